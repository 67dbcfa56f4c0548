"""Fault drills for scripts/node/run_one.sh: real bash, tmux, setsid, signals, files and the real dead-man.

Each test builds a throw-away profile index (RGT_PROFILE_INDEX) whose METER_STOP_CMD is a stand-in
script that appends a line to a file, so a firing dead-man is visible and harmless.
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS, TOOLS, missing, need, need_root, pid_alive, wait_for
from conftest import read_json as read
from node_box import DEADMAN, JOB, RUN_ONE, TERMINAL, Box, path_without  # noqa: F401  (Box: other modules import it)

sys.path.insert(0, str(NODE))
import evidence  # noqa: E402

def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def manifest_of(results_dir):
    """The results dir's PULL_MANIFEST.json, parsed by the one evidence parser (it must be valid)."""
    manifest, problems = evidence.read_manifest(str(results_dir / "PULL_MANIFEST.json"))
    assert problems == [], problems
    return manifest



# ----------------------------------------------------------------------------- static

def test_shellcheck_clean():
    res = subprocess.run([need("shellcheck"), "-x", "-S", "style", RUN_ONE], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_usage_errors_exit_2(box):
    for opts in ([], ["--bogus"], ["--stall-minutes", "soon"], ["--run-id", "bad/id"]):
        argv = ["bash", RUN_ONE, *opts] + (["--", "true"] if opts else [])
        res = subprocess.run(argv, env=box.env, capture_output=True, text=True, cwd=str(box.work), timeout=30)
        assert res.returncode == 2, (opts, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "error" in res.stderr
    bare_bin = box.tmp / "bare-bin"                    # a node with a shell and coreutils but no Python
    bare_bin.mkdir()
    for tool in ("bash", "sed", "dirname", "basename", "cat"):
        os.symlink(shutil.which(tool), bare_bin / tool)
    bare = subprocess.run([str(bare_bin / "bash"), RUN_ONE, "--help"], capture_output=True, text=True,
                          env={"PATH": str(bare_bin)})
    assert bare.returncode == 0 and "Exit codes" in bare.stdout, "--help must work on a bare machine"
    assert not box.durable.exists(), "a usage error created files"


# ----------------------------------------------------------------------------- the happy path, both detach modes

@pytest.mark.parametrize("detach", ["tmux", "setsid"])
def test_success_syncs_verified_and_deadman_armed_before_job(box, detach):
    env = dict(box.env)
    if detach == "tmux":
        need("tmux")
    else:
        env["PATH"] = path_without(box.tmp, "tmux")
        assert subprocess.run(["bash", "-c", "command -v tmux"], env=env).returncode != 0
    hook = box.tmp / "proxy-hook.sh"
    hook.write_text("export RGT_HOOK_SEEN=yes-$RANDOM_UNSET_VAR\n")     # an unset var must not kill the launch
    env["PROXY_HOOK"] = str(hook)
    env["DATA_DIR"] = str(box.tmp / "my-data")                          # the environment beats the profile
    job, cfg = box.job("ok", outputs={"out/model.bin": 300000, "out/sub/metrics.json": 64}, sleep=0.3)
    res = box.launch("ok1", job, "--output", "out/*.bin", "--output", "out/sub", "--grace-minutes", "0.02",
                     "--wait", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    rd = box.run_dir("ok1")
    for text in ("run id:   ok1", "run dir:  %s" % rd, "run_status.py %s" % rd, "tail -f %s/job.log" % rd):
        assert text in res.stdout
    assert ("tmux -L rgt-ok1 attach -t rgt-ok1" in res.stdout) == (detach == "tmux")
    status = box.status("ok1")
    assert status["state"] == "succeeded" and status["exit_code"] == 0 and status["detach"] == detach
    assert (rd / "exit_code").read_text().strip() == "0"
    assert not (rd / "run.lock").exists(), "lock left behind after the run"
    if detach == "tmux":  # the run's private tmux server is gone, and so is its socket file
        sockets = os.environ.get("TMUX_TMPDIR", "/tmp") + "/tmux-%d/rgt-ok1" % os.getuid()
        assert wait_for(lambda: not os.path.exists(sockets), 5), "tmux socket left behind"
    seen = json.loads(open(cfg["seen"]).read())
    assert seen["deadman_at_start"] == "armed", "the dead-man was not armed before the job started"
    assert seen["RGT_RUN_DIR"] == str(rd) and seen["RGT_RUN_ID"] == "ok1"
    assert seen["RGT_HEARTBEAT"] == str(rd / "heartbeat.json")
    assert seen["DATA_DIR"] == str(box.tmp / "my-data") and seen["DURABLE_DIR"] == str(box.durable)
    assert seen["RGT_HOOK_SEEN"] == "yes-", "the proxy hook was not sourced into the job's environment"
    assert seen["cwd"] == str(box.work) and seen["stdin"] == "/dev/null" and seen["pgid"] == seen["pid"]
    run = read(rd / "run.json")
    assert run["cmd"] == job and run["outputs"] == ["out/*.bin", "out/sub"] and run["profile"] == "testbox"
    sync = status["sync"]
    assert sync["ok"] is True and sync["verified"] is True and sync["error"] is None
    dest = box.durable / "results" / "ok1"
    assert sync["results_dir"] == str(dest) and sync["manifest"] == str(dest / "PULL_MANIFEST.json")
    manifest = manifest_of(dest)
    # the run's record travels with its results (the sync waited for run_env.py), so a pull is a run dir
    assert manifest["roster"] == ["out/*.bin", "out/sub", "run.json", "env.json", "logs/**"]
    for name in ("run.json", "env.json"):
        assert (dest / name).read_bytes() == (rd / name).read_bytes()
    paths = [f["path"] for f in manifest["files"]]
    assert [p for p in paths if p.startswith("out/")] == ["out/model.bin", "out/sub/metrics.json"]
    assert {"logs/job.log", "logs/supervisor.log", "logs/deadman.log"} <= set(paths), paths
    assert sync["file_count"] == len(paths) and sync["total_bytes"] == manifest["total_bytes"]
    for entry in manifest["files"]:
        assert sha(dest / entry["path"]) == entry["sha256"]
        if entry["path"].startswith("out/"):
            assert sha(box.work / entry["path"]) == entry["sha256"]
    assert "job: done" in (rd / "job.log").read_text()
    # finished and nobody acknowledged: the dead-man stops the meter after the grace period
    assert wait_for(lambda: read(rd / "DEADMAN_FIRED.json").get("message"), 15)
    fired = read(rd / "DEADMAN_FIRED.json")
    assert fired["reason"] == "job_ended" and fired["ok"] is True
    assert [line.split()[-1] for line in box.stop_calls_lines()] == ["pod-42"]


# ----------------------------------------------------------------------------- exit codes and failed syncs

def test_job_exit_code_is_preserved(box):
    job, _ = box.job("seven", outputs={"out/partial.bin": 10}, code=7)
    res = box.launch("seven", job, "--output", "out/*", "--grace-minutes", "5", "--wait")
    assert res.returncode == 7, res.stderr
    rd = box.run_dir("seven")
    status = box.status("seven")
    assert status["state"] == "failed" and status["exit_code"] == 7
    assert (rd / "exit_code").read_text().strip() == "7"
    assert status["sync"]["ok"] is True, "a failed job's partial outputs should still be saved"
    assert (box.durable / "results" / "seven" / "out" / "partial.bin").stat().st_size == 10


@pytest.mark.parametrize("fault", ["glob-matches-nothing", "results-dir-unwritable"])
def test_failed_durable_sync_is_a_failure_even_when_training_succeeded(box, fault):
    job, _ = box.job("sync", outputs={"out/model.bin": 100})
    if fault == "results-dir-unwritable":   # (an unwritable DURABLE_DIR/results is refused at launch: finding 22)
        (box.durable / "results").mkdir(parents=True)
        (box.durable / "results" / "sync1").write_text("a file where this run's results directory should be\n")
        opts = ["--output", "out/model.bin"]
    else:
        opts = ["--output", "out/model.bin", "--output", "out/*.ckpt"]
    res = box.launch("sync1", job, *opts, "--grace-minutes", "5", "--wait")
    assert res.returncode == 1, res.stdout + res.stderr
    status = box.status("sync1")
    assert status["state"] == "sync_failed" and status["exit_code"] == 0
    sync = status["sync"]
    assert sync["ok"] is False and sync["verified"] is False and sync["error"] and sync["manifest"] is None
    if fault == "glob-matches-nothing":
        assert "out/*.ckpt" in sync["error"]
    assert "SYNC FAILED" in (box.run_dir("sync1") / "job.log").read_text()


# ----------------------------------------------------------------------------- gates

@pytest.mark.drill("low disk or read-only durable refuses launch")
def test_disk_floor_refuses_before_anything_starts(box):
    job, cfg = box.job("floor")
    res = box.launch("floor", job, "--disk-floor-gb", "100000000")
    assert res.returncode == 3, res.stderr
    assert "REFUSED" in res.stderr and "disk floor" in res.stderr
    assert not box.run_dir("floor").exists(), "run dir (and its lock) created despite the refusal"
    env = dict(box.env, DISK_FLOOR_INODES=str(10 ** 15))
    res = box.launch("floor", job, env=env)
    assert res.returncode == 3 and "inodes" in res.stderr
    # the gate refuses before run_one.sh forks anything: no supervisor exists that could start the job later
    assert not os.path.exists(cfg["seen"]), "the job ran although the gate refused"
    assert not box.run_dir("floor").exists()


def test_require_gpu_refuses_a_box_without_one(box):
    job, cfg = box.job("gpu")
    env = dict(box.env, PATH=path_without(box.tmp, "nvidia-smi"))
    res = box.launch("nogpu", job, "--require-gpu", env=env)
    assert res.returncode == 3 and "lists no GPU" in res.stderr
    assert not box.run_dir("nogpu").exists() and not os.path.exists(cfg["seen"])
    # a stand-in nvidia-smi that lists one GPU lets the same launch through
    fake = box.tmp / "fake-bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho "GPU 0: Test GPU (UUID: GPU-00000000)"\n')
    (fake / "nvidia-smi").chmod(0o755)
    env["PATH"] = "%s:%s" % (fake, env["PATH"])
    res = box.launch("onegpu", job, "--require-gpu", "--wait", env=env)
    assert res.returncode == 0, res.stderr
    assert "OK GPU gate: 1 GPU(s)" in res.stderr and os.path.exists(cfg["seen"])


def test_live_lock_refuses_and_sigterm_to_supervisor_reaches_the_job(box):
    job, cfg = box.job("long", sleep=60)
    res = box.launch("busy", job, "--grace-minutes", "5")
    assert res.returncode == 0, res.stderr
    rd = box.run_dir("busy")
    assert wait_for(lambda: box.status("busy").get("state") == "running")
    assert wait_for(lambda: os.path.exists(cfg["seen"]))
    job2, cfg2 = box.job("second")
    res2 = box.launch("busy", job2, "--run-dir", str(rd))
    assert res2.returncode == 3 and "already exists" in res2.stderr and "live" in res2.stderr, res2.stderr  # N19
    # the lock is taken before any fork: a refused launch leaves nothing behind that could start the job later
    assert not os.path.exists(cfg2["seen"]), "a second job started in a locked run dir"
    status = box.status("busy")
    assert (rd / "run.lock" / "pid").read_text().strip() == str(status["supervisor_pid"])
    os.kill(status["supervisor_pid"], signal.SIGTERM)             # what a spot platform does
    final = box.wait_terminal("busy")
    assert os.path.exists(cfg["term_marker"]), "SIGTERM never reached the job"
    assert final["state"] == "interrupted" and final["exit_code"] == 143   # stopped from outside (R5)
    assert "forwarding SIGTERM" in (rd / "job.log").read_text()
    assert wait_for(lambda: not (rd / "run.lock").exists(), 5)


def test_stale_lock_of_a_dead_pid_is_reclaimed(box):
    dead = subprocess.Popen(["true"])
    dead.wait()
    rd = box.run_dir("stale")
    (rd / "run.lock").mkdir(parents=True)
    (rd / "run.lock" / "pid").write_text("%d\n" % dead.pid)
    job, _ = box.job("stale")
    res = box.launch("stale", job, "--grace-minutes", "5", "--wait")
    assert res.returncode == 0, res.stderr
    assert "stale lock" in res.stderr and box.status("stale")["state"] == "succeeded"


# ----------------------------------------------------------------------------- the node runs itself

@pytest.mark.drill("SSH drop: job and dead-man live on")
@pytest.mark.parametrize("detach,signals", [("tmux", [signal.SIGKILL]), ("setsid", [signal.SIGHUP, signal.SIGKILL])])
def test_job_and_deadman_survive_the_launching_session(box, detach, signals):
    setsid = need("setsid")
    env = dict(box.env)
    if detach == "tmux":
        need("tmux")
    else:
        env["PATH"] = path_without(box.tmp, "tmux")
    job, cfg = box.job("survivor", outputs={"out/final.bin": 1000}, sleep=2.0)
    launcher = " ".join("'%s'" % a.replace("'", "'\\''") for a in box.argv("surv", job, "--output", "out/*",
                                                                             "--grace-minutes", "5"))
    # an "SSH session": its own session and process group, killed as a whole like a dropped connection
    session = subprocess.Popen([setsid, "bash", "-c", launcher + "; sleep 60"], cwd=str(box.work), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: box.status("surv").get("state") == "running" and os.path.exists(cfg["seen"]))
        status = box.status("surv")
        dm_pid = read(box.run_dir("surv") / "deadman.json")["pid"]
        for sig in signals:
            os.killpg(session.pid, sig)
            time.sleep(0.2)
        session.wait(timeout=5)
    finally:
        if session.poll() is None:
            session.kill()
    assert pid_alive(status["job_pid"]) and pid_alive(dm_pid), "job or dead-man died with the session"
    final = box.wait_terminal("surv")
    assert final["state"] == "succeeded" and final["detach"] == detach
    assert final["sync"]["verified"] is True and final["sync"]["ok"] is True
    assert pid_alive(dm_pid), "the dead-man should still be watching (grace not over)"


@pytest.mark.drill("stall fires the dead-man")
def test_stalled_job_is_stopped_by_the_deadman(box):
    job, cfg = box.job("hung", sleep=60)                       # alive, silent: no heartbeat, no log lines
    res = box.launch("hung", job, "--stall-minutes", "0.03", "--grace-minutes", "5")
    assert res.returncode == 0, res.stderr
    rd = box.run_dir("hung")
    assert wait_for(lambda: read(rd / "DEADMAN_FIRED.json").get("message"), 20), "the dead-man never fired"
    fired = read(rd / "DEADMAN_FIRED.json")
    assert fired["reason"] == "stall" and fired["ok"] is True
    assert fired["job_term"]["job_exited"] is True and os.path.exists(cfg["term_marker"])
    assert [line.split()[-1] for line in box.stop_calls_lines()] == ["pod-42"]
    assert box.wait_terminal("hung")["exit_code"] == 143


def test_deadman_dry_run_and_no_deadman(box):
    job, _ = box.job("dry")
    res = box.launch("dry", job, "--deadman-dry-run", "--grace-minutes", "0.005", "--deadman-arg", "--retries",
                     "--deadman-arg", "5", "--wait")
    assert res.returncode == 0, res.stderr
    assert "DRY RUN" in res.stdout
    rd = box.run_dir("dry")
    config = read(rd / "deadman.json")["config"]
    assert config["dry_run"] is True and config["retries"] == 5 and config["stop_cmd_source"] == "profile:testbox"
    assert wait_for(lambda: read(rd / "DEADMAN_FIRED.json").get("message"), 10)
    assert read(rd / "DEADMAN_FIRED.json")["would_run"].endswith("pod-42") and box.stop_calls_lines() == []
    job, _ = box.job("nodm")
    res = box.launch("nodm", job, "--no-deadman", "--wait")
    assert res.returncode == 0 and "--no-deadman" in res.stderr and "NOTHING" in res.stderr
    assert not (box.run_dir("nodm") / "deadman.json").exists()
    assert "DISABLED" in res.stdout


def test_relaunch_in_the_same_run_dir_after_the_first_run_is_refused(box):
    """A launch never reuses a run (field N19): with its dead-man still armed or disarmed, a finished run's id is
    refused and nothing of it moves; a next attempt is a resume (tests/test_adapters.py)."""
    job, _ = box.job("first", outputs={"out/a.bin": 10})
    assert box.launch("again", job, "--output", "out/*", "--grace-minutes", "5", "--wait").returncode == 0
    rd = box.run_dir("again")
    res = box.launch("again", job, "--output", "out/*", "--grace-minutes", "5", "--wait")
    assert res.returncode == 3 and "already exists" in res.stderr and "succeeded" in res.stderr, res.stderr
    assert box.status("again")["state"] == "succeeded", "a refused relaunch touched the old run's status"
    dm_pid = read(rd / "deadman.json")["pid"]
    subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(rd), "--disarm"], check=True,
                   capture_output=True)
    assert wait_for(lambda: not pid_alive(dm_pid), 5)
    res = box.launch("again", job, "--output", "out/*", "--grace-minutes", "5", "--wait")
    assert res.returncode == 3 and "already exists" in res.stderr, res.stderr
    assert not (rd / "previous").exists() and box.status("again")["attempt"] == 1


# ----------------------------------------------------------------------------- red-team findings (issue 10)

def launch_in(box, run_id, job_argv, *opts, env=None, cwd=None, timeout=120):
    """Like box.launch, with the dead-man polling slowly (these tests do not wait for it to fire)."""
    box.runs.append(run_id)
    argv = ["bash", RUN_ONE, "--profile", "testbox", "--run-id", run_id, *opts, "--", *job_argv]
    return subprocess.run(argv, cwd=str(cwd or box.work), env=env or box.env, capture_output=True, text=True,
                          timeout=timeout)


def next_attempt(box, run_id, job_argv, *opts):
    """launch_in as a resume's replay: holding RUN_DIR/resume.lock as boot_resume.py does, the one way run_one.sh
    starts another attempt in a run dir that holds a run (field N19); here with another job than the recorded one."""
    import fcntl
    with open(box.run_dir(run_id) / "resume.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        return launch_in(box, run_id, job_argv, *opts)


def leftovers(root):
    """Temp files a writer left behind under ROOT (atomic-write temps, copy parts)."""
    return sorted(str(p) for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".rgt-part")))


