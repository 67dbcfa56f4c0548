"""Watchers that cannot fail open (issue 23): one stop engine, one run record, every watcher guarded.

Each test is named after the finding it keeps fixed (../shared/reports/redteam-2026-12-03-node.md A<n>,
design-review-2026-12-03.md B<n>, the field test R<n>). Rules are tested as tables over the watcher's
own functions with the clock passed in; the drills (full disk, shebang-less stop, a stop that stops
nothing) run real dead-man processes.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import NODE, missing, webhook_target
from watch_fixture import DEADMAN, POLL, cfg_for, finished_run, running_status, stand_in

sys.path.insert(0, str(NODE))
import deadman  # noqa: E402
import evidence  # noqa: E402
import idle_watch  # noqa: E402
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402
import sessions  # noqa: E402
import stop_engine  # noqa: E402
import launcher  # noqa: E402

pytestmark = [pytest.mark.drill("wave-3 review findings stay fixed")]

IDLE = str(NODE / "idle_watch.py")
RUN_STATUS = str(NODE / "run_status.py")


def calls_of(path):
    return path.read_text().splitlines() if path.exists() else []


def arm_fg(run, *args, env=None, timeout=60):
    return subprocess.run([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--poll-seconds", POLL,
                           "--foreground", "--stop-retry-minutes", "0", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)   # retries: tests/test_stop_engine.py


# ----------------------------------------------------------------------------- the stop engine: drills

@pytest.mark.drill("shebang-less stop script runs")
def test_finding_node_A8_a_shebang_less_stop_runs_through_sh_and_is_checked_at_arm(tmp_path):
    stop, calls = stand_in(tmp_path, shebang=False)          # AutoDL's in-container `shutdown` looks like this
    run = finished_run(tmp_path)
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop + " now")
    assert res.returncode == 0, res.stderr
    fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
    assert calls_of(calls) == ["stop now"] and fired["ok"] is True
    assert fired["attempts"][0]["rc"] == 0 and fired["attempts"][0]["via_sh"] is True
    assert "runs through /bin/sh" in res.stderr
    # a stop that cannot run is refused when armed, with one clear line, not found out when it fires
    res = arm_fg(tmp_path / "run", "--stop-cmd", str(tmp_path / "no-such-stop"))
    assert res.returncode == 3 and "cannot run" in res.stderr and "Traceback" not in res.stderr
    res = arm_fg(tmp_path / "run", "--stop-cmd", "stop $RGT_SURELY_UNSET_VAR_1")
    assert res.returncode == 3 and "$RGT_SURELY_UNSET_VAR_1" in res.stderr


def test_finding_node_A8_the_program_found_at_arm_time_is_the_one_that_runs(tmp_path):
    first, later = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    later.mkdir()
    real, real_calls = stand_in(first, "shutdown")
    os.replace(real, first / "shutdown")
    env_path = "%s%s%s" % (first, os.pathsep, os.environ["PATH"])
    program, problem = None, None
    old = os.environ["PATH"]
    os.environ["PATH"] = env_path
    try:
        program, problem = stop_engine.describe_program("shutdown -h now")
        # later a different `shutdown` appears earlier on PATH: the armed plan still runs the first one
        impostor, impostor_calls = stand_in(later, "impostor")
        os.replace(impostor, later / "shutdown")
        os.environ["PATH"] = "%s%s%s" % (later, os.pathsep, env_path)
        argv, why = stop_engine.runnable(["shutdown", "-h", "now"], program)
    finally:
        os.environ["PATH"] = old
    assert problem is None
    assert argv[0] == str(first / "shutdown") and why is None
    assert subprocess.run(argv).returncode == 0
    assert calls_of(real_calls) == ["shutdown -h now"] and calls_of(impostor_calls) == []


@pytest.mark.drill("no-effect stop is NOT CONFIRMED")
def test_finding_node_A9_a_stop_that_stops_nothing_is_not_confirmed_retried_and_escalated(tmp_path):
    stop, calls = stand_in(tmp_path)                         # exits 0, the box stays up
    fallback, fb_calls = stand_in(tmp_path, "fallback")
    run = finished_run(tmp_path, run_id="r9")
    res = arm_fg(run, "--grace-minutes", "0", "--stop-cmd", stop, "--fallback-stop-cmd", fallback,
                 "--confirm-seconds", "0.2", "--retries", "2", "--retry-backoff", "0")
    assert res.returncode == 1, res.stderr
    fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
    assert fired["ok"] is False and fired["confirmed"] is False
    assert len(calls_of(calls)) == 2 and len(calls_of(fb_calls)) == 2
    assert [a["confirmation"]["method"] for a in fired["attempts"]] == ["still_up", "still_up"]
    assert fired["escalations"] and "NOT CONFIRMED" in fired["escalations"][0]["why"]
    out = subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu"], capture_output=True, text=True)
    assert "STOP NOT CONFIRMED" in out.stdout, out.stdout + out.stderr


def mounted_tmpfs(folder, size):
    """FOLDER, made and with a tmpfs of SIZE mounted on it (the caller unmounts it); missing unless root can mount."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        missing("the full-disk drill mounts a tmpfs: run the tests as root (CI does)")
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", str(folder)]).returncode != 0:
        missing("mount -t tmpfs failed here (a container without CAP_SYS_ADMIN)")
    return folder


