#!/usr/bin/env python3
"""Once armed, the box's meter is stopped, confirmed or escalated when the run ends, stalls or passes its cap.

Guarantee: once armed, the box's meter is stopped (and the stop confirmed or escalated) when the
run is over, stalled or past its cap, and no error, full disk or read-only disk ends the watch first;
a destructive stop runs only over a durable copy that re-verifies at fire time.

Runs ON THE GPU NODE, detached from any SSH session, and watches one run directory
(the layout scripts/node/run_one.sh creates). It fires when

  job_ended  the job is over (status.json says succeeded/failed/sync_failed/interrupted, or the job
             and its supervisor are gone) and nobody acknowledged it within --grace-minutes;
             with --wait-ssh the clock also waits for SSH sessions to close (bounded, see below);
  no_job     nothing was ever started (no job, no launcher, no supervisor) for --grace-minutes;
  stall      the job process is alive but neither heartbeat.json nor job.log changed for
             --stall-minutes (a hung NCCL collective or a deadlocked loader bills forever);
             while another watched run on the box still progresses, only THIS run's job is
             stopped (its stop signal, then its sync) and the box is left on for the other run;
             while the job is over and its supervisor syncs or waits on leftover members of the
             job's process group, the limit is at least --sync-wait-seconds + 95 s (its own bound),
             with the stall rule off (--stall-minutes 0) too: no grace starts before the sync ends;
  max_hours  --max-hours passed since arming, whatever the job is doing; or the hours --budget-usd
             buys at --rate-per-hour are spent, counted from the run's FIRST start across attempts,
             re-arms and reboots, less the time the box was suspended (RUN_DIR/budget.json, kept by
             runrec: a resume or a re-arm never gets the whole budget again); a cap is the run's:
             while another watched run on the box still progresses, only THIS run is stopped (its
             stop signal, then its sync; RUN_DIR/CAP_STOPPED.json, scope "run") and the box stop
             waits until no other run holds it off.
A torn or unreadable status.json is never read as "no job": the dead-man holds, and the stall
rule and the cap still apply. Other runs on the box (the box registry, runrec.py) hold the stop
off only while they are watched by their own dead-man and progressing: a hung, unwatched neighbour
cannot keep the box billing.

Every deadline runs on the monotonic clock, so a wall-clock step neither delays nor hastens a
firing, and the watcher wakes when a deadline it foresees runs out (the grace, the stall limit, the
cap, an ACK's postponement), not at the next --poll-seconds tick. A system suspend restarts the
stall and grace clocks; suspended time does not count toward --max-hours. Every poll is guarded: an
error is logged and the watch goes on (errors for longer than the stall limit fire "watch_error", so
a broken watcher cannot fail open). A reserve file made at arm time is given up when the disk is
full, and records are best effort: the stop runs anyway.

Firing: DEADMAN_FIRED.json is written first (best effort); a still-running job gets the run's stop
signal (run.json stop_signal, default SIGTERM; status.json job_stop says so first, so the supervisor
records the run as interrupted whatever the job's exit code) on its process group and up to
--term-grace-seconds to checkpoint, then SIGKILL to the group if the job is still alive
(job_term.killed), and the supervisor up to --sync-wait-seconds to finish its durable sync; then the
stop engine (stop_engine.py) runs: --pre-stop-cmd, the stop with --retries and backoff, a confirmation
(the provider's state where an adapter exists; for a stop meant to end the machine, this box still up
--confirm-seconds later means NOT CONFIRMED, retried, then the fallback), and an escalation (a record
and a notification) when the stop is not confirmed or fails. The stop command is checked when armed (its
program found, $VAR resolvable from the environment or PID 1's); a script without a "#!" line runs
through /bin/sh. The record's "confirmed" is true, false or null (a custom stop that cannot be
confirmed); run_status prints STOP NOT CONFIRMED while it is false.
A provider stop that read CONFIRMED is revoked when this box is still up --still-up-seconds later; a
fallback's exit code never confirms a provider stop (its state is read back). The dead-man never gives up
(finding C7): after a stop that failed or was NOT CONFIRMED it stays, state "retrying", and runs the whole
stop again every --stop-retry-minutes (the gap doubling to at most 15 min) until one is confirmed or
`deadman.py ack` acknowledges it, telling stop_not_confirmed on its own backoff; DEADMAN_FIRED.json
"stop_retry" says how many tries and since when. Every error text, record and log line passes
rgt_core.redact (no key reaches the run dir: finding C8).

Destructive stops (METER_STOP_DESTRUCTIVE true, --stop-cmd-destructive, or inferred from any word
of the command at any depth of wrapping: destructive.py) run only with --allow-destructive AND a
durable copy that re-verifies at fire time (stop_engine.verify_durable); otherwise the
non-destructive fallback runs, if given.

SSH sessions (--wait-ssh; sessions.py): interactive, command and tunnel (`ssh -N`) sessions hold
the firing off after the job is over, at most --ssh-wait-max-minutes (60), and a session with no
traffic for --ssh-idle-minutes (30) stops counting. Only --ssh-user's sessions count (default: the
user who arms it; * = every user). Where idle time cannot be measured (not root: sshd's /proc/PID/io
is unreadable), arm warns and status says so (ssh_idle_problem).

Messages (notify.py, when a target is configured; a --dry-run dead-man tells no one): deadman_fired when
it fires (with budget_100 when the cap that fired is the one --budget-usd bought), stalled, stop_confirmed,
stop_not_confirmed (repeated until an ACK, --repeat-minutes); and from a quiet poll: first_progress once per
attempt (the attempt's step rose above the first it showed; with the ETA run_status.py gives), budget_80
once (80% of the hours --budget-usd buys at --rate-per-hour are spent since the run's first start), disk_low once per
crossing (the run dir's or the durable dir's filesystem under --disk-floor-gb or --disk-floor-inodes; told
again only after it came back 10% above the floor; a filesystem that does not answer is skipped). The run's
own list (run.json notify_events) narrows what is sent. RUN_DIR/notified.json records what was told, so a
re-armed dead-man does not tell it again. A message a target dropped or a bad config refused is logged
("NOTIFY: ... NOT delivered") and counted in deadman.json notify_lost (run_status shows the count). A
notify config the node refuses (notify.py check fails) is refused at arm time (exit 3), unless --dry-run
or --notify-refused-ok (a warning; boot_resume.py re-arms that way: a run is never left unwatched).

Usage:
  deadman.py arm --run-dir DIR [--stall-minutes 30] [--grace-minutes 15] [--max-hours H]
                 [--wait-ssh] [--ssh-wait-max-minutes 60] [--ssh-idle-minutes 30] [--ssh-user USER]
                 [--profile NAME | --stop-cmd "ARGV" [--stop-cmd-destructive]]
                 [--allow-destructive] [--fallback-stop-cmd "ARGV"] [--pre-stop-cmd "ARGV"]
                 [--pre-stop-timeout 300] [--retries 3] [--retry-backoff 10] [--stop-timeout 120]
                 [--confirm-seconds S] [--still-up-seconds 180] [--stop-retry-minutes 5]
                 [--term-grace-seconds 30] [--sync-wait-seconds 300]
                 [--job-pid PID] [--poll-seconds 30] [--lease-ttl-seconds S] [--repeat-minutes 15]
                 [--registry DIR] [--dry-run]
                 [--budget-usd USD --rate-per-hour X] [--disk-floor-gb 10] [--disk-floor-inodes 10000]
                 [--notify-refused-ok] [--foreground] [--json]
  deadman.py ack --run-dir DIR [--postpone-minutes M | --disarm] [--json]
  deadman.py status --run-dir DIR [--json]

Exit codes:
  arm     0 armed (prints the dead-man pid), 2 usage, 3 refused (a live dead-man already
          watches this run dir, the stop command cannot run here, or the notify config is refused);
          with --foreground: 0 after
          firing with the stop succeeding and not disproved (or a dry run that found a command,
          or disarmed), 1 when it fired but every stop failed, was not confirmed, was refused, or
          no stop command exists.
  ack     0 written, 2 usage.
  status  0 armed and alive, 1 nothing is watching (NONE, DOWN, EXITED, DISARMED),
          7 fired, 2 usage.

Minutes and hours accept floats (tests use --grace-minutes 0.01 --poll-seconds 0.05).
Python 3.8+ standard library only; runs from the node folder beside rgt_core.py. The guarded loop, the firing and
the option table are watcher.py's (idle_watch.py shares them); the run rules are deadman_rules.py's, pure
functions of the facts this module reads at each check.
"""
import json
import os
import signal
import socket
import sys
import threading
import time

