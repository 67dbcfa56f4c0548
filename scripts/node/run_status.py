#!/usr/bin/env python3
"""Read-only: one line (or JSON) says what a run is doing and whether anything still watches the meter.

The states: starting, running, stalled, succeeded, failed, sync failed, or stopped by the dead-man.
Python 3.8+ standard library only; runs from the node folder beside rgt_core.py.

Usage:
  run_status.py RUN_DIR [--json] [--watch SECONDS] [--stall-minutes M] [--gpu-timeout S] [--no-gpu]
                [--rate-per-hour PRICE]

  RUN_DIR                the run directory (made by run_one.sh)
  --json                 all fields as one JSON object (with --watch: one compact object per line)
  --watch SECONDS        a line every SECONDS until the run ends (or the dead-man fires)
  --stall-minutes M      override the stall limit; by default the limit the run's dead-man was
                         armed with (deadman.json), else 30 (rgt_core.stall_minutes_for)
  --gpu-timeout S        seconds to wait for nvidia-smi, a hard timeout (default 3)
  --no-gpu               do not call nvidia-smi
  --rate-per-hour PRICE  the box's hourly price: adds the run's cost so far (job time x price)

Example line:
  RUNNING step 120/500 (24%) epoch 3 hb 3s ago eta 4m gpu 87% disk 41.0 GiB free deadman armed
  toolkit 50af0cf993c3bfaa

How the run is classified (RUN_DIR is the layout run_one.sh creates):
  DEADMAN_FIRED  DEADMAN_FIRED.json exists (or deadman.json says fired); wins over everything
                 else, because the box may already be stopped. The job's own outcome is still shown.
  SUCCEEDED      status.json state succeeded (job exited 0 and the outputs synced and verified)
  FAILED         state failed; or state running/starting while the job is gone and no exit_code
                 file exists ("job vanished": OOM killer, kill -9, reboot)
  SYNC_FAILED    state sync_failed: the job may have finished, but its outputs are NOT safe yet;
                 also state syncing while the supervisor that syncs is gone (a full disk, a crash)
  SYNCING        state syncing (job ended, outputs being copied); counted as running
  STALLED        live job, but the newest of heartbeat.json / job.log was modified longer ago than
                 the stall limit (also: stuck in starting that long)
  RUNNING        live job with recent activity
  STARTING       status.json says starting, or only run.json / run.lock exist so far

Liveness of the job, the supervisor and the dead-man uses the identities status.json and
deadman.json record (pid + start time + boot id, rgt_core.record_alive), so a pid reused after a
container restart never reads as a live job or an armed dead-man.

The dead-man is shown in every state: "deadman armed", "deadman DOWN" (it says armed but its
process is gone), "deadman exited" (stopped by a signal), "deadman disarmed", "deadman none" (never
armed), or the firing ("stop pending" until its first stop attempt has run). Messages the dead-man
could not deliver are counted: "notify: N message(s) NOT delivered". A finished run (succeeded,
failed, sync_failed) whose dead-man is DOWN or exited and never fired is UNWATCHED: nothing on the
node stops the meter, so it exits 8 with a hint (re-arm the dead-man, or stop the box yourself once
the outputs are safe), whatever the job's outcome.

The sync is read from status.json "sync": "outputs verified (N files, SIZE)", "outputs NOT
verified: REASON", or, for a run launched with no outputs declared, what was synced ("no outputs
declared; logs synced and verified"). The toolkit version (VERSION.json) is on every line and in
the JSON, so a report says which scripts produced it.

The JSON also gives newest_output / newest_output_age_s: the newest file the run's output globs (given to run_one.sh)
match in its cwd (for most jobs, the last checkpoint), so a watcher sees checkpoints go stale;
attempt and resume (the checkpoint this attempt resumed from, what was skipped, a durable copy put back);
line, the text-mode line.

Step and total: from heartbeat.json, else the last job.log line the launch's progress regex (run.json
progress_regex) matches; a total neither gives comes from run.json total_steps, the total the launch
was given for a trainer that prints none. A job that writes no heartbeat gets no "hb" age on the line.

ETA: with --watch, from the progress between two looks; else from the heartbeat's sec_per_step when
the job writes it (examples/train_resumable.py does); else this attempt's average: the steps since
the step it started at, over the time since status.json started_at. Attempt 1 counts from step 0.
A resumed attempt (attempt > 1, or status.json "resume" names a checkpoint) counts from the first
step it logged (progress lines after the supervisor's "starting:" note in job.log); when
that is unknown the ETA is left out and the JSON's eta_basis says why, never a guess from step 0.
GPU figures come from nvidia-smi on THIS machine; the liveness checks are skipped when run.json
names another host.

Exit codes:
  0 succeeded   1 failed, sync_failed or interrupted   2 usage / not a run dir / unreadable state
  4 running (or syncing)   5 starting   6 stalled   7 dead-man fired
  8 finished but UNWATCHED (the dead-man is down or exited and never fired)
"""
import json
import os
import shutil
import sys
import time

