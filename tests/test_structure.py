"""Structure tests: the skill is spec-valid, lean, linked, reachable, consistent and clean.

Each check runs on the repo (must be clean) and on a deliberately broken copy (must complain),
so no check can pass by being unable to fail.
"""
import re
import shutil
import subprocess
import sys

import pytest

import structure_checks as sc
from conftest import REPO, SHARED, missing, need

BROKEN_KEY = "-----BEGIN " + "OPENSSH PRIVATE KEY-----"  # split so this file does not trip the scan


@pytest.fixture
def tree(tmp_path):
    """A copy of the repo's Markdown and scripts to break."""
    root = tmp_path / "remote-gpu-trainer"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache",
                                                               ".hypothesis", "*.pt", "runs"))
    return root


# --- the official validator -------------------------------------------------------------------

def validate(path):
    exe = need("agentskills")
    return subprocess.run([exe, "validate", str(path)], capture_output=True, text=True)


def test_official_validator_passes(tmp_path):
    link = tmp_path / "remote-gpu-trainer"
    link.symlink_to(REPO, target_is_directory=True)
    res = validate(link)
    assert res.returncode == 0, res.stdout + res.stderr


def test_official_validator_rejects_a_bad_name(tree):
    skill = tree / "SKILL.md"
    skill.write_text(skill.read_text().replace("name: remote-gpu-trainer", "name: Remote_GPU", 1))
    assert validate(tree).returncode != 0


# --- frontmatter and budget -------------------------------------------------------------------

def test_frontmatter_rules():
    assert sc.check_frontmatter(REPO) == []


@pytest.mark.parametrize("old,new,expect", [
    ("license: MIT", "license: GPL-3.0", "license"),
    ("name: remote-gpu-trainer", "name: other", "name"),
    ("license: MIT", "license: MIT\nchangelog: v1", "non-standard"),
])
def test_frontmatter_rules_catch_breaks(tree, old, new, expect):
    skill = tree / "SKILL.md"
    skill.write_text(skill.read_text().replace(old, new, 1))
    assert any(expect in p for p in sc.check_frontmatter(tree))


def test_frontmatter_catches_long_description(tree):
    skill = tree / "SKILL.md"
    text = skill.read_text()
    skill.write_text(text.replace("description: >-\n", "description: >-\n  " + "x" * 1100 + "\n", 1))
    assert any("1024" in p for p in sc.check_frontmatter(tree))


def test_skill_body_within_budget():
    assert sc.check_budget(REPO) == []


def test_budget_catches_a_long_body(tree):
    skill = tree / "SKILL.md"
    skill.write_text(skill.read_text() + ("padding line\n" * 1000))
    problems = sc.check_budget(tree)
    assert any("bytes (budget" in p for p in problems) and any("lines" in p for p in problems)


# --- links, anchors, reachability ---------------------------------------------------------------

def test_links_and_anchors_resolve():
    assert sc.check_links(REPO) == []


def test_links_check_catches_missing_file_and_anchor(tree):
    (tree / "references" / "broken.md").write_text(
        "# Broken\n\n[gone](nowhere.md) and [bad anchor](../SKILL.md#no-such-heading)\n")
    problems = sc.check_links(tree)
    assert any("missing file nowhere.md" in p for p in problems)
    assert any("#no-such-heading" in p for p in problems)


def test_slug_matches_github():
    assert sc.slug("U7 — Save fails while `df` shows space") == "u7--save-fails-while-df-shows-space"
    assert sc.slug("2. Storage (survival matrix)") == "2-storage-survival-matrix"


def test_every_reference_and_profile_reachable_in_two_hops():
    assert sc.check_reachability(REPO) == []


