#!/usr/bin/env python3
"""Tier-1 evals, offline: routing, reading cost, coverage and triggers against their floors; exit 1 when one is missed.

Over evals/cases.jsonl and evals/triggers.jsonl it checks:
  cases      every case has its fields; each expected file exists and (if Markdown) is within two
             links of SKILL.md; each expected ID is an entry in an expected file; each key term is in them
  coverage   every reference and profile, and every gotcha entry, answers some case
  routing    lookup first, as SKILL.md tells the agent: a case with expected entries counts when
             `lookup.py "<prompt>"` prints one first (top-1) or among its first three (top-3); a case
             without entries (a script, a whole file) falls back to SKILL.md's router rows
  router     the router rows alone (the fallback): rows ranked against each prompt (BM25 over a row's
             words and the bold line heading its table); a case counts only when a row that itself links
             or names an expected file ranks first (top-1) or in the first three (top-3)
  reading    characters an agent reads by the route SKILL.md offers (lookup first): the SKILL.md
             body, then `lookup.py "<prompt>"` (the best entry in full with its related IDs, four more
             by title); an expected entry it only lists costs `lookup.py ID`; one it misses costs
             `lookup.py --index FILE` plus `lookup.py ID`; an expected file without entries costs its
             `--help` (a script) or the whole file; median and 90th percentile held under ceilings,
             next to whole-file reading
  router reading  characters read following the router alone: the SKILL.md body, then what the best
             top-3 router row that names an expected file names: an entry (by ID, or an entry anchor)
             costs the entry; a #index anchor costs the index and the entry; another anchor its
             section; a bare link the whole file; a script its --help; no such row: the whole files
  triggers   a lexical check of the description: a prompt triggers when the description phrases it
             contains (their words in order, at most one other word
             between neighbours) weigh 2 or more: a phrase of two or more
             words, a name such as RunPod or NCCL, or a Chinese term weighs 2; one lower-case word such
             as tmux weighs 1; accuracy over the should and should-not prompts

Usage:
  python3 evals/run_evals.py                 # report; exit 0 when every check passes, 1 otherwise
  python3 evals/run_evals.py --misses        # also list the cases each measure missed
  python3 evals/run_evals.py --json          # the whole report as one JSON object

Options:
  --root DIR           the skill checkout (default: the folder above evals/)
  --cases FILE         cases file (default: ROOT/evals/cases.jsonl)
  --triggers FILE      trigger prompts (default: ROOT/evals/triggers.jsonl)
  --top1 SHARE         floor for the top-1 routing hit rate, lookup first (default 0.80)
  --top3 SHARE         floor for the top-3 routing hit rate, lookup first (default 0.88)
  --router-top1 SHARE  floor for the router rows alone, top-1 (default 0.45)
  --router-top3 SHARE  floor for the router rows alone, top-3 (default 0.65)
  --reading-median N   ceiling for the median characters read per case (default 9000)
  --reading-p90 N      ceiling for the 90th percentile characters read per case (default 16000)
  --router-reading-median N  ceiling for the median read following the router alone (default 15000)
  --trigger-floor S    floor for the lexical trigger accuracy (default 0.80)
  --misses             print every miss, not only the counts
  --json               print JSON instead of text

The last line of the text report is `N passed, N failed` (one check per case, plus one per floor).

Exit codes: 0 every check passed; 1 a check failed; 2 usage or bad input.
"""
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts" / "node"))
sys.path.insert(0, str(ROOT / "scripts"))
import rgt_core as core  # noqa: E402  (one error line, one exit-code contract)
import lookup as lk  # noqa: E402  (the catalog parser, words and ranker measured are the ones agents run)

FIELDS = ("id", "prompt", "expected_files", "expected_ids", "key_terms", "must_cover")
TRIGGER_FIELDS = ("id", "prompt", "should_trigger")
FLOORS = {"top1": 0.80, "top3": 0.88, "router_top1": 0.45, "router_top3": 0.65, "reading_median": 9000,
          "reading_p90": 16000, "router_reading_median": 15000, "trigger_accuracy": 0.80}
