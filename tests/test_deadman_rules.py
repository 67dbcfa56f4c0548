"""deadman_rules.py, the dead-man's run rules, as tables: each row a run's facts and what the rule decides.

No process, file or clock: the rules take the facts deadman.py reads (times are seconds on its monotonic
clock). The dead-man as a process, deciding the same way, is in test_deadman.py, test_watchers.py and
test_run_cap.py."""
import sys

import pytest

from conftest import NODE

sys.path.insert(0, str(NODE))
import deadman_rules as rules  # noqa: E402

H = 3600.0


# (unreadable, ended, job_alive, helper_alive, active_state, job_pid) -> phase
@pytest.mark.parametrize("facts,phase", [
    (("torn json", False, False, False, False, None), "unreadable"),   # A7: never "no job"
    (("torn json", True, True, True, True, 42), "unreadable"),
    ((None, True, False, False, False, 42), "ended"),
    ((None, True, True, True, True, 42), "ended"),                     # the record says over: over
    ((None, False, True, False, False, 42), "running"),
    ((None, False, False, True, True, 42), "running"),                 # the supervisor between attempts
    ((None, False, False, True, False, 42), "gone"),                   # a helper alive in a state not active
    ((None, False, False, False, True, 42), "gone"),
    ((None, False, False, True, True, None), "running"),               # the launcher before the job starts
    ((None, False, False, False, True, None), "none"),
])
def test_finding_review_D8_job_phase_table(facts, phase):
    assert rules.job_phase(*facts) == phase


@pytest.mark.parametrize("phase,expected", [
    ("ended", "job failed (exit 3)"),
    ("gone", "job pid 42 is gone and no supervisor is alive (state running)"),
    ("running", None), ("unreadable", None), ("none", None),
])
def test_why_over(phase, expected):
    state = "failed" if phase == "ended" else "running"
    assert rules.why_over(phase, state, 3, 42) == expected


# (phase, job_alive, helper_alive, state, waiting_for_group) -> the supervisor winds down
@pytest.mark.parametrize("facts,expected", [
    (("running", False, True, "syncing", None), True),
    (("running", False, True, "running", True), True),     # waiting on leftover group members
    (("running", False, True, "running", False), False),
    (("running", True, True, "syncing", None), False),     # the job itself still lives
    (("running", False, False, "syncing", None), False),   # nobody left to sync
    (("unreadable", False, True, "syncing", None), False),
    (("ended", False, True, "syncing", True), False),
])
def test_winding_down_table(facts, expected):
    assert rules.winding_down(*facts) is expected


def test_quiet_since_and_the_wind_down_limit():
    assert rules.quiet_since(100.0, None, 50.0) == 100.0
    assert rules.quiet_since(100.0, 300.0, 50.0) == 300.0      # a resume from suspend restarts the clock
    assert rules.quiet_since(10.0, None, 50.0) == 50.0         # never before arming
    assert rules.wind_down_limit(30, 300) == 30 * 60           # the stall limit when it is longer
    assert rules.wind_down_limit(1, 300) == 300 + rules.WIND_DOWN_SECONDS


# (stalled, holding, job_alive, job_pid, stopped_job) -> whose stop a stall is
@pytest.mark.parametrize("facts,decision", [
    ((False, ["b"], True, 42, None), None),
    ((True, [], True, 42, None), "box"),
    ((True, [], False, 42, None), "box"),          # the job is gone, its supervisor hangs: the box
    ((True, ["b"], True, 42, None), "run"),        # R3: stop this run's job, the box stays on for b
    ((True, ["b"], True, 42, 42), "hold"),         # this job was already stopped: wait for b
    ((True, ["b"], True, 43, 42), "run"),          # a later attempt's job stalls too: its own stop
    ((True, ["b"], False, 42, None), "hold"),      # no live job to stop; b still trains
])
def test_finding_review_D8_stall_rule_table(facts, decision):
    assert rules.stall_rule(*facts) == decision


