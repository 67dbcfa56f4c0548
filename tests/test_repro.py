"""The reproduction recipe end to end: a small CPU run of examples/train_resumable.py launched by run_one.sh
(whose init records env.json through run_env.py), repro.py's script executed for real (git worktree, the
recorded patch, seeds, the environment check, the re-run, reconcile.py), and its refusals."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import NODE, REPO, SCRIPTS, need

RUN_ONE = str(NODE / "run_one.sh")
RUN_ENV = str(NODE / "run_env.py")
REPRO = str(SCRIPTS / "repro.py")
TRAIN = REPO / "examples" / "train_resumable.py"


def wait_for(predicate, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def git(cwd, *args):
    res = subprocess.run(["git", "-C", str(cwd), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def project(tmp_path):
    need("git")
    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    shutil.copy(TRAIN, proj / "train.py")
    git(proj, "add", "train.py")
    git(proj, "commit", "-qm", "the trainer")
    return proj


def env_for(tmp_path):
    env = dict(os.environ, RGT_PYTHON=sys.executable, SEED="7", HOME=str(tmp_path / "home"))
    for var in ("DATA_DIR", "DURABLE_DIR", "RGT_PROFILE", "RGT_PROFILE_INDEX", "TMUX", "RGT_NO_RUN_ENV"):
        env.pop(var, None)
    return env


def launch(tmp_path, proj, run_dir, steps=8, backend="pure"):
    """A real launch through run_one.sh; its init starts run_env.py, whose env.json we wait for."""
    cmd = [sys.executable, "train.py", "--ckpt-dir", str(run_dir / "ckpt"), "--steps", str(steps), "--seed", "7",
           "--backend", backend]
    res = subprocess.run(["bash", RUN_ONE, "--run-dir", str(run_dir), "--no-deadman", "--disk-floor-gb", "0",
                          "--wait", "--", *cmd], cwd=str(proj), env=env_for(tmp_path), capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: (run_dir / "env.json").is_file()), "run_env.py never wrote env.json"
    return json.loads((run_dir / "env.json").read_text())


def repro(*args, env=None):
    res = subprocess.run([sys.executable, REPRO, *map(str, args)], capture_output=True, text=True, timeout=120,
                         env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def run_script(script, work, tmp_path):
    return subprocess.run(["bash", str(script), str(work)], capture_output=True, text=True, timeout=600,
                          env=env_for(tmp_path), cwd=str(tmp_path))


def test_launch_records_the_environment(tmp_path, project):
    rec = launch(tmp_path, project, tmp_path / "runs" / "r1")
    assert rec["git"]["commit"] == git(project, "rev-parse", "HEAD").strip() and rec["git"]["dirty"] is False
    assert rec["seeds"] == {"SEED": "7"}, "only seed variables are recorded"
    assert rec["python"]["version"] == "%d.%d.%d" % sys.version_info[:3]
    assert "HOME" not in json.dumps(rec["seeds"]) and str(tmp_path / "home") not in json.dumps(rec)


def test_clean_run_reproduces(tmp_path, project):
    run_dir = tmp_path / "runs" / "r1"
    launch(tmp_path, project, run_dir)
    res = repro(run_dir, "-o", tmp_path / "repro.sh", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["claims"] > 0 and report["metrics_files"] == ["ckpt/metrics.jsonl"]
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout
    new_metrics = tmp_path / "w" / "run" / "ckpt" / "metrics.jsonl"
    assert new_metrics.is_file(), "the re-run wrote into the fresh run dir"
    assert len((run_dir / "ckpt" / "metrics.jsonl").read_text().splitlines()) == 8, "the old run was not touched"
    assert json.loads((tmp_path / "w" / "run" / "env.json").read_text())["seeds"] == {"SEED": "7"}


def test_dirty_tree_reproduces_from_the_saved_patch(tmp_path, project):
    torch_backend = "torch" if subprocess.run([sys.executable, "-c", "import torch"]).returncode == 0 else "pure"
    with open(project / "train.py", "a") as handle:
        handle.write("\n# an uncommitted edit\n")
    (project / "notes.txt").write_text("untracked\n")
    run_dir = tmp_path / "runs" / "r2"
    rec = launch(tmp_path, project, run_dir, steps=6, backend=torch_backend)
    assert rec["git"]["dirty"] is True and (run_dir / "code.patch").is_file()
    assert rec["git"]["untracked"] == ["notes.txt"]
    res = repro(run_dir, "-o", tmp_path / "repro.sh")
    assert res.returncode == 0 and "untracked" in res.stdout, res.stdout + res.stderr
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied code.patch: the tree matches" in done.stderr
    assert (tmp_path / "w" / "src" / "train.py").read_text().endswith("# an uncommitted edit\n")


def test_changed_numbers_are_caught(tmp_path, project):
    run_dir = tmp_path / "runs" / "r3"
    launch(tmp_path, project, run_dir)
    metrics = run_dir / "ckpt" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1]["loss"] *= 1.01                      # the record claims a number the code does not produce
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert repro(run_dir, "-o", tmp_path / "repro.sh").returncode == 0
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 1 and "DIFFERS" in done.stdout, done.stdout + done.stderr
    assert "DRIFT" in done.stdout and "loss@last" in done.stdout


def test_changed_data_stops_the_script(tmp_path, project):
    run_dir = tmp_path / "runs" / "r4"
    launch(tmp_path, project, run_dir)
    data = tmp_path / "data.bin"
    data.write_bytes(b"training data v1")
    res = subprocess.run([sys.executable, RUN_ENV, str(run_dir), "--cwd", str(project), "--data", str(data)],
                         capture_output=True, text=True, timeout=120, env=env_for(tmp_path))
    assert res.returncode == 0, res.stderr
    assert repro(run_dir, "-o", tmp_path / "repro.sh").returncode == 0
    data.write_bytes(b"training data v2")
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 3 and "FAIL data" in done.stdout and "numbers cannot match" in done.stderr, \
        done.stdout + done.stderr


def test_unpinned_code_is_refused_unless_allowed(tmp_path, project):
    run_dir = tmp_path / "runs" / "r5"
    launch(tmp_path, project, run_dir)
    os.unlink(run_dir / "env.json")
    with open(project / "train.py", "a") as handle:
        handle.write("\n# edited after the launch\n")
    subprocess.run([sys.executable, RUN_ENV, str(run_dir), "--cwd", str(project), "--no-patch"], check=True,
                   capture_output=True, timeout=120, env=env_for(tmp_path))
    res = repro(run_dir, "-o", tmp_path / "repro.sh")
    assert res.returncode == 3 and "--allow-unpinned" in res.stderr, res.stderr
    assert not (tmp_path / "repro.sh").exists()
    res = repro(run_dir, "-o", tmp_path / "repro.sh", "--allow-unpinned")
    assert res.returncode == 0 and "cannot be rebuilt" in res.stdout
    assert "NOT reproduced" in (tmp_path / "repro.sh").read_text()


def test_a_patch_that_is_not_the_run_tree_is_refused(tmp_path, project):
    with open(project / "train.py", "a") as handle:
        handle.write("\n# edit\n")
    run_dir = tmp_path / "runs" / "r6"
    launch(tmp_path, project, run_dir)
    with open(run_dir / "code.patch", "a") as handle:
        handle.write(" ")
    res = repro(run_dir, "-o", tmp_path / "repro.sh")
    assert res.returncode == 3 and "does not hash to the recorded diff" in res.stderr
