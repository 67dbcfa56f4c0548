#!/usr/bin/env python3
r"""run_forensics.py: judges a result from the run's own records (best vs last, config diff, curve); never guesses.

A final number hides how it was reached. Read the whole record instead: where the best value was
and how far the last one fell from it, what else differed between two runs besides the knob you
meant to change, and whether the curve has NaNs, spikes or a flat tail.

Usage:
  run_forensics.py list RUN_DIR... [--metric NAME] [--mode min|max] [--log-regex RE]... [--json]
  run_forensics.py diff RUN_A RUN_B [--all] [--json]
  run_forensics.py curve RUN --metric NAME [--mode min|max] [--log-regex RE]... [--window N] [--z Z]
                         [--flat-k K] [--flat-tol T] [--decline F] [--json]
  run_forensics.py plot RUN [RUN...] --metric NAME --out FILE.png [--mode min|max] [--log-regex RE]...
                        [--window N] [--z Z] [--size WxH] [--json]
  run_forensics.py steps FILE [--log-regex RE]...

  list   for each run (a folder of runs lists each child run; a folder whose wandb/ holds several
         W&B runs lists each of them): the metric's best
         value, the step of the best, and the last value and step; without --metric, every metric
         whose direction the name makes clear (loss, error ... lower; acc, f1, reward ... higher)
  diff   the resolved configs and environments of two runs side by side, only the keys that differ,
         nested keys flattened as a.b.c. Expect exactly the knob you changed; anything else differing
         (a seed, a package, the commit, a dirty tree) is a second variable. Settings that must differ
         per run are left out like the run's own id (--all shows them): output/save/log/checkpoint dirs,
         run and experiment names, any value that differs only by each run's own id, and from run.json
         the whole command line (compared option by option instead), the output, allow-empty and resume
         globs, the cwd and the durable dir
  curve  findings on one metric's curve, each with its step:
           early_peak  the best came well before the end and the last value fell back from it by at
                       least --decline (default 0.1) of the curve's range
           spike       a point whose robust z-score against the median of its --window neighbours
                       (default 10, five each side, at least two each side; scale = MAD, floored
                       at half the typical step-to-step change) exceeds --z (default 6)
           nonfinite   NaN or inf values (the first step and how many)
           flat        the last --flat-k (default 20) points do not change by more than --flat-tol
                       (default 1e-6) relative to their size
  plot   a PNG of one metric for one or more runs (a folder of runs draws each), to show the user rather
         than describe: each run's curve (the last value of each step), the best step as a star, spikes (as
         curve finds them) as red triangles, NaN/inf steps as red crosses along the top, and each resume as
         a dashed line at the step the log went back to (a step logged again; or, in job.log, the first step
         after the supervisor's `starting:` line of a later attempt), with the values the earlier attempt
         had logged for those steps as faint dots. The legend names each run's attempts (previous/ holds the
         earlier ones); a run with several attempts but no step logged twice gets a NOTE instead of a line.
         Needs matplotlib (pip install matplotlib); without it, exit 4 and one line, nothing read or written.
         The file is written atomically at --size pixels (default 1280x720)
  steps  one *.jsonl or *.csv metrics FILE read as list and curve read it (the last value logged for
         each step, in step order), printed as JSON lines: {"step": S, "NAME": VALUE}, each name's
         points together; scripts/repro.py checks a re-run's numbers against this, so a resumed
         run that logged some steps twice counts each step once. With --log-regex, FILE is any text
         log (a job.log) read through the regexes; two regexes may not name the same metric here

  --metric NAME  a metric name as logged (`loss`, `val/acc`, `eval.top1`); SOURCE:NAME picks one
                 source when two files log the same name (the names `list --json` prints)
  --mode min|max whether lower or higher is better; guessed from the name only when it is clear,
                 and the output says it was guessed; an unclear name without --mode is exit 2
  --all          diff: also compare the keys that differ between any two runs (run id, paths, times)
  --log-regex RE list, curve, steps: read a trainer that prints its numbers only to stdout (nanoGPT
                 without W&B). RE is a Python regex searched in each line of the run's job.log (the
                 node's run dir) and logs/job.log (a pulled copy); both are read when both are there.
                 Its (?P<step>...) group is the step (required: without it, exit 2) and every other
                 named group is a metric, read as a number (nan and inf are kept, as in JSONL). Give
                 it once per kind of line: each RE is a source of its own, FILE#N (N = its place among
                 the --log-regex options), so `iter 20: loss 3.58` and `step 20: train loss 3.38`
                 never merge into one curve even when both groups are named loss. Lines the
                 supervisor writes (`[rgt HH:MM:SS] ...`) are never read. A name another source
                 (JSONL, CSV, TensorBoard, W&B) already logs stays with it: pick the log's with
                 --metric 'logs/job.log#1:loss'. For nanoGPT:
                   --log-regex 'iter (?P<step>\d+): loss (?P<loss>[\d.]+)'
                   --log-regex 'step (?P<step>\d+): train loss (?P<train_loss>[\d.]+), val loss (?P<val_loss>[\d.]+)'
                 [\d.]+ does not match `nan`, so such a line is silently left out: write
                 (?P<loss>[\w.+-]+) to see NaN/inf in the curve. A trainer whose batch index restarts every
                 epoch (`Epoch 2 [300/600] loss 0.41`): name both, (?P<epoch>...) and (?P<step>...), and each
                 step is the pair (epoch, batch), in that order: the next epoch's batch 0 is not a resume, and
                 best and last are over the whole run. Text shows it as `epoch 2 batch 300`, --json and steps
                 as [2, 300]; plot puts it at 2 + 300/(the longest epoch's batches):
                   --log-regex 'Epoch (?P<epoch>\d+) \[(?P<step>\d+)/\d+\] loss (?P<loss>[\d.]+)'
  --json         one JSON object on stdout. Strict JSON: NaN and infinite values (a metric, a step, a
                 config value) are written as the strings "nan", "inf" and "-inf", dates and times
                 from a YAML config as ISO 8601 strings (steps writes its values the same way)

Sources read in a run dir (walked 4 levels deep; previous/ attempts and logs/ are skipped):
  job.log, logs/job.log  the job's stdout, only through --log-regex (above); without it a run whose
                 only record is its job.log has no source, and the error says to give --log-regex
  *.jsonl        one JSON object per line; nested objects are flattened; the step is the first of
                 step, global_step, _step, iteration, iter, epoch a record has, else the line number
  *.csv          a header row and numeric columns; the step column as for JSONL
  events.out.tfevents.*  TensorBoard scalars, through the tensorboard package's EventAccumulator
                 (pip install tensorboard); without it the files are named in a note
  wandb/offline-run-*, wandb/run-*  local W&B run folders: files/config.yaml and
                 files/wandb-summary.json when present (summary: last values only), and the run's
                 .wandb log (history, config, environment) through the wandb package's protobuf
                 definitions (pip install wandb)
  run.json       the launcher's record (cmd, cwd, profile, outputs); the cmd's option-value pairs
                 become cmd.<option> keys for diff, its other words (program, script) cmd.words
  env.json       scripts/node/run_env.py's environment record (python, torch, CUDA, packages, git)
  config.json, config.yaml, hparams.yaml, args.json ...  configs the job wrote
  wandb:ENTITY/PROJECT/RUN_ID (or wandb:ENTITY/PROJECT for list): the W&B API, only when
                 WANDB_API_KEY is set in the environment (the key is never printed)

Exit codes: 0 ok; 1 curve findings that warrant a look; 2 usage; 4 plot without matplotlib; 5 a needed package is
missing or the run has no readable source for the metric (3 is only for refusals). list and plot exit 5 as
curve does when none of the runs has the metric, or (list without --metric) has any metric at all,
e.g. a run with no source; runs that have one are still printed or drawn, the others shown as MISSING /
NO METRICS. plot draws findings, it does not judge them: 0 with spikes on the picture (curve exits 1).
"""
import argparse
import csv
import io
import json
import math
import os
import re
import statistics
import struct
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "node"))
import rgt_core as core  # noqa: E402
import run_env  # noqa: E402  (clean_url: a W&B record's git remote may hold a credential)
import runrec  # noqa: E402  (attempt_number: the attempts a run dir's previous/ holds)

