#!/usr/bin/env python3
"""Pull a run's results off a node with rsync, verify every byte, then promote them atomically.

Local side, standard library only (plus the rsync program; ssh for remote sources). The node must
hold a manifest written by build_pull_manifest.py. Nothing reaches DEST/<run_id>/ unless every file
listed in it is present with the right size and SHA-256 and nothing else is present.

Usage:
  pull_verified.py --source [HOST:]ROOT --dest DIR [--rsh "ssh -F cfg"] [--manifest NAME]
                   [--jobs N] [--bwlimit KBPS] [--fresh] [--json]

  python3 pull_verified.py --source gpu-box:/workspace/durable/results/run-42 --dest ./pulled
  python3 pull_verified.py --source /mnt/nfs/results/run-42 --dest ./pulled      # a local path

What it does, in order:
  1. fetches the manifest (ssh HOST cat, or reads the local file; NAME is relative to ROOT unless
     absolute, default PULL_MANIFEST.json) and validates it BEFORE copying anything: schema, run id,
     sizes, hashes, and every path (absolute, '..', '.', empty components, backslash, NUL/control
     characters, duplicates, a path that is also another's parent, reserved names are all refused);
  2. rsyncs exactly the listed files (--files-from, symlinks copied as content) into
     DEST/.staging-<run_id>/ with --partial-dir=.rsync-partial, so a re-run after Ctrl-C, a dropped
     connection or a crash continues from the bytes already there;
  3. verifies the staging tree in parallel: missing, extra, truncated or oversized files, changed
     bytes, symlinks and special files each get their own FAIL line naming the file. Files that fail
     are moved into .rsync-partial so the next run re-fetches only the blocks that differ;
  4. on success writes PULL_MANIFEST.json (the fetched bytes) and PULL_VERIFIED.json into staging
     and renames staging to DEST/<run_id>/ in one step.

If DEST/<run_id>/ exists already: the same files (same manifest) -> exit 0, nothing done; anything
else -> exit 3, nothing overwritten. One pull per run id at a time (a lock file in DEST).

Output: one line per problem (FAIL <code>: <path>: <detail>) and a verdict on stdout, or --json;
rsync's progress and hashing progress on stderr when stderr is a terminal.

Exit codes:
  0    verified and promoted, or already present with the same files
  1    a check failed (manifest unsafe or unreadable, transfer failed, verification failed, another
       pull running); staging is kept for the next run, nothing is promoted
  2    usage or bad environment (bad flags or --source, rsync missing, DEST not creatable)
  3    refused: DEST/<run_id>/ exists with different or damaged content
  130  interrupted (Ctrl-C / SIGTERM); re-run the same command to continue
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SCHEMA = "rgt-pull-manifest/1"
VERIFIED_SCHEMA = "rgt-pull-verified/1"
MANIFEST_NAME = "PULL_MANIFEST.json"
VERIFIED_NAME = "PULL_VERIFIED.json"
RESERVED_TOP = (MANIFEST_NAME, VERIFIED_NAME)
PARTIAL_DIR = ".rsync-partial"
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
STAMP_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")
RSYNC_TEMP_RE = re.compile(r"^\.(.+)\.[A-Za-z0-9]{6}$")
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
BUFFER = 1024 * 1024  # see bench_manifest.py
MAX_REPORTED = 50


class UsageError(Exception):
    """Exit 2."""


class FetchError(Exception):
    """The manifest could not be fetched (exit 1)."""


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived (exit 130)."""


