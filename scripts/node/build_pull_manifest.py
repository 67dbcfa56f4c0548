#!/usr/bin/env python3
"""Hash an explicit roster of result files into PULL_MANIFEST.json (node side, stdlib only).

Run this ON THE NODE once the job has finished and its outputs sit in a durable directory. The
manifest binds a run id to the exact files you expect to take home (relative path, size, SHA-256);
`pull_verified.py` on your machine refuses anything that does not match it, and `teardown_gate.py`
refuses to bless a teardown until the pulled copy matches the node's current manifest.

Usage:
  build_pull_manifest.py --root DIR --roster GLOB [--roster GLOB]... [--run-id ID] [--out PATH|-]
                         [--jobs N] [--buffer-mb N] [--json]

  python3 build_pull_manifest.py --root /workspace/durable/results/run-42 \\
      --roster 'checkpoints/**/*.pt' --roster metrics.jsonl --roster final.json

Roster rules (patterns are relative to --root, POSIX separators):
  *  matches within one path component, ?  one character, [abc] a set, ** any number of components;
  unlike a shell, * and ** also match names that start with a dot, so nothing is left out silently.
  An entry that matches a directory takes every file under it. Every entry must match at least one
  file (the unmatched ones are listed by name), and an empty result is a failure, never success.

Symlinks: a link whose target stays inside --root is recorded under the LINK's path with the
TARGET's size and hash (the puller copies content, never links). A link leaving the root, a dangling
link and a link to a directory are not followed; the first two fail when selected, the last is
skipped with a note (list the real directory instead). FIFOs, sockets and devices fail when selected.
The manifest never lists itself, its temp files, or a top-level PULL_MANIFEST.json / PULL_VERIFIED.json.

Output: the manifest is written atomically to --out (default ROOT/PULL_MANIFEST.json); `--out -`
prints it on stdout and writes nothing (used by teardown_gate.py --rebuild over ssh). Progress goes to
stderr (a live line on a terminal, a line every 15 s otherwise).

Exit codes:
  0  manifest written
  1  a check failed: unmatched roster entry, empty result, symlink escape, special file, unreadable
     file, a file that changed while being hashed, an unusable file name
  2  usage or bad input: bad flags, --root is not a directory, unsafe roster pattern or run id
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SCHEMA = "rgt-pull-manifest/1"
MANIFEST_NAME = "PULL_MANIFEST.json"
RESERVED_TOP = ("PULL_MANIFEST.json", "PULL_VERIFIED.json")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
DEFAULT_BUFFER_MB = 1  # measured best by bench_manifest.py (1 vs 4 vs 8 MiB, warm cache)
MAX_REPORTED = 50


class UsageError(Exception):
    """Bad flags or bad input: exit 2."""


# ---------------------------------------------------------------- roster patterns

def _segment_regex(segment: str) -> str:
    """Regex for one path component of a glob (no slashes inside)."""
    out = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            start = i + 1
            if segment[start:start + 1] in ("!", "^"):
                start += 1
            if segment[start:start + 1] == "]":
                start += 1
            close = segment.find("]", start)
            if close < 0:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1:close]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = "".join("\\" + c if c in "\\^[]" else c for c in body)
                out.append("[" + ("^/" if negate else "") + body + "]")
                i = close
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def check_pattern(pattern: str) -> str:
    """Normalise a roster/glob entry or raise UsageError saying what is wrong with it."""
    text = pattern.strip()
    while text.startswith("./"):
        text = text[2:]
    text = text.rstrip("/")
    if not text:
        raise UsageError(f"roster entry {pattern!r} is empty")
    if text.startswith("/"):
        raise UsageError(f"roster entry {pattern!r} is absolute; give it relative to --root")
    if "\\" in text or "\x00" in text:
        raise UsageError(f"roster entry {pattern!r} contains a backslash or NUL; use POSIX '/' separators")
    parts = text.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UsageError(f"roster entry {pattern!r} has an empty, '.' or '..' component")
    return text


def compile_pattern(pattern: str):
    """Compile a normalised glob with ** support into a regex matched against whole relative paths."""
    parts = pattern.split("/")
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _segment_regex(part) + ("" if last else "/")
    return re.compile(regex, re.DOTALL)


def ancestors_and_self(rel: str):
    """'a/b/c' -> ['a/b/c', 'a/b', 'a'] (the path, then each parent directory)."""
    out = [rel]
    while "/" in rel:
        rel = rel.rsplit("/", 1)[0]
        out.append(rel)
    return out


# ---------------------------------------------------------------- walking the root

def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"


def _inside(root_real: str, target: str) -> bool:
    return target == root_real or target.startswith(root_real.rstrip("/") + "/")


def name_problem(rel: str):
    """Why a relative path cannot go into a manifest, or None."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8; rename it"
    if "\\" in rel:
        return "file name contains a backslash; rename it (the puller refuses backslashes)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in rel):
        return "file name contains a control character (newline, tab ...); rename it"
    return None