import rgt_core as core
import evidence
import progress
import runrec
from progress import as_int, num

EXIT = {"succeeded": 0, "failed": 1, "sync_failed": 1, "interrupted": 1, "running": 4, "syncing": 4,
        "starting": 5, "stalled": 6, "deadman_fired": 7}
EXIT_UNWATCHED = 8
TERMINAL = set(runrec.REPORTED_OVER)
HINT = {
    "failed": "read job.log, fix the cause, then resume it as the next attempt: rgt.py resume HOST RID (on the "
              "node: boot_resume.py --run RUN_DIR); it continues from a checkpoint if the trainer resumes by "
              "itself or the launch gave --resume-glob/--resume-arg",
    "sync_failed": "outputs are not durable yet: check status.json sync.error and the disk, re-run the sync; "
                   "do NOT tear down",
    "stalled": "look at job.log and the process (py-spy dump, nvidia-smi); the dead-man fires at its "
               "own stall limit",
    "interrupted": "stopped from outside (preemption, a stop, the dead-man) before it finished, whatever the "
                   "trainer's exit code: resume it as the next attempt (rgt.py resume HOST RID; on the node "
                   "boot_resume.py --run RUN_DIR)",
    "deadman_fired": "read DEADMAN_FIRED.json: check whether the meter really stopped and whether outputs "
                     "are durable before anything else",
}
UNWATCHED_HINT = ("UNWATCHED: the dead-man is %s and never fired, so nothing on the node stops the meter: "
                  "re-arm it (deadman.py arm --run-dir %s ...) or stop the box yourself once the outputs are safe")
NONE_HINT = "no dead-man was ever armed for this run: nothing on the node stops the meter"


# ---------------------------------------------------------------- small readers

# (what the log's tail says, the reason shown, the first thing to read): the failures a user meets most.
KNOWN_FAILURES = (
    (("CUDA out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED"), "CUDA out of memory",
     "GPU memory ran out: smaller batch, activation checkpointing or mixed precision "
     "(references/training/oom-memory.md); then resume it as the next attempt"),
    (("NCCL error", "Watchdog caught collective operation timeout", "NCCL WARN"), "NCCL / collective failure",
     "a distributed collective failed or timed out (references/training/distributed-launch.md)"),
    (("No space left on device",), "disk full",
     "a disk filled up: free space or move outputs (references/run-remote/gotchas-disk.md); check inodes too"),
)