MIN_TRIGGERS = 60
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
SCRIPT_REF = re.compile(r"`(?:python3 )?((?:scripts|examples)/[\w./-]+\.(?:py|sh))\b")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|?\s*$")


# ---------------------------------------------------------------- files and links

def load_jsonl(path):
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append((n, json.loads(line)))
            except ValueError as exc:
                raise core.UsageError("%s:%d is not JSON: %s" % (path, n, exc))
    return out


def split_frontmatter(text):
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end >= 0:
            return text[4:end], text[end + 5:]
    return "", text


def skill_text(root):
    return (root / "SKILL.md").read_text(encoding="utf-8")


def skill_body(root):
    return split_frontmatter(skill_text(root))[1]


def description(root):
    """The frontmatter's description folded into one line (a block scalar or a plain value)."""
    head = split_frontmatter(skill_text(root))[0]
    m = re.search(r"^description:[ \t]*(?:[>|][-+]?[ \t]*\n)?(.*?)(?=^\S|\Z)", head, re.M | re.S)
    return " ".join(m.group(1).split()).strip("\"'") if m else ""


def md_files(root):
    skip = {".git", "__pycache__", ".pytest_cache", "node_modules"}
    return [p for p in sorted(root.rglob("*.md")) if not set(p.relative_to(root).parts) & skip]


def links(path):
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if not fenced:
            for target in LINK.findall(INLINE_CODE.sub("", line)):
                part = target.partition("#")[0]
                if part and not re.match(r"^[a-z][a-z0-9+.-]*:", part):
                    yield (path.parent / part).resolve()


def reachable(root, max_hops=2):
    graph = {md.resolve(): {d for d in links(md) if d.suffix == ".md"} for md in md_files(root)}
    seen = {(root / "SKILL.md").resolve()}
    frontier = set(seen)
    for _ in range(max_hops):
        frontier = {d for node in frontier for d in graph.get(node, ()) if d not in seen}
        seen |= frontier
    return seen


def entries_in(path):
    return [eid for eid, _, _, _ in lk.parse_entries(str(path))] if path.suffix == ".md" else []


def all_entries(root):
    out = {}
    for md in md_files(root):
        if md.name == "README.md" or ".github" in md.parts:
            continue
        for eid in entries_in(md):
            out.setdefault(eid, md.resolve())
    return out


# ---------------------------------------------------------------- case checks

def case_problems(root, cases):
    """{"<id> (line N)": [problem, ...]}, an empty list for a clean case."""
    near = reachable(root)
    out, seen = {}, set()
    for n, case in cases:
        key = "%s (line %d)" % (case.get("id", "?"), n)
        problems = out.setdefault(key, [])
        missing = [f for f in FIELDS if f not in case]
        if missing:
            problems.append("missing fields %s" % missing)
            continue
        if case["id"] in seen:
            problems.append("duplicate case id")
        seen.add(case["id"])
        files = [(root / f).resolve() for f in case["expected_files"]]
        if not files:
            problems.append("no expected file")
        for rel, f in zip(case["expected_files"], files):
            if not f.is_file():
                problems.append("expected file %s does not exist" % rel)
            elif f.suffix == ".md" and f not in near:
                problems.append("%s is not reachable from SKILL.md in two hops" % rel)
        present = [f for f in files if f.is_file()]
        ids = {eid for f in present for eid in entries_in(f)}
        for eid in case["expected_ids"]:
            if eid not in ids:
                problems.append("entry %s is not in the expected files" % eid)
        text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in present).lower()
        for term in case["key_terms"]:
            if term.lower() not in text:
                problems.append("key term %r not in the expected files" % term)
        if not case["must_cover"]:
            problems.append("no must-cover points")
    return out


def uncovered_docs(root, cases):
    covered = {f for _, c in cases for f in c.get("expected_files", [])}
    docs = [p.relative_to(root).as_posix() for sub in ("references", "profiles") if (root / sub).is_dir()
            for p in sorted((root / sub).rglob("*.md"))]
    return sorted(set(docs) - covered)


def uncovered_entries(root, cases):
    covered = {i for _, c in cases for i in c.get("expected_ids", [])}
    return sorted(set(all_entries(root)) - covered)


# ---------------------------------------------------------------- routing

