#!/usr/bin/env python3
"""Downloads one URL over a bad link: resumes, retries, catches stalls, falls back to mirrors, checks a hash.

Python 3.8+ and the standard library; part of the node toolkit (push the whole scripts/node folder:
this script imports rgt_core.py beside it).

  python3 fetch_resumable.py URL --out FILE [--fallback URL]... [--sha256 HEX]
  python3 fetch_resumable.py https://hf-mirror.com/<org>/<repo>/resolve/main/model.safetensors \\
      --fallback https://huggingface.co/<org>/<repo>/resolve/main/model.safetensors \\
      --out "$DATA_DIR/models/model.safetensors" --sha256 <64 hex> --stall-seconds 60 --json

Options:
  URL                    the primary http(s) source
  --out FILE             the final file (required; parent directories are created)
  --fallback URL         the next source when one gives up (repeatable, tried in order)
  --sha256 HEX           the expected SHA-256 (64 hex digits)
  --retries N            failed attempts per source before falling back (default 3)
  --stall-seconds S      no byte for this long = stalled (default 60)
  --connect-timeout S    connect and first-answer timeout (default 20)
  --backoff S            first retry delay, doubling (default 2)
  --backoff-max S        the longest retry delay (default 60)
  --auth-env NAME        environment variable holding a bearer token (its value is never shown or stored)
  --force                download again even when --out exists (a regular file only)
  --progress-every S     seconds between progress lines when stderr is not a terminal (default 10)
  --quiet                no progress or notes on stderr
  --json                 print the result as JSON on stdout
  -h, --help             this text

How it behaves:
  * Bytes go to FILE.part (progress notes in FILE.part.json). Re-running the same command resumes with an
    HTTP Range request; If-Range (the server's ETag/Last-Modified) makes a changed file restart from 0.
  * A stall is "no byte arrived for --stall-seconds": the connection is dropped and retried.
  * Progress is counted in offsets, not in bytes received: an attempt that ends with FILE.part longer than
    where it started (a dropped connection that was resumable) is retried at once without using up a retry.
    Anything else uses one: a stall, an error, no progress, or a server that ignores Range and drops the
    connection mid-body (each answer restarts the file from 0, so the offset never moves forward).
  * Each source gets --retries such attempts, with exponential backoff (--backoff doubling up to
    --backoff-max); then the next --fallback takes over, resuming the same .part when it reports the same
    total size. HTTP 404/403/401/410 moves on without retrying.
  * The SHA-256 is computed while downloading. With --sha256, a mismatch deletes the .part and tries the
    next source from scratch; if none verifies, exit 1 and no FILE is left behind.
  * On success the .part is fsynced and renamed to FILE (atomic), and FILE.part.json is removed.
  * An existing FILE is kept (verified when --sha256 is given) unless --force. An existing FILE, FILE.part
    or FILE.part.json that is not a regular file (a device such as /dev/null, a FIFO, a symlink) is refused
    with exit 2 and left untouched, with or without --force.
  * Secrets: --auth-env NAME sends "Authorization: Bearer $NAME" and https://user:password@host/... sends
    HTTP Basic auth (neither on redirects to other hosts). Nothing secret is written anywhere: logs, the
    JSON result and FILE.part.json show URLs without user:password@ and with the query string (where signed
    URLs carry their signature) replaced by <redacted>; the "same source" check of a resume compares a
    SHA-256 of the full URL instead of the URL. *_proxy variables apply.
  * Progress goes to stderr: a live line on a terminal, one line per --progress-every seconds otherwise.

Exit codes: 0 downloaded and (if asked) verified, or already present; 1 every source failed or the
checksum did not match (the .part is kept for a resume, except after a mismatch); 2 usage or bad input.
"""
import argparse
import base64
import errno
import fcntl
import hashlib
import http.client
import os
import random
import re
import socket
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import rgt_core as core

