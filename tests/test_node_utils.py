"""Behaviour tests for the node utilities: gpu_health.sh, mem_monitor.sh, reap_vram_zombies.sh,
setup-china-mirrors.sh and fetch_resumable.py.

Real processes, real signals, real sockets: fetch tests talk to a local HTTP server (written here,
with Range support) that can drop a connection mid-body or stall; the reaper kills a real orphan
made with setsid + double fork. On this GPU-less box, nvidia-smi output is fed by a stand-in script
first on PATH — the only way to exercise the GPU parsing without a GPU.
"""
import hashlib
import http.server
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, link_and_device, need, proc_state, untouched

SHELL_SCRIPTS = ["gpu_health.sh", "mem_monitor.sh", "reap_vram_zombies.sh", "setup-china-mirrors.sh"]
FETCH = NODE / "fetch_resumable.py"


def base_env(path_first=None):
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
           and not k.startswith(("HF_", "PIP_", "RGT_")) and k not in ("DATA_DIR", "CONDA_PKGS_DIRS",
                                                                       "MODELSCOPE_CACHE")}
    dirs = [d for d in env.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvidia-smi"))]
    if path_first:
        dirs.insert(0, str(path_first))
    env["PATH"] = os.pathsep.join(dirs)
    return env


def bash(script, *args, env=None, timeout=60):
    return subprocess.run(["bash", str(NODE / script), *args], capture_output=True, text=True,
                          env=env or base_env(), timeout=timeout)


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_shellcheck_clean(name):
    sc = need("shellcheck")
    proc = subprocess.run([sc, "-x", str(NODE / name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", ["gpu_health.sh", "mem_monitor.sh", "reap_vram_zombies.sh"])
def test_shell_help_and_usage_errors(name):
    proc = bash(name, "--help")
    assert proc.returncode == 0 and "Exit codes" in proc.stdout
    proc = bash(name, "--no-such-flag")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- gpu_health.sh

FAKE_SMI = """
import json, os, sys
spec = json.load(open(os.environ["FAKE_SMI_SPEC"]))
args = sys.argv[1:]
if args and args[0] == "-L":
    if spec.get("broken"):
        print("Failed to initialize NVML: Driver/library version mismatch")
        sys.exit(18)
    for i, g in enumerate(spec["gpus"]):
        print("GPU %d: %s (UUID: GPU-%d)" % (i, g["name"], i))
    sys.exit(0)
for a in args:
    if a.startswith("--query-gpu="):
        fields = a.split("=", 1)[1].split(",")
        for f in fields:
            if f != "index" and f not in spec["gpus"][0]:
                print('Field "%s" is not a valid field to query.' % f, file=sys.stderr)
                sys.exit(2)
        for i, g in enumerate(spec["gpus"]):
            print(", ".join(str(i) if f == "index" else str(g[f]) for f in fields))
        sys.exit(0)
    if a.startswith("--query-compute-apps="):
        for app in spec.get("apps", []):
            print(app)
        sys.exit(0)
sys.exit(0)
"""

HEALTHY = {"name": "NVIDIA H100 80GB HBM3", "memory.used": 2, "memory.total": 81559, "temperature.gpu": 34,
           "persistence_mode": "Enabled", "ecc.errors.uncorrected.volatile.total": 0,
           "retired_pages.pending": "[N/A]", "clocks_throttle_reasons.active": "0x0000000000000001"}


def fake_smi(tmp_path, spec):
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "nvidia-smi").write_text("#!%s\n%s" % (sys.executable, FAKE_SMI))
    (folder / "nvidia-smi").chmod(0o755)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = base_env(folder)
    env["FAKE_SMI_SPEC"] = str(tmp_path / "spec.json")
    return env


def test_gpu_health_without_gpu():
    proc = bash("gpu_health.sh")
    assert proc.returncode == 0
    assert proc.stdout.strip().splitlines()[-1].startswith("RESULT: NO_GPU")
    proc = bash("gpu_health.sh", "--require-gpu")
    assert proc.returncode == 1 and "RESULT: NO_GPU" in proc.stdout


def test_gpu_health_healthy_gpus(tmp_path):
    # older field name only: the script must fall back from clocks_event_reasons to clocks_throttle_reasons
    env = fake_smi(tmp_path, {"gpus": [HEALTHY, dict(HEALTHY, **{"temperature.gpu": 85})]})
    proc = bash("gpu_health.sh", env=env)
    assert proc.returncode == 0, proc.stdout
    words = {line.split()[0] for line in proc.stdout.splitlines()}
    assert words <= {"OK", "WARN", "FAIL", "RESULT:"}
    assert "FAIL" not in words
    assert "gpu1 temperature 85 C >= 83 C" in proc.stdout
    assert "OK   gpu0 no thermal or power-brake slowdown" in proc.stdout
    proc = bash("gpu_health.sh", "--gpu", "0", env=env)
    assert "gpu1" not in proc.stdout
    proc = bash("gpu_health.sh", "--gpu", "7", env=env)
    assert proc.returncode == 2


def test_gpu_health_fails_on_ecc_and_hw_slowdown(tmp_path):
    bad = dict(HEALTHY, **{"ecc.errors.uncorrected.volatile.total": 3,
                           "clocks_throttle_reasons.active": "0x0000000000000040"})
    env = fake_smi(tmp_path, {"gpus": [HEALTHY, bad], "apps": ["4242, python, 1000"]})
    proc = bash("gpu_health.sh", env=env)
    assert proc.returncode == 1
    assert "FAIL gpu1 3 uncorrected ECC errors" in proc.stdout
    assert "FAIL gpu1 clocks held down by hardware: HW_thermal" in proc.stdout
    assert "WARN 1 compute process(es) already hold GPU memory" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("RESULT: FAIL")


def test_gpu_health_broken_driver(tmp_path):
    env = fake_smi(tmp_path, {"gpus": [HEALTHY], "broken": True})
    proc = bash("gpu_health.sh", env=env)
    assert proc.returncode == 1
    assert "FAIL nvidia-smi cannot reach the driver: Failed to initialize NVML" in proc.stdout


# --------------------------------------------------------------------------- mem_monitor.sh

def test_mem_monitor_real_samples(tmp_path):
    out = tmp_path / "mem.csv"
    proc = bash("mem_monitor.sh", "--interval", "0.2", "--count", "3", "--out", str(out))
    assert proc.returncode in (0, 1), proc.stderr  # 1 only if this box is really near its limit
    rows = out.read_text().splitlines()
    assert len(rows) == 4
    header = rows[0].split(",")
    assert header[:3] == ["time", "host_total_mib", "host_available_mib"] and len(header) == 12
    for row in rows[1:]:
        cells = row.split(",")
        assert len(cells) == 12
        assert int(cells[1]) > 0 and cells[0].endswith("Z")
    # appending to an existing CSV does not repeat the header
    bash("mem_monitor.sh", "--interval", "0.1", "--count", "1", "--out", str(out))
    assert out.read_text().count("time,") == 1


def test_mem_monitor_reads_another_process_cgroup(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = bash("mem_monitor.sh", "--pid", str(sleeper.pid), "--interval", "0.1", "--count", "1")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode in (0, 1)
    assert "mem_monitor: cgroup v" in proc.stderr
    assert len(proc.stdout.splitlines()) == 2


def test_mem_monitor_warns_near_cgroup_limit(tmp_path):
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text("1073741824\n")          # 1 GiB
    (cg / "memory.current").write_text("1050000000\n")
    (cg / "memory.stat").write_text("anon 1000000000\ninactive_file 20000000\n")
    (cg / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 2\n")
    out = tmp_path / "m.csv"
    proc = bash("mem_monitor.sh", "--cgroup-dir", str(cg), "--interval", "0.1", "--count", "2", "--out", str(out))
    assert proc.returncode == 1
    assert "cgroup memory at 95.9% of its limit" in proc.stderr
    assert "exit 137" in proc.stderr and "2 OOM kill(s)" in proc.stderr
    assert proc.stderr.count("WARN") == 2  # warned once on crossing, not on every sample
    row = out.read_text().splitlines()[1].split(",")
    assert row[3:8] == ["1001", "982", "1024", "95.9", "2"]
    # below the threshold: quiet and exit 0
    (cg / "memory.current").write_text("200000000\n")
    (cg / "memory.events").write_text("oom_kill 0\n")
    proc = bash("mem_monitor.sh", "--cgroup-dir", str(cg), "--interval", "0.1", "--count", "1", "--out", str(out))
    assert proc.returncode == 0 and "WARN" not in proc.stderr


def test_mem_monitor_usage_errors(tmp_path):
    for args in (["--interval", "0"], ["--interval", "x"], ["--count", "-1"], ["--pid", "999999999"],
                 ["--out", str(tmp_path / "no" / "such" / "f.csv")], ["--cgroup-dir", str(tmp_path / "none")]):
        proc = bash("mem_monitor.sh", *args)
        assert proc.returncode == 2, args


# --------------------------------------------------------------------------- reap_vram_zombies.sh

ORPHAN_MAKER = """
import os, signal, sys
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execvp("sleep", ["sleep", "300"])
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(os.read(r, 64).decode())
"""


def is_alive(pid):
    return proc_state(pid) not in (None, "Z")


@pytest.fixture
def orphan_and_owned():
    maker = subprocess.run([sys.executable, "-c", ORPHAN_MAKER], capture_output=True, text=True, timeout=30)
    orphan = int(maker.stdout.strip())
    owned = subprocess.Popen(["sleep", "300"])
    yield orphan, owned.pid
    for pid in (orphan, owned.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    owned.wait(timeout=10)


def reaper_args(orphan):
    """If this test runs under a child subreaper (some CI runners), name it so the orphan's adopter counts."""
    with open("/proc/%d/stat" % orphan) as fh:
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    if ppid == 1:
        return []
    with open("/proc/%d/comm" % ppid) as fh:
        return ["--reaper", fh.read().strip()]


def test_reaper_lists_without_killing(tmp_path, orphan_and_owned):
    orphan, owned = orphan_and_owned
    pids = tmp_path / "pids.txt"
    pids.write_text("# pid, used_memory\n%d, 1200\n%d\n1\n%d\n" % (orphan, owned, os.getpid()))
    proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--min-age", "0", *reaper_args(orphan))
    assert proc.returncode == 0, proc.stderr
    lines = {int(l.split()[1]): l for l in proc.stdout.splitlines() if not l.startswith("RESULT")}
    assert lines[orphan].startswith("ORPHAN") and "session leader" in lines[orphan]
    assert lines[owned].startswith("OWNED") and "parent %d" % os.getpid() in lines[owned]
    assert lines[1].startswith("OWNED") and "PID 1" in lines[1]
    assert lines[os.getpid()].startswith("OWNED")
    assert "dry run, nothing signalled" in proc.stdout
    assert untouched(orphan) and untouched(owned)     # the reaper has returned: a signal it sent would show
    # with the default --min-age (120 s) a fresh orphan is only YOUNG, never a kill candidate
    proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--kill")
    assert proc.returncode == 0
    assert any(l.startswith("YOUNG") for l in proc.stdout.splitlines())
    assert is_alive(orphan)


def test_reaper_kills_only_the_orphan(tmp_path, orphan_and_owned):
    orphan, owned = orphan_and_owned
    pids = tmp_path / "pids.txt"
    pids.write_text("%d\n%d\n" % (owned, orphan))
    proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--min-age", "0", "--kill", "--grace", "3",
                *reaper_args(orphan))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KILLED %d with SIGTERM" % orphan in proc.stdout
    deadline = time.monotonic() + 5
    while is_alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_alive(orphan)
    assert is_alive(owned)


def test_reaper_respects_nohup_and_own_session(tmp_path):
    """A nohup'd job (SIGHUP ignored) and a detached session leader are deliberate detaches: never killed."""
    def make(code):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
        return int(out.stdout.strip())
    nohup_pid = make(ORPHAN_MAKER.replace("signal.SIG_DFL", "signal.SIG_IGN"))
    leader_pid = make(ORPHAN_MAKER.replace("signal.signal(signal.SIGHUP, signal.SIG_DFL)",
                                           "signal.signal(signal.SIGHUP, signal.SIG_DFL); os.setsid()"))
    try:
        pids = tmp_path / "pids.txt"
        pids.write_text("%d\n%d\n" % (nohup_pid, leader_pid))
        proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--min-age", "0", "--kill",
                    *reaper_args(nohup_pid))
        lines = {int(l.split()[1]): l for l in proc.stdout.splitlines() if l.startswith("OWNED")}
        assert "ignores SIGHUP" in lines[nohup_pid], proc.stdout
        assert "own session leader" in lines[leader_pid], proc.stdout
        assert "RESULT: 0 of 0 orphan(s) stopped" in proc.stdout
        assert untouched(nohup_pid) and untouched(leader_pid)
    finally:
        for pid in (nohup_pid, leader_pid):
            os.kill(pid, signal.SIGKILL)


def test_reaper_no_gpu_and_bad_input(tmp_path):
    proc = bash("reap_vram_zombies.sh")
    if not os.path.exists("/dev/nvidia0"):
        assert proc.returncode == 0 and "RESULT: NO_GPU" in proc.stdout
    bad = tmp_path / "bad.txt"
    bad.write_text("12ab\n")
    assert bash("reap_vram_zombies.sh", "--pids-from", str(bad)).returncode == 2
    assert bash("reap_vram_zombies.sh", "--pids-from", str(tmp_path / "missing")).returncode == 2
    assert bash("reap_vram_zombies.sh", "--grace", "x").returncode == 2


# --------------------------------------------------------------------------- setup-china-mirrors.sh

MIRRORS = NODE / "setup-china-mirrors.sh"
DUMP = "env -0 | sort -z | grep -zv '^_=' | tr '\\0' '\\n'"


def source_twice(env):
    script = ". '{m}' --quiet; {d} > \"$OUT1\"; . '{m}' --quiet; {d} > \"$OUT2\"".format(m=MIRRORS, d=DUMP)
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    first = open(env["OUT1"]).read().splitlines()
    second = open(env["OUT2"]).read().splitlines()
    return dict(l.split("=", 1) for l in first if "=" in l), first, second


def test_mirrors_idempotent_without_proxy(tmp_path):
    env = base_env()
    env.update(OUT1=str(tmp_path / "e1"), OUT2=str(tmp_path / "e2"), DATA_DIR=str(tmp_path / "data"))
    got, first, second = source_twice(env)
    assert first == second, "second source changed the environment"
    assert got["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert got["HF_HUB_DISABLE_XET"] == "1"
    assert got["HF_HOME"] == str(tmp_path / "data" / "hf")
    assert got["PIP_CACHE_DIR"].startswith(str(tmp_path / "data"))
    assert got["PIP_INDEX_URL"].startswith("https://pypi.tuna.tsinghua.edu.cn/")
    assert "no_proxy" not in got and "NO_PROXY" not in got
    assert (tmp_path / "data" / "hf").is_dir()


def test_mirrors_keeps_user_values_and_fixes_no_proxy_with_proxy(tmp_path):
    env = base_env()
    env.update(OUT1=str(tmp_path / "e1"), OUT2=str(tmp_path / "e2"),
               https_proxy="http://alice:s3cr3t-pass@203.0.113.10:3128", no_proxy="corp.internal",
               HF_ENDPOINT="https://hf.example.internal", PIP_INDEX_URL="https://bob:tok3n@pypi.example/simple")
    got, first, second = source_twice(env)
    assert first == second
    assert got["HF_ENDPOINT"] == "https://hf.example.internal"
    entries = got["no_proxy"].split(",")
    assert entries[0] == "corp.internal"
    assert {"localhost", "127.0.0.1", "hf.example.internal", "pypi.example"} <= set(entries)
    assert len(entries) == len(set(entries))
    assert got["NO_PROXY"] == got["no_proxy"]
    # the chatty (non-quiet) run never shows the proxy value or passwords
    proc = subprocess.run(["bash", "-c", ". '%s'" % MIRRORS], capture_output=True, text=True, env=env)
    assert "s3cr3t" not in proc.stdout + proc.stderr and "tok3n" not in proc.stdout + proc.stderr
    assert "***@pypi.example" in proc.stderr


def test_mirrors_refuses_to_run_without_check():
    proc = subprocess.run(["bash", str(MIRRORS)], capture_output=True, text=True, env=base_env())
    assert proc.returncode == 2 and "source" in proc.stderr
    proc = subprocess.run(["bash", str(MIRRORS), "--help"], capture_output=True, text=True, env=base_env())
    assert proc.returncode == 0 and "Exit codes (return codes when sourced)" in proc.stdout


def test_mirrors_safe_in_a_strict_caller_shell():
    """Sourcing must not trip set -euo pipefail, leak helpers, or swallow the caller's own arguments."""
    script = ("set -euo pipefail; . '%s' --quiet; . '%s' --quiet; "
              "declare -F | grep -c _rgt_ || true; echo \"args=$*\"; echo \"hf=$HF_ENDPOINT\"") % (MIRRORS, MIRRORS)
    proc = subprocess.run(["bash", "-c", script, "caller", "--job-flag"], capture_output=True, text=True,
                          env=base_env(), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "args=--job-flag", "hf=https://hf-mirror.com"]


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_mirrors_check_reachability(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    try:
        env = base_env()
        env.update(HF_ENDPOINT="http://127.0.0.1:%d" % server.server_address[1],
                   PIP_INDEX_URL="http://127.0.0.1:%d/simple" % dead_port, RGT_CHECK_TIMEOUT="3")
        proc = subprocess.run(["bash", str(MIRRORS), "--check", "--quiet"], capture_output=True, text=True,
                              env=env, timeout=30)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "OK   http://127.0.0.1:%d answered" % server.server_address[1] in proc.stdout
        assert "FAIL http://127.0.0.1:%d/simple" % dead_port in proc.stdout
        env["PIP_INDEX_URL"] = env["HF_ENDPOINT"] + "/simple"
        proc = subprocess.run(["bash", str(MIRRORS), "--check", "--quiet"], capture_output=True, text=True,
                              env=env, timeout=30)
        assert proc.returncode == 0, proc.stdout
        # sourced with --check: returns the status instead of exiting the caller's shell
        proc = subprocess.run(["bash", "-c", ". '%s' --check --quiet; echo \"rc=$?\"" % MIRRORS],
                              capture_output=True, text=True, env=env, timeout=30)
        assert "rc=0" in proc.stdout
    finally:
        server.shutdown()


# --------------------------------------------------------------------------- fetch_resumable.py

class FileServer:
    """Serves one blob with Range support. Modes: normal, drop_once (half, then close), drop_always (the
    first drop_after bytes of every answer, then close), stall, 404."""

    def __init__(self, data, mode="normal", stall_after=4096, honor_range=True, drop_after=100000):
        self.data, self.mode, self.stall_after, self.honor_range = data, mode, stall_after, honor_range
        self.drop_after = drop_after
        self.ranges = []
        self.auth = []
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.ranges.append(rng)
                outer.auth.append(self.headers.get("Authorization"))
                if outer.mode == "404":
                    self.send_error(404)
                    return
                partial = bool(rng) and outer.honor_range
                start = int(rng[len("bytes="):].split("-")[0]) if partial else 0
                body = outer.data[start:]
                self.send_response(206 if partial else 200)
                if partial:
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(outer.data) - 1,
                                                                          len(outer.data)))
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", '"blob-v1"')
                self.end_headers()
                first = len(outer.ranges) == 1
                if outer.mode == "drop_once" and first:
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if outer.mode == "drop_always":
                    self.wfile.write(body[:outer.drop_after])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if outer.mode == "stall":
                    self.wfile.write(body[:outer.stall_after])
                    self.wfile.flush()
                    outer.release.wait(30)
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d/model.bin" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def blob():
    return os.urandom(3 * 1024 * 1024 + 123)


@pytest.fixture
def servers():
    made = []

    def make(data, **kw):
        srv = FileServer(data, **kw)
        made.append(srv)
        return srv
    yield make
    for srv in made:
        srv.close()


def fetch(*args, timeout=60):
    proc = subprocess.run([sys.executable, str(FETCH), *args, "--json", "--backoff", "0.1"],
                          capture_output=True, text=True, env=base_env(), timeout=timeout)
    result = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc, result


def test_fetch_resumes_after_dropped_connection(tmp_path, blob, servers):
    srv = servers(blob, mode="drop_once")
    out = tmp_path / "dl" / "model.bin"
    proc, res = fetch(srv.url, "--out", str(out), "--sha256", hashlib.sha256(blob).hexdigest())
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == blob
    half = len(blob) // 2
    assert srv.ranges == [None, "bytes=%d-" % half], "second request must resume where the drop left off"
    assert [a["outcome"] for a in res["attempts"]] == ["dropped", "complete"]
    assert res["verified"] is True and res["sha256"] == hashlib.sha256(blob).hexdigest()
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.bin"], "leftover .part/.json"


def test_fetch_server_ignoring_range_restarts_cleanly(tmp_path, blob, servers):
    srv = servers(blob, mode="drop_once", honor_range=False)
    out = tmp_path / "model.bin"
    proc, res = fetch(srv.url, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert len(srv.ranges) == 2 and srv.ranges[1] is not None  # asked to resume, got the whole file
    assert "ignored the Range request" in proc.stderr
    assert out.read_bytes() == blob


def test_fetch_resumes_existing_part_file(tmp_path, blob, servers):
    srv = servers(blob)
    out = tmp_path / "model.bin"
    (tmp_path / "model.bin.part").write_bytes(blob[:1000000])
    proc, res = fetch(srv.url, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert srv.ranges == ["bytes=1000000-"]
    assert res["resumed_from"] == 1000000
    assert out.read_bytes() == blob


def test_fetch_stall_falls_back_to_mirror(tmp_path, blob, servers):
    slow = servers(blob, mode="stall", stall_after=200000)
    mirror = servers(blob)
    out = tmp_path / "model.bin"
    start = time.monotonic()
    proc, res = fetch(slow.url, "--fallback", mirror.url, "--out", str(out), "--stall-seconds", "1",
                      "--retries", "1", "--sha256", hashlib.sha256(blob).hexdigest())
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 20
    assert out.read_bytes() == blob
    assert [a["outcome"] for a in res["attempts"]] == ["stalled", "complete"]
    got = res["attempts"][0]["received"]
    assert 0 < got <= 200000
    assert mirror.ranges == ["bytes=%d-" % got], "the mirror must continue the stalled .part, not restart"
    assert "falling back" in proc.stderr


def test_fetch_404_moves_on_without_retrying(tmp_path, blob, servers):
    gone = servers(blob, mode="404")
    mirror = servers(blob)
    out = tmp_path / "model.bin"
    proc, res = fetch(gone.url, "--fallback", mirror.url, "--out", str(out), "--retries", "5")
    assert proc.returncode == 0
    assert len(gone.ranges) == 1
    assert out.read_bytes() == blob


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path, blob, servers):
    srv = servers(blob)
    out = tmp_path / "model.bin"
    proc, res = fetch(srv.url, "--out", str(out), "--sha256", "0" * 64)
    assert proc.returncode == 1
    assert res["status"] == "checksum_mismatch" and res["ok"] is False
    assert list(tmp_path.iterdir()) == [], "no final file and no partial file after a mismatch"
    assert "expected 000" in proc.stderr


def test_fetch_all_sources_down_keeps_part_for_resume(tmp_path, blob, servers):
    slow = servers(blob, mode="stall", stall_after=50000)
    out = tmp_path / "model.bin"
    proc, res = fetch(slow.url, "--out", str(out), "--stall-seconds", "0.5", "--retries", "2")
    assert proc.returncode == 1
    assert res["status"] == "failed" and "re-run the same command to resume" in res["error"]
    part = tmp_path / "model.bin.part"
    assert part.exists() and 0 < part.stat().st_size <= 100000 and not out.exists()
    # second run against a healthy server finishes from the kept bytes
    good = servers(blob)
    kept = part.stat().st_size
    proc, res = fetch(good.url, "--out", str(out))
    assert proc.returncode == 0 and out.read_bytes() == blob
    assert good.ranges == ["bytes=%d-" % kept]


def test_fetch_existing_file_and_bad_input(tmp_path, blob, servers):
    srv = servers(blob)
    out = tmp_path / "model.bin"
    out.write_bytes(blob)
    proc, res = fetch(srv.url, "--out", str(out), "--sha256", hashlib.sha256(blob).hexdigest())
    assert proc.returncode == 0 and res["status"] == "already_present" and srv.ranges == []
    proc, res = fetch(srv.url, "--out", str(out), "--sha256", "f" * 64)
    assert proc.returncode == 1 and "--force" in res["error"]
    for args in (["ftp://203.0.113.10/x", "--out", str(out)], [srv.url, "--out", str(out), "--sha256", "xyz"],
                 [srv.url, "--out", str(tmp_path)], [srv.url], [srv.url, "--out", str(out), "--retries", "0"],
                 [srv.url, "--out", str(out), "--auth-env", "RGT_SURELY_UNSET_VAR"]):
        proc = subprocess.run([sys.executable, str(FETCH), *args], capture_output=True, text=True, env=base_env())
        assert proc.returncode == 2, args
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_fetch_logs_hide_credentials_and_query(tmp_path, blob, servers):
    srv = servers(blob, mode="404")
    url = srv.url.replace("http://", "http://user:pa55word@") + "?token=t0ken-value"
    proc, res = fetch(url, "--out", str(tmp_path / "x.bin"))
    assert proc.returncode == 1
    text = proc.stdout + proc.stderr
    assert "pa55word" not in text and "t0ken-value" not in text


def no_secret_anywhere(secret, *texts, folder=None):
    """The secret appears in none of the texts nor in any file left in FOLDER (.part.json included)."""
    for text in texts:
        assert secret not in text, text[:2000]
    for path in (folder.rglob("*") if folder else []):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_finding_9_range_ignoring_server_that_drops_gives_up_then_falls_back(tmp_path, blob, servers):
    """The report's repro: 200 with the full Content-Length, 100 KB, close; Range ignored. Bounded attempts,
    then the --fallback source (old code: 192 requests in 20 s, fallback never tried)."""
    bad = servers(blob, mode="drop_always", honor_range=False, drop_after=100000)
    good = servers(blob)
    out = tmp_path / "out.bin"
    proc, res = fetch(bad.url + "?X-Amz-Signature=SECRETSIG", "--fallback", good.url, "--out", str(out),
                      "--retries", "2", "--backoff-max", "0.1", "--stall-seconds", "2", timeout=60)
    assert proc.returncode == 0, proc.stderr
    # attempt 1 moved the offset 0 -> 100 KB (progress); 2 and 3 restarted from 0 and got no further
    assert len(bad.ranges) == 3, bad.ranges
    tried = [a for a in res["attempts"] if a["source"].startswith(bad.url)]
    assert [a["progress"] for a in tried] == [True, False, False]
    assert "giving up on this source" in proc.stderr and "falling back" in proc.stderr
    assert good.ranges == ["bytes=100000-"] and out.read_bytes() == blob
    # no fallback: the same server ends in a clear failure, never an endless loop
    out2 = tmp_path / "only" / "out.bin"
    proc, res = fetch(bad.url, "--out", str(out2), "--retries", "2", "--backoff-max", "0.1", timeout=60)
    assert proc.returncode == 1 and res["status"] == "failed"
    assert len([a for a in res["attempts"]]) == 3


def test_finding_20_no_signed_url_on_disk(tmp_path, blob, servers):
    """A signed URL's query string never reaches FILE.part.json (kept for a resume), the JSON result or
    stderr; the same-source check keeps a SHA-256 of the URL instead."""
    slow = servers(blob, mode="stall", stall_after=50000)
    url = slow.url + "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=SECRETSIG"
    out = tmp_path / "out.bin"
    proc, res = fetch(url, "--out", str(out), "--stall-seconds", "0.5", "--retries", "1")
    assert proc.returncode == 1
    meta = json.loads((tmp_path / "out.bin.part.json").read_text())
    assert meta["source"] == slow.url + "?<redacted>"
    assert meta["source_sha256"] == hashlib.sha256(url.encode()).hexdigest()
    for secret in ("SECRETSIG", "AKIAEXAMPLE"):
        no_secret_anywhere(secret, proc.stdout, proc.stderr, folder=tmp_path)
    # the resume from the same (signed) URL still gets If-Range: the hash matched
    good = servers(blob)
    proc, res = fetch(good.url + "?X-Amz-Signature=SECRETSIG", "--out", str(out))
    assert proc.returncode == 0 and out.read_bytes() == blob
    no_secret_anywhere("SECRETSIG", proc.stdout, proc.stderr, folder=tmp_path)


def test_user_password_urls_work_and_stay_secret(tmp_path, blob, servers):
    """https://user:password@host/ is sent as HTTP Basic auth (urllib alone cannot resolve such a host)."""
    srv = servers(blob, mode="drop_once")
    url = srv.url.replace("http://", "http://alice:pa55word@")
    out = tmp_path / "out.bin"
    proc, res = fetch(url, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == blob
    assert srv.auth and all(a == "Basic YWxpY2U6cGE1NXdvcmQ=" for a in srv.auth)
    no_secret_anywhere("pa55word", proc.stdout, proc.stderr, json.dumps(res), folder=tmp_path)


def test_finding_5_fetch_never_replaces_a_symlink_or_a_device(tmp_path, blob, servers):
    srv = servers(blob)
    real = tmp_path / "real.bin"
    real.write_bytes(b"keep")
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    targets = link_and_device(tmp_path, link)
    for target in targets:
        for extra in ([], ["--force"]):
            proc = subprocess.run([sys.executable, str(FETCH), srv.url, "--out", str(target), *extra],
                                  capture_output=True, text=True, env=base_env(), timeout=60)
            assert proc.returncode == 2, (target, extra, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1 and "refusing to replace" in proc.stderr
    assert link.is_symlink() and real.read_bytes() == b"keep"
    if len(targets) > 1:
        st = os.lstat(targets[1])
        assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == 3
    # a .part that is a symlink (to a file someone cares about) is not written through either
    (tmp_path / "new.bin.part").symlink_to(real)
    proc = subprocess.run([sys.executable, str(FETCH), srv.url, "--out", str(tmp_path / "new.bin")],
                          capture_output=True, text=True, env=base_env(), timeout=60)
    assert proc.returncode == 2 and real.read_bytes() == b"keep"
    assert srv.ranges == [], "nothing was downloaded for a refused target"


# --------------------------------------------------------------------------- --json of the shell tools

def test_gpu_health_json_matches_the_lines(tmp_path):
    """Stand-in nvidia-smi (no GPU here); a GPU name with quotes and a backslash must still give valid JSON."""
    odd = dict(HEALTHY, name='NVIDIA "Odd" \\ GPU')
    bad = dict(HEALTHY, **{"ecc.errors.uncorrected.volatile.total": 3})
    env = fake_smi(tmp_path, {"gpus": [odd, bad]})
    lines = bash("gpu_health.sh", env=env)
    proc = bash("gpu_health.sh", "--json", env=env)
    assert proc.returncode == lines.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["status"] == "FAIL" and lines.stdout.strip().splitlines()[-1].startswith("RESULT: FAIL")
    assert doc["gpus"] == [0, 1] and doc["fails"] == 1
    assert [c["status"] + " " + c["message"] for c in doc["checks"]] == [
        l[:4].strip() + " " + l[5:] for l in lines.stdout.splitlines() if not l.startswith("RESULT")]
    assert any('NVIDIA "Odd" \\ GPU' in c["message"] for c in doc["checks"])
    assert json.loads(bash("gpu_health.sh", "--json").stdout)["status"] == "NO_GPU"
    broken = fake_smi(tmp_path, {"gpus": [HEALTHY], "broken": True})
    doc = json.loads(bash("gpu_health.sh", "--json", env=broken).stdout)
    assert doc["status"] == "FAIL" and "cannot reach the driver" in doc["checks"][0]["message"]


def test_gpu_health_hung_driver_is_bounded(tmp_path):
    """A stand-in nvidia-smi that never answers: --timeout holds, the result is FAIL, not a hang."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 300\n")
    (folder / "nvidia-smi").chmod(0o755)
    start = time.monotonic()
    proc = bash("gpu_health.sh", "--timeout", "1", "--json", env=base_env(folder), timeout=60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 1 and json.loads(proc.stdout)["status"] == "FAIL"


def test_reaper_json(tmp_path, orphan_and_owned):
    orphan, owned = orphan_and_owned
    pids = tmp_path / "pids.txt"
    pids.write_text("%d, 1200\n%d\n" % (orphan, owned))
    proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--min-age", "0", "--json", *reaper_args(orphan))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "OK" and doc["kill"] is False and doc["orphans"] == 1 and doc["actions"] == []
    by_pid = {p["pid"]: p for p in doc["processes"]}
    assert by_pid[orphan]["class"] == "ORPHAN" and by_pid[orphan]["source"] == "file"
    assert by_pid[owned]["class"] == "OWNED" and by_pid[owned]["mem_mib"] is None
    assert is_alive(orphan), "listing never kills"
    proc = bash("reap_vram_zombies.sh", "--pids-from", str(pids), "--min-age", "0", "--kill", "--grace", "3",
                "--json", *reaper_args(orphan))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["killed"] == 1
    assert doc["actions"] == [{"action": "KILLED", "pid": orphan, "detail": "with SIGTERM"}]
    assert json.loads(bash("reap_vram_zombies.sh", "--json").stdout)["status"] in ("NO_GPU", "OK")


def test_mem_monitor_json_lines(tmp_path):
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text("1073741824\n")
    (cg / "memory.current").write_text("1050000000\n")
    (cg / "memory.stat").write_text("anon 1000000000\ninactive_file 20000000\n")
    (cg / "memory.events").write_text("oom_kill 0\n")
    proc = bash("mem_monitor.sh", "--cgroup-dir", str(cg), "--interval", "0.1", "--count", "2", "--json")
    assert proc.returncode == 1
    rows = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(rows) == 2 and all(r["status"] == "WARN" for r in rows)
    assert rows[0]["cg_limit_mib"] == 1024 and rows[0]["cg_pct"] == 95.9 and rows[0]["gpu_mem_used_mib"] is None
    assert rows[0]["time"].endswith("Z")
    out = tmp_path / "m.csv"
    bash("mem_monitor.sh", "--interval", "0.1", "--count", "1", "--out", str(out))
    proc = bash("mem_monitor.sh", "--interval", "0.1", "--count", "1", "--out", str(out), "--json")
    assert proc.returncode == 2 and "already holds CSV" in proc.stderr


def test_mirrors_check_json(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = base_env()
        url = "http://127.0.0.1:%d" % server.server_address[1]
        env.update(HF_ENDPOINT=url, PIP_INDEX_URL="http://bob:tok3n@127.0.0.1:%d/simple" % server.server_address[1],
                   RGT_CHECK_TIMEOUT="3")
        proc = subprocess.run(["bash", str(MIRRORS), "--check", "--quiet", "--json"], capture_output=True,
                              text=True, env=env, timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["status"] == "OK" and [e["ok"] for e in doc["endpoints"]] == [True, True]
        assert doc["endpoints"][0] == {"url": url, "ok": True, "http_status": 200}
        assert "tok3n" not in proc.stdout
    finally:
        server.shutdown()


# --------------------------------------------------------------------------- every option in the header

SHELL_OPTIONS = ["gpu_health.sh", "mem_monitor.sh", "reap_vram_zombies.sh", "setup-china-mirrors.sh",
                 "run_queue.sh"]


def header_and_code(name):
    lines = (NODE / name).read_text().splitlines()
    head = []
    for line in lines[1:]:
        if not line.startswith("#"):
            break
        head.append(line)
    return "\n".join(head), "\n".join(lines[len(head) + 1:])


@pytest.mark.parametrize("name", SHELL_OPTIONS)
def test_every_shell_option_is_in_the_header_and_back(name):
    import re
    head, code = header_and_code(name)
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", head))
    accepted = set(re.findall(r"^\s*(?:[-\w|]+\s*\|\s*)?(--[a-z][a-z0-9-]+)(?:=\*)?\s*(?:\|[^)]*)?\)", code, re.M))
    assert accepted, "no option parsing found"
    assert accepted - named == set(), "accepted but not in the header"
    assert named - accepted == set(), "in the header but not accepted"
