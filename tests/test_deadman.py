"""Fault drills for scripts/node/deadman.py: real processes, signals and files, tiny intervals.

The meter-stop command is a stand-in shell script that appends one line per call to a file,
so every test can see whether (and when, and with which arguments) the meter would have stopped.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, need

DEADMAN = str(NODE / "deadman.py")
POLL = "0.05"
NO_STOP = "no on-node stop command; the meter is still running"
REFUSED = "refused: destructive stop without verified durable sync"

# A job that checkpoints on SIGTERM: it writes the time into argv[1] and exits 143.
TERM_JOB = r"""
import signal, sys, time
def on_term(signum, frame):
    with open(sys.argv[1], "w") as fh:
        fh.write(repr(time.time()))
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
time.sleep(60)
"""

# A healthy job: rewrites heartbeat.json (atomically) every 0.1 s.
BEATING_JOB = r"""
import json, os, sys, time
path = sys.argv[1]
step = 0
while True:
    step += 1
    with open(path + ".tmp", "w") as fh:
        json.dump({"step": step, "time": time.time()}, fh)
    os.replace(path + ".tmp", path)
    time.sleep(0.1)
"""


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def stand_in(tmp_path, name="stop", rc=0):
    """An executable that appends '<name> <unix time> <args>' to <name>.calls and exits rc."""
    calls = tmp_path / ("%s.calls" % name)
    script = tmp_path / ("%s.sh" % name)
    script.write_text('#!/bin/sh\necho "%s $(date +%%s.%%N) $*" >> "%s"\nexit %d\n' % (name, calls, rc))
    script.chmod(0o755)
    return str(script), calls


def calls_of(path):
    return path.read_text().splitlines() if path.exists() else []


def make_run(tmp_path, **status):
    run = tmp_path / "run"
    run.mkdir()
    if status:
        (run / "status.json").write_text(json.dumps(status))
    return run


def read(run, name):
    return json.loads((run / name).read_text())


def read_or_empty(run, name):
    try:
        return read(run, name)
    except (OSError, ValueError):
        return {}


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def procs():
    """Processes this test started; all are ended (by pid) afterwards."""
    started = []
    yield started
    for item in started:
        pid = item.pid if hasattr(item, "pid") else item
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        if hasattr(item, "wait"):
            item.wait(timeout=5)


def start_job(procs, code, *args):
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    procs.append(proc)
    return proc


def deadman(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, DEADMAN, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def arm_fg(run, *args, env=None, timeout=30):
    return deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--foreground", *args, env=env, timeout=timeout)


def arm_bg(procs, run, *args):
    res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, *args)
    if res.returncode == 0:
        procs.append(int(res.stdout.strip()))
    return res


def wait_for(predicate, timeout=10.0, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def make_sync(run, dest, files):
    """Write files under dest and a sync.json that lists them, as run_one.sh's supervisor does."""
    entries = []
    for rel, data in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    (run / "sync.json").write_text(json.dumps({"ok": True, "verified": True, "dest": str(dest), "files": entries,
                                               "finished_at": iso(time.time()), "error": None}))


# ----------------------------------------------------------------------------- triggers

def test_stalled_job_gets_sigterm_then_meter_stop(tmp_path, procs):
    marker = tmp_path / "job-got-sigterm"
    job = start_job(procs, TERM_JOB, marker)
    run = make_run(tmp_path, state="running", job_pid=job.pid)
    (run / "heartbeat.json").write_text('{"step": 1}')
    stop, calls = stand_in(tmp_path)
    t0 = time.time()
    res = arm_fg(run, "--stall-minutes", "0.01", "--stop-cmd", stop + " meter-off", "--term-grace-seconds", "5",
                 "--sync-wait-seconds", "0")
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["reason"] == "stall" and fired["ok"] is True
    assert time.time() - t0 >= 0.6, "fired before the stall limit"
    assert fired["job_term"]["job_exited"] is True and fired["job_term"]["target"] == "process group %d" % job.pid
    assert job.wait(timeout=5) == 143 and marker.exists(), "the job never saw SIGTERM"
    lines = calls_of(calls)
    assert len(lines) == 1 and lines[0].endswith("meter-off")
    assert float(marker.read_text()) <= float(lines[0].split()[1]), "meter stopped before the job could checkpoint"
    assert [a["rc"] for a in fired["attempts"]] == [0]
    assert read(run, "deadman.json")["state"] == "fired"


