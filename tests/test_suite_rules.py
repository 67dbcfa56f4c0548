"""The suite's own rules (tests/conftest.py), each shown to catch what it is for, in a throwaway pytest run:
under RGT_REQUIRE_ALL=1 every kind of skip fails; a process a test leaves running fails the session and is
killed; the latency benchmark prints every GUIDE §9 line. And the suite's shape (review D11): test modules are
named for the unit they test, never for the review round that found their tests, and no test sleeps right before
an assert (a positive wait goes through conftest's wait_for, a negative check counts the watcher's evaluations)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TOOLS, pid_alive, wait_for

SKIPPING = '''
import os
import pytest

def test_plain_skip():
    pytest.skip("rsync is not installed (apt-get install rsync)")

@pytest.mark.skipif(True, reason="needs root (sudo)")
def test_skipif():
    pass

@pytest.mark.xfail(reason="a known defect", strict=True)
def test_expected_failure():
    assert False

def test_passes():
    pass
'''

MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_rgt_xyz", reason="no_such_module_rgt_xyz is not installed (pip install it)")

def test_never_collected():
    pass
'''

LEAVES_A_PROCESS = '''
import subprocess

def test_leaves_a_sleeper(tmp_path):
    proc = subprocess.Popen(["sleep", "300"], cwd=str(tmp_path), start_new_session=True)
    (tmp_path.parent.parent / "sleeper.pid").write_text(str(proc.pid))
'''


def pytest_in(folder, *args, strict=False):
    """A separate pytest run over FOLDER with this suite's conftest.py and pytest.ini (serial, no cache)."""
    shutil.copy(REPO / "tests" / "conftest.py", folder / "conftest.py")
    shutil.copy(REPO / "pytest.ini", folder / "pytest.ini")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RGT_TEST_"))}
    env.pop("RGT_REQUIRE_ALL", None)
    if strict:
        env["RGT_REQUIRE_ALL"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", "-rA",
                           "--basetemp", str(folder / "basetemp"), *args], cwd=str(folder), env=env,
                          capture_output=True, text=True, timeout=300)


def _where(pid):
    try:
        return os.readlink("/proc/%d/cwd" % pid)
    except OSError as exc:
        return "(cwd unreadable: %s)" % exc


def outcome_counts(stdout):
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|error|errors)", stdout)}


def test_skips_are_skips_locally_and_failures_under_require_all(tmp_path):
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    local = pytest_in(tmp_path, ".")
    assert local.returncode == 0, local.stdout[-3000:]
    assert outcome_counts(local.stdout) == {"passed": 1, "skipped": 3, "xfailed": 1}, local.stdout[-3000:]

    strict = pytest_in(tmp_path, "test_skipping.py", strict=True)
    assert strict.returncode == 1, strict.stdout[-3000:]
    counts = outcome_counts(strict.stdout)
    # the plain skip fails in its call, the skipif in its setup (pytest reports that as an error)
    assert counts == {"failed": 1, "error": 1, "passed": 1, "xfailed": 1}, strict.stdout[-3000:]
    # each failure keeps the skip's reason, which names what is missing and how to get it
    for words in ("apt-get install rsync", "needs root (sudo)"):
        assert words in strict.stdout, (words, strict.stdout[-3000:])
    assert strict.stdout.count("RGT_REQUIRE_ALL=1, which forbids skipping") >= 2

    module = pytest_in(tmp_path, "test_module_skip.py", strict=True)     # a collection error stops the run
    assert module.returncode == 2 and "no_such_module_rgt_xyz is not installed" in module.stdout, module.stdout[-3000:]
    assert "module skipped under RGT_REQUIRE_ALL=1" in module.stdout


NEEDS_ROOT = '''
import os
from conftest import need_root

def test_full_disk_drill(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)      # as CI's runner user would be
    need_root("mounting a small tmpfs")
'''


def test_finding_review_B6_a_root_drill_run_without_root_fails_under_require_all(tmp_path):
    """The full-disk drills need root; without it they skip on a laptop but fail where RGT_REQUIRE_ALL=1 (CI), and
    no test skips on its own for want of root (it calls need_root, which goes through missing())."""
    (tmp_path / "test_root.py").write_text(NEEDS_ROOT)
    assert outcome_counts(pytest_in(tmp_path, ".").stdout) == {"skipped": 1}
    strict = pytest_in(tmp_path, ".", strict=True)
    assert strict.returncode == 1 and "mounting a small tmpfs needs root" in strict.stdout, strict.stdout[-3000:]
    own_skips = [p.name for p in sorted((REPO / "tests").glob("test_*.py"))
                 if re.search(r"pytest\.skip\(.*(root|mount)", p.read_text(encoding="utf-8"))]
    assert own_skips == []


