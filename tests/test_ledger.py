"""The laptop's ledger (rgt.py): a row is never torn by a short write, an unwritable ledger never hides what
the node did and a launch it cannot record never starts; two boxes behind one address stay two, a new machine at
an old address is a new box; a later live attempt reopens a gate PASS.

Real parts: an sshd on 127.0.0.1 (tests/sshd_fixture.py), real rsync and tar. Each test keeps its finding's name
(../shared/reports/redteam-2026-12-03-laptop.md L<n>, design review B<n>).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS, wait_for
from laptop_fixture import durable  # noqa: F401
from sshd_fixture import rgt


RGT = SCRIPTS / "rgt.py"


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_finding_laptop_1_a_gate_pass_is_reopened_by_a_later_live_attempt(tmp_path):
    """The ledger's fold: a status or patrol row that sees an attempt newer than the gated one, or a run that
    runs again, puts the run back on the list (and patrol looks at it again)."""
    rows = [{"event": "launch", "host": "box", "run_id": "r1", "attempt": 1, "state": "launched", "run_dir": "/d"},
            {"event": "gate", "host": "box", "run_id": "r1", "attempt": 1, "verdict": "PASS"},
            {"event": "status", "host": "box", "run_id": "r1", "attempt": 1, "state": "succeeded"}]
    path = tmp_path / "ledger.jsonl"
    for extra, listed in (([], []), ([{"event": "status", "host": "box", "run_id": "r1", "attempt": 2,
                                       "state": "running"}], ["r1"]),
                          ([{"event": "patrol", "host": "box", "run_id": "r1", "attempt": 1,
                             "state": "syncing"}], ["r1"])):
        path.write_text("".join(json.dumps(dict(r, time="2026-12-03T00:00:0%dZ" % i)) + "\n"
                                for i, r in enumerate(rows + extra)))
        res = run_py(RGT, "--ledger", path, "--json", "ledger")
        assert [r["run_id"] for r in json.loads(res.stdout)["runs"]] == listed, (extra, res.stdout)


# ---------------------------------------------------------------- laptop 4, 5: the ledger on a full or read-only disk

def limited(size):
    """A preexec_fn: files may not grow past SIZE bytes (a disk that fills mid-write), SIGXFSZ ignored so the
    write comes back short (or EFBIG) as it does on a full disk."""
    def apply():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_finding_laptop_4_a_short_write_never_tears_a_ledger_row(tmp_path):
    path = tmp_path / "ledger.jsonl"
    first = json.dumps({"event": "push", "host": "otherbox", "time": "2026-12-03T16:46:58Z"}) + "\n"
    path.write_text(first)
    code = ("import sys; sys.path.insert(0, %r); import rgt\n"
            "try:\n"
            "    rgt.ledger_append(%r, event='launch', host='gpu', run_id='torn3', state='launched', attempt=1,\n"
            "                      run_dir='~/dur/runs/torn3')\n"
            "except OSError as exc:\n"
            "    print('refused:', exc)\n" % (str(SCRIPTS), str(path)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=limited(len(first) + 40))
    assert "refused:" in res.stdout, res.stdout + res.stderr   # the short write is an error, not a silent 0
    assert path.read_text() == first                             # and it was undone: no torn row is left
    # a row torn earlier (a crash mid-write: no newline at the end) never swallows the next one
    path.write_text(first + '{"event": "launch", "host": "gpu", "run_id": "torn1", "run_d')
    for rid in ("torn3", "torn4"):
        res = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import rgt; "
                              "rgt.ledger_append(%r, event='launch', host='gpu', run_id=%r, state='launched', "
                              "attempt=1, run_dir='/d/runs/x')" % (str(SCRIPTS), str(path), rid)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
    listed = run_py(RGT, "--ledger", path, "ledger")
    assert "torn3" in listed.stdout and "torn4" in listed.stdout, listed.stdout
    assert "WARN ledger line 2 is not a whole row" in listed.stdout and "torn1" in listed.stdout
    assert listed.returncode == 1      # the list may be missing a run: said, never a quiet OK
    doc = json.loads(run_py(RGT, "--ledger", path, "--json", "ledger").stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["torn3", "torn4"] and doc["torn_rows"][0]["line"] == 2


def test_finding_laptop_5_an_unwritable_ledger_never_hides_what_the_node_did(tmp_path, sshd_server, durable):  # noqa: F811
    work = tmp_path / "work"
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    blocked = tmp_path / "state-is-a-file"
    blocked.write_text("")   # XDG_STATE_HOME/remote-gpu-trainer cannot be made: as unwritable as a read-only disk
    common = ["--profile", "local", "--durable-dir", durable, "--cwd", work, "--", "--deadman-dry-run", "--wait",
              "--poll-seconds", "0.2", "--", "python3", "-c", "print('step 1/1')"]
    bad_ledger = blocked / "remote-gpu-trainer" / "ledger.jsonl"
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "ro2", *common, ledger=bad_ledger)
    assert res.returncode == 12 and "cannot be written" in res.stderr and "nothing was started" in res.stderr, \
        res.stdout + res.stderr   # exit 12 since issue 35: a launch the ledger cannot record (test_ledger.py)
    assert not (durable / "runs" / "ro2").exists()               # checked before the node acted
    # the ledger fills up after its first row (written before the node acts): the launch is reported in full,
    # with a WARN, exit 0, and that first row lists the run
    scratch = tmp_path / "scratch.jsonl"       # the size of that first row, from a launch of the same shape
    assert rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "ro4", *common, ledger=scratch).returncode == 0
    first = len(next(l for l in scratch.read_text().splitlines(True) if '"launching"' in l).encode())
    ledger = tmp_path / "full.jsonl"
    ledger.write_text(json.dumps({"event": "push", "host": "x", "time": "2026-12-03T00:00:00Z"}) + "\n")
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
            str(tmp_path / "node-bin"), "--ledger", str(ledger)]
    res = subprocess.run(base + ["launch", "gpu-box", "--run-id", "ro3", *map(str, common)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, preexec_fn=limited(ledger.stat().st_size + first + 4))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "run id:     ro3" in res.stdout and "watch:" in res.stdout
    assert "WARN could not record this launch" in res.stderr and "unexpected" not in res.stderr
    assert json.loads((durable / "runs" / "ro3" / "status.json").read_text())["state"] == "succeeded"
    assert "ro3" in run_py(RGT, "--ledger", ledger, "ledger").stdout
    # read-only commands do their work and keep their own exit code
    status = rgt(tmp_path, sshd_server, "status", "gpu-box", "ro3", "--durable-dir", durable, ledger=bad_ledger)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stdout + status.stderr
    assert "WARN could not record this status" in status.stderr


# ---------------------------------------------------------------- laptop 3, review B5: which box is which

@pytest.fixture
def second_sshd(sshd_server, tmp_path):  # noqa: F811
    """Box B: a second sshd on another port of the same user@127.0.0.1 (how a gateway hands out boxes), with
    box A's keys, so one client config reaches both as `-p PORT user@127.0.0.1`."""
    import tempfile
    from sshd_fixture import SshdServer
    base = Path(tempfile.mkdtemp(prefix="rgt-b-"))   # short: the ssh control socket path has a length limit
    for name in ("host_ed25519", "host_ed25519.pub", "client_ed25519", "client_ed25519.pub"):
        shutil.copy2(sshd_server.base / name, base / name)
    server = SshdServer(base, sshd_server.sshd, sshd_server.ssh, sshd_server.keygen).start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


