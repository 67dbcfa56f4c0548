"""Resume adapters for training code we did not write (issue 11), with real PyTorch CPU and real
processes: a third-party-style trainer that resumes only when given `--resume PATH`, saves only on
its Ctrl-C path (SIGINT), and prints `step N/T` instead of writing a heartbeat."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import NODE, kill_everything_of, need_module, wait_for
from conftest import read_json as read

torch = need_module("torch")      # PyTorch (CPU) drives the third-party trainer

TRAINER = r'''
import argparse, os, sys, time, torch
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--resume", default=None)
args = parser.parse_args()
os.makedirs("out", exist_ok=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if args.resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); start = state["step"]
    print("resumed from step %d" % start, flush=True)
def save(step):
    tmp = "out/ckpt.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, "out/ckpt.pt")
step = start
try:
    while step < args.steps:
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        step += 1
        print("step %d/%d loss %.4f" % (step, args.steps, loss.item()), flush=True)
        if os.path.exists(os.environ["GATE_FILE"]) and step >= 5:
            time.sleep(0.05)          # the test holds it here until it has been preempted
        else:
            time.sleep(0.01)
except KeyboardInterrupt:          # this trainer's only clean-exit path
    save(step)
    print("interrupted: saved step %d" % step, flush=True)
    sys.exit(130)
save(step)
open("out/final.txt", "w").write("steps_done %d from %d\n" % (step, start))
'''

ADAPT = ["--stop-signal", "INT", "--resume-glob", "out/*.pt", "--resume-arg", "--resume {}",
         "--progress-regex", r"step (?P<step>\d+)/(?P<total>\d+)", "--no-deadman", "--output", "out/*"]


def status_json(run_dir):
    res = subprocess.run([sys.executable, str(NODE / "run_status.py"), str(run_dir), "--json", "--no-gpu"],
                         capture_output=True, text=True, timeout=60)
    return json.loads(res.stdout) if res.stdout.strip() else {}


@pytest.mark.drill("kill-9 mid-epoch resumes")
def test_third_party_trainer_preempted_and_resumed_as_attempt_two(tmp_path, box):  # noqa: F811
    (box.work / "train.py").write_text(TRAINER)
    gate = tmp_path / "hold"
    gate.write_text("hold")
    env = dict(box.env, GATE_FILE=str(gate))
    job = [sys.executable, "train.py", "--steps", "60"]
    argv = ["bash", str(NODE / "run_one.sh"), "--profile", "testbox", "--run-id", "tp", *ADAPT, "--", *job]
    first = subprocess.run(argv, cwd=str(box.work), env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    run_dir = box.run_dir("tp")
    # progress with no heartbeat: read from job.log by the regex
    assert wait_for(lambda: (status_json(run_dir).get("step") or 0) >= 5, 90)
    st = status_json(run_dir)
    assert st["progress_source"].startswith("job.log") and st["total_steps"] == 60 and st["attempt"] == 1
    assert read(run_dir / "status.json")["resume"] == {"from": None, "args": [], "skipped": []}  # fresh start

    # preemption: the supervisor gets SIGTERM and must pass the trainer its own signal, SIGINT
    os.kill(read(run_dir / "status.json")["supervisor_pid"], signal.SIGTERM)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") in ("failed", "succeeded", "sync_failed", "interrupted"), 90)
    log = (run_dir / "job.log").read_text()
    assert "forwarding SIGINT" in log and "interrupted: saved step" in log
    saved = torch.load(box.work / "out" / "ckpt.pt")["step"]
    assert 5 <= saved < 60
    # a newer but torn checkpoint must be skipped, never resumed from
    torn = box.work / "out" / "ckpt_newer.pt"
    torn.write_bytes(b"PK\x03\x04 cut off mid-save")
    os.utime(torn, (os.path.getmtime(box.work / "out" / "ckpt.pt") + 10,) * 2)

    gate.unlink()
    # attempt 2 is a resume (field N19: run_one.sh refuses a run id that already holds a run)
    code, second, err = boot_resume(env, "--run", run_dir)
    assert code == 0 and second["action"] == "resumed", (second, err)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") in ("failed", "succeeded", "sync_failed", "interrupted"), 120)
    status = read(run_dir / "status.json")
    assert status["attempt"] == 2 and status["resume"]["from"] == "out/ckpt.pt"
    assert status["resume"]["args"] == ["--resume", "out/ckpt.pt"]
    assert [s["path"] for s in status["resume"]["skipped"]] == ["out/ckpt_newer.pt"]
    assert (box.work / "out" / "final.txt").read_text() == "steps_done 60 from %d\n" % saved
    assert ("resumed from step %d" % saved) in (run_dir / "job.log").read_text()
    assert list((run_dir / "previous").iterdir()), "attempt 1's evidence was kept apart"


@pytest.mark.drill("kill-9 mid-save keeps last good")
@pytest.mark.drill("resume that cannot resume keeps durable output")
def test_a_torn_checkpoint_is_put_back_from_its_verified_durable_copy(tmp_path, box):  # noqa: F811
    """Preempted mid-save (or a container disk wiped by a restart): nothing good is left in the job's cwd, but
    the end-of-attempt sync kept a verified copy. The next attempt resumes from it instead of step 0, and the
    torn file is kept aside, not deleted."""
    (box.work / "train.py").write_text(TRAINER)
    gate = tmp_path / "hold"
    gate.write_text("hold")
    env = dict(box.env, GATE_FILE=str(gate))
    argv = ["bash", str(NODE / "run_one.sh"), "--profile", "testbox", "--run-id", "torn", *ADAPT, "--",
            sys.executable, "train.py", "--steps", "60"]
    assert subprocess.run(argv, cwd=str(box.work), env=env, capture_output=True, text=True,
                          timeout=120).returncode == 0
    run_dir = box.run_dir("torn")
    assert wait_for(lambda: (status_json(run_dir).get("step") or 0) >= 5, 90)
    os.kill(read(run_dir / "status.json")["supervisor_pid"], signal.SIGTERM)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") in ("failed", "succeeded", "sync_failed", "interrupted"), 90)
    durable = box.durable / "results" / "torn" / "out" / "ckpt.pt"
    good = durable.read_bytes()
    saved = torch.load(durable)["step"]
    (box.work / "out" / "ckpt.pt").write_bytes(good[: len(good) // 3])          # cut off mid-save

    code, plan, _ = boot_resume(env, "--run", run_dir, "--dry-run")
    assert code == 0 and plan["resume_from"] == "out/ckpt.pt" and plan["restored_from"] == str(durable), plan
    assert (box.work / "out" / "ckpt.pt").read_bytes() != good                 # a dry run puts nothing back
    gate.unlink()
    code, done, err = boot_resume(env, "--run", run_dir)
    assert code == 0 and done["action"] == "resumed", (done, err)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") in ("failed", "succeeded", "sync_failed", "interrupted"), 120)
    status = read(run_dir / "status.json")
    assert status["attempt"] == 2 and status["resume"]["restored_from"] == str(durable)
    assert status_json(run_dir)["resume"]["from"] == "out/ckpt.pt"   # run_status shows what it resumed from
    assert (box.work / "out" / "final.txt").read_text() == "steps_done 60 from %d\n" % saved
    (aside,) = (run_dir / "torn" / "out").iterdir()
    assert aside.read_bytes() == good[: len(good) // 3]


def test_adapter_arguments_are_checked_at_launch(tmp_path, box):  # noqa: F811
    for opts, fragment in ((["--resume-glob", "out/*.pt"], "go together"),
                           (["--progress-regex", "step ("], "does not compile"),
                           (["--progress-regex", "no groups"], "needs a group"),
                           (["--stop-signal", "KILL"], "invalid choice"),
                           (["--notify-events", "launched,nope"], "unknown event(s) nope")):
        res = subprocess.run(["bash", str(NODE / "run_one.sh"), "--profile", "testbox", "--run-id", "bad",
                              "--no-deadman", *opts, "--", "true"], cwd=str(box.work), env=box.env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and fragment in res.stderr and "Traceback" not in res.stderr, (opts, res.stderr)
        assert not box.run_dir("bad").exists(), "a refused launch wrote nothing (%s)" % opts


PERIODIC = r'''
import argparse, os, sys, time, torch
parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--resume", default=None)
args = parser.parse_args()
os.makedirs("out", exist_ok=True)
model = torch.nn.Linear(4, 1)
start = torch.load(args.resume)["step"] if args.resume else 0
if args.resume:
    print("resumed from step %d" % start, flush=True)
for step in range(start + 1, args.steps + 1):
    print("step %d/%d" % (step, args.steps), flush=True)
    if step % 5 == 0:
        torch.save({"model": model.state_dict(), "step": step}, "out/ckpt.pt.tmp")
        os.replace("out/ckpt.pt.tmp", "out/ckpt.pt")
    hold = os.environ.get("GATE_FILE")
    time.sleep(0.2 if hold and os.path.exists(hold) else 0.01)
open("out/final.txt", "w").write("from %d to %d\n" % (start, args.steps))
'''


@pytest.mark.drill("restart re-arms the dead-man")
@pytest.mark.parametrize("opted_in", [True, False], ids=["auto-resume", "re-arm-only"])
def test_boot_resume_after_a_simulated_restart(tmp_path, box, opted_in):  # noqa: F811
    (box.work / "train.py").write_text(PERIODIC)
    gate = tmp_path / "hold"
    gate.write_text("hold")
    env = dict(box.env, GATE_FILE=str(gate))
    opts = ["--resume-glob", "out/*.pt", "--resume-arg", "--resume {}", "--deadman-dry-run", "--output", "out/*",
            "--grace-minutes", "0.01"] + (["--auto-resume", "--max-attempts", "3"] if opted_in else [])
    argv = ["bash", str(NODE / "run_one.sh"), "--profile", "testbox", "--run-id", "boot", *opts, "--",
            sys.executable, "train.py"]
    assert subprocess.run(argv, cwd=str(box.work), env=env, capture_output=True, text=True,
                          timeout=120).returncode == 0
    run_dir = box.run_dir("boot")
    assert wait_for(lambda: (box.work / "out" / "ckpt.pt").exists(), 90)
    old_deadman = read(run_dir / "deadman.json")["pid"]
    kill_everything_of(run_dir)
    assert read(run_dir / "status.json")["state"] == "running"   # what a restarted box finds
    gate.unlink()
    boot = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--runs-dir", str(box.durable / "runs"),
                           "--json"], env=box.env, capture_output=True, text=True, timeout=300)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    (only,) = json.loads(boot.stdout)["runs"]
    if opted_in:
        assert only["action"] == "resumed" and only["attempt"] == 2
        # boot command to a detached, watched attempt 2: reported (target under 30 s); only a sanity bound here
        assert only["seconds_to_launch"] < 120, only
        assert wait_for(lambda: read(run_dir / "status.json").get("state") == "succeeded", 120)
        status = read(run_dir / "status.json")
        assert status["attempt"] == 2 and status["resume"]["from"] == "out/ckpt.pt"
        saved = int((box.work / "out" / "final.txt").read_text().split()[1])
        assert saved >= 5 and (box.work / "out" / "final.txt").read_text().endswith("to 40\n")
        assert read(run_dir / "deadman.json")["pid"] != old_deadman   # attempt 2 got its own dead-man
    else:
        assert only["action"] == "re-armed the dead-man" and "--auto-resume" in only["why"]
        status = read(run_dir / "status.json")
        assert status["state"] == "failed" and "node restarted" in status["error"]
        assert wait_for(lambda: (run_dir / "DEADMAN_FIRED.json").exists(), 90)   # the meter stops on its own
        assert read(run_dir / "DEADMAN_FIRED.json")["reason"] == "job_ended"
    # nothing left to do on a second boot
    again = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), "--runs-dir", str(box.durable / "runs")],
                           env=box.env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no unfinished run" in again.stdout


def boot_resume(env, *args):
    res = subprocess.run([sys.executable, str(NODE / "boot_resume.py"), *map(str, args), "--json"], env=env,
                         capture_output=True, text=True, timeout=300)
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else {}), res.stderr


@pytest.mark.drill("earlier watcher spares a resumed attempt")
def test_explicit_resume_refuses_a_live_attempt_then_hands_the_dead_man_over(tmp_path, box):  # noqa: F811
    (box.work / "train.py").write_text(PERIODIC)
    gate = tmp_path / "hold"
    gate.write_text("hold")
    env = dict(box.env, GATE_FILE=str(gate))
    opts = ["--resume-glob", "out/*.pt", "--resume-arg", "--resume {}", "--deadman-dry-run", "--output", "out/*",
            "--grace-minutes", "30"]
    argv = ["bash", str(NODE / "run_one.sh"), "--profile", "testbox", "--run-id", "again", *opts, "--",
            sys.executable, "train.py"]
    assert subprocess.run(argv, cwd=str(box.work), env=env, capture_output=True, text=True,
                          timeout=120).returncode == 0
    run_dir = box.run_dir("again")
    assert wait_for(lambda: (box.work / "out" / "ckpt.pt").exists(), 90)

    # attempt 1 is live: a second live attempt is never started
    code, live, _ = boot_resume(env, "--run", run_dir)
    assert code == 3 and live["action"] == "refused" and "still live" in live["why"], live
    assert read(run_dir / "status.json")["attempt"] == 1 and not (run_dir / "previous").exists()

    # preemption: SIGTERM to the supervisor; the run is interrupted, its dead-man stays armed (grace 30 min)
    os.kill(read(run_dir / "status.json")["supervisor_pid"], signal.SIGTERM)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") == "interrupted", 90)
    first_deadman = read(run_dir / "deadman.json")["pid"]
    assert os.path.exists("/proc/%d" % first_deadman)

    for capped in (["--max-attempts", "1"], ["--give-up-hours", "1e-6"]):
        code, refused, _ = boot_resume(env, "--run", run_dir, *capped)
        assert code == 3 and refused["action"] == "refused", (capped, refused)
    code, dry, _ = boot_resume(env, "--run", run_dir, "--dry-run")
    assert code == 0 and dry["action"] == "would resume" and read(run_dir / "status.json")["attempt"] == 1
    assert dry["resume_from"] == "out/ckpt.pt" and dry["resume_args"] == ["--resume", "out/ckpt.pt"]
    assert dry["warning"] is None

    gate.unlink()
    code, done, err = boot_resume(env, "--run", run_dir)
    assert code == 0 and done["action"] == "resumed" and done["attempt"] == 2, (done, err)
    assert wait_for(lambda: read(run_dir / "status.json").get("state") == "succeeded", 120)
    status = read(run_dir / "status.json")
    assert status["attempt"] == 2 and status["resume"]["from"] == "out/ckpt.pt"
    # one dead-man per run: the first one handed over (disarmed, gone), attempt 2 has its own
    second_deadman = read(run_dir / "deadman.json")["pid"]
    assert second_deadman != first_deadman
    assert wait_for(lambda: not os.path.exists("/proc/%d" % first_deadman)
                    or open("/proc/%d/stat" % first_deadman).read().rsplit(")", 1)[1].split()[0] == "Z", 60)
    final = (box.work / "out" / "final.txt").read_text().split()    # "from N to 40": resumed, not restarted
    assert int(final[1]) >= 5 and final[3] == "40", final

    code, finished, _ = boot_resume(env, "--run", run_dir)
    assert code == 3 and "succeeded" in finished["why"]
