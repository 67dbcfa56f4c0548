"""Round 4 findings on the node's watchers and run_status (issue 28): field R12 (a trainer that prints no total),
newcomer 4 (the ETA after a resume) and field R15 (dry-run dead-men firing late, and their wording).

Real parts: run_one.sh launches a real job in a temporary node (tests/node_box.py); the dead-men and idle
watchers run as real processes. Run dirs built by hand say so.
"""
import json
import socket
import subprocess
import sys
import time

from conftest import NODE, wait_for

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402
import progress  # noqa: E402  (the step and ETA reader run_status.py uses)

STATUS = NODE / "run_status.py"
DEADMAN = NODE / "deadman.py"
IDLE = NODE / "idle_watch.py"

# A trainer that prints its step and never a total, then waits for RELEASE (or 120 s) and exits 0.
NO_TOTAL_JOB = r"""
import os, sys, time
for step in range(1, 6):
    print("iter %d: loss 0.5" % step, flush=True)
end = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < end:
    time.sleep(0.05)
"""


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def status_json(run_dir, *args):
    res = subprocess.run([sys.executable, str(STATUS), str(run_dir), "--json", "--no-gpu", *args],
                         capture_output=True, text=True, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def hand_made_run(tmp_path, attempt, log, progress_regex=None, resume=None, started_ago=100.0, heartbeat=None):
    """A running run dir as run_one.sh leaves it, with a live job (this test's own process)."""
    import os
    run = tmp_path / "run"
    run.mkdir()
    now = time.time()
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": ["python3", "train.py"], "cwd": str(tmp_path),
                                              "host": socket.gethostname(), "outputs": [], "attempt": attempt,
                                              "progress_regex": progress_regex}))
    (run / "status.json").write_text(json.dumps({
        "run_id": "r1", "state": "running", "job_pid": os.getpid(), "job_identity": core.process_identity(os.getpid()),
        "exit_code": None, "started_at": iso(now - started_ago), "ended_at": None, "updated_at": iso(now),
        "attempt": attempt, "resume": resume}))
    (run / "job.log").write_text(log)
    if heartbeat is not None:
        (run / "heartbeat.json").write_text(json.dumps(dict(heartbeat, time=now)))
    return run


# ---------------------------------------------------------------- field R12: no total printed

def test_finding_field_R12_total_steps_from_the_launch_gives_step_of_n_an_eta_and_no_hb_noise(box, tmp_path):
    release = tmp_path / "release"
    res = box.launch("r12", [sys.executable, "-c", NO_TOTAL_JOB, str(release)], "--deadman-dry-run",
                     "--progress-regex", r"iter (\d+):", "--total-steps", "100")
    assert res.returncode == 0, res.stderr[-600:]
    run_dir = box.run_dir("r12")
    try:
        assert json.loads((run_dir / "run.json").read_text())["total_steps"] == 100
        assert wait_for(lambda: status_json(run_dir).get("step") == 5, 60), status_json(run_dir)
        doc = status_json(run_dir)
        assert doc["status"] == "running" and doc["total_steps"] == 100 and doc["percent"] == 5.0
        assert doc["total_source"] == "run.json (--total-steps)"
        assert doc["eta_s"] is not None and "step 0" in doc["eta_basis"]
        assert doc["heartbeat_age_s"] is None
        assert "step 5/100 (5%)" in doc["line"] and " eta " in doc["line"]
        assert "hb " not in doc["line"] and "n/a ago" not in doc["line"]
        # the supervisor's "starting:" note is what a resumed attempt counts from (newcomer 4)
        assert progress.attempt_first_step(str(run_dir / "job.log"), r"iter (\d+):") == 1
    finally:
        release.write_text("go")
        box.wait_terminal("r12", timeout=120)


def test_a_bad_total_steps_is_one_line_and_exit_2(box, tmp_path):
    for bad in ("0", "-3", "many", "1e400"):
        res = box.launch("r12bad", [sys.executable, "-c", "pass"], "--deadman-dry-run", "--total-steps", bad)
        assert res.returncode == 2, (bad, res.stderr)
        assert "Traceback" not in res.stderr and "--total-steps" in res.stderr, res.stderr
        assert len([line for line in res.stderr.splitlines() if "error" in line]) == 1, res.stderr