def test_reachability_catches_an_orphan_and_a_deep_file(tree):
    (tree / "references" / "orphan.md").write_text("# Orphan\n")
    problems = sc.check_reachability(tree)
    assert any("orphan.md" in p for p in problems)
    # a chain SKILL -> a -> b -> c puts c three hops away
    refs = tree / "references"
    (refs / "c.md").write_text("# C\n")
    (refs / "b.md").write_text("# B\n[c](c.md)\n")
    (refs / "a.md").write_text("# A\n[b](b.md)\n")
    skill = tree / "SKILL.md"
    skill.write_text(skill.read_text() + "\n[a](references/a.md)\n")
    problems = sc.check_reachability(tree)
    assert any("c.md" in p for p in problems) and not any("/b.md" in p for p in problems)


# --- gotcha entries -----------------------------------------------------------------------------

def test_entry_ids_unique_and_complete():
    assert sc.check_entries(REPO) == []


def test_entries_exist():
    assert len(list(sc.entries(REPO))) > 0


def test_entry_check_catches_duplicates_and_missing_parts(tree):
    (tree / "references" / "dup.md").write_text(
        "# Dup\n\n### ZZ1 — First\n**Symptom** a **Cause** b **Fix** c **Check** d\n\n"
        "### ZZ1 — Again\n**Symptom** a **Cause** b **Fix** c\n")
    problems = sc.check_entries(tree)
    assert any("duplicate entry ID ZZ1" in p for p in problems)
    assert any("lacks Check" in p for p in problems)


# --- shell, secrets, overlap --------------------------------------------------------------------

def test_shell_scripts_pass_shellcheck():
    assert sc.shell_files(REPO), "no shell scripts found"
    assert sc.check_shellcheck(REPO, need("shellcheck")) == []


def test_shellcheck_catches_a_bad_script(tmp_path):
    (tmp_path / "bad.sh").write_text("#!/usr/bin/env bash\nrm -rf $1/*\necho $undefined_var\n")
    assert sc.check_shellcheck(tmp_path, need("shellcheck")) != []


def test_no_secrets_in_tree():
    assert sc.check_secrets(REPO) == []


def test_secret_scan_catches_a_key_and_a_token(tmp_path):
    (tmp_path / "leak.txt").write_text(BROKEN_KEY + "\nexport HF_TOKEN=hf_" + "a1B2" * 9 + "\n")
    problems = sc.check_secrets(tmp_path)
    assert any("private key" in p for p in problems) and any("Hugging Face" in p for p in problems)


def overlap(paths=()):
    tool = SHARED / "tools" / "overlap_check.py"
    if not tool.is_file():
        missing(f"{tool} is absent: the copy check and the sources live in the project's shared folder beside a "
                "development checkout (CI on a plain clone deselects these with -m 'not needs_shared')")
    return subprocess.run([sys.executable, str(tool), *map(str, paths)], cwd=REPO, capture_output=True, text=True)


@pytest.mark.needs_shared
def test_no_text_copied_from_the_sources():
    res = overlap()
    # exit 0 is the tool's "clean"; a crash (exit 1 with a traceback, or 2) fails here too
    assert res.returncode == 0 and "FAIL" not in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]


@pytest.mark.needs_shared
def test_overlap_check_catches_copied_text(tmp_path):
    sources = SHARED / "sources" / "upstream" / "references" / "run-remote"
    src = next(sources.glob("*.md"), None)
    if src is None:
        missing(f"no upstream snapshot in {sources}: it sits in the project's shared folder beside a development "
                "checkout")
    copied = tmp_path / "references" / "copied.md"        # a copy outside the repo: the tree is never written
    copied.parent.mkdir()
    copied.write_text(src.read_text()[:4000])
    res = overlap([copied])
    assert res.returncode == 1 and "FAIL" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]


# --- README, CI and the scripts SKILL.md shows ----------------------------------------------------

def ci_test_command():
    m = re.search(r"^TEST_CMD='([^']+)'", (REPO / ".ci" / "run").read_text(), re.M)
    assert m, ".ci/run defines no TEST_CMD"
    return m.group(1)


