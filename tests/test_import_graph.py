"""The node toolkit's import graph (review D7): no circle among scripts/node/*.py, and no node module importing
a laptop one (the node gets scripts/node only). Imports are read with ast at every depth, module level and
inside functions alike: a lazy import is still an edge. scripts/*.py (the laptop's) has a test of its own."""
import ast

from conftest import NODE, SCRIPTS, imported_modules as imports


def node_graph(folder=NODE):
    modules = {p.stem: p for p in folder.glob("*.py")}
    return {name: sorted(imports(path) & set(modules) - {name}) for name, path in modules.items()}


def cycles(graph):
    """Every import circle in GRAPH (name -> [names]), each as a list starting and ending at one module."""
    found, state, stack = [], {}, []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for nxt in graph.get(name, ()):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return found


def test_finding_review_D7_no_import_circle_among_node_modules():
    """rgt_core imported runrec inside active_runs while runrec imports rgt_core: one circle, lazily hidden."""
    assert cycles(node_graph()) == []


def test_finding_review_D7_no_node_module_imports_upward():
    laptop = {p.stem for p in SCRIPTS.glob("*.py")} - {p.stem for p in NODE.glob("*.py")}
    upward = {name: sorted(imports(path) & laptop) for name, path in ((p.stem, p) for p in NODE.glob("*.py"))}
    assert {k: v for k, v in upward.items() if v} == {}


def test_the_core_imports_no_toolkit_module():
    """rgt_core is the floor: it travels alone (streamed_program), so it imports no other toolkit module."""
    assert node_graph()["rgt_core"] == []


def test_the_cycle_finder_finds_a_lazy_circle(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import c\n")
    (tmp_path / "c.py").write_text("def g():\n    from a import x\n")
    (tmp_path / "d.py").write_text("import os\nimport a\n")
    assert cycles(node_graph(tmp_path)) == [["a", "b", "c", "a"]]
    (tmp_path / "c.py").write_text("import os\n")
    assert cycles(node_graph(tmp_path)) == []


# Calls that reach past a rule's arguments: files, processes, the clock, the interpreter.
IMPURE_CALLS = {"open", "__import__", "exec", "eval", "compile", "input", "breakpoint", "print", "globals"}


def impurities(path):
    """What in PATH reaches for IO: every import (at any depth) and every call of an IMPURE_CALLS builtin."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append("line %d: import %s" % (node.lineno, ", ".join(a.name for a in node.names)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_CALLS:
            found.append("line %d: %s()" % (node.lineno, node.func.id))
    return found


def test_finding_review_D8_the_run_rules_are_pure():
    """deadman.py's evaluate mixed reading the run (files, pids, sessions, the clock) with deciding on it. The rules
    live in deadman_rules.py, which imports nothing at all (no os, time, runrec, deadman): it decides from the
    facts it is given, so it is table-tested without a process (test_deadman_rules.py). The loop that reads and
    fires (watcher.py) and the dead-man import it; it imports neither of them."""
    assert impurities(NODE / "deadman_rules.py") == []
    graph = node_graph()
    assert graph["deadman_rules"] == [] and "deadman_rules" in graph["deadman"]
    assert "deadman" not in graph["watcher"] and "deadman" not in graph["idle_watch"]


def test_the_purity_check_sees_a_lazy_import_and_a_file(tmp_path):
    (tmp_path / "rules.py").write_text("def f(x):\n    import os\n    return open(x).read()\n")
    assert impurities(tmp_path / "rules.py") == ["line 2: import os", "line 3: open()"]