def test_finding_1_sync_waits_until_the_jobs_process_group_is_empty(box):
    writer = box.work / "slow_writer.py"
    writer.write_text("import os, time\nos.makedirs('out2', exist_ok=True)\nwith open('out2/final.bin', 'wb') as f:\n"
                      "    for i in range(30):\n        f.write(os.urandom(100000)); f.flush(); time.sleep(0.1)\n")
    job = ["bash", "-c", "%s slow_writer.py & sleep 0.5; echo main done" % sys.executable]
    res = launch_in(box, "torn1", job, "--output", "out2/*", "--no-deadman", "--wait", "--poll-seconds", "0.3")
    assert res.returncode == 0, res.stdout + res.stderr
    status = box.status("torn1")
    assert status["state"] == "succeeded" and status["sync"]["ok"] is True
    durable = box.durable / "results" / "torn1" / "out2" / "final.bin"
    assert durable.stat().st_size == 3000000 == (box.work / "out2" / "final.bin").stat().st_size
    assert sha(durable) == sha(box.work / "out2" / "final.bin")
    entry = [e for e in manifest_of(durable.parent.parent)["files"] if e["path"] == "out2/final.bin"]
    assert entry and entry[0]["size"] == 3000000
    assert "waiting for the rest of its process group" in (box.run_dir("torn1") / "job.log").read_text()


