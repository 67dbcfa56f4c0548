"""A budget per run (issue 37): the cap counts from the run's first start across attempts, re-arms and reboots,
on the node (the dead-man's budget clock, RUN_DIR/budget.json) and on the laptop with one formula. A spent run is
not resumed (`rgt.py resume` refuses, the boot sweep re-arms instead of relaunching) until `resume --max-cost`
raises its cap; the drill goes through the real commands. Also the providers' attachment fields billing reads.

Findings: redteam-2026-12-05-laptop.md L6 = redteam-2026-12-05-node.md C6 = design-review-2026-12-05.md D6.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, kill_everything_of, kill_group_of, wait_for
from watch_fixture import DEADMAN, POLL, running_status, stand_in

sys.path.insert(0, str(NODE))
sys.path.insert(0, str(SCRIPTS))
import deadman  # noqa: E402
import ledger  # noqa: E402
import rgt  # noqa: E402
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402

QUIET_DISK = ("--disk-floor-gb", "0", "--disk-floor-inodes", "0")


def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@pytest.fixture
def pids(tmp_path):
    """Process groups this test started (each runs from its tmp_path); each still running from there is ended."""
    started = []
    yield started
    for pid in started:
        kill_group_of(pid, tmp_path)


def new_attempt(run, pids):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                           stdin=subprocess.DEVNULL, cwd=str(run))
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


def test_finding_laptop_L6_and_review_D6_one_formula_on_the_node_and_the_laptop(tmp_path):
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


# ---------------------------------------------------------------- the drill through the real commands

def rgt_cmd(tmp_path, server, *args):
    from sshd_fixture import rgt as run_rgt
    return run_rgt(tmp_path, server, *args)


def stop_times(calls):
    return [float(line) for line in calls.read_text().split()] if calls.exists() else []


@pytest.mark.long
@pytest.mark.drill("budget holds across re-arms and reboots")
def test_finding_review_D6_drill_through_rgt_resume_the_budget_holds_and_a_spent_run_is_refused(
        tmp_path, sshd_server):
    """Through the real commands: `rgt.py launch --max-cost 0.3` at 18/h (60 s: room for the resumes on a loaded box), the box's processes killed and
    `rgt.py resume` three times, a reboot (every process killed, boot_resume's sweep relaunches the
    --auto-resume run): the stop comes at most 1.05 x the budget + one poll after the run's first start. A
    fourth `rgt.py resume` is refused (exit 3, one line: spent, cap, currency, the way on); --max-cost at or
    below the spent amount is refused; above it the run goes on, the new cap is recorded on the node and in
    the ledger, and the new attempt's dead-man stops the box at the NEW cap. Before: no resume was ever
    refused for money, and each arming got the whole budget again."""
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    calls = tmp_path / "stop.calls"
    stop = tmp_path / "stop.sh"
    stop.write_text('#!/bin/sh\ndate +%%s.%%N >> "%s"\n' % calls)   # when each stop ran
    stop.chmod(0o755)
    run = durable / "runs" / "bud-rgt"
    rate, cap, poll = 18.0, 0.3, 0.1
    assert rgt_cmd(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt_cmd(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "bud-rgt",
                  "--durable-dir", str(durable), "--cwd", str(work), "--rate-per-hour", str(rate), "--max-cost",
                  str(cap), "--", "--auto-resume", "--max-attempts", "10", "--poll-seconds", str(poll),
                  "--deadman-arg", "--stop-cmd", "--deadman-arg", str(stop),
                  "--", "python3", "-c", "import time; time.sleep(600)")
    assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: read(run / "budget.json").get("first_start"), 60), "no budget clock"
    first = read(run / "budget.json")["first_start"]
    for attempt in (2, 3, 4):
        assert wait_for(lambda: read(run / "status.json").get("state") == "running", 60)
        kill_everything_of(run)                       # the box's job, supervisor and dead-man, by SIGKILL
        again = rgt_cmd(tmp_path, sshd_server, "resume", "gpu-box", "bud-rgt")
        assert again.returncode == 0 and "as attempt %d" % attempt in again.stdout, again.stdout + again.stderr
    assert wait_for(lambda: read(run / "status.json").get("state") == "running", 60)
    kill_everything_of(run)                           # a reboot: then the boot hook's sweep
    boot = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--runs-dir", str(durable / "runs"),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert [(r["action"], r["attempt"]) for r in json.loads(boot.stdout)["runs"]] == [("resumed", 5)], boot.stdout
    assert time.time() - first < cap / rate * 3600, "the drill came too late: the budget was spent before the reboot"
    assert wait_for(lambda: stop_times(calls), 60), "the budget never stopped the box"
    budget_s = core.budget_hours(cap, rate) * 3600
    assert stop_times(calls)[0] - first <= 1.05 * budget_s + poll, (stop_times(calls), first)
    assert read(run / "budget.json")["first_start"] == first
    fired = read(run / "DEADMAN_FIRED.json")
    assert fired["reason"] == "max_hours" and "since the run's first start" in fired["detail"], fired
    assert wait_for(lambda: read(run / "status.json").get("state") in ("interrupted", "failed"), 60)

    refused = rgt_cmd(tmp_path, sshd_server, "resume", "gpu-box", "bud-rgt")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert len(refused.stdout.strip().splitlines()) == 1, refused.stdout
    line = refused.stdout.strip()
    assert line.startswith("FAIL bud-rgt: refused (budget spent: ") and "of its 0.3 USD cap" in line, line
    assert "--max-cost" in line, line
    spent = read(run / "budget.json")
    spent_now = runrec.budget_spent_usd(spent, time.time())
    assert spent_now >= cap and "raised" not in spent
    low = rgt_cmd(tmp_path, sshd_server, "resume", "gpu-box", "bud-rgt", "--max-cost", "0.3")
    assert low.returncode == 3 and "does not exceed" in low.stdout, low.stdout + low.stderr
    dry = rgt_cmd(tmp_path, sshd_server, "resume", "gpu-box", "bud-rgt", "--max-cost", "0.9", "--dry-run")
    assert dry.returncode == 0 and "would set the run's budget to 0.9 USD" in dry.stdout, dry.stdout + dry.stderr
    assert read(run / "budget.json") == spent                   # a dry run changes no cap
    new_cap = round(spent_now + 0.1, 4)                         # 20 s more at 18/h: the resume's trip fits
    more = rgt_cmd(tmp_path, sshd_server, "resume", "gpu-box", "bud-rgt", "--max-cost", str(new_cap))
    assert more.returncode == 0 and "as attempt 6" in more.stdout, more.stdout + more.stderr
    assert "budget:     the run's cap is now %s USD (was 0.3;" % core.money(new_cap) in more.stdout, more.stdout
    clock = read(run / "budget.json")
    assert clock["first_start"] == first and clock["budget_usd"] == new_cap
    assert [(r["from"], r["to"]) for r in clock["raised"]] == [(cap, new_cap)] and clock["raised"][0]["spent"] >= cap
    rows = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    resumes = [r for r in rows if r["event"] == "resume"]
    assert [r["state"] for r in resumes] == ["launched"] * 3 + ["resume_refused"] * 2 + ["launched"]
    assert resumes[-1]["max_cost"] == new_cap and resumes[-1]["budget_raised"]["from"] == cap
    assert ledger.find_run(ledger.fold(rows)[0], "bud-rgt", host="gpu-box")["max_cost"] == new_cap
    # the new attempt's dead-man holds the new cap (not the launch's 0.3): the next stop comes at it
    assert wait_for(lambda: len(stop_times(calls)) >= 2, 60), "the raised budget never stopped the box"
    new_s = core.budget_hours(new_cap, rate) * 3600
    assert new_s * 0.95 <= stop_times(calls)[1] - first <= 1.05 * new_s + poll, (stop_times(calls), first)
    assert read(run / "deadman.json")["config"]["budget_usd"] == new_cap


def test_finding_node_C6_the_boot_sweep_never_restarts_a_spent_runs_job(tmp_path, box):
    """An --auto-resume run whose budget ran out while the box was down (0.3 at 18/h: 60 s; the box is down for
    two minutes, written into the run's clock as elapsed time, so no load can make the drill race its budget):
    the boot sweep marks it failed and re-arms its dead-man, which stops the box at once; the job is NOT started
    again. Before: the sweep relaunched it as attempt 2, billing until the new dead-man's first check."""
    job, _cfg = box.job("spent", sleep=600)
    res = box.launch("spent", job, "--auto-resume", "--max-attempts", "5", "--deadman-arg", "--budget-usd=0.3",
                     "--deadman-arg", "--rate-per-hour=18")
    assert res.returncode == 0, res.stdout + res.stderr
    run = box.run_dir("spent")
    assert wait_for(lambda: read(run / "budget.json").get("first_start") and
                    box.status("spent").get("state") == "running", 60)
    kill_everything_of(run)                               # the box goes down before its budget is spent ...
    assert not (run / "DEADMAN_FIRED.json").exists(), "the budget ran out before the drill's restart"
    clock = read(run / "budget.json")
    clock["first_start"] -= 120.0                         # ... and stays down for two minutes
    (run / "budget.json").write_text(json.dumps(clock))
    boot = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--runs-dir", str(box.durable / "runs"),
                           "--json"], env=box.env, capture_output=True, text=True, timeout=300)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    (only,) = json.loads(boot.stdout)["runs"]
    assert only["action"] == "re-armed the dead-man" and only["why"].startswith("budget spent: "), only
    status = box.status("spent")
    assert status["attempt"] == 1 and status["state"] == "failed" and "budget spent" in status["error"], status
    assert wait_for(lambda: box.stop_calls_lines(), 60), "the re-armed dead-man never stopped the box"
    assert read(run / "DEADMAN_FIRED.json")["reason"] == "max_hours"
    assert box.status("spent")["attempt"] == 1 and not (run / "previous").exists()   # no attempt 2 ever started