def router_rows(root, body=None):
    """[(words, [target paths], row text)] for every SKILL.md table row that links or names a file.

    A row's words are its own text plus the bold line heading its table (an agent reads both)."""
    body = skill_body(root) if body is None else body
    rows, heading = [], ""
    for line in body.splitlines():
        if line.startswith("**") or line.startswith("## "):
            heading = line
            continue
        if not line.startswith("|") or SEPARATOR.match(line):
            continue
        targets = [t.partition("#")[0] for t in LINK.findall(line)] + SCRIPT_REF.findall(line)
        targets = [(root / t).resolve() for t in targets if t and "://" not in t]
        if targets:
            rows.append((lk.doc_words(heading + "\n" + line), targets, line))
    return rows


def route_ranks(root, cases, body=None):
    """{case id: 1-based rank of the best row that links an expected file, or None}.

    Ties go against the case: a right row ranks below every wrong row with the same score, and a row
    that shares no word with the prompt never counts."""
    rows = router_rows(root, body)
    ranker = lk.Ranker([r[0] for r in rows])
    out = {}
    for _, case in cases:
        expected = {(root / f).resolve() for f in case.get("expected_files", [])}
        query = lk.words(case["prompt"])
        found = ranker.scores(query)
        scored = sorted((-found.get(i, 0.0), bool(expected & set(targets)), i)
                        for i, (_, targets, _) in enumerate(rows))
        out[case["id"]] = next((k for k, (s, hit, _) in enumerate(scored, 1) if hit and s < 0), None)
    return out


def route_rates(ranks):
    n = max(1, len(ranks))
    top1 = sum(1 for r in ranks.values() if r == 1) / n
    top3 = sum(1 for r in ranks.values() if r is not None and r <= 3) / n
    return top1, top3


# ---------------------------------------------------------------- reading budget

_HELP = {}


def help_chars(path):
    """Characters of a script's --help: SKILL.md tells the agent to run that rather than read the source."""
    if path not in _HELP:
        cmd = [sys.executable, str(path)] if path.suffix == ".py" else ["bash", str(path)]
        try:
            res = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60)
            ok = res.returncode == 0 and res.stdout.strip()
            _HELP[path] = len(res.stdout + res.stderr) if ok else len(path.read_text(errors="replace"))
        except (OSError, subprocess.TimeoutExpired):
            _HELP[path] = len(path.read_text(errors="replace"))
    return _HELP[path]


def id_output(catalog, eid):
    """Characters `lookup.py ID` prints."""
    text, _ = lk.lookup_text(catalog, [eid])
    return len(text.rstrip("\n") + "\n")


def reading(root, cases):
    """{case id: {"route": chars by the offered route, "whole_files": chars reading whole files, "steps": [...]}}.

    Both include the SKILL.md body, which loads with the skill."""
    body_text = skill_body(root)
    body = len(body_text)
    catalog = lk.Catalog(str(root))
    rows = router_rows(root, body_text)
    ranker = lk.Ranker([r[0] for r in rows])
    index_cache = {}
    out = {}
    for _, case in cases:
        route, whole, steps = body, body, ["SKILL.md body %d" % body]
        query = lk.words(case["prompt"])
        found = ranker.scores(query)
        top = [rows[i] for sc, i in sorted((-found.get(i, 0.0), i) for i in range(len(rows)))[:3] if sc < 0]
        wanted = [i for i in case.get("expected_ids", []) if catalog.get(i)]
        if wanted:
            text, hits = lk.lookup_text(catalog, [case["prompt"]])
            shown = len(text.rstrip("\n") + "\n")
            route += shown
            steps.append("lookup.py PROMPT %d" % shown)
            full = {e["id"] for _, e in hits[:1]}
            listed = {e["id"] for _, e in hits[1:]}
            for eid in wanted:
                if eid in full:
                    continue
                cost = id_output(catalog, eid)
                if eid not in listed:
                    f = catalog.get(eid)["file"]
                    if f not in index_cache:
                        index_cache[f] = len(lk.index_text(str(root / f)))
                    cost += index_cache[f]
                    steps.append("lookup.py --index %s + lookup.py %s %d" % (f, eid, cost))
                else:
                    steps.append("lookup.py %s %d" % (eid, cost))
                route += cost
        for rel in case.get("expected_files", []):
            f = (root / rel).resolve()
            if not f.is_file():
                continue
            size = help_chars(f) if f.suffix in (".py", ".sh") else len(f.read_text(encoding="utf-8"))
            whole += size
            if not set(entries_in(f)) & set(wanted):
                # lookup had nothing for this file: the agent follows a top-3 router row that names it and reads
                # the section its anchor names; a symptom index leads to no section, so that is the whole file
                anchors = [a for row in top for tf, a in row_targets(root, row[2])
                           if tf == f and a and a not in ("index", "symptom-index")]
                cost, how = size, "--help" if f.suffix in (".py", ".sh") else "read"
                if anchors and f.suffix == ".md" and section_text(f, anchors[0]) is not None:
                    cost, how = len(section_text(f, anchors[0])), "router row #" + anchors[0]
                route += cost
                steps.append("%s %s %d" % (how, rel, cost))
        out[case["id"]] = {"route": route, "whole_files": whole, "steps": steps}
    return out


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return 0
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


