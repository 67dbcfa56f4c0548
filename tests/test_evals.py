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
