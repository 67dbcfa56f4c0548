"""Fault drills for scripts/node/deadman.py: real processes, signals and files, tiny intervals.

The meter-stop command is a stand-in shell script that appends one line per call to a file,
so every test can see whether (and when, and with which arguments) the meter would have stopped.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, need, need_root, pid_alive, wait_for

sys.path.insert(0, str(NODE))
import destructive  # noqa: E402
import evidence  # noqa: E402
import rgt_core as core  # noqa: E402

DEADMAN = str(NODE / "deadman.py")
POLL = "0.05"
NO_STOP = "no on-node stop command; the meter is still running"
REFUSED = "refused: destructive stop without verified durable sync"

# A job that checkpoints on SIGTERM: it writes the time into argv[1] and exits 143. SIGWINCH is the tests'
# barrier: it touches argv[1].barrier, and Python runs pending handlers in signal order, so a SIGTERM sent
# before it is handled first (see handled_signals_before).
TERM_JOB = r"""
import signal, sys, time
def on_term(signum, frame):
    with open(sys.argv[1], "w") as fh:
        fh.write(repr(time.time()))
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGWINCH, lambda signum, frame: open(sys.argv[1] + ".barrier", "w").close())
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


def text_or_empty(path):
    try:
        return path.read_text()
    except OSError:
        return ""


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


def handled_signals_before(job, marker):
    """Returns once the TERM_JOB JOB has handled every signal sent to it before this call (its barrier file is
    there, or it exited): a negative check on the job then needs no sleep. SIGWINCH is sent again until then:
    one that comes before the job set its handler is ignored."""
    barrier = marker.parent / (marker.name + ".barrier")

    def answered():
        if barrier.exists() or not pid_alive(job.pid):
            return True
        os.kill(job.pid, signal.SIGWINCH)
        return False
    return wait_for(answered, 30)


def deadman(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, DEADMAN, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def arm_fg(run, *args, env=None, timeout=30):
    # --stop-retry-minutes 0: these tests read the first stop sequence's exit; tests/test_stop_engine.py holds the
    # retries (a real dead-man never gives up)
    return deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--foreground", "--stop-retry-minutes", "0",
                   *args, env=env, timeout=timeout)


def evaluations(run):
    """How many checks the run's dead-man has made (its lease): negative checks wait on this, never on a sleep."""
    try:
        return json.loads((run / "lease.json").read_text())["deadman"]["evaluations"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def arm_bg(procs, run, *args):
    res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, *args)
    if res.returncode == 0:
        procs.append(int(res.stdout.strip()))
    return res


def torch_like(payload_size=4096):
    """Bytes laid out as torch.save writes them (a zip with archive/data.pkl), so the content check passes."""
    import io
    import zipfile
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", os.urandom(payload_size))
    return buf.getvalue()


def record_pull(run, results):
    """What the teardown gate leaves on the node once a pull of RESULTS verified: RUN_DIR/pulled.json."""
    manifest, _problems = evidence.read_manifest(str(results / evidence.MANIFEST_NAME))
    (run / "pulled.json").write_text(json.dumps({"files_digest": destructive.files_digest(manifest),
                                                 "verified_at": "2026-12-06T00:00:00Z", "by": "test"}))


def make_sync(run, results, files, run_id="r1", logs=True):
    """What run_one.sh's end-of-run sync leaves: the outputs and logs/ in the results dir, its
    PULL_MANIFEST.json (evidence.build_manifest), and the outcome in status.json "sync"."""
    for rel, data in files.items():
        path = results / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    roster = sorted(files)
    if logs:
        (results / "logs").mkdir(parents=True, exist_ok=True)
        (results / "logs" / "job.log").write_text("step 1\n")
        roster.append("logs/**")
    manifest, problems, _ = evidence.build_manifest(str(results), roster, run_id, allow_empty=["logs/**"],
                                                    progress=False)
    assert problems == [], problems
    (results / evidence.MANIFEST_NAME).write_bytes(evidence.manifest_bytes(manifest))
    doc = read_or_empty(run, "status.json")
    doc.update(run_id=run_id, sync={
        "ok": True, "verified": True, "results_dir": str(results),
        "manifest": str(results / evidence.MANIFEST_NAME), "file_count": manifest["file_count"],
        "total_bytes": manifest["total_bytes"], "error": None, "kept_previous": [],
        "started_at": iso(time.time()), "finished_at": iso(time.time())})
    (run / "status.json").write_text(json.dumps(doc))


