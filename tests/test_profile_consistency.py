"""Each profile agrees with itself: its frontmatter against its own §2 survival table and §5 billing text.

The frontmatter is what the scripts, profiles/index.json and the generated platform tables read; the body is
what people read. When the two disagree on what survives a pause or a destroy, or when a fact the body calls
disputed is stated as settled in the data, one of them misleads someone about money or data.

``check_profile(path)`` returns a list of problems (empty means consistent). It checks:

1. **Survival table.** Every frontmatter storage tier appears in the §2 survival table (matched by tier name,
   parentheses and backticked paths ignored, else by its path), and where a table cell says plainly yes, no,
   n/a or "—" (no pause), or unknown/provider-specific, that equals ``survives_pause`` / ``survives_destroy``.
   Hedged cells ("24 h only", "usually", "until destroyed") say more than a boolean and are not compared; a
   cell that answers both yes and no (one platform each) is a problem, since one value cannot hold both.
2. **Inline facts.** A backticked ``key: value`` anywhere in the body's prose that names a billing,
   interruption, network or defaults key must equal the frontmatter's value.
3. **Uncertainty.** Each ``uncertain`` entry names a field that exists and whose value says so itself (a hedge
   word or "unknown"; for a storage field, the value or that tier's caps). A billing value that calls itself
   disputed needs an ``uncertain`` entry. When §5 says sources disagree about billing, some billing field
   must be listed under ``uncertain``.
4. **Hedged facts are flagged.** A paragraph or list item of the body that hedges (unconfirmed, unverified,
   reported, partial, not confirmed, removed docs ...) and names one of the money-or-data fields below
   (``HEDGED_FACTS``: the words a body uses for it) must have that field flagged: listed under ``uncertain``,
   or a value that says so itself. A value that cannot carry a word (true, 5, SIGTERM) is flagged only by
   ``uncertain``, whose note must hedge; index.json carries the note beside the value.
5. **Boot hook.** §4 says which boot hook re-runs ``boot_resume.py`` after a restart (or that none is known),
   and every ``boot_resume.py --runs-dir DIR`` the profile shows points at its own ``DURABLE_DIR``/runs when the
   frontmatter sets one: a hook that watches another folder re-arms nothing, silently.

The repo's profiles must report nothing; modified copies written to tmp_path must report the planted break.
"""
import re
from pathlib import Path

import pytest

from conftest import REPO, h2_sections as sections, need_module, prose_lines

PROFILES = REPO / "profiles"
SKIP = object()  # a table cell that is not a plain survival value
HEDGE = re.compile(r"disputed|unverified|unknown|unconfirmed|not confirmed|disagree|undocumented|uncertain",
                   re.I)
DISAGREE = re.compile(r"\b(disagree\w*|contradict\w*|conflict\w*)\b", re.I)
BILLING_WORDS = re.compile(r"bill|charge|granularit|per second|hourly|per hour|per minute", re.I)
INLINE = re.compile(r"`([A-Za-z_]+): ([^`]+)`")
RUNS_DIR = re.compile(r"boot_resume\.py\s+--runs-dir\s+(\S+)")
SELF_HEDGE = re.compile(r"\b(unconfirmed|unverified|disputed|not confirmed)\b")  # "NOT CONFIRMED" is a state name
BODY_HEDGE = re.compile(r"\b(unconfirmed|unverified|not confirmed|reported|partial|removed (?:all|every) spot)\b", re.I)
# field -> the words a body uses when it states that fact (storage fields are matched by the tier's path too)
HEDGED_FACTS = {
    "billing.os_shutdown_stops_billing": r"\bshutdown\b[^.;]*\b(?:bill|meter|power)",
    "interruption.spot": r"\bspot\b|\binterruptible\b",
    "interruption.signal": r"\bSIGTERM\b",
    "interruption.grace_seconds": r"\bgrace\b|SIGKILL \d+ ?s",
}
STORAGE_HEDGED = r"\b(?:wiped|survives?|kept|lost)\b"


