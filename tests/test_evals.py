"""Tier-1 offline evals (GUIDE §7): every case points at files, IDs and words that exist, reachable from SKILL.md."""
import json
import re

import pytest

import structure_checks as sc
from conftest import REPO

CASES = REPO / "evals" / "cases.jsonl"
FIELDS = {"id", "prompt", "expected_files", "expected_ids", "key_terms", "must_cover"}


def load_cases(path=CASES):
    cases = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            cases.append((n, json.loads(line)))
    return cases


def reachable(root, max_hops=2):
    graph = sc.link_graph(root)
    depth = {(root / "SKILL.md").resolve(): 0}
    frontier = list(depth)
    for hop in range(1, max_hops + 1):
        frontier = [d for node in frontier for d in graph.get(node, ()) if d not in depth]
        for d in frontier:
            depth.setdefault(d, hop)
    return set(depth)


def case_problems(root, cases):
    problems = []
    ids_by_file = {}
    for md, _, eid, _ in sc.entries(root):
        ids_by_file.setdefault(md.resolve(), set()).add(eid)
    near = reachable(root)
    seen = set()
    for n, case in cases:
        where = f"cases.jsonl:{n} ({case.get('id')})"
        missing = FIELDS - set(case)
        if missing:
            problems.append(f"{where}: missing fields {sorted(missing)}")
            continue
        if case["id"] in seen:
            problems.append(f"{where}: duplicate case id")
        seen.add(case["id"])
        files = [(root / f).resolve() for f in case["expected_files"]]
        if not files:
            problems.append(f"{where}: no expected file")
        for f in files:
            if not f.is_file():
                problems.append(f"{where}: expected file {f.relative_to(root.resolve())} does not exist")
            elif f.suffix == ".md" and f not in near:
                problems.append(f"{where}: {f.name} is not reachable from SKILL.md in two hops")
        text = "\n".join(f.read_text(encoding="utf-8") for f in files if f.is_file())
        for eid in case["expected_ids"]:
            if not any(eid in ids_by_file.get(f, ()) for f in files):
                problems.append(f"{where}: entry {eid} is not in the expected files")
        for term in case["key_terms"]:
            if term.lower() not in text.lower():
                problems.append(f"{where}: key term {term!r} not in the expected files")
        if not case["must_cover"]:
            problems.append(f"{where}: no must-cover points")
    return problems


def test_cases_file_exists_and_is_large_enough():
    assert len(load_cases()) >= 40


def test_every_case_resolves():
    assert case_problems(REPO, load_cases()) == []


def test_every_reference_and_profile_has_a_case():
    covered = {f for _, c in load_cases() for f in c["expected_files"]}
    docs = [p.relative_to(REPO).as_posix() for sub in ("references", "profiles") for p in (REPO / sub).rglob("*.md")]
    assert sorted(set(docs) - covered) == []


def test_checker_catches_bad_cases(tmp_path):
    bad = [
        (1, {"id": "x1", "prompt": "p", "expected_files": ["references/nope.md"], "expected_ids": [],
             "key_terms": [], "must_cover": ["a"]}),
        (2, {"id": "x1", "prompt": "p", "expected_files": ["SKILL.md"], "expected_ids": ["U99999"],
             "key_terms": ["zzqx-not-a-word"], "must_cover": []}),
        (3, {"id": "x3", "prompt": "p"}),
    ]
    problems = case_problems(REPO, bad)
    for expect in ("does not exist", "duplicate case id", "U99999", "zzqx-not-a-word", "no must-cover",
                   "missing fields"):
        assert any(expect in p for p in problems), expect


@pytest.mark.parametrize("word", ["AutoDL", "RunPod", "vast.ai", "Lambda", "OOM", "断点续训"])
def test_description_carries_trigger_words(word):
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    desc = re.search(r"description: >-\n(.*?)\nlicense:", text, re.S).group(1)
    assert word in desc


# --- routing: do SKILL.md's router words lead from the prompt to the expected file? -------------

STOP = set("the a an my i is it to of on in and or for with but when after how do does what why can this that at "
           "be from not no so me you your are was were has have".split())
ROUTE_FLOOR = 0.75  # share of cases whose expected file is within reach of the top-3 router rows


def words(text):
    found = set(re.findall(r"[a-z0-9_./-]+|[\u4e00-\u9fff]", text.lower()))
    return {w.strip(".") for w in found if (len(w) > 1 and w not in STOP) or re.match(r"[\u4e00-\u9fff]", w)}


def router_rows(skill_text, root):
    rows = []
    for line in skill_text.splitlines():
        if not line.startswith("|"):
            continue
        targets = re.findall(r"\]\(([^)#]+)", line) + re.findall(r"`((?:scripts|examples)/[\w.-]+)`", line)
        if targets:
            rows.append((words(line), [(root / t).resolve() for t in targets]))
    return rows


def route_rate(root, skill_text, cases):
    """Share of cases routed right, with the misses: rows ranked by idf-weighted shared words."""
    import math
    rows = router_rows(skill_text, root)
    df = {}
    for ws, _ in rows:
        for w in ws:
            df[w] = df.get(w, 0) + 1
    out_links = {}
    for md in sc.files(root, {".md"}):
        out_links[md.resolve()] = {(md.parent / t.partition("#")[0]).resolve() for _, t in sc.links(md)
                                   if t.partition("#")[0] and "://" not in t}
    misses = []
    for _, case in cases:
        prompt = words(case["prompt"])
        ranked = sorted(rows, key=lambda r: -sum(math.log(1 + len(rows) / df[w]) for w in prompt & r[0]))[:3]
        reach = set()
        for _, targets in ranked:
            for t in targets:
                reach |= {t} | out_links.get(t, set())
        if not {(root / f).resolve() for f in case["expected_files"]} & reach:
            misses.append(case["id"])
    return 1 - len(misses) / max(1, len(cases)), misses


def test_router_words_lead_to_the_expected_files():
    rate, misses = route_rate(REPO, (REPO / "SKILL.md").read_text(encoding="utf-8"), load_cases())
    assert rate >= ROUTE_FLOOR, f"routing {rate:.0%} < {ROUTE_FLOOR:.0%}; missed: {misses}"


def test_routing_check_fails_without_the_router():
    text = (REPO / "SKILL.md").read_text(encoding="utf-8")
    gutted = text[: text.index("## Router")] + text[text.index("## Scripts"):]
    rate, _ = route_rate(REPO, gutted, load_cases())
    assert rate < ROUTE_FLOOR


def uncovered_entries(root, cases):
    covered = {i for _, c in cases for i in c.get("expected_ids", [])}
    return sorted({eid for _, _, eid, _ in sc.entries(root)} - covered)


def test_every_gotcha_entry_has_an_eval_case():
    assert uncovered_entries(REPO, load_cases()) == []


def test_coverage_check_notices_a_new_entry_without_a_case(tmp_path):
    root = tmp_path / "skill"
    (root / "references").mkdir(parents=True)
    (root / "references" / "x.md").write_text("### ZZ7 — New\n**Symptom** a **Cause** b **Fix** c **Check** d\n")
    assert uncovered_entries(root, load_cases()) == ["ZZ7"]