def walk_root(root_real: str, skip: set):
    """Yield (rel, kind, detail, real_path) for every non-directory entry under root.

    kind: file | link-file (target inside root) | link-dir | escape | dangling | special.
    Directories are descended without following symlinks.
    """
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = os.path.join(root_real, rel_dir) if rel_dir else root_real
        try:
            entries = list(os.scandir(abs_dir))
        except OSError as exc:
            yield rel_dir or ".", "unreadable", f"cannot list directory: {exc.strerror}", None
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in skip:
                continue
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(root_real, target):
                        yield rel, "escape", f"symlink resolves outside the root (to {target})", None
                        continue
                    try:
                        mode = os.stat(entry.path).st_mode
                    except OSError as exc:
                        yield rel, "dangling", f"symlink target is unreadable or missing: {exc.strerror}", None
                        continue
                    if stat.S_ISREG(mode):
                        yield rel, "link-file", "", target
                    elif stat.S_ISDIR(mode):
                        yield rel, "link-dir", "symlinked directory not followed; list its real path", None
                    else:
                        yield rel, "special", f"symlink to a {_special_kind(mode)}", None
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    yield rel, "file", "", entry.path
                else:
                    mode = entry.stat(follow_symlinks=False).st_mode
                    yield rel, "special", f"{_special_kind(mode)} cannot be pulled", None
            except OSError as exc:
                yield rel, "unreadable", exc.strerror or str(exc), None


# ---------------------------------------------------------------- hashing

_local = threading.local()


def _scratch(size: int) -> memoryview:
    view = getattr(_local, "view", None)
    if view is None or len(view) != size:
        view = memoryview(bytearray(size))
        _local.view = view
    return view


def hash_file(path: str, bufsize: int, on_bytes=None):
    """Stream one regular file through SHA-256. Returns (size, hexdigest); raises OSError/ValueError."""
    digest = hashlib.sha256()
    view = _scratch(bufsize)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise ValueError("not a regular file any more")
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
        total = 0
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            while True:
                count = handle.readinto(view)
                if not count:
                    break
                digest.update(view[:count])
                total += count
                if on_bytes is not None:
                    on_bytes(count)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if total != after.st_size or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise ValueError("file changed while it was being hashed (is the job still writing?)")
    return total, digest.hexdigest()


