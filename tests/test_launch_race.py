"""The launch race (red-team finding 6): a job that exits at once is reported with its real exit code and state.

The old launcher polled for run.lock/pid, which the supervisor of a job like `false` had already removed:
it waited 30 s, said "the supervisor did not start", exited 1, overwrote the state and disarmed the
dead-man. Now the launcher learns the start from status.json (supervisor_identity, written under a lock).
Everything here is real: bash, tmux or the setsid path, the supervisor, the dead-man. Nothing sleeps a
fixed time; each launch is one `run_one.sh --wait --json` and the assertions read the files it left. The
four kinds of immediate exit start at once, so the launchers race each other for the CPU as well.
"""
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import NODE, need, path_without, pid_alive, runs_from, wait_for
from conftest import read_json as read

pytestmark = pytest.mark.drill("red-team findings stay fixed")   # every test here is a finding

RUN_ONE = str(NODE / "run_one.sh")
SUPERVISE = str(NODE / "supervise.py")
LAUNCHER = str(NODE / "launcher.py")
DEADMAN = str(NODE / "deadman.py")

# (job, exit code, final state): each exits within milliseconds
IMMEDIATE = [
    (["true"], 0, "succeeded"),
    (["false"], 1, "failed"),
    (["nonexistent_cmd_rgt_xyz"], 127, "failed"),         # a typo: exit 127 at once
    ([sys.executable, "-c", "import sys; sys.exit(7)"], 7, "failed"),
]


def stop_deadman(run_dir):
    """End this run's dead-man by its recorded pid (we armed it; SIGTERM is its documented exit)."""
    pid = read(run_dir / "deadman.json").get("pid")
    if isinstance(pid, int) and runs_from(pid, run_dir):
        os.kill(pid, signal.SIGTERM)


