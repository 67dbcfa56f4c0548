#!/usr/bin/env python3
"""On-node dead-man switch: stop the meter when nobody is looking after the run.

Runs ON THE GPU NODE, detached from any SSH session, and watches one run directory
(the layout scripts/node/run_one.sh creates). It fires when

  job_ended  the job is over (status.json says succeeded/failed/sync_failed, or the job
             and its supervisor are gone) and nobody acknowledged it within --grace-minutes;
             with --wait-ssh the clock also waits for every SSH session to close;
  no_job     nothing was ever started (no job, no launcher, no supervisor) for --grace-minutes;
  stall      the job process is alive but neither heartbeat.json nor job.log changed for
             --stall-minutes (a hung NCCL collective or a deadlocked loader bills forever);
  max_hours  --max-hours passed since arming, whatever the job is doing.

Firing, in this order: DEADMAN_FIRED.json is written first (so the reason survives even if
the stop kills the box mid-write); a still-running job gets SIGTERM on its process group and
up to --term-grace-seconds to checkpoint (and the supervisor up to --sync-wait-seconds to
finish its durable sync); --pre-stop-cmd runs with --pre-stop-timeout; then the stop command
runs with --retries attempts and exponential backoff, each attempt recorded.
Why signal the job at all: the stop command ends it anyway, only without warning. A SIGTERM
first is the same courtesy a spot reclaim gives, so a resumable job saves its step; the signal,
the wait and whether the job exited are recorded under "job_term". It never sends SIGKILL.

The stop command is an argv string (shlex-split, never a shell; $VAR / ${VAR} are expanded
at fire time from the environment, then from PID 1's environment where containers keep the
platform's ids, so keep tokens in env vars, not in argv; an unset variable never runs). It comes from
--stop-cmd, else from the profile's METER_STOP_CMD (--profile NAME, else the profile named in
run.json) read from profiles/index.json ($RGT_PROFILE_INDEX, <script dir>/../profiles/index.json,
or <script dir>/index.json). A DESTRUCTIVE command (METER_STOP_DESTRUCTIVE true, or
--stop-cmd-destructive) runs only with --allow-destructive AND a sync.json that says ok and
verified AND whose files still match at the durable destination (sizes and sha256 re-read now).
Otherwise it is refused and --fallback-stop-cmd (non-destructive) runs instead, if given.

Compared with SkyPilot autostop (idle = no job and, by default, no SSH session; default 5
idle minutes; a pre-stop hook with a timeout; stop or tear down; cancellable): the same idle
rule is `--grace-minutes 5 --wait-ssh`; in addition this catches a job that is alive but hung,
caps wall-clock time, and never tears down data that has no verified durable copy.

SSH sessions (--wait-ssh) are found by scanning /proc for OpenSSH per-session processes, whose
title is "sshd: USER@pts/N", "sshd: USER@notty" or (OpenSSH 9.8+) "sshd-session: USER@...".
utmp (`who`) is not used: containers often have no utmp records or keep stale ones, and
non-interactive sessions (ssh gpu-box CMD, rsync pulls) never appear there.

Usage:
  deadman.py arm --run-dir DIR [--stall-minutes 30] [--grace-minutes 15] [--max-hours H]
                 [--wait-ssh] [--profile NAME | --stop-cmd "ARGV" [--stop-cmd-destructive]]
                 [--allow-destructive] [--fallback-stop-cmd "ARGV"] [--pre-stop-cmd "ARGV"]
                 [--pre-stop-timeout S] [--retries 3] [--retry-backoff S] [--poll-seconds 30]
                 [--term-grace-seconds 30] [--dry-run] [--foreground] [--json]
  deadman.py ack --run-dir DIR [--postpone-minutes M | --disarm]
  deadman.py status --run-dir DIR [--json]

Exit codes:
  arm     0 armed (prints the dead-man pid), 2 usage, 3 refused (a live dead-man already
          watches this run dir); with --foreground: 0 after firing with the stop command
          succeeding (or a dry run that found a command, or disarmed), 1 when it fired but
          the stop failed after all retries, was refused, or no stop command exists.
  ack     0 written, 2 usage.
  status  0 armed and alive, 1 nothing is watching (none, dead, exited, disarmed),
          7 fired, 2 usage.

Minutes and hours accept floats (tests use --grace-minutes 0.01 --poll-seconds 0.05).
Python 3.8+ standard library only; copy this one file to the node and run it.
"""
import argparse
import errno
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone

try:  # POSIX only; without flock the pid in deadman.json is the only guard
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

TERMINAL = ("succeeded", "failed", "sync_failed")
ACTIVE = ("starting", "running", "syncing")
NO_STOP_MSG = "no on-node stop command; the meter is still running"
REFUSED_MSG = "refused: destructive stop without verified durable sync"
STATE_FILE = "deadman.json"
FIRED_FILE = "DEADMAN_FIRED.json"
LOCK_FILE = "deadman.lock"
UNRESOLVED_VAR = re.compile(r"\$(\{\w+\}|\w+)")
SSH_SESSION = re.compile(r"^sshd(?:-session)?: (\S+)@(\S+)")


class UsageError(Exception):
    """Bad input: one line on stderr, exit 2."""


