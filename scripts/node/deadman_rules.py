#!/usr/bin/env python3
"""deadman_rules.py: the dead-man's run rules, pure functions of a run's facts that read no clock, file or process.

deadman.py reads the facts at each check (status.json, the job's liveness, its progress clock, the ACK, the
other runs on the box, the SSH sessions) and asks these rules what they mean; a rule never reads anything
itself, so each is table-tested without a process (tests/test_deadman_rules.py). Times are seconds on the
caller's monotonic clock.

  job_phase, why_over    is the job running, over, gone or never started, or its record unreadable (a torn
                         status.json is never "no job": finding A7)
  winding_down           the job is over and its supervisor syncs or waits on leftover group members (A3)
  quiet_since, wind_down_limit, stall_rule    how long the run has been quiet, the limit while the supervisor
                         winds down, and whose stop a stall is: the run's job or the box (finding R3)
  cap_rule               a run's cap is the run's: the box, this run only, or hold the box stop (finding C2)
  split_neighbours       the other runs that hold the box stop off: watched AND progressing
  idle_since, grace_rule, ended_candidate     the grace after the job ended, and what holds it off (R11)
  postpone_until         the wall time an ACK postpones the firing to
  disk_state             disk_low with hysteresis
  budget_warn_in         seconds until budget_80

A library: imported by deadman.py and watcher.py, never run. Python 3.8+; it imports nothing (test_import_graph.py holds
it to that), so a rule cannot reach for a file or a process.
"""

WIND_DOWN_SECONDS = 95.0     # the supervisor's own bound on leftover group members (60 + 30 + 5 s)
DISK_RECOVER = 1.1           # a low disk counts as recovered only this far above its floor (hysteresis)
BUDGET_WARN_SHARE = 0.8      # budget_80: this share of the hours the budget buys has passed


def job_phase(unreadable, ended, job_alive, helper_alive, active_state, job_pid):
    """What the run's job is doing: 'unreadable' (status.json cannot be read: held as a live job), 'ended'
    (ENDED: its state is terminal), 'running' (the job is alive, or a launcher or supervisor is alive while the
    state is active or not yet written: ACTIVE_STATE), 'gone' (a job pid was recorded and nothing of it lives),
    or 'none' (nothing was ever started)."""
    if unreadable:
        return "unreadable"
    if ended:
        return "ended"
    if job_alive or (helper_alive and active_state):
        return "running"
    return "gone" if job_pid else "none"


def why_over(phase, state, exit_code, job_pid):
    """The words a job_ended firing gives for PHASE, or None while the job runs or never ran."""
    if phase == "ended":
        return "job %s (exit %s)" % (state, exit_code)
    if phase == "gone":
        return "job pid %s is gone and no supervisor is alive (state %s)" % (job_pid, state)
    return None


def winding_down(phase, job_alive, helper_alive, state, waiting_for_group):
    """The job is over but its supervisor lives on, syncing or waiting on leftover members of the job's process
    group: neither writes a heartbeat, and a box stop now would lose the sync."""
    return phase == "running" and not job_alive and bool(helper_alive) and (
        state == "syncing" or bool(waiting_for_group))


def quiet_since(progress_at, resumed_at, armed_at):
    """When the run last showed progress: its last heartbeat/log change, a resume from suspend, or arming."""
    return max(progress_at, resumed_at or armed_at)


def wind_down_limit(stall_minutes, sync_wait_seconds):
    """The stall limit while the supervisor winds down: at least its own bounded wait plus the sync wait."""
    return max(stall_minutes * 60, sync_wait_seconds + WIND_DOWN_SECONDS)


def stall_rule(stalled, holding, job_alive, job_pid, stopped_job):
    """A stalled run: None (not stalled), 'run' (stop only this run's job: another watched run still trains),
    'box' (no other run holds the box), or 'hold' (this job was already stopped; the box waits for the others)."""
    if not stalled:
        return None
    if holding and job_alive and job_pid and stopped_job != job_pid:
        return "run"
    return "hold" if holding else "box"


def cap_rule(holding, run_stopped, postponed):
    """A run past its cap: 'box' (no other watched run progresses), 'run' (stop this run's job once and leave
    the box on), or 'hold' (this run is already stopped, or an ACK postpones: the box stop waits)."""
    if not holding:
        return "box"
    return "run" if not run_stopped and not postponed else "hold"


def split_neighbours(found):
    """(names of the runs holding the box stop off, descriptions of those that do not) from runrec's
    active_neighbours: a run holds it off only while a dead-man watches it AND it progresses."""
    holding = [n["name"] for n in found if n["watched"] and n["progressing"]]
    ignored = ["%s (%s)" % (n["name"], "not progressing" if n["watched"] else "no dead-man watches it")
               for n in found if not (n["watched"] and n["progressing"])]
    return holding, ignored


def idle_since(ended_at, armed_at, others_released, last_ssh, resumed_at):
    """Where the job-end grace starts: the job's end (else arming), never before the other runs stopped
    holding the box (finding R11), the last SSH session that held it, or a resume from suspend."""
    since = ended_at if ended_at is not None else armed_at
    for later in (others_released, last_ssh, resumed_at):
        if later is not None:
            since = max(since, later)
    return since


def grace_rule(idle_for, grace_minutes, holding):
    """'hold' (another run or an SSH session holds the firing off), 'fire' (the grace ran out), else 'wait'."""
    if holding:
        return "hold"
    return "fire" if idle_for >= grace_minutes * 60 else "wait"


def ended_candidate(over, grace_minutes, ssh_capped_minutes=None):
    """(reason, detail) of the firing once the grace ran out: job_ended with why it is OVER, or no_job."""
    capped = " (SSH wait capped at %g min)" % ssh_capped_minutes if ssh_capped_minutes is not None else ""
    if over:
        return "job_ended", "%s; no ACK within %g min%s" % (over, grace_minutes, capped)
    return "no_job", "no job, launcher or supervisor seen for %g min%s" % (grace_minutes, capped)


def postpone_until(ack):
    """The wall time an ACK postpones the firing to, or None (no until, or not a number)."""
    until = ack.get("until")
    if isinstance(until, (int, float)) and not isinstance(until, bool) and until == until:
        return until
    return None


def disk_state(was_low, free_bytes, free_inodes, floor_bytes, floor_inodes):
    """(low now, tell now). A filesystem is low when its free bytes or free inodes (None: not reported) are
    under their floor; once low it stays low until both are at least DISK_RECOVER times their floor, so a disk
    that hovers at the floor sends one message, not one per poll. TELL is true on the look it turns low."""
    under = free_bytes < floor_bytes or (free_inodes is not None and free_inodes < floor_inodes)
    if not was_low:
        return under, under
    clear = free_bytes >= floor_bytes * DISK_RECOVER and (
        free_inodes is None or free_inodes >= floor_inodes * DISK_RECOVER)
    return not clear, False


def budget_warn_in(budget_hours, elapsed_s):
    """Seconds until BUDGET_WARN_SHARE of the hours a budget buys are spent (<= 0: tell budget_80 now)."""
    return budget_hours * 3600 * BUDGET_WARN_SHARE - elapsed_s
