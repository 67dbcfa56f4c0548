"""The fast paths of issue 27: one ssh connection per rgt.py command, and a tar fallback that hashes as it writes.

Multiplexing (`mux` tests) runs against a real sshd of its own whose log names every accepted connection
(LogLevel INFO) and whose client config does not multiplex, so each connection counted is one rgt.py made.
The tar stream (`fast` tests) runs against streams made by the real tar, by python3's tarfile, and by a
stand-in `tar` that sends a prepared stream (an extra member, a traversal, a cut): what a broken or hostile
node could send. No assertion depends on timing.
"""
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS, need
from results_fixture import RUN, build, make_results, run

sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(NODE))
import evidence  # noqa: E402
import rgt  # noqa: E402  (the Ssh class, in-process)

RGT = SCRIPTS / "rgt.py"
PULL = SCRIPTS / "pull_verified.py"


# ---------------------------------------------------------------- one connection per command

@pytest.fixture
def counted_sshd(tmp_path, ssh_sessions_allowed):
    """A real sshd that logs each accepted connection; its client config (alias gpu-box) never multiplexes."""
    from sshd_fixture import SshdServer
    need("rsync")
    server = SshdServer(tmp_path / "sshd", os.path.abspath(need("sshd")), need("ssh"), need("ssh-keygen"),
                        log_level="INFO", client_mux=False)
    server.base.mkdir()
    server.start()
    yield server
    server.stop()


def accepted(server) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


