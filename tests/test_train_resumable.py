"""Fault drills for examples/train_resumable.py (GUIDE §9): kill -9 then resume, SIGTERM save within
5 s, corrupt newest checkpoint, on both the pure-Python and the PyTorch backend.

Every interrupted run is compared with an uninterrupted one: same final parameters (sha256), same
per-step losses and learning rates, steps 1..N each logged exactly once.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, need_module

TRAIN = REPO / "examples" / "train_resumable.py"
STEPS = 24
EVERY = 4
SEED = 7
BACKENDS = ["pure", "torch"]


def base_args(ckpt, backend, *extra):
    return [sys.executable, str(TRAIN), "--ckpt-dir", str(ckpt), "--steps", str(STEPS), "--seed", str(SEED),
            "--backend", backend, *extra]


def clean_env():
    env = dict(os.environ)
    env.pop("RGT_HEARTBEAT", None)
    return env


def run(argv, env=None, timeout=120):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or clean_env(),
                          stdin=subprocess.DEVNULL)


def metrics(ckpt):
    rows = [json.loads(line) for line in (Path(ckpt) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def final(ckpt):
    return json.loads((Path(ckpt) / "final.json").read_text())


def ckpt_steps(ckpt, backend):
    ext = "pt" if backend == "torch" else "json"
    return sorted(int(p.name[5:13]) for p in Path(ckpt).glob("ckpt-*." + ext))


def read_hb(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def wait_for_step(proc, hb, step, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        data = read_hb(hb)
        if data and data.get("step", 0) >= step:
            return data
        if proc.poll() is not None:
            pytest.fail(f"trainer exited {proc.returncode} before step {step}: {proc.stderr.read()[-500:]}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"trainer did not reach step {step} within {timeout}s")


def start(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            stdin=subprocess.DEVNULL)


class Straight:
    """An uninterrupted reference run, started in the background so it overlaps the drills."""

    def __init__(self, backend, ckpt):
        self.backend, self.ckpt = backend, ckpt
        self.proc = start(base_args(ckpt, backend, "--ckpt-every", str(EVERY)))
        self._done = False

    def wait(self):
        if not self._done:
            _out, err = self.proc.communicate(timeout=120)
            assert self.proc.returncode == 0, err
            self.final, self.metrics = final(self.ckpt), metrics(self.ckpt)
            self._done = True
        return self


@pytest.fixture(scope="module", params=BACKENDS)
def straight(request, tmp_path_factory):
    backend = request.param
    if backend == "torch":
        need_module("torch")
    ref = Straight(backend, tmp_path_factory.mktemp("straight-" + backend) / "ckpt")
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.communicate()


def test_help_is_fast_and_imports_no_third_party_module():
    res = run([sys.executable, str(TRAIN), "--help"])     # fast because of the import check below
    assert res.returncode == 0 and "--ckpt-dir" in res.stdout
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', %r); "
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
             "print(sorted(n for n in ('torch', 'numpy') if n in sys.modules))" % str(TRAIN))
    res = run([sys.executable, "-c", probe])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def stop_and_collect(proc, sig):
    t0 = time.time()
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    elapsed = time.time() - t0
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return rc, elapsed, t0, err


@pytest.mark.long
@pytest.mark.drill("kill-9 mid-epoch resumes")
@pytest.mark.drill("SIGTERM saves within grace")
def test_sigterm_then_kill9_then_resume_matches_uninterrupted_run(straight, tmp_path):
    """Drill 1: SIGTERM -> checkpoint + exit 143 within 5 s. Drill 2: kill -9 mid-run -> the relaunch
    continues from the newest checkpoint. The end result equals the uninterrupted run's, bit for bit."""
    backend = straight.backend
    ckpt, hb = tmp_path / "ckpt", tmp_path / "hb.json"

    # 1. no periodic checkpoint yet, so the only one on disk must come from the signal
    proc = start(base_args(ckpt, backend, "--ckpt-every", "1000", "--step-seconds", "0.05", "--heartbeat", str(hb)))
    wait_for_step(proc, hb, 6)
    assert ckpt_steps(ckpt, backend) == []
    rc, elapsed, t0, err = stop_and_collect(proc, signal.SIGTERM)
    assert rc == 143, err
    saved = ckpt_steps(ckpt, backend)
    assert len(saved) == 1 and saved[0] >= 6, saved
    # The drill is "saved within the 5 s grace": the checkpoint's own time says when it landed. How long the
    # interpreter then takes to exit depends on the box's load (7 s seen on a loaded 2-core box), so it is
    # printed, not bounded.
    landed = next(ckpt.glob("ckpt-*")).stat().st_mtime - t0
    print("SIGTERM: checkpoint on disk after %.2f s, process gone after %.2f s" % (landed, elapsed))
    assert landed < 5, "the SIGTERM checkpoint landed %.2f s after the signal" % landed
    assert read_hb(hb)["step"] == saved[0]
    assert [m["step"] for m in metrics(ckpt)] == list(range(1, saved[0] + 1))
    first_stop = saved[0]

    # 2. relaunch (cadence is not part of the run config), then kill -9 between checkpoints
    proc = start(base_args(ckpt, backend, "--ckpt-every", str(EVERY), "--step-seconds", "0.05",
                           "--heartbeat", str(hb)))
    wait_for_step(proc, hb, first_stop + 6)
    rc, _elapsed, _t0, err = stop_and_collect(proc, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert not (ckpt / "final.json").exists()
    survivors = ckpt_steps(ckpt, backend)
    assert survivors[-1] > first_stop and len(survivors) <= 2, survivors    # --keep 2
    last = survivors[-1]

    # 3. the identical command finishes the run
    res = run(base_args(ckpt, backend, "--ckpt-every", str(EVERY)))
    assert res.returncode == 0, res.stderr
    fin = final(ckpt)
    assert fin["resumed_from"] == last                     # the newest checkpoint, not step 0
    assert fin["steps_done"] == STEPS
    assert [m["step"] for m in metrics(ckpt)] == list(range(1, STEPS + 1))   # unique and contiguous
    ref = straight.wait()
    assert metrics(ckpt) == ref.metrics                    # same loss and LR at every step
    assert fin["params_sha256"] == ref.final["params_sha256"]


@pytest.mark.drill("kill-9 mid-save keeps last good")
def test_corrupt_newest_checkpoint_falls_back_to_previous(straight, tmp_path):
    ref = straight.wait()
    backend = ref.backend
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ref.ckpt, ckpt)
    (ckpt / "final.json").unlink()
    newest = sorted(ckpt.glob("ckpt-*"))[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])                        # a save cut short
    partial = ckpt / (".ckpt-%08d.%s.x1y2.tmp" % (STEPS + EVERY, newest.suffix[1:]))
    partial.write_bytes(b"partial")                                   # a temp file left by a kill
    res = run(base_args(ckpt, backend, "--ckpt-every", str(EVERY)))
    assert res.returncode == 0, res.stderr
    fin = final(ckpt)
    assert fin["resumed_from"] == STEPS - EVERY
    assert fin["params_sha256"] == ref.final["params_sha256"]
    assert metrics(ckpt) == ref.metrics
    assert (ckpt / (newest.name + ".corrupt")).exists()               # kept aside as evidence
    assert not partial.exists()
    assert "unusable" in res.stderr


