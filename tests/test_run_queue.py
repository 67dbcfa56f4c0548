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

from conftest import NODE, REPO, SCRIPTS, TOOLS, kill_group_of, need, proc_state, tiny_tmpfs, wait_for

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


def cell_groups(root):
    """The process groups the queue recorded for its cells (each cell runs in its own session)."""
    return [int(p.read_text()) for p in Path(root).rglob("cells/*/pgid")]


def group_members(pgid):
    """Live (non-zombie) processes of process group PGID."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % name) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if name.isdigit() and fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(name))
    return found


def kill_groups(root):
    for pgid in cell_groups(root):
        kill_group_of(pgid, root)             # a cell's group leader, while it still runs from ROOT


@pytest.fixture(autouse=True)
def no_cell_left_behind(tmp_path):
    """Whatever a test does, no cell's process group outlives it."""
    yield
    kill_groups(tmp_path)


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
    kill_groups(tmp_path)                        # (the cell runs in a session of its own)
    proc.wait(timeout=10)
    assert wait_for(lambda: not any(group_members(g) for g in cell_groups(tmp_path)), 30)   # no writer is left
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
        kill_groups(tmp_path)      # the cell lives in a session of its own; the queue is already gone


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


# ---------------------------------------------------------------- finding 4: the cell's whole process tree

def alive(pid):
    return proc_state(pid) not in (None, "Z")


def pids_in(path):
    try:
        return [int(x) for x in Path(path).read_text().split()]
    except (OSError, ValueError):
        return []


REPRO_4 = ("echo start; python3 -c 'import time,os; open(\"cell.pid\",\"a\").write(str(os.getpid())+\"\\n\"); "
           "time.sleep(6)'; echo done")


def start_queue(tmp_path, *args):
    return subprocess.Popen(["bash", str(QUEUE), *args], cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)


def test_finding_4_sigterm_stops_the_whole_cell_tree_and_it_never_runs_twice(tmp_path):
    """The report's repro: SIGTERM to the queue (not its group) while the cell's python runs. Old code:
    only `bash -c` got the signal, the python lived on, and the next pass started a second copy."""
    write_queue(tmp_path / "q1.txt", [REPRO_4])
    cid = cell_id(1, REPRO_4)
    first = start_queue(tmp_path, "--disk-floor-gb", "0", "q1.txt")
    wait_for(lambda: len(pids_in(tmp_path / "cell.pid")) == 1, what="the cell's python to start")
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 143
    [old] = pids_in(tmp_path / "cell.pid")
    assert not alive(old), "the cell's python outlived the stopped queue"
    cdir = tmp_path / "q1.queue" / "cells" / cid
    assert read(cdir / "status") == "interrupted"
    assert summary(tmp_path / "q1.queue")["cells"][0]["status"] == "interrupted"

    second = start_queue(tmp_path, "--disk-floor-gb", "0", "q1.txt")
    try:
        wait_for(lambda: len(pids_in(tmp_path / "cell.pid")) == 2, what="the second pass to start the cell again")
        assert [alive(p) for p in pids_in(tmp_path / "cell.pid")].count(True) <= 1, "two copies at once"
        assert not alive(old)
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=60)
    assert second.returncode == 143
    assert not any(alive(p) for p in pids_in(tmp_path / "cell.pid"))


def test_finding_4_interrupted_cell_whose_process_lives_is_refused(tmp_path):
    """A cell recorded as interrupted whose old process still runs is refused (exit 3), like a running one."""
    write_queue(tmp_path / "q.txt", ["echo x >> starts.txt; exec sleep 30"])
    cid = cell_id(1, "echo x >> starts.txt; exec sleep 30")
    cdir = tmp_path / "q.queue" / "cells" / cid
    proc = start_queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    wait_for(lambda: (cdir / "pid").exists() and (tmp_path / "starts.txt").exists(), what="the cell to start")
    os.kill(proc.pid, signal.SIGKILL)                 # the queue alone dies; the cell lives on
    proc.communicate(timeout=10)
    (cdir / "status").write_text("interrupted\n")     # as a pass that recorded the stop but not the group
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 3, res.stdout + res.stderr
    refusal = res.stderr.strip().splitlines()[-1]     # (after a note that the dead pass's lock was taken over)
    assert refusal.startswith("run_queue.sh: error: REFUSED") and "still running" in refusal
    assert "(interrupted)" in refusal
    assert read(tmp_path / "starts.txt") == "x", "a second copy was started"


