"""scripts/rgt.py, the laptop CLI, end to end against a real sshd on 127.0.0.1 (GUIDE §6, §8).

push -> probe -> launch -> status -> logs -> pull -> gate -> ledger, with the tar transport and
(where rsync exists) rsync; hostile arguments travel as data; the ledger lists what may still bill.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import NODE, SCRIPTS, end_runs_under, need, path_without, wait_for
from laptop_fixture import durable  # noqa: F401
from sshd_fixture import rgt, rgt as run_rgt

RGT = SCRIPTS / "rgt.py"


@pytest.fixture(autouse=True)
def end_remote_runs(tmp_path):
    """The runs launched on the 'node' arm dry-run dead-men that watch until their grace: end them afterwards."""
    yield
    end_runs_under(tmp_path)


@pytest.mark.parametrize("transport", ["tar", "rsync"])
def test_push_copies_and_verifies_the_toolkit(tmp_path, sshd_server, transport):
    if transport == "rsync":
        need("rsync")
    res = rgt(tmp_path, sshd_server, "--json", "push", "gpu-box", "--transport", transport)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    stamp = json.loads((NODE / "VERSION.json").read_text())
    assert out["version"] == stamp["version"] and out["transport"] == transport
    for name in stamp["files"]:
        assert (tmp_path / "node-bin" / name).read_bytes() == (NODE / name).read_bytes()
    assert (tmp_path / "node-bin" / "index.json").is_file()


def test_push_refuses_to_leave_a_mixed_toolkit_unnoticed(tmp_path, sshd_server):
    """A node copy that does not match its stamp fails the push's version check."""
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    with open(tmp_path / "node-bin" / "rgt_core.py", "a") as fh:
        fh.write("# edited on the node\n")
    res = sshd_server.run(f"python3 {tmp_path}/node-bin/rgt_core.py --version")
    assert res.returncode == 3 and "not one version" in res.stderr


@pytest.mark.parametrize("bare", [False, True], ids=["with-rsync", "no-rsync-no-tmux"])
def test_the_whole_chain_over_ssh(tmp_path, sshd_server, bare):
    """The SKILL.md chain end to end; `bare` runs it with rsync and tmux hidden from the laptop side."""
    # sshd gives the node side its own PATH, so only the laptop side is bare here; the launcher's
    # setsid fallback on a bare node is proven by tests/test_demo.py.
    if bare:
        os.environ["PATH"], saved = path_without(tmp_path / "bin", "rsync", "tmux"), os.environ["PATH"]
    try:
        chain(tmp_path, sshd_server, bare)
    finally:
        if bare:
            os.environ["PATH"] = saved


def test_the_whole_chain_on_a_node_without_rsync_tar_or_tmux(tmp_path, bare_node_sshd):
    """A minimal container (python3 and a shell only) behind sshd, reached from a laptop without rsync or
    tmux: push and pull pick the tar stream by themselves, python3 makes it on the node, the job runs
    under setsid, and every byte still verifies."""
    os.environ["PATH"], saved = path_without(tmp_path / "bin", "rsync", "tmux"), os.environ["PATH"]
    try:
        chain(tmp_path, bare_node_sshd, bare=True, bare_node=True)
    finally:
        os.environ["PATH"] = saved


