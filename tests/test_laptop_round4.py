"""Round 4 of the laptop side and custody (issue 28): every finding of
../shared/reports/redteam-2026-12-03-laptop.md, design review B4/B5, the field test's R9-R18 (R15 is the
node watchers' and lives with them) and a newcomer's walk-through, each with the test that reproduces it.

Real parts: an sshd on 127.0.0.1 (tests/sshd_fixture.py), real rsync and tar. Where a node must misbehave
(stall, lie about a size), a small stand-in for ssh plays that node and the test says so.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NODE, REPO, SCRIPTS, wait_for
from sshd_fixture import sshd_server  # noqa: F401  (the real sshd on 127.0.0.1)

SKILL = "remote-gpu-trainer"
RGT = SCRIPTS / "rgt.py"


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


# ---------------------------------------------------------------- laptop 2: install_skill --link --force

def test_finding_laptop_2_link_force_never_deletes_the_checkout_it_runs_from(tmp_path):
    """The README's git-clone install, then `install_skill.py --agent claude --link --force` from inside it:
    the checkout (its .git and the user's own files) must survive, and no self-pointing link is made."""
    home = tmp_path / "home"
    clone = home / ".claude" / "skills" / SKILL
    clone.mkdir(parents=True)
    for item in ("SKILL.md", "LICENSE", "README.md", "SECURITY.md", "references", "profiles", "scripts",
                 "examples"):
        src = REPO / item
        if src.is_dir():
            shutil.copytree(src, clone / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, clone / item)
    assert subprocess.run(["git", "init", "-q", str(clone)], capture_output=True).returncode == 0
    (clone / "MYNOTES.txt").write_text("uncommitted notes\n")
    env = dict(os.environ, HOME=str(home))
    for extra in (["--agent", "claude"], []):
        res = run_py(clone / "scripts" / "install_skill.py", *extra, "--link", "--force", env=env, cwd=clone)
        assert "Traceback" not in res.stderr, res.stderr
        assert "SKIP" in res.stdout and "this checkout itself" in res.stdout, res.stdout + res.stderr
        assert clone.is_dir() and not clone.is_symlink()
        assert (clone / ".git").is_dir() and (clone / "MYNOTES.txt").read_text() == "uncommitted notes\n"
    # the shared folder had no install: it gets a link to the checkout, which resolves
    shared = home / ".agents" / "skills" / SKILL
    assert shared.is_symlink() and shared.resolve() == clone.resolve()


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


def test_finding_laptop_9_the_node_records_the_launch_scrubbed_and_runs_it_raw(box):
    """run_one.sh with a presigned URL in the job's argv: run.json (cmd, launch_argv), job.log and the synced
    results never carry the credential; the job and a replay get the raw argv from a 0600 file in the run dir."""
    url = "https://alice:SECRETPW@data.example.com/set.tar?X-Amz-Signature=SECRETSIG"
    job = [sys.executable, "-c", "import sys; open('argv.txt', 'w').write(sys.argv[1])", url]
    res = box.launch("secret", job, "--no-deadman", "--output", "argv.txt", "--wait", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = box.run_dir("secret")
    assert (box.work / "argv.txt").read_text() == url                       # the job got it word for word
    run = json.loads((run_dir / "run.json").read_text())
    assert "SECRET" not in json.dumps(run["cmd"]) and "SECRET" not in json.dumps(run["launch_argv"])
    assert "https://data.example.com/set.tar" in run["cmd"]
    assert "SECRET" not in (run_dir / "job.log").read_text()
    raw = run_dir / ".launch-argv.json"
    assert raw.stat().st_mode & 0o777 == 0o600 and url in json.loads(raw.read_text())["cmd"]
    results = box.durable / "results" / "secret"
    leaked = [p for p in results.rglob("*") if p.is_file() and p.name != "argv.txt" and b"SECRET" in p.read_bytes()]
    assert not leaked and not (results / ".launch-argv.json").exists(), leaked
    sys.path.insert(0, str(NODE))
    import boot_resume
    assert url in boot_resume.replay_argv(run)                              # a replay runs the real launch


# ---------------------------------------------------------------- laptop 7: render_job pastes request text raw

@pytest.mark.parametrize("target", ["slurm", "k8s-job", "pytorchjob", "skypilot"])
@pytest.mark.parametrize("bad", [
    {"resources": {"partition": "gpu\ntouch PWNED_PARTITION"}},
    {"resources": {"account": "lab\ntouch PWNED_ACCOUNT"}},
    {"env": {"X=1; touch PWNED_ENVKEY; Y": "v"}},
    {"env": {"OK": "v\ntouch PWNED_ENVVAL"}},
    {"outputs": {"durable_dir": "/mnt/my data"}},
], ids=["partition", "account", "env-key", "env-value-newline", "durable-dir-blank"])
def test_finding_laptop_7_render_job_refuses_text_that_would_run_as_shell(tmp_path, target, bad):
    from render_fixture import SCHEMA, render, request
    path = request(tmp_path, **bad)
    res = render(path, target, check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stdout + res.stderr
    assert "PWNED" not in res.stdout and "Traceback" not in res.stderr
    try:
        import jsonschema
    except ImportError:
        return
    if "OK" in bad.get("env", {}):
        return   # a newline in an env value is the renderer's check; the schema pins names and #SBATCH words
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(path.read_text()), json.loads(SCHEMA.read_text()))


# ---------------------------------------------------------------- laptop 10, 11: a node that stalls or lies
# A stand-in for ssh plays the node here (a stalled link cannot be made on demand with the real sshd without
# timing games): it runs `cat` and `command -v` locally, and misbehaves on the transfer itself, as FAKE_MODE says.

FAKE_SSH = r'''
import os, subprocess, sys, tarfile, time
args = sys.argv[1:]
while args and args[0].startswith("-"):       # ssh options, if any
    args = args[2:] if args[0] in ("-F", "-p", "-i", "-o", "-l") else args[1:]
host, command = args[0], " ".join(args[1:])
mode = os.environ["FAKE_MODE"]
if command.startswith(("cat ", "command -v")):
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
if command.startswith("rsync"):               # rsync's server side never answers
    sys.stdin.buffer.read()
    sys.exit(0)
if command.startswith("python3 - --run-state"):   # is a run still running: answered by this machine
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
if command.startswith("python3 -"):           # the gate's re-hash: reads the program, then hangs
    sys.stdin.buffer.read()
    time.sleep(600)
    sys.exit(1)
sys.stdin.buffer.read()                       # the tar transport: the list of wanted files
info = tarfile.TarInfo(os.environ["FAKE_MEMBER"])
info.size = int(os.environ["FAKE_SIZE"])
out = sys.stdout.buffer
out.write(info.tobuf(format=tarfile.PAX_FORMAT))
if mode == "stall":                           # part of the member's data, then nothing
    out.write(b"x" * (info.size // 2))
    out.flush()
    time.sleep(600)
else:                                         # "huge": as many zeros as the header claims
    chunk = b"\0" * (1 << 20)
    for _ in range(info.size // len(chunk)):
        out.write(chunk)
out.flush()
'''


@pytest.fixture
def fake_node(tmp_path):
    """A results dir with a real manifest, and the ssh stand-in that serves it."""
    results = tmp_path / "node" / "results" / "fk1"
    (results / "out").mkdir(parents=True)
    (results / "out" / "final.json").write_text('{"ok": 1}')
    res = run_py(NODE / "build_pull_manifest.py", "--root", results, "--run-id", "fk1", "--roster", "out/*")
    assert res.returncode == 0, res.stderr
    fake = tmp_path / "fake_ssh.py"
    fake.write_text(FAKE_SSH)
    return results, "%s %s" % (sys.executable, fake)


def pull(results, rsh, dest, mode, *extra, member="./out/final.json", size=9):
    env = dict(os.environ, FAKE_MODE=mode, FAKE_MEMBER=member, FAKE_SIZE=str(size))
    return run_py(SCRIPTS / "pull_verified.py", "--source", "box:%s" % results, "--dest", dest, "--rsh", rsh,
                  "--stall-seconds", "2", *extra, env=env, timeout=300)


def test_finding_laptop_10_a_stalled_pull_or_gate_ends_in_one_line_and_can_resume(tmp_path, fake_node):
    results, rsh = fake_node
    dest = tmp_path / "pulled"
    res = pull(results, rsh, dest, "stall", "--transport", "tar")     # the header matches the manifest
    assert res.returncode == 1 and "STALLED: the node sent nothing for 2 s" in res.stdout, res.stdout + res.stderr
    assert (dest / ".staging-fk1").is_dir() and not (dest / "fk1").exists()   # kept for the next run
    if shutil.which("rsync"):
        res = pull(results, rsh, dest, "stall", "--transport", "rsync")
        assert res.returncode == 1 and "STALLED" in res.stdout, res.stdout + res.stderr
    # the gate's re-hash: the node reads the program and then says nothing
    pulled = tmp_path / "good"
    ok = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", pulled)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    env = dict(os.environ, FAKE_MODE="stall", FAKE_MEMBER="x", FAKE_SIZE="0")
    gate = run_py(SCRIPTS / "teardown_gate.py", "--pulled", pulled / "fk1", "--source", "box:%s" % results,
                  "--rsh", rsh, "--profile", "vastai", "--stall-seconds", "2", env=env, timeout=300)
    assert gate.returncode == 3 and "the node stopped answering: no output for 2 s" in gate.stdout, \
        gate.stdout + gate.stderr


def test_finding_laptop_11_a_tar_member_larger_than_the_manifest_is_never_written(tmp_path, fake_node):
    results, rsh = fake_node
    dest = tmp_path / "pulled"
    res = pull(results, rsh, dest, "huge", "--transport", "tar", size=64 << 20)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL size" in res.stdout and "the manifest says 9" in res.stdout, res.stdout
    biggest = max((p.stat().st_size for p in dest.rglob("*") if p.is_file() and p != dest / ".gitignore"),
                  default=0)
    assert biggest <= 9, "a %d-byte file landed on the laptop for a 9-byte manifest entry" % biggest


# ---------------------------------------------------------------- newcomer 3: what a pull leaves behind

def test_finding_newcomer_3_a_pull_leaves_no_lock_and_stays_out_of_git(tmp_path, fake_node):
    results, _rsh = fake_node
    project = tmp_path / "project"
    project.mkdir()
    assert subprocess.run(["git", "init", "-q", str(project)], capture_output=True).returncode == 0
    res = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", "pulled", cwd=project)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (project / "pulled" / "fk1" / "out" / "final.json").is_file()
    assert sorted(p.name for p in (project / "pulled").iterdir()) == [".gitignore", "fk1"]   # no .pull-fk1.lock
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True)
    assert status.stdout == "", status.stdout          # pulled/ is not offered for a commit
    again = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", "pulled", cwd=project)
    assert again.returncode == 0 and "ALREADY" in again.stdout
    assert "pulled/" in (REPO / ".gitignore").read_text().split()   # nor in this checkout, where the README runs


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


# ---------------------------------------------------------------- laptop 13 (field R10), laptop 14 (review B4)

def test_finding_laptop_13_and_field_R10_the_pasteable_sweep_line_expands_tilde(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import teardown_gate
    word = teardown_gate.runs_dir_of("gpu:~/rgt/results/exp1")
    line = teardown_gate.SWEEP_HINT % ("exp1", word)
    assert "'~" not in line
    home = tmp_path / "nodehome"
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + word], capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)))
    assert out.stdout == "%s/rgt/runs\n" % home, out.stdout
    spaced = teardown_gate.runs_dir_of("gpu:~/my dur/results/exp1")
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + spaced], capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)))
    assert out.stdout == "%s/my dur/runs\n" % home, out.stdout


