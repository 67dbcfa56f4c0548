"""Issue 36 part B: the watcher under faults (red-team 2026-12-05 node C9, C10, A3 residual; field N2, N4, N13).

Every drill runs the real processes: the dead-man as a subprocess, a real supervisor through run_one.sh, the boot
sweep and notify.py as the box runs them."""
import calendar
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conftest import NODE, pid_alive, wait_for, webhook
from conftest import read_json as read
from test_deadman import deadman, open_idle_session, procs, stand_in  # noqa: F401  (procs: a fixture)

NOTIFY = str(NODE / "notify.py")
RUN_STATUS = str(NODE / "run_status.py")
BOOT = str(NODE / "boot_resume.py")
POLL = "0.05"


def failing_hook():
    """A webhook that answers 500 to every POST (a passing failure: the message is for the spool)."""
    return webhook(answer=500, read=bytes)


def notify_config(tmp_path, url, **extra):
    target = {"type": "webhook", "name": "hook", "url": url, "secret": "s3cr3t-not-for-logs"}
    target.update(extra)
    path = tmp_path / "notify.json"
    path.write_text(json.dumps({"targets": [target]}))
    path.chmod(0o600)
    return path


def finished(folder, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"state": "succeeded", "exit_code": 0, "run_id": folder.name,
           "ended_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    doc.update(extra)
    (folder / "status.json").write_text(json.dumps(doc))
    return folder


def run_status(run, env=None):
    res = subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu", "--json"], capture_output=True,
                         text=True, env=env, timeout=30)
    return json.loads(res.stdout)


# ----------------------------------------------------------------------------- C9

def test_finding_node_C9_a_message_lost_to_an_unwritable_spool_is_counted_everywhere(tmp_path):
    server, heard = failing_hook()
    try:
        blocker = tmp_path / "full-disk"
        blocker.write_text("a file where the spool dir should be: every spool write fails, as on a full disk")
        env = dict(os.environ, RGT_NOTIFY_CONFIG=str(notify_config(
                       tmp_path, "http://127.0.0.1:%d/in" % server.server_address[1], allow_http=True)),
                   RGT_NOTIFY_SPOOL=str(blocker / "spool"), RGT_NOTIFY_LOST_DIR=str(tmp_path))
        run = finished(tmp_path / "run")
        stop, _calls = stand_in(tmp_path)
        res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--foreground", "--grace-minutes", "0",
                      "--stop-cmd", stop, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        assert heard, "the target was never asked"
        log = (run / "deadman.log").read_text()
        assert "NOTIFY: deadman_fired NOT delivered" in log, log
        assert read(run / "deadman.json")["notify_lost"]["count"] >= 1
        # notify.py status is another process: the failure the spool could not hold is still counted
        st = subprocess.run([sys.executable, NOTIFY, "status", "--json"], capture_output=True, text=True, env=env)
        doc = json.loads(st.stdout)
        assert st.returncode == 1 and doc["dropped"] >= 1 and "dropped" in doc["line"], st.stdout
        human = subprocess.run([sys.executable, NOTIFY, "status"], capture_output=True, text=True, env=env)
        assert "nothing unsent" not in human.stdout and human.returncode == 1, human.stdout
        r = run_status(run, env)
        assert r["notify"]["lost"] >= 1 and "NOT delivered" in r["line"], r["line"]
        assert "s3cr3t" not in log + st.stdout + r["line"]
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- C10

