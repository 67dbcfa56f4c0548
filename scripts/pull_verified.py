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
  2. rsyncs exactly the listed files (a files-from list, symlinks copied as content) into
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
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "node"))
import rgt_core as core  # noqa: E402
from evidence import (MANIFEST_NAME, PARTIAL_DIR, VERIFIED_NAME, file_set, parse_manifest, problem,  # noqa: E402
                      verify_tree)

atomic_write, fsync_dir, human, utc_now = core.atomic_write, core.fsync_dir, core.human_bytes, core.utc_iso
VERIFIED_SCHEMA = "rgt-pull-verified/1"
RSYNC_TEMP_RE = re.compile(r"^\.(.+)\.[A-Za-z0-9]{6}$")
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
MAX_REPORTED = 50


UsageError = core.UsageError  # exit 2


class FetchError(Exception):
    """The manifest could not be fetched (exit 1)."""


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived (exit 130)."""


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


# ---------------------------------------------------------------- hashing and verification


# ---------------------------------------------------------------- files and rsync


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