def known_failure(log_path, exit_code, tail_bytes=64 << 10):
    """(reason, hint) when the end of job.log names a failure users meet often, else None; exit 137 with no
    message in the log is the kernel's OOM killer (the cgroup memory limit), not a bug in the job."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            tail = fh.read().decode("utf-8", "replace")
    except OSError:
        tail = ""
    for needles, reason, hint in KNOWN_FAILURES:
        if any(n in tail for n in needles):
            return reason, hint
    if exit_code == 137:
        return ("killed (exit 137: SIGKILL, usually the OOM killer at the container's memory limit)",
                "host or cgroup RAM ran out: watch it with mem_monitor.sh (references/training/oom-memory.md)")
    return None


def read_state(path):
    """A run-dir state file as a dict; None when absent; UsageError (exit 2) when damaged.

    Writers replace these files atomically; one retry covers a filesystem without atomic rename."""
    for attempt in (0, 1):
        if not os.path.lexists(path):
            return None
        try:
            return core.load_json_strict(path, "state file")
        except core.UsageError as exc:
            if "not a JSON object" in str(exc):
                raise core.UsageError("%s does not hold a JSON object" % path)
            if attempt:
                raise
            time.sleep(0.1)
    return None


def read_int(path):
    try:
        with open(path, "r", encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


# ---------------------------------------------------------------- machine facts

GPU_QUERY = ["--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]


def gpu_info(timeout):
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found"
    res = core.run_bounded([exe] + GPU_QUERY, timeout, kill_grace=0.5)
    return gpu_parse(res.rc, res.output, res.timed_out, timeout, res.error)


def gpu_parse(rc, output, timed_out=False, timeout=None, error=None):
    """(gpus, None) from nvidia-smi's CSV (GPU_QUERY), or (None, why)."""
    if timed_out:
        return None, "nvidia-smi timed out after %gs (driver hung? see gpu_health.sh)" % timeout
    if error:
        return None, "nvidia-smi failed to start: %s" % error
    if rc != 0:
        first = output.strip().splitlines()
        return None, "nvidia-smi exited %s: %s" % (rc, first[0][:120] if first else "no output")
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        gpus.append({"index": as_int(parts[0]), "util_pct": as_int(parts[1]),
                     "mem_used_mib": as_int(parts[2]), "mem_total_mib": as_int(parts[3])})
    if not gpus:
        return None, "nvidia-smi listed no GPUs"
    return gpus, None


def newest_output(run):
    """(mtime, relative path) of the newest file the run's --output globs match in its cwd, the last
    checkpoint for most jobs; None when nothing is declared or matches. Read-only."""
    outputs, cwd = (run or {}).get("outputs"), (run or {}).get("cwd")
    if not isinstance(outputs, list) or not outputs or not isinstance(cwd, str) or not os.path.isdir(cwd):
        return None
    try:
        patterns = [evidence.check_pattern(o) for o in outputs if isinstance(o, str)]
        chosen, _problems, _notes, _unmatched = evidence.select(os.path.realpath(cwd), patterns, set())
    except (core.UsageError, OSError):
        return None
    newest = None
    for rel, real in chosen.items():
        stamp = mtime(real)
        if stamp is not None and (newest is None or stamp > newest[0]):
            newest = (stamp, rel)
    return newest


def disk_info(path):
    try:
        info = core.disk_check(path)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return disk_percentages(info)


def disk_percentages(info):
    total, inodes = info["total_bytes"], info.get("total_inodes")
    info["free_pct"] = round(100.0 * info["free_bytes"] / total, 1) if total else None
    info["inodes_free_pct"] = round(100.0 * info["free_inodes"] / inodes, 1) \
        if inodes and info["free_inodes"] is not None else None
    return info


class Here(object):
    """The machine classify() reads beyond the run dir's files: this one. remote_status.py (the laptop's
    one-trip `rgt.py status`) passes the same facts as the node's shell gathered them (status_facts.sh)."""
    procs = core.HERE

    def now(self):
        return time.time()

    def hostname(self):
        return os.uname().nodename

    def disk(self, run_dir):
        return disk_info(run_dir)

    def newest_output(self, run):
        """(mtime, relative path) of the newest file the run's output globs match in its cwd, or None."""
        return newest_output(run)

    def gpu(self, timeout):
        return gpu_info(timeout)

    def toolkit_version(self):
        return core.toolkit_version()


# ---------------------------------------------------------------- formatting

def sync_words(r):
    sync = r.get("sync")
    if not sync or r["status"] not in ("succeeded", "sync_failed", "interrupted", "deadman_fired"):
        return None
    good = sync.get("ok") is True and sync.get("verified") is True
    count, size = sync.get("file_count"), sync.get("total_bytes")
    amount = "%s files, %s" % (count, core.human_bytes(size)) if isinstance(count, int) and \
        isinstance(size, int) else None
    if not good:
        return "outputs NOT verified" + (": %s" % str(sync["error"])[:120] if sync.get("error") else "")
    kept = sync.get("kept_generation") if isinstance(sync.get("kept_generation"), dict) else None
    gen = ("; generation %s replaced attempt %s's results, kept in %s (%s)" % (
        sync.get("generation"), kept.get("attempt"), kept.get("dir"), kept.get("why")) if kept else "")
    unsure = sync.get("continuity") if isinstance(sync.get("continuity"), dict) else {}
    if not kept and unsure.get("why") and unsure.get("continued") is None:
        gen += "; replaced attempt %s's results as a resume from a step not known (no heartbeat step or " \
               "--progress-regex line to compare)" % unsure.get("durable_attempt")
    if r.get("outputs_declared") is False:
        return "no outputs declared; logs synced and verified" + (" (%s)" % amount if amount else "") + gen
    return "outputs verified" + (" (%s)" % amount if amount else "") + gen


