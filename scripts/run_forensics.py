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
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
sys.path.insert(0, HERE)   # metrics_readers beside this file, also when run through runpy or from elsewhere
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402  (attempt_number: the attempts a run dir's previous/ holds)
from metrics_readers import (EpochStep, Missing, jsonable, log_hint, log_regex_arg, log_series,  # noqa: E402
                             one_run, read_csv, read_jsonl, records_to_series, runs_from, show)

PROG = "run_forensics.py"
EXIT_MISSING = 5   # nothing to read: not a refusal, so not 3 (review D9)
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


def note(line):
    sys.stderr.write("%s: %s\n" % (PROG, line))


# ---------------------------------------------------------------- small helpers

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


def emit(obj):
    """--json output: strict JSON (see jsonable), in the shared layout."""
    core.emit_json(jsonable(obj))



def plot_x(points):
    """STEP -> its place on a plot's x axis: the step itself, or for (epoch, batch) steps the epoch plus the
    batch's fraction of the longest epoch of POINTS (epoch 2 batch 300 of 600 -> 2.5)."""
    batches = [s[1] for s, _v in points if isinstance(s, EpochStep)]
    width = float(max(batches) + 1) if batches else 1.0
    return lambda s: s[0] + s[1] / width if isinstance(s, EpochStep) else s


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
