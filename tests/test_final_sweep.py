"""final_sweep.py (issue 18): before a box that ran several cells is released, every run's outputs reach
durable storage under a verified manifest. Real run_one.sh launches, real supervisors, real syncs."""
import json
import os
import shutil
import subprocess
import sys

from conftest import NODE, kill_group_of, wait_for
from conftest import read_json as read

SWEEP = NODE / "final_sweep.py"

WRITER = ("import os,sys,time\n"
          "name = sys.argv[1]; os.makedirs('out_' + name, exist_ok=True)\n"
          "open('out_%s/model.bin' % name, 'wb').write(b'weights of ' + name.encode())\n"
          "t = time.monotonic()\n"
          "while os.path.exists('hold_' + name) and time.monotonic() - t < 300: time.sleep(0.1)\n")


def sweep(env, runs, *extra):
    res = subprocess.run([sys.executable, str(SWEEP), "--runs-dir", str(runs), "--json", *extra], env=env,
                         capture_output=True, text=True, timeout=300)
    assert "Traceback" not in res.stderr, res.stderr
    doc = json.loads(res.stdout)
    return res.returncode, {r["run_id"]: r for r in doc["runs"]}


def launch(box, name):  # noqa: F811
    res = box.launch(name, [sys.executable, "-c", WRITER, name], "--deadman-dry-run", "--output", "out_%s/*" % name)
    assert res.returncode == 0, res.stderr


def test_sweep_finds_syncs_and_verifies_every_run(box):  # noqa: F811
    runs = box.durable / "runs"
    for name in ("clean", "later", "damaged", "crashed"):
        if name == "crashed":
            (box.work / "hold_crashed").write_text("")
        launch(box, name)
    for name in ("clean", "later", "damaged"):
        assert box.wait_terminal(name, 60)["state"] == "succeeded"
    # a cell wrote more after its sync; a durable copy rotted; a box restart killed a cell mid-run
    (box.work / "out_later" / "eval.json").write_text('{"acc": 0.9}')
    damaged = box.durable / "results" / "damaged" / "out_damaged" / "model.bin"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"X")
    assert wait_for(lambda: (box.work / "out_crashed" / "model.bin").exists(), 60)

    code, live = sweep(box.env, runs, "--check-only")
    assert code == 1 and live["crashed"]["verdict"] == "RUNNING", live["crashed"]
    status = read(box.run_dir("crashed") / "status.json")
    for pid in (status["job_pid"], status["supervisor_pid"]):
        assert kill_group_of(pid, box.tmp)
    assert wait_for(lambda: not any(os.path.exists("/proc/%d" % p) and open("/proc/%d/stat" % p).read()
                                    .rsplit(")", 1)[1].split()[0] != "Z"
                                    for p in (status["job_pid"], status["supervisor_pid"])), 30)

    before = {p: p.read_bytes() for p in (box.durable / "results").rglob("*") if p.is_file()}
    code, checked = sweep(box.env, runs, "--check-only")
    assert code == 4, checked
    assert checked["clean"]["verdict"] == "OK"
    assert {n: checked[n]["verdict"] for n in ("damaged", "crashed")} == dict.fromkeys(
        ("damaged", "crashed"), "STALE")
    # a file that appeared after the run ended is no attempt's of it: left alone, never swept into its results
    assert checked["later"]["verdict"] == "OK"
    assert any("eval.json: left alone" in n for n in checked["later"]["left_alone"]), checked["later"]
    assert any("model.bin" in p for p in checked["damaged"]["problems"])
    after = {p: p.read_bytes() for p in (box.durable / "results").rglob("*") if p.is_file()}
    assert after == before, "--check-only changed durable storage"

    code, swept = sweep(box.env, runs)
    assert code == 0, swept
    assert swept["clean"]["verdict"] == "OK" and swept["later"]["verdict"] == "OK"
    assert {n: swept[n]["verdict"] for n in ("damaged", "crashed")} == dict.fromkeys(("damaged", "crashed"), "SYNCED")
    assert not (box.durable / "results" / "later" / "out_later" / "eval.json").exists()
    assert damaged.read_bytes() == b"weights of damaged"
    assert (box.durable / "results" / "crashed" / "out_crashed" / "model.bin").read_bytes() == b"weights of crashed"
    assert read(box.run_dir("crashed") / "status.json")["state"] == "failed"   # honest: it never finished
    code, again = sweep(box.env, runs)
    assert code == 0 and {r["verdict"] for r in again.values()} == {"OK"}


def test_a_run_that_cannot_be_saved_is_reported(box):  # noqa: F811
    launch(box, "gone")
    assert box.wait_terminal("gone", 60)["state"] == "succeeded"
    shutil.rmtree(box.durable / "results" / "gone")          # the durable copy is lost ...
    os.unlink(box.work / "out_gone" / "model.bin")          # ... and so is the only source
    code, swept = sweep(box.env, box.durable / "runs")
    assert code == 1 and swept["gone"]["verdict"] == "FAILED", swept
    text = subprocess.run([sys.executable, str(SWEEP), "--runs-dir", str(box.durable / "runs")], env=box.env,
                          capture_output=True, text=True, timeout=300)
    assert text.returncode == 1 and "do not release the box yet" in text.stdout


def test_a_file_changed_after_the_sync_and_saved_nowhere_is_a_conflict(box):  # noqa: F811
    """The run's verified copy is never synced over with bytes that no durable copy holds: the sweep says
    CONFLICT (exit 1) and leaves both the copy and the cwd file as they are."""
    launch(box, "solo")
    assert box.wait_terminal("solo", 60)["state"] == "succeeded"
    kept = box.durable / "results" / "solo" / "out_solo" / "model.bin"
    (box.work / "out_solo" / "model.bin").write_bytes(b"rewritten by something else")
    code, swept = sweep(box.env, box.durable / "runs")
    assert code == 1 and swept["solo"]["verdict"] == "CONFLICT", swept
    assert "saved nowhere" in swept["solo"]["problems"][0]
    assert kept.read_bytes() == b"weights of solo"
    assert (box.work / "out_solo" / "model.bin").read_bytes() == b"rewritten by something else"