# ---------------------------------------------------------------- parsing

def split_profile(text: str):
    """Return (frontmatter dict, body text). The frontmatter sits between the first two '---' lines."""
    yaml = need_module("yaml")
    lines = text.splitlines()
    assert lines and lines[0].strip() == "---", "no frontmatter"
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    return yaml.safe_load("\n".join(lines[1:end])), "\n".join(lines[end + 1:])


def section(body: str, number: int) -> str:
    for heading, text in sections(body).items():
        if heading.startswith(f"## {number}."):
            return text
    return ""


def cells(line: str) -> list:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def survival_table(storage_text: str):
    """Rows of the §2 survival matrix as dicts: name, path, pause, destroy. None when there is no matrix."""
    lines = [l for l in storage_text.splitlines() if l.lstrip().startswith("|")]
    for i, line in enumerate(lines):
        head = [c.lower() for c in cells(line)]
        family = bool(head) and head[0] == "platform"
        core = head[1:] if family else head
        if (len(core) == 5 and core[0] == "tier" and core[1] == "path" and core[4] == "caps"
                and core[2].startswith("survives") and core[3].startswith("survives")):
            rows = []
            for row in lines[i + 1:]:
                c = cells(row)
                if all(re.fullmatch(r":?-+:?", x) for x in c):
                    continue
                if len(c) != len(head):
                    break
                if family:
                    platform, c = c[0], c[1:]
                    name = c[0] if platform.lower() in ("", "all") else f"{platform} {c[0]}"
                else:
                    name = c[0]
                rows.append({"name": name, "path": c[1], "pause": c[2], "destroy": c[3], "line": row.strip()})
            return rows
    return None


def norm_name(text: str) -> str:
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\([^)]*\)", " ", text)
    return " ".join(text.replace("*", "").lower().split())


def parse_cell(cell: str):
    """True / False / None (no pause, n/a) / "unknown", or SKIP for a hedged or descriptive cell."""
    c = re.sub(r"`[^`]*`", "", cell.replace("*", "")).strip().lower()
    if re.match(r"^yes\b", c):
        return True
    if re.match(r"^no\b", c):
        return False
    if c.startswith(("—", "–", "n/a")) or c == "-":
        return None
    if re.match(r"^(unknown|unclear|provider-specific|varies|depends)\b", c):
        return "unknown"
    return SKIP


def mixed(cell: str) -> bool:
    """A cell such as 'A, B no; C yes' gives different answers for different platforms."""
    c = re.sub(r"`[^`]*`", "", cell.replace("*", "")).lower()
    return bool(re.search(r"\byes\b", c) and re.search(r"\bno\b", c))


def match_row(tier: dict, rows: list):
    want = norm_name(str(tier.get("tier", "")))
    by_name = [r for r in rows if norm_name(r["name"]) == want]
    if len(by_name) == 1:
        return by_name[0]
    path = tier.get("path")
    if path:
        by_path = [r for r in rows if path.rstrip("/") in
                   {p.rstrip("/") for p in re.findall(r"`([^`]+)`", r["path"])}]
        if len(by_path) == 1:
            return by_path[0]
    return None


def resolve_field(fm: dict, field: str):
    """Return (found, value, extra hedge text) for a dotted uncertain field."""
    m = re.fullmatch(r"storage\[(.+)\]\.([a-z_]+)", field)
    if m:
        for tier in fm.get("storage") or []:
            if tier.get("tier") == m.group(1) and m.group(2) in tier:
                return True, tier[m.group(2)], str(tier.get("caps") or "")
        return False, None, ""
    part, _, key = field.partition(".")
    block = fm.get(part)
    if isinstance(block, dict) and key in block:
        return True, block[key], ""
    return False, None, ""


