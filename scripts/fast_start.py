"""fast_start: `rgt.py status` opens its ssh connection before the rest of rgt.py has loaded.

The handshake is most of a status round trip, and loading rgt.py's modules (argparse, rgt_core, the
ledger) costs about as much as the node's whole answer, so rgt.py starts `ssh HOST sh -s` from here first
and loads the rest while it connects. The node's `sh -s` runs only what is later written to its stdin.

This file also owns what both need: the HOST rule and the ssh options every rgt.py command uses. rgt.py
adopts the early trip only when its own parse of the command line builds exactly the same ssh command;
anything this quick scan is unsure of starts no trip here.
Standard library only; imports nothing of its own.
"""
import re
import subprocess
import threading
import time

HOST_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._+-]*@)?(?:[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])$")
STATUS_SHELL = "sh -s"
# the options rgt.py takes with a value: global ones (which may also follow the command) and status's own
VALUED = {"-p": "port", "--port": "port", "-i": "identity", "--identity": "identity",
          "--ssh-config": "config", "--node-dir": None, "--ledger": None, "--durable-dir": None,
          "--rate-per-hour": None}
FLAGS = ("--json",)


def ssh_base(port=None, identity=None, config=None):
    """ssh and the options of every rgt.py call: -F, -p and -i as given, batch mode, a dead link noticed in
    about a minute (pull, gate, status) instead of never."""
    base = ["ssh"]
    if config:
        base += ["-F", config]
    if port:
        base += ["-p", str(port)]
    if identity:
        base += ["-i", identity]
    return base + ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]


def scan_status(argv):
    """The ssh command `rgt.py ARGV` would open for a status, or None when ARGV is not plainly one."""
    found, words, pending = {}, [], None
    for word in argv:
        if pending is not None:
            if pending:
                found[pending] = word
            pending = None
        elif word in VALUED:
            pending = VALUED[word] or ""
        elif word.startswith("-"):
            name, eq, value = word.partition("=")
            if word in FLAGS:
                continue
            if not eq or name not in VALUED:
                return None           # -h, -p22, an abbreviation, '--': argparse decides, not this scan
            if VALUED[name]:
                found[VALUED[name]] = value
        else:
            words.append(word)
    if pending is not None or len(words) != 3 or words[0] != "status" or not HOST_RE.match(words[1]):
        return None
    port = found.get("port")
    if port is not None and not port.isdigit():
        return None
    return ssh_base(port and int(port), found.get("identity"), found.get("config")) + [words[1], STATUS_SHELL]


class AnswerTooLarge(Exception):
    """The node's answer passed the byte limit its reader set: the call was ended (finding_laptop_L14)."""


def collect(proc, stdin, timeout, limit=None):
    """(stdout, stderr) of PROC once it ends, after writing STDIN to it. Like communicate(), except that at most
    LIMIT bytes of each stream are kept: past them PROC is killed and AnswerTooLarge raised, so a node that
    answers without end costs this laptop LIMIT bytes, not its memory. subprocess.TimeoutExpired (PROC killed)
    after TIMEOUT seconds."""
    kept, over = {}, []

    def drain(name, stream):
        chunks, size = [], 0
        for chunk in iter(lambda: stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16), b""):
            if limit is not None and size + len(chunk) > limit:
                over.append(name)
                proc.kill()
                continue     # read on to EOF (a killed ssh closes its end), keep nothing more
            chunks.append(chunk)
            size += len(chunk)
        kept[name] = b"".join(chunks)

    def feed():
        try:
            if stdin:
                proc.stdin.write(stdin)
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
    threads = [threading.Thread(target=feed, daemon=True)] if proc.stdin else []
    threads += [threading.Thread(target=drain, args=(name, stream), daemon=True)
                for name, stream in (("out", proc.stdout), ("err", proc.stderr)) if stream]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        proc.kill()
        for t in threads:
            t.join(5)
        proc.wait()
        raise subprocess.TimeoutExpired(proc.args, timeout)
    try:
        proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    if over:
        raise AnswerTooLarge("the node's answer passed %d bytes" % limit)
    return kept.get("out", b""), kept.get("err", b"")


class Trip(object):
    """One ssh call already connecting: finish() writes its input and waits; abandon() drops it (nothing ran
    on the node: `sh -s` runs only what it is sent)."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def finish(self, stdin, timeout, limit=None):
        """CompletedProcess; subprocess.TimeoutExpired (the call killed) after TIMEOUT seconds; AnswerTooLarge
        (the call killed) when the answer passes LIMIT bytes."""
        out, err = collect(self.proc, stdin, timeout, limit)
        return subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)

    def abandon(self):
        if self.proc.returncode is None:
            self.proc.kill()
        self.proc.communicate()


def status_trip(argv):
    """A Trip for `rgt.py ARGV` when it is a status, else None. Never raises: rgt.py reports any error."""
    try:
        command = scan_status(argv)
        return Trip(command) if command else None
    except (OSError, ValueError):
        return None
