"""run_forensics.py on real records: TensorBoard events written by torch's SummaryWriter, offline W&B runs
written by the wandb package (no network), JSONL and CSV logs, and the launcher's run.json / env.json."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, need_module

FORENSICS = str(SCRIPTS / "run_forensics.py")

# val/loss falls then climbs back (an early peak for a lower-is-better metric); train/loss has one spike and
# a NaN; lr goes flat for the last 30 steps.
CURVES = {
    "val/loss": [1.0 / (1 + 0.3 * s) if s < 15 else 1.0 / (1 + 0.3 * 15) + 0.04 * (s - 15) for s in range(50)],
    "train/loss": [2.0 - 0.03 * s + (25.0 if s == 30 else 0.0) + (float("nan") if s == 40 else 0.0)
                   for s in range(50)],
    "lr": [0.1 - 0.005 * s if s < 20 else 0.0 for s in range(50)],
}


def forensics(*args, env=None):
    res = subprocess.run([sys.executable, FORENSICS, *map(str, args)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def as_json(res):
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory):
    need_module("tensorboard")
    torch = need_module("torch")
    from torch.utils.tensorboard import SummaryWriter
    run = tmp_path_factory.mktemp("tb") / "tb-run"
    writer = SummaryWriter(str(run / "tb"))
    for name, values in CURVES.items():
        for step, value in enumerate(values):
            writer.add_scalar(name, torch.tensor(value).item(), step)
    writer.close()
    return run


WANDB_JOB = """
import json, sys
import wandb
cfg = json.loads(sys.argv[1])
run = wandb.init(project="forensics-test", config=cfg, name=cfg["name"])
for step in range(30):
    loss = 1.0 / (1 + step) if step < 10 else 0.1 + 0.03 * (step - 9)
    run.log({"eval/loss": loss, "acc": min(0.9, 0.05 * step)}, step=step)
