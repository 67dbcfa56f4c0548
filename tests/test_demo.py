"""The README's main command: the whole lifecycle on this machine, end to end."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import wait_for, NODE, SCRIPTS, TOOLS, path_without

PHASES = ["probe", "gate", "dead-man", "run", "interrupt", "resume", "manifest", "pull", "verify", "teardown gate",
          "dead-man fires", "verified stop", "reaper"]


def live_deadmen(workdir):
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [l for l in out.splitlines() if "deadman.py" in l and str(workdir) in l]


@pytest.mark.long
def test_demo_runs_every_phase_and_cleans_up(tmp_path):
    work = tmp_path / "demo"
    res = subprocess.run([sys.executable, str(SCRIPTS / "demo_lifecycle.py"), "--json", "--keep", "--workdir", str(work)],
                         capture_output=True, text=True, timeout=240)
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["ok"], res.stderr[-2000:]
    assert [p["phase"] for p in report["phases"]] == PHASES
    resume = next(p for p in report["phases"] if p["phase"] == "resume")["evidence"]
    assert "restarted from step" in resume and "finished 60/60" in resume and resume.startswith("attempt 2")
    # --keep leaves the evidence: the verified pull and its record
    verified = json.loads((work / "laptop" / "pulled" / "demo-1" / "PULL_VERIFIED.json").read_text())
    assert verified["file_count"] >= 3
    assert wait_for(lambda: live_deadmen(work) == [], 30), "the demo left a dead-man running"


def test_demo_refuses_a_non_empty_workdir(tmp_path):
    (tmp_path / "something").write_text("x")
    res = subprocess.run([sys.executable, str(SCRIPTS / "demo_lifecycle.py"), "--workdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "not empty" in res.stderr and (tmp_path / "something").exists()


@pytest.mark.long
def test_demo_runs_on_a_bare_machine_without_rsync_or_tmux(tmp_path):
    """The README's promise: Python and bash are enough; the pull falls back to a tar stream, the
    launcher to setsid."""
    env = dict(os.environ, PATH=path_without(tmp_path / "bin", "rsync", "tmux"))
    work = tmp_path / "demo"
    res = subprocess.run([sys.executable, str(SCRIPTS / "demo_lifecycle.py"), "--json", "--keep", "--workdir", str(work)],
                         capture_output=True, text=True, timeout=240, env=env)
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["ok"], res.stderr[-2000:]
    assert [p["phase"] for p in report["phases"]] == PHASES
    status = json.loads((work / "node" / "runs" / "demo-1" / "status.json").read_text())
    assert status["detach"] == "setsid"
    assert (work / "laptop" / "pulled" / "demo-1" / "PULL_VERIFIED.json").exists()