def launch_and_wait(box, env, run_id, job):
    return subprocess.run(["bash", RUN_ONE, "--profile", "testbox", "--run-id", run_id, "--grace-minutes", "5",
                           "--poll-seconds", "0.5", "--wait", "--json", "--", *job], cwd=str(box.work), env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("detach", ["tmux", "setsid"])
def test_finding_6_immediate_exits_report_their_own_code_and_state(box, detach):
    """Every kind of immediate exit, launched all at once into one box (the race is hardest when the
    launchers compete for the CPU); each launcher must report its own job's code and state."""
    env = dict(box.env)
    if detach == "tmux":
        need("tmux")
    else:
        env["PATH"] = path_without(box.tmp / "no-tmux", "tmux")
    launches = [("fast-%s-%d" % (detach, n), job, code, state) for n, (job, code, state) in enumerate(IMMEDIATE)]
    box.runs.extend(run_id for run_id, _, _, _ in launches)
    with ThreadPoolExecutor(len(launches)) as pool:
        results = list(pool.map(lambda launch: launch_and_wait(box, env, launch[0], launch[1]), launches))
    for (run_id, job, code, state), res in zip(launches, results):
        where = "%s (%s): %s" % (run_id, " ".join(job), res.stderr[-600:])
        assert res.returncode == code, where
        assert "did not" not in res.stderr, where
        report = json.loads(res.stdout)
        assert report["detach"] == detach and report["final"]["state"] == state, where
        assert report["final"]["exit_code"] == code, where
        rd = box.run_dir(run_id)
        status = read(rd / "status.json")
        assert status["state"] == state and status["exit_code"] == code, (where, status)
        assert status["supervisor_identity"]["pid"] == status["supervisor_pid"] == report["supervisor_pid"]
        assert status["sync"]["ok"] is True, (where, status["sync"])
        if code == 127:
            assert "cannot start nonexistent_cmd_rgt_xyz" in status["error"]
        else:
            assert status["error"] is None and status["job_identity"]["pid"] == status["job_pid"], where
        # the run ran: its dead-man must still be armed (nothing acknowledged, nothing disarmed it)
        dm = read(rd / "deadman.json")
        assert dm["state"] == "armed" and pid_alive(dm["pid"]) and not (rd / "ACK").exists(), where
        assert report["deadman"]["state"] == "armed", where
        assert not (rd / "run.lock").exists(), where
        stop_deadman(rd)
    # How fast the report comes is measured by tools/bench_latency.py (GUIDE §9: within 2 s), not here.


def test_finding_6_a_supervisor_that_never_records_itself_fails_the_launch_fast_and_disarms(box):
    """The other side of the handshake: when no supervisor ever claims the run, the launcher says so at once,
    marks it failed and disarms the dead-man (the job never ran)."""
    rd = box.run_dir("nosup")
    (rd / "supervisor.log").mkdir(parents=True)   # the supervisor cannot open its log and exits before claiming
    job, cfg = box.job("nosup")
    res = box.launch("nosup", job, "--grace-minutes", "5", "--wait")
    # this message, not the timeout's ("did not record itself within ..."): the launcher noticed at once
    assert res.returncode == 1 and "exited before it recorded itself" in res.stderr, res.stderr
    status = box.status("nosup")
    assert status["state"] == "failed" and status["supervisor_identity"] is None and status["job_pid"] is None
    assert not os.path.exists(cfg["seen"]), "the job ran"
    assert read(rd / "ACK").get("disarm") is True


def write_run(rd, marker, status):
    rd.mkdir(parents=True)
    (rd / "run.lock").mkdir()
    (rd / "run.lock" / "pid").write_text("%d\n" % os.getpid())
    (rd / "run.json").write_text(json.dumps({"run_id": "late", "cwd": str(rd), "outputs": [],
                                             "cmd": [sys.executable, "-c", "open(%r, 'w').close()" % str(marker)]}))
    (rd / "status.json").write_text(json.dumps(dict({"run_id": "late", "launcher_pid": os.getpid()}, **status)))


def test_finding_6_a_late_supervisor_never_runs_a_run_its_launcher_gave_up(tmp_path):
    rd, marker = tmp_path / "run", tmp_path / "job-ran"
    write_run(rd, marker, {"state": "failed", "error": "the supervisor did not record itself within 30 s",
                           "supervisor_identity": None})
    before = (rd / "status.json").read_text()
    res = subprocess.run([sys.executable, SUPERVISE, "--run-dir", str(rd)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 3, res.stderr
    assert "launcher gave up" in (rd / "supervisor.log").read_text()
    assert not marker.exists() and (rd / "status.json").read_text() == before


def test_finding_6_the_launcher_never_overwrites_a_run_that_has_a_supervisor(tmp_path):
    rd = tmp_path / "run"
    write_run(rd, tmp_path / "unused", {"state": "failed", "exit_code": 7, "ended_at": "2026-01-01T00:00:00Z",
                                        "supervisor_pid": 1, "supervisor_identity": {"pid": 1}})
    before = (rd / "status.json").read_text()
    res = subprocess.run([sys.executable, LAUNCHER, "fail", "--run-dir", str(rd), "--message", "did not start"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "a supervisor has it" in res.stderr
    assert (rd / "status.json").read_text() == before


# ---------------------------------------------------------------- field N19: a launch never reuses a run

def tree(rd):
    """{relative path: bytes} of every file under RD (directories by name): what a refused launch must not change."""
    return {str(p.relative_to(rd)): (p.read_bytes() if p.is_file() else None) for p in sorted(rd.rglob("*"))}


def refused_once(res, *words):
    assert res.returncode == 3, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "already exists" in lines[0] and "rgt.py resume" in lines[0], lines
    assert "--run-id" in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert res.stdout == ""


def test_finding_field_N19_a_launch_under_an_existing_run_id_is_refused_and_changes_nothing(box, tmp_path):
    """run_one.sh with the run id of a run the node holds: a live one was refused by its run lock only after the
    gates, a finished one got attempt 2 behind the user's back (evidence moved aside, the run record replaced),
    and one whose budget was spent armed a dead-man on the first start's clock: the job started and was stopped
    at the first check, paid for nothing. Now each is refused (3) in one line naming the run's state, with no job
    started and not a byte of the run dir changed; resume is the way to a next attempt, and it still works."""
    sys.path.insert(0, str(NODE))
    import runrec
    import time
    hold = box.work / "hold"
    hold.write_text("")
    live_job = [sys.executable, "-c", "import os, time\nwhile os.path.exists('hold'): time.sleep(0.05)\n"]
    assert box.launch("n19-live", live_job, "--no-deadman").returncode == 0
    assert box.launch("n19-over", box.job("over", code=1)[0], "--no-deadman", "--wait").returncode == 1
    assert box.launch("n19-spent", box.job("spent")[0], "--no-deadman", "--wait").returncode == 0
    # the clock the dead-man keeps (runrec.start_budget): started 10 s ago at 3600/h, so 10 of a 0.5 cap is spent
    runrec.start_budget(str(box.run_dir("n19-spent")), 0.5, 3600.0, time.time() - 10)
    try:
        assert wait_for(lambda: box.status("n19-live").get("state") == "running", 60)
        for rid, words in (("n19-live", ("live", "running")), ("n19-over", ("attempt 1", "failed")),
                           ("n19-spent", ("succeeded", "budget spent"))):
            rd = box.run_dir(rid)
            before = tree(rd) if rid != "n19-live" else None
            status = (rd / "status.json").read_bytes()
            again, cfg = box.job("again-" + rid)
            res = box.launch(rid, again, "--grace-minutes", "5", "--wait")
            refused_once(res, *words)
            assert not os.path.exists(cfg["seen"]), "the second launch started its job"
            assert (rd / "status.json").read_bytes() == status and not (rd / "previous").exists()
            assert not (rd / "deadman.json").exists(), "the refused launch armed a dead-man"
            if before is not None:
                assert tree(rd) == before
    finally:
        hold.unlink()
    assert box.wait_terminal("n19-live")["attempt"] == 1
    # the way on is resume: boot_resume.py replays the launch under RUN_DIR/resume.lock, as attempt 2
    res = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--run", str(box.run_dir("n19-over")),
                          "--force-restart", "--json"], env=box.env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and json.loads(res.stdout)["attempt"] == 2, res.stdout + res.stderr
    assert box.wait_terminal("n19-over")["attempt"] == 2
