#!/usr/bin/env python3
"""Phase-0 audit of a training node: what is here, and is it enough to start?

Run it first on every new box (rented, owned or a cluster node), before any download
or launch. Standard library only (Python 3.8+); copy this one file to the node.

  python3 node_probe.py                                  # short summary, one OK/WARN/FAIL per line
  python3 node_probe.py --json --out probe.json          # full report as JSON (file written atomically)
  python3 node_probe.py --profile runpod --min-free-gb 50 --min-free-inodes 200000 \
      --min-mem-gb 32 --min-shm-gb 8 --require-gpu        # gate: exit 3 lists every unmet reason
  python3 node_probe.py --network --network-target pypi.org --network-target 203.0.113.10:8443
  python3 node_probe.py --torch                          # also import torch in a subprocess (slow)

What it reads: GPUs (nvidia-smi, short timeout; CUDA version from its banner), torch (installed
version from package metadata; CUDA view only with --torch, in a subprocess with a timeout),
disk bytes AND inodes for the data dir, durable dir, /, /dev/shm and $HOME (one statvfs per
mount, every path listed), cgroup v2/v1 memory limit, usage and CPU quota, host RAM from
/proc/meminfo, tools (tmux, rsync, nohup, setsid, sha256sum, git) and optional network reach
(DNS + TCP connect, then an HTTPS HEAD that honours *_proxy/no_proxy).

Anything that cannot be read is still present in the JSON, as null, with the reason under the
section's "unavailable" map ({field: reason}). Sizes are bytes; "GB" in flags and summaries means
GiB (2**30 bytes), as `df -h` prints.

Directories: --data-dir/--durable-dir beat $DATA_DIR/$DURABLE_DIR, which beat the --profile
defaults (read from profiles/index.json: $RGT_PROFILE_INDEX, else <script dir>/../profiles/index.json,
else <script dir>/index.json). A directory that does not exist yet is measured on its nearest
existing parent, since that is where it will be created.

Exit codes:
  0  probe done; every requested gate passed (or no gate was requested)
  2  usage or bad input (unknown profile, missing index, bad value, unwritable --out)
  3  a gate refused: every unmet reason is printed on stderr, one per line, and in gate.reasons
"""
import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