def stale_daemon(run_dir, dm, current):
    """True when a live dead-man runs older code than the toolkit now in its folder (a push after it armed)."""
    loaded = core.read_json(os.path.join(run_dir, "deadman.json")).get("loaded_version")
    return bool(dm.get("watching") and loaded and current and loaded != current)


def stop_pending(fired):
    """True while a firing has run no stop attempt yet (the job's stop signal and its sync come first)."""
    if not fired or fired.get("ok") is not False or fired.get("dry_run") or fired.get("attempts"):
        return False
    return not any(fired.get(k) for k in ("refused", "message", "error", "fallback", "last_resort_rc"))


def notify_lost(doc):
    """The dead-man's count of messages dropped or refused (deadman.json notify_lost), or None."""
    lost = doc.get("notify_lost") if isinstance(doc, dict) else None
    if not isinstance(lost, dict) or not isinstance(lost.get("count"), int):
        return None
    return {"lost": lost["count"], "last": lost.get("last") if isinstance(lost.get("last"), str) else None}


def deadman_words(dm):
    word = dm["word"]
    if word == "FIRED":
        return None                       # the status word already says so
    if word == "ARMED" and dm["alive"] is None:
        return "deadman armed (not checked: another host)"
    return "deadman %s" % (word if word == "DOWN" else word.lower())


def stop_words(dm):
    """What the stop did, in words that match the record (findings N12, N17, C7): "stop pending" before any
    attempt, the attempts' real exit codes, a refused destructive stop and its fallback, the retries."""
    if dm.get("dry_run"):
        return "dry run (nothing was stopped)"
    codes = dm.get("stop_exit_codes") or []
    retry = dm.get("stop_retry") or {}
    if dm.get("stop_ok") is None and dm.get("stop_confirmed") is None and not codes:
        return None
    if dm.get("stop_pending"):
        return "stop pending (no stop attempt has run yet)"   # findings N4, N12: never FAILED before an attempt
    said = "exit code%s %s" % ("" if len(codes) == 1 else "s", ", ".join(codes)) if codes else "no attempt ran"
    if dm.get("stop_refused"):
        if dm.get("stop_ok") and codes:
            words = "destructive stop refused, fallback ran (%s)" % (
                "confirmed" if dm.get("stop_confirmed") else "unconfirmed")
        else:
            words = "destructive stop refused, %s (%s)" % ("fallback FAILED" if codes else "no fallback ran", said)
    elif dm.get("stop_confirmed") is False:
        words = "STOP NOT CONFIRMED (attempts: %s; this box may still be billing: stop it by hand)" % said
    elif dm.get("stop_ok"):
        words = "stop command ok%s" % (" (confirmed)" if dm.get("stop_confirmed") else "")
    else:
        words = "stop command FAILED (%s)" % said
    if retry.get("since"):
        words += "; stop retried %d time(s) since %s%s" % (
            retry.get("tries") or 0, retry["since"],
            {"waiting": ", next at %s" % retry.get("next_at"), "running": ", a retry is running now",
             "acknowledged": ", retries ended by an ACK", "confirmed": ", confirmed on the last retry"}.get(
                retry.get("state"), ""))
    return core.redact(words)