import deadman_rules as rules
import progress
import rgt_core as core
import runrec
import sessions
import stop_engine
from deadman_rules import disk_state  # noqa: F401  (re-exported: tests use deadman.*)
from destructive import destructive_word  # noqa: F401  (re-exported: tests and callers use deadman.*)
from sessions import ssh_sessions  # noqa: F401
from stop_engine import expand_argv, init_environ, split_cmd, verify_durable  # noqa: F401
from watcher import (FIRED_FILE, STATE_FILE, WATCH_OPTIONS, WATCH_RESERVE, Watcher, add_watch_options,  # noqa: F401
                     detach_and_run, dur, fnum, live_deadman, mtime, run_command, stamp, suspended_seconds,
                     take_lock)
# (the watcher's loop, lock and option table, re-exported: tests, boot_resume and launcher use deadman.*)

TERMINAL = runrec.TERMINAL
ACTIVE = runrec.ACTIVE
NO_STOP_MSG = stop_engine.NO_STOP_MSG
REFUSED_MSG = stop_engine.REFUSED_MSG
CAP_STOPPED_FILE = runrec.CAP_STOPPED
DISK_CHECK_SECONDS = 2.0          # a filesystem that does not answer statvfs in this long is skipped this poll

# ----------------------------------------------------------------------------- the run's own stop signal

def stop_signal_of(run_dir):
    """The run's own stop signal (run.json stop_signal: TERM, INT, ...), default SIGTERM."""
    name = core.read_json(os.path.join(run_dir, runrec.RUN)).get("stop_signal") or "TERM"
    sig = getattr(signal, "SIG" + str(name).upper().replace("SIG", "", 1), None)
    return sig if isinstance(sig, signal.Signals) else signal.SIGTERM



# ----------------------------------------------------------------------------- the run dead-man

