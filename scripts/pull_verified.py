#!/usr/bin/env python3
"""Promotes a pulled run only when every file matches the node's manifest byte for byte; a re-run resumes.

Local side, standard library only (plus ssh for remote sources; rsync where both ends have it, else a tar
stream, made by python3's tarfile on a node without tar). The node must
hold a manifest written by build_pull_manifest.py. Nothing reaches DEST/<run_id>/ unless every file
listed in it is present with the right size and SHA-256 and nothing else is present.

Usage:
  pull_verified.py --source [HOST:]ROOT --dest DIR [--rsh "ssh -F cfg"] [--manifest NAME] [--generation N]
                   [--transport auto|rsync|tar] [--jobs N] [--bwlimit KBPS] [--fresh] [--stall-seconds S] [--json]

  python3 pull_verified.py --source gpu-box:/workspace/durable/results/run-42 --dest ./pulled
  python3 pull_verified.py --source /mnt/nfs/results/run-42 --dest ./pulled      # a local path
  python3 pull_verified.py --source gpu-box:/workspace/durable/results/run-42 --dest ./pulled --generation 1

--generation N pulls generation N of the run instead of its current results: the verified results of attempt
N that a later attempt which did not continue it (a forced restart, having no resume adapter) would have
replaced, kept whole on the node with their own manifest in DURABLE/generations/RID/N (for a --source
DURABLE/results/RID). It is fetched and verified by the same steps below and lands in DEST/<run_id>@generation-N/
(PULL_VERIFIED.json records the generation); gate it with teardown_gate.py --keep-generation N.

What it does, in order:
  1. fetches the manifest (ssh HOST cat, or reads the local file; NAME is relative to ROOT unless
     absolute, default PULL_MANIFEST.json) and validates it BEFORE copying anything: schema, run id,
     sizes, hashes, and every path (absolute, '..', '.', empty components, backslash, NUL/control
     characters, duplicates, a path that is also another's parent, reserved names are all refused);
  2. copies exactly the listed files (symlinks as content) into DEST/.staging-<run_id>/. Transport
     (--transport, default auto): rsync when both ends have it, with --partial-dir=.rsync-partial, so
     a re-run after Ctrl-C, a dropped connection or a crash continues from the bytes already there;
     otherwise one tar stream (`tar -ch` on the node over ssh, or locally; python3's tarfile where there
     is no tar: the summary's transfer.packer says which), read straight from the pipe
     member by member with only listed regular files accepted (an extra, repeated or linked member, or a
     header whose size is not the manifest's, fails the pull before its bytes land), each file hashed as
     it is written so step 3 need not read it again; resumable per file: files already in staging with
     the manifest's size and hash are not sent again. The summary says which transport ran; a transfer that
     receives no byte for --stall-seconds S (default 300) is ended as STALLED, keeping what arrived;
  3. verifies the staging tree in parallel: missing, extra, truncated or oversized files, changed
     bytes, symlinks and special files each get their own FAIL line naming the file. Files that fail
     are moved into .rsync-partial so the next run re-fetches only the blocks that differ;
  4. on success writes PULL_MANIFEST.json (the fetched bytes) and PULL_VERIFIED.json into staging
     and renames staging to DEST/<run_id>/ in one step.

If DEST/<run_id>/ exists already: the same files (same manifest), every one re-hashed and still
matching -> exit 0, nothing done; anything else (a different pull, a file changed even by one byte)
-> exit 3, nothing overwritten. One pull per run id at a time (a lock file in DEST).

Output: one line per problem (FAIL <code>: <path>: <detail>) and a verdict on stdout, or --json;
rsync's progress and hashing progress on stderr when stderr is a terminal.

A run that has not ended yet has no manifest: the pull then says it is still running (exit 1, --json status
"running") instead of "the manifest could not be fetched".

Exit codes:
  0    verified and promoted, or already present with the same files
  1    a check failed (manifest unsafe or unreadable, transfer failed, verification failed, another
       pull running); staging is kept for the next run, nothing is promoted
  2    usage or bad environment (bad flags or --source, a forced transport missing, DEST not creatable)
  3    refused: DEST/<run_id>/ exists with different or damaged content
  130  interrupted (Ctrl-C / SIGTERM / SIGHUP) in any phase, one INTERRUPTED line (before the lock: nothing
       pulled; after it: staging kept); re-run the same command to continue. The transfer
       process dies with this one (Linux: even after kill -9) and holds the pull's lock while alive
"""
from __future__ import annotations

import os
import signal
import sys

INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def catch_signals(handler) -> dict:
    """HANDLER for SIGINT, SIGTERM and SIGHUP (a closed terminal or a dropped ssh session too), but not for one
    this process was started ignoring (nohup, a background job) -> the handlers it replaced."""
    return {sig: signal.signal(sig, handler) for sig in INTERRUPTING if signal.getsignal(sig) != signal.SIG_IGN}


def _interrupted_loading(signum, _frame):
    """An interrupt while the modules load: nothing is written and no child runs yet, so one line and out."""
    sys.stderr.write(f"pull_verified: INTERRUPTED ({signal.Signals(signum).name}) while starting: nothing pulled; "
                     "re-run the same command\n")
    sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":   # from the first statement on (finding field N21); main() then raises Interrupted
    catch_signals(_interrupted_loading)

import hashlib  # noqa: E402  (the imports follow the signal handlers)
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402
import sync as node_sync  # noqa: E402  (where a run's kept generations live)
from evidence import (MANIFEST_NAME, PARTIAL_DIR, VERIFIED_NAME, file_set, parse_manifest, problem,  # noqa: E402
                      verify_tree, written_identity)

atomic_write, fsync_dir, human, utc_now = core.atomic_write, core.fsync_dir, core.human_bytes, core.utc_iso
VERIFIED_SCHEMA = "rgt-pull-verified/1"
RSYNC_TEMP_RE = re.compile(r"^\.(.+)\.[A-Za-z0-9]{6}$")
MAX_MANIFEST_BYTES = 512 * 1024 * 1024
MAX_REPORTED = 50
TAR_CHUNK = 1 << 20     # the tar stream is read in pieces of this size,
WRITE_PIECE = 64 << 10  # and hashed and written in pieces of this one (see TarStream.copy_member)


UsageError = core.UsageError  # exit 2


class FetchError(Exception):
    """The manifest could not be fetched (exit 1)."""


class SizeMismatch(tarfile.TarError):
    """A tar member's header claims another size than the manifest's: refused before anything is written."""


class UnexpectedMember(tarfile.TarError):
    """A tar member the manifest does not list as a regular file (an extra file, a traversal, a link, a second
    copy): the pull fails even when every listed file arrived, and nothing of the member is written."""


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived (exit 130). A BaseException, as KeyboardInterrupt: no `except Exception`
    on the way (the run-state probe's) may swallow it."""


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


def pulled_name(run_id: str, generation=None) -> str:
    """The folder under DEST a pull lands in: the run id, or RID@generation-N for a kept generation ('@' is not
    in a run id, so no run's pull can take that name)."""
    return run_id if generation is None else "%s@generation-%d" % (run_id, generation)


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


def child_options(keep_fds=()):
    """Popen options for a transport child: it dies with us (even after kill -9, on Linux) and holds the
    pull's lock fd, so a second pull sees "busy" until an orphan that outlived us is gone too."""
    return {"preexec_fn": core.die_with_parent(), "pass_fds": keep_fds}


DEFAULT_STALL_SECONDS = 300.0
RSYNC_TIMEOUT_EXIT = (30, 35)   # rsync: "timeout in data send/receive", "timeout waiting for daemon connection"


class StallGuard:
    """Ends a transfer that moved no byte for SECONDS (a monotonic clock): a stalled node, a hung volume on
    it, or a link that dropped without a reset would otherwise hang the pull (and the box bills on).
    moved() is called for every chunk read; when the deadline passes, PROC is killed and .fired is set."""

    def __init__(self, proc, seconds):
        self.proc, self.seconds = proc, float(seconds)
        self.last = time.monotonic()
        self.fired = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def moved(self, count=1):
        if count:
            self.last = time.monotonic()

    def _watch(self):
        while not self.done.wait(min(1.0, self.seconds / 4)):
            if time.monotonic() - self.last >= self.seconds:
                self.fired = True
                try:
                    self.proc.kill()
                except OSError:
                    pass
                return

    def stop(self):
        self.done.set()
        self.thread.join(5)


def stall_text(seconds):
    return ("STALLED: the node sent nothing for %d s (a stalled link, node or disk there); what arrived is kept: "
            "re-run the same command to continue" % seconds)


class RsyncRun:
    """Run rsync in the foreground; forward its progress; survive Ctrl-C/SIGTERM by stopping it cleanly."""

    def __init__(self, argv, show_progress: bool, keep_fds=(), stall_seconds=DEFAULT_STALL_SECONDS):
        self.argv, self.show_progress, self.keep_fds = argv, show_progress, tuple(keep_fds)
        self.stall_seconds = stall_seconds
        self.proc = None

    def run(self) -> dict:
        started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, **child_options(self.keep_fds))
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
                "stalled_seconds": self.stall_seconds if rc in RSYNC_TIMEOUT_EXIT else None,
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


