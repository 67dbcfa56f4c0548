"""The events the watchers tell (issue 25): first_progress, budget_80 / budget_100, disk_low, boot_resume,
and a run's own choice of events (run.json notify_events).

Every message goes to a real webhook receiver on 127.0.0.1 (conftest.webhook) through notify.py. The drills
run real dead-man, supervisor and boot_resume.py processes; the rules (once per attempt, once per crossing,
the 80 % mark) are also driven through the dead-man's own poll (Deadman.observe) with the clock passed in.
"""
import errno
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import NODE, kill_everything_of, need_root, wait_for, webhook_target
from conftest import read_json as read
from watch_fixture import DEADMAN, POLL, cfg_for, finished_run, running_status, stand_in

sys.path.insert(0, str(NODE))
import deadman  # noqa: E402
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402

HOOK_SECRET = "a-long-enough-test-secret"
QUIET_DISK = ("--disk-floor-gb", "0", "--disk-floor-inodes", "0")   # no disk_low from a small CI disk


@pytest.fixture
def hook(tmp_path, monkeypatch):
    """A webhook target in a 0600 notify config -> (bodies heard, env for a child process). The same config is
    set for this process too, so a watcher driven in-process sends to it."""
    server, heard, values = webhook_target(tmp_path, HOOK_SECRET)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    yield heard, dict(os.environ, **values)
    server.shutdown()
    server.server_close()


def events(heard, name=None):
    return [h["event"] for h in heard if name is None or h["event"] == name]


def fields_of(heard, name):
    return [h["fields"] for h in heard if h["event"] == name]


def beat(run, step, at=None, **extra):
    """heartbeat.json at STEP, its mtime AT (default now): each beat is a new look for the dead-man."""
    path = run / "heartbeat.json"
    path.write_text(json.dumps(dict(extra, step=step)))
    at = time.time() if at is None else at
    os.utime(str(path), (at, at))