def problem(code: str, path: str, detail: str) -> dict:
    return {"code": code, "path": path, "detail": detail}


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def human(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024.0
    return f"{count:.1f} TiB"


# ---------------------------------------------------------------- sources and fetching

def parse_source(text: str):
    """'[user@]host:/path' -> (host, path); anything without a colon before the first '/' is local."""
    if not text:
        raise UsageError("--source is empty")
    if text.startswith("rsync://") or "::" in text:
        raise UsageError("rsync daemon sources are not supported; use HOST:PATH (over ssh) or a local path")
    colon, slash = text.find(":"), text.find("/")
    if colon > 0 and (slash < 0 or colon < slash):
        host, root = text[:colon], text[colon + 1:]
        if host.startswith("-") or any(ch.isspace() for ch in host):
            raise UsageError(f"--source host {host!r} is not a usable ssh destination")
        if not root:
            raise UsageError("--source HOST: needs the result root after the colon (HOST:/path/to/results)")
        return host, root
    if colon == 0:
        raise UsageError(f"--source {text!r} has an empty host before ':'")
    return None, text


def source_label(host, root) -> str:
    return f"{host}:{root}" if host else os.path.abspath(os.path.expanduser(root))


def remote_quote(path: str) -> str:
    """Quote a path for the remote shell, keeping a leading ~/ expandable."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def join_root(root: str, name: str) -> str:
    if name.startswith("/") or name.startswith("~"):
        return name
    return root.rstrip("/") + "/" + name if root.rstrip("/") else "/" + name


def rsh_argv(rsh) -> list:
    if rsh is None:
        return ["ssh"]
    try:
        argv = shlex.split(rsh)
    except ValueError as exc:
        raise UsageError(f"--rsh {rsh!r} cannot be split into arguments: {exc}")
    if not argv:
        raise UsageError("--rsh is empty")
    return argv


def fetch_manifest(host, root: str, name: str, rsh, timeout: float = 600.0) -> bytes:
    """Return the manifest's raw bytes, or raise FetchError with a reason a person can act on."""
    path = join_root(root, name)
    if host is None:
        local = os.path.expanduser(path)
        try:
            with open(local, "rb") as handle:
                data = handle.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise FetchError(f"no manifest at {local}; build it on the node with build_pull_manifest.py")
        except OSError as exc:
            raise FetchError(f"cannot read {local}: {exc.strerror or exc}")
    else:
        argv = rsh_argv(rsh) + [host, "cat -- " + remote_quote(path)]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=timeout)
        except FileNotFoundError:
            raise FetchError(f"cannot run {argv[0]!r} (from --rsh)")
        except subprocess.TimeoutExpired:
            raise FetchError(f"fetching {host}:{path} took longer than {timeout:.0f} s")
        tail = (done.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
        if done.returncode == 255:
            raise FetchError(f"ssh to {host} failed: {tail or 'exit 255'} (check the host alias, key, --rsh)")
        if done.returncode != 0:
            raise FetchError(f"cannot read {path} on {host}: {tail or 'exit %d' % done.returncode}; "
                             "build it there with build_pull_manifest.py")
        data = done.stdout
    if len(data) > MAX_MANIFEST_BYTES:
        raise FetchError(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes; refusing to parse it")
    return data


# ---------------------------------------------------------------- manifest validation

def path_problem(path):
    """Why a manifest path is unsafe or malformed, or None when it is fine."""
    if not isinstance(path, str) or not path:
        return "path is empty or not a string"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "absolute path; manifest paths must be relative to the root"
    if "\\" in path:
        return "contains a backslash (a Windows separator or an escape); refusing to guess"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return "contains a control character (newline, tab ...)"
    parts = path.split("/")
    if ".." in parts:
        return "has a '..' component that would write outside the destination"
    if "" in parts or "." in parts:
        return "has an empty or '.' component (not in normal form)"
    if path in RESERVED_TOP:
        return "is a reserved name (the puller writes this file itself)"
    if PARTIAL_DIR in parts:
        return f"uses the reserved resume directory name {PARTIAL_DIR}"
    return None


def parse_manifest(raw: bytes):
    """Validate structure and every path. Returns (manifest or None, problems)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, [problem("manifest", "<manifest>", f"not valid UTF-8 JSON: {exc}")]
    if not isinstance(data, dict):
        return None, [problem("manifest", "<manifest>", "top level is not a JSON object")]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(problem("manifest", "schema", f"expected {SCHEMA!r}, found {data.get('schema')!r}"))
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        problems.append(problem("manifest", "run_id", f"{run_id!r} is not a safe run id (letters, digits, . _ -)"))
    if not isinstance(data.get("created_at"), str) or not STAMP_RE.match(data["created_at"]):
        problems.append(problem("manifest", "created_at", "missing or not ISO-8601 UTC (YYYY-MM-DDTHH:MM:SSZ)"))
    roster = data.get("roster")
    if not isinstance(roster, list) or not roster or not all(isinstance(r, str) and r for r in roster):
        problems.append(problem("manifest", "roster", "must be a non-empty list of globs"))
    files = data.get("files")
    if not isinstance(files, list) or not files:
        problems.append(problem("manifest", "files", "must be a non-empty list (an empty pull proves nothing)"))
        return data, problems
    first_index = {}
    total = 0
    for index, entry in enumerate(files):
        where = f"files[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"path", "size", "sha256"}:
            problems.append(problem("manifest", where, "entry must be an object with exactly path, size, sha256"))
            continue
        path = entry["path"]
        reason = path_problem(path)
        if reason:
            problems.append(problem("unsafe-path", repr(path), f"{where} {reason}"))
            continue
        size = entry["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            problems.append(problem("manifest", path, f"{where} size must be a non-negative integer"))
            continue
        if not isinstance(entry["sha256"], str) or not HEX64_RE.match(entry["sha256"]):
            problems.append(problem("manifest", path, f"{where} sha256 must be 64 lowercase hex digits"))
            continue
        if path in first_index:
            problems.append(problem("duplicate", path, f"listed twice (files[{first_index[path]}] and {where})"))
            continue
        first_index[path] = index
        total += size
    for path in first_index:
        parent = path
        while "/" in parent:
            parent = parent.rsplit("/", 1)[0]
            if parent in first_index:
                problems.append(problem("path-conflict", path, f"'{parent}' is listed as a file and as its parent"))
                break
    if not problems:
        if data.get("file_count") != len(files):
            problems.append(problem("manifest", "file_count",
                                    f"says {data.get('file_count')!r}, files lists {len(files)}"))
        if data.get("total_bytes") != total:
            problems.append(problem("manifest", "total_bytes",
                                    f"says {data.get('total_bytes')!r}, sizes sum to {total}"))
    return data, problems


def file_set(manifest: dict) -> set:
    return {(e["path"], e["size"], e["sha256"]) for e in manifest["files"]}


# ---------------------------------------------------------------- hashing and verification

_local = threading.local()


def hash_file(path: str, on_bytes=None) -> str:
    view = getattr(_local, "view", None)
    if view is None:
        view = _local.view = memoryview(bytearray(BUFFER))
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            while True:
                count = handle.readinto(view)
                if not count:
                    break
                digest.update(view[:count])
                if on_bytes is not None:
                    on_bytes(count)
    finally:
        os.close(fd)
    return digest.hexdigest()


class Progress:
    """Bytes-done meter on stderr: a live line on a TTY, a line every 15 s otherwise."""

    def __init__(self, label: str, total: int, enabled: bool = True):
        self.label, self.total, self.done = label, total, 0
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self.start = self.last = time.monotonic()
        self.interval = 0.25 if self.tty else 15.0
        self.printed = False

    def add(self, count: int):
        with self.lock:
            self.done += count
            now = time.monotonic()
            if self.enabled and now - self.last >= self.interval:
                self.last = now
                rate = self.done / max(now - self.start, 1e-9)
                line = f"{self.label}: {human(self.done)}/{human(self.total)}, {human(rate)}/s"
                sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else (line + "\n"))
                sys.stderr.flush()
                self.printed = True

    def close(self):
        if self.printed and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def scan_tree(root: str, skip_partial: bool):
    """Map every plain file under root to its size; symlinks and special files are problems."""
    files, problems = {}, []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except OSError as exc:
            problems.append(problem("unreadable", rel_dir or ".", f"cannot list directory: {exc.strerror}"))
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if not rel_dir and entry.name in RESERVED_TOP:
                continue
            if entry.is_symlink():
                problems.append(problem("symlink", rel,
                                        "a symlink in the pulled tree; pulled data must be plain files"))
            elif entry.is_dir(follow_symlinks=False):
                if not (skip_partial and entry.name == PARTIAL_DIR):
                    stack.append(rel)
            elif entry.is_file(follow_symlinks=False):
                files[rel] = entry.stat(follow_symlinks=False).st_size
            else:
                problems.append(problem("special", rel, "a FIFO, socket or device where a file should be"))
    return files, problems


def verify_tree(root: str, manifest: dict, jobs: int, skip_partial: bool = True, label: str = "verifying"):
    """Compare a directory with the manifest. Returns (problems, bytes hashed)."""
    actual, problems = scan_tree(root, skip_partial)
    expected = {e["path"]: e for e in manifest["files"]}
    for rel in sorted(set(actual) - set(expected)):
        problems.append(problem("extra", rel, "present but not in the manifest (left from an earlier pull or "
                                              "added by hand); delete it, or re-run with --fresh"))
    flagged = {p["path"] for p in problems}
    for rel in sorted(set(expected) - set(actual)):
        if rel in flagged:
            continue
        problems.append(problem("missing", rel, "in the manifest but not here (deleted or renamed on the node "
                                                "after the manifest was built, or the transfer failed)"))
    to_hash = []
    for rel in sorted(set(expected) & set(actual)):
        want, have = expected[rel]["size"], actual[rel]
        if have < want:
            problems.append(problem("truncated", rel, f"{have} of {want} bytes (cut off, or still being written "
                                                      "on the node)"))
        elif have > want:
            problems.append(problem("size", rel, f"{have} bytes, the manifest says {want} (changed after the "
                                                 "manifest was built?)"))
        else:
            to_hash.append(rel)
    total = sum(expected[r]["size"] for r in to_hash)
    meter = Progress(label, total)
    to_hash.sort(key=lambda r: -expected[r]["size"])

    def work(rel):
        try:
            return rel, hash_file(os.path.join(root, rel), meter.add), None
        except OSError as exc:
            return rel, "", exc.strerror or str(exc)

    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(to_hash) or 1)))
    futures = [pool.submit(work, rel) for rel in to_hash]
    try:
        for future in futures:
            rel, digest, error = future.result()
            if error:
                problems.append(problem("unreadable", rel, error))
            elif digest != expected[rel]["sha256"]:
                problems.append(problem("sha256", rel, "content differs from the manifest (flipped or changed "
                                                       f"bytes; got {digest[:12]}..., want "
                                                       f"{expected[rel]['sha256'][:12]}...)"))
    finally:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
    meter.close()
    order = {"unsafe-path": 0, "missing": 1, "truncated": 2, "size": 3, "sha256": 4, "extra": 5}
    problems.sort(key=lambda p: (order.get(p["code"], 9), p["path"]))
    return problems, total


# ---------------------------------------------------------------- files and rsync

def fsync_dir(path: str):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def adopt_rsync_leftovers(staging: str, paths) -> int:
    """rsync temp files (.NAME.XXXXXX) left by a kill -9 become resume bases in .rsync-partial."""
    by_dir = {}
    for rel in paths:
        head, _, name = rel.rpartition("/")
        by_dir.setdefault(head, set()).add(name)
    listed = set(paths)
    adopted = 0
    for head, names in by_dir.items():
        directory = os.path.join(staging, head) if head else staging
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            match = RSYNC_TEMP_RE.match(entry.name)
            rel = f"{head}/{entry.name}" if head else entry.name
            if not match or match.group(1) not in names or rel in listed:
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            partial = os.path.join(directory, PARTIAL_DIR, match.group(1))
            if os.path.exists(partial):
                os.unlink(entry.path)
            else:
                os.makedirs(os.path.dirname(partial), exist_ok=True)
                os.replace(entry.path, partial)
                os.chmod(partial, 0o644)  # rsync's temp files are private (0600); do not inherit that
                adopted += 1
    return adopted


def park_bad_files(staging: str, problems) -> None:
    """Move files that failed size/hash checks to .rsync-partial: kept, and reused as rsync bases."""
    for item in problems:
        if item["code"] not in ("truncated", "size", "sha256"):
            continue
        head, _, name = item["path"].rpartition("/")
        directory = os.path.join(staging, head) if head else staging
        try:
            os.makedirs(os.path.join(directory, PARTIAL_DIR), exist_ok=True)
            os.replace(os.path.join(directory, name), os.path.join(directory, PARTIAL_DIR, name))
            item["detail"] += f"; moved to {PARTIAL_DIR}/ so the next run re-fetches only the differing blocks"
        except OSError:
            pass


def _stat_number(text: str, label: str):
    match = re.search(re.escape(label) + r":\s*([\d,.]+)", text)
    if not match:
        return None
    try:
        return int(match.group(1).replace(",", "").replace(".", ""))
    except ValueError:
        return None


class RsyncRun:
    """Run rsync in the foreground; forward its progress; survive Ctrl-C/SIGTERM by stopping it cleanly."""

    def __init__(self, argv, show_progress: bool):
        self.argv, self.show_progress = argv, show_progress
        self.proc = None

    def run(self) -> dict:
        started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        err_chunks = []
        reader = threading.Thread(target=lambda: err_chunks.append(self.proc.stderr.read()), daemon=True)
        reader.start()
        out = b""
        while True:
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            if self.show_progress:
                sys.stderr.write(chunk.decode("utf-8", "replace"))
                sys.stderr.flush()
            out = (out + chunk)[-65536:]
        rc = self.proc.wait()
        reader.join(5)
        if self.show_progress:
            sys.stderr.write("\n")
        text = out.decode("utf-8", "replace")
        err = b"".join(err_chunks).decode("utf-8", "replace").strip()
        return {"rc": rc, "seconds": round(time.monotonic() - started, 3),
                "literal_bytes": _stat_number(text, "Literal data"),
                "matched_bytes": _stat_number(text, "Matched data"),
                "files_transferred": _stat_number(text, "Number of regular files transferred"),
                "stderr_tail": err.splitlines()[-5:]}

    def stop(self, sig=signal.SIGINT):
        if self.proc is None:
            return
        try:
            self.proc.wait(3)  # a Ctrl-C reached rsync too: let it save its partial file undisturbed
        except subprocess.TimeoutExpired:
            pass
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def rsync_argv(rsync: str, host, root: str, staging: str, list_file: str, rsh, bwlimit, progress: bool):
    argv = [rsync, "--copy-links", "--times", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--from0", f"--files-from={list_file}", "--stats"]
    if bwlimit:
        argv.append(f"--bwlimit={bwlimit}")
    if progress:
        argv.append("--info=progress2")
    if host:
        # With --files-from, rsync takes a leading "~/" literally; a path without "/" is home-relative.
        remote = "." if root in ("~", "~/") else root[2:] if root.startswith("~/") else root
        argv += ["-e", rsh or "ssh", f"{host}:{remote.rstrip('/') or '/'}/"]
    else:
        argv.append(os.path.expanduser(root).rstrip("/") + "/")
    argv.append(staging.rstrip("/") + "/")
    return argv


# ---------------------------------------------------------------- existing destination

def check_existing(final: str, raw_sha: str, manifest: dict):
    """DEST/<run_id> exists: (0, msg) when it holds these very files, else (3, reason)."""
    marker_path = os.path.join(final, VERIFIED_NAME)
    try:
        with open(marker_path, "rb") as handle:
            marker = json.loads(handle.read().decode("utf-8"))
        with open(os.path.join(final, MANIFEST_NAME), "rb") as handle:
            kept_raw = handle.read()
    except (OSError, ValueError) as exc:
        return 3, (f"{final} exists but is not a verified pull ({VERIFIED_NAME}/{MANIFEST_NAME} unreadable: "
                   f"{getattr(exc, 'strerror', None) or exc}); refusing to overwrite - move it aside")
    kept_sha = hashlib.sha256(kept_raw).hexdigest()
    if not isinstance(marker, dict) or marker.get("manifest_sha256") != kept_sha:
        return 3, f"{final}: {VERIFIED_NAME} does not match the {MANIFEST_NAME} kept there; refusing to overwrite"
    same = kept_sha == raw_sha
    if not same:
        kept, kept_problems = parse_manifest(kept_raw)
        same = not kept_problems and file_set(kept) == file_set(manifest)
    if not same:
        return 3, (f"{final} holds a different pull of run {manifest['run_id']} (its files differ from the "
                   "node's manifest); refusing to overwrite - move it aside or pull into another --dest")
    for entry in manifest["files"]:
        try:
            size = os.lstat(os.path.join(final, entry["path"])).st_size
        except OSError:
            return 3, f"{final} was verified before but {entry['path']} is gone now; move it aside and pull again"
        if size != entry["size"]:
            return 3, f"{final} was verified before but {entry['path']} changed size; move it aside and pull again"
    note = "same manifest" if kept_sha == raw_sha else "manifest rebuilt on the node, same files"
    return 0, f"ALREADY pulled and verified: {final} ({note}); nothing to do"


# ---------------------------------------------------------------- main

class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (try --help)\n")
        sys.exit(2)


def parse_args(argv):
    parser = Parser(
        description="rsync a run's results into staging, verify against the node's manifest, promote atomically.",
        epilog="Exit: 0 ok/already, 1 check failed (staging kept), 2 usage, 3 refused to overwrite, "
               "130 interrupted. Details: module docstring.")
    parser.add_argument("--source", required=True, help="[HOST:]ROOT on the node (HOST may be an ssh alias), "
                                                         "or a local path")
    parser.add_argument("--dest", required=True, help="local directory; the run lands in DEST/<run_id>/")
    parser.add_argument("--rsh", help='remote shell for rsync -e and the manifest fetch, e.g. "ssh -F cfg"')
    parser.add_argument("--manifest", default=MANIFEST_NAME,
                        help=f"manifest name relative to ROOT, or an absolute path (default {MANIFEST_NAME})")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="files verified in parallel (default: min(8, CPUs))")
    parser.add_argument("--bwlimit", type=int, help="rsync bandwidth cap in KiB/s")
    parser.add_argument("--fresh", action="store_true", help="delete this run's staging dir first (no resume)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    return parser.parse_args(argv)


def emit(args, summary: dict, lines) -> None:
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    problems = summary.get("problems", [])
    for item in problems[:MAX_REPORTED]:
        print(f"FAIL {item['code']}: {item['path']}: {item['detail']}")
    if len(problems) > MAX_REPORTED:
        print(f"FAIL ... and {len(problems) - MAX_REPORTED} more (use --json for all)")
    for line in lines:
        print(line)


def _raise_interrupt(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = {"ok": False, "status": "failed", "source": args.source, "problems": []}
    try:
        host, root = parse_source(args.source)
        if host is None and not os.path.isdir(os.path.expanduser(root)):
            raise UsageError(f"--source {root} is not a directory"
                             + ("" if os.path.exists(os.path.expanduser(root)) else " (it does not exist)"))
        if not args.manifest:
            raise UsageError("--manifest is empty")
        rsync = shutil.which("rsync")
        if not rsync:
            raise UsageError("rsync is not installed here (apt-get install rsync / brew install rsync)")
        if args.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if args.bwlimit is not None and args.bwlimit < 1:
            raise UsageError("--bwlimit must be a positive number of KiB/s")
        rsh_argv(args.rsh)
        dest = os.path.abspath(os.path.expanduser(args.dest))
        if os.path.exists(dest) and not os.path.isdir(dest):
            raise UsageError(f"--dest {dest} exists and is not a directory")
    except UsageError as exc:
        print(f"pull_verified: {exc}", file=sys.stderr)
        return 2
    summary["source"] = source_label(host, root)

    try:
        raw = fetch_manifest(host, root, args.manifest, args.rsh)
    except FetchError as exc:
        summary["problems"] = [problem("fetch", args.manifest, str(exc))]
        emit(args, summary, ["NOTHING PULLED: the manifest could not be fetched"])
        return 1
    raw_sha = hashlib.sha256(raw).hexdigest()
    manifest, problems = parse_manifest(raw)
    summary["manifest_sha256"] = raw_sha
    if problems:
        summary["problems"] = problems
        emit(args, summary, [f"NOTHING PULLED: the manifest is unsafe or malformed ({len(problems)} problem(s)); "
                             "rebuild it on the node with build_pull_manifest.py"])
        return 1

    run_id = manifest["run_id"]
    final = os.path.join(dest, run_id)
    staging = os.path.join(dest, f".staging-{run_id}")
    summary.update({"run_id": run_id, "dest": final, "file_count": manifest["file_count"],
                    "total_bytes": manifest["total_bytes"]})
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        print(f"pull_verified: cannot create --dest {dest}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if os.path.lexists(final):
        code, message = check_existing(final, raw_sha, manifest)
        summary.update({"ok": code == 0, "status": "already" if code == 0 else "refused"})
        if code:
            summary["problems"] = [problem("exists", final, message)]
        emit(args, summary, [message] if code == 0 else ["REFUSED: nothing overwritten"])
        return code

    import fcntl  # POSIX only; imported late so --help works anywhere
    lock_handle = open(os.path.join(dest, f".pull-{run_id}.lock"), "a+")
    try:
        fcntl.flock(lock_handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        summary["problems"] = [problem("busy", final, "another pull of this run is writing the same staging dir")]
        emit(args, summary, ["NOT STARTED: wait for the other pull to finish, then re-run"])
        return 1

    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    rsync_job = None
    started = time.monotonic()
    try:
        if args.fresh and os.path.isdir(staging):
            shutil.rmtree(staging)
        os.makedirs(staging, exist_ok=True)
        paths = [e["path"] for e in manifest["files"]]
        adopt_rsync_leftovers(staging, paths)
        fd, list_file = tempfile.mkstemp(dir=dest, prefix=f".pull-{run_id}.", suffix=".list")
        with os.fdopen(fd, "wb") as handle:
            # "./" keeps rsync from reading a name that starts with '#' or ';' as a comment line
            handle.write(b"".join(b"./" + p.encode("utf-8") + b"\0" for p in paths))
        try:
            show = sys.stderr.isatty() and not args.json
            rsync_job = RsyncRun(rsync_argv(rsync, host, root, staging, list_file, args.rsh, args.bwlimit, show), show)
            print(f"pulling {manifest['file_count']} files ({human(manifest['total_bytes'])}) of run {run_id} "
                  f"from {summary['source']} into {staging}", file=sys.stderr)
            transfer = rsync_job.run()
        finally:
            os.unlink(list_file)
        summary["rsync"] = transfer
        problems, _ = verify_tree(staging, manifest, args.jobs)
        if problems:
            park_bad_files(staging, problems)
            if transfer["rc"] != 0:
                problems.insert(0, problem("rsync", summary["source"], f"rsync exit {transfer['rc']}: " +
                                           " | ".join(transfer["stderr_tail"][-2:])))
            summary.update({"problems": problems, "staging": staging})
            emit(args, summary, [f"NOT PROMOTED: {len(problems)} problem(s); staging kept at {staging}. Fix the "
                                 "cause, then re-run the same command to continue (--fresh starts over)"])
            return 1
        verified = {"schema": VERIFIED_SCHEMA, "run_id": run_id, "manifest_sha256": raw_sha,
                    "file_count": manifest["file_count"], "total_bytes": manifest["total_bytes"],
                    "verified_at": utc_now(), "source": summary["source"]}
        atomic_write(os.path.join(staging, MANIFEST_NAME), raw)
        atomic_write(os.path.join(staging, VERIFIED_NAME), (json.dumps(verified, indent=2) + "\n").encode())
        for directory, subdirs, _files in os.walk(staging):
            if PARTIAL_DIR in subdirs:
                shutil.rmtree(os.path.join(directory, PARTIAL_DIR), ignore_errors=True)
                subdirs.remove(PARTIAL_DIR)
        if os.path.lexists(final):
            summary.update({"status": "refused", "problems": [problem("exists", final, "appeared during the pull")]})
            emit(args, summary, [f"REFUSED: {final} appeared while pulling; verified copy left in {staging}"])
            return 3
        os.rename(staging, final)
        fsync_dir(dest)
    except Interrupted as exc:
        if rsync_job is not None:
            rsync_job.stop()
        summary.update({"status": "interrupted", "staging": staging})
        emit(args, summary, [f"INTERRUPTED ({exc}): partial data kept in {staging}; re-run the same command to "
                             "continue"])
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lock_handle.close()
    seconds = time.monotonic() - started
    summary.update({"ok": True, "status": "promoted", "seconds": round(seconds, 3), "verified": verified})
    reused = summary["rsync"].get("matched_bytes")
    emit(args, summary, [f"OK pulled and verified run {run_id}: {manifest['file_count']} files, "
                         f"{human(manifest['total_bytes'])} -> {final} ({VERIFIED_NAME} written, "
                         f"{seconds:.1f} s" + (f", {human(reused)} reused from earlier attempts" if reused else "")
                         + ")"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
