#!/usr/bin/env python3
"""Re-derives every number a document binds to a metrics file and names each one that no longer matches.

A number in prose is a copy; copies drift. Bind each reported number to its source once, and this
script re-derives every bound number and reports the ones that no longer match, with file and line.

Bindings (paths are relative to the document's folder, or to --base):
  Markdown   Top-1 accuracy is 76.1% <!-- metric: runs/r1/metrics.json#eval.top1*100 -->
  LaTeX      ResNet-50 & 76.1 \\\\ % metric: runs/r1/metrics.json#eval.top1*100
  CSV        a column named `source` holds PATH per row; every other numeric column is compared
             with the key of the same name in that file (columns the file lacks are skipped)
The number compared is the last number before the binding on the same line.

Keys: dotted paths into JSON (`eval.top1`, `history.3.loss`); for JSON Lines and CSV metrics files,
a field name with an optional reducer: `val_acc` (last record), `val_acc@max`, `val_acc@min`,
`val_acc@first`, `val_acc@mean`. A trailing `*100` or `/1000` scales the source value.

Tolerance: the document's own precision (76.1 matches 76.05 up to 76.15), or --abs-tol/--rel-tol.

Usage:
  python3 scripts/reconcile.py paper.md results.csv tables.tex
  python3 scripts/reconcile.py --json README.md
  python3 scripts/reconcile.py --quiet paper.md      # print only drift and broken bindings

Exit codes: 0 every bound number matches; 1 drift, or a binding that cannot be resolved;
2 usage or unreadable input; 4 no bindings found at all (nothing was checked).
"""
import argparse
import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "node"))
import rgt_core as core  # noqa: E402  (one-line usage errors, the exit-code contract)

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
MD_TAG = re.compile(r"<!--\s*metric:\s*(\S+?)\s*-->")
TEX_TAG = re.compile(r"(?<!\\)%\s*metric:\s*(\S+)")
REDUCERS = {
    "last": lambda xs: xs[-1],
    "first": lambda xs: xs[0],
    "max": max,
    "min": min,
    "mean": statistics.fmean,
}


class Unresolved(Exception):
    """A binding that points at nothing usable."""


def parse_number(text: str) -> float:
    return float(text.replace(",", ""))


def decimals(text: str) -> int:
    """Decimal places the claim is written to, exponent included: 76.1 -> 1, 3e-4 -> 4, 1.5e3 -> -2."""
    parts = re.split(r"[eE]", text.replace(",", ""))
    places = len(parts[0].split(".")[1]) if "." in parts[0] else 0
    try:
        return places - (int(parts[1]) if len(parts) > 1 else 0)
    except ValueError:
        return places


def load_records(path: Path):
    """A metrics file as a list of dict records (JSON object → one record)."""
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise Unresolved(f"source file not found: {path}")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unresolved(f"cannot read {path}: {exc}")
    try:
        if suffix == ".jsonl":
            return [json.loads(l) for l in text.splitlines() if l.strip()]
        if suffix == ".csv":
            return list(csv.DictReader(text.splitlines()))
        data = json.loads(text)
    except (json.JSONDecodeError, csv.Error) as exc:
        raise Unresolved(f"cannot parse {path}: {exc}")
    return data if isinstance(data, list) else [data]


def dig(record, dotted: str):
    node = record
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            raise KeyError(dotted)
    return node


def resolve(path: Path, key: str) -> float:
    """The source value of PATH#KEY (with reducer and scale)."""
    scale = 1.0
    m = re.search(r"([*/])(\d+(?:\.\d+)?)$", key)
    if m:
        factor = float(m.group(2))
        scale = factor if m.group(1) == "*" else 1.0 / factor
        key = key[: m.start()]
    key, _, reducer = key.partition("@")
    records = load_records(path)
    if not records:
        raise Unresolved(f"{path} holds no records")
    if reducer and reducer not in REDUCERS:
        raise Unresolved(f"unknown reducer @{reducer} (use {', '.join(REDUCERS)})")
    if len(records) == 1 and not reducer:
        values = [dig_number(records[0], key, path)]
    else:
        values = [v for v in (dig_number(r, key, path, optional=True) for r in records) if v is not None]
        if not values:
            raise Unresolved(f"key {key!r} not found in any record of {path}")
    return REDUCERS[reducer or "last"](values) * scale


def dig_number(record, key, path, optional=False):
    try:
        value = dig(record, key)
    except KeyError:
        if optional:
            return None
        raise Unresolved(f"key {key!r} not found in {path}")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise Unresolved(f"{path}#{key} is not a number: {value!r}")
    if math.isnan(value):
        raise Unresolved(f"{path}#{key} is NaN")
    return value