PROG = "run_forensics.py"
EXIT_MISSING = 5   # nothing to read: not a refusal, so not 3 (review D9)
STEP_KEYS = ("step", "global_step", "_step", "iteration", "iter", "epoch")
SKIP_DIRS = {"previous", "logs", "__pycache__", "node_modules", ".git"}
MAX_DEPTH = 4
LOG_NAMES = ("job.log", "logs/job.log")   # the node run dir's stdout, and the copy a pull brings back
SUPERVISOR_MARK = "[rgt "                  # supervise.py's own lines in job.log: "[rgt 13:01:54] ..."
SUPERVISOR_START = "] starting: "          # ... and the one it writes as each attempt starts the job
NANOGPT_HINT = "--log-regex 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'"
CONFIG_NAMES = ("config.json", "config.yaml", "config.yml", "hparams.yaml", "hparams.yml", "hparams.json",
                "args.json", "args.yaml", "resolved_config.json", "resolved_config.yaml")
VOLATILE = {"run.run_id", "run.run_dir", "run.results_dir", "run.created_at", "run.host", "run.attempt",
            "run.launch_argv", "env.recorded_at", "env.cwd", "env.host", "env.toolkit", "env.git.toplevel",
            "env.git.untracked", "env.python.prefix", "env.python.executable", "env.python.chosen_by",
            "env.cmd", "env.git.patch", "wandb.run.id", "wandb.run.name", "wandb.run.start_time",
            "wandb.env.started_at", "wandb.env.writer_id", "wandb.env.program", "wandb.env.root",
            "wandb.env.host", "wandb.env.code_path", "wandb.env.code_path_local"}
LOWER = {"loss", "losses", "error", "err", "errors", "perplexity", "ppl", "mse", "mae", "rmse", "nll", "wer",
         "cer", "fid", "kid", "regret", "distance", "dist", "l1", "l2", "bpd", "bpb", "ce", "xent", "lpips",
         "eer", "brier", "ece", "mape", "smape", "cost"}
HIGHER = {"acc", "accuracy", "top1", "top5", "f1", "auc", "auroc", "auprc", "precision", "recall", "map",
          "iou", "miou", "dice", "bleu", "rouge", "rougel", "reward", "return", "returns", "score", "psnr",
          "ssim", "r2", "mcc", "kappa", "ndcg", "mrr", "hit", "hits", "success", "win", "winrate", "pass",
          "em", "exact", "exactmatch", "correlation", "spearman", "pearson"}


class Missing(Exception):
    """A package or source the answer needs is not there: exit EXIT_MISSING (5)."""


def note(line):
    sys.stderr.write("%s: %s\n" % (PROG, line))


# ---------------------------------------------------------------- small helpers

def as_number(value):
    """A float for a numeric JSON/CSV value (bools and non-numeric text are None; nan/inf kept)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return float(text)
        except ValueError:
            return None
    return None


def flatten(obj, prefix="", out=None):
    out = {} if out is None else out
    if isinstance(obj, dict):
        if not obj and prefix:
            out[prefix[:-1]] = {}
        for key in obj:
            flatten(obj[key], "%s%s." % (prefix, key), out)
    else:
        out[prefix[:-1]] = obj
    return out


def guess_mode(name):
    """'min', 'max' or None from a metric name's words (None when no word or both kinds match)."""
    words = set()
    for word in re.split(r"[^a-z0-9]+", name.lower()):
        if word:
            words.update((word, re.sub(r"\d+$", "", word)))
    low, high = bool(words & LOWER), bool(words & HIGHER)
    return "min" if low and not high else "max" if high and not low else None


def fmt(value):
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return "%.6g" % value
    return str(value)


def jsonable(value):
    """VALUE with nothing strict JSON lacks: non-finite floats as "nan"/"inf"/"-inf", dates and times as ISO
    8601 strings, tuples and sets as lists, any other object as its str; mapping keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=str)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def emit(obj):
    """--json output: strict JSON (see jsonable), in the shared layout."""
    core.emit_json(jsonable(obj))


def show(value, width=40):
    text = json.dumps(jsonable(value), sort_keys=True, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= width else text[:width - 3] + "..."


# ---------------------------------------------------------------- the job's stdout (--log-regex)

class EpochStep(tuple):
    """The step of a log whose batch index restarts every epoch (a --log-regex with (?P<epoch>) and (?P<step>)
    groups): (epoch, batch), ordered epoch first, so the next epoch's batch 0 comes after the last epoch's
    batch 900 and is never read as a resume. Shown as 'epoch 2 batch 300'; JSON [2, 300]."""
    __slots__ = ()

    def __new__(cls, epoch, batch):
        return tuple.__new__(cls, (epoch, batch))

    def __str__(self):
        return "epoch %s batch %s" % (fmt_step(self[0]), fmt_step(self[1]))

    __repr__ = __str__


def fmt_step(value):
    return "%d" % value if isinstance(value, float) and value == int(value) else str(value)


def plot_x(points):
    """STEP -> its place on a plot's x axis: the step itself, or for (epoch, batch) steps the epoch plus the
    batch's fraction of the longest epoch of POINTS (epoch 2 batch 300 of 600 -> 2.5)."""
    batches = [s[1] for s, _v in points if isinstance(s, EpochStep)]
    width = float(max(batches) + 1) if batches else 1.0
    return lambda s: s[0] + s[1] / width if isinstance(s, EpochStep) else s


def log_regex_arg(text):
    """An argparse type: a compiled --log-regex with a (?P<step>...) group and at least one other named group
    (besides an (?P<epoch>...) group, which makes the steps (epoch, batch) pairs)."""
    try:
        rx = re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError("'%s' does not compile: %s" % (text, exc))
    if "step" not in rx.groupindex:
        raise argparse.ArgumentTypeError("'%s' has no (?P<step>...) group: name the step, e.g. "
                                         "'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'" % text)
    if not set(rx.groupindex) - {"step", "epoch"}:
        raise argparse.ArgumentTypeError("'%s' names no metric: add a named group per value, e.g. "
                                         "(?P<loss>[\\d.]+)" % text)
    return rx


def log_files(path):
    """The job.log copies in run dir PATH, as LOG_NAMES spells them."""
    return [rel for rel in LOG_NAMES if os.path.isfile(os.path.join(path, *rel.split("/")))]


def log_series(path, regexes, resumes=None):
    """One (series, unreadable) per regex over the lines of the text log PATH: series {name: [(step, value)]}
    with the last value of each step, unreadable [count, first line] of matching lines whose step or a value
    is not a number. A carriage return ends a line (progress bars); supervisor lines are skipped, but a
    supervisor's `starting:` line after some points marks the next step as a restart. RESUMES (a list, one
    {} per regex), when given, gets {name: dedupe's resume} for each regex."""
    found = [({}, [0, None]) for _rx in regexes]
    starts = [[] for _rx in regexes]     # per regex: the first step after each later attempt's start
    pending = [False for _rx in regexes]
    with open(path, encoding="utf-8", errors="replace") as handle:  # universal newlines: \r splits too
        for line in handle:
            line = line.rstrip("\n")
            if line.startswith(SUPERVISOR_MARK) and SUPERVISOR_START in line:
                pending = [bool(series) for series, _bad in found]
            if not line or line.startswith(SUPERVISOR_MARK):
                continue
            for index, (rx, (series, bad)) in enumerate(zip(regexes, found)):
                match = rx.search(line)
                if not match:
                    continue
                groups = match.groupdict()
                step = as_number(groups.pop("step"))
                epoch = as_number(groups.pop("epoch")) if "epoch" in groups else False
                values = [(name, as_number(text)) for name, text in groups.items() if text is not None]
                whole = step is not None and math.isfinite(step) and (
                    epoch is False or (epoch is not None and math.isfinite(epoch)))
                if not whole or any(v is None for _n, v in values):
                    bad[0] += 1
                    bad[1] = bad[1] or line.strip()
                if not whole:
                    continue
                step = int(step) if step == int(step) else step
                if epoch is not False:   # the batch index restarts every epoch: the step is (epoch, batch)
                    step = EpochStep(int(epoch) if epoch == int(epoch) else epoch, step)
                if pending[index]:
                    starts[index].append(step)
                    pending[index] = False
                for name, value in values:
                    if value is not None:
                        series.setdefault(name, []).append((step, value))
    out = []
    for index, (series, bad) in enumerate(found):
        deduped = {}
        for name, points in series.items():
            resume = {}
            deduped[name] = dedupe(points, resume)
            if resumes is not None:
                resume["restarts"] = resume["restarts"] + [s for s in starts[index] if s not in resume["restarts"]]
                resumes[index][name] = resume
        out.append((deduped, bad))
    return out


