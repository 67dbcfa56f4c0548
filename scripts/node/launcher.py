#!/usr/bin/env python3
"""launcher.py: the Python half of run_one.sh (the launch steps and the launch report).

run_one.sh starts it twice (two interpreter starts; the supervisor, supervise.py, is the third): `prepare`,
then, after the shell sourced the proxy hook, `start`. Python 3.8+, standard library only. Errors are one line,
`run_one.sh: error: ...` (it is run_one.sh's code).

Usage:
  launcher.py prepare --launcher-pid PID [--profile NAME] [--run-id ID] [--run-dir D] [--durable-dir D]
                      [--tag WORD] [--disk-floor-gb N] [--require-gpu [--gpu-timeout S]]
                      [--output GLOB]... [--allow-empty GLOB]... [the adapter options of init]
      everything that can refuse a launch before anything is written: the globs (exit 2 when one is absolute,
      has '..' or is empty), the adapters (exit 2), the profile's defaults (a variable set in the environment wins, a flag over both),
      the run id and dir, the disk gate (free bytes AND inodes of each filesystem of the run dir, DATA_DIR and
      DURABLE_DIR; a write probe in DURABLE_DIR/results; the floor: --disk-floor-gb, else DISK_FLOOR_GB, else
      rgt_core.DEFAULT_DISK_FLOOR_GB; DISK_FLOOR_INODES, else rgt_core.DEFAULT_MIN_FREE_INODES), the GPU gate
      (`nvidia-smi -L` lists a GPU within S seconds, default 15), then the run dir and run.lock for PID. A run dir
      that already holds a run (status.json, run.json or budget.json; live, over or its budget spent) is refused
      (3) before anything is written: a launch never reuses a run; only a resume's replay (boot_resume.py, holding
      RUN_DIR/resume.lock) starts its next attempt there.
      Prints KEY NUL VALUE NUL pairs: PY (this interpreter), PROFILE, RGT_PROFILE_INDEX, RUN_ID, RUN_DIR,
      RESULTS_DIR, FLOOR_GB and FLOOR_INODES (the floors this gate used; the dead-man's disk_low watch gets
      the same), DATA_DIR, DURABLE_DIR, HF_HOME, PROXY_HOOK
  launcher.py start (the options of init, less --detach and --check-deadman) [--no-deadman]
                    [--deadman-arg WORD]... [--wait] [--poll-seconds S] [--json] (-- CMD [ARGS...] | --words-on-stdin)
      init, then the dead-man (`deadman.py arm --run-dir D WORD...`, armed in this process: a fork), then
      the supervisor (in tmux when it is installed, else setsid; it must record itself in status.json
      within 120 s), then the report; whatever fails before a supervisor claims the run marks it failed
      and disarms the dead-man. With --words-on-stdin the launch's words and the job's come on stdin
      (NUL-terminated: their count, the launch's words, the job's), never in argv: the dead-man is a fork of
      this process, and `pgrep -f train.py` or `pkill -f train.py` must not find it
  launcher.py init --run-dir D --run-id ID --cwd DIR --results-dir R --detach tmux|setsid
                   --launcher-pid PID [--profile NAME] [--durable-dir DIR] [--check-deadman]
                   [--output GLOB]... [--allow-empty GLOB]... [--stop-signal SIG]
                   [--resume-glob GLOB --resume-arg TEMPLATE] [--resume-from PATH] [--progress-regex RE]
                   [--auto-resume] [--max-attempts N] [--launch-arg WORD]... [--total-steps N]
                   [--notify-events E1,E2] -- CMD [ARGS...]
      write run.json and status.json (state starting, attempt N); an earlier attempt's evidence (a resume's
      replay) moves to previous/<stamp>/; refused (3) while a live dead-man is armed on D (with --check-deadman)
  launcher.py fail --run-dir D --message TEXT
      mark a run that never got a supervisor as failed; exit 0 when no supervisor ever claimed it
      (nor can now), exit 1, changing nothing, when one has
  launcher.py report --run-dir D [--deadman-pid PID] [--dry-run] [--wait] [--poll-seconds S] [--json]
      the launch report (text, or one JSON object with --json); with --wait, wait for the run to
      end and exit like run_one.sh --wait (0 succeeded, the job's code, 1 sync failed)

The handshake (why a job that exits at once is reported right): status.json is only changed
under an flock on RUN_DIR/.status.lock. The supervisor claims the run (state still "starting",
no supervisor recorded, run.lock held by the launcher) and records supervisor_identity in one
locked step; the launcher gives up only in a locked step that finds no supervisor recorded. So
exactly one of them wins, the launcher learns the start from the file, never from what run.lock
looked like, and a run that ran is never overwritten or disarmed by its launcher.

The supervisor (supervise.py) runs the job; the durable sync is sync.py.

Exit codes: 0 ok, 1 failed (the sync, the start, a job that failed: its code), 2 usage, 3 refused.
"""
import functools
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import rgt_core as core
import runrec
import evidence

PROG = "run_one.sh"
STATUS = "status.json"
RUN = "run.json"
LOCK_DIR = runrec.RUN_LOCK
TERMINAL = runrec.TERMINAL
RAW_ARGV = runrec.RAW_ARGV
START_TIMEOUT = 120.0  # generous: a loaded box starts Python slowly
SUPERVISE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")