run.finish()
"""


def wandb_env(root):
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(root), WANDB_SILENT="true",
               WANDB_CONFIG_DIR=str(root / "cfg"), WANDB_CACHE_DIR=str(root / "cache"),
               WANDB_DATA_DIR=str(root / "data"), WANDB_DISABLE_GIT="true")
    env.pop("WANDB_API_KEY", None)
    return env


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory):
    need_module("wandb")
    root = tmp_path_factory.mktemp("wb")
    dirs = []
    for name, lr in (("a", 0.1), ("b", 0.01)):
        folder = root / name
        folder.mkdir()
        cfg = {"name": name, "lr": lr, "model": {"depth": 3, "width": 64}, "seed": 1}
        res = subprocess.run([sys.executable, "-c", WANDB_JOB, json.dumps(cfg)], capture_output=True, text=True,
                             env=wandb_env(folder), timeout=300, cwd=str(folder))
        assert res.returncode == 0, res.stdout + res.stderr
        runs = sorted((folder / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, list((folder / "wandb").iterdir())
        dirs.append(folder)
    return dirs


# ---------------------------------------------------------------- TensorBoard

def test_list_reads_tensorboard_best_last_and_step(tb_run):
    out = as_json(forensics("list", tb_run, "--metric", "val/loss", "--json"))
    (row,) = out["runs"]
    m = row["metrics"]["val/loss"]
    assert m["best_step"] == 15 and m["last_step"] == 49 and m["points"] == 50
    assert math.isclose(m["best"], CURVES["val/loss"][15], rel_tol=1e-6)
    assert math.isclose(m["last"], CURVES["val/loss"][49], rel_tol=1e-6)
    assert m["mode"] == "min" and m["mode_from"] == "guessed from the name"


def test_curve_finds_the_early_peak(tb_run):
    res = forensics("curve", tb_run, "--metric", "val/loss", "--json")
    assert res.returncode == 1, res.stdout
    kinds = {f["kind"]: f for f in as_json(res)["findings"]}
    assert kinds["early_peak"]["step"] == 15
    assert "spike" not in kinds and "nonfinite" not in kinds and "flat" not in kinds


def test_curve_finds_the_spike_and_the_nan(tb_run):
    res = forensics("curve", tb_run, "--metric", "train/loss", "--json")
    assert res.returncode == 1
    found = as_json(res)["findings"]
    assert [f["step"] for f in found if f["kind"] == "spike"] == [30]
    (nan,) = [f for f in found if f["kind"] == "nonfinite"]
    assert nan["step"] == 40 and nan["count"] == 1
    text = forensics("curve", tb_run, "--metric", "train/loss").stdout
    assert "FAIL nonfinite" in text and "WARN spike" in text


def test_curve_finds_a_flat_tail_and_needs_a_direction_for_unclear_names(tb_run):
    res = forensics("curve", tb_run, "--metric", "lr")
    assert res.returncode == 2 and "--mode" in res.stderr and len(res.stderr.splitlines()) == 1
    res = forensics("curve", tb_run, "--metric", "lr", "--mode", "min", "--json")
    assert res.returncode == 1
    (flat,) = [f for f in as_json(res)["findings"] if f["kind"] == "flat"]
    assert flat["step"] == 30 and flat["value"] == 0.0


def test_a_clean_curve_is_ok(tmp_path):
    run = tmp_path / "clean"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (1 + s)}) + "\n"
                                               for s in range(40)))
    res = forensics("curve", run, "--metric", "loss")
    assert res.returncode == 0 and "OK no early peak" in res.stdout, res.stdout + res.stderr


def test_missing_tensorboard_is_one_note_and_exit_3(tb_run, tmp_path):
    shadow = tmp_path / "shadow" / "tensorboard"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('tensorboard hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=str(shadow.parent))
    res = forensics("curve", tb_run, "--metric", "val/loss", env=env)
    assert res.returncode == 5, res.stdout + res.stderr
    assert "tensorboard package is not installed" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_an_absent_metric_is_exit_3(tb_run):
    res = forensics("curve", tb_run, "--metric", "val/accuracy")
    assert res.returncode == 5 and "no source logs 'val/accuracy'" in res.stderr


# ---------------------------------------------------------------- W&B offline runs

def test_list_reads_offline_wandb_history(wandb_runs):
    out = as_json(forensics("list", *wandb_runs, "--metric", "eval/loss", "--json"))
    assert [r["name"] for r in out["runs"]] == ["a", "b"]
    for row in out["runs"]:
        m = row["metrics"]["eval/loss"]
        assert m["best_step"] == 9 and m["last_step"] == 29 and m["points"] == 30
        assert math.isclose(m["best"], 0.1) and math.isclose(m["last"], 0.1 + 0.03 * 20)


def test_list_of_a_parent_folder_lists_each_run(wandb_runs):
    out = as_json(forensics("list", wandb_runs[0].parent, "--json"))
    names = sorted(r["name"] for r in out["runs"])
    assert names == ["a", "b"]
    assert out["runs"][0]["metrics"]["acc"]["best_step"] == 18   # the first step reaching 0.9


def test_diff_shows_only_the_knob_that_differs(wandb_runs):
    out = as_json(forensics("diff", *wandb_runs, "--json"))
    keys = {row["key"]: row for row in out["differing"]}
    assert keys["wandb.config.lr"]["a"] == 0.1 and keys["wandb.config.lr"]["b"] == 0.01
    assert "wandb.config.name" in keys
    assert "wandb.config.model.depth" not in keys and "wandb.config.seed" not in keys
    assert not any(k.startswith("wandb.run.") for k in keys), "run identity is left out without --all"


def test_curve_on_wandb_finds_the_early_peak(wandb_runs):
    res = forensics("curve", wandb_runs[0], "--metric", "eval/loss", "--json")
    assert res.returncode == 1
    assert [f["step"] for f in as_json(res)["findings"] if f["kind"] == "early_peak"] == [9]


def test_the_wandb_api_needs_a_key(tmp_path):
    env = dict(os.environ)
    env.pop("WANDB_API_KEY", None)
    res = forensics("list", "wandb:someone/project", env=env)
    assert res.returncode == 5 and "WANDB_API_KEY" in res.stderr


# ---------------------------------------------------------------- run dirs: JSONL, CSV, run.json, env.json

def launcher_run(tmp_path, name, lr, seed, torch_version):
    run = tmp_path / name
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": name, "cwd": "/w", "created_at": "2026-12-01T00:00:00Z",
                                              "cmd": ["python3", "train.py", "--lr", str(lr), "--seed", str(seed)]}))
    (run / "env.json").write_text(json.dumps({"python": {"version": "3.11.7"}, "torch": {"version": torch_version},
                                              "git": {"commit": "abc", "dirty": False}, "host": name}))
    (run / "log.csv").write_text("epoch,val_acc\n" + "".join("%d,%s\n" % (e, 0.1 * e) for e in range(6)))
    return run


def test_diff_of_launcher_runs_flattens_cmd_and_environment(tmp_path):
    a = launcher_run(tmp_path, "a", 0.1, 1, "2.5.0")
    b = launcher_run(tmp_path, "b", 0.1, 2, "2.6.0")
    out = as_json(forensics("diff", a, b, "--json"))
    keys = {row["key"] for row in out["differing"]}
    assert keys == {"cmd.seed", "env.torch.version"}, keys
    text = forensics("diff", a, b).stdout
    assert "WARN more than the one knob" in text
    assert "run.run_id" in {r["key"] for r in as_json(forensics("diff", a, b, "--all", "--json"))["differing"]}


def test_list_reads_csv_with_its_step_column(tmp_path):
    run = launcher_run(tmp_path, "a", 0.1, 1, "2.5.0")
    m = as_json(forensics("list", run, "--metric", "val_acc", "--json"))["runs"][0]["metrics"]["val_acc"]
    assert m["best_step"] == 5 and m["mode"] == "max" and math.isclose(m["best"], 0.5)


# ---------------------------------------------------------------- strict JSON and the per-step reader

def strict_json(text):
    """json.loads that refuses NaN / Infinity, as jq and most non-Python parsers do."""
    def refuse(token):
        raise ValueError("not JSON: %s" % token)
    return json.loads(text, parse_constant=refuse)


def test_json_writes_nonfinite_values_and_yaml_dates_as_strings(tmp_path):
    need_module("yaml", "pip install -r requirements-dev.txt (pyyaml)")
    runs = []
    for name, values, when in (("a", [1.0, float("inf"), 0.5], "2026-12-01 10:00:00"),
                               ("b", [1.0, float("-inf"), float("nan")], "2026-12-02")):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                                   for s, v in enumerate(values)))
        (run / "config.yaml").write_text("lr: .nan\nstarted: %s\n" % when)
        runs.append(run)
    curve = forensics("curve", runs[1], "--metric", "loss", "--json")
    assert curve.returncode == 1, curve.stderr
    doc = strict_json(curve.stdout)
    assert doc["stats"]["last"] == "nan" and doc["stats"]["points"] == 3
    listed = strict_json(forensics("list", *runs, "--metric", "loss", "--json").stdout)
    assert [r["metrics"]["loss"]["last"] for r in listed["runs"]] == [0.5, "nan"]
    diff = forensics("diff", *runs, "--json")
    assert diff.returncode == 0, diff.stderr
    rows = {r["key"]: r for r in strict_json(diff.stdout)["differing"]}
    assert rows["config.started"]["a"] == "2026-12-01T10:00:00" and rows["config.started"]["b"] == "2026-12-02"
    assert "config.lr" not in rows, "NaN in both configs is the same value"
    text = forensics("diff", *runs)
    assert text.returncode == 0 and "config.started" in text.stdout and "2026-12-01T10:00:00" in text.stdout


def test_steps_prints_the_last_value_of_each_step(tmp_path):
    # attempt 1 logged steps 0..3 and died; attempt 2 resumed from step 2 and logged 2..4 with other numbers
    log = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "loss": 1.0 + s} for s in range(4)] + [{"step": s, "loss": 10.0 + s, "acc": s / 10.0}
                                                              for s in range(2, 5)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "lo')  # a torn last line
    res = forensics("steps", log)
    assert res.returncode == 0, res.stderr
    got = [strict_json(line) for line in res.stdout.splitlines()]
    assert got == [{"step": 2, "acc": 0.2}, {"step": 3, "acc": 0.3}, {"step": 4, "acc": 0.4},
                   {"step": 0, "loss": 1.0}, {"step": 1, "loss": 2.0}, {"step": 2, "loss": 12.0},
                   {"step": 3, "loss": 13.0}, {"step": 4, "loss": 14.0}]
    csv_log = tmp_path / "log.csv"
    csv_log.write_text("epoch,val_loss\n0,1.5\n1,nan\n1,0.5\n2,inf\n")
    got = [strict_json(line) for line in forensics("steps", csv_log).stdout.splitlines()]
    assert got == [{"step": 0, "val_loss": 1.5}, {"step": 1, "val_loss": 0.5}, {"step": 2, "val_loss": "inf"}]
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"note": "no numbers"}\n')
    res = forensics("steps", empty)
    assert res.returncode == 5 and "no numeric metric" in res.stderr


# ---------------------------------------------------------------- a trainer that logs only to stdout (job.log)

ITER_RX = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
# the eval line's train loss is named loss too: it must stay a source of its own, never merge with the iter curve
EVAL_RX = r"step (?P<step>\d+): train loss (?P<loss>[\d.]+), val loss (?P<val_loss>[\d.]+)"


def iter_loss(step):
    return round(4.0 / (1 + 0.1 * step), 4)


def nanogpt_log(steps=40, nan_at=None):
    """job.log as karpathy/nanoGPT without W&B prints it: an eval line every 10 iterations (its losses far
    above the iter curve, so a merge would read as spikes), one line per iteration, and the supervisor's notes,
    one of which looks like an iter line."""
    lines = ["Overriding: max_iters = %d" % steps, "[rgt 12:00:01] job started; iter 99: loss 0.0001",
             "tokens per iteration will be: 8,192"]
    for step in range(steps):
        if step % 10 == 0:
            lines.append("step %d: train loss %.4f, val loss %.4f" % (step, 9.0 - 0.01 * step, 9.5 - 0.01 * step))
            lines.append("saving checkpoint to out-tiny")
        loss = "nan" if step == nan_at else "%.4f" % iter_loss(step)
        lines.append("iter %d: loss %s, time 51.2ms, mfu %.2f%%" % (step, loss, -100.0 if step < 5 else 1.2))
    lines.append("[rgt 12:03:10] job exited 0")
    return "\n".join(lines) + "\n"


def pulled_stdout_run(tmp_path, name="nano1", text=None):
    run = tmp_path / name
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "job.log").write_text(text if text is not None else nanogpt_log())
    (run / "run.json").write_text(json.dumps({"run_id": name, "cmd": ["python3", "-u", "train.py"]}))
    return run


def test_log_regex_reads_exactly_the_iter_points_of_a_stdout_only_trainer(tmp_path):
    run = pulled_stdout_run(tmp_path)
    res = forensics("curve", run, "--metric", "loss", "--log-regex", ITER_RX, "--log-regex", EVAL_RX, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = strict_json(res.stdout)
    assert doc["source"] == "logs/job.log#1" and doc["findings"] == []
    assert doc["stats"]["points"] == 40 and doc["stats"]["first_step"] == 0 and doc["stats"]["last_step"] == 39
    assert math.isclose(doc["stats"]["last"], iter_loss(39)) and doc["stats"]["best_step"] == 39
    # the eval lines are their own source; the supervisor's look-alike line (step 99) was never read
    steps = [json.loads(line) for line in forensics("steps", run / "logs" / "job.log", "--log-regex", ITER_RX)
             .stdout.splitlines()]
    assert [p["step"] for p in steps] == list(range(40)) and steps[10]["loss"] == iter_loss(10)
    evals = strict_json(forensics("curve", run, "--metric", "logs/job.log#2:val_loss", "--log-regex", ITER_RX,
                                  "--log-regex", EVAL_RX, "--json").stdout)
    assert evals["stats"]["points"] == 4 and evals["stats"]["last_step"] == 30
    listed = strict_json(forensics("list", run, "--log-regex", ITER_RX, "--log-regex", EVAL_RX, "--json").stdout)
    (row,) = listed["runs"]
    assert row["sources"][-2:] == ["logs/job.log#1", "logs/job.log#2"]
    assert row["metrics"]["loss"]["points"] == 40 and row["metrics"]["val_loss"]["points"] == 4


def test_without_log_regex_a_stdout_only_run_is_exit_3_for_list_and_curve_with_a_hint(tmp_path):
    run = pulled_stdout_run(tmp_path)
    for args in (("curve", run, "--metric", "loss"), ("list", run)):
        res = forensics(*args)
        assert res.returncode == 5, (args, res.stdout, res.stderr)
        (line,) = res.stderr.strip().splitlines()
        assert "--log-regex" in line and "logs/job.log" in line, line
    assert "NO METRICS" in forensics("list", run).stdout
    # a folder of runs: the run that logs to JSONL is listed, the stdout-only one is shown, the exit is 0
    other = tmp_path / "jsonl-run"
    other.mkdir()
    (other / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (1 + s)}) + "\n"
                                                 for s in range(5)))
    res = forensics("list", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "RUN jsonl-run" in res.stdout and "RUN nano1" in res.stdout and "NO METRICS" in res.stdout


def test_log_regex_reads_the_run_dirs_and_the_pulled_copy_and_keeps_nan(tmp_path):
    run = pulled_stdout_run(tmp_path, text=nanogpt_log(20))
    (run / "job.log").write_text(nanogpt_log(30, nan_at=25))
    loose = r"iter (?P<step>\d+): loss (?P<loss>[\w.+-]+),"
    out = strict_json(forensics("list", run, "--metric", "loss", "--log-regex", loose, "--json").stdout)
    (row,) = out["runs"]
    assert [s for s in row["sources"] if "job.log" in s] == ["job.log#1", "logs/job.log#1"]
    assert row["metrics"]["loss"]["source"] == "job.log#1" and row["metrics"]["loss"]["points"] == 30
    res = forensics("curve", run, "--metric", "loss", "--log-regex", loose, "--json")
    assert res.returncode == 1
    (nan,) = [f for f in strict_json(res.stdout)["findings"] if f["kind"] == "nonfinite"]
    assert nan["step"] == 25 and nan["count"] == 1
    pulled = strict_json(forensics("curve", run, "--metric", "logs/job.log#1:loss", "--log-regex", loose,
                                   "--json").stdout)
    assert pulled["stats"]["points"] == 20 and pulled["findings"] == []


def test_a_log_regex_without_a_step_group_or_that_does_not_compile_is_exit_2(tmp_path):
    run = pulled_stdout_run(tmp_path)
    for bad, said in ((r"iter (\d+): loss (?P<loss>[\d.]+)", "(?P<step>...)"),
                      (r"iter (?P<step>\d+: loss (?P<loss>[\d.]+)", "does not compile"),
                      (r"iter (?P<step>\d+):", "names no metric")):
        for args in (("curve", run, "--metric", "loss"), ("list", run), ("steps", run / "logs" / "job.log")):
            res = forensics(*args, "--log-regex", ITER_RX, "--log-regex", bad)
            assert res.returncode == 2, (bad, args, res.stderr)
            (line,) = res.stderr.strip().splitlines()
            assert said in line and "--log-regex" in line, line
    res = forensics("steps", run / "logs" / "job.log", "--log-regex", ITER_RX, "--log-regex", EVAL_RX)
    assert res.returncode == 2 and "both name 'loss'" in res.stderr


# ---------------------------------------------------------------- N6: a batch index that restarts every epoch

EPOCH_RX = r"Epoch (?P<epoch>\d+) \[(?P<step>\d+)/5\] loss (?P<loss>[\d.]+)"
# three epochs of five batches: the best loss is in epoch 1, the last epoch overfits and ends worse
EPOCH_LOSS = {0: [2.0, 1.8, 1.6, 1.5, 1.4], 1: [1.3, 1.2, 1.1, 0.5, 1.0], 2: [1.2, 1.3, 1.4, 1.5, 1.6]}


def epoch_log(resume_at=None):
    """job.log of a trainer that prints `Epoch E [B/5] loss L`; RESUME_AT (epoch, batch): a supervisor
    `starting:` line and the attempt after it logs that epoch again from batch 0 (a real resume)."""
    lines = ["[rgt 12:00:00] starting: python3 train.py"]
    for epoch, losses in sorted(EPOCH_LOSS.items()):
        for batch, loss in enumerate(losses):
            lines.append("Epoch %d [%d/5] loss %.2f" % (epoch, batch, loss))
            if resume_at == (epoch, batch):
                lines.append("[rgt 12:05:00] starting: python3 train.py")
                lines += ["Epoch %d [%d/5] loss %.2f" % (epoch, b, EPOCH_LOSS[epoch][b]) for b in range(batch + 1)]
    return "\n".join(lines) + "\n"


def test_finding_field_N6_an_epoch_and_batch_log_is_read_as_epoch_batch_steps(tmp_path):
    """`epoch` and `step` groups: each (epoch, batch) is its own step, in order; best and last cover all three
    epochs (the old reading kept five points, each batch index's last epoch, and made epoch a metric)."""
    run = pulled_stdout_run(tmp_path, "ep", epoch_log())
    doc = strict_json(forensics("list", run, "--metric", "loss", "--log-regex", EPOCH_RX, "--json").stdout)
    stats = doc["runs"][0]["metrics"]["loss"]
    assert stats["points"] == 15 and stats["first_step"] == [0, 0] and stats["last_step"] == [2, 4], stats
    assert stats["best"] == 0.5 and stats["best_step"] == [1, 3] and stats["last"] == 1.6, stats
    assert "epoch" not in doc["runs"][0]["metrics"], doc["runs"][0]["metrics"]
    text = forensics("list", run, "--metric", "loss", "--log-regex", EPOCH_RX).stdout
    assert "epoch 1 batch 3" in text and "epoch 2 batch 4" in text, text
    curve = strict_json(forensics("curve", run, "--metric", "loss", "--log-regex", EPOCH_RX, "--json").stdout)
    assert [f["kind"] for f in curve["findings"]] == ["early_peak"] and curve["findings"][0]["step"] == [1, 3]
    steps = [json.loads(line) for line in forensics("steps", run / "logs" / "job.log", "--log-regex", EPOCH_RX)
             .stdout.splitlines()]
    assert [p["step"] for p in steps][:6] == [[0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [1, 0]] and len(steps) == 15


def test_finding_field_N6_each_epoch_start_is_not_a_resume_but_a_real_resume_still_is(tmp_path):
    need_module("matplotlib")
    plain = pulled_stdout_run(tmp_path, "plain", epoch_log())
    resumed = pulled_stdout_run(tmp_path, "resumed", epoch_log(resume_at=(1, 2)))
    res = forensics("plot", plain, resumed, "--metric", "loss", "--log-regex", EPOCH_RX, "--out",
                    tmp_path / "ep.png", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    runs = {r["name"]: r for r in json.loads(res.stdout)["runs"]}
    assert runs["plain"]["restarts"] == [] and runs["plain"]["points"] == 15, runs["plain"]
    assert runs["resumed"]["restarts"] == [[1, 0]] and runs["resumed"]["replaced"] == 3, runs["resumed"]
    assert runs["resumed"]["best_step"] == [1, 3] and runs["resumed"]["last_step"] == [2, 4]


# ---------------------------------------------------------------- N8: per-run settings are not knobs

def sweep_cell(tmp_path, name, lr, script="train.py"):
    """A cell of a sweep as the launcher records it: its own cwd, outputs, run dir, and a command line with the
    one knob (--lr) and its own output folder."""
    run = tmp_path / name
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "run_id": name, "cwd": "/work/sweep/%s" % name, "profile": "runpod", "durable_dir": "/workspace/d-%s" % name,
        "run_dir": "/workspace/d/runs/%s" % name, "results_dir": "/workspace/d/results/%s" % name,
        "outputs": ["out/%s/*.pt" % name, "logs/%s/*.jsonl" % name], "allow_empty": ["logs/%s/*.jsonl" % name],
        "resume_glob": "out/%s/ckpt_*.pt" % name, "progress_regex": r"step (?P<step>\d+)",
        "cmd": ["python3", script, "--lr", str(lr), "--batch", "64", "--save", "out/%s" % name]}))
    (run / "env.json").write_text(json.dumps({"python": {"version": "3.11.7"}, "git": {"commit": "abc"}}))
    return run


