"""Behaviour tests for scripts/node/node_probe.py (phase-0 node audit and gate).

They run the real script in a subprocess on this machine. This box has no NVIDIA GPU, so the
GPU-less path is exercised for real; GPU parsing is exercised with a stand-in `nvidia-smi` put
first on PATH (the only way to feed a GPU listing on a GPU-less box).
"""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, need_root, tiny_tmpfs

PROBE = NODE / "node_probe.py"


def clean_path(extra_first=None):
    """PATH without any directory holding a real nvidia-smi (so results do not depend on the box)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "nvidia-smi"))]
    if extra_first:
        dirs.insert(0, str(extra_first))
    return os.pathsep.join(dirs)


def run_probe(*args, env_extra=None, path_first=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("DATA_DIR", "DURABLE_DIR", "RGT_PROFILE_INDEX")}
    env["PATH"] = clean_path(path_first)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def probe_json(*args, **kw):
    proc = run_probe("--json", *args, **kw)
    assert proc.returncode in (0, 3), proc.stderr
    return proc, json.loads(proc.stdout)


def assert_nulls_explained(sec, where):
    """Every null field of a section must carry a reason in its 'unavailable' map."""
    assert isinstance(sec.get("unavailable"), dict), where
    for key, value in sec.items():
        if value is None:
            assert sec["unavailable"].get(key), "%s.%s is null without a reason" % (where, key)


def write_fake_smi(folder, body):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvidia-smi"
    path.write_text("#!%s\n%s" % (sys.executable, textwrap.dedent(body)))
    path.chmod(0o755)
    return folder


FAKE_TWO_GPUS = """
    import sys
    args = sys.argv[1:]
    if not args:
        print("| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |")
        sys.exit(0)
    if args[0].startswith("--query-gpu="):
        print("0, NVIDIA A100-SXM4-80GB, 81920, 1024, 37, 550.54.15")
        print("1, NVIDIA A100-SXM4-80GB, 81920, [N/A], 0, 550.54.15")
        sys.exit(0)
    sys.exit(9)
