"""The reproduction recipe end to end: a small CPU run of examples/train_resumable.py launched by run_one.sh
(whose init records env.json through run_env.py), repro.py's script executed for real (git worktree, the
recorded patch, seeds, the environment check, the re-run, reconcile.py), and its refusals."""
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import NODE, REPO, SCRIPTS, need, wait_for
from repro_fixture import committed_project, git

RUN_ONE = str(NODE / "run_one.sh")
RUN_ENV = str(NODE / "run_env.py")
REPRO = str(SCRIPTS / "repro.py")
TRAIN = REPO / "examples" / "train_resumable.py"


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
    assert wait_for(lambda: (run_dir / "env.json").is_file(), 120), "run_env.py never wrote env.json"
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


# ---------------------------------------------------------------- a run recorded by hand (no launcher needed)

JOB = r'''
import json, sys
metrics, out = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
with open(metrics, "w") as fh:
    for epoch in range(3):            # several records per epoch: a per-batch log keyed by epoch
        for batch in range(4):
            fh.write(json.dumps({"epoch": epoch, "batch": batch, "loss": 1.0 / (1 + 4 * epoch + batch)}) + "\n")
if out:
    open(out, "w").write("written by the job\n")
'''


def hand_recorded(tmp_path, tail=()):
    """A committed job.py, run once by hand, and its run dir with run.json and the real run_env.py's env.json."""
    proj = committed_project(tmp_path, JOB)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "job.py", str(run_dir / "metrics.jsonl"), *tail]
    assert subprocess.run(cmd, cwd=str(proj), timeout=60).returncode == 0
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": cmd, "cwd": str(proj)}))
    res = subprocess.run([sys.executable, RUN_ENV, str(run_dir), "--cwd", str(proj), "--timeout", "60"],
                         capture_output=True, text=True, timeout=300, env=env_for(tmp_path))
    assert res.returncode == 0, res.stderr
    return proj, run_dir


def test_the_script_is_never_written_into_the_run_dir_or_over_a_file(tmp_path):
    _proj, run_dir = hand_recorded(tmp_path)
    record = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    for target, extra in ((run_dir / "run.json", ["--force"]), (run_dir / "repro.sh", ["--force"]),
                          (run_dir / "env.json", [])):
        res = repro(run_dir, "-o", target, *extra)
        assert res.returncode == 2 and "inside the run dir" in res.stderr, res.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == record, "the run's record is untouched"
    script = tmp_path / "repro.sh"
    script.write_text("my own notes\n")
    res = repro(run_dir, "-o", script)
    assert res.returncode == 2 and "already exists" in res.stderr and script.read_text() == "my own notes\n"
    res = repro(run_dir, "-o", script, "--force")
    assert res.returncode == 0 and script.read_text().startswith("#!/usr/bin/env bash"), res.stderr
    res = repro(run_dir, "-o", tmp_path / "no" / "such" / "repro.sh")
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_a_path_outside_the_repo_is_named_before_the_rerun(tmp_path):
    (tmp_path / "outputs").mkdir()
    proj, run_dir = hand_recorded(tmp_path, ["../outputs/model.txt"])
    res = repro(run_dir, "-o", tmp_path / "repro.sh", "--json")
    assert res.returncode == 0, res.stderr
    warned = [w for w in json.loads(res.stdout)["warnings"] if str(tmp_path / "outputs" / "model.txt") in w]
    assert warned and "overwrites" in warned[0], json.loads(res.stdout)["warnings"]
    assert not [w for w in json.loads(res.stdout)["warnings"] if sys.executable in w], "the program is not named"


def test_a_log_with_several_records_per_step_reproduces(tmp_path):
    """Both sides are read per step (the last value of each step): the recorded run and the re-run agree."""
    _proj, run_dir = hand_recorded(tmp_path)
    assert repro(run_dir, "-o", tmp_path / "repro.sh").returncode == 0
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 0 and "REPRODUCED" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "w" / "steps" / "metrics.jsonl").is_file()


# ---------------------------------------------------------------- run_env.py: no credential, odd records