def chain(tmp_path, server, bare, bare_node=False):
    sshd_server = server
    durable, work = tmp_path / "durable", tmp_path / "work"
    pushed = rgt(tmp_path, sshd_server, "--json", "push", "gpu-box", *(() if bare_node else ("--transport", "tar")))
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert json.loads(pushed.stdout)["transport"] == "tar"
    assert json.loads(pushed.stdout)["node_tar"] == ("python3" if bare_node else "tar")
    probe = rgt(tmp_path, sshd_server, "--json", "probe", "gpu-box", "--profile", "local", "--",
                "--data-dir", str(work), "--durable-dir", str(durable), "--gpu-timeout", "2")
    assert probe.returncode == 0, probe.stderr
    assert "disks" in json.loads(probe.stdout)

    hostile = "it's $(touch PWNED) `touch PWNED2` \"quoted\" ; echo no"
    job = ("import os,sys; os.makedirs('out', exist_ok=True); "
           "open('out/result.txt','w').write(sys.argv[1]); print('step 1/1')")
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "cli-1",
              "--durable-dir", str(durable), "--cwd", str(work), "--rate-per-hour", "1.5", "--",
              "--output", "out/*", "--deadman-dry-run", "--wait", "--poll-seconds", "0.2", "--",
              "python3", "-c", job, hostile)
    assert res.returncode == 0, res.stdout + res.stderr
    for field in ("run id:", "watch:", "ETA:", "cost:", "teardown:"):
        assert field in res.stdout
    watch = next(line for line in res.stdout.splitlines() if line.startswith("watch:")).split(None, 1)[1]
    env = {k: v for k, v in os.environ.items() if k != "RGT_PROFILE_INDEX"}
    again = subprocess.run(watch, shell=True, cwd=str(SCRIPTS.parent), capture_output=True, text=True, timeout=120,
                           env=env)
    assert again.returncode == 0 and "SUCCEEDED" in again.stdout, (watch, again.stdout, again.stderr)  # pasteable
    assert ("detach:   setsid" in res.stdout) == bare_node  # no tmux on the node: its own session instead
    assert (work / "out" / "result.txt").read_text() == hostile  # the argument arrived as one word
    assert not list(tmp_path.rglob("PWNED*")) and not (work / "PWNED").exists()

    status = rgt(tmp_path, sshd_server, "--json", "status", "gpu-box", "cli-1")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "succeeded"
    logs = rgt(tmp_path, sshd_server, "logs", "gpu-box", "cli-1", "--lines", "50")
    assert logs.returncode == 0 and "step 1/1" in logs.stdout

    ledger = rgt(tmp_path, sshd_server, "--json", "ledger")
    assert [r["run_id"] for r in json.loads(ledger.stdout)["runs"]] == ["cli-1"]  # not through the gate yet
    assert "NOT GATED (no meter)" in rgt(tmp_path, sshd_server, "ledger").stdout  # --profile local: no platform meter

    pulled = tmp_path / "pulled"
    res = rgt(tmp_path, sshd_server, "pull", "gpu-box", "cli-1", "--dest", str(pulled))
    assert res.returncode == 0, res.stdout + res.stderr
    assert ("(rsync)" if shutil.which("rsync") and not bare else "(tar)") in res.stderr
    assert ("tar stream made by python3" in res.stdout) == bare_node

    assert (pulled / "cli-1" / "out" / "result.txt").read_text() == hostile
    res = rgt(tmp_path, sshd_server, "gate", "gpu-box", "cli-1", "--dest", str(pulled))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "final_sweep.py --runs-dir %s/runs" % durable in res.stdout  # the box's own runs dir, not a placeholder
    swept = rgt(tmp_path, sshd_server, "--json", "sweep", "gpu-box")   # the runs dir comes from the ledger
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert [(r["run_id"], r["verdict"]) for r in json.loads(swept.stdout)["runs"]] == [("cli-1", "OK")]

    ledger = rgt(tmp_path, sshd_server, "--json", "ledger")
    assert json.loads(ledger.stdout)["runs"] == []  # through the gate: no longer listed
    assert "cli-1" in rgt(tmp_path, sshd_server, "ledger", "--all").stdout
    events = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("attempt")) for e in events if e.get("run_id")] == \
        [("launch_pending", None), ("launch", 1), ("status", 1), ("pull", 1), ("gate", 1)]
    assert [e["state"] for e in events if e["event"] == "sweep"] == ["all saved"]


def test_a_relaunched_attempt_after_a_gate_pass_is_listed_again(tmp_path):
    """The ledger folds events in order: a resume that launched after a gate PASS bills again."""
    path = tmp_path / "ledger.jsonl"
    rows = [{"event": "launch", "host": "box", "run_id": "r1", "attempt": 1, "state": "launched"},
            {"event": "gate", "host": "box", "run_id": "r1", "attempt": 1, "verdict": "PASS"},
            {"event": "resume", "host": "box", "run_id": "r1", "attempt": 2, "state": "launched"}]
    for n in (2, 3):
        path.write_text("".join(json.dumps(dict(r, time="2026-12-0%dT00:00:00Z" % i)) + "\n"
                                for i, r in enumerate(rows[:n], 1)))
        res = subprocess.run([sys.executable, str(RGT), "--ledger", str(path), "--json", "ledger"],
                             capture_output=True, text=True, timeout=60)
        runs = json.loads(res.stdout)["runs"]
        assert [(r["run_id"], r["attempt"]) for r in runs] == ([] if n == 2 else [("r1", 2)])


def test_a_pushed_box_without_a_run_is_listed_as_possibly_billing(tmp_path, sshd_server):
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt(tmp_path, sshd_server, "ledger")
    assert "MAY STILL BE BILLING" in res.stdout and "gpu-box" in res.stdout


