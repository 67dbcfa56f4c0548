#!/usr/bin/env python3
"""watcher.py: what the box's watchers share: a guarded poll loop that fires through the one stop engine.

The dead-man (deadman.py, one run) and the idle-box watcher (idle_watch.py, the whole box) are each a
Watcher: arming-time records, a reserve file for a full disk, the poll loop on the monotonic clock (a
suspend seen and taken out, a foreseen deadline waking it on time), a guarded check (an error is logged,
never fatal; errors past the stall limit fire "watch_error"), the budget clock and its messages, and the
firing: the record first, the stop engine, the retries until a stop is confirmed or acknowledged. A
subclass gives evaluate(now) (deadman.py reads the run's facts and asks deadman_rules.py) and may add
before_stop(). Also here: the lock that keeps one watcher per folder, the double fork that detaches one,
and the option table and main both watchers' commands share.

A library: imported by deadman.py and idle_watch.py, never run. Python 3.8+ standard library only; runs
from the node folder beside rgt_core.py.
"""
import errno
import json
import os
import signal
import socket
import sys
import time
import traceback

import deadman_rules as rules
import rgt_core as core
import runrec
import stop_engine
from stop_engine import expand_argv

try:  # POSIX only; without flock the identity in deadman.json is the only guard
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

STATE_FILE = core.DEADMAN_FILE
FIRED_FILE = core.DEADMAN_FIRED_FILE
LOCK_FILE = "deadman.lock"
WATCH_RESERVE = ".rgt-watch-reserve"
SUSPEND_THRESHOLD = 60.0
RETRY_CAP_SECONDS = 900.0         # the stop retries' backoff stops doubling here (unless --stop-retry-minutes is longer)
# What this process runs: a push that replaces the folder later does not change it (status flags it).
LOADED_VERSION = core.toolkit_version()

# ----------------------------------------------------------------------------- small helpers


def stamp(ts=None):
    """ISO-8601 UTC to the second; a hand-written absurd time (ACK {"until": 1e300}) stays printable."""
    try:
        return core.utc_iso(ts)
    except (OverflowError, OSError, ValueError):
        return "unix time %r" % (ts,)