class Deadman(Watcher):
    NAME = "deadman"

    def __init__(self, run_dir, cfg, foreground):
        Watcher.__init__(self, run_dir, cfg, foreground)
        self.ended_mono = None            # when the job was (first seen) over
        self.ssh = sessions.SshRule(cfg.get("ssh_idle_minutes"), cfg.get("ssh_wait_max_minutes"))
        self.last_ssh = None              # last time a counted SSH session held the firing off
        self.holding_others = False       # another run held the firing off at the last look
        self.others_released = None       # when the other runs stopped holding it off (first seen)
        self.progress_sig = None          # (mtime of heartbeat.json, of job.log) last seen
        self.progress_mono = self.armed_mono
        self.last_eval = self.armed_mono
        self.ack_sig = None
        self.ack_until_mono = None
        self.stopped_job = None           # the job this dead-man already stopped for a stall
        self.cap_stopped = None           # CAP_STOPPED.json: this run stopped at its cap, the box left on
        self.progress_look = None         # (mtime of heartbeat.json, of job.log) at the last first_progress look
        self.progress_base = {}           # attempt -> the first step its heartbeat showed this dead-man
        self.progress_told = set()        # attempts whose first_progress is told (or was, says notified.json)
        self.disk_low = told_record(run_dir, "disk_low")   # which filesystem is low now (a re-arm keeps it)
        self.disk_probe = None            # a statvfs still hanging (a dead network mount): none started meanwhile

    def renew_lease(self):
        """Renew the run's lease (issue 39): who watches, until when the lease holds, the budget's deadline. A
        reaper off the box stops the box when this stops being renewed while the provider says it runs."""
        hours, _fields = self.budget(time.monotonic())
        clock = self.budget_clock
        deadline = core.utc_iso(clock["first_start"] + (clock.get("suspended_s") or 0) + hours * 3600) \
            if hours else None
        run = core.read_json(self.p("run.json"))
        doc = {"run_id": run.get("run_id"), "run_dir": self.run_dir, "profile": self.cfg.get("profile"),
               "box": {"host": socket.gethostname(), "boot_id": core.boot_id()},
               "renewed_at": round(time.time(), 3),
               "ttl_s": self.cfg.get("lease_ttl_seconds") or runrec.lease_ttl(self.cfg.get("poll_seconds")),
               "budget_deadline": deadline,
               "budget": {k: clock.get(k) for k in ("first_start", "suspended_s", "budget_usd", "rate_per_hour")}
               if hours else None,
               "deadman": {"pid": os.getpid(), "identity": core.process_identity(), "state": self.state,
                           "oom_protected": getattr(self, "oom_protected", False), "last_evaluation": stamp(),
                           "evaluations": self.evaluations}}
        error = runrec.write_lease(self.run_dir, doc, reserve=self.p(WATCH_RESERVE))
        if error:
            self.note("lease not renewed (%s); watching goes on" % error)

    def from_wall(self, wall, now):
        """A monotonic instant for a wall time read from a file, no earlier than arming."""
        age = time.time() - wall
        return now - min(max(age, 0.0), now - self.armed_mono)

    def track_progress(self, now):
        """Move the stall clock when heartbeat.json or job.log changed since the last look.

        The change is dated by the file's mtime, but never earlier than the previous look, so a
        wall-clock step moves the stall clock by one poll interval at most."""
        stamps = (mtime(self.p("heartbeat.json")), mtime(self.p("job.log")))
        if self.progress_sig is not None and stamps != self.progress_sig:
            newest = max([t for t in stamps if t is not None] or [time.time()])
            self.progress_mono = max(self.progress_mono, now - min(max(time.time() - newest, 0.0),
                                                                   now - self.last_eval))
        self.progress_sig = stamps

    def ack_postponed(self, ack, now):
        """True while an ACK's until (a wall time) lies ahead; converted once per ACK written."""
        until = rules.postpone_until(ack)
        sig = (ack.get("until"), ack.get("at"))
        if sig != self.ack_sig:
            self.ack_sig = sig
            self.ack_until_mono = None if until is None else now + (until - time.time())
        return self.ack_until_mono is not None and now < self.ack_until_mono

    def neighbours(self):
        """Other active runs on the box that hold this one's stop off: watched AND progressing."""
        found = runrec.active_neighbours([self.run_dir], [os.path.dirname(self.run_dir)],
                                         self.cfg["stall_minutes"], self.cfg.get("registry"))
        return rules.split_neighbours(found)

    def evaluate(self, now):
        """(reason, detail, job_pid, job_alive) when it should fire now, else None. NOW is monotonic."""
        cfg = self.cfg
        ack = core.read_json(self.p("ACK"))
        if ack.get("disarm") is True:
            return "disarm", "ACK says disarm", None, False
        postponed = self.ack_postponed(ack, now)

        status, unreadable = runrec.read_status(self.run_dir)
        state = (status or {}).get("state")
        job_pid, job_alive, helper_alive = runrec.liveness(status or {}, cfg.get("job_pid"), cfg.get("job_identity"))
        self.track_progress(now)
        self.last_eval = now

        candidates = []
        cap = self.cap_reached(now)
        if cap:
            # Finding C2: a run's cap is the run's. While other watched runs still progress, stop this run (its
            # stop signal, its sync) once and leave the box on; the box stop waits for the last of them.
            holding, _ignored = self.neighbours()
            rule = rules.cap_rule(holding, self.cap_stopped is not None, postponed)
            if rule == "box":
                candidates.append(cap[:2])
            elif rule == "run":
                return "cap_run", "%s; other runs still train (%s)" % (cap[1], ", ".join(holding[:5])), \
                    job_pid, job_alive
            else:
                self.note("%s: this run stopped; holding the box stop for %s" % (cap[1], ", ".join(holding[:5])))

        phase = rules.job_phase(unreadable, state in TERMINAL, job_alive, helper_alive, state in ACTIVE + (None,),
                                job_pid)
        over = rules.why_over(phase, state, (status or {}).get("exit_code"), job_pid)
        if phase == "unreadable":
            # Finding A7: never "no job". Hold; the stall rule and the cap still apply.
            self.note("status.json unreadable (%s): treated as a live job" % unreadable)
        elif phase == "ended" and self.ended_mono is None:
            ended_at = core.parse_iso(status.get("ended_at"))
            self.ended_mono = self.from_wall(ended_at, now) if ended_at is not None else now
        elif phase == "running":
            self.ended_mono = None
            self.ssh.reset()
            self.last_ssh = None
        elif phase == "gone" and self.ended_mono is None:
            self.ended_mono = now

        winding_down = rules.winding_down(phase, job_alive, helper_alive, state,
                                          (status or {}).get("waiting_for_group"))
        quiet_since = rules.quiet_since(self.progress_mono, self.resumed_mono, self.armed_mono)
        if winding_down:
            # Finding A3 (residual): the job is over and its supervisor is waiting on leftover group members or
            # syncing. Stopping the box now would lose the sync, so only a supervisor hung far past its own
            # bounded wait plus --sync-wait-seconds is stopped (the cap still applies). This holds with the stall
            # rule off too: the grace of a job that is over only starts once its supervisor is done.
            limit = rules.wind_down_limit(cfg["stall_minutes"], cfg["sync_wait_seconds"])
            doing = "syncing" if state == "syncing" else "waiting for the job's leftover process group"
            if now - quiet_since >= limit:
                candidates.append(("stall", "job over but its supervisor has been %s with no progress for %s "
                                            "(limit %s)" % (doing, dur(now - quiet_since), dur(limit))))
            else:
                self.due_at(quiet_since + limit)
                self.note("job over; the supervisor is %s: the box stop waits (up to %s)" % (doing, dur(limit)))
        elif phase in ("running", "unreadable") and not winding_down:
            quiet = now - quiet_since
            if cfg["stall_minutes"]:
                self.due_at(quiet_since + cfg["stall_minutes"] * 60)
            stalled = core.is_stalled(quiet, cfg["stall_minutes"])
            holding = self.neighbours()[0] if stalled else []
            rule = rules.stall_rule(stalled, holding, job_alive, job_pid, self.stopped_job)
            if rule:
                who = ("job alive (pid %s, state %s)" % (job_pid, state)) if job_alive else (
                    "job pid %s gone but its supervisor alive (state %s)" % (job_pid, state))
                detail = ("%s but heartbeat.json and job.log unchanged for %s (limit %g min)"
                          % (who, dur(quiet), cfg["stall_minutes"]))
            if rule == "run":
                # Finding R3: stop this run's job, not the box under a healthy run.
                return "stall_run", detail + "; other runs still train (%s)" % ", ".join(holding[:5]), \
                    job_pid, job_alive
            if rule == "box":
                candidates.append(("stall", detail))
            elif rule == "hold":
                self.note("stalled, job already stopped; holding the box stop for %s" % ", ".join(holding[:5]))
            if not candidates:
                self.note("watching: job active (state %s, pid %s)" % (state, job_pid))
        else:   # the job is over (its supervisor done) or never ran
            candidates += self.job_over(now, over)

        if not candidates:
            return None
        if postponed:
            self.due_at(self.ack_until_mono)
            self.note("would fire (%s) but ACK postpones until %s" % (candidates[0][0], stamp(ack.get("until"))))
            return None
        reason, detail = candidates[0]
        return reason, detail, job_pid, job_alive

    def job_over(self, now, over):
        """The job is over (OVER says why) or never ran: [(reason, detail)] once the grace ran out unless other
        runs or SSH sessions hold it off (their clocks move on here), else []."""
        cfg = self.cfg
        holding = False
        others, ignored = self.neighbours()
        if others:
            holding, self.holding_others, self.others_released = True, True, None
            self.note("%s; holding: another run on this box is active and watched (%s)"
                      % (over or "no job running", ", ".join(others[:5])))
        elif self.holding_others:
            # Finding R11: the grace starts when the neighbours were first seen gone, never earlier.
            self.holding_others, self.others_released = False, now
        if ignored and not others:
            self.note("not holding for %s" % ", ".join(ignored[:5]))
        if cfg["wait_ssh"] and not holding:
            found = ssh_sessions(user=cfg.get("ssh_user"))
            problem = sessions.idle_problem(found, cfg.get("ssh_idle_minutes"))
            self.ssh_view = {"user": cfg.get("ssh_user"), "counted": len(found or []), "idle_problem": problem}
            if problem:
                self.note(problem)
            ssh_hold, counted, idle, capped = self.ssh.hold(now, found)
            if ssh_hold:
                holding, self.last_ssh = True, now
                self.note("job over; waiting for %d SSH session(s) to close: %s (at most until %s)"
                          % (len(counted), ", ".join(counted),
                             stamp(self.wall_at(self.ssh.since + cfg["ssh_wait_max_minutes"] * 60))))
            elif capped and counted:
                self.note("SSH wait cap of %g min reached: %d open session(s) no longer hold the firing "
                          "off (%s)" % (cfg["ssh_wait_max_minutes"], len(counted), ", ".join(counted)))
            elif idle:
                self.note("ignoring %d SSH session(s) idle for over %g min: %s"
                          % (len(idle), cfg["ssh_idle_minutes"], ", ".join(idle)))
        since = rules.idle_since(self.ended_mono, self.armed_mono, self.others_released, self.last_ssh,
                                 self.resumed_mono)
        rule = rules.grace_rule(now - since, cfg["grace_minutes"], holding)
        if rule == "fire":
            return [rules.ended_candidate(over, cfg["grace_minutes"],
                                          cfg["ssh_wait_max_minutes"] if self.ssh.capped else None)]
        if rule == "wait":
            self.due_at(since + cfg["grace_minutes"] * 60)
            self.note("%s; firing at %s unless acknowledged"
                      % (over or "no job running", stamp(self.wall_at(since + cfg["grace_minutes"] * 60))))
        return []

    # the job
    def still_the_job(self, job_pid):
        status = runrec.status(self.run_dir)
        if status.get("job_pid") == job_pid:
            return core.record_alive(status.get("job_identity"), job_pid, core.parse_iso(status.get("started_at")))
        return core.record_alive(self.cfg.get("job_identity"), job_pid)

    def wait_until(self, done, seconds):
        """Poll DONE() until it is true or SECONDS (monotonic) pass; returns the seconds waited."""
        start = time.monotonic()
        while not done() and time.monotonic() - start < seconds:
            time.sleep(min(0.2, self.cfg["poll_seconds"]))
        return time.monotonic() - start

    def term_job(self, job_pid, reason=None):
        """The run's stop signal to the job's process group, then time to save and to sync. Before the signal,
        status.json job_stop says who stops the job and why (REASON), so the supervisor records the run as
        interrupted whatever the job's exit code: this record is only complete once the sync is over."""
        cfg = self.cfg
        pid = int(job_pid)
        sig = stop_signal_of(self.run_dir)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = None
        group = pgid == pid
        rec = {"signal": sig.name, "target": ("process group %d" % pid) if group else ("pid %d" % pid),
               "grace_seconds": cfg["term_grace_seconds"]}
        if cfg["dry_run"]:
            rec["dry_run"] = True
            return rec
        if not self.still_the_job(pid):   # never signal a reused pid
            rec["skipped"] = "pid %d is no longer the recorded job (exited, or reused by another process)" % pid
            return rec
        rec["sent_at"] = stamp()
        runrec.set_status(self.run_dir, job_stop={"by": "the dead-man", "reason": reason, "signal": sig.name,
                                                  "job_pid": pid, "at": rec["sent_at"]})
        try:
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except OSError as exc:
            rec["error"] = str(exc)
            runrec.set_status(self.run_dir, job_stop=None)   # nothing was stopped
        rec["waited_seconds"] = round(self.wait_until(lambda: not core.pid_alive(pid), cfg["term_grace_seconds"]), 2)
        rec["job_exited"] = not core.pid_alive(pid)
        if not rec["job_exited"] and "error" not in rec:
            # Finding N4: a job that ignores its stop signal is killed after the grace, so the supervisor can sync
            # and the box stop follow at once (not after --sync-wait-seconds spent waiting on a job that lives on).
            rec["killed"] = {"signal": "SIGKILL", "at": stamp()}
            try:
                if group:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                rec["killed"]["error"] = str(exc)
            self.wait_until(lambda: not core.pid_alive(pid), 5.0)
            rec["job_exited"] = not core.pid_alive(pid)
            self.log("the job outlived %s by %g s: sent SIGKILL to %s; job exited: %s"
                     % (sig.name, cfg["term_grace_seconds"], rec["target"], rec["job_exited"]))

        def sync_over():  # give the supervisor a chance to finish its durable sync of what the job saved
            status = runrec.status(self.run_dir)
            return status.get("state") in TERMINAL or not core.record_alive(
                status.get("supervisor_identity"), status.get("supervisor_pid"),
                core.parse_iso(status.get("started_at")))
        self.wait_until(sync_over, cfg["sync_wait_seconds"])
        rec["state_after"] = runrec.status(self.run_dir).get("state")
        self.log("sent %s to %s; job exited: %s after %.1f s; run state now %s"
                 % (sig.name, rec["target"], rec["job_exited"], rec["waited_seconds"], rec["state_after"]))
        return rec

    def before_stop(self, job_pid, job_alive):
        if job_alive and job_pid:
            self.fired["job_term"] = self.term_job(job_pid, self.fired.get("reason"))

    def stop_own_job(self, detail, job_pid, job_alive):
        """Finding R3: a stalled run on a box where another watched run trains loses its job, not the box."""
        self.stopped_job = job_pid
        self.log("STALL: %s: stopping this run's job only; the box stays on" % detail)
        rec = {"reason": "stall", "detail": detail, "at": stamp(), "box_stop": False}
        try:
            rec["job_term"] = self.term_job(job_pid, "stall")
        except Exception as exc:  # noqa: BLE001
            rec["error"] = str(exc)
        self.write_state({"stalled_job_stopped": rec})
        self.save("STALL_STOPPED.json", rec)
        send = self.sender()
        if send is not None:
            send("stalled", {"detail": detail, "box_stop": False})

    def stop_run_at_cap(self, detail, job_pid, job_alive):
        """Finding C2: the run's cap passed while other watched runs train: stop this run's job (its stop signal,
        then its sync), record CAP_STOPPED.json (scope "run") and leave the box on; the box stop fires once no
        other run holds it (the usual neighbour rule)."""
        reason = "max_hours"
        others, _ignored = self.neighbours()
        self.log("CAP: %s: stopping this run only; the box stays on for %d other run(s)" % (detail, len(others)))
        rec = {"reason": reason, "scope": "run", "detail": detail, "at": stamp(), "box_stop": False,
               "other_runs": others, "job_term": None}
        self.cap_stopped = rec
        self.save(CAP_STOPPED_FILE, rec)   # what happened goes on disk before the signal
        send = self.sender()
        if send is not None:
            send("deadman_fired", {"reason": reason, "detail": detail, "scope": "run", "box_stop": False})
            hours, spent = self.budget(time.monotonic())
            if hours is not None and self.cfg.get("max_hours", 0) >= hours - 1e-6:
                send("budget_100", spent)
        if job_alive and job_pid:
            try:
                rec["job_term"] = self.term_job(job_pid, reason)
            except Exception as exc:  # noqa: BLE001
                rec["error"] = str(exc)
        rec["state_after"] = runrec.status(self.run_dir).get("state")
        self.write_state({"cap_stopped": rec})
        self.save(CAP_STOPPED_FILE, rec)

    def notify_fields(self):
        return {"host": socket.gethostname(), "run_dir": self.run_dir,
                "run_id": runrec.status(self.run_dir).get("run_id")}

    def notify_events(self):
        return runrec.notify_events(self.run_dir)

    # messages from a quiet poll
    def observe(self, now):
        send = self.sender()
        if send is None:
            return
        for tell in (self.tell_budget, self.tell_first_progress, self.tell_disk):
            try:   # each on its own: one that breaks never keeps the others quiet
                tell(now, send)
            except Exception as exc:  # noqa: BLE001
                self.note("%s failed, watching on: %s: %s" % (tell.__name__, type(exc).__name__, exc))

    def note_told(self, key, value):
        """Record in notified.json what was told, so a re-armed dead-man does not tell it again. Best effort and
        without the reserve: that is kept for the stop's own records."""
        doc = runrec.notified(self.run_dir)
        doc[key] = value
        error = core.write_json_best_effort(self.p(runrec.NOTIFIED), doc)
        if error:
            self.note("%s not recorded (%s); not told again by this dead-man" % (key, error))

    def tell_first_progress(self, now, send):
        """first_progress once per attempt: the first time the attempt's step rises above the first step it
        showed (its first logged step with --progress-regex; else the first its heartbeat showed this dead-man),
        with the ETA run_status.py would give (progress.py). Looked at only when heartbeat.json or job.log moved."""
        look = (mtime(self.p(progress.HEARTBEAT)), mtime(self.p(progress.JOB_LOG)))
        if look == self.progress_look:
            return
        self.progress_look = look
        status = runrec.status(self.run_dir)
        attempt = status.get("attempt") or 1
        if status.get("state") not in ("running", "stalled") or attempt in self.progress_told:
            return
        if told_record(self.run_dir, "first_progress").get("attempt") == attempt:
            self.progress_told.add(attempt)
            return
        run = core.read_json(self.p(runrec.RUN))
        seen = progress.attempt_progress(self.run_dir, status, run)
        step = seen["step"]
        if step is None:
            return
        base = seen["first_step"] if seen["first_step"] is not None else self.progress_base.setdefault(attempt, step)
        if step <= base:
            return
        eta_s, basis = progress.eta(step, seen["total_steps"], seen["heartbeat"],
                                    core.parse_iso(status.get("started_at")), status, run,
                                    self.p(progress.JOB_LOG), time.time())
        self.progress_told.add(attempt)
        self.log("first progress of attempt %s: step %s; telling (eta %s: %s)" % (attempt, step, eta_s, basis))
        self.note_told("first_progress", {"attempt": attempt, "step": step, "at": stamp()})
        send("first_progress", {"attempt": attempt, "step": step, "total": seen["total_steps"], "eta_s": eta_s})

    def disk_paths(self):
        """(label, path) of the filesystems a run needs: its run dir's and its durable dir's."""
        paths = [("run_dir", self.run_dir)]
        durable = core.read_json(self.p(runrec.RUN)).get("durable_dir")
        if isinstance(durable, str) and durable and os.path.isdir(durable):
            paths.append(("durable_dir", durable))
        return paths

    def measure(self, path):
        """core.disk_check(PATH) in a helper thread, waited for at most DISK_CHECK_SECONDS: a hung network
        mount must not hold the watch. None when it did not answer (or failed); one helper at a time."""
        if self.disk_probe is not None and self.disk_probe.is_alive():
            return None
        found = {}

        def probe():
            try:
                found["info"] = core.disk_check(path)
            except OSError:
                pass
        thread = threading.Thread(target=probe, name="rgt-disk-check", daemon=True)
        thread.start()
        thread.join(DISK_CHECK_SECONDS)
        if thread.is_alive():
            self.disk_probe = thread
            self.note("statvfs of %s did not answer within %g s; disk not checked" % (path, DISK_CHECK_SECONDS))
            return None
        return found.get("info")

    def tell_disk(self, now, send):
        """disk_low once per crossing: free bytes or inodes of the run dir's or durable dir's filesystem under
        the floor (disk_state); told again only after it recovered."""
        floor_gb = self.cfg.get("disk_floor_gb")
        floor_gb = core.DEFAULT_DISK_FLOOR_GB if floor_gb is None else floor_gb
        floor_inodes = self.cfg.get("disk_floor_inodes")
        floor_inodes = core.DEFAULT_MIN_FREE_INODES if floor_inodes is None else floor_inodes
        seen = set()
        for label, path in self.disk_paths():
            info = self.measure(path)
            if info is None or info["dev"] in seen:
                continue
            seen.add(info["dev"])
            was = bool(self.disk_low.get(label))
            low, tell = disk_state(was, info["free_bytes"], info["free_inodes"], floor_gb * (1 << 30), floor_inodes)
            if low == was:
                continue
            self.disk_low[label] = low
            self.note_told("disk_low", dict(self.disk_low))
            if not tell:
                self.log("disk of the %s recovered: %s free, %s inodes" % (
                    label, core.human_bytes(info["free_bytes"]), info["free_inodes"]))
                continue
            self.log("DISK LOW under the %s: %s free, %s inodes (floor %g GiB, %d inodes); telling" % (
                label, core.human_bytes(info["free_bytes"]), info["free_inodes"], floor_gb, floor_inodes))
            send("disk_low", {"which": label, "path": info["measured_at"], "free_bytes": info["free_bytes"],
                              "free_inodes": info["free_inodes"], "floor_gb": floor_gb, "floor_inodes": floor_inodes})