"""


def test_json_on_gpu_less_box(tmp_path):
    data, durable = tmp_path / "data", tmp_path / "durable"
    data.mkdir()
    proc, rep = probe_json("--data-dir", str(data), "--durable-dir", str(durable))
    assert proc.returncode == 0
    assert rep["schema"] == "rgt-node-probe/1"
    gpus = rep["gpus"]
    assert gpus["count"] is None and gpus["devices"] is None
    assert "nvidia-smi" in gpus["unavailable"]["count"]
    for name in ("gpus", "torch", "cgroup", "memory", "tools"):
        assert_nulls_explained(rep[name], name)
    # disks: bytes AND inodes (or an explicit reason for inodes), one entry per mount
    assert rep["disks"], "no disks measured"
    for mount in rep["disks"]:
        assert_nulls_explained(mount, "disk %s" % mount["mount_point"])
        assert isinstance(mount["total_bytes"], int) and mount["total_bytes"] > 0
        assert isinstance(mount["free_bytes"], int)
        assert isinstance(mount["total_inodes"], int) or mount["unavailable"].get("total_inodes")
        assert mount["paths"], "mount listed without the paths that live on it"
    for role in ("data", "durable", "root", "shm", "home"):
        entry = rep["disk_paths"][role]
        assert_nulls_explained(entry, "disk_paths.%s" % role)
        assert isinstance(entry["free_bytes"], int), role
        assert isinstance(entry["free_inodes"], int) or entry["inodes_dynamic"], role
    assert rep["disk_paths"]["data"]["source"] == "flag"
    # a dir that does not exist yet is measured on its nearest existing parent
    assert rep["disk_paths"]["durable"]["exists"] is False
    assert rep["disk_paths"]["durable"]["measured_at"] == str(tmp_path)
    cg = rep["cgroup"]
    for field in ("memory_limit_bytes", "cpu_quota_cores", "memory_usage_bytes"):
        assert cg[field] is not None or cg["unavailable"].get(field)
    assert rep["memory"]["total_bytes"] > 0
    assert rep["memory"]["effective_limit_bytes"] <= rep["memory"]["total_bytes"]
    assert rep["tools"]["python"]["version"].count(".") == 2
    assert rep["network"]["checked"] is False
    assert rep["gate"] == {"checked": [], "passed": True, "reasons": []}


def test_paths_on_one_mount_are_deduplicated(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, rep = probe_json("--data-dir", str(tmp_path / "a"), "--durable-dir", str(tmp_path / "b"))
    dev_of = {}
    for mount in rep["disks"]:
        for p in mount["paths"]:
            dev_of[p["role"]] = mount["mount_point"]
    assert dev_of["data"] == dev_of["durable"]
    assert len({m["mount_point"] for m in rep["disks"]}) == len(rep["disks"])


def test_gate_lists_every_unmet_reason(tmp_path):
    proc = run_probe("--json", "--data-dir", str(tmp_path), "--min-free-gb", "100000000",
                     "--min-free-inodes", str(10 ** 15), "--min-mem-gb", "1000000",
                     "--min-shm-gb", "1000000", "--require-gpu")
    assert proc.returncode == 3, proc.stderr
    rep = json.loads(proc.stdout)
    reasons = rep["gate"]["reasons"]
    assert rep["gate"]["passed"] is False
    for needle in ("--min-free-gb", "--min-free-inodes", "--min-mem-gb", "--min-shm-gb", "--require-gpu"):
        assert sum(needle in r for r in reasons) == 1, (needle, reasons)
    refused = [l for l in proc.stderr.splitlines() if l.startswith("REFUSED: ")]
    assert [l[len("REFUSED: "):] for l in refused] == reasons


def test_gate_free_space_and_inodes_both_reported(tmp_path):
    proc = run_probe("--data-dir", str(tmp_path), "--durable-dir", str(tmp_path),
                     "--min-free-gb", "1e9", "--min-free-inodes", str(10 ** 15))
    assert proc.returncode == 3
    lines = [l for l in proc.stderr.splitlines() if l.startswith("REFUSED")]
    # two gates x two roles (data and durable are both checked, even on one mount)
    assert len(lines) == 4, proc.stderr
    assert any("inodes" in l and "data dir" in l for l in lines)
    assert any("GiB free" in l and "durable dir" in l for l in lines)
    assert "FAIL gate:" in proc.stdout


def test_gate_passes_when_satisfiable(tmp_path):
    proc = run_probe("--data-dir", str(tmp_path), "--min-free-gb", "0.001", "--min-free-inodes", "1",
                     "--min-mem-gb", "0.01", "--min-shm-gb", "0.0001")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK   gate: passed" in proc.stdout
    assert "REFUSED" not in proc.stderr


def test_env_data_dir_is_used_for_the_gate(tmp_path):
    proc = run_probe("--json", "--min-free-gb", "1e9", env_extra={"DATA_DIR": str(tmp_path)})
    assert proc.returncode == 3
    rep = json.loads(proc.stdout)
    assert rep["disk_paths"]["data"]["source"] == "env"
    assert str(tmp_path) in rep["gate"]["reasons"][0]


@pytest.mark.parametrize("args", [
    ["--min-free-gb", "abc"],
    ["--min-free-gb", "-1"],
    ["--min-free-inodes", "1.5"],
    ["--network-target", "a:b:c"],
    ["--network-target", "host:99999"],
    ["--bogus"],
    ["--min-free-gb", "5"],          # no directory to gate
    ["--out", "/nonexistent-dir-rgt/probe.json"],
    ["--profile", "nosuch"],         # index missing
])
def test_bad_input_is_exit_2_one_line(args, tmp_path):
    proc = run_probe(*args, env_extra={"RGT_PROFILE_INDEX": str(tmp_path / "missing.json")})
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("node_probe.py: error:"), proc.stderr  # the toolkit's prefix
    assert "Traceback" not in proc.stderr


def test_profile_defaults_and_lookup(tmp_path):
    index = tmp_path / "index.json"
    data, durable = tmp_path / "pd", tmp_path / "pu"
    data.mkdir()
    durable.mkdir()
    index.write_text(json.dumps({"generated_by": "test", "schema_version": 1, "profiles": {
        "demo": {"platform": "demo", "defaults": {"DATA_DIR": str(data), "DURABLE_DIR": str(durable),
                                                  "DISK_FLOOR_GB": 10}}}}))
    env = {"RGT_PROFILE_INDEX": str(index)}
    _, rep = probe_json("--profile", "demo", env_extra=env)
    assert rep["disk_paths"]["data"]["path"] == str(data)
    assert rep["disk_paths"]["durable"]["source"] == "profile"
    assert rep["profile_defaults"]["DISK_FLOOR_GB"] == 10
    _, rep = probe_json("--profile", "demo", "--data-dir", str(tmp_path), env_extra=env)
    assert rep["disk_paths"]["data"]["path"] == str(tmp_path)
    assert rep["disk_paths"]["data"]["source"] == "flag"
    proc = run_probe("--profile", "other", env_extra=env)
    assert proc.returncode == 2
    assert "profile 'other' is not in" in proc.stderr and "known: demo" in proc.stderr
    index.write_text("{not json")
    proc = run_probe("--profile", "demo", env_extra=env)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_profile_index_next_to_a_pushed_toolkit(tmp_path):
    """On a node the toolkit folder travels as one unit, with profiles/index.json copied beside the core."""
    node = tmp_path / "rgt-bin"
    shutil.copytree(NODE, node, ignore=shutil.ignore_patterns("__pycache__"))
    (node / "index.json").write_text(json.dumps({"profiles": {"local": {"defaults": {
        "DATA_DIR": str(tmp_path), "DURABLE_DIR": None}}}}))
    env = {k: v for k, v in os.environ.items() if k != "RGT_PROFILE_INDEX"}
    proc = subprocess.run([sys.executable, str(node / "node_probe.py"), "--json", "--profile", "local"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["disk_paths"]["data"]["path"] == str(tmp_path)


def test_runtime_is_bounded_on_a_loaded_box(tmp_path):
    """A hang guard, not a latency figure (tools/bench_latency.py measures those): every external command the
    probe starts is bounded, so even a loaded 2-core box finishes far inside this limit."""
    start = time.monotonic()
    proc = run_probe("--json", "--data-dir", str(tmp_path))
    elapsed = time.monotonic() - start
    assert proc.returncode == 0
    assert elapsed < 45.0, "probe took %.2fs" % elapsed


def test_out_is_written_atomically(tmp_path):
    out = tmp_path / "probe.json"
    proc = run_probe("--out", str(out), "--data-dir", str(tmp_path))
    assert proc.returncode == 0
    assert json.loads(out.read_text())["schema"] == "rgt-node-probe/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probe.json"], "temp file left behind"
    # human summary on stdout: every line starts with a fixed status word
    for line in proc.stdout.splitlines():
        assert line.split()[0] in ("OK", "WARN", "FAIL"), line


def test_gpu_listing_parsed_from_nvidia_smi(tmp_path):
    fake = write_fake_smi(tmp_path / "bin", FAKE_TWO_GPUS)
    _, rep = probe_json("--require-gpu", path_first=fake)
    gpus = rep["gpus"]
    assert gpus["count"] == 2
    assert gpus["cuda_version"] == "12.4" and gpus["driver_version"] == "550.54.15"
    first, second = gpus["devices"]
    assert first == {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920,
                     "memory_used_mib": 1024, "utilization_pct": 37, "driver_version": "550.54.15"}
    assert second["memory_used_mib"] is None  # "[N/A]" becomes null, not a crash
    assert rep["gate"]["passed"] is True


def test_hung_nvidia_smi_times_out(tmp_path):
    fake = write_fake_smi(tmp_path / "bin", "import time\ntime.sleep(30)\n")
    start = time.monotonic()
    proc, rep = probe_json("--gpu-timeout", "1", "--require-gpu", path_first=fake)
    assert time.monotonic() - start < 10
    assert proc.returncode == 3
    assert "did not answer" in rep["gpus"]["unavailable"]["count"]
    assert any("--require-gpu" in r for r in rep["gate"]["reasons"])


def test_network_targets_local(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    open_port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        proc, rep = probe_json("--network-target", "127.0.0.1:%d" % open_port,
                               "--network-target", "127.0.0.1:%d" % closed_port, "--network-timeout", "2")
    finally:
        listener.close()
    assert proc.returncode == 0
    up, down = rep["network"]["targets"]
    assert up["reachable"] is True and up["tcp_ok"] is True
    assert down["reachable"] is False and "refused" in down["unavailable"]["tcp_ok"].lower()


def test_torch_subprocess_only_on_request():
    import importlib.util
    installed = importlib.util.find_spec("torch") is not None
    _, rep = probe_json()
    assert rep["torch"]["installed"] is installed
    assert rep["torch"]["cuda_available"] is None
    if installed:
        assert "--torch" in rep["torch"]["unavailable"]["cuda_available"]
        _, rep = probe_json("--torch", timeout=120)
        assert isinstance(rep["torch"]["cuda_available"], bool)


def test_help_works():
    proc = run_probe("--help")
    assert proc.returncode == 0 and "Exit codes" in proc.stdout


# ---------------------------------------------------------------- the core's rules, as node_probe applies them

def is_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


def test_finding_5_out_refuses_a_symlink_and_a_fifo(tmp_path):
    """--out onto /proc/self/fd/1 (a symlink) or a FIFO: one line, exit 2, the target untouched."""
    link = tmp_path / "fakestdout"
    link.symlink_to("/proc/self/fd/1")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for target in (link, fifo):
        proc = run_probe("--out", str(target), "--data-dir", str(tmp_path))
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "refusing to replace" in lines[0] and "Traceback" not in proc.stderr
        assert proc.stdout == ""
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_finding_5_out_refuses_a_device_node(tmp_path):
    """The report's repro: mknod c 1 3 (a /dev/null twin), then node_probe --out onto it."""
    need_root("mknod of a character device")
    dev = tmp_path / "fakenull"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    proc = run_probe("--out", str(dev), "--data-dir", str(tmp_path))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "device" in proc.stderr
    st = os.lstat(dev)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fakenull"], "a temp file was left behind"