def test_readme_has_exactly_two_commands_up_front_and_ci_runs_the_test_one():
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    commands = [l.split("#")[0].strip() for l in block.splitlines() if l.strip()]
    assert len(commands) == 2
    assert commands[0] == "python3 scripts/demo_lifecycle.py"
    assert commands[1] == ci_test_command()


def test_ci_requires_every_test_to_run():
    text = (REPO / ".ci" / "run").read_text()
    assert "RGT_REQUIRE_ALL=1" in text
    for pkg in ("openssh-server", "rsync", "tmux"):
        assert pkg in text


def skill_scripts():
    text = (REPO / "SKILL.md").read_text()
    return sorted(set(re.findall(r"`((?:scripts|examples)/[\w.-]+\.(?:py|sh))`", text)))


def test_skill_md_names_only_existing_scripts():
    missing = [s for s in skill_scripts() if not (REPO / s).is_file()]
    assert skill_scripts() and missing == []


@pytest.mark.parametrize("script", skill_scripts())
def test_every_script_skill_md_shows_accepts_help(script):
    path = REPO / script
    cmd = [sys.executable, str(path), "--help"] if script.endswith(".py") else ["bash", str(path), "--help"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, f"{script} --help exited {res.returncode}: {res.stderr[-500:]}"
    assert "usage" in (res.stdout + res.stderr).lower()
    assert "Traceback" not in res.stderr


def test_docs_show_only_options_the_scripts_accept():
    assert sc.check_doc_flags(REPO) == []


def test_doc_flag_check_catches_a_made_up_option(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nssh gpu-box \"python3 ~/rgt-bin/run_status.py RUN --frobnicate\"\n"
                   "bash ~/rgt-bin/run_one.sh --profile x \\\n  --no-such-flag -- python train.py --epochs 3\n```\n")
    problems = sc.check_doc_flags(REPO, docs=[doc])
    assert len(problems) == 2 and "--frobnicate" in problems[0] and "--no-such-flag" in problems[1]


def test_references_open_with_when_contents_and_symptom_index():
    assert sc.check_reference_openings(REPO) == []


def test_opening_check_catches_a_bare_catalog(tree):
    (tree / "references" / "bare.md").write_text(
        "# Bare\n\n### ZZ9 — Thing\n**Symptom** a **Cause** b **Fix** c **Check** d\n")
    problems = [p for p in sc.check_reference_openings(tree) if "bare.md" in p]
    assert len(problems) == 3


# --- reference size: split a file that passes ~25 KB (GUIDE.md section 5) ---------------------

REFERENCE_MAX_BYTES = 25_600


def oversized_references(root):
    """['path (N bytes)'] for every references/**/*.md larger than REFERENCE_MAX_BYTES."""
    return [f"{p.relative_to(root).as_posix()} ({p.stat().st_size} bytes)"
            for p in sorted((root / "references").rglob("*.md")) if p.stat().st_size > REFERENCE_MAX_BYTES]


def test_every_reference_within_25_kb():
    over = oversized_references(REPO)
    assert over == [], (f"over {REFERENCE_MAX_BYTES} bytes, split by topic (GUIDE.md section 5): "
                        + ", ".join(over))


def test_size_check_catches_a_long_reference(tree):
    (tree / "references" / "long.md").write_text("x" * (REFERENCE_MAX_BYTES + 1))
    assert oversized_references(tree) == [f"references/long.md ({REFERENCE_MAX_BYTES + 1} bytes)"]


# --- module size: one job per module (review D8) ----------------------------------------------------------------

# A module over the review's ~800-line mark is worth a look for a second job; over SCRIPT_MAX_LINES it has one.
# 1,500 sits above the largest modules that are one job today (rgt.py 1,465: the laptop CLI; rgt_core.py 1,322: the
# node's core; notify.py 1,235: one job in layers) and below what run_forensics.py (1,475: readers, statistics,
# commands, plot) and deadman.py (1,663: loop, run rules, CLI) had grown to before they were split. Still above
# 800, each one job: rgt.py, rgt_core.py, notify.py, node_probe.py (one audit in sections), pull_verified.py (one
# verified pull, two transports) and deadman.py (~950: the run dead-man's facts, its job stop, its CLI).
SCRIPT_MAX_LINES = 1500
SPLIT_MAX_LINES = 800   # the modules the D8 split made stay under the review's mark


def long_scripts(root, limit=SCRIPT_MAX_LINES):
    """['path (N lines)'] for every scripts/*.py and scripts/node/*.py longer than LIMIT lines."""
    paths = sorted((root / "scripts").glob("*.py")) + sorted((root / "scripts" / "node").glob("*.py"))
    counts = ((p, len(p.read_text(encoding="utf-8").splitlines())) for p in paths)
    return [f"{p.relative_to(root).as_posix()} ({n} lines)" for p, n in counts if n > limit]


def test_finding_review_D8_no_script_over_the_line_budget():
    """run_forensics.py held readers, statistics, commands and plot; deadman.py the watch loop, the run rules and
    the CLI (1,663 lines). Split, and held so: no script over SCRIPT_MAX_LINES, the split parts under 800."""
    assert long_scripts(REPO) == [], f"over {SCRIPT_MAX_LINES} lines: split it by job (review D8)"
    split = ["scripts/run_forensics.py", "scripts/metrics_readers.py", "scripts/node/watcher.py",
             "scripts/node/deadman_rules.py"]
    sizes = {rel: len((REPO / rel).read_text(encoding="utf-8").splitlines()) for rel in split}
    assert {rel: n for rel, n in sizes.items() if n > SPLIT_MAX_LINES} == {}


def test_finding_review_D8_the_readers_are_imported_not_the_cli():
    """repro.py imported the run_forensics CLI for its readers; now both import metrics_readers, which imports
    neither of them (no circle, no command line of its own)."""
    import ast

    def imported(rel):
        names = set()
        for node in ast.walk(ast.parse((REPO / rel).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        return names
    assert "metrics_readers" in imported("scripts/repro.py") & imported("scripts/run_forensics.py")
    assert "run_forensics" not in imported("scripts/repro.py")
    assert not imported("scripts/metrics_readers.py") & {"run_forensics", "repro"}
    assert "def main(" not in (REPO / "scripts" / "metrics_readers.py").read_text(encoding="utf-8")


def test_line_budget_check_catches_a_long_script(tmp_path):
    (tmp_path / "scripts" / "node").mkdir(parents=True)
    (tmp_path / "scripts" / "node" / "big.py").write_text("x = 1\n" * (SCRIPT_MAX_LINES + 1))
    (tmp_path / "scripts" / "small.py").write_text("x = 1\n" * SCRIPT_MAX_LINES)
    assert long_scripts(tmp_path) == ["scripts/node/big.py (1501 lines)"]


def test_finding_review_D10_each_shared_provider_and_file_check_has_one_owner():
    """Review D10: the adapters' shared header (API base and its override variables, "is this answer about another
    instance") lived in four copies, and the private-file check in two. Each is one owner now: providers.ADAPTERS,
    providers.api_base, providers.not_this_instance; rgt_core.lstat_or_usage."""
    node = REPO / "scripts" / "node"
    adapters = sorted(node.glob("provider_*.py"))
    assert len(adapters) == 4
    for path in adapters:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"[\"']\w*_API_URL[\"']", text), "%s reads its API base itself (ADAPTERS owns it)" % path.name
        assert "pv.api_base(" in text and "pv.not_this_instance(" in text, path.name
    notify = (node / "notify.py").read_text(encoding="utf-8")
    assert "os.lstat(" not in notify and "core.lstat_or_usage(" in notify, "notify.py checks a private file itself"