def suspend_clock():
    """A clock that keeps counting while the system is suspended: CLOCK_BOOTTIME where it exists
    (a wall-clock step does not move it), else the wall clock."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.time()


def suspended_seconds(before, after, threshold=SUSPEND_THRESHOLD):
    """Seconds the machine slept between two (suspend_clock, monotonic) readings, or 0.

    CLOCK_MONOTONIC stops during system suspend on Linux while CLOCK_BOOTTIME (and the wall clock)
    keep going, so a gap between the two that a busy poll cannot explain is a suspend/resume.
    """
    gap = (after[0] - before[0]) - (after[1] - before[1])
    return gap if gap >= threshold else 0.0


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def dur(seconds):
    """A short human duration: 42 s, 3.5 min, 2.1 h."""
    if seconds < 120:
        return "%.1f s" % seconds
    if seconds < 7200:
        return "%.1f min" % (seconds / 60.0)
    return "%.1f h" % (seconds / 3600.0)


# ----------------------------------------------------------------------------- the guarded watcher

class Watcher(object):
    """What every watcher shares: best-effort records, a reserve for a full disk, a guarded poll loop,
    and firing through the one stop engine. Subclasses give evaluate(now) and may add before_stop()."""

    NAME = "watcher"
    STATE_FILE = STATE_FILE
    FIRED_FILE = FIRED_FILE
    LOG_FILE = "deadman.log"

    def __init__(self, folder, cfg, foreground):
        self.run_dir = folder
        self.cfg = cfg
        self.foreground = foreground
        self.armed_at = time.time()       # for the record only; every deadline is monotonic
        self.armed_mono = time.monotonic()
        self.state = "armed"
        self.clock = (suspend_clock(), time.monotonic())
        self.resumed_mono = None
        self.last_note = None
        self.last_write = None
        self.stop_requested = None
        self.check_now = False
        self.firing = False
        self.fired = None
        self.failing_since = None
        self.record_errors = 0
        self.next_deadline = None         # monotonic: the earliest firing the last check foresaw (R15)
        self.budget_told = False          # budget_80 sent by this watcher
        self.budget_clock = None          # the run's budget clock (runrec.BUDGET), from its first start
        self.budget_fired = False         # the cap that fired is the budget's
        self.evaluations = 0              # checks made so far (lease.json)
        self.notify_lost = {"count": 0, "last": None}   # messages dropped or refused (finding C9)

    def due_at(self, mono):
        """Note a deadline the last check foresaw (a grace, stall or cap running out), so the poll wakes
        then instead of up to --poll-seconds later (finding R15)."""
        if mono is not None and (self.next_deadline is None or mono < self.next_deadline):
            self.next_deadline = mono

    def p(self, name):
        return os.path.join(self.run_dir, name)

    def log(self, msg):
        line = "%s %s[%d] %s\n" % (stamp(), self.NAME, os.getpid(), core.redact(msg))
        try:
            with open(self.p(self.LOG_FILE), "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            pass   # a full disk: the log is the first thing given up
        if self.foreground:
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def note(self, msg):
        """Log msg only when it differs from the previous note (no log spam at each poll)."""
        if msg != self.last_note:
            self.last_note = msg
            self.log(msg)

    def save(self, name, doc):
        """Best effort: on a full or read-only disk give up the reserve once, never raise."""
        error = core.write_json_best_effort(self.p(name), core.redact_doc(doc), reserve=self.p(WATCH_RESERVE))
        if error:
            self.record_errors += 1
            self.note("record not written (%s); watching and stopping go on" % error)
        return error

    def state_doc(self):
        doc = {"pid": os.getpid(), "identity": core.process_identity(), "host": socket.gethostname(),
               "run_dir": self.run_dir, "armed_at": stamp(self.armed_at), "state": self.state,
               "updated_at": stamp(), "config": self.cfg, "last_check": self.last_note,
               "toolkit_version": LOADED_VERSION, "loaded_version": LOADED_VERSION,
               "notify_lost": self.notify_lost}
        ssh = getattr(self, "ssh_view", None)
        if ssh is not None:
            doc["ssh"] = ssh
        if self.fired:
            doc["fired"] = {"reason": self.fired.get("reason"), "ok": self.fired.get("ok"),
                            "confirmed": self.fired.get("confirmed"), "fired_at": self.fired.get("fired_at")}
        return doc

    def write_state(self, extra=None):
        doc = self.state_doc()
        if extra:
            doc.update(extra)
        self.save(self.STATE_FILE, doc)
        self.last_write = time.monotonic()

    def save_fired(self):
        if self.fired is not None:
            self.save(self.FIRED_FILE, self.fired)

    def on_wake(self, _signum, _frame):
        self.check_now = True  # SIGUSR1 from `ack`: read ACK now, not at the next poll

    def on_signal(self, signum, _frame):
        if self.firing:
            self.log("ignoring signal %d while firing: finishing the stop sequence" % signum)
            return
        self.stop_requested = signum

    def wall_at(self, mono):
        """The wall-clock time a monotonic instant corresponds to (for messages only)."""
        return time.time() + (mono - time.monotonic())

    def guarded_evaluate(self, now):
        """evaluate(now), but an exception is logged, never fatal. Errors that last longer than the
        stall limit (or 30 min) become a firing: a watcher that cannot judge must not fail open."""
        try:
            verdict = self.evaluate(now)
            self.failing_since = None
            return verdict
        except Exception as exc:  # noqa: BLE001  (SkyPilot's skylet guards each event the same way)
            if self.failing_since is None:
                self.failing_since = now
                self.log("check failed, watching on: %s" % traceback.format_exc().strip().splitlines()[-1])
            limit = (self.cfg.get("stall_minutes") or core.DEFAULT_STALL_MINUTES) * 60.0
            if now - self.failing_since >= limit:
                return "watch_error", "every check failed for %s (last: %s: %s)" % (
                    dur(now - self.failing_since), type(exc).__name__, exc), None, False
            return None

    def guarded_observe(self, now):
        """observe(now), best effort: a message that cannot be worked out or sent never ends the watch."""
        try:
            self.observe(now)
        except Exception as exc:  # noqa: BLE001
            self.note("telling failed, watching on: %s: %s" % (type(exc).__name__, exc))

    def observe(self, now):
        """Messages from a quiet poll (no firing): the budget's 80 % mark. Subclasses add their own."""
        send = self.sender()
        if send is not None:
            self.tell_budget(now, send)

    def sender(self):
        """send(event, fields) for this watcher's messages (stop_engine.notifier), or None: a dry run tells no one.
        A message dropped or refused is counted (deadman.json notify_lost) and logged (finding C9)."""
        if self.cfg.get("dry_run"):
            return None
        inner = stop_engine.notifier(self.notify_fields(), self.notify_events())
        if inner is None:
            return None

        def send(event, fields):
            result = inner(event, fields)
            self.count_lost(event, result)
            return result
        return send

    def told(self, event, result):
        """What became of a message the firing sent, in the firing's record (as the stop engine records its own)."""
        if isinstance(result, dict):
            self.fired.setdefault("notified", []).append(
                {"event": event, "sent": result.get("sent"), "spooled": result.get("spooled"),
                 "skipped": result.get("skipped")})

    def count_lost(self, event, result):
        """Count a message that reached no one for good: dropped by a target, or refused by a bad config."""
        if not isinstance(result, dict):
            return
        skipped = str(result.get("skipped") or "")
        lost = [("%s: %s" % (name, (result.get("errors") or {}).get(name, "dropped"))) for name in
                result.get("dropped") or []]
        if skipped.startswith(("notify config unusable", "notify error")) or result.get("error"):
            lost.append(skipped or str(result.get("error")))
        if not lost:
            return
        self.notify_lost["count"] += 1
        self.notify_lost["last"] = "%s at %s: %s" % (event, stamp(), "; ".join(lost)[:300])
        self.log("NOTIFY: %s NOT delivered (%s); %d message(s) lost so far"
                 % (event, "; ".join(lost)[:300], self.notify_lost["count"]))
        self.write_state()

    def notify_events(self):
        """The run's own event list (None: every event); a box watcher has no run."""
        return None

    def start_budget_clock(self):
        """The run's budget clock (runrec.BUDGET): started by the first arming with --budget-usd, carried on by
        every later one (a resume, a re-arm, a reboot), so the budget is spent once per run, not per arming."""
        usd, rate = self.cfg.get("budget_usd"), self.cfg.get("rate_per_hour")
        if not usd or not rate or self.budget_clock is not None:
            return
        self.budget_clock, error = runrec.start_budget(self.run_dir, usd, rate, time.time())
        if error:
            self.note("budget clock not saved (%s); it counts from this arming only" % error)
        self.log("budget clock: the run's first start %s, %s suspended so far" % (
            stamp(self.budget_clock["first_start"]), dur(self.budget_clock.get("suspended_s") or 0)))

    def budget(self, now):
        """(hours the budget buys, its fields at NOW) or (None, None) without --budget-usd. Spent time runs
        from the run's first start (runrec.budget_spent_hours), not from this arming."""
        usd, rate = self.cfg.get("budget_usd"), self.cfg.get("rate_per_hour")
        if not usd or not rate:
            return None, None
        if self.budget_clock is None:
            self.start_budget_clock()
        spent_h = runrec.budget_spent_hours(self.budget_clock, self.wall_at(now))
        return core.budget_hours(usd, rate), {"spent_usd": round(spent_h * rate, 6), "budget_usd": usd,
                                              "rate_per_hour": rate, "elapsed_s": round(spent_h * 3600)}

    def tell_budget(self, now, send):
        """budget_80 once, when rules.BUDGET_WARN_SHARE of the budget's hours are spent (since the first start)."""
        hours, fields = self.budget(now)
        if hours is None or self.budget_told:
            return
        left_s = rules.budget_warn_in(hours, fields["elapsed_s"])
        if left_s <= 0:
            self.budget_told = True
            self.log("budget: %s of %s spent (estimate); telling" % (fields["spent_usd"], fields["budget_usd"]))
            send("budget_80", fields)
        else:
            self.due_at(now + left_s)

    def cap_reached(self, now):
        budget_h, fields = self.budget(now)
        if budget_h is not None:
            spent_h = runrec.budget_spent_hours(self.budget_clock, self.wall_at(now))
            if spent_h >= budget_h:
                self.budget_fired = True
                return "max_hours", "budget %s reached: %.4g h spent since the run's first start (of %.4g h it " \
                    "buys at %g/h)" % (fields["budget_usd"], spent_h, budget_h, fields["rate_per_hour"]), None, None
            self.due_at(now + (budget_h - spent_h) * 3600)
        hours = self.cfg.get("max_hours") or 0.0
        if hours and now - self.armed_mono >= hours * 3600:
            return "max_hours", "wall-clock cap of %g h since arming reached" % hours, None, None
        if hours:
            self.due_at(self.armed_mono + hours * 3600)
        return None

    def loop(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGUSR1, self.on_wake)
        core.make_reserve(self.p(WATCH_RESERVE), 64 << 10)
        self.oom_protected = core.protect_from_oom()
        self.log("armed on %s: %s" % (self.run_dir, json.dumps(self.cfg, sort_keys=True)))
        self.start_budget_clock()
        if not self.oom_protected:
            self.log("NOTE: the OOM killer may still pick this watcher (lowering oom_score_adj needs root); "
                     "the run's lease lets a reaper off the box notice if it dies")
        while True:
            if self.stop_requested:
                self.state = "exited"
                self.log("exiting on signal %d: NOTHING WATCHES THIS NOW" % self.stop_requested)
                self.write_state()
                self.renew_lease()
                return 0
            if not os.path.isdir(self.run_dir):
                # Someone removed the run on purpose; there is nothing left to record into or guard.
                sys.stderr.write("%s: %s is gone; standing down\n" % (self.NAME, self.run_dir))
                return 0
            now = time.monotonic()
            clock = (suspend_clock(), now)
            slept = suspended_seconds(self.clock, clock)
            self.clock = clock
            if slept:
                # The job was frozen too: restart the stall and grace clocks.
                self.resumed_mono = now
                self.armed_mono += slept   # suspended time does not count toward --max-hours
                if self.budget_clock is not None:   # nor toward the budget
                    error = runrec.add_suspended(self.run_dir, self.budget_clock, slept)
                    if error:
                        self.note("budget clock not saved (%s)" % error)
                self.log("machine was suspended for about %s; stall and grace clocks restart now" % dur(slept))
            self.next_deadline = None
            verdict = self.guarded_evaluate(now)
            self.evaluations += 1         # in the lease: tests (and people) count checks instead of sleeping
            flush_notifications()
            if verdict is None:
                self.guarded_observe(now)
            if verdict and verdict[0] == "disarm":
                self.state = "disarmed"
                self.log("disarmed by ACK; exiting without stopping anything")
                self.write_state()
                self.renew_lease()
                return 0
            if verdict and verdict[0] == "stall_run":
                self.stop_own_job(*verdict[1:])
                verdict = None
            if verdict and verdict[0] == "cap_run":
                self.stop_run_at_cap(*verdict[1:])
                verdict = None
            if verdict:
                self.state = "firing"
                self.renew_lease()
                return self.fire(*verdict)
            self.renew_lease()
            if self.last_write is None or now - self.last_write >= max(30.0, self.cfg["poll_seconds"]):
                self.write_state()
            # Sleep in short slices: a handled signal must not wait a whole poll interval. A deadline the
            # check foresaw (the grace running out) wakes it on time, not at the next poll (finding R15).
            wake = time.monotonic() + self.cfg["poll_seconds"]
            if self.next_deadline is not None and self.next_deadline > now:
                wake = min(wake, self.next_deadline + 0.05)
            while not self.stop_requested and not self.check_now and time.monotonic() < wake:
                time.sleep(min(0.5, self.cfg["poll_seconds"]))
            self.check_now = False

    def stop_own_job(self, detail, job_pid, job_alive):
        """Overridden by the run dead-man; other watchers have no job of their own."""

    def stop_run_at_cap(self, detail, job_pid, job_alive):
        """Overridden by the run dead-man; a box watcher's cap is the box's."""

    def renew_lease(self):
        """Overridden by the run dead-man: its run's lease (runrec.LEASE); a box watcher has none."""

    def before_stop(self, job_pid, job_alive):
        """Overridden by the run dead-man: give a live job its stop signal and time to save."""

    def notify_fields(self):
        return {"host": socket.gethostname(), "run_dir": self.run_dir}

    def fire(self, reason, detail, job_pid=None, job_alive=False):
        cfg = self.cfg
        self.firing = True
        self.fired = {
            "reason": reason, "detail": detail, "fired_at": stamp(), "run_dir": self.run_dir,
            "host": socket.gethostname(), "deadman_pid": os.getpid(), "dry_run": cfg["dry_run"],
            "command": cfg.get("stop_cmd"), "command_source": cfg.get("stop_cmd_source"),
            "destructive": cfg.get("destructive", False), "attempts": [], "ok": False, "confirmed": None,
            "toolkit_version": LOADED_VERSION,
        }
        self.save_fired()                       # the reason goes on disk first (best effort)
        self.state = "fired"
        self.write_state()
        self.log("FIRED: %s: %s" % (reason, detail))
        send = self.sender()
        if send is not None:   # before the stop: it may take the box and the message
            event = "idle_stop" if reason == "idle_box" else "deadman_fired"
            self.told(event, send(event, {"reason": reason, "detail": detail}))
            hours, spent = self.budget(time.monotonic())
            if reason == "max_hours" and hours is not None and (self.budget_fired or
                                                                  cfg.get("max_hours", 0) >= hours - 1e-6):
                self.told("budget_100", send("budget_100", spent))   # the cap that fired is the budget's
        try:
            self.before_stop(job_pid, job_alive)
        except Exception:  # noqa: BLE001  the stop must run even when the courtesy to the job failed
            self.log("preparing the stop failed: %s" % traceback.format_exc().strip().splitlines()[-1])
        self.save_fired()
        engine = stop_engine.Engine(cfg, cfg, self.fired, self.save_fired, self.log, run_dir=self.run_dir,
                                    notify=send)
        try:
            rc = engine.run()
        except Exception:  # noqa: BLE001  last resort: the plain stop command, once
            self.log("stop engine error: %s" % traceback.format_exc().strip().splitlines()[-1])
            rc = last_resort_stop(cfg, self.log)
            self.fired["last_resort_rc"] = rc
            self.save_fired()
        if rc != 0 and not cfg.get("dry_run") and cfg.get("stop_retry_minutes"):
            rc = self.retry_until_confirmed(send)
        elif rc != 0 and send is not None:
            self.keep_telling(send)
        return self.finish(0 if rc == 0 else 1)

    def retry_until_confirmed(self, send):
        """After a stop that failed or was NOT CONFIRMED: run the whole stop again on a capped backoff until one
        is confirmed (0) or an ACK arrives (1), telling stop_not_confirmed on notify's own backoff (C7)."""
        import notify
        first = self.cfg["stop_retry_minutes"] * 60.0
        gap, cap = first, max(first, RETRY_CAP_SECONDS)
        retry = {"tries": 0, "since": stamp(), "state": "waiting"}
        self.fired["stop_retry"] = retry
        told = {"count": 1, "last_sent": time.time(), "every_s": (self.cfg.get("repeat_minutes") or 15.0) * 60}
        start_ack = core.read_json(self.p("ACK")).get("at")
        self.state = "retrying"
        self.write_state()
        quiet = None if send is None else (lambda event, fields: None if event == "stop_not_confirmed"
                                            else send(event, fields))
        while True:
            retry.update(state="waiting", next_at=stamp(time.time() + gap))
            self.save_fired()
            wake = time.monotonic() + gap
            renewed = time.monotonic()
            while time.monotonic() < wake:
                if time.monotonic() - renewed >= self.cfg["poll_seconds"]:
                    self.renew_lease()            # still watching: a reaper off the box reads this lease
                    renewed = time.monotonic()
                ack = core.read_json(self.p("ACK"))
                if self.stop_requested or (ack.get("at") and ack.get("at") != start_ack):
                    retry.update(state="acknowledged" if not self.stop_requested else "stopped by signal",
                                 ended_at=stamp())
                    self.log("stop retries end: %s after %d retr%s (the meter may still be running)" % (
                        retry["state"], retry["tries"], "y" if retry["tries"] == 1 else "ies"))
                    self.save_fired()
                    return 1
                if send is not None and notify.should_repeat(told, time.time()):
                    send("stop_not_confirmed", {"why": "still NOT CONFIRMED after %d retr%s: %s" % (
                        retry["tries"], "y" if retry["tries"] == 1 else "ies", self.fired.get("message")),
                        "repeat": told["count"] + 1})
                    told = notify.note_repeat(told, time.time())
                    self.fired["repeats"] = told["count"] - 1
                    self.save_fired()
                self.check_now = False
                time.sleep(max(0.01, min(0.5, self.cfg["poll_seconds"], wake - time.monotonic())))
            retry["tries"] += 1
            retry.update(state="running", last_at=stamp())
            self.log("stop retry %d (since %s): running the whole stop again" % (retry["tries"], retry["since"]))
            self.renew_lease()
            again = {"attempts": [], "escalations": [], "ok": False, "confirmed": None, "try": retry["tries"]}
            self.fired["last_retry"] = again
            plan = dict(self.cfg, pre_stop_cmd=None)
            try:
                rc = stop_engine.Engine(plan, plan, again, self.save_fired, self.log, run_dir=self.run_dir,
                                        notify=quiet).run()
            except Exception:  # noqa: BLE001  a broken round is one more failed try, never the end of the watch
                self.log("stop retry error: %s" % traceback.format_exc().strip().splitlines()[-1])
                rc = 1
            retry["last_rc"] = rc
            if rc == 0 and again.get("confirmed") is not False:
                retry.update(state="confirmed" if again.get("confirmed") else "ok", ended_at=stamp())
                self.fired.update(ok=True, confirmed=again.get("confirmed"),
                                  message="%s (retry %d)" % (again.get("message"), retry["tries"]))
                self.log("stop retry %d: %s" % (retry["tries"], self.fired["message"]))
                self.save_fired()
                return 0
            self.fired["message"] = "%s; retried %d time(s) since %s, still not confirmed" % (
                again.get("message"), retry["tries"], retry["since"])
            gap = min(cap, gap * 2)

    def keep_telling(self, send):
        """The stop failed or was not confirmed, and someone can be told: repeat STOP NOT CONFIRMED until an ACK
        (notify.should_repeat: every --repeat-minutes, the gap doubling, at most 8 messages), then exit."""
        import notify
        told = [n for n in self.fired.get("notified") or [] if n.get("sent") or n.get("spooled")]
        if not told:
            return   # nobody configured to hear it: lingering would tell no one
        state = {"count": 1, "last_sent": time.time(), "every_s": (self.cfg.get("repeat_minutes") or 15.0) * 60}
        self.state = "telling"
        self.write_state()
        start_ack = core.read_json(self.p("ACK")).get("at")
        while not self.stop_requested:
            ack = core.read_json(self.p("ACK"))
            if ack.get("at") and ack.get("at") != start_ack:
                state["acknowledged"] = True
                self.log("acknowledged: no more STOP NOT CONFIRMED messages")
                break
            now = time.time()
            if notify.should_repeat(state, now):
                send("stop_not_confirmed", {"why": "still NOT CONFIRMED: " + str(self.fired.get("message")),
                                            "repeat": state["count"] + 1})
                state = notify.note_repeat(state, now)
                self.fired["repeats"] = state["count"] - 1
                self.save_fired()
            elif state["count"] >= notify.REPEAT_MAX_COUNT:
                self.log("told %d times; no more messages" % state["count"])
                break
            wake = time.monotonic() + self.cfg["poll_seconds"]
            while not self.stop_requested and not self.check_now and time.monotonic() < wake:
                time.sleep(min(0.5, self.cfg["poll_seconds"]))
            self.check_now = False

    def finish(self, rc):
        self.write_state({"exit_code": rc})
        return rc


