"""Shared test helpers.

Tests that need a system program (sshd, rsync, tmux, shellcheck, ...) call
``need(program)``: on a plain laptop a missing program is a skip with the reason;
in CI (``RGT_REQUIRE_ALL=1``, set by ``.ci/run``) it is a failure, so CI can never
pass by skipping.
"""
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"          # laptop tools
NODE = SCRIPTS / "node"             # the node toolkit, pushed to the GPU box as one folder
TOOLS = REPO / "tools"              # maintainer tools
SHARED = REPO.parent / "shared"
STRICT = os.environ.get("RGT_REQUIRE_ALL") == "1"
# Node modules that other tools import and nobody runs: no command line, so no --help, no exit codes and no
# toolkit version check of their own (test_help and test_toolkit skip them for those checks; test_help holds
# that each still has no command line). A module that gains a main() leaves this list and gets its help text.
LIBRARY_MODULES = ("rgt_core.py", "evidence.py", "runrec.py", "stop_engine.py", "destructive.py", "sessions.py")


def missing(reason: str):
    """Skip locally, fail in CI."""
    if STRICT:
        pytest.fail(f"{reason} (RGT_REQUIRE_ALL=1 forbids skipping)")
    pytest.skip(reason)


def need(program: str) -> str:
    """Return the path of a system program, or skip/fail when it is absent."""
    path = shutil.which(program) or (shutil.which(program, path="/usr/sbin:/sbin") if program == "sshd" else None)
    if not path:
        missing(f"{program} is not installed")
    return path


def need_module(name: str):
    """Import a Python module, or skip/fail when it is absent."""
    try:
        return __import__(name)
    except ImportError:
        missing(f"Python module {name} is not installed")


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def py() -> str:
    return sys.executable


def path_without(folder: Path, *hidden: str) -> str:
    """A PATH holding every program of the current PATH except HIDDEN (symlinks in FOLDER):
    how a bare machine without rsync or tmux looks to a script."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin"]:
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            link, target = folder / name, os.path.join(directory, name)
            if name in hidden or link.exists() or link.is_symlink():
                continue
            if os.path.isfile(target) and os.access(target, os.X_OK):
                link.symlink_to(target)
    return str(folder)


@pytest.fixture(autouse=True)
def own_run_registry(tmp_path_factory, monkeypatch):
    """Each test gets its own box registry (runrec.registry_dir): runs started by tests that run at the
    same time (xdist) must not look like neighbours on one box and hold each other's stops off."""
    monkeypatch.setenv("RGT_REGISTRY", str(tmp_path_factory.mktemp("registry")))
