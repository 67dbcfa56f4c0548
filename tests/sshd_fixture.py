"""A real OpenSSH server on 127.0.0.1 for tests of the remote flows.

`sshd_server` (conftest.py; one server per test process) generates throwaway host and client keys in a temporary directory,
starts `/usr/sbin/sshd -D -e -f <cfg>` as the current user on a free port, and writes an ssh client
config in which the alias `gpu-box` reaches it non-interactively. Tests then run our scripts with
`--rsh "ssh -F <cfg>"` and `--source gpu-box:<path>` exactly as a user would against a rented node.
Nothing in ~/.ssh is read or written. The client config multiplexes (ControlMaster) so each command
does not pay a fresh handshake; the master is opened by the readiness probe and closed on teardown.

    def test_x(sshd_server):          # the fixture is in conftest.py
        sshd_server.rsh        # 'ssh -F /tmp/.../ssh_config'
        sshd_server.run("ls /")  # CompletedProcess of a command on the "node"
"""
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import need, path_without


class SshdServer:
    def __init__(self, base: Path, sshd: str, ssh: str, keygen: str, node_path: str = None, log_level: str = "ERROR",
                 client_mux: bool = True, node_env: dict = None):
        self.base = base
        self.node_env = dict(node_env or {})  # more variables every session on the "node" sees (sshd's SetEnv)
        self.log_level = log_level      # INFO logs one "Accepted publickey" line per connection (test_fast_paths)
        self.client_mux = client_mux    # False: the client config does not multiplex (each ssh connects anew)
        self.node_path = node_path  # PATH of every session on the "node" (None: sshd's default)
        self.sshd, self.ssh, self.keygen = sshd, ssh, keygen
        self.alias = "gpu-box"
        self.proc = None
        self.port = None
        self.config = base / "ssh_config"
        # A socket path has at most 108 bytes and ssh binds the master at PATH.<16 random chars> first, so the
        # control socket lives in the short per-process dir conftest.py makes, not in the (long) basetemp.
        self.control_dir = tempfile.mkdtemp(prefix="ssh-", dir=os.environ.get("RGT_TEST_SOCKETS") or None)
        self.log = base / "sshd.log"

    @property
    def rsh(self) -> str:
        return f"ssh -F {shlex.quote(str(self.config))}"

    def run(self, command: str, **kwargs) -> subprocess.CompletedProcess:
        """Run a shell command on the 'node' through the real sshd."""
        return subprocess.run([self.ssh, "-F", str(self.config), self.alias, command],
                              capture_output=True, text=True, timeout=60, **kwargs)

    def _set_env(self):
        """Variables every session on the 'node' gets: the bare node's PATH, this test process's tmux socket dir
        (conftest.py), so runs launched over SSH by two xdist workers never share a socket, and NODE_ENV's."""
        pairs = ([f"PATH={self.node_path}"] if self.node_path else []) + \
            ([f"TMUX_TMPDIR={os.environ['TMUX_TMPDIR']}"] if os.environ.get("TMUX_TMPDIR") else []) + \
            [f"{k}={v}" for k, v in sorted(self.node_env.items())]
        return ["SetEnv " + " ".join(pairs)] if pairs else []

    def _keys(self):
        for name in ("host_ed25519", "client_ed25519"):
            key = self.base / name
            if not key.exists():
                subprocess.run([self.keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"rgt-test-{name}",
                                "-f", str(key)], check=True, capture_output=True)
        (self.base / "authorized_keys").write_text((self.base / "client_ed25519.pub").read_text())
        os.chmod(self.base / "authorized_keys", 0o600)
        host_pub = (self.base / "host_ed25519.pub").read_text().split()
        return host_pub[0], host_pub[1]

    def start(self, attempts: int = 3):
        key_type, key_blob = self._keys()
        for _ in range(attempts):
            try:
                self.pid_file.unlink()  # a previous attempt's: readiness is this sshd writing its own
            except FileNotFoundError:
                pass
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            cfg = self.base / "sshd_config"
            cfg.write_text("\n".join([
                f"Port {self.port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {self.base / 'host_ed25519'}",
                f"AuthorizedKeysFile {self.base / 'authorized_keys'}",
                f"PidFile {self.pid_file}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "MaxStartups 50:30:100",
                f"LogLevel {self.log_level}",
                "Subsystem sftp internal-sftp",
            ] + self._set_env() + [""]))
            # Pin the throwaway host key: no trust-on-first-use, nothing in ~/.ssh/known_hosts.
            known = self.base / "known_hosts"
            known.write_text(f"[127.0.0.1]:{self.port} {key_type} {key_blob}\n")
            self.config.write_text("\n".join([
                f"Host {self.alias}",
                "  HostName 127.0.0.1",
                f"  Port {self.port}",
                f"  IdentityFile {self.base / 'client_ed25519'}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {known}",
                "  GlobalKnownHostsFile /dev/null",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
                "  ConnectTimeout 30",                # a loaded CI box can be slow to answer
                "  LogLevel ERROR",
                # One multiplexed connection, as many users configure for a rented node: every
                # transfer still goes through this sshd, minus ~0.4 s of handshake per command.
            ] + ([
                "  ControlMaster auto",
                f"  ControlPath {self.control_dir}/cm-%C",
                "  ControlPersist 300",
            ] if self.client_mux else ["  ControlMaster no"]) + [""]))
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([self.sshd, "-D", "-e", "-f", str(cfg)],
                                             stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            if self._wait_ready():
                return self
            self.stop()
        raise RuntimeError(f"sshd did not come up; log:\n{self.log.read_text()[-2000:]}")

    def _wait_ready(self, probes: int = 5) -> bool:
        """True once this sshd listens and a session through it works; False when it exited first.

        No deadline on a loaded machine: sshd writes PidFile only after its listen socket is bound (and exits
        when the port was taken meanwhile), so the wait ends on what sshd records, not on how fast the box is.
        A listening server is never restarted for a slow first handshake: the probe that opens the multiplexing
        master is retried (each try bounded by ssh's ConnectTimeout), and only a server that keeps refusing
        sessions counts as not ready."""
        while self._recorded_pid() != self.proc.pid:
            if self.proc.poll() is not None:
                return False  # bind failed (the port was taken after we picked it) or the config was refused
            if "Couldn't create pid file" in self.log.read_text(errors="replace"):
                break  # listening, but it could not say so: the probe below decides
            time.sleep(0.05)
        for _ in range(probes):
            if self.proc.poll() is not None:
                return False
            try:
                if self.run("true").returncode == 0:
                    return True
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.5)
        return False

    @property
    def pid_file(self) -> Path:
        return self.base / "sshd.pid"

    def _recorded_pid(self):
        """The pid sshd wrote to its PidFile, or None while the file is absent or half written."""
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def stop(self):
        subprocess.run([self.ssh, "-F", str(self.config), "-O", "exit", self.alias],
                       capture_output=True, timeout=30)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def start_sshd(base: Path) -> SshdServer:
    """A started sshd in BASE (keys, configs, logs), or a failure/skip naming what is missing."""
    sshd, ssh, keygen = need("sshd"), need("ssh"), need("ssh-keygen")
    need("rsync")
    server = SshdServer(base, os.path.abspath(sshd), ssh, keygen)
    try:
        return server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))


