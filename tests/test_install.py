"""scripts/install_skill.py against a temporary HOME: copy, link, update, refuse, dry-run, verify."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

SKILL = "remote-gpu-trainer"


def run(home, *args, script=REPO / "scripts" / "install_skill.py"):
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


def test_default_install_copies_for_claude_and_the_shared_folder(home):
    res = run(home)
    assert res.returncode == 0, res.stderr
    for folder in (".claude/skills", ".agents/skills"):
        dest = home / folder / SKILL
        assert dest.is_dir() and not dest.is_symlink()
        assert (dest / "SKILL.md").read_bytes() == (REPO / "SKILL.md").read_bytes()
        for carried in ("references", "profiles", "scripts", "LICENSE"):
            assert (dest / carried).exists(), carried
        for left_out in ("tests", "evals", ".ci", ".github", ".git"):
            assert not (dest / left_out).exists(), left_out
        assert json.loads((dest / ".rgt-install.json").read_text())["skill"] == SKILL
    # nothing but the skill folder is left behind (no staging debris)
    assert sorted(p.name for p in (home / ".claude/skills").iterdir()) == [SKILL]


def test_link_install_points_at_the_checkout(home):
    res = run(home, "--agent", "claude", "--link")
    assert res.returncode == 0, res.stderr
    dest = home / ".claude/skills" / SKILL
    assert dest.is_symlink() and dest.resolve() == REPO.resolve()


def test_reinstall_updates_our_own_install(home):
    assert run(home, "--agent", "claude").returncode == 0
    dest = home / ".claude/skills" / SKILL
    (dest / ".rgt-install.json").write_text(json.dumps({"skill": SKILL}))  # an older copy of ours
    (dest / "SKILL.md").write_text("---\nname: remote-gpu-trainer\ndescription: old\n---\nold\n")
    res = run(home, "--agent", "claude")
    assert res.returncode == 0, res.stderr
    assert "replaced" in res.stdout
    assert (dest / "SKILL.md").read_bytes() == (REPO / "SKILL.md").read_bytes()


def test_refuses_a_foreign_folder_and_leaves_it_untouched(home):
    dest = home / ".agents/skills" / SKILL
    dest.mkdir(parents=True)
    (dest / "notes.txt").write_text("mine")
    res = run(home, "--agent", "codex")
    assert res.returncode == 3
    assert "not an install of ours" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]
    res = run(home, "--agent", "codex", "--force")
    assert res.returncode == 0, res.stderr
    assert (dest / "SKILL.md").is_file() and not (dest / "notes.txt").exists()


def test_dry_run_changes_nothing(home):
    res = run(home, "--agent", "all", "--dry-run")
    assert res.returncode == 0
    assert "DRY-RUN would create" in res.stdout
    assert list(home.iterdir()) == []


def test_target_folder(home, tmp_path):
    target = tmp_path / "custom-skills"
    res = run(home, "--target", str(target))
    assert res.returncode == 0, res.stderr
    assert (target / SKILL / "SKILL.md").is_file()
    assert not (home / ".claude").exists()


def test_a_copy_that_fails_verification_keeps_the_old_install(home, tmp_path):
    assert run(home, "--agent", "claude").returncode == 0
    dest = home / ".claude/skills" / SKILL
    before = (dest / "SKILL.md").read_bytes()
    # a broken checkout: SKILL.md links to a file it does not carry
    broken = tmp_path / "checkout"
    shutil.copytree(REPO, broken, ignore=shutil.ignore_patterns(".git", "tests", "__pycache__"))
    skill = broken / "SKILL.md"
    skill.write_text(skill.read_text() + "\n[gone](references/does-not-exist.md)\n")
    res = run(home, "--agent", "claude", script=broken / "scripts" / "install_skill.py")
    assert res.returncode == 1
    assert "does-not-exist.md" in res.stderr
    assert (dest / "SKILL.md").read_bytes() == before
    assert sorted(p.name for p in (home / ".claude/skills").iterdir()) == [SKILL]


def test_bad_usage_is_one_line_exit_2(home):
    res = run(home, "--agent", "notepad")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run(home, "--project", str(home / "missing"))
    assert res.returncode == 2 and res.stderr.count("\n") == 1


def test_installed_copy_passes_the_official_validator(home):
    from conftest import need
    assert run(home, "--agent", "claude").returncode == 0
    res = subprocess.run([need("agentskills"), "validate", str(home / ".claude/skills" / SKILL)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_finding_laptop_L9_a_rerun_refuses_to_replace_an_install_the_user_changed(home):
    """The README's update path (re-running the installer) never deletes what the user put in the install."""
    assert run(home, "--agent", "claude").returncode == 0
    dest = home / ".claude/skills" / SKILL
    recorded = json.loads((dest / ".rgt-install.json").read_text())["files"]
    assert recorded["SKILL.md"] and "scripts/rgt.py" in recorded
    # running the installed tools makes caches: they are not the user's files
    (dest / "scripts" / "__pycache__").mkdir()
    (dest / "scripts" / "__pycache__" / "rgt.cpython-311.pyc").write_bytes(b"\0")
    assert run(home, "--agent", "claude").returncode == 0, "an unchanged install is updated as before"
    (dest / "references" / "MY-NOTES.md").write_text("my own notes\n")
    with open(dest / "SKILL.md", "a") as handle:
        handle.write("# my edit\n")
    edited = (dest / "SKILL.md").read_bytes()
    res = run(home, "--agent", "claude")
    assert res.returncode == 4, res.stdout + res.stderr
    assert "changed: SKILL.md" in res.stderr and "added: references/MY-NOTES.md" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert (dest / "references" / "MY-NOTES.md").read_text() == "my own notes\n"
    assert (dest / "SKILL.md").read_bytes() == edited
    dry = run(home, "--agent", "claude", "--dry-run")
    assert dry.returncode == 4 and (dest / "SKILL.md").read_bytes() == edited