def gateway_config(tmp_path, a, b, alias_port=None):
    """An ssh config that reaches both boxes as USER@127.0.0.1 -p PORT, and `gpu` at ALIAS_PORT."""
    known = tmp_path / "known_gateway"
    key = (a.base / "host_ed25519.pub").read_text().split()
    known.write_text("".join("[127.0.0.1]:%d %s %s\n" % (s.port, key[0], key[1]) for s in (a, b)))
    lines = []
    if alias_port:
        lines += ["Host gpu", "  HostName 127.0.0.1", "  Port %d" % alias_port]
    lines += ["Host *", "  IdentityFile %s" % (a.base / "client_ed25519"), "  IdentitiesOnly yes",
              "  UserKnownHostsFile %s" % known, "  GlobalKnownHostsFile /dev/null", "  StrictHostKeyChecking yes",
              "  BatchMode yes", "  LogLevel ERROR", ""]
    path = tmp_path / ("gateway_%s.cfg" % (alias_port or "plain"))
    path.write_text("\n".join(lines))
    return path


def rgt_at(tmp_path, config, *args, port=None):
    base = [sys.executable, str(RGT), "--ssh-config", str(config), "--node-dir", str(tmp_path / "node-bin"),
            "--ledger", str(tmp_path / "ledger.jsonl")] + (["-p", str(port)] if port else [])
    env = dict(os.environ)
    env.pop("RGT_PROFILE_INDEX", None)
    return subprocess.run(base + list(map(str, args)), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)


