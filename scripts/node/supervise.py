#!/usr/bin/env python3
"""supervise.py: the Python half of run_one.sh (launch steps, the supervisor, the durable sync).

run_one.sh runs one operation of this file at each step that needs JSON or filesystem work; the
supervisor that stays behind on the node (inside tmux, or in its own session) is `supervise`.
Python 3.8+, standard library only; imports rgt_core and evidence from this folder.
Errors are one line, `run_one.sh: error: ...` (it is run_one.sh's code).

Usage:
  supervise.py profile NAME
      the profile's scalar defaults as KEY NUL VALUE NUL pairs (first pair: @index PATH)
  supervise.py check-patterns [--output GLOB]... [--allow-empty GLOB]...
      exit 2 when a glob is absolute, has '..' or is empty
  supervise.py disk --floor-gb N --floor-inodes N [--writable DIR]... -- PATH...
      the launch disk gate: free bytes AND inodes of each filesystem, a write probe in each DIR
  supervise.py gpu-gate [--timeout S]
      refuse unless `nvidia-smi -L` lists a GPU within S seconds (default 15)
  supervise.py init --run-dir D --run-id ID --cwd DIR --results-dir R --detach tmux|setsid
                    --launcher-pid PID [--profile NAME] [--durable-dir DIR] [--check-deadman]
                    [--output GLOB]... [--allow-empty GLOB]... -- CMD [ARGS...]
      [--stop-signal SIG] [--resume-glob GLOB --resume-arg TEMPLATE] [--progress-regex RE]
                    [--auto-resume] [--max-attempts N] [--launch-arg WORD]...
      write run.json and status.json (state starting, attempt N); an earlier attempt's evidence moves to
      previous/<stamp>/; refused (3) while a live dead-man is armed on D (with --check-deadman)
  supervise.py fail --run-dir D --message TEXT
      mark a run that never got a supervisor as failed; exit 0 when no supervisor ever claimed it
      (nor can now), exit 1, changing nothing, when one has
  supervise.py start --run-dir D --detach tmux|setsid [--tmux-name NAME] [--timeout S]
      start the detached supervisor and wait until status.json records it (its identity); a
      supervisor that died or did not record itself within S s (default 30) -> the run is marked
      failed under the status lock, so a late supervisor can never run it, and exit 1
  supervise.py supervise --run-dir D
      (internal, runs detached) claim the run, add the resume arguments (the newest checkpoint that
      passes the content check), run the job in its own session, forward SIGTERM/SIGINT/SIGHUP to
      its process group as the run's stop signal (TERM by default), wait until the group is gone,
      sync, record the final state; exit: the job's code, else 1 when the sync failed
  supervise.py sync --run-dir D
      run the end-of-run sync again for a finished run (after freeing disk, say); 0 ok, 1 failed
  supervise.py report --run-dir D [--deadman-pid PID] [--dry-run] [--wait] [--poll-seconds S] [--json]
      the launch report (text, or one JSON object with --json); with --wait, wait for the run to
      end and exit like run_one.sh --wait (0 succeeded, the job's code, 1 sync failed)

The handshake (why a job that exits at once is reported right): status.json is only changed
under an flock on RUN_DIR/.status.lock. The supervisor claims the run (state still "starting",
no supervisor recorded, run.lock held by the launcher) and records supervisor_identity in one
locked step; the launcher gives up only in a locked step that finds no supervisor recorded. So
exactly one of them wins, the launcher learns the start from the file, never from what run.lock
looked like, and a run that ran is never overwritten or disarmed by its launcher.

The sync (the one evidence format): the --output globs (relative to the job's cwd; * and **
match dotfiles), the run's record (run.json, env.json, code.patch, at the top, unless an output
has that name) and its logs (job.log, supervisor.log, deadman.log -> logs/) are copied to
the results dir, so a pulled copy serves repro.py and run_forensics.py as a run dir; each copy hashed while copying, fsynced and content-checked before it replaces
anything. A source that changes during its copy, a zero-byte file (unless --allow-empty covers
it) or a damaged checkpoint never replaces the previous durable copy: the old one stays and
status.json sync.kept_previous says so. Then PULL_MANIFEST.json is built over the results dir
(evidence.build_manifest, roster = the outputs + the record + logs/**), which re-reads every copy; status.json
"sync" records ok, verified, results_dir, manifest, file_count, total_bytes, error,
kept_previous, started_at, finished_at. A full disk ends in sync_failed with the error recorded
(a small reserve file in the run dir is given up so the final status can still be written).

Exit codes: 0 ok, 1 failed (the sync, the start, a job that failed: its code), 2 usage, 3 refused.
"""
import contextlib
import errno
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import traceback