@pytest.mark.parametrize("how", ["succeeded", "crashed"])
def test_finished_job_not_acknowledged_stops_after_grace(tmp_path, procs, how):
    if how == "succeeded":
        run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    else:  # job pid gone, no supervisor, status never updated (kill -9 of the whole tree)
        gone = subprocess.Popen(["true"])
        gone.wait()
        run = make_run(tmp_path, state="running", job_pid=gone.pid)
    stop, calls = stand_in(tmp_path)
    t0 = time.time()
    res = arm_fg(run, "--grace-minutes", "0.01", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["reason"] == "job_ended", fired
    assert time.time() - t0 >= 0.6, "fired before the grace period"
    assert len(calls_of(calls)) == 1


def test_ack_postpones_and_disarm_exits_cleanly(tmp_path, procs):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    stop, calls = stand_in(tmp_path)
    assert deadman("ack", "--run-dir", run, "--postpone-minutes", "1").returncode == 0
    res = arm_bg(procs, run, "--grace-minutes", "0.001", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout)
    time.sleep(1.0)                                   # ~17 grace periods: it would have fired by now
    assert not (run / "DEADMAN_FIRED.json").exists() and calls_of(calls) == []
    st = deadman("status", "--run-dir", run)
    assert st.returncode == 0 and st.stdout.startswith("ARMED") and "postponed-until" in st.stdout
    assert "ACK postpones" in (run / "deadman.log").read_text()
    assert deadman("ack", "--run-dir", run, "--disarm").returncode == 0
    assert wait_for(lambda: not pid_alive(pid), 5), "disarmed dead-man kept running"
    assert read(run, "deadman.json")["state"] == "disarmed"
    assert not (run / "DEADMAN_FIRED.json").exists() and calls_of(calls) == []
    assert deadman("status", "--run-dir", run).returncode == 1


def test_postponed_fires_only_after_until(tmp_path):
    run = make_run(tmp_path, state="failed", exit_code=1, ended_at=iso(time.time() - 3600))
    stop, calls = stand_in(tmp_path)
    assert deadman("ack", "--run-dir", run, "--postpone-minutes", "0.025").returncode == 0
    until = read(run, "ACK")["until"]
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    (line,) = calls_of(calls)
    assert float(line.split()[1]) >= until, "fired before the ACK's until"
    assert read(run, "DEADMAN_FIRED.json")["reason"] == "job_ended"


def test_wall_clock_cap_fires_on_a_healthy_job(tmp_path, procs):
    run = make_run(tmp_path)
    job = start_job(procs, BEATING_JOB, run / "heartbeat.json")
    (run / "status.json").write_text(json.dumps({"state": "running", "job_pid": job.pid}))
    stop, calls = stand_in(tmp_path)
    t0 = time.time()
    # stall limit 0.3 s is far below the cap: only a live heartbeat keeps the stall trigger quiet
    res = arm_fg(run, "--stall-minutes", "0.005", "--max-hours", "0.0004", "--stop-cmd", stop,
                 "--term-grace-seconds", "0.5", "--sync-wait-seconds", "0")
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["reason"] == "max_hours", fired
    assert time.time() - t0 >= 1.4
    assert len(calls_of(calls)) == 1
    assert not pid_alive(job.pid), "the capped job was not sent SIGTERM"


def test_no_job_ever_started_fires_no_job(tmp_path):
    run = make_run(tmp_path)
    stop, calls = stand_in(tmp_path)
    res = arm_fg(run, "--grace-minutes", "0.005", "--stop-cmd", stop)
    assert res.returncode == 0
    assert read(run, "DEADMAN_FIRED.json")["reason"] == "no_job" and len(calls_of(calls)) == 1


# ----------------------------------------------------------------------------- the stop action

def test_dry_run_records_but_runs_and_signals_nothing(tmp_path, procs):
    marker = tmp_path / "job-got-sigterm"
    job = start_job(procs, TERM_JOB, marker)
    run = make_run(tmp_path, state="running", job_pid=job.pid)
    stop, calls = stand_in(tmp_path)
    pre, pre_calls = stand_in(tmp_path, "pre")
    res = arm_fg(run, "--stall-minutes", "0.005", "--stop-cmd", stop + " x", "--pre-stop-cmd", pre, "--dry-run")
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["dry_run"] is True and fired["would_run"] == stop + " x" and fired["attempts"] == []
    assert fired["ok"] is False and fired["job_term"]["dry_run"] is True
    assert calls_of(calls) == [] and calls_of(pre_calls) == []
    time.sleep(0.2)
    assert pid_alive(job.pid) and not marker.exists(), "dry run signalled the job"
    assert "DRY RUN: would run" in (run / "deadman.log").read_text()


def test_no_stop_command_is_recorded_loudly(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    res = arm_fg(run, "--grace-minutes", "0")
    assert res.returncode == 1
    assert NO_STOP in res.stderr                          # warned at arm time
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["message"] == NO_STOP and fired["ok"] is False and fired["attempts"] == []
    assert NO_STOP.upper() in (run / "deadman.log").read_text()


def test_failing_stop_is_retried_with_backoff_then_exit_1(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    stop, calls = stand_in(tmp_path, rc=5)
    t0 = time.time()
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop, "--retries", "3", "--retry-backoff", "0.2")
    assert res.returncode == 1
    fired = read(run, "DEADMAN_FIRED.json")
    assert [a["rc"] for a in fired["attempts"]] == [5, 5, 5] and fired["ok"] is False
    assert len(calls_of(calls)) == 3
    assert time.time() - t0 >= 0.6, "no backoff between attempts (0.2 + 0.4 s)"


def test_pre_stop_command_times_out_and_the_stop_still_runs(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    stop, calls = stand_in(tmp_path)
    t0 = time.time()
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop, "--pre-stop-cmd", "sleep 20",
                 "--pre-stop-timeout", "0.5")
    assert res.returncode == 0
    assert time.time() - t0 < 10
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["pre_stop"]["timed_out"] is True and len(calls_of(calls)) == 1


def test_stop_command_expands_env_vars_and_keeps_the_template(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    stop, calls = stand_in(tmp_path)
    fallback, fb_calls = stand_in(tmp_path, "fallback")
    env = dict(os.environ, RGT_TEST_POD="pod-123")
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop + " stop $RGT_TEST_POD", env=env)
    assert res.returncode == 0
    assert calls_of(calls)[0].endswith("stop pod-123")
    assert read(run, "DEADMAN_FIRED.json")["command"].endswith("$RGT_TEST_POD"), "expanded value leaked into the record"
    # an unset variable never runs a half-formed command: the fallback runs instead
    (run / "DEADMAN_FIRED.json").unlink()
    env.pop("RGT_TEST_POD")
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop + " stop $RGT_TEST_POD",
                 "--fallback-stop-cmd", fallback, env=env)
    assert res.returncode == 0
    assert len(calls_of(calls)) == 1 and len(calls_of(fb_calls)) == 1
    assert "RGT_TEST_POD" in read(run, "DEADMAN_FIRED.json")["error"]


# ----------------------------------------------------------------------------- destructive gate

@pytest.mark.parametrize("case", ["no-sync", "tampered", "truncated", "not-allowed", "verified"])
def test_destructive_stop_needs_allow_and_a_verified_durable_sync(tmp_path, case):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    dest = tmp_path / "durable" / "results" / "r1"
    if case != "no-sync":
        make_sync(run, dest, {"ckpt/best.pt": os.urandom(4096), "metrics.json": b'{"acc": 0.9}'})
    if case == "tampered":
        blob = bytearray((dest / "ckpt/best.pt").read_bytes())
        blob[100] ^= 0x01
        (dest / "ckpt/best.pt").write_bytes(bytes(blob))
    if case == "truncated":
        (dest / "metrics.json").write_bytes(b'{"acc"')
    destroy, d_calls = stand_in(tmp_path, "terminate")
    pause, p_calls = stand_in(tmp_path, "pause")
    args = ["--grace-minutes", "0", "--stop-cmd", destroy, "--stop-cmd-destructive", "--fallback-stop-cmd", pause]
    if case != "not-allowed":
        args.append("--allow-destructive")
    res = arm_fg(run, *args)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    if case == "verified":
        assert len(calls_of(d_calls)) == 1 and calls_of(p_calls) == []
        assert fired["destructive"] is True and fired["destructive_gate"]["passed"] is True
        assert "refused" not in fired
    else:
        assert calls_of(d_calls) == [], "destructive stop ran without a verified durable copy"
        assert len(calls_of(p_calls)) == 1, "the non-destructive fallback did not run"
        assert fired["refused"].startswith(REFUSED) and fired["destructive"] is False
        assert fired["refused_command"] == destroy and fired["command"] == pause
    if case == "tampered":
        assert "sha256" in fired["destructive_gate"]["detail"]
    if case == "not-allowed":
        assert "--allow-destructive" in fired["destructive_gate"]["detail"]


def test_destructive_profile_refused_without_fallback_keeps_meter_running(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    destroy, d_calls = stand_in(tmp_path, "terminate")
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"generated_by": "test", "schema_version": 1, "profiles": {"rental": {
        "platform": "rental", "defaults": {"METER_STOP_CMD": destroy + " pod", "METER_STOP_DESTRUCTIVE": True}}}}))
    env = dict(os.environ, RGT_PROFILE_INDEX=str(index))
    res = arm_fg(run, "--grace-minutes", "0", "--profile", "rental", "--allow-destructive", env=env)
    assert res.returncode == 1
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["command_source"] is None and fired["refused"].startswith(REFUSED)
    assert fired["message"] == NO_STOP and calls_of(d_calls) == []
    bad = deadman("arm", "--run-dir", run, "--profile", "nope", "--foreground", env=env)
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- arming

