#!/usr/bin/env python3
"""Download one URL to a file over a bad link: resume, retry, detect stalls, fall back to mirrors.

Standard library only (Python 3.8+); copy this one file to the node.

  python3 fetch_resumable.py URL --out FILE [--fallback URL]... [--sha256 HEX]
  python3 fetch_resumable.py https://hf-mirror.com/<org>/<repo>/resolve/main/model.safetensors \
      --fallback https://huggingface.co/<org>/<repo>/resolve/main/model.safetensors \
      --out "$DATA_DIR/models/model.safetensors" --sha256 <64 hex> --stall-seconds 60 --json

How it behaves:
  * Bytes go to FILE.part (progress notes in FILE.part.json). Re-running the same command resumes with an
    HTTP Range request; If-Range (the server's ETag/Last-Modified) makes a changed file restart from 0.
  * A stall is "no byte arrived for --stall-seconds": the connection is dropped and retried. A dropped
    connection that had made progress is resumed at once and does not use up a retry.
  * Each source gets --retries failed attempts (stalls, errors, no progress), with exponential backoff
    (--backoff doubling up to --backoff-max); then the next --fallback takes over, resuming the same .part
    when it reports the same total size. HTTP 404/403/401/410 moves on without retrying.
  * The SHA-256 is computed while downloading. With --sha256, a mismatch deletes the .part and tries the
    next source from scratch; if none verifies, exit 1 and no FILE is left behind.
  * On success the .part is fsynced and renamed to FILE (atomic), and FILE.part.json is removed.
  * An existing FILE is kept (verified when --sha256 is given) unless --force.
  * Secrets: --auth-env NAME sends "Authorization: Bearer $NAME" (never on redirects to other hosts);
    URLs are logged without user:password@ and without their query string. *_proxy variables apply.
  * Progress goes to stderr: a live line on a terminal, one line per --progress-every seconds otherwise.

Exit codes: 0 downloaded and (if asked) verified, or already present; 1 every source failed or the
checksum did not match (the .part is kept for a resume, except after a mismatch); 2 usage or bad input.
"""
import argparse
import errno
import fcntl
import hashlib
import http.client
import json
import os
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 256 * 1024
MIB = 1024 * 1024
FATAL_HTTP = {401, 403, 404, 410}


class UsageError(Exception):
    pass


class Stalled(Exception):
    pass


