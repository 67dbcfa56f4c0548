#!/usr/bin/env python3
"""Hashes an explicit roster into PULL_MANIFEST.json; an unmatched pattern, empty result, 0-byte or damaged file fails.

Run this ON THE NODE once the job has finished and its outputs sit in a durable directory. The
manifest binds a run id to the exact files you expect to take home (relative path, size, SHA-256,
and the checkpoint format whose sanity check passed); `pull_verified.py` on your machine refuses
anything that does not match it, and `teardown_gate.py` refuses to bless a teardown until the
pulled copy matches the node's current manifest. The format and every rule below live in
evidence.py beside this file (the one manifest builder and parser of the toolkit); this is its CLI.

Usage:
  build_pull_manifest.py --root DIR --roster GLOB [--roster GLOB]... [--allow-empty GLOB]...
                         [--run-id ID] [--out PATH|-] [--jobs N] [--buffer-mb N] [--json]

  python3 build_pull_manifest.py --root /workspace/durable/results/run-42 \\
      --roster 'checkpoints/**/*.pt' --roster metrics.jsonl --roster final.json

Options:
  --root DIR          the durable directory holding the results (required)
  --roster GLOB       an expected file or glob relative to --root (required, repeatable)
  --allow-empty GLOB  files this glob matches may be zero bytes (repeatable; otherwise a zero-byte
                      file is a failure: a save that was killed leaves one)
  --run-id ID         the run id (default: $RGT_RUN_ID, else the root's directory name)
  --out PATH|-        where to write (default ROOT/PULL_MANIFEST.json); '-' prints it on stdout
  --jobs N            files hashed in parallel (default: min(8, CPUs))
  --buffer-mb N       read buffer per worker in MiB (default 1)
  --json              print a JSON summary on stdout (not with --out -)
  -h, --help          this text

Roster rules (patterns are relative to --root, POSIX separators):
  *  matches within one path component, ?  one character, [abc] a set, ** any number of components;
  unlike a shell, * and ** also match names that start with a dot, so nothing is left out silently.
  An entry that matches a directory takes every file under it. Every entry must match at least one
  file (the unmatched ones are listed by name), and an empty result is a failure, never success.

Content checks: a zero-byte file fails unless --allow-empty covers it; a torch zip archive must have a
readable central directory (and a data.pkl), a safetensors header must parse and fit the file, a
pickle must end with its STOP opcode, a .json file must parse. A file that fails is listed and no
manifest is written.

Symlinks: a link whose target stays inside --root is recorded under the LINK's path with the
TARGET's size and hash (the puller copies content, never links). A link leaving the root, a dangling
link and a link to a directory are not followed; the first two fail when selected, the last is
skipped with a note (list the real directory instead). FIFOs, sockets and devices fail when selected.
The manifest never lists itself, its temp files, or a top-level PULL_MANIFEST.json / PULL_VERIFIED.json.

Output: the manifest is written atomically (temp file, fsync, rename, directory fsync). An --out
that exists and is not a regular file (a device such as /dev/null, a FIFO, a symlink) is refused
before anything is hashed and left untouched. `--out -` prints the manifest on stdout and writes
nothing (the teardown gate's re-hash over ssh uses this). Progress goes to stderr (a live line on a
terminal, a line every 15 s otherwise).

Exit codes:
  0  manifest written
  1  a check failed: unmatched roster entry, empty result, zero-byte or damaged file, symlink
     escape, special file, unreadable file, a file that changed while being hashed, an unusable
     file name, the write failed
  2  usage or bad input: bad flags, --root is not a directory, unsafe roster pattern or run id,
     an --out that is a directory, a device, a FIFO or a symlink
"""
import hashlib
import os
import sys
import time

import rgt_core as core
import evidence
# Kept for callers that still import these from here (teardown_gate.py); the code lives in evidence.py.
from evidence import ancestors_and_self, check_pattern, compile_pattern  # noqa: F401

UsageError = core.UsageError
MANIFEST_NAME = evidence.MANIFEST_NAME
DEFAULT_BUFFER_MB = 1  # measured best by tools/bench_manifest.py (1 vs 4 vs 8 MiB, warm cache)
MAX_REPORTED = 50


def build_parser():
    parser = core.Parser(
        description="Hash an explicit roster of result files into a pull manifest (run on the node).",
        formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--root", required=True, help="durable directory holding the results")
    parser.add_argument("--roster", action="append", required=True, metavar="GLOB",
                        help="expected file or glob relative to --root (repeat; ** allowed)")
    parser.add_argument("--allow-empty", action="append", default=[], metavar="GLOB",
                        help="files matching this glob may be zero bytes (repeatable)")
    parser.add_argument("--run-id", help="run id (default: $RGT_RUN_ID, else the root's directory name)")
    parser.add_argument("--out", help="manifest path (default ROOT/%s); '-' prints to stdout" % MANIFEST_NAME)
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="files hashed in parallel (default: min(8, CPUs))")
    parser.add_argument("--buffer-mb", type=float, default=DEFAULT_BUFFER_MB,
                        help="read buffer per worker in MiB (default %s)" % DEFAULT_BUFFER_MB)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    return parser


