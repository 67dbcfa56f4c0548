#!/usr/bin/env python3
"""launcher.py: the Python half of run_one.sh (the launch steps and the launch report).

run_one.sh runs one operation of this file at each step that needs JSON or filesystem work; the
supervisor that stays behind on the node (inside tmux, or in its own session) is `supervise`.
Python 3.8+, standard library only; imports rgt_core and evidence from this folder.
Errors are one line, `run_one.sh: error: ...` (it is run_one.sh's code).

Usage:
  launcher.py profile NAME
      the profile's scalar defaults as KEY NUL VALUE NUL pairs (first pair: @index PATH)
  launcher.py check-patterns [--output GLOB]... [--allow-empty GLOB]...
      exit 2 when a glob is absolute, has '..' or is empty
  launcher.py disk [--floor-gb N] [--floor-inodes N] [--writable DIR]... -- PATH...
      the launch disk gate: free bytes AND inodes of each filesystem, a write probe in each DIR; the
      floors default to rgt_core's DEFAULT_DISK_FLOOR_GB and DEFAULT_MIN_FREE_INODES (run_one.sh passes
      a floor only when --disk-floor-gb, DISK_FLOOR_GB or DISK_FLOOR_INODES sets one)
  launcher.py gpu-gate [--timeout S]
      refuse unless `nvidia-smi -L` lists a GPU within S seconds (default 15)
  launcher.py init --run-dir D --run-id ID --cwd DIR --results-dir R --detach tmux|setsid
                    --launcher-pid PID [--profile NAME] [--durable-dir DIR] [--check-deadman]
                    [--output GLOB]... [--allow-empty GLOB]... -- CMD [ARGS...]
      [--stop-signal SIG] [--resume-glob GLOB --resume-arg TEMPLATE] [--resume-from PATH] [--progress-regex RE]
                    [--auto-resume] [--max-attempts N] [--launch-arg WORD]... [--total-steps N]
      write run.json and status.json (state starting, attempt N); an earlier attempt's evidence moves to
      previous/<stamp>/; refused (3) while a live dead-man is armed on D (with --check-deadman)
  launcher.py fail --run-dir D --message TEXT
      mark a run that never got a supervisor as failed; exit 0 when no supervisor ever claimed it
      (nor can now), exit 1, changing nothing, when one has
  launcher.py start --run-dir D --detach tmux|setsid [--tmux-name NAME] [--timeout S]
      start the detached supervisor and wait until status.json records it (its identity); a
      supervisor that died or did not record itself within S s (default 30) -> the run is marked
      failed under the status lock, so a late supervisor can never run it, and exit 1
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
import os
import re
import shlex
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
TERMINAL = runrec.TERMINAL
RAW_ARGV = runrec.RAW_ARGV
SUPERVISE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")

status_lock, save_status, set_status = runrec.status_lock, runrec.save_status, runrec.set_status
attempt_number = runrec.attempt_number


def run_path(run_dir, name):
    return os.path.join(run_dir, name)


def say(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def read_status(run_dir):
    return runrec.status(run_dir)


def unlink_quiet(path):
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------- launch steps

def op_profile(args):
    index = core.profile_index_path()
    pairs = [("@index", index or "")] + sorted(core.profile_defaults(args.name).items())
    out = getattr(sys.stdout, "buffer", sys.stdout)
    out.write("".join("%s\0%s\0" % pair for pair in pairs).encode("utf-8"))
    return 0


def normal_patterns(patterns, what):
    out = []
    for pattern in patterns or []:
        try:
            out.append(evidence.check_pattern(pattern))
        except core.UsageError as exc:
            detail = str(exc).replace("roster entry %r" % pattern, "").replace("--root", "the working directory")
            raise core.UsageError("%s %r %s" % (what, pattern, detail.strip()))
    return out


def op_check_patterns(args):
    normal_patterns(args.output, "--output")
    normal_patterns(args.allow_empty, "--allow-empty")
    return 0


def op_disk(args):
    ok, checks = core.disk_gate(args.paths, args.floor_gb, args.floor_inodes, writable=args.writable)
    for check in checks:
        say(check["line"])
    if ok:
        return 0
    unwritable = [c for c in checks[-len(args.writable):] if c["status"] != core.OK] if args.writable else []
    if unwritable:
        raise core.Refused("%s (the end-of-run sync would fail after the GPU hours are spent: fix the mount or "
                           "the permissions, or choose another --durable-dir); nothing was started"
                           % "; ".join(c["line"].replace("REFUSED ", "", 1) for c in unwritable))
    raise core.Refused("disk floor not met (need %g GiB and %d inodes free): free space first (df -h; df -i); "
                       "nothing was started" % (args.floor_gb, args.floor_inodes))


def op_gpu_gate(args):
    res = core.run_bounded(["nvidia-smi", "-L"], args.timeout)
    if res.timed_out:
        raise core.Refused("--require-gpu: nvidia-smi did not answer within %g s (a hung driver: look for Xid errors "
                           "in dmesg); nothing was started" % args.timeout)
    if res.error:
        raise core.Refused("--require-gpu: nvidia-smi lists no GPU (it is not installed: no driver?); "
                           "nothing was started")
    gpus = [line for line in res.output.splitlines() if line.startswith("GPU ")]
    if not gpus:
        raise core.Refused("--require-gpu: nvidia-smi lists no GPU (missing driver, or the box came back without "
                           "one; nvidia-smi exit %s); nothing was started" % res.rc)
    say("%s GPU gate: %d GPU(s) listed by nvidia-smi" % (core.OK, len(gpus)))
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
            "launch_argv": core.scrub_record(launch_argv)})
        core.atomic_write_json(run_path(run_dir, STATUS), {
            "run_id": args.run_id, "state": "starting", "job_pid": None, "job_identity": None, "exit_code": None,
            "started_at": None, "ended_at": None, "updated_at": core.utc_iso(), "detach": args.detach,
            "launcher_pid": args.launcher_pid, "launcher_identity": core.process_identity(args.launcher_pid),
            "supervisor_pid": None, "supervisor_identity": None, "sync": None, "error": None,
            "attempt": attempt_number(run_dir), "resume": None})
    with open(run_path(run_dir, "job.log"), "ab"):
        pass
    try:  # the environment record for reproduction (run_env.py, detached): never blocks or fails a launch
        import run_env
        pid = run_env.start_detached(run_dir)
        if pid:  # the end-of-run sync waits (bounded) for it, so env.json reaches the results dir
            with status_lock(run_dir):
                core.update_json(run_path(run_dir, STATUS), run_env_identity=core.process_identity(pid))
    except Exception as exc:  # noqa: BLE001
        say("%s: the environment was not recorded (%s)" % (PROG, exc))
    return 0



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


def op_start(args):
    run_dir = os.path.abspath(args.run_dir)
    run = core.read_json(run_path(run_dir, RUN))
    cwd = run.get("cwd") or os.getcwd()
    detach, child, pane = args.detach, None, None
    if detach == "tmux":
        set_status(run_dir, detach="tmux", tmux_socket=args.tmux_name)
        pane, why = start_tmux(run_dir, args.tmux_name, cwd)
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
    deadline = time.monotonic() + args.timeout
    while True:
        if read_status(run_dir).get("supervisor_identity"):
            return 0
        gone = child.poll() is not None if child else not core.pid_alive(pane)
        if gone or time.monotonic() > deadline:
            why = "exited before it recorded itself" if gone else "did not record itself within %g s" % args.timeout
            message = "the supervisor %s (%s); see %s" % (why, detach, run_path(run_dir, "supervisor.log"))
            if not give_up(run_dir, message):
                return 0  # it recorded itself at the last moment: it runs the job
            if child and child.poll() is None:
                child.kill()
            elif pane and detach == "tmux":
                core.run_bounded(["tmux", "-L", args.tmux_name, "kill-server"], 10)
            raise core.CheckFailed(message)
        time.sleep(0.02)


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
    results = run.get("results_dir") or run_path(run_dir, "results")
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


def build_parser():
    parser = core.Parser(prog="launcher.py", description="The Python half of run_one.sh (see the module docstring).")
    sub = parser.add_subparsers(dest="op", parser_class=core.Parser)
    sub.required = True
    p = sub.add_parser("profile", help="a profile's defaults, NUL-separated")
    p.add_argument("name")
    p = sub.add_parser("check-patterns", help="validate --output / --allow-empty globs")
    p.add_argument("--output", action="append", default=[])
    p.add_argument("--allow-empty", action="append", default=[])
    p = sub.add_parser("disk", help="the launch disk gate")
    p.add_argument("--floor-gb", type=float, default=core.DEFAULT_DISK_FLOOR_GB,
                   help="GiB free required (default %g: rgt_core.DEFAULT_DISK_FLOOR_GB)" % core.DEFAULT_DISK_FLOOR_GB)
    p.add_argument("--floor-inodes", type=int, default=core.DEFAULT_MIN_FREE_INODES,
                   help="free inodes required (default %d: rgt_core.DEFAULT_MIN_FREE_INODES)"
                        % core.DEFAULT_MIN_FREE_INODES)
    p.add_argument("--writable", action="append", default=[])
    p.add_argument("paths", nargs="+")
    p = sub.add_parser("gpu-gate", help="refuse unless nvidia-smi lists a GPU in time")
    p.add_argument("--timeout", type=positive, default=15.0)
    p = sub.add_parser("init", help="write run.json and status.json")
    for name in ("--run-dir", "--run-id", "--cwd", "--results-dir"):
        p.add_argument(name, required=True)
    p.add_argument("--detach", choices=("tmux", "setsid"), required=True)
    p.add_argument("--launcher-pid", type=int, required=True)
    p.add_argument("--profile", default="")
    p.add_argument("--durable-dir", default="")
    p.add_argument("--check-deadman", action="store_true")
    p.add_argument("--stop-signal", choices=STOP_SIGNALS, default="TERM")
    p.add_argument("--resume-glob", default="")
    p.add_argument("--resume-arg", default="")
    p.add_argument("--resume-from", default="")
    p.add_argument("--progress-regex", default="")
    p.add_argument("--auto-resume", action="store_true")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--launch-arg", action="append", default=[])
    p.add_argument("--total-steps", type=core.arg_number(int, 1, 1e15), default=None,
                   help="the run's total steps, for a trainer that prints none (run.json total_steps)")
    p.add_argument("--output", action="append", default=[])
    p.add_argument("--allow-empty", action="append", default=[])
    p = sub.add_parser("fail", help="mark a run that never got a supervisor failed")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--message", required=True)
    p = sub.add_parser("start", help="start the detached supervisor, wait until it records itself")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--detach", choices=("tmux", "setsid"), required=True)
    p.add_argument("--tmux-name", default="")
    p.add_argument("--timeout", type=positive, default=120.0)  # generous: a loaded box starts Python slowly
    p = sub.add_parser("report", help="the launch report; --wait for the end")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--deadman-pid", type=int, default=None)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--poll-seconds", type=positive, default=1.0)
    p.add_argument("--json", action="store_true")
    return parser


OPS = {"profile": op_profile, "check-patterns": op_check_patterns, "disk": op_disk, "gpu-gate": op_gpu_gate,
       "init": op_init, "fail": op_fail, "start": op_start, "report": op_report}


def main(argv=None):
    core.check_toolkit()
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if argv[:1] == ["init"] and "--" in argv:  # the job's own argv follows the first "--", verbatim
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    if argv[:1] == ["--help"] or argv[:1] == ["-h"]:
        sys.stdout.write(__doc__)
        return 0
    args = build_parser().parse_args(argv)
    if args.op == "init":
        args.cmd = rest
    return OPS[args.op](args)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
