#!/usr/bin/env python3
"""Say in one line (or JSON) what a run is doing: starting, running, stalled, succeeded, failed,
sync failed, or stopped by the dead-man. Read-only; Python standard library only; safe to copy to a
node and run there.

Usage:
  run_status.py RUN_DIR                      one line, status word first
  run_status.py RUN_DIR --json               all fields as one JSON object
  run_status.py RUN_DIR --watch 30           a line every 30 s until the run ends
  options: --stall-minutes M (default 30)  --gpu-timeout S (default 3)  --no-gpu

Example line:
  RUNNING step 120/500 (24%) epoch 3 hb 3s ago eta 4m gpu 87% disk 41G free deadman armed

How the run is classified (RUN_DIR is the layout run_one.sh creates):
  DEADMAN_FIRED  DEADMAN_FIRED.json exists (or deadman.json says fired); wins over everything
                 else, because the box may already be stopped. The job's own outcome is still shown.
  SUCCEEDED      status.json state succeeded (job exited 0 and the outputs synced and verified)
  FAILED         state failed; or state running/starting while job_pid is gone and no exit_code
                 file exists ("job vanished": OOM killer, kill -9, reboot)
  SYNC_FAILED    state sync_failed: the job may have finished, but its outputs are NOT safe yet
  SYNCING        state syncing (job ended, outputs being copied); counted as running
  STALLED        live job, but the newest of heartbeat.json / job.log was modified longer ago than
                 --stall-minutes (also: stuck in starting that long)
  RUNNING        live job with recent activity
  STARTING       status.json says starting, or only run.json / run.lock exist so far

ETA: from the heartbeat's sec_per_step when the job writes it (examples/train_resumable.py does),
else the average since started_at (too low when the job resumed from a checkpoint), or, with
--watch, from the progress between two looks. GPU figures come from nvidia-smi on THIS machine;
the liveness check of job_pid is skipped when run.json names another host.

Exit codes:
  0 succeeded   1 failed or sync_failed   2 usage / not a run dir / unreadable state
  4 running (or syncing)   5 starting   6 stalled   7 dead-man fired
"""
import argparse
import datetime
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time

EXIT = {"succeeded": 0, "failed": 1, "sync_failed": 1, "running": 4, "syncing": 4,
        "starting": 5, "stalled": 6, "deadman_fired": 7}
TERMINAL = {"succeeded", "failed", "sync_failed", "deadman_fired"}
HINT = {
    "failed": "read job.log, fix the cause, relaunch the same command (a resumable job continues)",
    "sync_failed": "outputs are not durable yet: check sync.json error and disk, re-run the sync; "
                   "do NOT tear down",
    "stalled": "look at job.log and the process (py-spy dump, nvidia-smi); the dead-man fires at its "
               "own stall limit",
    "deadman_fired": "read DEADMAN_FIRED.json: check whether the meter really stopped and whether outputs "
                     "are durable before anything else",
}


class UsageError(Exception):
    pass


# ---------------------------------------------------------------- small readers

def read_json(path, required=False):
    """Parsed JSON, or None when absent. Writers replace files atomically, but retry once anyway."""
    for attempt in (0, 1):
        try:
            with open(path, "r", encoding="utf-8") as fh:
                doc = json.load(fh)
            if not isinstance(doc, dict):
                raise UsageError("%s does not hold a JSON object" % path)
            return doc
        except FileNotFoundError:
            if required:
                raise UsageError("%s is missing" % path)
            return None
        except (ValueError, UnicodeDecodeError) as exc:
            if attempt:
                raise UsageError("%s is not valid JSON (%s)" % (path, exc))
            time.sleep(0.1)
        except OSError as exc:
            raise UsageError("cannot read %s: %s" % (path, exc))
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


def parse_iso(text):
    if not isinstance(text, str) or not text:
        return None
    try:
        dt = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp()