def test_finding_field_R12_a_heartbeat_or_log_total_wins_over_the_launch(tmp_path):
    run = hand_made_run(tmp_path, 1, "step 50/400\n", progress_regex=r"step (\d+)/(\d+)")
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(doc, total_steps=100)))
    out = status_json(run)
    assert (out["step"], out["total_steps"], out["total_source"]) == (50, 400, "job.log (--progress-regex)")


# ---------------------------------------------------------------- newcomer 4: the ETA after a resume

ATTEMPT_1 = "".join("step %d/1000\n" % s for s in range(1, 501))
ATTEMPT_2 = "[rgt 12:00:00] resume: from ckpt/step500.pt\n[rgt 12:00:00] starting: python3 train.py (cwd /w)\n" + \
    "".join("step %d/1000\n" % s for s in range(501, 601))
RESUMED = {"from": "ckpt/step500.pt", "args": ["--resume", "ckpt/step500.pt"], "skipped": []}


def test_finding_newcomer_4_a_resumed_attempt_counts_its_rate_from_its_first_step(tmp_path):
    """Attempt 2 resumed at step 500 and did 100 steps in 100 s: 400 steps are left, about 400 s, not the 67 s
    an average from step 0 gives (600 steps in 100 s)."""
    run = hand_made_run(tmp_path, 2, ATTEMPT_1 + ATTEMPT_2, progress_regex=r"step (\d+)/(\d+)", resume=RESUMED)
    out = status_json(run)
    assert out["step"] == 600 and out["attempt"] == 2
    assert out["eta_basis"] == "average since this attempt's first logged step 501"
    assert 300 < out["eta_s"] < 500, out["eta_s"]    # 400 * elapsed / 99; never the 67 s of the old rule


def test_finding_newcomer_4_an_unknown_start_step_leaves_the_eta_out_and_says_why(tmp_path):
    run = hand_made_run(tmp_path, 2, "resumed\n", resume=RESUMED,
                        heartbeat={"step": 600, "total_steps": 1000})   # no sec_per_step, no --progress-regex
    out = status_json(run)
    assert out["eta_s"] is None and out["eta_basis"].startswith("unknown: attempt 2 resumed from ckpt/step500.pt")
    assert " eta " not in out["line"] and out["line"].startswith("RUNNING step 600/1000 (60%)")


def test_finding_newcomer_4_the_first_attempt_and_a_fresh_restart_count_from_zero(tmp_path):
    run = hand_made_run(tmp_path, 1, "step 100/200\n", progress_regex=r"step (\d+)/(\d+)")
    out = status_json(run)
    assert "from step 0" in out["eta_basis"] and 50 < out["eta_s"] < 150
    # attempt 3 whose resume found no good checkpoint started over at 0, and its log shows no step of its own yet
    (run / "status.json").write_text(json.dumps(dict(json.loads((run / "status.json").read_text()), attempt=3,
                                                     resume={"from": None, "args": [], "skipped": []})))
    out = status_json(run)
    assert out["eta_basis"].endswith("started fresh: no good checkpoint)") and out["eta_s"] is not None


