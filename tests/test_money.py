"""The money view fails closed (issue 37): `rgt.py billing` against the provider stand-ins, one ledger module.

Findings: redteam-2026-12-05-laptop.md L2-L5, L7, L8; design-review-2026-12-05.md D5; field test N11, N15.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import NODE, SCRIPTS, TOOLS, imported_modules
sys.path.insert(0, str(TOOLS))
from provider_standins import LIST_FAULTS, Instance, StandIn, Volume  # noqa: E402

sys.path.insert(0, str(NODE))
sys.path.insert(0, str(SCRIPTS))
import billing  # noqa: E402
import ledger  # noqa: E402

pytestmark = pytest.mark.drill("billing never OK while it cannot see or match")   # every test here

KEY = "canary-key-0e5d1c7b9a2f4e6d8c3b"
URL_VARS = {"runpod": "RGT_RUNPOD_API_URL", "vastai": "RGT_VASTAI_API_URL", "lambda": "RGT_LAMBDA_API_URL",
            "paperspace": "RGT_PAPERSPACE_API_URL"}
KEY_VARS = {"runpod": "RUNPOD_API_KEY", "vastai": "VAST_API_KEY", "lambda": "LAMBDA_API_KEY",
            "paperspace": "PAPERSPACE_API_KEY"}


def env_for(*apis):
    env = {}
    for api in apis:
        env[URL_VARS[api.provider]], env[KEY_VARS[api.provider]] = api.url, KEY
    return env


def rows(*events):
    return [dict(e, time=e.get("time", "2026-12-05T00:00:00Z")) for e in events]


def labels(doc):
    return {(i["provider"], i["id"]): i["label"] for i in doc["items"]}


def billing_cli(tmp_path, env, events=()):
    """rgt.py billing as a user runs it (a clean environment: only these providers' keys and URLs)."""
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in rows(*events)))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST", "LAMBDA", "PAPERSPACE",
                                                                      "RGT_", "XDG_"))}
    base.update(env, HOME=str(tmp_path))
    return subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(path), "billing", "--timeout",
                           "1"], env=base, capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------- L2: a malformed 2xx answer is no empty account

@pytest.mark.parametrize("provider", ["runpod", "vastai", "lambda", "paperspace"])
@pytest.mark.parametrize("fault", LIST_FAULTS)
def test_finding_laptop_L2_a_malformed_list_answer_is_UNKNOWN_never_nothing_listed(tmp_path, provider, fault):
    api = StandIn(provider, KEY, [Instance("77", rate=9.6)], [Volume("5")])
    api.list_fault = fault
    with api:
        doc = billing.report_billing([], environ=env_for(api), home=str(tmp_path), timeout=1)
    (seen,) = [p for p in doc["providers"] if p["provider"] == provider]
    assert seen["error"] and doc["ok"] is False and doc["exit"] == billing.EXIT_INCOMPLETE, (fault, seen)
    human = billing.human_report(doc)
    assert "UNKNOWN provider %s: " % provider in human and "nothing listed" not in human, human
    assert KEY not in json.dumps(doc)


def test_finding_laptop_L2_rgt_billing_exits_4_on_an_error_object(tmp_path):
    api = StandIn("vastai", KEY, [Instance("1001", rate=2.1)])
    api.list_fault = "error_object"
    with api:
        res = billing_cli(tmp_path, env_for(api))
    assert res.returncode == 4, res.stdout + res.stderr
    assert "UNKNOWN provider vastai: vastai instances: the answer is an error: Invalid user key" in res.stdout
    assert "nothing listed" not in res.stdout and "Traceback" not in res.stderr


# ---------------------------------------------------------------- L3: box identity, never the gateway host alone

def test_finding_laptop_L3_a_shared_gateway_host_never_covers_another_port(tmp_path):
    api = StandIn("vastai", KEY, [Instance("1001", rate=2.1, ssh_port=40022),
                                  Instance("1002", name="forgotten-8xA100", rate=9.6, ssh_port=40055)])
    with api:
        res = billing_cli(tmp_path, env_for(api), [
            {"event": "launch", "host": "root@ssh.example.invalid", "box": "root@ssh.example.invalid:40022",
             "run_id": "r1", "state": "launched"}])
    line = [ln for ln in res.stdout.splitlines() if "1002" in ln]
    assert res.returncode == 1 and line and line[0].startswith("UNKNOWN TO THE LEDGER"), res.stdout
    assert "$9.60/h" in line[0] and any(ln.startswith("OK") and " 1001 " in ln for ln in res.stdout.splitlines())


# ---------------------------------------------------------------- L4: storage by attachment