def body_units(body: str):
    """The body's paragraphs and list items, each folded to one line (table rows are units too)."""
    units, current = [], []
    for line in prose_lines(body):
        starts = re.match(r"^\s*(?:[-*+]\s|\d+\.\s|\||>|#)", line)  # "**Cause**" continues a paragraph
        if not line.strip() or starts:
            if current:
                units.append(" ".join(current))
            current = [line.strip()] if line.strip() else []
        else:
            current.append(line.strip())
    if current:
        units.append(" ".join(current))
    return units


def hedged_fields(fm: dict, body: str) -> list:
    """The fields a hedging paragraph or list item of BODY names (see HEDGED_FACTS)."""
    patterns = dict(HEDGED_FACTS)
    for tier in fm.get("storage") or []:
        path = str(tier.get("path") or "")
        if len(path) > 2:  # "/" alone names nothing
            patterns["storage[%s].survives_pause" % tier.get("tier")] = \
                re.escape(path) + r"\b[^|.;]{0,40}" + STORAGE_HEDGED + "|" + STORAGE_HEDGED + r"[^|.;]{0,40}" \
                + re.escape(path) + r"\b"
    out = set()
    for unit in body_units(body):
        if BODY_HEDGE.search(unit):
            out.update(f for f, rx in patterns.items() if re.search(rx, unit, re.I))
    return sorted(out)


def hedges(value, extra: str = "") -> bool:
    if value is None or value == "unknown":
        return True
    return bool(HEDGE.search(str(value)) or HEDGE.search(extra))


# ---------------------------------------------------------------- the checker