# ----------------------------------------------------------------------------- triggers

@pytest.mark.drill("stall fires the dead-man")
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


@pytest.mark.drill("unacknowledged finish stops after grace")
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
    # ten checks span at least nine polls, far past the 0.06 s grace: it would have fired by now
    assert wait_for(lambda: evaluations(run) >= 10, 60), "the dead-man made no checks"
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
    assert handled_signals_before(job, marker)        # the dead-man has exited: anything it sent is handled
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


def test_a_local_run_is_not_told_a_meter_runs(tmp_path):
    """Own machine (profile local): nothing bills, so arming without a stop says so instead of a meter warning."""
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    res = arm_fg(run, "--grace-minutes", "0", "--profile", "local")
    assert "profile local has no platform meter" in res.stderr and "meter is still running if" not in res.stderr
    assert read(run, "DEADMAN_FIRED.json")["message"] == NO_STOP   # the record itself is unchanged


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

GATE_CASES = ["no-sync", "tampered", "truncated", "not-allowed", "verified", "sync-not-ok", "logs-only",
              "extra-file", "other-run", "damaged-manifest"]


@pytest.mark.drill("destructive stop needs verified sync")
@pytest.mark.parametrize("case", GATE_CASES)
def test_destructive_stop_needs_allow_and_a_verified_durable_sync(tmp_path, case):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    results = tmp_path / "durable" / "results" / "r1"
    if case != "no-sync":
        files = {} if case == "logs-only" else {"ckpt/best.pt": torch_like(), "metrics.json": b'{"acc": 0.9}'}
        make_sync(run, results, files, run_id="r1")
    if case == "tampered":
        blob = bytearray((results / "ckpt/best.pt").read_bytes())
        blob[100] ^= 0x01
        (results / "ckpt/best.pt").write_bytes(bytes(blob))
    if case == "truncated":
        (results / "metrics.json").write_bytes(b'{"acc"')
    if case == "sync-not-ok":
        doc = read(run, "status.json")
        doc["sync"].update(ok=False, verified=False, error="No space left on device")
        (run / "status.json").write_text(json.dumps(doc))
    if case == "extra-file":
        (results / "ckpt" / "stray.pt").write_bytes(torch_like(10))
    if case == "other-run":
        doc = read(run, "status.json")
        doc["run_id"] = "r2"
        (run / "status.json").write_text(json.dumps(doc))
    if case == "damaged-manifest":
        (results / evidence.MANIFEST_NAME).write_text('{"schema": "rgt-pull-manifest/1", "files": [')
    if case == "verified":   # the copy here is on this instance's disk: the gate's record of a verified pull
        record_pull(run, results)   # makes it safe to erase (finding C1; tests/test_off_box.py)
    destroy, d_calls = stand_in(tmp_path, "terminate")
    pause, p_calls = stand_in(tmp_path, "pause")
    args = ["--grace-minutes", "0", "--stop-cmd", destroy, "--stop-cmd-destructive", "--fallback-stop-cmd", pause]
    if case != "not-allowed":
        args.append("--allow-destructive")
    res = arm_fg(run, *args)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    detail = fired["destructive_gate"]["detail"]
    if case == "verified":
        assert len(calls_of(d_calls)) == 1 and calls_of(p_calls) == []
        assert fired["destructive"] is True and fired["destructive_gate"]["passed"] is True
        assert "refused" not in fired and "re-verified" in detail
    else:
        assert calls_of(d_calls) == [], "destructive stop ran without a verified durable copy"
        assert len(calls_of(p_calls)) == 1, "the non-destructive fallback did not run"
        assert fired["refused"].startswith(REFUSED) and fired["destructive"] is False
        assert fired["refused_command"] == destroy and fired["command"] == pause
    expected = {"no-sync": "no sync record", "tampered": "sha256", "truncated": "truncated",
                "not-allowed": "--allow-destructive", "sync-not-ok": "No space left", "logs-only": "only the run's logs",
                "extra-file": "extra", "other-run": "is for run 'r1'", "damaged-manifest": "manifest"}
    if case in expected:
        assert expected[case] in detail, detail


