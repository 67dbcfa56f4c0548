#!/usr/bin/env python3
"""Validates profile frontmatter; regenerates profiles/index.json and the platform tables (--check writes nothing).

Local-side tool (needs PyYAML; uses jsonschema when installed). It reads the YAML
frontmatter of every ``profiles/*.md`` (except README.md and files starting with
``_``), validates it against ``profiles/profile.schema.json``, checks that
``platform`` equals the file stem, then writes:

  * ``profiles/index.json`` -- ``{"generated_by", "schema_version", "profiles": {id: frontmatter}}``,
    sorted keys, stable bytes, written atomically;
  * the platform table between the marker lines
    ``<!-- BEGIN GENERATED: platform-table -->`` and ``<!-- END GENERATED: platform-table -->``
    in ``SKILL.md`` and ``README.md`` (rows: local first, then by id).

Files whose content would not change are left untouched.

Usage:
  python3 tools/build_profile_index.py            # regenerate index + tables
  python3 tools/build_profile_index.py --check    # write nothing; exit 1 if anything is stale
  python3 tools/build_profile_index.py --root /tmp/copy --json

Exit codes:
  0  everything valid (and written, or already fresh under --check)
  1  a profile failed validation, or --check found a stale file
  2  usage or bad input: PyYAML missing, no profiles, a file lacks the markers, bad --root
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "node"))
import rgt_core as core  # noqa: E402  (the one atomic write)

GENERATED_BY = "tools/build_profile_index.py"
SCHEMA_VERSION = 1
BEGIN = "<!-- BEGIN GENERATED: platform-table -->"
END = "<!-- END GENERATED: platform-table -->"
TABLE_FILES = ("SKILL.md", "README.md")
HEADER = ("| Platform | Stop the meter | What that destroys | Still billing when paused | Checked |\n"
          "|---|---|---|---|---|\n")
# SKILL.md has a character budget (8,000 bytes): its table names the stop only; what it destroys and what
# still bills live in the profile (section 5), one hop away, and in README.md's full table.
COMPACT_HEADER = "| Platform | Stop the meter |\n|---|---|\n"


class UsageError(Exception):
    """Bad input: reported as one line, exit 2."""


def _say(msg: str) -> None:
    print(msg, file=sys.stderr)


def _field_path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def read_frontmatter(path: Path, yaml):
    """Return (data, error). The frontmatter is the YAML between the first two '---' lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read: {exc}"
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return None, "no frontmatter: the file must start with a '---' line"
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            break
    else:
        return None, "frontmatter is not closed by a second '---' line"
    try:
        data = yaml.safe_load("\n".join(lines[1:i]))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        return None, f"frontmatter is not valid YAML{line}: {getattr(exc, 'problem', exc)}"
    if not isinstance(data, dict):
        return None, "frontmatter must be a mapping"
    return data, None


def _non_json(value, parts):
    """Yield paths of values JSON cannot represent as-is (YAML dates, sets, ...)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                yield _field_path(parts + [str(k)]), f"key {k!r} is not a string"
            yield from _non_json(v, parts + [str(k)])
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _non_json(v, parts + [i])
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        yield _field_path(parts), f"{type(value).__name__} value {value!r}; quote it as a string"


def load_profiles(root: Path):
    """Return (profiles {id: data}, errors [(file, field, message)], schema_checked)."""
    try:
        import yaml  # lazy: --help must work without PyYAML
    except ImportError:
        raise UsageError("PyYAML is required: pip install pyyaml") from None
    pdir = root / "profiles"
    if not pdir.is_dir():
        raise UsageError(f"no profiles/ directory under {root}")
    files = sorted(p for p in pdir.glob("*.md")
                   if not p.name.startswith("_") and p.name.lower() != "readme.md")
    if not files:
        raise UsageError(f"no profiles/*.md found under {root}")
    schema_path = pdir / "profile.schema.json"
    try:
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {schema_path}: {exc}") from None
    try:
        import jsonschema
        validator = jsonschema.Draft202012Validator(schema)
    except ImportError:
        validator = None
        _say("WARN jsonschema is not installed: schema validation skipped (pip install jsonschema)")

    profiles, errors = {}, []
    for path in files:
        rel = f"profiles/{path.name}"
        data, err = read_frontmatter(path, yaml)
        if err:
            errors.append((rel, "(frontmatter)", err))
            continue
        bad = list(_non_json(data, []))
        errors.extend((rel, field, msg) for field, msg in bad)
        if validator is not None and not bad:
            for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
                errors.append((rel, _field_path(list(e.absolute_path)), e.message))
        if data.get("platform") != path.stem:
            errors.append((rel, "platform", f"{data.get('platform')!r} must equal the file stem {path.stem!r}"))
        profiles[path.stem] = data
    return profiles, errors, validator is not None


def render_index(profiles) -> str:
    doc = {"generated_by": GENERATED_BY, "schema_version": SCHEMA_VERSION, "profiles": profiles}
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _cell(value) -> str:
    text = " ".join(str(value).split())
    return text.replace("|", "\\|")


def render_table(profiles, compact=False) -> str:
    order = sorted(profiles, key=lambda pid: (pid != "local", pid))
    rows = []
    for pid in order:
        p = profiles[pid]
        b = p.get("billing") or {}
        if compact:
            rows.append("| [{}](profiles/{}.md) | {} |\n".format(
                _cell(p.get("title", pid)), pid, _cell(b.get("meter_stop_action", "?"))))
            continue
        rows.append("| [{}](profiles/{}.md) | {} | {} | {} | {} |\n".format(
            _cell(p.get("title", pid)), pid, _cell(b.get("meter_stop_action", "?")),
            _cell(b.get("meter_stop_destroys", "?")), _cell(b.get("keeps_billing_when_paused", "?")),
            _cell(str(p.get("verified", "?")))))
    return (COMPACT_HEADER if compact else HEADER) + "".join(rows)


def splice(text: str, table: str, name: str) -> str:
    """Replace the lines between the markers with the table; UsageError if markers are wrong."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise UsageError(f"{name} must contain exactly one '{BEGIN}' line followed by one '{END}' line")
    b, e = begins[0], ends[0]
    head = lines[:b + 1]
    if not head[-1].endswith("\n"):
        head[-1] += "\n"
    return "".join(head) + table + "".join(lines[e:])