def told_record(run_dir, key):
    """notified.json's record for KEY as a dict ({} when absent or damaged: then it is told again)."""
    value = runrec.notified(run_dir).get(key)
    return dict(value) if isinstance(value, dict) else {}






def run_dir_arg(args):
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        raise core.UsageError("run dir %s %s" % (run_dir, "is not a directory" if os.path.exists(run_dir)
                                                   else "does not exist"))
    return run_dir



def cfg_to_argv(cfg):
    """The arm options that rebuild CFG (the boot re-arm): every setting, the stop included."""
    out = []
    for key, flag, kind, default, _text in WATCH_OPTIONS:
        value = cfg.get(key)
        if kind == "flag":
            out += [flag] if value else []
        elif value is not None and not (kind == "float?" and key == "confirm_seconds" and not cfg.get("confirm_explicit")):
            out += [flag, repr(value) if isinstance(value, float) else str(value)]
    source = cfg.get("stop_cmd_source") or ""
    if source == "--stop-cmd" and cfg.get("stop_cmd"):
        out += ["--stop-cmd", cfg["stop_cmd"]] + (["--stop-cmd-destructive"] if cfg.get("stop_cmd_destructive") else [])
    elif source.startswith("profile:"):
        out += ["--profile", source.split(":", 1)[1]]
    if cfg.get("job_pid"):
        out += ["--job-pid", str(cfg["job_pid"])]
    return out