def test_out_dash_prints_the_report_once(tmp_path):
    proc = run_probe("--out", "-", "--data-dir", str(tmp_path))
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["schema"] == "rgt-node-probe/1"


FAKE_MIG = """
    import sys
    args = sys.argv[1:]
    if not args:
        print("| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |")
        sys.exit(0)
    if args[0].startswith("--query-gpu="):
        print("0, NVIDIA H100 80GB HBM3, 81559, 10, [N/A], 550.54.15")
        sys.exit(0)
    sys.exit(9)
"""


def test_na_utilisation_prints_n_a_not_none(tmp_path):
    """MIG cards answer [N/A] for utilization.gpu (stand-in nvidia-smi: this box has no GPU)."""
    fake = write_fake_smi(tmp_path / "bin", FAKE_MIG)
    proc = run_probe(path_first=fake)
    assert proc.returncode == 0, proc.stderr
    gpu = next(l for l in proc.stdout.splitlines() if " gpu 0 " in l)
    assert "util n/a" in gpu and "None" not in gpu


@pytest.fixture
def tiny_fs(tmp_path):
    """A 4 MiB tmpfs with 200 inodes: a real filesystem under the toolkit's inode floor (root only)."""
    point = tiny_tmpfs(tmp_path / "tiny")
    yield point
    subprocess.run(["umount", str(point)], capture_output=True)