@pytest.mark.drill("full disk during grace: stop still runs")
def test_finding_review_B1_a_full_durable_disk_never_keeps_the_stop_from_running(tmp_path):
    """The run dir on a 1 MiB tmpfs, filled to the last byte before the dead-man fires: it still stops."""
    mnt = mounted_tmpfs(tmp_path / "durable", "1m")
    try:
        stop, calls = stand_in(tmp_path)                     # outside the full disk, like a platform CLI
        run = finished_run(mnt)
        armed = subprocess.Popen([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--poll-seconds", POLL,
                                  "--foreground", "--grace-minutes", "0.02", "--stop-cmd", stop],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not (run / "deadman.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        fill = subprocess.run(["dd", "if=/dev/zero", "of=%s" % (mnt / "fill"), "bs=64k"], capture_output=True)
        # the disk was full when dd stopped (a probe write after it could race the dead-man giving up its reserve)
        assert fill.returncode != 0 and b"No space left" in fill.stderr, fill.stderr
        _out, err = armed.communicate(timeout=60)
        assert armed.returncode == 0, err
        assert calls_of(calls) == ["stop "], "the stop did not run on a full disk"
        assert "Traceback" not in err
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_finding_review_B1_records_give_up_the_reserve_then_never_raise(tmp_path, monkeypatch):
    reserve = tmp_path / ".rgt-watch-reserve"
    assert core.make_reserve(str(reserve), 4096) and reserve.stat().st_size == 4096
    real = core.atomic_write_json
    calls = []

    def full(path, obj):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(path, obj)
    monkeypatch.setattr(core, "atomic_write_json", full)
    assert core.write_json_best_effort(str(tmp_path / "x.json"), {"a": 1}, reserve=str(reserve)) is None
    assert not reserve.exists() and json.loads((tmp_path / "x.json").read_text()) == {"a": 1}
    monkeypatch.setattr(core, "atomic_write_json", lambda p, o: (_ for _ in ()).throw(OSError(30, "Read-only")))
    assert "Read-only" in core.write_json_best_effort(str(tmp_path / "y.json"), {}, reserve=str(reserve))


def test_a_tick_that_raises_never_ends_the_watch_and_a_lasting_error_fires(tmp_path):
    run = finished_run(tmp_path)
    dm = deadman.Deadman(str(run), cfg_for(run, "--stop-cmd", "true", "--stall-minutes", "1"), False)

    def broken(_now):
        raise ValueError("a damaged record")
    dm.evaluate = broken
    t0 = dm.armed_mono
    assert dm.guarded_evaluate(t0 + 1) is None
    assert dm.guarded_evaluate(t0 + 30) is None
    verdict = dm.guarded_evaluate(t0 + 62)
    assert verdict[0] == "watch_error" and "a damaged record" in verdict[1]


# ----------------------------------------------------------------------------- the idle mode

def idle_arm(watch, *args, env=None):
    return subprocess.run([sys.executable, IDLE, "arm", "--watch-dir", str(watch), "--no-gpu", "--ignore-ssh",
                           "--idle-minutes", "0.001", "--poll-seconds", POLL, "--foreground",
                           "--stop-retry-minutes", "0", *map(str, args)],   # the first sequence's exit
                          capture_output=True, text=True, env=env, timeout=60)


def test_finding_review_B2_the_idle_watch_expands_variables_like_the_dead_man(tmp_path):
    stop, calls = stand_in(tmp_path)
    env = dict(os.environ, RGT_TEST_POD="pod-77")
    res = idle_arm(tmp_path / "w", "--stop-cmd", stop + ' stop "$RGT_TEST_POD"', env=env)
    assert res.returncode == 0, res.stderr
    assert calls_of(calls) == ["stop stop pod-77"]
    fired = json.loads((tmp_path / "w" / "IDLE_FIRED.json").read_text())
    assert "pod-77" not in json.dumps(fired), "an expanded value leaked into the record"


def test_finding_node_A10_the_idle_watch_never_counts_a_failed_stop_as_done(tmp_path):
    stop, calls = stand_in(tmp_path, rc=1)
    res = idle_arm(tmp_path / "w", "--stop-cmd", stop, "--retries", "3", "--retry-backoff", "0")
    assert res.returncode == 1
    fired = json.loads((tmp_path / "w" / "IDLE_FIRED.json").read_text())
    assert fired["ok"] is False and len(calls_of(calls)) == 3 and fired["escalations"]
    st = subprocess.run([sys.executable, IDLE, "status", "--watch-dir", str(tmp_path / "w")],
                        capture_output=True, text=True)
    assert st.returncode == 1 and "ok=False" in st.stdout


def test_the_idle_watch_has_no_stop_code_of_its_own():
    source = (NODE / "idle_watch.py").read_text()
    assert "run_bounded(argv" not in source and "stop_argv" not in source
    assert issubclass(idle_watch.IdleWatch, deadman.Watcher)
    assert idle_watch.IdleWatch.fire is not deadman.Watcher.fire   # a thin wrapper, calling it
    assert "Watcher.fire(self" in source


@pytest.mark.parametrize("title,expected", [
    ("sshd: alice@pts/3", ("alice", "pts/3")),
    ("sshd: alice@notty", ("alice", "notty")),
    ("sshd: alice", ("alice", "tunnel")),                        # ssh -N -L: no session channel
    ("sshd-session: alice", ("alice", "tunnel")),                # OpenSSH 9.8+
    ("sshd-session: root@pts/0", ("root", "pts/0")),
    ("sshd: alice [priv]", None),
    ("sshd: unknown [net]", None),
    ("sshd: alice [preauth]", None),
    ("sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups", None),
    ("/usr/sbin/sshd -D -f /tmp/cfg", None),
])
def test_finding_node_A6_and_field_R8_tunnels_are_sessions(title, expected):
    assert sessions.parse_title(title) == expected


@pytest.mark.parametrize("steps,expected", [
    # (now, activity) per poll -> holding at the last poll; idle cutoff 1 min, cap 10 min
    ([(0, 5), (30, 6), (59, 7)], True),                          # traffic moves: holds
    ([(0, 5), (30, 5), (61, 5)], False),                         # no traffic for a minute: stops counting
    ([(0, None), (300, None), (599, None)], True),               # unreadable activity counts until the cap
    ([(0, None), (300, None), (601, None)], False),              # ... and not after it
    ([(0, 1), (50, 2), (100, 3), (599, 4), (601, 5)], False),    # even a busy session hits the cap
])
def test_finding_node_A11_an_ssh_session_never_holds_the_stop_off_for_ever(steps, expected):
    rule = sessions.SshRule(idle_minutes=1, max_minutes=10)
    holding = None
    for now, activity in steps:
        holding = rule.hold(now, [{"key": "1:1", "label": "alice@tunnel", "activity": activity}])[0]
    assert holding is expected


# ----------------------------------------------------------------------------- many runs on one box

def neighbour_run(folder, name, proc, watched, progressing):
    run = folder / "runs" / name
    run.mkdir(parents=True)
    running_status(run, proc)
    (run / "job.log").write_text("step 1\n")
    if not progressing:
        old = time.time() - 3600
        os.utime(run / "job.log", (old, old))
    if watched:   # a dead-man record whose process is alive (this test process stands for it)
        (run / "deadman.json").write_text(json.dumps({"pid": os.getpid(), "identity": core.process_identity(),
                                                      "state": "armed", "armed_at": core.utc_iso(),
                                                      "config": {}}))
    return run


@pytest.mark.parametrize("watched,progressing,holds", [
    (True, True, True), (True, False, False), (False, True, False), (False, False, False)])
def test_finding_node_A12_only_a_watched_progressing_neighbour_holds_the_stop(tmp_path, child, watched,
                                                                              progressing, holds):
    done = tmp_path / "runs" / "done"
    done.mkdir(parents=True)
    (done / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0,
                                                 "ended_at": core.utc_iso(time.time() - 600)}))
    neighbour_run(tmp_path, "other", child(), watched, progressing)
    dm = deadman.Deadman(str(done), cfg_for(done, "--stop-cmd", "true", "--grace-minutes", "1"), False)
    verdict = dm.evaluate(dm.armed_mono + 120)
    assert (verdict is None) is holds
    if not holds:
        assert verdict[0] == "job_ended"


