"""A finished run's results for the pull, manifest and gate drills (test_pull.py, test_reconcile.py), and the
verified pull run on it.

The `node` and `profile_env` fixtures in conftest.py are built from these helpers.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import NODE

BUILD = NODE / "build_pull_manifest.py"
PULL = NODE.parent / "pull_verified.py"
GATE = NODE.parent / "teardown_gate.py"
ROSTER = ("ckpt/**", "metrics.jsonl", "final.json")
RUN = "run-7"

PROFILE = {
    "platform": "examplecloud", "title": "Example Cloud", "kind": "container-rental", "verified": "2026-12",
    "sources": ["https://example.com/billing"],
    "billing": {"meter_stop_action": "Terminate the pod (console, or examplectl rm <pod-id>)",
                "meter_stop_destroys": "container disk and volume disk",
                "pause_action": "Stop the pod", "keeps_billing_when_paused": "volume disk at the idle rate",
                "granularity": "per second", "auto_release": None, "os_shutdown_stops_billing": False},
    "storage": [{"tier": "network volume", "path": "/workspace", "survives_pause": True,
                 "survives_destroy": True, "caps": "fixed size", "region_locked": True}],
}


def run(script, *args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


# A legacy-pickle magic byte first: the content check accepts it as a torch checkpoint, the rest is noise.
HEAD = b"\x80\x02GOOD"


def make_results(root: Path, seed: int = 0) -> Path:
    """A finished run's outputs: two checkpoints, metrics, a final summary, and a log NOT in the roster."""
    rng = __import__("random").Random(seed)
    (root / "ckpt" / "sub").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "ckpt" / "epoch_1.pt").write_bytes(HEAD + rng.randbytes(150_000))
    (root / "ckpt" / "sub" / "epoch_2.pt").write_bytes(HEAD + rng.randbytes(90_000))
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1 / (i + 1)}) + "\n"
                                                for i in range(50)))
    (root / "final.json").write_text(json.dumps({"steps_done": 50, "loss": 0.02}))
    (root / "logs" / "train.log").write_text("not part of the roster\n")
    return root


def build(root: Path, roster=ROSTER, run_id=RUN, *extra):
    args = ["--root", root, "--run-id", run_id, *extra]
    for pattern in roster:
        args += ["--roster", pattern]
    return run(BUILD, *args)


def profile_env_for(folder: Path) -> dict:
    """An environment whose profile index (in FOLDER) holds only PROFILE."""
    index = folder / "index.json"
    index.write_text(json.dumps({"generated_by": "tests", "schema_version": 1,
                                 "profiles": {"examplecloud": PROFILE}}))
    return dict(os.environ, RGT_PROFILE_INDEX=str(index))


def node_results(tmp_path: Path) -> Path:
    """Result root 'on the node' with its manifest built (same machine, reached through sshd or locally)."""
    root = make_results(tmp_path / "node dir" / "results")  # a space: quoting must hold end to end
    done = build(root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def pull(source, dest, rsh=None, *extra):
    args = ["--source", source, "--dest", dest, *extra]
    if rsh:
        args += ["--rsh", rsh]
    return run(PULL, *args)


def flip_byte(path: Path, offset: int, mask: int = 0x01):
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))
