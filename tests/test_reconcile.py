"""scripts/reconcile.py: bound numbers in Markdown, LaTeX and CSV against JSON, JSONL and CSV metrics."""
import json
import subprocess
import sys

import pytest

from conftest import NODE, SCRIPTS, TOOLS


def reconcile(*args):
    res = subprocess.run([sys.executable, str(SCRIPTS / "reconcile.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=30)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.fixture
def evidence(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "final.json").write_text(json.dumps({"eval": {"top1": 0.7612, "loss": 0.9431}, "params": 25557032}))
    (runs / "log.jsonl").write_text("\n".join(json.dumps({"step": s, "val_acc": a})
                                              for s, a in [(1, 0.50), (2, 0.81), (3, 0.79)]) + "\n")
    (runs / "flat.json").write_text(json.dumps({"top1": 0.7612, "loss": 0.9431}))
    (runs / "seeds.csv").write_text("seed,top1\n0,76.0\n1,76.4\n2,76.2\n")
    return tmp_path


def test_matching_numbers_pass_in_all_three_formats(evidence):
    (evidence / "paper.md").write_text(
        "# Results\n\nTop-1 is 76.1% <!-- metric: runs/final.json#eval.top1*100 -->, loss 0.943 "
        "<!-- metric: runs/final.json#eval.loss -->.\nBest val 0.81 <!-- metric: runs/log.jsonl#val_acc@max -->\n"
        "Mean over seeds 76.2 <!-- metric: runs/seeds.csv#top1@mean -->; 25,557,032 params "
        "<!-- metric: runs/final.json#params -->\n")
    (evidence / "table.tex").write_text("ResNet & 76.12 \\\\ % metric: runs/final.json#eval.top1*100\n")
    (evidence / "summary.csv").write_text("model,top1,loss,source\nr50,0.7612,0.94,runs/flat.json\n")
    res = reconcile(evidence / "paper.md", evidence / "table.tex", evidence / "summary.csv", "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 0, res.stdout
    assert out["checked"] == 5 + 1 + 2 and out["drift"] == 0 and out["broken"] == 0


def test_drift_is_reported_with_file_and_line(evidence):
    doc = evidence / "paper.md"
    doc.write_text("intro\n\nTop-1 is 76.4% <!-- metric: runs/final.json#eval.top1*100 -->\n")
    res = reconcile(doc)
    assert res.returncode == 1
    assert f"DRIFT {doc}:3: claims 76.4" in res.stdout and "76.12" in res.stdout


def test_precision_sets_the_tolerance(evidence):
    doc = evidence / "p.md"
    doc.write_text("76 <!-- metric: runs/final.json#eval.top1*100 -->\n")  # 76.12 rounds to 76
    assert reconcile(doc).returncode == 0
    doc.write_text("76.2 <!-- metric: runs/final.json#eval.top1*100 -->\n")  # but not to 76.2
    assert reconcile(doc).returncode == 1
    assert reconcile(doc, "--abs-tol", "0.1").returncode == 0


def test_csv_drift_names_the_row(evidence):
    doc = evidence / "summary.csv"
    doc.write_text("model,top1,source\nr50,0.7612,runs/flat.json\nr50b,0.80,runs/flat.json\n")
    res = reconcile(doc, "--json")
    bad = [r for r in json.loads(res.stdout)["results"] if r["status"] != "OK"]
    assert res.returncode == 1 and [r["where"] for r in bad] == [f"{doc}:3"]


@pytest.mark.parametrize("binding,reason", [
    ("runs/missing.json#eval.top1", "source file not found"),
    ("runs/final.json#eval.top5", "not found"),
    ("runs/final.json", "no #key"),
    ("runs/log.jsonl#val_acc@median", "unknown reducer"),
])
def test_broken_bindings_fail_with_a_reason(evidence, binding, reason):
    doc = evidence / "p.md"
    doc.write_text(f"value 1.0 <!-- metric: {binding} -->\n")
    res = reconcile(doc)
    assert res.returncode == 1 and "BROKEN" in res.stdout and reason in res.stdout


def test_no_bindings_is_not_success(evidence):
    doc = evidence / "plain.md"
    doc.write_text("76.1% with no binding\n")
    assert reconcile(doc).returncode == 4


def test_missing_document_is_usage_error(tmp_path):
    res = reconcile(tmp_path / "nope.md")
    assert res.returncode == 2 and res.stderr.count("\n") == 1


# ---------------------------------------------------------------- red-team findings (reports/redteam-2026-12.md)
from results_fixture import run  # noqa: E402


# ---------------------------------------------------------------- 19: reconcile tolerance with an exponent

@pytest.mark.drill("red-team findings stay fixed")
def test_finding_19_scientific_notation_gets_its_own_precision(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"lr": 0.3, "loss": 2.5e-05, "wd": 0.00030004, "steps": 1540}))
    (tmp_path / "drift.md").write_text("lr 3e-4 <!-- metric: m.json#lr -->\n"
                                       "loss 9.9e-5 <!-- metric: m.json#loss -->\n")
    drift = run(SCRIPTS / "reconcile.py", tmp_path / "drift.md")
    assert drift.returncode == 1, drift.stdout
    assert drift.stdout.count("DRIFT") == 2, drift.stdout
    (tmp_path / "ok.md").write_text("wd 3.0E-04 <!-- metric: m.json#wd -->\n"
                                    "loss 2.5e-5 <!-- metric: m.json#loss -->\n"
                                    "steps 1.5e3 <!-- metric: m.json#steps -->\n")
    ok = run(SCRIPTS / "reconcile.py", tmp_path / "ok.md", "--json")
    assert ok.returncode == 0, ok.stdout
    tolerances = sorted(r["tolerance"] for r in json.loads(ok.stdout)["results"])
    assert tolerances[0] == pytest.approx(0.5e-6, rel=1e-3) and tolerances[-1] == pytest.approx(50, rel=1e-3)
