"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd, started in a temp dir.

Debian's ``slurm-wlm`` and ``munge`` packages, run as root (``.ci/run`` installs them). Everything the
daemons write (key, socket, state, spool, logs, pid files) lives under one temp dir; the ports are
picked free, so a Slurm already on the machine is not touched. The daemons run in the foreground as
our own children and are stopped by pid (SIGTERM, then SIGKILL after a deadline).

Use:  with SlurmCluster(tmp_path) as slurm: slurm.run(["sbatch", ...])
The client commands see this cluster through SLURM_CONF (``slurm.env``).
"""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def find(program):
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin:/usr/bin")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmError(RuntimeError):
    pass


class SlurmCluster(object):
    def __init__(self, root, cpus=None):
        self.root = Path(root) / "slurm"
        self.host = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.procs = {}
        self.env = dict(os.environ)
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket.2"

    # ------------------------------------------------------------------ set-up
    def write_config(self):
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o711)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o600)
        ctl_port, d_port = free_port(), free_port()
        while d_port == ctl_port:
            d_port = free_port()
        lines = [
            "ClusterName=rgttest",
            "SlurmctldHost=%s(127.0.0.1)" % self.host,
            "SlurmUser=root",
            "SlurmdUser=root",
            "SlurmctldPort=%d" % ctl_port,
            "SlurmdPort=%d" % d_port,
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s,cred_expire=10" % self.socket,
            "StateSaveLocation=%s" % (self.root / "state"),
            "SlurmdSpoolDir=%s" % (self.root / "spool"),
            "SlurmctldPidFile=%s" % (self.root / "slurmctld.pid"),
            "SlurmdPidFile=%s" % (self.root / "slurmd.pid"),
            "SlurmctldLogFile=%s" % (self.root / "log" / "slurmctld.log"),
            "SlurmdLogFile=%s" % (self.root / "log" / "slurmd.log"),
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            "JobCompLoc=%s" % (self.root / "log" / "jobcomp.txt"),
            "MinJobAge=600",
            "KillWait=10",
            "InactiveLimit=0",
            "SlurmctldTimeout=60",
            "SlurmdTimeout=120",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN" % (self.host, self.cpus),
            "PartitionName=test Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" % self.host,
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        self.env["SLURM_CONF"] = str(self.conf)

    def spawn(self, name, argv):
        log = open(self.root / "log" / ("%s.out" % name), "ab")
        try:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, start_new_session=True)
        finally:
            log.close()

    def start(self, deadline=90.0):
        self.write_config()
        munge_dir = self.root / "munge"
        self.spawn("munged", [find("munged"), "--foreground", "--force", "--key-file=%s" % (munge_dir / "munge.key"),
                              "--socket=%s" % self.socket, "--pid-file=%s" % (munge_dir / "munged.pid"),
                              "--log-file=%s" % (self.root / "log" / "munged.log"),
                              "--seed-file=%s" % (munge_dir / "munged.seed")])
        self.wait_for(lambda: self.socket.exists(), deadline, "munged socket")
        self.spawn("slurmctld", [find("slurmctld"), "-D", "-f", str(self.conf)])
        self.spawn("slurmd", [find("slurmd"), "-D", "-f", str(self.conf)])
        self.wait_for(self.node_ready, deadline, "the node to become idle in sinfo")
        return self

    def node_ready(self):
        res = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=20)
        return res.returncode == 0 and res.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

    def wait_for(self, cond, deadline, what, interval=0.5):
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError("%s exited with %s while waiting for %s\n%s" % (name, proc.returncode, what,
                                                                                      self.logs()))
            if cond():
                return
            time.sleep(interval)
        raise SlurmError("timed out after %ss waiting for %s\n%s" % (deadline, what, self.logs()))

    # ------------------------------------------------------------------ use
    def run(self, argv, check=True, timeout=60, **kw):
        res = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout,
                             stdin=subprocess.DEVNULL, **kw)
        if check and res.returncode != 0:
            raise SlurmError("%s failed (%d): %s %s" % (" ".join(argv), res.returncode, res.stdout, res.stderr))
        return res

    def job_field(self, job_id, field):
        """One field of `scontrol show job` (e.g. JobState, Restarts); '' when the job is unknown."""
        res = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False, timeout=20)
        for word in res.stdout.split():
            key, _, value = word.partition("=")
            if key == field:
                return value
        return ""

    def logs(self, tail=3000):
        out = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log", "slurmctld.out", "slurmd.out", "munged.out"):
            path = self.root / "log" / name
            if path.exists():
                out.append("--- %s\n%s" % (name, path.read_text(errors="replace")[-tail:]))
        return "\n".join(out)

    # ------------------------------------------------------------------ tear-down
    def stop(self, deadline=20.0):
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=%s" % os.getuid()], check=False, timeout=20)
            end = time.monotonic() + deadline
            while time.monotonic() < end:
                res = self.run(["squeue", "-h", "-t", "all", "-o", "%i %T"], check=False, timeout=20)
                if res.returncode != 0 or not any(s in res.stdout for s in ("RUNNING", "COMPLETING", "PENDING")):
                    break
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=deadline)
            except OSError:
                pass
        self.procs.clear()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        return False