@pytest.mark.parametrize("args,fragment", [
    (["status", "gpu-box", "no-such-run"], "no launch of run"),
    (["resume", "gpu-box", "no-such-run"], "no launch of run"),
    (["status", "gpu;box", "r1"], "not an ssh alias"),
    (["status", "-oProxyCommand=x", "r1"], "rgt.py: error:"),  # never reaches ssh as an option
    (["launch", "gpu-box", "--profile", "local", "--run-id", "bad id!", "--", "true"], "run id"),
    (["launch", "gpu-box", "--profile", "local", "--run-id", "r2"], "no job command"),
    (["status", "gpu-box", "r1", "--", "x"], "only for probe and launch"),
    ([], "give a command"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    res = subprocess.run([sys.executable, str(RGT), "--ledger", str(tmp_path / "l.jsonl"), *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and fragment in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr


def test_remote_words_keep_tilde_and_quote_everything():
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    assert cli.remote_word("~/rgt-bin/run_one.sh") == '"$HOME"/rgt-bin/run_one.sh'
    assert cli.remote_word("$(reboot)") == "'$(reboot)'"
    line = cli.remote_command(["echo", "a b", "~"], cwd="/tmp/x y")
    out = subprocess.run(["bash", "-c", line.replace("mkdir -p '/tmp/x y' && cd '/tmp/x y' && ", "")],
                         capture_output=True, text=True, env=dict(os.environ, HOME="/home/someone"))
    assert out.stdout == "a b /home/someone\n"
    assert shutil.which("bash")


def test_patrol_reports_every_open_run_in_one_round_trip_and_escalates(tmp_path, sshd_server):
    durable, work = tmp_path / "durable", tmp_path / "work"
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    common = ["--profile", "local", "--durable-dir", str(durable), "--cwd", str(work)]
    ok = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "good-1", *common, "--",
             "--deadman-dry-run", "--wait", "--poll-seconds", "0.2", "--", "true")
    assert ok.returncode == 0, ok.stderr
    res = rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("OK patrol gpu-box: 1 run(s)") and "good-1 SUCCEEDED" in res.stdout
    assert 2 <= len(res.stdout.strip().splitlines()) <= 5

    bad = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--run-id", "bad-1", *common, "--",
              "--deadman-dry-run", "--wait", "--poll-seconds", "0.2", "--", "python3", "-c", "import sys; sys.exit(3)")
    assert bad.returncode == 3, bad.stderr
    res = rgt(tmp_path, sshd_server, "--json", "patrol", "gpu-box", "--min-free-gb", "0")
    assert res.returncode == 10, res.stdout + res.stderr
    verdict = {r["run_id"]: r for r in json.loads(res.stdout)["runs"]}
    assert verdict["bad-1"]["escalate"] and "failed" in verdict["bad-1"]["why"]
    assert not verdict["good-1"]["escalate"]
    res = rgt(tmp_path, sshd_server, "patrol", "gpu-box", "good-1", "--min-free-gb", "1000000")
    assert res.returncode == 10 and "disk" in res.stdout  # disk headroom below the floor escalates


def test_resume_refuses_a_live_attempt_then_relaunches_as_attempt_two(tmp_path, sshd_server):
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    (work / "hold").write_text("")
    (work / "fail").write_text("")
    job = ("import os,time\n"
           "t = time.monotonic()\n"
           "while os.path.exists('hold') and time.monotonic() - t < 300: time.sleep(0.1)\n"
           "if os.path.exists('fail'): raise SystemExit('attempt failed on purpose')\n"
           "os.makedirs('out', exist_ok=True); open('out/result.txt', 'w').write('done')\n")
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "res-1",
              "--durable-dir", str(durable), "--cwd", str(work), "--",
              "--output", "out/*", "--deadman-dry-run", "--poll-seconds", "0.2", "--", "python3", "-c", job)
    assert res.returncode == 0, res.stdout + res.stderr

    def state():
        return json.loads(rgt(tmp_path, sshd_server, "--json", "status", "gpu-box", "res-1").stdout).get("status")

    live = rgt(tmp_path, sshd_server, "resume", "gpu-box", "res-1")
    assert live.returncode == 3 and "still live" in live.stdout, live.stdout + live.stderr
    assert "WARN" not in live.stdout  # a refusal says why, not what a resume would do
    (work / "hold").unlink()
    assert wait_for(lambda: state() == "failed", 120)
    (work / "fail").unlink()
    dry = rgt(tmp_path, sshd_server, "resume", "gpu-box", "res-1", "--dry-run")
    # no resume adapters were given at launch: the user is told the job starts over
    assert dry.returncode == 0 and "WARN the launch recorded no --resume-glob/--resume-arg" in dry.stdout, dry.stdout
    again = rgt(tmp_path, sshd_server, "--json", "resume", "gpu-box", "res-1")
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["attempt"] == 2
    assert wait_for(lambda: state() == "succeeded", 120)
    status = json.loads((durable / "runs" / "res-1" / "status.json").read_text())
    assert status["attempt"] == 2 and (work / "out" / "result.txt").read_text() == "done"
    events = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(e["attempt"], e["state"]) for e in events if e["event"] == "resume"] == \
        [(1, "resume_refused"), (2, "launched")]
    assert [e["attempt"] for e in events if e["event"] == "launch"] == [1]
    assert {e["attempt"] for e in events if e["event"] == "status"} <= {1, 2}
    ledger = json.loads(rgt(tmp_path, sshd_server, "--json", "ledger").stdout)
    assert [(r["run_id"], r["attempt"]) for r in ledger["runs"]] == [("res-1", 2)]



def test_finding_field_R2_resume_over_ssh_refuses_a_restart_that_supersedes_verified_outputs(tmp_path, sshd_server):
    """A run with no resume adapter and verified outputs: `rgt.py resume` refuses in one line that names what its
    restart from step 0 would supersede; with --force-restart it relaunches and the node keeps them as a
    generation, which the gate names."""
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    (work / "model.txt").write_text("model at 6.71% correct")
    job = ("import shutil, sys, os\nos.makedirs('out', exist_ok=True)\nshutil.copy('model.txt', 'out/model.bin')\n"
           "sys.exit(1 if '6.71' in open('model.txt').read() else 0)\n")   # the good model's attempt failed
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "nores-1",
              "--durable-dir", str(durable), "--cwd", str(work), "--", "--output", "out/*", "--deadman-dry-run",
              "--wait", "--poll-seconds", "0.2", "--", "python3", "-c", job)
    assert res.returncode == 1, res.stdout + res.stderr          # the job failed; its outputs are verified
    kept = durable / "generations" / "nores-1" / "1"

    refused = rgt(tmp_path, sshd_server, "resume", "gpu-box", "nores-1")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert len(refused.stdout.strip().splitlines()) == 1, refused.stdout       # one line: the reason
    line = refused.stdout.strip()
    assert line.startswith("FAIL nores-1: refused (") and "no resume adapter" in line, line
    assert "out/model.bin" in line and "--force-restart" in line and str(kept) in line, line
    assert not kept.exists()
    assert json.loads((durable / "runs" / "nores-1" / "status.json").read_text())["attempt"] == 1

    (work / "model.txt").write_text("untrained model, 0.18% correct")
    forced = rgt(tmp_path, sshd_server, "resume", "gpu-box", "nores-1", "--force-restart")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "generation: attempt 1's verified outputs are kept in %s" % kept in forced.stdout, forced.stdout

    def state():
        return json.loads(rgt(tmp_path, sshd_server, "--json", "status", "gpu-box", "nores-1").stdout).get("status")
    assert wait_for(lambda: state() == "succeeded", 120)
    status = json.loads((durable / "runs" / "nores-1" / "status.json").read_text())
    assert status["attempt"] == 2 and status["sync"]["kept_generation"]["dir"] == str(kept), status["sync"]
    assert (kept / "out" / "model.bin").read_text() == "model at 6.71% correct"
    assert (durable / "results" / "nores-1" / "out" / "model.bin").read_text() == "untrained model, 0.18% correct"

    pulled = tmp_path / "pulled"
    assert rgt(tmp_path, sshd_server, "pull", "gpu-box", "nores-1", "--dest", str(pulled)).returncode == 0
    # the untrained attempt-2 model never passes alone while the good generation 1 is only on the node (N3)
    gate = rgt(tmp_path, sshd_server, "gate", "gpu-box", "nores-1", "--dest", str(pulled))
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "REASON generation: generation 1: generation 1 (attempt 1's verified results, kept in %s because attempt 2 " \
           "had no resume adapter" % kept in gate.stdout, gate.stdout
    assert "rgt.py pull gpu-box nores-1 --generation N" in gate.stdout, gate.stdout
    got = rgt(tmp_path, sshd_server, "pull", "gpu-box", "nores-1", "--dest", str(pulled), "--generation", "1")
    assert got.returncode == 0, got.stdout + got.stderr
    assert (pulled / "nores-1@generation-1" / "out" / "model.bin").read_text() == "model at 6.71% correct"
    gate = rgt(tmp_path, sshd_server, "gate", "gpu-box", "nores-1", "--dest", str(pulled), "--keep-generation", "1")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "verified generation 1 (the results of attempt 1), the one you chose to keep" in gate.stdout, gate.stdout
    assert "DESTROYED by a teardown: generation 2 (the current results, attempt 2's)" in gate.stdout, gate.stdout
    rows = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(r["verdict"], r.get("keep_generation")) for r in rows if r["event"] == "gate"] == \
        [("REFUSED", None), ("PASS", 1)]