def load_logs(run, regexes):
    """Each --log-regex over each job.log copy of RUN: a source FILE#N per (file, regex) that matched."""
    def say(line):
        run.notes.append(line)
        run.log_notes.append(line)
    files = log_files(run.path)
    if not files:
        say("--log-regex given, but %s holds no %s" % (run.path, " or ".join(LOG_NAMES)))
        return
    for rel in files:
        try:
            resumes = [{} for _rx in regexes]
            found = log_series(os.path.join(run.path, *rel.split("/")), regexes, resumes)
        except OSError as exc:
            say("skipped %s: %s" % (rel, exc.strerror or exc))
            continue
        for index, (series, bad) in enumerate(found, 1):
            label = "%s#%d" % (rel, index)
            if bad[0]:
                say("%s: %d matching line(s) had a step or value that is not a number, the first: %s"
                                 % (label, bad[0], show(bad[1], 100)))
            if not series:
                say("%s: --log-regex #%d (%s) matched no line with a numeric step"
                                 % (label, index, show(regexes[index - 1].pattern, 80)))
                continue
            run.sources.append(label)
            for name, points in sorted(series.items()):
                run.add_series(label, name, points, resumes[index - 1].get(name))


def log_hint(run, regexes):
    """A pointer at --log-regex when RUN's only metrics may be in its job.log ("" when there is nothing to say)."""
    files = log_files(run.path) if os.path.isdir(run.path) else []
    if files and not regexes:
        return ("; %s holds the job's stdout: read its numbers with %s (a (?P<step>) group and one named group "
                "per metric; see --help)" % (files[0], NANOGPT_HINT))
    return "; " + "; ".join(run.log_notes) if regexes and run.log_notes else ""


# ---------------------------------------------------------------- a run and its sources

class Run(object):
    def __init__(self, path, label=None):
        self.path = path
        self.label = label or os.path.basename(os.path.normpath(path)) or path
        self.series = {}      # name (and SOURCE:name) -> [(step, value)]
        self.bare = []        # the names as logged, first source first
        self.origin = {}      # name -> source label
        self.summary = {}     # name -> last value (W&B summary only)
        self.config = {}      # flattened key -> value
        self.sources = []
        self.notes = []
        self.unreadable = []  # sources a missing package kept closed
        self.log_notes = []   # what --log-regex found wanting (also in notes)
        self.resumes = {}     # name (and SOURCE:name) -> dedupe's resume: restart steps, replaced points

    def add_series(self, source, name, points, resume=None):
        if not points:
            return
        qualified = "%s:%s" % (source, name)
        self.series[qualified] = points
        self.origin[qualified] = source
        self.resumes[qualified] = resume or {}
        if name not in self.bare:
            self.bare.append(name)
            self.series[name] = points
            self.origin[name] = source
            self.resumes[name] = resume or {}

    def set_config(self, prefix, mapping):
        for key, value in flatten(mapping).items():
            if key:
                self.config["%s.%s" % (prefix, key)] = value


def dedupe(points, resume=None):
    """Keep the last value logged for each step (a resumed run logs some steps twice), in step order.

    RESUME ({}), when given, gets what the log order says about restarts: "restarts", each step at which
    the log went back to a step it had already reached (the step a resumed attempt started again from),
    and "replaced", the (step, value) points a later attempt logged again (what the earlier attempt had)."""
    last = {}
    order = []
    restarts, replaced = [], []
    previous = None
    for step, value in points:
        try:
            if previous is not None and step <= previous and step not in restarts:
                restarts.append(step)
        except TypeError:  # steps of mixed kinds: no order to read a restart from
            pass
        previous = step
        if step not in last:
            order.append(step)
        else:
            replaced.append((step, last[step]))
        last[step] = value
    try:
        order.sort()
    except TypeError:
        pass
    if resume is not None:
        resume.update(restarts=restarts, replaced=replaced)
    return [(s, last[s]) for s in order]


def records_to_series(records, resumes=None):
    """JSONL/CSV records -> {name: [(step, value)]}; RESUMES ({}), when given, gets {name: dedupe's resume}."""
    out = {}
    for index, rec in enumerate(records):
        flat = flatten(rec) if isinstance(rec, dict) else {}
        step_key = next((k for k in STEP_KEYS if as_number(flat.get(k)) is not None), None)
        step = as_number(flat[step_key]) if step_key else float(index)
        step = int(step) if step is not None and math.isfinite(step) and step == int(step) else step
        for key, raw in flat.items():
            if key == step_key:
                continue
            value = as_number(raw)
            if value is not None:
                out.setdefault(key, []).append((step, value))
    if resumes is None:
        return {k: dedupe(v) for k, v in out.items()}
    return {k: dedupe(v, resumes.setdefault(k, {})) for k, v in out.items()}


def read_jsonl(path):
    records = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn last line of a killed run
            if isinstance(obj, dict):
                records.append(obj)
    return records


def read_csv(path):
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        return list(csv.DictReader(handle))


MAX_CONFIG_BYTES = 8 << 20       # a config file larger than this is not a config
MAX_CONFIG_VALUES = 200000       # values after YAML aliases are expanded: a 700-byte alias bomb makes 10^7


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        raise Missing("%s needs PyYAML to read (pip install pyyaml)" % path)
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise ValueError("larger than %s: not read as a config" % core.human_bytes(MAX_CONFIG_BYTES))
    with open(path, encoding="utf-8") as handle:
        return yaml_plain(yaml.safe_load(handle), [MAX_CONFIG_VALUES])


def yaml_plain(value, budget=None):
    """A YAML document with its dates and times as ISO 8601 strings (as a JSON config would hold them).
    BUDGET ([n]) bounds the values made: aliases are shared in what safe_load returns, but a copy expands
    every one of them, so a tiny file can stand for billions of values (ValueError past the budget)."""
    if budget is not None:
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError("expands to more than %d values (YAML aliases nested in aliases?): not read"
                             % MAX_CONFIG_VALUES)
    if isinstance(value, dict):
        return {yaml_plain(k, budget): yaml_plain(v, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_plain(v, budget) for v in value]
    if hasattr(value, "isoformat") and not isinstance(value, str):
        return value.isoformat()
    return value


def walk(root):
    """(dirpath, dirnames, filenames) under ROOT, MAX_DEPTH deep, skipping attempts, logs, hidden and W&B dirs."""
    base = root.rstrip(os.sep).count(os.sep)
    for folder, dirs, files in os.walk(root):
        depth = folder.rstrip(os.sep).count(os.sep) - base
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and d != "wandb"
                         and depth < MAX_DEPTH and not os.path.islink(os.path.join(folder, d)))
        yield folder, dirs, sorted(files)


def wandb_folders(root):
    """Local W&B run folders at or under ROOT (a folder named wandb, one level or two down)."""
    name = os.path.basename(os.path.normpath(root))
    if re.match(r"^(offline-)?run-", name) and (os.path.isdir(os.path.join(root, "files")) or
                                                 any(f.endswith(".wandb") for f in os.listdir(root))):
        return [root]
    found = []
    for cand in (os.path.join(root, "wandb"),) + tuple(os.path.join(root, d, "wandb") for d in safe_list(root)):
        if os.path.isdir(cand):
            found += [os.path.join(cand, d) for d in safe_list(cand)
                      if re.match(r"^(offline-)?run-", d) and os.path.isdir(os.path.join(cand, d))]
    return sorted(set(found))


