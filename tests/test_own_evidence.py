"""Runs on one box keep their own evidence (issue 26): the field test's R1, R2, R4, R5, R13 and the node red
team's A1, A5, A14 (../shared/reports/redteam-2026-12-03-node.md), each reproduced with real processes, and
one drill with four runs sharing a working dir.

Every wait is on a state a tool records (status.json, a file, /proc/locks), never on a sleep.
"""
import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import NODE, SCRIPTS, wait_for
from conftest import read_json as read

RUN_ONE = str(NODE / "run_one.sh")
BOOT = str(NODE / "boot_resume.py")
SWEEP = str(NODE / "final_sweep.py")

# A trainer we did not write, stdlib only. cfg (JSON, argv[1]): ckpt (a checkpoint it writes each step),
# out (a model file it writes at the end), steps, code (its exit code), hold (it waits while this file exists),
# mode (a file whose text, read at start, overrides "code" and "out_text": how each attempt behaves),
# term_exit (its exit code on SIGTERM: a clean stop path), hb (it writes {"step"} to $RGT_HEARTBEAT at its start
# and after each step), pause (after that first heartbeat it waits while this file exists). It resumes only
# when given "--resume PATH"; ckpt_every (it saves every Nth step only), ignore_resume (it starts at 0 anyway).
TRAINER = r"""
import json, os, signal, sys, time
cfg = json.loads(sys.argv[1])
if cfg.get("term_exit") is not None:
    signal.signal(signal.SIGTERM, lambda *_: (print("trainer: stop signal, clean exit", flush=True),
                                              sys.exit(cfg["term_exit"])))
mode = json.load(open(cfg["mode"])) if cfg.get("mode") else {}
cfg.update(mode)
start = 0
if "--resume" in sys.argv and not cfg.get("ignore_resume"):
    start = int(open(sys.argv[sys.argv.index("--resume") + 1]).read().split()[1])
print("trainer %s: start at step %d" % (cfg["name"], start), flush=True)
def beat(step):
    if cfg.get("hb"):
        with open(os.environ["RGT_HEARTBEAT"] + ".tmp", "w") as fh:
            json.dump({"step": step}, fh)
        os.replace(os.environ["RGT_HEARTBEAT"] + ".tmp", os.environ["RGT_HEARTBEAT"])
beat(start)
while cfg.get("pause") and os.path.exists(cfg["pause"]):
    time.sleep(0.05)
for step in range(start, cfg.get("steps", 3)):
    if cfg.get("ckpt") and (step + 1) % cfg.get("ckpt_every", 1) == 0:
        os.makedirs(os.path.dirname(cfg["ckpt"]), exist_ok=True)
        with open(cfg["ckpt"] + ".tmp", "w") as fh:
            fh.write("step %d\n" % (step + 1))
        os.replace(cfg["ckpt"] + ".tmp", cfg["ckpt"])
    print("step %d" % (step + 1), flush=True)
    beat(step + 1)
while cfg.get("hold") and os.path.exists(cfg["hold"]):
    time.sleep(0.05)
if cfg.get("out"):
    os.makedirs(os.path.dirname(cfg["out"]), exist_ok=True)
    with open(cfg["out"], "w") as fh:
        fh.write(cfg.get("out_text") or "%s trained from step %d\n" % (cfg["name"], start))
sys.exit(cfg.get("code", 0))
"""


def trainer(box, name, **cfg):
    (box.work / "trainer.py").write_text(TRAINER)
    cfg["name"] = name
    return [sys.executable, "trainer.py", json.dumps(cfg)]


def launch(box, run_id, job, *opts, ok=True):
    res = box.launch(run_id, job, "--deadman-dry-run", "--grace-minutes", "30", *opts, timeout=120)
    if ok:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def boot_resume(box, *args):
    res = subprocess.run([sys.executable, BOOT, *map(str, args), "--json"], env=box.env, capture_output=True,
                         text=True, timeout=300)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else {}), res.stderr


def sweep(box, *extra):
    res = subprocess.run([sys.executable, SWEEP, "--runs-dir", str(box.durable / "runs"), *extra], env=box.env,
                         capture_output=True, text=True, timeout=300)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def outputs_of(results):
    """The result files that are outputs (not the run's logs, record or manifest)."""
    return [f for f in files_under(results) if not f.startswith("logs/")
            and f not in ("run.json", "env.json", "code.patch", "PULL_MANIFEST.json")]


def verify(root):
    """evidence.verify_tree over ROOT's own manifest -> problems (empty: the copy verifies)."""
    sys.path.insert(0, str(NODE))
    import evidence
    manifest, bad = evidence.parse_manifest((root / "PULL_MANIFEST.json").read_bytes())
    assert not bad, bad
    found, _ = evidence.verify_tree(str(root), manifest, 2, progress=False)
    return found


# ---------------------------------------------------------------- R1: a new run never resumes another run's checkpoint