def test_arm_detaches_refuses_a_second_and_ignores_sighup(tmp_path, procs):
    run = make_run(tmp_path, state="running", job_pid=os.getpid())
    stop, calls = stand_in(tmp_path)
    t0 = time.time()
    res = arm_bg(procs, run, "--stop-cmd", stop, "--stall-minutes", "0")
    assert res.returncode == 0, res.stderr
    assert time.time() - t0 < 5, "arm did not return: it is not detached"
    pid = int(res.stdout)
    assert read(run, "deadman.json")["pid"] == pid and read(run, "deadman.json")["state"] == "armed"
    assert os.getsid(pid) != os.getsid(0), "the dead-man shares a session with its caller"
    assert os.getsid(pid) != pid, "not double-forked: a session leader can reacquire a terminal"
    assert os.path.realpath("/proc/%d/fd/0" % pid) == os.devnull
    assert os.path.realpath("/proc/%d/fd/1" % pid) == str(run / "deadman.log")
    os.kill(pid, signal.SIGHUP)
    time.sleep(0.3)
    assert pid_alive(pid), "SIGHUP killed the dead-man"
    second = deadman("arm", "--run-dir", run, "--stop-cmd", stop)
    assert second.returncode == 3
    assert "REFUSED" in second.stderr and str(pid) in second.stderr and len(second.stderr.splitlines()) == 1
    os.kill(pid, signal.SIGTERM)                        # killing it is recorded, not silent
    assert wait_for(lambda: not pid_alive(pid), 5)
    assert read(run, "deadman.json")["state"] == "exited"
    assert deadman("status", "--run-dir", run).returncode == 1
    assert calls_of(calls) == []


