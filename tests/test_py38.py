"""Node-side scripts promise Python 3.8+ and the standard library only (GUIDE §6)."""
import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, pyenv_python

# Every Python file of the node toolkit (found, not listed, so a new tool is covered) and the example.
NODE_SIDE = sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts" / "node").glob("*.py")) + [
    "examples/train_resumable.py"]
NODE_TOOLS = [s for s in NODE_SIDE if s.startswith("scripts/node/") and s.rsplit("/", 1)[1] not in
              ("rgt_core.py", "evidence.py")]
STDLIB_ONLY_EXCEPT = {"torch", "numpy"}  # the example imports these lazily, only when installed
SIBLINGS = {p.stem for p in (REPO / "scripts" / "node").glob("*.py")}  # the core and other node modules


def py38():
    """A Python 3.8 interpreter: on PATH, or one pyenv keeps (its shim fails when 3.8 is not selected)."""
    return pyenv_python("3.8", "pyenv install 3.8.18, or put any python3.8 on PATH; the GitHub workflow installs "
                               "one with actions/setup-python")


@pytest.mark.parametrize("script", NODE_SIDE)
def test_grammar_is_python_38(script):
    ast.parse((REPO / script).read_text(encoding="utf-8"), filename=script, feature_version=(3, 8))


@pytest.mark.parametrize("script", NODE_SIDE)
def test_imports_only_the_standard_library(script):
    tree = ast.parse((REPO / script).read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    third_party = {n for n in names - STDLIB_ONLY_EXCEPT - SIBLINGS - {"__future__"} if n not in sys.stdlib_module_names}
    assert third_party == set()


def test_grammar_check_can_fail():
    with pytest.raises(SyntaxError):
        ast.parse("if (n := 3):\n    x: list[int] = []\nmatch n:\n    case 3: pass\n", feature_version=(3, 8))


@pytest.mark.parametrize("script", NODE_TOOLS + ["examples/train_resumable.py"])
def test_help_runs_on_python_38(script):
    res = subprocess.run([py38(), str(REPO / script), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-800:]


def test_manifest_and_status_work_on_python_38(tmp_path):
    exe = py38()
    root = tmp_path / "results"
    (root / "ckpt").mkdir(parents=True)
    (root / "ckpt" / "a.pt").write_bytes(b"\x80\x02" + os.urandom(1000))  # legacy-pickle magic
    res = subprocess.run([exe, str(REPO / "scripts/node/build_pull_manifest.py"), "--root", str(root),
                          "--roster", "ckpt/*", "--run-id", "r38", "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["file_count"] == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"run_id": "r38", "state": "succeeded", "exit_code": 0}))
    res = subprocess.run([exe, str(REPO / "scripts/node/run_status.py"), str(run), "--json", "--no-gpu"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["status"] == "succeeded", res.stderr


def test_readme_main_command_runs_on_bare_python_38(tmp_path):
    """The demo needs no third-party package: a 3.8 without torch takes the pure-Python model."""
    exe = py38()
    res = subprocess.run([exe, str(REPO / "scripts/demo_lifecycle.py"), "--json", "--workdir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=240)
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["ok"], res.stderr[-1500:]