def build_config(args, run_dir):
    cfg = {key: getattr(args, key) for key, _flag, _kind, _default, _text in WATCH_OPTIONS}
    cfg["max_hours"] = cfg["max_hours"] or 0.0
    cfg["registry"] = os.path.abspath(args.registry) if args.registry else runrec.registry_dir()
    cfg["job_pid"] = args.job_pid
    cfg["stop_cmd_destructive"] = bool(args.stop_cmd_destructive)
    cfg["confirm_explicit"] = args.confirm_seconds is not None
    if args.job_pid is not None:
        if args.job_pid <= 0:
            raise core.UsageError("--job-pid must be a positive pid")
        cfg["job_identity"] = core.process_identity(args.job_pid)
    if args.retries < 1:
        raise core.UsageError("--retries must be at least 1")
    if bool(args.budget_usd) != bool(args.rate_per_hour):
        raise core.UsageError("--budget-usd and --rate-per-hour go together (the budget, and what an hour costs)")
    if args.budget_usd:   # the budget's cap holds whatever --max-hours says
        hours = core.budget_hours(args.budget_usd, args.rate_per_hour)
        if hours <= 0:
            raise core.UsageError("--budget-usd %g buys no time at %g per hour" % (args.budget_usd, args.rate_per_hour))
        cfg["max_hours"] = min(cfg["max_hours"] or hours, hours)
    if args.disk_floor_inodes is not None and args.disk_floor_inodes < 0:
        raise core.UsageError("--disk-floor-inodes must be 0 or more")
    profile = args.profile
    if not profile:
        profile = core.read_json(os.path.join(run_dir, "run.json")).get("profile") or None
    profile = profile if isinstance(profile, str) else None
    plan, warnings = stop_engine.stop_plan(
        stop_cmd=args.stop_cmd, stop_cmd_destructive=args.stop_cmd_destructive, profile=profile,
        profile_explicit=bool(args.profile), fallback_stop_cmd=args.fallback_stop_cmd,
        pre_stop_cmd=args.pre_stop_cmd, confirm_seconds=args.confirm_seconds, dry_run=args.dry_run,
        allow_destructive=args.allow_destructive)
    cfg.update(plan)
    if not cfg["stop_cmd"] and not cfg["fallback_stop_cmd"] and profile == "local":
        warnings.append("NOTE: profile local has no platform meter; if this fires it only records why (give "
                        "--stop-cmd to act, e.g. a suspend command)")
    elif not cfg["stop_cmd"] and not cfg["fallback_stop_cmd"]:
        warnings.append("WARNING: %s if this fires (no --stop-cmd, and profile %s has no METER_STOP_CMD); "
                        "it will only record why" % (NO_STOP_MSG, profile or "(none)"))
    cfg["ssh_user"] = args.ssh_user or sessions.arming_user()
    if args.wait_ssh and ssh_sessions() is None:
        warnings.append("WARNING: --wait-ssh cannot see SSH sessions here (no /proc); it has no effect")
    elif args.wait_ssh:   # finding N13: an idle limit that cannot be measured is said, not silently ignored
        problem = sessions.idle_problem(ssh_sessions(user=cfg["ssh_user"]), args.ssh_idle_minutes)
        if problem:
            warnings.append("WARNING: " + problem)
    if not args.dry_run:
        problem = stop_engine.notify_config_problem()
        if problem and not getattr(args, "notify_refused_ok", False):
            raise core.Refused(problem)
        if problem:
            warnings.append("WARNING: " + problem)
    if cfg["destructive"] and not args.allow_destructive:
        warnings.append("WARNING: the stop command is DESTRUCTIVE and --allow-destructive is not set: it will be "
                        "refused%s" % (" and the fallback run" if cfg["fallback_stop_cmd"]
                                       else "; with no --fallback-stop-cmd the meter keeps running"))
    return cfg, warnings