def safe_list(folder):
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def load_run(path, log_regexes=()):
    run = Run(path)
    tb_dirs = []
    for folder, _dirs, files in walk(path):
        rel_dir = os.path.relpath(folder, path)
        for name in files:
            full = os.path.join(folder, name)
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            lower = name.lower()
            try:
                if name.startswith("events.out.tfevents."):
                    if folder not in tb_dirs:
                        tb_dirs.append(folder)
                elif lower.endswith((".jsonl", ".csv")):
                    run.sources.append(rel)
                    resumes = {}
                    records = read_jsonl(full) if lower.endswith(".jsonl") else read_csv(full)
                    for key, pts in sorted(records_to_series(records, resumes).items()):
                        run.add_series(rel, key, pts, resumes.get(key))
                elif name == "run.json" and rel_dir == ".":
                    run.sources.append(rel)
                    load_run_json(run, core.load_json_strict(full, "run.json"))
                elif name == "env.json" and rel_dir == ".":
                    run.sources.append(rel)
                    run.set_config("env", {k: v for k, v in core.load_json_strict(full, "env.json").items()
                                           if k != "key_packages"})
                elif lower in CONFIG_NAMES:
                    run.sources.append(rel)
                    doc = load_yaml(full) if lower.endswith((".yaml", ".yml")) else core.load_json_strict(full)
                    run.set_config("config" if rel_dir == "." else "config[%s]" % rel_dir, doc or {})
            except Missing as exc:
                run.notes.append(str(exc))
                run.unreadable.append(rel)
            except (OSError, ValueError, csv.Error, core.UsageError) as exc:
                run.notes.append("skipped %s: %s" % (rel, exc))
            except Exception as exc:  # a YAML parse error and the like: say which file, keep going
                run.notes.append("skipped %s: %s: %s" % (rel, type(exc).__name__, str(exc)[:200]))
    for folder in tb_dirs:
        load_tensorboard(run, folder)
    for folder in wandb_folders(path):
        load_wandb_folder(run, folder)
    if log_regexes:  # last: a name a structured source logs keeps that source
        load_logs(run, log_regexes)
    return run


def load_run_json(run, doc):
    cmd = doc.get("cmd") if isinstance(doc.get("cmd"), list) else []
    run.set_config("run", {k: v for k, v in doc.items() if k != "cmd"})
    if cmd:
        run.config["run.cmd"] = " ".join(str(w) for w in cmd)
        flags, words = cmd_flags(cmd)
        for key, value in flags.items():
            run.config["cmd.%s" % key] = value
        if words:
            run.config[CMD_WORDS] = " ".join(words)


CMD_WORDS = "cmd.words"   # the command's words that are no option's: the program, the script, positionals


def cmd_flags(cmd):
    """({flag: value} of the --flag value / --flag=value / bare --flag (True) pairs of a command line, [the
    other words, in order])."""
    out, rest = {}, []
    words = [str(w) for w in cmd]
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("--") and len(word) > 2:
            if "=" in word:
                key, value = word[2:].split("=", 1)
            elif index + 1 < len(words) and not words[index + 1].startswith("--"):
                key, value = word[2:], words[index + 1]
                index += 1
            else:
                key, value = word[2:], True
            out[key] = value
        else:
            rest.append(word)
        index += 1
    return out, rest


# ---------------------------------------------------------------- TensorBoard

def load_tensorboard(run, folder):
    rel = os.path.relpath(folder, run.path)
    label = "tb" if rel == "." else "tb[%s]" % rel
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        run.notes.append("TensorBoard event files in %s are not read: the tensorboard package is not installed "
                         "(pip install tensorboard)" % (rel if rel != "." else run.path))
        run.unreadable.append(label)
        return
    acc = event_accumulator.EventAccumulator(folder, size_guidance={event_accumulator.SCALARS: 0,
                                                                    event_accumulator.TENSORS: 0})
    try:
        acc.Reload()
    except Exception as exc:  # a damaged event file: say so, read the rest
        run.notes.append("TensorBoard events in %s: %s" % (rel, str(exc)[:200]))
        return
    run.sources.append(label)
    tags = acc.Tags()
    for tag in tags.get("scalars", []):
        resume = {}
        run.add_series(label, tag, dedupe([(ev.step, float(ev.value)) for ev in acc.Scalars(tag)], resume), resume)
    tensor_tags = [t for t in tags.get("tensors", []) if t not in run.series]
    if tensor_tags:
        try:
            from tensorboard.util import tensor_util
        except ImportError:
            return
        for tag in tensor_tags:
            points = []
            for ev in acc.Tensors(tag):
                try:
                    arr = tensor_util.make_ndarray(ev.tensor_proto)
                    if getattr(arr, "size", 0) == 1:
                        points.append((ev.step, float(arr.reshape(-1)[0])))
                except Exception:  # a non-numeric tensor (text, image): not a curve
                    break
            run.add_series(label, tag, dedupe(points))


# ---------------------------------------------------------------- W&B (local folders)