def test_finding_field_R1_a_new_run_never_resumes_another_runs_checkpoint(box):
    adapt = ["--resume-glob", "ckpt/*.txt", "--resume-arg", "--resume {}", "--output", "ckpt/*.txt"]
    launch(box, "first", trainer(box, "first", ckpt="ckpt/first.txt", steps=7), *adapt, "--wait")
    assert box.status("first")["state"] == "succeeded"
    # a brand-new run in the same working dir, with the same documented adapters
    res = launch(box, "second", trainer(box, "second", ckpt="ckpt/second.txt", steps=3, code=1), *adapt, "--wait",
                 ok=False)
    status = box.status("second")
    assert status["attempt"] == 1 and status["resume"]["from"] is None, status["resume"]
    skipped = {s["path"]: s["why"] for s in status["resume"]["skipped"]}
    assert "written by run first" in skipped["ckpt/first.txt"], skipped
    assert "start at step 0" in (box.run_dir("second") / "job.log").read_text()
    assert "resume:   none" in res.stdout and "ckpt/first.txt: written by run first" in res.stdout, res.stdout
    # its own checkpoint is what its next attempt resumes from, and the launch report says who wrote it
    res = relaunch(box, "second", trainer(box, "second", ckpt="ckpt/second.txt", steps=5), *adapt, "--wait")
    status = box.status("second")
    assert status["attempt"] == 2 and status["resume"]["from"] == "ckpt/second.txt", status["resume"]
    assert "resume:   from ckpt/second.txt (written by: this run's attempt 1)" in res.stdout, res.stdout
    assert "start at step 3" in (box.run_dir("second") / "job.log").read_text()
    # it resumed from the newest checkpoint this run wrote: it continues the run (no step needed to tell)
    continuity = status["sync"]["continuity"]
    assert continuity["continued"] is True and "this run's newest checkpoint" in continuity["why"], continuity
    assert status["sync"]["kept_generation"] is None
    # an explicit path is the way to start from someone else's checkpoint
    res = launch(box, "third", trainer(box, "third", steps=9), "--resume-from", "ckpt/first.txt",
                 "--resume-arg", "--resume {}", "--wait")
    assert box.status("third")["resume"]["from"] == "ckpt/first.txt"
    assert "(written by: whoever it was: given explicitly with --resume-from)" in res.stdout, res.stdout


# ---------------------------------------------------------------- R2: a restart from step 0 keeps the good generation

@pytest.mark.drill("resume that cannot resume keeps durable output")
def test_finding_field_R2_a_resume_that_cannot_resume_keeps_the_verified_generation(box):
    mode = box.tmp / "mode.json"
    mode.write_text(json.dumps({"out_text": "model at 6.71% correct\n", "code": 1}))
    job = trainer(box, "nores", out="out/nores/model.bin", mode=str(mode))
    launch(box, "nores", job, "--output", "out/nores/*", "--wait", ok=False)
    run_dir, results = box.run_dir("nores"), box.durable / "results" / "nores"
    assert box.status("nores")["state"] == "failed" and box.status("nores")["sync"]["ok"]
    good = (results / "out/nores/model.bin").read_text()

    # no resume adapter: the resume refuses and says what its restart from step 0 would supersede
    code, refused, _ = boot_resume(box, "--run", run_dir)
    assert code == 3 and refused["action"] == "refused", refused
    assert "no resume adapter" in refused["why"] and "out/nores/model.bin" in refused["why"], refused
    assert "--force-restart" in refused["why"] and box.status("nores")["attempt"] == 1
    code, dry, _ = boot_resume(box, "--run", run_dir, "--dry-run")
    assert code == 0 and "refuses without --force-restart" in dry["warning"], dry

    # told to, it restarts; the untrained model replaces the results, the good one is kept beside them
    mode.write_text(json.dumps({"out_text": "model at 0.18% correct\n", "code": 0}))
    code, done, err = boot_resume(box, "--run", run_dir, "--force-restart")
    assert code == 0 and done["action"] == "resumed" and done["would_supersede"]["attempt"] == 1, (done, err)
    assert wait_for(lambda: box.status("nores").get("state") == "succeeded" and box.status("nores")["attempt"] == 2,
                    120), box.status("nores")
    sync = box.status("nores")["sync"]
    kept = box.durable / "generations" / "nores" / "1"
    assert sync["generation"] == 2 and sync["kept_generation"]["attempt"] == 1, sync
    assert sync["kept_generation"]["dir"] == str(kept) and "had no resume adapter" in sync["kept_generation"]["why"]
    assert (results / "out/nores/model.bin").read_text() == "model at 0.18% correct\n"
    assert (kept / "out/nores/model.bin").read_text() == good == "model at 6.71% correct\n"
    assert verify(kept) == [] and verify(results) == []
    assert "kept generation 1" in (run_dir / "job.log").read_text()
    # what the gate reads on the node: which generation the results hold, and the kept ones
    sys.path.insert(0, str(SCRIPTS))
    import teardown_gate   # the program the gate streams to the node (runrec's run_activity, with the core)
    state = subprocess.run([sys.executable, "-", "--run-state", str(run_dir)], input=teardown_gate.run_state_program(),
                           capture_output=True, timeout=60)
    assert json.loads(state.stdout)["generation"] == {"attempt": 2, "kept": [str(kept)],
                                                      "why": {str(kept): sync["kept_generation"]["why"]}}


