#!/usr/bin/env python3
"""Lists the platform facts whose "verified" month is older than a threshold, so someone re-checks them (advisory).

Every money- or data-affecting fact carries a month: `verified: YYYY-MM` in a profile's frontmatter,
and "verified YYYY-MM" next to a source in profile and reference bodies. Prices, billing actions and
grace windows change; this lists the stamps older than --max-age-months so someone re-checks them.

Usage:
  python3 tools/check_staleness.py                      # stamps older than 6 months
  python3 tools/check_staleness.py --max-age-months 3 --json
  python3 tools/check_staleness.py --strict             # exit 1 when anything is stale (for a CI job)
  python3 tools/check_staleness.py --root DIR --today 2027-01   # another checkout; pretend it is that month

Exit codes: 0 nothing stale, or stale stamps listed without --strict; 1 --strict and something is stale
or a stamp lies in the future; 2 usage or bad input.
"""
import argparse
import json
import re
import sys
import time
from pathlib import Path

STAMP = re.compile(r"\bverified:?\s+\(?(\d{4})-(\d{2})\b", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, "error: %s\n" % message)


def month(text):
    m = re.fullmatch(r"(\d{4})-(\d{2})", text or "")
    if not m or not 1 <= int(m.group(2)) <= 12:
        raise argparse.ArgumentTypeError("expected YYYY-MM, got %r" % text)
    return int(m.group(1)), int(m.group(2))


def non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number of months, got %r" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def stamps(root):
    """Yield (relative path, line, (year, month)) for every verified stamp under profiles/ and references/."""
    for sub in ("profiles", "references"):
        for path in sorted((root / sub).rglob("*.md")) if (root / sub).is_dir() else []:
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise SystemExit("error: cannot read %s: %s" % (path, exc))
            for n, line in enumerate(lines, 1):
                for m in STAMP.finditer(line):
                    yield path.relative_to(root).as_posix(), n, (int(m.group(1)), int(m.group(2)))


def main(argv=None):
    ap = Parser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the skill's root (default: this checkout)")
    ap.add_argument("--max-age-months", type=non_negative_int, default=6, help="older than this is stale (6)")
    ap.add_argument("--today", type=month, help="YYYY-MM to measure from (default: this month)")
    ap.add_argument("--strict", action="store_true", help="exit 1 when anything is stale")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = ap.parse_args(argv)
    if not (args.root / "profiles").is_dir() and not (args.root / "references").is_dir():
        print("error: %s has neither profiles/ nor references/" % args.root, file=sys.stderr)
        return 2
    now = args.today or tuple(time.gmtime()[:2])
    findings, total = [], 0
    for path, line, (y, m) in stamps(args.root):
        total += 1
        age = (now[0] - y) * 12 + (now[1] - m)
        if age < 0:
            findings.append({"status": "FUTURE", "file": path, "line": line, "verified": "%04d-%02d" % (y, m),
                             "age_months": age})
        elif age > args.max_age_months:
            findings.append({"status": "STALE", "file": path, "line": line, "verified": "%04d-%02d" % (y, m),
                             "age_months": age})
    if args.json:
        print(json.dumps({"today": "%04d-%02d" % now, "max_age_months": args.max_age_months,
                          "stamps": total, "findings": findings}, indent=2))
    else:
        for f in findings:
            print("%s %s:%d verified %s (%d months) -- re-check against its source and update the month"
                  % (f["status"], f["file"], f["line"], f["verified"], f["age_months"]))
        print("%d stamps, %d stale or in the future (limit %d months from %04d-%02d)"
              % (total, len(findings), args.max_age_months, now[0], now[1]), file=sys.stderr)
    future = any(f["status"] == "FUTURE" for f in findings)
    return 1 if (args.strict and findings) or future else 0


if __name__ == "__main__":
    sys.exit(main())
