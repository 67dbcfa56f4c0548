#!/usr/bin/env python3
"""bench_latency.py: the GUIDE §9 latencies, measured on this machine with real processes.

Each line is one figure beside its target:
  immediate exit   run_one.sh --wait --json -- sh -c 'exit 7': seconds until the launcher reports exit 7
                   (target: within 2 s)
  dead-man delay   a finished run's dead-man: seconds from its deadline (ended_at + grace) to the moment
                   its stop command ran (target: within one poll interval)
  boot → training  boot_resume.py after a simulated restart (supervisor, job and dead-man killed): seconds
                   until the relaunched trainer's first step, less the trainer's own start-up measured
                   alone (target: under 30 s)
  idle → stop      idle_watch.py with a stand-in nvidia-smi reading 0 %: seconds from arming until the stop
                   command ran (target: the idle window plus one poll)
  status trip      rgt.py status against a local sshd, over one bare `ssh HOST true` (target: 1.3 times), and
                   how much of the difference is this interpreter's bare start-up (`python3 -c pass`);
                   skipped, with the reason, when no sshd can be started here
  tar pull         throughput of rgt.py pull --transport tar (manifest, stream, verification, promotion) over
                   that of `ssh HOST 'tar -cf - .' | tar -xf -` on the same 1 GiB + 2,000 x 64 KiB files
                   (--quick: 32 MiB + 100, once), alternately from a warm cache (target: at least 0.8 times)
Repeated figures count by their worst repetition, except the two ratios (median over median). The last line
gives the load average when the run began: on a shared box, read the figures beside it. Every
temporary file lives in one temp dir, removed at the end; every process the benchmark started is disarmed
or killed by its recorded pid. The stop commands are stand-ins that write a file: nothing is stopped.

Usage:
  python3 tools/bench_latency.py [--quick] [--repeat N] [--only FIGURES] [--json] [--keep]

  --quick    one repetition and short windows (the smoke test runs this)
  --repeat   repetitions of each figure (default 3)
  --json     one JSON document instead of lines
  --keep     keep the temp dir (its path is printed on stderr)
  --only     a comma-separated subset of exit,deadman,boot,idle,status,pull

Exit codes: 0 every target met; 1 a target missed or a measurement failed; 2 usage.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(REPO, "scripts", "node")
RUN_ONE = os.path.join(NODE, "run_one.sh")
DEADMAN = os.path.join(NODE, "deadman.py")
BOOT = os.path.join(NODE, "boot_resume.py")
IDLE = os.path.join(NODE, "idle_watch.py")
RGT = os.path.join(REPO, "scripts", "rgt.py")
PY = sys.executable
sys.path.insert(0, NODE)
import rgt_core as core  # noqa: E402  (the toolkit's one core: JSON reads, pid liveness, time stamps)

read_json = core.read_json
alive = core.pid_alive

# A trainer with no dependencies: one line per step into ./progress (pid, step, wall time); ends when ./STOP
# appears or after 10 minutes.
TRAINER = r"""
import os, time
start = time.time()
while not os.path.exists("STOP") and time.time() - start < 600:
    with open("progress", "a") as fh:
        fh.write("%d %.6f\n" % (os.getpid(), time.time()))
    time.sleep(0.05)
