#!/usr/bin/env python3
"""A box with no GPU use, no SSH session and no active run for --idle-minutes gets its meter stopped (or escalated).

Guarantee: a box left on with nothing to do is stopped through the same stop engine as the run
dead-man (arm-time checks, $VAR from PID 1, retries, fallback, confirmation, escalation); a
reading it cannot make counts as busy, and the wall-clock cap (--max-hours) still holds.

The most common money loss is a box left on with nothing to do (a notebook, an ad-hoc SSH session
that ended, a finished run nobody watched). The run dead-man needs a run; this mode needs none. It
fires when ALL of these held for --idle-minutes without a break, namely
  - every GPU reads below --util-below percent; a reading that fails or hangs counts as busy (no
    evidence of idleness). --no-gpu drops this test on a CPU-only box. The reading:
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits
  - no SSH session holds it (sessions.py, the dead-man's rule: tunnels such as `ssh -N -L` count;
    a session with no traffic for --ssh-idle-minutes stops counting; all of them stop counting
    --ssh-wait-max-minutes after they first held it), unless --ignore-ssh;
  - no run on the box is active (the box registry plus each --runs-dir) while watched by its own
    dead-man or still progressing (a hung, unwatched run does not keep the box billing).
It also fires at --max-hours since arming, whatever the readings say.

The stop is the profile's METER_STOP_CMD (--profile) or --stop-cmd, run by stop_engine.py: checked
when armed (a command that cannot run here is refused then), a script without "#!" run through
/bin/sh, up to --retries attempts with backoff, then --fallback-stop-cmd; a stop meant to end the
machine is NOT CONFIRMED when this box is still up --confirm-seconds later (a provider stop read CONFIRMED is
revoked when it is still up --still-up-seconds later), and a stop not confirmed runs again every
--stop-retry-minutes until confirmed or acknowledged (deadman.py, the same options). A destructive stop
(terminate, destroy, rm ...) is refused when armed unless --allow-destructive: an idle box can still
hold the only copy of a result. A notify config the node refuses (notify.py check fails) is refused when
armed too, unless --dry-run: a watcher that would tell no one is not started.

Usage:
  idle_watch.py arm --watch-dir DIR (--stop-cmd CMD | --profile NAME) [--idle-minutes M] [--util-below P]
                    [--runs-dir DIR]... [--poll-seconds S] [--gpu-timeout S] [--no-gpu] [--ignore-ssh]
                    [--max-hours H] [--fallback-stop-cmd CMD] [--pre-stop-cmd CMD] [--pre-stop-timeout S]
                    [--retries N] [--retry-backoff S] [--stop-timeout S] [--confirm-seconds S]
                    [--ssh-idle-minutes M] [--ssh-wait-max-minutes M] [--repeat-minutes M] [--registry DIR]
                    [--lease-ttl-seconds S] [--still-up-seconds S] [--stop-retry-minutes M]
                    [--allow-destructive] [--dry-run] [--foreground] [--json]
  idle_watch.py status --watch-dir DIR [--json]
  idle_watch.py disarm --watch-dir DIR

  python3 idle_watch.py arm --watch-dir ~/rgt/idle --runs-dir /workspace/durable/runs \\
      --stop-cmd 'runpodctl stop pod $RUNPOD_POD_ID' --idle-minutes 30

arm detaches (double fork, own session: it survives the SSH session) and prints its pid; the state
(idle_watch.json), the firing record (IDLE_FIRED.json: attempts, ok, confirmed) and the log
(deadman.log) stay in --watch-dir. One watcher per watch dir.

Exit codes: 0 armed / status printed / disarmed (with --foreground: 0 fired and stopped), 1 a check
failed (with --foreground: the stop failed or was not confirmed); 2 usage; 3 refused (a watcher
already runs there, a destructive stop without --allow-destructive, a stop that cannot run here, or a
notify config the node refuses).
"""
import os
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402
import sessions  # noqa: E402
import stop_engine  # noqa: E402
import watcher  # noqa: E402  (the guarded loop, the option table, the lock and detaching)

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


