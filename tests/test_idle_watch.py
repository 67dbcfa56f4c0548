"""idle_watch.py: the dead-man for a box with no run (issue 11). Real detached processes; the GPU is a
stand-in `nvidia-smi` on PATH that prints what the real one prints for
`--query-gpu=utilization.gpu --format=csv,noheader,nounits` (one integer per GPU), read from a file
the test controls."""
import json
import os
import subprocess
import sys

import pytest

import conftest
from conftest import NODE

WATCH = NODE / "idle_watch.py"


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, str(WATCH), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def gpu(tmp_path):
    """PATH with a stand-in nvidia-smi whose readings are the lines of tmp_path/util."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    reading = tmp_path / "util"
    reading.write_text("3\n5\n")
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncat %s\n" % reading)
    smi.chmod(0o755)
    return reading, dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")


def wait_for(predicate, what, timeout=90):
    return conftest.wait_for(predicate, timeout, step=0.1, what=what)


def state(watch_dir):
    try:
        return json.loads((watch_dir / "idle_watch.json").read_text())
    except (OSError, ValueError):
        return {}


def marker_cmd(path):
    return f"{sys.executable} -c \"open({str(path)!r}, 'w').write('stopped')\""


def arm(watch_dir, stop, env, *extra):
    res = run("arm", "--watch-dir", watch_dir, "--stop-cmd", stop, "--idle-minutes", "0.02",
              "--poll-seconds", "0.2", "--ignore-ssh", *extra, env=env)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def test_an_idle_box_stops_its_meter(tmp_path, gpu):
    _, env = gpu
    watch, marker = tmp_path / "watch", tmp_path / "METER_STOPPED"
    arm(watch, marker_cmd(marker), env)
    # the record is written before the stop runs: wait for the finished record, not its first version
    fired = wait_for(lambda: state(watch).get("state") == "FIRED" and (watch / "IDLE_FIRED.json").exists()
                     and json.loads((watch / "IDLE_FIRED.json").read_text()).get("ok") and
                     "rc" in json.loads((watch / "IDLE_FIRED.json").read_text()) and   # its last write adds rc
                     json.loads((watch / "IDLE_FIRED.json").read_text()), "the idle watcher to fire and stop")
    assert marker.read_text() == "stopped" and fired["reason"] == "idle_box" and fired["rc"] == 0
    assert fired["confirmed"] is None    # a custom stop cannot be confirmed, and says so
    assert wait_for(lambda: state(watch).get("state") == "FIRED", "the FIRED state")


def test_a_busy_gpu_or_an_active_run_keeps_it_from_firing(tmp_path, gpu):
    reading, env = gpu
    reading.write_text("2\n87\n")   # one GPU busy
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    watch, marker = tmp_path / "watch", tmp_path / "METER_STOPPED"
    arm(watch, marker_cmd(marker), env, "--runs-dir", runs)
    seen = wait_for(lambda: state(watch).get("ticks", 0) >= 5 and state(watch), "five ticks")
    assert "GPU utilization 2/87%" in seen["busy"][0] and not marker.exists()
    # GPUs go quiet, but a live run (this test process as its supervisor) keeps the box busy
    me = {"pid": os.getpid()}
    me.update(json.loads(subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import rgt_core, json;"
                                         " print(json.dumps(rgt_core.process_identity(%d)))" % (str(NODE), os.getpid())],
                                        capture_output=True, text=True).stdout))
    (runs / "r1" / "job.log").write_text("step 1\n")   # it shows progress: a hung, unwatched run would not count
    (runs / "r1" / "status.json").write_text(json.dumps({"state": "running", "supervisor_identity": me}))
    reading.write_text("0\n0\n")
    ticks = state(watch)["ticks"]
    seen = wait_for(lambda: state(watch).get("ticks", 0) >= ticks + 5 and state(watch), "five more ticks")
    assert seen["busy"] == ["active run(s): r1"] and not marker.exists()
    # the run ends: now the box is idle and the watcher fires
    (runs / "r1" / "status.json").write_text(json.dumps({"state": "succeeded", "supervisor_identity": me}))
    wait_for(marker.exists, "the stop after the run ended")


def test_no_gpu_reading_is_never_taken_for_idle(tmp_path, gpu):
    reading, env = gpu
    reading.write_text("[N/A]\n")
    watch, marker = tmp_path / "watch", tmp_path / "METER_STOPPED"
    arm(watch, marker_cmd(marker), env)
    seen = wait_for(lambda: state(watch).get("ticks", 0) >= 5 and state(watch), "five ticks")
    assert "not a utilization" in seen["busy"][0] and not marker.exists()
    assert run("disarm", "--watch-dir", watch).returncode == 0
    assert wait_for(lambda: state(watch).get("state") == "DISARMED", "the disarm")


def test_an_open_ssh_session_keeps_it_from_firing(tmp_path, gpu, sshd_server):
    _, env = gpu
    watch, marker = tmp_path / "watch", tmp_path / "METER_STOPPED"
    session = subprocess.Popen(["ssh", "-tt", "-F", str(sshd_server.config), "-o", "ControlPath=none", "gpu-box",
                                "sleep 600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        res = run("arm", "--watch-dir", watch, "--stop-cmd", marker_cmd(marker), "--idle-minutes", "0.02",
                  "--poll-seconds", "0.2", env=env)
        assert res.returncode == 0, res.stderr
        seen = wait_for(lambda: any("SSH session" in b for b in state(watch).get("busy", [])) and state(watch),
                        "the watcher to see the SSH session")
        assert not marker.exists() and seen["idle_seconds"] == 0
    finally:
        session.kill()
        session.wait()
        run("disarm", "--watch-dir", watch)


def test_destructive_stop_refused_and_one_watcher_per_dir(tmp_path, gpu):
    _, env = gpu
    watch = tmp_path / "watch"
    res = run("arm", "--watch-dir", watch, "--stop-cmd", "vastai destroy instance 123", env=env)
    assert res.returncode == 3 and "destructive" in res.stderr and "Traceback" not in res.stderr
    res = run("arm", "--watch-dir", watch, "--stop-cmd", "true", "--idle-minutes", "30", "--poll-seconds", "0.2",
              env=env)
    assert res.returncode == 0, res.stderr
    again = run("arm", "--watch-dir", watch, "--stop-cmd", "true", env=env)
    assert again.returncode == 3 and "already" in again.stderr
    assert run("disarm", "--watch-dir", watch).returncode == 0
    wait_for(lambda: state(watch).get("state") == "DISARMED", "the disarm")


def test_finding_node_C10_the_idle_watch_refuses_to_arm_with_a_notify_config_the_node_refuses(tmp_path, gpu):
    """As the dead-man's arm: plain http without allow_http is refused by notify.py, so every message of this watcher
    would vanish. Before: the idle watcher armed and would have stopped the box telling no one."""
    _, env = gpu
    bad = tmp_path / "notify.json"
    bad.write_text(json.dumps({"targets": [{"type": "webhook", "name": "hook", "url": "http://127.0.0.1:9/in"}]}))
    bad.chmod(0o600)
    env = dict(env, RGT_NOTIFY_CONFIG=str(bad), RGT_NOTIFY_SPOOL=str(tmp_path / "spool"))
    watch = tmp_path / "watch"
    res = run("arm", "--watch-dir", watch, "--stop-cmd", marker_cmd(tmp_path / "M"), "--ignore-ssh", env=env)
    if res.returncode == 0:   # armed after all (the bug): end it
        run("disarm", "--watch-dir", watch, env=env)
    assert res.returncode == 3, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "notify config is refused" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert state(watch).get("state") != "ARMED"
    # a dry run tells no one, so it may arm
    pid = arm(watch, marker_cmd(tmp_path / "M"), env, "--dry-run", "--idle-minutes", "60")
    assert pid > 1 and wait_for(lambda: state(watch).get("state") == "ARMED", "the dry-run watcher armed")
    assert run("disarm", "--watch-dir", watch, env=env).returncode == 0
