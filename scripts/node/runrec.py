#!/usr/bin/env python3
"""The run record: one module owns a run's layout, states, liveness, attempt number and status writes.

Guarantee: every status.json write goes through set_status/save_status under RUN_DIR/.status.lock
with an allowed transition, survives a full disk by giving up a reserve file, and every reader gets
the same answer to "is this run alive" (pid + start time + boot id) and "which attempt is this".
A torn or unreadable status.json is UNREADABLE, never "no job". The box keeps one registry of run
dirs (whatever durable dir they live under) so a watcher sees every run on the box.

Schema: status.schema.json beside this file. A library module (no command line).
"""
import contextlib
import hashlib
import json
import math
import os
import time

import rgt_core as core

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

STATUS = "status.json"
RUN = "run.json"
STATUS_LOCK = ".status.lock"
RESERVE = ".rgt-reserve"
PREVIOUS = "previous"
# The launch word for word when it carries a URL credential (a presigned data URL, https://user:token@): 0600, in
# the run dir only, never synced, read by the supervisor and boot_resume.py's replay; run.json holds it scrubbed.
RAW_ARGV = ".launch-argv.json"
RUN_LOCK = "run.lock"   # a dir holding the pid of the launcher, then of the supervisor
# the job's cwd, then one --output glob per line: what status_facts.sh (a shell, which reads no JSON) needs to
# find the newest output (launcher.write_outputs_list).
OUTPUTS_LIST = "outputs.txt"
# What the watchers already told about this run (first_progress per attempt, a disk still low), so a re-armed
# dead-man does not tell it again. Written by the dead-man only; no secret in it.
NOTIFIED = "notified.json"
# The run's lease (issue 39): renewed by its dead-man at every tick, read by status and by the laptop's reaper,
# which stops a box whose lease ran out (a hung box, a killed dead-man) from outside.
LEASE = "lease.json"
LEASE_TTL_MIN_S = 300.0
# The dead-man stopped this run at its cap and left the box on for other runs (finding C2): read by run_status.
CAP_STOPPED = "CAP_STOPPED.json"
SCHEMA_VERSION = 1

# The run's vocabulary, one definition imported everywhere (finding D3). STORED: what writers put in status.json
# "state" (= status.schema.json's enum); ACTIVE and TERMINAL split it. REPORTED: run_status.py's words, which
# add two a reader derives and nobody stores: stalled (from the heartbeat's age) and deadman_fired (from
# DEADMAN_FIRED.json).
ACTIVE = ("starting", "running", "syncing")
TERMINAL = ("succeeded", "failed", "sync_failed", "interrupted")
STORED = ACTIVE + TERMINAL
STATES = STORED
REPORTED = STORED + ("stalled", "deadman_fired")
REPORTED_ACTIVE = ACTIVE + ("stalled",)       # reported words of a run still going (it may still bill)
REPORTED_OVER = TERMINAL + ("deadman_fired",)  # reported words of a run that is over
# Which state may follow which within one attempt (a new attempt starts over with init_attempt()).
ALLOWED = {
    None: set(STORED),
    "starting": set(STORED),
    "running": set(STORED) - {"starting"},
    "syncing": {"syncing"} | set(TERMINAL),
}
for _t in TERMINAL:
    ALLOWED[_t] = set(TERMINAL)   # a sweep may re-sync a finished run, never revive it


def path(run_dir, name=STATUS):
    return os.path.join(run_dir, name)


def layout(durable_dir, run_id, run_dir=None):
    """{"runs_dir", "run_dir", "results_dir"}: where a run lives, derived here only (finding D4). Under a durable
    dir: DURABLE/runs/RID and DURABLE/results/RID (an explicit RUN_DIR wins for the run dir). Without one, the
    results go to RUN_DIR/results, only as durable as the run dir."""
    if durable_dir:
        runs = os.path.join(durable_dir, "runs")
        return {"runs_dir": runs, "run_dir": run_dir or os.path.join(runs, run_id),
                "results_dir": os.path.join(durable_dir, "results", run_id)}
    return {"runs_dir": os.path.dirname(run_dir), "run_dir": run_dir, "results_dir": os.path.join(run_dir, "results")}