def test_run_env_records_no_credential_from_any_url(tmp_path):
    need("git")
    sys.path.insert(0, str(NODE))
    import run_env
    cases = {"https://ci:p@ss@git.example.com/o/r.git": "https://git.example.com/o/r.git",
             "https://git.example.com/o/r.git?private_token=abc#frag": "https://git.example.com/o/r.git",
             "ssh://git:tok@host:2222/o/r.git": "ssh://host:2222/o/r.git",
             "git@github.com:o/r.git": "git@github.com:o/r.git",
             "me:tok@host:o/r.git": "host:o/r.git",
             "/srv/git/r.git": "/srv/git/r.git"}
    assert {url: run_env.clean_url(url) for url in cases} == cases
    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    git(proj, "commit", "-q", "--allow-empty", "-m", "x")
    git(proj, "remote", "add", "origin", "https://oauth2:SECRET1@git.example.com/o/r.git?sig=SECRET2")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"cwd": str(proj), "cmd": [
        sys.executable, "-c", "pass", "--hub=https://u:SECRET3@hub.example.com/m?token=SECRET4"]}))
    res = subprocess.run([sys.executable, RUN_ENV, str(run_dir), "--timeout", "60"], capture_output=True,
                         text=True, timeout=300, env=env_for(tmp_path))
    assert res.returncode == 0, res.stderr
    text = (run_dir / "env.json").read_text()
    assert "SECRET" not in text and "--hub=https://hub.example.com/m" in text, text
    assert json.loads(text)["git"]["remote"] == "https://git.example.com/o/r.git"


@pytest.mark.parametrize("old,why", [
    ({"python": {"version": "3.11.7"}}, "schema"),
    ({"schema": "rgt-env/1", "python": "3.11.7"}, "python is a str"),
    ({"schema": "rgt-env/1", "packages": ["torch"]}, "packages is a list"),
    ({"schema": "rgt-env/1", "data": ["/data/x"]}, "a data entry"),
])
def test_run_env_compare_refuses_a_record_of_another_shape(tmp_path, old, why):
    (tmp_path / "run").mkdir()
    (tmp_path / "old.json").write_text(json.dumps(old))
    res = subprocess.run([sys.executable, RUN_ENV, str(tmp_path / "run"), "--python", sys.executable, "--cwd",
                          str(tmp_path), "--compare", str(tmp_path / "old.json")], capture_output=True, text=True,
                         timeout=300, env=env_for(tmp_path))
    assert res.returncode == 2 and why in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert not (tmp_path / "run" / "env.json").exists(), "nothing is recorded from a bad request"


# ---------------------------------------------------------------- N7: a stdout-only trainer

STDOUT_JOB = '''import sys
for step in range(12):
    print("iter %d: loss %.4f, time 3.1ms" % (step, 4.0 / (1 + 0.5 * step)), flush=True)
    if step % 4 == 0:
        print("step %d: train loss %.4f, val loss %.4f" % (step, 3.0 - 0.1 * step, 3.5 - 0.1 * step), flush=True)
'''
ITER_RX = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"
EVAL_RX = r"step (?P<step>\d+): train loss (?P<train_loss>[\d.]+), val loss (?P<val_loss>[\d.]+)"


def stdout_only_run(tmp_path):
    """nanoGPT-like: the job's numbers are only in its stdout, which the launcher keeps as the run dir's job.log
    (with a supervisor line in it)."""
    proj = committed_project(tmp_path, STDOUT_JOB)
    run_dir = tmp_path / "runs" / "nano"
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "job.py"]
    out = subprocess.run(cmd, cwd=str(proj), capture_output=True, text=True, timeout=60).stdout
    (run_dir / "job.log").write_text("[rgt 12:00:00] starting: python3 job.py\n" + out)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "nano", "cmd": cmd, "cwd": str(proj)}))
    res = subprocess.run([sys.executable, RUN_ENV, str(run_dir), "--cwd", str(proj), "--timeout", "60"],
                         capture_output=True, text=True, timeout=300, env=env_for(tmp_path))
    assert res.returncode == 0, res.stderr
    return run_dir