def relaunch(box, run_id, job, *opts, ok=True):
    """The next attempt of RUN_ID, launched again in its run dir once its last dead-man is disarmed, holding
    RUN_DIR/resume.lock as boot_resume.py's replay does (field N19: only a resume starts another attempt in a run
    dir that holds a run); here with another job than the recorded one."""
    subprocess.run([sys.executable, str(NODE / "deadman.py"), "ack", "--run-dir", str(box.run_dir(run_id)),
                    "--disarm"], env=box.env, capture_output=True, timeout=60, check=True)
    with open(box.run_dir(run_id) / "resume.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        return launch(box, run_id, job, *opts, ok=ok)


def gate_lines(box, run_id, dest, profile_env, *extra):
    """Pull RUN_ID's results to DEST and run the teardown gate on them (EXTRA: its options) -> the gate's stdout
    (it passed)."""
    results = box.durable / "results" / run_id
    pulled = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source", str(results), "--dest",
                             str(dest)], capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    gate = run_gate(dest / run_id, results, profile_env, *extra)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    return gate.stdout


def run_gate(pulled, source, profile_env, *extra):
    return subprocess.run([sys.executable, str(SCRIPTS / "teardown_gate.py"), "--pulled", str(pulled),
                           "--profile", "examplecloud", "--source", str(source), *map(str, extra)],
                          capture_output=True, text=True, timeout=300, env=profile_env)


@pytest.mark.drill("resume that cannot resume keeps durable output")
def test_finding_field_R2_a_resume_from_an_older_checkpoint_keeps_the_verified_generation(box, tmp_path,
                                                                                          profile_env):
    """Resumed, but from a step below the one the durable copy stands at (an earlier file given with
    --resume-from): the attempt did not continue the one before, so its sync keeps that one's results."""
    (box.work / "ckpt").mkdir()
    (box.work / "ckpt" / "old.txt").write_text("step 2\n")          # an earlier experiment's checkpoint
    adapt = ["--output", "out/*", "--progress-regex", r"^step (?P<step>\d+)$", "--resume-glob", "ckpt/last.txt",
             "--resume-arg", "--resume {}"]
    mode = tmp_path / "mode.json"
    mode.write_text(json.dumps({"out_text": "model at step 10: 6.71% correct\n", "code": 1}))
    job = trainer(box, "old", ckpt="ckpt/last.txt", out="out/model.bin", steps=10, mode=str(mode))
    launch(box, "old", job, *adapt, "--wait", ok=False)
    run_dir, results = box.run_dir("old"), box.durable / "results" / "old"
    first = box.status("old")
    assert first["state"] == "failed" and first["sync"]["ok"] and first["sync"]["step"]["step"] == 10, first["sync"]
    assert read(run_dir / "generation.json")["step"] == 10

    # attempt 2 resumes, but from the old file: it starts at step 2 and ends with a model from there
    mode.write_text(json.dumps({"out_text": "model from step 2: 0.18% correct\n", "code": 0}))
    res = relaunch(box, "old", job, *adapt, "--resume-from", "ckpt/old.txt", "--wait")
    status = box.status("old")
    assert status["attempt"] == 2 and status["resume"]["from"] == "ckpt/old.txt", status["resume"]
    sync = status["sync"]
    kept = box.durable / "generations" / "old" / "1"
    assert sync["ok"] and sync["kept_generation"]["attempt"] == 1 and sync["kept_generation"]["dir"] == str(kept)
    why = sync["kept_generation"]["why"]
    assert "resumed at step 3 (from ckpt/old.txt), below the durable copy's step 10" in why, why
    assert sync["continuity"]["continued"] is False and sync["continuity"]["durable_step"] == 10, sync["continuity"]
    assert (results / "out/model.bin").read_text() == "model from step 2: 0.18% correct\n"
    assert (kept / "out/model.bin").read_text() == "model at step 10: 6.71% correct\n" and verify(kept) == []
    assert "below the durable copy's step 10" in res.stdout, res.stdout        # the launch report
    shown = subprocess.run([sys.executable, str(NODE / "run_status.py"), str(run_dir), "--no-gpu"],
                           capture_output=True, text=True, timeout=60, env=box.env).stdout
    assert "kept in %s" % kept in shown and "below the durable copy's step 10" in shown, shown
    gate = gate_lines(box, "old", tmp_path / "pulled", profile_env, "--keep-generation", "2")
    assert "verified generation 2 (the results of attempt 2), the one you chose to keep" in gate, gate
    assert ("DESTROYED by a teardown: generation 1 (attempt 1's verified results, kept in %s because attempt 2 "
            "resumed at step 3" % kept) in gate, gate

    # attempt 3 resumes from attempt 2's last checkpoint (step 10) and goes on: it continues, nothing more is kept
    job = trainer(box, "old", ckpt="ckpt/last.txt", out="out/model.bin", steps=15)
    relaunch(box, "old", job, *adapt, "--wait")
    sync = box.status("old")["sync"]
    assert box.status("old")["resume"]["from"] == "ckpt/last.txt" and sync["ok"], box.status("old")
    assert sync["kept_generation"] is None and sync["continuity"]["continued"] is True, sync
    assert sync["continuity"]["resumed_step"] == 11 and sync["step"]["step"] == 15, sync
    assert sorted(os.listdir(box.durable / "generations" / "old")) == ["1"]