class IdleWatch(watcher.Watcher):
    """The idle rule on the watchers' guarded loop; the stop is the one every watcher makes (Watcher.fire)."""

    NAME = "idle_watch"
    STATE_FILE = STATE
    FIRED_FILE = FIRED

    def __init__(self, watch_dir, cfg, foreground=False):
        watcher.Watcher.__init__(self, watch_dir, cfg, foreground)
        self.idle_since = None   # monotonic: a wall-clock jump neither delays nor hastens a firing
        self.ticks = 0
        self.busy = []
        self.ssh = sessions.SshRule(cfg.get("ssh_idle_minutes"), cfg.get("ssh_wait_max_minutes"))

    def state_doc(self):
        doc = watcher.Watcher.state_doc(self)
        doc.update(state=self.state.upper() if self.state != "armed" else "ARMED", ticks=self.ticks,
                   busy=list(self.busy), idle_seconds=round(self.idle_for(time.monotonic()), 1))
        return doc

    def idle_for(self, now):
        return 0.0 if self.idle_since is None else now - self.idle_since

    def busy_reasons(self, now):
        cfg, reasons = self.cfg, []
        if not cfg["no_gpu"]:
            why = gpu_busy(cfg["gpu_timeout"], cfg["util_below"])
            if why:
                reasons.append(why)
        if not cfg["ignore_ssh"]:
            holding, counted, _idle, _capped = self.ssh.hold(now, sessions.ssh_sessions())
            if holding:
                reasons.append("SSH session(s) open: %s" % ", ".join(counted[:3]))
        runs = [n["name"] for n in runrec.active_neighbours((), cfg["runs_dirs"], None, cfg.get("registry"))
                if n["watched"] or n["progressing"]]
        if runs:
            reasons.append("active run(s): %s" % ", ".join(runs[:5]))
        return reasons

    def evaluate(self, now):
        if os.path.exists(self.p(DISARM)):
            return "disarm", "IDLE_DISARM written", None, False
        self.ticks += 1
        cap = self.cap_reached(now)
        if cap:
            return cap
        self.busy = self.busy_reasons(now)
        if self.busy:
            if self.idle_since is not None:
                self.log("busy again: %s" % "; ".join(self.busy))
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
            self.log("idle: no GPU use, no SSH session holding, no active run")
        self.write_state()
        idle_s = self.idle_for(now)
        if self.idle_since is not None and idle_s >= self.cfg["idle_minutes"] * 60:
            return "idle_box", "idle for %.0f s (limit %g min)" % (idle_s, self.cfg["idle_minutes"]), None, False
        if self.idle_since is not None:   # wake when the idle limit runs out, not a poll later
            self.due_at(self.idle_since + self.cfg["idle_minutes"] * 60)
        return None

    def fire(self, reason, detail, job_pid=None, job_alive=False):
        rc = watcher.Watcher.fire(self, reason, detail)
        fired = self.fired or {}
        # One-line fields older readers use: the last attempt's exit code and the idle time.
        last = (fired.get("fallback") or {}).get("attempts") or fired.get("attempts") or [{}]
        fired.update(rc=last[-1].get("rc"), idle_seconds=round(self.idle_for(time.monotonic()), 1),
                     stop_cmd=self.cfg.get("stop_cmd"))
        self.save_fired()
        return rc


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


