"""run_forensics.py plot: a real PNG of two runs (read back and checked), the resume, spike, NaN and best
marks it reports, and the one-line exit 4 on a machine without matplotlib."""
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import SCRIPTS, need_module

FORENSICS = str(SCRIPTS / "run_forensics.py")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def forensics(*args, env=None):
    res = subprocess.run([sys.executable, FORENSICS, *map(str, args)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.fixture
def two_runs(tmp_path):
    """runs/a: attempt 1 logged steps 0..59 and died; attempt 2 resumed from the step-40 checkpoint and logged
    40..99 again (a spike at step 70); its earlier attempt's status sits in previous/, as launcher.py leaves it.
    runs/b: one attempt, a CSV with a NaN at step 50."""
    a = tmp_path / "runs" / "a"
    (a / "previous" / "20261201T000000Z-101-x").mkdir(parents=True)
    (a / "previous" / "20261201T000000Z-101-x" / "status.json").write_text('{"state": "interrupted", "attempt": 1}')
    rows = [{"step": s, "loss": 2.0 / (1 + 0.1 * s)} for s in range(60)]
    rows += [{"step": s, "loss": 2.0 / (1 + 0.1 * s) + (6.0 if s == 70 else 0.01)} for s in range(40, 100)]
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = tmp_path / "runs" / "b"
    b.mkdir()
    (b / "metrics.csv").write_text("step,loss\n" + "".join(
        "%d,%s\n" % (s, "nan" if s == 50 else 1.5 / (1 + 0.05 * s)) for s in range(100)))
    return a, b


def png_size(data):
    """(width, height) from a PNG's IHDR chunk, which the format puts first."""
    assert data[:8] == PNG_SIGNATURE, data[:8]
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_draws_two_runs_with_resume_spike_nan_and_best(two_runs, tmp_path):
    need_module("matplotlib")
    import matplotlib.image
    a, b = two_runs
    out = tmp_path / "loss.png"
    res = forensics("plot", a, b, "--metric", "loss", "--out", out, "--size", "900x500", "--json")
    assert res.returncode == 0, res.stderr
    data = out.read_bytes()
    assert png_size(data) == (900, 500)
    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[:2] == (500, 900)
    flat = pixels.reshape(-1, pixels.shape[-1])
    assert (flat != flat[0]).any(axis=1).sum() > 0.01 * len(flat), "the image is (nearly) blank"
    doc = json.loads(res.stdout)
    runs = {r["name"]: r for r in doc["runs"]}
    assert doc["mode"] == "min" and doc["size"] == [900, 500]
    assert runs["a"]["attempts"] == 2 and runs["a"]["restarts"] == [40] and runs["a"]["replaced"] == 20
    assert runs["a"]["spikes"] == [70] and runs["a"]["best_step"] == 99 and runs["a"]["points"] == 100
    assert runs["b"]["attempts"] == 1 and runs["b"]["restarts"] == [] and runs["b"]["nonfinite_steps"] == [50]
    # the text form says the same, and a second picture of one run differs from the two-run picture
    one = tmp_path / "one.png"
    text = forensics("plot", a, "--metric", "loss", "--out", one, "--size", "900x500")
    assert text.returncode == 0 and "resumes at 40" in text.stdout and "2 attempt(s)" in text.stdout
    assert (matplotlib.image.imread(str(one)) != pixels).any()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], "the atomic write left a temp file"


def test_plot_marks_an_attempt_start_in_job_log(tmp_path):
    """A trainer that resumes at the checkpoint step logs no step twice; the supervisor's `starting:` line in
    job.log still places the resume."""
    need_module("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    lines = ["[rgt 10:00:00] starting: python train.py"] + ["iter %d: loss %.3f" % (s, 3.0 - 0.01 * s)
                                                            for s in range(0, 30)]
    lines += ["[rgt 10:05:00] resume: from ckpt_30.pt", "[rgt 10:05:00] starting: python train.py --resume x"]
    lines += ["iter %d: loss %.3f" % (s, 3.0 - 0.01 * s) for s in range(31, 60)]
    (run / "job.log").write_text("\n".join(lines) + "\n")
    res = forensics("plot", run, "--metric", "loss", "--out", tmp_path / "p.png", "--json",
                    "--log-regex", r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["runs"][0]["restarts"] == [31]


def test_plot_notes_attempts_it_cannot_place(two_runs, tmp_path):
    need_module("matplotlib")
    _a, b = two_runs
    (b / "previous" / "x").mkdir(parents=True)
    res = forensics("plot", b, "--metric", "loss", "--out", tmp_path / "b.png")
    assert res.returncode == 0 and "no step was logged twice" in res.stderr


def test_plot_bad_input_is_one_line_and_exit_2_or_5(two_runs, tmp_path):
    need_module("matplotlib")
    a, _b = two_runs
    cases = [(("--out", tmp_path / "x.jpg"), 2, ".png"), (("--out", tmp_path / "no" / "x.png"), 2, "does not exist"),
             (("--out", tmp_path / "x.png", "--size", "10x10"), 2, "WIDTHxHEIGHT"),
             (("--out", tmp_path / "x.png", "--metric", "thing"), 2, "--mode"),
             (("--out", tmp_path / "x.png", "--metric", "val/acc"), 5, "no run has")]
    for extra, code, words in cases:
        args = list(extra) if "--metric" in extra else list(extra) + ["--metric", "loss"]
        res = forensics("plot", a, *args)
        assert res.returncode == code and words in res.stderr, (extra, res.returncode, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_is_exit_4_and_one_line(two_runs, tmp_path):
    a, _b = two_runs
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named matplotlib (test shim)')\n")
    env = dict(os.environ, PYTHONPATH=str(shim.parent))
    out = tmp_path / "x.png"
    res = forensics("plot", a, "--metric", "loss", "--out", out, env=env)
    assert res.returncode == 4, (res.returncode, res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1 and "pip install matplotlib" in res.stderr
    assert not out.exists()
    helped = forensics("plot", "--help", env=env)
    assert helped.returncode == 0 and "4 plot without matplotlib" in helped.stdout
    assert forensics("list", a, "--metric", "loss", env=env).returncode == 0