class Progress:
    """Byte counter that reports on stderr: a live line on a TTY, a line every 15 s otherwise."""

    def __init__(self, label: str, total_bytes: int, total_files: int, enabled: bool = True):
        self.label, self.total, self.files_total = label, total_bytes, total_files
        self.done = 0
        self.files_done = 0
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self.start = time.monotonic()
        self.last = self.start
        self.interval = 0.25 if self.tty else 15.0
        self.printed = False

    def add(self, count: int, file_done: bool = False):
        with self.lock:
            self.done += count
            self.files_done += 1 if file_done else 0
            now = time.monotonic()
            if self.enabled and now - self.last >= self.interval and now - self.start >= 1.0:
                self.last = now
                self._emit(now)

    def _emit(self, now: float):
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        line = (f"{self.label}: {self.files_done}/{self.files_total} files, {human(self.done)}/"
                f"{human(self.total)}, {human(rate)}/s")
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.printed = True

    def close(self):
        if self.enabled and self.printed and self.tty:
            self._emit(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


def human(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024.0
    return f"{count:.1f} TiB"


# ---------------------------------------------------------------- building

def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def select(root_real: str, patterns, skip):
    """Apply the roster. Returns (chosen {rel: real_path}, problems, notes, unmatched patterns)."""
    compiled = [(p, compile_pattern(p)) for p in patterns]
    hits = {p: 0 for p in patterns}
    skipped_hits = {p: 0 for p in patterns}
    chosen, problems, notes = {}, [], []
    for rel, kind, detail, real in walk_root(root_real, skip):
        candidates = ancestors_and_self(rel)
        matching = [p for p, rx in compiled if any(rx.fullmatch(c) for c in candidates)]
        if not matching:
            continue
        if kind == "link-dir":
            for p in matching:
                skipped_hits[p] += 1
            notes.append({"path": rel, "reason": detail})
            continue
        for p in matching:
            hits[p] += 1
        if kind in ("file", "link-file"):
            bad_name = name_problem(rel)
            if bad_name:
                problems.append({"code": "bad-name", "path": rel, "detail": bad_name})
            else:
                chosen[rel] = real
        else:
            problems.append({"code": kind, "path": rel, "detail": detail})
    unmatched = []
    for p in patterns:
        if hits[p] == 0:
            hint = " (it matched only symlinked directories, which are not followed)" if skipped_hits[p] else ""
            unmatched.append(p)
            problems.append({"code": "unmatched", "path": p,
                             "detail": "roster entry matches no file under the root" + hint})
    return chosen, problems, notes, unmatched


def hash_all(chosen: dict, jobs: int, bufsize: int, progress: Progress):
    """Hash every chosen file in parallel. Returns (entries sorted by path, problems)."""
    sizes = {}
    for rel, real in chosen.items():
        try:
            sizes[rel] = os.stat(real).st_size
        except OSError:
            sizes[rel] = 0
    progress.total = sum(sizes.values())
    order = sorted(chosen, key=lambda r: -sizes[r])  # big files first balances the workers

    def work(rel):
        try:
            size, hexdigest = hash_file(chosen[rel], bufsize, progress.add)
            progress.add(0, file_done=True)
            return rel, size, hexdigest, None
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return rel, 0, "", reason

    entries, problems = [], []
    workers = max(1, min(jobs, len(order)))
    pool = ThreadPoolExecutor(max_workers=workers)
    futures = [pool.submit(work, rel) for rel in order]
    try:
        for future in futures:
            rel, size, hexdigest, reason = future.result()
            if reason:
                problems.append({"code": "unreadable", "path": rel, "detail": reason})
            else:
                entries.append({"path": rel, "size": size, "sha256": hexdigest})
    finally:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
    entries.sort(key=lambda e: e["path"])
    return entries, problems


def atomic_write(path: str, data: bytes):
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
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
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def build(root: str, patterns, run_id: str, out, jobs: int, bufsize: int, progress_enabled: bool = True):
    """Build the manifest dict. Returns (manifest or None, problems, notes)."""
    root_real = os.path.realpath(root)
    skip = set(RESERVED_TOP)
    if out is not None:
        out_real = os.path.realpath(out)
        if _inside(root_real, out_real) and out_real != root_real:
            out_rel = out_real[len(root_real.rstrip("/")) + 1:]
            skip.add(out_rel)
            out_dir = os.path.dirname(out_real)
            tmp_prefix = f".{os.path.basename(out_real)}."
            try:
                for name in os.listdir(out_dir):
                    if name.startswith(tmp_prefix) and name.endswith(".tmp"):
                        rel_dir = os.path.dirname(out_rel)
                        skip.add(f"{rel_dir}/{name}" if rel_dir else name)
            except OSError:
                pass
    chosen, problems, notes, _ = select(root_real, patterns, skip)
    if problems:
        return None, problems, notes
    if not chosen:
        return None, [{"code": "empty", "path": ".", "detail": "the roster selected no files"}], notes
    progress = Progress("hashing", 0, len(chosen), enabled=progress_enabled)
    entries, hash_problems = hash_all(chosen, jobs, bufsize, progress)
    progress.close()
    if hash_problems:
        return None, hash_problems, notes
    manifest = {
        "schema": SCHEMA,
        "run_id": run_id,
        "created_at": utc_now(),
        "roster": list(patterns),
        "file_count": len(entries),
        "total_bytes": sum(e["size"] for e in entries),
        "files": entries,
    }
    return manifest, [], notes


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (try --help)\n")
        sys.exit(2)


def parse_args(argv):
    parser = Parser(
        description="Hash an explicit roster of result files into a pull manifest (run on the node).",
        epilog="Exit: 0 written, 1 a check failed, 2 usage/bad input. Details: module docstring.")
    parser.add_argument("--root", required=True, help="durable directory holding the results")
    parser.add_argument("--roster", action="append", required=True, metavar="GLOB",
                        help="expected file or glob relative to --root (repeat; ** allowed)")
    parser.add_argument("--run-id", help="run id (default: $RGT_RUN_ID, else the root's directory name)")
    parser.add_argument("--out", help=f"manifest path (default ROOT/{MANIFEST_NAME}); '-' prints to stdout")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="files hashed in parallel (default: min(8, CPUs))")
    parser.add_argument("--buffer-mb", type=float, default=DEFAULT_BUFFER_MB,
                        help=f"read buffer per worker in MiB (default {DEFAULT_BUFFER_MB})")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    to_stdout = args.out == "-"
    report = sys.stderr if to_stdout else sys.stdout
    try:
        root = os.path.expanduser(args.root)
        if not os.path.isdir(root):
            raise UsageError(f"--root {args.root!r} is not a directory")
        patterns = []
        for raw in args.roster:
            pattern = check_pattern(raw)
            if pattern not in patterns:
                patterns.append(pattern)
        run_id = args.run_id or os.environ.get("RGT_RUN_ID") or os.path.basename(os.path.realpath(root))
        if not RUN_ID_RE.match(run_id):
            raise UsageError(f"run id {run_id!r} is unusable as a directory name; use letters, digits, . _ -")
        if args.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if not 0.0625 <= args.buffer_mb <= 256:
            raise UsageError("--buffer-mb must be between 0.0625 and 256")
        if args.out == "":
            raise UsageError("--out is empty (give a file name, or '-' for stdout)")
        out = None if to_stdout else os.path.expanduser(args.out or os.path.join(root, MANIFEST_NAME))
        if out is not None and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
            raise UsageError(f"--out directory does not exist: {os.path.dirname(os.path.abspath(out))}")
        if out is not None and os.path.isdir(out):
            raise UsageError(f"--out {out} is a directory; give the manifest's file name")
    except UsageError as exc:
        print(f"build_pull_manifest: {exc}", file=sys.stderr)
        return 2

    started = time.monotonic()
    manifest, problems, notes = build(root, patterns, run_id, out, args.jobs, int(args.buffer_mb * 1024 * 1024))
    seconds = time.monotonic() - started
    for note in notes:
        print(f"NOTE skipped {note['path']}: {note['reason']}", file=sys.stderr)
    if problems:
        if args.json and not to_stdout:
            print(json.dumps({"ok": False, "run_id": run_id, "problems": problems, "notes": notes}, indent=2))
        else:
            for item in problems[:MAX_REPORTED]:
                print(f"FAIL {item['code']}: {item['path']}: {item['detail']}", file=report)
            if len(problems) > MAX_REPORTED:
                print(f"FAIL ... and {len(problems) - MAX_REPORTED} more problems", file=report)
            print(f"NO MANIFEST written ({len(problems)} problem(s)); fix the roster or the files and re-run",
                  file=report)
        return 1

    data = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    if to_stdout:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        try:
            atomic_write(out, data)
        except OSError as exc:
            print(f"FAIL write: {out}: {exc.strerror or exc}", file=report)
            return 1
    rate = manifest["total_bytes"] / max(seconds, 1e-9)
    summary = {"ok": True, "out": "-" if to_stdout else os.path.abspath(out), "run_id": run_id,
               "file_count": manifest["file_count"], "total_bytes": manifest["total_bytes"],
               "manifest_sha256": hashlib.sha256(data).hexdigest(), "seconds": round(seconds, 3),
               "bytes_per_second": round(rate), "notes": notes}
    if args.json and not to_stdout:
        print(json.dumps(summary, indent=2))
    else:
        print(f"OK manifest {summary['out']}: {manifest['file_count']} files, {human(manifest['total_bytes'])}"
              f" (run {run_id}) hashed in {seconds:.2f} s ({human(rate)}/s)", file=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