import rgt_core as core
import runrec
import evidence

try:
    import fcntl
except ImportError:  # pragma: no cover - POSIX only
    fcntl = None

PROG = "run_one.sh"
STATUS = "status.json"
RUN = "run.json"
LOCK_DIR = "run.lock"
STATUS_LOCK = runrec.STATUS_LOCK
RESERVE = runrec.RESERVE
PART_SUFFIX = ".rgt-part"
TERMINAL = runrec.TERMINAL
LOG_NAMES = ("job.log", "supervisor.log", "deadman.log")
LOGS_ROSTER = "logs/**"
# The run's own record, beside the outputs at the top of the results dir, so a pulled copy is a run dir for
# repro.py and run_forensics.py: the launch (run.json), the environment (env.json), uncommitted code (code.patch).
RECORD_NAMES = ("run.json", "env.json", "code.patch")
RUN_ENV_WAIT_SECONDS = 120  # run_env.py's own probes time out at 60 s each; it normally takes a second or two
GLOB_CHARS = "*?["
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
PROGRESS_SECONDS = 30.0


def run_path(run_dir, name):
    return os.path.join(run_dir, name)


def say(line):
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- status.json: runrec owns it

status_lock, save_status, set_status = runrec.status_lock, runrec.save_status, runrec.set_status
attempt_number = runrec.attempt_number


def release_reserve(run_dir):
    return core.release_reserve(run_path(run_dir, RESERVE))


def read_status(run_dir):
    return runrec.status(run_dir)


def lock_owner(run_dir):
    try:
        with open(os.path.join(run_dir, LOCK_DIR, "pid")) as handle:
            return handle.read().strip()
    except OSError:
        return ""


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
    prev = os.path.join(run_dir, "previous", "%s-%d" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), os.getpid()))
    os.makedirs(prev)
    for name in names:
        os.replace(run_path(run_dir, name), os.path.join(prev, name))
    say("%s: earlier attempt's %s moved to %s" % (PROG, " ".join(names), prev))


STOP_SIGNALS = ("TERM", "INT", "HUP", "USR1", "USR2", "QUIT")


def check_adapters(args):
    """The resume and progress adapters, validated at launch (exit 2), never at the job's end."""
    if bool(args.resume_glob) != bool(args.resume_arg):
        raise core.UsageError("--resume-glob and --resume-arg go together (the checkpoints, and how to pass one)")
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


def durable_checkpoint(run, rx):
    """(rel, path) of the newest checkpoint in the run's results dir that matches the resume glob, is listed in
    its manifest and still hashes to it and passes the content check; else None."""
    results = run.get("results_dir") or ""
    manifest = core.read_json(os.path.join(results, evidence.MANIFEST_NAME))
    listed = [e for e in manifest.get("files") or [] if isinstance(e, dict) and isinstance(e.get("path"), str)
              and rx.fullmatch(e["path"]) and os.path.isfile(os.path.join(results, e["path"]))]
    listed.sort(key=lambda e: os.path.getmtime(os.path.join(results, e["path"])), reverse=True)
    for entry in listed:
        path = os.path.join(results, entry["path"])
        try:
            if core.sha256_file(path)[1] == entry.get("sha256") and evidence.content_check(path, entry["path"])[1] is None:
                return entry["path"], path
        except (OSError, ValueError):
            continue
    return None