# (holding, run_stopped, postponed) -> what a run's cap stops
@pytest.mark.parametrize("facts,decision", [
    (([], False, False), "box"),
    (([], True, False), "box"),                    # the last other run is done: now the box
    (([], False, True), "box"),                    # (an ACK postpones the box stop later, as any firing)
    ((["b"], False, False), "run"),                # C2: this run only, the box stays on for b
    ((["b"], True, False), "hold"),
    ((["b"], False, True), "hold"),
])
def test_finding_review_D8_cap_rule_table(facts, decision):
    assert rules.cap_rule(*facts) == decision


def test_split_neighbours_holds_only_for_watched_and_progressing_runs():
    found = [{"name": "a", "watched": True, "progressing": True},
             {"name": "b", "watched": True, "progressing": False},
             {"name": "c", "watched": False, "progressing": True}]
    assert rules.split_neighbours(found) == (["a"], ["b (not progressing)", "c (no dead-man watches it)"])
    assert rules.split_neighbours([]) == ([], [])


# (ended_at, armed_at, others_released, last_ssh, resumed_at) -> where the grace starts
@pytest.mark.parametrize("facts,since", [
    ((None, 10.0, None, None, None), 10.0),        # never ran: from arming
    ((50.0, 10.0, None, None, None), 50.0),
    ((50.0, 10.0, 80.0, None, None), 80.0),        # R11: from when the other runs were first seen gone
    ((50.0, 10.0, 80.0, 90.0, None), 90.0),        # the last SSH session that held it
    ((50.0, 10.0, None, None, 120.0), 120.0),      # a resume from suspend
    ((50.0, 10.0, 20.0, 30.0, 40.0), 50.0),        # never before the job's end
])
def test_idle_since_table(facts, since):
    assert rules.idle_since(*facts) == since


@pytest.mark.parametrize("idle_for,holding,decision", [
    (0.0, False, "wait"), (899.9, False, "wait"), (900.0, False, "fire"), (10 * H, True, "hold"),
])
def test_grace_rule_table(idle_for, holding, decision):
    assert rules.grace_rule(idle_for, 15.0, holding) == decision


def test_ended_candidate_words():
    assert rules.ended_candidate("job failed (exit 1)", 15.0) == (
        "job_ended", "job failed (exit 1); no ACK within 15 min")
    assert rules.ended_candidate(None, 0.5, 60.0) == (
        "no_job", "no job, launcher or supervisor seen for 0.5 min (SSH wait capped at 60 min)")


@pytest.mark.parametrize("ack,until", [
    ({}, None), ({"until": 1.7e9}, 1.7e9), ({"until": 5}, 5), ({"until": True}, None),
    ({"until": "tomorrow"}, None), ({"until": float("nan")}, None), ({"disarm": True}, None),
])
def test_postpone_until_table(ack, until):
    assert rules.postpone_until(ack) == until


GB = 1 << 30


@pytest.mark.parametrize("was_low,free,inodes,expected", [
    (False, 20 * GB, 50000, (False, False)),
    (False, 5 * GB, 50000, (True, True)),          # turns low: tell once
    (True, 10.5 * GB, 50000, (True, False)),       # at the floor but not 10% above it: still low, quiet
    (True, 11 * GB, 50000, (False, False)),        # recovered
    (False, 20 * GB, 10, (True, True)),            # inodes count too
    (False, 20 * GB, None, (False, False)),        # inodes not reported
])
def test_disk_state_table(was_low, free, inodes, expected):
    assert rules.disk_state(was_low, free, inodes, 10 * GB, 10000) == expected


def test_budget_warn_in():
    assert rules.budget_warn_in(10.0, 0) == 8 * H           # budget_80 at 80% of the hours the budget buys
    assert rules.budget_warn_in(10.0, 8 * H) == 0
    assert rules.budget_warn_in(10.0, 9 * H) < 0