def check_profile(path: Path) -> list:
    yaml = need_module("yaml")
    fm, body = split_profile(path.read_text(encoding="utf-8"))
    name = path.name
    problems = []

    entries = fm.get("uncertain") or []
    listed = {str(e.get("field")) for e in entries if isinstance(e, dict)}

    # 1. frontmatter storage tiers vs the §2 survival table
    rows = survival_table(section(body, 2))
    if rows is None:
        problems.append(f"{name}: §2 has no survival table (tier | path | survives … | survives … | caps)")
        rows = []
    for tier in fm.get("storage") or []:
        row = match_row(tier, rows)
        if row is None:
            problems.append(f"{name}: storage tier {tier.get('tier')!r} is not a row of the §2 survival table")
            continue
        for key, cell in (("survives_pause", row["pause"]), ("survives_destroy", row["destroy"])):
            if mixed(cell):
                problems.append(f"{name}: tier {tier.get('tier')!r}: the §2 cell {cell!r} answers both yes and "
                                f"no, which one {key} value cannot hold; give each platform its own tier and row")
                continue
            said = parse_cell(cell)
            if said is SKIP and isinstance(tier.get(key), bool) and cell.strip() \
                    and f"storage[{tier.get('tier')}].{key}" not in listed:
                problems.append(f"{name}: tier {tier.get('tier')!r}: the §2 cell {cell!r} is partial but "
                                f"{key}={tier.get(key)!r} is stated as settled: list it under uncertain")
                continue
            if said is not SKIP and said != tier.get(key):
                problems.append(f"{name}: tier {tier.get('tier')!r}: frontmatter {key}={tier.get(key)!r} "
                                f"but the §2 table says {cell!r}")

    # 2. backticked `key: value` facts in the prose
    known, seen = {}, set()
    for block in ("billing", "interruption", "network", "defaults"):
        for key, value in (fm.get(block) or {}).items():
            if key in seen:
                known.pop(key, None)  # ambiguous key: skip it
            else:
                known[key] = value
            seen.add(key)
    for line in prose_lines(body):
        for key, raw in INLINE.findall(line):
            if key not in known:
                continue
            try:
                said = yaml.safe_load(raw)
            except yaml.YAMLError:
                continue
            if said != known[key]:
                problems.append(f"{name}: the body says `{key}: {raw}` but the frontmatter has {known[key]!r}")

    # 3. uncertainty carried by the data
    entries = fm.get("uncertain") or []
    listed = {str(e.get("field")) for e in entries if isinstance(e, dict)}
    notes = {str(e.get("field")): str(e.get("note") or "") for e in entries if isinstance(e, dict)}
    for field in sorted(listed):
        found, value, extra = resolve_field(fm, field)
        if value is not None and (not isinstance(value, str) or " " not in value):
            extra = extra + " " + notes.get(field, "")  # true, 5, SIGTERM cannot hedge: the note must
        if not found:
            problems.append(f"{name}: uncertain names {field!r}, which is not a field of this frontmatter")
        elif not hedges(value, extra):
            problems.append(f"{name}: {field} is listed as uncertain but its value states it as settled: "
                            f"{value!r}")
    for key, value in (fm.get("billing") or {}).items():
        if isinstance(value, str) and re.search(r"disputed|see uncertain", value, re.I) \
                and f"billing.{key}" not in listed:
            problems.append(f"{name}: billing.{key} calls itself disputed but is not listed under uncertain")
    # a value that hedges itself is in the list too, so the doubt has a note and a month (issue 40)
    for block in ("billing", "interruption", "network", "defaults"):
        for key, value in (fm.get(block) or {}).items():
            if key == "notes" or f"{block}.{key}" in listed or not isinstance(value, str):
                continue
            if SELF_HEDGE.search(value):
                problems.append(f"{name}: {block}.{key} says it is {SELF_HEDGE.search(value).group(0)} but is "
                                "not listed under uncertain")
    teardown = " ".join(section(body, 5).split())
    for sentence in re.split(r"(?<=[.!?])\s+", teardown):
        if DISAGREE.search(sentence) and BILLING_WORDS.search(sentence) \
                and not any(f.startswith("billing.") for f in listed):
            problems.append(f"{name}: §5 says the sources disagree about billing ({sentence[:90]!r}…) but no "
                            "billing field is listed under uncertain")
            break

    # 4. every hedged fact of the body is flagged in the data
    for field in hedged_fields(fm, body):
        found, value, extra = resolve_field(fm, field)
        if found and field not in listed and not (isinstance(value, str) and hedges(value, extra)) \
                and value not in (None, "unknown"):
            problems.append(f"{name}: the body hedges {field} but the data states it as settled ({value!r}): "
                            "list it under uncertain")

    # 5. the boot hook named in §4, pointed at this profile's runs dir
    if not re.search(r"boot hook", section(body, 4), re.I):
        problems.append(f"{name}: §4 does not say which boot hook re-runs boot_resume.py after a restart")
    durable = (fm.get("defaults") or {}).get("DURABLE_DIR")
    for shown in RUNS_DIR.findall(body):
        shown = shown.rstrip("`'\".,;)")
        if durable and shown != durable.rstrip("/") + "/runs":
            problems.append(f"{name}: boot_resume.py --runs-dir {shown} is not DURABLE_DIR/runs "
                            f"({durable.rstrip('/')}/runs)")
    return problems


# ---------------------------------------------------------------- the repo's profiles

PROFILE_FILES = sorted(p for p in PROFILES.glob("*.md")
                       if not p.name.startswith("_") and p.name.lower() != "readme.md")


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_profile_agrees_with_itself(path):
    problems = check_profile(path)
    assert problems == [], "\n".join(problems)


def test_every_profile_is_checked():
    assert {p.stem for p in PROFILE_FILES} >= {"local", "autodl", "runpod", "vastai", "lambda", "paperspace",
                                               "china", "generic-ssh"}


# ---------------------------------------------------------------- planted disagreements

def planted(tmp_path: Path, pid: str, edit) -> Path:
    """Write profiles/<pid>.md, changed by edit(text) -> text, to tmp_path; the edit must change something."""
    text = (PROFILES / f"{pid}.md").read_text(encoding="utf-8")
    new = edit(text)
    assert new != text, f"the planted edit did not change profiles/{pid}.md"
    out = tmp_path / f"{pid}.md"
    out.write_text(new, encoding="utf-8")
    assert check_profile(PROFILES / f"{pid}.md") == [], "the unmodified profile must be consistent first"
    return out