def start_bare_sshd(base: Path) -> SshdServer:
    """An sshd whose sessions see a PATH without rsync, tar and tmux: a minimal rented container
    (python3, coreutils and a shell only). The laptop side keeps its own PATH."""
    sshd, ssh, keygen = need("sshd"), need("ssh"), need("ssh-keygen")
    node_path = path_without(base / "node-bin", "rsync", "tar", "tmux")
    server = SshdServer(base, os.path.abspath(sshd), ssh, keygen, node_path=node_path)
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    for program in ("rsync", "tar", "tmux"):
        if server.run(f"command -v {program}").returncode == 0:
            server.stop()
            pytest.fail(f"the bare node still finds {program}: sshd's SetEnv PATH did not take")
    return server


# The fixtures live in conftest.py; these names stay importable for test modules written against the old layout.
from conftest import bare_node_sshd, sshd_server  # noqa: E402,F401


def rgt(tmp_path, server, *args, timeout=300, ledger=None, env=None):
    """rgt.py as the user runs it against the test sshd (its own node-bin and ledger under TMP_PATH)."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "rgt.py"
    base = [sys.executable, str(script), "--ssh-config", str(server.config), "--node-dir", str(tmp_path / "node-bin"),
            "--ledger", str(ledger or tmp_path / "ledger.jsonl")]
    env = dict(env or os.environ)
    env.pop("RGT_PROFILE_INDEX", None)
    return subprocess.run(base + list(map(str, args)), capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path, env=env)
