#!/usr/bin/env python3
"""metrics_readers.py: reads a run's own records (logs, metric files, TensorBoard, W&B, configs) into one Run.

The readers behind run_forensics.py (list, diff, curve, plot, steps) and repro.py: each source a run dir can
hold becomes named series of (step, value) points, the last value of each step in step order, with what the
log order says about resumes, plus the run's flattened config and environment. What a source could not give
(a missing package, a damaged file) is a note on the run, never a guess; a package a command needs and
cannot import raises Missing (run_forensics.py exits 5). run_forensics.py --help documents each source.

A library: imported, never run (no command line). Python 3.8+; tensorboard, wandb and PyYAML are imported
only when a run holds what needs them.
"""
import argparse
import csv
import json
import math
import os
import re
import struct
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "node"))
import rgt_core as core  # noqa: E402
import run_env  # noqa: E402  (clean_url: a W&B record's git remote may hold a credential)

STEP_KEYS = ("step", "global_step", "_step", "iteration", "iter", "epoch")
SKIP_DIRS = {"previous", "logs", "__pycache__", "node_modules", ".git"}
MAX_DEPTH = 4
LOG_NAMES = ("job.log", "logs/job.log")   # the node run dir's stdout, and the copy a pull brings back
SUPERVISOR_MARK = "[rgt "                  # supervise.py's own lines in job.log: "[rgt 13:01:54] ..."
SUPERVISOR_START = "] starting: "          # ... and the one it writes as each attempt starts the job
NANOGPT_HINT = "--log-regex 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'"
CONFIG_NAMES = ("config.json", "config.yaml", "config.yml", "hparams.yaml", "hparams.yml", "hparams.json",
                "args.json", "args.yaml", "resolved_config.json", "resolved_config.yaml")


class Missing(Exception):
    """A package or source the answer needs is not there (run_forensics.py: exit EXIT_MISSING, 5)."""


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