def test_straight_run_outputs(straight):
    ref = straight.wait()
    fin, ckpt, backend = ref.final, ref.ckpt, ref.backend
    assert fin["steps_done"] == STEPS and fin["backend"] == backend and fin["resumed_from"] is None
    assert len(fin["params_sha256"]) == 64 and isinstance(fin["loss"], float)
    assert [m["step"] for m in ref.metrics] == list(range(1, STEPS + 1))
    assert ckpt_steps(ckpt, backend) == [STEPS - EVERY, STEPS]          # --keep 2 by default
    assert (ckpt / fin["model_file"]).is_file() and fin["model_file"].startswith("model_final.")
    assert not [p.name for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    lrs = [m["lr"] for m in ref.metrics]
    assert lrs[0] > lrs[-1]                                              # the scheduler moved


def test_rerun_of_finished_run_is_idempotent(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = run(base_args(ckpt, "pure"))
    assert first.returncode == 0, first.stderr
    before = final(ckpt)
    again = run(base_args(ckpt, "pure"))
    assert again.returncode == 0, again.stderr
    after = final(ckpt)
    assert after["params_sha256"] == before["params_sha256"] and after["steps_done"] == STEPS
    assert [m["step"] for m in metrics(ckpt)] == list(range(1, STEPS + 1))


def test_unreadable_checkpoints_refuse_instead_of_restarting(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for step in (4, 8):
        (ckpt / ("ckpt-%08d.json" % step)).write_text("{not json")
    res = run(base_args(ckpt, "pure"))
    assert res.returncode == 1
    assert "none loads" in res.stderr and "Traceback" not in res.stderr
    assert not (ckpt / "final.json").exists()


def test_other_config_or_backend_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    assert run(base_args(ckpt, "pure", "--ckpt-every", "4")).returncode == 0
    (ckpt / "final.json").unlink()
    res = run([sys.executable, str(TRAIN), "--ckpt-dir", str(ckpt), "--steps", str(STEPS), "--seed", "8",
               "--backend", "pure"])
    assert res.returncode == 2 and "seed" in res.stderr and "Traceback" not in res.stderr
    res = run(base_args(ckpt, "torch"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run(base_args(ckpt, "auto"))                                # auto follows the files on disk
    assert res.returncode == 0 and final(ckpt)["backend"] == "pure"


def test_heartbeat_from_environment(tmp_path):
    ckpt, hb = tmp_path / "ckpt", tmp_path / "run" / "heartbeat.json"
    hb.parent.mkdir()
    env = clean_env()
    env["RGT_HEARTBEAT"] = str(hb)
    t0 = time.time()
    res = run(base_args(ckpt, "pure"), env=env)
    assert res.returncode == 0, res.stderr
    data = json.loads(hb.read_text())
    assert {"step", "total_steps", "epoch", "loss", "time"} <= set(data)
    assert data["step"] == data["total_steps"] == STEPS
    assert isinstance(data["time"], float) and t0 - 1 <= data["time"] <= time.time() + 1
    assert not [p for p in hb.parent.iterdir() if p.name != "heartbeat.json"]   # no temp left behind


def test_bad_arguments_exit_2(tmp_path):
    res = run([sys.executable, str(TRAIN), "--ckpt-dir", str(tmp_path), "--steps", "0"])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = run([sys.executable, str(TRAIN), "--steps", "5"])
    assert res.returncode == 2
