"""The run record owns the run (issue 38; ../shared/reports/design-review-2026-12-05.md D1-D4).

D1: runrec is the only status.json writer, and the final sweep never marks a starting launch failed.
D2: one activity rule (job, supervisor, launcher, resuming; pid + start time + boot id), as a table of facts.
D3: one vocabulary of states: what is stored, what is reported; run_status takes every stored state.
D4: one run-id rule, shared by the code and the schemas; the layout derived once, by runrec.layout.
"""
import ast
import json
import inspect
import re
import subprocess
import sys

import pytest

from conftest import NODE, REPO, SCRIPTS

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402

SWEEP = str(NODE / "final_sweep.py")
RUN_STATUS = str(NODE / "run_status.py")


def write_status(run_dir, **doc):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "status.json").write_text(json.dumps(doc))
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name, "run_dir": str(run_dir)}))


# ---------------------------------------------------------------- D1: one writer

WRITERS = {"atomic_write_json", "atomic_write", "update_json", "write_json_best_effort", "write_text", "write_bytes",
           "open", "save_status"}
# The demo stages a finished run by hand for its dead-man drill (a fixture, not a run of the toolkit's own).
NOT_A_WRITER = {"scripts/demo_lifecycle.py"}


def status_writers(root):
    """[(file, line, call)] of every call outside runrec.py whose target names status.json (a literal, a STATUS
    constant, or runrec.path(run_dir) whose default is status.json) and that writes."""
    found = []
    for path in sorted(list((root / "scripts").glob("*.py")) + list((root / "scripts" / "node").glob("*.py"))):
        rel = str(path.relative_to(root))
        if path.name == "runrec.py" or rel in NOT_A_WRITER:
            continue
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in WRITERS:
                continue
            if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute):
                target = ast.get_source_segment(src, func.value) or ""
            else:
                target = ast.get_source_segment(src, node.args[0]) if node.args else ""
            if not re.search(r"status\.json|\bSTATUS\b|runrec\.path\([^,()]*\)$", target or ""):
                continue
            if name == "open":
                mode = ast.get_source_segment(src, node.args[1]) if len(node.args) > 1 else ""
                if not re.search(r"[wax+]", mode or ""):
                    continue
            found.append((rel, node.lineno, name))
    return found


def test_finding_review_D1_no_module_but_runrec_writes_status_json(tmp_path):
    assert status_writers(REPO) == []
    # the check can fail: a hand-written status.json in a copy of a node module is caught
    copy = tmp_path / "repo"
    (copy / "scripts" / "node").mkdir(parents=True)
    (copy / "scripts" / "node" / "final_sweep.py").write_text(
        'import os\ncore.update_json(os.path.join(run_dir, "status.json"), state="failed")\n'
        'with open(p("status.json"), "w") as fh:\n    pass\n')
    assert [w[2] for w in status_writers(copy)] == ["update_json", "open"]