"""


FIGURES = ("exit", "deadman", "boot", "idle", "status", "pull")


def log(msg):
    sys.stderr.write("bench_latency: %s\n" % msg)
    sys.stderr.flush()


def wait_for(predicate, timeout, step=0.02):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            return value
        time.sleep(step)


class Failed(Exception):
    pass


class Bench(object):
    def __init__(self, root, quick):
        self.root, self.quick = root, quick
        self.durable = os.path.join(root, "durable")
        self.work = os.path.join(root, "work")
        os.makedirs(self.work)
        self.stop_calls = os.path.join(root, "meter-stop.calls")
        stop = os.path.join(root, "meter-stop.sh")
        with open(stop, "w") as fh:
            fh.write('#!/bin/sh\necho "stop $(date +%%s.%%N) $*" >> "%s"\n' % self.stop_calls)
        os.chmod(stop, 0o755)
        self.stop = stop
        index = os.path.join(root, "index.json")
        with open(index, "w") as fh:
            json.dump({"generated_by": "bench_latency", "schema_version": 1, "profiles": {"benchbox": {
                "platform": "benchbox", "defaults": {
                    "DATA_DIR": os.path.join(root, "data"), "DURABLE_DIR": self.durable, "HF_HOME": None,
                    "PROXY_HOOK": None, "DISK_FLOOR_GB": 0.001, "METER_STOP_CMD": stop,
                    "METER_STOP_DESTRUCTIVE": False, "METER_STOP_NEEDS": None}}}}, fh)
        # tmux sockets: the caller's TMUX_TMPDIR (the test suite gives each process one), else the temp dir
        self.env = dict(os.environ, RGT_PROFILE_INDEX=index, RGT_PYTHON=PY,
                        TMUX_TMPDIR=os.environ.get("TMUX_TMPDIR") or root)
        for var in ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "PROXY_HOOK", "DISK_FLOOR_GB", "RGT_PROFILE", "TMUX"):
            self.env.pop(var, None)
        self.pids = []          # (pid, what) to end at cleanup, by pid
        self.run_dirs = []
        self.sshd = None

    # ------------------------------------------------------------------ helpers
    def run_dir(self, run_id):
        return os.path.join(self.durable, "runs", run_id)

    def launch(self, run_id, job, *opts, cwd=None, timeout=120):
        self.run_dirs.append(self.run_dir(run_id))
        argv = ["bash", RUN_ONE, "--profile", "benchbox", "--run-id", run_id] + list(opts) + ["--"] + list(job)
        return subprocess.run(argv, cwd=cwd or self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def disarm(self, run_dir):
        subprocess.run([PY, DEADMAN, "ack", "--run-dir", run_dir, "--disarm"], env=self.env, capture_output=True,
                       timeout=60)

    def cleanup(self):
        for rd in self.run_dirs:
            if not os.path.isdir(rd):
                continue
            self.disarm(rd)
            status = read_json(os.path.join(rd, "status.json"))
            for pid in (status.get("job_pid"), status.get("supervisor_pid"),
                        read_json(os.path.join(rd, "deadman.json")).get("pid")):
                self.pids.append((pid, rd))
        if self.sshd is not None:
            self.sshd.terminate()
            try:
                self.sshd.wait(10)
            except subprocess.TimeoutExpired:
                self.sshd.kill()
        deadline = time.monotonic() + 10
        for pid, _ in self.pids:
            if pid and wait_for(lambda: not alive(pid), max(0.0, deadline - time.monotonic()), 0.05) is False:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass

    # ------------------------------------------------------------------ figures
    def immediate_exit(self, repeat):
        took = []
        for n in range(repeat):
            run_id = "exit7-%d" % n
            start = time.monotonic()
            res = self.launch(run_id, ["sh", "-c", "exit 7"], "--grace-minutes", "5", "--wait", "--json")
            took.append(time.monotonic() - start)
            try:
                report = json.loads(res.stdout)
            except ValueError:
                report = {}
            if res.returncode != 7 or (report.get("final") or {}).get("exit_code") != 7:
                raise Failed("run_one.sh reported rc %s, final %s: %s" % (res.returncode, report.get("final"),
                                                                          res.stderr.strip()[-300:]))
            self.disarm(self.run_dir(run_id))
        return took

    def deadman_delay(self, repeat):
        poll, grace_min = (0.5, 0.05) if self.quick else (1.0, 0.1)   # a grace longer than the dead-man's start
        delays = []
        for n in range(repeat):
            rd = os.path.join(self.root, "dm-%d" % n)
            os.makedirs(rd)
            calls = os.path.join(rd, "stop.calls")
            stop = os.path.join(rd, "stop.sh")
            with open(stop, "w") as fh:
                fh.write('#!/bin/sh\necho "$(date +%%s.%%N)" >> "%s"\n' % calls)
            os.chmod(stop, 0o755)
            now = time.time()
            time.sleep(1.0 - (now % 1.0) + 0.01)          # ended_at has whole seconds: end on one exactly
            ended = float(int(time.time()))
            with open(os.path.join(rd, "status.json"), "w") as fh:
                json.dump({"state": "succeeded", "exit_code": 0, "ended_at": core.utc_iso(ended)}, fh)
            res = subprocess.run([PY, DEADMAN, "arm", "--run-dir", rd, "--poll-seconds", str(poll),
                                  "--grace-minutes", str(grace_min), "--stop-cmd", stop], env=self.env,
                                 capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                raise Failed("deadman.py arm exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
            self.pids.append((res.stdout.strip(), rd))
            if not wait_for(lambda: os.path.exists(calls) and open(calls).read().strip(), grace_min * 60 + 60):
                raise Failed("the dead-man never ran its stop command")
            fired = float(open(calls).read().split()[0])
            delays.append(fired - (ended + grace_min * 60))
        return delays, poll

    def boot_to_training(self, repeat):
        with open(os.path.join(self.root, "trainer.py"), "w") as fh:
            fh.write(TRAINER)
        alone = []
        for n in range(repeat):                           # the trainer's own start-up, launched alone
            cwd = os.path.join(self.root, "alone-%d" % n)
            os.makedirs(cwd)
            start = time.time()
            proc = subprocess.Popen([PY, os.path.join(self.root, "trainer.py")], cwd=cwd, stdin=subprocess.DEVNULL)
            self.pids.append((proc.pid, cwd))
            ok = wait_for(lambda: os.path.exists(os.path.join(cwd, "progress")), 60)
            first = float(open(os.path.join(cwd, "progress")).readline().split()[1]) if ok else None
            proc.kill()
            proc.wait()
            if first is None:
                raise Failed("the stand-in trainer never wrote a step")
            alone.append(first - start)
        startup = statistics.median(alone)
        took = []
        for n in range(repeat):
            run_id, cwd = "boot-%d" % n, os.path.join(self.root, "boot-%d" % n)
            os.makedirs(cwd)
            progress = os.path.join(cwd, "progress")
            res = self.launch(run_id, [PY, os.path.join(self.root, "trainer.py")], "--auto-resume", "--max-attempts",
                              "3", "--deadman-dry-run", "--grace-minutes", "5", cwd=cwd)
            if res.returncode != 0:
                raise Failed("run_one.sh exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
            rd = self.run_dir(run_id)
            if not wait_for(lambda: os.path.exists(progress), 60):
                raise Failed("the trainer never started under run_one.sh")
            status = read_json(os.path.join(rd, "status.json"))
            victims = [status.get("job_pid"), status.get("supervisor_pid"),
                       read_json(os.path.join(rd, "deadman.json")).get("pid")]
            for pid in victims:                             # a restart: everything dies at once
                try:
                    os.killpg(os.getpgid(int(pid)), signal.SIGKILL)
                except (OSError, TypeError, ValueError):
                    pass
            for pid in victims:
                wait_for(lambda: not alive(pid), 30)
            first_pids = {line.split()[0] for line in open(progress)}
            start = time.time()
            boot = subprocess.run([PY, BOOT, "--runs-dir", os.path.dirname(rd), "--json"], env=self.env,
                                  capture_output=True, text=True, timeout=300)
            if boot.returncode != 0:
                raise Failed("boot_resume.py exited %d: %s" % (boot.returncode, (boot.stdout + boot.stderr)[-300:]))

            def new_step():
                for line in open(progress):
                    pid, when = line.split()[:2]
                    if pid not in first_pids:
                        return float(when)
                return None
            again = wait_for(new_step, 120, 0.05)
            if not again:
                raise Failed("the trainer never stepped again after boot_resume.py")
            took.append(again - start - startup)
            open(os.path.join(cwd, "STOP"), "w").close()
            wait_for(lambda: read_json(os.path.join(rd, "status.json")).get("state") in
                     ("succeeded", "failed", "sync_failed"), 60)
            self.disarm(rd)
        return took, startup

    def idle_to_stop(self, repeat):
        poll, idle_min = (0.5, 0.02) if self.quick else (1.0, 0.05)
        bindir = os.path.join(self.root, "bin")
        os.makedirs(bindir, exist_ok=True)
        smi = os.path.join(bindir, "nvidia-smi")            # a stand-in: no GPU here; prints what the real one does
        with open(smi, "w") as fh:
            fh.write("#!/bin/sh\necho 0\n")
        os.chmod(smi, 0o755)
        env = dict(self.env, PATH=bindir + os.pathsep + self.env.get("PATH", ""))
        took = []
        for n in range(repeat):
            watch = os.path.join(self.root, "idle-%d" % n)
            marker = os.path.join(self.root, "idle-%d.stopped" % n)
            stop = os.path.join(self.root, "idle-%d.sh" % n)     # a stand-in stop: records when it ran
            with open(stop, "w") as fh:
                fh.write('#!/bin/sh\ndate +%%s.%%N > "%s"\n' % marker)
            os.chmod(stop, 0o755)
            start = time.time()
            res = subprocess.run([PY, IDLE, "arm", "--watch-dir", watch, "--stop-cmd", stop, "--idle-minutes",
                                  str(idle_min), "--poll-seconds", str(poll), "--ignore-ssh"], env=env,
                                 capture_output=True, text=True, timeout=60)
            if res.returncode != 0:
                raise Failed("idle_watch.py arm exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
            self.pids.append((res.stdout.strip(), watch))
            if not wait_for(lambda: os.path.exists(marker) and open(marker).read(), idle_min * 60 + 60):
                raise Failed("the idle watcher never ran its stop command")
            took.append(float(open(marker).read()) - start)
            subprocess.run([PY, IDLE, "disarm", "--watch-dir", watch], env=env, capture_output=True, timeout=60)
        return took, idle_min * 60 + poll

    def start_sshd(self):
        """A throwaway sshd on 127.0.0.1 (own host and client keys) and an ssh config without multiplexing;
        None and the reason when this machine has no sshd."""
        sshd = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")
        missing = [name for name, path in (("sshd", sshd), ("ssh", shutil.which("ssh")),
                                           ("ssh-keygen", shutil.which("ssh-keygen"))) if not path]
        if missing:
            return "%s not installed (apt-get install openssh-server openssh-client)" % " and ".join(missing)
        base = os.path.join(self.root, "sshd")
        os.makedirs(base)
        for name in ("host", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(base, name)],
                           check=True, capture_output=True)
        shutil.copy(os.path.join(base, "client.pub"), os.path.join(base, "authorized_keys"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        cfg = os.path.join(base, "sshd_config")
        with open(cfg, "w") as fh:
            fh.write("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile %s\n"
                     "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                     "StrictModes no\nUsePAM no\nLogLevel ERROR\nSetEnv TMUX_TMPDIR=%s\n"
                     % (port, os.path.join(base, "host"), os.path.join(base, "authorized_keys"),
                        os.path.join(base, "sshd.pid"), self.env["TMUX_TMPDIR"]))
        with open(os.path.join(base, "host.pub")) as fh:
            key_type, key = fh.read().split()[:2]
        with open(os.path.join(base, "known_hosts"), "w") as fh:
            fh.write("[127.0.0.1]:%d %s %s\n" % (port, key_type, key))
        self.ssh_config = os.path.join(base, "ssh_config")
        with open(self.ssh_config, "w") as fh:
            fh.write("Host benchbox\n  HostName 127.0.0.1\n  Port %d\n  IdentityFile %s\n  IdentitiesOnly yes\n"
                     "  UserKnownHostsFile %s\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
                     "  BatchMode yes\n  ConnectTimeout 30\n  LogLevel ERROR\n  ControlMaster no\n"
                     % (port, os.path.join(base, "client"), os.path.join(base, "known_hosts")))
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)
        log_fh = open(os.path.join(base, "sshd.log"), "ab")
        self.sshd = subprocess.Popen([sshd, "-D", "-e", "-f", cfg], stdout=log_fh, stderr=log_fh,
                                     stdin=subprocess.DEVNULL)
        log_fh.close()
        ready = wait_for(lambda: self.sshd.poll() is not None or self.ssh_true() == 0, 60, 0.2)
        if self.sshd.poll() is not None or not ready:
            return "sshd did not start here (%s)" % open(os.path.join(base, "sshd.log")).read().strip()[-200:]
        return None

    def ssh_true(self, command="true"):
        return subprocess.run(["ssh", "-F", self.ssh_config, "benchbox", command], capture_output=True,
                              timeout=60, stdin=subprocess.DEVNULL).returncode

    def rgt(self, *args):
        base = [PY, RGT, "--ssh-config", self.ssh_config, "--node-dir", os.path.join(self.root, "node-bin"),
                "--ledger", os.path.join(self.root, "ledger.jsonl")]
        env = {k: v for k, v in self.env.items() if k != "RGT_PROFILE_INDEX"}
        return subprocess.run(base + list(args), capture_output=True, text=True, timeout=300, env=env,
                              cwd=self.root, stdin=subprocess.DEVNULL)

    def ensure_sshd(self):
        """Start the throwaway sshd once; None, or the reason it cannot run here."""
        if self.sshd is None and not getattr(self, "sshd_why", None):
            self.sshd_why = self.start_sshd()
        return getattr(self, "sshd_why", None)

    def status_round_trip(self, repeat):
        why = self.ensure_sshd()
        if why:
            return None, why
        durable, work = os.path.join(self.root, "st-durable"), os.path.join(self.root, "st-work")
        os.makedirs(work)
        pushed = self.rgt("push", "benchbox", "--transport", "tar")
        if pushed.returncode != 0:
            raise Failed("rgt.py push exited %d: %s" % (pushed.returncode, pushed.stderr.strip()[-300:]))
        launched = self.rgt("launch", "benchbox", "--profile", "local", "--run-id", "st-1", "--durable-dir", durable,
                            "--cwd", work, "--", "--no-deadman", "--wait", "--", "sh", "-c", "exit 0")
        if launched.returncode != 0:
            raise Failed("rgt.py launch exited %d: %s" % (launched.returncode, launched.stderr.strip()[-300:]))
        self.run_dirs.append(os.path.join(durable, "runs", "st-1"))
        trips, statuses, pythons = [], [], []
        for _ in range(max(3, repeat)):
            start = time.monotonic()
            if self.ssh_true() != 0:
                raise Failed("ssh benchbox true failed")
            trips.append(time.monotonic() - start)
            start = time.monotonic()
            res = self.rgt("--json", "status", "benchbox", "st-1")
            statuses.append(time.monotonic() - start)
            if res.returncode != 0:
                raise Failed("rgt.py status exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
            start = time.monotonic()   # the floor of any Python CLI here: this interpreter's own start-up
            subprocess.run([PY, "-c", "pass"], env=self.env, capture_output=True, timeout=60)
            pythons.append(time.monotonic() - start)
        return (statistics.median(statuses), statistics.median(trips), statistics.median(pythons)), None


    def make_pull_data(self, root, big_mb, count):
        """One BIG_MB MiB file and COUNT x 64 KiB files (random bytes) under ROOT, and their manifest."""
        os.makedirs(os.path.join(root, "small"))
        block = os.urandom(8 << 20)
        with open(os.path.join(root, "model.bin"), "wb") as fh:
            for n in range(big_mb // 8):
                fh.write(block[n % 4096:] + block[:n % 4096])
            fh.write(block[:(big_mb % 8) << 20])
        small = os.urandom(64 << 10)
        for n in range(count):
            folder = os.path.join(root, "small", "d%02d" % (n // 500))
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "part-%05d.bin" % n), "wb") as fh:
                fh.write(n.to_bytes(8, "little") + small[8:])
        res = subprocess.run([PY, os.path.join(NODE, "build_pull_manifest.py"), "--root", root, "--roster",
                              "model.bin", "--roster", "small/**", "--run-id", "pull-1"], capture_output=True,
                             text=True, timeout=1800)
        if res.returncode != 0:
            raise Failed("build_pull_manifest.py exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))

    def tar_pull(self, repeat):
        """rgt.py pull --transport tar (manifest, stream, verification, promotion) against a plain
        `ssh HOST 'tar -cf - .' | tar -xf -` of the same folder, alternately, from a warm page cache."""
        why = self.ensure_sshd()
        if why:
            return None, why
        big_mb, count = (32, 100) if self.quick else (1024, 2000)
        durable = os.path.join(self.root, "pull-durable")
        source = os.path.join(durable, "results", "pull-1")
        log("writing %d MiB + %d x 64 KiB of test data ..." % (big_mb, count))
        self.make_pull_data(source, big_mb, count)
        plain, pulls = [], []
        for n in range(repeat if self.quick else max(3, repeat)):
            into = os.path.join(self.root, "plain-%d" % n)
            os.makedirs(into)
            start = time.monotonic()
            res = subprocess.run("ssh -F %s benchbox 'cd %s && tar -cf - .' | tar -xf - -C %s" % (
                self.ssh_config, source, into), shell=True, capture_output=True, timeout=1800,
                stdin=subprocess.DEVNULL)
            plain.append(time.monotonic() - start)
            if res.returncode != 0:
                raise Failed("ssh | tar exited %d: %s" % (res.returncode, res.stderr.decode()[-300:]))
            shutil.rmtree(into)
            dest = os.path.join(self.root, "pulled-%d" % n)
            start = time.monotonic()
            res = self.rgt("pull", "benchbox", "pull-1", "--durable-dir", durable, "--dest", dest,
                           "--transport", "tar")
            pulls.append(time.monotonic() - start)
            if res.returncode != 0:
                raise Failed("rgt.py pull exited %d: %s" % (res.returncode, (res.stdout + res.stderr)[-300:]))
            shutil.rmtree(dest)
        return (statistics.median(plain), statistics.median(pulls), big_mb, count), None


def figure(name, value, target, ok, detail):
    return {"name": name, "value": value, "target": target, "ok": ok, "detail": detail}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Measure the GUIDE §9 latencies with real processes.",
                                     formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--quick", action="store_true", help="one repetition, short windows")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions of each figure (default 3)")
    parser.add_argument("--json", action="store_true", help="one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--only", help="comma-separated figures to measure: %s (default: all)" % ",".join(FIGURES))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    repeat = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    only = [w.strip() for w in args.only.split(",") if w.strip()] if args.only else list(FIGURES)
    unknown = [w for w in only if w not in FIGURES]
    if unknown or not only:
        sys.stderr.write("bench_latency: error: --only takes %s (got %s)\n" % (",".join(FIGURES), args.only))
        return 2
    if repeat < 1:
        sys.stderr.write("bench_latency: error: --repeat must be at least 1\n")
        return 2
    root = tempfile.mkdtemp(prefix="rgt-bench-")
    if args.keep:
        log("temp dir %s" % root)
    bench = Bench(root, args.quick)
    results = []

    def measure(name, target, fn):
        log("measuring %s ..." % name)
        try:
            results.append(fn())
        except Exception as exc:  # noqa: BLE001  a broken step is reported as FAILED, the other figures still run
            results.append(figure(name, None, target, False, "FAILED: %s: %s" % (type(exc).__name__, exc)))

    def immediate():
        took = bench.immediate_exit(repeat)
        return figure("immediate exit", max(took), "<= 2.0 s", max(took) <= 2.0,
                      "worst of %d, median %.2f s" % (len(took), statistics.median(took)))

    def deadman():
        delays, poll = bench.deadman_delay(repeat)
        return figure("dead-man delay", max(delays), "<= %.1f s (one poll)" % poll, max(delays) <= poll,
                      "past its deadline; worst of %d" % len(delays))

    def boot():
        took, startup = bench.boot_to_training(repeat)
        return figure("boot -> training", max(took), "< 30.0 s", max(took) < 30.0,
                      "less the trainer's own start-up of %.2f s; worst of %d" % (startup, len(took)))

    def idle():
        took, limit = bench.idle_to_stop(repeat)
        return figure("idle -> stop", max(took), "<= %.1f s (window + one poll)" % limit, max(took) <= limit,
                      "from arming; worst of %d" % len(took))

    def status():
        medians, why = bench.status_round_trip(repeat)
        if medians is None:
            return figure("status trip", None, "<= 1.3x one ssh round trip", None, "SKIPPED: %s" % why)
        ratio = medians[0] / medians[1]
        # no Python starts on the node (status_facts.sh); this laptop's own interpreter start-up is the floor
        status_s, true_s, python_s = medians
        return figure("status trip", ratio, "<= 1.3x one ssh round trip", ratio <= 1.3,
                      "rgt.py status %.3f s, ssh true %.3f s (medians; one connection per command); of the %.0f ms "
                      "over the round trip, %.0f ms is this machine's python3 -c pass"
                      % (status_s, true_s, 1000 * (status_s - true_s), 1000 * python_s))

    def pull():
        medians, why = bench.tar_pull(repeat)
        if medians is None:
            return figure("tar pull", None, ">= 0.8x ssh tar | tar", None, "SKIPPED: %s" % why)
        plain, ours, big_mb, count = medians
        ratio = plain / ours            # throughput ratio: the same bytes in each
        return figure("tar pull", ratio, ">= 0.8x ssh tar | tar", ratio >= 0.8,
                      "rgt.py pull --transport tar %.2f s, ssh tar | tar %.2f s (medians; %d MiB + %d x 64 KiB)"
                      % (ours, plain, big_mb, count))

    steps = {"exit": ("immediate exit", "<= 2.0 s", immediate), "deadman": ("dead-man delay", "<= one poll", deadman),
             "boot": ("boot -> training", "< 30.0 s", boot), "idle": ("idle -> stop", "<= window + one poll", idle),
             "status": ("status trip", "<= 1.3x one ssh round trip", status),
             "pull": ("tar pull", ">= 0.8x ssh tar | tar", pull)}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        for key in FIGURES:
            if key in only:
                measure(*steps[key])
    finally:
        bench.cleanup()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    missed = [r for r in results if r["ok"] is False]
    if args.json:
        print(json.dumps({"figures": results, "ok": not missed, "quick": args.quick, "repeat": repeat,
                          "load_1min": load, "cpus": os.cpu_count()}, indent=2))
    else:
        for r in results:
            word = "SKIP" if r["ok"] is None else ("OK" if r["ok"] else "FAIL")
            unit = "x" if r["name"] in ("status trip", "tar pull") else " s"
            value = "-" if r["value"] is None else "%.2f%s" % (r["value"], unit)
            print("%-4s %-17s %-9s target %-30s %s" % (word, r["name"], value, r["target"], r["detail"]))
        print("%s: %d of %d figures missed their GUIDE §9 target (load %s on %d CPUs at the start)"
              % ("FAIL" if missed else "OK", len(missed), len(results),
                 "?" if load is None else "%.2f" % load, os.cpu_count() or 0))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