def test_finding_field_N7_repro_takes_the_log_regex_of_run_forensics_for_a_stdout_only_trainer(tmp_path):
    run_dir = stdout_only_run(tmp_path)
    refused = repro(run_dir, "-o", tmp_path / "repro.sh")
    assert refused.returncode == 3 and "--log-regex" in refused.stderr, refused.stderr
    res = repro(run_dir, "-o", tmp_path / "repro.sh", "--log-regex", ITER_RX, "--log-regex", EVAL_RX, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["log_regex"] == [ITER_RX, EVAL_RX] and doc["claims"] == 12, doc   # loss, train_loss, val_loss x 4
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 0 and "REPRODUCED" in done.stdout, done.stdout + done.stderr
    got = [json.loads(line) for line in (tmp_path / "w" / "steps" / "job.log.1.jsonl").read_text().splitlines()]
    assert [p["step"] for p in got] == list(range(12))


def test_finding_field_N7_a_log_number_that_differs_is_caught(tmp_path):
    run_dir = stdout_only_run(tmp_path)
    log = run_dir / "job.log"
    log.write_text(log.read_text().replace("iter 11: loss 0.6154", "iter 11: loss 0.5154"))
    assert repro(run_dir, "-o", tmp_path / "repro.sh", "--log-regex", ITER_RX).returncode == 0
    done = run_script(tmp_path / "repro.sh", tmp_path / "w", tmp_path)
    assert done.returncode == 1 and "DIFFERS" in done.stdout, done.stdout + done.stderr


def test_finding_laptop_L11_a_newline_in_the_run_dir_name_never_becomes_a_command(tmp_path):
    """A run folder named with newlines and a command (a shared archive, someone else's pull): repro.sh holds
    the path only as one quoted word, never in a comment, so running the script runs nothing of the name."""
    _proj, run_dir = hand_recorded(tmp_path)
    hostile = run_dir.parent / "x\ntouch PWNED_L11\n#"
    os.rename(run_dir, hostile)
    script = tmp_path / "repro.sh"
    res = repro(hostile, "-o", script, "--allow-unpinned")
    assert res.returncode == 0, res.stderr
    body = script.read_text()
    assert not [line for line in body.splitlines() if line.startswith("#") and "PWNED" in line]
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=60).returncode == 0
    subprocess.run(["bash", str(script), str(tmp_path / "w")], capture_output=True, text=True, timeout=600,
                   env=env_for(tmp_path), cwd=str(tmp_path))
    assert not (tmp_path / "PWNED_L11").exists(), "a line of the run dir's name ran as a command"
    assert "ORIG_RUN=%s" % shlex.quote(str(hostile)) in body


# ---------------------------------------------------------------- red-team round 3 findings


PY = sys.executable


from conftest import run_no_traceback as run  # noqa: E402


# ---------------------------------------------------------------------------------------------- repro.py

METRICS_JOB = r'''
import argparse, json
p = argparse.ArgumentParser()
p.add_argument("--metrics")
p.add_argument("--out")
a = p.parse_args()
with open(a.metrics, "w") as fh:
    for step in range(6):
        fh.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\n")
if a.out:
    open(a.out, "w").write("weights of the RE-RUN\n")
'''


def recorded_run(tmp_path, cmd_tail, metrics_lines=None):
    """A git project with job.py, and a run dir recorded by the real run_env.py, as a launch leaves it."""
    proj = committed_project(tmp_path, METRICS_JOB)
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    cmd = [PY, "job.py", "--metrics", str(run_dir / "metrics.jsonl")] + cmd_tail
    assert subprocess.run(cmd, cwd=str(proj), timeout=60).returncode == 0
    if metrics_lines is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics_lines))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": cmd, "cwd": str(proj)}))
    res = run([PY, RUN_ENV, run_dir, "--python", PY, "--cwd", proj])
    assert res.returncode == 0, res.stderr
    return proj, run_dir


@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
def test_repro_out_never_overwrites_evidence(tmp_path):
    _proj, run_dir = recorded_run(tmp_path, [])
    before = (run_dir / "run.json").read_bytes()
    res = run([PY, REPRO, run_dir, "-o", run_dir / "run.json"])
    assert (run_dir / "run.json").read_bytes() == before and res.returncode != 0, res.stdout + res.stderr


@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
def test_repro_warns_before_rerun_overwrites_outside_outputs(tmp_path):
    outside = tmp_path / "outputs" / "model.txt"
    outside.parent.mkdir()
    proj, run_dir = recorded_run(tmp_path, ["--out=%s" % outside])
    outside.write_text("weights of the ORIGINAL run\n")
    res = run([PY, REPRO, run_dir, "-o", tmp_path / "repro.sh", "--json"])
    assert res.returncode == 0, res.stderr
    warned = [w for w in json.loads(res.stdout)["warnings"] if str(outside) in w]
    done = subprocess.run(["bash", str(tmp_path / "repro.sh"), str(tmp_path / "w")], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, RGT_PY=PY))
    assert done.returncode == 0, done.stdout + done.stderr
    assert warned or outside.read_text() == "weights of the ORIGINAL run\n", (warned, outside.read_text())