ROW_ID = re.compile(r"(?<![\w#/-])([A-Z]{1,3}\d+)\b")


def anchor_slug(heading):
    """GitHub's anchor for a heading (as tests/structure_checks.slug computes it)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- \u4e00-\u9fff]", "", text).replace(" ", "-")


def section_text(path, anchor):
    """The text under the heading whose anchor is ANCHOR, to the next heading of the same or a higher level."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start, level = None, 0
    for i, line in enumerate(lines):
        m = re.match(r"^(#{1,6})\s+(.*)", line)
        if not m:
            continue
        if start is None and anchor_slug(m.group(2)) == anchor:
            start, level = i, len(m.group(1))
        elif start is not None and len(m.group(1)) <= level:
            return "\n".join(lines[start:i]) + "\n"
    return "\n".join(lines[start:]) + "\n" if start is not None else None


def row_targets(root, row_text):
    """[(path, anchor or None)] a router row links or names (scripts by path)."""
    out = []
    for t in LINK.findall(row_text):
        if "://" in t:
            continue
        part, _, anchor = t.partition("#")
        out.append(((root / part).resolve(), anchor or None))
    out += [((root / t).resolve(), None) for t in SCRIPT_REF.findall(row_text)]
    return out


def agent_reading(root, cases, body=None):
    """{case id: {"chars": N, "steps": [...]}}: what an agent reads following the router as it is written.

    The agent reads the SKILL.md body, picks the best-ranked row that names an expected file (the routing
    rank; top 3), and reads what that row names, nothing more: an entry the row names by ID or by an entry
    anchor costs that entry (`lookup.py ID`); an `#index` (symptom index) anchor costs the index plus each
    expected entry in it; another anchor costs that section; a bare link costs the whole file; a script costs
    its --help. When no row in the top 3 names an expected file, every expected file is read whole."""
    body = skill_body(root) if body is None else body
    catalog = lk.Catalog(str(root))
    rows = router_rows(root, body)
    ranker = lk.Ranker([r[0] for r in rows])
    out = {}
    for _, case in cases:
        expected = [(root / f).resolve() for f in case.get("expected_files", [])]
        wanted = [i for i in case.get("expected_ids", []) if catalog.get(i)]
        query = lk.words(case["prompt"])
        found = ranker.scores(query)
        scored = sorted((-found.get(i, 0.0), not (set(expected) & set(r[1])), i) for i, r in enumerate(rows))
        pick = next((rows[i] for k, (sc, miss, i) in enumerate(scored[:3]) if not miss and sc < 0), None)
        chars, steps = len(body), ["SKILL.md body %d" % len(body)]
        named = set(ROW_ID.findall(pick[2])) if pick else set()
        targets = row_targets(root, pick[2]) if pick else []
        for f in expected:
            if not f.is_file():
                continue
            rel = f.relative_to(root.resolve()).as_posix()
            in_file = [i for i in wanted if catalog.get(i)["file"] == rel]
            anchors = [a for t, a in targets if t == f]
            direct = [i for i in in_file if i in named or any(a and a.startswith(i.lower() + "--") for a in anchors)]
            if f.suffix in (".py", ".sh"):
                cost, how = (help_chars(f), "--help %s" % rel) if f in [t for t, _ in targets] or not pick else (
                    help_chars(f), "--help %s (not on the row)" % rel)
            elif direct:
                cost = sum(id_output(catalog, i) for i in direct)
                how = "lookup.py %s" % " ".join(direct)
            elif {"symptom-index", "index"} & set(anchors):
                cost = len(lk.index_text(str(f))) + sum(id_output(catalog, i) for i in in_file)
                how = "%s#symptom-index + %s" % (rel, " ".join(in_file) or "nothing")
            elif any(anchors) and section_text(f, next(a for a in anchors if a)) is not None:
                a = next(a for a in anchors if a)
                cost, how = len(section_text(f, a)), "%s#%s" % (rel, a)
            else:
                cost, how = len(f.read_text(encoding="utf-8")), "read %s" % rel
            chars += cost
            steps.append("%s %d" % (how, cost))
        out[case["id"]] = {"chars": chars, "steps": steps, "row": pick[2][:80] if pick else None}
    return out