def restore_checkpoint(run, rel, source):
    """Put the durable copy SOURCE back at CWD/REL for the trainer; a torn file there moves to RUN_DIR/torn/."""
    target = os.path.join(run.get("cwd") or ".", *rel.split("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target):
        aside = os.path.join(run.get("run_dir") or ".", "torn", "%s.%d" % (rel, int(time.time())))
        os.makedirs(os.path.dirname(aside), exist_ok=True)
        shutil.move(target, aside)
    tmp = os.path.join(os.path.dirname(target), ".%s.rgt-restore" % os.path.basename(target))
    copy_file(source, tmp)
    os.replace(tmp, target)


def resume_choice(run, restore=False):
    """(extra argv, record): the newest checkpoint matching resume_glob that passes the content check. With none
    good in the job's cwd (torn by a preemption mid-save, or the container disk wiped by a restart), the newest
    verified durable copy in the results dir is used: RESTORE copies it back first (the launch), without it
    the record only says it would (a dry run)."""
    pattern, template = run.get("resume_glob"), run.get("resume_arg")
    if not pattern or not template:
        return [], None
    cwd = run.get("cwd") or "."
    rx = evidence.compile_pattern(evidence.check_pattern(pattern))
    found = []
    for folder, dirs, files in os.walk(cwd):
        for name in files:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, cwd).replace(os.sep, "/")
            if rx.fullmatch(rel) and os.path.isfile(full):
                found.append((os.path.getmtime(full), rel))
    skipped = []
    for _mtime, rel in sorted(found, reverse=True):
        full = os.path.join(cwd, rel)
        _fmt, why = evidence.content_check(full, rel)
        if why is None and os.path.getsize(full) == 0:
            why = "zero bytes"
        if why is None:
            extra = [a.replace("{}", rel) for a in shlex.split(template)]
            return extra, {"from": rel, "args": extra, "skipped": skipped}
        skipped.append({"path": rel, "why": why})
    durable = durable_checkpoint(run, rx)
    if durable is not None:
        rel, source = durable
        if restore:
            restore_checkpoint(run, rel, source)
        extra = [a.replace("{}", rel) for a in shlex.split(template)]
        return extra, {"from": rel, "args": extra, "skipped": skipped, "restored_from": source}
    return [], {"from": None, "args": [], "skipped": skipped}


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
    with status_lock(run_dir):
        move_old_evidence(run_dir)
        core.atomic_write_json(run_path(run_dir, RUN), {
            "run_id": args.run_id, "cmd": args.cmd, "cwd": args.cwd, "profile": args.profile or None,
            "host": socket.gethostname(), "created_at": core.utc_iso(), "outputs": outputs,
            "allow_empty": allow_empty, "durable_dir": args.durable_dir or None, "results_dir": args.results_dir,
            "run_dir": run_dir, "stop_signal": args.stop_signal, "resume_glob": args.resume_glob or None,
            "resume_arg": args.resume_arg or None, "progress_regex": args.progress_regex or None,
            "attempt": attempt_number(run_dir), "auto_resume": args.auto_resume,
            "max_attempts": args.max_attempts,
            "launch_argv": [w[2:] if w.startswith("w:") else w for w in args.launch_arg]})
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
    return [sys.executable, "-E", "-S", os.path.abspath(__file__), "supervise", "--run-dir=" + run_dir]


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


# ---------------------------------------------------------------- the sync

def split_literal(pattern):
    """'out/sub/*.bin' -> (['out', 'sub'], ['*.bin']): the components before the first glob character."""
    parts = pattern.split("/")
    index = 0
    while index < len(parts) and not any(ch in parts[index] for ch in GLOB_CHARS):
        index += 1
    return parts[:index], parts[index:]


def plan_outputs(cwd, patterns):
    """Select the --output globs under CWD with evidence's roster rules -> (plan {rel: source}, errors).

    Each glob is walked from its literal leading directories (a checkpoint dir that is a symlink
    to the data disk is followed, a huge cwd is not walked for 'ckpt/*'). A symlink to a regular
    file is copied as that file; a dangling symlink, a FIFO, a device or an unreadable entry that
    a glob matches is an error, as is a glob that matches nothing."""
    groups = {}
    for pattern in patterns:
        literal, rest = split_literal(pattern)
        if not rest and os.path.isdir(os.path.join(cwd, *literal)):
            prefix, sub = literal, "**"
        elif not rest:
            prefix, sub = literal[:-1], literal[-1]
        else:
            prefix, sub = literal, "/".join(rest)
        groups.setdefault("/".join(prefix), []).append((pattern, sub))
    plan, errors = {}, []
    for prefix, members in sorted(groups.items()):
        base = os.path.join(cwd, *prefix.split("/")) if prefix else cwd
        subs = sorted({sub for _p, sub in members})
        if not os.path.isdir(base):
            chosen, problems, unmatched = {}, [], subs
        else:
            root = os.path.realpath(base)
            chosen, problems, _notes, unmatched = evidence.select(root, subs, set())

        def full(rel):
            return "%s/%s" % (prefix, rel) if prefix else rel

        for rel, real in chosen.items():
            plan[full(rel)] = real
        for prob in problems:
            rel = prob["path"]
            if prob["code"] == "unmatched":
                continue
            if prob["code"] == "escape":  # a link to a file elsewhere: copying it makes a real, durable file
                target = os.path.realpath(os.path.join(base, rel))
                try:
                    mode = os.stat(target).st_mode
                except OSError as exc:
                    errors.append("%s: dangling symlink: its target %s is missing or unreadable (%s)"
                                  % (full(rel), target, exc.strerror or exc))
                    continue
                if stat.S_ISREG(mode):
                    plan[full(rel)] = target
                else:
                    errors.append("%s: a symlink to %s, which is not a regular file; name its files instead"
                                  % (full(rel), target))
                continue
            errors.append("%s: %s" % (full(rel), prob["detail"]))
        for pattern, sub in members:
            if sub in unmatched:
                errors.append("--output %s matched nothing (relative to %s)" % (pattern, cwd))
    for rel in sorted(plan):
        why = evidence.path_problem(rel)
        if why:
            errors.append("%s: cannot be synced: %s" % (rel, why))
            del plan[rel]
    return plan, errors


def copy_file(src, tmp, on_bytes=None):
    """Copy SRC to TMP while hashing it (core.sha256_file), fsync the copy, drop its cached pages.

    Returns (size, sha256). Raises ValueError when SRC changed while it was copied (size or
    mtime moved: something still writes it), OSError when a read or write fails."""
    fout = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        def write_all(chunk):
            done = 0
            while done < len(chunk):
                done += os.write(fout, chunk[done:])

        size, digest = core.sha256_file(src, on_bytes=on_bytes, sink=write_all)
        os.fsync(fout)
        if hasattr(os, "posix_fadvise"):  # the manifest's re-read then reads the storage, not the cache
            try:
                os.posix_fadvise(fout, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
    finally:
        os.close(fout)
    st = os.stat(src)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(tmp, stat.S_IMODE(st.st_mode) & 0o777)
    return size, digest


def unlink_quiet(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class Sync(object):
    """One end-of-run sync into the results dir; .run() -> the status.json "sync" object."""

    def __init__(self, run_dir, note=None):
        self.run_dir = run_dir
        self.meta = core.read_json(run_path(run_dir, RUN))
        self.results = self.meta.get("results_dir") or run_path(run_dir, "results")
        self.note = note or (lambda text: None)
        self.errors, self.kept, self.copied, self.folders = [], [], {}, set()
        self.old_manifest_dropped = False
        self.meter_last = time.monotonic()
        self.meter_bytes = 0

    def progress(self, name):
        def on_bytes(count):  # a long copy is progress, not a stall, for the dead-man (job.log moves)
            self.meter_bytes += count
            if time.monotonic() - self.meter_last >= PROGRESS_SECONDS:
                self.meter_last = time.monotonic()
                self.note("syncing %s: %d MiB so far" % (name, self.meter_bytes >> 20))
        return on_bytes

    def drop_old_manifest(self):
        """The results dir is about to change: an old manifest would no longer describe it."""
        if not self.old_manifest_dropped:
            unlink_quiet(os.path.join(self.results, evidence.MANIFEST_NAME))
            self.old_manifest_dropped = True

    def clean_parts(self):
        for folder, _dirs, names in os.walk(self.results):
            for name in names:
                if name.endswith(PART_SUFFIX):
                    unlink_quiet(os.path.join(folder, name))

    def copy_changing(self, rel, src, tmp, snapshot):
        """copy_file -> (size, sha256); (None, None) when the source kept changing. A log (SNAPSHOT) that
        the dead-man is still appending to gets three tries, then the copy is taken as it is."""
        for attempt in range(3 if snapshot else 1):
            try:
                return copy_file(src, tmp, None if snapshot else self.progress(rel))
            except ValueError as exc:
                if "changed" not in str(exc):
                    raise
        if snapshot:
            return core.sha256_file(tmp)
        return None, None

    def copy_one(self, rel, src, snapshot):
        """Copy one file into place; False when the disk is full (stop copying)."""
        dst = os.path.join(self.results, *rel.split("/"))
        folder = os.path.dirname(dst)
        tmp = os.path.join(folder, ".%s%s" % (os.path.basename(dst)[:100], PART_SUFFIX))
        reason = None
        try:
            os.makedirs(folder, exist_ok=True)
            size, digest = self.copy_changing(rel, src, tmp, snapshot)
            if digest is None:
                reason = ("changed while it was being copied (something outside the job's process group still "
                          "writes it?)")
            elif size == 0 and not evidence.allowed_empty(rel, self.allow_empty):
                reason = "zero bytes (a save that was killed?); allow it with --allow-empty GLOB if empty is expected"
            else:
                reason = evidence.content_check(tmp, rel)[1]
            if reason is None:
                self.drop_old_manifest()
                os.replace(tmp, dst)
                self.folders.add(folder)
                self.copied[rel] = digest
                self.note("synced %s (%d bytes, sha256 %s...)" % (rel, size, digest[:12]))
                return True
        except (OSError, ValueError) as exc:
            unlink_quiet(tmp)
            reason = "copy failed: %s" % (getattr(exc, "strerror", None) or exc)
            self.reject(rel, dst, reason)
            return not (isinstance(exc, OSError) and exc.errno in FULL_DISK)
        unlink_quiet(tmp)
        self.reject(rel, dst, reason)
        return True

    def reject(self, rel, dst, reason):
        if os.path.isfile(dst):
            self.kept.append({"path": rel, "reason": reason})
            self.errors.append("%s: %s; the previous durable copy was kept" % (rel, reason))
        else:
            self.errors.append("%s: %s" % (rel, reason))

    def wait_for_run_env(self, limit=RUN_ENV_WAIT_SECONDS):
        """A job that ended within seconds may beat run_env.py (started at launch) to the finish: give it up
        to LIMIT seconds, so env.json and code.patch are part of the sync. Never longer: it is a record."""
        ident = read_status(self.run_dir).get("run_env_identity")
        deadline = time.monotonic() + limit
        if ident and core.identity_alive(ident):
            self.note("waiting up to %d s for run_env.py (pid %s) to finish env.json" % (limit, ident.get("pid")))
            while core.identity_alive(ident) and time.monotonic() < deadline:
                time.sleep(0.1)

    def run(self):
        outputs = list(self.meta.get("outputs") or [])
        self.allow_empty = [LOGS_ROSTER] + list(self.meta.get("allow_empty") or [])
        run_id = self.meta.get("run_id") or os.path.basename(self.run_dir)
        doc = {"ok": False, "verified": False, "results_dir": self.results, "manifest": None, "file_count": 0,
               "total_bytes": 0, "error": None, "kept_previous": self.kept, "started_at": core.utc_iso(),
               "started_epoch": time.time(),  # exact: a file changed after this is not what the sync saw
               "finished_at": None}
        plan, plan_errors = plan_outputs(self.meta.get("cwd") or ".", outputs)
        self.errors.extend(plan_errors)
        logs = [("logs/" + name, run_path(self.run_dir, name)) for name in LOG_NAMES
                if os.path.isfile(run_path(self.run_dir, name))]
        for rel, _src in logs:
            if rel in plan:
                self.errors.append("--output %s collides with the run's own log of that name" % rel)
                del plan[rel]
        self.wait_for_run_env()
        records = [(name, run_path(self.run_dir, name)) for name in RECORD_NAMES
                   if name not in plan and os.path.isfile(run_path(self.run_dir, name))]  # a job's own file wins
        try:
            os.makedirs(self.results, exist_ok=True)
            self.clean_parts()
        except OSError as exc:
            self.errors.append("cannot create the results dir %s: %s" % (self.results, exc.strerror or exc))
            return self.done(doc)
        # outputs first, then the record, logs last (the sync's own notes go to job.log)
        copies = [(item, False) for item in sorted(plan.items()) + records] + [(item, True) for item in logs]
        for (rel, src), snapshot in copies:
            if not self.copy_one(rel, src, snapshot):
                self.errors.append("stopped copying: the results filesystem is full or read-only")
                break
        for folder in self.folders:
            core.fsync_dir(folder)
        self.write_manifest(doc, outputs + [rel for rel, _src in records if rel in self.copied] + [LOGS_ROSTER],
                            run_id)
        return self.done(doc)

    def write_manifest(self, doc, roster, run_id):
        try:
            manifest, problems, _notes = evidence.build_manifest(self.results, roster, run_id,
                                                                 allow_empty=self.allow_empty, progress=False)
        except (OSError, core.UsageError) as exc:
            manifest, problems = None, [evidence.problem("manifest", self.results, str(exc))]
        if manifest is None:
            self.drop_old_manifest()
            self.errors.append("no manifest: %s" % "; ".join("%s: %s" % (p["path"], p["detail"]) for p in problems[:5]))
            return
        entries = {e["path"]: e for e in manifest["files"]}
        bad = sorted(rel for rel, digest in self.copied.items() if entries.get(rel, {}).get("sha256") != digest)
        files, tree_problems = evidence.scan_tree(self.results)
        extra = sorted(set(files) - set(entries))
        if bad:
            self.errors.append("the durable copy of %s does not match what was read from the source"
                               % ", ".join(bad[:5]))
        if extra or tree_problems:
            self.errors.append("the results dir holds files outside the roster (from an earlier attempt with other "
                               "--output globs?): %s" % ", ".join((extra + [p["path"] for p in tree_problems])[:5]))
        try:
            core.atomic_write(os.path.join(self.results, evidence.MANIFEST_NAME), evidence.manifest_bytes(manifest))
        except OSError as exc:
            self.drop_old_manifest()
            self.errors.append("cannot write %s: %s" % (evidence.MANIFEST_NAME, exc.strerror or exc))
            return
        doc.update(manifest=os.path.join(self.results, evidence.MANIFEST_NAME), file_count=manifest["file_count"],
                   total_bytes=manifest["total_bytes"], verified=not bad and not extra and not tree_problems)

    def done(self, doc):
        doc["ok"] = bool(doc["verified"] and not self.errors)
        doc["error"] = "; ".join(self.errors) if self.errors else None
        doc["finished_at"] = core.utc_iso()
        if doc["ok"]:
            self.note("sync verified: %d file(s), %s in %s (manifest %s)" % (
                doc["file_count"], core.human_bytes(doc["total_bytes"]), self.results, evidence.MANIFEST_NAME))
        else:
            self.note("SYNC FAILED: %s" % doc["error"])
        return doc


# ---------------------------------------------------------------- the supervisor

class Supervisor(object):
    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.job = None
        self.pending = None
        self.stop_signal = signal.SIGTERM
        self.log_path = run_path(run_dir, "job.log")

    def note(self, text):
        line = "[rgt %s] %s\n" % (time.strftime("%H:%M:%S", time.gmtime()), text)
        try:
            with open(self.log_path, "a", encoding="utf-8", errors="replace") as handle:
                handle.write(line)
        except OSError:
            pass
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):
            pass

    def forward(self, signum, _frame):
        name = signal.Signals(signum).name
        if self.job is None:
            self.pending = name
            return
        sig = self.stop_signal
        self.note("supervisor got %s: forwarding %s to the job's process group %d"
                  % (name, signal.Signals(sig).name, self.job.pid))
        try:
            os.killpg(self.job.pid, sig)
        except OSError:
            try:
                self.job.send_signal(sig)
            except OSError:
                pass

    def claim(self):
        """Take the run over from the launcher, in one locked step; None or why not."""
        with status_lock(self.run_dir):
            doc = read_status(self.run_dir)
            if doc.get("state") != "starting" or doc.get("supervisor_identity"):
                return "the run is %s with supervisor %s: the launcher gave up, or another supervisor has it" % (
                    doc.get("state"), doc.get("supervisor_pid"))
            if lock_owner(self.run_dir) != str(doc.get("launcher_pid")):
                return "run.lock is not held by the launcher (pid %s)" % doc.get("launcher_pid")
            core.atomic_write(os.path.join(self.run_dir, LOCK_DIR, "pid"), "%d\n" % os.getpid())
            doc.update(supervisor_pid=os.getpid(), supervisor_identity=core.process_identity())
            error = save_status(self.run_dir, doc)
            if error:
                return error
        return None

    def make_reserve(self):
        runrec.make_reserve(self.run_dir)

    def start_job(self, run):
        cmd, cwd = run.get("cmd") or [], run.get("cwd") or ""
        env = dict(os.environ, RGT_RUN_DIR=self.run_dir, RGT_RUN_ID=str(run.get("run_id") or ""),
                   RGT_HEARTBEAT=run_path(self.run_dir, "heartbeat.json"))
        if not cmd or not isinstance(cmd, list) or not os.path.isdir(cwd):
            return 127, "cannot start: no command in run.json, or its cwd %r is gone" % cwd
        try:
            extra, resume = resume_choice(run, restore=True)
        except (OSError, ValueError) as exc:  # a fresh start would overwrite the good copy at its next sync
            return 1, ("cannot put the verified durable checkpoint back into %s (%s): not starting, since a fresh "
                       "start would replace it at the next sync" % (cwd, getattr(exc, "strerror", None) or exc))
        if resume is not None:
            for item in resume["skipped"]:
                self.note("resume: skipping %s: %s" % (item["path"], item["why"]))
            if resume.get("restored_from"):
                self.note("resume: restored %s from its verified durable copy %s" % (resume["from"],
                                                                                      resume["restored_from"]))
            self.note("resume: from %s" % resume["from"] if resume["from"] else "resume: no good checkpoint, fresh start")
            set_status(self.run_dir, resume=resume)
            cmd = list(cmd) + extra
        self.stop_signal = getattr(signal, "SIG" + str(run.get("stop_signal") or "TERM"), signal.SIGTERM)
        self.note("starting: %s (cwd %s)" % (" ".join(shlex.quote(str(a)) for a in cmd), cwd))
        try:
            with open(self.log_path, "ab") as log:
                self.job = subprocess.Popen([str(a) for a in cmd], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            rc = 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR) else 126
            return rc, "cannot start %s: %s" % (cmd[0], exc.strerror or exc)
        return None, None

    def wait_job(self):
        rc = self.job.wait()
        return 128 - rc if rc < 0 else rc

    def wait_group(self, rc):
        pgid = self.job.pid
        if not core.group_alive(pgid):
            return
        self.note("the job's main process exited (code %d); waiting for the rest of its process group %d "
                  "before syncing" % (rc, pgid))
        set_status(self.run_dir, waiting_for_group={"pgid": pgid, "leader_exit_code": rc, "since": core.utc_iso()})
        while core.group_alive(pgid):
            time.sleep(0.25)
        self.note("process group %d is empty" % pgid)

    def run(self):
        why = self.claim()
        if why:
            say("%s supervisor: not starting: %s" % (core.REFUSED, why))
            return core.EXIT_REFUSED
        self.make_reserve()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.forward)
        try:
            return self.supervise()
        except Exception as exc:  # never leave the run "running": say why in status.json and the log
            say(traceback.format_exc())
            set_status(self.run_dir, state="failed", error="supervisor error: %s: %s" % (type(exc).__name__, exc),
                       ended_at=core.utc_iso())
            return core.EXIT_FAIL
        finally:
            self.cleanup()

    def supervise(self):
        run = core.read_json(run_path(self.run_dir, RUN))
        rc, error = self.start_job(run)
        if self.job is not None:
            set_status(self.run_dir, state="running", job_pid=self.job.pid,
                       job_identity=core.process_identity(self.job.pid), started_at=core.utc_iso())
            if self.pending:
                self.forward(getattr(signal, self.pending), None)
            rc = self.wait_job()
            self.wait_group(rc)
            self.note("job exited with code %d" % rc)
        else:
            self.note("%s (exit %d)" % (error, rc))
        try:
            core.atomic_write(run_path(self.run_dir, "exit_code"), "%d\n" % rc)
        except OSError:
            pass
        set_status(self.run_dir, state="syncing", exit_code=rc, ended_at=core.utc_iso(), waiting_for_group=None,
                   error=error)
        sync = Sync(self.run_dir, self.note).run()
        state = "failed" if rc else ("succeeded" if sync["ok"] else "sync_failed")
        problem = set_status(self.run_dir, state=state, exit_code=rc, sync=sync)
        if problem:
            say("%s: the final state %s could not be recorded: %s" % (core.FAIL, state, problem))
        self.note("run finished: state %s, job exit code %d" % (state, rc))
        code = rc if rc else (0 if sync["ok"] else 1)
        say("supervisor exiting with code %d (state %s)" % (code, state))
        return code

    def cleanup(self):
        if lock_owner(self.run_dir) == str(os.getpid()):
            lock = os.path.join(self.run_dir, LOCK_DIR)
            for name in os.listdir(lock):
                unlink_quiet(os.path.join(lock, name))
            try:
                os.rmdir(lock)
            except OSError:
                pass
        release_reserve(self.run_dir)
        tmux = os.environ.get("TMUX")
        if tmux:  # this run's private tmux server ends with this process; its socket file would stay
            unlink_quiet(tmux.split(",")[0])


def op_supervise(args):
    run_dir = os.path.abspath(args.run_dir)
    try:
        log = os.open(run_path(run_dir, "supervisor.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError as exc:
        raise core.CheckFailed("cannot open %s: %s" % (run_path(run_dir, "supervisor.log"), exc.strerror or exc))
    return Supervisor(run_dir).run()


def op_sync(args):
    run_dir = os.path.abspath(args.run_dir)
    doc = read_status(run_dir)
    if not doc:
        raise core.UsageError("%s has no readable status.json: not a run dir" % run_dir)
    if doc.get("state") not in TERMINAL + ("syncing",) or core.identity_alive(doc.get("supervisor_identity")):
        raise core.Refused("the run is %s and its supervisor is alive: it syncs by itself at the end"
                           % doc.get("state"))
    sync = Sync(run_dir, lambda text: say("[rgt] " + text)).run()
    rc = doc.get("exit_code")
    # no exit code: the job never finished (its supervisor died with the box), so it did not succeed
    state = "failed" if rc or rc is None else ("succeeded" if sync["ok"] else "sync_failed")
    error = set_status(run_dir, state=state, sync=sync)
    if error:
        raise core.CheckFailed(error)
    return 0 if sync["ok"] else 1


# ---------------------------------------------------------------- the launch report

def launch_info(run_dir, args):
    run = core.read_json(run_path(run_dir, RUN))
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
            "node_version": core.toolkit_version()}


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
    if state == "failed" and isinstance(code, int) and not isinstance(code, bool) and 0 < code < 256:
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
    parser = core.Parser(prog="supervise.py", description="The Python half of run_one.sh (see the module docstring).")
    sub = parser.add_subparsers(dest="op", parser_class=core.Parser)
    sub.required = True
    p = sub.add_parser("profile", help="a profile's defaults, NUL-separated")
    p.add_argument("name")
    p = sub.add_parser("check-patterns", help="validate --output / --allow-empty globs")
    p.add_argument("--output", action="append", default=[])
    p.add_argument("--allow-empty", action="append", default=[])
    p = sub.add_parser("disk", help="the launch disk gate")
    p.add_argument("--floor-gb", type=float, required=True)
    p.add_argument("--floor-inodes", type=int, required=True)
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
    p.add_argument("--progress-regex", default="")
    p.add_argument("--auto-resume", action="store_true")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--launch-arg", action="append", default=[])
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
    p = sub.add_parser("supervise", help="(internal) the supervisor")
    p.add_argument("--run-dir", required=True)
    p = sub.add_parser("sync", help="run the end-of-run sync again for a finished run")
    p.add_argument("--run-dir", required=True)
    p = sub.add_parser("report", help="the launch report; --wait for the end")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--deadman-pid", type=int, default=None)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--poll-seconds", type=positive, default=1.0)
    p.add_argument("--json", action="store_true")
    return parser


OPS = {"profile": op_profile, "check-patterns": op_check_patterns, "disk": op_disk, "gpu-gate": op_gpu_gate,
       "init": op_init, "fail": op_fail, "start": op_start, "supervise": op_supervise, "sync": op_sync,
       "report": op_report}


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