class Refused(Exception):
    """A gate refused: one line on stderr, exit 3."""


# ----------------------------------------------------------------------------- small helpers

def iso(ts=None):
    """ISO-8601 UTC with a Z, to the second."""
    if ts is None:
        ts = time.time()
    try:
        return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):   # e.g. a hand-written ACK {"until": 1e300}
        return "unix time %r" % (ts,)


def parse_iso(text):
    """Unix seconds from an ISO-8601 UTC string, or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        try:
            return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None


def atomic_write_json(path, obj):
    """Write JSON via a temp file in the same directory, fsync, rename, fsync the directory."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    data = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def read_json(path):
    """The JSON object in path, or None when absent, unreadable or not an object."""
    try:
        with open(path, "r", encoding="utf-8") as fh:
            obj = json.load(fh)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def suspended_seconds(before, after, threshold=60.0):
    """Seconds the machine slept between two (wall, monotonic) readings, or 0.

    CLOCK_MONOTONIC stops during system suspend on Linux while the wall clock keeps going,
    so a gap between the two that a busy poll cannot explain is a suspend/resume.
    """
    gap = (after[0] - before[0]) - (after[1] - before[1])
    return gap if gap >= threshold else 0.0


def pid_alive(pid):
    """True when pid exists and is not a zombie (a zombie job is a finished job)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
        return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")
    except (OSError, ValueError):
        return True


def ssh_sessions():
    """Authenticated OpenSSH sessions on this host as ["user@tty", ...]; None without /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                raw = fh.read(256)
        except OSError:
            continue
        title = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
        match = SSH_SESSION.match(title)
        if match:
            found.append("%s@%s" % (match.group(1), match.group(2)))
    return sorted(found)


def dur(seconds):
    """A short human duration: 42 s, 3.5 min, 2.1 h."""
    if seconds < 120:
        return "%.1f s" % seconds
    if seconds < 7200:
        return "%.1f min" % (seconds / 60.0)
    return "%.1f h" % (seconds / 3600.0)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split_cmd(text, what):
    """shlex-split an argv string; UsageError when empty or unbalanced."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError("%s cannot be split into arguments: %s" % (what, exc))
    if not argv:
        raise UsageError("%s is empty" % what)
    return argv


def init_environ():
    """PID 1's environment: in a container it holds what the platform injected (pod or instance ids),
    which an SSH login shell - and so everything started from it - often does not see."""
    try:
        with open("/proc/1/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def expand_argv(text):
    """argv with $VAR/${VAR} expanded from the environment, then from PID 1's; (argv, [unresolved names])."""
    tokens = shlex.split(text)
    names = {m.group(1).strip("{}") for tok in tokens for m in UNRESOLVED_VAR.finditer(tok)}
    env = dict(os.environ)
    if names - set(env):
        extra = init_environ()
        env.update({k: extra[k] for k in names - set(env) if k in extra})

    def sub(match):
        name = match.group(1).strip("{}")
        return env.get(name, match.group(0))
    argv = [UNRESOLVED_VAR.sub(sub, tok) for tok in tokens]
    missing = sorted(n for n in names if n not in env)
    return argv, missing


def script_dir():
    return os.path.dirname(os.path.abspath(__file__))


def find_index():
    """Path of profiles/index.json per the contract's search order, or None."""
    env = os.environ.get("RGT_PROFILE_INDEX")
    if env:
        return env if os.path.isfile(env) else None
    for cand in (os.path.join(script_dir(), "..", "..", "profiles", "index.json"),
                 os.path.join(script_dir(), "index.json")):
        if os.path.isfile(cand):
            return os.path.abspath(cand)
    return None


def profile_defaults(name):
    """(defaults dict, None) or (None, reason)."""
    index = find_index()
    if not index:
        return None, "no profiles/index.json found (set RGT_PROFILE_INDEX or copy index.json next to deadman.py)"
    data = read_json(index)
    if not data or not isinstance(data.get("profiles"), dict):
        return None, "%s is not a profile index" % index
    prof = data["profiles"].get(name)
    if not isinstance(prof, dict):
        return None, "profile %r is not in %s (known: %s)" % (name, index, ", ".join(sorted(data["profiles"])))
    defaults = prof.get("defaults")
    if defaults is not None and not isinstance(defaults, dict):
        return None, "profile %r in %s is malformed: its defaults are not an object" % (name, index)
    return defaults or {}, None


def verify_sync(run_dir):
    """Re-check sync.json against the durable copy now: (ok, detail)."""
    sync = read_json(os.path.join(run_dir, "sync.json"))
    if sync is None:
        return False, "no readable sync.json in the run dir"
    if sync.get("ok") is not True or sync.get("verified") is not True:
        return False, "sync.json says ok=%s verified=%s" % (sync.get("ok"), sync.get("verified"))
    dest, files = sync.get("dest"), sync.get("files")
    if not isinstance(dest, str) or not dest:
        return False, "sync.json has no dest"
    if not isinstance(files, list) or not files:
        return False, "sync.json lists no files: nothing durable to protect the teardown"
    total = 0
    for entry in files:
        if not isinstance(entry, dict):
            return False, "sync.json has a malformed file entry"
        rel = entry.get("path")
        if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.split("/"):
            return False, "sync.json path %r is not a plain relative path" % (rel,)
        full = os.path.join(dest, rel)
        try:
            size = os.stat(full).st_size
        except OSError as exc:
            return False, "%s missing at the destination (%s)" % (rel, exc.strerror)
        if size != entry.get("size"):
            return False, "%s is %d bytes at the destination, sync.json says %s" % (rel, size, entry.get("size"))
        if sha256_file(full) != entry.get("sha256"):
            return False, "%s sha256 differs from sync.json (changed or corrupted at the destination)" % rel
        total += size
    return True, "%d file(s), %d bytes re-verified at %s" % (len(files), total, dest)