@pytest.mark.drill("destructive stop needs verified sync")
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
    seen = evaluations(run)
    os.kill(pid, signal.SIGHUP)      # a SIGHUP that killed it would leave no further evaluation
    assert wait_for(lambda: evaluations(run) >= seen + 2 or not pid_alive(pid), 30)
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


def test_wait_ssh_holds_while_a_real_ssh_session_is_open(tmp_path, procs, ssh_sessions_allowed):
    sshd = need("sshd")
    need("ssh")
    keygen = need("ssh-keygen")
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    env = dict(os.environ)   # RGT_SSHD_PID (set below): only this drill's own sshd's sessions count

    def sessions():
        return json.loads(deadman("status", "--run-dir", run, "--json", env=env).stdout)["ssh_sessions"]
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
    env["RGT_SSHD_PID"] = str(daemon.pid)
    assert sessions() == 0
    assert wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, 10), "sshd did not listen"
    import pwd
    user = pwd.getpwuid(os.geteuid()).pw_name
    client = subprocess.Popen(["ssh", "-i", str(tmp_path / "user"), "-p", str(port), "-o", "BatchMode=yes",
                               "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                               "-o", "LogLevel=ERROR", "%s@127.0.0.1" % user, "sleep 60"],
                              stdin=subprocess.DEVNULL)
    procs.append(client)
    assert wait_for(lambda: sessions() > 0, 10), "the SSH session was not detected in /proc"
    stop, calls = stand_in(tmp_path)
    res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--grace-minutes", "0.005", "--wait-ssh",
                  "--stop-cmd", stop, env=env)
    assert res.returncode == 0, res.stderr
    procs.append(int(res.stdout.strip()))
    assert wait_for(lambda: re.search(r"waiting for \d+ SSH session", text_or_empty(run / "deadman.log")), 30), \
        "the dead-man never said it waits for the SSH session"
    assert not (run / "DEADMAN_FIRED.json").exists(), "fired while an SSH session was open"
    client.kill()
    client.wait()
    # other users' and other sshd servers' sessions on a shared host do not count: the firing half always runs
    fired = wait_for(lambda: "message" in (read_or_empty(run, "DEADMAN_FIRED.json")), 10)   # "message" = done
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
    assert wait_for(lambda: not pid_alive(pid), timeout=30)
    assert calls_of(calls) == []      # a stop runs before the dead-man exits: none ran


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
@pytest.mark.drill("destructive stop needs verified sync")
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


# ----------------------------------------------------------------------------- red-team findings

def import_deadman():
    sys.path.insert(0, str(NODE))
    try:
        import deadman as dm
    finally:
        sys.path.pop(0)
    return dm


WRAPPED_DESTRUCTIVE = [
    'bash -c "vastai destroy instance 1"',
    'sh -c "vastai destroy instance 1"',
    'bash -lc "runpodctl remove pod $RUNPOD_POD_ID"',
    'env X=1 vastai destroy instance 1',
    'env -i PATH=/usr/bin sh -c "vastai destroy instance 1"',
    'sudo vastai destroy instance 1',
    'sudo -u root bash -c "sky down -y c"',
    'nice -n 5 timeout 60 setsid vastai destroy instance 1',
    'sky down -y c',
    'curl -XDELETE https://api.example.invalid/pods/1',
    'curl -X DELETE https://api.example.invalid/pods/1',
    'curl --request DELETE https://api.example.invalid/pods/1',
    'curl -K /root/.config/rgt/stop.curlrc',
    'python3 -c "api.terminateInstance()"',
    'python3 -c "import os; os.system(\'echo hi\')"',
    'perl -e "print 1"',
    'dd if=/dev/zero of=/dev/sda',
    'mkfs.ext4 /dev/nvme0n1',
    'shred -u /workspace/ckpt.pt',
    'wipe -rf /workspace',
    'terminateInstance 42',
    'api_terminate_instance 42',
    'delete_pod 42',
    'bash -c "echo vastai destroy instance 42 >> /tmp/destroyed.log"',
    'bash -c "$(printf %s dmFzdGFp | base64 -d) stop 1"',
    'sh -c "eval $STOP"',
    '$STOP_COMMAND',
    'bash -c "cat /dev/zero > /dev/sda"',
    'docker exec pod sh -c "rm -rf /data"',
    'ssh bastion "vastai destroy instance 1"',
    'bash',
    'awk "BEGIN { system(\\"x\\") }"',
]
KNOWN_SAFE = [
    "shutdown -h now",
    "true",
    "runpodctl stop pod ID",
    "vastai stop instance ID",
    "runpodctl stop pod $RUNPOD_POD_ID",
    "vastai stop instance $CONTAINER_ID",
    "shutdown",
    "sudo shutdown -h now",
    "sky stop -y c",
    "aws ec2 stop-instances --instance-ids i-1",
    "curl -X POST https://api.example.invalid/v1/pods/1/stop",
    "bash -c 'setsid sleep 300 & exit 1'",
    # a stand-in script named by path: its folder (here the test's, named after a test) does not decide
    "/tmp/pytest-of-root/test_removed_run_dir0/stop.sh meter-off",
]