@pytest.mark.drill("multi-run stall spares healthy runs")
def test_finding_field_R3_a_stall_stops_that_run_not_the_box_under_a_healthy_run(tmp_path, child):
    hung = tmp_path / "runs" / "hung"
    hung.mkdir(parents=True)
    running_status(hung, child())
    neighbour_run(tmp_path, "healthy", child(), watched=True, progressing=True)
    dm = deadman.Deadman(str(hung), cfg_for(hung, "--stop-cmd", "true", "--stall-minutes", "1"), False)
    verdict = dm.evaluate(dm.armed_mono + 120)
    assert verdict[0] == "stall_run" and "healthy" in verdict[1]
    # once no other run trains, the same stall stops the box
    shutil.rmtree(tmp_path / "runs" / "healthy")
    dm2 = deadman.Deadman(str(hung), cfg_for(hung, "--stop-cmd", "true", "--stall-minutes", "1"), False)
    assert dm2.evaluate(dm2.armed_mono + 120)[0] == "stall"


@pytest.mark.drill("multi-run stall spares healthy runs")
def test_finding_field_R3_stop_own_job_signals_only_that_job(tmp_path, child):
    hung = tmp_path / "runs" / "hung"
    hung.mkdir(parents=True)
    proc = child()
    running_status(hung, proc)
    dm = deadman.Deadman(str(hung), cfg_for(hung, "--stop-cmd", "true", "--term-grace-seconds", "5",
                                            "--sync-wait-seconds", "0"), False)
    dm.stop_own_job("stalled", proc.pid, True)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    record = json.loads((hung / "STALL_STOPPED.json").read_text())
    assert record["box_stop"] is False and record["job_term"]["job_exited"] is True
    assert not (hung / "DEADMAN_FIRED.json").exists()


