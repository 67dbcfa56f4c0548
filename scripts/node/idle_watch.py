#!/usr/bin/env python3
"""idle_watch.py: the dead-man for a box with no run: stop the meter when nothing uses it.

The most common money loss is a box left on with nothing to do (a notebook, an ad-hoc SSH session
that ended, a finished run nobody watched). The run dead-man needs a run; this one needs none. It
fires when ALL of these held for --idle-minutes without a break:
  - every GPU reads below --util-below percent; a reading that fails or hangs counts as busy (no
    evidence of idleness, no stop). --no-gpu drops this test on a CPU-only box. The reading:
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits
  - no SSH session is open (sshd session processes in /proc), unless --ignore-ssh;
  - no run is active in any --runs-dir (status.json in starting/running/stalled/syncing with its
    supervisor alive). Give the durable runs dir so a run launched later keeps the box busy.
Firing runs --stop-cmd once (split with shlex, no shell) and writes IDLE_FIRED.json; --dry-run
only writes what it would run. A stop command that looks destructive (terminate, destroy, rm ...)
is refused unless --allow-destructive: an idle box can still hold the only copy of a result.

Usage:
  idle_watch.py arm --watch-dir DIR --stop-cmd CMD [--idle-minutes M] [--util-below P]
                    [--runs-dir DIR]... [--poll-seconds S] [--gpu-timeout S] [--no-gpu] [--ignore-ssh]
                    [--allow-destructive] [--dry-run] [--foreground] [--json]
  idle_watch.py status --watch-dir DIR [--json]
  idle_watch.py disarm --watch-dir DIR

  python3 idle_watch.py arm --watch-dir ~/rgt/idle --runs-dir /workspace/durable/runs \\
      --stop-cmd 'runpodctl stop pod "$RUNPOD_POD_ID"' --idle-minutes 30

arm detaches (double fork, own session: it survives the SSH session) and prints its pid; the
state (idle_watch.json: each tick's busy reasons and the idle time so far) and the log
(deadman.log) stay in --watch-dir. Defaults: --idle-minutes 30, --util-below 10, --poll-seconds 30,
--gpu-timeout 20. One watcher per watch dir.

Exit codes: 0 armed / status printed / disarmed; 1 a check failed; 2 usage; 3 refused (a watcher
already runs there, or a destructive stop without --allow-destructive).
"""
import json
import os
import shlex
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rgt_core as core  # noqa: E402
import deadman  # noqa: E402  (ssh session detection, destructive-command inference, detaching)

STATE = "idle_watch.json"
FIRED = "IDLE_FIRED.json"
DISARM = "IDLE_DISARM"


def gpu_busy(timeout, util_below):
    """A reason the GPUs count as busy, or None when every GPU read below the threshold."""
    res = core.run_bounded(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                           timeout)
    if res.error or res.timed_out or res.rc != 0:
        return "nvidia-smi gave no reading (%s)" % (res.error or ("timed out" if res.timed_out else "exit %s" % res.rc))
    values = []
    for line in res.output.splitlines():
        try:
            values.append(float(line.strip().rstrip("%").strip()))
        except ValueError:
            if line.strip():
                return "nvidia-smi printed %r, not a utilization" % line.strip()[:40]
    if not values:
        return "nvidia-smi listed no GPU"
    busy = [v for v in values if v >= util_below]
    return "GPU utilization %s%% (threshold %g%%)" % ("/".join("%g" % v for v in values), util_below) if busy else None