def test_status_and_usage_errors(tmp_path):
    run = make_run(tmp_path)
    st = deadman("status", "--run-dir", run)
    assert st.returncode == 1 and st.stdout.startswith("NONE")
    for args in (["arm", "--run-dir", tmp_path / "missing"], ["arm", "--run-dir", run, "--stop-cmd", "'unbalanced"],
                 ["arm", "--run-dir", run, "--grace-minutes", "-1"], ["arm", "--run-dir", run, "--retries", "0"],
                 ["frobnicate"], []):
        res = deadman(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert "Traceback" not in res.stderr
    for args in (["--help"], ["arm", "--help"], ["ack", "--help"], ["status", "--help"]):
        assert deadman(*args).returncode == 0
    (run / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1}))
    assert arm_fg(run, "--grace-minutes", "0", "--stop-cmd", "true").returncode == 0
    st = deadman("status", "--run-dir", run, "--json")
    assert st.returncode == 7 and json.loads(st.stdout)["fired"]["reason"] == "job_ended"


# ----------------------------------------------------------------------------- SSH sessions (real sshd)

def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_wait_ssh_holds_while_a_real_ssh_session_is_open(tmp_path, procs):
    sshd = need("sshd")
    need("ssh")
    keygen = need("ssh-keygen")
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))

    def sessions():
        return json.loads(deadman("status", "--run-dir", run, "--json").stdout)["ssh_sessions"]
    baseline = sessions()
    for name in ("host", "user"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    os.chmod(tmp_path, 0o755)
    shutil.copy(tmp_path / "user.pub", tmp_path / "authorized_keys")
    port = _free_port()
    (tmp_path / "sshd_config").write_text("\n".join([
        "Port %d" % port, "ListenAddress 127.0.0.1", "HostKey %s" % (tmp_path / "host"),
        "AuthorizedKeysFile %s" % (tmp_path / "authorized_keys"), "PidFile %s" % (tmp_path / "sshd.pid"),
        "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password", ""]))
    os.makedirs("/run/sshd", exist_ok=True) if os.geteuid() == 0 else None
    daemon = subprocess.Popen([sshd, "-D", "-e", "-f", str(tmp_path / "sshd_config")], stderr=subprocess.DEVNULL)
    procs.append(daemon)
    assert wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 10), "sshd did not listen"
    import pwd
    user = pwd.getpwuid(os.geteuid()).pw_name
    client = subprocess.Popen(["ssh", "-i", str(tmp_path / "user"), "-p", str(port), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                               "-o", "LogLevel=ERROR", "%s@127.0.0.1" % user, "sleep 60"],
                              stdin=subprocess.DEVNULL)
    procs.append(client)
    assert wait_for(lambda: sessions() > baseline, 10), "the SSH session was not detected in /proc"
    stop, calls = stand_in(tmp_path)
    res = arm_bg(procs, run, "--grace-minutes", "0.005", "--wait-ssh", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    time.sleep(1.0)
    assert not (run / "DEADMAN_FIRED.json").exists(), "fired while an SSH session was open"
    assert re.search(r"waiting for \d+ SSH session", (run / "deadman.log").read_text())
    client.kill()
    client.wait()
    fired = wait_for(lambda: "message" in (read_or_empty(run, "DEADMAN_FIRED.json")), 4)   # "message" = done
    if not fired and sessions():
        pytest.skip("our session closed but other SSH sessions on this host keep the dead-man waiting "
                    "(correct behaviour; the firing half of the drill needs a quiet host)")
    assert fired, "did not fire after the last SSH session closed"
    assert read(run, "DEADMAN_FIRED.json")["reason"] == "job_ended" and len(calls_of(calls)) == 1


# ----------------------------------------------------------------------------- standing down

def test_sigterm_ends_the_deadman_promptly_even_with_a_long_poll(tmp_path, procs):
    job = start_job(procs, TERM_JOB, tmp_path / "marker")
    run = make_run(tmp_path, state="running", job_pid=job.pid)
    stop, calls = stand_in(tmp_path)
    res = deadman("arm", "--run-dir", run, "--poll-seconds", "30", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.strip())
    procs.append(pid)
    assert wait_for(lambda: read_or_empty(run, "deadman.json").get("state") == "armed")
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not pid_alive(pid), timeout=3), "dead-man ignored SIGTERM for a whole poll interval"
    assert read(run, "deadman.json")["state"] == "exited"
    assert calls_of(calls) == [] and job.poll() is None, "standing down must not stop the meter or the job"


