#!/usr/bin/env python3
"""boot_resume.py: after the box restarts, put every unfinished run back under watch.

A restart (an interruptible instance resuming, a VM or workstation reboot) kills the job, its
supervisor and its dead-man together; status.json still says running and the box bills idle. Run
this once at boot (the profile says which hook: vast.ai's on-start script, a container start
command, `@reboot` cron or a systemd unit). For each run under --runs-dir whose status says
starting/running/stalled/syncing but whose supervisor and job are gone:
  - the run opted in (run_one.sh --auto-resume) and has attempts left (--max-attempts, default 3):
    the recorded launch is replayed word for word in the job's cwd, as the next attempt; its resume
    adapters pick the newest good checkpoint and run_one.sh arms a fresh dead-man first;
  - otherwise, or with no attempts left: the run is marked failed ("the node restarted") and a
    dead-man is armed on it (the run's profile's stop), so the meter stops after the grace period
    unless someone acknowledges.
Runs with a live supervisor, and finished runs, are left alone.

Usage:
  boot_resume.py --runs-dir DIR [--runs-dir DIR]... [--dry-run] [--json]

  @reboot  python3 ~/rgt-bin/boot_resume.py --runs-dir /workspace/durable/runs >> ~/rgt/boot.log 2>&1

--dry-run says what it would do and changes nothing. Output: one line per run acted on (or JSON).

Exit codes: 0 every orphaned run was resumed or re-armed (or there was none); 1 something could not
be done (its line says what); 2 usage.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rgt_core as core  # noqa: E402

DROP_ON_REPLAY = ("--wait", "--json")  # a boot hook must not block, and reads no JSON


def orphaned(run_dir):
    """(status, run) when the run should be running but nothing of it is alive, else None."""
    status = core.read_json(os.path.join(run_dir, "status.json"))
    if status.get("state") not in core.ACTIVE_RUN_STATES:
        return None
    alive = (core.record_alive(status.get("supervisor_identity"), status.get("supervisor_pid"))
             or core.record_alive(status.get("job_identity"), status.get("job_pid")))
    if alive:
        return None
    return status, core.read_json(os.path.join(run_dir, "run.json"))


def replay_argv(run):
    words = list(run.get("launch_argv") or [])
    cut = words.index("--") if "--" in words else len(words)
    return [w for w in words[:cut] if w not in DROP_ON_REPLAY] + words[cut:]


def rearm_args(run_dir):
    """The killed dead-man's own settings (deadman.json), so the new one keeps its stop and clocks."""
    cfg = core.read_json(os.path.join(run_dir, "deadman.json")).get("config") or {}
    out = []
    for key, flag in (("grace_minutes", "--grace-minutes"), ("stall_minutes", "--stall-minutes"),
                      ("poll_seconds", "--poll-seconds")):
        if isinstance(cfg.get(key), (int, float)) and not isinstance(cfg.get(key), bool):
            out += [flag, str(cfg[key])]
    if cfg.get("stop_cmd_source") == "--stop-cmd" and cfg.get("stop_cmd"):
        out += ["--stop-cmd", cfg["stop_cmd"]] + (["--stop-cmd-destructive"] if cfg.get("destructive") else [])
    if cfg.get("fallback_stop_cmd"):
        out += ["--fallback-stop-cmd", cfg["fallback_stop_cmd"]]
    out += ["--dry-run"] if cfg.get("dry_run") else []
    out += ["--allow-destructive"] if cfg.get("allow_destructive") else []
    return out


def mark_failed(run_dir, status, why):
    status.update(state="failed", error=why, ended_at=status.get("ended_at") or core.utc_iso(),
                  updated_at=core.utc_iso())
    core.atomic_write_json(os.path.join(run_dir, "status.json"), status)


def resume(run_dir, status, run, dry_run):
    attempt = int(status.get("attempt") or 1)
    cap = int(run.get("max_attempts") or 3)
    argv = replay_argv(run)
    cwd = run.get("cwd")
    why_not = None
    if not run.get("auto_resume"):
        why_not = "not launched with --auto-resume"
    elif not argv:
        why_not = "run.json has no recorded launch"
    elif attempt >= cap:
        why_not = "attempt %d of at most %d already used" % (attempt, cap)
    elif not cwd or not os.path.isdir(cwd):
        why_not = "the job's cwd %r is gone" % cwd
    if why_not is None:
        cmd = ["bash", os.path.join(HERE, "run_one.sh")] + argv
        if dry_run:
            return {"run_dir": run_dir, "action": "would resume", "attempt": attempt + 1, "ok": True}
        mark_failed(run_dir, status, "the node restarted during attempt %d; resumed as attempt %d" % (attempt, attempt + 1))
        started = time.monotonic()
        res = core.run_bounded(cmd, 600, cwd=cwd)
        return {"run_dir": run_dir, "action": "resumed", "attempt": attempt + 1, "ok": res.rc == 0,
                "seconds_to_launch": round(time.monotonic() - started, 1),
                "detail": res.output.strip().splitlines()[-1:] if res.rc else None}
    if dry_run:
        return {"run_dir": run_dir, "action": "would re-arm the dead-man", "why": why_not, "ok": True}
    mark_failed(run_dir, status, "the node restarted during attempt %d (%s)" % (attempt, why_not))
    arm = [sys.executable, os.path.join(HERE, "deadman.py"), "arm", "--run-dir", run_dir] + rearm_args(run_dir)
    res = core.run_bounded(arm, 60)
    return {"run_dir": run_dir, "action": "re-armed the dead-man", "why": why_not, "ok": res.rc == 0,
            "detail": res.output.strip().splitlines()[-1:] if res.rc else None}


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog="boot_resume.py", description="After a restart: resume or re-arm unfinished runs.")
    parser.add_argument("--runs-dir", action="append", required=True, help="a runs dir (DURABLE_DIR/runs)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    for runs in args.runs_dir:
        if not os.path.isdir(runs):
            raise core.UsageError("--runs-dir %s is not a directory" % runs)
    results = []
    for runs in args.runs_dir:
        for name in sorted(os.listdir(runs)):
            run_dir = os.path.join(os.path.abspath(runs), name)
            found = orphaned(run_dir) if os.path.isdir(run_dir) else None
            if found:
                results.append(resume(run_dir, found[0], found[1], args.dry_run))
    ok = all(r["ok"] for r in results)
    if args.json:
        core.emit_json({"ok": ok, "runs": results})
    else:
        for r in results:
            print("%s %s: %s%s" % (core.OK if r["ok"] else core.FAIL, os.path.basename(r["run_dir"]), r["action"],
                                   (" (%s)" % r["why"]) if r.get("why") else
                                   (" as attempt %d" % r["attempt"]) if r.get("attempt") else ""))
        if not results:
            print("%s no unfinished run to resume or re-arm" % core.OK)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="boot_resume.py"))
