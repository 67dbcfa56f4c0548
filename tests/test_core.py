"""Each contract of the shared core (scripts/node/rgt_core.py), tested once, directly."""
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

from conftest import NODE, missing, need_root

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402


# ---------------------------------------------------------------- atomic writes

def test_atomic_write_replaces_content_and_leaves_no_temp(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    core.atomic_write_json(str(target), {"b": 1, "a": 2})
    assert json.loads(target.read_text()) == {"a": 2, "b": 1}
    assert target.read_text().startswith('{\n  "a"')  # sorted keys, stable bytes
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the mode of the file it replaced
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_atomic_write_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "out.bin"
    target.write_bytes(b"good")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(core.os, "replace", broken_replace)
    with pytest.raises(OSError):
        core.atomic_write(str(target), b"new")
    assert target.read_bytes() == b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_atomic_write_dash_means_stdout(capfdbinary):
    core.atomic_write("-", b"to stdout\n")
    assert capfdbinary.readouterr().out == b"to stdout\n"


def test_atomic_write_refuses_a_symlink_and_keeps_it(tmp_path):
    real = tmp_path / "real"
    real.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(core.UsageError, match="symlink"):
        core.atomic_write(str(link), b"x")
    assert link.is_symlink() and real.read_text() == "keep"


def test_atomic_write_refuses_a_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(core.UsageError, match="not a regular file"):
        core.atomic_write(str(fifo), b"x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_atomic_write_refuses_a_device_node(tmp_path):
    need_root("mknod of a device node")
    dev = tmp_path / "fakenull"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with pytest.raises(core.UsageError, match="device"):
        core.atomic_write(str(dev), b"x")
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_atomic_write_refuses_a_directory(tmp_path):
    with pytest.raises(core.UsageError, match="directory"):
        core.atomic_write(str(tmp_path), b"x")


# ---------------------------------------------------------------- processes

def test_pid_alive_on_self_strings_and_junk():
    me = core.process_identity()
    assert core.pid_alive(os.getpid()) and core.pid_alive(str(os.getpid()))
    assert core.identity_alive(me)
    for junk in (None, 0, -1, "", "abc", "12x", True, 3.5, [1]):
        assert core.pid_alive(junk) is False


def test_pid_reuse_is_not_alive():
    """A live pid recorded with another start time (the pid was reused) is not the recorded process."""
    me = core.process_identity()
    if me["start_ticks"] is None:
        missing("no /proc here: process start times come from /proc/PID/stat (run the suite on Linux)")
    assert not core.pid_alive(me["pid"], start_ticks=me["start_ticks"] + 1)
    assert not core.pid_alive(me["pid"], start_ticks=me["start_ticks"], boot="another-boot")


def test_exited_and_zombie_processes_are_not_alive():
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # not reaped yet: a zombie
        with open("/proc/%d/stat" % proc.pid) as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert core.pid_alive(proc.pid) is False
    proc.wait()
    assert core.pid_alive(proc.pid) is False


def test_group_alive_follows_every_member():
    leader = subprocess.Popen(["bash", "-c", "sleep 30 & echo $!; exit 0"], stdout=subprocess.PIPE,
                              start_new_session=True, text=True)
    child = int(leader.stdout.readline())
    leader.wait()
    try:
        assert core.group_alive(leader.pid)  # the leader exited, its child still runs
    finally:
        os.kill(child, 9)
    deadline = time.monotonic() + 30
    while core.group_alive(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not core.group_alive(leader.pid)


def test_run_bounded_holds_its_timeout_against_a_detached_child(tmp_path):
    """The child escapes into its own session but keeps stdout: the timeout still holds."""
    pidfile = tmp_path / "escaped.pid"
    script = "setsid sh -c 'echo $$ > \"$0\"; exec sleep 60' %s & sleep 60" % shlex.quote(str(pidfile))
    try:
        res = core.run_bounded(["bash", "-c", script], timeout=1.0, kill_grace=0.5)
        assert res.timed_out and res.rc is None
        assert res.seconds < 20
    finally:   # the escaped child is the test's own: it must not outlive the test
        if pidfile.exists() and pidfile.read_text().strip().isdigit():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except OSError:
                pass


def test_run_bounded_reports_code_output_and_missing_binary():
    res = core.run_bounded(["bash", "-c", "echo hi; exit 7"], timeout=30)
    assert (res.rc, res.timed_out, res.output.strip()) == (7, False, "hi")
    res = core.run_bounded(["/nonexistent/stop-cmd"], timeout=5)
    assert res.rc == 127 and "cannot run" in res.error


# ---------------------------------------------------------------- hashing

def test_sha256_file_streams_and_matches_hashlib(tmp_path):
    import hashlib
    data = os.urandom(3 * (1 << 20) + 17)
    f = tmp_path / "big.bin"
    f.write_bytes(data)
    seen = []
    assert core.sha256_file(str(f), bufsize=1 << 16, on_bytes=seen.append) == (len(data),
                                                                               hashlib.sha256(data).hexdigest())
    assert sum(seen) == len(data)


def test_sha256_file_refuses_a_symlink_and_a_fifo(tmp_path):
    real = tmp_path / "r"
    real.write_bytes(b"x")
    (tmp_path / "l").symlink_to(real)
    with pytest.raises(OSError):
        core.sha256_file(str(tmp_path / "l"))
    os.mkfifo(tmp_path / "p")
    with pytest.raises(ValueError):
        core.sha256_file(str(tmp_path / "p"))


def test_sha256_file_notices_a_file_growing_under_it(tmp_path):
    f = tmp_path / "growing"
    f.write_bytes(b"a" * 1000)

    grown = []

    def grow(_count):  # another writer appends once, mid-read
        if not grown:
            grown.append(1)
            with open(f, "ab") as fh:
                fh.write(b"more")
    with pytest.raises(ValueError, match="changed"):
        core.sha256_file(str(f), bufsize=100, on_bytes=grow)


# ---------------------------------------------------------------- profiles

def write_index(tmp_path, profiles):
    path = tmp_path / "index.json"
    path.write_text(json.dumps({"profiles": profiles}))
    return str(path)


def test_profile_lookup_env_first_then_repo(tmp_path, monkeypatch):
    monkeypatch.delenv("RGT_PROFILE_INDEX", raising=False)
    assert core.profile_index_path().endswith(os.path.join("profiles", "index.json"))
    assert "DURABLE_DIR" in core.profile_defaults("local")
    monkeypatch.setenv("RGT_PROFILE_INDEX", write_index(tmp_path, {"x": {"defaults": {"A": "~/a", "B": True}}}))
    assert core.profile_defaults("x") == {"A": os.path.expanduser("~/a"), "B": "true"}


@pytest.mark.parametrize("index,name,message", [
    (None, "local", "no profile index found"),
    ({"nope": {}}, "local", "not a profile index"),
    ({"profiles": {"a": {}}}, "local", "not in"),
    ({"profiles": {"bad": {"defaults": []}}}, "bad", "malformed"),
    ({"profiles": {"a": {}}}, " ", "empty"),
])
def test_profile_lookup_fails_with_one_reason(tmp_path, monkeypatch, index, name, message):
    path = tmp_path / "index.json"
    if index is not None:
        path.write_text(json.dumps(index))
    monkeypatch.setenv("RGT_PROFILE_INDEX", str(path))
    with pytest.raises(core.UsageError, match=message):
        core.load_profile(name)


# ---------------------------------------------------------------- disk gate

def test_disk_gate_passes_and_refuses_on_bytes_and_inodes(tmp_path):
    ok, checks = core.disk_gate([str(tmp_path), str(tmp_path / "not" / "yet")], 0, 0)
    assert ok and len(checks) == 1 and checks[0]["status"] == core.OK  # one filesystem, measured once
    ok, checks = core.disk_gate([str(tmp_path)], 10 ** 9, 0)
    assert not ok and checks[0]["status"] == core.REFUSED and "floor" in checks[0]["line"]
    free_inodes = core.disk_check(str(tmp_path))["free_inodes"]
    if free_inodes is not None:
        ok, checks = core.disk_gate([str(tmp_path)], 0, free_inodes + 10 ** 12)
        assert not ok and "inodes" in checks[0]["line"]


def test_disk_gate_write_probe_refuses_an_unusable_dir(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file where a directory must go")
    ok, checks = core.disk_gate([], 0, 0, writable=[str(blocker / "run-1")])
    assert not ok and checks[0]["status"] == core.REFUSED and "not writable" in checks[0]["line"]
    ok, _ = core.disk_gate([], 0, 0, writable=[str(tmp_path / "fresh")])
    assert ok and not any(p.name.startswith(".rgt-write-probe") for p in (tmp_path / "fresh").iterdir())


# ---------------------------------------------------------------- the stall rule

def test_stall_rule_reads_the_dead_mans_limit(tmp_path):
    (tmp_path / "job.log").write_text("step 1\n")
    old = time.time() - 600
    os.utime(tmp_path / "job.log", (old, old))
    age = core.progress_age(str(tmp_path))
    assert 590 < age < 3600
    assert core.stall_minutes_for(str(tmp_path)) == core.DEFAULT_STALL_MINUTES
    (tmp_path / "deadman.json").write_text(json.dumps({"config": {"stall_minutes": 5}}))
    assert core.stall_minutes_for(str(tmp_path)) == 5.0
    assert core.is_stalled(age, 5) and not core.is_stalled(age, 30) and not core.is_stalled(age, 0)
    (tmp_path / "heartbeat.json").write_text("{}")  # fresh heartbeat: progress
    assert core.progress_age(str(tmp_path)) < 60
    assert core.progress_age(str(tmp_path / "missing")) is None


# ---------------------------------------------------------------- errors and exit codes

@pytest.mark.parametrize("exc,code", [(core.UsageError("bad flag"), 2), (core.Refused("disk"), 3),
                                      (core.CheckFailed("sha"), 1), (ValueError("boom"), 1)])
def test_run_main_maps_errors_to_one_line_and_a_code(capsys, exc, code, monkeypatch):
    monkeypatch.delenv("RGT_DEBUG", raising=False)

    def main(_argv):
        raise exc
    assert core.run_main(main, prog="tool") == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: error: ") and "Traceback" not in err


def test_parser_error_is_a_usage_error():
    parser = core.Parser(prog="tool")
    parser.add_argument("--n", type=int)
    with pytest.raises(core.UsageError, match="invalid int"):
        parser.parse_args(["--n", "x"])


def test_parse_iso_round_trip_and_junk():
    assert core.parse_iso(core.utc_iso(1700000000)) == 1700000000.0
    assert core.parse_iso("2026-12-02T10:00:00.123+00:00") == core.parse_iso("2026-12-02T10:00:00Z")
    assert core.parse_iso("yesterday") is None and core.parse_iso(None) is None


# ---------------------------------------------------------------- the version stamp

def test_stamp_is_fresh():
    res = subprocess.run([sys.executable, str(NODE.parent.parent / "tools" / "stamp_node.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_a_tool_refuses_to_run_beside_a_different_core(tmp_path):
    import shutil
    node = tmp_path / "node"
    shutil.copytree(NODE, node)
    tool = sorted(p for p in node.glob("*.py") if p.name not in ("rgt_core.py", "evidence.py"))[0]
    env = dict(os.environ)
    env.pop("RGT_SKIP_VERSION_CHECK", None)
    assert subprocess.run([sys.executable, str(tool), "--help"], capture_output=True, env=env).returncode == 0
    with open(node / "rgt_core.py", "a") as fh:
        fh.write("\n# a newer core\n")
    res = subprocess.run([sys.executable, str(tool), "--help"], capture_output=True, text=True, env=env)
    assert res.returncode == 3 and "not one version" in res.stderr and "rgt_core.py" in res.stderr
    assert res.stderr.count("\n") == 1