@pytest.fixture
def control_parent():
    """A short folder for rgt.py's control dirs (RGT_SSH_CONTROL_PARENT), so a test can see what is left."""
    folder = tempfile.mkdtemp(prefix="mux-", dir=os.environ.get("RGT_TEST_SOCKETS") or "/tmp")
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def rgt_cli(tmp_path, server, parent, *args, config=None, mux=True):
    env = dict(os.environ, RGT_SSH_CONTROL_PARENT=str(parent), RGT_SSH_MUX="1" if mux else "0")
    env.pop("RGT_PROFILE_INDEX", None)
    base = [sys.executable, str(RGT), "--ssh-config", str(config or server.config), "--node-dir",
            str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "ledger.jsonl")]
    return subprocess.run(base + list(args), capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def masters_under(parent) -> list:
    """Processes whose command line names a control path under PARENT (a master left running)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/cmdline" % name, "rb") as fh:
                    if str(parent).encode() in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_mux_push_and_pull_each_use_one_connection(tmp_path, counted_sshd, control_parent):
    """push makes 3 ssh calls (probe, stream, version check) and pull 3 or more (manifest, rsync check,
    transfer): each command is ONE accepted connection; the control dir and the master are gone afterwards."""
    before = accepted(counted_sshd)
    res = rgt_cli(tmp_path, counted_sshd, control_parent, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stderr
    assert accepted(counted_sshd) - before == 1
    assert not os.listdir(control_parent) and not masters_under(control_parent)

    durable = tmp_path / "durable"
    make_results(durable / "results" / RUN)
    assert build(durable / "results" / RUN).returncode == 0
    for transport, dest in (("auto", "pulled"), ("tar", "pulled-tar")):
        before = accepted(counted_sshd)
        res = rgt_cli(tmp_path, counted_sshd, control_parent, "pull", "gpu-box", RUN, "--durable-dir",
                      str(durable), "--dest", str(tmp_path / dest), "--transport", transport)
        assert res.returncode == 0, res.stdout + res.stderr
        assert accepted(counted_sshd) - before == 1, transport
        assert (tmp_path / dest / RUN / "PULL_VERIFIED.json").is_file()
        assert not os.listdir(control_parent) and not masters_under(control_parent)


def test_mux_off_connects_once_per_call(tmp_path, counted_sshd, control_parent):
    """The count above can fail: with multiplexing off (RGT_SSH_MUX=0) the same push connects once per call."""
    before = accepted(counted_sshd)
    res = rgt_cli(tmp_path, counted_sshd, control_parent, "push", "gpu-box", "--transport", "tar", mux=False)
    assert res.returncode == 0, res.stderr
    assert accepted(counted_sshd) - before >= 3


def test_mux_control_dir_is_private_short_and_removed(counted_sshd, control_parent, monkeypatch):
    monkeypatch.setenv("RGT_SSH_CONTROL_PARENT", str(control_parent))
    monkeypatch.delenv("RGT_SSH_MUX", raising=False)
    ssh = rgt.Ssh("gpu-box", config=str(counted_sshd.config))
    try:
        folder = Path(ssh.control_dir)
        assert folder.parent == control_parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert len(ssh.control_path.encode()) <= rgt.SOCKET_PATH_MAX
        assert ssh.run("true").returncode == 0
        check = ["ssh", "-F", str(counted_sshd.config), "-o", "ControlPath=" + ssh.control_path, "-O", "check",
                 "gpu-box"]
        assert subprocess.run(check, capture_output=True, timeout=30).returncode == 0   # a master is up
        before = accepted(counted_sshd)
        assert ssh.run("true").returncode == 0 and accepted(counted_sshd) == before     # and is reused
    finally:
        ssh.close()
    assert not folder.exists() and not os.listdir(control_parent)
    assert subprocess.run(check, capture_output=True, timeout=30).returncode != 0
    assert not masters_under(control_parent)


def test_mux_keeps_the_users_config_and_port(tmp_path, counted_sshd, control_parent):
    """-F and -p still reach ssh: a config whose port is wrong works only with -p naming the right one."""
    wrong = tmp_path / "ssh_config_wrong_port"
    wrong.write_text(counted_sshd.config.read_text().replace("Port %d" % counted_sshd.port, "Port 1"))
    failed = rgt_cli(tmp_path, counted_sshd, control_parent, "push", "gpu-box", config=wrong)
    assert failed.returncode == 255, failed.stderr
    res = rgt_cli(tmp_path, counted_sshd, control_parent, "-p", str(counted_sshd.port), "push", "gpu-box",
                  "--transport", "tar", config=wrong)
    assert res.returncode == 0, res.stderr
    assert not os.listdir(control_parent) and not masters_under(control_parent)


# ---------------------------------------------------------------- the tar stream

def results(tmp_path, name="node") -> Path:
    root = make_results(tmp_path / name)
    done = build(root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def fake_tar(tmp_path, stream: bytes, rc: int = 0) -> dict:
    """An environment whose `tar` ignores its list and sends STREAM (then exits RC): a broken or hostile node."""
    folder = tmp_path / "fakebin"
    folder.mkdir(exist_ok=True)
    (tmp_path / "stream.tar").write_bytes(stream)
    (folder / "tar").write_text("#!/bin/sh\ncat >/dev/null\ncat %s\nexit %d\n" % (tmp_path / "stream.tar", rc))
    (folder / "tar").chmod(0o755)
    return dict(os.environ, PATH=str(folder) + os.pathsep + os.environ["PATH"])


def stream_of(root: Path, names, extra=(), fmt=tarfile.GNU_FORMAT) -> bytes:
    """A tar of ROOT's NAMES as ./NAME (what `tar -ch` sends), then EXTRA (name, bytes) members."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as archive:
        for name in names:
            archive.add(str(root / name), arcname="./" + name, recursive=False)
        for name, data in extra:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def listed(root: Path):
    return [e["path"] for e in json.loads((root / "PULL_MANIFEST.json").read_text())["files"]]


def pull_tar(root, dest, env=None, *extra):
    return run(PULL, "--source", root, "--dest", dest, "--transport", "tar", "--json", *extra, env=env)


def test_fast_tar_pulls_long_names_from_gnu_and_pax_streams(tmp_path):
    """Names past the 100-byte ustar field arrive as GNU long-name and pax `path` records: both are read."""
    root = tmp_path / "node"
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / ("f" * 90 + ".bin")).write_bytes(os.urandom(70_000))
    (root / "final.json").write_text("{}")
    assert build(root, ("**",)).returncode == 0
    for fmt, label in ((tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        env = fake_tar(tmp_path, stream_of(root, listed(root), fmt=fmt))
        done = pull_tar(root, tmp_path / label, env)
        assert done.returncode == 0, label + done.stdout + done.stderr
        assert json.loads(done.stdout)["transfer"]["files_transferred"] == 2
    real = pull_tar(root, tmp_path / "real")     # the real tar on this machine
    assert real.returncode == 0, real.stdout + real.stderr


def test_fast_tar_verifies_the_bytes_it_hashed_while_writing(tmp_path):
    """verify_tree trusts a digest taken while writing only while the file is the one written: a digest that
    does not match the manifest fails, and a file changed after it was written is read again."""
    root = results(tmp_path)
    manifest = json.loads((root / "PULL_MANIFEST.json").read_text())
    target = root / "final.json"
    wrong = {"final.json": ("0" * 64, evidence.written_identity(os.lstat(target)))}
    (root / "logs" / "train.log").unlink()     # not in the roster: the node's folder holds it, staging would not
    problems, _ = evidence.verify_tree(root, manifest, 1, progress=False, hashed=wrong)
    assert [(p["code"], p["path"]) for p in problems] == [("sha256", "final.json")]
    os.utime(target, ns=(1, 1))          # another identity: the stale digest is not used, the file is hashed
    problems, _ = evidence.verify_tree(root, manifest, 1, progress=False, hashed=wrong)
    assert problems == []


def test_fast_tar_writes_a_big_member_piece_by_piece_byte_for_byte_and_raises_a_write_error(tmp_path):
    """A member of several chunks is hashed and written a WRITE_PIECE at a time: the file holds the exact bytes
    whose digest is returned, in pieces no larger than WRITE_PIECE; a write that fails (a full disk) fails it."""
    sys.path.insert(0, str(SCRIPTS))
    import hashlib
    import pull_verified as pv
    data = os.urandom(3 * pv.TAR_CHUNK + 12345)
    stream = stream_of(tmp_path, [], extra=[("./big.bin", data)])

    class Guard:
        def moved(self, count):
            pass

    class Pieces(io.BytesIO):
        sizes = []

        def write(self, view):
            self.sizes.append(len(view))
            return super().write(view)

    tar = pv.TarStream(io.BufferedReader(io.BytesIO(stream)), Guard())
    name, size, kind = next(tar.members())
    out = Pieces()
    digest = tar.copy_member(size, out)
    assert (name, size, kind) == ("./big.bin", len(data), "file")
    assert out.getvalue() == data and digest == hashlib.sha256(data).hexdigest()
    assert max(out.sizes) == pv.WRITE_PIECE < pv.TAR_CHUNK and sum(out.sizes) == len(data)

    class FullDisk:
        written = 0

        def write(self, view):
            if self.written >= pv.TAR_CHUNK:
                raise OSError(28, "No space left on device")
            self.written += len(view)
            return len(view)

    tar = pv.TarStream(io.BufferedReader(io.BytesIO(stream)), Guard())
    _name, size, _kind = next(tar.members())
    with pytest.raises(OSError, match="No space left"):
        tar.copy_member(size, FullDisk())


def test_fast_tar_rejects_a_flipped_byte(tmp_path):
    root = results(tmp_path)
    with open(root / "ckpt" / "epoch_1.pt", "r+b") as fh:
        fh.seek(70_000)
        byte = fh.read(1)
        fh.seek(70_000)
        fh.write(bytes([byte[0] ^ 1]))
    done = pull_tar(root, tmp_path / "dest")
    assert done.returncode == 1
    codes = {(p["code"], p["path"]) for p in json.loads(done.stdout)["problems"]}
    assert ("sha256", "ckpt/epoch_1.pt") in codes
    assert not (tmp_path / "dest" / RUN).exists()


def test_fast_tar_rejects_an_extra_member(tmp_path):
    root = results(tmp_path)
    env = fake_tar(tmp_path, stream_of(root, listed(root), extra=[("./logs/train.log", b"not listed\n")]))
    done = pull_tar(root, tmp_path / "dest", env)
    assert done.returncode == 1 and "unexpected member 'logs/train.log'" in done.stdout
    assert not (tmp_path / "dest" / RUN).exists()
    assert not list((tmp_path / "dest").rglob("train.log"))


def test_fast_tar_rejects_a_member_sent_twice(tmp_path):
    root = results(tmp_path)
    names = listed(root)
    done = pull_tar(root, tmp_path / "dest", fake_tar(tmp_path, stream_of(root, names + names[:1])))
    assert done.returncode == 1 and "sent twice" in done.stdout
    assert not (tmp_path / "dest" / RUN).exists()


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/abs-escape.txt", "./ckpt/../../escape.txt"])
def test_fast_tar_rejects_traversal(tmp_path, name):
    root = results(tmp_path)
    env = fake_tar(tmp_path, stream_of(root, [], extra=[(name, b"payload")]))
    done = pull_tar(root, tmp_path / "dest", env)
    assert done.returncode == 1 and "unexpected member" in done.stdout
    assert not list(tmp_path.rglob("escape.txt")) and not os.path.exists("/tmp/abs-escape.txt")


def test_fast_tar_rejects_an_oversize_member_before_writing_it(tmp_path):
    """A file grown on the node after its manifest: its header's size is refused; not one byte is written."""
    root = results(tmp_path)
    with open(root / "metrics.jsonl", "ab") as fh:
        fh.write(b"x" * 5_000_000)
    done = pull_tar(root, tmp_path / "dest")
    assert done.returncode == 1
    summary = json.loads(done.stdout)
    assert summary["problems"][0]["code"] == "size" and "metrics.jsonl" in summary["problems"][0]["detail"]
    staging = tmp_path / "dest" / (".staging-" + RUN)
    assert not (staging / "metrics.jsonl").exists()
    assert not [p for p in staging.rglob("*") if p.name.endswith(".rgt-part")]


def test_fast_tar_rejects_links_and_sparse_members(tmp_path):
    root = results(tmp_path)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("./final.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(info)
    done = pull_tar(root, tmp_path / "dest", fake_tar(tmp_path, buf.getvalue()))
    assert done.returncode == 1 and "unexpected member 'final.json'" in done.stdout
    assert not (tmp_path / "dest" / (".staging-" + RUN) / "final.json").is_symlink()


def test_fast_tar_interrupted_pull_resumes_per_file(tmp_path):
    """A stream cut inside a member: the files before the cut stay in staging (verified), the cut one is not
    left under its name; the next run asks only for what is missing and promotes."""
    root = results(tmp_path)
    names = sorted(listed(root))
    full = stream_of(root, names)
    first = names[0]
    with tarfile.open(fileobj=io.BytesIO(full)) as archive:
        second = archive.getmembers()[1]
    assert second.size > 4096
    cut = full[:second.offset_data + 4096]          # into the second member's data
    done = pull_tar(root, tmp_path / "dest", fake_tar(tmp_path, cut, rc=2))
    assert done.returncode == 1
    staging = tmp_path / "dest" / (".staging-" + RUN)
    assert (staging / first).read_bytes() == (root / first).read_bytes()
    assert not (staging / names[1]).exists()
    assert not [p for p in staging.rglob("*") if p.name.endswith(".rgt-part")]
    again = pull_tar(root, tmp_path / "dest")
    assert again.returncode == 0, again.stdout + again.stderr
    transfer = json.loads(again.stdout)["transfer"]
    assert transfer["files_reused"] == 1 and transfer["files_transferred"] == len(names) - 1
    assert (tmp_path / "dest" / RUN / "PULL_VERIFIED.json").is_file()


# ---------------------------------------------------------------- a launch in three interpreter starts

def test_finding_review_R3_a_launch_costs_three_interpreter_starts(tmp_path):
    """run_one.sh starts Python three times on the launch path: launcher.py prepare (the gates, the run dir),
    launcher.py start (the record, the dead-man as a fork of it, the supervisor, the report) and the supervisor.
    The environment record is a thread of the supervisor, and an immediate exit is reported with its own code
    and a verified sync. Each toolkit process says it started through RGT_TRACE_STARTS (rgt_core at import)."""
    trace = tmp_path / "starts.txt"
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, RGT_TRACE_STARTS=str(trace))
    env.pop("RGT_PYTHON", None)
    res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--durable-dir", str(tmp_path / "durable"),
                          "--deadman-dry-run", "--wait", "--json", "--", "sh", "-c", "exit 7"],
                         cwd=str(work), env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 7, res.stderr[-600:]
    report = json.loads(res.stdout)
    final = report["final"]
    assert (final["state"], final["exit_code"], final["sync"]["ok"], final["sync"]["verified"]) == \
        ("failed", 7, True, True)
    assert report["deadman"]["state"] == "armed" and report["deadman"]["pid"]
    results = Path(final["sync"]["results_dir"])
    assert (results / "env.json").is_file(), "the environment record reached the results"
    starts = [line.split("\t") for line in trace.read_text().splitlines()]
    tools = [(os.path.basename(argv[1]), argv[2] if len(argv) > 2 else "") for argv in starts]
    assert [t for t, _ in tools] == ["launcher.py", "launcher.py", "supervise.py"], tools
    assert [op for t, op in tools if t == "launcher.py"] == ["prepare", "start"]


def test_finding_review_R3_the_dead_man_forked_from_start_never_carries_the_jobs_words(tmp_path):
    """The dead-man is a fork of `launcher.py start`: the job's words reach start on stdin, so `pgrep -f WORD`
    (or a `pkill -f train.py` the docs warn about) never finds the dead-man, while run.json keeps the whole
    launch word for word for the replay after a restart."""
    work = tmp_path / "work"
    work.mkdir()
    marker = "unique-job-word-%d" % os.getpid()
    res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--durable-dir", str(tmp_path / "durable"),
                          "--run-id", "words", "--deadman-dry-run", "--wait", "--json", "--", "sh", "-c",
                          "exit 0", marker, ""], cwd=str(work), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-600:]
    report = json.loads(res.stdout)
    dm_pid = report["deadman"]["pid"]
    cmdline = Path("/proc/%d/cmdline" % dm_pid).read_bytes()
    assert cmdline and marker.encode() not in cmdline, cmdline
    run = json.loads((tmp_path / "durable" / "runs" / "words" / "run.json").read_text())
    assert run["cmd"] == ["sh", "-c", "exit 0", marker, ""]
    assert run["launch_argv"][-6:] == ["--", "sh", "-c", "exit 0", marker, ""], run["launch_argv"]