def test_finding_1_a_source_that_changes_during_its_copy_fails_that_file(tmp_path, monkeypatch):
    """A writer outside the job's process group: the copy notices the source move and keeps the old copy."""
    import sync
    work, results, rd = tmp_path / "work", tmp_path / "results", tmp_path / "run"
    for d in (work / "out", results / "out", rd):
        d.mkdir(parents=True)
    (work / "out" / "grow.bin").write_bytes(os.urandom(3 << 20))
    (work / "out" / "steady.bin").write_bytes(os.urandom(1000))
    (results / "out" / "grow.bin").write_bytes(b"the previous good generation")
    (rd / "job.log").write_text("job output\n")
    (rd / "run.json").write_text(json.dumps({"run_id": "chg", "cwd": str(work), "outputs": ["out/*"],
                                             "results_dir": str(results)}))
    real, appended = sync.copy_file, []

    def racing_copy(src, tmp, on_bytes=None):
        def on_chunk(count):  # another process appends while the copy is reading
            if src.endswith("grow.bin") and not appended:
                with open(src, "ab") as fh:
                    fh.write(b"more")
                appended.append(True)
            if on_bytes:
                on_bytes(count)
        return real(src, tmp, on_chunk)

    monkeypatch.setattr(sync, "copy_file", racing_copy)
    doc = sync.Sync(str(rd)).run()
    assert appended and doc["ok"] is False
    assert "out/grow.bin" in doc["error"] and "changed while it was being copied" in doc["error"]
    assert [k["path"] for k in doc["kept_previous"]] == ["out/grow.bin"]
    assert (results / "out" / "grow.bin").read_bytes() == b"the previous good generation"
    assert sha(results / "out" / "steady.bin") == sha(work / "out" / "steady.bin")
    assert leftovers(results) == []