@pytest.mark.parametrize("profile", ["lambda", "china"])
def test_finding_laptop_14_and_review_B4_launch_without_a_durable_dir_says_pass_one(tmp_path, profile):
    res = run_py(RGT, "--ledger", tmp_path / "ledger.jsonl", "launch", "gpu-box", "--profile", profile,
                 "--run-id", "lam1", "--", "true")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "profile %s has no default durable dir" % profile in res.stderr and "--durable-dir" in res.stderr
    assert "in the ledger" not in res.stderr


# ---------------------------------------------------------------- over the real sshd

def rgt(tmp_path, server, *args, timeout=300, ledger=None, env=None):
    """rgt.py as the user runs it against the test sshd (its own node-bin and ledger under TMP_PATH)."""
    base = [sys.executable, str(RGT), "--ssh-config", str(server.config), "--node-dir", str(tmp_path / "node-bin"),
            "--ledger", str(ledger or tmp_path / "ledger.jsonl")]
    env = dict(env or os.environ)
    env.pop("RGT_PROFILE_INDEX", None)
    return subprocess.run(base + list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)


def state_of(tmp_path, server, rid, **kw):
    res = rgt(tmp_path, server, "--json", "status", "gpu-box", rid, **kw)
    try:
        return json.loads(res.stdout)
    except ValueError:
        return {}