def lookup_first_ranks(root, cases, body=None):
    """{case id: rank} as an agent that runs lookup first meets it: the place of the first expected entry in
    `lookup.py PROMPT` for a case with entries, else the router rank (the fallback SKILL.md offers)."""
    lranks = lookup_ranks(root, cases)
    rranks = route_ranks(root, cases, body)
    return {c["id"]: (lranks.get(c["id"]) if c.get("expected_ids") else rranks.get(c["id"])) for _, c in cases}


def lookup_ranks(root, cases):
    """{case id: place of the first expected entry in `lookup.py PROMPT` (1 = printed in full), or None}."""
    catalog = lk.Catalog(str(root))
    out = {}
    for _, case in cases:
        if not case.get("expected_ids"):
            continue
        hits = [e["id"] for _, e in catalog.search(case["prompt"], limit=1 + lk.RUNNERS_UP)]
        places = [hits.index(i) + 1 for i in case["expected_ids"] if i in hits]
        out[case["id"]] = min(places) if places else None
    return out


# ---------------------------------------------------------------- triggers

FILLER = re.compile(r"^(use when|use it when|or asks|asks|ships|triggers|the user|when|or|and|a|an|the)\b\s*",
                    re.I)
CJK = re.compile(r"[\u3400-\u9fff]")


def tokens(text):
    """TEXT's content words in order, stemmed as lookup.py stems them; a compound (torch.load) gives its parts."""
    out = []
    for m in lk.WORD.finditer(text.lower()):
        if CJK.match(m.group(0)):
            continue
        for part in re.split(r"[._+/-]", m.group(0)):
            if part and part not in lk.STOP and (len(part) > 1 or part.isdigit()):
                out.append(lk.stem(part))
    return out


def trigger_phrases(desc):
    """The description cut at commas, semicolons, colons, slashes, brackets, quotes, 'or', 'and' and
    sentence ends: [(phrase, its content words in order, weight)]. Weight 2: two or more content words,
    a capitalised name (RunPod, NCCL) or a Chinese term; weight 1: one lower-case word (tmux, resume)."""
    out = []
    for part in re.split(r"[,;:/()\"\u201c\u201d]|\.\s|\bor\b|\band\b|\s-\s", desc):
        part = part.strip(" .'")
        while FILLER.match(part):
            part = FILLER.sub("", part, count=1)
        seq = tokens(part)
        if not seq and not CJK.search(part):
            continue
        named = bool(re.search(r"[A-Z]", part)) or bool(CJK.search(part))
        out.append((part, tuple(seq), 2 if len(seq) > 1 or named else 1))
    return out


def contains(seq, sub, gap=1):
    """SUB's words appear in SEQ in order, with at most GAP other words between neighbours."""
    for start in (i for i, w in enumerate(seq) if w == sub[0]):
        at, ok = start, True
        for w in sub[1:]:
            window = seq[at + 1:at + 2 + gap]
            if w not in window:
                ok = False
                break
            at = at + 1 + window.index(w)
        if ok:
            return True
    return False


