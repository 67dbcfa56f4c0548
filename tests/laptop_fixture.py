"""A run launched through rgt.py against the test sshd: the `durable` folder fixture that, on teardown, disarms
every dead-man of the runs under it and ends their processes (by recorded pid only).

    from laptop_fixture import durable  # noqa: F401   (the fixture, by name)
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import NODE


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
