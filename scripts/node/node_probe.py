#!/usr/bin/env python3
"""Audits a node (GPUs, driver, disk bytes and inodes, memory, /dev/shm); exit 3 with every reason a gate is unmet.

Run it first on every new box (rented, owned or a cluster node), before any download or launch.
Python 3.8+ and the standard library; part of the node toolkit (push the whole scripts/node folder:
this script imports rgt_core.py beside it).

  python3 node_probe.py                                  # short summary, one OK/WARN/FAIL per line
  python3 node_probe.py --json --out probe.json          # full report as JSON (file written atomically)
  python3 node_probe.py --profile runpod --min-free-gb 50 --min-free-inodes 200000 \
      --min-mem-gb 32 --min-shm-gb 8 --require-gpu        # gate: exit 3 lists every unmet reason
  python3 node_probe.py --network --network-target pypi.org --network-target 203.0.113.10:8443
  python3 node_probe.py --torch                          # also import torch in a subprocess (slow)
  python3 node_probe.py disk-gate --min-free-gb 20 "$DATA_DIR"   # the disk gate alone, fast (no GPU,
                                                         # torch or network probe): for shell callers

Options:
  --json                  print the full report as JSON on stdout
  --out FILE|-            also write the JSON report to FILE (atomic; '-' = stdout, like --json)
  --profile NAME          take DATA_DIR/DURABLE_DIR defaults from this profile
  --data-dir DIR          data/scratch directory (default $DATA_DIR, else the profile's)
  --durable-dir DIR       durable directory (default $DURABLE_DIR, else the profile's)
  --path DIR              an extra path to measure (repeatable)
  --torch                 import torch in a subprocess to read its CUDA view
  --python PATH           the job's interpreter (a venv's bin/python): torch is looked up and imported
                          there, not in the python running this probe
  --torch-timeout S       hard limit for that subprocess (default 60)
  --gpu-timeout S         hard limit for each nvidia-smi call (default 8)
  --network               check reachability (a TCP connect to port 443, nothing sent) of the default
                          targets: huggingface.co, hf-mirror.com, pypi.org, pypi.tuna.tsinghua.edu.cn,
                          github.com
  --network-target HOST[:PORT]   a target to check instead of the defaults (repeatable; implies --network)
  --network-timeout S     per-target timeout (default 4)
  --min-free-gb N         gate: GiB free required on the data and durable dirs (no default: the audit
                          reports and gates only what it is asked; disk-gate below defaults to the floor)
  --min-free-inodes N     gate: free inodes required there (default, whenever a disk gate is asked
                          for: the toolkit's one floor, rgt_core.DEFAULT_MIN_FREE_INODES = 10000)
  --min-mem-gb N          gate: GiB of usable memory (min of cgroup limit and host RAM)
  --min-shm-gb N          gate: GiB free in /dev/shm
  --require-gpu           gate: at least one GPU listed by nvidia-smi
  -h, --help              this text

disk-gate PATH... : the toolkit's disk gate (rgt_core.disk_gate) on each PATH's filesystem (a path
that does not exist yet is measured on its nearest existing parent), one line per filesystem:
  --min-free-gb N (default: the toolkit's one floor, rgt_core.DEFAULT_DISK_FLOOR_GB = 10; 0 turns the
  byte check off)  --min-free-inodes N (default 10000)  --writable DIR (repeatable: a file must be
  creatable and removable there)  --json
  The default is the floor, not off: a gate called without a number should refuse where a launch
  would, never pass a full disk. (Before 2026-12 it was 0, which checked inodes only.)
  Exit 0 every check passed, 3 refused (each reason on stdout and stderr), 2 usage.

What it reads: GPUs (nvidia-smi, hard timeout; CUDA version from its banner), torch (installed
version from package metadata; CUDA view only with --torch, in a subprocess with a hard timeout),
disk bytes AND inodes for the data dir, durable dir, /, /dev/shm and $HOME (one statvfs per
mount, every path listed), cgroup v2/v1 memory limit, usage and CPU quota, host RAM from
/proc/meminfo, tools (tmux, rsync, nohup, setsid, sha256sum, git) and optional network reach
(DNS + TCP connect, then an HTTPS HEAD that honours *_proxy/no_proxy).

Anything that cannot be read is still present in the JSON, as null, with the reason under the
section's "unavailable" map ({field: reason}). Sizes are bytes; "GB" in flags and summaries means
GiB (2**30 bytes), as `df -h` prints.

Directories: --data-dir/--durable-dir beat $DATA_DIR/$DURABLE_DIR, which beat the --profile
defaults (the profile index: $RGT_PROFILE_INDEX, else index.json beside the node toolkit, else the
repo's profiles/index.json). A directory that does not exist yet is measured on its nearest
existing parent, since that is where it will be created.

--out: an existing target that is not a regular file (a device such as /dev/null, a FIFO, a
symlink) is refused with exit 2 and left untouched.

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
import sys
import threading
import time

import rgt_core as core

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


UsageError = core.UsageError


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
    """Run argv under core.run_bounded (a hard timeout that holds even for detached children).

    Returns (rc, output); rc is None when the timeout killed it, 127 when it could not start."""
    res = core.run_bounded(argv, timeout)
    return res.rc, res.output if res.error is None else res.error


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
    rc, out = run_cmd([smi, query, "--format=csv,noheader,nounits"], timeout)
    if rc is None:
        missing(sec, "nvidia-smi did not answer within %gs (hung driver or GPU?)" % timeout,
                "count", "driver_version", "cuda_version", "devices")
        return sec
    if rc != 0:
        first = out.strip().splitlines()
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
    rc, banner = run_cmd([smi], timeout)
    match = re.search(r"CUDA Version:\s*([0-9.]+)", banner) if rc is not None else None
    if match:
        sec["cuda_version"] = match.group(1)
    elif rc is None:
        missing(sec, "nvidia-smi banner: no answer within %gs" % timeout, "cuda_version")
    else:
        missing(sec, "no 'CUDA Version' in the nvidia-smi banner", "cuda_version")
    return sec


FIND_TORCH_SNIPPET = (
    "import importlib.util, json\n"
    "found = importlib.util.find_spec('torch') is not None\n"
    "version = None\n"
    "try:\n"
    "    from importlib import metadata\n"
    "    version = metadata.version('torch') if found else None\n"
    "except Exception:\n"
    "    pass\n"
    "print(json.dumps({'installed': found, 'version': version}))\n"
)


def find_torch(python, timeout):
    """(installed, version or None) of torch for PYTHON, without importing it; None, reason when PYTHON fails."""
    if python == sys.executable:
        try:
            import importlib.util
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return (False, None), None
        try:
            from importlib import metadata as md  # Python 3.8+
            return (True, md.version("torch")), None
        except Exception:  # noqa: BLE001 - metadata may be absent for source installs
            return (True, None), None
    rc, out = run_cmd([python, "-c", FIND_TORCH_SNIPPET], timeout)
    try:
        doc = json.loads(out.strip().splitlines()[-1]) if rc == 0 else None
    except (ValueError, IndexError):
        doc = None
    if not isinstance(doc, dict):
        return None, "%s could not be asked about torch (exit %s)" % (python, rc)
    return (bool(doc.get("installed")), doc.get("version")), None


def job_python(text):
    """--python as a runnable path (a name is looked up on PATH); UsageError when there is none."""
    if text is None:
        return None
    import shutil
    found = text if os.sep in text else shutil.which(text)
    if not found or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise UsageError("--python %s is not an executable file (give the job's interpreter, e.g. "
                         "~/venv/bin/python)" % text)
    return found


def probe_torch(run_import, timeout, python=None):
    python = python or sys.executable
    sec = section(("installed", "version", "cuda_available", "cuda_version", "device_count", "devices"))
    sec["python"] = python
    found, why = find_torch(python, timeout)
    if found is None:
        sec["installed"] = None
        missing(sec, why, "installed", "version", "cuda_available", "cuda_version", "device_count", "devices")
        return sec
    sec["installed"], version = found
    if not sec["installed"]:
        missing(sec, "torch is not importable by %s" % python,
                "version", "cuda_available", "cuda_version", "device_count", "devices")
        return sec
    if version:
        sec["version"] = version
    else:
        missing(sec, "no package metadata for torch", "version")
    fields = ("cuda_available", "cuda_version", "device_count", "devices")
    if not run_import:
        missing(sec, "not checked: pass --torch to import torch in a subprocess (takes seconds)", *fields)
        return sec
    rc, out = run_cmd([python, "-c", TORCH_SNIPPET], timeout)
    if rc is None:
        missing(sec, "importing torch took longer than %gs" % timeout, *fields)
        return sec
    if rc != 0:
        tail = (out.strip().splitlines() or ["no output"])[-1]
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
        measured = core.nearest_existing(full)
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

def disk_reasons(role, path, min_free_gb, min_free_inodes):
    """The toolkit's disk gate (core.disk_gate, one inode floor) on one role's directory, as reasons."""
    inode_floor = core.DEFAULT_MIN_FREE_INODES if min_free_inodes is None else min_free_inodes
    floor_flag = "--min-free-inodes" if min_free_inodes is not None else \
        "the toolkit's inode floor; --min-free-inodes changes it"
    _, checks = core.disk_gate([os.path.expanduser(path)], min_free_gb or 0, inode_floor)
    out = []
    for check in checks:
        if check["status"] == core.FAIL:
            out.append("%s dir %s: %s; cannot verify the disk gate" % (role, path, check["line"]))
            continue
        if check.get("low_bytes"):
            out.append("%s dir %s: %.1f GiB free < %g GiB required (--min-free-gb); free space or pick a "
                       "bigger volume" % (role, path, check["free_bytes"] / GIB, min_free_gb))
        if check.get("low_inodes"):
            out.append("%s dir %s: %d inodes free < %d required (%s); pack small files into shards or "
                       "archives, or use another volume" % (role, path, check["free_inodes"], inode_floor,
                                                              floor_flag))
    return out


def evaluate_gate(report, args):
    reasons = []
    checks = []
    disks = report["disk_paths"]
    gated_roles = [r for r in ("data", "durable") if disks.get(r, {}).get("path")]
    if args.min_free_gb is not None or args.min_free_inodes is not None:
        checks += (["min_free_gb"] if args.min_free_gb is not None else []) + ["min_free_inodes"]
        for role in gated_roles:
            reasons += disk_reasons(role, disks[role]["path"], args.min_free_gb, args.min_free_inodes)
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


def na(value):
    return "n/a" if value is None else value


def fmt_gib(num):
    return "?" if num is None else "%.1f GiB" % (num / GIB)


def summary_lines(report):
    lines = []
    tools = report["tools"]
    lines.append(("OK", "python %s (%s)" % (tools["python"]["version"], tools["python"]["executable"])))
    gpus = report["gpus"]
    if gpus["count"]:
        for d in gpus["devices"]:
            util = "n/a" if d["utilization_pct"] is None else "%s%%" % d["utilization_pct"]  # [N/A] on MIG
            lines.append(("OK", "gpu %s %s: %s/%s MiB used, util %s, driver %s, CUDA %s" % (
                d["index"], d["name"], na(d["memory_used_mib"]), na(d["memory_total_mib"]), util,
                na(d["driver_version"]), gpus["cuda_version"] or "?")))
    else:
        lines.append(("WARN", "gpu: none usable (%s)" % (gpus["unavailable"].get("count") or "0 GPUs listed")))
    torch = report["torch"]
    if torch["installed"]:
        extra = "cuda_available=%s" % torch["cuda_available"] if torch["cuda_available"] is not None \
            else "CUDA not checked (--torch)"
        lines.append(("OK", "torch %s, %s (%s)" % (torch["version"] or "?", extra, torch.get("python"))))
    else:
        lines.append(("WARN", "torch: %s" % (torch["unavailable"].get("installed") or
                                             "not importable by %s" % torch.get("python"))))
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


# ---------------------------------------------------------------------------- main

def non_negative(kind, below=float("inf")):
    return core.arg_number(kind, 0, below)


def build_parser():
    p = core.Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog=core.exit_codes_epilog(__doc__))
    p.add_argument("--json", action="store_true", help="print the full report as JSON on stdout")
    p.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE (atomic; '-' = stdout)")
    p.add_argument("--profile", metavar="NAME", help="take DATA_DIR/DURABLE_DIR defaults from this profile")
    p.add_argument("--data-dir", metavar="DIR", help="data/scratch directory (default $DATA_DIR or profile)")
    p.add_argument("--durable-dir", metavar="DIR", help="durable directory (default $DURABLE_DIR or profile)")
    p.add_argument("--path", action="append", default=[], metavar="DIR", help="extra path to measure (repeatable)")
    p.add_argument("--torch", action="store_true", help="import torch in a subprocess to read its CUDA view")
    p.add_argument("--python", metavar="PATH", help="the job's python (a venv's bin/python): torch is checked "
                                                   "there, not in the probe's own python")
    p.add_argument("--torch-timeout", type=non_negative(float, 1e9), default=60.0, metavar="S",
                   help="timeout for the torch subprocess (default 60)")
    p.add_argument("--gpu-timeout", type=non_negative(float, 1e9), default=8.0, metavar="S",
                   help="timeout for each nvidia-smi call (default 8)")
    p.add_argument("--network", action="store_true", help="TCP connect (port 443, nothing sent) to the default "
                                                         "targets: %s" % ", ".join(DEFAULT_TARGETS))
    p.add_argument("--network-target", action="append", default=[], metavar="HOST[:PORT]",
                   help="target to check instead of the defaults (repeatable; implies --network)")
    p.add_argument("--network-timeout", type=non_negative(float, 1e9), default=4.0, metavar="S",
                   help="timeout for each reachability check (default 4)")
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
    if args.profile is not None:
        defaults = core.load_profile(args.profile).get("defaults") or {}
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
            there = core.nearest_existing(os.path.expanduser(out[role]))
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
    if args.out == "":
        raise UsageError("--out is empty (give a file name, or '-' for stdout)")
    if args.out and args.out != "-":
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise UsageError("--out %s: directory %s is missing or not writable" % (args.out, folder))
        core.check_replaceable(args.out)  # never replace /dev/null, a FIFO or a symlink (finding 5)

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
        "probed_at": core.utc_iso(),
        "host": socket.gethostname(),
        "profile": args.profile,
        "profile_defaults": {k: defaults.get(k) for k in ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "DISK_FLOOR_GB")}
        if args.profile else None,
        "gpus": probe_gpus(args.gpu_timeout),
        "torch": probe_torch(args.torch, args.torch_timeout, job_python(args.python)),
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


def build_gate_parser():
    p = core.Parser(prog="node_probe.py disk-gate",
                    description="The toolkit's disk gate on each PATH's filesystem (rgt_core.disk_gate).",
                    epilog=core.exit_codes_epilog(ok="every check passed", fail=None,
                                                  refused="refused (reasons on stdout and stderr)"))
    p.add_argument("paths", nargs="+", metavar="PATH", help="a directory (or a file) whose filesystem is gated")
    p.add_argument("--min-free-gb", type=non_negative(float), default=core.DEFAULT_DISK_FLOOR_GB, metavar="N",
                   help="GiB that must be free (default %g, the toolkit's one floor, as run_one.sh and run_queue.sh "
                        "use: a bare gate refuses where a launch would; it was 0 before 2026-12; 0 turns the byte "
                        "check off)" % core.DEFAULT_DISK_FLOOR_GB)
    p.add_argument("--min-free-inodes", type=non_negative(int), default=core.DEFAULT_MIN_FREE_INODES, metavar="N",
                   help="free inodes required (default %d, the toolkit's one floor)" % core.DEFAULT_MIN_FREE_INODES)
    p.add_argument("--writable", action="append", default=[], metavar="DIR",
                   help="a file must be creatable and removable in DIR (repeatable)")
    p.add_argument("--json", action="store_true", help="print {ok, status, checks} as JSON on stdout")
    return p


def gate_line(check):
    """One line per check, with the floor it is under named: what the queue and the launcher print."""
    if check["status"] != core.REFUSED or "low_bytes" not in check:
        return check["line"]
    parts = []
    if check["low_bytes"]:
        parts.append("%.2f GiB free, below the floor of %g GiB" % (check["free_bytes"] / GIB, check["min_free_gb"]))
    if check["low_inodes"]:
        parts.append("%d free inodes, below the floor of %d" % (check["free_inodes"], check["min_free_inodes"]))
    return "REFUSED disk %s (measured at %s): %s" % (check["path"], check["measured_at"], "; ".join(parts))


def disk_gate_main(argv):
    args = build_gate_parser().parse_args(argv)
    if any(not p for p in args.paths + args.writable):
        raise UsageError("an empty path was given")
    ok, checks = core.disk_gate(args.paths, args.min_free_gb, args.min_free_inodes, writable=args.writable)
    for check in checks:
        check["line"] = gate_line(check)
        check.pop("dev", None)
    status = core.OK if ok else (core.FAIL if any(c["status"] == core.FAIL for c in checks) else core.REFUSED)
    if args.json:
        core.emit_json({"ok": ok, "status": status, "checks": checks})
    else:
        for check in checks:
            print(check["line"])
    for check in checks:
        if check["status"] != core.OK:
            core.say_error(check["line"])
    return core.EXIT_OK if ok else core.EXIT_REFUSED


def main(argv=None):
    core.check_toolkit()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["disk-gate"]:
        return disk_gate_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.out == "-":
        args.out, args.json = None, True  # '-' is stdout: the report is printed once
    report = run(args)
    text = core.dumps(report)
    if args.out:
        try:
            core.atomic_write(args.out, text)
        except OSError as exc:
            raise UsageError("cannot write --out %s: %s" % (args.out, exc.strerror or exc))
    if args.json:
        sys.stdout.write(text)
    else:
        for word, msg in summary_lines(report):
            print("%-4s %s" % (word, msg))
    for reason in report["gate"]["reasons"]:
        print("REFUSED: %s" % reason, file=sys.stderr)
    return core.EXIT_OK if report["gate"]["passed"] else core.EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(core.run_main(main))
