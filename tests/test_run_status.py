"""scripts/node/run_status.py: every state from a run dir built by hand (live and dead processes are real),
exit codes per the contract, --json fields, --watch, and the usage errors."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS, TOOLS

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402

STATUS = NODE / "run_status.py"
DEADMAN = NODE / "deadman.py"


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
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": ["python3", "train.py"], "cwd": str(root),
                                              "profile": "local", "host": host or socket.gethostname(),
                                              "created_at": iso(now - started_ago), "outputs": []}))
    if state is not None:
        # what run_one.sh records: the job's pid and its identity (pid + start time + boot id)
        (run / "status.json").write_text(json.dumps({
            "run_id": "r1", "state": state, "job_pid": pid, "job_identity": core.process_identity(pid) if pid else None,
            "exit_code": exit_code, "started_at": iso(now - started_ago), "ended_at": None, "updated_at": iso(now),
            "detach": "nohup"}))
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


def set_status(run, **fields):
    doc = json.loads((run / "status.json").read_text())
    doc.update(fields)
    (run / "status.json").write_text(json.dumps(doc))


def write_deadman(run, pid, state="armed", identity=True, **extra):
    doc = {"pid": pid, "state": state, "config": {}, "armed_at": iso(time.time())}
    if identity:
        doc["identity"] = core.process_identity(pid) if identity is True else identity
    doc.update(extra)
    (run / "deadman.json").write_text(json.dumps(doc))


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
    doc["supervisor_pid"], doc["supervisor_identity"] = live_pid, core.process_identity(live_pid)
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
    assert code == 1 and "rgt.py resume HOST RID" in data["hint"] and "fix the cause" not in data["hint"]

    sf = make_run(tmp_path / "c", "sync_failed", dead_pid, exit_code=0, step=500, total=500)
    set_status(sf, sync={"ok": False, "verified": False, "results_dir": "/durable/results/r1", "manifest": None,
                         "file_count": 0, "total_bytes": 0, "error": "No space left on device",
                         "kept_previous": [], "started_at": iso(time.time()), "finished_at": iso(time.time())})
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
    write_deadman(run, dead_pid)
    assert "deadman DOWN" in status(run).stdout
    write_deadman(run, live_pid)
    assert "deadman armed" in status(run).stdout


def test_watch_exits_when_the_run_ends(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=5, total=50)
    proc = subprocess.Popen([sys.executable, str(STATUS), str(run), "--watch", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()      # its first look, taken while the run still runs (no sleep: a loaded box)
    assert first.startswith("RUNNING") and proc.poll() is None, first
    st = json.loads((run / "status.json").read_text())
    st["state"], st["exit_code"] = "succeeded", 0
    (run / "status.json").write_text(json.dumps(st))
    out, _err = proc.communicate(timeout=60)
    lines = [first.strip()] + out.strip().splitlines()
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


# ----------------------------------------------------------------------------- the core helpers run_status uses

def test_record_alive_uses_the_identity_then_the_record_time(live_pid, dead_pid):
    ident = core.process_identity(live_pid)
    assert core.record_alive(ident, live_pid) is True
    assert core.record_alive(dict(ident, start_ticks=ident["start_ticks"] + 1), live_pid) is False
    assert core.record_alive(core.process_identity(dead_pid), dead_pid) is False
    # no identity (an older writer): the bare pid, unless the process started after the record was made
    assert core.record_alive(None, live_pid) is True
    assert core.record_alive(None, live_pid, not_after=time.time()) is True
    assert core.record_alive(None, live_pid, not_after=time.time() - 3600) is False
    assert abs(core.process_start_epoch(live_pid) - time.time()) < 120


def test_deadman_state_words(tmp_path, live_pid, dead_pid):
    run = tmp_path / "run"
    run.mkdir()
    assert core.deadman_state(str(run))["word"] == "NONE"
    write_deadman(run, live_pid)
    st = core.deadman_state(str(run))
    assert (st["word"], st["watching"], st["alive"]) == ("ARMED", True, True)
    write_deadman(run, dead_pid)
    assert core.deadman_state(str(run))["word"] == "DOWN"
    assert core.deadman_state(str(run), check_alive=False)["word"] == "ARMED"
    for state, word in (("disarmed", "DISARMED"), ("exited", "EXITED"), ("fired", "FIRED")):
        write_deadman(run, dead_pid, state=state)
        assert core.deadman_state(str(run))["word"] == word
    write_deadman(run, dead_pid)
    (run / "DEADMAN_FIRED.json").write_text(json.dumps({"reason": "stall"}))
    st = core.deadman_state(str(run))
    assert st["word"] == "FIRED" and st["fired"]["reason"] == "stall"


# ----------------------------------------------------------------------------- red-team findings

def arm_real_deadman(run, *args):
    """A real detached dead-man with a long grace (it must not fire during the test); returns its pid."""
    res = subprocess.run([sys.executable, str(DEADMAN), "arm", "--run-dir", str(run), "--grace-minutes", "600",
                          "--poll-seconds", "0.1", "--dry-run", *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def wait_dead(pid, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and core.pid_alive(pid):
        time.sleep(0.05)
    return not core.pid_alive(pid)


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_finding_8_a_dead_deadman_after_the_end_is_unwatched(tmp_path, dead_pid, how):
    """The report's repro: the run ended, then the dead-man died; SUCCEEDED exit 0 hid that nothing stops the meter."""
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0, step=500, total=500)
    pid = arm_real_deadman(run)
    try:
        res = status(run, "--no-gpu")
        assert res.returncode == 0 and "deadman armed" in res.stdout, res.stdout   # shown after the end too
        os.kill(pid, signal.SIGKILL if how == "kill -9" else signal.SIGTERM)
        assert wait_dead(pid)
        if how == "SIGTERM":   # it records that it exited; poll for the record, not a fixed sleep
            end = time.monotonic() + 10
            while time.monotonic() < end and json.loads((run / "deadman.json").read_text()).get("state") != "exited":
                time.sleep(0.05)
        res = status(run, "--no-gpu")
        assert res.returncode == 8, res.stdout
        assert res.stdout.startswith("SUCCEEDED") and "UNWATCHED" in res.stdout
        assert ("deadman DOWN" if how == "kill -9" else "deadman exited") in res.stdout
        code, data = as_json(run, "--no-gpu")
        assert code == 8 and data["unwatched"] is True and data["status"] == "succeeded"
        assert data["deadman"]["watching"] is False and "re-arm" in data["hint"]
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("state", ["starting", "running", "syncing", "succeeded", "failed", "sync_failed"])
def test_finding_8_the_deadman_is_shown_in_every_state(tmp_path, live_pid, dead_pid, state):
    pid = live_pid if state in ("starting", "running") else dead_pid
    run = make_run(tmp_path, state, pid, exit_code=None if state in ("starting", "running") else 0)
    if state == "syncing":
        set_status(run, supervisor_pid=live_pid, supervisor_identity=core.process_identity(live_pid))
    write_deadman(run, live_pid)
    assert "deadman armed" in status(run, "--no-gpu").stdout
    write_deadman(run, dead_pid, state="disarmed")
    res = status(run, "--no-gpu")
    assert "deadman disarmed" in res.stdout and res.returncode != 8      # disarmed on purpose: not unwatched
    (run / "deadman.json").unlink()
    assert "deadman none" in status(run, "--no-gpu").stdout