def claims_in_text(path: Path, text: str, tag: re.Pattern):
    """Yield (line, claimed text, binding) for tagged lines of a Markdown or LaTeX document."""
    for lineno, line in enumerate(text.splitlines(), 1):
        pos = 0
        for m in tag.finditer(line):
            numbers = list(NUMBER.finditer(line, pos, m.start()))
            yield lineno, (numbers[-1].group(0) if numbers else None), m.group(1)
            pos = m.end()


def claims_in_csv(path: Path, text: str):
    """Yield (line, claimed text, binding) for each numeric cell of a CSV with a `source` column."""
    rows = list(csv.reader(text.splitlines()))
    if not rows or "source" not in rows[0]:
        return
    header = rows[0]
    src_col = header.index("source")
    for lineno, row in enumerate(rows[1:], 2):
        if len(row) != len(header) or not row[src_col].strip():
            continue
        for col, cell in zip(header, row):
            if col == "source" or not NUMBER.fullmatch(cell.strip()):
                continue
            yield lineno, cell.strip(), f"{row[src_col].strip()}#{col}", True


def check_document(doc: Path, base: Path, abs_tol, rel_tol):
    text = doc.read_text(encoding="utf-8")
    suffix = doc.suffix.lower()
    if suffix == ".csv":
        claims = claims_in_csv(doc, text)
    elif suffix in (".tex", ".sty"):
        claims = ((*c, False) for c in claims_in_text(doc, text, TEX_TAG))
    else:
        claims = ((*c, False) for c in claims_in_text(doc, text, MD_TAG))
    results = []
    for lineno, claimed, binding, skip_missing_key in claims:
        where = f"{doc}:{lineno}"
        rel, _, key = binding.partition("#")
        row = {"where": where, "binding": binding, "claimed": claimed}
        if claimed is None:
            results.append({**row, "status": "BROKEN", "detail": "no number before the binding on this line"})
            continue
        if not key:
            results.append({**row, "status": "BROKEN", "detail": "binding has no #key"})
            continue
        try:
            source = resolve((base or doc.parent) / rel, key)
        except Unresolved as exc:
            if skip_missing_key and "not found in" in str(exc) and "source file" not in str(exc):
                continue  # a CSV column the metrics file does not track
            results.append({**row, "status": "BROKEN", "detail": str(exc)})
            continue
        value = parse_number(claimed)
        tol = max(abs_tol if abs_tol is not None else 0.5 * 10 ** -decimals(claimed),
                  (rel_tol or 0.0) * abs(source)) + 1e-12 * max(1.0, abs(source))
        status = "OK" if abs(value - source) <= tol else "DRIFT"
        results.append({**row, "status": status, "source": source, "tolerance": tol})
    return results


def fmt(r):
    if r["status"] == "BROKEN":
        return f"BROKEN {r['where']}: {r['binding']}: {r['detail']}"
    rel = "" if r["status"] == "OK" else f" (fix: write {r['source']:.6g} or re-run the source)"
    return f"{r['status']} {r['where']}: claims {r['claimed']}, {r['binding']} is {r['source']:.6g}{rel}"


def main(argv=None) -> int:
    ap = core.Parser(description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("documents", nargs="+", type=Path, help="Markdown, LaTeX or CSV documents to check")
    ap.add_argument("--base", type=Path, help="resolve binding paths from here instead of each document's folder")
    ap.add_argument("--abs-tol", type=float, help="absolute tolerance (default: half the document's last digit)")
    ap.add_argument("--rel-tol", type=float, help="relative tolerance, added to the absolute one")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("--quiet", action="store_true", help="print only drift and broken bindings")
    args = ap.parse_args(argv)
    for flag, value in (("--abs-tol", args.abs_tol), ("--rel-tol", args.rel_tol)):
        if value is not None and not 0 <= value < math.inf:   # also nan
            ap.error(f"{flag} must be a finite number >= 0, got {value}")
    if args.base is not None and not args.base.is_dir():
        ap.error(f"--base {args.base} is not a directory")

    results = []
    for doc in args.documents:
        try:
            results.extend(check_document(doc, args.base, args.abs_tol, args.rel_tol))
        except FileNotFoundError:
            print(f"error: document not found: {doc}", file=sys.stderr)
            return 2
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: cannot read {doc}: {exc}", file=sys.stderr)
            return 2
    bad = [r for r in results if r["status"] != "OK"]
    if args.json:
        print(json.dumps({"checked": len(results), "drift": sum(r["status"] == "DRIFT" for r in results),
                          "broken": sum(r["status"] == "BROKEN" for r in results), "results": results}, indent=2))
    else:
        for r in results:
            if r["status"] != "OK" or not args.quiet:
                print(fmt(r))
        print(f"{len(results)} bound numbers checked, {len(bad)} problem(s)", file=sys.stderr)
    if not results:
        if not args.json:
            print("NONE no bindings found: add <!-- metric: FILE#KEY --> after each reported number", file=sys.stderr)
        return 4
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="reconcile.py"))