def test_finding_2_dotfiles_in_an_output_glob_are_synced(box):
    ckpt = box.work / "ckpt"
    ckpt.mkdir()
    (ckpt / ".metadata").write_text("meta\n")
    (ckpt / "__0_0.distcp").write_bytes(os.urandom(5000))
    res = launch_in(box, "dot1", ["true"], "--output", "ckpt/*", "--no-deadman", "--wait")
    assert res.returncode == 0, res.stderr
    dest = box.durable / "results" / "dot1"
    assert (dest / "ckpt" / ".metadata").read_text() == "meta\n"
    paths = {e["path"] for e in manifest_of(dest)["files"]}
    assert {"ckpt/.metadata", "ckpt/__0_0.distcp"} <= paths


def test_finding_15_output_matching_only_a_dangling_symlink_or_fifo_is_sync_failed(box):
    ckpt = box.work / "ckpt"
    ckpt.mkdir()
    os.symlink("/nonexistent/step-900.pt", str(ckpt / "best.pt"))
    os.mkfifo(str(ckpt / "events.fifo"))
    res = launch_in(box, "dang1", ["true"], "--output", "ckpt/best.pt", "--output", "ckpt/*.fifo", "--no-deadman",
                    "--wait")
    assert res.returncode == 1, res.stdout + res.stderr
    status = box.status("dang1")
    assert status["state"] == "sync_failed" and status["sync"]["ok"] is False
    error = status["sync"]["error"]
    assert "ckpt/best.pt" in error and "missing" in error and "ckpt/events.fifo" in error and "fifo" in error


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Mount a small tmpfs (root only); unmounted after the test (request it before `box`)."""
    mounts = []

    def mount(name, options):
        need_root("mounting a small tmpfs")
        point = tmp_path / name
        point.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True,
                             text=True)
        if res.returncode != 0:
            missing("cannot mount a tmpfs here (a container needs CAP_SYS_ADMIN: docker run --privileged): %s" % res.stderr.strip())
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.mark.parametrize("exhausted", ["bytes", "inodes"])
def test_finding_14_full_durable_disk_during_the_sync_ends_sync_failed(mount_tmpfs, box, exhausted):
    if exhausted == "bytes":
        small = mount_tmpfs("small", "size=5m")
        outputs = {"out3/a.bin": 3000000, "out3/b.bin": 3000000}
    else:
        small = mount_tmpfs("small", "size=20m,nr_inodes=48")
        outputs = {"out3/f%02d.bin" % i: 100 for i in range(60)}
    for rel, size in outputs.items():
        (box.work / rel).parent.mkdir(parents=True, exist_ok=True)
        (box.work / rel).write_bytes(os.urandom(size))
    env = dict(box.env, DISK_FLOOR_INODES="0")
    durable = small / "dur"
    res = launch_in(box, "full1", ["sleep", "0.5"], "--durable-dir", str(durable), "--disk-floor-gb", "0",
                    "--no-deadman", "--output", "out3/*", "--wait", env=env)
    assert res.returncode == 1, res.stdout + res.stderr
    rd = durable / "runs" / "full1"
    status = read(rd / "status.json")
    assert status["state"] == "sync_failed" and status["exit_code"] == 0
    assert status["sync"]["ok"] is False and "No space left on device" in status["sync"]["error"]
    assert leftovers(small) == [], "temp files left behind"
    for log in ("supervisor.log", "job.log"):
        assert "Traceback" not in (rd / log).read_text()
    assert "supervisor exiting with code 1" in (rd / "supervisor.log").read_text()
    assert not (rd / "run.lock").exists()


@pytest.mark.drill("low disk or read-only durable refuses launch")
@pytest.mark.parametrize("fault", ["read-only", "file-in-the-way"])
def test_finding_22_unwritable_durable_results_dir_is_refused_at_launch(box, fault):
    durable = box.tmp / "ro" / "dur"
    if fault == "file-in-the-way":
        durable.mkdir(parents=True)
        (durable / "results").write_text("a file where the results directory must be\n")
    elif os.geteuid() == 0:   # root ignores permissions: a read-only bind mount
        src = box.tmp / "rosrc"
        (src / "dur").mkdir(parents=True)
        (box.tmp / "ro").mkdir()
        ro = box.tmp / "ro"
        res = subprocess.run("mount --bind '%s' '%s' && mount -o remount,bind,ro '%s'" % (src, ro, ro), shell=True,
                             capture_output=True, text=True)
        if res.returncode != 0:
            subprocess.run(["umount", "-l", str(box.tmp / "ro")], capture_output=True)
            missing("cannot make a read-only bind mount here (a container needs CAP_SYS_ADMIN: docker run --privileged): %s" % res.stderr.strip())
    else:
        durable.mkdir(parents=True)
        durable.chmod(0o555)
    try:
        job, cfg = box.job("ro")
        run_dir = box.tmp / "rorun"
        res = launch_in(box, "ro1", job, "--durable-dir", str(durable), "--run-dir", str(run_dir), "--output",
                        "out/*", "--deadman-dry-run", "--wait")
        assert res.returncode == 3, res.stdout + res.stderr
        assert "REFUSED" in res.stderr and "not writable" in res.stderr and "nothing was started" in res.stderr
        assert not run_dir.exists() and not os.path.exists(cfg["seen"])
    finally:
        if fault == "read-only" and os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(box.tmp / "ro")], capture_output=True)


def test_finding_12_require_gpu_times_out_a_hung_nvidia_smi(box):
    # a stand-in for hardware: an nvidia-smi that hangs like a driver after an Xid error
    fake = box.tmp / "hung-bin"
    fake.mkdir()
    pidfile = box.tmp / "nvidia-smi.pid"
    (fake / "nvidia-smi").write_text('#!/bin/sh\necho $$ > "%s"\nexec sleep 600\n' % pidfile)
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(box.env, PATH="%s:%s" % (fake, box.env["PATH"]))
    job, cfg = box.job("hung-gpu")
    res = launch_in(box, "hunggpu", job, "--require-gpu", "--gpu-timeout", "2", env=env, timeout=90)
    assert res.returncode == 3, res.stderr
    assert "did not answer within 2 s" in res.stderr and "nothing was started" in res.stderr
    assert not box.run_dir("hunggpu").exists() and not os.path.exists(cfg["seen"])
    assert wait_for(lambda: pidfile.exists() and not pid_alive(pidfile.read_text().strip()), 10), \
        "the hung nvidia-smi was left running"


def test_finding_21_non_ascii_run_dir_launches_under_dash_and_the_c_locale(box):
    need("tmux")
    name = "实验-1 it's"
    run_dir = box.durable / "runs" / name
    env = dict(box.env, LANG="C", LC_ALL="C", SHELL="/bin/sh")
    box.runs.append(name)   # the run id becomes run-<time>-<n> (not a safe id); cleanup finds the run dir
    res = subprocess.run(["bash", RUN_ONE, "--profile", "testbox", "--run-dir", str(run_dir), "--deadman-dry-run",
                          "--wait", "--", "sleep", "0.2"], cwd=str(box.work), env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    status = read(run_dir / "status.json")
    assert status["state"] == "succeeded" and status["detach"] == "tmux"


# ----------------------------------------------------------------------------- the sync's evidence

def good_checkpoint_code(path):
    """A job that writes a real checkpoint: torch.save when torch is importable, else a torch-like zip."""
    return ("import zipfile\ntry:\n    import torch\n    torch.save({'w': torch.arange(1000.0)}, %r)\n"
            "except ImportError:\n    with zipfile.ZipFile(%r, 'w') as z:\n"
            "        z.writestr('archive/data.pkl', b'\\x80\\x02}q\\x00.')\n"
            "        z.writestr('archive/data/0', bytes(4000))\n" % (path, path))


@pytest.mark.drill("resume that cannot resume keeps durable output")
def test_a_failing_new_checkpoint_never_replaces_the_previous_good_durable_copy(box):
    opts = ["--output", "ckpt.pt", "--no-deadman", "--wait"]
    res = launch_in(box, "gen", [sys.executable, "-c", good_checkpoint_code("ckpt.pt")], *opts)
    assert res.returncode == 0, res.stdout + res.stderr
    durable = box.durable / "results" / "gen"
    good = sha(durable / "ckpt.pt")
    assert good == sha(box.work / "ckpt.pt")
    assert [e.get("format") for e in manifest_of(durable)["files"] if e["path"] == "ckpt.pt"] == ["torch-zip"]
    good_bytes = (box.work / "ckpt.pt").read_bytes()
    for attempt, (code, why) in enumerate([
            ("open('ckpt.pt', 'wb').close()", "zero bytes"),                       # kill -9 during torch.save
            ("data = open('ckpt.pt', 'rb').read()\nopen('ckpt.pt', 'wb').write(data[:len(data) // 2])",
             "truncated")]):                                                       # a torn copy
        (box.work / "ckpt.pt").write_bytes(good_bytes)
        res = next_attempt(box, "gen", [sys.executable, "-c", code], *opts)
        assert res.returncode == 1, (attempt, res.stdout + res.stderr)
        status = box.status("gen")
        assert status["state"] == "sync_failed" and status["exit_code"] == 0
        sync = status["sync"]
        assert sync["ok"] is False and [k["path"] for k in sync["kept_previous"]] == ["ckpt.pt"]
        assert why in sync["kept_previous"][0]["reason"] and "previous durable copy was kept" in sync["error"]
        assert sha(durable / "ckpt.pt") == good, "the previous good copy was replaced"
        manifest = manifest_of(durable)   # still a valid manifest of what the results dir holds
        assert [e["sha256"] for e in manifest["files"] if e["path"] == "ckpt.pt"] == [good]
        assert evidence.verify_tree(str(durable), manifest, progress=False)[0] == []
        assert sync["manifest"] == str(durable / "PULL_MANIFEST.json")


def test_allow_empty_passes_through_to_the_sync_and_the_manifest(box):
    (box.work / "ckpt").mkdir()
    (box.work / "ckpt" / "a.bin").write_bytes(os.urandom(100))
    (box.work / "ckpt" / "DONE.marker").write_bytes(b"")
    res = launch_in(box, "empty1", ["true"], "--output", "ckpt/*", "--no-deadman", "--wait")
    assert res.returncode == 1 and "ckpt/DONE.marker: zero bytes" in box.status("empty1")["sync"]["error"]
    res = launch_in(box, "empty2", ["true"], "--output", "ckpt/*", "--allow-empty", "ckpt/*.marker", "--no-deadman",
                    "--wait")
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = manifest_of(box.durable / "results" / "empty2")
    assert manifest["allow_empty"] == ["logs/**", "ckpt/*.marker"]
    assert [e["size"] for e in manifest["files"] if e["path"] == "ckpt/DONE.marker"] == [0]
    res = launch_in(box, "empty3", ["true"], "--output", "/abs/*", "--no-deadman")
    assert res.returncode == 2 and "absolute" in res.stderr and not box.run_dir("empty3").exists()


def test_json_launch_report(box):
    res = launch_in(box, "js1", ["sleep", "0.3"], "--deadman-dry-run", "--json", "--poll-seconds", "0.5",
                    "--grace-minutes", "5")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    rd = box.run_dir("js1")
    assert report["run_id"] == "js1" and report["run_dir"] == str(rd) and report["detach"] in ("tmux", "setsid")
    assert report["supervisor_pid"] == box.status("js1")["supervisor_pid"]
    assert report["deadman"]["pid"] == read(rd / "deadman.json")["pid"] and report["deadman"]["state"] == "armed"
    assert report["deadman"]["dry_run"] is True and "final" not in report
    assert any("run_status.py" in w for w in report["watch"]) and "--disarm" not in report["ack"]
    assert report["results_dir"] == str(box.durable / "results" / "js1")
    box.wait_terminal("js1")
    res = launch_in(box, "js2", ["false"], "--no-deadman", "--json", "--wait")
    assert res.returncode == 1
    report = json.loads(res.stdout)
    assert report["deadman"] == {"pid": None, "state": "disabled", "dry_run": False}
    assert report["final"]["state"] == "failed" and report["final"]["exit_code"] == 1
    assert report["final"]["sync"]["ok"] is True


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def test_finding_laptop_9_the_node_records_the_launch_scrubbed_and_runs_it_raw(box):
    """run_one.sh with a presigned URL in the job's argv: run.json (cmd, launch_argv), job.log and the synced
    results never carry the credential; the job and a replay get the raw argv from a 0600 file in the run dir."""
    url = "https://alice:SECRETPW@data.example.com/set.tar?X-Amz-Signature=SECRETSIG"
    job = [sys.executable, "-c", "import sys; open('argv.txt', 'w').write(sys.argv[1])", url]
    res = box.launch("secret", job, "--no-deadman", "--output", "argv.txt", "--wait", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = box.run_dir("secret")
    assert (box.work / "argv.txt").read_text() == url                       # the job got it word for word
    run = json.loads((run_dir / "run.json").read_text())
    assert "SECRET" not in json.dumps(run["cmd"]) and "SECRET" not in json.dumps(run["launch_argv"])
    assert "https://data.example.com/set.tar" in run["cmd"]
    assert "SECRET" not in (run_dir / "job.log").read_text()
    raw = run_dir / ".launch-argv.json"
    assert raw.stat().st_mode & 0o777 == 0o600 and url in json.loads(raw.read_text())["cmd"]
    results = box.durable / "results" / "secret"
    leaked = [p for p in results.rglob("*") if p.is_file() and p.name != "argv.txt" and b"SECRET" in p.read_bytes()]
    assert not leaked and not (results / ".launch-argv.json").exists(), leaked
    sys.path.insert(0, str(NODE))
    import boot_resume
    assert url in boot_resume.replay_argv(run)                              # a replay runs the real launch