def test_finding_laptop_L4_an_unattached_volume_is_listed_with_what_it_bills_whatever_else_runs(tmp_path):
    api = StandIn("runpod", KEY, [Instance("podA", rate=1.2)],
                  [Volume("vol-used", attached_to="podA"), Volume("vol-orphan-1", "old-experiment-2025", 2000),
                   Volume("vol-orphan-2", "forgotten", 500, "US-TX-3")])
    with api:
        doc = billing.report_billing(rows({"event": "launch", "host": "gpu", "box": "root@192.0.2.10:22022",
                                           "run_id": "r1", "state": "launched", "instance": "runpod:podA"}),
                                     environ=env_for(api), home=str(tmp_path), timeout=5)
    assert labels(doc) == {("runpod", "podA"): "OK", ("runpod", "vol-used"): "OK",
                           ("runpod", "vol-orphan-1"): "STORAGE BILLING", ("runpod", "vol-orphan-2"): "STORAGE BILLING"}
    assert doc["exit"] == 1 and not doc["ok"]
    orphan = [ln for ln in billing.human_report(doc).splitlines() if "vol-orphan-1" in ln][0]
    assert "bills per GB while it exists" in orphan


# ---------------------------------------------------------------- L5: a pull never revives a finished run

@pytest.mark.parametrize("later", ["pulled", "pull_failed"])
def test_finding_laptop_L5_a_pull_after_the_run_ended_keeps_RUNNING_NO_ACTIVE_RUN(tmp_path, later):
    api = StandIn("vastai", KEY, [Instance("777", rate=1.5)])
    with api:
        res = billing_cli(tmp_path, env_for(api), [
            {"event": "launch", "host": "gpu", "box": "root@127.0.0.1:2222", "run_id": "mc1", "state": "launched",
             "instance": "vastai:777"},
            {"event": "status", "host": "gpu", "box": "root@127.0.0.1:2222", "run_id": "mc1",
             "state": "deadman_fired"},
            {"event": "pull", "host": "gpu", "box": "root@127.0.0.1:2222", "run_id": "mc1", "state": later}])
    assert res.returncode == 1 and "\nRUNNING, NO ACTIVE RUN   vastai     instance        777 " in res.stdout, \
        res.stdout
    assert "OK everything billing" not in res.stdout


# ---------------------------------------------------------------- L7: a key file that cannot be used

def test_finding_laptop_L7_a_world_readable_key_file_is_an_error_not_no_credentials(tmp_path):
    api = StandIn("lambda", KEY, [Instance("big", rate=23.92)])
    keys = tmp_path / ".lambda_cloud" / "lambda_keys"
    keys.parent.mkdir()
    keys.write_text("api_key = %s\n" % KEY)
    keys.chmod(0o644)
    with api:
        res = billing_cli(tmp_path, {"RGT_LAMBDA_API_URL": api.url})
        keys.chmod(0o600)
        fixed = billing_cli(tmp_path, {"RGT_LAMBDA_API_URL": api.url})
    assert res.returncode == 4, res.stdout
    assert "UNKNOWN provider lambda: lambda key file %s is readable by others (mode 644); chmod 600 it" % keys \
        in res.stdout and "nothing listed" not in res.stdout
    assert fixed.returncode == 1 and "$23.92/h" in fixed.stdout and KEY not in res.stdout + fixed.stdout


# ---------------------------------------------------------------- L8: ledger runs the provider cannot show

def test_finding_laptop_L8_a_ledger_run_the_provider_does_not_list_is_named(tmp_path):
    api = StandIn("vastai", KEY, [])
    launch = {"event": "launch", "host": "gpu", "box": "root@ssh4.vast.ai:40022", "run_id": "v1",
              "state": "launched", "instance": "vastai:999"}
    with api:
        res = billing_cli(tmp_path, env_for(api), [launch])
    assert res.returncode == 1, res.stdout
    assert "NOT LISTED BY vastai: ledger run v1 on root@ssh4.vast.ai:40022 (vastai:999) is not listed" in res.stdout
    assert "may still bill" in res.stdout and "nothing listed" not in res.stdout


def test_finding_laptop_L8_a_provider_the_ledger_uses_without_credentials_is_CANNOT_SEE(tmp_path):
    res = billing_cli(tmp_path, {}, [{"event": "launch", "host": "gpu", "box": "root@ssh4.vast.ai:40022",
                                      "run_id": "r1", "state": "launched", "instance": "vastai:1001"}])
    assert res.returncode == 4, res.stdout
    assert "CANNOT SEE vastai: the ledger has 1 live run(s) there (root@ssh4.vast.ai:40022 r1)" in res.stdout
    assert "nothing listed" not in res.stdout
    (tmp_path / "x").mkdir()
    assert billing_cli(tmp_path / "x", {}).returncode == 0   # no runs, no credentials: nothing to see


# ---------------------------------------------------------------- N15 and N11: what is shown