def one_line(r):
    word = r["status"].upper()
    bits = [word]
    dm = r["deadman"]
    if r["status"] == "deadman_fired":
        bits.append("reason %s" % (dm.get("fired_reason") or "?"))
        words = stop_words(dm)
        if words:
            bits.append(words)
        bits.append("(job %s)" % (r.get("state") or "?"))
    elif r.get("reason"):
        bits.append(r["reason"])
    if r.get("step") is not None:
        total = r.get("total_steps")
        progress = "step %s" % r["step"] + ("/%s" % total if total is not None else "")
        if r.get("percent") is not None:
            progress += " (%d%%)" % int(r["percent"])
        bits.append(progress)
        if r.get("epoch") is not None:
            bits.append("epoch %s" % r["epoch"])
        if r.get("heartbeat_age_s") is not None:   # a job that writes no heartbeat gets no "hb n/a" noise
            bits.append("hb %s ago" % core.human_age(r["heartbeat_age_s"]))
    elif r["status"] in ("running", "starting", "stalled"):
        bits.append("no heartbeat yet")
    if r["status"] in ("running", "stalled") and r.get("eta_s") is not None:
        bits.append("eta %s" % core.human_age(r["eta_s"]))
    gpus = r.get("gpu")
    if gpus:
        bits.append("gpu " + ",".join("%s%%" % (g["util_pct"] if g["util_pct"] is not None else "?") for g in gpus))
    else:
        bits.append("gpu n/a")
    disk = r.get("disk") or {}
    if "free_bytes" in disk:
        bits.append("disk %s free" % core.human_bytes(disk["free_bytes"]))
        pct = disk.get("inodes_free_pct")
        low = disk.get("free_inodes") is not None and disk["free_inodes"] < core.DEFAULT_MIN_FREE_INODES
        if pct is not None and (pct < 5 or low):
            bits.append("inodes LOW %s%% free" % pct)
    cap = r.get("cap_stopped")
    if cap and r["status"] != "deadman_fired":
        others = cap.get("other_runs") or []
        bits.append("cap reached: this run stopped, box left on for %d other run%s" % (
            len(others), "" if len(others) == 1 else "s"))
    synced = sync_words(r)
    if synced:
        bits.append(synced)
    shown = deadman_words(dm)
    if shown:
        bits.append(shown)
    if dm.get("stale_code"):
        bits.append("deadman runs OLDER CODE (%s) than the pushed toolkit: re-arm it" % dm.get("loaded_version"))
    lost = (r.get("notify") or {}).get("lost")
    if lost:
        bits.append("notify: %d message(s) NOT delivered (%s)" % (lost, (r["notify"].get("last") or "?")[:120]))
    if r.get("cost_so_far") is not None:
        bits.append("cost ~%.2f over %s" % (r["cost_so_far"], core.human_age(r["cost_hours"] * 3600)))
    bits.append("toolkit %s" % (r.get("toolkit_version") or "unstamped"))
    if r.get("hint"):
        bits.append("-- " + r["hint"])
    return " ".join(str(b) for b in bits)


# ---------------------------------------------------------------- classification

