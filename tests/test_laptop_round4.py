"""Round 4 of the laptop side and custody (issue 28): every finding of
../shared/reports/redteam-2026-12-03-laptop.md, design review B4/B5, the field test's R9-R18 (R15 is the
node watchers' and lives with them) and a newcomer's walk-through, each with the test that reproduces it.

Real parts: an sshd on 127.0.0.1 (tests/sshd_fixture.py), real rsync and tar. Where a node must misbehave
(stall, lie about a size), a small stand-in for ssh plays that node and the test says so.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NODE, REPO, SCRIPTS

SKILL = "remote-gpu-trainer"
RGT = SCRIPTS / "rgt.py"


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
