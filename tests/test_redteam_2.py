"""Red-team round 3 (helper E): reproductions for defects in the tools that landed after the first red-team
report: boot_resume.py / rgt.py resume, the dead-man's ack wake-up, final_sweep.py, run_env.py,
run_forensics.py and repro.py.

Each test states the behaviour we expect; each was a strict xfail until its finding was fixed (all 13 are
fixed now, see the commit log). Real components only: real run_one.sh launches, real dead-men, real git,
real bash; conditions are polled with generous deadlines.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import NODE, SCRIPTS, need_module
from repro_fixture import committed_project, git
from conftest import read_json as read

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402

pytestmark = pytest.mark.drill("red-team findings stay fixed")   # every test here is a finding

PY = sys.executable
BOOT = str(NODE / "boot_resume.py")
DEADMAN = str(NODE / "deadman.py")
REPRO = str(SCRIPTS / "repro.py")
FORENSICS = str(SCRIPTS / "run_forensics.py")
RUN_ENV = str(NODE / "run_env.py")
SWEEP = str(NODE / "final_sweep.py")


@pytest.fixture(autouse=True)
def one_toolkit_version(monkeypatch):
    """Other helpers edit scripts/node while this file runs; the version stamp is not what is tested here."""
    monkeypatch.setenv("RGT_SKIP_VERSION_CHECK", "1")


def poll(predicate, timeout=120.0):
    """True as soon as PREDICATE holds; False only after a generous deadline (no sleep-and-assert)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


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
        if pid:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass
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


@pytest.mark.drill("restart re-arms the dead-man")
def test_boot_sweep_survives_one_damaged_run(tmp_path):
    runs = tmp_path / "durable" / "runs"
    cfg = {"config": {"grace_minutes": 30, "poll_seconds": 1, "dry_run": True}}
    for name, attempt in (("a-damaged", "two"), ("b-fine", 1)):
        rd = runs / name
        rd.mkdir(parents=True)
        (rd / "status.json").write_text(json.dumps({"state": "running", "attempt": attempt, "run_id": name}))
        (rd / "run.json").write_text(json.dumps({"run_id": name, "auto_resume": True, "launch_argv": ["--", "true"],
                                                 "cwd": str(tmp_path)}))
        (rd / "deadman.json").write_text(json.dumps(cfg))
    try:
        res = run([PY, BOOT, "--runs-dir", runs, "--dry-run"])
        assert "b-fine" in res.stdout, res.stdout + res.stderr
    finally:
        for name in ("a-damaged", "b-fine"):
            run([PY, DEADMAN, "ack", "--run-dir", runs / name, "--disarm"])


# ---------------------------------------------------------------------------------------------- repro.py

JOB = r'''
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--metrics")
p.add_argument("--out")
a = p.parse_args()
with open(a.metrics, "w") as fh:
    for step in range(6):
        fh.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\n")
if a.out:
    open(a.out, "w").write("weights of the RE-RUN\n")
'''


def recorded_run(tmp_path, cmd_tail, metrics_lines=None):
    """A git project with job.py, and a run dir recorded by the real run_env.py, as a launch leaves it."""
    proj = committed_project(tmp_path, JOB)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    cmd = [PY, "job.py", "--metrics", str(run_dir / "metrics.jsonl")] + cmd_tail
    assert subprocess.run(cmd, cwd=str(proj), timeout=60).returncode == 0
    if metrics_lines is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics_lines))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": cmd, "cwd": str(proj)}))
    res = run([PY, RUN_ENV, run_dir, "--python", PY, "--cwd", proj])
    assert res.returncode == 0, res.stderr
    return proj, run_dir


def test_repro_out_never_overwrites_evidence(tmp_path):
    _proj, run_dir = recorded_run(tmp_path, [])
    before = (run_dir / "run.json").read_bytes()
    res = run([PY, REPRO, run_dir, "-o", run_dir / "run.json"])
    assert (run_dir / "run.json").read_bytes() == before and res.returncode != 0, res.stdout + res.stderr


def test_repro_warns_before_rerun_overwrites_outside_outputs(tmp_path):
    outside = tmp_path / "outputs" / "model.txt"
    outside.parent.mkdir()
    proj, run_dir = recorded_run(tmp_path, ["--out=%s" % outside])
    outside.write_text("weights of the ORIGINAL run\n")
    res = run([PY, REPRO, run_dir, "-o", tmp_path / "repro.sh", "--json"])
    assert res.returncode == 0, res.stderr
    warned = [w for w in json.loads(res.stdout)["warnings"] if str(outside) in w]
    done = subprocess.run(["bash", str(tmp_path / "repro.sh"), str(tmp_path / "w")], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, RGT_PY=PY))
    assert done.returncode == 0, done.stdout + done.stderr
    assert warned or outside.read_text() == "weights of the ORIGINAL run\n", (warned, outside.read_text())