def trigger_matches(phrases, prompt):
    """[(phrase, weight)] found in PROMPT: a Chinese phrase as written, any other as its content words in
    order (see contains); phrases with the same words count once."""
    seq, low, seen, out = tokens(prompt), prompt.lower(), set(), []
    for part, sub, weight in phrases:
        found = part.lower() in low if CJK.search(part) else bool(sub) and contains(seq, sub)
        if found and (sub or part) not in seen:
            seen.add(sub or part)
            out.append((part, weight))
    return out


def trigger_results(root, triggers):
    phrases = trigger_phrases(description(root))
    out = {}
    for _, t in triggers:
        matched = trigger_matches(phrases, t["prompt"])
        out[t["id"]] = (sum(w for _, w in matched) >= 2, bool(t["should_trigger"]), [p for p, _ in matched][:4])
    return out


def trigger_problems(triggers):
    problems, seen = [], set()
    for n, t in triggers:
        missing = [f for f in TRIGGER_FIELDS if f not in t]
        if missing:
            problems.append("triggers line %d: missing fields %s" % (n, missing))
            continue
        if t["id"] in seen:
            problems.append("triggers line %d: duplicate id %s" % (n, t["id"]))
        seen.add(t["id"])
    langs = {t.get("lang") for _, t in triggers}
    if not {"en", "zh"} <= langs:
        problems.append("triggers need English and Chinese prompts (lang en and zh)")
    if not any(not t.get("should_trigger", True) for _, t in triggers):
        problems.append("triggers need prompts that should not load the skill")
    return problems


# ---------------------------------------------------------------- report