def flush_notifications():
    """Retry spooled messages (notify.py; bounded, never raises): a message that failed once still arrives."""
    try:
        import notify
        notify.flush_spool(budget_s=5)
    except Exception:  # noqa: BLE001
        pass


def last_resort_stop(cfg, log):
    """When the engine itself broke: run the stop (or fallback) once, non-destructive only."""
    for key in ("stop_cmd", "fallback_stop_cmd"):
        command = cfg.get(key)
        if not command or (key == "stop_cmd" and cfg.get("destructive")):
            continue
        try:
            argv, missing = expand_argv(command)
            cmd, problem = stop_engine.runnable(argv)
            if missing or problem:
                continue
            res = core.run_bounded(cmd, cfg.get("stop_timeout") or 120)
            log("last-resort %s: rc=%s" % (key, res.rc))
            if res.rc == 0:
                return 0
        except Exception:  # noqa: BLE001
            continue
    return 1



# ----------------------------------------------------------------------------- one watcher per folder, detached

def live_deadman(run_dir):
    """The pid of a dead-man that is still running for run_dir (its recorded identity alive), else None."""
    st = core.deadman_state(run_dir)
    if st["word"] == "ARMED" and st["alive"] and st["pid"] != os.getpid():
        return st["pid"]
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
                holder = core.read_json(os.path.join(run_dir, STATE_FILE)).get("pid")
                raise core.Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                                   "deadman.py ack --run-dir %s --disarm" % (holder, run_dir, run_dir))
            # filesystems without flock (some FUSE mounts): fall back to the identity check alone
    live = live_deadman(run_dir)
    if live:
        os.close(fd)
        raise core.Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                           "deadman.py ack --run-dir %s --disarm" % (live, run_dir, run_dir))
    return fd



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
        # before the pid is published: an early ack's wake-up must not kill it (SIGUSR1's default)
        signal.signal(signal.SIGUSR1, getattr(dm, "on_wake", signal.SIG_IGN))
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