def test_a_node_without_the_toolkit_gets_one_clear_line(tmp_path, sshd_server):
    """Nothing pushed yet: the node's python3 finds no run_status.py, and the user is told so in one line."""
    res = rgt(tmp_path, sshd_server, "status", "gpu-box", "r1", "--durable-dir", str(tmp_path / "durable"))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "rgt.py: error: run_status.py on gpu-box gave no JSON" in res.stderr


def test_an_unknown_host_exits_255_with_a_hint(tmp_path, sshd_server):
    res = rgt(tmp_path, sshd_server, "status", "no-such-alias.invalid", "r1", "--durable-dir", str(tmp_path / "d"))
    assert res.returncode == 255 and "ssh could not reach the node" in res.stderr, res.stderr


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


@pytest.mark.parametrize("profile", ["lambda", "china"])
def test_finding_laptop_14_and_review_B4_launch_without_a_durable_dir_says_pass_one(tmp_path, profile):
    res = run_py(RGT, "--ledger", tmp_path / "ledger.jsonl", "launch", "gpu-box", "--profile", profile,
                 "--run-id", "lam1", "--", "true")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "profile %s has no default durable dir" % profile in res.stderr and "--durable-dir" in res.stderr
    assert "in the ledger" not in res.stderr


# ---------------------------------------------------------------- over the real sshd