status_lock, save_status, set_status = runrec.status_lock, runrec.save_status, runrec.set_status
attempt_number = runrec.attempt_number
run_path, say, read_status = runrec.path, core.say, runrec.status   # one copy each (runrec, rgt_core)
lock_owner, unlink_quiet = runrec.lock_owner, core.unlink_quiet


# ---------------------------------------------------------------- launch steps

PROFILE_KEYS = ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "PROXY_HOOK", "DISK_FLOOR_GB")
RUN_ID_RX = core.RUN_ID_RE


def normal_patterns(patterns, what):
    out = []
    for pattern in patterns or []:
        try:
            out.append(evidence.check_pattern(pattern))
        except core.UsageError as exc:
            detail = str(exc).replace("roster entry %r" % pattern, "").replace("--root", "the working directory")
            raise core.UsageError("%s %r %s" % (what, pattern, detail.strip()))
    return out


def profile_settings(profile, environ):
    """The launch's settings from the profile: a variable already set in the environment wins."""
    out = {}
    if profile:
        defaults = core.profile_defaults(profile)
        for key in PROFILE_KEYS:
            if environ.get(key):
                out[key] = environ[key]
            elif defaults.get(key):
                out[key] = defaults[key]
    else:
        out = {key: environ[key] for key in PROFILE_KEYS if environ.get(key)}
    return out


def new_run_id(tag):
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(tag or "run"))[:24]
    rid = "%s-%s-%d" % (stamp, clean, random.randrange(32768))
    return rid if RUN_ID_RX.match(rid) else "run-%s-%d" % (stamp, random.randrange(32768))


def disk_floors(args, settings):
    """(GiB, inodes): --disk-floor-gb, else DISK_FLOOR_GB (environment, then the profile), else the toolkit's one
    floor (rgt_core.DEFAULT_DISK_FLOOR_GB); DISK_FLOOR_INODES, else rgt_core.DEFAULT_MIN_FREE_INODES."""
    floor = args.disk_floor_gb if args.disk_floor_gb is not None else settings.get("DISK_FLOOR_GB")
    if floor is None:
        floor = core.DEFAULT_DISK_FLOOR_GB
    try:
        floor = float(floor)
    except ValueError:
        raise core.UsageError("DISK_FLOOR_GB must be a number, got %r" % floor)
    if not 0 <= floor < 1e9:
        raise core.UsageError("DISK_FLOOR_GB must be a non-negative number, got %r" % floor)
    inodes = os.environ.get("DISK_FLOOR_INODES") or core.DEFAULT_MIN_FREE_INODES
    if not str(inodes).isdigit():
        raise core.UsageError("DISK_FLOOR_INODES must be an integer, got %r" % inodes)
    return floor, int(inodes)


def refuse_below_floor(paths, floor_gb, floor_inodes, writable):
    ok, checks = core.disk_gate(paths, floor_gb, floor_inodes, writable=writable)
    for check in checks:
        say(check["line"])
    if ok:
        return
    unwritable = [c for c in checks[-len(writable):] if c["status"] != core.OK] if writable else []
    if unwritable:
        raise core.Refused("%s (the end-of-run sync would fail after the GPU hours are spent: fix the mount or "
                           "the permissions, or choose another --durable-dir); nothing was started"
                           % "; ".join(c["line"].replace("REFUSED ", "", 1) for c in unwritable))
    raise core.Refused("disk floor not met (need %g GiB and %d inodes free): free space first (df -h; df -i); "
                       "nothing was started" % (floor_gb, floor_inodes))


def gpu_gate(timeout):
    res = core.run_bounded(["nvidia-smi", "-L"], timeout)
    if res.timed_out:
        raise core.Refused("--require-gpu: nvidia-smi did not answer within %g s (a hung driver: look for Xid errors "
                           "in dmesg); nothing was started" % timeout)
    if res.error:
        raise core.Refused("--require-gpu: nvidia-smi lists no GPU (it is not installed: no driver?); "
                           "nothing was started")
    gpus = [line for line in res.output.splitlines() if line.startswith("GPU ")]
    if not gpus:
        raise core.Refused("--require-gpu: nvidia-smi lists no GPU (missing driver, or the box came back without "
                           "one; nvidia-smi exit %s); nothing was started" % res.rc)
    say("%s GPU gate: %d GPU(s) listed by nvidia-smi" % (core.OK, len(gpus)))


def take_run_lock(run_dir, launcher_pid):
    """run.lock (a dir holding the owner's pid) for the launcher LAUNCHER_PID; the supervisor takes it over."""
    lock = run_path(run_dir, LOCK_DIR)
    for _ in range(5):
        try:
            os.mkdir(lock)
        except FileExistsError:
            owner = lock_owner(run_dir)
            if not owner:
                time.sleep(0.5)   # being created right now
                continue
            if owner.isdigit() and core.pid_alive(int(owner)):
                raise core.Refused("run dir %s is locked by live pid %s (a run is using it); choose another --run-id"
                                   % (run_dir, owner))
            say("%s: reclaiming stale lock %s (pid %s is gone)" % (PROG, lock, owner))
            aside = "%s.stale.%d" % (lock, os.getpid())
            try:
                os.rename(lock, aside)
                shutil.rmtree(aside, ignore_errors=True)
            except OSError:
                pass
            continue
        core.atomic_write(os.path.join(lock, "pid"), "%d\n" % launcher_pid)
        return
    raise core.Refused("could not take the lock %s" % lock)