def test_finding_field_R11_a_held_dead_man_never_fires_before_its_grace(tmp_path):
    done = finished_run(tmp_path, ended_at=core.utc_iso(time.time() - 600))
    dm = deadman.Deadman(str(done), cfg_for(done, "--stop-cmd", "true", "--grace-minutes", "1"), False)
    seen = {"others": ["b"]}
    dm.neighbours = lambda: (seen["others"], [])
    t0 = dm.armed_mono
    assert dm.evaluate(t0 + 10) is None                      # b trains: held
    assert dm.evaluate(t0 + 40) is None                      # still held (last seen active at +40)
    seen["others"] = []                                      # b ended somewhere between +40 and +70
    assert dm.evaluate(t0 + 70) is None                      # first seen gone at +70: the grace starts here
    assert dm.evaluate(t0 + 129) is None                     # the old rule fired here (+40 + 60 s)
    assert dm.evaluate(t0 + 131)[0] == "job_ended"


def test_finding_node_A15_a_run_under_another_durable_dir_is_seen(tmp_path, child):
    registry = tmp_path / "registry"
    mine = tmp_path / "durA" / "runs" / "a"
    mine.mkdir(parents=True)
    other = tmp_path / "durB" / "runs" / "b"
    other.mkdir(parents=True)
    running_status(other, child())
    (other / "job.log").write_text("step 1\n")
    assert runrec.register(str(other), str(registry)) is None
    found = runrec.active_neighbours([str(mine)], [str(mine.parent)], None, str(registry))
    assert [n["name"] for n in found] == ["b"]
    assert runrec.active_neighbours([str(mine)], [str(mine.parent)], None, str(tmp_path / "empty")) == []