def state_of(tmp_path, server, rid, **kw):
    res = run_rgt(tmp_path, server, "--json", "status", "gpu-box", rid, **kw)
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
    assert run_rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = run_rgt(tmp_path, server, "launch", "gpu-box", "--profile", "vastai", "--run-id", rid, "--durable-dir",
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
    dry = run_rgt(tmp_path, sshd_server, "resume", "gpu-box", "r9", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    line = next(l for l in dry.stdout.splitlines() if l.startswith("resume:"))
    assert "verified durable copy %s" % (durable / "results" / "r9" / "ckpt" / "state.txt") in line, line
    assert (work / "ckpt" / "state.txt").read_bytes() == b""  # a dry run puts nothing back


def test_finding_laptop_1_the_gate_refuses_while_a_resumed_attempt_runs(tmp_path, sshd_server, durable):  # noqa: F811
    work = tmp_path / "work"
    launch_resumable(tmp_path, sshd_server, "res2", durable, work)
    resumed = run_rgt(tmp_path, sshd_server, "resume", "gpu-box", "res2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert wait_for(lambda: state_of(tmp_path, sshd_server, "res2").get("step") == 50, 120)
    pulled = run_rgt(tmp_path, sshd_server, "pull", "gpu-box", "res2")           # attempt 1's synced results
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    gate = run_rgt(tmp_path, sshd_server, "gate", "gpu-box", "res2")
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "REASON running" in gate.stdout and "attempt 2 is running" in gate.stdout, gate.stdout
    assert "PASS" not in gate.stdout
    ledger = json.loads(run_rgt(tmp_path, sshd_server, "--json", "ledger").stdout)
    assert [(r["run_id"], r["gate"]) for r in ledger["runs"]] == [("res2", "REFUSED")]
    patrol = run_rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert "res2 RUNNING" in patrol.stdout, patrol.stdout
    (work / "go").write_text("")
    (work / "done").write_text("")
    assert wait_for(lambda: state_of(tmp_path, sshd_server, "res2").get("status") == "succeeded", 120)
    after = run_rgt(tmp_path, sshd_server, "gate", "gpu-box", "res2")
    assert "REASON running" not in after.stdout, after.stdout   # over: only the stale pull is left to fix


# ---------------------------------------------------------------- laptop round 5 findings (issue 35)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quick_run(tmp_path, server, rid, durable, ledger=None):
    """A finished run on the node: launched through rgt.py, no dead-man, waited for."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    res = run_rgt(tmp_path, server, "launch", "gpu-box", "--profile", "local", "--run-id", rid,
                  "--durable-dir", durable, "--cwd", work, "--", "--no-deadman", "--wait", "--", "python3", "-c",
                  "print('step 1/1')", ledger=ledger)
    assert res.returncode == 0, res.stdout + res.stderr
    return durable / "runs" / rid


def pushed(tmp_path, server):
    res = run_rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stdout + res.stderr


# ---------------------------------------------------------------- L12: patrol and a run it cannot place

def test_finding_laptop_L12_patrol_reports_a_run_it_cannot_place_and_checks_the_others(
        tmp_path, sshd_server):  # noqa: F811
    durable = tmp_path / "durable"
    pushed(tmp_path, sshd_server)
    quick_run(tmp_path, sshd_server, "ok1", durable)
    # a run rgt.py did not launch (another ledger knew it), reached once with --durable-dir
    quick_run(tmp_path, sshd_server, "ext1", durable, ledger=tmp_path / "other-ledger.jsonl")
    ledger = tmp_path / "ledger.jsonl"
    res = run_rgt(tmp_path, sshd_server, "status", "gpu-box", "ext1", "--durable-dir", durable)
    assert res.returncode == 0 and "SUCCEEDED" in res.stdout, res.stdout + res.stderr
    row = rows(ledger)[-1]
    assert row["run_id"] == "ext1" and row["run_dir"] == str(durable / "runs" / "ext1"), row
    # an older rgt.py wrote status rows with no run dir: such a run is its own UNKNOWN line, never the end
    with open(ledger, "a") as handle:
        handle.write(json.dumps(dict(row, run_id="ghost1", run_dir=None, results_dir=None)) + "\n")
    patrol = run_rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert patrol.returncode == 10, patrol.stdout + patrol.stderr
    lines = patrol.stdout.splitlines()
    assert any(line.strip().startswith("ok1 SUCCEEDED") for line in lines), patrol.stdout
    assert any(line.strip().startswith("ext1 SUCCEEDED") for line in lines), patrol.stdout
    ghost = [line for line in lines if line.strip().startswith("ghost1 UNKNOWN")]
    assert ghost and "cannot locate run ghost1" in ghost[0] and "--durable-dir" in ghost[0], patrol.stdout
    doc = json.loads(run_rgt(tmp_path, sshd_server, "--json", "patrol", "gpu-box", "--min-free-gb", "0").stdout)
    assert {r["run_id"]: r["status"]["status"] for r in doc["runs"]} == {
        "ok1": "succeeded", "ext1": "succeeded", "ghost1": "unknown"}


# ---------------------------------------------------------------- N5: a confirmed and an unconfirmed stop

def test_finding_field_N5_patrol_tells_a_confirmed_stop_from_an_unconfirmed_one(tmp_path, sshd_server):  # noqa: F811
    durable = tmp_path / "durable"
    pushed(tmp_path, sshd_server)
    for rid, confirmed in (("fy", True), ("fn", False), ("fu", None)):
        run_dir = quick_run(tmp_path, sshd_server, rid, durable)
        # the dead-man's own record of a firing (deadman.py writes this shape): the stop ran, exit 0
        (run_dir / "DEADMAN_FIRED.json").write_text(json.dumps({
            "reason": "job_ended", "detail": "not acknowledged", "fired_at": "2026-12-05T10:00:00Z", "ok": True,
            "confirmed": confirmed, "dry_run": False, "attempts": [{"rc": 0}]}))
    patrol = run_rgt(tmp_path, sshd_server, "patrol", "gpu-box", "--min-free-gb", "0")
    assert patrol.returncode == 10, patrol.stdout + patrol.stderr
    line = {l.split()[0]: l for l in patrol.stdout.splitlines()[1:]}
    assert "STOP CONFIRMED" in line["fy"] and "NOT CONFIRMED" not in line["fy"], patrol.stdout
    assert "STOP NOT CONFIRMED" in line["fn"] and "STOP NOT CONFIRMED" in line["fu"], patrol.stdout
    strip = lambda text: text.replace(text.split()[0], "", 1)   # noqa: E731  (the run id aside)
    assert strip(line["fy"]) != strip(line["fn"])


# ---------------------------------------------------------------- N14: the interpreter record, per box

def test_finding_field_N14_the_recorded_interpreter_is_per_box_and_run_before_use(tmp_path, sshd_server):  # noqa: F811
    sys.path.insert(0, str(NODE))
    import rgt_core as core
    node_bin = tmp_path / "node-bin"
    pushed(tmp_path, sshd_server)
    mine = node_bin / core.interpreter_record_name()
    assert mine.is_file() and os.access(mine.read_text().strip(), os.X_OK), "push records this box's interpreter"
    log = tmp_path / "starts.log"

    def interpreter(name, code):
        path = tmp_path / name
        path.write_text('#!/bin/sh\necho "%s $*" >> %s\n%s\n' % (name, log, code))
        path.chmod(0o755)
        return path
    # another box on the same NFS home pushed last: its records (the old shared name, and its own key) name an
    # interpreter that exists here too, so only the key tells them apart
    other = interpreter("other-box-python", 'exec %s "$@"' % sys.executable)
    (node_bin / core.INTERPRETER_FILE).write_text("%s\n" % other)
    (node_bin / ("%s-otherbox-0123456789ab" % core.INTERPRETER_FILE)).write_text("%s\n" % other)
    res = run_rgt(tmp_path, sshd_server, "probe", "gpu-box")
    assert res.returncode in (0, 3), res.stdout + res.stderr        # 3: the box misses a gate; it ran here
    assert not log.exists(), "another box's interpreter ran here: %s" % log.read_text()
    # this box's record names an interpreter that no longer runs (a venv removed since): checked, python3 instead
    mine.write_text("%s\n" % interpreter("stale-python", "exit 127"))
    res = run_rgt(tmp_path, sshd_server, "probe", "gpu-box")
    assert res.returncode in (0, 3) and "node_probe" not in log.read_text(), res.stdout + res.stderr + log.read_text()
    assert log.read_text().startswith("stale-python -S -c"), log.read_text()   # it was run, as the check


# ---------------------------------------------------------------- review D4: the node derives the layout once

def test_finding_review_D4_a_durable_dir_in_the_nodes_environment_moves_no_result(tmp_path, ssh_sessions_allowed,
                                                                                   durable):
    """A DURABLE_DIR in the node's ssh environment once put the results where the ledger, pull and gate did not
    look. The laptop sends --durable-dir, the node derives the run's paths (runrec.layout) and answers in JSON,
    and the ledger records that answer: the results land in the durable dir asked for, and pull and gate find
    them there."""
    from sshd_fixture import SshdServer
    elsewhere = tmp_path / "node-env-durable"
    server = SshdServer(tmp_path / "sshd", os.path.abspath(need("sshd")), need("ssh"), need("ssh-keygen"),
                        node_env={"DURABLE_DIR": str(elsewhere)})
    (tmp_path / "sshd").mkdir()
    server.start()
    try:
        assert server.run("echo $DURABLE_DIR").stdout.strip() == str(elsewhere)   # the node's own setting
        pushed(tmp_path, server)
        work = tmp_path / "proj"
        work.mkdir()
        (work / "train.py").write_text("import os\nos.makedirs('ckpt', exist_ok=True)\n"
                                       "open('ckpt/final.json', 'w').write('{}')\nprint('step 1/1')\n")
        res = run_rgt(tmp_path, server, "--json", "launch", "gpu-box", "--profile", "generic-ssh", "--run-id", "d4",
                      "--durable-dir", durable, "--cwd", work, "--", "--output", "ckpt/*", "--deadman-dry-run",
                      "--wait", "--", "python3", "-u", "train.py")
        assert res.returncode == 0, res.stdout + res.stderr
        answer = json.loads(res.stdout)
        node_run = json.loads((durable / "runs" / "d4" / "run.json").read_text())
        assert answer["results_dir"] == node_run["results_dir"] == str(durable / "results" / "d4")
        assert answer["run_dir"] == str(durable / "runs" / "d4")
        assert (durable / "results" / "d4" / "ckpt" / "final.json").is_file()
        assert not elsewhere.exists(), sorted(str(p) for p in elsewhere.rglob("*"))
        launches = [r for r in rows(tmp_path / "ledger.jsonl") if r.get("event") == "launch"]
        assert [(r["run_dir"], r["results_dir"]) for r in launches] == [(answer["run_dir"], answer["results_dir"])]
        pulled = run_rgt(tmp_path, server, "pull", "gpu-box", "d4")
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        assert (tmp_path / "pulled" / "d4" / "ckpt" / "final.json").is_file()
        gate = run_rgt(tmp_path, server, "gate", "gpu-box", "d4")
        assert gate.returncode == 0 and "PASS" in gate.stdout, gate.stdout + gate.stderr
    finally:
        server.stop()


# ---------------------------------------------------------------- field N20: resume records before the node acts

def ledger_full_at(size):
    """A preexec_fn: no file may grow past SIZE bytes (a full laptop disk: the ledger's write comes back short)."""
    def apply():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_finding_field_N20_a_resume_the_ledger_cannot_record_is_refused_before_the_node_acts(tmp_path, sshd_server):
    """launch writes its first row before the node acts and refuses (12) when it cannot; resume only checked that
    the file opened (a full disk passed, the attempt ran unrecorded) and a folder it could not make was exit 2.
    Now resume writes its resume_pending row first: a ledger that cannot take it refuses with launch's code, one
    line, and the node is never asked (attempt 1 stays, no resume record)."""
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    ledger = tmp_path / "ledger.jsonl"
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "n20",
              "--durable-dir", str(durable), "--cwd", str(work), "--", "--deadman-dry-run", "--wait",
              "--poll-seconds", "0.2", "--", "python3", "-c", "raise SystemExit(1)")
    assert res.returncode == 1, res.stdout + res.stderr          # a failed attempt: resumable
    run_dir = durable / "runs" / "n20"
    before = ledger.read_bytes()
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
            str(tmp_path / "node-bin")]
    full = subprocess.run(base + ["--ledger", str(ledger), "resume", "gpu-box", "n20"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, preexec_fn=ledger_full_at(len(before)))
    blocked = tmp_path / "state-is-a-file"
    blocked.write_text("")
    gone = subprocess.run(base + ["--ledger", str(blocked / "ledger.jsonl"), "resume", "gpu-box", "n20",
                                  "--durable-dir", str(durable)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    for refused in (full, gone):
        assert refused.returncode == 12, refused.stdout + refused.stderr
        assert refused.stdout == "" and refused.stderr.count("\n") == 1, refused.stdout + refused.stderr
        assert "cannot be written" in refused.stderr and "nothing was started on gpu-box" in refused.stderr
    assert ledger.read_bytes() == before                            # no torn row either
    assert not (run_dir / "resume.json").exists() and not (run_dir / "previous").exists()
    assert json.loads((run_dir / "status.json").read_text())["attempt"] == 1
    ok = rgt(tmp_path, sshd_server, "--json", "resume", "gpu-box", "n20")   # a writable ledger: resumed, both rows
    assert ok.returncode == 0 and json.loads(ok.stdout)["attempt"] == 2, ok.stdout + ok.stderr
    events = [json.loads(line)["event"] for line in ledger.read_text().splitlines()]
    assert events[-2:] == ["resume_pending", "resume"], events


# ---------------------------------------------------------------- field N19: launch never reuses a run id

def test_finding_field_N19_rgt_launch_of_an_existing_run_id_is_refused_before_the_node_acts(tmp_path, sshd_server):
    """A second `rgt.py launch` with a run id already run on the box started attempt 2 behind the user's back.
    Now a run the ledger launched there is refused here (3, one line, no row: the run's own record is not
    marked failed), and one only the node knows (another laptop's ledger) is refused by the node's launcher
    (3, its line passed through): nothing started, the run dir unchanged, resume named as the way on."""
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    launch = ["launch", "gpu-box", "--profile", "local", "--run-id", "n19", "--durable-dir", str(durable), "--cwd",
              str(work), "--", "--deadman-dry-run", "--wait", "--poll-seconds", "0.2", "--"]
    assert rgt(tmp_path, sshd_server, *launch, "python3", "-c", "raise SystemExit(1)").returncode == 1
    run_dir, ledger = durable / "runs" / "n19", tmp_path / "ledger.jsonl"
    rows_before, status = ledger.read_bytes(), (run_dir / "status.json").read_bytes()
    record = (run_dir / "run.json").read_bytes()
    again = rgt(tmp_path, sshd_server, *launch, "python3", "-c", "open('ran', 'w')")
    assert again.returncode == 3, again.stdout + again.stderr
    assert again.stderr.count("\n") == 1 and "launched on gpu-box already" in again.stderr, again.stderr
    assert "attempt 1" in again.stderr and "rgt.py resume gpu-box n19" in again.stderr, again.stderr
    assert ledger.read_bytes() == rows_before
    other = subprocess.run([sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir",
                            str(tmp_path / "node-bin"), "--ledger", str(tmp_path / "other.jsonl")] + launch
                           + ["python3", "-c", "open('ran', 'w')"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path)
    assert other.returncode == 3, other.stdout + other.stderr
    assert "run n19 already exists in %s (attempt 1, failed)" % run_dir in other.stderr, other.stderr
    assert not (work / "ran").exists() and (run_dir / "status.json").read_bytes() == status
    # the run's record is untouched and no attempt 2 moved it aside (the dry-run dead-man still writes its lease
    # and log in its grace, so the folder's listing is no steady thing to compare)
    assert (run_dir / "run.json").read_bytes() == record and not (run_dir / "previous").exists()
    theirs = [(r["event"], r.get("state"), r.get("rc")) for r in map(json.loads, open(tmp_path / "other.jsonl"))]
    assert theirs == [("launch_pending", "launching", None), ("launch", "launch_failed", 3)], theirs