def test_finding_laptop_L9_force_moves_the_old_tree_aside_and_never_deletes_it(home):
    assert run(home, "--agent", "claude").returncode == 0
    dest = home / ".claude/skills" / SKILL
    (dest / "references" / "MY-NOTES.md").write_text("my own notes\n")
    res = run(home, "--agent", "claude", "--force")
    assert res.returncode == 0, res.stderr
    kept = [line for line in res.stdout.splitlines() if line.startswith("KEPT the old tree at ")]
    assert kept, res.stdout
    aside = kept[0][len("KEPT the old tree at "):].split(" (")[0]
    assert open(os.path.join(aside, "references", "MY-NOTES.md")).read() == "my own notes\n"
    assert not os.path.abspath(aside).startswith(str(home / ".claude/skills")), "agents would load it as a skill"
    assert not (dest / "references" / "MY-NOTES.md").exists()
    assert (dest / "SKILL.md").read_bytes() == (REPO / "SKILL.md").read_bytes()
    assert run(home, "--agent", "claude").returncode == 0, "the fresh copy records its own files"
    # a folder that is not ours, replaced with --force, is kept aside too
    foreign = home / ".agents/skills" / SKILL
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    res = run(home, "--agent", "codex", "--force")
    assert res.returncode == 0 and "KEPT the old tree at" in res.stdout, res.stdout + res.stderr
    assert [p.name for p in (home / ".agents" / ".rgt-replaced").iterdir()][0].startswith(SKILL)
    assert (next((home / ".agents" / ".rgt-replaced").iterdir()) / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- red-team findings (reports/redteam-2026-12.md)
from conftest import SCRIPTS  # noqa: E402


# ---------------------------------------------------------------- 23: tracebacks and undocumented exit codes

@pytest.mark.drill("red-team findings stay fixed")
def test_finding_23_install_skill_over_long_project_is_one_line_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "install_skill.py"), "--dry-run", "--project", "a" * 300],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "--project" in done.stderr


# ---------------------------------------------------------------- 26: install_skill copying itself

@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.parametrize("inside", ["scripts", "references/sub"])
def test_finding_26_install_into_a_carried_folder_is_refused(tmp_path, inside):
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", "tests", "__pycache__", "evals", ".ci"))
    target = checkout / inside
    before = sorted(str(p) for p in checkout.rglob("*"))
    done = subprocess.run([sys.executable, str(checkout / "scripts" / "install_skill.py"), "--target", str(target)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 2, done.stderr[:500]
    assert done.stderr.count("\n") == 1 and len(done.stderr) < 1000
    assert sorted(str(p) for p in checkout.rglob("*")) == before, "the refused install left files behind"


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


# ---------------------------------------------------------------- laptop 2: install_skill --link --force

def test_finding_laptop_2_link_force_never_deletes_the_checkout_it_runs_from(tmp_path):
    """The README's git-clone install, then `install_skill.py --agent claude --link --force` from inside it:
    the checkout (its .git and the user's own files) must survive, and no self-pointing link is made."""
    home = tmp_path / "home"
    clone = home / ".claude" / "skills" / SKILL
    clone.mkdir(parents=True)
    for item in ("SKILL.md", "LICENSE", "README.md", "SECURITY.md", "references", "profiles", "scripts",
                 "examples"):
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, clone / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, clone / item)
    assert subprocess.run(["git", "init", "-q", str(clone)], capture_output=True).returncode == 0
    (clone / "MYNOTES.txt").write_text("uncommitted notes\n")
    env = dict(os.environ, HOME=str(home))
    for extra in (["--agent", "claude"], []):
        res = run_py(clone / "scripts" / "install_skill.py", *extra, "--link", "--force", env=env, cwd=clone)
        assert "Traceback" not in res.stderr, res.stderr
        assert "SKIP" in res.stdout and "this checkout itself" in res.stdout, res.stdout + res.stderr
        assert clone.is_dir() and not clone.is_symlink()
        assert (clone / ".git").is_dir() and (clone / "MYNOTES.txt").read_text() == "uncommitted notes\n"
    # the shared folder had no install: it gets a link to the checkout, which resolves
    shared = home / ".agents" / "skills" / SKILL
    assert shared.is_symlink() and shared.resolve() == clone.resolve()