def wandb_log_records(path):
    """The raw records of a .wandb file: a LevelDB-style log (7-byte file header, 32 KiB blocks, each
    record with a CRC-32, a length and a kind: full, first, middle, last)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < 7 or data[:4] != b":W&B":
        raise ValueError("not a W&B run log")
    block, pos, pending, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        body = data[pos + 7:pos + 7 + length]
        if kind == 0 and length == 0:
            pos += room  # zero padding to the block end
            continue
        if len(body) < length or zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF != crc:
            break  # a torn tail of a run that was killed: keep what came before
        pos += 7 + length
        if kind == 1:
            out.append(body)
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        elif kind == 4:
            out.append(pending + body)
            pending = b""
    return out


def item_key(item):
    nested = list(getattr(item, "nested_key", []) or [])
    return ".".join(nested) if nested else item.key


def load_wandb_folder(run, folder):
    rel = os.path.relpath(folder, run.path)
    label = "wandb" if rel == "." else "wandb[%s]" % os.path.basename(folder)
    files = os.path.join(folder, "files")
    got_config = False
    cfg = os.path.join(files, "config.yaml")
    if os.path.isfile(cfg):
        try:
            doc = load_yaml(cfg) or {}
            run.set_config("wandb.config", {k: (v.get("value") if isinstance(v, dict) and "value" in v else v)
                                            for k, v in doc.items() if k != "_wandb"})
            got_config = True
            run.sources.append("%s/files/config.yaml" % label)
        except Missing as exc:
            run.notes.append(str(exc))
        except Exception as exc:
            run.notes.append("skipped %s: %s" % (cfg, str(exc)[:200]))
    summ = os.path.join(files, "wandb-summary.json")
    if os.path.isfile(summ):
        doc = core.read_json(summ)
        for key, value in flatten(doc).items():
            if as_number(value) is not None and not key.startswith("_"):
                run.summary["%s:%s" % (label, key)] = as_number(value)
                run.summary.setdefault(key, as_number(value))
        run.sources.append("%s/files/wandb-summary.json" % label)
    logs = sorted(f for f in safe_list(folder) if f.endswith(".wandb"))
    if not logs:
        return
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError:
        run.notes.append("the W&B run log %s is not read: the wandb package is not installed (pip install wandb)"
                         % os.path.join(rel, logs[0]))
        run.unreadable.append(label)
        return
    history, config, env = {}, {}, {}
    for name in logs:
        try:
            raws = wandb_log_records(os.path.join(folder, name))
        except (OSError, ValueError) as exc:
            run.notes.append("skipped %s: %s" % (name, exc))
            continue
        for raw in raws:
            rec = pb.Record()
            try:
                rec.ParseFromString(raw)
            except Exception:
                continue
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                row = {}
                for item in rec.history.item:
                    try:
                        row[item_key(item)] = json.loads(item.value_json)
                    except ValueError:
                        continue
                step = row.get("_step")
                for key, value in row.items():
                    number = as_number(value)
                    if key.startswith("_") or number is None:
                        continue
                    history.setdefault(key, []).append((step if step is not None else len(history.get(key, [])),
                                                        number))
            elif kind in ("run", "config"):
                updates = rec.run.config.update if kind == "run" else rec.config.update
                for item in updates:
                    try:
                        config[item_key(item)] = json.loads(item.value_json)
                    except ValueError:
                        continue
                if kind == "run":
                    env["run.project"] = rec.run.project or None
                    env["run.id"] = rec.run.run_id or None
                    env["run.name"] = rec.run.display_name or None
                    if rec.run.HasField("git"):
                        env["git.commit"] = rec.run.git.commit or None
                        env["git.remote"] = run_env.clean_url(rec.run.git.remote_url)
            elif kind == "environment":
                for field, value in rec.environment.ListFields():
                    if isinstance(value, (str, int, float, bool)):  # scalars only (no disks, no timestamps)
                        env["env.%s" % field.name] = value
    run.sources.append("%s/%s" % (label, logs[0]))
    if not got_config:
        run.set_config("wandb.config", {k: v for k, v in config.items() if not k.startswith("_wandb")})
    for key, value in env.items():
        if value not in (None, ""):
            run.config["wandb.%s" % key] = value
    for key, points in sorted(history.items()):
        resume = {}
        run.add_series(label, key, dedupe(points, resume), resume)


# ---------------------------------------------------------------- W&B API (only with a key)

def load_wandb_api(spec):
    """Runs for wandb:ENTITY/PROJECT[/RUN_ID] -> list of Run."""
    key = os.environ.get("WANDB_API_KEY")
    if not key:
        raise Missing("%s needs the W&B API: set WANDB_API_KEY in the environment (it is never printed)" % spec)
    try:
        import wandb
    except ImportError:
        raise Missing("%s needs the wandb package (pip install wandb)" % spec)
    path = spec[len("wandb:"):].strip("/")
    if path.count("/") not in (1, 2) or any(not part for part in path.split("/")):
        raise core.UsageError("%s: give wandb:ENTITY/PROJECT or wandb:ENTITY/PROJECT/RUN_ID" % spec)
    try:
        api = wandb.Api()
        remote = [api.run(path)] if path.count("/") == 2 else list(api.runs(path))
        out = []
        for item in remote:
            run = Run("wandb:%s/%s" % ("/".join(path.split("/")[:2]), item.id), label=item.name or item.id)
            run.set_config("wandb.config", {k: v for k, v in dict(item.config).items() if not k.startswith("_")})
            for k, v in flatten(dict(item.summary)).items():
                if as_number(v) is not None and not k.startswith("_"):
                    run.summary[k] = as_number(v)
            history = {}
            for row in item.scan_history():
                step = row.get("_step")
                for k, v in flatten(row).items():
                    if not k.startswith("_") and as_number(v) is not None:
                        history.setdefault(k, []).append((step, as_number(v)))
            for k, pts in sorted(history.items()):
                run.add_series("wandb-api", k, dedupe(pts))
            run.sources.append("wandb-api")
            out.append(run)
        return out
    except Missing:
        raise
    except Exception as exc:  # network, auth, a wrong path: one line, the key scrubbed from it
        raise Missing("the W&B API failed for %s: %s" % (spec, str(exc).replace(key, "***")[:300]))


# ---------------------------------------------------------------- finding runs

def has_own_records(path):
    """PATH itself is one run: a launcher record, an env record, or metric files directly in it."""
    names = safe_list(path)
    return ("run.json" in names or "env.json" in names or bool(log_files(path)) or
            any(n.endswith((".jsonl", ".csv")) or n.startswith("events.out.tfevents.") for n in names))


def is_run(path):
    if has_own_records(path) or wandb_folders(path):
        return True
    return any(any(f.endswith((".jsonl", ".csv")) or f.startswith("events.out.tfevents.") for f in files)
               for _folder, _dirs, files in walk(path))


def load_wandb_only(folder):
    run = Run(folder)
    load_wandb_folder(run, folder)
    return run


def runs_from(paths, log_regexes=()):
    """Runs for each PATH: the run itself when it has its own records (a job.log counts), else each child
    run dir and each W&B run folder in PATH/wandb."""
    runs = []
    for path in paths:
        if path.startswith("wandb:"):
            runs.extend(load_wandb_api(path))
            continue
        if not os.path.isdir(path):
            raise core.UsageError("%s is not a directory (give a run dir or a folder of run dirs)" % path)
        name = os.path.basename(os.path.normpath(path))
        own_wandb = [f for f in wandb_folders(path) if os.path.dirname(f) == os.path.join(path, "wandb")]
        if has_own_records(path) or re.match(r"^(offline-)?run-", name) or len(own_wandb) == 1:
            runs.append(load_run(path, log_regexes))
            continue
        found = [load_run(os.path.join(path, d), log_regexes) for d in safe_list(path)
                 if d not in SKIP_DIRS and d != "wandb" and not d.startswith(".")
                 and os.path.isdir(os.path.join(path, d)) and is_run(os.path.join(path, d))]
        found += [load_wandb_only(f) for f in own_wandb]
        runs.extend(found or [load_run(path, log_regexes)])
    return runs


def one_run(path, log_regexes=()):
    if path.startswith("wandb:"):
        runs = load_wandb_api(path)
        if len(runs) != 1:
            raise core.UsageError("%s names a project; give wandb:ENTITY/PROJECT/RUN_ID" % path)
        return runs[0]
    if not os.path.isdir(path):
        raise core.UsageError("%s is not a directory" % path)
    return load_run(path, log_regexes)


# ---------------------------------------------------------------- statistics

def best_last(points, mode):
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    out = {"points": len(points), "nonfinite": len(points) - len(finite),
           "last": points[-1][1] if points else None, "last_step": points[-1][0] if points else None,
           "first_step": points[0][0] if points else None, "best": None, "best_step": None}
    if finite and mode:
        pick = min if mode == "min" else max
        best = pick(finite, key=lambda p: p[1])  # the first step reaching the best value
        out.update(best=best[1], best_step=best[0])
    return out


def resolve_mode(name, mode):
    if mode:
        return mode, "--mode"
    guess = guess_mode(name)
    return guess, ("guessed from the name" if guess else None)


def metric_for(run, name):
    if name in run.series:
        return run.series[name]
    return None


def median(values):
    return statistics.median(values)


def curve_findings(points, mode, window=10, z_limit=6.0, flat_k=20, flat_tol=1e-6, decline=0.1):
    findings = []
    bad = [(s, v) for s, v in points if not math.isfinite(v)]
    if bad:
        findings.append({"kind": "nonfinite", "step": bad[0][0], "count": len(bad),
                         "line": "%d NaN/inf value(s), the first at step %s (%s)" % (len(bad), bad[0][0], bad[0][1])})
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    values = [v for _s, v in finite]
    n = len(values)
    if n >= 5 and mode:
        stats = best_last(finite, mode)
        lo, hi = min(values), max(values)
        span = hi - lo
        first, last_step = finite[0][0], finite[-1][0]
        try:
            where = (stats["best_step"] - first) / float(last_step - first) if last_step != first else 1.0
        except TypeError:
            where = finite.index((stats["best_step"], stats["best"])) / float(n - 1)
        fell = abs(values[-1] - stats["best"]) / span if span > 0 else 0.0
        if where < 0.75 and fell >= decline:
            findings.append({"kind": "early_peak", "step": stats["best_step"], "best": stats["best"],
                             "last": values[-1], "position": round(where, 3), "fell": round(fell, 3),
                             "line": "best %s at step %s (%d%% into the run), last %s at step %s: fell back %d%% of "
                                     "the range; report the best checkpoint only if it was selected on "
                                     "held-out data" % (fmt(stats["best"]), stats["best_step"], 100 * where,
                                                        fmt(values[-1]), last_step, 100 * fell)})
    half = max(1, window // 2)
    if n >= 7:
        diffs = [abs(values[i + 1] - values[i]) for i in range(n - 1)]
        typical = median(diffs) if diffs else 0.0
        spikes = []
        for i in range(n):
            left, right = values[max(0, i - half):i], values[i + 1:i + 1 + half]
            if len(left) < 2 or len(right) < 2:  # one-sided at the ends: a trend would read as a spike
                continue
            around = left + right
            mid = median(around)
            mad = median([abs(v - mid) for v in around])
            scale = max(1.4826 * mad, 0.5 * typical, 1e-12 * max(1.0, abs(mid)))
            z = (values[i] - mid) / scale
            if abs(z) > z_limit:
                spikes.append((finite[i][0], values[i], z))
        for step, value, z in spikes[:20]:
            findings.append({"kind": "spike", "step": step, "value": value, "z": round(z, 1),
                             "line": "spike at step %s: %s (robust z %.1f against its %d neighbours)"
                                     % (step, fmt(value), z, 2 * half)})
        if len(spikes) > 20:
            findings.append({"kind": "spike", "step": spikes[20][0], "count": len(spikes) - 20,
                             "line": "%d more spikes not shown" % (len(spikes) - 20)})
    if n >= flat_k >= 2:
        tail = values[-flat_k:]
        size = max(max(abs(v) for v in tail), 1e-12)
        if max(tail) - min(tail) <= flat_tol * size:
            findings.append({"kind": "flat", "step": finite[-flat_k][0], "value": tail[-1],
                             "line": "flat: the last %d points (from step %s) stay at %s; a stuck optimizer, a "
                                     "zero learning rate, or a metric that is not being updated"
                                     % (flat_k, finite[-flat_k][0], fmt(tail[-1]))})
    return findings


# ---------------------------------------------------------------- commands

def check_missing(run, what, regexes=()):
    if run.unreadable:
        raise Missing("%s: %s; %s" % (run.label, what, "; ".join(run.notes)))
    raise Missing("%s: %s (sources read: %s)%s" % (run.label, what, ", ".join(run.sources) or "none",
                                                    log_hint(run, regexes)))


def cmd_list(args):
    runs = runs_from(args.runs, args.log_regex or ())
    if not runs:
        raise Missing("no runs found under %s" % ", ".join(args.runs))
    mode_from = None
    if args.metric:
        mode, mode_from = resolve_mode(args.metric.split(":")[-1], args.mode)
        if mode is None:
            raise core.UsageError("cannot tell from the name whether higher or lower %r is better; give --mode min "
                                  "or --mode max" % args.metric)
    rows, missing = [], 0
    for run in runs:
        entry = {"run": run.path, "name": run.label, "sources": run.sources, "notes": run.notes, "metrics": {}}
        # without --metric: each name logged per step, then the names only a W&B summary holds
        names = [args.metric] if args.metric else sorted(run.bare) + sorted(
            k for k in run.summary if ":" not in k and k not in run.series)
        for name in names:
            points = metric_for(run, name)
            if args.metric:
                use_mode, how = mode, mode_from
            else:
                use_mode, how = resolve_mode(name, args.mode)
            if points is None:
                if name in run.summary:
                    entry["metrics"][name] = {"last": run.summary[name], "best": None, "best_step": None,
                                              "last_step": None, "points": 0, "mode": use_mode, "mode_from": how,
                                              "from": "summary (last value only)"}
                continue
            stats = best_last(points, use_mode)
            stats.update(mode=use_mode, mode_from=how, source=run.origin.get(name))
            entry["metrics"][name] = stats
        if (args.metric and args.metric not in entry["metrics"]) or not entry["metrics"]:
            missing += 1
            entry["missing"] = True
        rows.append(entry)
    if args.json:
        emit({"metric": args.metric, "mode": args.mode, "log_regex": [rx.pattern for rx in args.log_regex or ()],
              "runs": rows})
    else:
        if args.metric:
            print("METRIC %s (%s better, %s)" % (args.metric, "lower" if mode == "min" else "higher", mode_from))
            print("%-32s %12s %10s %12s %10s %7s" % ("run", "best", "best_step", "last", "last_step", "points"))
        for entry in rows:
            if args.metric:
                m = entry["metrics"].get(args.metric)
                if m is None:
                    print("%-32s %s" % (entry["name"][:32], "MISSING (no source logs it)"))
                    continue
                print("%-32s %12s %10s %12s %10s %7s" % (entry["name"][:32], fmt(m["best"]), fmt(m["best_step"]),
                                                         fmt(m["last"]), fmt(m["last_step"]), m["points"]))
                continue
            print("RUN %s (%s)" % (entry["name"], ", ".join(entry["sources"]) or "no sources"))
            if not entry["metrics"]:
                print("  NO METRICS no source of this run logs a number")
            shown = sorted(entry["metrics"].items())[:20]
            for name, m in shown:
                if m.get("from"):
                    print("  %-30s last %s, from the W&B %s" % (name, fmt(m["last"]), m["from"]))
                elif m["mode"]:
                    print("  %-30s best %s at step %s, last %s at step %s (%s better, %s)" % (
                        name, fmt(m["best"]), fmt(m["best_step"]), fmt(m["last"]), fmt(m["last_step"]),
                        "lower" if m["mode"] == "min" else "higher", m["mode_from"]))
                else:
                    print("  %-30s last %s at step %s (direction unclear from the name: --metric %s --mode min|max)"
                          % (name, fmt(m["last"]), fmt(m["last_step"]), name))
            if len(entry["metrics"]) > 20:
                print("  ... %d more metrics (--json lists all)" % (len(entry["metrics"]) - 20))
        for entry in rows:
            for line in entry["notes"]:
                note("NOTE %s: %s" % (entry["name"], line))
    if missing == len(rows):  # as curve: nothing to show is exit 5, never a quiet 0
        unreadable = [r for r in runs if r.unreadable]
        hints = [log_hint(r, args.log_regex or ()) for r in runs]
        hint = "; " + "; ".join(unreadable[0].notes) if unreadable else next((h for h in hints if h), "")
        if args.metric:
            raise Missing("no run has %r%s" % (args.metric, hint))
        raise Missing("no run has a metric (sources read: %s)%s" % (
            ", ".join(sorted(set(src for r in runs for src in r.sources))) or "none", hint))
    return 0


# Per-run settings of the launch record: the whole command line (its options are compared one by one as cmd.<option>,
# its other words as cmd.words), where each run's job ran and what it saves (outputs, allow-empty and resume globs
# name each cell's own folder), and where its record lives. Left out like the run id; --all shows them.
PER_RUN = {"run.cmd", "run.outputs", "run.allow_empty", "run.resume_glob", "run.cwd", "run.durable_dir"}
# Settings that must differ between two runs (where each writes, what it is called), by the last part of
# their key: `out_dir`, `output_dir`, `save_dir`, `checkpoint_dir`, `logging_dir`, `run_name`, `wandb_run_name`...
PER_RUN_KEY = re.compile(r"(^|[._])((out|output|save|ckpt|checkpoint|checkpoints|log|logging|logs|result|results|"
                         r"run|exp|experiment|tensorboard|tb|wandb)_?(dir|path|root|folder|name|id))$", re.I)


def run_names(run):
    """The words that name RUN: its run id (run.json) and its folder's name."""
    names = {str(run.config.get("run.run_id") or ""), os.path.basename(os.path.normpath(run.path))}
    return sorted((n for n in names if len(n) >= 2), key=len, reverse=True)