# attempt 1 saves a checkpoint and fails (its outputs are synced and verified); later attempts wait on a file
RESUMABLE_JOB = (
    "import os, sys, time\n"
    "os.makedirs('ckpt', exist_ok=True)\n"
    "if '--resume' not in sys.argv:\n"
    "    open('ckpt/state.txt', 'w').write('step 40\\n'); print('step 40/100', flush=True); sys.exit(1)\n"
    "print('resumed from', sys.argv[-1], flush=True)\n"
    "print('step 50/100', flush=True)\n"
    "t = time.monotonic()\n"
    "while not os.path.exists('go') and time.monotonic() - t < 300: time.sleep(0.1)\n"
    "print('step 60/100', flush=True)\n"
    "while not os.path.exists('done') and time.monotonic() - t < 300: time.sleep(0.1)\n"
    "open('ckpt/state.txt', 'w').write('step 100\\n'); print('step 100/100', flush=True)\n")


def launch_resumable(tmp_path, server, rid, durable, work):
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(RESUMABLE_JOB)
    assert rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt(tmp_path, server, "launch", "gpu-box", "--profile", "vastai", "--run-id", rid, "--durable-dir",
              durable, "--cwd", work, "--", "--output", "ckpt/*", "--deadman-dry-run", "--poll-seconds", "0.2",
              "--resume-glob", "ckpt/state.txt", "--resume-arg", "--resume {}",
              "--progress-regex", r"step (?P<step>\d+)/(?P<total>\d+)", "--", "python3", "-u", "job.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: state_of(tmp_path, server, rid).get("status") == "failed", 120)
    assert (durable / "results" / rid / "ckpt" / "state.txt").read_text() == "step 40\n"   # synced, verified


def test_finding_field_R9_resume_names_the_durable_copy_it_will_really_use(tmp_path, sshd_server):  # noqa: F811
    durable, work = tmp_path / "durable", tmp_path / "work"
    launch_resumable(tmp_path, sshd_server, "r9", durable, work)
    (work / "ckpt" / "state.txt").write_bytes(b"")            # torn to 0 bytes, as a preemption mid-save leaves it
    dry = rgt(tmp_path, sshd_server, "resume", "gpu-box", "r9", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    line = next(l for l in dry.stdout.splitlines() if l.startswith("resume:"))
    assert "verified durable copy %s" % (durable / "results" / "r9" / "ckpt" / "state.txt") in line, line
    assert (work / "ckpt" / "state.txt").read_bytes() == b""  # a dry run puts nothing back


def end_runs(durable):
    """Disarm every dead-man of the runs under DURABLE and end their processes, by recorded pid only."""
    sys.path.insert(0, str(NODE))
    import rgt_core
    import signal
    for run_dir in sorted((durable / "runs").glob("*")) if (durable / "runs").is_dir() else []:
        subprocess.run([sys.executable, str(NODE / "deadman.py"), "ack", "--run-dir", str(run_dir), "--disarm"],
                       capture_output=True, timeout=60)
        for name in ("status.json", "deadman.json"):
            try:
                doc = json.loads((run_dir / name).read_text())
            except (OSError, ValueError):
                continue
            for pid_key, ident_key in (("job_pid", "job_identity"), ("supervisor_pid", "supervisor_identity"),
                                       ("pid", "identity")):
                pid = doc.get(pid_key)
                if isinstance(pid, int) and rgt_core.record_alive(doc.get(ident_key), pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        if shutil.which("tmux"):
            subprocess.run(["tmux", "-L", "rgt-" + run_dir.name.replace(".", "_"), "kill-server"],
                           capture_output=True)


@pytest.fixture
def durable(tmp_path):
    folder = tmp_path / "durable"
    yield folder
    end_runs(folder)


def test_finding_laptop_1_the_gate_refuses_while_a_resumed_attempt_runs(tmp_path, sshd_server, durable):  # noqa: F811
    work = tmp_path / "work"
    launch_resumable(tmp_path, sshd_server, "res2", durable, work)
    resumed = rgt(tmp_path, sshd_server, "resume", "gpu-box", "res2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert wait_for(lambda: state_of(tmp_path, sshd_server, "res2").get("step") == 50, 120)
    pulled = rgt(tmp_path, sshd_server, "pull", "gpu-box", "res2")           # attempt 1's synced results
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    gate = rgt(tmp_path, sshd_server, "gate", "gpu-box", "res2")
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "REASON running" in gate.stdout and "attempt 2 is running" in gate.stdout, gate.stdout
    assert "PASS" not in gate.stdout
    ledger = json.loads(rgt(tmp_path, sshd_server, "--json", "ledger").stdout)
    assert [(r["run_id"], r["gate"]) for r in ledger["runs"]] == [("res2", "REFUSED")]
    patrol = rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert "res2 RUNNING" in patrol.stdout, patrol.stdout
    (work / "go").write_text("")
    (work / "done").write_text("")
    assert wait_for(lambda: state_of(tmp_path, sshd_server, "res2").get("status") == "succeeded", 120)
    after = rgt(tmp_path, sshd_server, "gate", "gpu-box", "res2")
    assert "REASON running" not in after.stdout, after.stdout   # over: only the stale pull is left to fix


def test_finding_laptop_1_a_gate_pass_is_reopened_by_a_later_live_attempt(tmp_path):
    """The ledger's fold: a status or patrol row that sees an attempt newer than the gated one, or a run that
    runs again, puts the run back on the list (and patrol looks at it again)."""
    rows = [{"event": "launch", "host": "box", "run_id": "r1", "attempt": 1, "state": "launched", "run_dir": "/d"},
            {"event": "gate", "host": "box", "run_id": "r1", "attempt": 1, "verdict": "PASS"},
            {"event": "status", "host": "box", "run_id": "r1", "attempt": 1, "state": "succeeded"}]
    path = tmp_path / "ledger.jsonl"
    for extra, listed in (([], []), ([{"event": "status", "host": "box", "run_id": "r1", "attempt": 2,
                                       "state": "running"}], ["r1"]),
                          ([{"event": "patrol", "host": "box", "run_id": "r1", "attempt": 1,
                             "state": "syncing"}], ["r1"])):
        path.write_text("".join(json.dumps(dict(r, time="2026-12-03T00:00:0%dZ" % i)) + "\n"
                                for i, r in enumerate(rows + extra)))
        res = run_py(RGT, "--ledger", path, "--json", "ledger")
        assert [r["run_id"] for r in json.loads(res.stdout)["runs"]] == listed, (extra, res.stdout)


# ---------------------------------------------------------------- laptop 4, 5: the ledger on a full or read-only disk

def limited(size):
    """A preexec_fn: files may not grow past SIZE bytes (a disk that fills mid-write), SIGXFSZ ignored so the
    write comes back short (or EFBIG) as it does on a full disk."""
    def apply():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_finding_laptop_4_a_short_write_never_tears_a_ledger_row(tmp_path):
    path = tmp_path / "ledger.jsonl"
    first = json.dumps({"event": "push", "host": "otherbox", "time": "2026-12-03T16:46:58Z"}) + "\n"
    path.write_text(first)
    code = ("import sys; sys.path.insert(0, %r); import rgt\n"
            "try:\n"
            "    rgt.ledger_append(%r, event='launch', host='gpu', run_id='torn3', state='launched', attempt=1,\n"
            "                      run_dir='~/dur/runs/torn3')\n"
            "except OSError as exc:\n"
            "    print('refused:', exc)\n" % (str(SCRIPTS), str(path)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=limited(len(first) + 40))
    assert "refused:" in res.stdout, res.stdout + res.stderr   # the short write is an error, not a silent 0
    assert path.read_text() == first                             # and it was undone: no torn row is left
    # a row torn earlier (a crash mid-write: no newline at the end) never swallows the next one
    path.write_text(first + '{"event": "launch", "host": "gpu", "run_id": "torn1", "run_d')
    for rid in ("torn3", "torn4"):
        res = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import rgt; "
                              "rgt.ledger_append(%r, event='launch', host='gpu', run_id=%r, state='launched', "
                              "attempt=1, run_dir='/d/runs/x')" % (str(SCRIPTS), str(path), rid)],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
    listed = run_py(RGT, "--ledger", path, "ledger")
    assert "torn3" in listed.stdout and "torn4" in listed.stdout, listed.stdout
    assert "WARN ledger line 2 is not a whole row" in listed.stdout and "torn1" in listed.stdout
    assert listed.returncode == 1      # the list may be missing a run: said, never a quiet OK
    doc = json.loads(run_py(RGT, "--ledger", path, "--json", "ledger").stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["torn3", "torn4"] and doc["torn_rows"][0]["line"] == 2


def test_finding_laptop_5_an_unwritable_ledger_never_hides_what_the_node_did(tmp_path, sshd_server, durable):  # noqa: F811
    work = tmp_path / "work"
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    blocked = tmp_path / "state-is-a-file"
    blocked.write_text("")   # XDG_STATE_HOME/remote-gpu-trainer cannot be made: as unwritable as a read-only disk
    common = ["--profile", "local", "--durable-dir", durable, "--cwd", work, "--", "--deadman-dry-run", "--wait",
              "--poll-seconds", "0.2", "--", "python3", "-c", "print('step 1/1')"]
    bad_ledger = blocked / "remote-gpu-trainer" / "ledger.jsonl"
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "ro2", *common, ledger=bad_ledger)
    assert res.returncode == 12 and "cannot be written" in res.stderr and "nothing was started" in res.stderr, \
        res.stdout + res.stderr   # exit 12 since issue 35: a launch the ledger cannot record (test_laptop_round5_runs)
    assert not (durable / "runs" / "ro2").exists()               # checked before the node acted
    # the ledger fills up after its first row (written before the node acts): the launch is reported in full,
    # with a WARN, exit 0, and that first row lists the run
    scratch = tmp_path / "scratch.jsonl"       # the size of that first row, from a launch of the same shape
    assert rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "ro4", *common, ledger=scratch).returncode == 0
    first = len(next(l for l in scratch.read_text().splitlines(True) if '"launching"' in l).encode())
    ledger = tmp_path / "full.jsonl"
    ledger.write_text(json.dumps({"event": "push", "host": "x", "time": "2026-12-03T00:00:00Z"}) + "\n")
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
            str(tmp_path / "node-bin"), "--ledger", str(ledger)]
    res = subprocess.run(base + ["launch", "gpu-box", "--run-id", "ro3", *map(str, common)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, preexec_fn=limited(ledger.stat().st_size + first + 4))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "run id:     ro3" in res.stdout and "watch:" in res.stdout
    assert "WARN could not record this launch" in res.stderr and "unexpected" not in res.stderr
    assert json.loads((durable / "runs" / "ro3" / "status.json").read_text())["state"] == "succeeded"
    assert "ro3" in run_py(RGT, "--ledger", ledger, "ledger").stdout
    # read-only commands do their work and keep their own exit code
    status = rgt(tmp_path, sshd_server, "status", "gpu-box", "ro3", "--durable-dir", durable, ledger=bad_ledger)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stdout + status.stderr
    assert "WARN could not record this status" in status.stderr


# ---------------------------------------------------------------- laptop 3, review B5: which box is which

@pytest.fixture
def second_sshd(sshd_server, tmp_path):  # noqa: F811
    """Box B: a second sshd on another port of the same user@127.0.0.1 (how a gateway hands out boxes), with
    box A's keys, so one client config reaches both as `-p PORT user@127.0.0.1`."""
    import tempfile
    from sshd_fixture import SshdServer
    base = Path(tempfile.mkdtemp(prefix="rgt-b-"))   # short: the ssh control socket path has a length limit
    for name in ("host_ed25519", "host_ed25519.pub", "client_ed25519", "client_ed25519.pub"):
        shutil.copy2(sshd_server.base / name, base / name)
    server = SshdServer(base, sshd_server.sshd, sshd_server.ssh, sshd_server.keygen).start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


def gateway_config(tmp_path, a, b, alias_port=None):
    """An ssh config that reaches both boxes as USER@127.0.0.1 -p PORT, and `gpu` at ALIAS_PORT."""
    known = tmp_path / "known_gateway"
    key = (a.base / "host_ed25519.pub").read_text().split()
    known.write_text("".join("[127.0.0.1]:%d %s %s\n" % (s.port, key[0], key[1]) for s in (a, b)))
    lines = []
    if alias_port:
        lines += ["Host gpu", "  HostName 127.0.0.1", "  Port %d" % alias_port]
    lines += ["Host *", "  IdentityFile %s" % (a.base / "client_ed25519"), "  IdentitiesOnly yes",
              "  UserKnownHostsFile %s" % known, "  GlobalKnownHostsFile /dev/null", "  StrictHostKeyChecking yes",
              "  BatchMode yes", "  LogLevel ERROR", ""]
    path = tmp_path / ("gateway_%s.cfg" % (alias_port or "plain"))
    path.write_text("\n".join(lines))
    return path


def rgt_at(tmp_path, config, *args, port=None):
    base = [sys.executable, str(RGT), "--ssh-config", str(config), "--node-dir", str(tmp_path / "node-bin"),
            "--ledger", str(tmp_path / "ledger.jsonl")] + (["-p", str(port)] if port else [])
    env = dict(os.environ)
    env.pop("RGT_PROFILE_INDEX", None)
    return subprocess.run(base + list(map(str, args)), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)


def test_finding_laptop_3_and_review_B5_two_boxes_at_one_address_stay_two(tmp_path, sshd_server, second_sshd,
                                                                            durable):  # noqa: F811
    import getpass
    user = getpass.getuser()
    a, b = sshd_server, second_sshd
    cfg = gateway_config(tmp_path, a, b)
    host = "%s@127.0.0.1" % user
    for box in (a, b):
        res = rgt_at(tmp_path, cfg, "push", host, "--transport", "tar", port=box.port)
        assert res.returncode == 0, res.stdout + res.stderr
    boxes = json.loads(rgt_at(tmp_path, cfg, "--json", "ledger").stdout)["boxes_without_runs"]
    assert sorted(x["box"] for x in boxes) == sorted("%s:%d" % (host, s.port) for s in (a, b))   # two, not one
    # the same run id on both: box A's runs on, box B's ends and passes the gate
    work_a, work_b = tmp_path / "work-a", tmp_path / "work-b"
    work_a.mkdir()
    hold = ("import os, time\nt = time.monotonic()\n"
            "while not os.path.exists('release') and time.monotonic() - t < 300: time.sleep(0.1)\n"
            "os.makedirs('ckpt', exist_ok=True); open('ckpt/final.json', 'w').write('{}')\n")
    (work_a / "job.py").write_text(hold)
    for box, work, job in ((a, work_a, ["python3", "job.py"]),
                           (b, work_b, ["python3", "-c", "import os; os.makedirs('ckpt', exist_ok=True); "
                                                         "open('ckpt/final.json', 'w').write('{}')"])):
        res = rgt_at(tmp_path, cfg, "launch", host, "--profile", "vastai", "--run-id", "exp3", "--durable-dir",
                     durable / str(box.port), "--cwd", work, "--", "--output", "ckpt/*", "--deadman-dry-run",
                     "--poll-seconds", "0.2", "--", *job, port=box.port)
        assert res.returncode == 0, res.stdout + res.stderr
    assert wait_for(lambda: rgt_at(tmp_path, cfg, "status", host, "exp3", port=b.port).returncode == 0, 120)
    assert rgt_at(tmp_path, cfg, "pull", host, "exp3", port=b.port).returncode == 0
    gate = rgt_at(tmp_path, cfg, "gate", host, "exp3", port=b.port)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    runs = json.loads(rgt_at(tmp_path, cfg, "--json", "ledger").stdout)["runs"]
    assert [(r["run_id"], r["box"]) for r in runs] == [("exp3", "%s:%d" % (host, a.port))], runs   # A still bills
    assert "exp3" in rgt_at(tmp_path, cfg, "patrol", host, "--min-free-gb", "0", port=a.port).stdout
    (work_a / "release").write_text("")
    # an alias re-pointed at another box: a push through it lists that box, and the ledger says what moved
    for port in (a.port, b.port):
        res = rgt_at(tmp_path, gateway_config(tmp_path, a, b, alias_port=port), "push", "gpu", "--transport", "tar")
        assert res.returncode == 0, res.stdout + res.stderr
    listed = rgt_at(tmp_path, cfg, "ledger")
    assert "NOTE gpu now reaches %s:%d" % (host, b.port) in listed.stdout, listed.stdout
    assert "(pushed, no run)" in listed.stdout and "%s:%d" % (host, b.port) in listed.stdout   # B bills again


def test_finding_laptop_3_a_new_machine_at_an_old_address_is_a_new_box(tmp_path):
    """A gateway port handed to another instance: same address, another /etc/machine-id at push."""
    rows = [{"event": "push", "host": "gw", "box": "root@gw:4000", "machine_id": "a" * 32},
            {"event": "launch", "host": "gw", "box": "root@gw:4000", "run_id": "r1", "attempt": 1,
             "state": "launched", "run_dir": "/d/runs/r1"},
            {"event": "gate", "host": "gw", "box": "root@gw:4000", "run_id": "r1", "attempt": 1, "verdict": "PASS"},
            {"event": "push", "host": "gw", "box": "root@gw:4000", "machine_id": "b" * 32}]
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(dict(r, time="2026-12-03T00:00:0%dZ" % i)) + "\n" for i, r in enumerate(rows)))
    doc = json.loads(run_py(RGT, "--ledger", path, "--json", "ledger").stdout)
    assert [(x["box"], x["machine_id"]) for x in doc["boxes_without_runs"]] == [("root@gw:4000", "b" * 32)]
    assert any("NOTE gw now reaches root@gw:4000 [machine bbbb" in n for n in doc["notes"]), doc["notes"]


# ---------------------------------------------------------------- field R14, R17: node_probe

STUB_TORCH = ("__version__ = '9.9.9+stub'\n"
              "class cuda:\n"
              "    is_available = staticmethod(lambda: False)\n"
              "    device_count = staticmethod(lambda: 0)\n"
              "class version:\n"
              "    cuda = None\n")


def test_finding_field_R14_probe_checks_torch_in_the_jobs_python(tmp_path):
    """A stand-in torch (a stub module, said here) lives only on the job's interpreter path: --python finds it
    there; the probe's own python is not what the job runs."""
    site = tmp_path / "site" / "torch"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(STUB_TORCH)
    job_py = tmp_path / "venv" / "bin" / "python"
    job_py.parent.mkdir(parents=True)
    job_py.write_text('#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' % (tmp_path / "site", sys.executable))
    job_py.chmod(0o755)
    res = run_py(NODE / "node_probe.py", "--python", job_py, "--torch", "--json", "--gpu-timeout", "1")
    assert res.returncode == 0, res.stderr
    torch = json.loads(res.stdout)["torch"]
    assert torch["installed"] is True and torch["version"] == "9.9.9+stub" and torch["python"] == str(job_py)
    assert torch["cuda_available"] is False
    human = run_py(NODE / "node_probe.py", "--python", job_py, "--gpu-timeout", "1")
    assert str(job_py) in human.stdout
    bad = run_py(NODE / "node_probe.py", "--python", tmp_path / "nope", "--json")
    assert bad.returncode == 2 and "--python" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_finding_field_R17_probe_help_names_every_host_network_contacts(tmp_path):
    sys.path.insert(0, str(NODE))
    import node_probe
    res = run_py(NODE / "node_probe.py", "--help")
    flat = " ".join(res.stdout.split())
    for host in node_probe.DEFAULT_TARGETS:
        assert host in flat, host
    assert "443" in flat


# ---------------------------------------------------------------- newcomer 1, 2: the README's walk-through

def readme_walkthrough():
    text = (REPO / "README.md").read_text()
    block = text.split("## Use it without an agent", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = []
    for line in block.strip().splitlines():
        line = line.split(" # ", 1)[0].strip()
        for part in line.replace("&&", ";").split(";"):
            if part.strip().startswith("$R "):
                lines.append(part.strip()[3:])
    return text, lines


def test_finding_newcomer_1_the_readme_walkthrough_runs_on_a_plain_ssh_box(tmp_path, sshd_server, durable):  # noqa: F811
    """Each `$R ...` line of the README, as written, against the test sshd (a plain box, not a Pod): HOST is the
    test alias, '~/proj' a folder of this test, and launch gets --durable-dir here (its home is this machine's)."""
    import shlex
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    _text, lines = readme_walkthrough()
    launch = next(l for l in lines if l.startswith("launch "))
    profile = shlex.split(launch)[shlex.split(launch).index("--profile") + 1]
    durable_default = sys.modules["rgt_core"].profile_defaults(profile).get("DURABLE_DIR") or ""
    assert durable_default.startswith(("~/", os.path.expanduser("~") + "/")), \
        "the README launches with --profile %s, whose durable dir %r is not on every ssh box" % (profile, durable_default)
    assert cli  # the CLI the README names is this one
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("import os\nos.makedirs('ckpt', exist_ok=True)\n"
                                   "open('ckpt/final.json', 'w').write('{}')\nprint('step 1/1')\n")
    for line in lines:
        words = [w.replace("HOST", "gpu-box") for w in shlex.split(line)]
        words = [str(work) if w == "~/proj" else w for w in words]
        if words[0] == "launch":
            cut = words.index("--")
            words[cut:cut] = ["--durable-dir", str(durable)]
            words[words.index("--", cut + 2) + 1:words.index("--", cut + 2) + 1] = ["--deadman-dry-run", "--wait"]
        res = rgt(tmp_path, sshd_server, *words)
        if words[0] == "status":
            ok = res.returncode == 0 and "SUCCEEDED" in res.stdout
        elif words[0] == "resume":
            ok = res.returncode == 3 and "succeeded" in res.stdout   # nothing to resume: it says so
        else:
            ok = res.returncode == 0
        assert ok, (line, res.returncode, res.stdout, res.stderr)
    assert (tmp_path / "pulled" / "exp1" / "ckpt" / "final.json").is_file()


def test_finding_newcomer_2_the_readme_says_where_pulls_and_the_ledger_land(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    text, _lines = readme_walkthrough()
    dest = cli.build_parser().parse_args(["pull", "h", "r1"]).dest
    assert "./%s/RID/" % dest in text                     # pull's default --dest, as the README names it
    env = dict(os.environ)
    env.pop("XDG_STATE_HOME", None)
    default = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import rgt; "
                              "print(rgt.ledger_path())" % str(SCRIPTS)], capture_output=True, text=True,
                             env=env).stdout.strip()
    assert default.replace(os.path.expanduser("~"), "~") in text
    assert "$XDG_STATE_HOME/remote-gpu-trainer/ledger.jsonl" in text


# ---------------------------------------------------------------- field R16: lifecycle.md teaches rgt.py launch

def test_finding_field_R16_lifecycle_teaches_rgt_launch_and_the_143_hint(tmp_path):
    doc = (REPO / "references" / "run-remote" / "lifecycle.md").read_text()
    assert "still suggests fixing" not in doc
    phase3 = doc.split("## Phase 3", 1)[1].split("\n## ", 1)[0]
    first_block = phase3.split("```bash", 1)[1].split("```", 1)[0]
    assert first_block.strip().startswith("python3 scripts/rgt.py launch"), first_block
    assert "no ledger row" in phase3
    drill = doc.split("Then the drill", 1)[1].split("**Check**", 1)[0]
    assert "$R launch" in drill and "$R resume" in drill and "run_one.sh" not in drill
    # what the doc says of exit 143 is what run_status.py's hint says
    sys.path.insert(0, str(NODE))
    import run_status
    src = (NODE / "run_status.py").read_text()
    assert "rgt.py resume" in src and "rgt.py resume" in drill + doc.split("drill-a` ends", 1)[1][:400]
    assert run_status  # imported: the hint lives there
    # every rgt.py line the doc shows parses as the CLI's own syntax
    import shlex
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    shown = [l for l in doc.replace("\\\n", " ").splitlines() if "scripts/rgt.py launch" in l or l.startswith("$R ")]
    assert shown
    for line in shown:
        words = shlex.split(line.split(" # ", 1)[0].replace("$R ", "python3 scripts/rgt.py "))
        words = words[words.index("scripts/rgt.py") + 1:]
        argv = words[:words.index("--")] if "--" in words else words
        cli.build_parser().parse_args([w.replace("$", "") for w in argv])   # a usage error raises SystemExit