def test_finding_node_A7_a_torn_status_json_is_never_no_job(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text('{"state": "runn')      # torn by a full disk
    (run / "job.log").write_text("step 9\n")
    dm = deadman.Deadman(str(run), cfg_for(run, "--stop-cmd", "true", "--grace-minutes", "0.01",
                                           "--stall-minutes", "10"), False)
    t0 = dm.armed_mono
    for later in (1, 30, 300):
        assert dm.evaluate(t0 + later) is None, "fired no_job on an unreadable status.json"
    assert dm.evaluate(t0 + 601)[0] == "stall"               # the stall rule still holds
    doc, problem = runrec.read_status(str(run))
    assert doc is None and "torn" in problem


# ----------------------------------------------------------------------------- the job and its attempts

SIGNAL_JOB = r"""
import signal, sys, time
def got(signum, frame):
    open(sys.argv[1], "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGINT, got)
signal.signal(signal.SIGTERM, got)
open(sys.argv[1] + ".ready", "w").close()
time.sleep(600)
"""


def test_finding_node_A2_and_field_R6_the_dead_man_sends_the_runs_stop_signal(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "got"
    proc = subprocess.Popen([sys.executable, "-c", SIGNAL_JOB, str(marker)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30      # the handlers are installed once it says so
        while not os.path.exists(str(marker) + ".ready") and time.monotonic() < deadline:
            time.sleep(0.02)
        (run / "run.json").write_text(json.dumps({"stop_signal": "INT"}))
        running_status(run, proc)
        dm = deadman.Deadman(str(run), cfg_for(run, "--stop-cmd", "true", "--term-grace-seconds", "10",
                                               "--sync-wait-seconds", "0"), False)
        rec = dm.term_job(proc.pid)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rec["signal"] == "SIGINT" and marker.read_text() == "SIGINT"


def test_finding_node_A13_an_attempt_that_dies_while_starting_is_counted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for expected in (1, 2, 3):
        launcher.move_old_evidence(str(run))                 # what init does before it numbers the attempt
        assert runrec.attempt_number(str(run)) == expected
        # this attempt dies while starting: started_at never written
        (run / "status.json").write_text(json.dumps({"state": "starting", "started_at": None,
                                                     "attempt": expected}))
    launcher.move_old_evidence(str(run))
    assert runrec.attempt_number(str(run)) == 4


def test_finding_node_A3_a_leftover_process_in_the_group_never_blocks_the_sync(tmp_path):
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, RGT_GROUP_WAIT_SECONDS="0.5", RGT_GROUP_TERM_SECONDS="2")
    job = ["sh", "-c", "sleep 300 & echo trained > model.txt; exit 0"]    # `tensorboard &` in a train.sh
    res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir", str(durable),
                          "--run-id", "a3", "--disk-floor-gb", "0", "--no-deadman", "--output", "model.txt",
                          "--wait", "--", *job], cwd=str(work), capture_output=True, text=True, env=env,
                         timeout=120)
    status = json.loads((durable / "runs" / "a3" / "status.json").read_text())
    assert status["state"] == "succeeded", res.stdout + res.stderr
    assert status["sync"]["ok"] is True and status["sync"]["verified"] is True
    log = (durable / "runs" / "a3" / "job.log").read_text()
    assert "still has members: sending SIGTERM" in log
    # the run record written by runrec holds to its schema
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((NODE / "status.schema.json").read_text())
    jsonschema.validate(status, schema)
    assert status["schema_version"] == 1


def test_one_run_state_set():
    assert set(runrec.ACTIVE).isdisjoint(runrec.TERMINAL)   # the one definition: tests/test_runrec.py (D3)
    schema = json.loads((NODE / "status.schema.json").read_text())
    assert set(schema["properties"]["state"]["enum"]) == set(runrec.STATES)
    # a finished attempt is never revived by a late write; a new attempt starts over with init
    assert runrec.transition_problem("succeeded", "running")
    assert runrec.transition_problem("running", "succeeded") is None


def test_finding_node_A4_the_manifest_re_read_reports_progress(tmp_path):
    (tmp_path / "a.bin").write_bytes(os.urandom(3 << 20))
    (tmp_path / "b.bin").write_bytes(os.urandom(1 << 20))
    heard = []
    manifest, problems, _ = evidence.build_manifest(str(tmp_path), ["*.bin"], "r", progress=False,
                                                    on_bytes=heard.append)
    assert not problems and sum(heard) == manifest["total_bytes"] == 4 << 20 and len(heard) >= 4


# ----------------------------------------------------------------------------- re-arm and old code

def test_finding_review_B3_the_re_arm_keeps_every_setting(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stop, _ = stand_in(tmp_path)
    fallback, _ = stand_in(tmp_path, "fallback")
    pre, _ = stand_in(tmp_path, "pre")
    options = ["--stall-minutes", "12.5", "--grace-minutes", "7", "--max-hours", "12", "--wait-ssh",
               "--ssh-wait-max-minutes", "45", "--ssh-idle-minutes", "9", "--allow-destructive",
               "--fallback-stop-cmd", fallback, "--pre-stop-cmd", pre, "--pre-stop-timeout", "33",
               "--retries", "5", "--retry-backoff", "4", "--stop-timeout", "66", "--confirm-seconds", "20",
               "--term-grace-seconds", "11", "--sync-wait-seconds", "44", "--poll-seconds", "3", "--dry-run",
               "--lease-ttl-seconds", "400",
               "--repeat-minutes", "5", "--registry", str(tmp_path / "reg"), "--budget-usd", "20",
               "--rate-per-hour", "2.5", "--disk-floor-gb", "3.5", "--disk-floor-inodes", "500",
               "--ssh-user", "trainer", "--lease-ttl-seconds", "600", "--still-up-seconds", "30",
               "--stop-retry-minutes", "7",
               "--stop-cmd", stop]
    first = cfg_for(run, *options)
    again = cfg_for(run, *deadman.cfg_to_argv(first))
    for key in ("identity",):
        first.pop(key, None)
        again.pop(key, None)
    assert again == first
    # every option of the table is covered by this round trip
    given = {o for o in options if o.startswith("--")}
    assert {flag for _k, flag, _t, _d, _h in deadman.WATCH_OPTIONS} <= given


def test_boot_resume_re_arms_with_every_setting(tmp_path):
    import boot_resume
    run = tmp_path / "run"
    run.mkdir()
    stop, _ = stand_in(tmp_path)
    cfg = cfg_for(run, "--stop-cmd", stop, "--max-hours", "12", "--retries", "5", "--wait-ssh",
                  "--pre-stop-cmd", stop)
    (run / "deadman.json").write_text(json.dumps({"config": cfg}))
    argv = boot_resume.rearm_args(str(run))
    assert cfg_for(run, *argv) == cfg


def test_a_dead_man_running_older_code_is_flagged(tmp_path):
    run = finished_run(tmp_path)
    (run / "deadman.json").write_text(json.dumps({"pid": os.getpid(), "identity": core.process_identity(),
                                                  "state": "armed", "armed_at": core.utc_iso(), "config": {},
                                                  "loaded_version": "0000old00000"}))
    out = subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu"], capture_output=True, text=True)
    assert "OLDER CODE (0000old00000)" in out.stdout, out.stdout + out.stderr


# ----------------------------------------------------------------------------- the provider confirms (issue 24)

@pytest.mark.drill("provider 200 that never stops is NOT CONFIRMED")
@pytest.mark.parametrize("mode,rc,confirmed", [("normal", 0, True), ("never_stops", 1, False)])
def test_verified_stop_the_dead_man_stops_through_the_provider_and_reads_it_back(tmp_path, mode, rc, confirmed):
    """A RunPod stand-in (tools/provider_standins.py, held to the runpod SDK by test_providers.py): the
    dead-man's stop is the API's stop-then-read-back; a 200 that stops nothing is NOT CONFIRMED."""
    sys.path.insert(0, str(NODE.parent.parent / "tools"))
    from provider_standins import Instance, StandIn
    run = finished_run(tmp_path)
    with StandIn("runpod", "k-test-canary", [Instance("pod1", mode=mode)]) as api:
        env = dict(os.environ, RUNPOD_POD_ID="pod1", RUNPOD_API_KEY="k-test-canary", RGT_RUNPOD_API_URL=api.url,
                   RGT_PROVIDER_CONFIRM_READS="2", RGT_PROVIDER_CONFIRM_SPAN_S="0.1")   # C5's reads, shrunk
        res = arm_fg(run, "--grace-minutes", "0", "--profile", "runpod", "--confirm-seconds", "1",
                     "--retries", "2", "--retry-backoff", "0", "--still-up-seconds", "0", env=env, timeout=120)
        stops = [c for c in api.calls("POST") if "podStop" in json.dumps(c)]
    assert res.returncode == rc, res.stderr
    fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
    assert fired["command_source"] == "provider:runpod" and fired["confirmed"] is confirmed
    assert len(stops) == (1 if confirmed else 2)
    assert bool(fired["escalations"]) is not confirmed
    for name in os.listdir(run):
        assert "k-test-canary" not in (run / name).read_text(errors="replace"), name


# ----------------------------------------------------------------------------- the escalation is heard (issue 25)

def test_notif_drill_the_dead_man_fires_and_the_escalation_reaches_the_webhook(tmp_path):
    """A stop that exits 0 and stops nothing: the webhook hears deadman_fired, then stop_not_confirmed."""
    server, heard, notify_env = webhook_target(tmp_path, "notif-canary-secret")
    try:
        env = dict(os.environ, **notify_env)
        stop, _calls = stand_in(tmp_path)
        run = finished_run(tmp_path, run_id="n1")
        armed = subprocess.Popen([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--poll-seconds", POLL,
                                  "--foreground", "--grace-minutes", "0", "--stop-cmd", stop, "--confirm-seconds",
                                  "0.2", "--retries", "1", "--repeat-minutes", "0.002"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # STOP NOT CONFIRMED is repeated until someone acknowledges it
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and [h.get("event") for h in heard].count("stop_not_confirmed") < 2:
                time.sleep(0.05)
            subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(run)], capture_output=True, check=True)
            _out, err = armed.communicate(timeout=60)
        finally:
            if armed.poll() is None:
                armed.kill()
                armed.wait()
        assert armed.returncode == 1, err
        assert "acknowledged" in (run / "deadman.log").read_text()
    finally:
        server.shutdown()
        server.server_close()
    events = [h.get("event") for h in heard]
    assert events[:2] == ["deadman_fired", "stop_not_confirmed"], heard
    fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
    assert fired["notified"][0]["sent"] == ["hook"]
    for name in os.listdir(run):
        assert "notif-canary-secret" not in (run / name).read_text(errors="replace"), name


def test_an_unknown_gpu_reading_counts_as_busy_but_the_cap_still_holds(tmp_path):
    """A hung or broken nvidia-smi is no evidence of idleness, yet it cannot keep the box billing past --max-hours."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH="%s%s%s" % (bindir, os.pathsep, os.environ["PATH"]))
    stop, calls = stand_in(tmp_path)
    res = subprocess.run([sys.executable, IDLE, "arm", "--watch-dir", str(tmp_path / "w"), "--stop-cmd", stop,
                          "--ignore-ssh", "--idle-minutes", "0.001", "--max-hours", "0.0005", "--poll-seconds",
                          POLL, "--foreground"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    fired = json.loads((tmp_path / "w" / "IDLE_FIRED.json").read_text())
    state = json.loads((tmp_path / "w" / "idle_watch.json").read_text())
    assert fired["reason"] == "max_hours" and calls_of(calls) == ["stop "]
    assert any("no reading" in b for b in state["busy"]), state


# ----------------------------------------------------------------------------- the drills through a real launch

@pytest.mark.drill("no-effect stop is NOT CONFIRMED")
@pytest.mark.drill("shebang-less stop script runs")
def test_a_real_launch_whose_shebang_less_stop_stops_nothing_escalates(tmp_path):
    """run_one.sh launches a job that ends; its dead-man runs a stop script with no #! line (through /bin/sh),
    which exits 0 and stops nothing: NOT CONFIRMED, retried, escalated, and run_status says so."""
    stop, calls = stand_in(tmp_path, shebang=False)
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir", str(durable),
                          "--run-id", "noeffect", "--disk-floor-gb", "0", "--grace-minutes", "0.005",
                          "--poll-seconds", "0.1", "--deadman-arg", "--stop-cmd", "--deadman-arg", stop,
                          "--deadman-arg", "--confirm-seconds", "--deadman-arg", "0.3",
                          "--deadman-arg", "--retries", "--deadman-arg", "2",
                          "--deadman-arg", "--retry-backoff", "--deadman-arg", "0", "--wait", "--", "true"],
                         cwd=str(work), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run = durable / "runs" / "noeffect"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        fired = json.loads((run / "DEADMAN_FIRED.json").read_text()) if (run / "DEADMAN_FIRED.json").exists() else {}
        if fired.get("message"):
            break
        time.sleep(0.1)
    assert fired.get("confirmed") is False and fired["ok"] is False, fired
    assert len(calls_of(calls)) == 2 and all(a.get("via_sh") for a in fired["attempts"])
    assert fired["escalations"]
    out = subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu"], capture_output=True, text=True)
    assert "STOP NOT CONFIRMED" in out.stdout


@pytest.mark.drill("full disk during grace: stop still runs")
def test_a_real_launch_on_a_durable_disk_the_job_fills_still_stops_the_meter(tmp_path):
    """The job fills the durable disk (a 2 MiB tmpfs) and exits 0: the sync fails, and the dead-man, whose run
    dir is on that full disk, still runs the stop after its grace."""
    durable = mounted_tmpfs(tmp_path / "durable", "2m")
    try:
        stop, calls = stand_in(tmp_path)
        work = tmp_path / "work"
        work.mkdir()
        fill = "dd if=/dev/zero of=%s/fill bs=64k 2>/dev/null; echo trained > model.txt; exit 0" % durable
        subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir", str(durable),
                        "--run-id", "full", "--disk-floor-gb", "0", "--grace-minutes", "0.01", "--poll-seconds",
                        "0.1", "--output", "model.txt", "--deadman-arg", "--stop-cmd", "--deadman-arg", stop,
                        "--", "sh", "-c", fill], cwd=str(work), capture_output=True, text=True, timeout=120)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not calls_of(calls):
            time.sleep(0.1)
        assert calls_of(calls) == ["stop "], "the stop never ran on a full durable disk"
    finally:
        subprocess.run(["umount", "-l", str(durable)])


@pytest.mark.parametrize("line,exit_code,reason", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 TiB. GPU 0 has a total capacity of "
     "139.81 GiB", 1, "CUDA out of memory"),
    ("[rank1]:[E ProcessGroupNCCL.cpp] Watchdog caught collective operation timeout", 1, "NCCL"),
    ("OSError: [Errno 28] No space left on device", 1, "disk full"),
    ("epoch 3 loss 0.41", 137, "OOM killer"),
    ("Traceback ... ValueError: bad config", 1, None),
])
def test_run_status_names_the_failures_users_meet_most(tmp_path, line, exit_code, reason):
    """Log lines in the format the libraries print them; tools/gpu_check.sh makes a real CUDA OOM on a GPU box."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.log").write_text("step 1\n%s\n" % line)
    (run / "status.json").write_text(json.dumps({"state": "failed", "exit_code": exit_code, "run_id": "r",
                                                 "ended_at": core.utc_iso()}))
    out = json.loads(subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu", "--json"],
                                    capture_output=True, text=True).stdout)
    if reason is None:
        assert "read job.log" in out["hint"]
    else:
        assert reason in out["reason"] and out["hint"]