@pytest.fixture
def dead_man(hook):
    """start(run, *arm options) -> a foreground dead-man process sending to the hook; ended after the test.
    Its exit: code, stderr = finish(proc)."""
    _heard, env = hook
    procs = []

    def start(run, *args):
        proc = subprocess.Popen([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--poll-seconds", POLL,
                                 "--foreground", *map(str, args)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        end(proc)


def end(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def finish(proc, timeout=120):
    """Wait for a dead-man process to exit by itself -> (exit code, stderr)."""
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def a_deadman(run, *args):
    stop, _calls = stand_in(run.parent)
    return deadman.Deadman(str(run), cfg_for(run, "--stop-cmd", stop, *args), foreground=False)


# ----------------------------------------------------------------------------- first_progress

def test_notif_first_progress_is_told_once_per_attempt_with_the_eta_and_never_again_after_a_re_arm(
        tmp_path, hook, child):
    heard, _env = hook
    run = tmp_path / "run"
    run.mkdir()
    started = time.time() - 100
    running_status(run, child(), run_id="fp", attempt=1, started_at=core.utc_iso(started))
    (run / "run.json").write_text(json.dumps({"run_id": "fp", "total_steps": 1000}))
    dm = a_deadman(run, *QUIET_DISK)
    tick = time.time()

    def look(dead_man, step, **extra):
        nonlocal tick
        tick += 1
        beat(run, step, at=tick, **extra)
        dead_man.observe(time.monotonic())

    look(dm, 10, sec_per_step=0.5)           # the first step this attempt shows: not progress yet
    look(dm, 10, sec_per_step=0.5)           # written again, the same step
    assert heard == []
    look(dm, 12, sec_per_step=0.5)           # it rose: told, with the ETA run_status gives (988 x 0.5 s)
    look(dm, 20, sec_per_step=0.5)           # once per attempt
    (told,) = fields_of(heard, "first_progress")
    assert {k: told[k] for k in ("run_id", "attempt", "step", "total", "eta_s", "run_dir")} == {
        "run_id": "fp", "attempt": 1, "step": 12, "total": 1000, "eta_s": 494, "run_dir": str(run)}
    assert read(run / "notified.json")["first_progress"]["attempt"] == 1
    again = a_deadman(run, *QUIET_DISK)      # a re-armed dead-man (a boot, a resume's hand-over) reads the record
    look(again, 30)
    look(again, 40)
    assert events(heard) == ["first_progress"]
    # attempt 2: the heartbeat left by attempt 1 is not its progress; its own first step, then a rise, is
    status = read(run / "status.json")
    (run / "status.json").write_text(json.dumps(dict(status, attempt=2, started_at=core.utc_iso(tick + 5))))
    tick += 1
    beat(run, 40, at=tick)                   # older than attempt 2's start
    again.observe(time.monotonic())
    tick += 10
    look(again, 41)
    look(again, 45)
    assert [(f["attempt"], f["step"]) for f in fields_of(heard, "first_progress")] == [(1, 12), (2, 45)]


def test_notif_first_progress_from_the_log_counts_from_the_attempts_first_logged_step(tmp_path, hook, child):
    """A trainer with no heartbeat (--progress-regex): attempt 2's part of job.log starts after the supervisor's
    "starting:" note; its first logged step (501) is where it started, so 501 alone is not progress, 502 is."""
    heard, _env = hook
    run = tmp_path / "run"
    run.mkdir()
    running_status(run, child(), run_id="lg", attempt=2, started_at=core.utc_iso(time.time() - 60),
                   resume={"from": "out/ckpt.pt"})
    (run / "run.json").write_text(json.dumps({"run_id": "lg", "progress_regex": r"step (\d+)/(\d+)"}))
    log = run / "job.log"
    log.write_text("step 499/1000\nstep 500/1000\n[rgt 12:00:00] starting: python3 train.py (cwd /w)\n")
    dm = a_deadman(run, *QUIET_DISK)
    dm.observe(time.monotonic())
    with open(str(log), "a") as fh:
        fh.write("step 501/1000\n")
    os.utime(str(log), (time.time() + 1, time.time() + 1))
    dm.observe(time.monotonic())
    assert heard == []
    with open(str(log), "a") as fh:
        fh.write("step 502/1000\n")
    os.utime(str(log), (time.time() + 2, time.time() + 2))
    dm.observe(time.monotonic())
    (told,) = fields_of(heard, "first_progress")
    assert (told["attempt"], told["step"], told["total"]) == (2, 502, 1000)
    assert isinstance(told["eta_s"], int) and told["eta_s"] > 0   # 1 step since 501 in about 60 s: hours left


# ----------------------------------------------------------------------------- budget_80 / budget_100

def test_notif_budget_80_is_told_once_when_80_percent_of_the_hours_have_passed(tmp_path, hook):
    heard, _env = hook
    run = finished_run(tmp_path, run_id="bu")
    dm = a_deadman(run, "--budget-usd", "10", "--rate-per-hour", "2", "--grace-minutes", "600", *QUIET_DISK)
    assert dm.cfg["max_hours"] == 5.0                       # the cap the budget buys, without --max-hours
    hours = 5 * 3600
    dm.budget_clock = {"first_start": time.time() - hours * 0.79, "suspended_s": 0.0}   # the run's clock (issue 37)
    now = time.monotonic()
    dm.observe(now)
    assert heard == [] and dm.next_deadline == pytest.approx(now + hours * 0.01, abs=2)   # it wakes on time
    dm.budget_clock = {"first_start": time.time() - hours * 0.8, "suspended_s": 0.0}
    dm.observe(time.monotonic())
    dm.observe(time.monotonic())
    (told,) = fields_of(heard, "budget_80")
    assert (told["run_id"], told["budget_usd"], told["rate_per_hour"]) == ("bu", 10.0, 2.0)
    assert told["spent_usd"] == pytest.approx(8.0, abs=0.01)


@pytest.mark.parametrize("max_hours, expected", [("3", 3.0), ("9", 5.0), ("0", 5.0)])
def test_notif_the_budget_cap_holds_whatever_max_hours_says(tmp_path, max_hours, expected):
    cfg = cfg_for(tmp_path, "--budget-usd", "10", "--rate-per-hour", "2", "--max-hours", max_hours)
    assert cfg["max_hours"] == expected
    again = cfg_for(tmp_path, *deadman.cfg_to_argv(cfg))    # the re-arm keeps the budget
    assert (again["budget_usd"], again["rate_per_hour"], again["max_hours"]) == (10.0, 2.0, expected)


def test_notif_budget_without_a_rate_is_one_line_exit_2(tmp_path):
    run = finished_run(tmp_path)
    res = subprocess.run([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--budget-usd", "5", "--foreground"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--rate-per-hour" in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_notif_drill_the_budget_cap_fires_and_tells_budget_100(tmp_path, hook, child):
    """A live job on a budget that buys 0.72 s: the dead-man fires for max_hours and tells deadman_fired, then
    budget_100 (the cap that fired is the budget's)."""
    heard, env = hook
    run = tmp_path / "run"
    run.mkdir()
    running_status(run, child(), run_id="cap")
    stop, calls = stand_in(tmp_path)
    res = subprocess.run([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--poll-seconds", POLL, "--foreground",
                          "--budget-usd", "0.01", "--rate-per-hour", "36", "--stall-minutes", "0", "--stop-cmd", stop,
                          "--term-grace-seconds", "5", *QUIET_DISK], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert read(run / "DEADMAN_FIRED.json")["reason"] == "max_hours" and len(calls.read_text().splitlines()) == 1
    told = [e for e in events(heard) if e != "budget_80"]   # 80 % of 0.72 s may pass between two polls
    assert told == ["deadman_fired", "budget_100"], heard
    (spent,) = fields_of(heard, "budget_100")
    assert (spent["run_id"], spent["budget_usd"], spent["rate_per_hour"]) == ("cap", 0.01, 36.0)
    assert isinstance(spent["spent_usd"], float) and spent["spent_usd"] >= 0


# ----------------------------------------------------------------------------- disk_low

@pytest.mark.parametrize("was_low, free, inodes, expected", [
    (False, 100, 1000, (False, False)),     # above both floors
    (False, 49, 1000, (True, True)),        # under the byte floor: told
    (False, 100, 99, (True, True)),         # under the inode floor: told
    (True, 40, 1000, (True, False)),        # still low: not told again
    (True, 52, 1000, (True, False)),        # back over the floor but within 10 %: still low, quiet
    (True, 56, 1000, (False, False)),       # recovered (10 % over both floors): the next crossing is told
    (True, 56, 105, (True, False)),         # bytes recovered, inodes not yet
    (False, 100, None, (False, False)),     # a filesystem that reports no inodes
])
def test_notif_disk_low_once_per_crossing_with_hysteresis(was_low, free, inodes, expected):
    assert deadman.disk_state(was_low, free, inodes, 50, 100) == expected


def test_notif_disk_floors_of_zero_never_tell():
    assert deadman.disk_state(False, 0, 0, 0, 0) == (False, False)


def test_notif_drill_a_real_dead_man_tells_disk_low_once_then_first_progress(tmp_path, hook, child, dead_man):
    """A floor no disk meets: disk_low once (the run dir and the durable dir share one filesystem: one message),
    then first_progress when the step rises, then deadman_fired when the job ends; each from a later poll, so a
    second disk_low would be heard before the firing."""
    heard, env = hook
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "durable").mkdir()
    job = child()
    running_status(run, job, run_id="dl", started_at=core.utc_iso(time.time() - 30))
    (run / "run.json").write_text(json.dumps({"run_id": "dl", "durable_dir": str(tmp_path / "durable")}))
    beat(run, 1)
    stop, _calls = stand_in(tmp_path)
    armed = dead_man(run, "--grace-minutes", "0", "--stall-minutes", "0", "--stop-cmd", stop, "--disk-floor-gb", "1e8")
    assert wait_for(lambda: "disk_low" in events(heard), 60), heard
    beat(run, 2)
    assert wait_for(lambda: "first_progress" in events(heard), 60), heard
    job.kill()
    job.wait()
    code, err = finish(armed)
    assert code == 0, err
    assert events(heard) == ["disk_low", "first_progress", "deadman_fired"], heard
    (low,) = fields_of(heard, "disk_low")
    assert low["which"] == "run_dir" and low["floor_gb"] == 1e8 and low["free_bytes"] > 0
    assert read(run / "notified.json")["disk_low"] == {"run_dir": True}
    assert "DISK LOW" in (run / "deadman.log").read_text()


def fill(path):
    """Write zeros to PATH until its filesystem is full."""
    try:
        with open(str(path), "ab") as fh:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc


def test_notif_drill_a_full_filesystem_is_told_once_per_crossing_and_the_stop_still_runs(tmp_path, hook, child,
                                                                                         dead_man):
    """The run dir on a real 4 MiB tmpfs, filled to the brim: disk_low is told although no record can be written
    there; freed, then filled again: told again; then the job ends and the stop runs (root: a mount)."""
    need_root("mounting a small tmpfs")
    heard, env = hook
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    armed = None
    try:
        run = mnt / "run"
        run.mkdir()
        job = child()
        running_status(run, job, run_id="full")
        stop, calls = stand_in(tmp_path)
        armed = dead_man(run, "--grace-minutes", "0", "--stall-minutes", "0", "--stop-cmd", stop,
                         "--disk-floor-gb", "0.001", "--disk-floor-inodes", "0")
        assert wait_for(lambda: (run / "deadman.json").exists(), 60)
        fill(mnt / "filler")
        assert wait_for(lambda: events(heard) == ["disk_low"], 60), heard
        os.unlink(str(mnt / "filler"))
        # the dead-man saw it recover (10 % over the 1 MiB floor) when it could write that down again
        assert wait_for(lambda: read(run / "notified.json").get("disk_low") == {"run_dir": False}, 60)
        fill(mnt / "filler")
        assert wait_for(lambda: events(heard) == ["disk_low", "disk_low"], 60), heard
        job.kill()
        job.wait()
        code, err = finish(armed)
        assert code == 0, err
    finally:
        if armed is not None:
            end(armed)      # before the umount: a process on the mount keeps it busy
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)
    assert events(heard) == ["disk_low", "disk_low", "deadman_fired"], heard
    assert len(calls.read_text().splitlines()) == 1             # the stop ran, on a full run dir


def test_notif_a_filesystem_that_hangs_never_holds_the_watch(tmp_path, hook, monkeypatch):
    """statvfs on a dead network mount can block for ever: the dead-man waits DISK_CHECK_SECONDS for it, skips
    the disk this poll, and starts no second probe while the first still hangs. (The hang is a stand-in for
    core.disk_check: a dead NFS server is not something a test can summon.)"""
    heard, _env = hook
    run = finished_run(tmp_path, run_id="hang")
    release = threading.Event()
    entered = []

    def hangs(path):
        entered.append(path)
        release.wait(60)
        raise OSError("gone")
    monkeypatch.setattr(deadman, "DISK_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(deadman.core, "disk_check", hangs)
    dm = a_deadman(run, "--disk-floor-gb", "1e8")
    try:
        dm.observe(time.monotonic())
        assert not release.is_set() and len(entered) == 1     # returned while the probe still hangs
        dm.observe(time.monotonic())
        assert len(entered) == 1 and heard == []              # no second probe piled up
        assert "did not answer" in (run / "deadman.log").read_text()
    finally:
        release.set()


# ----------------------------------------------------------------------------- boot_resume

BOOT_JOB = r'''
import os, sys, time
start = int(open(sys.argv[2]).read().split()[1]) if "--resume" in sys.argv else 0
os.makedirs("out", exist_ok=True)
open("out/ckpt.txt.tmp", "w").write("step %d\n" % (start + 5))
os.replace("out/ckpt.txt.tmp", "out/ckpt.txt")
while os.path.exists(os.environ["GATE_FILE"]):
    time.sleep(0.05)
'''


@pytest.mark.drill("restart re-arms the dead-man")
@pytest.mark.parametrize("opted_in, run_events, told", [(True, None, True), (False, ["failed"], False)],
                         ids=["resumed-told", "re-armed-not-in-the-runs-list"])
def test_notif_boot_resume_tells_what_the_boot_sweep_did(tmp_path, hook, box, opted_in, run_events, told):
    heard, env = hook
    (box.work / "job.py").write_text(BOOT_JOB)
    gate = tmp_path / "hold"
    gate.write_text("hold")
    env = dict(box.env, RGT_NOTIFY_CONFIG=env["RGT_NOTIFY_CONFIG"], RGT_NOTIFY_SPOOL=env["RGT_NOTIFY_SPOOL"],
               GATE_FILE=str(gate))
    opts = ["--resume-glob", "out/*.txt", "--resume-arg", "--resume {}", "--deadman-dry-run", "--grace-minutes",
            "0.01"] + (["--auto-resume"] if opted_in else []) + (["--notify-events", ",".join(run_events)]
                                                                 if run_events else [])
    res = box.launch("boot", [sys.executable, "job.py"], *opts, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = box.run_dir("boot")
    assert wait_for(lambda: (box.work / "out" / "ckpt.txt").exists(), 60)
    kill_everything_of(run_dir)
    gate.unlink()
    boot = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--runs-dir", str(box.durable / "runs"),
                           "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    (only,) = json.loads(boot.stdout)["runs"]
    told_now = fields_of(heard, "boot_resume")               # boot_resume.py has returned: its message is in
    if not told:
        assert only["action"] == "re-armed the dead-man" and told_now == []
        return
    assert only["action"] == "resumed"
    (msg,) = told_now
    assert (msg["run_id"], msg["attempt"], msg["action"], msg["resume_from"]) == ("boot", 2, "resumed", "out/ckpt.txt")
    box.wait_terminal("boot", timeout=120)


# ----------------------------------------------------------------------------- a run's own events

@pytest.mark.parametrize("value, expected", [
    (None, None), (["failed"], ["failed"]), ([], []), ("failed", None), (["failed", 3], None), ({"a": 1}, None),
])
def test_notif_runrec_notify_events_reads_the_runs_list(tmp_path, value, expected):
    doc = {"run_id": "r"} if value is None else {"run_id": "r", "notify_events": value}
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert runrec.notify_events(str(tmp_path)) == expected


def test_notif_a_run_that_wants_only_failed_hears_only_failed(tmp_path, hook):
    """run_one.sh --notify-events failed (run.json notify_events): the supervisor tells nothing for a run that
    starts and finishes, and tells a run that failed."""
    heard, env = hook
    work = tmp_path / "work"
    work.mkdir()
    for rid, code in (("ok", "0"), ("bad", "3")):
        res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "local", "--durable-dir",
                              str(tmp_path / "durable"), "--run-id", rid, "--disk-floor-gb", "0", "--no-deadman",
                              "--notify-events", "failed", "--wait", "--", "sh", "-c", "exit %s" % code],
                             cwd=str(work), capture_output=True, text=True, env=env, timeout=120)
        assert "finished:" in res.stdout, res.stdout + res.stderr
        assert read(tmp_path / "durable" / "runs" / rid / "run.json")["notify_events"] == ["failed"]
    # --wait returned after each supervisor's last message: what was sent is in
    assert [(h["event"], h["fields"]["run_id"]) for h in heard] == [("failed", "bad")], heard


def test_notif_the_dead_man_and_the_stop_engine_tell_only_the_runs_events(tmp_path, hook, dead_man):
    """notify_events ["stop_not_confirmed"]: the firing (deadman_fired) is not told, the escalation is."""
    heard, env = hook
    run = finished_run(tmp_path, run_id="only")
    (run / "run.json").write_text(json.dumps({"run_id": "only", "notify_events": ["stop_not_confirmed"]}))
    stop, _calls = stand_in(tmp_path)
    armed = dead_man(run, "--grace-minutes", "0", "--stop-cmd", stop, "--confirm-seconds", "0.2", "--retries", "1",
                     "--repeat-minutes", "600")
    assert wait_for(lambda: "stop_not_confirmed" in events(heard), 60), heard
    subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(run)], capture_output=True, check=True)
    code, err = finish(armed, 60)
    assert code == 1, err
    assert set(events(heard)) == {"stop_not_confirmed"}, heard     # the engine's escalations, nothing else
    notified = read(run / "DEADMAN_FIRED.json")["notified"]
    told = [n for n in notified if n["sent"]]
    assert {n["event"] for n in told} == {"stop_not_confirmed"} and told[0]["sent"] == ["hook"], notified
    # the firing's own message is on the record as not sent, and why (not one of the run's events)
    assert [(n["event"], n["skipped"]) for n in notified if not n["sent"]] == [("deadman_fired", notified[0][
        "skipped"])] and notified[0]["skipped"], notified


# ---------------------------------------------------------------- laptop round 5 findings (issue 35)
import signal  # noqa: E402


# ---------------------------------------------------------------- N18: what a running run, a launch and a failure say

WAITING_JOB = "import os, time\nprint('step 1/2', flush=True)\nwhile not os.path.exists('go'): time.sleep(0.05)\n"


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