@pytest.mark.drill("destructive stop needs verified sync")
@pytest.mark.parametrize("command", WRAPPED_DESTRUCTIVE)
def test_finding_3_wrapped_destructive_stops_are_detected(command):
    assert import_deadman().destructive_word(command), command


@pytest.mark.parametrize("command", KNOWN_SAFE)
def test_finding_3_known_safe_stops_stay_non_destructive(command):
    assert import_deadman().destructive_word(command) is None, command


def test_finding_3_the_report_repro_never_runs_the_wrapped_destroy(tmp_path):
    """deadman.py arm with a `bash -c "... destroy ..."` stop after sync_failed and without --allow-destructive."""
    run = make_run(tmp_path, state="sync_failed", exit_code=0, ended_at=iso(time.time()))
    doc = read(run, "status.json")
    doc["sync"] = {"ok": False, "verified": False, "error": "disk full", "results_dir": str(tmp_path / "r"),
                   "manifest": None}
    (run / "status.json").write_text(json.dumps(doc))
    destroyed = tmp_path / "destroyed.log"
    res = arm_fg(run, "--grace-minutes", "0.02", "--stop-cmd",
                 'bash -c "echo vastai destroy instance 42 >> %s"' % destroyed)
    assert res.returncode == 1, res.stderr
    assert not destroyed.exists(), "the wrapped destroy ran"
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["refused"].startswith(REFUSED) and fired["destructive_gate"]["passed"] is False
    assert "destroy" in res.stderr


def test_finding_3_a_variable_that_expands_to_a_destroy_is_caught_at_fire_time(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    stop, calls = stand_in(tmp_path)
    fallback, fb_calls = stand_in(tmp_path, "pause")
    env = dict(os.environ, RGT_TEST_ACTION="destroy")
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop + " $RGT_TEST_ACTION instance 1",
                 "--fallback-stop-cmd", fallback, env=env)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert calls_of(calls) == [] and len(calls_of(fb_calls)) == 1
    assert fired["destructive_inferred_at_fire"] == "destroy" and fired["refused"].startswith(REFUSED)


def detached_child_stop(tmp_path, name, then):
    """A stop command that leaves a detached child (its own session) holding stdout, then THEN."""
    pids = tmp_path / ("%s.pids" % name)
    script = tmp_path / ("%s.sh" % name)
    script.write_text('#!/bin/sh\nsetsid sh -c \'echo $$ >> "%s"; exec sleep 300\' &\n%s\n' % (pids, then))
    script.chmod(0o755)
    return str(script), pids