def test_finding_node_C10_a_refused_notify_config_refuses_the_arm_and_the_launch(tmp_path, box, procs):
    bad = notify_config(tmp_path, "http://127.0.0.1:9/in")   # plain http without allow_http: notify.py refuses it
    env = dict(box.env, RGT_NOTIFY_CONFIG=str(bad), RGT_NOTIFY_SPOOL=str(tmp_path / "spool"))
    run = finished(tmp_path / "run")
    stop, _calls = stand_in(tmp_path)
    res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--stop-cmd", stop, env=env)
    if res.returncode == 0:
        procs.append(int(res.stdout.strip()))   # armed after all (the bug): end it afterwards
    assert res.returncode == 3, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "notify config" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert read(run / "deadman.json").get("state") != "armed"
    # the boot sweep's re-arm watches anyway, with the warning (a run is never left unwatched)
    rearm = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--stop-cmd", stop, "--notify-refused-ok",
                    "--grace-minutes", "60", env=env)
    assert rearm.returncode == 0 and "notify config is refused" in rearm.stderr, rearm.stderr
    procs.append(int(rearm.stdout.strip()))
    deadman("ack", "--run-dir", run, "--disarm")
    assert wait_for(lambda: not pid_alive(procs[-1]), 10)
    # a dry run tells no one, so it may arm
    ok = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--stop-cmd", stop, "--dry-run",
                 "--grace-minutes", "60", env=env)
    assert ok.returncode == 0, ok.stderr
    procs.append(int(ok.stdout.strip()))
    deadman("ack", "--run-dir", run, "--disarm")
    # the launch says so in one line and starts nothing
    job, cfg = box.job("c10", sleep=0)
    launch = box.launch("c10", job, env=env)
    assert launch.returncode == 3, launch.stdout + launch.stderr
    said = [ln for ln in launch.stderr.splitlines() if "notify config" in ln]
    assert len(said) == 1 and "Traceback" not in launch.stderr, launch.stderr
    assert not os.path.exists(cfg["seen"]), "the job started although the dead-man could not be armed"


# ----------------------------------------------------------------------------- A3 residual