def test_finding_review_D1_the_sweep_never_marks_a_starting_launch_failed(tmp_path):
    """A launch whose run_one.sh is alive and whose supervisor has not started yet is RUNNING to the sweep, not
    dead: its status.json stays `starting` (the sweep used to write `failed` by hand, with no lock)."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run_dir = tmp_path / "runs" / "starting"
        write_status(run_dir, run_id="starting", state="starting", attempt=1, launcher_pid=launcher.pid,
                     launcher_identity=core.process_identity(launcher.pid), supervisor_pid=None, job_pid=None)
        res = subprocess.run([sys.executable, SWEEP, "--runs-dir", str(tmp_path / "runs"), "--json"],
                             capture_output=True, text=True, timeout=120)
        runs = json.loads(res.stdout)["runs"]
        assert res.returncode == 1 and runs[0]["verdict"] == "RUNNING", res.stdout + res.stderr
        assert json.loads((run_dir / "status.json").read_text())["state"] == "starting"
    finally:
        launcher.kill()
        launcher.wait()


def test_finding_review_D1_a_run_that_died_with_the_box_is_marked_failed_through_the_record(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = tmp_path / "runs" / "died"
    write_status(run_dir, run_id="died", state="running", attempt=1, supervisor_pid=dead.pid,
                 supervisor_identity={"pid": dead.pid, "start_ticks": 1, "boot_id": core.boot_id()})
    subprocess.run([sys.executable, SWEEP, "--runs-dir", str(tmp_path / "runs")], capture_output=True, timeout=120)
    doc = json.loads((run_dir / "status.json").read_text())
    assert doc["state"] == "failed" and "found dead by final_sweep.py" in doc["error"], doc
    assert doc["schema_version"] == runrec.SCHEMA_VERSION   # written by runrec, under its lock
    assert (run_dir / runrec.STATUS_LOCK).exists()


# ---------------------------------------------------------------- D2: one activity rule

BOOT = "boot-1"


class Table(core.Procs):
    """A process table as facts: {pid: (state letter, start ticks)} on boot BOOT."""

    def __init__(self, rows, boot=BOOT):
        self.rows, self.boot = rows, boot

    def exists(self, pid):
        return pid in self.rows

    def stat(self, pid):
        if pid not in self.rows:
            return None
        letter, ticks = self.rows[pid]
        return [letter] + ["0"] * 18 + [str(ticks)]

    def boot_id(self):
        return self.boot

    def boot_time(self):
        return None


def ident(pid, ticks=100, boot=BOOT):
    return {"pid": pid, "start_ticks": ticks, "boot_id": boot}


ACTIVITY = [
    # (case, status doc, table, same_host, expected job, supervisor, launcher, any)
    ("nothing recorded", {}, {}, True, None, None, None, False),
    ("a starting launch: launcher alive", {"launcher_pid": 10, "launcher_identity": ident(10)},
     {10: ("S", 100)}, True, None, None, True, True),
    ("job alive", {"job_pid": 11, "job_identity": ident(11)}, {11: ("R", 100)}, True, True, None, None, True),
    ("supervisor alive, job gone", {"job_pid": 11, "job_identity": ident(11), "supervisor_pid": 12,
                                    "supervisor_identity": ident(12)}, {12: ("S", 100)}, True, False, True, None,
     True),
    ("pid reused (other start time)", {"job_pid": 11, "job_identity": ident(11)}, {11: ("R", 999)}, True, False,
     None, None, False),
    ("another boot", {"job_pid": 11, "job_identity": ident(11, boot="boot-0")}, {11: ("R", 100)}, True, False,
     None, None, False),
    ("a zombie", {"job_pid": 11, "job_identity": ident(11)}, {11: ("Z", 100)}, True, False, None, None, False),
    ("another host: nothing checked", {"job_pid": 11, "job_identity": ident(11)}, {11: ("R", 100)}, False, None,
     None, None, None),
]


@pytest.mark.parametrize("case,doc,rows,same_host,job,sup,launcher,alive", ACTIVITY, ids=[c[0] for c in ACTIVITY])
def test_finding_review_D2_one_activity_rule_as_a_table(case, doc, rows, same_host, job, sup, launcher, alive):
    act = runrec.activity(doc, procs=Table(rows), same_host=same_host)
    assert (act["job"], act["supervisor"], act["launcher"], act["any"]) == (job, sup, launcher, alive), case
    assert act["resuming"] is False


def test_finding_review_D2_the_gate_reads_the_one_rule():
    """The gate's run state is runrec.run_activity, streamed to the node with the core (review D7 removed the
    core's copy of the rule): a starting launch whose launcher is alive is live to the gate."""
    assert not hasattr(core, "attempt_alive") and not hasattr(core, "run_activity")
    src = inspect.getsource(runrec.run_activity)
    assert "activity(status)" in src


def test_finding_review_D2_callers_use_the_one_rule():
    """Every node module that asks "is the run alive" goes through runrec.activity (through liveness/is_active),
    none composes record_alive over the roles by itself."""
    composed = []
    for path in sorted(NODE.glob("*.py")):
        if path.name in ("runrec.py", "rgt_core.py"):
            continue
        src = path.read_text()
        for match in re.finditer(r"record_alive\([^)]*_identity", src):
            line = src.count("\n", 0, match.start()) + 1
            if re.search(r'\(\s*(?:status|doc)\.get\(["\'](?:job|supervisor|launcher)_identity', match.group(0)) or \
                    re.search(r'\+ ["\']_identity', match.group(0)):
                composed.append("%s:%d" % (path.name, line))
    allowed = {"deadman.py", "launcher.py", "sync.py"}   # one role each, for a signal or a wait (review D2's table)
    assert [c for c in composed if c.split(":")[0] not in allowed] == [], composed