def test_repro_of_a_resumed_run_counts_each_step_once(tmp_path):
    # attempt 1 logged steps 0..4 and died; attempt 2 resumed from the step-2 checkpoint and logged 3..5
    # again: identical numbers, as a deterministic resume gives
    lines = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(5)] + [{"step": s, "loss": 1.0 / (s + 1)}
                                                                     for s in range(3, 6)]
    _proj, run_dir = recorded_run(tmp_path, [], metrics_lines=lines)
    res = run([PY, REPRO, run_dir, "-o", tmp_path / "repro.sh"])
    assert res.returncode == 0, res.stderr
    done = subprocess.run(["bash", str(tmp_path / "repro.sh"), str(tmp_path / "w")], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, RGT_PY=PY))
    assert done.returncode == 0 and "REPRODUCED" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------- run_forensics.py

def test_forensics_json_is_strict_json_with_nan_metrics(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                              for s, v in enumerate([1.0, 0.5, float("nan")])))
    res = run([PY, FORENSICS, "list", rd, "--metric", "loss", "--json"])
    assert res.returncode == 0, res.stderr

    def refuse(token):
        raise ValueError("not JSON: %s" % token)
    json.loads(res.stdout, parse_constant=refuse)


def test_forensics_diff_yaml_dates(tmp_path):
    need_module("yaml", "pip install -r requirements-dev.txt (pyyaml)")
    for name, day in (("a", "2026-12-01"), ("b", "2026-12-02")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("lr: 0.1\ndata_snapshot: %s\n" % day)
    res = run([PY, FORENSICS, "diff", tmp_path / "a", tmp_path / "b"])
    assert res.returncode == 0 and "data_snapshot" in res.stdout, res.stdout + res.stderr


# ---------------------------------------------------------------------------------------------- run_env.py

def test_run_env_compare_odd_record(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    odd = tmp_path / "old-env.json"
    odd.write_text(json.dumps({"python": "3.11.7", "torch": "2.3.0", "data": ["/data/x"]}))
    res = run([PY, RUN_ENV, rd, "--python", PY, "--cwd", tmp_path, "--compare", odd, "--timeout", "30"])
    assert res.returncode == 2 and "unexpected" not in res.stderr, res.stderr


def test_run_env_remote_keeps_no_credential(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    git(proj, "commit", "-q", "--allow-empty", "-m", "x")
    rd = tmp_path / "run"
    rd.mkdir()
    leaked = []
    for url in ("https://gitlab.example.com/o/r.git?private_token=glpat-SECRETA",
                "https://ci:p@ssSECRETB@git.example.com/o/r.git"):
        git(proj, "remote", "remove", "origin") if "origin" in git(proj, "remote") else None
        git(proj, "remote", "add", "origin", url)
        res = run([PY, RUN_ENV, rd, "--python", PY, "--cwd", proj, "--timeout", "30"])
        assert res.returncode == 0, res.stderr
        remote = json.loads((rd / "env.json").read_text())["git"]["remote"]
        if "SECRET" in remote:
            leaked.append(remote)
    assert not leaked, leaked


# ---------------------------------------------------------------------------------------------- final_sweep.py

@pytest.mark.drill("sweep keeps runs' files apart")
def test_final_sweep_never_replaces_a_verified_copy_with_another_runs_file(box):  # noqa: F811
    for rid in ("abl-a", "abl-b"):
        job = [PY, "-c", "import os; os.makedirs('out', exist_ok=True); open('out/model.bin', 'w')"
                         ".write('weights of %s')" % rid]
        res = box.launch(rid, job, "--no-deadman", "--output", "out/*", "--wait", timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
    kept = box.durable / "results" / "abl-a" / "out" / "model.bin"
    assert kept.read_text() == "weights of abl-a"
    res = run([PY, SWEEP, "--runs-dir", box.durable / "runs", "--json"], env=box.env)
    assert kept.read_text() == "weights of abl-a", (res.returncode, res.stdout)
    verdicts = {r["run_id"]: r for r in json.loads(res.stdout)["runs"]}
    assert res.returncode == 0 and verdicts["abl-a"]["verdict"] == "OK" and verdicts["abl-b"]["verdict"] == "OK"
    assert [n.split(":")[0] for n in verdicts["abl-a"]["left_alone"]] == ["out/model.bin"]


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
