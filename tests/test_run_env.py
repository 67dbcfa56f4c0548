"""run_env.py, the environment record of a launch: --compare on an odd record and --remote never keep a
credential. Real git projects (tests/repro_fixture.py). Each test was a red-team finding (round 3).
"""
import json
import sys

import pytest

from conftest import NODE, run_no_traceback as run
from repro_fixture import git

pytestmark = [pytest.mark.drill("red-team findings stay fixed"),   # every test here is a finding
              pytest.mark.usefixtures("one_toolkit_version")]


PY = sys.executable
RUN_ENV = str(NODE / "run_env.py")


# ---------------------------------------------------------------------------------------------- run_env.py

def test_run_env_compare_odd_record(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    odd = tmp_path / "old-env.json"
    odd.write_text(json.dumps({"python": "3.11.7", "torch": "2.3.0", "data": ["/data/x"]}))
    res = run([PY, RUN_ENV, rd, "--python", PY, "--cwd", tmp_path, "--compare", odd, "--timeout", "30"])
    assert res.returncode == 2 and "unexpected" not in res.stderr, res.stderr


def test_run_env_remote_keeps_no_credential(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    git(proj, "commit", "-q", "--allow-empty", "-m", "x")
    rd = tmp_path / "run"
    rd.mkdir()
    leaked = []
    for url in ("https://gitlab.example.com/o/r.git?private_token=glpat-SECRETA",
                "https://ci:p@ssSECRETB@git.example.com/o/r.git"):
        git(proj, "remote", "remove", "origin") if "origin" in git(proj, "remote") else None
        git(proj, "remote", "add", "origin", url)
        res = run([PY, RUN_ENV, rd, "--python", PY, "--cwd", proj, "--timeout", "30"])
        assert res.returncode == 0, res.stderr
        remote = json.loads((rd / "env.json").read_text())["git"]["remote"]
        if "SECRET" in remote:
            leaked.append(remote)
    assert not leaked, leaked