# ----------------------------------------------------------------------------- the watchdog

class Deadman(object):
    def __init__(self, run_dir, cfg, foreground):
        self.run_dir = run_dir
        self.cfg = cfg
        self.foreground = foreground
        self.armed_at = time.time()
        self.state = "armed"
        self.ended_seen = None        # first time we saw the job as over
        self.last_ssh = None          # last time an SSH session was seen
        self.resumed_at = None        # wall time the machine last woke from suspend
        self.clock = (time.time(), time.monotonic())
        self.last_note = None
        self.last_write = 0.0
        self.stop_requested = None
        self.firing = False
        self.fired = None

    # paths
    def p(self, name):
        return os.path.join(self.run_dir, name)

    def log(self, msg):
        line = "%s deadman[%d] %s\n" % (iso(), os.getpid(), msg)
        try:
            with open(self.p("deadman.log"), "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            pass
        if self.foreground:
            sys.stderr.write(line)
            sys.stderr.flush()

    def note(self, msg):
        """Log msg only when it differs from the previous note (no log spam at each poll)."""
        if msg != self.last_note:
            self.last_note = msg
            self.log(msg)

    def write_state(self, extra=None):
        doc = {
            "pid": os.getpid(), "host": socket.gethostname(), "run_dir": self.run_dir,
            "armed_at": iso(self.armed_at), "state": self.state, "updated_at": iso(),
            "config": self.cfg, "last_check": self.last_note,
        }
        if self.fired:
            doc["fired"] = {"reason": self.fired.get("reason"), "ok": self.fired.get("ok"),
                            "fired_at": self.fired.get("fired_at")}
        if extra:
            doc.update(extra)
        atomic_write_json(self.p(STATE_FILE), doc)
        self.last_write = time.time()

    def on_signal(self, signum, _frame):
        if self.firing:
            self.log("ignoring signal %d while firing: finishing the stop sequence" % signum)
            return
        self.stop_requested = signum

    # one look at the run
    def evaluate(self, now):
        """(reason, detail, job_pid, job_alive) when it should fire now, else None."""
        cfg = self.cfg
        ack = read_json(self.p("ACK")) or {}
        if ack.get("disarm") is True:
            return "disarm", "ACK says disarm", None, False
        until = ack.get("until")
        postponed = isinstance(until, (int, float)) and until > now

        status = read_json(self.p("status.json")) or {}
        state = status.get("state")
        job_pid = status.get("job_pid") or cfg.get("job_pid")
        job_alive = bool(job_pid) and pid_alive(job_pid)
        helper_alive = any(pid_alive(status.get(k)) for k in ("supervisor_pid", "launcher_pid") if status.get(k))

        candidates = []
        if cfg["max_hours"] and now - self.armed_at >= cfg["max_hours"] * 3600:
            candidates.append(("max_hours", "wall-clock cap of %g h since arming reached" % cfg["max_hours"]))

        if state in TERMINAL:
            ended = max(parse_iso(status.get("ended_at")) or self.ended_seen or now, self.armed_at)
            self.ended_seen = self.ended_seen or ended
            active, why_over = False, "job %s (exit %s)" % (state, status.get("exit_code"))
        elif job_alive or (helper_alive and state in ACTIVE + (None,)):
            active, why_over = True, None
            self.ended_seen = None
        elif job_pid:
            self.ended_seen = self.ended_seen or now
            ended = self.ended_seen
            active, why_over = False, "job pid %s is gone and no supervisor is alive (state %s)" % (job_pid, state)
        else:
            ended = self.armed_at
            active, why_over = False, None

        if active:
            if cfg["stall_minutes"]:
                stamps = [self.armed_at, self.resumed_at or 0] + [t for t in (mtime(self.p("heartbeat.json")), mtime(self.p("job.log")))
                                            if t is not None]
                quiet = now - max(stamps)
                if quiet >= cfg["stall_minutes"] * 60:
                    candidates.append(("stall", "job alive (pid %s, state %s) but heartbeat.json and job.log "
                                                "unchanged for %s (limit %g min)"
                                       % (job_pid, state, dur(quiet), cfg["stall_minutes"])))
            if not candidates:
                self.note("watching: job active (state %s, pid %s)" % (state, job_pid))
        else:
            idle_since = ended
            sessions = ssh_sessions() if cfg["wait_ssh"] else None
            if sessions:
                self.last_ssh = now
                self.note("job over; waiting for %d SSH session(s) to close: %s"
                          % (len(sessions), ", ".join(sessions)))
            if self.last_ssh:
                idle_since = max(idle_since, self.last_ssh)
            if self.resumed_at:
                idle_since = max(idle_since, self.resumed_at)
            idle = now - idle_since
            if not sessions and idle >= cfg["grace_minutes"] * 60:
                if why_over:
                    candidates.append(("job_ended", "%s; no ACK within %g min" % (why_over, cfg["grace_minutes"])))
                else:
                    candidates.append(("no_job", "no job, launcher or supervisor seen for %g min"
                                       % cfg["grace_minutes"]))
            elif not sessions:
                self.note("%s; firing at %s unless acknowledged"
                          % (why_over or "no job running", iso(idle_since + cfg["grace_minutes"] * 60)))

        if not candidates:
            return None
        if postponed:
            self.note("would fire (%s) but ACK postpones until %s" % (candidates[0][0], iso(until)))
            return None
        reason, detail = candidates[0]
        return reason, detail, job_pid, job_alive

    def loop(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.log("armed on %s: %s" % (self.run_dir, json.dumps(self.cfg, sort_keys=True)))
        while True:
            if self.stop_requested:
                self.state = "exited"
                self.log("exiting on signal %d: NOTHING WATCHES THIS RUN NOW" % self.stop_requested)
                self.write_state()
                return 0
            if not os.path.isdir(self.run_dir):
                # Someone removed the run on purpose; there is nothing left to record into or guard.
                sys.stderr.write("deadman: run dir %s is gone; standing down\n" % self.run_dir)
                return 0
            now = time.time()
            slept = suspended_seconds(self.clock, (now, time.monotonic()))
            self.clock = (now, time.monotonic())
            if slept:
                # A laptop lid or host suspend froze the job and us alike: the heartbeat is old only
                # because time stood still for the job. Restart the stall and grace clocks.
                self.resumed_at = now
                self.log("machine was suspended for about %s; stall and grace clocks restart now" % dur(slept))
            verdict = self.evaluate(now)
            if verdict and verdict[0] == "disarm":
                self.state = "disarmed"
                self.log("disarmed by ACK; exiting without stopping anything")
                self.write_state()
                return 0
            if verdict:
                return self.fire(*verdict)
            if now - self.last_write >= max(30.0, self.cfg["poll_seconds"]):
                self.write_state()
            # Sleep in short slices: time.sleep resumes after a handled signal (PEP 475),
            # so one long sleep would delay a requested exit by a whole poll interval.
            wake = time.time() + self.cfg["poll_seconds"]
            while not self.stop_requested and time.time() < wake:
                time.sleep(min(0.5, self.cfg["poll_seconds"]))

    # firing
    def save_fired(self):
        atomic_write_json(self.p(FIRED_FILE), self.fired)

    def term_job(self, job_pid):
        cfg = self.cfg
        pid = int(job_pid)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = None
        group = pgid == pid
        rec = {"signal": "SIGTERM", "target": ("process group %d" % pid) if group else ("pid %d" % pid),
               "grace_seconds": cfg["term_grace_seconds"]}
        if cfg["dry_run"]:
            rec["dry_run"] = True
            return rec
        rec["sent_at"] = iso()
        try:
            if group:
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except OSError as exc:
            rec["error"] = str(exc)
        start = time.time()
        while pid_alive(pid) and time.time() - start < cfg["term_grace_seconds"]:
            time.sleep(min(0.2, cfg["poll_seconds"]))
        rec["job_exited"] = not pid_alive(pid)
        rec["waited_seconds"] = round(time.time() - start, 2)
        # give the supervisor a chance to finish its durable sync of what the job just saved
        start = time.time()
        while time.time() - start < cfg["sync_wait_seconds"]:
            status = read_json(self.p("status.json")) or {}
            if status.get("state") in TERMINAL or not pid_alive(status.get("supervisor_pid")):
                break
            time.sleep(min(0.2, cfg["poll_seconds"]))
        rec["state_after"] = (read_json(self.p("status.json")) or {}).get("state")
        self.log("sent SIGTERM to %s; job exited: %s after %.1f s; run state now %s"
                 % (rec["target"], rec["job_exited"], rec["waited_seconds"], rec["state_after"]))
        return rec

    def run_limited(self, argv, timeout):
        """Run argv (no shell) in its own session; (rc, timed_out, tail). rc 127 when not found."""
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=self.run_dir)
        except OSError as exc:
            return 127, False, str(exc)
        try:
            out, _ = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            out, _ = proc.communicate()
            timed_out = True
        tail = (out or b"").decode("utf-8", "replace")[-300:]
        return proc.returncode, timed_out, tail

    def fire(self, reason, detail, job_pid, job_alive):
        cfg = self.cfg
        self.firing = True
        self.fired = {
            "reason": reason, "detail": detail, "fired_at": iso(), "run_dir": self.run_dir,
            "host": socket.gethostname(), "deadman_pid": os.getpid(), "dry_run": cfg["dry_run"],
            "command": cfg["stop_cmd"], "command_source": cfg["stop_cmd_source"],
            "destructive": cfg["destructive"], "attempts": [], "ok": False,
        }
        self.save_fired()                       # the reason is on disk before anything else happens
        self.state = "fired"
        self.write_state()
        self.log("FIRED: %s: %s" % (reason, detail))

        if job_alive and job_pid:
            self.fired["job_term"] = self.term_job(job_pid)
            self.save_fired()

        if cfg["pre_stop_cmd"]:
            if cfg["dry_run"]:
                self.fired["pre_stop"] = {"command": cfg["pre_stop_cmd"], "dry_run": True}
            else:
                argv, missing = expand_argv(cfg["pre_stop_cmd"])
                if missing:
                    self.fired["pre_stop"] = {"command": cfg["pre_stop_cmd"], "rc": None,
                                              "error": "unset variable(s): " + ", ".join(missing)}
                else:
                    started = time.time()
                    rc, timed_out, tail = self.run_limited(argv, cfg["pre_stop_timeout"])
                    self.fired["pre_stop"] = {"command": cfg["pre_stop_cmd"], "rc": rc, "timed_out": timed_out,
                                              "seconds": round(time.time() - started, 2), "output_tail": tail}
                self.log("pre-stop command: %s" % json.dumps(self.fired["pre_stop"]))
            self.save_fired()

        command, destructive = cfg["stop_cmd"], cfg["destructive"]
        if command and destructive:
            if not cfg["allow_destructive"]:
                gate_ok, why = False, "--allow-destructive was not given"
            else:
                gate_ok, why = verify_sync(self.run_dir)
            self.fired["destructive_gate"] = {"passed": gate_ok, "detail": why}
            if not gate_ok:
                self.fired["refused"] = "%s (%s)" % (REFUSED_MSG, why)
                self.fired["refused_command"] = command
                self.log("REFUSED destructive stop %r: %s" % (command, why))
                command, destructive = cfg["fallback_stop_cmd"], False
                self.fired["command"], self.fired["destructive"] = command, False
                self.fired["command_source"] = "--fallback-stop-cmd" if command else None
            else:
                self.log("destructive stop allowed: %s" % why)

        argv = None
        if command:
            argv, missing = expand_argv(command)
            if missing:
                self.fired["error"] = "stop command %r needs unset variable(s): %s" % (command, ", ".join(missing))
                self.log("cannot run %r: unset variable(s) %s" % (command, ", ".join(missing)))
                command = None
                fallback = cfg["fallback_stop_cmd"]
                if fallback and fallback != self.fired["command"]:
                    argv, missing = expand_argv(fallback)
                    if not missing:
                        command, destructive = fallback, False
                        self.fired.update(command=fallback, destructive=False, command_source="--fallback-stop-cmd")
        if not command:
            self.fired["message"] = NO_STOP_MSG
            self.save_fired()
            self.log("!!! %s !!! Stop it by hand (profile meter-stop action)." % NO_STOP_MSG.upper())
            return self.finish(1)

        if cfg["dry_run"]:
            self.fired["would_run"] = command
            # Which $VARs resolved (names only: values can be ids or keys and stay out of files).
            names = sorted({m.group(1).strip("{}") for m in UNRESOLVED_VAR.finditer(command)})
            if names:
                self.fired["variables_resolved"] = names
            self.fired["message"] = "dry run: nothing was signalled or run"
            self.save_fired()
            self.log("DRY RUN: would run %r (destructive: %s)" % (command, destructive))
            return self.finish(0)

        for attempt in range(cfg["retries"]):
            started = time.time()
            rc, timed_out, tail = self.run_limited(argv, cfg["stop_timeout"])
            self.fired["attempts"].append({"rc": rc, "at": iso(started), "timed_out": timed_out,
                                           "seconds": round(time.time() - started, 2), "output_tail": tail})
            self.save_fired()
            self.log("stop attempt %d/%d: rc=%s%s" % (attempt + 1, cfg["retries"], rc,
                                                      " (timed out)" if timed_out else ""))
            if rc == 0:
                self.fired["ok"] = True
                self.fired["message"] = "stop command succeeded"
                self.save_fired()
                return self.finish(0)
            if attempt + 1 < cfg["retries"]:
                time.sleep(cfg["retry_backoff"] * (2 ** attempt))
        self.fired["message"] = "stop command failed after %d attempt(s); the meter may still be running" \
            % cfg["retries"]
        self.save_fired()
        self.log("!!! STOP FAILED after %d attempts: the meter may still be running !!!" % cfg["retries"])
        return self.finish(1)

    def finish(self, rc):
        self.write_state({"exit_code": rc})
        return rc


# ----------------------------------------------------------------------------- subcommands

def fnum(minimum=0.0):
    def conv(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if value != value or not minimum <= value < 1e9:   # nan, inf and absurd sizes overflow time APIs
            raise argparse.ArgumentTypeError("%r must be >= %g and < 1e9" % (text, minimum))
        return value
    return conv


def run_dir_arg(args):
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        raise UsageError("run dir %s %s" % (run_dir, "is not a directory" if os.path.exists(run_dir)
                                              else "does not exist"))
    return run_dir


def live_deadman(run_dir):
    """(pid, state) of a dead-man that is still running for run_dir, else None."""
    doc = read_json(os.path.join(run_dir, STATE_FILE)) or {}
    pid = doc.get("pid")
    if doc.get("state") == "armed" and pid_alive(pid) and pid != os.getpid():
        return pid, doc.get("state")
    return None


def take_lock(run_dir):
    """An fd holding an exclusive flock on deadman.lock; Refused when another dead-man holds it."""
    fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                holder = (read_json(os.path.join(run_dir, STATE_FILE)) or {}).get("pid")
                raise Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                              "deadman.py ack --run-dir %s --disarm" % (holder, run_dir, run_dir))
            # filesystems without flock (some FUSE mounts): fall back to the pid check alone
    live = live_deadman(run_dir)
    if live:
        os.close(fd)
        raise Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                      "deadman.py ack --run-dir %s --disarm" % (live[0], run_dir, run_dir))
    return fd