SCHEMA = "rgt-node-probe/1"
GIB = 1024 ** 3
TOOLS = ("tmux", "rsync", "nohup", "setsid", "sha256sum", "git")
DEFAULT_TARGETS = ("huggingface.co", "hf-mirror.com", "pypi.org", "pypi.tuna.tsinghua.edu.cn", "github.com")
# cgroup v1 writes "no limit" as a huge page-aligned number (e.g. 9223372036854771712).
UNLIMITED_FLOOR = 1 << 60
GPU_FIELDS = ("index", "name", "memory.total", "memory.used", "utilization.gpu", "driver_version")
TORCH_SNIPPET = (
    "import json, torch\n"
    "ok = torch.cuda.is_available()\n"
    "print(json.dumps({'version': torch.__version__, 'cuda_available': ok,\n"
    "  'cuda_version': torch.version.cuda, 'device_count': torch.cuda.device_count() if ok else 0,\n"
    "  'devices': [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if ok else []}))\n"
)


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit 2."""


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def section(fields):
    """A report section: the given fields set to None plus an empty 'unavailable' map."""
    out = {name: None for name in fields}
    out["unavailable"] = {}
    return out


def missing(sec, reason, *fields):
    """Mark fields of a section as unreadable, with the reason."""
    for name in fields:
        sec[name] = None
        sec["unavailable"][name] = reason


def read_text(path):
    with open(path, "r", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def run_cmd(argv, timeout):
    """Run argv; return (rc, stdout, stderr) or raise OSError / subprocess.TimeoutExpired."""
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, universal_newlines=True)
    return proc.returncode, proc.stdout, proc.stderr


# ---------------------------------------------------------------------------- profile lookup

def profile_index_candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("RGT_PROFILE_INDEX")
    if env:
        return [env]
    return [os.path.join(here, "..", "..", "profiles", "index.json"), os.path.join(here, "index.json")]


def load_profile(name):
    tried = profile_index_candidates()
    path = next((p for p in tried if os.path.isfile(p)), None)
    if path is None:
        raise UsageError("profile index not found (tried: %s); set RGT_PROFILE_INDEX or copy index.json "
                         "next to this script" % ", ".join(tried))
    try:
        index = json.loads(read_text(path))
    except (OSError, ValueError) as exc:
        raise UsageError("cannot read profile index %s: %s" % (path, exc))
    profiles = index.get("profiles") if isinstance(index, dict) else None
    if not isinstance(profiles, dict) or name not in profiles:
        known = ", ".join(sorted(profiles)) if isinstance(profiles, dict) else "none"
        raise UsageError("unknown profile %r in %s (known: %s)" % (name, path, known))
    prof = profiles[name]
    if not isinstance(prof, dict) or not isinstance(prof.get("defaults", {}), (dict, type(None))):
        raise UsageError("profile index %s is malformed: profile %r or its defaults is not an object" % (path, name))
    return path, prof.get("defaults") or {}


# ---------------------------------------------------------------------------- GPUs and torch

def parse_smi_value(raw):
    value = raw.strip()
    if not value or value.startswith("[") or value.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    return value


def to_number(value):
    if value is None:
        return None
    try:
        num = float(value)
    except ValueError:
        return None
    return int(num) if num.is_integer() else num


def probe_gpus(timeout):
    sec = section(("count", "driver_version", "cuda_version", "devices", "nvidia_smi"))
    smi = shutil.which("nvidia-smi")
    if not smi:
        missing(sec, "nvidia-smi not found on PATH (no NVIDIA driver visible here)",
                "count", "driver_version", "cuda_version", "devices", "nvidia_smi")
        return sec
    sec["nvidia_smi"] = smi
    query = "--query-gpu=" + ",".join(GPU_FIELDS)
    try:
        rc, out, err = run_cmd([smi, query, "--format=csv,noheader,nounits"], timeout)
    except subprocess.TimeoutExpired:
        missing(sec, "nvidia-smi did not answer within %gs (hung driver or GPU?)" % timeout,
                "count", "driver_version", "cuda_version", "devices")
        return sec
    except OSError as exc:
        missing(sec, "nvidia-smi could not run: %s" % exc, "count", "driver_version", "cuda_version", "devices")
        return sec
    if rc != 0:
        first = (err or out).strip().splitlines()
        missing(sec, "nvidia-smi exit %d: %s" % (rc, first[0] if first else "no output"),
                "count", "driver_version", "cuda_version", "devices")
        return sec
    devices = []
    for line in out.splitlines():
        if not line.strip():
            continue
        cells = [parse_smi_value(c) for c in line.split(",")]
        if len(cells) < len(GPU_FIELDS):
            continue
        row = dict(zip(GPU_FIELDS, cells))
        devices.append({
            "index": to_number(row["index"]),
            "name": row["name"],
            "memory_total_mib": to_number(row["memory.total"]),
            "memory_used_mib": to_number(row["memory.used"]),
            "utilization_pct": to_number(row["utilization.gpu"]),
            "driver_version": row["driver_version"],
        })
    sec["devices"] = devices
    sec["count"] = len(devices)
    drivers = sorted({d["driver_version"] for d in devices if d["driver_version"]})
    if drivers:
        sec["driver_version"] = drivers[0] if len(drivers) == 1 else ",".join(drivers)
    else:
        missing(sec, "nvidia-smi listed no driver version", "driver_version")
    try:
        rc, banner, _ = run_cmd([smi], timeout)
        match = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
        if match:
            sec["cuda_version"] = match.group(1)
        else:
            missing(sec, "no 'CUDA Version' in the nvidia-smi banner", "cuda_version")
    except (OSError, subprocess.TimeoutExpired) as exc:
        missing(sec, "nvidia-smi banner unreadable: %s" % exc.__class__.__name__, "cuda_version")
    return sec


def probe_torch(run_import, timeout):
    sec = section(("installed", "version", "cuda_available", "cuda_version", "device_count", "devices"))
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    sec["installed"] = spec is not None
    if spec is None:
        missing(sec, "torch is not importable by %s" % sys.executable,
                "version", "cuda_available", "cuda_version", "device_count", "devices")
        return sec
    try:
        from importlib import metadata as md  # Python 3.8+
        sec["version"] = md.version("torch")
    except Exception:  # noqa: BLE001 - metadata may be absent for source installs
        missing(sec, "no package metadata for torch", "version")
    fields = ("cuda_available", "cuda_version", "device_count", "devices")
    if not run_import:
        missing(sec, "not checked: pass --torch to import torch in a subprocess (takes seconds)", *fields)
        return sec
    try:
        rc, out, err = run_cmd([sys.executable, "-c", TORCH_SNIPPET], timeout)
    except subprocess.TimeoutExpired:
        missing(sec, "importing torch took longer than %gs" % timeout, *fields)
        return sec
    if rc != 0:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        missing(sec, "importing torch failed: %s" % tail[:200], *fields)
        return sec
    try:
        info = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        missing(sec, "unexpected output from the torch subprocess", *fields)
        return sec
    sec["version"] = info.get("version") or sec["version"]
    sec["unavailable"].pop("version", None)
    for name in fields:
        sec[name] = info.get(name)
    if sec["cuda_version"] is None:
        sec["unavailable"]["cuda_version"] = "this torch build has no CUDA (CPU-only wheel)"
    return sec


# ---------------------------------------------------------------------------- disks

def mount_table():
    """[(mount_point, fs_type, source)] from /proc/self/mountinfo, longest mount point first."""
    rows = []
    try:
        text = read_text("/proc/self/mountinfo")
    except OSError:
        return rows
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 2:
            continue
        point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        rows.append((point, rparts[0], rparts[1]))
    rows.sort(key=lambda r: len(r[0]), reverse=True)
    return rows


def find_mount(path, table):
    for point, fstype, source in table:
        if path == point or path.startswith(point.rstrip("/") + "/"):
            return point, fstype, source
    return None, None, None


def nearest_existing(path):
    cur = os.path.abspath(path)
    while not os.path.exists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


PATH_FIELDS = ("path", "exists", "measured_at", "mount_point", "free_bytes", "free_gib", "total_bytes",
               "free_inodes", "total_inodes")
COPIED = ("mount_point", "free_bytes", "free_gib", "total_bytes", "free_inodes", "total_inodes")


def new_mount(real, table):
    mount = section(("mount_point", "fs_type", "source", "total_bytes", "free_bytes", "used_bytes",
                     "free_gib", "total_inodes", "free_inodes", "used_inodes_pct"))
    mount["paths"] = []
    mount["inodes_dynamic"] = False
    point, fstype, source = find_mount(real, table)
    mount["mount_point"], mount["fs_type"], mount["source"] = point, fstype, source
    if point is None:
        missing(mount, "no matching line in /proc/self/mountinfo", "mount_point", "fs_type", "source")
    try:
        st = os.statvfs(real)
    except OSError as exc:
        missing(mount, "statvfs failed: %s" % exc.strerror, "total_bytes", "free_bytes", "used_bytes",
                "free_gib", "total_inodes", "free_inodes", "used_inodes_pct")
        return mount
    mount["total_bytes"] = st.f_blocks * st.f_frsize
    mount["free_bytes"] = st.f_bavail * st.f_frsize  # what an unprivileged writer can still use
    mount["used_bytes"] = (st.f_blocks - st.f_bfree) * st.f_frsize
    mount["free_gib"] = round(mount["free_bytes"] / GIB, 2)
    if st.f_files > 0:
        mount["total_inodes"] = st.f_files
        mount["free_inodes"] = st.f_favail
        mount["used_inodes_pct"] = round(100.0 * (st.f_files - st.f_ffree) / st.f_files, 1)
    else:
        mount["inodes_dynamic"] = True
        missing(mount, "filesystem reports no inode count (f_files=0): inodes are allocated on demand, "
                "so there is no fixed inode cap", "total_inodes", "free_inodes", "used_inodes_pct")
    return mount


def probe_disks(paths):
    """paths: [(role, path)]. Returns (mounts, per_role): one statvfs per device, every path listed."""
    table = mount_table()
    mounts, by_dev, per_role = [], {}, {}
    for role, path in paths:
        entry = section(PATH_FIELDS + ("inodes_dynamic",))
        per_role[role] = entry
        if not path:
            missing(entry, "not given: pass --%s-dir, set %s_DIR, or use --profile" % (role, role.upper()),
                    *(PATH_FIELDS + ("inodes_dynamic",)))
            continue
        entry["path"] = path
        full = os.path.expanduser(path)
        entry["exists"] = os.path.exists(full)
        measured = nearest_existing(full)
        entry["measured_at"] = measured
        try:
            real = os.path.realpath(measured)
            dev = os.stat(real).st_dev
        except OSError as exc:
            missing(entry, "stat %s failed: %s" % (measured, exc.strerror), *(COPIED + ("inodes_dynamic",)))
            continue
        if dev not in by_dev:
            by_dev[dev] = new_mount(real, table)
            mounts.append(by_dev[dev])
        mount = by_dev[dev]
        mount["paths"].append({"role": role, "path": path})
        for key in COPIED:
            entry[key] = mount[key]
            if mount[key] is None:
                entry["unavailable"][key] = mount["unavailable"].get(key, "unreadable")
        entry["inodes_dynamic"] = mount["inodes_dynamic"]
    return mounts, per_role


# ---------------------------------------------------------------------------- memory, cgroup

def read_meminfo():
    sec = section(("total_bytes", "available_bytes", "swap_total_bytes"))
    try:
        values = {}
        for line in read_text("/proc/meminfo").splitlines():
            key, _, rest = line.partition(":")
            num = rest.split()
            if num:
                values[key] = int(num[0]) * 1024
        for field, key in (("total_bytes", "MemTotal"), ("available_bytes", "MemAvailable"),
                           ("swap_total_bytes", "SwapTotal")):
            if key in values:
                sec[field] = values[key]
            else:
                missing(sec, "%s absent from /proc/meminfo" % key, field)
    except OSError as exc:
        missing(sec, "/proc/meminfo unreadable: %s" % exc.strerror, "total_bytes", "available_bytes",
                "swap_total_bytes")
    return sec


def own_cgroup_paths():
    """{'v2': '/path'} and/or {'memory': '/path', 'cpu': '/path'} from /proc/self/cgroup."""
    found = {}
    try:
        text = read_text("/proc/self/cgroup")
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            found["v2"] = path
        for ctrl in ctrls.split(","):
            if ctrl in ("memory", "cpu"):
                found[ctrl] = path
    return found


def cgroup_dirs(root, rel):
    """Own cgroup dir first, then its ancestors up to the mount root (limits nest)."""
    dirs = []
    cur = os.path.normpath(os.path.join(root, (rel or "/").lstrip("/")))
    if not os.path.isdir(cur):
        cur = root  # cgroup namespace: our path is not visible, the mount root is our cgroup
    while True:
        dirs.append(cur)
        if os.path.normpath(cur) == os.path.normpath(root):
            break
        cur = os.path.dirname(cur)
    return dirs


def first_int(path):
    try:
        raw = read_text(path).split()
    except OSError:
        return None, False
    if not raw:
        return None, False
    if raw[0] == "max":
        return None, True
    try:
        return int(raw[0]), True
    except ValueError:
        return None, False


def probe_cgroup(base="/sys/fs/cgroup"):
    sec = section(("version", "memory_limit_bytes", "memory_usage_bytes", "cpu_quota_cores", "path"))
    sec["memory_limited"] = None
    sec["cpu_limited"] = None
    own = own_cgroup_paths()
    v2 = os.path.isfile(os.path.join(base, "cgroup.controllers"))
    if v2:
        sec["version"] = 2
        dirs = cgroup_dirs(base, own.get("v2", "/"))
        mem_files, usage_file = ["memory.max"], "memory.current"
    elif os.path.isdir(os.path.join(base, "memory")) or os.path.isdir(os.path.join(base, "cpu")):
        sec["version"] = 1
        dirs = cgroup_dirs(os.path.join(base, "memory"), own.get("memory", "/"))
        mem_files, usage_file = ["memory.limit_in_bytes"], "memory.usage_in_bytes"
    else:
        missing(sec, "no cgroup filesystem at %s" % base, "version", "memory_limit_bytes",
                "memory_usage_bytes", "cpu_quota_cores", "path")
        return sec
    sec["path"] = dirs[0]
    limits, seen = [], False
    for d in dirs:
        for name in mem_files:
            val, ok = first_int(os.path.join(d, name))
            seen = seen or ok
            if val is not None and val < UNLIMITED_FLOOR:
                limits.append(val)
    if limits:
        sec["memory_limit_bytes"] = min(limits)
        sec["memory_limited"] = True
    elif seen:
        sec["memory_limited"] = False
        missing(sec, "no memory limit set in this cgroup or its parents (unlimited)", "memory_limit_bytes")
    else:
        missing(sec, "memory limit file not readable under %s" % dirs[0], "memory_limit_bytes")
    usage, ok = first_int(os.path.join(dirs[0], usage_file))
    if usage is not None:
        sec["memory_usage_bytes"] = usage
    else:
        missing(sec, "%s not readable under %s" % (usage_file, dirs[0]), "memory_usage_bytes")
    # CPU quota: the tightest quota/period among our cgroup and its parents.
    quotas, cpu_seen = [], False
    if sec["version"] == 2:
        for d in dirs:
            try:
                parts = read_text(os.path.join(d, "cpu.max")).split()
            except OSError:
                continue
            cpu_seen = True
            if len(parts) == 2 and parts[0] != "max":
                try:
                    quotas.append(int(parts[0]) / int(parts[1]))
                except (ValueError, ZeroDivisionError):
                    pass
    else:
        for d in cgroup_dirs(os.path.join(base, "cpu"), own.get("cpu", "/")):
            quota, ok_q = first_int(os.path.join(d, "cpu.cfs_quota_us"))
            period, ok_p = first_int(os.path.join(d, "cpu.cfs_period_us"))
            cpu_seen = cpu_seen or (ok_q and ok_p)
            if quota is not None and quota > 0 and period:
                quotas.append(quota / period)
    if quotas:
        sec["cpu_quota_cores"] = round(min(quotas), 2)
        sec["cpu_limited"] = True
    elif cpu_seen:
        sec["cpu_limited"] = False
        missing(sec, "no CPU quota set (unlimited)", "cpu_quota_cores")
    else:
        missing(sec, "CPU quota files (cpu.max / cpu.cfs_quota_us) not readable", "cpu_quota_cores")
    return sec


# ---------------------------------------------------------------------------- tools, network

def probe_tools():
    sec = section(TOOLS)
    for name in TOOLS:
        found = shutil.which(name)
        if found:
            sec[name] = found
        else:
            missing(sec, "not found on PATH", name)
    sec["python"] = {"version": platform.python_version(), "executable": sys.executable}
    return sec


def parse_target(text):
    """HOST, HOST:PORT or [IPv6]:PORT -> (host, port). Port defaults to 443."""
    text = text.strip()
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?", text)
    if match:
        host, port = match.group(1), match.group(2)
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif ":" in text:
        raise UsageError("bad --network-target %r: write IPv6 as [addr]:port" % text)
    else:
        host, port = text, None
    if not host or not re.fullmatch(r"[A-Za-z0-9._:-]+", host):
        raise UsageError("bad --network-target %r: expected HOST or HOST:PORT" % text)
    try:
        port_num = int(port) if port is not None else 443
    except ValueError:
        raise UsageError("bad --network-target %r: port must be a number" % text)
    if not 0 < port_num < 65536:
        raise UsageError("bad --network-target %r: port out of range" % text)
    return host, port_num


def check_target(host, port, timeout, head):
    res = {"target": "%s:%d" % (host, port), "host": host, "port": port, "dns_ok": None, "tcp_ok": None,
           "connect_ms": None, "https_status": None, "unavailable": {}}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        res["dns_ok"] = True
    except (socket.gaierror, UnicodeError) as exc:
        res["dns_ok"] = False
        res["tcp_ok"] = False
        res["unavailable"]["tcp_ok"] = "DNS lookup failed: %s" % exc
        infos = []
    err = None
    for family, stype, proto, _, addr in infos[:3]:
        start = time.monotonic()
        try:
            with socket.socket(family, stype, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(addr)
            res["tcp_ok"] = True
            res["connect_ms"] = round(1000 * (time.monotonic() - start), 1)
            break
        except OSError as exc:
            err = exc
    if infos and not res["tcp_ok"]:
        res["tcp_ok"] = False
        res["unavailable"]["tcp_ok"] = "TCP connect failed: %s" % (err or "no address")
    if head and port == 443:
        import urllib.request
        import urllib.error
        req = urllib.request.Request("https://%s/" % host, method="HEAD",
                                     headers={"User-Agent": "rgt-node-probe/1"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                res["https_status"] = resp.status
        except urllib.error.HTTPError as exc:
            res["https_status"] = exc.code  # an HTTP answer still proves the route works
        except Exception as exc:  # noqa: BLE001 - URLError, timeouts, TLS errors
            res["unavailable"]["https_status"] = "HTTPS HEAD failed: %s" % getattr(exc, "reason", exc)
    elif not head or port != 443:
        res["unavailable"]["https_status"] = "HEAD only tried on port 443"
    res["reachable"] = bool(res["tcp_ok"]) or res["https_status"] is not None
    return res


def probe_network(targets, timeout):
    results = [None] * len(targets)

    def work(i, host, port):
        results[i] = check_target(host, port, timeout, head=True)

    threads = [threading.Thread(target=work, args=(i, h, p), daemon=True) for i, (h, p) in enumerate(targets)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 3 * timeout + 2
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for i, (host, port) in enumerate(targets):
        if results[i] is None:
            results[i] = {"target": "%s:%d" % (host, port), "host": host, "port": port, "reachable": False,
                          "dns_ok": None, "tcp_ok": None, "connect_ms": None, "https_status": None,
                          "unavailable": {"tcp_ok": "no answer before the overall deadline"}}
    return {"checked": True, "timeout_seconds": timeout,
            "proxy_set": any(os.environ.get(k) for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")),
            "targets": results}


# ---------------------------------------------------------------------------- gate and summary

def evaluate_gate(report, args):
    reasons = []
    checks = []
    disks = report["disk_paths"]
    gated_roles = [r for r in ("data", "durable") if disks.get(r, {}).get("path")]
    if args.min_free_gb is not None:
        checks.append("min_free_gb")
        for role in gated_roles:
            d = disks[role]
            if d.get("free_bytes") is None:
                reasons.append("%s dir %s: free space unreadable (%s); cannot verify --min-free-gb %g"
                               % (role, d["path"], d["unavailable"].get("free_bytes"), args.min_free_gb))
            elif d["free_bytes"] < args.min_free_gb * GIB:
                reasons.append("%s dir %s: %.1f GiB free < %g GiB required (--min-free-gb); free space or "
                               "pick a bigger volume" % (role, d["path"], d["free_bytes"] / GIB, args.min_free_gb))
    if args.min_free_inodes is not None:
        checks.append("min_free_inodes")
        for role in gated_roles:
            d = disks[role]
            if d.get("inodes_dynamic"):
                continue  # no fixed inode table on this filesystem: nothing can run out
            if d.get("free_inodes") is None:
                reasons.append("%s dir %s: free inodes unreadable; cannot verify --min-free-inodes %d"
                               % (role, d["path"], args.min_free_inodes))
            elif d["free_inodes"] < args.min_free_inodes:
                reasons.append("%s dir %s: %d inodes free < %d required (--min-free-inodes); pack small "
                               "files into shards or archives, or use another volume"
                               % (role, d["path"], d["free_inodes"], args.min_free_inodes))
    if args.min_mem_gb is not None:
        checks.append("min_mem_gb")
        eff = report["memory"]["effective_limit_bytes"]
        if eff is None:
            reasons.append("memory size unreadable; cannot verify --min-mem-gb %g" % args.min_mem_gb)
        elif eff < args.min_mem_gb * GIB:
            reasons.append("memory: %.1f GiB usable (min of cgroup limit and host RAM) < %g GiB required "
                           "(--min-mem-gb); a job above the cgroup limit is SIGKILLed (exit 137)"
                           % (eff / GIB, args.min_mem_gb))
    if args.min_shm_gb is not None:
        checks.append("min_shm_gb")
        shm = disks.get("shm", {})
        if shm.get("free_bytes") is None:
            reasons.append("/dev/shm unreadable; cannot verify --min-shm-gb %g" % args.min_shm_gb)
        elif shm["free_bytes"] < args.min_shm_gb * GIB:
            reasons.append("/dev/shm: %.2f GiB free of %.2f GiB < %g GiB required (--min-shm-gb); DataLoader "
                           "workers need shared memory: restart the container with a bigger --shm-size or use "
                           "num_workers=0" % (shm["free_bytes"] / GIB, (shm.get("total_bytes") or 0) / GIB,
                                              args.min_shm_gb))
    if args.require_gpu:
        checks.append("require_gpu")
        gpus = report["gpus"]
        if not gpus["count"]:
            why = gpus["unavailable"].get("count") or "nvidia-smi listed no GPU"
            reasons.append("no usable GPU (--require-gpu): %s" % why)
    return {"checked": checks, "passed": not reasons, "reasons": reasons}


def fmt_gib(num):
    return "?" if num is None else "%.1f GiB" % (num / GIB)


def summary_lines(report):
    lines = []
    tools = report["tools"]
    lines.append(("OK", "python %s (%s)" % (tools["python"]["version"], tools["python"]["executable"])))
    gpus = report["gpus"]
    if gpus["count"]:
        for d in gpus["devices"]:
            lines.append(("OK", "gpu %s %s: %s/%s MiB used, util %s%%, driver %s, CUDA %s" % (
                d["index"], d["name"], d["memory_used_mib"], d["memory_total_mib"], d["utilization_pct"],
                d["driver_version"], gpus["cuda_version"] or "?")))
    else:
        lines.append(("WARN", "gpu: none usable (%s)" % (gpus["unavailable"].get("count") or "0 GPUs listed")))
    torch = report["torch"]
    if torch["installed"]:
        extra = "cuda_available=%s" % torch["cuda_available"] if torch["cuda_available"] is not None \
            else "CUDA not checked (--torch)"
        lines.append(("OK", "torch %s, %s" % (torch["version"] or "?", extra)))
    else:
        lines.append(("WARN", "torch: not importable by this python"))
    for mount in report["disks"]:
        roles = ",".join("%s=%s" % (p["role"], p["path"]) for p in mount["paths"])
        word = "OK"
        if mount["free_bytes"] is None:
            word = "FAIL"
        elif mount["free_bytes"] < 10 * GIB and mount["mount_point"] != "/dev/shm":
            word = "WARN"
        if mount["total_inodes"] and mount["used_inodes_pct"] is not None and mount["used_inodes_pct"] > 90:
            word = "WARN"
        inodes = "inodes n/a (dynamic)" if mount.get("inodes_dynamic") else (
            "%s inodes free (%s%% used)" % (mount["free_inodes"], mount["used_inodes_pct"]))
        lines.append((word, "disk %s [%s]: %s free of %s, %s (%s)" % (
            mount["mount_point"] or "?", mount["fs_type"] or "?", fmt_gib(mount["free_bytes"]),
            fmt_gib(mount["total_bytes"]), inodes, roles)))
    for role, entry in report["disk_paths"].items():
        if entry.get("path") and entry.get("exists") is False:
            lines.append(("WARN", "%s dir %s does not exist yet (measured on %s)"
                          % (role, entry["path"], entry["measured_at"])))
    shm = report["disk_paths"].get("shm", {})
    if shm.get("total_bytes") is not None and shm["total_bytes"] < 1 * GIB:
        lines.append(("WARN", "/dev/shm is only %.0f MiB: DataLoader workers may crash (bus error); "
                      "raise --shm-size" % (shm["total_bytes"] / 2 ** 20)))
    mem, cg = report["memory"], report["cgroup"]
    limit = "cgroup limit %s" % fmt_gib(cg["memory_limit_bytes"]) if cg["memory_limited"] else (
        "no cgroup limit" if cg["memory_limited"] is False else "cgroup limit unreadable")
    lines.append(("OK" if mem["total_bytes"] else "WARN", "memory: host %s, available %s, %s, usable %s" % (
        fmt_gib(mem["total_bytes"]), fmt_gib(mem["available_bytes"]), limit, fmt_gib(mem["effective_limit_bytes"]))))
    cpu = "%s cores quota" % cg["cpu_quota_cores"] if cg["cpu_limited"] else "no CPU quota"
    lines.append(("OK", "cpu: %s logical CPUs, %s (cgroup v%s)" % (os.cpu_count(), cpu, cg["version"] or "?")))
    absent = [t for t in TOOLS if report["tools"][t] is None]
    lines.append(("WARN" if absent else "OK", "tools: missing %s" % " ".join(absent) if absent
                  else "tools: " + " ".join(TOOLS)))
    net = report["network"]
    if net.get("checked"):
        for t in net["targets"]:
            how = "tcp %s ms" % t["connect_ms"] if t["tcp_ok"] else (
                t["unavailable"].get("tcp_ok") or "tcp failed")
            if t["https_status"] is not None:
                how += ", https HEAD %s" % t["https_status"]
            lines.append(("OK" if t["reachable"] else "FAIL", "network %s: %s" % (t["target"], how)))
    gate = report["gate"]
    if gate["checked"]:
        if gate["passed"]:
            lines.append(("OK", "gate: passed (%s)" % ", ".join(gate["checked"])))
        for reason in gate["reasons"]:
            lines.append(("FAIL", "gate: " + reason))
    return lines


def write_atomic(path, text):
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(target), suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# ---------------------------------------------------------------------------- main

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def non_negative(kind, below=float("inf")):
    def conv(text):
        try:
            val = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if not 0 <= val < below:   # also refuses nan and inf
            raise argparse.ArgumentTypeError("%r must be >= 0%s" % (text, "" if below == float("inf")
                                                                      else " and < %g" % below))
        return val
    return conv


def build_parser():
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="Exit codes: 0 ok, 2 usage/bad input, 3 a gate refused (reasons on stderr).")
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    p.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE (atomic)")
    p.add_argument("--profile", metavar="NAME", help="take DATA_DIR/DURABLE_DIR defaults from this profile")
    p.add_argument("--data-dir", metavar="DIR", help="data/scratch directory (default $DATA_DIR or profile)")
    p.add_argument("--durable-dir", metavar="DIR", help="durable directory (default $DURABLE_DIR or profile)")
    p.add_argument("--path", action="append", default=[], metavar="DIR", help="extra path to measure (repeatable)")
    p.add_argument("--torch", action="store_true", help="import torch in a subprocess to read its CUDA view")
    p.add_argument("--torch-timeout", type=non_negative(float, 1e9), default=60.0, metavar="S")
    p.add_argument("--gpu-timeout", type=non_negative(float, 1e9), default=8.0, metavar="S",
                   help="timeout for each nvidia-smi call (default 8)")
    p.add_argument("--network", action="store_true", help="check reachability of the default targets")
    p.add_argument("--network-target", action="append", default=[], metavar="HOST[:PORT]",
                   help="target to check instead of the defaults (repeatable; implies --network)")
    p.add_argument("--network-timeout", type=non_negative(float, 1e9), default=4.0, metavar="S")
    p.add_argument("--min-free-gb", type=non_negative(float), metavar="N",
                   help="gate: GiB free required on the data and durable dirs")
    p.add_argument("--min-free-inodes", type=non_negative(int), metavar="N",
                   help="gate: free inodes required on the data and durable dirs")
    p.add_argument("--min-mem-gb", type=non_negative(float), metavar="N",
                   help="gate: GiB of usable memory (min of cgroup limit and host RAM)")
    p.add_argument("--min-shm-gb", type=non_negative(float), metavar="N", help="gate: GiB free in /dev/shm")
    p.add_argument("--require-gpu", action="store_true", help="gate: at least one GPU listed by nvidia-smi")
    return p


def resolve_dirs(args):
    sources = {}
    defaults = {}
    if args.profile == "":
        raise UsageError("--profile is empty")
    if args.profile:
        _, defaults = load_profile(args.profile)
    out = {}
    for role, flag, env_key in (("data", args.data_dir, "DATA_DIR"), ("durable", args.durable_dir, "DURABLE_DIR")):
        if flag:
            out[role], sources[role] = flag, "flag"
        elif os.environ.get(env_key):
            out[role], sources[role] = os.environ[env_key], "env"
        elif defaults.get(env_key):
            out[role], sources[role] = str(defaults[env_key]), "profile"
        else:
            out[role], sources[role] = None, None
        if out[role]:
            there = nearest_existing(os.path.expanduser(out[role]))
            if not os.path.isdir(there):
                raise UsageError("%s dir %s (from %s): %s is not a directory" % (role, out[role], sources[role], there))
    return out, sources, defaults


def run(args):
    started = time.monotonic()
    dirs, dir_sources, defaults = resolve_dirs(args)
    gate_wanted = args.min_free_gb is not None or args.min_free_inodes is not None
    if gate_wanted and not (dirs["data"] or dirs["durable"]):
        raise UsageError("--min-free-gb/--min-free-inodes need a directory: pass --data-dir/--durable-dir, "
                         "set DATA_DIR/DURABLE_DIR, or use --profile")
    targets = []
    if args.network_target:
        targets = [parse_target(t) for t in args.network_target]
    elif args.network:
        targets = [(h, 443) for h in DEFAULT_TARGETS]
    if args.out:
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError("--out %s: directory %s is missing or not writable" % (args.out, folder))

    net_holder = {}
    net_thread = None
    if targets:  # network checks run while the local probes do
        net_thread = threading.Thread(
            target=lambda: net_holder.update(probe_network(targets, args.network_timeout)), daemon=True)
        net_thread.start()

    paths = [("data", dirs["data"]), ("durable", dirs["durable"]), ("root", "/"), ("shm", "/dev/shm"),
             ("home", os.path.expanduser("~"))]
    paths += [("extra%d" % (i + 1), p) for i, p in enumerate(args.path)]
    mounts, per_role = probe_disks(paths)
    for role in ("data", "durable"):
        per_role[role]["source"] = dir_sources[role]
    memory = read_meminfo()
    cgroup = probe_cgroup()
    candidates = [v for v in (memory["total_bytes"], cgroup["memory_limit_bytes"]) if v is not None]
    memory["effective_limit_bytes"] = min(candidates) if candidates else None
    if memory["effective_limit_bytes"] is None:
        memory["unavailable"]["effective_limit_bytes"] = "neither host RAM nor a cgroup limit could be read"

    report = {
        "schema": SCHEMA,
        "probed_at": utc_now(),
        "host": socket.gethostname(),
        "profile": args.profile,
        "profile_defaults": {k: defaults.get(k) for k in ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "DISK_FLOOR_GB")}
        if args.profile else None,
        "gpus": probe_gpus(args.gpu_timeout),
        "torch": probe_torch(args.torch, args.torch_timeout),
        "disks": mounts,
        "disk_paths": per_role,
        "memory": memory,
        "cgroup": cgroup,
        "tools": probe_tools(),
    }
    if net_thread is not None:
        net_thread.join(3 * args.network_timeout + 5)
    report["network"] = net_holder or {"checked": False, "targets": [],
                                       "unavailable": {"targets": "not checked: pass --network"}}
    report["gate"] = evaluate_gate(report, args)
    report["duration_seconds"] = round(time.monotonic() - started, 3)
    return report


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        report = run(args)
    except UsageError as exc:
        print("node_probe: error: %s" % exc, file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2, sort_keys=False) + "\n"
    if args.out:
        try:
            write_atomic(args.out, text)
        except OSError as exc:
            print("node_probe: error: cannot write --out %s: %s" % (args.out, exc.strerror), file=sys.stderr)
            return 2
    if args.json:
        sys.stdout.write(text)
    else:
        for word, msg in summary_lines(report):
            print("%-4s %s" % (word, msg))
    for reason in report["gate"]["reasons"]:
        print("REFUSED: %s" % reason, file=sys.stderr)
    return 0 if report["gate"]["passed"] else 3


if __name__ == "__main__":
    sys.exit(main())