def armed(args):
    """The arming both ways share -> (run dir, config, the dead-man, the lock fd): settings checked, the lock
    taken, earlier evidence retired, the run registered, warnings said."""
    run_dir = run_dir_arg(args)
    cfg, warnings = build_config(args, run_dir)
    lock_fd = take_lock(run_dir)
    dm = Deadman(run_dir, cfg, foreground=args.foreground)
    retire_old_evidence(run_dir, dm.log)
    runrec.register(run_dir, cfg["registry"])
    for line in warnings:
        dm.log(line)
        sys.stderr.write(line + "\n")
    return run_dir, cfg, dm, lock_fd


def arm(args):
    """Arm a detached dead-man for ARGS (deadman.py arm's options) -> (pid, config). The caller may be another
    tool (launcher.py arms in its own process): the watcher is a double fork of the caller, no new interpreter."""
    args.foreground = False
    _run_dir, cfg, dm, lock_fd = armed(args)
    try:
        pid = detach_and_run(dm, lock_fd)
    except RuntimeError as exc:
        raise core.CheckFailed("the detached dead-man failed to start: %s (see %s)" % (exc, dm.p("deadman.log")))
    finally:
        os.close(lock_fd)   # the watcher holds its own copy of the lock
    return pid, cfg


def cmd_arm(args):
    if not args.foreground:
        pid, cfg = arm(args)
        if args.json:
            core.emit_json({"pid": pid, "run_dir": os.path.abspath(args.run_dir), "state": "armed", "config": cfg})
        else:
            print(pid)
            sys.stderr.write("dead-man armed (pid %d) on %s; stop: %s\n"
                             % (pid, os.path.abspath(args.run_dir), cfg["stop_cmd"] or cfg["fallback_stop_cmd"] or "NONE"))
        return 0
    run_dir, cfg, dm, _lock_fd = armed(args)   # the lock stays held by this process while it watches
    signal.signal(signal.SIGUSR1, dm.on_wake)
    dm.write_state()
    if args.json:
        core.emit_json({"pid": os.getpid(), "run_dir": run_dir, "state": "armed", "foreground": True, "config": cfg})
    return dm.loop()


