"""Upstream parity (issue 40): evals/upstream_parity.tsv maps every entry of the upstream snapshot to where this
skill keeps the fact, or says why it was dropped. Without ../shared: every row is well formed, every our_id
resolves in this checkout, at most 10% of the rows are dropped. With ../shared: the table lists every entry
ID in the snapshot once, and nothing the snapshot lacks."""
import re
from pathlib import Path

import pytest

import structure_checks as sc
from conftest import REPO, SHARED, missing

TABLE = REPO / "evals" / "upstream_parity.tsv"
UPSTREAM = SHARED / "sources" / "upstream"
COLUMNS = ["upstream_id", "upstream_file", "upstream_title", "our_id", "status", "note"]
STATUSES = {"covered", "ported", "partial", "dropped"}
MAX_DROPPED = 0.10
# An upstream entry starts a line: `### ID — title` (references), `- **ID — title**` or `**ID — title**` (profiles).
UPSTREAM_ENTRY = re.compile(r"^(?:#{2,4} |- \*\*|\*\*)([A-Z]{1,4}\d+[a-z]?) ?[—–]")
SOURCE = re.compile(r"https?://|[\w./-]+\.md\b")


def load_table(path=TABLE):
    """[(lineno, {column: value})] for the data rows; '#' lines are comments, the first other line the header."""
    rows, header = [], None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            assert header == COLUMNS, f"{path.name}:{n}: header {header} is not {COLUMNS}"
            continue
        rows.append((n, dict(zip(COLUMNS, cells + [""] * (len(COLUMNS) - len(cells))), _width=len(cells))))
    return rows


def our_targets(root):
    """The entry IDs in ROOT, and a resolver for path[#anchor] targets."""
    ids = {eid for _, _, eid, _ in sc.entries(root)}

    def exists(target):
        if target in ids:
            return True
        path, _, anchor = target.partition("#")
        f = root / path
        return f.is_file() and (not anchor or anchor in sc.anchors(f))
    return exists


def table_problems(root, rows):
    exists = our_targets(root)
    problems, seen = [], set()
    for n, row in rows:
        where = f"upstream_parity.tsv:{n} ({row['upstream_id']})"
        if row["_width"] != len(COLUMNS):
            problems.append(f"{where}: {row['_width']} columns, not {len(COLUMNS)}")
        key = (row["upstream_file"], row["upstream_id"])
        if key in seen:
            problems.append(f"{where}: listed twice for {row['upstream_file']}")
        seen.add(key)
        status, our, note = row["status"], row["our_id"], row["note"]
        if status not in STATUSES:
            problems.append(f"{where}: status {status!r} is not one of {sorted(STATUSES)}")
        if status == "dropped":
            if not note.startswith(("out of scope", "outdated", "wrong")) or not SOURCE.search(note):
                problems.append(f"{where}: a drop says why (out of scope / outdated / wrong) and gives its source")
        elif not our or our == "-":
            problems.append(f"{where}: {status} but no our_id")
        elif not exists(our):
            problems.append(f"{where}: our_id {our} is no entry ID, file or anchor in this checkout")
        if status == "partial" and not note:
            problems.append(f"{where}: partial without a note of what is not kept")
    dropped = sum(1 for _, r in rows if r["status"] == "dropped")
    if rows and dropped > MAX_DROPPED * len(rows):
        problems.append(f"{dropped} of {len(rows)} rows dropped: more than {MAX_DROPPED:.0%}")
    return problems


def test_table_rows_resolve_and_at_most_a_tenth_is_dropped():
    rows = load_table()
    assert len(rows) >= 250
    assert table_problems(REPO, rows) == []


def test_the_table_check_catches_bad_rows(tmp_path):
    bad = tmp_path / "t.tsv"
    lines = ["\t".join(COLUMNS),
             "X1\tref/a.md\tt\tU99999\tcovered\t",                                 # no such entry
             "X1\tref/a.md\tt\tU1\tcovered\t",                                     # twice
             "X2\tref/a.md\tt\t-\tdropped\tno reason",                             # a drop without a why/source
             "X3\tref/a.md\tt\treferences/run-remote/gotchas.md#no-such\tcovered\t",  # a dead anchor
             "X4\tref/a.md\tt\tU1\tmaybe\t",                                       # unknown status
             "X5\tref/a.md\tt\tU1\tpartial\t",                                     # partial, nothing said
             "X6\tref/a.md\tt\tU1"]                                                # short row
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    problems = table_problems(REPO, load_table(bad))
    for expect in ("U99999", "listed twice", "gives its source", "no-such", "maybe", "partial without",
                   "4 columns", "more than 10%"):
        assert any(expect in p for p in problems), (expect, problems)


def upstream_entries(root=UPSTREAM):
    """{(relative file, ID)} for every entry heading in the snapshot's references/ and profiles/."""
    found = set()
    for sub in ("references", "profiles"):
        for md in sorted((root / sub).rglob("*.md")):
            for line in md.read_text(encoding="utf-8").splitlines():
                m = UPSTREAM_ENTRY.match(line)
                if m:
                    found.add((md.relative_to(root).as_posix(), m.group(1)))
    return found


@pytest.mark.needs_shared
def test_table_lists_every_upstream_entry_once():
    if not (UPSTREAM / "references").is_dir():
        missing(f"no upstream snapshot in {UPSTREAM}: it sits in the project's shared folder beside a development "
                "checkout (CI on a plain clone deselects this with -m 'not needs_shared')")
    want = upstream_entries()
    rows = [r for _, r in load_table()]
    listed = {(r["upstream_file"], r["upstream_id"]) for r in rows if not r["upstream_id"].startswith("§")}
    assert len(want) >= 250
    assert sorted(want - listed) == [], "upstream entries missing from the table"
    assert sorted(listed - want) == [], "rows naming no entry of the snapshot"
    sections = [r["upstream_file"] for r in rows if r["upstream_id"].startswith("§")]
    assert [f for f in sections if not (UPSTREAM / f).is_file()] == []