def rsync_argv(rsync: str, host, root: str, staging: str, list_file: str, rsh, bwlimit, progress: bool,
               stall_seconds: float = DEFAULT_STALL_SECONDS):
    argv = [rsync, "--copy-links", "--times", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--from0", f"--files-from={list_file}", "--stats", "--timeout=%d" % max(1, round(stall_seconds))]
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


class TarRun:
    """The transport when rsync is missing at either end: one `tar -ch` stream over ssh (or locally),
    unpacked here member by member. Resumable per file: a staging file that already has the manifest's
    size and SHA-256 is not asked for again; a file cut off mid-stream is never left under its name."""

    def __init__(self, host, root, staging, manifest, rsh, jobs, keep_fds=(), stall_seconds=DEFAULT_STALL_SECONDS):
        self.host, self.root, self.staging, self.rsh, self.jobs = host, root, staging, rsh, jobs
        self.stall_seconds = stall_seconds
        self.keep_fds = tuple(keep_fds)
        self.entries = {e["path"]: e for e in manifest["files"]}
        self.proc = None
        self.packer = "tar"  # or "python3" where the sending end has no tar
        self.hashed = {}     # path -> (sha256, identity) of each file hashed as it was written (verify_tree)

    def already_good(self):
        """Paths whose staging copy verifies already (size first, then the hash)."""
        sized = [rel for rel, e in self.entries.items()
                 if os.path.isfile(os.path.join(self.staging, rel))
                 and not os.path.islink(os.path.join(self.staging, rel))
                 and os.path.getsize(os.path.join(self.staging, rel)) == e["size"]]
        if not sized:
            return set()
        subset = {"files": [self.entries[rel] for rel in sized]}
        bad, _ = verify_tree_subset(self.staging, subset, self.jobs)
        return set(sized) - {b["path"] for b in bad}

    def argv(self):
        """tar -ch (a symlink inside the root is sent as its content); where the node, or this machine,
        has no tar, python3's tarfile writes the same stream (core.tar_pack_shell)."""
        if self.host is None:
            if shutil.which("tar"):
                return ["tar", "-chf", "-", "-T", "-"], os.path.expanduser(self.root)
            self.packer = "python3"
            return [sys.executable, "-c", core.TAR_PACK_PY], os.path.expanduser(self.root)
        return rsh_argv(self.rsh) + [self.host, "cd " + remote_quote(self.root) + " && " +
                                     core.tar_pack_shell(shlex.quote)], None

    def run(self) -> dict:
        started = time.monotonic()
        skip = self.already_good()
        wanted = [rel for rel in sorted(self.entries) if rel not in skip]
        result = {"rc": 0, "seconds": 0.0, "files_transferred": 0, "files_reused": len(skip),
                  "literal_bytes": 0, "matched_bytes": sum(self.entries[r]["size"] for r in skip), "stderr_tail": []}
        if not wanted:
            return result
        argv, cwd = self.argv()
        err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         bufsize=0, **child_options(self.keep_fds))
        except OSError as exc:
            result.update(rc=127, stderr_tail=["cannot run %s: %s" % (argv[0], exc.strerror or exc)])
            return result
        # "./" first: tar never reads a listed name as an option; manifest paths hold no newline
        feeder = threading.Thread(target=self._feed, args=(wanted,), daemon=True)
        feeder.start()
        guard = StallGuard(self.proc, self.stall_seconds)
        try:
            self._unpack(set(wanted), result, guard)
        except SizeMismatch as exc:
            result["size_refused"] = str(exc)
            result["stderr_tail"].append(str(exc))
            broken = True
        except UnexpectedMember as exc:
            result["member_refused"] = str(exc)
            result["stderr_tail"].append("tar stream refused: %s" % exc)
            broken = True
        except (tarfile.TarError, OSError, EOFError) as exc:
            result["stderr_tail"].append("tar stream broken: %s" % exc)
            broken = True
        else:
            broken = False
        finally:
            guard.stop()
            if guard.fired:
                result["stalled_seconds"] = self.stall_seconds
            if broken and self.proc.poll() is None:
                self.proc.kill()   # the rest of a refused stream is never read: end the sender now
            self.proc.stdout.close()
            rc = self.proc.wait()
            feeder.join(5)
            err.seek(0)
            lines = err.read().decode("utf-8", "replace").strip().splitlines()
            err.close()
            if core.NO_TAR_NOTE in lines:
                self.packer = "python3"
                lines.remove(core.NO_TAR_NOTE)
            result["stderr_tail"] = lines[-5:] + result["stderr_tail"]
        result["rc"] = rc or (1 if broken else 0)
        result["seconds"] = round(time.monotonic() - started, 3)
        result["packer"] = self.packer
        return result

    def _feed(self, wanted):
        try:
            self.proc.stdin.write("".join("./%s\n" % rel for rel in wanted).encode("utf-8"))
            self.proc.stdin.close()
        except OSError:
            pass

    def _unpack(self, wanted, result, guard):
        """Read the one stream member by member (TarStream): each listed regular file is written to a temp name,
        hashed as it is written (so verification needs no second read) and renamed into place. A member that is
        not a listed regular file, a second copy of one, or a header whose size is not the manifest's ends the
        pull before any of its bytes reach the disk."""
        stream = TarStream(self.proc.stdout, guard)
        for name, size, kind in stream.members():
            rel = name[2:] if name.startswith("./") else name
            if kind == "dir":
                continue
            if rel not in wanted or kind != "file":
                raise UnexpectedMember("unexpected member %r in the stream (not a listed regular file%s)"
                                       % (rel, ", or sent twice" if rel in self.hashed else ""))
            want = self.entries[rel]["size"]
            if size != want:   # before the first byte lands on this disk
                raise SizeMismatch("size: %s: the node's tar header says %d bytes, the manifest says %d; "
                                   "nothing of it was written" % (rel, size, want))
            wanted.discard(rel)
            target = os.path.join(self.staging, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.islink(target) or os.path.isdir(target):
                raise tarfile.TarError("%s in staging is not a regular file; re-run with --fresh" % rel)
            tmp = os.path.join(os.path.dirname(target), ".%s.rgt-part" % os.path.basename(target))
            try:
                with open(tmp, "wb", buffering=0) as out:
                    digest = stream.copy_member(size, out)
                    written = os.fstat(out.fileno())
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            self.hashed[rel] = (digest, written_identity(written))
            result["files_transferred"] += 1
            result["literal_bytes"] += size

    def stop(self, sig=signal.SIGTERM):
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


class TarStream:
    """A tar stream read straight from a pipe: headers parsed one 512-byte block at a time (ustar, GNU long
    names, pax `path`/`size` records), member data read into one reused buffer, hashed and written with no
    copy in Python, so the pull keeps pace with `ssh tar | tar`. Sparse members and pax sparse records are
    reported as kind "sparse"; links, devices and FIFOs as "other"; the caller decides what to refuse."""

    DRAIN_LIMIT = 1 << 20     # after the end marker, at most this much record padding is read and dropped

    def __init__(self, raw, guard):
        self.raw, self.guard = raw, guard
        self.buffer = memoryview(bytearray(TAR_CHUNK))
        self.block = memoryview(bytearray(tarfile.BLOCKSIZE))
        self.pending = 0          # data bytes (and padding) of the current member not read yet
        _grow_pipe(raw)

    def _fill(self, view, at_header=False) -> bool:
        """Fill VIEW from the stream; False on a clean end before its first byte (only AT_HEADER)."""
        got, want = 0, len(view)
        while got < want:
            count = self.raw.readinto(view[got:])
            if not count:
                if at_header and got == 0:
                    return False
                raise tarfile.ReadError("the stream ended inside a member (cut off after %d of %d bytes)"
                                        % (got, want))
            got += count
            self.guard.moved(count)
        return True

    def _read_bytes(self, size) -> bytes:
        """A small member's data (a long name or a pax header) with its padding; bounded."""
        if size > 1 << 20:
            raise tarfile.HeaderError("a %d-byte name or pax header; refusing to read it" % size)
        padded = -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        data = bytearray(padded)
        self._fill(memoryview(data))
        return bytes(data[:size])

    def members(self):
        """Yield (name, size, kind) per member; kind is file, dir, sparse or other. The caller reads a file's
        data with copy_member(size, out) before asking for the next member (the rest is skipped otherwise)."""
        long_name, pax = None, {}
        while True:
            if self.pending:
                self._skip(self.pending)
            if not self._fill(self.block, at_header=True):
                return
            if not any(self.block):
                self._drain()
                return
            info = tarfile.TarInfo.frombuf(bytes(self.block), "utf-8", "surrogateescape")
            kind_byte = info.type
            if kind_byte in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                data = self._read_bytes(info.size).split(b"\0", 1)[0]
                if kind_byte == tarfile.GNUTYPE_LONGNAME:
                    long_name = data.decode("utf-8", "surrogateescape")
                continue
            if kind_byte in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
                records = _pax_records(self._read_bytes(info.size))
                if kind_byte != tarfile.XGLTYPE:
                    pax = records
                continue
            name = pax.get("path") or long_name or info.name
            size = info.size
            if "size" in pax:
                try:
                    size = int(pax["size"])
                except ValueError:
                    raise tarfile.HeaderError("pax size %r is not a number" % pax["size"])
            sparse = kind_byte == tarfile.GNUTYPE_SPARSE or any(k.startswith("GNU.sparse.") for k in pax)
            long_name, pax = None, {}
            if sparse:
                kind = "sparse"
            elif kind_byte in tarfile.REGULAR_TYPES:
                kind = "file"
            elif kind_byte == tarfile.DIRTYPE:
                kind = "dir"
            else:
                kind = "other"
            self.pending = -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE if kind in ("file", "dir") else 0
            yield name, size, kind

    def copy_member(self, size, out) -> str:
        """Copy the current member's SIZE data bytes to OUT, hashing them on the way; returns the SHA-256. Each
        chunk read is hashed and written a WRITE_PIECE at a time, while that piece is still in the CPU's cache:
        a 1 MiB write costs the kernel three times the CPU of sixteen 64 KiB ones (measured, 2026-12)."""
        digest = hashlib.sha256()
        left = size
        while left:
            view = self.buffer[:min(left, len(self.buffer))]
            self._fill(view)
            for at in range(0, len(view), WRITE_PIECE):
                piece = view[at:at + WRITE_PIECE]
                digest.update(piece)          # the bytes hashed are the bytes written
                write_all(out, piece)
            left -= len(view)
        padding = self.pending - size
        if padding:
            self._fill(self.block[:padding])
        self.pending = 0
        return digest.hexdigest()

    def _skip(self, count):
        while count:
            view = self.buffer[:min(count, len(self.buffer))]
            self._fill(view)
            count -= len(view)
        self.pending = 0

    def _drain(self):
        left = self.DRAIN_LIMIT
        while left > 0:
            count = self.raw.readinto(self.buffer[:min(left, len(self.buffer))])
            if not count:
                return
            self.guard.moved(count)
            left -= count


def write_all(out, view):
    done = 0
    while done < len(view):
        done += out.write(view[done:])


def _pax_records(data: bytes) -> dict:
    """The "LEN key=value\n" records of a pax header."""
    records, at = {}, 0
    while at < len(data):
        space = data.find(b" ", at)
        if space < 0:
            break
        try:
            length = int(data[at:space])
        except ValueError:
            raise tarfile.HeaderError("a pax header record has no length")
        if length <= 0 or at + length > len(data):
            raise tarfile.HeaderError("a pax header record overruns its header")
        key, _, value = data[space + 1:at + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


def _grow_pipe(raw):
    """Let the sender run up to 1 MiB ahead of us (Linux F_SETPIPE_SZ; elsewhere the default stays)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import fcntl
        fcntl.fcntl(raw.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), TAR_CHUNK)   # 1031: Linux, Python < 3.10
    except (ImportError, OSError, ValueError, AttributeError):
        pass


def verify_tree_subset(root, manifest, jobs):
    """Hash only the manifest's files that are present (extra files in ROOT are not this check's business)."""
    problems, hashed = verify_tree(root, manifest, jobs, progress=False)
    return [p for p in problems if p["code"] not in ("extra", "symlink", "special")], hashed


def remote_has(host, rsh, program):
    """Whether `command -v PROGRAM` succeeds on HOST (one short round trip)."""
    try:
        done = subprocess.run(rsh_argv(rsh) + [host, "command -v " + shlex.quote(program)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


# ---------------------------------------------------------------- existing destination

def check_existing(final: str, raw_sha: str, manifest: dict, jobs: int = 1, progress: bool = False):
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
    # Re-hash: a same-size change (bit rot, an edit, a bad disk) must not pass as "already verified".
    damaged, _ = verify_tree(final, manifest, jobs, skip_partial=False, label="re-verifying the existing copy",
                             progress=progress)
    if damaged:
        named = "; ".join(f"{p['path']}: {p['code']}" for p in damaged[:5])
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        return 3, (f"{final} was verified before but no longer matches its manifest ({named}{more}); "
                   "move it aside and pull again")
    note = "same manifest" if kept_sha == raw_sha else "manifest rebuilt on the node, same files"
    return 0, f"ALREADY pulled and verified: {final} ({note}, every file re-hashed); nothing to do"


# ---------------------------------------------------------------- main

def parse_args(argv):
    parser = core.Parser(
        prog="pull_verified.py",
        description="rsync a run's results into staging, verify against the node's manifest, promote atomically.",
        formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--source", required=True, help="[HOST:]ROOT on the node (HOST may be an ssh alias), "
                                                         "or a local path")
    parser.add_argument("--dest", required=True, help="local directory; the run lands in DEST/<run_id>/")
    parser.add_argument("--rsh", help='remote shell for rsync -e and the manifest fetch, e.g. "ssh -F cfg"')
    parser.add_argument("--manifest", default=MANIFEST_NAME,
                        help=f"manifest name relative to ROOT, or an absolute path (default {MANIFEST_NAME})")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="files verified in parallel (default: min(8, CPUs))")
    parser.add_argument("--bwlimit", type=int, help="rsync bandwidth cap in KiB/s")
    parser.add_argument("--transport", choices=("auto", "rsync", "tar"), default="auto",
                        help="auto (default): rsync when both ends have it, else a tar stream")
    parser.add_argument("--fresh", action="store_true", help="delete this run's staging dir first (no resume)")
    parser.add_argument("--generation", type=core.arg_number(int, 1, 1 << 30), metavar="N",
                        help="pull generation N (attempt N's verified results the node kept in "
                             "DURABLE/generations/RID/N) instead of the current results; lands in "
                             "DEST/<run_id>@generation-N")
    parser.add_argument("--stall-seconds", type=core.arg_number(float, 0.0, 1e6, low_open=True),
                        default=DEFAULT_STALL_SECONDS,
                        help="give up when no byte arrives for this long (default %d); staging is kept, so the "
                             "same command continues" % DEFAULT_STALL_SECONDS)
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


def results_root(root):
    """The run's results dir for ROOT: ROOT itself, or DURABLE/results/RID for a kept generation
    DURABLE/generations/RID/N (pull_verified.py --generation N)."""
    gen = node_sync.generation_of(root)
    return gen[0] if gen else root


def run_dir_of(root):
    """DURABLE_DIR/runs/RID for a results root DURABLE_DIR/results/RID (or a generation of it), else None."""
    parent, rid = os.path.split(results_root(root).rstrip("/"))
    if os.path.basename(parent) == "results" and rid:
        return os.path.join(os.path.dirname(parent), "runs", rid)
    return None


# What the node runs for run_activity: runrec's rule, streamed with the core (nothing is written there).
RUN_STATE_ENTRY = ("import sys, rgt_core, runrec\n"
                   "rgt_core.emit_json(runrec.run_activity(sys.argv[sys.argv.index('--run-state') + 1]))\n")


def run_state_program() -> bytes:
    """The program `python3 - --run-state RUN_DIR` reads on the node: the core and runrec, then RUN_STATE_ENTRY."""
    return core.streamed_program(os.path.join(HERE, "node", "runrec.py"), modules=("rgt_core", "runrec"),
                                 entry=RUN_STATE_ENTRY)


def run_activity(host, run_dir: str, rsh) -> dict:
    """runrec.run_activity for RUN_DIR on the node (streamed to `python3 -`, nothing written there), or here,
    in this process, for a local run dir. Raises FetchError when the node does not answer."""
    if host is None:
        import runrec
        return runrec.run_activity(os.path.expanduser(run_dir))
    argv = rsh_argv(rsh) + [host, "python3 - --run-state " + remote_quote(run_dir)]
    payload = run_state_program()
    try:
        done = subprocess.run(argv, input=payload, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        doc = json.loads(done.stdout.decode("utf-8", "replace"))
        if not isinstance(doc, dict) or "live" not in doc:
            raise ValueError("no answer")
        return doc
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"cannot tell whether run {run_dir} still runs on {host or 'this machine'} "
                         f"({getattr(exc, 'strerror', None) or exc})")


def still_running(host, root, rsh):
    """Why the run whose results dir is ROOT still runs (the gate's own run-state check, on the node), or None
    when it does not, or when that cannot be told (not a DURABLE/results/RID root, no answer)."""
    run_dir = run_dir_of(root)
    if run_dir is None:
        return None
    try:
        activity = run_activity(host, run_dir, rsh)
    except Exception:  # noqa: BLE001  (no answer: the manifest's own reason stands)
        return None
    return (activity.get("why") or "it is live") if activity.get("live") else None


def _raise_interrupt(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv=None) -> int:
    """Every phase ends on an interrupt in one line and exit 130: before the lock (the arguments, the manifest's
    ssh read, the check of an existing pull: nothing written but DEST itself) here; after it, pull() keeps the
    staging dir and ends the transfer (finding field N21)."""
    previous = catch_signals(_raise_interrupt)
    seen = {}
    try:
        return pull(argv, seen)
    except Interrupted as exc:
        line = f"INTERRUPTED ({exc}) before the pull took its lock: nothing pulled; re-run the same command"
        if "summary" in seen:
            seen["summary"].update(status="interrupted")
            emit(seen["args"], seen["summary"], [line])
        else:
            print(f"pull_verified: {line}", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def pull(argv, seen) -> int:
    args = seen["args"] = parse_args(argv)
    core.guard_output(getattr(args, "json", False))   # file names and reasons come from the node: finding_laptop_L10
    summary = seen["summary"] = {"ok": False, "status": "failed", "source": args.source, "problems": []}
    try:
        host, root = parse_source(args.source)
        if host is None and not os.path.isdir(os.path.expanduser(root)):
            raise UsageError(f"--source {root} is not a directory"
                             + ("" if os.path.exists(os.path.expanduser(root)) else " (it does not exist)"))
        if not args.manifest:
            raise UsageError("--manifest is empty")
        rsync = shutil.which("rsync")
        if args.transport == "rsync" and not rsync:
            raise UsageError("--transport rsync: rsync is not installed here (apt-get install rsync / "
                             "brew install rsync), or use --transport tar")
        if args.bwlimit is not None and args.transport == "tar":
            raise UsageError("--bwlimit needs rsync; the tar transport has no rate cap")
        if args.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if args.bwlimit is not None and args.bwlimit < 1:
            raise UsageError("--bwlimit must be a positive number of KiB/s")
        rsh_argv(args.rsh)
        if args.generation is not None:
            root = os.path.join(node_sync.generations_dir(root), str(args.generation))
            if host is None and not os.path.isdir(os.path.expanduser(root)):
                raise UsageError(f"--generation {args.generation}: {root} does not exist (the node keeps a "
                                 "generation only when a later attempt did not continue it)")
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
        running = still_running(host, root, args.rsh) if args.generation is None else None
        if running:       # no manifest yet because the run has not ended: say that, not "could not be fetched"
            summary.update({"status": "running", "problems": [problem("running", root, running)]})
            emit(args, summary, [f"NOTHING PULLED: the run is still running ({running}); its results are synced "
                                 "and verified when it ends: pull again then (rgt.py status says when)"])
            return 1
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
    name = pulled_name(run_id, args.generation)
    final = os.path.join(dest, name)
    staging = os.path.join(dest, f".staging-{name}")
    summary.update({"run_id": run_id, "dest": final, "file_count": manifest["file_count"],
                    "total_bytes": manifest["total_bytes"]})
    try:
        if not os.path.isdir(dest):
            os.makedirs(dest)
            # pulled results are data, not code: a DEST made here keeps itself out of the project's git
            atomic_write(os.path.join(dest, ".gitignore"), b"# made by pull_verified.py: pulled results stay out "
                                                          b"of git\n*\n")
    except OSError as exc:
        print(f"pull_verified: cannot create --dest {dest}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if os.path.lexists(final):
        code, message = check_existing(final, raw_sha, manifest, args.jobs,
                                       progress=sys.stderr.isatty() and not args.json)
        summary.update({"ok": code == 0, "status": "already" if code == 0 else "refused"})
        if code:
            summary["problems"] = [problem("exists", final, message)]
        emit(args, summary, [message] if code == 0 else ["REFUSED: nothing overwritten"])
        return code

    import fcntl  # POSIX only; imported late so --help works anywhere
    lock_path = os.path.join(dest, f".pull-{name}.lock")
    lock_handle = open(lock_path, "a+")
    try:
        fcntl.flock(lock_handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        summary["problems"] = [problem("busy", final, "another pull of this run is writing the same staging dir")]
        emit(args, summary, ["NOT STARTED: wait for the other pull to finish, then re-run"])
        return 1

    held = (lock_handle.fileno(),)
    rsync_job = None   # main() catches SIGINT, SIGTERM and SIGHUP: each raises Interrupted, here or before the lock
    started = time.monotonic()
    try:
        if args.fresh and os.path.isdir(staging):
            shutil.rmtree(staging)
        os.makedirs(staging, exist_ok=True)
        paths = [e["path"] for e in manifest["files"]]
        adopt_rsync_leftovers(staging, paths)
        transport = args.transport
        if transport == "auto":
            transport = "rsync" if rsync and (host is None or remote_has(host, args.rsh, "rsync")) else "tar"
        summary["transport"] = transport
        show = sys.stderr.isatty() and not args.json
        print(f"pulling {manifest['file_count']} files ({human(manifest['total_bytes'])}) of run {run_id} "
              f"from {summary['source']} into {staging} ({transport})", file=sys.stderr)
        if transport == "tar":
            rsync_job = TarRun(host, root, staging, manifest, args.rsh, args.jobs, keep_fds=held,
                               stall_seconds=args.stall_seconds)
            transfer = rsync_job.run()
        else:
            fd, list_file = tempfile.mkstemp(dir=dest, prefix=f".pull-{name}.", suffix=".list")
            with os.fdopen(fd, "wb") as handle:
                # "./" keeps rsync from reading a name that starts with '#' or ';' as a comment line
                handle.write(b"".join(b"./" + p.encode("utf-8") + b"\0" for p in paths))
            try:
                rsync_job = RsyncRun(rsync_argv(rsync, host, root, staging, list_file, args.rsh, args.bwlimit, show,
                                                args.stall_seconds), show, keep_fds=held,
                                     stall_seconds=args.stall_seconds)
                transfer = rsync_job.run()
            finally:
                os.unlink(list_file)
        summary["transfer"] = transfer
        if transport == "rsync":
            summary["rsync"] = transfer  # the name older callers read
        # files the tar stream hashed while writing them are not read again (their identity must still hold)
        problems, _ = verify_tree(staging, manifest, args.jobs, hashed=getattr(rsync_job, "hashed", None))
        if problems or transfer.get("size_refused") or transfer.get("member_refused"):
            park_bad_files(staging, problems)
            if transfer.get("size_refused"):
                problems.insert(0, problem("size", summary["source"], transfer["size_refused"]))
            elif transfer.get("member_refused"):
                problems.insert(0, problem("extra", summary["source"], transfer["member_refused"]))
            elif transfer.get("stalled_seconds"):
                problems.insert(0, problem("stalled", summary["source"], stall_text(transfer["stalled_seconds"])))
            elif transfer["rc"] != 0:
                problems.insert(0, problem(transport, summary["source"], f"{transport} exit {transfer['rc']}: " +
                                           " | ".join(transfer["stderr_tail"][-2:])))
            summary.update({"problems": problems, "staging": staging,
                            "stalled": bool(transfer.get("stalled_seconds"))})
            lead = (stall_text(transfer["stalled_seconds"]) + "; " if transfer.get("stalled_seconds") else "")
            emit(args, summary, [f"NOT PROMOTED: {lead}{len(problems)} problem(s); staging kept at {staging}. Fix "
                                 "the cause, then re-run the same command to continue (--fresh starts over)"])
            return 1
        verified = {"schema": VERIFIED_SCHEMA, "run_id": run_id, "manifest_sha256": raw_sha,
                    "file_count": manifest["file_count"], "total_bytes": manifest["total_bytes"],
                    "verified_at": utc_now(), "source": summary["source"], "generation": args.generation}
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
        try:
            os.unlink(lock_path)   # still held: a pull that opens it now finds DEST/<run_id> and stops there
        except OSError:
            pass
        fsync_dir(dest)
    except Interrupted as exc:
        if rsync_job is not None:
            rsync_job.stop()
        summary.update({"status": "interrupted", "staging": staging})
        emit(args, summary, [f"INTERRUPTED ({exc}): partial data kept in {staging}; re-run the same command to "
                             "continue"])
        return 130
    finally:
        lock_handle.close()
    seconds = time.monotonic() - started
    summary.update({"ok": True, "status": "promoted", "seconds": round(seconds, 3), "verified": verified})
    reused = summary["transfer"].get("matched_bytes")
    which = "" if args.generation is None else f" generation {args.generation} (attempt {args.generation}'s results)"
    emit(args, summary, [f"OK pulled and verified run {run_id}{which}: {manifest['file_count']} files, "
                         f"{human(manifest['total_bytes'])} -> {final} ({VERIFIED_NAME} written, "
                         f"{seconds:.1f} s" + (f", {human(reused)} reused from earlier attempts" if reused else "")
                         + (", tar stream made by python3: no tar on the node"
                            if summary["transfer"].get("packer") == "python3" else "") + ")"])
    return 0


if __name__ == "__main__":
    CODE = core.run_main(main, prog='pull_verified.py')
    catch_signals(signal.SIG_IGN)   # the verdict is out: a signal now can no longer change the exit code
    sys.exit(CODE)
