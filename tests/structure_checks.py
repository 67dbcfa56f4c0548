"""Structure checks over a skill tree. Each returns a list of problems (empty = clean).

They take the tree's root as an argument so tests can run them on the repo and on deliberately
broken copies — every check is shown to fail as well as to pass.
"""
import re
import subprocess
from pathlib import Path

import yaml

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", "node_modules", ".hypothesis"}
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
BODY_MAX_CHARS = 8_000
BODY_MAX_LINES = 300
ENTRY_HEADING = re.compile(r"^###\s+([A-Z]{1,3}\d+)\s+—\s+\S")
ENTRY_PARTS = ("**Symptom**", "**Cause**", "**Fix**", "**Check**")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
SECRET_PATTERNS = {
    "private key": re.compile(r"-----BEGIN (?:RSA |EC |OPENSSH |DSA |ENCRYPTED )?PRIVATE KEY-----"),
    "AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "OpenAI-style key": re.compile(r"\bsk-[A-Za-z0-9_-]{32,}\b"),
    "Slack token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),
    "wandb key": re.compile(r"WANDB_API_KEY\s*=\s*['\"]?[0-9a-f]{40}\b"),
}


def files(root: Path, suffixes):
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in suffixes and not (set(p.relative_to(root).parts) & SKIP_DIRS):
            out.append(p)
    return out


def split_frontmatter(text: str):
    """Return (frontmatter dict or None, body)."""
    if not text.startswith("---\n"):
        return None, text
    end = text.find("\n---\n", 4)
    if end < 0:
        return None, text
    return yaml.safe_load(text[4:end]), text[end + 5:]


def check_frontmatter(root: Path):
    problems = []
    skill = root / "SKILL.md"
    if not skill.is_file():
        return ["SKILL.md is missing"]
    try:
        meta, _ = split_frontmatter(skill.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        return [f"SKILL.md frontmatter is not YAML: {exc}"]
    if not isinstance(meta, dict):
        return ["SKILL.md has no frontmatter"]
    extra = set(meta) - ALLOWED_KEYS
    if extra:
        problems.append(f"non-standard frontmatter keys: {sorted(extra)}")
    if meta.get("name") != "remote-gpu-trainer":
        problems.append(f"name is {meta.get('name')!r}, expected 'remote-gpu-trainer'")
    desc = meta.get("description")
    if not isinstance(desc, str) or not desc.strip():
        problems.append("description is missing")
    elif len(desc) > 1024:
        problems.append(f"description is {len(desc)} characters (max 1024)")
    elif not re.search(r"[\u4e00-\u9fff]", desc):
        problems.append("description has no Chinese trigger words")
    if meta.get("license") != "MIT":
        problems.append(f"license is {meta.get('license')!r}, expected 'MIT'")
    return problems


def check_budget(root: Path):
    text = (root / "SKILL.md").read_text(encoding="utf-8")
    _, body = split_frontmatter(text)
    problems = []
    size = len(body.encode("utf-8"))  # UTF-8 bytes: the stricter count (CJK and dashes take 2-3 each)
    if size > BODY_MAX_CHARS:
        problems.append(f"SKILL.md body is {size} bytes (budget {BODY_MAX_CHARS})")
    lines = body.count("\n")
    if lines > BODY_MAX_LINES:
        problems.append(f"SKILL.md body is {lines} lines (budget {BODY_MAX_LINES})")
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower-case, drop punctuation, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- \u4e00-\u9fff]", "", text)
    return text.replace(" ", "-")


