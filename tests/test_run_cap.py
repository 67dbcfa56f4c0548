"""A run's cap is the run's (issue 38; ../shared/reports/redteam-2026-12-05-node.md C2, field test N1).

Two real runs on one box (two run dirs under one durable dir, one registry, two dead-men as subprocesses
launched by run_one.sh): the capped run's dead-man stops that run (its stop signal, its sync) and leaves the
box on while the other watched run progresses; the box stop runs once the last of them is done.

Positive waits go through wait_for; the one negative check ("the box was not stopped") counts the capped
dead-man's evaluations in its lease instead of sleeping.
"""
import json
import os
import signal
import subprocess
import sys

from conftest import NODE, REPO, wait_for
from conftest import read_json as read
from test_own_evidence import TICKER, trainer

TRAIN = str(REPO / "examples" / "train_resumable.py")


def evaluations(run_dir):
    return ((read(run_dir / "lease.json").get("deadman") or {}).get("evaluations")) or 0


def launch(box, run_id, job, *opts):
    res = box.launch(run_id, job, "--grace-minutes", "30", *opts, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def box_left_on_while(box, capped, other):
    """The capped dead-man keeps evaluating (three more checks) and never runs the box stop meanwhile."""
    seen = evaluations(box.run_dir(capped))
    assert wait_for(lambda: evaluations(box.run_dir(capped)) >= seen + 3, 60), "the capped dead-man stopped watching"
    assert box.stop_calls_lines() == [], "the box was stopped under a run that still trains"
    assert box.status(other)["state"] == "running", box.status(other)


def status_line(box, run_id):
    res = subprocess.run([sys.executable, str(NODE / "run_status.py"), str(box.run_dir(run_id)), "--no-gpu"],
                         capture_output=True, text=True, timeout=60, env=box.env)
    return res.stdout


def test_finding_node_C2_a_runs_max_hours_stops_that_run_and_leaves_the_box_on_for_the_other(box, tmp_path):
    busy_hold = tmp_path / "busy-hold"
    busy_hold.write_text("")
    (box.work / "ticker.py").write_text(TICKER)
    launch(box, "busy", [sys.executable, "ticker.py", str(busy_hold)], "--deadman-dry-run")
    try:
        assert wait_for(lambda: "tick" in (box.run_dir("busy") / "job.log").read_text(), 60)
        hold = tmp_path / "hold"
        hold.write_text("")
        # 0.001 h = 3.6 s: the capped run saves a checkpoint, then waits (until HOLD goes) and exits 0 on SIGTERM
        launch(box, "capped", trainer(box, "capped", hold=str(hold), term_exit=0, ckpt="ckpt/capped.txt"),
               "--max-hours", "0.001", "--output", "ckpt/capped.txt")
        run = box.run_dir("capped")
        assert wait_for(lambda: read(run / "CAP_STOPPED.json").get("state_after"), 90), read(run / "deadman.log")
        rec = read(run / "CAP_STOPPED.json")
        assert rec["scope"] == "run" and rec["box_stop"] is False and rec["other_runs"] == ["busy"], rec
        assert rec["job_term"]["signal"] == "SIGTERM" and rec["job_term"]["job_exited"] is True, rec
        status = box.wait_terminal("capped", 60)
        assert status["state"] == "interrupted" and "max_hours" in status["interrupted_by"], status
        assert status["sync"]["ok"] and status["sync"]["verified"], status["sync"]   # its work is durable
        assert not (run / "DEADMAN_FIRED.json").exists(), "the box-scope firing ran under a training run"
        box_left_on_while(box, "capped", "busy")
        assert "cap reached: this run stopped, box left on for 1 other run" in status_line(box, "capped")
    finally:
        busy_hold.unlink()
    # the last watched run is done: the capped run's dead-man now stops the box
    assert box.wait_terminal("busy", 60)["state"] == "succeeded"
    assert wait_for(lambda: box.stop_calls_lines(), 60), "the box was never stopped after the last run ended"
    assert wait_for(lambda: read(box.run_dir("capped") / "DEADMAN_FIRED.json").get("ok") is not None, 60)
    assert read(box.run_dir("capped") / "DEADMAN_FIRED.json")["reason"] == "max_hours"


def test_finding_field_N1_a_budget_cap_beside_an_unmodified_trainer_stops_only_its_run(box):
    """Two runs of the example trainer (its own SIGTERM save, heartbeat): run A's budget (0.003 USD at 2 USD/h,
    5.4 s) runs out while B trains; A saves and syncs, B keeps stepping, the box stays on until B is done."""
    def job(name):
        return [sys.executable, TRAIN, "--backend", "pure", "--ckpt-dir", "ckpt/%s" % name, "--steps", "100000",
                "--step-seconds", "0.05", "--ckpt-every", "20"]
    launch(box, "b", job("b"), "--deadman-dry-run", "--output", "ckpt/b/*")
    assert wait_for(lambda: (read(box.run_dir("b") / "heartbeat.json").get("step") or 0) > 0, 60)
    launch(box, "a", job("a"), "--output", "ckpt/a/*", "--deadman-arg", "--budget-usd", "--deadman-arg", "0.003",
           "--deadman-arg", "--rate-per-hour", "--deadman-arg", "2")
    run = box.run_dir("a")
    status = box.wait_terminal("a", 90)
    assert status["state"] == "interrupted" and status["exit_code"] == 143, status   # the trainer's own save
    assert status["sync"]["ok"] and status["sync"]["verified"], status["sync"]
    results = status["sync"]["results_dir"]
    saved = os.listdir(os.path.join(results, "ckpt", "a"))
    assert any(n.startswith("ckpt-") for n in saved), saved
    assert wait_for(lambda: read(run / "CAP_STOPPED.json").get("state_after"), 60)
    assert read(run / "CAP_STOPPED.json")["other_runs"] == ["b"]
    step = read(box.run_dir("b") / "heartbeat.json")["step"]
    box_left_on_while(box, "a", "b")
    assert wait_for(lambda: read(box.run_dir("b") / "heartbeat.json")["step"] > step + 2, 60), "B stopped training"
    line = status_line(box, "a")
    assert "INTERRUPTED" in line and "box left on for 1 other run" in line, line
    # B ends (stopped by hand here): A's dead-man, the last watcher with a real stop, stops the box
    os.kill(box.status("b")["job_pid"], signal.SIGTERM)
    assert box.wait_terminal("b", 60)["exit_code"] == 143   # its own save on SIGTERM
    assert wait_for(lambda: box.stop_calls_lines(), 60), "the box was never stopped after the last run ended"
    fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
    assert fired["reason"] == "max_hours", fired
