"""Job requests and the renderer run on them (test_render_job.py)."""
import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

RENDER = REPO / "scripts" / "render_job.py"
SCHEMA = REPO / "scripts" / "job_request.schema.json"


def request(tmp, **over):
    req = {
        "name": "drill",
        "command": ["train.py", "--steps", "100"],
        "workdir": "/workspace/code",
        "image": "ghcr.io/example/train@sha256:" + "0" * 64,
        "env": {"NCCL_DEBUG": "INFO"},
        "resources": {"nodes": 2, "gpus_per_node": 8, "gpu_type": "H100", "cpus_per_node": 32, "memory_gb": 256,
                      "time_limit_minutes": 720},
        "outputs": {"durable_dir": "/shared/rgt", "roster": ["final.json", "ckpt/ckpt-*.pt"],
                    "pvc": {"claim": "rgt-results", "size_gb": 200}, "bucket": {"name": "rgt-results-x", "store": "s3"}},
        "checkpoint": {"save_seconds": 90, "resume_args": ["--resume", "{latest}"]},
        "deadman": {"max_restarts": 2, "max_hours": 48, "stall_minutes": 30, "idle_minutes": 15},
    }
    for key, value in over.items():
        if value is None:
            req.pop(key, None)
        elif isinstance(value, dict) and isinstance(req.get(key), dict):
            req[key] = {k: v for k, v in dict(req[key], **value).items() if v is not None}
        else:
            req[key] = value
    path = Path(tmp) / ("req-%d.json" % len(list(Path(tmp).glob("req-*.json"))))
    path.write_text(json.dumps(req))
    return path


def render(path, target, *extra, check=True):
    res = subprocess.run([sys.executable, str(RENDER), str(path), "--to", target, *extra], capture_output=True,
                         text=True, timeout=60)
    if check:
        assert res.returncode == 0, res.stderr
    return res
