"""The gate as the field test met it (issue 35): N10, its verdict recorded from its own result, and N3 over
`rgt.py`, a kept generation brought home with `pull --generation N` and kept with `gate --keep-generation N`.

Real processes throughout: rgt.py in a real shell pipeline, the test sshd, the node tools.
"""
import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import SCRIPTS
from results_fixture import build, make_results, pull

RGT = SCRIPTS / "rgt.py"


def gate_rows(ledger):
    return [json.loads(line) for line in ledger.read_text().splitlines() if json.loads(line).get("event") == "gate"]


@pytest.mark.parametrize("reader", ["head -1", "head -c 0"])
def test_finding_field_N10_the_ledger_gets_the_gates_own_verdict_when_stdout_closes_early(tmp_path, sshd_server,
                                                                                         profile_env, reader):
    """`rgt.py gate ... | head -1` (and a reader that reads nothing): the gate PASSes, and the ledger says PASS.
    PYTHONUNBUFFERED=1, as agent harnesses set it: each line is its own write, so a closed pipe hits the gate
    mid-output."""
    durable = tmp_path / "durable"
    results = durable / "results" / "n10"
    make_results(results)
    assert build(results, run_id="n10").returncode == 0
    dest = tmp_path / "pulled"
    assert pull(str(results), str(dest)).returncode == 0
    ledger = tmp_path / "ledger.jsonl"
    argv = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--ledger", str(ledger), "gate",
            "gpu-box", "n10", "--durable-dir", str(durable), "--dest", str(dest), "--profile", "examplecloud",
            "--no-inspect"]
    shell = "%s | %s; echo \"rc=${PIPESTATUS[0]}\" >&2" % (" ".join(shlex.quote(a) for a in argv), reader)
    env = dict(profile_env, PYTHONUNBUFFERED="1")
    res = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300, env=env)
    assert "Traceback" not in res.stderr and "rc=0" in res.stderr, res.stderr
    if reader == "head -1":
        assert res.stdout.startswith("PASS teardown gate for run n10") and res.stdout.count("\n") == 1, res.stdout
    else:
        assert res.stdout == ""
    rows = gate_rows(ledger)
    assert [r["verdict"] for r in rows] == ["PASS"], rows


def test_a_gate_refusal_is_recorded_as_a_refusal(tmp_path, sshd_server, profile_env):
    """The other way round: nothing pulled, the gate refuses; the ledger says REFUSED and rgt.py exits 3."""
    durable = tmp_path / "durable"
    results = durable / "results" / "n10r"
    make_results(results)
    assert build(results, run_id="n10r").returncode == 0
    (tmp_path / "pulled" / "n10r").mkdir(parents=True)
    ledger = tmp_path / "ledger.jsonl"
    res = subprocess.run([sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--ledger", str(ledger),
                          "gate", "gpu-box", "n10r", "--durable-dir", str(durable), "--dest", str(tmp_path / "pulled"),
                          "--profile", "examplecloud", "--no-inspect"], capture_output=True, text=True, timeout=300,
                         env=profile_env)
    assert res.returncode == 3 and res.stdout.startswith("REFUSED"), res.stdout + res.stderr
    assert [r["verdict"] for r in gate_rows(ledger)] == ["REFUSED"]