def test_finding_review_D6_a_raised_cap_is_what_every_later_arming_holds(tmp_path):
    """After `resume --max-cost`, the replayed launch and a reboot's re-arm carry the run's new cap (budget.json)
    and the --max-hours it buys, never the launch's old one; a tighter --max-hours the user gave stays."""
    import boot_resume
    from watch_fixture import cfg_for
    run = tmp_path / "run"
    run.mkdir()
    stop, _calls = stand_in(tmp_path)
    cfg = cfg_for(run, "--budget-usd", "0.1", "--rate-per-hour", "24", "--stop-cmd", stop)
    (run / "deadman.json").write_text(json.dumps({"config": cfg}))
    clock, _ = runrec.start_budget(str(run), 0.1, 24.0, time.time() - 20)
    raised = runrec.raise_budget(str(run), clock, 0.3, runrec.budget_spent_usd(clock, time.time()))
    assert raised["budget_usd"] == 0.3 and read(run / "budget.json")["raised"][0]["from"] == 0.1
    words = boot_resume.rearm_args(str(run))
    assert words[words.index("--budget-usd") + 1] == "0.3"
    assert float(words[words.index("--max-hours") + 1]) == core.budget_hours(0.3, 24)
    launch = ["--profile", "p", "--max-hours", "%.12g" % core.budget_hours(0.1, 24), "--deadman-arg",
              "--budget-usd=0.1", "--deadman-arg", "--rate-per-hour=24"]
    assert boot_resume.capped_words(launch, raised) == ["--profile", "p", "--max-hours", "%.12g" % core.budget_hours(
        0.3, 24), "--deadman-arg", "--budget-usd=0.3", "--deadman-arg", "--rate-per-hour=24"]
    tight = ["--max-hours", "0.001", "--deadman-arg", "--budget-usd", "--deadman-arg", "0.1"]
    assert boot_resume.capped_words(tight, raised) == ["--max-hours", "0.001", "--deadman-arg", "--budget-usd",
                                                       "--deadman-arg", "0.3"]
    assert boot_resume.capped_words(launch, None) == launch