def classify(run_dir, stall_override=None, want_gpu=True, gpu_timeout=3.0, prev=None, machine=None, shown=None):
    """The run's state as one dict (the JSON of --json). MACHINE: what is read beyond the run dir's files
    (Here(): this machine); SHOWN: the run dir as the output names it (default RUN_DIR)."""
    if not os.path.isdir(run_dir):
        raise core.UsageError(("not a directory: %s" if os.path.exists(run_dir) else "no such run dir: %s")
                              % run_dir)
    machine = machine or Here()
    now = machine.now()
    p = lambda name: os.path.join(run_dir, name)   # noqa: E731
    run = read_state(p("run.json"))
    status = read_state(p("status.json"))
    if status is None and run is None and not os.path.isdir(p("run.lock")):
        raise core.UsageError("%s is not a run dir (no status.json, run.json or run.lock)" % run_dir)
    status = status or {}
    hb = core.read_json(p("heartbeat.json"))

    state = status.get("state")
    if state is not None and state not in runrec.STORED:
        raise core.UsageError("status.json has an unknown state %r" % (state,))
    exit_code = read_int(p("exit_code"))
    if exit_code is None and num(status.get("exit_code")) is not None:
        exit_code = int(status["exit_code"])
    job_pid = status.get("job_pid")
    job_pid = job_pid if isinstance(job_pid, int) and not isinstance(job_pid, bool) else None
    host = (run or {}).get("host")
    here = machine.hostname()
    same_host = not host or host in (here, here.split(".")[0]) or here.startswith(str(host) + ".")
    started = core.parse_iso(status.get("started_at"))
    procs = machine.procs
    act = runrec.activity(status, procs=procs, same_host=same_host)   # the one liveness rule (finding D2)
    alive = act["job"] if job_pid else None
    sup_alive = act["supervisor"]

    where = progress.current(run_dir, run or {}, hb)
    step, total = where["step"], where["total_steps"]
    hb_time = num(hb.get("time"))
    hb_mtime = mtime(p("heartbeat.json"))
    activity_age = core.progress_age(run_dir, now)
    status_mtime = mtime(p("status.json"))
    stall_minutes = core.stall_minutes_for(run_dir, stall_override)
    outputs = (run or {}).get("outputs")
    dm = core.deadman_state(run_dir, check_alive=same_host, procs=procs)
    version = machine.toolkit_version()
    fired = dm["fired"] or {}

    r = {"run_dir": shown or os.path.abspath(run_dir), "run_id": status.get("run_id") or (run or {}).get("run_id"),
         "status": None, "exit": None, "state": state, "reason": None, "hint": None,
         "job_pid": job_pid, "job_alive": alive, "supervisor_alive": sup_alive, "exit_code": exit_code,
         "host": host, "step": step, "total_steps": total, "total_source": where["total_source"],
         "epoch": hb.get("epoch"), "loss": hb.get("loss"),
         "progress_source": where["progress_source"], "attempt": status.get("attempt"),
         "resume": status.get("resume") if isinstance(status.get("resume"), dict) else None,
         "percent": round(100.0 * step / total, 1) if (step is not None and total) else None,
         "heartbeat_age_s": round(now - (hb_time if hb_time is not None else hb_mtime), 1)
         if (hb_time is not None or hb_mtime is not None) else None,
         "activity_age_s": round(activity_age, 1) if activity_age is not None else None,
         "stall_minutes": stall_minutes, "eta_s": None, "eta_basis": None,
         "gpu": None, "gpu_reason": None, "disk": machine.disk(run_dir),
         "outputs_declared": bool(outputs) if isinstance(outputs, list) else None,
         "newest_output_age_s": None, "newest_output": None,
         "deadman": {"state": dm["state"], "word": dm["word"], "pid": dm["pid"], "alive": dm["alive"],
                     "watching": dm["watching"], "fired": dm["word"] == "FIRED",
                     "stall_minutes": dm["config"].get("stall_minutes"),
                     "fired_reason": fired.get("reason"), "fired_detail": fired.get("detail"),
                     "fired_at": fired.get("fired_at"), "stop_ok": fired.get("ok"),
                     "stop_confirmed": fired.get("confirmed"), "dry_run": fired.get("dry_run"),
                     "stop_exit_codes": ["timed out" if a.get("timed_out") else str(a.get("rc"))
                                         for a in (fired.get("attempts") or []) if isinstance(a, dict)],
                     "stop_refused": bool(fired.get("refused")), "stop_message": fired.get("message"),
                     "stop_retry": fired.get("stop_retry") if isinstance(fired.get("stop_retry"), dict) else None,
                     "stop_pending": stop_pending(fired),
                     "loaded_version": (core.read_json(p("deadman.json")).get("loaded_version") or None),
                     "stale_code": stale_daemon(run_dir, dm, version)},
         "unwatched": False, "sync": None, "toolkit_version": version, "checked_at": core.utc_iso(now),
         "lease": runrec.lease_view(read_state(p(runrec.LEASE)), now), "cap_stopped": None,
         "notify": notify_lost(core.read_json(p("deadman.json")))}
    cap = core.read_json(p(runrec.CAP_STOPPED))   # a damaged record only loses this line
    if cap:   # finding C2: the run's cap stopped this run only
        others = cap.get("other_runs") if isinstance(cap.get("other_runs"), list) else []
        r["cap_stopped"] = {"reason": cap.get("reason"), "at": cap.get("at"), "scope": cap.get("scope"),
                            "other_runs": [str(o) for o in others]}
    newest = machine.newest_output(run) if same_host else None
    if newest:
        r["newest_output_age_s"], r["newest_output"] = round(max(0.0, now - newest[0]), 1), newest[1]
    if not same_host:
        r["job_alive_note"] = "run.json host %s is not this machine (%s): pids not checked" % (host, here)
    sync = status.get("sync")
    if isinstance(sync, dict):
        r["sync"] = {k: sync.get(k) for k in ("ok", "verified", "error", "results_dir", "manifest", "file_count",
                                              "total_bytes", "kept_previous", "finished_at", "generation",
                                              "kept_generation", "left_out", "step", "continuity")}

    # -- decide
    quiet_for = activity_age if activity_age is not None else (
        now - (started or status_mtime) if (started or status_mtime) else None)
    if dm["word"] == "FIRED":
        word = "deadman_fired"
    elif state == "succeeded":
        word = "succeeded"
    elif state == "failed":
        word = "failed"
        r["reason"] = "job exited %s" % exit_code if exit_code is not None else "job failed"
    elif state == "interrupted":
        word = "interrupted"
        r["reason"] = "stopped by %s; job exited %s" % (status.get("interrupted_by") or "a signal", exit_code)
    elif state == "sync_failed":
        word = "sync_failed"
        err = (sync or {}).get("error") if isinstance(sync, dict) else None
        r["reason"] = "sync failed" + (": %s" % str(err)[:160] if err else "")
    elif state == "syncing" and sup_alive is False:
        word = "sync_failed"
        r["reason"] = ("the supervisor (pid %s) is gone but the run still says syncing: the sync never finished "
                       "(full disk? see supervisor.log); outputs are NOT durable" % status.get("supervisor_pid"))
    elif state == "syncing":
        word = "syncing"
        r["reason"] = "job exited %s, copying outputs" % exit_code if exit_code is not None else "copying outputs"
    elif state in ("running", "starting") and alive is False and exit_code is None and sup_alive:
        # the job just ended and its supervisor is writing the exit code: not vanished, just late
        word = "syncing"
        r["reason"] = "job ended; the supervisor is recording its exit"
    elif state in ("running", "starting") and alive is False and exit_code is None:
        word = "failed"
        r["reason"] = "job vanished (pid %s gone, or reused by another process; no exit_code)" % job_pid
    elif state == "running" and alive is False:
        quiet = now - status_mtime if status_mtime else 0
        if exit_code != 0:
            word, r["reason"] = "failed", "job exited %s" % exit_code
        elif core.is_stalled(quiet, stall_minutes):
            word = "stalled"
            r["reason"] = "job exited 0 but status.json unchanged for %s (wrapper gone?)" % core.human_age(quiet)
        else:
            word, r["reason"] = "syncing", "job exited 0, wrapper finishing"
    elif state == "running":
        if core.is_stalled(quiet_for, stall_minutes):
            word = "stalled"
            r["reason"] = "no heartbeat/log activity for %s (limit %s)" % (
                core.human_age(quiet_for), core.human_age(stall_minutes * 60))
        else:
            word = "running"
    else:   # starting, or no status.json yet
        since = now - (started or status_mtime or mtime(p("run.json")) or now)
        if core.is_stalled(since, stall_minutes) and (alive is None or alive) and \
                (quiet_for is None or core.is_stalled(quiet_for, stall_minutes)):
            word = "stalled"
            r["reason"] = "still starting after %s" % core.human_age(since)
        else:
            word = "starting"
    r["status"], r["exit"], r["hint"] = word, EXIT[word], HINT.get(word)
    if word == "failed" and status.get("exit_code") in (143, 130, 129):
        # 128 + SIGTERM/SIGINT/SIGHUP: stopped from outside (preemption, a drill, a stop), not a bug
        r["hint"] = ("stopped by a signal (exit %s), e.g. preemption or a manual stop: resume it as the next "
                     "attempt in the same run dir (rgt.py resume HOST RID; on the node boot_resume.py --run "
                     "RUN_DIR); a resumable job continues from its newest checkpoint" % status.get("exit_code"))
    if word == "failed" and status.get("exit_code") not in (143, 130, 129):
        known = known_failure(p("job.log"), status.get("exit_code"))
        if known:
            r["reason"], r["hint"] = known
    if word == "deadman_fired":
        r["reason"] = "dead-man fired: %s" % (fired.get("reason") or "see deadman.log")
    elif word in TERMINAL and dm["word"] in ("DOWN", "EXITED"):
        r["unwatched"], r["exit"] = True, EXIT_UNWATCHED
        unwatched = UNWATCHED_HINT % (dm["word"].lower() if dm["word"] == "EXITED" else "DOWN", r["run_dir"])
        r["hint"] = unwatched + ("; " + r["hint"] if r["hint"] else "")
    elif word in TERMINAL and dm["word"] == "NONE":
        r["hint"] = NONE_HINT + ("; " + r["hint"] if r["hint"] else "")

    # -- ETA
    if word in ("running", "stalled") and step is not None and total and step < total:
        r["eta_s"], r["eta_basis"] = progress.eta(step, total, hb, started, status, run, p("job.log"), now, prev)
    elif word in ("succeeded", "syncing") or (word == "running" and step is not None and total and step >= total):
        r["eta_s"], r["eta_basis"] = 0, "done"

    if want_gpu:
        r["gpu"], r["gpu_reason"] = machine.gpu(gpu_timeout)
    else:
        r["gpu_reason"] = "skipped (--no-gpu)"
    return r