def per_run_setting(key, va, vb, a, b):
    """Whether KEY differs between runs A and B only because each run writes to its own place or has its own
    name: a per-run key name, or values equal once each run's own id is taken out. Not a changed knob."""
    if key in PER_RUN:
        return True
    if not isinstance(va, str) or not isinstance(vb, str):
        return False
    if PER_RUN_KEY.search(key.rsplit(".", 1)[-1]) or PER_RUN_KEY.search(key):
        return True
    for name in run_names(a):
        va = va.replace(name, "<run>")
    for name in run_names(b):
        vb = vb.replace(name, "<run>")
    return va == vb


def cmd_diff(args):
    a, b = one_run(args.run_a), one_run(args.run_b)
    if not a.config and not b.config:
        raise Missing("neither run has a config or environment record (run.json, env.json, a config file, W&B)")
    keys = sorted(set(a.config) | set(b.config))
    skipped = 0
    rows = []
    for key in keys:
        va, vb = a.config.get(key, "<absent>"), b.config.get(key, "<absent>")
        if not args.all and (key in VOLATILE or any(key.startswith(v + ".") for v in VOLATILE)
                             or per_run_setting(key, va, vb, a, b)):
            skipped += 1
            continue
        if va != vb and not (isinstance(va, float) and isinstance(vb, float) and va != va and vb != vb):
            rows.append({"key": key, "a": va, "b": vb})
    if args.json:
        emit({"a": a.path, "b": b.path, "compared": len(keys) - skipped, "skipped_volatile": skipped,
                        "differing": rows, "notes": a.notes + b.notes})
        return 0
    print("A = %s\nB = %s" % (a.path, b.path))
    print("%-44s %-40s %-40s" % ("key", "A", "B"))
    for row in rows:
        print("%-44s %-40s %-40s" % (row["key"][:44], show(row["a"]), show(row["b"])))
    knobs = [r for r in rows if not r["key"].startswith(("env.", "wandb.env.", "wandb.git."))]
    envs = len(rows) - len(knobs)
    print("%d differing key(s) of %d compared (%d config, %d environment; %d run-identity and per-run keys left "
          "out%s)." % (
        len(rows), len(keys) - skipped, len(knobs), envs, skipped, ", --all shows them" if skipped else ""))
    if len(knobs) > 1 or envs:
        print("WARN more than the one knob you meant to change differs: explain each before trusting the gap")
    for line in a.notes + b.notes:
        note("NOTE %s" % line)
    return 0