def evaluate(root=ROOT, cases_path=None, triggers_path=None, floors=None):
    root = Path(root).resolve()
    floors = dict(FLOORS, **(floors or {}))
    cases = load_jsonl(cases_path or root / "evals" / "cases.jsonl")
    tpath = triggers_path or root / "evals" / "triggers.jsonl"
    triggers = load_jsonl(tpath) if Path(tpath).is_file() else []
    checks = []  # (name, ok, detail)
    for key, problems in case_problems(root, cases).items():
        checks.append(("case " + key, not problems, "; ".join(problems)))
    docs, ids = uncovered_docs(root, cases), uncovered_entries(root, cases)
    checks.append(("every reference and profile has a case", not docs, ", ".join(docs) or "yes"))
    checks.append(("every gotcha entry has a case", not ids, ", ".join(ids) or "yes"))

    good = [(n, c) for n, c in cases if all(f in c for f in FIELDS)]
    ranks = lookup_first_ranks(root, good)
    top1, top3 = route_rates(ranks)
    checks.append(("routing (lookup first) top-1 >= %.0f%%" % (100 * floors["top1"]), top1 >= floors["top1"],
                   "%.1f%%" % (100 * top1)))
    checks.append(("routing (lookup first) top-3 >= %.0f%%" % (100 * floors["top3"]), top3 >= floors["top3"],
                   "%.1f%%" % (100 * top3)))
    rranks = route_ranks(root, good)
    rtop1, rtop3 = route_rates(rranks)
    checks.append(("router rows alone top-1 >= %.0f%%" % (100 * floors["router_top1"]),
                   rtop1 >= floors["router_top1"], "%.1f%%" % (100 * rtop1)))
    checks.append(("router rows alone top-3 >= %.0f%%" % (100 * floors["router_top3"]),
                   rtop3 >= floors["router_top3"], "%.1f%%" % (100 * rtop3)))

    read = reading(root, good)
    route_chars = [v["route"] for v in read.values()]
    whole_chars = [v["whole_files"] for v in read.values()]
    median = statistics.median(route_chars) if route_chars else 0
    p90 = percentile(route_chars, 0.9)
    checks.append(("reading median <= %d chars" % floors["reading_median"], median <= floors["reading_median"],
                   "%d" % median))
    checks.append(("reading p90 <= %d chars" % floors["reading_p90"], p90 <= floors["reading_p90"],
                   "%d" % p90))

    agent = agent_reading(root, good)
    agent_chars = [v["chars"] for v in agent.values()]
    agent_median = statistics.median(agent_chars) if agent_chars else 0
    checks.append(("reading by the router alone, median <= %d chars" % floors["router_reading_median"],
                   agent_median <= floors["router_reading_median"], "%d" % agent_median))

    lranks = lookup_ranks(root, good)
    tres = trigger_results(root, triggers)
    tprob = trigger_problems(triggers)
    accuracy = sum(1 for got, want, _ in tres.values() if got == want) / max(1, len(tres))
    checks.append(("triggers file well formed, >= %d prompts" % MIN_TRIGGERS,
                   not tprob and len(triggers) >= MIN_TRIGGERS, "; ".join(tprob) or "%d prompts" % len(triggers)))
    checks.append(("trigger accuracy >= %.0f%%" % (100 * floors["trigger_accuracy"]),
                   accuracy >= floors["trigger_accuracy"], "%.1f%%" % (100 * accuracy)))
    should = [k for k, (_, w, _) in tres.items() if w]
    body = len(skill_body(root))
    return {
        "cases": len(cases),
        "floors": floors,
        "routing": {"route": "lookup.py PROMPT for cases with entries, else the router rows",
                    "top1": top1, "top3": top3, "ranks": ranks,
                    "missed_top1": sorted(k for k, r in ranks.items() if r != 1),
                    "missed_top3": sorted(k for k, r in ranks.items() if r is None or r > 3)},
        "router": {"top1": rtop1, "top3": rtop3, "ranks": rranks,
                   "missed_top1": sorted(k for k, r in rranks.items() if r != 1),
                   "missed_top3": sorted(k for k, r in rranks.items() if r is None or r > 3)},
        "reading": {"route": "SKILL.md body + lookup.py PROMPT (+ lookup.py ID / --index FILE when the entry "
                             "is not printed first; --help or the whole file for a file without entries)",
                    "skill_body": body, "median": median, "p90": p90,
                    "whole_files_median": statistics.median(whole_chars) if whole_chars else 0,
                    "whole_files_p90": percentile(whole_chars, 0.9), "per_case": read,
                    "agent": {"route": "lookup first, as SKILL.md tells the agent: the same figures as the route",
                              "median": median, "p90": p90},
                    "router": {"route": "SKILL.md body + what the best top-3 router row names (an entry by ID or "
                                        "anchor; a #symptom-index plus the entry; a section; else the whole file)",
                               "median": agent_median, "p90": percentile(agent_chars, 0.9), "per_case": agent}},
        "lookup": {"cases": len(lranks),
                   "first": sum(1 for r in lranks.values() if r == 1) / max(1, len(lranks)),
                   "listed": sum(1 for r in lranks.values() if r) / max(1, len(lranks)),
                   "missed": sorted(k for k, r in lranks.items() if not r)},
        "triggers": {"prompts": len(tres), "accuracy": accuracy,
                     "recall": sum(1 for k in should if tres[k][0]) / max(1, len(should)),
                     "false_positives": sorted(k for k, (g, w, _) in tres.items() if g and not w),
                     "false_negatives": sorted(k for k, (g, w, _) in tres.items() if w and not g),
                     "matched": {k: m for k, (_, _, m) in tres.items()}},
        "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks],
        "passed": sum(1 for _, ok, _ in checks if ok),
        "failed": sum(1 for _, ok, _ in checks if not ok),
    }