# ----------------------------------------------------------------------------- arming: one table of options

def fnum(positive=False):
    """Minutes, hours, seconds: finite, >= 0 (> 0 when POSITIVE) and < 1e9 (absurd sizes overflow time APIs)."""
    return core.arg_number(float, 0.0, 1e9, low_open=positive)



# (config key, flag, kind, default, help). The re-arm (cfg_to_argv) walks the same table, so a re-armed
# dead-man keeps every setting (finding B3).
WATCH_OPTIONS = [
    ("stall_minutes", "--stall-minutes", "float", core.DEFAULT_STALL_MINUTES,
     "fire when the job is alive but heartbeat.json/job.log are this old (0 = off; %g)" % core.DEFAULT_STALL_MINUTES),
    ("grace_minutes", "--grace-minutes", "float", 15.0, "fire this long after the job ended unless acknowledged (15)"),
    ("max_hours", "--max-hours", "float", 0.0, "wall-clock cap since arming, whatever the job does (0 = off)"),
    ("wait_ssh", "--wait-ssh", "flag", False,
     "after the job is over, also wait while SSH sessions (tunnels too) are open, bounded below"),
    ("ssh_wait_max_minutes", "--ssh-wait-max-minutes", "float+", 60.0,
     "open SSH sessions delay the firing by at most this much (60; always on)"),
    ("ssh_idle_minutes", "--ssh-idle-minutes", "float", 30.0,
     "an SSH session with no traffic for this long stops counting (30; 0 = off; said at arm and in status "
     "when its traffic cannot be read)"),
    ("ssh_user", "--ssh-user", "str", None,
     "only this user's SSH sessions count (default: the user who arms it; * = every user)"),
    ("allow_destructive", "--allow-destructive", "flag", False,
     "permit a destructive stop, and only after the durable sync re-verifies at fire time"),
    ("fallback_stop_cmd", "--fallback-stop-cmd", "str", None,
     "non-destructive argv string run when the stop is refused, fails or is not confirmed"),
    ("pre_stop_cmd", "--pre-stop-cmd", "str", None, "argv string run before the stop (e.g. a last sync)"),
    ("pre_stop_timeout", "--pre-stop-timeout", "float", 300.0, "hard seconds for --pre-stop-cmd (300)"),
    ("retries", "--retries", "int", 3, "attempts of the stop, and of the fallback (3)"),
    ("retry_backoff", "--retry-backoff", "float", 10.0, "seconds before retry 2; doubles each retry (10)"),
    ("stop_timeout", "--stop-timeout", "float", 120.0, "hard seconds per stop attempt, children included (120)"),
    ("confirm_seconds", "--confirm-seconds", "float?", None,
     "a stop meant to end the machine is NOT CONFIRMED when this box is still up this long after it "
     "exits 0 (default 90 for a profile's stop or shutdown/poweroff/halt, else 0 = cannot confirm)"),
    ("still_up_seconds", "--still-up-seconds", "float", stop_engine.DEFAULT_STILL_UP_SECONDS,
     "a provider stop of this box that read CONFIRMED is revoked when this box is still up this long after it "
     "(%g; 0 = no check, for a rehearsal off the box)" % stop_engine.DEFAULT_STILL_UP_SECONDS),
    ("stop_retry_minutes", "--stop-retry-minutes", "float", 5.0,
     "after a stop that failed or was NOT CONFIRMED, run the whole stop again (stop, read back, fallback) after "
     "this long, the gap doubling to at most 15 min (or this, if longer), until confirmed or an ACK (5; 0 = "
     "never again: tests and rehearsals only)"),
    ("term_grace_seconds", "--term-grace-seconds", "float", 30.0,
     "after the run's stop signal to a live job's process group, wait this long for its checkpoint (30)"),
    ("sync_wait_seconds", "--sync-wait-seconds", "float", 300.0,
     "then wait this long for the supervisor's durable sync to finish (300)"),
    ("poll_seconds", "--poll-seconds", "float+", 30.0, "check interval in seconds (30)"),
    ("lease_ttl_seconds", "--lease-ttl-seconds", "float?", None,
     "the run's lease (lease.json, renewed every check) holds this long unrenewed before a reaper off the box "
     "may act (default three checks, at least 300)"),
    ("dry_run", "--dry-run", "flag", False, "on firing, record what would happen; signal and run nothing"),
    ("repeat_minutes", "--repeat-minutes", "float+", 15.0,
     "after a stop that failed or was not confirmed, repeat the message this often (the gap doubles; at most "
     "8; until an ACK) when notify.py has a target (15)"),
    ("registry", "--registry", "str", None,
     "the box's run registry (default $RGT_REGISTRY, else ~/.rgt/registry): other runs it lists hold the stop off"),
    ("budget_usd", "--budget-usd", "float+", None,
     "the run's budget (what rgt.py launch was given as its max cost): with --rate-per-hour, the cap is at "
     "most the hours it buys, counted from the run's first start (RUN_DIR/budget.json), budget_80 is told at "
     "80%% of them and budget_100 when the cap fires"),
    ("rate_per_hour", "--rate-per-hour", "float+", None, "the box's price per hour, for --budget-usd"),
    ("disk_floor_gb", "--disk-floor-gb", "float", None,
     "tell disk_low when the run dir's or durable dir's filesystem has fewer GiB free (default %g, the "
     "toolkit's launch floor)" % core.DEFAULT_DISK_FLOOR_GB),
    ("disk_floor_inodes", "--disk-floor-inodes", "int", None,
     "tell disk_low when either has fewer free inodes (default %d)" % core.DEFAULT_MIN_FREE_INODES),
]


def add_watch_options(parser, skip=()):
    for key, flag, kind, default, text in WATCH_OPTIONS:
        if key in skip:
            continue
        if kind == "flag":
            parser.add_argument(flag, action="store_true", help=text)
        elif kind == "int":
            parser.add_argument(flag, type=int, default=default, help=text)
        elif kind == "str":
            parser.add_argument(flag, default=default, help=text)
        else:
            parser.add_argument(flag, type=fnum(positive=kind == "float+"), default=default, help=text)


def run_command(parser, dest, commands, argv):
    """A watcher's main, once its toolkit is checked: parse ARGV, run the command it names (DEST) from COMMANDS
    (name -> function of the arguments); no command is a usage error naming them."""
    args = parser.parse_args(argv)
    name = getattr(args, dest)
    if not name:
        names = list(commands)
        raise core.UsageError("give a command: %s or %s (see --help)" % (", ".join(names[:-1]), names[-1]))
    return commands[name](args)