@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
def test_repro_of_a_resumed_run_counts_each_step_once(tmp_path):
    # attempt 1 logged steps 0..4 and died; attempt 2 resumed from the step-2 checkpoint and logged 3..5
    # again: identical numbers, as a deterministic resume gives
    lines = [{"step": s, "loss": 1.0 / (s + 1)} for s in range(5)] + [{"step": s, "loss": 1.0 / (s + 1)}
                                                                     for s in range(3, 6)]
    _proj, run_dir = recorded_run(tmp_path, [], metrics_lines=lines)
    res = run([PY, REPRO, run_dir, "-o", tmp_path / "repro.sh"])
    assert res.returncode == 0, res.stderr
    done = subprocess.run(["bash", str(tmp_path / "repro.sh"), str(tmp_path / "w")], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, RGT_PY=PY))
    assert done.returncode == 0 and "REPRODUCED" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


# ---------------------------------------------------------------- laptop 6, 8, 9: repro.sh from a hostile record

def hostile_run(tmp_path):
    """A run dir whose records were written by someone else: a cwd holding shell syntax, "seeds" that are not
    seeds, and a presigned URL with a user:password in the command."""
    run_dir = tmp_path / "hostile"
    run_dir.mkdir()
    cwd = '%s/proj"; touch %s/PWNED_CWD; echo "' % (tmp_path, tmp_path)
    url = "https://alice:SECRETPW@data.example.com/set.tar?X-Amz-Signature=SECRETSIG"
    (run_dir / "run.json").write_text(json.dumps({"run_id": "h1", "cmd": ["python3", "-c", "print(1)", url],
                                                  "cwd": cwd}))
    (run_dir / "env.json").write_text(json.dumps({
        "git": {"error": "not a git work tree"}, "cwd": cwd,
        "seeds": {"SEED": "1", "LD_PRELOAD": str(tmp_path / "evil.so"), "BASH_ENV": str(tmp_path / "evil.sh"),
                  "PATH": str(tmp_path / "evilbin")}}))
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n')
    return run_dir


def test_finding_laptop_6_repro_quotes_the_recorded_cwd(tmp_path):
    run_dir = hostile_run(tmp_path)
    script = tmp_path / "repro.sh"
    res = run_py(SCRIPTS / "repro.py", run_dir, "-o", script, "--allow-unpinned")
    assert res.returncode == 0, res.stdout + res.stderr
    (tmp_path / "runs").mkdir()
    env = dict(os.environ, RGT_HOME=str(REPO))
    subprocess.run(["bash", str(script), str(tmp_path / "work")], cwd=tmp_path / "runs", env=env,
                   capture_output=True, text=True, timeout=120)
    assert not (tmp_path / "PWNED_CWD").exists(), "repro.sh ran shell code taken from run.json's cwd"
    assert "touch" in script.read_text()   # the cwd is still named, as data


def test_finding_laptop_8_repro_exports_only_seed_variables(tmp_path):
    run_dir = hostile_run(tmp_path)
    script = tmp_path / "repro.sh"
    res = run_py(SCRIPTS / "repro.py", run_dir, "-o", script, "--allow-unpinned")
    assert res.returncode == 0, res.stdout + res.stderr
    exports = [line for line in script.read_text().splitlines() if line.startswith("export ")]
    assert exports == ["export SEED=1"], exports
    assert "BASH_ENV" in res.stdout and "LD_PRELOAD" in res.stdout and "NOT exported" in res.stdout


def test_finding_laptop_9_no_url_credential_in_repro_or_the_core_records(tmp_path):
    """The core's one redaction rule (rgt_core.scrub_urls/url_secrets) takes the user:password and the
    signature out; repro.sh, which copies the recorded command, never carries them."""
    sys.path.insert(0, str(NODE))
    import rgt_core
    url = "https://alice:SECRETPW@data.example.com/set.tar?X-Amz-Signature=SECRETSIG"
    argv = ["python3", "train.py", "--data-url", url, "--lr", "0.1"]
    assert rgt_core.url_secrets(argv) == [url]
    assert rgt_core.scrub_record({"cmd": argv}) == {"cmd": argv[:3] + ["https://data.example.com/set.tar",
                                                                       "--lr", "0.1"]}
    line = "[rgt 12:00:00] starting: python3 train.py --data-url '%s'" % url
    assert "SECRET" not in rgt_core.scrub_urls(line)
    run_dir = hostile_run(tmp_path)
    script = tmp_path / "repro.sh"
    res = run_py(SCRIPTS / "repro.py", run_dir, "-o", script, "--allow-unpinned")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SECRET" not in script.read_text()
    assert "URL credential" in res.stdout
