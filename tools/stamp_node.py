#!/usr/bin/env python3
"""Writes scripts/node/VERSION.json, the content hash every node tool checks before it runs (--check: 1 if stale).

The node folder travels to the GPU box as one unit; every node tool refuses to run when a file
differs from this stamp (rgt_core.check_toolkit), so an old deadman.py can never run beside a new
core. Run this after changing anything under scripts/node/; a test fails while the stamp is stale.

Usage:
  stamp_node.py [--check] [--json]

  --check   write nothing; exit 1 when VERSION.json is stale (what the test runs)
  --json    print the stamp on stdout

Exit codes: 0 written (or fresh with --check), 1 stale (--check), 2 usage.
"""
import argparse
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NODE = os.path.join(HERE, "..", "scripts", "node")
sys.path.insert(0, NODE)
import rgt_core as core  # noqa: E402

TOOL_SUFFIXES = (".py", ".sh", ".json")


def compute(folder=NODE):
    files = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name in (core.STAMP_NAME, "index.json") or not name.endswith(TOOL_SUFFIXES) or not os.path.isfile(path):
            continue
        files[name] = core.file_sha256(path)
    joined = "".join("%s %s\n" % item for item in sorted(files.items())).encode("utf-8")
    return {"schema": "rgt-node-version/1", "version": hashlib.sha256(joined).hexdigest()[:16], "files": files}


def main(argv=None):
    parser = core.Parser(description="Stamp scripts/node/VERSION.json (content hash of the node toolkit).",
                         epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--check", action="store_true", help="exit 1 when the stamp is stale; write nothing")
    parser.add_argument("--json", action="store_true", help="print the stamp on stdout")
    args = parser.parse_args(argv)
    stamp = compute()
    current = core.read_stamp(NODE)
    path = os.path.join(NODE, core.STAMP_NAME)
    if args.check:
        fresh = current.get("files") == stamp["files"] and current.get("version") == stamp["version"]
        if args.json:
            core.emit_json({"fresh": fresh, "version": stamp["version"]})
        print("%s %s (version %s)" % (core.OK if fresh else core.STALE, path, stamp["version"]), file=sys.stderr)
        if not fresh:
            print("  run: python3 tools/stamp_node.py", file=sys.stderr)
        return 0 if fresh else 1
    core.atomic_write_json(path, stamp)
    if args.json:
        core.emit_json(stamp)
    print("%s stamped %s: version %s, %d files" % (core.OK, path, stamp["version"], len(stamp["files"])),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(core.run_main(main))
