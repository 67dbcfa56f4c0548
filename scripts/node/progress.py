#!/usr/bin/env python3
"""A run's step, total and ETA, read one way by every tool that shows or acts on progress.

Step and total come from heartbeat.json, else from the last job.log line the launch's progress
regex (run.json progress_regex) matches; a total neither gives comes from run.json total_steps. The
ETA is the heartbeat's sec_per_step when the job writes it, else this attempt's average rate (steps
since the step the attempt started at, over the time since it started). Used by run_status.py (its
line and JSON), sync.py (which step an attempt reached) and the dead-man (the first_progress message).
A library module (no command line).
"""
import math
import os
import re

import rgt_core as core

HEARTBEAT = "heartbeat.json"
JOB_LOG = "job.log"
# supervise.py notes each attempt's start in job.log: "[rgt HH:MM:SS] starting: CMD (cwd DIR)"
ATTEMPT_START = re.compile(rb"\n\[rgt [0-9:]+\] starting: ")


def num(value):
    """A finite int/float from JSON, else None (JSON also admits NaN and Infinity)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def as_int(text):
    try:
        return int(float(text))
    except ValueError:
        return None   # "[N/A]" on some GPUs (MIG, old drivers)


def progress_of(rx, line):
    """(step, total) from one log line the --progress-regex matches, else None. Supervisor notes
    ("[rgt 13:01:54] ...") are never progress."""
    if line.startswith("[rgt "):
        return None
    match = rx.search(line)
    if not match:
        return None
    named = match.groupdict()
    groups = match.groups()
    step = named.get("step") if "step" in named else (groups[0] if groups else None)
    total = named.get("total") if "total" in named else (groups[1] if len(groups) > 1 and "step" not in named
                                                            else None)
    step = num(as_int(step)) if step is not None else None
    # a second group that is not a whole number >= step (a loss, a learning rate) is not a total
    whole = total is not None and re.match(r"^\s*\d+\s*$", str(total))
    total = num(as_int(total)) if whole else None
    if total is not None and step is not None and total < step:
        total = None
    return step, total


def log_progress(log_path, pattern, tail_bytes=256 * 1024):
    """(step, total) from the last job.log line the run's --progress-regex matches, else (None, None).
    For code that writes no heartbeat: `step 120/500`, tqdm's `120/500 [`, `Epoch 3 ... it 120 of 500`."""
    try:
        rx = re.compile(pattern)
        with open(log_path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log_path) - tail_bytes))
            lines = handle.read().decode("utf-8", "replace").replace("\r", "\n").splitlines()
    except (OSError, re.error):
        return None, None
    for line in reversed(lines):
        found = progress_of(rx, line)
        if found is not None:
            return found
    return None, None


def attempt_first_step(log_path, pattern, limit=64 << 20, chunk=1 << 20):
    """The first step the --progress-regex finds in THIS attempt's part of job.log (after the supervisor's
    last "starting:" note), else None. job.log is appended across attempts, so the attempt's first progress
    line is where a resumed job started counting. Reads at most LIMIT bytes back and LIMIT forward."""
    return attempt_steps(log_path, pattern, limit, chunk, last=False)[0]


def attempt_steps(log_path, pattern, limit=64 << 20, chunk=1 << 20, last=True):
    """(first, last): the first and the last step the --progress-regex finds in THIS attempt's part of job.log
    (see attempt_first_step), each None when unknown; with LAST False the scan stops at the first one."""
    first = final = None
    try:
        rx = re.compile(pattern)
        size = os.path.getsize(log_path)
        with open(log_path, "rb") as handle:
            start, pos, carry = None, size, b""
            while pos > 0 and size - pos < limit and start is None:
                take = min(chunk, pos)
                pos -= take
                handle.seek(pos)
                block = handle.read(take) + carry
                lead = b"\n" if pos == 0 else b""   # the file's first line starts a line too
                marks = list(ATTEMPT_START.finditer(lead + block))
                if marks:
                    start = pos + marks[-1].end() - len(lead)
                carry = block[:64]
            if start is None:
                return None, None
            handle.seek(start)
            handle.readline()   # the rest of the "starting:" note
            read = 0
            for raw in handle:
                read += len(raw)
                if read > limit:
                    return first, None   # the attempt's part goes on past LIMIT: its last step is not read
                for line in raw.decode("utf-8", "replace").replace("\r", "\n").splitlines():
                    found = progress_of(rx, line)
                    if found is not None and found[0] is not None:
                        first = found[0] if first is None else first
                        final = found[0]
                        if not last:
                            return first, None
    except (OSError, re.error):
        return first, None
    return first, final