def test_finding_node_A3_residual_no_stall_while_the_supervisor_waits_for_leftovers(box):
    # The main process exits at once and leaves a helper in its group: the supervisor waits 5 s for it before
    # the sync, with the stall limit (1.8 s) far below that wait.
    job = ["bash", "-c", "sleep 30 & echo main done"]
    env = dict(box.env, RGT_GROUP_WAIT_SECONDS="5", RGT_GROUP_TERM_SECONDS="2")
    res = box.launch("a3r", job, "--stall-minutes", "0.03", "--grace-minutes", "5", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    status = box.wait_terminal("a3r", timeout=30)
    rd = box.run_dir("a3r")
    assert status["state"] == "succeeded" and status["sync"]["ok"] is True, status
    assert not (rd / "DEADMAN_FIRED.json").exists(), read(rd / "DEADMAN_FIRED.json")
    assert box.stop_calls_lines() == [], "the box was stopped before (or while) the run synced"
    assert "the box stop waits" in (rd / "deadman.log").read_text()


# ----------------------------------------------------------------------------- N4

DEAF_JOB = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("deaf job: started", flush=True)
time.sleep(600)
"""


def test_finding_field_N4_a_job_deaf_to_its_stop_signal_is_killed_and_the_stop_follows(box):
    res = box.launch("n4", [sys.executable, "-c", DEAF_JOB], "--stall-minutes", "0.02",
                     "--deadman-arg", "--term-grace-seconds=3", "--deadman-arg", "--sync-wait-seconds=120")
    assert res.returncode == 0, res.stdout + res.stderr
    rd = box.run_dir("n4")
    job_pid = box.status("n4")["job_pid"]
    assert wait_for(lambda: (rd / "DEADMAN_FIRED.json").exists(), 30), "the stall never fired"
    # before any stop attempt (the job's grace is running): "pending", never "FAILED"
    line = wait_for(lambda: (lambda r: r["line"] if "stop pending" in r["line"] else None)(run_status(rd)), 3)
    assert line and "FAILED" not in line, run_status(rd)["line"]
    # SIGKILL after the 3 s grace, the sync, then the box stop, well inside --sync-wait-seconds (120)
    assert wait_for(lambda: box.stop_calls_lines(), 25), "the box stop did not follow the kill"
    assert not pid_alive(job_pid)
    term = read(rd / "DEADMAN_FIRED.json")["job_term"]
    assert term["killed"]["signal"] == "SIGKILL" and term["job_exited"] is True, term
    assert box.status("n4")["state"] in ("interrupted", "failed", "sync_failed"), box.status("n4")


# ----------------------------------------------------------------------------- N2

def test_finding_field_N2_the_boot_sweep_rearms_a_finished_run_whose_deadman_had_not_finished(tmp_path, box):
    # (a) a finished run in its grace: the dead-man dies with the box
    job, _cfg = box.job("n2a", sleep=0)
    res = box.launch("n2a", job, "--grace-minutes", "5", "--wait")
    assert res.returncode == 0, res.stdout + res.stderr
    rd = box.run_dir("n2a")
    before = read(rd / "deadman.json")
    os.kill(before["pid"], signal.SIGKILL)
    assert wait_for(lambda: not pid_alive(before["pid"]), 5)
    # (b) a run whose dead-man fired and whose stop was NOT CONFIRMED (this box was still up after it)
    other = finished(box.durable / "runs" / "n2b")
    stop, calls = stand_in(tmp_path)
    fg = deadman("arm", "--run-dir", other, "--poll-seconds", POLL, "--foreground", "--grace-minutes", "0",
                 "--stop-cmd", stop, "--confirm-seconds", "0.3", "--retries", "1", "--stop-retry-minutes", "0",
                 env=box.env, timeout=60)
    assert fg.returncode == 1 and read(other / "DEADMAN_FIRED.json")["confirmed"] is False, fg.stderr
    box.runs.append("n2b")   # cleanup disarms and ends what the sweep arms
    sweep = subprocess.run([sys.executable, BOOT, "--runs-dir", str(box.durable / "runs"), "--json"],
                           capture_output=True, text=True, env=box.env, timeout=120)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    acted = {os.path.basename(r["run_dir"]): r for r in json.loads(sweep.stdout)["runs"]}
    assert acted.get("n2a", {}).get("action") == "re-armed the dead-man", sweep.stdout
    assert acted.get("n2b", {}).get("action") == "re-armed the dead-man", sweep.stdout
    st = deadman("status", "--run-dir", rd, "--json")
    assert st.returncode == 0 and json.loads(st.stdout)["status"] == "ARMED", st.stdout
    # the re-armed watcher of (b) takes up its unfinished work: the stop runs again (its grace is 0)
    assert wait_for(lambda: len(calls.read_text().splitlines()) >= 2, 20), "the unconfirmed stop was not retried"
    wait_for(lambda: read(other / "deadman.json").get("state") not in ("armed", "firing"), 20)
    assert read(rd / "deadman.json")["config"]["grace_minutes"] == before["config"]["grace_minutes"] == 5.0
    # a second sweep finds (a) watched: nothing to do there
    again = subprocess.run([sys.executable, BOOT, "--runs-dir", str(box.durable / "runs"), "--json"],
                           capture_output=True, text=True, env=box.env, timeout=60)
    assert "n2a" not in again.stdout, again.stdout


# ----------------------------------------------------------------------------- N13

def as_nobody():
    user = pwd.getpwnam("nobody")

    def drop():
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    return drop


def test_finding_field_N13_whose_ssh_sessions_count_and_unmeasurable_idle_is_said(tmp_path, procs, sshd_server):
    me = pwd.getpwuid(os.geteuid()).pw_name
    env = dict(os.environ, RGT_SSHD_PID=str(sshd_server.proc.pid))   # only this test's sshd's sessions
    run = finished(tmp_path / "run")
    open_idle_session(sshd_server, procs)
    assert wait_for(lambda: json.loads(deadman("status", "--run-dir", run, "--json", env=env).stdout)
                    ["ssh_sessions"] >= 1, 15), "the test's own SSH session was not seen"
    stop, calls = stand_in(tmp_path)
    # another user's session does not hold this run's stop off
    res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--foreground", "--grace-minutes", "0.005",
                  "--wait-ssh", "--ssh-user", "somebody-else", "--stop-cmd", stop, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert read(run / "DEADMAN_FIRED.json")["reason"] == "job_ended" and calls.exists()
    # the arming user's own session does (the default --ssh-user)
    run2 = finished(tmp_path / "run2")
    armed = deadman("arm", "--run-dir", run2, "--poll-seconds", POLL, "--grace-minutes", "0.005", "--wait-ssh",
                    "--stop-cmd", stop, env=env)
    assert armed.returncode == 0, armed.stderr
    procs.append(int(armed.stdout.strip()))
    assert wait_for(lambda: re.search(r"waiting for \d+ SSH session", (run2 / "deadman.log").read_text()), 20)
    assert read(run2 / "deadman.json")["config"]["ssh_user"] == me
    deadman("ack", "--run-dir", run2, "--disarm")
    # a watcher that cannot read sshd's /proc/PID/io says so at arm and in status
    system_python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else None
    if os.geteuid() == 0 and system_python:   # as root: drop to nobody (the interpreter must be one it can run)
        base = tempfile.mkdtemp(prefix="rgt-n13-")
        os.chmod(base, 0o777)
        try:
            folder = finished(Path(base) / "run")
            os.chmod(folder, 0o777)
            os.chmod(folder / "status.json", 0o666)
            user_env = dict(env, HOME=base, RGT_REGISTRY=os.path.join(base, "registry"))
            blind = subprocess.run([system_python, str(NODE / "deadman.py"), "arm", "--run-dir", str(folder),
                                    "--foreground", "--poll-seconds", POLL, "--grace-minutes", "0", "--dry-run",
                                    "--wait-ssh", "--stop-cmd", "true"], capture_output=True, text=True,
                                   env=user_env, preexec_fn=as_nobody(), timeout=60, cwd=base)
            assert blind.returncode == 0, blind.stderr
            assert "UNMEASURABLE" in blind.stderr, blind.stderr
            st = subprocess.run([system_python, str(NODE / "deadman.py"), "status", "--run-dir", str(folder),
                                 "--json"], capture_output=True, text=True, env=user_env, preexec_fn=as_nobody(),
                                cwd=base)
            assert "UNMEASURABLE" in (json.loads(st.stdout)["ssh_idle_problem"] or ""), st.stdout
        finally:
            shutil.rmtree(base, ignore_errors=True)
    elif os.geteuid() != 0:
        blind = deadman("arm", "--run-dir", finished(tmp_path / "run3"), "--foreground", "--poll-seconds", POLL,
                        "--grace-minutes", "0", "--dry-run", "--wait-ssh", "--stop-cmd", "true", env=env)
        assert "UNMEASURABLE" in blind.stderr, blind.stderr



def test_finding_node_A3_residual_with_the_stall_rule_off_the_grace_never_stops_the_box_mid_sync(box):
    # --stall-minutes 0 turns the stall rule off; the job's main process exits at once and leaves a helper in its
    # group, so the supervisor waits 5 s before its sync, far past the 1.2 s grace counted from arming. Before:
    # with the stall rule off a winding-down run read as "no job", and the box was stopped before the sync.
    job = ["bash", "-c", "sleep 30 & echo main done"]
    env = dict(box.env, RGT_GROUP_WAIT_SECONDS="5", RGT_GROUP_TERM_SECONDS="2")
    res = box.launch("a3off", job, "--stall-minutes", "0", "--grace-minutes", "0.02", env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    status = box.wait_terminal("a3off", timeout=30)
    assert status["state"] == "succeeded" and status["sync"]["ok"] is True, status
    assert wait_for(lambda: box.stop_calls_lines(), 30), "the box was never stopped after the run"
    stopped_at = float(box.stop_calls_lines()[0].split()[1])
    ended = calendar.timegm(time.strptime(status["ended_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert stopped_at >= ended, "the box was stopped %.1f s before its run ended and synced" % (ended - stopped_at)
    assert "the box stop waits" in (box.run_dir("a3off") / "deadman.log").read_text()


def test_finding_node_C9_the_firing_record_says_what_became_of_its_message(tmp_path, procs):
    """DEADMAN_FIRED.json lists the deadman_fired message with what notify.py did with it (here: spooled, the hook
    answered 500), as the stop engine lists its own. Before: the firing's own message was sent and forgotten."""
    server, heard = failing_hook()
    try:
        cfg = notify_config(tmp_path, "http://127.0.0.1:%d/in" % server.server_address[1], allow_http=True)
        env = dict(os.environ, RGT_NOTIFY_CONFIG=str(cfg), RGT_NOTIFY_SPOOL=str(tmp_path / "spool"))
        run = finished(tmp_path / "run")
        stop, _calls = stand_in(tmp_path)
        res = deadman("arm", "--run-dir", run, "--poll-seconds", POLL, "--foreground", "--grace-minutes", "0",
                      "--stop-cmd", stop, "--stop-retry-minutes", "0", env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        told = {n["event"]: n for n in read(run / "DEADMAN_FIRED.json").get("notified", [])}
        assert "deadman_fired" in told, read(run / "DEADMAN_FIRED.json")
        assert told["deadman_fired"]["spooled"] and not told["deadman_fired"]["sent"], told
        assert heard, "the hook never heard the message"
    finally:
        server.shutdown()