def build_config(args):
    if not args.stop_cmd and not args.profile:
        raise core.UsageError("give --stop-cmd CMD or --profile NAME (whose METER_STOP_CMD stops this box)")
    for runs in args.runs_dir:
        if not os.path.isdir(os.path.expanduser(runs)):
            raise core.UsageError("--runs-dir %s is not a directory" % runs)
    if args.retries < 1:
        raise core.UsageError("--retries must be at least 1")
    plan, warnings = stop_engine.stop_plan(
        stop_cmd=args.stop_cmd, profile=args.profile, profile_explicit=bool(args.profile),
        fallback_stop_cmd=args.fallback_stop_cmd, pre_stop_cmd=args.pre_stop_cmd,
        confirm_seconds=args.confirm_seconds, dry_run=args.dry_run, allow_destructive=args.allow_destructive)
    problem = None if args.dry_run else stop_engine.notify_config_problem()
    if problem:   # finding C10, as the dead-man's arm: a watcher that would tell no one is refused
        raise core.Refused(problem)
    if plan["destructive"] and not args.allow_destructive:
        raise core.Refused("the stop looks destructive (%s); an idle box may still hold the only copy of a "
                           "result. Use the platform's stop/pause action, or add --allow-destructive"
                           % (plan.get("destructive_inferred_from") or "declared destructive"))
    cfg = {key: getattr(args, key) for key, _f, _k, _d, _t in watcher.WATCH_OPTIONS if hasattr(args, key)}
    cfg.update(plan)
    cfg.update(idle_minutes=args.idle_minutes, util_below=args.util_below, gpu_timeout=args.gpu_timeout,
               no_gpu=args.no_gpu, ignore_ssh=args.ignore_ssh, max_hours=args.max_hours or 0.0,
               runs_dirs=[os.path.abspath(os.path.expanduser(r)) for r in args.runs_dir],
               registry=os.path.abspath(args.registry) if args.registry else runrec.registry_dir(),
               stall_minutes=core.DEFAULT_STALL_MINUTES, term_grace_seconds=0.0, sync_wait_seconds=0.0)
    return cfg, warnings


def cmd_arm(args):
    cfg, warnings = build_config(args)
    watch_dir = watch_dir_arg(args, create=True)  # only once the arguments hold: a refusal leaves nothing
    live = live_watcher(watch_dir)
    if live:
        raise core.Refused("an idle watcher (pid %s) already runs in %s; disarm it first" % (live, watch_dir))
    for stale in (DISARM, FIRED):
        if os.path.exists(os.path.join(watch_dir, stale)):
            os.unlink(os.path.join(watch_dir, stale))
    watch = IdleWatch(watch_dir, cfg, foreground=args.foreground)
    for line in warnings:
        watch.log(line)
        sys.stderr.write(line + "\n")
    lock_fd = watcher.take_lock(watch_dir)  # one watcher per dir, also against a racing arm
    if args.foreground:
        return watch.loop()
    try:
        pid = watcher.detach_and_run(watch, lock_fd)
    except RuntimeError as exc:
        raise core.CheckFailed("the idle watcher failed to start: %s (see %s)" % (exc, watch.p("deadman.log")))
    if args.json:
        core.emit_json({"pid": pid, "watch_dir": watch_dir, "state": "armed", "config": cfg})
    else:
        print(pid)
        sys.stderr.write("idle watcher armed (pid %d): stop after %g min idle: %s\n"
                         % (pid, args.idle_minutes, cfg.get("stop_cmd") or cfg.get("fallback_stop_cmd")))
    return 0