def build_config(args, run_dir):
    cfg = {
        "stall_minutes": args.stall_minutes, "grace_minutes": args.grace_minutes,
        "max_hours": args.max_hours or 0.0, "wait_ssh": args.wait_ssh,
        "allow_destructive": args.allow_destructive, "retries": args.retries,
        "retry_backoff": args.retry_backoff, "stop_timeout": args.stop_timeout,
        "pre_stop_cmd": args.pre_stop_cmd, "pre_stop_timeout": args.pre_stop_timeout,
        "fallback_stop_cmd": args.fallback_stop_cmd, "term_grace_seconds": args.term_grace_seconds,
        "sync_wait_seconds": args.sync_wait_seconds, "poll_seconds": args.poll_seconds,
        "dry_run": args.dry_run, "job_pid": args.job_pid, "profile": None,
        "stop_cmd": None, "stop_cmd_source": None, "destructive": False,
    }
    if args.retries < 1:
        raise UsageError("--retries must be at least 1")
    if args.poll_seconds <= 0:
        raise UsageError("--poll-seconds must be > 0")
    for flag, value in (("--pre-stop-cmd", args.pre_stop_cmd), ("--fallback-stop-cmd", args.fallback_stop_cmd)):
        if value is not None:
            split_cmd(value, flag)
    warnings = []
    profile = args.profile
    if not profile:
        profile = (read_json(os.path.join(run_dir, "run.json")) or {}).get("profile") or None
    cfg["profile"] = profile
    if args.stop_cmd is not None:
        split_cmd(args.stop_cmd, "--stop-cmd")
        cfg.update(stop_cmd=args.stop_cmd, stop_cmd_source="--stop-cmd", destructive=args.stop_cmd_destructive)
    elif profile:
        defaults, why = profile_defaults(profile)
        if defaults is None:
            if args.profile:
                raise UsageError(why)
            warnings.append("profile %s from run.json: %s" % (profile, why))
        elif defaults.get("METER_STOP_CMD"):
            split_cmd(defaults["METER_STOP_CMD"], "METER_STOP_CMD of profile %s" % profile)
            cfg.update(stop_cmd=defaults["METER_STOP_CMD"], stop_cmd_source="profile:%s" % profile,
                       destructive=bool(defaults.get("METER_STOP_DESTRUCTIVE")))
            if defaults.get("METER_STOP_NEEDS"):
                cfg["stop_cmd_needs"] = defaults["METER_STOP_NEEDS"]
    if args.stop_cmd_destructive and args.stop_cmd is None:
        raise UsageError("--stop-cmd-destructive describes --stop-cmd; give --stop-cmd too")
    word = destructive_word(cfg["stop_cmd"]) if cfg["stop_cmd"] else None
    if word and not cfg["destructive"]:
        cfg["destructive"] = True
        cfg["destructive_inferred_from"] = word
        warnings.append("NOTE: the stop command names %r, so it is treated as destructive (runs only with "
                        "--allow-destructive and a verified durable sync)" % word)
    if cfg["fallback_stop_cmd"] and destructive_word(cfg["fallback_stop_cmd"]):
        raise UsageError("--fallback-stop-cmd names %r: the fallback must be non-destructive"
                         % destructive_word(cfg["fallback_stop_cmd"]))
    if not cfg["stop_cmd"] and not cfg["fallback_stop_cmd"]:
        warnings.append("WARNING: %s if this fires (no --stop-cmd, and profile %s has no METER_STOP_CMD); "
                        "it will only record why" % (NO_STOP_MSG, profile or "(none)"))
    if args.wait_ssh and ssh_sessions() is None:
        warnings.append("WARNING: --wait-ssh cannot see SSH sessions here (no /proc); it has no effect")
    if cfg["destructive"] and not args.allow_destructive:
        warnings.append("WARNING: the stop command is DESTRUCTIVE and --allow-destructive is not set: it will be "
                        "refused%s" % (" and the fallback run" if cfg["fallback_stop_cmd"]
                                       else "; with no --fallback-stop-cmd the meter keeps running"))
    return cfg, warnings