@pytest.mark.parametrize("then", ["exit 1", "exec sleep 300"])
def test_finding_7_a_stop_that_leaves_a_detached_child_is_bounded_then_the_fallback_runs(tmp_path, then):
    """The report's repro: each attempt took 300 s (communicate() waited for the orphan's pipe)."""
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    stop, pids = detached_child_stop(tmp_path, "stop", then)
    fallback, fb_calls = stand_in(tmp_path, "pause")
    started = time.monotonic()
    try:
        res = arm_fg(run, "--grace-minutes", "0.01", "--stop-cmd", stop, "--stop-timeout", "1", "--retries", "2",
                     "--retry-backoff", "0.1", "--fallback-stop-cmd", fallback, timeout=120)
        assert res.returncode == 0, res.stderr
        fired = read(run, "DEADMAN_FIRED.json")
        assert len(fired["attempts"]) == 2 and all(a["seconds"] < 30 for a in fired["attempts"]), fired["attempts"]
        if then != "exit 1":
            assert all(a["timed_out"] for a in fired["attempts"])
        assert fired["fallback"]["ok"] is True and len(calls_of(fb_calls)) == 1 and fired["ok"] is True
        assert "fallback" in fired["message"]
        assert time.monotonic() - started < 100
    finally:
        for line in (pids.read_text().split() if pids.exists() else []):
            try:
                os.kill(int(line), signal.SIGKILL)
            except OSError:
                pass


def test_finding_7_minor_the_fallback_runs_when_the_primary_fails_every_retry(tmp_path):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    stop, calls = stand_in(tmp_path, rc=5)
    fallback, fb_calls = stand_in(tmp_path, "pause")
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop, "--retries", "2", "--retry-backoff", "0.05",
                 "--fallback-stop-cmd", fallback)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert [a["rc"] for a in fired["attempts"]] == [5, 5] and len(calls_of(calls)) == 2
    assert len(calls_of(fb_calls)) == 1 and fired["fallback"]["attempts"][0]["rc"] == 0 and fired["ok"] is True
    # and when the fallback fails too, the record says the meter may still be running
    (run / "DEADMAN_FIRED.json").unlink()
    bad_fallback, _ = stand_in(tmp_path, "broken", rc=7)
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop, "--retries", "1", "--fallback-stop-cmd", bad_fallback)
    fired = read(run, "DEADMAN_FIRED.json")
    assert res.returncode == 1 and fired["ok"] is False and "may still be running" in fired["message"]