def iso_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def num(value):
    """A finite int/float from JSON, else None (JSON also admits NaN and Infinity)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def supervisor_alive(status):
    pid = status.get("supervisor_pid")
    return isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 and bool(pid_alive(pid))


def pid_alive(pid):
    """True/False; a zombie counts as dead (it has exited, only its parent has not reaped it)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    try:
        with open("/proc/%d/stat" % pid, "r") as fh:
            stat = fh.read()
        if stat[stat.rindex(")") + 2:].startswith("Z"):
            return False
    except (OSError, ValueError):
        pass
    return True


# ---------------------------------------------------------------- machine facts

def as_int(text):
    try:
        return int(float(text))
    except ValueError:
        return None   # "[N/A]" on some GPUs (MIG, old drivers)


def gpu_info(timeout):
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found"
    try:
        res = subprocess.run(
            [exe, "--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            timeout=timeout, universal_newlines=True)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi timed out after %gs (driver hung? see gpu_health.sh)" % timeout
    except OSError as exc:
        return None, "nvidia-smi failed to start: %s" % exc
    if res.returncode != 0:
        first = (res.stderr or res.stdout).strip().splitlines()
        return None, "nvidia-smi exited %d: %s" % (res.returncode, first[0][:120] if first else "no output")
    gpus = []
    for line in res.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        gpus.append({"index": as_int(parts[0]), "util_pct": as_int(parts[1]),
                     "mem_used_mib": as_int(parts[2]), "mem_total_mib": as_int(parts[3])})
    if not gpus:
        return None, "nvidia-smi listed no GPUs"
    return gpus, None


def disk_info(path):
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    out = {"path": path, "free_bytes": free, "total_bytes": total,
           "free_pct": round(100.0 * free / total, 1) if total else None,
           "free_inodes": st.f_favail, "total_inodes": st.f_files,
           "inodes_free_pct": round(100.0 * st.f_favail / st.f_files, 1) if st.f_files else None}
    return out


# ---------------------------------------------------------------- formatting

def human_age(seconds):
    if seconds is None:
        return "?"
    s = int(max(seconds, 0))
    if s < 90:
        return "%ds" % s
    if s < 5400:
        return "%dm" % round(s / 60.0)
    if s < 172800:
        return "%dh%02dm" % (s // 3600, (s % 3600) // 60)
    return "%dd%02dh" % (s // 86400, (s % 86400) // 3600)


def human_bytes(n):
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            return ("%.1f%s" % (value, unit)) if value < 10 and unit != "B" else ("%d%s" % (value, unit))
        value /= 1024.0
    return "?"


def one_line(r):
    word = r["status"].upper()
    bits = [word]
    if r["status"] == "deadman_fired":
        dm = r.get("deadman") or {}
        bits.append("reason %s" % (dm.get("fired_reason") or "?"))
        if dm.get("stop_ok") is not None:
            bits.append("stop command %s" % ("ok" if dm["stop_ok"] else "FAILED"))
        bits.append("(job %s)" % (r.get("state") or "?"))
    elif r.get("reason"):
        bits.append(r["reason"])
    if r.get("step") is not None:
        total = r.get("total_steps")
        progress = "step %s/%s" % (r["step"], total if total is not None else "?")
        if r.get("percent") is not None:
            progress += " (%d%%)" % int(r["percent"])
        bits.append(progress)
        if r.get("epoch") is not None:
            bits.append("epoch %s" % r["epoch"])
        bits.append("hb %s ago" % human_age(r.get("heartbeat_age_s")))
    elif r["status"] in ("running", "starting", "stalled"):
        bits.append("no heartbeat yet")
    if r["status"] in ("running", "stalled") and r.get("eta_s") is not None:
        bits.append("eta %s" % human_age(r["eta_s"]))
    gpus = r.get("gpu")
    if gpus:
        bits.append("gpu " + ",".join("%s%%" % (g["util_pct"] if g["util_pct"] is not None else "?") for g in gpus))
    else:
        bits.append("gpu n/a")
    disk = r.get("disk") or {}
    if "free_bytes" in disk:
        bits.append("disk %s free" % human_bytes(disk["free_bytes"]))
        pct = disk.get("inodes_free_pct")
        if pct is not None and (pct < 5 or disk.get("free_inodes", 1 << 30) < 10000):
            bits.append("inodes LOW %s%% free" % pct)
    sync = r.get("sync")
    if sync and r["status"] in ("succeeded", "sync_failed", "deadman_fired"):
        bits.append("outputs verified" if sync.get("ok") and sync.get("verified") else "outputs NOT verified")
    if r["status"] in ("running", "stalled", "starting", "syncing"):
        dm = r.get("deadman")
        if dm is None:
            bits.append("deadman none")
        elif dm.get("alive") is False and dm.get("state") in ("armed", None):
            bits.append("deadman DOWN")
        else:
            bits.append("deadman %s" % (dm.get("state") or "?"))
    if r.get("cost_so_far") is not None:
        bits.append("cost ~%.2f over %s" % (r["cost_so_far"], human_age(r["cost_hours"] * 3600)))
    if r.get("hint"):
        bits.append("-- " + r["hint"])
    return " ".join(str(b) for b in bits)


# ---------------------------------------------------------------- classification

def classify(run_dir, stall_minutes, want_gpu=True, gpu_timeout=3.0, prev=None):
    if not os.path.isdir(run_dir):
        raise UsageError(("not a directory: %s" if os.path.exists(run_dir) else "no such run dir: %s") % run_dir)
    now = time.time()
    p = lambda name: os.path.join(run_dir, name)   # noqa: E731
    run = read_json(p("run.json"))
    status = read_json(p("status.json"))
    if status is None and run is None and not os.path.isdir(p("run.lock")):
        raise UsageError("%s is not a run dir (no status.json, run.json or run.lock)" % run_dir)
    status = status or {}
    hb = read_json(p("heartbeat.json")) or {}
    deadman = read_json(p("deadman.json"))
    fired = read_json(p("DEADMAN_FIRED.json"))
    sync = read_json(p("sync.json"))

    state = status.get("state")
    if state is not None and state not in ("starting", "running", "syncing", "succeeded", "failed",
                                           "sync_failed"):
        raise UsageError("status.json has an unknown state %r" % state)
    exit_code = read_int(p("exit_code"))
    if exit_code is None and num(status.get("exit_code")) is not None:
        exit_code = int(status["exit_code"])
    job_pid = status.get("job_pid")
    job_pid = job_pid if isinstance(job_pid, int) and not isinstance(job_pid, bool) else None
    host = (run or {}).get("host")
    here = socket.gethostname()
    same_host = not host or host in (here, here.split(".")[0]) or here.startswith(str(host) + ".")
    alive = pid_alive(job_pid) if (job_pid and same_host) else None

    step, total = num(hb.get("step")), num(hb.get("total_steps"))
    hb_time = num(hb.get("time"))
    hb_mtime, log_mtime = mtime(p("heartbeat.json")), mtime(p("job.log"))
    activity = max([t for t in (hb_mtime, log_mtime) if t is not None], default=None)
    started = parse_iso(status.get("started_at"))
    status_mtime = mtime(p("status.json"))
    stall_s = stall_minutes * 60.0

    r = {"run_dir": os.path.abspath(run_dir), "run_id": status.get("run_id") or (run or {}).get("run_id"),
         "status": None, "exit": None, "state": state, "reason": None, "hint": None,
         "job_pid": job_pid, "job_alive": alive, "exit_code": exit_code, "host": host,
         "step": step, "total_steps": total, "epoch": hb.get("epoch"), "loss": hb.get("loss"),
         "percent": round(100.0 * step / total, 1) if (step is not None and total) else None,
         "heartbeat_age_s": round(now - (hb_time if hb_time is not None else hb_mtime), 1)
         if (hb_time is not None or hb_mtime is not None) else None,
         "activity_age_s": round(now - activity, 1) if activity is not None else None,
         "stall_minutes": stall_minutes, "eta_s": None, "eta_basis": None,
         "gpu": None, "gpu_reason": None, "disk": disk_info(run_dir),
         "deadman": None, "sync": None, "checked_at": iso_now()}
    if not same_host:
        r["job_alive_note"] = "run.json host %s is not this machine (%s): pid not checked" % (host, here)
    if sync is not None:
        r["sync"] = {"ok": sync.get("ok"), "verified": sync.get("verified"), "error": sync.get("error"),
                     "dest": sync.get("dest"), "finished_at": sync.get("finished_at")}
    if deadman is not None or fired is not None:
        dm_pid = (deadman or {}).get("pid")
        dm_pid = dm_pid if isinstance(dm_pid, int) and not isinstance(dm_pid, bool) else None
        r["deadman"] = {"state": (deadman or {}).get("state"), "pid": dm_pid,
                        "alive": pid_alive(dm_pid) if (dm_pid and same_host) else None,
                        "fired": fired is not None or (deadman or {}).get("state") == "fired",
                        "fired_reason": (fired or {}).get("reason"), "fired_detail": (fired or {}).get("detail"),
                        "fired_at": (fired or {}).get("fired_at"), "stop_ok": (fired or {}).get("ok")}

    # -- decide
    activity_ref = activity if activity is not None else (started or status_mtime)
    quiet_for = now - activity_ref if activity_ref is not None else None
    if r["deadman"] and r["deadman"]["fired"]:
        word = "deadman_fired"
    elif state == "succeeded":
        word = "succeeded"
    elif state == "failed":
        word = "failed"
        r["reason"] = "job exited %s" % exit_code if exit_code is not None else "job failed"
    elif state == "sync_failed":
        word = "sync_failed"
        err = (sync or {}).get("error")
        r["reason"] = "sync failed" + (": %s" % str(err)[:160] if err else "")
    elif state == "syncing":
        word = "syncing"
        r["reason"] = "job exited %s, copying outputs" % exit_code if exit_code is not None else "copying outputs"
    elif state in ("running", "starting") and alive is False and exit_code is None and supervisor_alive(status):
        # the job just ended and its supervisor is writing the exit code: not vanished, just late
        word = "syncing"
        r["reason"] = "job ended; the supervisor is recording its exit"
    elif state in ("running", "starting") and alive is False and exit_code is None:
        word = "failed"
        r["reason"] = "job vanished (pid %s gone, no exit_code)" % job_pid
    elif state == "running" and alive is False:
        quiet = now - status_mtime if status_mtime else 0
        if exit_code != 0:
            word, r["reason"] = "failed", "job exited %s" % exit_code
        elif quiet > stall_s:
            word = "stalled"
            r["reason"] = "job exited 0 but status.json unchanged for %s (wrapper gone?)" % human_age(quiet)
        else:
            word, r["reason"] = "syncing", "job exited 0, wrapper finishing"
    elif state == "running":
        if quiet_for is not None and quiet_for > stall_s:
            word = "stalled"
            r["reason"] = "no heartbeat/log activity for %s (limit %s)" % (human_age(quiet_for), human_age(stall_s))
        else:
            word = "running"
    else:   # starting, or no status.json yet
        since = now - (started or status_mtime or mtime(p("run.json")) or now)
        if since > stall_s and (alive is None or alive) and (quiet_for is None or quiet_for > stall_s):
            word = "stalled"
            r["reason"] = "still starting after %s" % human_age(since)
        else:
            word = "starting"
    r["status"], r["exit"], r["hint"] = word, EXIT[word], HINT.get(word)
    if word == "failed" and status.get("exit_code") in (143, 130, 129):
        # 128 + SIGTERM/SIGINT/SIGHUP: stopped from outside (preemption, a drill, a stop), not a bug
        r["hint"] = ("stopped by a signal (exit %s), e.g. preemption or a manual stop: relaunch the same "
                     "command with a new run id from the same directory; a resumable job continues"
                     % status.get("exit_code"))
    if word == "deadman_fired":
        r["reason"] = "dead-man fired: %s" % ((fired or {}).get("reason") or "see deadman.log")

    # -- ETA
    if word in ("running", "stalled") and step is not None and total and step < total:
        remaining = total - step
        sps = num(hb.get("sec_per_step"))
        if prev and prev.get("step") is not None and step > prev["step"] and prev.get("at"):
            rate = (step - prev["step"]) / max(now - prev["at"], 1e-6)
            r["eta_s"], r["eta_basis"] = round(remaining / rate), "watched progress"
        elif sps and sps > 0:
            r["eta_s"], r["eta_basis"] = round(remaining * sps), "heartbeat sec_per_step"
        elif started and step > 0 and (hb_time or now) > started:
            r["eta_s"] = round(remaining * ((hb_time or now) - started) / step)
            r["eta_basis"] = "average since started_at (low if the job resumed)"
    elif word in ("succeeded", "syncing") or (word == "running" and step is not None and total and step >= total):
        r["eta_s"], r["eta_basis"] = 0, "done"

    if want_gpu:
        r["gpu"], r["gpu_reason"] = gpu_info(gpu_timeout)
    else:
        r["gpu_reason"] = "skipped (--no-gpu)"
    return r


class Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write("%s: error: %s (try --help)\n" % (self.prog, message))
        sys.exit(2)


def positive_number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not 0 < value < 1e9:   # also refuses nan and inf (time.sleep overflows near 1e10)
        raise argparse.ArgumentTypeError("%r must be > 0 and < 1e9" % text)
    return value


def parse_args(argv):
    ap = Parser(
        description="Classify a run dir: starting/running/stalled/succeeded/failed/sync_failed/deadman_fired. "
                    "Exit 0 succeeded, 1 failed, 2 usage, 4 running, 5 starting, 6 stalled, 7 dead-man fired.")
    ap.add_argument("run_dir", help="the run directory (made by run_one.sh)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (JSON lines with --watch)")
    ap.add_argument("--stall-minutes", type=positive_number, default=30.0,
                    help="a live job quiet for longer than this is STALLED (default 30; floats allowed)")
    ap.add_argument("--watch", type=positive_number, metavar="SECONDS",
                    help="repeat every SECONDS until the run succeeds, fails, or the dead-man fires")
    ap.add_argument("--gpu-timeout", type=positive_number, default=3.0,
                    help="seconds to wait for nvidia-smi (default 3)")
    ap.add_argument("--no-gpu", action="store_true", help="do not call nvidia-smi")
    ap.add_argument("--rate-per-hour", type=positive_number, metavar="PRICE",
                    help="the box's hourly price: adds the run's cost so far (job time x price; the box itself "
                         "may have billed longer, from before the launch and after the end)")
    return ap.parse_args(argv)


def add_cost(r, run_dir, rate):
    """cost_so_far = hours from the job's start to its end (or now) x rate, rounded to cents."""
    status = read_json(os.path.join(run_dir, "status.json")) or {}
    started = parse_iso(status.get("started_at")) if isinstance(status, dict) else None
    if started is None:
        r["cost_so_far"], r["cost_note"] = None, "no started_at in status.json yet"
        return
    ended = parse_iso(status.get("ended_at")) if r["status"] in TERMINAL else None
    hours = max(0.0, ((ended or time.time()) - started) / 3600.0)
    r["cost_so_far"] = round(hours * rate, 2)
    r["cost_hours"] = round(hours, 3)
    r["cost_note"] = "job time x rate; the box may have billed longer"


def emit(r, as_json):
    sys.stdout.write((json.dumps(r, sort_keys=True) if as_json else one_line(r)) + "\n")
    sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    prev = None
    try:
        while True:
            r = classify(args.run_dir, args.stall_minutes, not args.no_gpu, args.gpu_timeout, prev)
            if args.rate_per_hour:
                add_cost(r, args.run_dir, args.rate_per_hour)
            emit(r, args.json)
            if args.watch is None or r["status"] in TERMINAL:
                return r["exit"]
            if r.get("step") is not None and (prev is None or prev.get("step") is None):
                prev = {"step": r["step"], "at": time.time()}
            time.sleep(args.watch)
    except UsageError as exc:
        sys.stderr.write("run_status: %s\n" % exc)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
