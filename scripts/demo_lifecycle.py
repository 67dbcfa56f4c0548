#!/usr/bin/env python3
"""Runs the whole lifecycle on this machine (local profile, Python and bash); exit 0 only when all evidence checks.

  probe → gate → dead-man armed → run → interrupted (SIGTERM, as a spot preemption) → resumed →
  manifest → pull → verify → teardown gate (and a gate that refuses a changed node) → a hung job
  that the dead-man ends and stops the (stand-in) meter for, with no one watching → a verified stop: the
  dead-man stops a box through a stand-in of RunPod's API and reads the state back (confirmed), and the
  same against an API that answers 200 and stops nothing (STOP NOT CONFIRMED, escalated) → a hung box
  (job and dead-man frozen) that the laptop's reaper stops from outside through a vast.ai stand-in

The "node" and the "laptop" are two folders in a temporary directory; the pull goes through the same
code that pulls over SSH. Needs Python 3.8+ and bash; tmux and rsync are used when present. Uses
PyTorch (CPU) for the example training when it is installed, a pure-Python model otherwise.

Usage:
  python3 scripts/demo_lifecycle.py            # about 30 seconds; cleans up after itself
  python3 scripts/demo_lifecycle.py --keep     # leave the folders to inspect
  python3 scripts/demo_lifecycle.py --json     # the final report as JSON on stdout
  python3 scripts/demo_lifecycle.py --workdir DIR   # build the node and laptop folders under DIR

Exit codes: 0 every phase showed what it should; 1 a phase failed (the report says which);
2 usage or a missing part of the skill.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "node"))
import rgt_core as core  # noqa: E402  (one-line usage errors, the exit-code contract)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
NODE = SCRIPTS / "node"
TRAIN = ROOT / "examples" / "train_resumable.py"
STEPS = 60
STEP_SECONDS = 0.08


class PhaseFailed(Exception):
    pass


class Demo:
    def __init__(self, work: Path, quiet: bool):
        self.work = work
        self.node = work / "node"          # stands in for the rented box
        self.laptop = work / "laptop"      # stands in for the user's machine
        self.durable = self.node / "durable"
        self.job_dir = self.node / "job"   # the job's working directory
        self.quiet = quiet
        self.report = []
        self.started = time.monotonic()
        self.env = dict(os.environ, RGT_PROFILE_INDEX=str(ROOT / "profiles" / "index.json"),
                        DURABLE_DIR=str(self.durable), DATA_DIR=str(self.node / "data"))
        for d in (self.node, self.laptop, self.durable, self.job_dir, self.node / "data"):
            d.mkdir(parents=True, exist_ok=True)

    # -- plumbing ---------------------------------------------------------------------------

    def say(self, text=""):
        if not self.quiet:
            print(text, flush=True)

    def run(self, argv, expect=(0,), timeout=120, cwd=None):
        res = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                             cwd=cwd or self.work, env=self.env, stdin=subprocess.DEVNULL)
        if res.returncode not in expect:
            tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
            raise PhaseFailed(f"{Path(str(argv[1])).name if len(argv) > 1 else argv[0]} exited "
                              f"{res.returncode} (expected {expect}): " + " | ".join(tail))
        return res

    def py(self, script, *args, **kw):
        return self.run([sys.executable, (NODE if (NODE / script).exists() else SCRIPTS) / script, *args], **kw)

    def phase(self, name, evidence):
        now = time.monotonic()
        took, self.phase_start = now - getattr(self, "phase_start", self.started), now
        self.report.append({"phase": name, "ok": True, "evidence": evidence, "seconds": round(took, 1)})
        self.say(f"  OK   {name:<14} {evidence}  [{took:.0f}s]")

    def launch(self, run_id, extra_train=()):
        argv = ["bash", NODE / "run_one.sh", "--profile", "local", "--run-id", run_id,
                "--run-dir", self.node / "runs" / run_id, "--durable-dir", self.durable,
                "--output", "ckpt/final.json", "--output", "ckpt/metrics.jsonl", "--output", "ckpt/model_final.*",
                "--disk-floor-gb", "0.01", "--stall-minutes", "5", "--grace-minutes", "1",
                "--deadman-dry-run", "--",
                sys.executable, TRAIN, "--ckpt-dir", "ckpt", "--steps", str(STEPS),
                "--step-seconds", str(STEP_SECONDS), "--ckpt-every", "10", *extra_train]
        return self.run(argv, cwd=self.job_dir)

    def status(self, run_dir):
        res = self.py("run_status.py", run_dir, "--json", expect=(0, 1, 4, 5, 6, 7))
        return res.returncode, json.loads(res.stdout)

    def wait_for(self, run_dir, predicate, what, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            code, st = self.status(run_dir)
            if predicate(code, st):
                return code, st
            time.sleep(0.2)
        raise PhaseFailed(f"timed out waiting for {what}")

    # -- the lifecycle ----------------------------------------------------------------------

    def go(self):
        self.say(f"remote-gpu-trainer demo — node and laptop folders under {self.work}\n")

        probe = json.loads(self.py("node_probe.py", "--json", "--data-dir", self.node / "data",
                                   "--durable-dir", self.durable).stdout)
        count = (probe.get("gpus") or {}).get("count")
        gpu_text = f"{count} GPU(s)" if count else "no GPU (CPU run)"
        self.phase("probe", f"{gpu_text}; disks and inodes read for data, durable, /, /dev/shm, HOME")

        self.py("node_probe.py", "--data-dir", self.node / "data", "--durable-dir", self.durable,
                "--min-free-gb", "0.01", "--min-free-inodes", "100")
        refused = self.py("node_probe.py", "--data-dir", self.node / "data", "--durable-dir", self.durable,
                          "--min-free-gb", "1000000", expect=(3,))
        self.phase("gate", "passes a sane floor; refuses a 1 PB floor with exit 3 "
                           f"({refused.stderr.strip().splitlines()[0][:70]}…)")

        run1 = self.node / "runs" / "demo-1"
        self.launch("demo-1")
        dm = json.loads((run1 / "deadman.json").read_text())
        self.phase("dead-man", f"armed before the job (pid {dm.get('pid')}, dry-run: would stop the meter "
                               "on stall, unacknowledged end, or wall-clock cap)")

        code, st = self.wait_for(run1, lambda c, s: c == 4 and (s.get("step") or 0) >= 25, "the job to pass step 25")
        self.phase("run", f"detached; heartbeat at step {st.get('step')}/{st.get('total_steps')}")

        status1 = json.loads((run1 / "status.json").read_text())
        os.killpg(os.getpgid(int(status1["job_pid"])), signal.SIGTERM)   # what a spot reclaim sends
        code, st = self.wait_for(run1, lambda c, s: c in (0, 1), "the job to stop after SIGTERM", timeout=20)
        saved = json.loads((run1 / "status.json").read_text())
        ckpts = sorted(p.name for p in (self.job_dir / "ckpt").iterdir() if "ckpt" in p.name or p.suffix == ".pt")
        self.phase("interrupt", f"SIGTERM → checkpoint saved, job exit {saved.get('exit_code')}; "
                                f"checkpoints on disk: {', '.join(ckpts[-2:]) or 'none'}")
        # Attempt 2 in the same run dir: the recorded launch replayed (what `rgt.py resume` runs on the node);
        # attempt 1's dead-man, still armed, hands the run over to the one attempt 2 arms.
        old_dm = json.loads((run1 / "deadman.json").read_text()).get("pid")
        resumed = json.loads(self.py("boot_resume.py", "--run", run1, "--json").stdout)
        code, st = self.wait_for(run1, lambda c, s: c in (0, 1) and s.get("attempt") == 2,
                                 "attempt 2 to finish", timeout=90)
        if code != 0:
            raise PhaseFailed(f"attempt 2 ended {st.get('state')}: see {run1 / 'job.log'}")
        final = json.loads((self.job_dir / "ckpt" / "final.json").read_text())
        sync = json.loads((run1 / "status.json").read_text()).get("sync") or {}
        if not sync.get("verified"):
            raise PhaseFailed(f"the durable sync did not verify: {sync.get('error')}")
        new_dm = json.loads((run1 / "deadman.json").read_text()).get("pid")
        self.phase("resume", f"attempt {resumed.get('attempt')} in the same run dir restarted from step "
                             f"{final.get('resumed_from')}, finished {final.get('steps_done')}/{STEPS}; dead-man "
                             f"handed over (pid {old_dm} -> {new_dm}); {sync.get('file_count')} files synced to "
                             "durable and hash-verified")
        self.py("deadman.py", "ack", "--run-dir", run1, "--disarm")

        results = Path(sync["results_dir"])
        man = json.loads((results / "PULL_MANIFEST.json").read_text())
        self.phase("manifest", f"{man.get('file_count')} files, {man.get('total_bytes')} bytes, SHA-256 each, "
                               "written by the sync itself")

        pulled = self.laptop / "pulled"
        self.py("pull_verified.py", "--source", results, "--dest", pulled, "--json")
        verified = json.loads((pulled / "demo-1" / "PULL_VERIFIED.json").read_text())
        self.phase("pull", f"staged, then promoted to {pulled / 'demo-1'}")
        self.phase("verify", f"{verified.get('file_count')} files match the manifest "
                             f"(manifest sha256 {str(verified.get('manifest_sha256'))[:12]}…)")

        # The gate re-hashes the node's files now; change one byte there after the pull and it must refuse.
        gate = self.py("teardown_gate.py", "--pulled", pulled / "demo-1", "--source", results, "--profile", "local")
        victim = next(results / e["path"] for e in man["files"] if e["path"].endswith(".jsonl"))
        original = victim.read_bytes()
        victim.write_bytes(original[:-2] + (b"0" if original[-2:-1] != b"0" else b"1") + original[-1:])
        stale = self.py("teardown_gate.py", "--pulled", pulled / "demo-1", "--source", results,
                        "--profile", "local", expect=(3,))
        victim.write_bytes(original)
        first = [l for l in gate.stdout.splitlines() if l.strip()][:1]
        self.phase("teardown gate", f"passes on the verified pull ({first[0][:60] if first else 'exit 0'}…); "
                                    "refuses (exit 3) once a node file changes after the pull")
        self.hang_drill()
        self.verified_stop_drill()
        self.reaper_drill()
        return stale

    def hang_drill(self):
        """A job that is alive but silent: the dead-man must end it and stop the meter on its own."""
        marker = self.node / "METER_STOPPED"
        stand_in = f"{sys.executable} -c \"open({str(marker)!r}, 'w').write('stand-in meter stop')\""
        run3 = self.node / "runs" / "demo-hang"
        self.run(["bash", NODE / "run_one.sh", "--profile", "local", "--run-id", "demo-hang",
                  "--run-dir", run3, "--durable-dir", self.durable, "--disk-floor-gb", "0.01",
                  "--stall-minutes", "0.05", "--poll-seconds", "0.5",
                  "--deadman-arg", "--stop-cmd", "--deadman-arg", stand_in,
                  "--deadman-arg", "--term-grace-seconds", "--deadman-arg", "5", "--",
                  sys.executable, "-c", "import time; time.sleep(120)"], cwd=self.job_dir)
        deadline = time.time() + 30
        while time.time() < deadline and not ((run3 / "DEADMAN_FIRED.json").exists() and marker.exists()):
            time.sleep(0.2)
        if not marker.exists():
            raise PhaseFailed("the dead-man did not stop the (stand-in) meter for a hung job")
        fired = json.loads((run3 / "DEADMAN_FIRED.json").read_text())
        term = fired.get("job_term") or {}
        self.phase("dead-man fires", f"hung job (alive, no heartbeat): reason {fired.get('reason')}, job got "
                                     f"SIGTERM (exited: {term.get('job_exited')}), then the stand-in meter stop ran")

    def verified_stop_drill(self):
        """The stop is only counted once the provider's state says so (tools/provider_standins.py, a RunPod API
        held to the runpod SDK by the tests): a confirmed stop, then a 200 that stops nothing."""
        sys.path.insert(0, str(ROOT / "tools"))
        from provider_standins import Instance, StandIn
        seen = {}
        for mode in ("normal", "never_stops"):
            run = self.node / "runs" / ("demo-stop-" + mode)
            run.mkdir(parents=True, exist_ok=True)
            (run / "status.json").write_text(json.dumps({"state": "succeeded", "exit_code": 0, "run_id": run.name}))
            with StandIn("runpod", "demo-key", [Instance("pod-demo", mode=mode)]) as api:
                env = dict(self.env, RUNPOD_POD_ID="pod-demo", RUNPOD_API_KEY="demo-key", RGT_RUNPOD_API_URL=api.url)
                # The path the box runs: dead-man -> stop engine -> providers.py subprocess -> the API. Confirmation
                # is shrunk to 2 reads over 0.2 s; this laptop survives any stop, so no still-up check.
                env.update(RGT_PROVIDER_CONFIRM_READS="2", RGT_PROVIDER_CONFIRM_SPAN_S="0.2")
                proc = subprocess.Popen([sys.executable, str(NODE / "deadman.py"), "arm", "--run-dir", str(run),
                                         "--foreground", "--profile", "runpod", "--grace-minutes", "0",
                                         "--poll-seconds", "0.1", "--confirm-seconds", "1", "--retries", "2",
                                         "--retry-backoff", "0", "--still-up-seconds", "0",
                                         "--stop-retry-minutes", "0.005"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=env)
                try:   # NOT CONFIRMED is retried until acknowledged: wait for one retry, then ACK it
                    deadline = time.time() + 60
                    while proc.poll() is None and time.time() < deadline:
                        doc = json.loads((run / "DEADMAN_FIRED.json").read_text()) \
                            if (run / "DEADMAN_FIRED.json").exists() else {}
                        if (doc.get("stop_retry") or {}).get("tries", 0) >= 1:
                            subprocess.run([sys.executable, str(NODE / "deadman.py"), "ack", "--run-dir", str(run)],
                                           capture_output=True, env=env, timeout=60)
                            break
                        time.sleep(0.1)
                    proc.wait(timeout=60)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
            fired = json.loads((run / "DEADMAN_FIRED.json").read_text())
            seen[mode] = fired
        ok, bad = seen["normal"], seen["never_stops"]
        if not (ok.get("confirmed") is True and bad.get("confirmed") is False and bad.get("escalations")):
            raise PhaseFailed("the provider stand-in did not give a confirmed stop and a NOT CONFIRMED one "
                              "(confirmed: %s / %s)" % (ok.get("confirmed"), bad.get("confirmed")))
        self.phase("verified stop", "RunPod stand-in: stop sent, state read back EXITED: confirmed; an API that "
                                    "says 200 and keeps running: STOP NOT CONFIRMED after %d attempt(s), escalated, "
                                    "retried %d time(s) until acknowledged"
                   % (len(bad.get("attempts") or []), (bad.get("stop_retry") or {}).get("tries", 0)))

    def reaper_drill(self):
        """The backstop off the box (scripts/reap.py): the whole box hangs, job and dead-man alike (SIGSTOP), so
        nothing on it renews the run's lease; the laptop's reaper sees the lease run out and stops the instance
        through a vast.ai stand-in, reading the state back. The laptop reaches this 'node' through a local ssh
        stand-in (the demo needs no sshd); the ledger row is the one `rgt.py launch --instance` writes."""
        sys.path.insert(0, str(ROOT / "tools"))
        from provider_standins import Instance, StandIn
        run = self.node / "runs" / "demo-hung-box"
        self.run(["bash", NODE / "run_one.sh", "--profile", "local", "--run-id", run.name, "--run-dir", run,
                  "--durable-dir", self.durable, "--disk-floor-gb", "0.01", "--poll-seconds", "0.2",
                  "--deadman-dry-run", "--deadman-arg", "--lease-ttl-seconds", "--deadman-arg", "1", "--",
                  sys.executable, "-c", "import time; time.sleep(120)"], cwd=self.job_dir)
        deadline = time.time() + 30
        while time.time() < deadline and not (run / "lease.json").exists():
            time.sleep(0.1)
        pids = [json.loads((run / name).read_text()).get(key) for name, key in
                (("status.json", "job_pid"), ("status.json", "supervisor_pid"), ("deadman.json", "pid"))]
        for pid in filter(None, pids):
            os.kill(pid, signal.SIGSTOP)          # the box hangs: nothing on it runs any more
        self.frozen = [p for p in pids if p]
        bin_dir = self.laptop / "bin"             # `ssh HOST CMD` runs CMD here; `ssh -G` names the box
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "ssh").write_text('#!/bin/sh\ncase " $* " in *" -G "*) printf "user demo\\nhostname node\\n'
                                     'port 22\\n"; exit 0;; *" -O "*) exit 0;; esac\nfor last; do :; done\n'
                                     'exec sh -c "$last"\n')
        (bin_dir / "ssh").chmod(0o755)
        ledger = self.laptop / "ledger.jsonl"
        ledger.write_text(json.dumps({"event": "launch", "host": "node", "box": "demo@node:22", "run_id": run.name,
                                      "run_dir": str(run), "profile": "local", "state": "launched", "attempt": 1,
                                      "instance": "vastai:777", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                       time.gmtime())}) + "\n")
        lease = json.loads((run / "lease.json").read_text())
        while time.time() < lease["renewed_at"] + lease["ttl_s"] + 0.5:
            time.sleep(0.1)
        with StandIn("vastai", "demo-key", [Instance("777", lag=0)]) as api:
            env = dict(self.env, PATH="%s%s%s" % (bin_dir, os.pathsep, os.environ.get("PATH", "")),
                       VAST_API_KEY="demo-key", RGT_VASTAI_API_URL=api.url, HOME=str(self.laptop),
                       # the stop's confirmation: 2 reads 0.2 s apart here (a real reap reads 3 over 20 s)
                       RGT_PROVIDER_CONFIRM_READS="2", RGT_PROVIDER_CONFIRM_SPAN_S="0.2")
            res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(ledger), "--node-dir",
                                  str(NODE), "reap", "--json", "--unwatched-grace-minutes", "0", "--poll-seconds",
                                  "0"], capture_output=True, text=True, env=env, timeout=120)
            state = api.instances["777"].state
        try:
            decision = json.loads(res.stdout)["decisions"][0]
        except (ValueError, IndexError, KeyError):
            raise PhaseFailed("rgt.py reap gave no decision (exit %d): %s" % (res.returncode, res.stderr[-300:]))
        if not (res.returncode == 0 and decision.get("rule") == "unwatched" and decision.get("confirmed")
                and state == "stopped"):
            raise PhaseFailed("the reaper did not stop the hung box: %s" % decision.get("why"))
        self.phase("reaper", "box hung (job and dead-man stopped): the lease ran out, `rgt.py reap` stopped the "
                             "instance through the vast.ai stand-in and read it back: %s" % state)

    def cleanup(self):
        """Stop anything the demo left running: dead-men and tmux sessions of its runs."""
        for pid in getattr(self, "frozen", ()):       # the reaper phase's hung box wakes to be ended
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        for run_dir in (self.node / "runs").glob("*") if (self.node / "runs").exists() else []:
            subprocess.run([sys.executable, str(NODE / "deadman.py"), "ack", "--run-dir", str(run_dir),
                            "--disarm"], capture_output=True, env=self.env)
            try:  # a disarmed dead-man exits at its next poll; the demo does not wait for that
                sys.path.insert(0, str(NODE))
                import rgt_core   # its recorded identity, not its command line, says it is still that dead-man
                watched = rgt_core.deadman_state(str(run_dir))
                if watched.get("watching") and watched.get("pid"):
                    os.kill(int(watched["pid"]), signal.SIGTERM)
            except (OSError, ValueError, ImportError):
                pass
            try:
                pid = int(json.loads((run_dir / "status.json").read_text()).get("job_pid") or 0)
                if pid:
                    os.killpg(os.getpgid(pid), signal.SIGTERM)
            except (OSError, ValueError, json.JSONDecodeError):
                pass
            if shutil.which("tmux"):
                subprocess.run(["tmux", "kill-session", "-t", f"rgt-{run_dir.name}"], capture_output=True)


def main(argv=None) -> int:
    ap = core.Parser(description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--keep", action="store_true", help="leave the node and laptop folders to inspect")
    ap.add_argument("--json", action="store_true", help="print the final report as JSON")
    ap.add_argument("--workdir", type=Path, help="use this (empty or new) folder instead of a temporary one")
    args = ap.parse_args(argv)

    needed = [NODE / n for n in ("node_probe.py", "run_one.sh", "deadman.py", "run_status.py", "build_pull_manifest.py")]
    needed += [SCRIPTS / n for n in ("pull_verified.py", "teardown_gate.py")]
    needed += [TRAIN, ROOT / "profiles" / "index.json"]
    missing = [str(p.relative_to(ROOT)) for p in needed if not p.exists()]
    if missing:
        print(f"error: this checkout lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    if shutil.which("bash") is None:
        print("error: bash is required", file=sys.stderr)
        return 2
    if args.workdir:
        there = os.path.abspath(args.workdir)
        while not os.path.lexists(there):   # the part of the path that exists already
            there = os.path.dirname(there)
        if not os.path.isdir(there):
            print(f"error: --workdir {args.workdir}: {there} is not a directory", file=sys.stderr)
            return 2
    if args.workdir and args.workdir.exists() and any(args.workdir.iterdir()):
        print(f"error: --workdir {args.workdir} is not empty", file=sys.stderr)
        return 2
    work = args.workdir.resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="rgt-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    demo = Demo(work, quiet=args.json)
    started = time.time()
    ok = True
    try:
        demo.go()
    except PhaseFailed as exc:
        ok = False
        demo.report.append({"phase": "failed", "ok": False, "evidence": str(exc)})
        print(f"  FAIL {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        ok = False
        print("  interrupted", file=sys.stderr)
    finally:
        demo.cleanup()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.time() - started
    if args.json:
        print(json.dumps({"ok": ok, "seconds": round(elapsed, 1), "workdir": str(work) if args.keep else None,
                          "phases": demo.report}, indent=2))
    else:
        done = sum(p["ok"] for p in demo.report)
        print(f"\n{'PASS' if ok else 'FAIL'}: {done} phases in {elapsed:.0f}s. "
              + (f"Inspect: {work}" if args.keep else "Temporary folders removed (--keep to inspect)."))
        if ok:
            print("On a real box: the same scripts, with --profile <platform> and pull_verified.py --source "
                  "gpu-box:<dir> --rsh 'ssh -F <config>'. Read SKILL.md first.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="demo_lifecycle.py"))