def test_removed_run_dir_makes_the_deadman_stand_down_without_firing(tmp_path, procs):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    stop, calls = stand_in(tmp_path)
    res = arm_bg(procs, run, "--grace-minutes", "0.05", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.strip())
    assert wait_for(lambda: (run / "deadman.json").exists())
    shutil.rmtree(run)
    assert wait_for(lambda: not pid_alive(pid), timeout=5)
    time.sleep(3.2)  # past the grace period: a dead-man still running would have fired by now
    assert calls_of(calls) == []


def test_suspend_is_told_apart_from_a_stall():
    """A wall-clock jump the monotonic clock did not see is a suspend, not a hung job."""
    sys.path.insert(0, str(NODE))
    try:
        import deadman as dm
    finally:
        sys.path.pop(0)
    assert dm.suspended_seconds((1000.0, 50.0), (1030.0, 80.0)) == 0.0        # a normal 30 s poll
    assert dm.suspended_seconds((1000.0, 50.0), (1000.0 + 3600, 80.0)) == 3570  # an hour asleep
    assert dm.suspended_seconds((1000.0, 50.0), (1020.0, 50.5)) == 0.0         # small jitter


@pytest.mark.parametrize("command,word", [
    ("runpodctl remove pod $RUNPOD_POD_ID", "remove"),
    ("vastai destroy instance 42", "destroy"),
    ("curl -X POST https://api.example.invalid/v1/instance-operations/terminate", "terminate"),
])
def test_undeclared_destructive_stop_is_treated_as_destructive(tmp_path, command, word):
    """Fail closed: naming terminate/destroy/remove makes a stop destructive even without the flag."""
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    env = dict(os.environ, RUNPOD_POD_ID="pod-x")
    res = arm_fg(run, "--grace-minutes", "0.005", "--stop-cmd", command, env=env)
    assert res.returncode == 1
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["refused"].startswith(REFUSED) and fired["attempts"] == []
    assert word in res.stderr + (run / "deadman.log").read_text()


def test_destructive_fallback_is_a_usage_error(tmp_path):
    run = make_run(tmp_path, state="running")
    res = deadman("arm", "--run-dir", run, "--stop-cmd", "true", "--fallback-stop-cmd", "vastai destroy instance 1",
                  "--foreground", "--dry-run")
    assert res.returncode == 2 and "non-destructive" in res.stderr and "Traceback" not in res.stderr


def test_dry_run_names_the_variables_it_resolved(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    env = dict(os.environ, RGT_TEST_POD="pod-123")
    res = arm_fg(run, "--grace-minutes", "0.005", "--stop-cmd", "true $RGT_TEST_POD", "--dry-run", env=env)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["variables_resolved"] == ["RGT_TEST_POD"] and "pod-123" not in json.dumps(fired)