def test_finding_newcomer_4_the_attempt_marker_is_found_across_read_chunks(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("x" * 1000 + "\n" + ATTEMPT_2 + "y" * 5000 + "\n")
    for chunk in (7, 64, 100, 1 << 20):
        assert progress.attempt_first_step(str(log), r"step (\d+)/", chunk=chunk) == 501, chunk
    log.write_text(ATTEMPT_2.split("\n", 1)[1])                # the marker on the file's first line
    assert progress.attempt_first_step(str(log), r"step (\d+)/") == 501
    log.write_text("step 3/10\n")                               # no marker: not this attempt's log
    assert progress.attempt_first_step(str(log), r"step (\d+)/") is None


# ---------------------------------------------------------------- field R15: dry-run dead-men

def fire_dry_run(tmp_path, status, *watch):
    """A foreground dry-run dead-man (stop `true`, a 600 s poll unless WATCH says) over a run whose status.json
    is STATUS -> its DEADMAN_FIRED.json, once it has fired and exited."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps(status))
    res = subprocess.run([sys.executable, str(DEADMAN), "arm", "--run-dir", str(run), "--foreground", "--dry-run",
                          "--stop-cmd", "true", *watch], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    return json.loads((run / "DEADMAN_FIRED.json").read_text())


def test_finding_field_R15_a_dead_man_fires_when_its_grace_runs_out_not_a_poll_later(tmp_path):
    """The field's smoke runs asked for a short grace and kept the default 30 s poll: the firing waited for
    the next poll. Here the poll is 600 s and the grace 1.2 s: the firing must not wait for the poll."""
    fired = fire_dry_run(tmp_path, {"run_id": "r15", "state": "succeeded", "exit_code": 0,
                                    "ended_at": iso(time.time())}, "--grace-minutes", "0.02", "--poll-seconds", "600")
    assert fired["reason"] == "job_ended" and fired["dry_run"] is True and fired["would_run"] == "true"


def test_finding_field_R15_a_stall_and_an_idle_box_fire_on_time_too(tmp_path):
    import os
    fired = fire_dry_run(tmp_path, {"run_id": "r15s", "state": "running", "job_pid": os.getpid(),
                                    "job_identity": core.process_identity(os.getpid()),
                                    "started_at": iso(time.time())}, "--stall-minutes", "0.02", "--poll-seconds", "600")
    assert fired["reason"] == "stall"
    watch = tmp_path / "idle"
    res = subprocess.run([sys.executable, str(IDLE), "arm", "--watch-dir", str(watch), "--foreground", "--dry-run",
                          "--stop-cmd", "true", "--no-gpu", "--ignore-ssh", "--idle-minutes", "0.02",
                          "--poll-seconds", "600"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    assert json.loads((watch / "IDLE_FIRED.json").read_text())["reason"] == "idle_box"


def test_finding_field_R15_a_dry_run_firing_never_reads_as_a_failed_stop(tmp_path):
    fired = fire_dry_run(tmp_path, {"run_id": "r15d", "state": "succeeded", "exit_code": 0,
                                    "ended_at": iso(time.time())}, "--grace-minutes", "0", "--poll-seconds", "0.05")
    assert fired["dry_run"] is True and fired["ok"] is False     # the record: nothing ran, so nothing succeeded
    run = tmp_path / "run"
    line = status_json(run)["line"]
    assert "dry run (nothing was stopped)" in line and "FAILED" not in line, line
    st = subprocess.run([sys.executable, str(DEADMAN), "status", "--run-dir", str(run)], capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 7 and "DRY RUN (nothing was stopped): would run \"true\"" in st.stdout, st.stdout
    assert "stop_ok=False" not in st.stdout
    # the idle watcher's status: a dry-run firing is not a failed stop (exit 0, not 1)
    watch = tmp_path / "idle"
    res = subprocess.run([sys.executable, str(IDLE), "arm", "--watch-dir", str(watch), "--foreground", "--dry-run",
                          "--stop-cmd", "true", "--no-gpu", "--ignore-ssh", "--idle-minutes", "0.001",
                          "--poll-seconds", "0.05"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    st = subprocess.run([sys.executable, str(IDLE), "status", "--watch-dir", str(watch)], capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 0 and "DRY RUN (nothing was stopped)" in st.stdout, st.stdout


def test_finding_field_R15_the_wake_never_comes_before_the_deadline_it_was_set_for(tmp_path, monkeypatch):
    """The in-process rule: evaluate() notes the grace's end as next_deadline, and the check at that time fires."""
    import deadman
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"run_id": "r15w", "state": "failed", "exit_code": 1}))
    args = deadman.build_parser().parse_args(["arm", "--run-dir", str(run), "--dry-run", "--stop-cmd", "true",
                                              "--grace-minutes", "1", "--poll-seconds", "30"])
    cfg, _ = deadman.build_config(args, str(run))
    dm = deadman.Deadman(str(run), cfg, foreground=False)
    now = dm.armed_mono + 5.0
    assert dm.evaluate(now) is None and dm.next_deadline == dm.ended_mono + 60.0
    assert dm.evaluate(dm.next_deadline - 0.01) is None
    assert dm.evaluate(dm.next_deadline)[0] == "job_ended"