class IdleWatch(object):
    def __init__(self, watch_dir, cfg):
        self.dir, self.cfg = watch_dir, cfg
        self.idle_since = None   # monotonic: a wall-clock jump neither delays nor hastens a firing
        self.ticks = 0
        self.stop = False

    def p(self, name):
        return os.path.join(self.dir, name)

    def log(self, msg):
        with open(self.p("deadman.log"), "a") as fh:
            fh.write("%s idle_watch[%d] %s\n" % (core.utc_iso(), os.getpid(), msg))

    def write_state(self, reasons=(), idle_s=0.0, word="ARMED"):
        core.atomic_write_json(self.p(STATE), {
            "pid": os.getpid(), "identity": core.process_identity(), "state": word, "updated_at": core.utc_iso(),
            "ticks": self.ticks, "busy": list(reasons), "idle_seconds": round(idle_s, 1), "config": self.cfg})

    def busy_reasons(self):
        cfg, reasons = self.cfg, []
        if not cfg["no_gpu"]:
            why = gpu_busy(cfg["gpu_timeout"], cfg["util_below"])
            if why:
                reasons.append(why)
        if not cfg["ignore_ssh"]:
            sessions = deadman.ssh_sessions() or []
            if sessions:
                reasons.append("SSH session(s) open: %s" % ", ".join(s["label"] for s in sessions[:3]))
        runs = core.active_runs(cfg["runs_dirs"])
        if runs:
            reasons.append("active run(s): %s" % ", ".join(runs[:5]))
        return reasons

    def loop(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))
        self.log("armed: %s" % json.dumps(self.cfg, sort_keys=True))
        while not self.stop:
            if os.path.exists(self.p(DISARM)):
                self.log("disarmed")
                self.write_state(word="DISARMED")
                return 0
            reasons = self.busy_reasons()
            now = time.monotonic()
            self.ticks += 1
            if reasons:
                if self.idle_since is not None:
                    self.log("busy again: %s" % "; ".join(reasons))
                self.idle_since = None
            elif self.idle_since is None:
                self.idle_since = now
                self.log("idle: no GPU use, no SSH session, no active run")
            idle_s = 0.0 if self.idle_since is None else now - self.idle_since
            self.write_state(reasons, idle_s)
            if self.idle_since is not None and idle_s >= self.cfg["idle_minutes"] * 60:
                return self.fire(idle_s)
            time.sleep(self.cfg["poll_seconds"])
        self.write_state(word="EXITED")
        return 0

    def fire(self, idle_s):
        argv = self.cfg["stop_argv"]
        record = {"reason": "idle_box", "idle_seconds": round(idle_s, 1), "fired_at": core.utc_iso(),
                  "stop_cmd": argv, "dry_run": self.cfg["dry_run"], "rc": None}
        if not self.cfg["dry_run"]:
            res = core.run_bounded(argv, 300)
            record.update(rc=res.rc, output_tail=res.output[-2000:], error=res.error)
        core.atomic_write_json(self.p(FIRED), record)
        self.log("FIRED after %.0f s idle: %s%s" % (idle_s, " ".join(argv), " (dry run)" if self.cfg["dry_run"] else ""))
        self.write_state(word="FIRED", idle_s=idle_s)
        return 0


def watch_dir_arg(args, create=False):
    path = os.path.abspath(os.path.expanduser(args.watch_dir))
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise core.UsageError("cannot create --watch-dir %s: %s" % (path, exc.strerror or exc))
    elif not os.path.isdir(path):
        raise core.UsageError("--watch-dir %s is not a directory (nothing was armed there)" % path)
    return path


def live_watcher(watch_dir):
    state = core.read_json(os.path.join(watch_dir, STATE))
    if state.get("state") == "ARMED" and core.identity_alive(state.get("identity")):
        return state.get("pid")
    return None