def set_cell(text: str, row_start: str, column: int, value: str) -> str:
    """Replace one cell of the first table row whose first cells start with row_start."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(row_start):
            c = cells(line)
            c[column] = value
            lines[i] = "| " + " | ".join(c) + " |\n"
            return "".join(lines)
    raise AssertionError(f"no table row starts with {row_start!r}")


def test_flipped_destroy_cell_is_caught(tmp_path):
    # RunPod's network volume survives terminate; a table saying it does not must be reported.
    path = planted(tmp_path, "runpod", lambda t: set_cell(t, "| Network volume |", 3, "**no**"))
    problems = check_profile(path)
    assert any("network volume" in p and "survives_destroy" in p for p in problems), problems


def test_family_table_pause_cell_is_caught(tmp_path):
    # The original china bug: the table said Matpool's system disk survives a stop, the data did not.
    path = planted(tmp_path, "china", lambda t: set_cell(t, "| Matpool | system disk |", 3, "yes"))
    problems = check_profile(path)
    assert any("Matpool system disk" in p and "survives_pause" in p for p in problems), problems


def test_mixed_answer_cell_is_caught(tmp_path):
    # The layout that hid the china bug: one "all platforms" row whose cell answers differently per platform.
    def edit(text):
        text = set_cell(text, "| Matpool | system disk |", 3, "Gpushare, LanRui **no**; Matpool yes")
        return text
    problems = check_profile(planted(tmp_path, "china", edit))
    assert any("Matpool system disk" in p and "both yes and no" in p for p in problems), problems


def test_frontmatter_side_flip_is_caught(tmp_path):
    # The same disagreement planted in the data instead of the table.
    def edit(text):
        return text.replace("- {tier: volume disk, path: /workspace, survives_pause: true,",
                            "- {tier: volume disk, path: /workspace, survives_pause: false,", 1)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("volume disk" in p and "survives_pause=False" in p for p in problems), problems


def test_tier_missing_from_table_is_caught(tmp_path):
    def edit(text):
        return "".join(l for l in text.splitlines(keepends=True) if not l.startswith("| Cloud Sync bucket |"))
    problems = check_profile(planted(tmp_path, "vastai", edit))
    assert any("cloud sync bucket" in p and "not a row" in p for p in problems), problems


def test_disputed_billing_without_uncertain_is_caught(tmp_path):
    # A §5 that says the sources disagree on billing, with the data's uncertainty dropped, must fail.
    def edit(text):
        text = re.sub(r"^uncertain:\n(?:  .*\n)+", "uncertain: []\n", text, count=1, flags=re.M)
        return text.replace("- **Meter stop = terminate.**",
                            "- Network volumes: the pricing and billing pages disagree on how often they bill.\n"
                            "- **Meter stop = terminate.**", 1)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("§5 says the sources disagree" in p for p in problems), problems
    assert any("billing.granularity calls itself disputed" in p for p in problems), problems


def test_flat_granularity_listed_as_uncertain_is_caught(tmp_path):
    # Listed as uncertain, yet the value (which reaches index.json) states it flatly.
    def edit(text):
        return re.sub(r"^  granularity: >-\n(?:    .*\n)+",
                      '  granularity: "per second for compute and disks; hourly for network volumes"\n',
                      text, count=1, flags=re.M)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("billing.granularity is listed as uncertain" in p for p in problems), problems


def test_inline_billing_fact_is_caught(tmp_path):
    def edit(text):
        return text.replace("`os_shutdown_stops_billing: unknown`", "`os_shutdown_stops_billing: true`", 1)
    problems = check_profile(planted(tmp_path, "paperspace", edit))
    assert any("os_shutdown_stops_billing" in p for p in problems), problems


def test_uncertain_naming_a_missing_field_is_caught(tmp_path):
    def edit(text):
        entry = "uncertain:\n  - {field: billing.no_such_key, note: planted}\n"
        return text.replace("\nbilling:\n", "\n" + entry + "billing:\n", 1)
    problems = check_profile(planted(tmp_path, "local", edit))
    assert any("billing.no_such_key" in p for p in problems), problems


def test_boot_hook_pointed_elsewhere_is_caught(tmp_path):
    # The hook must watch the runs dir run_one.sh writes to (DURABLE_DIR/runs), or it re-arms nothing.
    def edit(text):
        return text.replace("--runs-dir /workspace/durable/runs", "--runs-dir /workspace/runs", 1)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("--runs-dir /workspace/runs is not DURABLE_DIR/runs" in p for p in problems), problems


def test_missing_boot_hook_is_caught(tmp_path):
    def edit(text):
        return re.sub(r"\*\*Boot hook[^*]*\*\*", "**After a restart.**", text, flags=re.I)
    problems = check_profile(planted(tmp_path, "lambda", edit))
    assert any("§4 does not say which boot hook" in p for p in problems), problems


@pytest.mark.parametrize("cell, expected", [
    ("yes", True), ("**no**", False), ("yes (**billed**, unverified)", True), ("**no**: terminate erases it", False),
    ("n/a (no pause)", None), ("— (no stop)", None), ("provider-specific", "unknown"),
    ("**24 h only**", SKIP), ("usually", SKIP), ("until destroyed", SKIP),
])
def test_cell_reading(cell, expected):
    got = parse_cell(cell)
    if expected is None or expected is SKIP:
        assert got is expected
    else:
        assert got == expected


def test_hedged_spot_facts_without_uncertain_are_caught(tmp_path):
    # RunPod's body says its spot docs were removed; dropping the interruption entries must fail.
    def edit(text):
        return re.sub(r"^  - \{field: interruption\.[a-z_]+, note: .*\}\n", "", text, flags=re.M)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("hedges interruption.spot" in p for p in problems), problems


def test_hedged_shutdown_billing_without_uncertain_is_caught(tmp_path):
    # AutoDL's body calls the in-container shutdown unconfirmed; the data's flag must stay.
    def edit(text):
        return re.sub(r"^uncertain:\n  - field: billing\.os_shutdown_stops_billing\n(?:    .*\n)+", "", text,
                      flags=re.M)
    problems = check_profile(planted(tmp_path, "autodl", edit))
    assert any("hedges billing.os_shutdown_stops_billing" in p for p in problems), problems


def test_partial_survival_cell_without_uncertain_is_caught(tmp_path):
    # China's /hy-tmp survives a short pause only ("24 h only"): false alone is partial, so it must be flagged.
    def edit(text):
        return re.sub(r"^  - field: storage\[Gpushare local SSD\]\.survives_pause\n(?:    .*\n)+", "", text,
                      flags=re.M)
    problems = check_profile(planted(tmp_path, "china", edit))
    assert any("'Gpushare local SSD'" in p and "partial" in p for p in problems), problems


def test_an_uncertain_boolean_needs_a_hedging_note(tmp_path):
    def edit(text):
        return text.replace("The 30-day removal of stopped Pods is upstream's (2026-06); not in docs.runpod.io, "
                            "unverified.", "Fine.").replace(
            'note: "from the spot docs removed 2026-05-06; unconfirmed since"}', 'note: "settled"}', 1)
    problems = check_profile(planted(tmp_path, "runpod", edit))
    assert any("interruption.signal is listed as uncertain" in p for p in problems), problems



def test_a_value_that_hedges_itself_must_be_listed(tmp_path):
    # AutoDL's expanded-disk billing says "unconfirmed" in its value; dropping its entry must fail (issue 40).
    def edit(text):
        return re.sub(r"^  - field: billing\.keeps_billing_when_paused\n(?:    .*\n)+", "", text, flags=re.M)
    problems = check_profile(planted(tmp_path, "autodl", edit))
    assert any("billing.keeps_billing_when_paused says it is unconfirmed" in p for p in problems), problems