class InProcess(object):
    """One dead-man run in a thread of this process, so that time.time can be stepped as the report did."""

    def __init__(self, monkeypatch, run, *args):
        self.dm_mod = import_deadman()
        parsed = self.dm_mod.build_parser().parse_args(
            ["arm", "--run-dir", str(run), "--poll-seconds", "0.05", "--dry-run", "--stop-cmd", "true"] + list(args))
        cfg, _ = self.dm_mod.build_config(parsed, str(run))
        self.dm = self.dm_mod.Deadman(str(run), cfg, foreground=False)
        self.evaluations = 0
        evaluate = self.dm.evaluate

        def counted(now):
            self.evaluations += 1
            return evaluate(now)
        self.dm.evaluate = counted
        monkeypatch.setattr(self.dm_mod.signal, "signal", lambda *a: None)   # handlers need the main thread
        self.result = {}
        self.thread = threading.Thread(target=lambda: self.result.setdefault("rc", self.dm.loop()), daemon=True)

    def step_clock(self, monkeypatch, seconds, after=0.3):
        real, start = time.time, time.monotonic()
        monkeypatch.setattr(time, "time", lambda: real() + (seconds if time.monotonic() - start > after else 0.0))

    def start(self):
        self.dm.write_state()
        self.thread.start()

    def wait_fired(self, run, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.thread.is_alive():
            time.sleep(0.05)
        self.stop()
        return read_or_empty(run, "DEADMAN_FIRED.json")

    def stop(self):
        self.dm.stop_requested = signal.SIGTERM
        self.thread.join(10)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def running_job(tmp_path, proc):
    return make_run(tmp_path, state="running", job_pid=proc.pid, job_identity=core.process_identity(proc.pid),
                    started_at=iso(time.time()))


def test_finding_10_a_backward_clock_step_does_not_delay_the_grace(tmp_path, monkeypatch):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    watch = InProcess(monkeypatch, run, "--grace-minutes", "0.02")      # 1.2 s
    watch.step_clock(monkeypatch, -3600)
    watch.start()
    fired = watch.wait_fired(run)
    assert fired.get("reason") == "job_ended", "a 1 h backward step delayed the grace (old: by the full hour)"


def test_finding_10_a_backward_clock_step_does_not_delay_the_cap(tmp_path, monkeypatch, sleeper):
    run = running_job(tmp_path, sleeper)
    watch = InProcess(monkeypatch, run, "--max-hours", "0.0005", "--stall-minutes", "0")   # 1.8 s
    watch.step_clock(monkeypatch, -3600)
    watch.start()
    assert watch.wait_fired(run).get("reason") == "max_hours"


def test_finding_10_a_forward_clock_step_does_not_fire_the_cap_early(tmp_path, monkeypatch, sleeper):
    run = running_job(tmp_path, sleeper)
    watch = InProcess(monkeypatch, run, "--max-hours", "1", "--stall-minutes", "0")
    watch.step_clock(monkeypatch, 2 * 3600)
    watch.start()
    end = time.monotonic() + 60
    while time.monotonic() < end and watch.thread.is_alive() and watch.evaluations < 40:   # ~30 looks after the step
        time.sleep(0.05)
    still_watching = watch.thread.is_alive()
    watch.stop()
    assert not (run / "DEADMAN_FIRED.json").exists(), "a 2 h forward step fired a 1 h cap after seconds"
    assert still_watching and watch.evaluations >= 40, "the in-process dead-man stopped looking"


def test_finding_11_a_reused_pid_is_not_an_armed_deadman(tmp_path, sleeper):
    """An unrelated live process whose pid sits in deadman.json without its start time."""
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    ident = core.process_identity(sleeper.pid)
    wrong = dict(ident, start_ticks=ident["start_ticks"] - 1000)
    (run / "deadman.json").write_text(json.dumps({"pid": sleeper.pid, "identity": wrong, "state": "armed",
                                                  "config": {}, "armed_at": iso(time.time())}))
    st = deadman("status", "--run-dir", run)
    assert st.returncode == 1 and st.stdout.startswith("DOWN"), st.stdout
    assert json.loads(deadman("status", "--run-dir", run, "--json").stdout)["watching"] is False
    # an older writer's record (no identity) whose pid started after the arming: the same
    (run / "deadman.json").write_text(json.dumps({"pid": sleeper.pid, "state": "armed", "config": {},
                                                  "armed_at": iso(time.time() - 3600)}))
    assert deadman("status", "--run-dir", run).stdout.startswith("DOWN")
    # and nothing stops a new dead-man from arming on this run dir
    res = arm_fg(run, "--grace-minutes", "0", "--dry-run", "--stop-cmd", "true")
    assert res.returncode == 0, res.stderr


def test_finding_11_a_reused_job_pid_is_a_finished_job_and_is_never_signalled(tmp_path, sleeper):
    ident = core.process_identity(sleeper.pid)
    run = make_run(tmp_path, state="running", job_pid=sleeper.pid, started_at=iso(time.time()),
                   job_identity=dict(ident, start_ticks=ident["start_ticks"] - 1000))
    stop, calls = stand_in(tmp_path)
    res = arm_fg(run, "--grace-minutes", "0.01", "--stall-minutes", "0.005", "--stop-cmd", stop,
                 "--term-grace-seconds", "1", "--sync-wait-seconds", "0")
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["reason"] == "job_ended" and "job_term" not in fired, fired
    assert sleeper.poll() is None, "the dead-man signalled an unrelated process that reused the job's pid"


def ssh_session_count(run):
    return json.loads(deadman("status", "--run-dir", run, "--json").stdout)["ssh_sessions"]


def open_idle_session(sshd_server, procs):
    """A session that stays open and silent, like a ControlPersist master or a forgotten window."""
    # -tt: a terminal, so the remote sleep gets SIGHUP and ends with the session instead of outliving the test
    client = subprocess.Popen([sshd_server.ssh, "-tt", "-F", str(sshd_server.config), "-o", "ControlMaster=no",
                               "-o", "ControlPath=none", sshd_server.alias, "sleep 120"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(client)
    return client


def test_finding_13_the_ssh_wait_is_capped(tmp_path, procs, quiet_ssh_host, sshd_server):
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    baseline = ssh_session_count(run)
    open_idle_session(sshd_server, procs)
    assert wait_for(lambda: ssh_session_count(run) > baseline, 15), "the SSH session was not seen in /proc"
    stop, calls = stand_in(tmp_path)
    res = arm_fg(run, "--grace-minutes", "0.005", "--wait-ssh", "--ssh-idle-minutes", "0",
                 "--ssh-wait-max-minutes", "0.03", "--stop-cmd", stop, timeout=60)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert fired["reason"] == "job_ended" and "SSH wait capped" in fired["detail"], fired
    log = (run / "deadman.log").read_text()
    assert re.search(r"waiting for \d+ SSH session", log) and "SSH wait cap" in log
    assert len(calls_of(calls)) == 1


def test_finding_13_an_idle_ssh_session_stops_holding_the_deadman_off(tmp_path, procs, quiet_ssh_host, sshd_server):
    need_root("reading the traffic counters of sshd's session processes (/proc/PID/io)")
    run = make_run(tmp_path, state="succeeded", exit_code=0, ended_at=iso(time.time()))
    baseline = ssh_session_count(run)
    open_idle_session(sshd_server, procs)
    assert wait_for(lambda: ssh_session_count(run) > baseline, 15), "the SSH session was not seen in /proc"
    stop, calls = stand_in(tmp_path)
    res = arm_fg(run, "--grace-minutes", "0.005", "--wait-ssh", "--ssh-idle-minutes", "0.02",
                 "--ssh-wait-max-minutes", "0.5", "--stop-cmd", stop, timeout=90)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    log = (run / "deadman.log").read_text()
    if "SSH session(s) idle" not in log and "SSH wait capped" in fired["detail"]:
        pytest.skip("other, busy SSH sessions on this host kept the dead-man waiting until the cap (correct)")
    assert "SSH session(s) idle" in log and "SSH wait capped" not in fired["detail"], (fired, log)
    assert fired["reason"] == "job_ended" and len(calls_of(calls)) == 1


def test_every_option_is_in_the_docstring():
    dm = import_deadman()
    doc = dm.__doc__
    parser = dm.build_parser()
    flags = set()
    for action in parser._subparsers._group_actions[0].choices.values():
        for act in action._actions:
            flags.update(f for f in act.option_strings if f.startswith("--") and f != "--help")
    assert sorted(f for f in flags if f not in doc) == []
    assert sorted(set(re.findall(r"--[a-z][a-z-]+", doc)) - flags - {"--help"}) == []


# ----------------------------------------------------------------------------- the node registry

@pytest.mark.drill("unacknowledged finish stops after grace")
def test_a_finished_run_waits_while_another_run_on_the_node_trains(tmp_path, procs):
    """Issue 11 drill: two runs, one ends, the other trains: no stop until both are done and the grace has passed."""

    runs = tmp_path / "runs"
    done_run, live_run = runs / "a", runs / "b"
    done_run.mkdir(parents=True)
    live_run.mkdir()
    (done_run / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0, "ended_at": core.utc_iso()}))
    trainer = start_job(procs, "import time; time.sleep(600)")
    (live_run / "status.json").write_text(json.dumps({"state": "running", "job_pid": trainer.pid,
                                                      "job_identity": core.process_identity(trainer.pid)}))
    (live_run / "heartbeat.json").write_text("{}")   # progressing, and watched by its own dead-man below
    other_stop, _ = stand_in(tmp_path, "other")
    res = arm_bg(procs, live_run, "--grace-minutes", "60", "--stall-minutes", "60", "--stop-cmd", other_stop)
    assert res.returncode == 0, res.stderr
    stop, calls = stand_in(tmp_path)
    res = arm_bg(procs, done_run, "--grace-minutes", "0.01", "--stop-cmd", stop)
    assert res.returncode == 0, res.stderr
    log = done_run / "deadman.log"
    assert wait_for(lambda: log.exists() and "another run on this box is active and watched (b)" in log.read_text(), 60)
    seen = evaluations(done_run)      # checks counted past the 0.6 s grace: with the other run active, none fires
    assert wait_for(lambda: evaluations(done_run) >= seen + 10, 60), "the dead-man stopped checking"
    assert calls_of(calls) == [] and not (done_run / "DEADMAN_FIRED.json").exists()
    trainer.kill()
    trainer.wait()
    # DEADMAN_FIRED.json is written before the stop runs: wait for the stop itself, then read the record
    assert wait_for(lambda: calls_of(calls) and "message" in read_or_empty(done_run, "DEADMAN_FIRED.json"), 60)
    assert read(done_run, "DEADMAN_FIRED.json")["reason"] == "job_ended" and len(calls_of(calls)) == 1