# ---------------------------------------------------------------- N9: a run that produced nothing

CRASHER = "import sys\nprint('loading data... CUDA error: out of memory at batch 0', flush=True)\nsys.exit(1)\n"


def test_finding_field_N9_a_run_that_produced_nothing_can_be_acknowledged_and_its_crash_log_pulled(box, tmp_path):
    res = box.launch("oom", [sys.executable, "-c", CRASHER], "--deadman-dry-run", "--output", "ckpt/*.pt",
                     "--wait")
    assert res.returncode != 0 and box.status("oom")["state"] in ("failed", "sync_failed"), box.status("oom")
    launch(box, "fine")
    assert box.wait_terminal("fine", 60)["state"] == "succeeded"
    runs = box.durable / "runs"
    code, swept = sweep(box.env, runs)
    assert code == 1 and swept["oom"]["verdict"] == "FAILED" and swept["fine"]["verdict"] == "OK", swept
    state = box.status("oom")["state"]

    code, swept = sweep(box.env, runs, "--ack", "oom")
    assert code == 0 and swept["oom"]["verdict"] == "ACKED" and swept["fine"]["verdict"] == "OK", swept
    assert "its outputs are NOT saved" in swept["oom"]["problems"][0], swept["oom"]
    assert box.status("oom")["state"] == state, "the ack never makes the run a success"
    # its crash log is on durable storage under a manifest, and a verified pull brings it home
    results = box.durable / "results" / "oom"
    pulled = subprocess.run([sys.executable, str(NODE.parent / "pull_verified.py"), "--source", str(results),
                             "--dest", str(tmp_path / "pulled")], capture_output=True, text=True, timeout=300)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert "CUDA error: out of memory" in (tmp_path / "pulled" / "oom" / "logs" / "job.log").read_text()
    # later sweeps no longer block on it, ack or not
    code, swept = sweep(box.env, runs)
    assert code == 0 and swept["oom"]["verdict"] == "OK", swept
    text = subprocess.run([sys.executable, str(SWEEP), "--runs-dir", str(runs)], env=box.env, capture_output=True,
                          text=True, timeout=300)
    assert text.returncode == 0 and "SAVED    oom" in text.stdout, text.stdout
    assert "only its record and logs are saved" in text.stdout, text.stdout


def test_finding_field_N9_an_ack_of_an_unknown_run_is_a_usage_error(box):
    (box.durable / "runs").mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, str(SWEEP), "--runs-dir", str(box.durable / "runs"), "--ack", "nope"],
                         env=box.env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--ack nope: no run nope" in res.stderr, res.stderr


# ---------------------------------------------------------------- red-team round 3 findings
import pytest  # noqa: E402


PY = sys.executable
BOOT = str(NODE / "boot_resume.py")
DEADMAN = str(NODE / "deadman.py")


from conftest import run_no_traceback as run  # noqa: E402


@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
@pytest.mark.drill("restart re-arms the dead-man")
def test_boot_sweep_survives_one_damaged_run(tmp_path):
    runs = tmp_path / "durable" / "runs"
    cfg = {"config": {"grace_minutes": 30, "poll_seconds": 1, "dry_run": True}}
    for name, attempt in (("a-damaged", "two"), ("b-fine", 1)):
        rd = runs / name
        rd.mkdir(parents=True)
        (rd / "status.json").write_text(json.dumps({"state": "running", "attempt": attempt, "run_id": name}))
        (rd / "run.json").write_text(json.dumps({"run_id": name, "auto_resume": True, "launch_argv": ["--", "true"],
                                                 "cwd": str(tmp_path)}))
        (rd / "deadman.json").write_text(json.dumps(cfg))
    try:
        res = run([PY, BOOT, "--runs-dir", runs, "--dry-run"])
        assert "b-fine" in res.stdout, res.stdout + res.stderr
    finally:
        for name in ("a-damaged", "b-fine"):
            run([PY, DEADMAN, "ack", "--run-dir", runs / name, "--disarm"])


# ---------------------------------------------------------------------------------------------- final_sweep.py

@pytest.mark.drill("red-team findings stay fixed")
@pytest.mark.usefixtures("one_toolkit_version")
@pytest.mark.drill("sweep keeps runs' files apart")
def test_final_sweep_never_replaces_a_verified_copy_with_another_runs_file(box):  # noqa: F811
    for rid in ("abl-a", "abl-b"):
        job = [PY, "-c", "import os; os.makedirs('out', exist_ok=True); open('out/model.bin', 'w')"
                         ".write('weights of %s')" % rid]
        res = box.launch(rid, job, "--no-deadman", "--output", "out/*", "--wait", timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
    kept = box.durable / "results" / "abl-a" / "out" / "model.bin"
    assert kept.read_text() == "weights of abl-a"
    res = run([PY, SWEEP, "--runs-dir", box.durable / "runs", "--json"], env=box.env)
    assert kept.read_text() == "weights of abl-a", (res.returncode, res.stdout)
    verdicts = {r["run_id"]: r for r in json.loads(res.stdout)["runs"]}
    assert res.returncode == 0 and verdicts["abl-a"]["verdict"] == "OK" and verdicts["abl-b"]["verdict"] == "OK"
    assert [n.split(":")[0] for n in verdicts["abl-a"]["left_alone"]] == ["out/model.bin"]