def cmd_status(args):
    watch_dir = watch_dir_arg(args)
    state = core.read_json(os.path.join(watch_dir, STATE))
    fired = core.read_json(os.path.join(watch_dir, FIRED))
    word = state.get("state") or "NONE"
    if word == "ARMED" and not core.identity_alive(state.get("identity")):
        word = "DOWN"
    if fired:
        word = "FIRED"
    out = {"watch_dir": watch_dir, "state": word, "pid": state.get("pid"), "ticks": state.get("ticks"),
           "busy": state.get("busy"), "idle_seconds": state.get("idle_seconds"), "fired": fired or None,
           "loaded_version": state.get("loaded_version"), "toolkit_version": core.toolkit_version()}
    if args.json:
        core.emit_json(out)
        return 0
    if fired:
        confirmed = fired.get("confirmed")
        tail = "stop ok=%s confirmed=%s: %s" % (fired.get("ok"), confirmed, fired.get("message") or "")
        if confirmed is False:
            tail = "%s: %s" % (stop_engine.NOT_CONFIRMED, tail)
        if fired.get("dry_run"):   # nothing was meant to stop: not a failed stop (finding R15)
            tail = "DRY RUN (nothing was stopped): %s" % (fired.get("message") or "")
        print("FIRED idle watcher in %s: %s" % (watch_dir, tail))
        return 0 if fired.get("ok") or fired.get("dry_run") else 1
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
    parser = core.Parser(prog="idle_watch.py", description=core.help_description(__doc__),
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=core.Parser,
                                help="what to do; idle_watch.py COMMAND --help for its options")
    arm = sub.add_parser("arm", help="start the watcher (detached)", formatter_class=core.RawHelp,
                         epilog=core.exit_codes_epilog(
                             ok="armed (with --foreground: fired and the stop ran and was not disproved)",
                             fail="(--foreground) the stop failed or was not confirmed",
                             refused="a watcher already runs in --watch-dir, the stop is destructive without "
                                     "--allow-destructive, it cannot run here, or the notify config is refused"))
    arm.add_argument("--watch-dir", required=True, help="folder for the watcher's state, record and log")
    arm.add_argument("--stop-cmd", help="argv string that stops this box's meter ($VAR allowed)")
    arm.add_argument("--profile", help="use this profile's METER_STOP_CMD as the stop")
    arm.add_argument("--idle-minutes", type=core.arg_number(float, 0, 1e6, low_open=True), default=30.0,
                     help="fire after the box stayed idle this long (30)")
    arm.add_argument("--util-below", type=core.arg_number(float, 0, 100, low_open=True), default=10.0,
                     help="a GPU under this utilization percent counts as idle (10)")
    arm.add_argument("--runs-dir", action="append", default=[],
                     help="a runs dir whose active runs keep the box busy (repeatable; the box registry always counts)")
    arm.add_argument("--gpu-timeout", type=core.arg_number(float, 0, 600, low_open=True), default=20.0,
                     help="seconds nvidia-smi may take; no reading counts as busy (20)")
    arm.add_argument("--no-gpu", action="store_true", help="a CPU-only box: skip the GPU reading")
    arm.add_argument("--ignore-ssh", action="store_true", help="SSH sessions never keep the box busy")
    watcher.add_watch_options(arm, skip=("stall_minutes", "grace_minutes", "wait_ssh", "term_grace_seconds",
                                         "sync_wait_seconds", "budget_usd", "rate_per_hour", "disk_floor_gb",
                                         "disk_floor_inodes", "ssh_user"))   # a box watcher counts every user
    arm.add_argument("--foreground", action="store_true", help="do not detach (tests, debugging)")
    arm.add_argument("--json", action="store_true", help="print the armed watcher as JSON")
    status = sub.add_parser("status", help="print the watcher's state", formatter_class=core.RawHelp,
                            epilog=core.exit_codes_epilog(ok="printed", fail="it fired and the stop failed",
                                                          refused=None))
    status.add_argument("--watch-dir", required=True, help="the folder given to arm")
    status.add_argument("--json", action="store_true", help="print every field as JSON")
    disarm = sub.add_parser("disarm", help="stop the watcher at its next tick", formatter_class=core.RawHelp,
                            epilog=core.exit_codes_epilog(ok="disarm requested", fail=None, refused=None))
    disarm.add_argument("--watch-dir", required=True, help="the folder given to arm")
    return parser


def main(argv=None):
    core.check_toolkit()
    return watcher.run_command(build_parser(), "command", {"arm": cmd_arm, "status": cmd_status,
                                                           "disarm": cmd_disarm}, argv)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="idle_watch.py"))