def retire_old_evidence(run_dir, log):
    """A new arming starts clean: an old disarm ACK or fired record would mislead it and run_status."""
    ack = core.read_json(os.path.join(run_dir, "ACK"))
    if ack.get("disarm") is True:
        os.unlink(os.path.join(run_dir, "ACK"))
        log("removed a disarm ACK left by an earlier dead-man")
    fired = os.path.join(run_dir, FIRED_FILE)
    if os.path.exists(fired):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        os.replace(fired, os.path.join(run_dir, "DEADMAN_FIRED.%s.json" % stamp))
        log("kept the earlier firing record as DEADMAN_FIRED.%s.json" % stamp)



def write_ack(run_dir, doc):
    """Write the ACK and wake a live dead-man so it takes effect now (a resume waits for the hand-over)."""
    core.atomic_write_json(os.path.join(run_dir, "ACK"), doc)
    live = live_deadman(run_dir)
    if live:
        try:
            os.kill(live, signal.SIGUSR1)
        except OSError:
            pass


def disarm(run_dir):
    write_ack(run_dir, {"disarm": True, "at": stamp()})


def cmd_ack(args):
    run_dir = run_dir_arg(args)
    if args.disarm:
        doc = {"disarm": True, "at": stamp()}
        msg = "disarm requested: the dead-man is woken and exits now"
    else:
        minutes = args.postpone_minutes
        if minutes is None:
            minutes = core.deadman_state(run_dir, check_alive=False)["config"].get("grace_minutes")
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 <= minutes < 1e9:
                minutes = 15.0   # deadman.json is damaged or from elsewhere: the documented default
        until = time.time() + minutes * 60
        doc = {"until": until, "at": stamp()}
        msg = "postponed until %s (%g min)" % (stamp(until), minutes)
    write_ack(run_dir, doc)
    if args.json:
        core.emit_json(doc)
    else:
        print("ACK %s" % msg)
    return 0