def current(run_dir, run=None, hb=None):
    """Where the run is now: {"step", "total_steps", "progress_source", "total_source"} (None where unknown).
    RUN is run.json and HB heartbeat.json as already read (read here when not given)."""
    run = run if isinstance(run, dict) else core.read_json(os.path.join(run_dir, "run.json"))
    hb = hb if isinstance(hb, dict) else core.read_json(os.path.join(run_dir, HEARTBEAT))
    step, total = num(hb.get("step")), num(hb.get("total_steps"))
    source = "heartbeat" if step is not None else None
    if step is None and run.get("progress_regex"):
        step, total = log_progress(os.path.join(run_dir, JOB_LOG), run["progress_regex"])
        source = "job.log (--progress-regex)" if step is not None else None
    total_source = "heartbeat" if total is not None and source == "heartbeat" else \
        ("job.log (--progress-regex)" if total is not None else None)
    launched = num(run.get("total_steps"))
    if total is None and launched is not None and launched > 0:
        total, total_source = launched, "run.json (--total-steps)"
    return {"step": step, "total_steps": total, "progress_source": source, "total_source": total_source}


def eta(step, total, hb, started, status, run, log_path, now, prev=None):
    """(eta_s, eta_basis) for a run at STEP of TOTAL, or (None, why) when it cannot be told. PREV
    ({"step", "at"}: an earlier look) gives the watched rate; else the heartbeat's sec_per_step; else
    this attempt's average since STARTED (epoch of status.json started_at)."""
    if step is None or not total or step >= total:
        return None, None
    remaining = total - step
    sps = num((hb or {}).get("sec_per_step"))
    if prev and prev.get("step") is not None and step > prev["step"] and prev.get("at"):
        rate = (step - prev["step"]) / max(now - prev["at"], 1e-6)
        return round(remaining / rate), "watched progress"
    if sps and sps > 0:
        return round(remaining * sps), "heartbeat sec_per_step"
    if started:
        hb_time = num((hb or {}).get("time"))
        return average_eta(status, run, log_path, step, remaining, (hb_time or now) - started)
    return None, None


def average_eta(status, run, log_path, step, remaining, elapsed):
    """(eta_s, eta_basis) from this attempt's average rate: the steps since the step it started at, over the
    time since it started. A resumed attempt (attempt > 1, or a resume from a checkpoint) started where the
    checkpoint left off, not at 0: that step is the first this attempt logged (--progress-regex); when it is
    unknown the ETA is left out and eta_basis says why (an average from 0 would be far too low)."""
    status = status or {}
    attempt = status.get("attempt")
    resume = status.get("resume") if isinstance(status.get("resume"), dict) else {}
    resumed = (isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 1) or bool(resume.get("from"))
    pattern = (run or {}).get("progress_regex")
    first = attempt_first_step(log_path, pattern) if (resumed and pattern) else None
    if not resumed:
        start, basis = 0, "average since started_at (from step 0; low if the trainer resumed by itself)"
    elif first is not None:
        start, basis = first, "average since this attempt's first logged step %s" % first
    elif "from" in resume and not resume.get("from"):
        start, basis = 0, "average since started_at (attempt %s started fresh: no good checkpoint)" % attempt
    else:
        why = "attempt %s resumed%s from a step this status cannot see (no heartbeat sec_per_step%s)" % (
            attempt, " from %s" % resume["from"] if resume.get("from") else "",
            ", no progress line of this attempt in job.log" if pattern else ", no --progress-regex")
        return None, "unknown: " + why
    done = step - start
    if done <= 0 or elapsed <= 0:
        return None, "unknown: no progress in this attempt yet (%s)" % basis
    return round(remaining * elapsed / done), basis


def attempt_progress(run_dir, status, run=None):
    """This attempt's own progress: {"step", "total_steps", "first_step", "heartbeat"}, each None (the heartbeat
    {}) when unknown. A heartbeat.json older than the attempt's start (status.json started_at) belongs to an
    earlier attempt and is not read; a step from job.log counts only once this attempt logged one (the first
    of them is first_step)."""
    nothing = {"step": None, "total_steps": None, "first_step": None, "heartbeat": {}}
    run = run if isinstance(run, dict) else core.read_json(os.path.join(run_dir, "run.json"))
    started = core.parse_iso((status or {}).get("started_at"))
    if started is None:
        return nothing
    hb = {}
    try:
        if os.stat(os.path.join(run_dir, HEARTBEAT)).st_mtime >= started:
            hb = core.read_json(os.path.join(run_dir, HEARTBEAT))
    except OSError:
        pass
    first = None
    if num(hb.get("step")) is None and run.get("progress_regex"):
        first = attempt_first_step(os.path.join(run_dir, JOB_LOG), run["progress_regex"])
        if first is None:
            return nothing
    where = current(run_dir, run, hb)
    return {"step": where["step"], "total_steps": where["total_steps"], "first_step": first, "heartbeat": hb}
