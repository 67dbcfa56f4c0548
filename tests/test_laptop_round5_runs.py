"""Round 5 of the laptop side (issue 35), the findings about runs and the ledger: patrol with a run it cannot
place (L12), a pull killed by its caller (L13), a notify config among the results (L16), a launch the ledger
cannot record (the round-4 residual), patrol's stop lines (N5), the interpreter record per box (N14) and the
field test's N18 messages. ../shared/reports/redteam-2026-12-05-laptop.md has the reproductions.

Real parts: the sshd on 127.0.0.1 (tests/sshd_fixture.py) and real node tools. Where the node must hang
mid-transfer, a small stand-in for ssh plays it and the test says so.
"""
import fcntl
import json
import os
import signal
import subprocess
import sys

from conftest import NODE, SCRIPTS, wait_for
from sshd_fixture import sshd_server  # noqa: F401  (the real sshd on 127.0.0.1)

RGT = SCRIPTS / "rgt.py"


def rgt(tmp_path, server, *args, ledger=None, env=None, timeout=300):
    """rgt.py as the user runs it against the test sshd (its own node-bin and ledger under TMP_PATH)."""
    base = [sys.executable, str(RGT), "--ssh-config", str(server.config), "--node-dir", str(tmp_path / "node-bin"),
            "--ledger", str(ledger or tmp_path / "ledger.jsonl")]
    env = dict(env or os.environ)
    env.pop("RGT_PROFILE_INDEX", None)
    return subprocess.run(base + list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quick_run(tmp_path, server, rid, durable, ledger=None):
    """A finished run on the node: launched through rgt.py, no dead-man, waited for."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    res = rgt(tmp_path, server, "launch", "gpu-box", "--profile", "local", "--run-id", rid, "--durable-dir", durable,
              "--cwd", work, "--", "--no-deadman", "--wait", "--", "python3", "-c", "print('step 1/1')",
              ledger=ledger)
    assert res.returncode == 0, res.stdout + res.stderr
    return durable / "runs" / rid


def pushed(tmp_path, server):
    res = rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- L12: patrol and a run it cannot place

def test_finding_laptop_L12_patrol_reports_a_run_it_cannot_place_and_checks_the_others(
        tmp_path, sshd_server):  # noqa: F811
    durable = tmp_path / "durable"
    pushed(tmp_path, sshd_server)
    quick_run(tmp_path, sshd_server, "ok1", durable)
    # a run rgt.py did not launch (another ledger knew it), reached once with --durable-dir
    quick_run(tmp_path, sshd_server, "ext1", durable, ledger=tmp_path / "other-ledger.jsonl")
    ledger = tmp_path / "ledger.jsonl"
    res = rgt(tmp_path, sshd_server, "status", "gpu-box", "ext1", "--durable-dir", durable)
    assert res.returncode == 0 and "SUCCEEDED" in res.stdout, res.stdout + res.stderr
    row = rows(ledger)[-1]
    assert row["run_id"] == "ext1" and row["run_dir"] == str(durable / "runs" / "ext1"), row
    # an older rgt.py wrote status rows with no run dir: such a run is its own UNKNOWN line, never the end
    with open(ledger, "a") as handle:
        handle.write(json.dumps(dict(row, run_id="ghost1", run_dir=None, results_dir=None)) + "\n")
    patrol = rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert patrol.returncode == 10, patrol.stdout + patrol.stderr
    lines = patrol.stdout.splitlines()
    assert any(line.strip().startswith("ok1 SUCCEEDED") for line in lines), patrol.stdout
    assert any(line.strip().startswith("ext1 SUCCEEDED") for line in lines), patrol.stdout
    ghost = [line for line in lines if line.strip().startswith("ghost1 UNKNOWN")]
    assert ghost and "cannot locate run ghost1" in ghost[0] and "--durable-dir" in ghost[0], patrol.stdout
    doc = json.loads(rgt(tmp_path, sshd_server, "--json", "patrol", "gpu-box", "--min-free-gb", "0").stdout)
    assert {r["run_id"]: r["status"]["status"] for r in doc["runs"]} == {
        "ok1": "succeeded", "ext1": "succeeded", "ghost1": "unknown"}


# ---------------------------------------------------------------- N5: a confirmed and an unconfirmed stop

def test_finding_field_N5_patrol_tells_a_confirmed_stop_from_an_unconfirmed_one(tmp_path, sshd_server):  # noqa: F811
    durable = tmp_path / "durable"
    pushed(tmp_path, sshd_server)
    for rid, confirmed in (("fy", True), ("fn", False), ("fu", None)):
        run_dir = quick_run(tmp_path, sshd_server, rid, durable)
        # the dead-man's own record of a firing (deadman.py writes this shape): the stop ran, exit 0
        (run_dir / "DEADMAN_FIRED.json").write_text(json.dumps({
            "reason": "job_ended", "detail": "not acknowledged", "fired_at": "2026-12-05T10:00:00Z", "ok": True,
            "confirmed": confirmed, "dry_run": False, "attempts": [{"rc": 0}]}))
    patrol = rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert patrol.returncode == 10, patrol.stdout + patrol.stderr
    line = {l.split()[0]: l for l in patrol.stdout.splitlines()[1:]}
    assert "STOP CONFIRMED" in line["fy"] and "NOT CONFIRMED" not in line["fy"], patrol.stdout
    assert "STOP NOT CONFIRMED" in line["fn"] and "STOP NOT CONFIRMED" in line["fu"], patrol.stdout
    strip = lambda text: text.replace(text.split()[0], "", 1)   # noqa: E731  (the run id aside)
    assert strip(line["fy"]) != strip(line["fn"])


# ---------------------------------------------------------------- L13: a pull killed by its caller

# ssh as the stand-in node: `-G` answers as ssh does, `-O exit` ends no master, `cat` of the manifest runs here,
# and the tar stream hangs (a slow node), recording its pid and its parent's (pull_verified.py) first
HANGING_SSH = r'''#!/usr/bin/env python3
import os, subprocess, sys, time
argv = sys.argv[1:]
if "-G" in argv:
    print("user tester\nhostname 127.0.0.1\nport 22"); sys.exit(0)
if "-O" in argv:
    sys.exit(0)
command = argv[-1]
if "tar" in command:
    with open(os.environ["HANG_PIDS"], "w") as fh:
        fh.write("%d %d\n" % (os.getpid(), os.getppid()))
    time.sleep(600)
    sys.exit(1)
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
'''


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_finding_laptop_L13_a_killed_pull_ends_its_child_and_leaves_a_ledger_row(tmp_path):
    results = tmp_path / "node" / "results" / "fk1"
    (results / "out").mkdir(parents=True)
    (results / "out" / "final.json").write_text('{"ok": 1}')
    res = subprocess.run([sys.executable, str(NODE / "build_pull_manifest.py"), "--root", str(results), "--run-id",
                          "fk1", "--roster", "out/*"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    bindir, ctl = tmp_path / "bin", tmp_path / "ctl"
    bindir.mkdir()
    ctl.mkdir()
    (bindir / "ssh").write_text(HANGING_SSH)
    (bindir / "ssh").chmod(0o755)
    pids, ledger = tmp_path / "hang.pids", tmp_path / "ledger.jsonl"
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), HANG_PIDS=str(pids),
               RGT_SSH_CONTROL_PARENT=str(ctl))
    proc = subprocess.Popen([sys.executable, str(RGT), "--ledger", str(ledger), "pull", "gpu", "fk1",
                             "--durable-dir", str(tmp_path / "node"), "--transport", "tar", "--dest",
                             str(tmp_path / "pulled")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: pids.is_file() and pids.read_text().endswith("\n"), 120), proc.stderr.read1()
        hanging, puller = map(int, pids.read_text().split())
        assert len(os.listdir(ctl)) == 1                     # this command's private ssh control folder
        proc.send_signal(signal.SIGTERM)                     # the caller's timeout: rgt.py alone, by pid
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out, err)
    assert b"pull interrupted" in err, err
    assert wait_for(lambda: not alive(puller) and not alive(hanging), 60), "pull_verified.py outlived rgt.py"
    assert os.listdir(ctl) == [], "the ssh control folder was left behind"
    with open(tmp_path / "pulled" / ".pull-fk1.lock", "a") as handle:   # the lock is free for the re-run
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    row = rows(ledger)[-1]
    assert (row["event"], row["result"], row["run_id"]) == ("pull", "interrupted", "fk1"), row
    assert row["run_dir"] == str(tmp_path / "node" / "runs" / "fk1")   # with --durable-dir: recorded (L12)


# ---------------------------------------------------------------- L16: the notify config among a run's results

def test_finding_laptop_L16_notify_setup_refuses_a_config_path_under_a_durable_or_results_dir(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    pulled = tmp_path / "pulled"
    events = [{"event": "launch", "run_id": "sec2", "profile": "vastai", "state": "launched", "attempt": 1,
               "run_dir": "~/rgt/runs/sec2", "results_dir": "~/rgt/results/sec2"},
              {"event": "pull", "run_id": "sec2", "dest": str(pulled), "state": "pulled"}]
    ledger.write_text("".join(json.dumps(dict(r, host="gpu", time="2026-12-05T10:00:0%dZ" % i)) + "\n"
                              for i, r in enumerate(events)))
    src = tmp_path / "n.json"
    src.write_text(json.dumps({"targets": [{"type": "ntfy", "url": "https://ntfy.example/topic"}]}))
    src.chmod(0o600)

    def setup(path):
        return subprocess.run([sys.executable, str(RGT), "--ssh-config", "/dev/null", "--ledger", str(ledger),
                               "notify", "setup", "gpu", "--from", str(src), "--config-path", path],
                              capture_output=True, text=True, timeout=120)
    for path in ("~/rgt/results/sec2/logs/notify.json", "~/rgt/runs/sec2/notify.json", "~/rgt/notify.json",
                 "~/rgt/results/../results/other/n.json", str(pulled / "sec2" / "notify.json")):
        res = setup(path)
        assert res.returncode == 2 and "durable or results dir" in res.stderr, (path, res.stderr)
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    # a path outside them goes on to the node (here: no node, so ssh's own 255)
    res = setup("~/.config/rgt/notify.json")
    assert res.returncode == 255 and "durable or results dir" not in res.stderr, res.stderr


# ---------------------------------------------------------------- round-4 residual: a launch on a full laptop disk

def full_disk(size):
    """A preexec_fn: no file may grow past SIZE bytes, as on a full disk (the write comes back short)."""
    def apply():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_finding_laptop_round4_residual_a_launch_the_ledger_cannot_record_never_starts(
        tmp_path, sshd_server):  # noqa: F811
    durable, work = tmp_path / "durable", tmp_path / "work"
    pushed(tmp_path, sshd_server)
    ledger = tmp_path / "ledger.jsonl"
    before = ledger.read_bytes()
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
            str(tmp_path / "node-bin"), "--ledger", str(ledger)]
    res = subprocess.run(base + ["launch", "gpu-box", "--profile", "local", "--run-id", "torn3", "--durable-dir",
                                 str(durable), "--cwd", str(work), "--", "--no-deadman", "--", "python3", "-c", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         preexec_fn=full_disk(len(before)))   # the ledger's folder is writable; its disk is full
    assert res.returncode == 12, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "nothing was started on gpu-box" in res.stderr, res.stderr
    assert not (durable / "runs" / "torn3").exists() and not work.exists()   # the node never acted
    assert ledger.read_bytes() == before                                     # and no torn row is left


# ---------------------------------------------------------------- N14: the interpreter record, per box

def test_finding_field_N14_the_recorded_interpreter_is_per_box_and_run_before_use(tmp_path, sshd_server):  # noqa: F811
    sys.path.insert(0, str(NODE))
    import rgt_core as core
    node_bin = tmp_path / "node-bin"
    pushed(tmp_path, sshd_server)
    mine = node_bin / core.interpreter_record_name()
    assert mine.is_file() and os.access(mine.read_text().strip(), os.X_OK), "push records this box's interpreter"
    log = tmp_path / "starts.log"

    def interpreter(name, code):
        path = tmp_path / name
        path.write_text('#!/bin/sh\necho "%s $*" >> %s\n%s\n' % (name, log, code))
        path.chmod(0o755)
        return path
    # another box on the same NFS home pushed last: its records (the old shared name, and its own key) name an
    # interpreter that exists here too, so only the key tells them apart
    other = interpreter("other-box-python", 'exec %s "$@"' % sys.executable)
    (node_bin / core.INTERPRETER_FILE).write_text("%s\n" % other)
    (node_bin / ("%s-otherbox-0123456789ab" % core.INTERPRETER_FILE)).write_text("%s\n" % other)
    res = rgt(tmp_path, sshd_server, "probe", "gpu-box")
    assert res.returncode in (0, 3), res.stdout + res.stderr        # 3: the box misses a gate; it ran here
    assert not log.exists(), "another box's interpreter ran here: %s" % log.read_text()
    # this box's record names an interpreter that no longer runs (a venv removed since): checked, python3 instead
    mine.write_text("%s\n" % interpreter("stale-python", "exit 127"))
    res = rgt(tmp_path, sshd_server, "probe", "gpu-box")
    assert res.returncode in (0, 3) and "node_probe" not in log.read_text(), res.stdout + res.stderr + log.read_text()
    assert log.read_text().startswith("stale-python -S -c"), log.read_text()   # it was run, as the check


# ---------------------------------------------------------------- N18: what a running run, a launch and a failure say

WAITING_JOB = "import os, time\nprint('step 1/2', flush=True)\nwhile not os.path.exists('go'): time.sleep(0.05)\n"


def test_finding_field_N18_a_pull_of_a_running_run_says_still_running(tmp_path, sshd_server):  # noqa: F811
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    pushed(tmp_path, sshd_server)
    try:
        res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "live1",
                  "--durable-dir", durable, "--cwd", work, "--", "--no-deadman", "--", "python3", "-c", WAITING_JOB)
        assert res.returncode == 0, res.stdout + res.stderr
        # a launch without resume adapters says what a restart would do to its results
        assert "WARN no resume adapter" in res.stderr and "supersede" in res.stderr, res.stderr
        assert wait_for(lambda: rgt(tmp_path, sshd_server, "status", "gpu-box", "live1").returncode == 4, 120)
        pull = rgt(tmp_path, sshd_server, "pull", "gpu-box", "live1", "--dest", tmp_path / "pulled")
        assert pull.returncode == 1, pull.stdout + pull.stderr
        assert "still running" in pull.stdout and "could not be fetched" not in pull.stdout, pull.stdout
    finally:
        (work / "go").write_text("")
    assert wait_for(lambda: rgt(tmp_path, sshd_server, "status", "gpu-box", "live1").returncode in (0, 1), 120)
    adapted = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "live2",
                  "--durable-dir", durable, "--cwd", work, "--", "--no-deadman", "--wait", "--resume-glob",
                  "ckpt/*", "--resume-arg", "--resume {}", "--", "python3", "-c", "1")
    assert adapted.returncode == 0 and "WARN no resume adapter" not in adapted.stderr, adapted.stderr


def test_finding_field_N18_a_failed_message_always_says_why(tmp_path):
    """The supervisor's `failed` message for a run stopped from outside (a cap, a preemption: here its forwarded
    SIGTERM) and for a job that exited non-zero names the reason; no field reads null."""
    from conftest import webhook_target
    server, heard, values = webhook_target(tmp_path, "a-long-enough-test-secret")
    env = dict(os.environ, **values)
    work, durable = tmp_path / "work", tmp_path / "durable"
    work.mkdir()
    base = ["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir", str(durable),
            "--disk-floor-gb", "0", "--no-deadman"]
    try:
        res = subprocess.run(base + ["--run-id", "bad", "--wait", "--", "sh", "-c", "exit 3"], cwd=str(work),
                             capture_output=True, text=True, env=env, timeout=120)
        assert "finished:" in res.stdout, res.stdout + res.stderr
        # the synced supervisor.log holds the supervisor's own account, not nothing
        synced = (durable / "results" / "bad" / "logs" / "supervisor.log").read_text()
        assert "job exited with code 3" in synced, synced
        res = subprocess.run(base + ["--run-id", "cut", "--", "python3", "-c", WAITING_JOB], cwd=str(work),
                             capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        status = durable / "runs" / "cut" / "status.json"
        assert wait_for(lambda: json.loads(status.read_text()).get("state") == "running", 60)
        os.kill(json.loads(status.read_text())["supervisor_pid"], signal.SIGTERM)   # a preemption's signal
        assert wait_for(lambda: len([h for h in heard if h["event"] == "failed"]) == 2, 120), heard
    finally:
        (work / "go").write_text("")
        server.shutdown()
        server.server_close()
    failed = {h["fields"]["run_id"]: h for h in heard if h["event"] == "failed"}
    assert failed["bad"]["fields"]["reason"] == "the job exited with code 3", failed["bad"]
    assert failed["cut"]["fields"]["state"] == "interrupted", failed["cut"]
    assert failed["cut"]["fields"]["reason"].startswith("stopped by signal SIGTERM"), failed["cut"]
    for message in failed.values():
        assert "null" not in message["text"] and "n/a" not in message["text"], message["text"]