def test_finding_11_a_reused_pid_is_neither_running_nor_armed(tmp_path):
    """An unrelated live process whose pid sits in status.json and deadman.json (a container restart)."""
    other = subprocess.Popen(["sleep", "120"])
    try:
        ident = core.process_identity(other.pid)
        wrong = dict(ident, start_ticks=ident["start_ticks"] - 1000)      # the recorded process started earlier
        run = make_run(tmp_path, "running", other.pid, step=5, total=50)
        set_status(run, job_identity=wrong)
        write_deadman(run, other.pid, identity=wrong)
        code, data = as_json(run, "--no-gpu")
        assert data["status"] != "running" and data["job_alive"] is False, data
        assert data["reason"].startswith("job vanished")
        assert code == 8 and data["unwatched"] is True   # a finished run with nothing watching the meter
        assert data["deadman"]["word"] == "DOWN" and "deadman DOWN" in status(run, "--no-gpu").stdout
        # a record from an older writer (no identity): the pid started after the run and the arming
        set_status(run, job_identity=None, started_at=iso(time.time() - 3600))
        write_deadman(run, other.pid, identity=False, armed_at=iso(time.time() - 3600))
        code, data = as_json(run, "--no-gpu")
        assert data["job_alive"] is False and data["status"] == "failed" and data["deadman"]["word"] == "DOWN"
    finally:
        other.kill()
        other.wait()


def test_finding_14_syncing_with_a_dead_supervisor_is_sync_failed(tmp_path, dead_pid, live_pid):
    run = make_run(tmp_path, "syncing", dead_pid, exit_code=0, step=500, total=500)
    set_status(run, supervisor_pid=dead_pid, supervisor_identity=core.process_identity(dead_pid))
    code, data = as_json(run, "--no-gpu")
    assert code == 1 and data["status"] == "sync_failed" and "NOT durable" in data["reason"]
    assert "do NOT tear down" in data["hint"]
    set_status(run, supervisor_pid=live_pid, supervisor_identity=core.process_identity(live_pid))
    code, data = as_json(run, "--no-gpu")
    assert code == 4 and data["status"] == "syncing"


def test_stall_limit_is_the_one_the_deadman_was_armed_with(tmp_path, live_pid):
    run = make_run(tmp_path, "running", live_pid, step=50, total=500, files_age=40 * 60, started_ago=3600)
    write_deadman(run, live_pid, config={"stall_minutes": 60})
    code, data = as_json(run, "--no-gpu")
    assert code == 4 and data["stall_minutes"] == 60           # 40 min quiet is within the dead-man's 60
    write_deadman(run, live_pid, config={"stall_minutes": 10})
    assert status(run, "--no-gpu").returncode == 6
    write_deadman(run, live_pid, config={"stall_minutes": 0})  # armed with the stall rule off
    assert status(run, "--no-gpu").returncode == 4
    assert status(run, "--no-gpu", "--stall-minutes", "20").returncode == 6   # an explicit override wins