def unique_patterns(raw_list):
    out = []
    for raw in raw_list:
        pattern = evidence.check_pattern(raw)
        if pattern not in out:
            out.append(pattern)
    return out


def validate(args):
    """-> (root, patterns, allow_empty, run_id, out or None for stdout); UsageError on bad input."""
    root = os.path.expanduser(args.root)
    if not os.path.isdir(root):
        raise UsageError("--root %r is not a directory" % args.root)
    patterns = unique_patterns(args.roster)
    allow_empty = unique_patterns(args.allow_empty)
    run_id = args.run_id or os.environ.get("RGT_RUN_ID") or os.path.basename(os.path.realpath(root))
    if not evidence.RUN_ID_RE.match(run_id):
        raise UsageError("run id %r is unusable as a directory name; use letters, digits, . _ -" % run_id)
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if not 0.0625 <= args.buffer_mb <= 256:
        raise UsageError("--buffer-mb must be between 0.0625 and 256")
    if args.out == "":
        raise UsageError("--out is empty (give a file name, or '-' for stdout)")
    if args.out == "-":
        return root, patterns, allow_empty, run_id, None
    out = os.path.expanduser(args.out or os.path.join(root, MANIFEST_NAME))
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise UsageError("--out directory does not exist: %s" % folder)
    core.check_replaceable(out)  # a device, FIFO or symlink is refused here, before any hashing
    return root, patterns, allow_empty, run_id, out


def own_files(root, out):
    """Relative paths under ROOT that are this run's own output (the manifest and its temp files)."""
    if out is None:
        return set()
    root_real, out_real = os.path.realpath(root), os.path.realpath(out)
    if not out_real.startswith(root_real.rstrip("/") + "/"):
        return set()
    out_rel = out_real[len(root_real.rstrip("/")) + 1:]
    skip = {out_rel}
    rel_dir, prefix = os.path.dirname(out_rel), ".%s." % os.path.basename(out_real)[:100]
    try:
        names = os.listdir(os.path.dirname(out_real))
    except OSError:
        names = []
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):  # core.atomic_write's temp names
            skip.add("%s/%s" % (rel_dir, name) if rel_dir else name)
    return skip


def report_problems(problems, args, run_id, notes, stream):
    if args.json and stream is sys.stdout:
        core.emit_json({"ok": False, "status": core.FAIL, "run_id": run_id, "problems": problems, "notes": notes})
        return
    for item in problems[:MAX_REPORTED]:
        stream.write("FAIL %s: %s: %s\n" % (item["code"], item["path"], item["detail"]))
    if len(problems) > MAX_REPORTED:
        stream.write("FAIL ... and %d more problems\n" % (len(problems) - MAX_REPORTED))
    stream.write("NO MANIFEST written (%d problem(s)); fix the roster or the files and re-run\n" % len(problems))


def main(argv=None):
    core.check_toolkit()
    args = build_parser().parse_args(argv)
    root, patterns, allow_empty, run_id, out = validate(args)
    report = sys.stderr if out is None else sys.stdout

    started = time.monotonic()
    manifest, problems, notes = evidence.build_manifest(
        root, patterns, run_id, allow_empty=allow_empty, skip=own_files(root, out), jobs=args.jobs,
        bufsize=int(args.buffer_mb * 1024 * 1024))
    seconds = time.monotonic() - started
    for note in notes:
        sys.stderr.write("NOTE skipped %s: %s\n" % (note["path"], note["reason"]))
    if problems:
        report_problems(problems, args, run_id, notes, report)
        return core.EXIT_FAIL

    data = evidence.manifest_bytes(manifest)
    try:
        core.atomic_write("-" if out is None else out, data)
    except OSError as exc:
        report.write("FAIL write: %s: %s\n" % (out, exc.strerror or exc))
        return core.EXIT_FAIL
    rate = manifest["total_bytes"] / max(seconds, 1e-9)
    summary = {"ok": True, "status": core.OK, "out": "-" if out is None else os.path.abspath(out),
               "run_id": run_id, "file_count": manifest["file_count"], "total_bytes": manifest["total_bytes"],
               "allow_empty": allow_empty, "manifest_sha256": hashlib.sha256(data).hexdigest(),
               "seconds": round(seconds, 3), "bytes_per_second": round(rate), "notes": notes}
    if args.json and out is not None:
        core.emit_json(summary)
    else:
        report.write("OK manifest %s: %d files, %s (run %s) hashed in %.2f s (%s/s)\n" % (
            summary["out"], manifest["file_count"], core.human_bytes(manifest["total_bytes"]), run_id, seconds,
            core.human_bytes(rate)))
    return core.EXIT_OK


if __name__ == "__main__":
    sys.exit(core.run_main(main))