def test_finding_field_N8_diff_counts_only_the_knob_not_the_command_line_outputs_or_run_dir(tmp_path):
    a, b = sweep_cell(tmp_path, "lr1", 0.1), sweep_cell(tmp_path, "lr2", 0.2)
    out = as_json(forensics("diff", a, b, "--json"))
    assert [(r["key"], r["a"], r["b"]) for r in out["differing"]] == [("cmd.lr", "0.1", "0.2")], out["differing"]
    text = forensics("diff", a, b).stdout
    assert "1 differing key(s)" in text and "WARN more than the one knob" not in text, text
    shown = {r["key"] for r in as_json(forensics("diff", a, b, "--all", "--json"))["differing"]}
    assert {"run.cmd", "run.outputs", "run.cwd", "run.run_dir"} <= shown, shown
    # a different script is still a second variable
    c = sweep_cell(tmp_path, "lr3", 0.1, script="train_v2.py")
    keys = {r["key"] for r in as_json(forensics("diff", a, c, "--json"))["differing"]}
    assert keys == {"cmd.words"}, keys


# ---------------------------------------------------------------- red-team round 3 findings


PY = sys.executable


from conftest import run_no_traceback as run  # noqa: E402


# ---------------------------------------------------------------------------------------------- run_forensics.py