def test_toolkit_version_is_in_the_line_and_the_json(tmp_path, dead_pid):
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0)
    version = json.loads((NODE / "VERSION.json").read_text())["version"]
    assert "toolkit %s" % version in status(run, "--no-gpu").stdout
    assert as_json(run, "--no-gpu")[1]["toolkit_version"] == version


def test_minor_a_run_without_output_says_what_was_synced(tmp_path, dead_pid):
    """Red-team minor item: no --output used to read 'outputs NOT verified'; the logs are synced and verified."""
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0)
    sync = {"ok": True, "verified": True, "results_dir": str(tmp_path / "results"), "error": None,
            "manifest": str(tmp_path / "results" / "PULL_MANIFEST.json"), "file_count": 3, "total_bytes": 2048,
            "kept_previous": [], "started_at": iso(time.time()), "finished_at": iso(time.time())}
    set_status(run, sync=sync)
    line = status(run, "--no-gpu").stdout
    assert "NOT verified" not in line and "no outputs declared; logs synced and verified (3 files" in line
    run_json = json.loads((run / "run.json").read_text())
    run_json["outputs"] = ["ckpt/*"]
    (run / "run.json").write_text(json.dumps(run_json))
    assert "outputs verified (3 files, 2.0 KiB)" in status(run, "--no-gpu").stdout
    set_status(run, state="sync_failed", sync=dict(sync, ok=False, verified=False, error="No space left on device"))
    line = status(run, "--no-gpu").stdout
    assert line.startswith("SYNC_FAILED") and "outputs NOT verified: No space left on device" in line


def test_watch_json_prints_one_object_per_line(tmp_path, dead_pid):
    run = make_run(tmp_path, "succeeded", dead_pid, exit_code=0)
    res = status(run, "--no-gpu", "--json", "--watch", "0.1")
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 0 and len(lines) == 1 and json.loads(lines[0])["status"] == "succeeded"


def test_every_option_is_in_the_docstring():
    """Both directions: every option --help lists is in the docstring, and the docstring names no other."""
    import re
    sys.path.insert(0, str(NODE))
    try:
        import run_status as rs
    finally:
        sys.path.pop(0)
    res = subprocess.run([sys.executable, str(STATUS), "--help"], capture_output=True, text=True, timeout=30)
    parser_flags = set(re.findall(r"--[a-z][a-z-]+", res.stdout)) - {"--help"}
    doc_flags = set(re.findall(r"--[a-z][a-z-]+", rs.__doc__))
    assert parser_flags and parser_flags - doc_flags == set() and doc_flags - parser_flags == set()


@pytest.mark.parametrize("regex,expected", [
    (r"(\d+)", (40, None)),                                  # the supervisor's "[rgt 13:01:54]" is not step 13
    (r"iter (\d+): loss ([\d.]+)", (40, None)),               # a loss in group 2 is not a total
    (r"iter (?P<step>\d+):", (40, None)),
    (r"iter (\d+): loss (\d+)", (40, None)),                 # a whole number below the step is not a total
    (r"iter (\d+)/(\d+)", (None, None)),                    # no line matches
])
def test_progress_regex_on_a_trainer_that_prints_only_text(tmp_path, live_pid, regex, expected):
    """nanoGPT-style stdout (no heartbeat, no total): the status reads the step, never a made-up total."""
    run = make_run(tmp_path, "running", live_pid)
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(doc, progress_regex=regex)))
    (run / "job.log").write_text("iter 30: loss 2.4812, time 51.2ms\niter 40: loss 2.31, time 50.1ms\n"
                                 "[rgt 13:01:54] synced out/ckpt.pt (1000 bytes, sha256 0123456789ab...)\n")
    _code, data = as_json(run)
    assert (data.get("step"), data.get("total_steps")) == expected, data
    # the same line as text mode, but for the free disk, which other processes change between the two looks
    same = lambda line: re.sub(r" disk \S+ \S+ free", " disk N free", line)  # noqa: E731
    assert data["line"].startswith("RUNNING") and same(data["line"]) == same(status(run).stdout.strip())


# ---------------------------------------------------------------- field R12 and newcomer 4 (issue 28)
import progress  # noqa: E402  (the step and ETA reader run_status.py uses)
from conftest import wait_for  # noqa: E402


# A trainer that prints its step and never a total, then waits for RELEASE (or 120 s) and exits 0.
NO_TOTAL_JOB = r"""
import os, sys, time
for step in range(1, 6):
    print("iter %d: loss 0.5" % step, flush=True)
end = time.time() + 120
while not os.path.exists(sys.argv[1]) and time.time() < end:
    time.sleep(0.05)
"""


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