def test_the_one_inode_floor_applies_to_every_disk_gate(tiny_fs):
    """--min-free-gb alone still gates inodes, at rgt_core.DEFAULT_MIN_FREE_INODES (10,000)."""
    proc = run_probe("--json", "--data-dir", str(tiny_fs), "--min-free-gb", "0")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    reasons = json.loads(proc.stdout)["gate"]["reasons"]
    assert len(reasons) == 1 and "inodes free < 10000" in reasons[0] and "inode floor" in reasons[0]
    proc = run_probe("--data-dir", str(tiny_fs), "--min-free-gb", "0", "--min-free-inodes", "10")
    assert proc.returncode == 0, proc.stderr
    proc = run_probe("disk-gate", str(tiny_fs / "not-yet" / "made"))
    assert proc.returncode == 3 and "below the floor of 10000" in proc.stdout


def test_disk_gate_subcommand(tmp_path):
    proc = run_probe("disk-gate", "--min-free-gb", "0", "--min-free-inodes", "1", str(tmp_path / "later"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK disk ") and proc.stderr == ""
    proc = run_probe("disk-gate", "--min-free-gb", "1e9", "--json", str(tmp_path), "--writable", str(tmp_path / "w"))
    assert proc.returncode == 3
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["status"] == "REFUSED"
    assert [c["status"] for c in doc["checks"]] == ["REFUSED", "OK"]
    assert "below the floor of 1e+09 GiB" in doc["checks"][0]["line"]
    assert (tmp_path / "w").is_dir() and list((tmp_path / "w").iterdir()) == []   # the probe cleaned up
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_probe("disk-gate", str(tmp_path), "--writable", str(blocker / "sub"))
    assert proc.returncode == 3 and "not writable" in proc.stdout
    for args in ([], ["--min-free-gb", "x", str(tmp_path)], [""], ["--bogus", str(tmp_path)]):
        proc = run_probe("disk-gate", *args)
        assert proc.returncode == 2, args
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("node_probe.py: error:")


@pytest.mark.parametrize("name", ["node_probe", "fetch_resumable", "build_pull_manifest"])
def test_every_option_is_in_the_docstring_and_back(name):
    import importlib
    import re
    sys.path.insert(0, str(NODE))
    try:
        mod = importlib.import_module(name)
    finally:
        sys.path.remove(str(NODE))
    parsers = [mod.build_parser()] + ([mod.build_gate_parser()] if hasattr(mod, "build_gate_parser") else [])
    accepted = {o for p in parsers for a in p._actions for o in a.option_strings if o.startswith("--")}
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", mod.__doc__))
    assert accepted - named == set(), "accepted but not in the docstring"
    assert named - accepted == set(), "in the docstring but not accepted"


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


# ---------------------------------------------------------------- field R14, R17: node_probe

STUB_TORCH = ("__version__ = '9.9.9+stub'\n"
              "class cuda:\n"
              "    is_available = staticmethod(lambda: False)\n"
              "    device_count = staticmethod(lambda: 0)\n"
              "class version:\n"
              "    cuda = None\n")


def test_finding_field_R14_probe_checks_torch_in_the_jobs_python(tmp_path):
    """A stand-in torch (a stub module, said here) lives only on the job's interpreter path: --python finds it
    there; the probe's own python is not what the job runs."""
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(STUB_TORCH)
    job_py = tmp_path / "venv" / "bin" / "python"
    job_py.parent.mkdir(parents=True)
    job_py.write_text('#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' % (tmp_path / "site", sys.executable))
    job_py.chmod(0o755)
    res = run_py(NODE / "node_probe.py", "--python", job_py, "--torch", "--json", "--gpu-timeout", "1")
    assert res.returncode == 0, res.stderr
    torch = json.loads(res.stdout)["torch"]
    assert torch["installed"] is True and torch["version"] == "9.9.9+stub" and torch["python"] == str(job_py)
    assert torch["cuda_available"] is False
    human = run_py(NODE / "node_probe.py", "--python", job_py, "--gpu-timeout", "1")
    assert str(job_py) in human.stdout
    bad = run_py(NODE / "node_probe.py", "--python", tmp_path / "nope", "--json")
    assert bad.returncode == 2 and "--python" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_finding_field_R17_probe_help_names_every_host_network_contacts(tmp_path):
    sys.path.insert(0, str(NODE))
    import node_probe
    res = run_py(NODE / "node_probe.py", "--help")
    flat = " ".join(res.stdout.split())
    for host in node_probe.DEFAULT_TARGETS:
        assert host in flat, host
    assert "443" in flat