def test_stop_grace_kills_a_cell_that_ignores_sigterm(tmp_path):
    cmd = "trap '' TERM; echo $$ > leader.pid; sleep 300"
    write_queue(tmp_path / "q.txt", [cmd])
    proc = start_queue(tmp_path, "--disk-floor-gb", "0", "--stop-grace", "1", "q.txt")
    wait_for(lambda: pids_in(tmp_path / "leader.pid"), what="the cell to start")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert "SIGKILL to process group" in err
    [pgid] = cell_groups(tmp_path)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert read(tmp_path / "q.queue" / "cells" / cell_id(1, cmd) / "status") == "interrupted"


def test_a_cell_ends_when_its_whole_process_group_has(tmp_path):
    """A background writer the cell left behind finishes before the next cell starts."""
    cmds = ["(sleep 1; echo late > late.txt) & echo main", "test -f late.txt"]
    write_queue(tmp_path / "q.txt", cmds)
    res = queue(tmp_path, "--disk-floor-gb", "0", "q.txt")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "waiting for the processes it left" in res.stdout


# ---------------------------------------------------------------- --json

def test_json_summary_on_stdout(tmp_path):
    cmds = ["true", "exit 3"]
    write_queue(tmp_path / "q.txt", cmds)
    res = queue(tmp_path, "--disk-floor-gb", "0", "--json", "q.txt")
    assert res.returncode == 1
    doc = json.loads(res.stdout)                                     # stdout is the document alone
    assert doc == summary(tmp_path / "q.queue")
    assert doc["schema"] == "rgt-queue-status/1" and doc["state"] == "finished" and doc["status"] == "FAIL"
    assert [(c["id"], c["status"], c["exit_code"]) for c in doc["cells"]] == [
        (cell_id(1, "true"), "succeeded", 0), (cell_id(2, "exit 3"), "failed", 3)]
    assert all(isinstance(c["pgid"], int) and c["attempts"] == 1 for c in doc["cells"])
    assert "QUEUE FAILED" in res.stderr
    res = queue(tmp_path, "--dry-run", "--json", "q.txt")
    assert res.returncode == 0 and json.loads(res.stdout)["state"] == "dry_run"
    (tmp_path / "fresh.txt").write_text("true\n")
    res = queue(tmp_path, "--dry-run", "--json", "fresh.txt")
    assert json.loads(res.stdout)["cells"][0]["status"] == "pending" and not (tmp_path / "fresh.queue").exists()


def test_json_stays_valid_for_hostile_commands(tmp_path):
    tricky = 'echo "a \\"quote\\", a back\\\\slash,\ttab, 实验" > /dev/null'
    (tmp_path / "q.txt").write_bytes(tricky.encode() + b"\n" + b"echo '\xff\xfe' > /dev/null\n")
    res = subprocess.run(["bash", str(QUEUE), "--disk-floor-gb", "0", "--json", "q.txt"], cwd=tmp_path,
                         capture_output=True, env=env(), stdin=subprocess.DEVNULL, timeout=60)
    assert res.returncode == 0, res.stderr
    on_disk = json.loads((tmp_path / "q.queue" / "queue_status.json").read_text())
    assert json.loads(res.stdout.decode("utf-8")) == on_disk
    raw = (tmp_path / "q.queue" / "queue_status.json").read_bytes()
    doc = json.loads(raw.decode("utf-8"))                            # valid UTF-8 and valid JSON
    assert doc["cells"][0]["cmd"] == tricky
    assert doc["cells"][1]["cmd"] == "echo '' > /dev/null"           # invalid bytes dropped, not fatal


# ---------------------------------------------------------------- the core's disk gate

def test_disk_gate_uses_the_toolkits_inode_floor(tmp_path):
    """A real filesystem with 200 inodes: refused by the one inode floor (10,000) unless --inode-floor says."""
    tiny = tiny_tmpfs(tmp_path / "tiny")
    try:
        write_queue(tmp_path / "q.txt", ["touch ran.txt"])
        e = env()
        e["DATA_DIR"] = str(tiny / "data")
        res = subprocess.run(["bash", str(QUEUE), "--disk-floor-gb", "0", "q.txt"], cwd=tmp_path, env=e,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and not (tmp_path / "ran.txt").exists()
        reason = summary(tmp_path / "q.queue")["cells"][0]["reason"]
        assert "free inodes, below the floor of 10000" in reason, reason
        res = subprocess.run(["bash", str(QUEUE), "--disk-floor-gb", "0", "--inode-floor", "10", "q.txt"],
                             cwd=tmp_path, env=e, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
    finally:
        subprocess.run(["umount", str(tiny)], capture_output=True)