CHUNK = 256 * 1024
FATAL_HTTP = {401, 403, 404, 410}
UsageError = core.UsageError


class Stalled(Exception):
    pass


def redact(url):
    """URL for logs and state files: no credentials, no query string (signed URLs carry tokens there)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:   # a bad IPv6 literal, or a port that is not 0-65535
        return "<unparseable url>"
    if port:
        host = "%s:%d" % (host, port)
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "<redacted>" if parts.query else "", ""))


def url_hash(url):
    """What the 'same source' check keeps on disk instead of the URL itself."""
    return hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()


def secrets_of(url):
    """The parts of URL that must never reach a log or a file: query, fragment, user:password."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return [url]
    found = [p for p in (parts.query, parts.fragment, parts.password) if p]
    if "@" in parts.netloc:
        found.append(parts.netloc.rsplit("@", 1)[0])
    for text in list(found):  # quoted forms too: urllib quotes when it echoes a URL in an error
        found += [urllib.parse.quote(text, safe=""), urllib.parse.unquote(text)]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def split_credentials(url):
    """(url without user:password@, Basic auth header value or None); urllib cannot resolve user:pass@host."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, hostport = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    token = "%s:%s" % (urllib.parse.unquote(user), urllib.parse.unquote(password))
    bare = urllib.parse.urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
    return bare, "Basic " + base64.b64encode(token.encode("utf-8")).decode("ascii")


def prefix_hasher(path, upto):
    """A SHA-256 object fed with the first UPTO bytes of PATH (to continue hashing a resumed .part)."""
    digest = hashlib.sha256()
    left = upto
    with open(path, "rb") as handle:
        while left > 0:
            block = handle.read(min(4 << 20, left))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest


class Fetcher:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.part = self.out + ".part"
        self.meta_path = self.out + ".part.json"
        self.sources = [args.url] + list(args.fallback)
        self.secrets = sorted({s for src in self.sources for s in secrets_of(src)}, key=len, reverse=True)
        self.attempts = []
        self.meta = {}
        self.fd = None
        self.hasher = hashlib.sha256()
        self.hashed = 0
        self.token = os.environ.get(args.auth_env) if args.auth_env else None
        if self.token:
            self.secrets.insert(0, self.token)
        self.meter = None

    # -- messages: nothing secret leaves this process
    def scrub(self, text):
        text = str(text)
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def note(self, msg):
        if self.meter is not None and self.meter.printed and self.meter.tty:
            sys.stderr.write("\n")
            self.meter.printed = False
        if not self.args.quiet:
            sys.stderr.write("fetch: %s\n" % self.scrub(msg))
            sys.stderr.flush()

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
            core.atomic_write_json(self.meta_path, self.meta)
        elif os.path.lexists(self.meta_path):
            os.unlink(self.meta_path)

    def load_meta(self):
        data = core.read_json(self.meta_path)
        self.meta = {k: data.get(k) for k in ("source", "source_sha256", "total", "etag", "last_modified",
                                                "updated_at") if k in data}
        if isinstance(self.meta.get("source"), str) and self.meta["source"] != redact(self.meta["source"]):
            self.meta["source"] = redact(self.meta["source"])  # an older version stored the full URL
            self.save_meta()

    def sync_hasher(self, offset):
        if self.hashed != offset:
            self.hasher = prefix_hasher(self.part, offset)
            self.hashed = offset

    # -- one HTTP attempt from the current .part size
    def attempt(self, src):
        offset = self.size()
        rec = {"source": redact(src), "offset": offset, "end_offset": offset, "received": 0, "outcome": None,
               "http_status": None, "error": None, "started_at": core.utc_iso()}
        self.attempts.append(rec)
        try:
            outcome = self.request(src, offset, rec)
        finally:
            rec["end_offset"] = self.size()
            if rec["error"]:
                rec["error"] = self.scrub(rec["error"])
        return outcome

    def request(self, src, offset, rec):
        bare, basic = split_credentials(src)
        headers = {"User-Agent": "rgt-fetch-resumable/1", "Accept-Encoding": "identity"}
        if offset > 0:
            headers["Range"] = "bytes=%d-" % offset
            validator = self.meta.get("etag") or self.meta.get("last_modified")
            if validator and self.meta.get("source_sha256") == url_hash(src) and not str(validator).startswith("W/"):
                headers["If-Range"] = validator
        req = urllib.request.Request(bare, headers=headers)
        if basic:
            req.add_unredirected_header("Authorization", basic)
        elif self.token:
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
                self.note("%s ignored the Range request (or the file changed): starting again from 0" % redact(src))
                self.reset_part()
                offset = 0
            total = int(length) if length and length.isdigit() else None
        else:
            rec["outcome"], rec["error"] = "error", "unexpected HTTP status %d" % status
            return "error"
        self.meta.update({"source": redact(src), "source_sha256": url_hash(src),
                          "total": total or self.meta.get("total"), "etag": resp.headers.get("ETag"),
                          "last_modified": resp.headers.get("Last-Modified"), "updated_at": core.utc_iso()})
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
        self.meter = core.Progress("fetch from %s" % (urllib.parse.urlsplit(src).hostname or "?"), want or 0,
                                   enabled=not self.args.quiet)
        if not self.meter.tty:
            self.meter.interval = self.args.progress_every
        self.meter.done = offset
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
                self.meter.add(len(block))
        except Stalled:
            rec["outcome"] = "stalled"
            rec["error"] = "no byte for %gs at %s" % (self.args.stall_seconds, core.human_bytes(done))
            return "stalled"
        except (http.client.IncompleteRead, OSError, http.client.HTTPException) as exc:
            rec["outcome"] = "dropped"
            rec["error"] = "connection broke at %s: %s" % (core.human_bytes(done), exc.__class__.__name__)
            return "dropped"
        finally:
            self.meter.close()
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
        if os.path.lexists(self.out) and not args.force:
            result["bytes"], digest = core.sha256_file(self.out)
            result["status"] = "already_present"
            result["sha256"] = digest
            if args.sha256:
                result["verified"] = digest == args.sha256
                if not result["verified"]:
                    result["error"] = ("%s exists but its sha256 is %s, not %s: delete it or pass --force"
                                       % (self.out, digest, args.sha256))
                    return result
            result["ok"] = True
            self.note("%s already present (%s)%s" % (self.out, core.human_bytes(result["bytes"]),
                                                      "" if args.sha256 else "; not verified: pass --sha256"))
            return result
        self.fd = os.open(self.part, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise UsageError("%s is not a regular file; refusing to write into it" % self.part)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    result["error"] = "another fetch is already writing %s" % self.part
                    return result
                raise
            self.load_meta()
            result["resumed_from"] = self.size()
            if result["resumed_from"]:
                self.note("resuming %s at %s" % (self.part, core.human_bytes(result["resumed_from"])))
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
                if outcome == "fatal":
                    self.note("%s: %s; not retrying this source" % (redact(src), rec["error"]))
                    break
                # Progress is an offset that moved forward, not bytes received: a server that answers every
                # Range request with the whole file from 0 and drops mid-body receives bytes on every attempt
                # and never gets further (finding 9).
                progressed = outcome == "dropped" and rec["end_offset"] > rec["offset"]
                rec["progress"] = progressed
                if progressed:
                    self.note("%s: %s; resuming" % (redact(src), rec["error"]))
                    time.sleep(min(args.backoff, args.backoff_max))
                    continue
                failures += 1
                if failures < args.retries:
                    delay = self.backoff(failures)
                    self.note("%s: %s (%s); no progress, retry %d/%d in %.1fs" % (
                        redact(src), outcome, rec["error"], failures, args.retries - 1, delay))
                    time.sleep(delay)
                else:
                    self.note("%s: %s (%s); %d attempt(s) without progress, giving up on this source" % (
                        redact(src), outcome, rec["error"], failures))
            if index + 1 < len(self.sources):
                self.note("falling back to %s (keeping %s already downloaded)" % (
                    redact(self.sources[index + 1]), core.human_bytes(self.size())))
        kept = self.size()
        if result["status"] != "checksum_mismatch" or kept:
            result["status"] = "failed"
            result["error"] = ("every source failed; %s kept in %s: re-run the same command to resume"
                               % (core.human_bytes(kept), self.part)) if kept else "every source failed"
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
            self.note(result["error"])
            self.reset_part()
            return False
        os.fsync(self.fd)
        core.check_replaceable(self.out)  # nothing but a regular file (or nothing) is ever replaced
        os.replace(self.part, self.out)
        core.fsync_dir(os.path.dirname(self.out))
        self.meta = {}
        self.save_meta()
        result.update({"ok": True, "status": "downloaded", "verified": True if self.args.sha256 else None,
                       "error": None})
        self.note("done: %s (%s) sha256 %s%s" % (self.out, core.human_bytes(size), digest,
                                                 " verified" if self.args.sha256 else ""))
        return True


def positive(kind):
    return core.arg_number(kind, 0, 1e9, low_open=True)  # 1e9: also nan and inf, which overflow sleep


def build_parser():
    p = core.Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=core.exit_codes_epilog(__doc__))
    p.add_argument("url", help="primary http(s) URL")
    p.add_argument("--out", required=True, metavar="FILE", help="final file path (parents are created)")
    p.add_argument("--fallback", action="append", default=[], metavar="URL", help="next source (repeatable)")
    p.add_argument("--sha256", metavar="HEX", help="expected SHA-256 (64 hex digits)")
    p.add_argument("--retries", type=positive(int), default=3, metavar="N",
                   help="attempts without progress per source before falling back (default 3)")
    p.add_argument("--stall-seconds", type=positive(float), default=60.0, metavar="S",
                   help="no byte for this long = stalled (default 60)")
    p.add_argument("--connect-timeout", type=positive(float), default=20.0, metavar="S",
                   help="seconds to wait for a connection (default 20)")
    p.add_argument("--backoff", type=positive(float), default=2.0, metavar="S", help="first retry delay")
    p.add_argument("--backoff-max", type=positive(float), default=60.0, metavar="S",
                   help="longest wait between retries (default 60)")
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
    if args.auth_env is not None and (not args.auth_env or not os.environ.get(args.auth_env)):
        raise UsageError("--auth-env %s: that environment variable is empty or unset" % args.auth_env)
    if not args.out:
        raise UsageError("--out is empty; give the file name")
    if os.path.isdir(args.out):
        raise UsageError("--out %s is a directory; give the file name" % args.out)
    out = os.path.abspath(args.out)
    for path in (out, out + ".part", out + ".part.json"):
        core.check_replaceable(path)  # a device, FIFO or symlink is never written into or replaced
    folder = os.path.dirname(out)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise UsageError("cannot create %s: %s" % (folder, exc.strerror))


def main(argv=None):
    core.check_toolkit()
    args = build_parser().parse_args(argv)
    validate(args)
    started = time.monotonic()
    fetcher = Fetcher(args)
    try:
        result = fetcher.run()
    except KeyboardInterrupt:
        core.say_error("interrupted; re-run the same command to resume")
        return 130
    except OSError as exc:
        result = {"ok": False, "status": "failed", "out": os.path.abspath(args.out),
                  "error": "local I/O error: %s" % exc, "attempts": fetcher.attempts}
    result["error"] = fetcher.scrub(result["error"]) if result.get("error") else result.get("error")
    result["elapsed_seconds"] = round(time.monotonic() - started, 3)
    if not result["ok"]:
        core.say_error(result["error"])
    if args.json:
        core.emit_json(result)
    return core.EXIT_OK if result["ok"] else core.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(core.run_main(main))