positive_number = core.arg_number(float, 0.0, 1e9, low_open=True)   # also refuses nan and inf


def parse_args(argv):
    ap = core.Parser(
        prog="run_status.py", formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__),
        description="Classify a run dir: starting/running/stalled/succeeded/failed/sync_failed/deadman_fired\n"
                    "(the module docstring says how each is decided, and how the ETA is made).")
    ap.add_argument("run_dir", help="the run directory (made by run_one.sh)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (JSON lines with --watch)")
    ap.add_argument("--stall-minutes", type=positive_number, default=None,
                    help="a live job quiet for longer than this is STALLED (default: the dead-man's limit, "
                         "else %g; floats allowed)" % core.DEFAULT_STALL_MINUTES)
    ap.add_argument("--watch", type=positive_number, metavar="SECONDS",
                    help="repeat every SECONDS until the run succeeds, fails, or the dead-man fires")
    ap.add_argument("--gpu-timeout", type=positive_number, default=3.0,
                    help="seconds to wait for nvidia-smi (default 3)")
    ap.add_argument("--no-gpu", action="store_true", help="do not call nvidia-smi")
    ap.add_argument("--rate-per-hour", type=positive_number, metavar="PRICE",
                    help="the box's hourly price: adds the run's cost so far (job time x price; the box itself "
                         "may have billed longer, from before the launch and after the end)")
    return ap.parse_args(argv)