def prose_lines(text: str):
    """Yield (lineno, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def anchors(path: Path):
    seen = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            out.add(base if k == 0 else f"{base}-{k}")
            seen[base] = k + 1
        for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
            out.add(a)
    return out


def links(path: Path):
    """Yield (lineno, target) for Markdown links outside code."""
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            yield n, target


def check_links(root: Path):
    problems = []
    cache = {}
    for md in files(root, {".md"}):
        for n, target in links(md):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md.resolve()
            where = f"{md.relative_to(root)}:{n}"
            if file_part and not dest.exists():
                problems.append(f"{where}: link to missing file {target}")
                continue
            if anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    problems.append(f"{where}: anchor #{anchor} not found in {file_part or md.name}")
    return problems


def link_graph(root: Path):
    graph = {}
    for md in files(root, {".md"}):
        outs = set()
        for _, target in links(md):
            file_part = target.partition("#")[0]
            if file_part and not re.match(r"^[a-z][a-z0-9+.-]*:", file_part):
                dest = (md.parent / file_part).resolve()
                if dest.suffix == ".md" and dest.exists():
                    outs.add(dest)
        graph[md.resolve()] = outs
    return graph


def check_reachability(root: Path, max_hops: int = 2):
    """Every Markdown file under references/ and profiles/ is within max_hops links of SKILL.md."""
    graph = link_graph(root)
    start = (root / "SKILL.md").resolve()
    depth = {start: 0}
    frontier = [start]
    for hop in range(1, max_hops + 1):
        nxt = []
        for node in frontier:
            for dest in graph.get(node, ()):
                if dest not in depth:
                    depth[dest] = hop
                    nxt.append(dest)
        frontier = nxt
    problems = []
    for sub in ("references", "profiles"):
        for md in files(root / sub, {".md"}) if (root / sub).is_dir() else []:
            if md.resolve() not in depth:
                problems.append(f"{md.relative_to(root)} is not reachable from SKILL.md in {max_hops} hops")
    return problems


def entries(root: Path):
    """Yield (file, lineno, id, entry text) for every gotcha entry in the tree."""
    for md in files(root, {".md"}):
        if md.name == "README.md" or ".github" in md.parts:
            continue
        lines = md.read_text(encoding="utf-8").splitlines()
        starts = [(i, ENTRY_HEADING.match(l)) for i, l in enumerate(lines)]
        starts = [(i, m.group(1)) for i, m in starts if m]
        for k, (i, eid) in enumerate(starts):
            end = len(lines)
            fenced = False
            for j in range(i + 1, len(lines)):
                if FENCE.match(lines[j]):
                    fenced = not fenced
                elif not fenced and re.match(r"^#{1,3}\s", lines[j]):  # a '# comment' in code is not a heading
                    end = j
                    break
            yield md, i + 1, eid, "\n".join(lines[i:end])


def check_entries(root: Path):
    problems = []
    seen = {}
    for md, n, eid, text in entries(root):
        where = f"{md.relative_to(root)}:{n}"
        if eid in seen:
            problems.append(f"{where}: duplicate entry ID {eid} (first at {seen[eid]})")
        else:
            seen[eid] = where
        missing = [p.strip("*") for p in ENTRY_PARTS if p not in text]
        if missing:
            problems.append(f"{where}: entry {eid} lacks {', '.join(missing)}")
    return problems


def shell_files(root: Path):
    out = files(root, {".sh"})
    for p in files(root, {""}):
        try:
            with open(p, "rb") as fh:
                first = fh.readline()
        except OSError:
            continue
        if first.startswith(b"#!") and (b"bash" in first or b"/sh" in first):
            out.append(p)
    return sorted(set(out))


def check_shellcheck(root: Path, shellcheck: str):
    problems = []
    targets = shell_files(root)
    if not targets:
        return problems
    res = subprocess.run([shellcheck, "-x", "-S", "warning", *map(str, targets)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        problems.append(res.stdout.strip() or res.stderr.strip())
    return problems


def check_secrets(root: Path):
    problems = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or set(p.relative_to(root).parts) & SKIP_DIRS:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pattern in SECRET_PATTERNS.items():
                if pattern.search(line):
                    problems.append(f"{p.relative_to(root)}:{n}: looks like a {what}")
    return problems


def script_options(path: Path):
    """Every long option a script's --help mentions (for tools with subcommands, theirs too)."""
    import sys
    subcommands = {"deadman.py": ["arm", "ack", "status"], "idle_watch.py": ["arm", "status", "disarm"],
                   "rgt.py": ["push", "probe", "launch", "status", "patrol", "logs", "ack", "resume", "pull", "gate",
                              "sweep", "ledger", "notify", "reap"],
                   "run_forensics.py": ["list", "diff", "curve", "plot", "steps"]}
    runs = [[]] + [[s] for s in subcommands.get(path.name, [])]
    text = ""
    for sub in runs:
        cmd = ([sys.executable, str(path)] if path.suffix == ".py" else ["bash", str(path)]) + sub + ["--help"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        text += res.stdout + res.stderr
    return set(re.findall(r"--[a-z][a-z0-9-]*", text))


def check_doc_flags(root: Path, docs=None):
    """Every --option shown with one of our scripts in the docs is one that script accepts.

    A command is read from the script's name to the end of its shell segment (a quote, pipe, &&, ;,
    backtick, comment or ` -- `, after which the arguments belong to the job). Values passed through
    `--deadman-arg` belong to deadman.py and are skipped here.
    """
    scripts = {p.name: p for d in ("scripts", "scripts/node", "tools", "examples")
               for p in [*(root / d).glob("*.py"), *(root / d).glob("*.sh")]}
    if not scripts:
        return []
    pattern = re.compile(r"(?<![\w.-])(?:[\w~./$-]*/)?(" + "|".join(map(re.escape, scripts)) + r")\b(.*)")
    if docs is None:
        docs = [root / "SKILL.md", root / "README.md", *files(root / "references", {".md"}),
                *files(root / "profiles", {".md"})]
    known, problems = {}, []
    for doc in docs:
        text = re.sub(r"\\\n\s*", " ", doc.read_text(encoding="utf-8"))  # join continued lines
        for n, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                name, rest = m.group(1), m.group(2)
                segment = re.split(r'"|\||&&|;|`|\)|\s#|\s--\s|\s--$', rest)[0]
                segment = re.sub(r"--deadman-arg\s+\S+", " ", segment)
                for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", segment):
                    if name not in known:
                        known[name] = script_options(scripts[name])
                    if opt not in known[name]:
                        problems.append(f"{doc.name if not doc.is_relative_to(root) else doc.relative_to(root)}:{n}: {name} has no option {opt}")
    return problems


def check_reference_openings(root: Path):
    """Each reference opens with 'Use this when' and a contents list; each catalog has a symptom index."""
    problems = []
    entry_files = {md.resolve() for md, _, _, _ in entries(root)}
    for md in files(root / "references", {".md"}) if (root / "references").is_dir() else []:
        text = md.read_text(encoding="utf-8")
        rel = md.relative_to(root)
        if "use this when" not in "\n".join(text.splitlines()[:12]).lower():
            problems.append(f"{rel}: no 'Use this when' in its first lines")
        if not re.search(r"^#{2,3}\s+(table of )?contents\b", text, re.I | re.M):
            problems.append(f"{rel}: no contents list")
        if md.resolve() in entry_files and not re.search(r"^#{2,3}\s+symptom index\b", text, re.I | re.M):
            problems.append(f"{rel}: has entries but no symptom index")
    return problems