@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
def test_forensics_json_is_strict_json_with_nan_metrics(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": v}) + "\n"
                                              for s, v in enumerate([1.0, 0.5, float("nan")])))
    res = run([PY, FORENSICS, "list", rd, "--metric", "loss", "--json"])
    assert res.returncode == 0, res.stderr

    def refuse(token):
        raise ValueError("not JSON: %s" % token)
    json.loads(res.stdout, parse_constant=refuse)


@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
def test_forensics_diff_yaml_dates(tmp_path):
    need_module("yaml", "pip install -r requirements-dev.txt (pyyaml)")
    for name, day in (("a", "2026-12-01"), ("b", "2026-12-02")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text("lr: 0.1\ndata_snapshot: %s\n" % day)
    res = run([PY, FORENSICS, "diff", tmp_path / "a", tmp_path / "b"])
    assert res.returncode == 0 and "data_snapshot" in res.stdout, res.stdout + res.stderr


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


# ---------------------------------------------------------------- laptop 12, field R18: run_forensics diff

def forensic_run(folder, config_text, name="config.yaml"):
    folder.mkdir(parents=True)
    (folder / name).write_text(config_text)
    (folder / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    return folder


def test_finding_laptop_12_a_yaml_alias_bomb_is_skipped_with_a_note(tmp_path):
    pytest.importorskip("yaml")
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 8):
        bomb.append("a%d: &a%d [%s]" % (level, level, ", ".join(["*a%d" % (level - 1)] * 10)))
    bomb.append("lr: 0.1")
    text = "\n".join(bomb) + "\n"
    assert len(text) < 1000   # under a kilobyte, 10^8 values when expanded
    run_a = forensic_run(tmp_path / "runA", text)
    run_b = forensic_run(tmp_path / "runB", text.replace("lr: 0.1", "lr: 0.2"))
    for run in (run_a, run_b):
        (run / "args.json").write_text('{"seed": 1}')
    # bounded: an expansion would take minutes and gigabytes; a cap answers at once, under a hard address limit
    limit = "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
    for argv in (["diff", run_a, run_b], ["list", run_a, "--metric", "loss", "--mode", "min"]):
        res = subprocess.run([sys.executable, "-c", limit + "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], "
                              "run_name='__main__')", str(SCRIPTS / "run_forensics.py"), *map(str, argv)],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "expands to more than" in res.stdout + res.stderr, res.stdout + res.stderr
        assert "MemoryError" not in res.stdout + res.stderr


def test_finding_field_R18_diff_leaves_out_settings_that_must_differ_per_run(tmp_path):
    base = {"lr": 0.1, "batch_size": 32, "out_dir": "/data/out/ablate-a", "run_name": "ablate-a",
            "logging": {"dir": "/data/logs/ablate-a"}, "data_dir": "/data/set"}
    other = dict(base, lr=0.2, out_dir="/data/out/ablate-b", run_name="ablate-b", logging={"dir": "/data/logs/ablate-b"})
    run_a = forensic_run(tmp_path / "ablate-a", json.dumps(base), "config.json")
    run_b = forensic_run(tmp_path / "ablate-b", json.dumps(other), "config.json")
    res = run_py(SCRIPTS / "run_forensics.py", "--json", "diff", run_a, run_b)
    if res.returncode == 2:   # --json after the command
        res = run_py(SCRIPTS / "run_forensics.py", "diff", run_a, run_b, "--json")
    assert res.returncode == 0, res.stderr
    assert [r["key"] for r in json.loads(res.stdout)["differing"]] == ["config.lr"]
    human = run_py(SCRIPTS / "run_forensics.py", "diff", run_a, run_b)
    assert "WARN more than the one knob" not in human.stdout, human.stdout
    every = run_py(SCRIPTS / "run_forensics.py", "diff", run_a, run_b, "--all", "--json")
    keys = [r["key"] for r in json.loads(every.stdout)["differing"]]
    assert {"config.out_dir", "config.run_name", "config.logging.dir", "config.lr"} <= set(keys)