def cmd_status(args):
    run_dir = run_dir_arg(args)
    st = core.deadman_state(run_dir)
    doc = core.read_json(os.path.join(run_dir, STATE_FILE)) or None
    fired, cfg = st["fired"], st["config"]
    ack = core.read_json(os.path.join(run_dir, "ACK")) or None
    counted = ssh_sessions(user=cfg.get("ssh_user") or None)
    word = st["word"]
    if word == "FIRED":
        rc = 7
        fired = fired or {}
        if fired.get("dry_run"):   # a dry run stops nothing by design: never "stop_ok=False" (finding R15)
            line = "reason=%s at %s DRY RUN (nothing was stopped)%s" % (
                fired.get("reason"), fired.get("fired_at"),
                ": would run %s" % json.dumps(fired["would_run"]) if fired.get("would_run") else
                ": %s" % (fired.get("message") or "no stop command"))
        elif fired.get("ok") is False and not fired.get("attempts") and not any(
                fired.get(k) for k in ("refused", "message", "error", "fallback", "last_resort_rc")):
            # finding N4: the job's stop signal and sync come first; no attempt has failed yet
            line = "reason=%s at %s stop pending (no stop attempt has run yet)" % (fired.get("reason"),
                                                                                 fired.get("fired_at"))
        else:
            line = "reason=%s at %s stop_ok=%s %s" % (fired.get("reason"), fired.get("fired_at"), fired.get("ok"),
                                                       fired.get("refused") or fired.get("message") or "")
    elif word == "NONE":
        rc, line = 1, "no dead-man was armed for this run dir: nothing will stop the meter"
    elif word == "ARMED":
        rc = 0
        line = "pid=%s since %s stall=%sm grace=%sm cap=%s stop=%s%s" % (
            st["pid"], st["armed_at"], cfg.get("stall_minutes"), cfg.get("grace_minutes"),
            ("%gh" % cfg["max_hours"]) if isinstance(cfg.get("max_hours"), (int, float)) and cfg["max_hours"]
            else "off",
            json.dumps(cfg.get("stop_cmd") or cfg.get("fallback_stop_cmd")),
            " (dry run)" if cfg.get("dry_run") else "")
        until = (ack or {}).get("until")
        if isinstance(until, (int, float)) and not isinstance(until, bool) and until > time.time():
            line += " postponed-until=%s" % stamp(until)
        if cfg.get("wait_ssh"):
            problem = sessions.idle_problem(ssh_sessions(user=cfg.get("ssh_user")), cfg.get("ssh_idle_minutes"))
            line += " ssh-user=%s%s" % (cfg.get("ssh_user") or "*", (" -- " + problem) if problem else "")
    elif word == "DOWN":
        rc = 1
        line = "deadman.json says armed but pid %s is gone (or is another process now): nothing watches this " \
               "run; re-arm it" % st["pid"]
    else:
        rc, line = 1, "pid %s is not watching (state %s)" % (st["pid"], st["state"])
    out = {"run_dir": run_dir, "status": word, "watching": st["watching"], "alive": st["alive"],
           "deadman": doc, "fired": st["fired"], "ack": ack, "toolkit_version": core.toolkit_version(),
           "ssh_sessions": len(counted) if counted is not None else None,
           "ssh_idle_problem": sessions.idle_problem(counted, cfg.get("ssh_idle_minutes")) if cfg.get("wait_ssh")
           else None}
    if args.json:
        core.emit_json(out)
    else:
        print("%s %s" % (word, line))
    return rc


def build_parser():
    codes = core.exit_codes_epilog(__doc__)
    top = core.Parser(prog="deadman.py", description=core.help_description(__doc__), formatter_class=core.RawHelp,
                      epilog="Run `deadman.py arm --help` for every option.\n\n" + codes)
    sub = top.add_subparsers(dest="cmd", parser_class=core.Parser)

    arm = sub.add_parser("arm", help="start watching a run dir (detaches unless --foreground)",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(
                             ok="armed (with --foreground: fired and the stop ran and was not disproved, a dry run "
                                "that found a command, or disarmed)",
                             fail="(--foreground) fired, and the stop failed, was not confirmed or refused, or no "
                                  "stop command exists",
                             refused="a live dead-man already watches this run dir, the stop cannot run "
                                     "here, or the notify config is refused"))
    arm.add_argument("--run-dir", required=True, help="the run dir to watch (DURABLE/runs/RUN_ID)")
    arm.add_argument("--profile", help="read METER_STOP_CMD/METER_STOP_DESTRUCTIVE from this profile "
                                       "(default: the profile in run.json)")
    arm.add_argument("--stop-cmd", help="argv string run to stop the meter (overrides the profile; $VAR allowed)")
    arm.add_argument("--stop-cmd-destructive", action="store_true", help="--stop-cmd deletes data")
    add_watch_options(arm)
    arm.add_argument("--job-pid", type=int, help="watch this pid when status.json has none")
    arm.add_argument("--notify-refused-ok", action="store_true",
                     help="arm even when the notify config is refused, with a warning (the boot sweep's re-arm)")
    arm.add_argument("--foreground", action="store_true", help="do not detach (tests, debugging)")
    arm.add_argument("--json", action="store_true", help="print the armed dead-man as JSON")

    ack = sub.add_parser("ack", help="postpone (default: by the armed grace) or disarm", formatter_class=core.RawHelp,
                         epilog=core.exit_codes_epilog(ok="the ACK is written", fail=None, refused=None))
    ack.add_argument("--run-dir", required=True, help="the run dir whose dead-man to acknowledge")
    group = ack.add_mutually_exclusive_group()
    group.add_argument("--postpone-minutes", type=fnum(), help="no firing before now + M minutes")
    group.add_argument("--disarm", action="store_true", help="the dead-man exits cleanly")
    ack.add_argument("--json", action="store_true", help="print the ACK written as JSON")

    st = sub.add_parser("status", help="is a dead-man watching this run? (0 armed, 1 nothing, 7 fired)",
                        formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(
                            ok="armed and alive", fail="nothing watches (NONE, DOWN, EXITED, DISARMED)",
                            refused=None, extra="7 it fired"))
    st.add_argument("--run-dir", required=True, help="the run dir to ask about")
    st.add_argument("--json", action="store_true", help="print every field as JSON")
    return top


def main(argv=None):
    core.check_toolkit()
    return run_command(build_parser(), "cmd", {"arm": cmd_arm, "ack": cmd_ack, "status": cmd_status}, argv)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="deadman.py"))