def render(report, misses=False):
    r, rd, lu, tr = report["routing"], report["reading"], report["lookup"], report["triggers"]
    ro = report["router"]
    lines = [
        "cases: %d" % report["cases"],
        "routing (lookup first, router for cases without entries): top-1 %.1f%%, top-3 %.1f%% (%d missed "
        "top-1, %d missed top-3)" % (100 * r["top1"], 100 * r["top3"], len(r["missed_top1"]), len(r["missed_top3"])),
        "router rows alone (the fallback): top-1 %.1f%%, top-3 %.1f%%" % (100 * ro["top1"], 100 * ro["top3"]),
        "reading per case, lookup first: median %d chars, p90 %d (SKILL.md body %d + lookup output); whole "
        "files instead: median %d, p90 %d" % (rd["median"], rd["p90"], rd["skill_body"], rd["whole_files_median"],
                                              rd["whole_files_p90"]),
        "reading by the router alone (SKILL.md + what the chosen row names): median %d chars, p90 %d" % (
            rd["router"]["median"], rd["router"]["p90"]),
        "lookup.py given the prompt: expected entry printed first %.0f%%, listed %.0f%% of %d cases" % (
            100 * lu["first"], 100 * lu["listed"], lu["cases"]),
        "triggers (lexical, description): accuracy %.1f%% of %d, recall %.0f%%; false positives: %s; "
        "false negatives: %s" % (100 * tr["accuracy"], tr["prompts"], 100 * tr["recall"],
                                 ", ".join(tr["false_positives"]) or "none",
                                 ", ".join(tr["false_negatives"]) or "none")]
    if misses:
        lines.append("missed top-3: " + (", ".join(r["missed_top3"]) or "none"))
        lines.append("missed top-1: " + (", ".join(r["missed_top1"]) or "none"))
        lines.append("router alone missed top-3: " + (", ".join(ro["missed_top3"]) or "none"))
        lines.append("lookup missed: " + (", ".join(lu["missed"]) or "none"))
    for c in report["checks"]:
        if not c["ok"]:
            lines.append("FAIL %s: %s" % (c["name"], c["detail"]))
    for c in report["checks"]:
        if c["ok"] and not c["name"].startswith("case "):
            lines.append("OK   %s: %s" % (c["name"], c["detail"]))
    lines.append("%d passed, %d failed" % (report["passed"], report["failed"]))
    return "\n".join(lines) + "\n"


def main(argv=None):
    share = core.arg_number(float, 0.0, 1.0000001)
    p = core.Parser(prog="run_evals.py", description=__doc__.split("\n")[0],
                    formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                    epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--root", type=Path, default=ROOT, metavar="DIR", help="the skill checkout")
    p.add_argument("--cases", type=Path, metavar="FILE", help="cases file")
    p.add_argument("--triggers", type=Path, metavar="FILE", help="trigger prompts")
    p.add_argument("--top1", type=share, default=FLOORS["top1"], metavar="SHARE", help="top-1 floor")
    p.add_argument("--top3", type=share, default=FLOORS["top3"], metavar="SHARE", help="top-3 floor")
    p.add_argument("--router-top1", type=share, default=FLOORS["router_top1"], metavar="SHARE",
                   help="top-1 floor for the router rows alone")
    p.add_argument("--router-top3", type=share, default=FLOORS["router_top3"], metavar="SHARE",
                   help="top-3 floor for the router rows alone")
    p.add_argument("--reading-median", type=core.arg_number(int, 1), default=FLOORS["reading_median"],
                   metavar="N", help="ceiling for the median characters read")
    p.add_argument("--reading-p90", type=core.arg_number(int, 1), default=FLOORS["reading_p90"],
                   metavar="N", help="ceiling for the 90th percentile characters read")
    p.add_argument("--router-reading-median", type=core.arg_number(int, 1),
                   default=FLOORS["router_reading_median"], metavar="N",
                   help="ceiling for the median characters read following the router alone")
    p.add_argument("--trigger-floor", type=share, default=FLOORS["trigger_accuracy"], metavar="S",
                   help="floor for the lexical trigger accuracy")
    p.add_argument("--misses", action="store_true", help="list every miss")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    if not (args.root / "SKILL.md").is_file():
        raise core.UsageError("%s has no SKILL.md" % args.root)
    for f in (args.cases, args.triggers):
        if f is not None and not f.is_file():
            raise core.UsageError("no such file: %s" % f)
    report = evaluate(args.root, args.cases, args.triggers,
                      {"top1": args.top1, "top3": args.top3, "router_top1": args.router_top1,
                       "router_top3": args.router_top3, "reading_median": args.reading_median,
                       "reading_p90": args.reading_p90, "router_reading_median": args.router_reading_median,
                       "trigger_accuracy": args.trigger_floor})
    if args.json:
        core.emit_json(report)
    else:
        sys.stdout.write(render(report, args.misses))
    return core.EXIT_OK if report["failed"] == 0 else core.EXIT_FAIL


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="run_evals.py"))