RUN_RECORDS = (STATUS, RUN, runrec.BUDGET)   # any of them: the run dir already holds a run


def refuse_existing_run(run_dir, rid):
    """A launch never reuses a run (finding field N19): a run dir that holds a run record is refused, live or over,
    before anything is written, unless a resume holds RUN_DIR/resume.lock (boot_resume.py replaying the launch
    as the next attempt, with its caps, its budget check and the dead-man's hand-over). A second launch would
    inherit the first start's budget clock (its dead-man may fire at its first check, the job already paid for)
    and move the run's evidence aside."""
    if not any(os.path.lexists(run_path(run_dir, name)) for name in RUN_RECORDS) or runrec.resume_in_progress(
            run_dir):
        return
    act = runrec.run_activity(run_dir)
    state = "attempt %s, %s" % (act.get("attempt") or "?", act.get("state") or "no status")
    if act.get("live"):
        state += ", live: %s" % act["why"]
    clock = runrec.read_budget(run_dir)
    spent = runrec.budget_spent_usd(clock, time.time()) if clock else None
    cap = clock.get("budget_usd") if clock else None
    if spent is not None and isinstance(cap, (int, float)) and not isinstance(cap, bool):
        state += ", budget %s: %s of %s USD" % ("spent" if spent >= cap else "counting from its first start",
                                                core.money(spent), core.money(cap))
    raise core.Refused("run %s already exists in %s (%s): a launch never reuses a run; continue it with "
                       "`rgt.py resume HOST %s` (on the node: boot_resume.py --run %s), or launch under a new "
                       "--run-id; nothing was started" % (rid, run_dir, state, rid, run_dir))


def op_prepare(args):
    """Everything that can refuse a launch before anything is written: the globs, the profile, where the run
    goes, the disk and GPU gates; then the run dir and its lock. Prints KEY NUL VALUE NUL pairs for run_one.sh."""
    normal_patterns(args.output, "--output")
    normal_patterns(args.allow_empty, "--allow-empty")
    check_adapters(args)   # a wrong adapter is refused before a run dir exists
    profile = args.profile or os.environ.get("RGT_PROFILE") or ""
    settings = profile_settings(profile, os.environ)
    if args.durable_dir:
        settings["DURABLE_DIR"] = args.durable_dir
    durable = settings.get("DURABLE_DIR")
    if durable:
        settings["DURABLE_DIR"] = durable = os.path.abspath(durable)
    if args.run_id and not RUN_ID_RX.match(args.run_id):   # never swapped silently for a generated one (D4)
        raise core.UsageError("--run-id may hold letters, digits, '.', '_' and '-' (max %d), got %r"
                              % (core.RUN_ID_MAX, args.run_id))
    rid = args.run_id or (os.path.basename(os.path.normpath(args.run_dir)) if args.run_dir else new_run_id(args.tag))
    if not RUN_ID_RX.match(rid):
        rid = new_run_id(args.tag)   # a run dir whose name is no run id: the run gets its own
    if not (args.run_dir or durable):
        raise core.UsageError("no place for the run: pass --durable-dir DIR, --run-dir DIR, set DURABLE_DIR or "
                              "--profile")
    where = runrec.layout(durable, rid, args.run_dir and os.path.abspath(args.run_dir))
    run_dir, results = where["run_dir"], where["results_dir"]
    if not durable and args.output:
        say("%s: no DURABLE_DIR: the outputs are copied to %s, which is only as durable as the run dir"
            % (PROG, results))
    there = run_dir   # a file where the run dir must go is bad input, not a launch failure
    while not os.path.lexists(there):
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        raise core.UsageError("cannot use run dir %s: %s is not a directory" % (run_dir, there))
    refuse_existing_run(run_dir, rid)
    floor_gb, floor_inodes = disk_floors(args, settings)
    paths = [run_dir] + [settings[k] for k in ("DATA_DIR", "DURABLE_DIR") if settings.get(k)]
    refuse_below_floor(paths, floor_gb, floor_inodes, [os.path.join(durable, "results")] if durable else [])
    if args.require_gpu:
        gpu_gate(args.gpu_timeout)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        raise core.CheckFailed("cannot create run dir %s: %s" % (run_dir, exc.strerror or exc))
    take_run_lock(run_dir, args.launcher_pid)
    pairs = [("PY", sys.executable), ("PROFILE", profile), ("RGT_PROFILE_INDEX", core.profile_index_path() or ""),
             ("RUN_ID", rid), ("RUN_DIR", run_dir), ("RESULTS_DIR", results),
             ("FLOOR_GB", "%g" % floor_gb), ("FLOOR_INODES", "%d" % floor_inodes)]
    pairs += [(key, settings.get(key, "")) for key in PROFILE_KEYS if key != "DISK_FLOOR_GB"]
    out = getattr(sys.stdout, "buffer", sys.stdout)
    out.write("".join("%s\0%s\0" % pair for pair in pairs).encode("utf-8", "surrogateescape"))
    out.flush()
    return 0


