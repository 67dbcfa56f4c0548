"""A temporary 'node' for the run_one.sh drills: profile index, data and durable dirs, a stand-in meter stop.

`Box` was born in test_run_one.py; the `box` fixture (conftest.py) makes one per test and, afterwards,
disarms the dead-men and kills (by recorded pid) every process its runs started.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

from conftest import NODE, end_runs_under, runs_from, wait_for
from conftest import read_json as read

RUN_ONE = str(NODE / "run_one.sh")
DEADMAN = str(NODE / "deadman.py")
TERMINAL = ("succeeded", "failed", "sync_failed", "interrupted")

# The job: records what it saw at start, optionally writes outputs, sleeps, exits with a code.
# On SIGTERM it writes a marker (its "checkpoint") and exits 143.
JOB = r"""
import json, os, signal, sys, time
cfg = json.loads(sys.argv[1])
def on_term(signum, frame):
    open(cfg["term_marker"], "w").write(repr(time.time()))
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
run_dir = os.environ.get("RGT_RUN_DIR", "")
try:
    dm = json.load(open(os.path.join(run_dir, "deadman.json")))
    os.kill(dm["pid"], 0)
    dm_seen = dm["state"]
except Exception as exc:
    dm_seen = "none: %s" % exc
seen = {k: os.environ.get(k) for k in ("RGT_RUN_DIR", "RGT_RUN_ID", "RGT_HEARTBEAT", "DATA_DIR", "DURABLE_DIR",
                                       "RGT_HOOK_SEEN")}
seen.update(deadman_at_start=dm_seen, cwd=os.getcwd(), pgid=os.getpgid(0), pid=os.getpid(),
            stdin=os.readlink("/proc/self/fd/0"))
open(cfg["seen"], "w").write(json.dumps(seen))
for rel, size in cfg.get("outputs", {}).items():
    os.makedirs(os.path.dirname(rel) or ".", exist_ok=True)
    with open(rel, "wb") as fh:  # content checks apply: a .json output must parse
        fh.write(json.dumps({"pad": "a" * size}).encode() if rel.endswith(".json") else os.urandom(size))
print("job: started", flush=True)
time.sleep(cfg.get("sleep", 0))
print("job: done", flush=True)
sys.exit(cfg.get("code", 0))
"""


class Box(object):
    """A temporary 'node': profile index, data/durable dirs, a stand-in meter stop, a work dir."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.data = tmp_path / "data"
        self.durable = tmp_path / "durable"
        self.work = tmp_path / "work"
        for d in (self.data, self.work):
            d.mkdir()
        self.stop_calls = tmp_path / "meter-stop.calls"
        stop = tmp_path / "meter-stop.sh"
        stop.write_text('#!/bin/sh\necho "stop $(date +%%s.%%N) $*" >> "%s"\n' % self.stop_calls)
        stop.chmod(0o755)
        self.index = tmp_path / "index.json"
        self.index.write_text(json.dumps({"generated_by": "test", "schema_version": 1, "profiles": {"testbox": {
            "platform": "testbox", "defaults": {
                "DATA_DIR": str(self.data), "DURABLE_DIR": str(self.durable), "HF_HOME": None, "PROXY_HOOK": None,
                "DISK_FLOOR_GB": 0.001, "METER_STOP_CMD": "%s pod-42" % stop, "METER_STOP_DESTRUCTIVE": False,
                "METER_STOP_NEEDS": None}}}}))
        self.env = dict(os.environ, RGT_PROFILE_INDEX=str(self.index), RGT_PYTHON=sys.executable)
        for var in ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "PROXY_HOOK", "DISK_FLOOR_GB", "RGT_PROFILE", "TMUX"):
            self.env.pop(var, None)
        self.runs = []

    def run_dir(self, run_id):
        return self.durable / "runs" / run_id

    def job(self, name, **cfg):
        cfg.setdefault("seen", str(self.tmp / ("%s.seen.json" % name)))
        cfg.setdefault("term_marker", str(self.tmp / ("%s.sigterm" % name)))
        return [sys.executable, "-c", JOB, json.dumps(cfg)], cfg

    def argv(self, run_id, job_argv, *opts):
        self.runs.append(run_id)
        return ["bash", RUN_ONE, "--profile", "testbox", "--run-id", run_id, "--poll-seconds", "0.1", *opts,
                "--", *job_argv]

    def launch(self, run_id, job_argv, *opts, env=None, timeout=60):
        return subprocess.run(self.argv(run_id, job_argv, *opts), cwd=str(self.work), env=env or self.env,
                              capture_output=True, text=True, timeout=timeout)

    def status(self, run_id):
        return read(self.run_dir(run_id) / "status.json")

    def wait_terminal(self, run_id, timeout=20):
        assert wait_for(lambda: self.status(run_id).get("state") in TERMINAL, timeout), self.status(run_id)
        return self.status(run_id)

    def stop_calls_lines(self):
        return self.stop_calls.read_text().splitlines() if self.stop_calls.exists() else []

    def cleanup(self):
        """Disarm our dead-men and end every process our runs started, by recorded pid only."""
        for run_id in self.runs:
            rd = self.run_dir(run_id)
            if not rd.is_dir():
                continue
            subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(rd), "--disarm"],
                           capture_output=True, timeout=30)
            status = read(rd / "status.json")
            pids = [status.get("job_pid"), status.get("supervisor_pid"), read(rd / "deadman.json").get("pid")]
            for pid in pids:
                if isinstance(pid, int) and runs_from(pid, self.tmp):
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
            if shutil.which("tmux"):
                tmux = "rgt-" + run_id.replace(".", "_")
                subprocess.run(["tmux", "-L", tmux, "kill-server"], capture_output=True, env=self.env)
        end_runs_under(self.tmp)      # runs started by other tools in this box (a resume, a boot sweep)


def path_without(tmp_path, hidden):
    """A PATH holding links to every program on PATH except `hidden`."""
    farm = tmp_path / ("bin-without-%s" % hidden)
    farm.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            src = os.path.join(folder, name)
            if name == hidden or os.path.lexists(farm / name) or os.path.isdir(src) or not os.access(src, os.X_OK):
                continue
            os.symlink(src, farm / name)
    return str(farm)