def plan(root: Path, profiles):
    """Return [(relative name, path, new content)] for every generated file."""
    out = [("profiles/index.json", root / "profiles" / "index.json", render_index(profiles))]
    for name in TABLE_FILES:
        table = render_table(profiles, compact=name == "SKILL.md")
        path = root / name
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"{name} not found under {root}; it must carry the platform-table markers") from None
        out.append((name, path, splice(text, table, name)))  # noqa: B023
    return out


def _current(path: Path):
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (try --help)\n")
        sys.exit(2)


def nonempty_path(text: str) -> Path:
    if not text:   # Path("") would silently mean the current directory
        raise argparse.ArgumentTypeError("empty path")
    return Path(text)


def main(argv=None) -> int:
    ap = Parser(
        description="Validate profiles/*.md frontmatter; write profiles/index.json and the platform "
                    "tables in SKILL.md and README.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=core.exit_codes_epilog(__doc__))
    ap.add_argument("--root", type=nonempty_path, default=Path(__file__).resolve().parent.parent,
                    help="repository root (default: the parent of this script's directory)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 naming each stale file")
    ap.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    report = {"ok": False, "root": str(root), "profiles": [], "errors": [], "stale": [], "written": []}

    def finish(code: int) -> int:
        report["ok"] = code == 0
        if args.json:
            print(json.dumps(report, indent=2, sort_keys=True))
        return code

    try:
        if not root.is_dir():
            raise UsageError(f"--root {root} is not a directory")
        profiles, errors, schema_checked = load_profiles(root)
        report["profiles"] = sorted(profiles)
        report["schema_checked"] = schema_checked
        if errors:
            for rel, field, msg in errors:
                _say(f"FAIL {rel}: {field}: {msg}")
                report["errors"].append({"file": rel, "field": field, "message": msg})
            _say(f"FAIL {len(errors)} error(s) in profile frontmatter; nothing written")
            return finish(1)
        outputs = plan(root, profiles)
    except UsageError as exc:
        _say(f"ERROR {exc}")
        report["errors"].append({"file": None, "field": None, "message": str(exc)})
        return finish(2)

    stale = [(name, path, new) for name, path, new in outputs if _current(path) != new]
    report["stale"] = [name for name, _, _ in stale]
    if args.check:
        for name, _, _ in stale:
            _say(f"STALE {name}: regenerate with python3 tools/build_profile_index.py")
        if stale:
            return finish(1)
        _say(f"OK {len(profiles)} profiles valid; index and tables are fresh")
        return finish(0)
    for name, path, new in stale:
        try:
            core.atomic_write(str(path), new)
        except OSError as exc:
            _say(f"ERROR cannot write {name}: {exc}")
            return finish(2)
        report["written"].append(name)
        _say(f"WROTE {name}")
    _say(f"OK {len(profiles)} profiles valid; {len(stale)} file(s) updated")
    return finish(0)


if __name__ == "__main__":
    sys.exit(main())