def move_old_evidence(run_dir):
    """A relaunch in the same run dir keeps the earlier attempt's evidence apart."""
    names = [n for n in ("exit_code", "DEADMAN_FIRED.json", "ACK") if os.path.exists(run_path(run_dir, n))]
    # Any earlier status.json is an attempt, also one killed while still starting (finding A13).
    if not names and not os.path.exists(run_path(run_dir, STATUS)):
        return
    names += [STATUS] if os.path.exists(run_path(run_dir, STATUS)) else []
    os.makedirs(os.path.join(run_dir, "previous"), exist_ok=True)
    # unique even for two attempts in one second (one that died while starting is quick)
    prev = tempfile.mkdtemp(prefix="%s-%d-" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), os.getpid()),
                            dir=os.path.join(run_dir, "previous"))
    for name in names:
        os.replace(run_path(run_dir, name), os.path.join(prev, name))
    say("%s: earlier attempt's %s moved to %s" % (PROG, " ".join(names), prev))


STOP_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT")


def notify_events(text):
    """--notify-events E1,E2 -> the run's own event list (None: every event its targets take)."""
    if not text:
        return None
    import notify
    events = [e.strip() for e in text.split(",") if e.strip()]
    bad = sorted(set(events) - set(notify.EVENTS))
    if bad or not events:
        raise core.UsageError("--notify-events: unknown event(s) %s (known: %s)"
                              % (", ".join(bad) or repr(text), ", ".join(notify.EVENTS)))
    return events


def check_adapters(args):
    """The resume and progress adapters, validated at launch (exit 2), never at the job's end."""
    if bool(args.resume_glob or args.resume_from) != bool(args.resume_arg):
        raise core.UsageError("--resume-glob (or --resume-from) and --resume-arg go together (the checkpoints, and "
                              "how to pass one)")
    if args.resume_from and ("\n" in args.resume_from or "\0" in args.resume_from):
        raise core.UsageError("--resume-from must be one path")
    if args.resume_glob:
        normal_patterns([args.resume_glob], "--resume-glob")
        try:
            shlex.split(args.resume_arg)
        except ValueError as exc:
            raise core.UsageError("--resume-arg cannot be split into arguments: %s" % exc)
    if args.max_attempts < 1:
        raise core.UsageError("--max-attempts must be at least 1")
    notify_events(args.notify_events)
    if args.progress_regex:
        try:
            rx = re.compile(args.progress_regex)
        except re.error as exc:
            raise core.UsageError("--progress-regex does not compile: %s" % exc)
        if "step" not in rx.groupindex and rx.groups < 1:
            raise core.UsageError("--progress-regex needs a group for the step: (?P<step>\\d+) or (\\d+)")


def op_init(args):
    run_dir = os.path.abspath(args.run_dir)
    if not args.cmd:
        raise core.UsageError("no command given")
    check_adapters(args)
    outputs = normal_patterns(args.output, "--output")
    allow_empty = normal_patterns(args.allow_empty, "--allow-empty")
    if args.check_deadman:
        dm = core.deadman_state(run_dir)
        if dm["watching"]:
            raise core.Refused("a dead-man (pid %s) is still armed on %s; disarm it first: deadman.py ack --run-dir "
                               "%s --disarm" % (dm["pid"], run_dir, run_dir))
    launch_argv = [w[2:] if w.startswith("w:") else w for w in args.launch_arg]
    with status_lock(run_dir):
        move_old_evidence(run_dir)
        raw = run_path(run_dir, RAW_ARGV)
        if core.url_secrets(args.cmd) or core.url_secrets(launch_argv):
            core.atomic_write(raw, core.dumps({"cmd": args.cmd, "launch_argv": launch_argv}), mode=0o600)
        elif os.path.lexists(raw):
            unlink_quiet(raw)
        core.atomic_write_json(run_path(run_dir, RUN), {
            "run_id": args.run_id, "cmd": core.scrub_record(args.cmd), "cwd": args.cwd, "profile": args.profile or None,
            "host": socket.gethostname(), "created_at": core.utc_iso(), "outputs": outputs,
            "allow_empty": allow_empty, "durable_dir": args.durable_dir or None, "results_dir": args.results_dir,
            "run_dir": run_dir, "stop_signal": args.stop_signal, "resume_glob": args.resume_glob or None,
            "resume_arg": args.resume_arg or None,
            "resume_from": args.resume_from or None, "progress_regex": args.progress_regex or None,
            "attempt": attempt_number(run_dir), "auto_resume": args.auto_resume,
            "max_attempts": args.max_attempts, "total_steps": args.total_steps,
            "notify_events": notify_events(args.notify_events),
            "launch_argv": core.scrub_record(launch_argv)})
        write_outputs_list(run_dir, args.cwd, outputs)
        runrec.init_attempt(run_dir, {
            "run_id": args.run_id, "state": "starting", "job_pid": None, "job_identity": None, "exit_code": None,
            "started_at": None, "ended_at": None, "updated_at": core.utc_iso(), "detach": args.detach,
            "launcher_pid": args.launcher_pid, "launcher_identity": core.process_identity(args.launcher_pid),
            "supervisor_pid": None, "supervisor_identity": None, "sync": None, "error": None,
            "attempt": attempt_number(run_dir), "resume": None})
    with open(run_path(run_dir, "job.log"), "ab"):
        pass
    return 0