def test_finding_field_R2_a_crash_resume_from_the_newest_checkpoint_continues_and_keeps_no_generation(box):
    """Attempt 1 saves every 4th step, logs step 10 and crashes: its durable copy stands at step 10, its newest
    checkpoint at 8. Attempt 2 resumes from that newest checkpoint (first step 9, below 10) and continues the run:
    no generation is kept (each crash would otherwise pin a copy of every output on the durable disk). Attempt 3
    is given the same newest checkpoint but ignores it and starts over: that one keeps attempt 2's results."""
    adapt = ["--output", "out/*", "--progress-regex", r"^step (?P<step>\d+)$", "--resume-glob", "ckpt/last.txt",
             "--resume-arg", "--resume {}"]
    launch(box, "crash", trainer(box, "crash", ckpt="ckpt/last.txt", ckpt_every=4, out="out/model.bin", steps=10,
                                 code=1), *adapt, "--wait", ok=False)
    assert box.status("crash")["sync"]["step"]["step"] == 10
    relaunch(box, "crash", trainer(box, "crash", ckpt="ckpt/last.txt", ckpt_every=4, out="out/model.bin",
                                   steps=12), *adapt, "--wait")
    status = box.status("crash")
    sync = status["sync"]
    assert status["resume"]["from"] == "ckpt/last.txt" and status["resume"]["newest_own"] is True, status["resume"]
    assert sync["continuity"]["continued"] is True and sync["continuity"]["resumed_step"] == 9, sync["continuity"]
    assert sync["kept_generation"] is None and not (box.durable / "generations" / "crash").exists(), sync
    assert (box.durable / "results" / "crash" / "out" / "model.bin").read_text() == "crash trained from step 8\n"

    relaunch(box, "crash", trainer(box, "crash", ckpt="ckpt/last.txt", out="out/model.bin", steps=12,
                                   ignore_resume=True), *adapt, "--wait")
    sync = box.status("crash")["sync"]
    assert sync["continuity"]["continued"] is False and sync["kept_generation"]["attempt"] == 2, sync
    kept = box.durable / "generations" / "crash" / "2"
    assert (kept / "out" / "model.bin").read_text() == "crash trained from step 8\n" and verify(kept) == []


def test_finding_field_R2_the_heartbeat_tells_the_step_an_attempt_resumed_at(box, tmp_path):
    """The same rule for a trainer that writes a heartbeat and prints no progress: its supervisor notes the
    first step the heartbeat shows (status.json first_step), the sync the last."""
    (box.work / "ckpt").mkdir()
    (box.work / "ckpt" / "old.txt").write_text("step 2\n")
    adapt = ["--output", "out/*", "--resume-from", "ckpt/old.txt", "--resume-arg", "--resume {}"]
    launch(box, "hb", trainer(box, "hb", out="out/model.bin", steps=10, hb=True), "--output", "out/*", "--wait")
    assert read(box.run_dir("hb") / "generation.json")["step"] == 10
    pause = tmp_path / "pause"
    pause.write_text("")
    relaunch(box, "hb", trainer(box, "hb", out="out/model.bin", steps=10, hb=True, pause=str(pause)), *adapt)
    assert wait_for(lambda: box.status("hb").get("first_step"), 60), box.status("hb")
    assert box.status("hb")["first_step"]["step"] == 2, box.status("hb")
    pause.unlink()
    sync = box.wait_terminal("hb", 120)["sync"]
    assert sync["ok"] and sync["kept_generation"]["attempt"] == 1, sync
    assert "resumed at step 2 (from ckpt/old.txt), below the durable copy's step 10" in sync["kept_generation"]["why"]
    assert sync["continuity"]["resumed_source"].startswith("heartbeat.json"), sync["continuity"]
    assert (box.durable / "generations" / "hb" / "1" / "out" / "model.bin").read_text() == "hb trained from step 0\n"
    jsonschema = pytest.importorskip("jsonschema")      # first_step, sync.step and sync.continuity are in its schema
    jsonschema.validate(box.status("hb"), json.loads((NODE / "status.schema.json").read_text()))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(box.status("hb"), first_step=2), json.loads((NODE / "status.schema.json").read_text()))


# ---------------------------------------------------------------- R4: the sweep never copies another run's files

