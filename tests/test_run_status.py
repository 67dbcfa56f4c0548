"""scripts/node/run_status.py: every state from a run dir built by hand (live and dead processes are real),
exit codes per the contract, --json fields, --watch, and the usage errors."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS, TOOLS

STATUS = NODE / "run_status.py"


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def status(run_dir, *args, env=None, timeout=30):
    return subprocess.run([sys.executable, str(STATUS), str(run_dir), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def as_json(run_dir, *args, env=None):
    res = status(run_dir, "--json", *args, env=env)
    data = json.loads(res.stdout)
    assert data["exit"] == res.returncode
    return res.returncode, data


@pytest.fixture
def live_pid():
    proc = subprocess.Popen(["sleep", "120"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_run(root, state=None, pid=None, exit_code=None, step=None, total=None, started_ago=60,
             sec_per_step=None, files_age=None, host=None):
    run = Path(root) / "run"
    run.mkdir()
    now = time.time()
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": ["python3", "train.py"], "cwd": "/tmp",
                                              "profile": "local", "host": host or socket.gethostname(),
                                              "created_at": iso(now - started_ago), "outputs": []}))
    if state is not None:
        (run / "status.json").write_text(json.dumps({
            "run_id": "r1", "state": state, "job_pid": pid, "exit_code": exit_code,
            "started_at": iso(now - started_ago), "ended_at": None, "updated_at": iso(now), "detach": "nohup"}))
    (run / "job.log").write_text("step log\n")
    if step is not None:
        hb = {"step": step, "total_steps": total, "epoch": 2, "loss": 0.25, "time": now}
        if sec_per_step is not None:
            hb["sec_per_step"] = sec_per_step
        (run / "heartbeat.json").write_text(json.dumps(hb))
    if exit_code is not None:
        (run / "exit_code").write_text("%d\n" % exit_code)
    if files_age is not None:
        old = now - files_age
        for name in ("heartbeat.json", "job.log", "status.json", "run.json"):
            if (run / name).exists():
                os.utime(run / name, (old, old))
    return run


def test_running_line_json_and_eta(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=120, total=500, sec_per_step=0.5)
    res = status(run)
    assert res.returncode == 4
    line = res.stdout.strip()
    assert line.startswith("RUNNING step 120/500 (24%)") and "eta 3m" in line and "disk " in line
    code, data = as_json(run)
    assert code == 4 and data["status"] == "running" and data["job_alive"] is True
    assert (data["step"], data["total_steps"], data["epoch"], data["percent"]) == (120, 500, 2, 24.0)
    assert data["eta_s"] == 190 and data["eta_basis"] == "heartbeat sec_per_step"
    assert 0 <= data["heartbeat_age_s"] < 10
    disk = data["disk"]
    assert disk["free_bytes"] > 0 and disk["total_bytes"] >= disk["free_bytes"]
    assert isinstance(disk["free_inodes"], int) and isinstance(disk["total_inodes"], int)
    if shutil.which("nvidia-smi") is None:
        assert data["gpu"] is None and data["gpu_reason"] == "nvidia-smi not found"
        assert "gpu n/a" in line


def test_eta_from_average_since_start(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=100, total=200, started_ago=100)
    _code, data = as_json(run)
    assert 90 <= data["eta_s"] <= 110 and "started_at" in data["eta_basis"]


def test_stalled_when_heartbeat_and_log_are_old(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=50, total=500, files_age=40 * 60, started_ago=3600)
    res = status(run, "--stall-minutes", "30")
    assert res.returncode == 6 and res.stdout.startswith("STALLED no heartbeat/log activity for 40m")
    assert status(run, "--stall-minutes", "60").returncode == 4          # same dir, looser limit: running
    code, data = as_json(run, "--stall-minutes", "30")
    assert data["status"] == "stalled" and data["activity_age_s"] >= 40 * 60 - 5


def test_fresh_log_alone_keeps_a_run_alive(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=50, total=500, files_age=40 * 60, started_ago=3600)
    os.utime(run / "job.log")                                            # the log still moves
    assert status(run, "--stall-minutes", "30").returncode == 4


def test_running_with_dead_pid_and_no_exit_code_is_failed(tmp_path, dead_pid):
    run = make_run(tmp_path, "running", dead_pid, step=10, total=100)
    code, data = as_json(run)
    assert code == 1 and data["status"] == "failed" and data["job_alive"] is False
    assert data["reason"].startswith("job vanished")
    assert status(run).stdout.startswith("FAILED job vanished")


def test_job_just_ended_while_the_supervisor_records_it_is_not_vanished(tmp_path, dead_pid, live_pid):
    run = make_run(tmp_path, "running", dead_pid, step=100, total=100)
    doc = json.loads((run / "status.json").read_text())
    doc["supervisor_pid"] = live_pid
    (run / "status.json").write_text(json.dumps(doc))
    code, data = as_json(run)
    assert code == 4 and data["status"] == "syncing" and "supervisor" in data["reason"]


def test_pid_on_another_host_is_not_checked(tmp_path, dead_pid):
    run = make_run(tmp_path, "running", dead_pid, step=10, total=100, host="gpu-box-elsewhere")
    code, data = as_json(run)
    assert code == 4 and data["job_alive"] is None and "not this machine" in data["job_alive_note"]


def test_starting(tmp_path, live_pid):
    run = make_run(tmp_path, "starting", live_pid, started_ago=5)
    res = status(run)
    assert res.returncode == 5 and res.stdout.startswith("STARTING")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "run.json").write_text(json.dumps({"run_id": "r2"}))          # no status.json yet
    assert status(bare).returncode == 5


def test_succeeded_failed_sync_failed(tmp_path, dead_pid):
    for sub in "abc":
        (tmp_path / sub).mkdir()
    ok = make_run(tmp_path / "a", "succeeded", dead_pid, exit_code=0, step=500, total=500)
    code, data = as_json(ok)
    assert code == 0 and data["status"] == "succeeded" and data["eta_s"] == 0
    assert status(ok).stdout.startswith("SUCCEEDED")

    bad = make_run(tmp_path / "b", "failed", dead_pid, exit_code=3, step=20, total=500)
    code, data = as_json(bad)
    assert code == 1 and data["status"] == "failed" and data["exit_code"] == 3
    assert status(bad).stdout.startswith("FAILED job exited 3")
    assert "fix the cause" in data["hint"]

    (tmp_path / "d").mkdir()
    preempted = make_run(tmp_path / "d", "failed", dead_pid, exit_code=143, step=20, total=500)
    code, data = as_json(preempted)
    assert code == 1 and "new run id" in data["hint"] and "fix the cause" not in data["hint"]

    sf = make_run(tmp_path / "c", "sync_failed", dead_pid, exit_code=0, step=500, total=500)
    (sf / "sync.json").write_text(json.dumps({"ok": False, "verified": False, "dest": "/durable/results/r1",
                                              "files": [], "finished_at": iso(time.time()),
                                              "error": "No space left on device"}))
    code, data = as_json(sf)
    assert code == 1 and data["status"] == "sync_failed" and "No space left" in data["reason"]
    assert data["sync"]["ok"] is False
    assert status(sf).stdout.startswith("SYNC_FAILED")


def test_deadman_fired_wins(tmp_path, dead_pid):
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0, step=500, total=500)
    (run / "deadman.json").write_text(json.dumps({"pid": dead_pid, "armed_at": iso(time.time()), "config": {},
                                                  "state": "fired"}))
    (run / "DEADMAN_FIRED.json").write_text(json.dumps({
        "reason": "ended_unacked", "detail": "job ended 20m ago, no ACK", "fired_at": iso(time.time()),
        "command": None, "destructive": False, "attempts": [], "ok": True}))
    code, data = as_json(run)
    assert code == 7 and data["status"] == "deadman_fired" and data["state"] == "succeeded"
    assert data["deadman"]["fired_reason"] == "ended_unacked"
    assert status(run).stdout.startswith("DEADMAN_FIRED reason ended_unacked")


def test_deadman_liveness_is_reported(tmp_path, live_pid, dead_pid):
    run = make_run(tmp_path, "running", live_pid, step=5, total=50)
    (run / "deadman.json").write_text(json.dumps({"pid": dead_pid, "state": "armed", "config": {}}))
    assert "deadman DOWN" in status(run).stdout
    (run / "deadman.json").write_text(json.dumps({"pid": live_pid, "state": "armed", "config": {}}))
    assert "deadman armed" in status(run).stdout


def test_watch_exits_when_the_run_ends(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=5, total=50)
    proc = subprocess.Popen([sys.executable, str(STATUS), str(run), "--watch", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.8)
    assert proc.poll() is None
    st = json.loads((run / "status.json").read_text())
    st["state"], st["exit_code"] = "succeeded", 0
    (run / "status.json").write_text(json.dumps(st))
    out, _err = proc.communicate(timeout=10)
    lines = out.strip().splitlines()
    assert proc.returncode == 0 and len(lines) >= 2
    assert lines[0].startswith("RUNNING") and lines[-1].startswith("SUCCEEDED")


def test_usage_errors_are_one_line(tmp_path):
    res = status(tmp_path / "nope")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no such run dir" in res.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    res = status(empty)
    assert res.returncode == 2 and "not a run dir" in res.stderr
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "status.json").write_text(json.dumps({"state": "paused"}))
    res = status(weird)
    assert res.returncode == 2 and "unknown state" in res.stderr
    (weird / "status.json").write_text("{half")
    res = status(weird)
    assert res.returncode == 2 and "not valid JSON" in res.stderr and "Traceback" not in res.stderr
    assert status(tmp_path, "--stall-minutes", "0").returncode == 2


def test_hung_nvidia_smi_is_cut_off(tmp_path, live_pid):
    """A wedged driver makes nvidia-smi hang; the status line must still come back quickly."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\nsleep 20\n")
    (fake / "nvidia-smi").chmod(0o755)
    run = make_run(tmp_path, "running", live_pid, step=5, total=50)
    env = dict(os.environ, PATH=str(fake) + os.pathsep + os.environ.get("PATH", ""))
    t0 = time.time()
    code, data = as_json(run, "--gpu-timeout", "0.5", env=env)
    assert time.time() - t0 < 10
    assert code == 4 and data["gpu"] is None and "timed out" in data["gpu_reason"]
    code, data = as_json(run, "--no-gpu", env=env)
    assert data["gpu_reason"].startswith("skipped")


def test_cost_so_far_from_job_time_and_rate(tmp_path, dead_pid):
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0, started_ago=7200)
    doc = json.loads((run / "status.json").read_text())
    doc["ended_at"] = iso(time.time() - 3600)          # ran for one hour, ended an hour ago
    (run / "status.json").write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, str(STATUS), str(run), "--json", "--no-gpu", "--rate-per-hour", "2.5"],
                         capture_output=True, text=True, timeout=30)
    data = json.loads(res.stdout)
    assert res.returncode == 0 and abs(data["cost_so_far"] - 2.5) <= 0.01 and "billed longer" in data["cost_note"]
    line = subprocess.run([sys.executable, str(STATUS), str(run), "--no-gpu", "--rate-per-hour", "2.5"],
                          capture_output=True, text=True, timeout=30).stdout
    assert "cost ~2.50" in line
    bad = subprocess.run([sys.executable, str(STATUS), str(run), "--rate-per-hour", "-1"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