def write_outputs_list(run_dir, cwd, outputs):
    """runrec.OUTPUTS_LIST for status_facts.sh; removed when there is nothing a shell could read back exactly
    (no globs, a relative cwd, a line holding a newline)."""
    path = run_path(run_dir, runrec.OUTPUTS_LIST)
    lines = [cwd] + outputs if outputs and isinstance(cwd, str) and cwd.startswith("/") else []
    if lines and not any("\n" in line for line in lines):
        core.atomic_write(path, "\n".join(lines) + "\n")
    elif os.path.lexists(path):
        unlink_quiet(path)


def give_up(run_dir, message):
    """Mark the run failed unless a supervisor recorded itself -> True when no supervisor ever claimed
    it (marked now, or given up earlier): none can claim it after this, so nothing of it ever runs."""
    with status_lock(run_dir):
        doc = read_status(run_dir)
        if doc.get("supervisor_identity"):
            return False
        if doc.get("state") == "failed" and doc.get("job_pid") is None and doc.get("supervisor_pid") is None:
            return True   # already given up (a supervisor only claims a run that is still "starting")
        if doc.get("state") != "starting":
            return False
        doc.update(state="failed", error=message, ended_at=core.utc_iso())
        error = save_status(run_dir, doc)
        if error:
            raise core.CheckFailed(error)
        return True


def op_fail(args):
    if not give_up(os.path.abspath(args.run_dir), args.message):
        say("%s: not marking the run failed: a supervisor has it (state %s)"
            % (PROG, read_status(args.run_dir).get("state")))
        return 1
    return 0


def supervisor_argv(run_dir):
    return [sys.executable, "-E", "-S", SUPERVISE, "--run-dir=" + run_dir]


def start_tmux(run_dir, name, cwd):
    """Start the supervisor in a tmux session on its own server -> (pane pid, None) or (None, why)."""
    env = dict(os.environ)
    env.pop("TMUX", None)
    # argv straight to tmux (no shell, no quoting): a run dir with any characters works under any shell
    res = core.run_bounded(["tmux", "-L", name, "new-session", "-d", "-P", "-F", "#{pane_pid}", "-s", name,
                            "-c", cwd, "--"] + supervisor_argv(run_dir), 20, env=env)
    line = res.output.strip().splitlines()[-1:] if res.output.strip() else []
    if res.rc == 0 and line and line[0].strip().isdigit():
        return int(line[0].strip()), None
    return None, (res.error or ("timed out" if res.timed_out else res.output.strip()[:200]) or "exit %s" % res.rc)