def cmd_arm(args):
    argv = deadman.split_cmd(args.stop_cmd, "--stop-cmd")
    why = deadman.destructive_word(argv)
    if why and not args.allow_destructive:
        raise core.Refused("--stop-cmd looks destructive (%s); an idle box may still hold the only copy of a "
                           "result. Use the platform's stop/pause action, or add --allow-destructive" % why)
    for runs in args.runs_dir:
        if not os.path.isdir(os.path.expanduser(runs)):
            raise core.UsageError("--runs-dir %s is not a directory" % runs)
    watch_dir = watch_dir_arg(args, create=True)  # only once the arguments hold: a refusal leaves nothing
    live = live_watcher(watch_dir)
    if live:
        raise core.Refused("an idle watcher (pid %s) already runs in %s; disarm it first" % (live, watch_dir))
    for stale in (DISARM, FIRED):
        if os.path.exists(os.path.join(watch_dir, stale)):
            os.unlink(os.path.join(watch_dir, stale))
    cfg = {"stop_argv": argv, "idle_minutes": args.idle_minutes, "util_below": args.util_below,
           "runs_dirs": [os.path.abspath(os.path.expanduser(r)) for r in args.runs_dir],
           "poll_seconds": args.poll_seconds, "gpu_timeout": args.gpu_timeout, "no_gpu": args.no_gpu,
           "ignore_ssh": args.ignore_ssh, "dry_run": args.dry_run}
    watch = IdleWatch(watch_dir, cfg)
    lock_fd = deadman.take_lock(watch_dir)  # one watcher per dir, also against a racing arm
    if args.foreground:
        return watch.loop()
    try:
        pid = deadman.detach_and_run(watch, lock_fd)
    except RuntimeError as exc:
        raise core.CheckFailed("the idle watcher failed to start: %s (see %s)" % (exc, watch.p("deadman.log")))
    if args.json:
        core.emit_json({"pid": pid, "watch_dir": watch_dir, "state": "armed", "config": cfg})
    else:
        print(pid)
        sys.stderr.write("idle watcher armed (pid %d): stop after %g min idle: %s\n"
                         % (pid, args.idle_minutes, " ".join(shlex.quote(a) for a in argv)))
    return 0


def cmd_status(args):
    watch_dir = watch_dir_arg(args)
    state = core.read_json(os.path.join(watch_dir, STATE))
    fired = core.read_json(os.path.join(watch_dir, FIRED))
    word = state.get("state") or "NONE"
    if word == "ARMED" and not core.identity_alive(state.get("identity")):
        word = "DOWN"
    out = {"watch_dir": watch_dir, "state": word, "pid": state.get("pid"), "ticks": state.get("ticks"),
           "busy": state.get("busy"), "idle_seconds": state.get("idle_seconds"), "fired": fired or None}
    if args.json:
        core.emit_json(out)
    else:
        print("%s idle watcher in %s: %s" % (word, watch_dir, "; ".join(out["busy"] or []) or
                                             "idle %ss" % out["idle_seconds"]))
    return 0


def cmd_disarm(args):
    watch_dir = watch_dir_arg(args)
    core.atomic_write(os.path.join(watch_dir, DISARM), b"disarmed\n")
    pid = live_watcher(watch_dir)
    print("disarm requested%s" % (" (watcher pid %s stops at its next tick)" % pid if pid else "; no live watcher"))
    return 0


def build_parser():
    parser = core.Parser(prog="idle_watch.py", description="Stop the meter when the box has stayed idle.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    arm = sub.add_parser("arm", help="start the watcher (detached)")
    arm.add_argument("--watch-dir", required=True)
    arm.add_argument("--stop-cmd", required=True)
    arm.add_argument("--idle-minutes", type=core.arg_number(float, 0, 1e6, low_open=True), default=30.0)
    arm.add_argument("--util-below", type=core.arg_number(float, 0, 100, low_open=True), default=10.0)
    arm.add_argument("--runs-dir", action="append", default=[])
    arm.add_argument("--poll-seconds", type=core.arg_number(float, 0, 3600, low_open=True), default=30.0)
    arm.add_argument("--gpu-timeout", type=core.arg_number(float, 0, 600, low_open=True), default=20.0)
    arm.add_argument("--no-gpu", action="store_true")
    arm.add_argument("--ignore-ssh", action="store_true")
    arm.add_argument("--allow-destructive", action="store_true")
    arm.add_argument("--dry-run", action="store_true")
    arm.add_argument("--foreground", action="store_true")
    arm.add_argument("--json", action="store_true")
    status = sub.add_parser("status", help="print the watcher's state")
    status.add_argument("--watch-dir", required=True)
    status.add_argument("--json", action="store_true")
    disarm = sub.add_parser("disarm", help="stop the watcher at its next tick")
    disarm.add_argument("--watch-dir", required=True)
    return parser


def main(argv=None):
    core.check_toolkit()
    args = build_parser().parse_args(argv)
    if not args.command:
        raise core.UsageError("give a command: arm, status or disarm")
    return {"arm": cmd_arm, "status": cmd_status, "disarm": cmd_disarm}[args.command](args)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="idle_watch.py"))