def results_dir(run_dir, run=None):
    """Where RUN_DIR's results are: run.json results_dir (what the launch derived), else the layout's fallback."""
    run = run if isinstance(run, dict) else core.read_json(path(run_dir, RUN))
    found = run.get("results_dir")
    return found if isinstance(found, str) and found else layout(None, run.get("run_id"), run_dir)["results_dir"]


# ---------------------------------------------------------------- reading

def read_status(run_dir):
    """(doc, problem): doc {} with problem None when there is no status.json yet; doc None with a
    problem when it exists but cannot be read or parsed (torn by a full disk, hand-edited)."""
    p = path(run_dir)
    try:
        with open(p, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return None, "cannot read %s: %s" % (p, exc.strerror or exc)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, "%s is not valid JSON (%s): torn or damaged" % (p, exc)
    if not isinstance(doc, dict):
        return None, "%s is not a JSON object" % p
    return doc, None


def status(run_dir):
    """status.json as a dict ({} when absent or unreadable): for readers that only print."""
    doc, _problem = read_status(run_dir)
    return doc or {}


# ---------------------------------------------------------------- liveness

ROLES = ("job", "supervisor", "launcher")   # the processes a status.json records, each with pid + identity


def activity(doc, run_dir=None, procs=None, same_host=True):
    """Is the run alive? The one rule every reader uses (finding D2): {"job", "supervisor", "launcher",
    "resuming", "any", "why"}.

    Each role is True when the process status.json records for it is still that same process (pid + start time +
    boot id; a record without an identity: the pid, not started after the attempt's started_at), False when it
    is gone, None when nothing is recorded for it or it cannot be checked here (SAME_HOST false: another
    machine's record). resuming: boot_resume.py holds RUN_DIR/resume.lock (starting the next attempt). any: one
    of them is alive (None when nothing could be checked on this machine). PROCS: the process table to read
    (rgt_core.HERE; run_status passes a snapshot's)."""
    procs = core.HERE if procs is None else procs
    started = core.parse_iso(doc.get("started_at"))
    out = {}
    for role in ROLES:
        pid, ident = doc.get(role + "_pid"), doc.get(role + "_identity")
        if not (pid or isinstance(ident, dict)) or not same_host:
            out[role] = None
        else:
            out[role] = bool(core.record_alive(ident, pid, started, procs))
    out["resuming"] = bool(run_dir) and same_host and resume_in_progress(run_dir)
    live = [role for role in ROLES + ("resuming",) if out[role]]
    out["any"] = bool(live) if same_host else None
    out["why"] = ("%s alive" % " and ".join(live)) if live else None
    return out


def resume_in_progress(run_dir):
    """Whether a resume holds RUN_DIR/resume.lock now (boot_resume.py is starting the next attempt)."""
    return core.lock_held(os.path.join(run_dir, "resume.lock"))


def run_activity(run_dir):
    """Whether any attempt of the run in RUN_DIR may still run -> {"live", "state", "attempt", "why", "generation",
    "exit_code", "error", "results_step", "total_steps"}. Live: the recorded supervisor or job is alive, a resume
    is starting the next attempt, or the run says it is starting and has no process recorded yet. The teardown
    gate refuses while this says live, and names the state and the generations in its verdict (it streams this
    module to the node with the core: teardown_gate.RUN_STATE_ENTRY)."""
    if not os.path.isdir(run_dir):
        return {"live": False, "state": None, "attempt": None, "why": "no run dir at %s" % run_dir}
    status = core.read_json(os.path.join(run_dir, "status.json"))
    state, attempt = status.get("state"), status.get("attempt")
    out = {"live": False, "state": state, "attempt": attempt, "why": None}
    if resume_in_progress(run_dir):
        out.update(live=True, why="a resume is starting the next attempt")
    elif any(activity(status)[role] for role in ROLES):
        out.update(live=True, why="attempt %s is %s (its process is alive)" % (attempt, state))
    elif state == "starting" and not (status.get("supervisor_pid") or status.get("job_pid")):
        out.update(live=True, why="attempt %s is starting (no process recorded yet)" % attempt)
    # which generation the results dir holds (the attempt whose verified sync wrote it), and the earlier ones kept
    record = core.read_json(os.path.join(run_dir, "generation.json"))
    gen = record.get("attempt")
    sync = status.get("sync") if isinstance(status.get("sync"), dict) else {}
    kept = [g for g in sync.get("generations") or [] if isinstance(g, str)]
    # why each was kept (the attempt after it did not continue it): generation.json's list, and this attempt's
    why = dict(record["kept"]) if isinstance(record.get("kept"), dict) else {}
    last = sync.get("kept_generation")
    if isinstance(last, dict) and isinstance(last.get("dir"), str):
        why[last["dir"]] = last.get("why")
    out["generation"] = {"attempt": gen if isinstance(gen, int) else None, "kept": kept,
                         "why": {d: str(why[d]) for d in kept if why.get(d)}}
    # how the run ended, and where its results stand (the step its last verified sync recorded, of the total
    # heartbeat.json or the launch gave), so a gate PASS can say "interrupted at step 2 of 6"
    code = status.get("exit_code")
    out["exit_code"] = code if isinstance(code, int) and not isinstance(code, bool) else None
    out["error"] = status.get("error")[:300] if isinstance(status.get("error"), str) else None
    step = sync.get("step") if isinstance(sync.get("step"), dict) else {}
    total = core.read_json(os.path.join(run_dir, "heartbeat.json")).get("total_steps")
    if not _count(total):
        total = core.read_json(os.path.join(run_dir, "run.json")).get("total_steps")
    out["results_step"] = step.get("step") if _count(step.get("step")) else None
    out["total_steps"] = total if _count(total) else None
    return out


def _count(value):
    """Whether VALUE is a plain finite non-negative number (a step or a total as a record holds it)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def liveness(doc, fallback_pid=None, fallback_identity=None):
    """(job_pid, job_alive, helper_alive) for a status doc (activity(); the dead-man's own --job-pid when the
    doc records no job): helper is the supervisor or the launcher."""
    act = activity(doc)
    if doc.get("job_pid"):
        job_pid, job_alive = doc.get("job_pid"), bool(act["job"])
    else:
        job_pid = fallback_pid
        job_alive = bool(job_pid) and bool(core.record_alive(fallback_identity, job_pid,
                                                             core.parse_iso(doc.get("started_at"))))
    return job_pid, job_alive, bool(act["supervisor"] or act["launcher"])


def is_active(doc, run_dir=None):
    """Active state and one of its processes (job, supervisor, launcher) still that same process, or a resume
    starting it (activity())."""
    return doc.get("state") in ACTIVE and bool(activity(doc, run_dir)["any"])


def lock_owner(run_dir):
    """The pid (text) written in RUN_DIR/run.lock, or "" when there is none."""
    try:
        with open(os.path.join(run_dir, RUN_LOCK, "pid")) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def raw_launch(run_dir, run):
    """(cmd, launch_argv) word for word: from the 0600 RAW_ARGV file when the launch carried a URL credential,
    else run.json's own (nothing was scrubbed from it)."""
    raw = core.read_json(path(run_dir, RAW_ARGV))
    cmd, argv = raw.get("cmd"), raw.get("launch_argv")
    if isinstance(cmd, list) and isinstance(argv, list):
        return cmd, argv
    return run.get("cmd") or [], run.get("launch_argv") or []


def notify_events(run_dir, run=None):
    """The events this run asked to be told about (run.json notify_events, set by run_one.sh --notify-events;
    RUN: run.json as already read): a list of event names, or None (every event the targets take) when absent
    or malformed."""
    run = run if isinstance(run, dict) else core.read_json(path(run_dir, RUN))
    events = run.get("notify_events")
    if isinstance(events, list) and all(isinstance(e, str) for e in events):
        return list(events)
    return None


def notified(run_dir):
    """notified.json: {event: what was told and when} ({} when nothing was)."""
    return core.read_json(path(run_dir, NOTIFIED))


def attempt_number(run_dir):
    """1 for a new run dir; N+1 when N earlier attempts were moved to previous/."""
    try:
        return 1 + len([n for n in os.listdir(path(run_dir, PREVIOUS)) if not n.startswith(".")])
    except OSError:
        return 1


# ---------------------------------------------------------------- writing, under one lock

@contextlib.contextmanager
def status_lock(run_dir):
    """Exclusive flock on RUN_DIR/.status.lock for a read-modify-write of status.json."""
    fd = os.open(path(run_dir, STATUS_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_status(run_dir, doc):
    """Write status.json (caller holds the lock); on a full disk give up the reserve and try once more.
    Returns None, or the error text when it could not be written at all."""
    doc["updated_at"] = core.utc_iso()
    doc.setdefault("schema_version", SCHEMA_VERSION)
    return core.write_json_best_effort(path(run_dir), doc, reserve=path(run_dir, RESERVE))


def transition_problem(old, new):
    if new is None or new == old:
        return None
    if new not in STATES:
        return "unknown run state %r" % new
    if new not in ALLOWED.get(old, set(STATES)):
        return "status.json: %s -> %s is not an allowed transition" % (old, new)
    return None


def set_status(run_dir, **fields):
    """Update status.json under the lock; never raises for a filesystem error (returns its text)."""
    try:
        with status_lock(run_dir):
            doc = status(run_dir)
            problem = transition_problem(doc.get("state"), fields.get("state"))
            if problem:
                return problem
            doc.update(fields)
            return save_status(run_dir, doc)
    except OSError as exc:
        return "cannot lock status.json: %s" % (exc.strerror or exc)
    except core.UsageError as exc:   # status.json replaced by a link or a device: refuse, say so
        return str(exc)
    except (ValueError, TypeError) as exc:  # never let an odd value (a file name, say) end the writer
        return "cannot record status.json: %s: %s" % (type(exc).__name__, core.printable(str(exc)))


def init_attempt(run_dir, doc):
    """The first status.json of an attempt (launcher.py init, which holds the lock): written whatever the
    previous attempt's state, since a new attempt starts the transitions over. Raises OSError: a launch must
    not start without its record."""
    doc["updated_at"] = core.utc_iso()
    doc.setdefault("schema_version", SCHEMA_VERSION)
    core.atomic_write_json(path(run_dir), doc)


def fail_if_dead(run_dir, why):
    """Mark an active run whose every process is gone as failed (final_sweep.py: it died with the box), under the
    lock, so a launch or supervisor that is claiming it meanwhile is never marked. -> (marked, alive, problem):
    ALIVE is activity()'s why when one of its processes lives; PROBLEM the text of a write that failed."""
    try:
        with status_lock(run_dir):
            doc = status(run_dir)
            if doc.get("state") not in ACTIVE:
                return False, None, None
            act = activity(doc, run_dir)
            if act["any"]:
                return False, act["why"], None
            doc.update(state="failed", ended_at=core.utc_iso(), error=why)
            problem = save_status(run_dir, doc)
            return problem is None, None, problem
    except OSError as exc:
        return False, None, "cannot lock status.json: %s" % (exc.strerror or exc)
    except core.UsageError as exc:
        return False, None, str(exc)


def make_reserve(run_dir):
    return core.make_reserve(path(run_dir, RESERVE))


# ---------------------------------------------------------------- the box registry

def registry_dir():
    """One registry per box: $RGT_REGISTRY, else ~/.rgt/registry (not under any durable dir, so a run
    under a second durable dir is still seen)."""
    return os.environ.get("RGT_REGISTRY") or os.path.join(os.path.expanduser("~"), ".rgt", "registry")


def register(run_dir, registry=None):
    """Record RUN_DIR in the box registry (best effort: returns the error text or None)."""
    reg = registry or registry_dir()
    run_dir = os.path.realpath(run_dir)
    name = hashlib.sha256(run_dir.encode("utf-8", "surrogateescape")).hexdigest()[:20] + ".json"
    try:
        os.makedirs(reg, exist_ok=True)
        if os.path.exists(os.path.join(reg, name)):
            return None
    except OSError as exc:
        return "cannot use the run registry %s: %s" % (reg, exc.strerror or exc)
    return core.write_json_best_effort(os.path.join(reg, name), {"run_dir": run_dir, "at": core.utc_iso()})


def registered(registry=None):
    """Run dirs in the box registry that still exist."""
    reg = registry or registry_dir()
    found = []
    try:
        names = sorted(os.listdir(reg))
    except OSError:
        return found
    for name in names:
        doc = core.read_json(os.path.join(reg, name))
        run_dir = doc.get("run_dir")
        if isinstance(run_dir, str) and os.path.isdir(run_dir):
            found.append(run_dir)
    return found


def box_run_dirs(runs_dirs=(), registry=None):
    """Every run dir on the box: the registry, plus the run dirs under RUNS_DIRS (older runs)."""
    seen, out = set(), []
    listed = []
    for runs in runs_dirs:
        try:
            listed += [os.path.join(runs, n) for n in sorted(os.listdir(runs))]
        except OSError:
            continue
    for run_dir in registered(registry) + listed:
        real = os.path.realpath(run_dir)
        if real not in seen and os.path.isdir(run_dir):
            seen.add(real)
            out.append(run_dir)
    return out


def neighbour(run_dir, stall_minutes):
    """How another run on the box looks to a watcher: {name, run_dir, active, watched, progressing}.
    watched: its own dead-man is armed and alive; progressing: its heartbeat/log moved within
    STALL_MINUTES (a hung, unwatched neighbour must not hold the box on forever)."""
    doc, problem = read_status(run_dir)
    active = problem is None and is_active(doc or {}, run_dir)
    info = {"name": os.path.basename(run_dir), "run_dir": run_dir, "active": active, "watched": False,
            "progressing": False}
    if not active:
        return info
    info["watched"] = core.deadman_state(run_dir)["watching"]
    age = core.progress_age(run_dir)
    info["progressing"] = age is not None and not core.is_stalled(age, stall_minutes or core.DEFAULT_STALL_MINUTES)
    return info


def active_neighbours(exclude=(), runs_dirs=(), stall_minutes=None, registry=None):
    """Active runs on the box other than EXCLUDE, each with watched/progressing."""
    skip = {os.path.realpath(p) for p in exclude}
    out = []
    for run_dir in box_run_dirs(runs_dirs, registry):
        if os.path.realpath(run_dir) in skip:
            continue
        info = neighbour(run_dir, stall_minutes)
        if info["active"]:
            out.append(info)
    return out


# ---------------------------------------------------------------- ownership: the files each attempt wrote

FILES = "files.json"
GENERATION = "generation.json"


def identity(path):
    """(size, mtime_ns) of PATH as it is now, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def read_files(run_dir):
    """files.json: {"attempts": {"N": {"files": {rel: {"path", "size", "mtime_ns"}}, "recorded_at"}}}."""
    doc = core.read_json(path(run_dir, FILES))
    attempts = doc.get("attempts") if isinstance(doc.get("attempts"), dict) else {}
    return {"attempts": {k: v for k, v in attempts.items() if isinstance(v, dict) and isinstance(v.get("files"), dict)}}


def record_files(run_dir, attempt, files):
    """Add (or replace) ATTEMPT's list of the files it wrote: {rel: absolute path}. Best effort: the error text
    or None. Written under the status lock, so two writers never lose each other's attempt."""
    entries = {}
    for rel, full in sorted(files.items()):
        ident = identity(full)
        if ident is not None:
            entries[core.printable(rel)] = {"path": core.printable(os.path.realpath(full)), "size": ident[0],
                                            "mtime_ns": ident[1]}
    try:
        with status_lock(run_dir):
            doc = read_files(run_dir)
            doc["attempts"][str(attempt)] = {"files": entries, "recorded_at": core.utc_iso()}
            return core.write_json_best_effort(path(run_dir, FILES), doc, reserve=path(run_dir, RESERVE))
    except OSError as exc:
        return "cannot record files.json: %s" % (exc.strerror or exc)


def recorded(run_dir):
    """{(realpath, size, mtime_ns): attempt} over every attempt's record of RUN_DIR."""
    out = {}
    for attempt, item in read_files(run_dir)["attempts"].items():
        for entry in item["files"].values():
            if isinstance(entry, dict):
                out[(entry.get("path"), entry.get("size"), entry.get("mtime_ns"))] = attempt
    return out


def attempt_docs(run_dir):
    """status.json of every attempt of the run: the earlier ones (previous/*) first, the current one last."""
    docs = []
    try:
        names = sorted(os.listdir(path(run_dir, PREVIOUS)))
    except OSError:
        names = []
    for name in names:
        doc = core.read_json(os.path.join(run_dir, PREVIOUS, name, STATUS))
        if doc:
            docs.append(doc)
    docs.append(status(run_dir))
    return docs


def unrecorded_windows(run_dir):
    """[(start, end)] epoch windows of attempts that ran a job but left no files record (they died with the box):
    what they wrote can only be told by time. END None: still open (the attempt never recorded its end)."""
    have = set(read_files(run_dir)["attempts"])
    out = []
    for doc in attempt_docs(run_dir):
        if str(doc.get("attempt")) in have:
            continue
        start = doc.get("job_started_epoch")
        if not isinstance(start, (int, float)) or isinstance(start, bool):
            start = core.parse_iso(doc.get("started_at"))
            start = None if start is None else start - 1.0
        if start is None:
            continue
        end = core.parse_iso(doc.get("ended_at"))
        out.append((start, None if end is None else end + 2.0))
    return out


def other_owners(run_dir, registry=None):
    """{(realpath, size, mtime_ns): run id} of files other runs on the box recorded as theirs."""
    mine = os.path.realpath(run_dir)
    runs_dir = os.path.dirname(mine)
    out = {}
    for other in box_run_dirs([runs_dir], registry):
        if os.path.realpath(other) == mine:
            continue
        for key in recorded(other):
            out.setdefault(key, os.path.basename(other))
    return out


def owner_of(run_dir, full, mine=None, others=None, windows=None):
    """Who wrote the file FULL as it is now: ("self", attempt) when an attempt of this run recorded it (or, for an
    attempt that died unrecorded, it changed within that attempt's time); ("other", run id) when another run on
    the box recorded it; (None, None) when nobody did."""
    ident = identity(full)
    if ident is None:
        return None, None
    key = (os.path.realpath(full), ident[0], ident[1])
    mine = recorded(run_dir) if mine is None else mine
    if key in mine:
        return "self", mine[key]
    others = other_owners(run_dir) if others is None else others
    if key in others:
        return "other", others[key]
    mtime = ident[1] / 1e9
    for start, end in (unrecorded_windows(run_dir) if windows is None else windows):
        if mtime >= start and (end is None or mtime <= end):
            return "self", "unrecorded"
    return None, None


def lease_ttl(poll_seconds):
    """Seconds a lease holds without renewal: three polls of its dead-man, at least LEASE_TTL_MIN_S."""
    return max(LEASE_TTL_MIN_S, 3.0 * float(poll_seconds or 0))


def write_lease(run_dir, doc, reserve=None):
    """Renew the lease (atomic, best effort: a full disk never stops the watcher) -> an error text or None."""
    return core.write_json_best_effort(path(run_dir, LEASE), doc, reserve=reserve)


def lease_view(doc, now):
    """What a reader needs of a lease DOC at wall time NOW: its age, whether it ran out, who renews it; None when
    DOC is not a lease. Ages come from the node's own clock, so a laptop adds only the time since it read them."""
    if not isinstance(doc, dict) or not isinstance(doc.get("renewed_at"), (int, float)):
        return None
    ttl = doc.get("ttl_s") if isinstance(doc.get("ttl_s"), (int, float)) else LEASE_TTL_MIN_S
    age = max(0.0, float(now) - float(doc["renewed_at"]))
    watcher = doc.get("deadman") if isinstance(doc.get("deadman"), dict) else {}
    return {"renewed_at": core.utc_iso(doc["renewed_at"]), "age_s": round(age, 1), "ttl_s": ttl,
            "expired": age > ttl, "state": watcher.get("state"), "oom_protected": watcher.get("oom_protected"),
            "budget_deadline": doc.get("budget_deadline"), "boot_id": (doc.get("box") or {}).get("boot_id")
            if isinstance(doc.get("box"), dict) else None,
            "budget": doc.get("budget") if isinstance(doc.get("budget"), dict) else None}


def now_iso():
    return core.utc_iso(time.time())


# ---------------------------------------------------------------- the run's budget clock (issue 37)
# One clock for what a run has spent, on the node and on the laptop: the hours since the run's FIRST start
# (the first dead-man armed with a budget), across attempts, re-arms and reboots, less the time the box was
# suspended (a suspended box is frozen; the dead-man adds what it measured). Time the box was down between a
# kill or a reboot and the next arming still counts: the meter may have run, so the clock errs on the side of
# stopping early. RUN_DIR/budget.json: {"first_start": wall epoch, "suspended_s": s, "budget_usd", "rate_per_hour",
# "raised": [{from, to, spent, at}] when `resume --max-cost` changed the cap}. A spent budget refuses a resume.
BUDGET = "budget.json"


def budget_spent_hours(doc, now):
    """Hours spent on DOC's clock at wall time NOW (never negative)."""
    suspended = doc.get("suspended_s") if isinstance(doc.get("suspended_s"), (int, float)) else 0.0
    return max(0.0, float(now) - float(doc["first_start"]) - float(suspended)) / 3600.0


def read_budget(run_dir):
    """The run's budget clock, or None when no dead-man has started one (or the file is not one)."""
    doc = core.read_json(path(run_dir, BUDGET))
    if not isinstance(doc, dict) or not isinstance(doc.get("first_start"), (int, float)):
        return None
    return doc


def start_budget(run_dir, budget_usd, rate, now):
    """The run's budget clock, started at NOW unless an earlier arming already started it."""
    doc = read_budget(run_dir)
    if doc is None:
        doc = {"first_start": round(float(now), 3), "suspended_s": 0.0}
    doc.update(budget_usd=budget_usd, rate_per_hour=rate)
    error = core.write_json_best_effort(path(run_dir, BUDGET), doc)
    return doc, error


def add_suspended(run_dir, doc, seconds):
    """SECONDS of suspend measured by the dead-man: they do not count toward the budget."""
    doc["suspended_s"] = round(float(doc.get("suspended_s") or 0.0) + float(seconds), 3)
    return core.write_json_best_effort(path(run_dir, BUDGET), doc)


def budget_spent_usd(doc, now):
    """What DOC's clock has spent at wall time NOW: its hours x its rate, or None when it holds no rate."""
    rate = doc.get("rate_per_hour")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        return None
    return budget_spent_hours(doc, now) * float(rate)


def raise_budget(run_dir, doc, new_cap, spent):
    """The user's explicit new cap for the run (boot_resume.py --run --max-cost): the clock keeps it, and each
    change ({from, to, spent, at}) in "raised", so a cap is never changed silently. Raises OSError when the
    clock cannot be written (the resume then stops: a cap nobody recorded is no cap)."""
    doc = dict(doc)
    doc["raised"] = list(doc.get("raised") or []) + [{"from": doc.get("budget_usd"), "to": new_cap,
                                                      "spent": round(spent, 6), "at": now_iso()}]
    doc["budget_usd"] = new_cap
    core.atomic_write_json(path(run_dir, BUDGET), doc)
    return doc