def start_supervisor(run_dir, detach, tmux_name, timeout=START_TIMEOUT):
    """Start the detached supervisor and wait until status.json records it (it may have finished already).
    A supervisor that died, or did not record itself in TIMEOUT s, is given up under the status lock, so a late
    one can never run the job; CheckFailed then."""
    run = core.read_json(run_path(run_dir, RUN))
    cwd = run.get("cwd") or os.getcwd()
    child, pane = None, None
    if detach == "tmux":
        set_status(run_dir, detach="tmux", tmux_socket=tmux_name)
        pane, why = start_tmux(run_dir, tmux_name, cwd)
        if pane is None:
            say("%s: tmux could not start a session (%s); falling back to setsid" % (PROG, why))
            detach = "setsid"
    if detach == "setsid":
        set_status(run_dir, detach="setsid", tmux_socket=None)
        try:  # its own session: no terminal, no SIGHUP when the SSH session drops
            with open(run_path(run_dir, "supervisor.log"), "ab") as log:
                child = subprocess.Popen(supervisor_argv(run_dir), cwd=cwd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        except OSError as exc:
            give_up(run_dir, "cannot start the supervisor: %s" % exc)
            raise core.CheckFailed("cannot start the supervisor: %s" % exc)
    deadline = time.monotonic() + timeout
    while True:
        if read_status(run_dir).get("supervisor_identity"):
            return
        gone = child.poll() is not None if child else not core.pid_alive(pane)
        if gone or time.monotonic() > deadline:
            why = "exited before it recorded itself" if gone else "did not record itself within %g s" % timeout
            message = "the supervisor %s (%s); see %s" % (why, detach, run_path(run_dir, "supervisor.log"))
            if not give_up(run_dir, message):
                return  # it recorded itself at the last moment: it runs the job
            if child and child.poll() is None:
                child.kill()
            elif pane and detach == "tmux":
                core.run_bounded(["tmux", "-L", tmux_name, "kill-server"], 10)
            raise core.CheckFailed(message)
        time.sleep(0.02)


def tmux_name(run_id):
    return "rgt-" + re.sub(r"[.:]", "_", run_id)


def arm_deadman(run_dir, words):
    """Arm the run's dead-man in this process (deadman.py arm's own code: it forks the watcher) -> its pid."""
    import deadman
    try:
        args = deadman.build_parser().parse_args(["arm", "--run-dir", run_dir] + list(words))
    except core.UsageError as exc:
        raise core.UsageError("deadman.py rejected its arguments: %s; nothing was started" % exc)
    try:
        pid, _cfg = deadman.arm(args)
    except core.UsageError as exc:
        raise core.UsageError("the dead-man's settings are wrong: %s; nothing was started" % exc)
    except (core.Refused, core.CheckFailed, OSError) as exc:
        raise core.Refused("the dead-man could not be armed (%s); nothing was started" % exc)
    return pid


def op_start(args):
    """The launch after prepare: the run record, the dead-man, the supervisor, the report (with --wait, the end).
    Whatever fails before a supervisor claims the run leaves a readable failed status and no armed dead-man."""
    run_dir = os.path.abspath(args.run_dir)
    args.check_deadman = not args.no_deadman
    args.detach = "tmux" if shutil.which("tmux") else "setsid"
    op_init(args)
    deadman_pid = None
    try:
        if args.no_deadman:
            say("%s: !!! --no-deadman: NOTHING on this node will stop the meter if the job hangs, ends or the node "
                "is forgotten !!!" % PROG)
        else:
            deadman_pid = arm_deadman(run_dir, args.deadman_arg)
        start_supervisor(run_dir, args.detach, tmux_name(args.run_id))
    except BaseException as exc:
        known = isinstance(exc, (core.UsageError, core.Refused, core.CheckFailed))
        if give_up(run_dir, str(exc) if known else "the launch failed: %r" % exc) and deadman_pid:
            import deadman
            deadman.disarm(run_dir)   # no supervisor ever claimed the run, nor can now: nothing to watch
        raise
    if not args.output:
        say("%s: no --output given: only the run's logs will be copied to %s when the job ends"
            % (PROG, args.results_dir))
    args.deadman_pid = deadman_pid
    args.dry_run = "--dry-run" in args.deadman_arg
    return op_report(args)


# ---------------------------------------------------------------- the launch report

def launch_info(run_dir, args):
    run = core.read_json(run_path(run_dir, RUN))
    doc = read_status(run_dir)
    if run.get("resume_arg"):   # the supervisor records where it resumes from just before the job starts
        deadline = time.monotonic() + 10.0
        while doc.get("state") == "starting" and doc.get("resume") is None and time.monotonic() < deadline \
                and core.identity_alive(doc.get("supervisor_identity")):
            time.sleep(0.05)
            doc = read_status(run_dir)
    results = run.get("results_dir") or runrec.layout(None, run.get("run_id"), run_dir)["results_dir"]
    q = shlex.quote
    tmux = doc.get("tmux_socket") if doc.get("detach") == "tmux" else None
    watch = ["python3 %s %s" % (q(os.path.join(core.NODE_DIR, "run_status.py")), q(run_dir)),
             "tail -f %s" % q(run_path(run_dir, "job.log"))]
    if tmux:
        watch.append("tmux -L %s attach -t %s" % (q(tmux), q(tmux)))
    dm = None
    if args.deadman_pid:
        state = core.deadman_state(run_dir)
        dm = {"pid": args.deadman_pid, "state": state["word"].lower(), "dry_run": bool(args.dry_run)}
    return {"run_id": run.get("run_id"), "attempt": doc.get("attempt"), "run_dir": run_dir, "cwd": run.get("cwd"),
            "detach": doc.get("detach"),
            "tmux": {"socket": tmux, "session": tmux, "attach": watch[-1]} if tmux else None,
            "supervisor_pid": doc.get("supervisor_pid"), "supervisor_identity": doc.get("supervisor_identity"),
            "deadman": dm or {"pid": None, "state": "disabled", "dry_run": False},
            "watch": watch,
            "ack": ("python3 %s ack --run-dir %s --postpone-minutes 60" % (
                q(os.path.join(core.NODE_DIR, "deadman.py")), q(run_dir))) if dm else None,
            "results_dir": results, "manifest": os.path.join(results, evidence.MANIFEST_NAME),
            "outputs": run.get("outputs") or [], "allow_empty": run.get("allow_empty") or [],
            "resume": doc.get("resume"), "node_version": core.toolkit_version()}


def report_text(info):
    lines = ["run id:   %s" % info["run_id"], "attempt:  %s" % (info["attempt"] or "?"), "run dir:  %s" % info["run_dir"]]
    if info["tmux"]:
        lines.append("detach:   tmux session %s on its own server (socket %s), supervisor pid %s"
                     % (info["tmux"]["session"], info["tmux"]["socket"], info["supervisor_pid"]))
    else:
        lines.append("detach:   setsid (own session), supervisor pid %s" % info["supervisor_pid"])
    dm = info["deadman"]
    if dm["pid"]:
        lines.append("dead-man: %s, pid %s%s" % (dm["state"], dm["pid"],
                                                 " (DRY RUN: records, stops nothing)" if dm["dry_run"] else ""))
    else:
        lines.append("dead-man: DISABLED (--no-deadman) - nothing stops the meter for you")
    lines.append("watch:    " + info["watch"][0])
    lines.extend("          " + cmd for cmd in info["watch"][1:])
    if info["ack"]:
        lines.append("ack:      %s   (or --disarm)" % info["ack"])
    lines.append("results:  %s (outputs + run record + logs/, sha256-verified; manifest %s)" % (info["results_dir"],
                                                                                  evidence.MANIFEST_NAME))
    resume = info.get("resume")
    if isinstance(resume, dict):
        if resume.get("from"):
            lines.append("resume:   from %s (written by: %s)%s" % (resume["from"], resume.get("written_by") or "?",
                                                               " (put back from %s)" % resume["restored_from"]
                                                               if resume.get("restored_from") else ""))
        else:
            lines.append("resume:   none: starts from step 0 (no good checkpoint of this run's own)")
        for item in (resume.get("skipped") or [])[:3]:
            lines.append("          skipped %s: %s" % (item.get("path"), item.get("why")))
    return "\n".join(lines) + "\n"


def wait_end(run_dir, cap):
    """Wait until the run is over (a terminal state AND its supervisor gone) -> status.json."""
    delay, terminal_since = 0.02, None
    while True:
        doc = read_status(run_dir)
        alive = core.identity_alive(doc.get("supervisor_identity") or doc.get("supervisor_pid"))
        if doc.get("state") in TERMINAL:
            terminal_since = terminal_since or time.monotonic()
            if not alive or time.monotonic() - terminal_since > 10:
                return doc
        elif not alive:
            doc = read_status(run_dir)
            if doc.get("state") not in TERMINAL:
                return doc
        time.sleep(delay)
        delay = min(cap, delay * 1.5)


def final_code(doc):
    state, code = doc.get("state"), doc.get("exit_code")
    if state == "succeeded":
        return 0
    if state in ("failed", "interrupted") and isinstance(code, int) and not isinstance(code, bool) and 0 < code < 256:
        return code
    return 1


def op_report(args):
    run_dir = os.path.abspath(args.run_dir)
    info = launch_info(run_dir, args)
    if not args.json:
        sys.stdout.write(report_text(info))
        sys.stdout.flush()
    if not args.wait:
        if args.json:
            core.emit_json(info)
        return 0
    doc = wait_end(run_dir, max(0.05, min(1.0, args.poll_seconds)))
    state, sync = doc.get("state"), doc.get("sync") if isinstance(doc.get("sync"), dict) else {}
    if args.json:
        info.update(launch_info(run_dir, args))
        info["final"] = {"state": state, "exit_code": doc.get("exit_code"), "ended_at": doc.get("ended_at"),
                         "error": doc.get("error"), "sync": sync or None}
        core.emit_json(info)
    else:
        print("finished: state %s, job exit code %s" % (state or "?", "?" if doc.get("exit_code") is None
                                                        else doc.get("exit_code")))
        kept = sync.get("kept_generation") if isinstance(sync.get("kept_generation"), dict) else None
        if kept:
            print("generation: results now hold attempt %s's outputs; attempt %s's verified results were kept in "
                  "%s (%s)" % (sync.get("generation"), kept.get("attempt"), kept.get("dir"), kept.get("why")))
    if state == "sync_failed":
        core.say_error("the job exited 0 but the durable sync failed: %s" % sync.get("error"), PROG)
    elif state not in TERMINAL:
        core.say_error("the supervisor (pid %s) is gone but the run is still '%s': see %s"
                       % (doc.get("supervisor_pid"), state, run_path(run_dir, "job.log")), PROG)
    return final_code(doc)


# ---------------------------------------------------------------- the command line

def positive(text):
    try:
        value = float(text)
    except ValueError:
        raise core.UsageError("%r is not a number" % text)
    if not value > 0 or value != value or value == float("inf"):
        raise core.UsageError("%r must be a positive number" % text)
    return value


# Each option's one line for `launcher.py SUB --help` (the docstring's Usage says how they combine).
OPTION_HELP = {
    "--run-dir": "the run dir (prepare: default DURABLE_DIR/runs/RUN_ID)",
    "--run-id": "the run id (prepare: default a new one)",
    "--cwd": "the job's working directory",
    "--results-dir": "where the durable sync puts the run's outputs",
    "--launcher-pid": "run_one.sh's pid: the run lock's owner until a supervisor claims the run",
    "--profile": "the platform profile (its DATA_DIR, DURABLE_DIR and meter-stop defaults)",
    "--durable-dir": "DURABLE_DIR (a flag beats the environment, which beats the profile)",
    "--tag": "a word for the new run id",
    "--disk-floor-gb": "the disk gate's floor, GiB (default DISK_FLOOR_GB, else the toolkit's)",
    "--require-gpu": "refuse unless `nvidia-smi -L` lists a GPU",
    "--gpu-timeout": "seconds --require-gpu waits for nvidia-smi (default 15)",
    "--output": "a glob (relative to the job's cwd) the durable sync saves; repeatable",
    "--allow-empty": "an --output glob that may match nothing; repeatable",
    "--stop-signal": "the signal that asks the job to stop (default TERM)",
    "--resume-glob": "the job's checkpoint glob, for a resume adapter",
    "--resume-arg": "the words a resume adds ({} becomes the checkpoint path)",
    "--resume-from": "the checkpoint this attempt resumes from",
    "--progress-regex": "a regex with (?P<step>...) that reads progress from the job's log",
    "--auto-resume": "boot_resume.py relaunches this run after a restart",
    "--max-attempts": "attempt cap for resumes (default 3)",
    "--total-steps": "the run's total steps, for a trainer that prints none",
    "--notify-events": "the events that send a notification (comma-separated)",
    "--launch-arg": "one word of run_one.sh's own command line, kept for a resume; repeatable",
    "--no-deadman": "start without a dead-man",
    "--deadman-arg": "one word for `deadman.py arm`; repeatable",
    "--words-on-stdin": "read the launch's and the job's words from stdin (NUL-terminated), never argv",
    "--wait": "wait for the run to end and exit like run_one.sh --wait",
    "--poll-seconds": "how often --wait looks (default 1)",
    "--json": "one JSON object on stdout",
    "--detach": "how the supervisor is detached: tmux or setsid",
    "--check-deadman": "refuse (3) while a live dead-man is armed on the run dir",
    "--message": "why the launch failed (recorded in status.json)",
    "--deadman-pid": "the dead-man this launch armed, for the report",
    "--dry-run": "report a launch that was not started",
}


def add(p, name, **kw):
    """p.add_argument with the option's help from OPTION_HELP."""
    kw.setdefault("help", OPTION_HELP[name])
    return p.add_argument(name, **kw)


def run_record_options(p):
    """The options that become run.json (init and start)."""
    for name in ("--run-dir", "--run-id", "--cwd", "--results-dir"):
        add(p, name, required=True)
    add(p, "--launcher-pid", type=int, required=True)
    add(p, "--profile", default="")
    add(p, "--durable-dir", default="")
    adapter_options(p)
    add(p, "--launch-arg", action="append", default=[])
    add(p, "--output", action="append", default=[])
    add(p, "--allow-empty", action="append", default=[])


def adapter_options(p):
    """The adapters for a trainer we did not write (prepare checks them, init records them)."""
    add(p, "--stop-signal", choices=STOP_SIGNALS, default="TERM")
    add(p, "--resume-glob", default="")
    add(p, "--resume-arg", default="")
    add(p, "--resume-from", default="")
    add(p, "--progress-regex", default="")
    add(p, "--auto-resume", action="store_true")
    add(p, "--max-attempts", type=int, default=3)
    add(p, "--total-steps", type=core.arg_number(int, 1, 1e15), default=None)
    add(p, "--notify-events", default="")


def report_options(p):
    add(p, "--wait", action="store_true")
    add(p, "--poll-seconds", type=positive, default=1.0)
    add(p, "--json", action="store_true")


def words_from_stdin():
    """(launch words, job words) from stdin: NUL-terminated words, the first the number of launch words. The
    job never appears in start's argv, so neither in its fork, the dead-man's (`pgrep -f train.py` stays true)."""
    data = getattr(sys.stdin, "buffer", sys.stdin).read()
    words = [w.decode("utf-8", "surrogateescape") for w in data.split(b"\0")[:-1]]
    if not words or not words[0].isdigit() or int(words[0]) > len(words) - 1:
        raise core.UsageError("--words-on-stdin: stdin holds no launch (a count, then NUL-terminated words)")
    count = int(words[0])
    return ["w:" + w for w in words[1:1 + count]], words[1 + count:]


def build_parser():
    parser = core.Parser(prog="launcher.py", description="The Python half of run_one.sh (see the module docstring).")
    sub = parser.add_subparsers(dest="op", parser_class=core.Parser)
    sub.required = True
    codes = core.exit_codes_epilog(__doc__)   # each subcommand's --help ends with the codes, as every tool's
    sub.add_parser = functools.partial(sub.add_parser, epilog=codes, formatter_class=core.RawHelp)
    p = sub.add_parser("prepare", help="the gates, the run dir and its lock; KEY NUL VALUE NUL pairs")
    for name in ("--profile", "--run-id", "--run-dir", "--durable-dir", "--tag"):
        add(p, name, default="")
    add(p, "--disk-floor-gb", type=core.arg_number(float, 0.0, 1e9), default=None)
    add(p, "--require-gpu", action="store_true")
    add(p, "--gpu-timeout", type=positive, default=15.0)
    add(p, "--launcher-pid", type=int, required=True)
    add(p, "--output", action="append", default=[])
    add(p, "--allow-empty", action="append", default=[])
    adapter_options(p)
    p = sub.add_parser("start", help="the run record, the dead-man, the supervisor and the report")
    run_record_options(p)
    add(p, "--no-deadman", action="store_true")
    add(p, "--deadman-arg", action="append", default=[])
    add(p, "--words-on-stdin", action="store_true")
    report_options(p)
    p = sub.add_parser("init", help="write run.json and status.json")
    run_record_options(p)
    add(p, "--detach", choices=("tmux", "setsid"), required=True)
    add(p, "--check-deadman", action="store_true")
    p = sub.add_parser("fail", help="mark a run that never got a supervisor failed")
    add(p, "--run-dir", required=True)
    add(p, "--message", required=True)
    p = sub.add_parser("report", help="the launch report; --wait for the end")
    add(p, "--run-dir", required=True)
    add(p, "--deadman-pid", type=int, default=None)
    add(p, "--dry-run", action="store_true")
    report_options(p)
    return parser


OPS = {"prepare": op_prepare, "start": op_start, "init": op_init, "fail": op_fail, "report": op_report}


def main(argv=None):
    core.check_toolkit()
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if argv[:1] in (["init"], ["start"]) and "--" in argv:  # the job's own argv follows the first "--", verbatim
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    if argv[:1] == ["--help"] or argv[:1] == ["-h"]:
        sys.stdout.write(__doc__)
        return 0
    args = build_parser().parse_args(argv)
    if args.op in ("init", "start"):
        args.cmd = rest
    if getattr(args, "words_on_stdin", False):
        args.launch_arg, args.cmd = words_from_stdin()
    return OPS[args.op](args)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