def add_cost(r, run_dir, rate, now=None):
    """cost_so_far = hours from the job's start to its end (or NOW) x rate, rounded to cents."""
    status = core.read_json(os.path.join(run_dir, "status.json"))
    started = core.parse_iso(status.get("started_at"))
    if started is None:
        r["cost_so_far"], r["cost_note"] = None, "no started_at in status.json yet"
        return
    ended = core.parse_iso(status.get("ended_at")) if r["status"] in TERMINAL else None
    hours = max(0.0, ((ended or (time.time() if now is None else now)) - started) / 3600.0)
    r["cost_so_far"] = round(hours * rate, 2)
    r["cost_hours"] = round(hours, 3)
    r["cost_note"] = "job time x rate; the box may have billed longer"


def emit(r, as_json, lines):
    if as_json:
        r = dict(r, line=one_line(r))  # the text-mode line, for callers that print it (rgt.py status)
    if as_json and lines:
        sys.stdout.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    elif as_json:
        core.emit_json(r)
    else:
        sys.stdout.write(one_line(r) + "\n")
        sys.stdout.flush()


def main(argv=None):
    core.check_toolkit()
    args = parse_args(argv)
    prev = None
    while True:
        r = classify(args.run_dir, args.stall_minutes, not args.no_gpu, args.gpu_timeout, prev)
        if args.rate_per_hour:
            add_cost(r, args.run_dir, args.rate_per_hour)
        emit(r, args.json, args.watch is not None)
        if args.watch is None or r["status"] in TERMINAL:
            return r["exit"]
        if r.get("step") is not None and (prev is None or prev.get("step") is None):
            prev = {"step": r["step"], "at": time.time()}
        time.sleep(args.watch)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="run_status.py"))
