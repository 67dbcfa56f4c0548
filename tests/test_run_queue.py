"""scripts/node/run_queue.sh: a failing middle cell, resume after kill -9 of the whole queue, the guard
against running an orphaned cell twice, SIGTERM forwarding, the disk gate, dry-run, usage, shellcheck."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NODE, REPO, SCRIPTS, TOOLS, need

QUEUE = NODE / "run_queue.sh"
TRAIN = REPO / "examples" / "train_resumable.py"


def env():
    e = dict(os.environ)
    for name in ("RGT_HEARTBEAT", "DATA_DIR", "DISK_FLOOR_GB"):
        e.pop(name, None)
    e["RGT_PYTHON"] = sys.executable      # the interpreter itself, not a slow version-manager shim
    return e


def queue(cwd, *args, timeout=60):
    return subprocess.run(["bash", str(QUEUE), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env(), stdin=subprocess.DEVNULL)


def cell_id(line, cmd):
    return "L%03d-%s" % (line, hashlib.sha256(cmd.encode()).hexdigest()[:8])


def read(path):
    return Path(path).read_text().strip()


def summary(qdir):
    return json.loads((Path(qdir) / "queue_status.json").read_text())


def write_queue(path, lines):
    Path(path).write_text("\n".join(lines) + "\n")


def test_middle_cell_fails_others_still_run(tmp_path):
    cmds = ["echo a >> a.txt", "echo b >> b.txt; exit 3", "echo c >> c.txt"]
    write_queue(tmp_path / "q.txt", ["# three cells", "", *cmds])
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 1, res.stderr
    ids = [cell_id(3, cmds[0]), cell_id(4, cmds[1]), cell_id(5, cmds[2])]
    cells = tmp_path / "q.queue" / "cells"
    assert [read(cells / i / "status") for i in ids] == ["succeeded", "failed", "succeeded"]
    assert [read(cells / i / "exit_code") for i in ids] == ["0", "3", "0"]
    assert "QUEUE FAILED" in res.stdout and ids[1] in res.stdout
    doc = summary(tmp_path / "q.queue")
    assert doc["state"] == "finished" and doc["all_succeeded"] is False
    assert [c["id"] for c in doc["cells"]] == ids and [c["line"] for c in doc["cells"]] == [3, 4, 5]
    assert doc["counts"] == {"succeeded": 2, "failed": 1}

    # second pass: succeeded cells are skipped, the failed one stays failed unless asked
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 1
    assert [read(tmp_path / n) for n in ("a.txt", "b.txt", "c.txt")] == ["a", "b", "c"]
    res = queue(tmp_path, "--disk-floor-gb", "0", "--retry-failed", "q.txt")
    assert res.returncode == 1 and read(tmp_path / "b.txt") == "b\nb"
    assert read(cells / ids[1] / "attempts") == "2" and read(tmp_path / "a.txt") == "a"


def test_stop_on_fail_leaves_later_cells_unrun(tmp_path):
    write_queue(tmp_path / "q.txt", ["true", "false", "touch c.txt"])
    res = queue(tmp_path, "--disk-floor-gb", "0", "--stop-on-fail", "--queue-dir", "state", "q.txt")
    assert res.returncode == 1
    assert not (tmp_path / "c.txt").exists()
    statuses = [c["status"] for c in summary(tmp_path / "state")["cells"]]
    assert statuses == ["succeeded", "failed", "not_run"]


def test_all_succeed_exit_0_and_cells_get_their_env(tmp_path):
    write_queue(tmp_path / "q.txt", ['echo "$RGT_CELL_ID $RGT_HEARTBEAT" > env.txt', "true"])
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 0 and "QUEUE OK" in res.stdout
    cid, hb = read(tmp_path / "env.txt").split()
    assert cid == cell_id(1, 'echo "$RGT_CELL_ID $RGT_HEARTBEAT" > env.txt')
    assert hb == str(tmp_path / "q.queue" / "cells" / cid / "heartbeat.json")


def wait_file_json(path, pred, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            data = json.loads(Path(path).read_text())
            if pred(data):
                return data
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    pytest.fail(f"{path} never satisfied the condition")


def test_kill9_of_the_queue_then_rerun_resumes(tmp_path):
    train = (f"{sys.executable} {TRAIN} --backend pure --ckpt-dir ck --steps 30 --ckpt-every 5 "
             "--step-seconds 0.05")
    cmds = ["echo first >> first.txt", train, "echo third >> third.txt"]
    write_queue(tmp_path / "q.txt", cmds)
    ids = [cell_id(i + 1, c) for i, c in enumerate(cmds)]
    cells = tmp_path / "q.queue" / "cells"
    proc = subprocess.Popen(["bash", str(QUEUE), "--disk-floor-gb", "0", "q.txt"], cwd=tmp_path, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    wait_file_json(cells / ids[1] / "heartbeat.json", lambda d: d["step"] >= 12)
    os.killpg(proc.pid, signal.SIGKILL)          # the box's session dies: queue and cell together
    proc.wait(timeout=10)
    time.sleep(0.2)
    assert read(cells / ids[0] / "status") == "succeeded"
    assert read(cells / ids[1] / "status") == "running"
    assert not (cells / ids[2]).exists() or not (cells / ids[2] / "status").exists()

    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 0, res.stdout + res.stderr
    assert read(tmp_path / "first.txt") == "first"                    # finished cell was skipped
    assert "cut off" in res.stdout
    assert read(cells / ids[1] / "attempts") == "2"
    fin = json.loads((tmp_path / "ck" / "final.json").read_text())
    assert fin["steps_done"] == 30 and fin["resumed_from"] >= 10      # the training cell resumed, not restarted
    assert read(tmp_path / "third.txt") == "third"
    doc = summary(tmp_path / "q.queue")
    assert doc["all_succeeded"] is True and doc["state"] == "finished"


def test_orphaned_cell_still_alive_blocks_a_second_copy(tmp_path):
    write_queue(tmp_path / "q.txt", ["sleep 30"])
    cid = cell_id(1, "sleep 30")
    proc = subprocess.Popen(["bash", str(QUEUE), "--disk-floor-gb", "0", "q.txt"], cwd=tmp_path, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    pid_file = tmp_path / "q.queue" / "cells" / cid / "pid"
    try:
        deadline = time.time() + 20
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)                 # only the queue dies; its cell lives on
        proc.wait(timeout=10)
        res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
        assert res.returncode == 3 and "still running" in res.stderr
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_is_forwarded_and_the_cell_marked_interrupted(tmp_path):
    train = f"{sys.executable} {TRAIN} --backend pure --ckpt-dir ck --steps 200 --step-seconds 0.05"
    write_queue(tmp_path / "q.txt", [train, "touch never.txt"])
    cid = cell_id(1, train)
    proc = subprocess.Popen(["bash", str(QUEUE), "--disk-floor-gb", "0", "q.txt"], cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_file_json(tmp_path / "q.queue" / "cells" / cid / "heartbeat.json", lambda d: d["step"] >= 5)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143 and time.time() - t0 < 5
    cdir = tmp_path / "q.queue" / "cells" / cid
    assert read(cdir / "status") == "interrupted" and read(cdir / "exit_code") == "143"
    assert list((tmp_path / "ck").glob("ckpt-*.json"))              # the cell saved before exiting
    assert not (tmp_path / "never.txt").exists()
    assert summary(tmp_path / "q.queue")["state"] == "interrupted"


def test_disk_gate_refuses_every_cell_when_the_floor_is_huge(tmp_path):
    write_queue(tmp_path / "q.txt", ["touch ran1.txt", "touch ran2.txt"])
    res = queue(tmp_path, "--disk-floor-gb", "99999999", "q.txt")
    assert res.returncode == 1
    assert not (tmp_path / "ran1.txt").exists() and not (tmp_path / "ran2.txt").exists()
    doc = summary(tmp_path / "q.queue")
    assert [c["status"] for c in doc["cells"]] == ["refused_disk", "refused_disk"]
    assert "below the floor" in doc["cells"][0]["reason"]
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")            # space "freed": refused cells run
    assert res.returncode == 0 and (tmp_path / "ran1.txt").exists()


def test_dry_run_lists_and_changes_nothing(tmp_path):
    write_queue(tmp_path / "q.txt", ["# c", "touch x.txt", "", "touch y.txt"])
    res = queue(tmp_path, "--dry-run", "q.txt")
    assert res.returncode == 0
    assert cell_id(2, "touch x.txt") in res.stdout and cell_id(4, "touch y.txt") in res.stdout
    assert "pending" in res.stdout
    assert not (tmp_path / "q.queue").exists() and not (tmp_path / "x.txt").exists()


def test_usage_errors(tmp_path):
    assert queue(tmp_path, "missing.txt").returncode == 2
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    res = queue(tmp_path, "empty.txt")
    assert res.returncode == 2 and "no commands" in res.stderr
    write_queue(tmp_path / "q.txt", ["true"])
    assert queue(tmp_path, "--disk-floor-gb", "lots", "q.txt").returncode == 2
    assert queue(tmp_path, "--bogus", "q.txt").returncode == 2
    res = queue(tmp_path, "--help")
    assert res.returncode == 0 and "Exit codes" in res.stdout


def test_shellcheck_clean():
    sc = need("shellcheck")
    res = subprocess.run([sc, str(QUEUE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
