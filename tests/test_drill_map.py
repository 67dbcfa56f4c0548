"""The drill map: every fault drill GUIDE §9 names has at least one test marked `@pytest.mark.drill(NAME)`.

`python3 -m pytest -m drill` runs them all. The map below is the list; a marker whose name is not in it
fails (a typo would hide a drill). Drills whose tests are still being written sit in PENDING: the check
names them and how many marked tests they have, but does not fail on them; move one out of PENDING in
the change that adds its test.

The markers are read from the test files' syntax trees, so the check sees every file whatever -k or -m
selected, and needs no second pytest run.
"""
import ast

from conftest import REPO

TESTS = REPO / "tests"

# drill name (as the markers spell it) -> the GUIDE §9 drill it stands for
DRILLS = {
    "kill-9 mid-epoch resumes": "kill -9 mid-epoch, then resume with no progress lost past the last good checkpoint",
    "kill-9 mid-save keeps last good": "kill -9 mid-save leaves the previous good generation usable",
    "SIGTERM saves within grace": "SIGTERM saves within a 5 s grace",
    "SSH drop: job and dead-man live on": "SSH session dropped, job and dead-man live on",
    "stall fires the dead-man": "stalled job: the dead-man fires",
    "unacknowledged finish stops after grace": "finished job not acknowledged: the meter stops after the grace",
    "earlier watcher spares a resumed attempt": "a resumed attempt is never stopped by an earlier attempt's watcher",
    "restart re-arms the dead-man": "a restart re-arms the dead-man",
    "destructive stop needs verified sync": "destructive stop refused without verified sync, however it is wrapped",
    "damaged evidence fails with a reason": "flipped byte, truncated, zero-byte, missing, extra, dotfile, symlink escape, "
                                            "../ or absolute path: verification fails with a clear reason",
    "interrupted pull resumes": "an interrupted pull resumes",
    "low disk or read-only durable refuses launch": "a disk below the floor or a read-only durable dir: launch refused",
    "empty roster fails": "an empty roster is a failure, not a success",
    "red-team findings stay fixed": "every finding of the red-team reports stays fixed",
    # wave 3
    "full disk during grace: stop still runs": "the durable disk fills during the grace: the stop still runs",
    "shebang-less stop script runs": "a stop command that is a shebang-less script runs",
    "no-effect stop is NOT CONFIRMED": "a stop that exits 0 and stops nothing: NOT CONFIRMED, retried, escalated",
    "multi-run stall spares healthy runs": "one run's stall on a multi-run box never stops the box under a healthy run",
    "resume that cannot resume keeps durable output": "a resume of a trainer that cannot resume never replaces the "
                                                      "verified durable output without keeping it",
    "sweep keeps runs' files apart": "a sweep never gives a run another run's files",
    "provider 200 that never stops is NOT CONFIRMED": "a provider stand-in that says 200 and never stops: NOT CONFIRMED",
    "wave-3 review findings stay fixed": "every finding of the 2026-12-03 node and laptop red teams and design review "
                                         "stays fixed",
    "provider faults: CONFIRMED only when stopped": "provider_fault_matrix: a provider API that rate-limits, hangs, "
                                                    "lags, flaps, lies or answers for another instance: CONFIRMED "
                                                    "only when it really stopped, else NOT CONFIRMED, told, retried",
    # wave 4: the reaper, a backstop off the box
    "reaper stops a hung box": "a hung box (every process stopped) is stopped from outside by the reaper",
    "reaper stops at the budget when the dead-man is dead": "the dead-man killed with a budget: reaped at the deadline",
    "reaper waits out an unreachable box with a fresh lease": "sshd down with a fresh lease: no stop before the "
                                                              "second TTL, a notification sent",
    "reaper stops a finished, gate-passed box once": "a terminal, gate-passed run: stopped after the grace; two "
                                                     "reapers at once stop once",
    # wave 4: money (issue 37)
    "budget holds across re-arms and reboots": "a budget holds across re-arms and reboots (at most 1.05x)",
    "billing never OK while it cannot see or match": "`billing` never says OK when anything it cannot see or match "
                                                     "may bill",
}

# Wave-3 drills whose tests other changes are adding (2026-12): reported, not failed.
PENDING = set()


def drill_names(decorator):
    """The NAME of a `pytest.mark.drill(NAME)` expression, else None."""
    if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
            and decorator.func.attr == "drill" and isinstance(decorator.func.value, ast.Attribute)
            and decorator.func.value.attr == "mark"):
        args = decorator.args
        return args[0].value if args and isinstance(args[0], ast.Constant) else ""
    return None


def marks_in(source):
    """(module-wide drill names, {test function: [drill names]}) of one test module's source."""
    tree = ast.parse(source)
    module, tests = [], {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            module += [n for n in map(drill_names, values) if n is not None]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            names = [n for n in map(drill_names, node.decorator_list) if n is not None]
            if names:
                tests[node.name] = names
    return module, tests


def drill_map(folder=TESTS):
    """drill name -> ['file::test' or 'file (module)', ...] over every test module in FOLDER."""
    found = {}
    for path in sorted(folder.glob("test_*.py")):
        module, tests = marks_in(path.read_text())
        for name in module:
            found.setdefault(name, []).append("%s (every test)" % path.name)
        for test, names in tests.items():
            for name in names:
                found.setdefault(name, []).append("%s::%s" % (path.name, test))
    return found


def test_every_guide_drill_has_a_marked_test():
    found = drill_map()
    unknown = sorted(set(found) - set(DRILLS))
    assert not unknown, "drill markers with names not in DRILLS (a typo hides a drill): %s" % unknown
    uncovered = sorted(name for name in DRILLS if name not in PENDING and not found.get(name))
    assert not uncovered, "GUIDE §9 drills without a marked test: %s" % uncovered
    for name in sorted(PENDING):
        have = found.get(name, [])
        print("PENDING drill %r: %s" % (name, "%d marked test(s), move it out of PENDING" % len(have)
                                          if have else "no marked test yet"))


def test_the_map_reader_sees_function_and_module_markers(tmp_path):
    (tmp_path / "test_a.py").write_text(
        "import pytest\n"
        "pytestmark = [pytest.mark.slow, pytest.mark.drill('interrupted pull resumes')]\n"
        "@pytest.mark.parametrize('x', [1])\n"
        "@pytest.mark.drill('empty roster fails')\n"
        "def test_one(x):\n    pass\n"
        "def test_two():\n    pass\n")
    (tmp_path / "test_b.py").write_text("import pytest\n@pytest.mark.drill('no such drill')\ndef test_c():\n    pass\n")
    found = drill_map(tmp_path)
    assert found == {"interrupted pull resumes": ["test_a.py (every test)"],
                     "empty roster fails": ["test_a.py::test_one"], "no such drill": ["test_b.py::test_c"]}
    assert set(found) - set(DRILLS) == {"no such drill"}