def test_finding_laptop_3_and_review_B5_two_boxes_at_one_address_stay_two(tmp_path, sshd_server, second_sshd,
                                                                            durable):  # noqa: F811
    import getpass
    user = getpass.getuser()
    a, b = sshd_server, second_sshd
    cfg = gateway_config(tmp_path, a, b)
    host = "%s@127.0.0.1" % user
    for box in (a, b):
        res = rgt_at(tmp_path, cfg, "push", host, "--transport", "tar", port=box.port)
        assert res.returncode == 0, res.stdout + res.stderr
    boxes = json.loads(rgt_at(tmp_path, cfg, "--json", "ledger").stdout)["boxes_without_runs"]
    assert sorted(x["box"] for x in boxes) == sorted("%s:%d" % (host, s.port) for s in (a, b))   # two, not one
    # the same run id on both: box A's runs on, box B's ends and passes the gate
    work_a, work_b = tmp_path / "work-a", tmp_path / "work-b"
    work_a.mkdir()
    hold = ("import os, time\nt = time.monotonic()\n"
            "while not os.path.exists('release') and time.monotonic() - t < 300: time.sleep(0.1)\n"
            "os.makedirs('ckpt', exist_ok=True); open('ckpt/final.json', 'w').write('{}')\n")
    (work_a / "job.py").write_text(hold)
    for box, work, job in ((a, work_a, ["python3", "job.py"]),
                           (b, work_b, ["python3", "-c", "import os; os.makedirs('ckpt', exist_ok=True); "
                                                         "open('ckpt/final.json', 'w').write('{}')"])):
        res = rgt_at(tmp_path, cfg, "launch", host, "--profile", "vastai", "--run-id", "exp3", "--durable-dir",
                     durable / str(box.port), "--cwd", work, "--", "--output", "ckpt/*", "--deadman-dry-run",
                     "--poll-seconds", "0.2", "--", *job, port=box.port)
        assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: rgt_at(tmp_path, cfg, "status", host, "exp3", port=b.port).returncode == 0, 120)
    assert rgt_at(tmp_path, cfg, "pull", host, "exp3", port=b.port).returncode == 0
    gate = rgt_at(tmp_path, cfg, "gate", host, "exp3", port=b.port)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    runs = json.loads(rgt_at(tmp_path, cfg, "--json", "ledger").stdout)["runs"]
    assert [(r["run_id"], r["box"]) for r in runs] == [("exp3", "%s:%d" % (host, a.port))], runs   # A still bills
    assert "exp3" in rgt_at(tmp_path, cfg, "patrol", host, "--min-free-gb", "0", port=a.port).stdout
    (work_a / "release").write_text("")
    # an alias re-pointed at another box: a push through it lists that box, and the ledger says what moved
    for port in (a.port, b.port):
        res = rgt_at(tmp_path, gateway_config(tmp_path, a, b, alias_port=port), "push", "gpu", "--transport", "tar")
        assert res.returncode == 0, res.stdout + res.stderr
    listed = rgt_at(tmp_path, cfg, "ledger")
    assert "NOTE gpu now reaches %s:%d" % (host, b.port) in listed.stdout, listed.stdout
    assert "(pushed, no run)" in listed.stdout and "%s:%d" % (host, b.port) in listed.stdout   # B bills again


def test_finding_laptop_3_a_new_machine_at_an_old_address_is_a_new_box(tmp_path):
    """A gateway port handed to another instance: same address, another /etc/machine-id at push."""
    rows = [{"event": "push", "host": "gw", "box": "root@gw:4000", "machine_id": "a" * 32},
            {"event": "launch", "host": "gw", "box": "root@gw:4000", "run_id": "r1", "attempt": 1,
             "state": "launched", "run_dir": "/d/runs/r1"},
            {"event": "gate", "host": "gw", "box": "root@gw:4000", "run_id": "r1", "attempt": 1, "verdict": "PASS"},
            {"event": "push", "host": "gw", "box": "root@gw:4000", "machine_id": "b" * 32}]
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(dict(r, time="2026-12-03T00:00:0%dZ" % i)) + "\n" for i, r in enumerate(rows)))
    doc = json.loads(run_py(RGT, "--ledger", path, "--json", "ledger").stdout)
    assert [(x["box"], x["machine_id"]) for x in doc["boxes_without_runs"]] == [("root@gw:4000", "b" * 32)]
    assert any("NOTE gw now reaches root@gw:4000 [machine bbbb" in n for n in doc["notes"]), doc["notes"]


def pushed(tmp_path, server):
    res = rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- round-4 residual: a launch on a full laptop disk

def full_disk(size):
    """A preexec_fn: no file may grow past SIZE bytes, as on a full disk (the write comes back short)."""
    def apply():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_finding_laptop_round4_residual_a_launch_the_ledger_cannot_record_never_starts(
        tmp_path, sshd_server):  # noqa: F811
    durable, work = tmp_path / "durable", tmp_path / "work"
    pushed(tmp_path, sshd_server)
    ledger = tmp_path / "ledger.jsonl"
    before = ledger.read_bytes()
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
            str(tmp_path / "node-bin"), "--ledger", str(ledger)]
    res = subprocess.run(base + ["launch", "gpu-box", "--profile", "local", "--run-id", "torn3", "--durable-dir",
                                 str(durable), "--cwd", str(work), "--", "--no-deadman", "--", "python3", "-c", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         preexec_fn=full_disk(len(before)))   # the ledger's folder is writable; its disk is full
    assert res.returncode == 12, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "nothing was started on gpu-box" in res.stderr, res.stderr
    assert not (durable / "runs" / "torn3").exists() and not work.exists()   # the node never acted
    assert ledger.read_bytes() == before                                     # and no torn row is left
