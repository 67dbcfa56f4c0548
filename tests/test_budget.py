"""A budget per run (issue 37): the cap counts from the run's first start across attempts, re-arms and reboots,
on the node (the dead-man's budget clock, RUN_DIR/budget.json) and on the laptop with one formula.

Findings: redteam-2026-12-05-laptop.md L6 = redteam-2026-12-05-node.md C6 = design-review-2026-12-05.md D6.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import NODE, SCRIPTS, wait_for
from watch_fixture import DEADMAN, POLL, running_status, stand_in

sys.path.insert(0, str(NODE))
sys.path.insert(0, str(SCRIPTS))
import deadman  # noqa: E402
import ledger  # noqa: E402
import rgt  # noqa: E402
import runrec  # noqa: E402

QUIET_DISK = ("--disk-floor-gb", "0", "--disk-floor-inodes", "0")


def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def pids():
    """Process groups this test started; each is ended (by its id) afterwards."""
    started = []
    yield started
    for pid in started:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def new_attempt(run, pids):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                           stdin=subprocess.DEVNULL)
    pids.append(job.pid)
    running_status(run, job, run_id="bud1")
    return job


def arm(run, pids, *args):
    res = subprocess.run([sys.executable, DEADMAN, "arm", "--run-dir", str(run), *args], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.strip())
    pids.append(pid)
    assert wait_for(lambda: (read(run / "lease.json").get("deadman") or {}).get("pid") == pid and
                    read(run / "lease.json")["deadman"]["evaluations"] >= 1, 60), "the dead-man never checked"
    return pid


def kill_the_box(run, job, dm_pid):
    """Everything on the box dies at once by SIGKILL: the job and its dead-man (a crash, an OOM, a reboot)."""
    for pid in (job.pid, dm_pid):
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
    job.wait(10)
    assert wait_for(lambda: not os.path.exists("/proc/%d" % dm_pid) or
                    open("/proc/%d/stat" % dm_pid).read().rsplit(")", 1)[1].split()[0] == "Z", 30)


@pytest.mark.drill("budget holds across re-arms and reboots")
def test_finding_node_C6_drill_the_budget_holds_across_three_resumes_and_a_reboot(tmp_path, pids):
    """Budget 0.1 at 36/h (the cap: 9.72 s). Attempt 1, then the box's processes are killed and the run resumed
    three times, then a reboot re-arms from deadman.json as boot_resume does: the stop comes at most
    1.05 x the budget's time + one poll after the run's FIRST start (before: each arming got the whole budget)."""
    run = tmp_path / "run"
    run.mkdir()
    calls = tmp_path / "stop.calls"
    stop = tmp_path / "stop.sh"
    stop.write_text('#!/bin/sh\ndate +%%s.%%N >> "%s"\n' % calls)   # when the stop ran, to the nanosecond
    stop.chmod(0o755)
    argv = ["--poll-seconds", POLL, "--budget-usd", "0.1", "--rate-per-hour", "36", "--stall-minutes", "0",
            "--grace-minutes", "600", "--stop-cmd", str(stop), *QUIET_DISK]
    job = new_attempt(run, pids)
    dm = arm(run, pids, *argv)
    clock = read(run / "budget.json")
    first = clock["first_start"]
    assert (clock["budget_usd"], clock["rate_per_hour"], clock["suspended_s"]) == (0.1, 36.0, 0.0)
    for _resume in range(3):
        kill_the_box(run, job, dm)
        job = new_attempt(run, pids)
        dm = arm(run, pids, *argv)
        assert read(run / "budget.json")["first_start"] == first   # every arming carries the run's clock on
    assert wait_for(lambda: time.time() - first >= 2.0, 30)         # the reboot comes well into the budget
    kill_the_box(run, job, dm)
    reboot_argv = deadman.cfg_to_argv(read(run / "deadman.json")["config"])
    job = new_attempt(run, pids)
    arm(run, pids, *reboot_argv)
    assert wait_for(lambda: (run / "DEADMAN_FIRED.json").exists(), 60), "the budget never fired"
    fired = read(run / "DEADMAN_FIRED.json")
    budget_s = 0.1 / 36 * 3600
    assert fired["reason"] == "max_hours" and "since the run's first start" in fired["detail"], fired
    assert wait_for(lambda: calls.exists() and len(calls.read_text().splitlines()) == 1, 30)
    stopped_after = float(calls.read_text().split()[0]) - first
    assert stopped_after <= 1.05 * budget_s + float(POLL), (stopped_after, fired)


def test_finding_node_C6_suspended_time_is_subtracted_and_kept(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    clock, error = runrec.start_budget(str(run), 10.0, 2.0, 1000.0)
    assert error is None and clock == {"first_start": 1000.0, "suspended_s": 0.0, "budget_usd": 10.0,
                                       "rate_per_hour": 2.0}
    assert runrec.add_suspended(str(run), clock, 1800.0) is None
    again, _ = runrec.start_budget(str(run), 10.0, 2.0, 5000.0)     # a later arming: the same clock
    assert again["first_start"] == 1000.0 and again["suspended_s"] == 1800.0
    assert runrec.budget_spent_hours(again, 1000.0 + 7200) == 1.5   # 2 h since the first start, 0.5 h asleep


def test_finding_review_D6_one_formula_on_the_node_and_the_laptop(tmp_path):
    """The laptop's cost so far is the node's clock (copied into the ledger by status, via the lease) x the rate,
    and status shows that one cost with its basis; without the node's clock, the ledger's first launch."""
    first = ledger.core.parse_iso("2026-12-05T00:00:00Z")
    node_clock = {"first_start": first + 60, "suspended_s": 600.0, "budget_usd": 90.0, "rate_per_hour": 3600.0}
    launch = {"event": "launch", "host": "gpu", "box": "u@h:22", "run_id": "bud1", "state": "launched",
              "time": "2026-12-05T00:00:00Z", "rate_per_hour": 3600.0, "max_cost": 90.0}
    status = {"event": "status", "host": "gpu", "box": "u@h:22", "run_id": "bud1", "state": "running",
              "time": "2026-12-05T01:00:00Z", "lease": {"budget": node_clock}, "budget": node_clock}
    now = first + 3600
    from_node = ledger.cost_so_far([launch, status], "gpu", "bud1", now=now, box="u@h:22")
    assert from_node["hours"] == round(runrec.budget_spent_hours(node_clock, now), 4) == 0.8167
    assert from_node["cost"] == pytest.approx(3600 * runrec.budget_spent_hours(node_clock, now))
    assert "the node's budget clock" in from_node["basis"] and "10m suspended" in from_node["basis"]
    from_ledger = ledger.cost_so_far([launch], "gpu", "bud1", now=now, box="u@h:22")
    assert from_ledger["cost"] == 3600.0 and from_ledger["basis"] == "since the first launch, from the ledger"
    # status: one cost, its basis; the node's own "cost ~X over Y" (job time x rate) is not shown beside it
    shown = {"line": "RUNNING bud1 step 5 cost ~12.00 over 12s toolkit abc", "cost_so_far": 12.0}
    rgt.one_cost(shown, from_node)
    assert shown["line"] == "RUNNING bud1 step 5 toolkit abc" and shown["cost_so_far"] == from_node["cost"]
    assert shown["cost_basis"] == from_node["basis"] and shown["cost_from_ledger"]["line"].count("cost so far") == 1


def test_finding_review_D6_the_dead_man_lease_carries_the_budget_clock(tmp_path, pids):
    run = tmp_path / "run"
    run.mkdir()
    stop, _calls = stand_in(tmp_path)
    new_attempt(run, pids)
    arm(run, pids, "--poll-seconds", POLL, "--budget-usd", "50", "--rate-per-hour", "2", "--stall-minutes", "0",
        "--grace-minutes", "600", "--stop-cmd", stop, *QUIET_DISK)
    lease = read(run / "lease.json")
    clock = read(run / "budget.json")
    assert lease["budget"] == {k: clock[k] for k in ("first_start", "suspended_s", "budget_usd", "rate_per_hour")}
    view = runrec.lease_view(lease, time.time())
    assert view["budget"] == lease["budget"]
    deadline = ledger.core.parse_iso(lease["budget_deadline"])
    assert abs(deadline - (clock["first_start"] + 25 * 3600)) <= 1
