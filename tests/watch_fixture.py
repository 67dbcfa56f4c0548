"""Stand-ins for the watcher drills (test_watchers.py, test_notify_events.py): a stop command that records its
calls, a finished or running run dir, and the dead-man's config as its own parser builds it."""
import json
import sys

from conftest import NODE

sys.path.insert(0, str(NODE))
import deadman  # noqa: E402
import rgt_core as core  # noqa: E402

DEADMAN = str(NODE / "deadman.py")
POLL = "0.05"


def stand_in(folder, name="stop", rc=0, shebang=True):
    """A stop command that appends one line per call to <name>.calls and exits RC."""
    calls = folder / ("%s.calls" % name)
    script = folder / ("%s.sh" % name)
    body = 'echo "%s $*" >> "%s"\nexit %d\n' % (name, calls, rc)
    script.write_text(("#!/bin/sh\n" if shebang else "") + body)
    script.chmod(0o755)
    return str(script), calls


def finished_run(folder, **extra):
    run = folder / "run"
    run.mkdir(parents=True, exist_ok=True)
    doc = {"state": "succeeded", "exit_code": 0, "ended_at": core.utc_iso()}
    doc.update(extra)
    (run / "status.json").write_text(json.dumps(doc))
    return run


def cfg_for(run, *args):
    """The dead-man's config for these arm options, built by its own parser (no process)."""
    ns = deadman.build_parser().parse_args(["arm", "--run-dir", str(run), *map(str, args)])
    cfg, _warnings = deadman.build_config(ns, str(run))
    return cfg


def running_status(run, proc, **extra):
    doc = {"state": "running", "run_id": run.name, "job_pid": proc.pid,
           "job_identity": core.process_identity(proc.pid), "started_at": core.utc_iso()}
    doc.update(extra)
    (run / "status.json").write_text(json.dumps(doc))