# ---------------------------------------------------------------- the providers' attachment fields (issue 37)

def test_finding_laptop_L4_a_vastai_volume_is_matched_by_the_instance_side_attachment_too(tmp_path):
    """vast.ai documents a volume's "instances" as an array whose items' shape it does not give; its own CLI reads an
    instance's "volume_info" (objects with "id"). A volume only the instance side names is attached to the live
    run's box (OK), not billed alone; one neither side names stays STORAGE BILLING. Before: the instance side was
    never read, so that volume read STORAGE BILLING beside a healthy run."""
    sys.path.insert(0, str(TOOLS))
    from provider_standins import Instance, StandIn, Volume
    import billing
    api = StandIn("vastai", "canary-key-0e5d1c7b9a2f4e6d8c3b", [Instance("777", rate=1.5)],
                  [Volume("901", attached_to="777", on_volume=False), Volume("902")])
    with api:
        doc = billing.report_billing([{"event": "launch", "host": "gpu", "box": "root@127.0.0.1:2222", "run_id": "v1",
                                       "state": "launched", "instance": "vastai:777", "time": "2026-12-05T00:00:00Z"}],
                                     environ={"RGT_VASTAI_API_URL": api.url,
                                              "VAST_API_KEY": "canary-key-0e5d1c7b9a2f4e6d8c3b"},
                                     home=str(tmp_path), timeout=5)
    got = {(i["provider"], i["id"]): i["label"] for i in doc["items"]}
    assert got == {("vastai", "777"): "OK", ("vastai", "901"): "OK", ("vastai", "902"): "STORAGE BILLING"}, got