def cmd_curve(args):
    regexes = args.log_regex or ()
    run = one_run(args.run, regexes)
    points = metric_for(run, args.metric)
    if points is None:
        check_missing(run, "no source logs %r" % args.metric, regexes)
    mode, how = resolve_mode(args.metric.split(":")[-1], args.mode)
    if mode is None:
        raise core.UsageError("cannot tell from the name whether higher or lower %r is better; give --mode min "
                              "or --mode max" % args.metric)
    stats = best_last(points, mode)
    findings = curve_findings(points, mode, args.window, args.z, args.flat_k, args.flat_tol, args.decline)
    if args.json:
        emit({"run": run.path, "metric": args.metric, "mode": mode, "mode_from": how,
              "source": run.origin.get(args.metric), "log_regex": [rx.pattern for rx in regexes],
              "stats": stats, "findings": findings, "notes": run.notes})
    else:
        print("CURVE %s %s (%s better, %s; from %s): %d points, steps %s..%s" % (
            run.label, args.metric, "lower" if mode == "min" else "higher", how, run.origin.get(args.metric),
            stats["points"], stats["first_step"], stats["last_step"]))
        print("  best %s at step %s; last %s at step %s" % (fmt(stats["best"]), stats["best_step"],
                                                            fmt(stats["last"]), stats["last_step"]))
        for f in findings:
            print("  %s %s: %s" % ("FAIL" if f["kind"] == "nonfinite" else "WARN", f["kind"], f["line"]))
        if not findings:
            print("  OK no early peak, spike, NaN/inf or flat tail")
        for line in run.notes:
            note("NOTE %s" % line)
    return core.EXIT_FAIL if findings else 0


def cmd_steps(args):
    path = args.file
    regexes = args.log_regex or ()
    if not os.path.isfile(path):
        raise core.UsageError("%s is not a file (give a *.jsonl or *.csv metrics file, or a log with --log-regex)"
                              % path)
    if regexes:
        return steps_from_log(path, regexes)
    if not path.lower().endswith((".jsonl", ".csv")):
        raise core.UsageError("%s is not a *.jsonl or *.csv metrics file" % path)
    try:
        records = read_jsonl(path) if path.lower().endswith(".jsonl") else read_csv(path)
    except (OSError, csv.Error) as exc:
        raise core.UsageError("cannot read %s: %s" % (path, getattr(exc, "strerror", None) or exc))
    series = records_to_series(records)
    if not series:
        raise Missing("%s holds no numeric metric" % path)
    return print_steps(series)


def print_steps(series):
    """One JSON line per (step, name) point, each name's points together (what repro.sh compares)."""
    for name in sorted(series):
        for step, value in series[name]:
            sys.stdout.write(json.dumps(jsonable({"step": step, name: value}), ensure_ascii=False,
                                        allow_nan=False) + "\n")
    sys.stdout.flush()
    return 0


def steps_from_log(path, regexes):
    """steps FILE --log-regex RE...: the regexes' series of the text log FILE, each name's points together."""
    named = {}
    for index, rx in enumerate(regexes, 1):
        for name in rx.groupindex:
            if name not in ("step", "epoch") and named.setdefault(name, index) != index:
                raise core.UsageError("--log-regex #%d and #%d both name %r: steps prints bare names, so give the "
                                      "groups different names" % (named[name], index, name))
    try:
        found = log_series(path, regexes)
    except OSError as exc:
        raise core.UsageError("cannot read %s: %s" % (path, exc.strerror or exc))
    series = {}
    for index, (one, bad) in enumerate(found, 1):
        if bad[0]:
            note("NOTE --log-regex #%d: %d matching line(s) had a step or value that is not a number, the first: %s"
                 % (index, bad[0], show(bad[1], 100)))
        series.update(one)
    if not series:
        raise Missing("no line of %s matches %s" % (path, " or ".join(show(rx.pattern, 80) for rx in regexes)))
    return print_steps(series)


# ---------------------------------------------------------------- plot (matplotlib, only when asked)

EXIT_NO_MATPLOTLIB = 4
PLOT_SIZE = (1280, 720)   # pixels, at PLOT_DPI
PLOT_DPI = 100


