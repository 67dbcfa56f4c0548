"""Resuming a run: boot_resume.py at boot and `rgt.py resume`. A resume that fails, is killed mid-launch or
races another leaves the run watched; a resume waits for (or refuses) a dead-man that is firing.

Real components only: real run_one.sh launches (tests/node_box.py), real dead-men; conditions are polled
with generous deadlines. Each test was a red-team finding (round 3) and keeps its name.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import NODE, kill_group_of, wait_for
from conftest import read_json as read

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402

pytestmark = pytest.mark.drill("red-team findings stay fixed")   # every test here is a finding


PY = sys.executable
BOOT = str(NODE / "boot_resume.py")
DEADMAN = str(NODE / "deadman.py")


@pytest.fixture(autouse=True)
def one_toolkit_version(monkeypatch):
    """Other helpers edit scripts/node while this file runs; the version stamp is not what is tested here."""
    monkeypatch.setenv("RGT_SKIP_VERSION_CHECK", "1")


def poll(predicate, timeout=120.0):
    """True as soon as PREDICATE holds; False only after a generous deadline (conftest's wait_for)."""
    return bool(wait_for(predicate, timeout, step=0.1))


def run(argv, timeout=300, **kw):
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def dead(pid):
    if not pid:
        return True
    try:
        with open("/proc/%d/stat" % int(pid)) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def kill_run_processes(run_dir):
    """A simulated box restart: supervisor, job group and dead-man die together by SIGKILL."""
    status = read(run_dir / "status.json")
    pids = [status.get("job_pid"), status.get("supervisor_pid"), read(run_dir / "deadman.json").get("pid")]
    for pid in pids:
        kill_group_of(pid, run_dir)
    assert poll(lambda: all(dead(p) for p in pids), 60)


def slow_launch_shim(tmp_path):
    """A PATH folder whose `bash` holds back every run_one.sh start until RELEASE exists (a slow or stuck
    launch: disk gate on a busy volume, nvidia-smi hanging, a 30 s supervisor wait). Each start leaves a
    marker. Everything else runs the real bash at once."""
    real = shutil.which("bash")
    shim = tmp_path / "shim"
    shim.mkdir()
    markers = tmp_path / "launches"
    markers.mkdir()
    release = tmp_path / "release"
    (shim / "bash").write_text(
        "#!%s\n"
        "case \"${1:-}\" in *run_one.sh)\n"
        "  : > \"%s/launch.$$\"\n"
        "  n=0; while [ ! -e \"%s\" ] && [ $n -lt 3000 ]; do %s 0.1; n=$((n+1)); done ;;\n"
        "esac\n"
        "exec %s \"$@\"\n" % (real, markers, release, shutil.which("sleep"), real))
    (shim / "bash").chmod(0o755)
    return str(shim), markers, release


def failed_run_with_armed_deadman(box, run_id):
    """A real launch whose job fails at once; its dead-man (dry run, grace 30 min) stays armed: the state
    `rgt.py resume` is made for."""
    res = box.launch(run_id, [PY, "-c", "import sys; sys.exit(1)"], "--deadman-dry-run", "--grace-minutes", "30",
                     timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = box.run_dir(run_id)
    assert poll(lambda: read(run_dir / "status.json").get("state") == "failed", 120)
    assert poll(lambda: core.deadman_state(str(run_dir))["watching"], 60)
    return run_dir


# ---------------------------------------------------------------------------------------------- resume

@pytest.mark.drill("restart re-arms the dead-man")
def test_boot_resume_failed_relaunch_leaves_run_watched(box):  # noqa: F811
    res = box.launch("boot1", [PY, "-c", "import time; time.sleep(900)"], "--auto-resume", "--deadman-dry-run",
                     "--grace-minutes", "0.5", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = box.run_dir("boot1")
    assert poll(lambda: read(run_dir / "status.json").get("state") == "running", 60)
    kill_run_processes(run_dir)
    # after the restart the volume is nearly full (the usual reason the box died): run_one.sh's disk gate refuses
    env = dict(box.env, DISK_FLOOR_GB="1000000")
    boot = run([PY, BOOT, "--runs-dir", box.durable / "runs", "--json"], env=env)
    (only,) = json.loads(boot.stdout)["runs"]
    assert only["action"] == "resumed" and only["ok"] is False, only
    # whatever failed, something must still stop the meter of this idle box
    assert core.deadman_state(str(run_dir))["watching"], (read(run_dir / "status.json"), only)


@pytest.mark.drill("earlier watcher spares a resumed attempt")
def test_resume_killed_mid_launch_leaves_run_watched(tmp_path, box):  # noqa: F811
    run_dir = failed_run_with_armed_deadman(box, "kill1")
    shim, markers, release = slow_launch_shim(tmp_path)
    # the relaunch will fail at run_one.sh's disk gate (a full volume), before it arms a dead-man
    env = dict(box.env, PATH=shim + os.pathsep + box.env["PATH"], DISK_FLOOR_GB="1000000")
    proc = subprocess.Popen([PY, BOOT, "--run", str(run_dir), "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    launcher = None
    try:
        assert poll(lambda: any(markers.iterdir()), 120), "the resume never reached its relaunch"
        launcher = int(next(markers.iterdir()).name.split(".")[1])   # the shim execs run_one.sh in this pid
        os.killpg(proc.pid, signal.SIGKILL)   # the SSH session of `rgt.py resume` drops: its group dies
        proc.wait(60)
    finally:
        release.write_text("go")
    assert poll(lambda: dead(launcher), 120), "run_one.sh never finished"
    # the hand-over outlives the killed resume and records how it ended
    assert poll(lambda: "exit_code" in read(run_dir / "resume.json"), 120), read(run_dir / "resume.json")
    assert read(run_dir / "resume.json").get("rearmed") is True
    watched = core.deadman_state(str(run_dir))["watching"]
    again = run([PY, BOOT, "--runs-dir", box.durable / "runs", "--dry-run", "--json"], env=box.env)
    planned = json.loads(again.stdout)["runs"]
    assert watched or planned, (read(run_dir / "status.json"), core.deadman_state(str(run_dir))["word"])


def test_second_concurrent_resume_is_refused(tmp_path, box):  # noqa: F811
    run_dir = failed_run_with_armed_deadman(box, "twice")
    shim, markers, release = slow_launch_shim(tmp_path)
    env = dict(box.env, PATH=shim + os.pathsep + box.env["PATH"])
    first = subprocess.Popen([PY, BOOT, "--run", str(run_dir), "--json"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    second = None
    try:
        assert poll(lambda: len(list(markers.iterdir())) == 1, 120), "the first resume never reached its relaunch"
        second = subprocess.Popen([PY, BOOT, "--run", str(run_dir), "--json"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        poll(lambda: second.poll() is not None or len(list(markers.iterdir())) > 1, 120)
        launches = len(list(markers.iterdir()))
    finally:
        release.write_text("go")
        out1 = first.communicate(timeout=300)
        out2 = second.communicate(timeout=300) if second else ("", "")
    assert launches == 1 and second.returncode == 3, (launches, second.returncode, out1, out2)


# ---------------------------------------------------------------------------------------------- dead-man hand-over

@pytest.mark.drill("earlier watcher spares a resumed attempt")
def test_resume_waits_for_or_refuses_a_firing_deadman(tmp_path, box):  # noqa: F811
    started, release = tmp_path / "stop.started", tmp_path / "stop.release"
    stop = tmp_path / "slow-stop.sh"
    stop.write_text("#!/bin/sh\n: > %s\nn=0; while [ ! -e %s ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done\n"
                    % (started, release))
    stop.chmod(0o755)
    res = box.launch("fire1", [PY, "-c", "import sys; sys.exit(1)"], "--no-deadman", "--wait", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    run_dir = box.run_dir("fire1")
    arm = run([PY, DEADMAN, "arm", "--run-dir", run_dir, "--grace-minutes", "0.01", "--poll-seconds", "0.2",
               "--stop-cmd", str(stop), "--stop-timeout", "120"], env=box.env)
    assert arm.returncode == 0, arm.stderr
    try:
        assert poll(started.exists, 120), "the dead-man never fired"
        resumed = run([PY, BOOT, "--run", run_dir, "--json"], env=box.env)
    finally:
        release.write_text("go")
    assert resumed.returncode == 3, resumed.stdout