def test_finding_field_R4_the_sweep_never_gives_a_run_another_runs_files(box):
    glob = ["--output", "ckpt/*.txt"]
    res = launch(box, "quiet", trainer(box, "quiet", steps=0), *glob, "--wait", ok=False)
    assert box.status("quiet")["state"] == "sync_failed", res.stdout + res.stderr
    launch(box, "busy", trainer(box, "busy", ckpt="ckpt/busy.txt"), *glob, "--wait")
    assert box.status("busy")["state"] == "succeeded"

    res = sweep(box, "--json")
    runs = {r["run_id"]: r for r in json.loads(res.stdout)["runs"]}
    assert runs["quiet"]["verdict"] != "SYNCED", runs["quiet"]
    assert not (box.durable / "results" / "quiet" / "ckpt").exists(), files_under(box.durable / "results" / "quiet")
    said = json.dumps(runs["quiet"]) + json.dumps(read(box.run_dir("quiet") / "status.json")["sync"])
    assert "written by run busy" in said, said
    assert runs["busy"]["verdict"] == "OK"
    assert read(box.run_dir("busy") / "files.json")["attempts"]["1"]["files"].keys() == {"ckpt/busy.txt"}


# ---------------------------------------------------------------- R5: stopped by a signal is interrupted

def test_finding_field_R5_a_run_stopped_by_a_signal_is_interrupted_whatever_its_exit_code(box, tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    launch(box, "pre", trainer(box, "pre", hold=str(hold), term_exit=0, out="out/pre/model.bin"),
           "--output", "out/pre/*")
    assert wait_for(lambda: box.status("pre").get("state") == "running", 60)
    assert wait_for(lambda: "start at step" in (box.run_dir("pre") / "job.log").read_text(), 60)
    os.kill(box.status("pre")["supervisor_pid"], signal.SIGTERM)      # a preemption notice
    status = box.wait_terminal("pre", 60)
    assert status["state"] == "interrupted" and status["exit_code"] == 0, status
    assert "SIGTERM" in status["interrupted_by"]
    res = subprocess.run([sys.executable, str(NODE / "run_status.py"), str(box.run_dir("pre")), "--json", "--no-gpu"],
                         capture_output=True, text=True, timeout=60, env=box.env)
    assert json.loads(res.stdout)["status"] == "interrupted", res.stdout


# A trainer that keeps printing until its hold file goes: a neighbour that progresses.
TICKER = ("import os, sys, time\nwhile os.path.exists(sys.argv[1]):\n    print('tick', flush=True)\n"
          "    time.sleep(0.2)\n")


def stalled_by_the_deadman(box, run_id, hold, *opts):
    """Launch a trainer that saves, prints three steps, then hangs silently (until HOLD goes) and exits 0 on
    SIGTERM, under a real dead-man (no dry run) with a 3 s stall limit; -> its final status."""
    job = trainer(box, run_id, hold=str(hold), term_exit=0, ckpt="ckpt/%s.txt" % run_id)
    res = box.launch(run_id, job, "--stall-minutes", "0.05", "--grace-minutes", "30",
                     "--output", "ckpt/%s.txt" % run_id, *opts, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return box.wait_terminal(run_id, 120)


def test_finding_field_R5_a_job_the_deadman_stopped_is_interrupted_even_when_it_exits_0(box, tmp_path):
    hold = tmp_path / "hold"
    hold.write_text("")
    status = stalled_by_the_deadman(box, "hung", hold)
    fired = read(box.run_dir("hung") / "DEADMAN_FIRED.json")   # written first, before the job's signal
    assert fired["reason"] == "stall" and not fired["dry_run"], fired
    assert status["state"] == "interrupted" and status["exit_code"] == 0, status
    assert "dead-man" in status["interrupted_by"] and "stall" in status["interrupted_by"], status
    assert status["sync"]["ok"], status["sync"]       # what it saved before the stop is still synced
    assert "clean exit" in (box.run_dir("hung") / "job.log").read_text()
    assert wait_for(lambda: box.stop_calls_lines(), 120), "the meter stop never ran"


def test_finding_field_R5_a_job_the_deadman_stopped_beside_a_busy_run_is_interrupted(box, tmp_path):
    """The dead-man of a stalled run beside a watched, progressing one stops only its own job (finding R3): that
    job, too, was cut short, whatever its exit code; the box is left on."""
    busy_hold = tmp_path / "busy-hold"
    busy_hold.write_text("")
    (box.work / "ticker.py").write_text(TICKER)
    launch(box, "busy", [sys.executable, "ticker.py", str(busy_hold)])
    try:
        assert wait_for(lambda: "tick" in (box.run_dir("busy") / "job.log").read_text(), 60)
        hold = tmp_path / "hold"
        hold.write_text("")
        status = stalled_by_the_deadman(box, "hung", hold)
        # the dead-man writes its record once the stopped job's sync is over, so after the final state
        assert wait_for(lambda: read(box.run_dir("hung") / "STALL_STOPPED.json").get("job_term"), 60)
        stopped = read(box.run_dir("hung") / "STALL_STOPPED.json")
        assert stopped["box_stop"] is False and stopped["job_term"]["signal"] == "SIGTERM", stopped
        assert status["state"] == "interrupted" and status["exit_code"] == 0, status
        assert "dead-man" in status["interrupted_by"] and "stall" in status["interrupted_by"], status
        assert box.status("busy")["state"] == "running" and box.stop_calls_lines() == []
    finally:
        busy_hold.unlink()
    assert box.wait_terminal("busy", 60)["state"] == "succeeded"


def test_finding_field_R5_a_dry_run_dead_man_that_fired_never_marks_a_run_interrupted(box, tmp_path):
    """A dry-run dead-man records what it would do and signals nothing: the job it 'would have stopped' goes on
    and finishes by itself, so the run succeeded (found while fixing the dead-man -> interrupted rule)."""
    hold = tmp_path / "hold"
    hold.write_text("")
    launch(box, "dry", trainer(box, "dry", hold=str(hold), ckpt="ckpt/dry.txt"), "--stall-minutes", "0.05",
           "--output", "ckpt/dry.txt")
    assert wait_for(lambda: read(box.run_dir("dry") / "DEADMAN_FIRED.json").get("job_term"), 120)
    assert read(box.run_dir("dry") / "DEADMAN_FIRED.json")["job_term"]["dry_run"] is True
    hold.unlink()
    status = box.wait_terminal("dry", 120)
    assert status["state"] == "succeeded" and not status.get("interrupted_by"), status


# ---------------------------------------------------------------- R13: the sweep's text line shows the real state

def test_finding_field_R13_the_sweep_text_shows_a_crashed_runs_state(box):
    launch(box, "segv", trainer(box, "segv", out="out/segv/model.bin", code=139), "--output", "out/segv/*",
           "--wait", ok=False)
    assert box.status("segv")["state"] == "failed" and box.status("segv")["exit_code"] == 139
    res = sweep(box)
    line = [ln for ln in res.stdout.splitlines() if ln.split()[1:2] in (["segv"], ["segv:"])][0]
    assert not line.startswith("OK"), line
    assert line.startswith("SAVED") and "state failed, exit 139" in line, res.stdout


# ---------------------------------------------------------------- A1: queue cells report progress to the run

QUEUE_CELL = "import time\nfor i in range(40):\n    print('cell tick %d' % i, flush=True); time.sleep(0.25)\n"


def test_finding_node_A1_queue_cells_reach_the_runs_log_and_are_never_stalled(box):
    (box.work / "cell.py").write_text(QUEUE_CELL)
    (box.work / "q.txt").write_text("%s cell.py\n" % sys.executable)
    res = box.launch("queued", ["bash", str(NODE / "run_queue.sh"), "--disk-floor-gb", "0", "q.txt"],
                     "--deadman-dry-run", "--stall-minutes", "0.1", "--grace-minutes", "30", "--wait", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    log = (box.run_dir("queued") / "job.log").read_text()
    assert "cell tick 0" in log and "cell tick 39" in log, log[-2000:]
    fired = read(box.run_dir("queued") / "DEADMAN_FIRED.json")
    assert fired.get("reason") != "stall", fired


# ---------------------------------------------------------------- A5: the boot sweep locks, and spares a live launch

def test_finding_node_A5_boot_sweep_spares_a_live_launch_and_runs_one_at_a_time(box, tmp_path):
    # a launch still starting: its launcher is alive, no supervisor has claimed the run yet
    launcher = subprocess.Popen(["sleep", "300"])
    try:
        run_dir = box.run_dir("slow")
        run_dir.mkdir(parents=True)
        box.runs.append("slow")
        init = subprocess.run([sys.executable, str(NODE / "launcher.py"), "init", "--run-dir", str(run_dir),
                               "--run-id", "slow", "--cwd", str(box.work), "--results-dir",
                               str(box.durable / "results" / "slow"), "--detach", "setsid", "--launcher-pid",
                               str(launcher.pid), "--auto-resume", "--", "true"],
                              env=box.env, capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        res = subprocess.run([sys.executable, BOOT, "--runs-dir", str(box.durable / "runs"), "--json"],
                             env=box.env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert box.status("slow")["state"] == "starting" and not box.status("slow").get("error"), box.status("slow")
    finally:
        launcher.kill()
        launcher.wait()

    # the launcher is gone now: the run is orphaned. While another sweep holds the box lock, a second one waits.
    lock_path = os.path.join(os.path.dirname(os.environ["RGT_REGISTRY"]), "boot_resume.lock")
    with open(lock_path, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        second = subprocess.Popen([sys.executable, BOOT, "--runs-dir", str(box.durable / "runs"), "--json"],
                                  env=box.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def waiting():
            with open("/proc/locks") as fh:
                return any("->" in line and " %d " % second.pid in line for line in fh)
        assert wait_for(waiting, 60), "the second sweep did not wait for the box lock"
        assert box.status("slow")["state"] == "starting"      # nothing touched while the lock is held
    out, err = second.communicate(timeout=300)
    assert "Traceback" not in err, err
    (only,) = json.loads(out)["runs"]
    assert only["run_dir"] == str(run_dir) and box.status("slow")["state"] != "starting", only


# ---------------------------------------------------------------- A14: a non-UTF-8 file name is recorded, escaped

def test_finding_node_A14_a_non_utf8_output_name_is_recorded_escaped_never_a_crash(box):
    out = os.path.join(os.fsencode(str(box.work)), b"out")
    os.makedirs(out)
    with open(os.path.join(out, b"model.bin"), "wb") as fh:
        fh.write(b"x" * 100)
    with open(os.path.join(out, b"\xd1\xf9\xb1\xbe.png"), "wb") as fh:   # a GBK name
        fh.write(b"y" * 100)
    res = box.launch("gbk", ["true"], "--no-deadman", "--output", "out/*", "--wait", timeout=120)
    status = box.status("gbk")
    assert status["state"] == "sync_failed" and res.returncode == 1, (status, res.stderr)
    assert isinstance(status["sync"], dict) and "supervisor error" not in (status.get("error") or "")
    assert "\\xd1\\xf9\\xb1\\xbe.png" in status["sync"]["error"] and "not valid UTF-8" in status["sync"]["error"]
    assert (box.durable / "results" / "gbk" / "out" / "model.bin").read_bytes() == b"x" * 100


# ---------------------------------------------------------------- the drill: four runs, one working dir

@pytest.mark.drill("sweep keeps runs' files apart")
def test_multi_run_box_each_runs_evidence_holds_exactly_its_own_files(box, tmp_path, profile_env):
    glob = ["--output", "out/*.bin"]
    hold = tmp_path / "hold-healthy"
    hold.write_text("")
    launch(box, "healthy", trainer(box, "healthy", hold=str(hold), out="out/healthy.bin"), *glob)
    assert wait_for(lambda: box.status("healthy").get("state") == "running", 60)

    launch(box, "crash", trainer(box, "crash", out="out/crash.bin", code=139), *glob, "--wait", ok=False)
    launch(box, "noout", trainer(box, "noout", steps=1), *glob, "--wait", ok=False)
    mode = tmp_path / "nores-mode.json"
    mode.write_text(json.dumps({"out_text": "good model\n", "code": 1}))
    launch(box, "nores", trainer(box, "nores", out="out/nores.bin", mode=str(mode)), *glob, "--wait", ok=False)
    mode.write_text(json.dumps({"out_text": "untrained model\n", "code": 0}))
    code, done, err = boot_resume(box, "--run", box.run_dir("nores"), "--force-restart")
    assert code == 0, (done, err)
    assert wait_for(lambda: box.status("nores").get("attempt") == 2
                    and box.status("nores").get("state") == "succeeded", 120), box.status("nores")
    hold.unlink()
    assert box.wait_terminal("healthy", 60)["state"] == "succeeded"

    states = {r: box.status(r)["state"] for r in ("healthy", "crash", "noout", "nores")}
    assert states == {"healthy": "succeeded", "crash": "failed", "noout": "sync_failed", "nores": "succeeded"}

    res = sweep(box)
    assert "OK       healthy (state succeeded, exit 0)" in res.stdout, res.stdout
    assert "SAVED    crash (state failed, exit 139)" in res.stdout, res.stdout
    assert "noout (state sync_failed, exit 0)" in res.stdout and "OK       noout" not in res.stdout, res.stdout

    results = box.durable / "results"
    own = {"healthy": ["out/healthy.bin"], "crash": ["out/crash.bin"], "noout": [], "nores": ["out/nores.bin"]}
    for run_id, files in own.items():
        assert outputs_of(results / run_id) == files, (run_id, files_under(results / run_id))
    assert (results / "nores" / "out/nores.bin").read_text() == "untrained model\n"
    kept = box.durable / "generations" / "nores" / "1"
    assert (kept / "out/nores.bin").read_text() == "good model\n" and verify(kept) == []
    assert not (box.durable / "generations" / "healthy").exists()

    # pull and gate each saved run: the gate names the generation it verified
    for run_id in ("healthy", "crash", "nores"):
        dest = tmp_path / "pulled"
        pulled = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source",
                                 str(results / run_id), "--dest", str(dest)], capture_output=True, text=True,
                                timeout=300)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        attempt = 2 if run_id == "nores" else 1
        # nores: the user keeps the current results on purpose; the kept generation 1 would otherwise refuse
        gate = run_gate(dest / run_id, results / run_id, profile_env,
                        *(["--keep-generation", "2"] if run_id == "nores" else []))
        assert gate.returncode == 0, gate.stdout + gate.stderr
        assert "verified generation %d (the results of attempt %d)" % (attempt, attempt) in gate.stdout, gate.stdout
        if run_id == "nores":
            assert "DESTROYED by a teardown: generation 1 (attempt 1's verified results, kept in %s" % kept \
                in gate.stdout, gate.stdout
        assert sorted(p for p in outputs_of(dest / run_id) if p != "PULL_VERIFIED.json") == own[run_id]


# ---------------------------------------------------------------- N3, N16: the gate and the generations of a run

def forced_restart(box, run_id):
    """Attempt 1 (no resume adapter) fails with the good model; a --force-restart trains an untrained one that
    succeeds. -> (results dir, the kept generation 1's dir)."""
    mode = box.tmp / ("%s-mode.json" % run_id)
    mode.write_text(json.dumps({"out_text": "model at 6.71% correct\n", "code": 1}))
    job = trainer(box, run_id, out="out/%s/model.bin" % run_id, mode=str(mode))
    launch(box, run_id, job, "--output", "out/%s/*" % run_id, "--wait", ok=False)
    mode.write_text(json.dumps({"out_text": "model at 0.18% correct\n", "code": 0}))
    code, done, err = boot_resume(box, "--run", box.run_dir(run_id), "--force-restart")
    assert code == 0 and done["action"] == "resumed", (done, err)
    assert wait_for(lambda: box.status(run_id).get("state") == "succeeded" and box.status(run_id)["attempt"] == 2,
                    120), box.status(run_id)
    return box.durable / "results" / run_id, box.durable / "generations" / run_id / "1"


def test_finding_field_N3_the_gate_never_passes_the_restart_alone_while_the_good_generation_is_on_the_node(
        box, tmp_path, profile_env):
    """resume --force-restart of a trainer with no resume flag: the results hold attempt 2's untrained model, the
    good attempt-1 model sits only in DURABLE/generations/RID/1. The gate refuses until the user names which
    generation to keep; pull_verified.py --generation 1 brings the good one home, verified, and the gate passes
    it with --keep-generation 1 (and says the current results are destroyed by a teardown)."""
    results, kept = forced_restart(box, "nores")
    dest = tmp_path / "pulled"
    pulled = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source", str(results), "--dest",
                             str(dest)], capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert (dest / "nores" / "out/nores/model.bin").read_text() == "model at 0.18% correct\n"

    refused = run_gate(dest / "nores", results, profile_env)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "REASON generation: generation 1: generation 1 (attempt 1's verified results, kept in %s" % kept \
        in refused.stdout, refused.stdout
    assert "--keep-generation N" in refused.stdout and "pull_verified.py --generation N" in refused.stdout
    as_json = json.loads(run_gate(dest / "nores", results, profile_env, "--json").stdout)
    assert as_json["verdict"] == "REFUSED" and as_json["generations"]["only_on_node"] == {"1": str(kept)}
    # naming a generation this pull does not hold is refused too
    wrong = run_gate(dest / "nores", results, profile_env, "--keep-generation", "1")
    assert wrong.returncode == 3 and "this pull holds generation 2: pull generation 1 home" in wrong.stdout

    # pull --generation 1: the kept generation comes home through the same manifest checks
    gen = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source", str(results), "--dest",
                          str(dest), "--generation", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    home = dest / "nores@generation-1"
    assert json.loads(gen.stdout)["dest"] == str(home)
    said = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source", str(results), "--dest",
                           str(dest), "--generation", "1"], capture_output=True, text=True, timeout=300)
    assert said.returncode == 0 and "ALREADY pulled and verified: %s " % home in said.stdout, said.stdout
    assert (home / "out/nores/model.bin").read_text() == "model at 6.71% correct\n"
    assert read(home / "PULL_VERIFIED.json")["generation"] == 1 and verify(home) == []
    (kept / "out/nores/model.bin").write_text("model at 6.71% correct, changed\n")   # a byte changed on the node
    stale = run_gate(home, kept, profile_env, "--keep-generation", "1")
    assert stale.returncode == 3 and "changed on the node since the pull" in stale.stdout, stale.stdout
    (kept / "out/nores/model.bin").write_text("model at 6.71% correct\n")

    kept_one = run_gate(home, kept, profile_env, "--keep-generation", "1")
    assert kept_one.returncode == 0, kept_one.stdout + kept_one.stderr
    assert "verified generation 1 (the results of attempt 1), the one you chose to keep" in kept_one.stdout
    assert "DESTROYED by a teardown: generation 2 (the current results, attempt 2's)" in kept_one.stdout, \
        kept_one.stdout
    # keeping the current results is the user's word too
    current = run_gate(dest / "nores", results, profile_env, "--keep-generation", "2")
    assert current.returncode == 0 and "DESTROYED by a teardown: generation 1" in current.stdout, current.stdout


def test_finding_field_N3_pull_of_a_generation_the_node_does_not_keep_is_one_line(box, tmp_path):
    results = box.durable / "results" / "none"
    results.mkdir(parents=True)
    res = subprocess.run([sys.executable, str(SCRIPTS / "pull_verified.py"), "--source", str(results), "--dest",
                          str(tmp_path / "pulled"), "--generation", "3"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--generation 3:" in res.stderr and "does not exist" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "pulled").exists()


def test_finding_field_N16_a_gate_pass_says_the_run_failed_and_where_its_results_stand(box, tmp_path, profile_env):
    """A run that stopped at step 2 of 6 (here: it failed) passes the gate with its results, and the PASS line says
    so: the state, the attempt, the exit code and the step of the total."""
    job = trainer(box, "cut", ckpt="ckpt/cut.txt", steps=2, code=1, hb=True)
    launch(box, "cut", job, "--output", "ckpt/*", "--total-steps", "6", "--wait", ok=False)
    assert box.status("cut")["state"] == "failed" and box.status("cut")["sync"]["ok"], box.status("cut")
    out = gate_lines(box, "cut", tmp_path / "pulled", profile_env)
    first = out.splitlines()[0]
    assert first.startswith("PASS teardown gate for run cut: ") and \
        first.endswith("; run FAILED (attempt 1, exit 1), results at step 2 of 6"), first
    assert "WARN the run did not succeed" in out, out