def size_arg(text):
    """An argparse type: WIDTHxHEIGHT in pixels, each 200..8000."""
    match = re.match(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$", text)
    if not match or not all(200 <= int(g) <= 8000 for g in match.groups()):
        raise argparse.ArgumentTypeError("%r is not WIDTHxHEIGHT in pixels, each 200..8000 (e.g. 1280x720)" % text)
    return int(match.group(1)), int(match.group(2))


def load_matplotlib():
    """(Figure, FigureCanvasAgg), imported only here so --help and the other commands never need them."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise NoMatplotlib("plot needs matplotlib, which is not importable here (%s): pip install matplotlib, "
                           "or read the same findings as text with `curve`" % (str(exc)[:120] or "ImportError"))
    return Figure, FigureCanvasAgg


class NoMatplotlib(Exception):
    """plot without matplotlib: exit EXIT_NO_MATPLOTLIB."""


def plot_facts(run, metric, mode, window, z_limit):
    """What the picture of one run shows, as data: points, best, spikes, NaN/inf steps, restarts, attempts."""
    points = metric_for(run, metric)
    attempts = runrec.attempt_number(run.path) if os.path.isdir(run.path) else 1
    entry = {"run": run.path, "name": run.label, "missing": points is None, "attempts": attempts,
             "source": run.origin.get(metric), "notes": run.notes}
    if points is None:
        return entry, None
    stats = best_last(points, mode)
    findings = curve_findings(points, mode, window, z_limit, flat_k=10 ** 9)  # flat tails are for `curve`
    resume = run.resumes.get(metric) or {}
    entry.update(points=stats["points"], best=stats["best"], best_step=stats["best_step"], last=stats["last"],
                 last_step=stats["last_step"],
                 spikes=[f["step"] for f in findings if f["kind"] == "spike" and "value" in f],
                 nonfinite_steps=[s for s, v in points if not math.isfinite(v)],
                 restarts=list(resume.get("restarts") or []), replaced=len(resume.get("replaced") or []))
    if attempts > 1 and not entry["restarts"]:
        entry["notes"] = entry["notes"] + [
            "%d attempts (previous/ holds %d), but no step was logged twice, so the resume points are not on "
            "the curve" % (attempts, attempts - 1)]
    return entry, (points, findings, resume)


def draw(figure, metric, mode, drawn):
    """One axes: each run's curve, earlier attempts' replaced points, restarts, spikes, NaN/inf, the best."""
    from matplotlib.transforms import blended_transform_factory
    ax = figure.add_subplot(1, 1, 1)
    top = blended_transform_factory(ax.transData, ax.transAxes)
    shown = set()

    def once(kind):
        if kind in shown:
            return None
        shown.add(kind)
        return kind

    epochs = False
    for index, (entry, (points, _findings, resume)) in enumerate(drawn):
        color = "C%d" % (index % 10)
        x = plot_x(points)
        epochs = epochs or any(isinstance(s, EpochStep) for s, _v in points[:1])
        finite = [(s, v) for s, v in points if math.isfinite(v)]
        name = entry["name"] + (" (%d attempts)" % entry["attempts"] if entry["attempts"] > 1 else "")
        ax.plot([x(s) for s, _v in points], [v if math.isfinite(v) else float("nan") for _s, v in points], color=color,
                linewidth=1.4, label=name, zorder=2)  # a NaN/inf point leaves a gap in the line
        old = [(s, v) for s, v in resume.get("replaced") or () if math.isfinite(v)]
        if old:
            ax.scatter([x(s) for s, _v in old], [v for _s, v in old], s=10, color=color, alpha=0.35, zorder=1,
                       label=once("replaced by a later attempt"))
        for step in entry["restarts"]:
            ax.axvline(x(step), color=color, linestyle="--", linewidth=1.0, alpha=0.7, zorder=1,
                       label=once("resume (a step logged again)"))
        values = dict(finite)
        spikes = [(s, values[s]) for s in entry["spikes"] if s in values]
        if spikes:
            ax.scatter([x(s) for s, _v in spikes], [v for _s, v in spikes], s=70, marker="^", facecolors="none",
                       edgecolors="red", linewidths=1.5, zorder=4, label=once("spike"))
        if entry["nonfinite_steps"]:
            ax.scatter([x(s) for s in entry["nonfinite_steps"]], [0.98] * len(entry["nonfinite_steps"]), transform=top, s=40,
                       marker="x", color="red", zorder=4, label=once("NaN/inf"))
        if entry["best_step"] is not None:
            ax.scatter([x(entry["best_step"])], [entry["best"]], s=180, marker="*", color=color, edgecolors="black",
                       linewidths=0.8, zorder=5, label=once("best"))
            ax.annotate("best %s @ %s" % (fmt(entry["best"]), entry["best_step"]),
                        (x(entry["best_step"]), entry["best"]), textcoords="offset points", xytext=(6, 8 + 12 * index),
                        fontsize=8, color=color)
    ax.set_xlabel("epoch (batch as its fraction)" if epochs else "step")
    ax.set_ylabel(metric)
    ax.set_title("%s (%s is better)" % (metric, "lower" if mode == "min" else "higher"))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)


def cmd_plot(args):
    out = args.out
    if not out.lower().endswith(".png"):
        raise core.UsageError("--out %s: give a .png file name" % out)
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise core.UsageError("--out %s: the folder %s does not exist" % (out, folder))
    if os.path.isdir(out):
        raise core.UsageError("--out %s is a directory" % out)
    mode, how = resolve_mode(args.metric.split(":")[-1], args.mode)
    if mode is None:
        raise core.UsageError("cannot tell from the name whether higher or lower %r is better; give --mode min "
                              "or --mode max" % args.metric)
    figure_class, canvas_class = load_matplotlib()  # before reading runs: a missing package fails fast
    regexes = args.log_regex or ()
    runs = runs_from(args.runs, regexes)
    entries, drawn = [], []
    for run in runs:
        entry, data = plot_facts(run, args.metric, mode, args.window, args.z)
        entries.append(entry)
        if data is not None:
            drawn.append((entry, data))
    if not drawn:
        hints = [log_hint(r, regexes) for r in runs]
        raise Missing("no run has %r%s" % (args.metric, next((h for h in hints if h), "")))
    width, height = args.size
    figure = figure_class(figsize=(width / float(PLOT_DPI), height / float(PLOT_DPI)), dpi=PLOT_DPI)
    canvas_class(figure)
    draw(figure, args.metric, mode, drawn)
    figure.tight_layout()
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=PLOT_DPI)  # no bbox_inches="tight": the size stays what was asked
    core.atomic_write(out, buf.getvalue())
    if args.json:
        emit({"out": out, "metric": args.metric, "mode": mode, "mode_from": how, "size": [width, height],
              "log_regex": [rx.pattern for rx in regexes], "runs": entries})
        return 0
    print("PLOT %s: %s (%s better, %s), %d of %d run(s) drawn, %dx%d px" % (
        out, args.metric, "lower" if mode == "min" else "higher", how, len(drawn), len(entries), width, height))
    for entry in entries:
        if entry["missing"]:
            print("  %-30s MISSING (no source logs it)" % entry["name"][:30])
            continue
        print("  %-30s best %s at step %s; last %s at step %s; %d spike(s); %d NaN/inf; resumes at %s; "
              "%d attempt(s)" % (entry["name"][:30], fmt(entry["best"]), entry["best_step"], fmt(entry["last"]),
                                 entry["last_step"], len(entry["spikes"]), len(entry["nonfinite_steps"]),
                                 ", ".join(str(s) for s in entry["restarts"]) or "none", entry["attempts"]))
    for entry in entries:
        for line in entry["notes"]:
            note("NOTE %s: %s" % (entry["name"], line))
    return 0


EXIT_EPILOG = core.exit_codes_epilog(__doc__)


def spike_options(p, note=""):
    """--window and --z, the spike rule's two knobs, for curve and for plot (which marks what curve reports)."""
    p.add_argument("--window", type=core.arg_number(int, 4, 10001), default=10, metavar="N",
                   help="neighbours a spike is judged against%s (default 10)" % note)
    p.add_argument("--z", type=core.arg_number(float, 0.0, 1e9, low_open=True), default=6.0, metavar="Z",
                   help="robust z-score above which a point is a spike%s (default 6)" % note)


def build_parser():
    parser = core.Parser(prog=PROG, description="Run forensics from a run's own records (see the docstring).",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_EPILOG)
    sub = parser.add_subparsers(dest="command", parser_class=core.Parser, help="what to read: COMMAND --help")
    mode = dict(choices=("min", "max"), default=None,
                help="min or max is better (default: from the metric's name: loss lower, acc higher)")
    log_rx = dict(action="append", type=log_regex_arg, default=None, metavar="RE",
                  help="a Python regex for job.log lines: (?P<step>...) and one named group per metric; repeatable")
    json_out = dict(action="store_true", help="print JSON")

    def command(name, help_text):
        return sub.add_parser(name, help=help_text, formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=EXIT_EPILOG)

    p = command("list", "best / last / step of best per run")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run dirs (a folder of runs lists each), or wandb:E/P")
    p.add_argument("--metric", default=None, metavar="NAME",
                   help="the metric (default: every metric whose direction its name makes clear)")
    p.add_argument("--mode", **mode)
    p.add_argument("--log-regex", **log_rx)
    p.add_argument("--json", **json_out)
    p = command("diff", "differing config and environment keys of two runs")
    p.add_argument("run_a", metavar="RUN_A", help="the first run dir (or wandb:E/P/ID)")
    p.add_argument("run_b", metavar="RUN_B", help="the second run dir (or wandb:E/P/ID)")
    p.add_argument("--all", action="store_true", help="show every key, not only those that differ")
    p.add_argument("--json", **json_out)
    p = command("curve", "early peak, spikes, NaN/inf, flat tail")
    p.add_argument("run", metavar="RUN", help="the run dir (or wandb:E/P/ID)")
    p.add_argument("--metric", required=True, metavar="NAME", help="the metric whose curve is read")
    p.add_argument("--mode", **mode)
    p.add_argument("--log-regex", **log_rx)
    spike_options(p)
    p.add_argument("--flat-k", type=core.arg_number(int, 2, 10 ** 9), default=20, metavar="K",
                   help="the last K points are checked for a flat tail (default 20)")
    p.add_argument("--flat-tol", type=core.arg_number(float, 0.0, 1.0), default=1e-6, metavar="T",
                   help="relative change under which the tail counts as flat (default 1e-6)")
    p.add_argument("--decline", type=core.arg_number(float, 0.0, 1.0, low_open=True), default=0.1, metavar="F",
                   help="fall from the best, as a share of the range, that makes an early peak (default 0.1)")
    p.add_argument("--json", **json_out)
    p = command("plot", "a PNG of one metric for one or more runs: spikes, resumes, best step marked")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run dirs (a folder of runs draws each), or wandb:E/P/ID")
    p.add_argument("--metric", required=True, metavar="NAME", help="the metric to draw")
    p.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write (atomically; replaced if there)")
    p.add_argument("--mode", **mode)
    p.add_argument("--log-regex", **log_rx)
    spike_options(p, ", as in curve")
    p.add_argument("--size", type=size_arg, default=PLOT_SIZE, metavar="WxH",
                   help="the image size in pixels (default %dx%d)" % PLOT_SIZE)
    p.add_argument("--json", action="store_true", help="print what was drawn as JSON")
    p = command("steps", "one metrics file, last value per step, as JSON lines")
    p.add_argument("file", metavar="FILE", help="a .jsonl or .csv metrics file, or a job.log read through --log-regex")
    p.add_argument("--log-regex", **log_rx)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    core.guard_output(getattr(args, "json", False))   # metric names and paths come from runs: finding_laptop_L10
    if not args.command:
        raise core.UsageError("give a command: list, diff, curve, plot or steps")
    if getattr(args, "metric", None) is not None and not args.metric.strip():
        raise core.UsageError("--metric is empty")
    try:
        return {"list": cmd_list, "diff": cmd_diff, "curve": cmd_curve, "plot": cmd_plot,
                "steps": cmd_steps}[args.command](args)
    except Missing as exc:
        core.say_error(exc, PROG)
        return EXIT_MISSING
    except NoMatplotlib as exc:
        core.say_error(exc, PROG)
        return EXIT_NO_MATPLOTLIB


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