def test_finding_field_N15_a_stopped_pod_shows_what_it_bills_while_stopped(tmp_path):
    api = StandIn("runpod", KEY, [Instance("podc", state="stopped", rate=0.7)])
    with api:
        doc = billing.report_billing(rows({"event": "launch", "host": "gpu", "run_id": "r", "state": "launched",
                                           "instance": "runpod:podc"}),
                                     environ=env_for(api), home=str(tmp_path), timeout=5)
    (item,) = doc["items"]
    assert item["label"] == "STOPPED, STORAGE BILLING" and item["rate_per_hour"] is None
    assert item["running_rate_per_hour"] == 0.7
    (line,) = [ln for ln in billing.human_report(doc).splitlines() if "podc" in ln]
    assert "bills its 40 GB volume only" in line and "0.70" not in line, line


def test_finding_field_N11_money_keeps_the_precision_it_needs():
    _opts, _hours, note = billing.plan_budget(0.02, 36.0, [])
    assert "at most 0.02 " in note and "at most 0.00" not in note
    assert [ledger.money(v) for v in (0.02, 0.0035, 0.00042, 0, 3.0, 142.956)] == [
        "0.02", "0.0035", "0.00042", "0.00", "3.00", "142.96"]
    events = rows({"event": "launch", "host": "h", "run_id": "r", "state": "launched", "rate_per_hour": 36.0,
                   "max_cost": 0.02, "time": "2026-12-05T00:00:00Z"})
    cost = ledger.cost_so_far(events, "h", "r", now=ledger.core.parse_iso("2026-12-05T00:00:01Z"))
    assert "cost so far: 0.01 " in cost["line"] and "budget 0.02" in cost["line"], cost["line"]


# ---------------------------------------------------------------- D5: one ledger module, no import circle

def imports_of(path, names):
    """The modules among NAMES that PATH imports anywhere (top level or inside a function)."""
    return imported_modules(path) & names


def import_cycles(folders):
    """Every import circle among the .py modules of FOLDERS (one sys.path, as rgt.py sets it up). The laptop
    modules (scripts/*.py) may import the node's (scripts/node/); those are leaves here."""
    paths = {p.stem: p for folder in folders for p in sorted(folder.glob("*.py"))}
    graph = {name: imports_of(path, set(paths)) - {name} for name, path in paths.items()}
    cycles, state = [], {}

    def visit(name, trail):
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                cycles.append(trail[trail.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[name] = "done"
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_finding_review_D5_no_import_circle_among_the_scripts():
    assert import_cycles([SCRIPTS]) == []
    ledger_users = ("billing", "notify_cli", "reap", "rgt", "ledger")
    assert not [c for c in import_cycles([SCRIPTS]) if set(c) & set(ledger_users)]


def test_finding_review_D5_the_cycle_check_catches_a_circle(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    (tmp_path / "c.py").write_text("import os\n")
    assert import_cycles([tmp_path]) == [["a", "b", "a"]]


def test_finding_review_D5_the_ledger_is_folded_once():
    """Only ledger.py opens, parses and folds the ledger; billing, reap, notify_cli and rgt use it."""
    import reap
    import rgt
    for name in ("billing.py", "notify_cli.py", "reap.py", "rgt.py"):
        assert "ledger" in imports_of(SCRIPTS / name, {"ledger"}), name
        assert "rgt" not in imports_of(SCRIPTS / name, {"rgt"}) or name == "rgt.py", name
    for name in ("billing.py", "notify_cli.py", "reap.py", "rgt.py"):   # nobody else parses or folds it
        text = (SCRIPTS / name).read_text()
        assert "json.loads(line)" not in text and "def ledger_runs" not in text and "def ledger_events" not in text
    assert rgt.ledger_runs is ledger.fold and rgt.ledger_events is ledger.events and rgt.ledger_append is ledger.append
    assert billing.cost_so_far is ledger.cost_so_far
    events = rows({"event": "launch", "host": "gpu", "box": "u@ssh4.vast.ai:40022", "run_id": "r1",
                   "state": "launched", "instance": "vastai:1", "max_cost": 9.0, "rate_per_hour": 3.0},
                  {"event": "status", "host": "gpu", "box": "u@ssh4.vast.ai:40022", "run_id": "r1",
                   "state": "succeeded"},
                  {"event": "pull", "host": "gpu", "box": "u@ssh4.vast.ai:40022", "run_id": "r1", "state": "pulled"})
    runs, _ = ledger.fold(events)
    (rec,) = runs.values()
    assert rec["run_state"] == "succeeded" and not ledger.active(rec)
    box = reap.boxes_of(events)["u@ssh4.vast.ai:40022"]
    assert box["instance"] == ("vastai", "1") and box["runs"]["r1"]["state"] == "succeeded"
    assert (box["runs"]["r1"]["max_cost"], box["runs"]["r1"]["rate"]) == (9.0, 3.0)