DESTRUCTIVE_WORD = re.compile(r"(?:^|[/_.:=-])(terminate|destroy|delete|remove|release|deactivate|rm)(?:$|[/_.:=-])",
                              re.IGNORECASE)


def destructive_word(command):
    """The word that makes a stop command look destructive (terminate, destroy, ...), or None.

    Fail closed: a command that names such an action is treated as destructive even when nobody
    declared it so, because running it without a verified durable copy can delete the only copy.
    The program path itself is skipped (a folder name must not decide), its basename is not.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if not argv:
        return None
    for token in [os.path.basename(argv[0])] + argv[1:]:
        m = DESTRUCTIVE_WORD.search(token)
        if m:
            return m.group(1).lower()
    return None


def retire_old_evidence(run_dir, log):
    """A new arming starts clean: an old disarm ACK or fired record would mislead it and run_status."""
    ack = read_json(os.path.join(run_dir, "ACK")) or {}
    if ack.get("disarm") is True:
        os.unlink(os.path.join(run_dir, "ACK"))
        log("removed a disarm ACK left by an earlier dead-man")
    fired = os.path.join(run_dir, FIRED_FILE)
    if os.path.exists(fired):
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        os.replace(fired, os.path.join(run_dir, "DEADMAN_FIRED.%s.json" % stamp))
        log("kept the earlier firing record as DEADMAN_FIRED.%s.json" % stamp)


def close_fds_except(keep):
    try:
        limit = os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        limit = 1024
    low = 3
    for fd in sorted(k for k in keep if k >= 3) + [min(limit, 65536)]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def detach_and_run(dm, lock_fd):
    """Double fork + setsid; the grandchild watches, the caller gets its pid. Returns that pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    rfd, wfd = os.pipe()
    child = os.fork()
    if child:
        os.close(wfd)
        os.waitpid(child, 0)
        chunks = []
        while True:
            chunk = os.read(rfd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(rfd)
        answer = b"".join(chunks).decode("utf-8", "replace").strip()
        if not answer.startswith("ok "):
            raise RuntimeError(answer or "the detached dead-man died before reporting its pid")
        return int(answer.split()[1])
    rc = 1
    try:
        os.close(rfd)
        os.setsid()
        if os.fork():
            os._exit(0)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        logfd = os.open(dm.p("deadman.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        close_fds_except({lock_fd, wfd})
        dm.write_state()
        os.write(wfd, ("ok %d\n" % os.getpid()).encode())
        os.close(wfd)
        wfd = None
        rc = dm.loop()
    except BaseException:  # the detached process has nobody to report to but its log
        try:
            dm.log("crashed:\n" + traceback.format_exc())
            if wfd is not None:
                os.write(wfd, ("error: %s\n" % sys.exc_info()[1]).encode())
        except Exception:
            pass
    finally:
        os._exit(rc)


def cmd_arm(args):
    run_dir = run_dir_arg(args)
    cfg, warnings = build_config(args, run_dir)
    lock_fd = take_lock(run_dir)
    dm = Deadman(run_dir, cfg, foreground=args.foreground)
    retire_old_evidence(run_dir, dm.log)
    for line in warnings:
        dm.log(line)
        sys.stderr.write(line + "\n")
    if args.foreground:
        dm.write_state()
        if args.json:
            print(json.dumps({"pid": os.getpid(), "run_dir": run_dir, "state": "armed", "foreground": True}))
        return dm.loop()
    try:
        pid = detach_and_run(dm, lock_fd)
    except RuntimeError as exc:
        sys.stderr.write("deadman.py: the detached dead-man failed to start: %s (see %s)\n"
                         % (exc, dm.p("deadman.log")))
        return 1
    if args.json:
        print(json.dumps({"pid": pid, "run_dir": run_dir, "state": "armed", "config": cfg}, sort_keys=True))
    else:
        print(pid)
        sys.stderr.write("dead-man armed (pid %d) on %s; stop: %s\n"
                         % (pid, run_dir, cfg["stop_cmd"] or cfg["fallback_stop_cmd"] or "NONE"))
    return 0


def cmd_ack(args):
    run_dir = run_dir_arg(args)
    if args.disarm:
        doc = {"disarm": True, "at": iso()}
        msg = "disarm requested: the dead-man exits at its next check"
    else:
        minutes = args.postpone_minutes
        if minutes is None:
            cfg = (read_json(os.path.join(run_dir, STATE_FILE)) or {}).get("config")
            minutes = cfg.get("grace_minutes") if isinstance(cfg, dict) else None
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 <= minutes < 1e9:
                minutes = 15.0   # deadman.json is damaged or from elsewhere: the documented default
        until = time.time() + minutes * 60
        doc = {"until": until, "at": iso()}
        msg = "postponed until %s (%g min)" % (iso(until), minutes)
    atomic_write_json(os.path.join(run_dir, "ACK"), doc)
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        print("ACK %s" % msg)
    return 0


def cmd_status(args):
    run_dir = run_dir_arg(args)
    doc = read_json(os.path.join(run_dir, STATE_FILE))
    fired = read_json(os.path.join(run_dir, FIRED_FILE))
    ack = read_json(os.path.join(run_dir, "ACK"))
    sessions = ssh_sessions()
    out = {"run_dir": run_dir, "deadman": doc, "fired": fired, "ack": ack,
           "ssh_sessions": len(sessions) if sessions is not None else None}
    if fired:
        word, rc = "FIRED", 7
        line = "reason=%s at %s stop_ok=%s %s" % (fired.get("reason"), fired.get("fired_at"), fired.get("ok"),
                                                   fired.get("refused") or fired.get("message") or "")
    elif not doc:
        word, rc, line = "NONE", 1, "no dead-man was armed for this run dir: nothing will stop the meter"
    elif doc.get("state") == "armed" and pid_alive(doc.get("pid")):
        word, rc = "ARMED", 0
        cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
        line = "pid=%s since %s stall=%sm grace=%sm cap=%s stop=%s%s" % (
            doc.get("pid"), doc.get("armed_at"), cfg.get("stall_minutes"), cfg.get("grace_minutes"),
            ("%gh" % cfg["max_hours"]) if isinstance(cfg.get("max_hours"), (int, float)) and cfg["max_hours"]
            else "off",
            json.dumps(cfg.get("stop_cmd") or cfg.get("fallback_stop_cmd")),
            " (dry run)" if cfg.get("dry_run") else "")
        if ack and isinstance(ack.get("until"), (int, float)) and ack["until"] > time.time():
            line += " postponed-until=%s" % iso(ack["until"])
    elif doc.get("state") == "armed":
        word, rc = "DEAD", 1
        line = "deadman.json says armed but pid %s is gone: nothing watches this run; re-arm it" % doc.get("pid")
    else:
        word, rc = str(doc.get("state", "unknown")).upper(), 1
        line = "pid %s is not watching (state %s)" % (doc.get("pid"), doc.get("state"))
    out["status"] = word
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print("%s %s" % (word, line))
    return rc


class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write("%s: error: %s (try --help)\n" % (self.prog, message))
        sys.exit(2)


def build_parser():
    top = Parser(prog="deadman.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                 epilog="Run `deadman.py arm --help` for every option.")
    sub = top.add_subparsers(dest="cmd", parser_class=Parser)

    arm = sub.add_parser("arm", help="start watching a run dir (detaches unless --foreground)")
    arm.add_argument("--run-dir", required=True)
    arm.add_argument("--stall-minutes", type=fnum(), default=30.0,
                     help="fire when the job is alive but heartbeat.json/job.log are this old (0 = off; 30)")
    arm.add_argument("--grace-minutes", type=fnum(), default=15.0,
                     help="fire this long after the job ended unless acknowledged (15)")
    arm.add_argument("--max-hours", type=fnum(), default=0.0, help="wall-clock cap since arming (0 = off)")
    arm.add_argument("--wait-ssh", action="store_true",
                     help="also wait while SSH sessions are open (SkyPilot's jobs_and_ssh idea)")
    arm.add_argument("--profile", help="read METER_STOP_CMD/METER_STOP_DESTRUCTIVE from this profile")
    arm.add_argument("--stop-cmd", help="argv string run to stop the meter (overrides the profile)")
    arm.add_argument("--stop-cmd-destructive", action="store_true", help="--stop-cmd deletes data")
    arm.add_argument("--allow-destructive", action="store_true",
                     help="permit a destructive stop, and only after the durable sync re-verifies")
    arm.add_argument("--fallback-stop-cmd", help="non-destructive argv string used when the destructive one is refused")
    arm.add_argument("--pre-stop-cmd", help="argv string run before the stop (e.g. a last sync)")
    arm.add_argument("--pre-stop-timeout", type=fnum(), default=300.0, help="seconds (300)")
    arm.add_argument("--retries", type=int, default=3, help="stop attempts (3)")
    arm.add_argument("--retry-backoff", type=fnum(), default=10.0, help="seconds before retry 2; doubles (10)")
    arm.add_argument("--stop-timeout", type=fnum(), default=120.0, help="seconds per stop attempt (120)")
    arm.add_argument("--term-grace-seconds", type=fnum(), default=30.0,
                     help="after SIGTERM to a live job's process group, wait this long for its checkpoint (30)")
    arm.add_argument("--sync-wait-seconds", type=fnum(), default=300.0,
                     help="then wait this long for the supervisor's durable sync to finish (300)")
    arm.add_argument("--job-pid", type=int, help="watch this pid when status.json has none")
    arm.add_argument("--poll-seconds", type=fnum(), default=30.0, help="check interval (30)")
    arm.add_argument("--dry-run", action="store_true", help="on firing, record what would happen; run nothing")
    arm.add_argument("--foreground", action="store_true", help="do not detach")
    arm.add_argument("--json", action="store_true")

    ack = sub.add_parser("ack", help="postpone (default: by the armed grace) or disarm")
    ack.add_argument("--run-dir", required=True)
    group = ack.add_mutually_exclusive_group()
    group.add_argument("--postpone-minutes", type=fnum(), help="no firing before now + M minutes")
    group.add_argument("--disarm", action="store_true", help="the dead-man exits cleanly")
    ack.add_argument("--json", action="store_true")

    st = sub.add_parser("status", help="is a dead-man watching this run? (0 armed, 1 nothing, 7 fired)")
    st.add_argument("--run-dir", required=True)
    st.add_argument("--json", action="store_true")
    return top


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.cmd:
        sys.stderr.write("deadman.py: error: give a command: arm, ack or status (try --help)\n")
        return 2
    try:
        return {"arm": cmd_arm, "ack": cmd_ack, "status": cmd_status}[args.cmd](args)
    except UsageError as exc:
        sys.stderr.write("deadman.py: error: %s\n" % exc)
        return 2
    except Refused as exc:
        sys.stderr.write("deadman.py: REFUSED: %s\n" % exc)
        return 3
    except OSError as exc:
        sys.stderr.write("deadman.py: error: %s\n" % exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