def redact(url):
    """URL for logs: no credentials, no query string (signed URLs carry tokens there)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:   # a bad IPv6 literal, or a port that is not 0-65535
        return "<unparseable url>"
    if port:
        host = "%s:%d" % (host, port)
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "<redacted>" if parts.query else "", ""))


def human(num):
    return "%.1f MiB" % (num / MIB)


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json_atomic(path, data):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path):
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


def sha256_file(path, upto=None):
    h = hashlib.sha256()
    left = upto
    with open(path, "rb") as fh:
        while left is None or left > 0:
            block = fh.read(min(4 * MIB, left) if left is not None else 4 * MIB)
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h


class Progress:
    """Progress on stderr: a rewritten line on a TTY, a plain line every `every` seconds otherwise."""

    def __init__(self, quiet, every):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.every = every
        self.last = 0.0
        self.drawn = False

    def update(self, done, total, rate, label, force=False):
        if self.quiet:
            return
        now = time.monotonic()
        gap = 0.25 if self.tty else self.every
        if not force and now - self.last < gap:
            return
        self.last = now
        pct = " %5.1f%%" % (100.0 * done / total) if total else ""
        text = "fetch:%s %s / %s  %.1f MiB/s  from %s" % (
            pct, human(done), human(total) if total else "?", rate / MIB, label)
        if self.tty:
            sys.stderr.write("\r" + text[:150].ljust(100))
            self.drawn = True
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def note(self, msg):
        if self.tty and self.drawn:
            sys.stderr.write("\n")
            self.drawn = False
        if not self.quiet:
            sys.stderr.write("fetch: %s\n" % msg)
            sys.stderr.flush()


class Fetcher:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.part = self.out + ".part"
        self.meta_path = self.out + ".part.json"
        self.sources = [args.url] + list(args.fallback)
        self.progress = Progress(args.quiet, args.progress_every)
        self.attempts = []
        self.meta = {}
        self.fd = None
        self.hasher = hashlib.sha256()
        self.hashed = 0
        self.token = os.environ.get(args.auth_env) if args.auth_env else None

    # -- .part bookkeeping
    def size(self):
        return os.fstat(self.fd).st_size

    def reset_part(self):
        os.ftruncate(self.fd, 0)
        self.hasher = hashlib.sha256()
        self.hashed = 0
        self.meta = {}
        self.save_meta()

    def save_meta(self):
        if self.meta:
            write_json_atomic(self.meta_path, self.meta)
        elif os.path.exists(self.meta_path):
            os.unlink(self.meta_path)

    def load_meta(self):
        try:
            with open(self.meta_path, "r", encoding="utf-8") as fh:
                data = json.load(fh)
            self.meta = data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.meta = {}

    def sync_hasher(self, offset):
        if self.hashed != offset:
            self.hasher = sha256_file(self.part, upto=offset)
            self.hashed = offset

    # -- one HTTP attempt from the current .part size
    def attempt(self, src):
        offset = self.size()
        rec = {"source": redact(src), "offset": offset, "received": 0, "outcome": None, "http_status": None,
               "error": None, "started_at": now_iso()}
        self.attempts.append(rec)
        headers = {"User-Agent": "rgt-fetch-resumable/1", "Accept-Encoding": "identity"}
        if offset > 0:
            headers["Range"] = "bytes=%d-" % offset
            validator = self.meta.get("etag") or self.meta.get("last_modified")
            if validator and self.meta.get("source") == src and not str(validator).startswith("W/"):
                headers["If-Range"] = validator
        req = urllib.request.Request(src, headers=headers)
        if self.token:
            req.add_unredirected_header("Authorization", "Bearer " + self.token)
        started = time.monotonic()
        try:
            resp = urllib.request.urlopen(req, timeout=self.args.connect_timeout)
        except urllib.error.HTTPError as exc:
            rec["http_status"] = exc.code
            exc.close()
            if exc.code == 416 and offset > 0:
                total = self.meta.get("total")
                if total and offset == total:
                    rec["outcome"] = "complete"
                    return "complete"
                self.reset_part()
                rec["outcome"], rec["error"] = "restart", "416: the partial file does not fit this resource"
                return "restart"
            rec["outcome"] = "fatal" if exc.code in FATAL_HTTP else "error"
            rec["error"] = "HTTP %d %s" % (exc.code, exc.reason)
            return rec["outcome"]
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            rec["outcome"] = "stalled" if isinstance(reason, socket.timeout) else "error"
            rec["error"] = "connect: %s" % reason
            return rec["outcome"]
        with resp:
            return self.receive(resp, src, offset, rec, started)

    def receive(self, resp, src, offset, rec, started):
        status = resp.status
        rec["http_status"] = status
        length = resp.headers.get("Content-Length")
        total = None
        if status == 206:
            match = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != offset:
                self.reset_part()
                rec["outcome"], rec["error"] = "restart", "server answered a different byte range"
                return "restart"
            total = int(match.group(3)) if match.group(3) != "*" else None
            known = self.meta.get("total")
            if known and total and known != total:
                self.reset_part()
                rec["outcome"], rec["error"] = "restart", "size differs from the partial file (%d != %d)" % (
                    total, known)
                return "restart"
        elif status == 200:
            if offset > 0:
                self.progress.note("%s ignored the Range request (or the file changed): starting again from 0"
                                   % redact(src))
                self.reset_part()
                offset = 0
            total = int(length) if length and length.isdigit() else None
        else:
            rec["outcome"], rec["error"] = "error", "unexpected HTTP status %d" % status
            return "error"
        self.meta.update({"source": src, "total": total or self.meta.get("total"),
                          "etag": resp.headers.get("ETag"), "last_modified": resp.headers.get("Last-Modified"),
                          "updated_at": now_iso()})
        self.save_meta()
        sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            try:
                sock.settimeout(self.args.stall_seconds)
            except OSError:
                pass
        self.sync_hasher(offset)
        os.lseek(self.fd, offset, os.SEEK_SET)
        done = offset
        want = self.meta.get("total")
        label = urllib.parse.urlsplit(src).hostname or "?"
        # read1 returns whatever has arrived (up to CHUNK), so bytes received just before a stall are kept
        reader = getattr(resp, "read1", None) or resp.read
        try:
            while True:
                try:
                    block = reader(CHUNK)
                except socket.timeout:
                    raise Stalled()
                if not block:
                    break
                os.write(self.fd, block)
                self.hasher.update(block)
                done += len(block)
                self.hashed = done
                rec["received"] += len(block)
                elapsed = max(time.monotonic() - started, 1e-6)
                self.progress.update(done, want, rec["received"] / elapsed, label)
        except Stalled:
            rec["outcome"] = "stalled"
            rec["error"] = "no byte for %gs at %s" % (self.args.stall_seconds, human(done))
            return "stalled"
        except (http.client.IncompleteRead, OSError, http.client.HTTPException) as exc:
            rec["outcome"] = "dropped"
            rec["error"] = "connection broke at %s: %s" % (human(done), exc.__class__.__name__)
            return "dropped"
        self.progress.update(done, want, rec["received"] / max(time.monotonic() - started, 1e-6), label, True)
        if want and done < want:
            rec["outcome"], rec["error"] = "dropped", "server closed early at %d of %d bytes" % (done, want)
            return "dropped"
        if want and done > want:
            self.reset_part()
            rec["outcome"], rec["error"] = "restart", "received more bytes than announced"
            return "restart"
        rec["outcome"] = "complete"
        return "complete"

    def backoff(self, failures):
        base = self.args.backoff * (2 ** max(failures - 1, 0))
        delay = min(base, self.args.backoff_max)
        return delay + random.uniform(0, delay * 0.1)

    # -- whole run
    def run(self):
        args = self.args
        result = {"ok": False, "status": None, "out": self.out, "bytes": None, "sha256": None,
                  "sha256_expected": args.sha256, "verified": None, "source": None, "resumed_from": 0,
                  "attempts": self.attempts, "error": None}
        if os.path.exists(self.out) and not args.force:
            result["bytes"] = os.path.getsize(self.out)
            result["status"] = "already_present"
            digest = sha256_file(self.out).hexdigest()
            result["sha256"] = digest
            if args.sha256:
                result["verified"] = digest == args.sha256
                if not result["verified"]:
                    result["error"] = ("%s exists but its sha256 is %s, not %s: delete it or pass --force"
                                       % (self.out, digest, args.sha256))
                    return result
            result["ok"] = True
            self.progress.note("%s already present (%s)%s" % (self.out, human(result["bytes"]),
                               "" if args.sha256 else "; not verified: pass --sha256"))
            return result
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                result["error"] = "another fetch is already writing %s" % self.part
                return result
            raise
        try:
            self.load_meta()
            result["resumed_from"] = self.size()
            if result["resumed_from"]:
                self.progress.note("resuming %s at %s" % (self.part, human(result["resumed_from"])))
            self.loop(result)
            if not result["ok"] and self.size() == 0:
                os.unlink(self.part)  # nothing worth resuming: leave no empty .part behind
                self.meta = {}
                self.save_meta()
            return result
        finally:
            os.close(self.fd)

    def loop(self, result):
        """Try each source in turn; fills `result` in place."""
        args = self.args
        for index, src in enumerate(self.sources):
            failures = 0
            while failures < args.retries:
                outcome = self.attempt(src)
                rec = self.attempts[-1]
                if outcome == "complete":
                    if self.finish(result, src):
                        return result
                    break  # checksum mismatch: the next source starts from zero
                if outcome == "restart":  # counts as a failure so a confused server cannot loop us forever
                    failures += 1
                    self.progress.note("%s: %s; starting over" % (redact(src), rec["error"]))
                    continue
                if outcome == "fatal":
                    self.progress.note("%s: %s; not retrying this source" % (redact(src), rec["error"]))
                    break
                if outcome == "dropped" and rec["received"] > 0:
                    self.progress.note("%s: %s; resuming" % (redact(src), rec["error"]))
                    time.sleep(min(args.backoff, args.backoff_max))
                    continue
                failures += 1
                if failures < args.retries:
                    delay = self.backoff(failures)
                    self.progress.note("%s: %s (%s); retry %d/%d in %.1fs" % (
                        redact(src), outcome, rec["error"], failures, args.retries - 1, delay))
                    time.sleep(delay)
                else:
                    self.progress.note("%s: %s (%s); giving up on this source" % (redact(src), outcome, rec["error"]))
            if index + 1 < len(self.sources):
                self.progress.note("falling back to %s (keeping %s already downloaded)" % (
                    redact(self.sources[index + 1]), human(self.size())))
        kept = self.size()
        if result["status"] != "checksum_mismatch" or kept:
            result["status"] = "failed"
            result["error"] = ("every source failed; %s kept in %s: re-run the same command to resume"
                               % (human(kept), self.part)) if kept else "every source failed"
        return result

    def finish(self, result, src):
        """Verify and promote the .part. False on a checksum mismatch (the .part is then discarded)."""
        size = self.size()
        self.sync_hasher(size)
        digest = self.hasher.hexdigest()
        result.update({"bytes": size, "sha256": digest, "source": redact(src)})
        if self.args.sha256 and digest != self.args.sha256:
            result.update({"status": "checksum_mismatch", "verified": False,
                           "error": "sha256 of the download from %s is %s, expected %s; partial file deleted"
                                    % (redact(src), digest, self.args.sha256)})
            self.progress.note(result["error"])
            self.reset_part()
            return False
        os.fsync(self.fd)
        os.replace(self.part, self.out)
        fsync_dir(os.path.dirname(self.out))
        self.meta = {}
        self.save_meta()
        result.update({"ok": True, "status": "downloaded", "verified": True if self.args.sha256 else None,
                       "error": None})
        self.progress.note("done: %s (%s) sha256 %s%s" % (self.out, human(size), digest,
                           " verified" if self.args.sha256 else ""))
        return True


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def positive(kind):
    def conv(text):
        try:
            val = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if not 0 < val < 1e9:   # also nan and inf, which overflow sleep and socket timeouts
            raise argparse.ArgumentTypeError("%r must be > 0 and < 1e9" % text)
        return val
    return conv


def build_parser():
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="Exit codes: 0 ok, 1 download or checksum failed, 2 usage/bad input.")
    p.add_argument("url", help="primary http(s) URL")
    p.add_argument("--out", required=True, metavar="FILE", help="final file path (parents are created)")
    p.add_argument("--fallback", action="append", default=[], metavar="URL", help="next source (repeatable)")
    p.add_argument("--sha256", metavar="HEX", help="expected SHA-256 (64 hex digits)")
    p.add_argument("--retries", type=positive(int), default=3, metavar="N",
                   help="failed attempts per source before falling back (default 3)")
    p.add_argument("--stall-seconds", type=positive(float), default=60.0, metavar="S",
                   help="no byte for this long = stalled (default 60)")
    p.add_argument("--connect-timeout", type=positive(float), default=20.0, metavar="S")
    p.add_argument("--backoff", type=positive(float), default=2.0, metavar="S", help="first retry delay")
    p.add_argument("--backoff-max", type=positive(float), default=60.0, metavar="S")
    p.add_argument("--auth-env", metavar="NAME", help="env var holding a bearer token (value never logged)")
    p.add_argument("--force", action="store_true", help="download even if --out already exists")
    p.add_argument("--progress-every", type=positive(float), default=10.0, metavar="S",
                   help="seconds between progress lines when stderr is not a terminal")
    p.add_argument("--quiet", action="store_true", help="no progress or notes on stderr")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


def validate(args):
    for url in [args.url] + args.fallback:
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port   # raises ValueError for a port outside 0-65535
        except ValueError as exc:
            raise UsageError("unusable URL %s: %s" % (redact(url), exc))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError("not an http(s) URL: %s" % redact(url))
    if args.sha256 is not None:
        args.sha256 = args.sha256.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", args.sha256):
            raise UsageError("--sha256 must be 64 hex digits")
    if args.auth_env and not os.environ.get(args.auth_env):
        raise UsageError("--auth-env %s: that environment variable is empty or unset" % args.auth_env)
    if not args.out:
        raise UsageError("--out is empty; give the file name")
    folder = os.path.dirname(os.path.abspath(args.out))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UsageError("cannot create %s: %s" % (folder, exc.strerror))
    if os.path.isdir(args.out):
        raise UsageError("--out %s is a directory; give the file name" % args.out)


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        validate(args)
    except UsageError as exc:
        print("fetch_resumable: error: %s" % exc, file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        result = Fetcher(args).run()
    except KeyboardInterrupt:
        print("\nfetch_resumable: interrupted; re-run the same command to resume", file=sys.stderr)
        return 1
    except OSError as exc:
        result = {"ok": False, "status": "failed", "out": os.path.abspath(args.out),
                  "error": "local I/O error: %s" % exc, "attempts": []}
    result["elapsed_seconds"] = round(time.monotonic() - started, 3)
    if not result["ok"]:
        print("fetch_resumable: FAIL %s" % result["error"], file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