# ---------------------------------------------------------------- D3: one vocabulary

def test_finding_review_D3_run_status_takes_every_state_the_record_and_the_schema_allow(tmp_path):
    schema = json.loads((NODE / "status.schema.json").read_text())
    assert tuple(schema["properties"]["state"]["enum"]) == runrec.STORED
    for state in runrec.STORED:
        run_dir = tmp_path / state
        write_status(run_dir, run_id=state, state=state, exit_code=0 if state not in runrec.ACTIVE else None)
        res = subprocess.run([sys.executable, RUN_STATUS, str(run_dir), "--json", "--no-gpu"], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode != 2, (state, res.stderr)
        assert json.loads(res.stdout)["status"] in runrec.REPORTED, state
    assert runrec.transition_problem("running", "stalled"), "a derived word is never stored"


def test_finding_review_D3_the_state_words_are_defined_once():
    import run_status
    assert set(run_status.EXIT) == set(runrec.REPORTED)
    assert set(runrec.ACTIVE) | set(runrec.TERMINAL) == set(runrec.STORED)
    assert set(runrec.ACTIVE).isdisjoint(runrec.TERMINAL)
    assert not hasattr(core, "RUN_STATES") and not hasattr(core, "ACTIVE_RUN_STATES")
    # no module names its own copy of a state set: a module-level constant spelling out three state words
    copies = []
    for path in sorted(list(SCRIPTS.glob("*.py")) + list(NODE.glob("*.py"))):
        if path.name == "runrec.py":
            continue
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
                words = {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                if len(words & set(runrec.REPORTED)) >= 3:
                    copies.append("%s:%d" % (path.name, node.lineno))
    assert copies == [], copies
    # the shell's copy (reap_vram_zombies.sh cannot import): the same active states
    shell = re.search(r'"state" \*: \*"\(([a-z_|]+)\)"', (NODE / "reap_vram_zombies.sh").read_text())
    assert shell and tuple(shell.group(1).split("|")) == runrec.ACTIVE


# ---------------------------------------------------------------- D4: one run-id rule, one layout

def test_finding_review_D4_one_run_id_rule_in_code_and_schemas(tmp_path):
    import evidence
    import launcher
    for schema in (NODE / "manifest.schema.json", SCRIPTS / "job_request.schema.json"):
        text = json.loads(schema.read_text())
        assert text["properties"]["run_id"]["pattern"] == core.RUN_ID_PATTERN, schema.name
    assert evidence.RUN_ID_RE is core.RUN_ID_RE and launcher.RUN_ID_RX is core.RUN_ID_RE
    run_one = (NODE / "run_one.sh").read_text()
    assert '=~ %s ]]' % core.RUN_ID_PATTERN in run_one and "(max %d)" % core.RUN_ID_MAX in run_one
    longest = "r" * core.RUN_ID_MAX
    assert core.RUN_ID_RE.match(longest) and not core.RUN_ID_RE.match(longest + "r")
    # an explicit run id the rule refuses is bad input, never swapped for a generated one
    res = subprocess.run([sys.executable, str(NODE / "launcher.py"), "prepare", "--run-id", "bad id!",
                          "--durable-dir", str(tmp_path / "durable"), "--disk-floor-gb", "0", "--launcher-pid", "1"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--run-id" in res.stderr and not (tmp_path / "durable").exists(), res.stderr


def test_finding_review_D4_the_layout_is_derived_once_on_the_node(tmp_path):
    lay = runrec.layout(str(tmp_path / "d"), "r1")
    assert lay == {"runs_dir": str(tmp_path / "d" / "runs"), "run_dir": str(tmp_path / "d" / "runs" / "r1"),
                   "results_dir": str(tmp_path / "d" / "results" / "r1")}
    assert runrec.layout(None, "r1", "/x/r1")["results_dir"] == "/x/r1/results"
    # the node modules ask runrec where the results are: no module joins "results" to a run dir by itself
    joins = [p.name for p in NODE.glob("*.py") if p.name != "runrec.py"
             and re.search(r'(?:run_path|os\.path\.join)\(run_dir, "results"\)', p.read_text())]
    assert joins == [], joins