def test_a_process_left_running_fails_the_session_and_is_killed(tmp_path):
    (tmp_path / "test_leak.py").write_text(LEAVES_A_PROCESS)
    res = pytest_in(tmp_path, ".")
    pid_file = tmp_path / "sleeper.pid"
    assert pid_file.exists(), res.stdout[-3000:]
    pid = int(pid_file.read_text())
    try:
        assert res.returncode == 1, res.stdout[-3000:]
        assert "1 passed" in res.stdout and "LEFTOVER PROCESSES" in res.stdout, (
            "sleeper %d %s; " % (pid, "still runs from " + _where(pid) if pid_alive(pid) else "was gone")
            + res.stdout[-3000:])
        assert "pid %d: sleep 300" % pid in res.stdout
        assert wait_for(lambda: not pid_alive(pid), 10), "the leftover sleeper was not killed"
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)


def test_bench_latency_quick_prints_every_line(tmp_path, ssh_sessions_allowed):
    """Not a timed test: the figures are whatever this box gives; only the shape of the report is checked.
    Its temp dir is in tmp_path (TMPDIR), so the session's leftover check sees anything it leaves running."""
    res = subprocess.run([sys.executable, str(TOOLS / "bench_latency.py"), "--quick", "--json"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert res.returncode in (0, 1), res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads(res.stdout)
    names = [f["name"] for f in report["figures"]]
    assert names == ["immediate exit", "dead-man delay", "boot -> training", "idle -> stop", "status trip", "tar pull"]
    for fig in report["figures"]:
        assert fig["target"] and fig["detail"], fig
        assert "FAILED" not in fig["detail"], fig              # a missed target is fine here; a broken bench is not
        assert (fig["value"] is None) == (fig["ok"] is None), fig
    assert report["ok"] == all(f["ok"] is not False for f in report["figures"])
    assert (res.returncode == 0) == report["ok"]
    lines = subprocess.run([sys.executable, str(TOOLS / "bench_latency.py"), "--repeat", "0"],
                           capture_output=True, text=True, timeout=60)
    assert lines.returncode == 2 and "error" in lines.stderr


# ---------------------------------------------------------------- finding review D11: unit names, no timed asserts

ROUND_WORDS = re.compile(r"round_?\d|red_?team|newcomer|wave_?\d", re.I)
# "file.py::function": why a bare sleep right before an assert is the point there. A sleep inside a child
# program's text (a job's own runtime) is a string, not a statement, and is never listed.
SLEEP_ALLOWED = {}


def round_named(names):
    return sorted(n for n in names if ROUND_WORDS.search(n))


def timed_asserts(path):
    """["file.py::function:line"] for each bare sleep statement whose next statement in its block is an assert:
    a positive check there races the box's load (use wait_for) and a negative one passes trivially under it
    (count the watcher's evaluations, or use a barrier)."""
    import ast
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if not isinstance(block, list):
                    continue
                for stmt, after in zip(block, block[1:]):
                    call = stmt.value if isinstance(stmt, ast.Expr) else None
                    name = getattr(getattr(call, "func", None), "attr", None) or getattr(getattr(call, "func", None),
                                                                                         "id", None)
                    if isinstance(call, ast.Call) and name == "sleep" and isinstance(after, ast.Assert):
                        found.append("%s::%s:%d" % (Path(path).name, func.name, stmt.lineno))
    return sorted(set(found))


def test_finding_review_D11_test_modules_are_named_for_the_unit_they_test():
    """test_laptop_round4.py, test_status_round4.py, test_redteam_2.py...: a module named after the review round
    that found its tests hides which unit they hold; each moved into its unit's module."""
    assert round_named(p.name for p in (REPO / "tests").glob("*.py")) == []
    assert round_named(["test_laptop_round4.py", "test_redteam_2.py", "test_pull.py"]) == [
        "test_laptop_round4.py", "test_redteam_2.py"]


def test_finding_review_D11_no_bare_sleep_right_before_an_assert():
    found = [f for p in sorted((REPO / "tests").glob("test_*.py")) for f in timed_asserts(p)]
    assert [f for f in found if f.rsplit(":", 1)[0] not in SLEEP_ALLOWED] == []


def test_the_sleep_scan_can_fail(tmp_path):
    sample = tmp_path / "test_x.py"
    sample.write_text("import time\n\nJOB = 'import time; time.sleep(5)'\n\n"
                      "def test_a(p):\n    p.kill()\n    time.sleep(0.3)\n    assert not p.alive\n\n"
                      "def test_b(w):\n    while w():\n        time.sleep(0.1)\n    assert w.done\n")
    assert timed_asserts(sample) == ["test_x.py::test_a:7"]