def test_notif_a_run_tells_when_it_starts_and_when_it_ends(tmp_path):
    """The supervisor sends launched, then finished (or failed) with the bytes synced, to a configured webhook."""
    server, heard, notify_env = webhook_target(tmp_path, "a-long-enough-test-secret")
    try:
        env = dict(os.environ, **notify_env)
        work = tmp_path / "work"
        work.mkdir()
        for rid, job in (("ok", "echo trained > model.txt"), ("bad", "exit 3")):
            res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir",
                                  str(tmp_path / "durable"), "--run-id", rid, "--disk-floor-gb", "0", "--no-deadman",
                                  "--output", "model.txt", "--wait", "--", "sh", "-c", job], cwd=str(work),
                                 capture_output=True, text=True, env=env, timeout=120)
            assert "finished:" in res.stdout, res.stdout + res.stderr
    finally:
        server.shutdown()
        server.server_close()
    seen = [(h.get("event"), (h.get("fields") or h).get("run_id")) for h in heard]
    assert ("launched", "ok") in seen and ("finished", "ok") in seen and ("failed", "bad") in seen, heard


# ---------------------------------------------------------------- field R15 (issue 28)


STATUS = NODE / "run_status.py"


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def status_json(run_dir, *args):
    res = subprocess.run([sys.executable, str(STATUS), str(run_dir), "--json", "--no-gpu", *args],
                         capture_output=True, text=True, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


# ---------------------------------------------------------------- field R15: dry-run dead-men

def fire_dry_run(tmp_path, status, *watch):
    """A foreground dry-run dead-man (stop `true`, a 600 s poll unless WATCH says) over a run whose status.json
    is STATUS -> its DEADMAN_FIRED.json, once it has fired and exited."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps(status))
    res = subprocess.run([sys.executable, str(DEADMAN), "arm", "--run-dir", str(run), "--foreground", "--dry-run",
                          "--stop-cmd", "true", *watch], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    return json.loads((run / "DEADMAN_FIRED.json").read_text())


def test_finding_field_R15_a_dead_man_fires_when_its_grace_runs_out_not_a_poll_later(tmp_path):
    """The field's smoke runs asked for a short grace and kept the default 30 s poll: the firing waited for
    the next poll. Here the poll is 600 s and the grace 1.2 s: the firing must not wait for the poll."""
    fired = fire_dry_run(tmp_path, {"run_id": "r15", "state": "succeeded", "exit_code": 0,
                                    "ended_at": iso(time.time())}, "--grace-minutes", "0.02", "--poll-seconds", "600")
    assert fired["reason"] == "job_ended" and fired["dry_run"] is True and fired["would_run"] == "true"


def test_finding_field_R15_a_stall_and_an_idle_box_fire_on_time_too(tmp_path):
    import os
    fired = fire_dry_run(tmp_path, {"run_id": "r15s", "state": "running", "job_pid": os.getpid(),
                                    "job_identity": core.process_identity(os.getpid()),
                                    "started_at": iso(time.time())}, "--stall-minutes", "0.02", "--poll-seconds", "600")
    assert fired["reason"] == "stall"
    watch = tmp_path / "idle"
    res = subprocess.run([sys.executable, str(IDLE), "arm", "--watch-dir", str(watch), "--foreground", "--dry-run",
                          "--stop-cmd", "true", "--no-gpu", "--ignore-ssh", "--idle-minutes", "0.02",
                          "--poll-seconds", "600"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    assert json.loads((watch / "IDLE_FIRED.json").read_text())["reason"] == "idle_box"


def test_finding_field_R15_a_dry_run_firing_never_reads_as_a_failed_stop(tmp_path):
    fired = fire_dry_run(tmp_path, {"run_id": "r15d", "state": "succeeded", "exit_code": 0,
                                    "ended_at": iso(time.time())}, "--grace-minutes", "0", "--poll-seconds", "0.05")
    assert fired["dry_run"] is True and fired["ok"] is False     # the record: nothing ran, so nothing succeeded
    run = tmp_path / "run"
    line = status_json(run)["line"]
    assert "dry run (nothing was stopped)" in line and "FAILED" not in line, line
    st = subprocess.run([sys.executable, str(DEADMAN), "status", "--run-dir", str(run)], capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 7 and "DRY RUN (nothing was stopped): would run \"true\"" in st.stdout, st.stdout
    assert "stop_ok=False" not in st.stdout
    # the idle watcher's status: a dry-run firing is not a failed stop (exit 0, not 1)
    watch = tmp_path / "idle"
    res = subprocess.run([sys.executable, str(IDLE), "arm", "--watch-dir", str(watch), "--foreground", "--dry-run",
                          "--stop-cmd", "true", "--no-gpu", "--ignore-ssh", "--idle-minutes", "0.001",
                          "--poll-seconds", "0.05"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-500:]
    st = subprocess.run([sys.executable, str(IDLE), "status", "--watch-dir", str(watch)], capture_output=True,
                        text=True, timeout=60)
    assert st.returncode == 0 and "DRY RUN (nothing was stopped)" in st.stdout, st.stdout


def test_finding_field_R15_the_wake_never_comes_before_the_deadline_it_was_set_for(tmp_path, monkeypatch):
    """The in-process rule: evaluate() notes the grace's end as next_deadline, and the check at that time fires."""
    import deadman
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"run_id": "r15w", "state": "failed", "exit_code": 1}))
    args = deadman.build_parser().parse_args(["arm", "--run-dir", str(run), "--dry-run", "--stop-cmd", "true",
                                              "--grace-minutes", "1", "--poll-seconds", "30"])
    cfg, _ = deadman.build_config(args, str(run))
    dm = deadman.Deadman(str(run), cfg, foreground=False)
    now = dm.armed_mono + 5.0
    assert dm.evaluate(now) is None and dm.next_deadline == dm.ended_mono + 60.0
    assert dm.evaluate(dm.next_deadline - 0.01) is None
    assert dm.evaluate(dm.next_deadline)[0] == "job_ended"
