#!/usr/bin/env python3
"""On-node dead-man switch: stop the meter when nobody is looking after the run.

Runs ON THE GPU NODE, detached from any SSH session, and watches one run directory
(the layout scripts/node/run_one.sh creates). It fires when

  job_ended  the job is over (status.json says succeeded/failed/sync_failed, or the job
             and its supervisor are gone) and nobody acknowledged it within --grace-minutes;
             with --wait-ssh the clock also waits for SSH sessions to close (bounded, see below);
  no_job     nothing was ever started (no job, no launcher, no supervisor) for --grace-minutes;
  stall      the job process is alive but neither heartbeat.json nor job.log changed for
             --stall-minutes (a hung NCCL collective or a deadlocked loader bills forever);
  max_hours  --max-hours passed since arming, whatever the job is doing.

Every deadline runs on the monotonic clock (time.monotonic), so a wall-clock step (NTP, a
manual date) neither delays nor hastens a firing. A wall time from a file (status.json's
ended_at, an ACK's until) is converted once, when it is first seen. A system suspend
(CLOCK_BOOTTIME moves, the monotonic clock does not) restarts the stall and grace clocks, because
the job was frozen too; suspended time does not count toward --max-hours.

Firing, in this order: DEADMAN_FIRED.json is written first (so the reason survives even if
the stop kills the box mid-write); a still-running job gets SIGTERM on its process group and
up to --term-grace-seconds to checkpoint (and the supervisor up to --sync-wait-seconds to
finish its durable sync); --pre-stop-cmd runs with --pre-stop-timeout; then the stop command
runs with --retries attempts and exponential backoff (--retry-backoff), each attempt recorded;
if every attempt fails (the platform API is down, the CLI is broken) --fallback-stop-cmd runs
the same way. Every external command runs with a hard --stop-timeout / --pre-stop-timeout that
holds even when it leaves a detached child holding its output (rgt_core.run_bounded).
Why signal the job at all: the stop command ends it anyway, only without warning. A SIGTERM
first is the same courtesy a spot reclaim gives, so a resumable job saves its step; the signal,
the wait and whether the job exited are recorded under "job_term". It never sends SIGKILL, and it
signals only the process status.json recorded (pid and start time), never a reused pid.

The stop command is an argv string (shlex-split, never a shell; $VAR / ${VAR} are expanded
at fire time from the environment, then from PID 1's environment where containers keep the
platform's ids, so keep tokens in env vars, not in argv; an unset variable never runs). It comes from
--stop-cmd, else from the profile's METER_STOP_CMD (--profile NAME, else the profile named in
run.json) read from the profile index (rgt_core.profile_index_path: $RGT_PROFILE_INDEX, index.json
beside this folder, or the repo's profiles/index.json).

Destructive stops. A DESTRUCTIVE command (METER_STOP_DESTRUCTIVE true, --stop-cmd-destructive,
or inferred, see below) runs only with --allow-destructive AND a durable copy that verifies NOW:
status.json's "sync" says ok and verified, and its manifest (sync.manifest, the one evidence
format: evidence.read_manifest) matches every file in sync.results_dir, re-hashed
(evidence.verify_tree), with at least one result besides the run's logs. Otherwise it is refused
and --fallback-stop-cmd (non-destructive) runs instead, if given.
Inference fails closed: a command is destructive when any word in it, at any depth, names a
destroying action (terminate, destroy, delete, remove, release, deactivate, purge, erase, wipe,
shred, rm, dd, mkfs, down as in `sky down`, curl -X DELETE / -XDELETE, camelCase and snake_case
forms such as terminateInstance or delete_pod), names a block device (/dev/sda, /dev/nvme0n1),
or cannot be inspected: wrappers are looked through (env, sudo, nice, timeout, setsid, ...; and
a shell or interpreter anywhere in the argv), `sh/bash -c SCRIPT` is parsed command by command,
and an opaque script (command substitution, eval, here-documents, ANSI-C quoting, a program
taken from a $VARIABLE, inline code of perl/ruby/node/..., python -c code that imports or runs
dynamic code, curl -K config files) counts as destructive. The expanded command is checked again
at fire time. This catches wrapping, not malice: a script file you name is trusted by its name,
so keep a destructive stop explicit (--stop-cmd-destructive) and let the gate do its job.

Compared with SkyPilot autostop (idle = no job and, by default, no SSH session; default 5
idle minutes; a pre-stop hook with a timeout; stop or tear down; cancellable): the same idle
rule is `--grace-minutes 5 --wait-ssh`; in addition this catches a job that is alive but hung,
caps wall-clock time, and never tears down data that has no verified durable copy.

SSH sessions (--wait-ssh) are found by scanning /proc for OpenSSH per-session processes, whose
title is "sshd: USER@pts/N", "sshd: USER@notty" or (OpenSSH 9.8+) "sshd-session: USER@...".
utmp (`who`) is not used: containers often have no utmp records or keep stale ones, and
non-interactive sessions (ssh gpu-box CMD, rsync pulls) never appear there. The wait is bounded:
  --ssh-wait-max-minutes M (default 60, on by default): SSH sessions delay the firing by at most
      M minutes after the job is over; after that they no longer count. An idle ControlMaster
      (ControlPersist), a forgotten VS Code window or a half-open session from a sleeping laptop
      therefore cannot hold the meter running for ever.
  --ssh-idle-minutes M (default 30; 0 = off): a session whose traffic counters
      (/proc/PID/io, readable as root, the usual case on rented boxes) and terminal times have
      not moved for M minutes no longer counts. Where neither can be read (not root, no tty) the
      session counts until the cap.

Usage:
  deadman.py arm --run-dir DIR [--stall-minutes 30] [--grace-minutes 15] [--max-hours H]
                 [--wait-ssh] [--ssh-wait-max-minutes 60] [--ssh-idle-minutes 30]
                 [--profile NAME | --stop-cmd "ARGV" [--stop-cmd-destructive]]
                 [--allow-destructive] [--fallback-stop-cmd "ARGV"] [--pre-stop-cmd "ARGV"]
                 [--pre-stop-timeout 300] [--retries 3] [--retry-backoff 10] [--stop-timeout 120]
                 [--term-grace-seconds 30] [--sync-wait-seconds 300] [--job-pid PID]
                 [--poll-seconds 30] [--dry-run] [--foreground] [--json]
  deadman.py ack --run-dir DIR [--postpone-minutes M | --disarm] [--json]
  deadman.py status --run-dir DIR [--json]

Exit codes:
  arm     0 armed (prints the dead-man pid), 2 usage, 3 refused (a live dead-man already
          watches this run dir); with --foreground: 0 after firing with the stop command (or its
          fallback) succeeding (or a dry run that found a command, or disarmed), 1 when it fired
          but every stop failed after all retries, was refused, or no stop command exists.
  ack     0 written, 2 usage.
  status  0 armed and alive, 1 nothing is watching (NONE, DOWN, EXITED, DISARMED),
          7 fired, 2 usage.

Minutes and hours accept floats (tests use --grace-minutes 0.01 --poll-seconds 0.05).
Python 3.8+ standard library only; runs from the node folder beside rgt_core.py and evidence.py.
"""
import argparse
import ast
import errno
import json
import os
import re
import shlex
import signal
import socket
import sys
import time
import traceback

import evidence
import rgt_core as core

try:  # POSIX only; without flock the identity in deadman.json is the only guard
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

TERMINAL = ("succeeded", "failed", "sync_failed")
ACTIVE = ("starting", "running", "syncing")
NO_STOP_MSG = "no on-node stop command; the meter is still running"
REFUSED_MSG = "refused: destructive stop without verified durable sync"
STATE_FILE = core.DEADMAN_FILE
FIRED_FILE = core.DEADMAN_FIRED_FILE
LOCK_FILE = "deadman.lock"
UNRESOLVED_VAR = re.compile(r"\$(\{\w+\}|\w+)")
SSH_SESSION = re.compile(r"^sshd(?:-session)?: (\S+)@(\S+)")
SUSPEND_THRESHOLD = 60.0


# ----------------------------------------------------------------------------- small helpers

def stamp(ts=None):
    """ISO-8601 UTC to the second; a hand-written absurd time (ACK {"until": 1e300}) stays printable."""
    try:
        return core.utc_iso(ts)
    except (OverflowError, OSError, ValueError):
        return "unix time %r" % (ts,)


def suspend_clock():
    """A clock that keeps counting while the system is suspended: CLOCK_BOOTTIME where it exists
    (a wall-clock step does not move it), else the wall clock."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.time()


def suspended_seconds(before, after, threshold=SUSPEND_THRESHOLD):
    """Seconds the machine slept between two (suspend_clock, monotonic) readings, or 0.

    CLOCK_MONOTONIC stops during system suspend on Linux while CLOCK_BOOTTIME (and the wall clock)
    keep going, so a gap between the two that a busy poll cannot explain is a suspend/resume.
    """
    gap = (after[0] - before[0]) - (after[1] - before[1])
    return gap if gap >= threshold else 0.0


def dur(seconds):
    """A short human duration: 42 s, 3.5 min, 2.1 h."""
    if seconds < 120:
        return "%.1f s" % seconds
    if seconds < 7200:
        return "%.1f min" % (seconds / 60.0)
    return "%.1f h" % (seconds / 3600.0)


def mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def split_cmd(text, what):
    """shlex-split an argv string; UsageError when empty or unbalanced."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise core.UsageError("%s cannot be split into arguments: %s" % (what, exc))
    if not argv:
        raise core.UsageError("%s is empty" % what)
    return argv


def init_environ():
    """PID 1's environment: in a container it holds what the platform injected (pod or instance ids),
    which an SSH login shell - and so everything started from it - often does not see."""
    try:
        with open("/proc/1/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def expand_argv(text):
    """argv with $VAR/${VAR} expanded from the environment, then from PID 1's; (argv, [unresolved names])."""
    tokens = shlex.split(text)
    names = {m.group(1).strip("{}") for tok in tokens for m in UNRESOLVED_VAR.finditer(tok)}
    env = dict(os.environ)
    if names - set(env):
        extra = init_environ()
        env.update({k: extra[k] for k in names - set(env) if k in extra})

    def sub(match):
        name = match.group(1).strip("{}")
        return env.get(name, match.group(0))
    argv = [UNRESOLVED_VAR.sub(sub, tok) for tok in tokens]
    missing = sorted(n for n in names if n not in env)
    return argv, missing


# ----------------------------------------------------------------------------- SSH sessions

def _io_counters(pid):
    """rchar+wchar of PID from /proc/PID/io, or None (sshd makes its session processes
    non-dumpable, so only root can read them)."""
    try:
        with open("/proc/%s/io" % pid) as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return None


def _tty_times(tty):
    if not tty.startswith("pts/"):
        return None
    try:
        st = os.stat("/dev/" + tty)
    except OSError:
        return None
    return (st.st_atime, st.st_mtime)


def ssh_sessions():
    """Authenticated OpenSSH sessions on this host, or None without /proc.

    Each: {"key": pid + start time, "label": "user@tty", "activity": what changes when data
    flows (traffic counters, terminal times), or None where nothing can be read}."""
    if not os.path.isdir("/proc/self"):
        return None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                raw = fh.read(256)
        except OSError:
            continue
        title = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
        match = SSH_SESSION.match(title)
        if not match:
            continue
        io, tty = _io_counters(name), _tty_times(match.group(2))
        ident = core.process_identity(int(name))
        found.append({"key": "%s:%s" % (name, ident.get("start_ticks")),
                      "label": "%s@%s" % (match.group(1), match.group(2)),
                      "activity": None if io is None and tty is None else (io, tty)})
    return sorted(found, key=lambda s: s["label"])


# ----------------------------------------------------------------------------- destructive inference

DESTRUCTIVE_EXACT = {"rm", "rmdir", "rmi", "dd", "mkfs", "wipefs", "down", "del", "unlink", "truncate",
                     "nuke", "teardown", "blkdiscard", "fdisk", "sfdisk", "sgdisk", "parted", "release"}
DESTRUCTIVE_STEMS = ("terminat", "destroy", "delet", "remov", "deactivat", "purg", "eras", "shred", "wipe",
                     "obliterat", "decommission", "releas", "mkfs")
WORD_PIECE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
GLUED_OPTION = re.compile(r"^-[A-Za-z]([A-Za-z].*)$")          # curl -XDELETE, -Rdelete ...
BLOCK_DEVICE = re.compile(r"/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|md|dm-|mapper/|disk/|loop|nbd|rbd|zd)")
SAFE_DEVICES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash", "fish", "csh", "tcsh"}
SHELL_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "case", "esac",
                  "{", "}", "!", "function", "select", "time", "coproc"}
OPAQUE_SCRIPT = ("`", "$(", "$'", '$"', "<<", "<(", ">(")
PYTHON = re.compile(r"^(?:python|pypy)[0-9.]*$")
# interpreter -> the options that take inline code (awk: its first operand is the program)
INLINE_CODE = {"perl": ("-e", "-E"), "ruby": ("-e",), "node": ("-e", "--eval", "-p", "--print"),
               "nodejs": ("-e", "--eval", "-p", "--print"), "deno": ("eval",), "bun": ("-e", "--eval"),
               "php": ("-r",), "lua": ("-e",), "luajit": ("-e",), "Rscript": ("-e",), "julia": ("-e", "--eval"),
               "osascript": ("-e",), "pwsh": ("-c", "-Command", "-EncodedCommand", "-e", "-ec"),
               "powershell": ("-c", "-Command", "-EncodedCommand", "-e", "-ec"), "tclsh": (), "awk": (),
               "gawk": (), "mawk": (), "nawk": ()}
PY_DYNAMIC = {"exec", "eval", "compile", "__import__", "getattr", "setattr", "globals", "locals", "vars",
              "__builtins__", "breakpoint"}
# wrapper -> (its options that take a value, operands it takes before the command)
WRAPPERS = {
    "env": ({"-u", "--unset", "-C", "--chdir"}, 0), "sudo": ({"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t",
                                                            "-U", "-T", "--user", "--group", "--host",
                                                            "--prompt", "--chdir"}, 0),
    "doas": ({"-u", "-C"}, 0), "nohup": (set(), 0), "setsid": (set(), 0), "time": (set(), 0),
    "command": (set(), 0), "builtin": (set(), 0), "exec": ({"-a"}, 0), "unbuffer": (set(), 0),
    "busybox": (set(), 0), "nice": ({"-n", "--adjustment"}, 0),
    "ionice": ({"-c", "-n", "-p", "-P", "-u", "--class", "--classdata"}, 0),
    "timeout": ({"-s", "-k", "--signal", "--kill-after"}, 1), "stdbuf": ({"-i", "-o", "-e"}, 0),
    "chrt": (set(), 1), "taskset": (set(), 1), "flock": ({"-w", "--timeout", "-E"}, 1),
    "chroot": ({"--userspec", "--groups"}, 1), "xargs": ({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s"}, 0),
    "systemd-run": ({"-u", "--unit", "-p", "--property", "-E", "--setenv", "--uid", "--gid"}, 0),
    "runuser": ({"-u", "-g", "-G", "--user", "--group"}, 0), "su": ({"-g", "-G", "-s", "--shell"}, 0),
    "watch": ({"-n", "--interval"}, 0),
}
MAX_DEPTH = 8


def _short(text, width=60):
    return text if len(text) <= width else text[:width - 3] + "..."


def word_reason(text):
    """The destroying word in TEXT (split on punctuation, camelCase and snake_case), or None."""
    candidates = []
    glued = GLUED_OPTION.match(text)
    if glued:
        candidates.append(glued.group(1))
    for piece in re.split(r"[^A-Za-z0-9]+", text) + candidates:
        words = [w.lower() for w in WORD_PIECE.findall(piece)] + [piece.lower()]
        for word in words:
            if word in DESTRUCTIVE_EXACT or (len(word) >= 4 and word.startswith(DESTRUCTIVE_STEMS)):
                return word
    return None


def _token_reason(token):
    if "$(" in token or "`" in token:
        return "command substitution in %r cannot be inspected" % _short(token)
    if BLOCK_DEVICE.search(token):
        return "names a block device (%s)" % _short(token)
    return None


def _python_code_reason(code):
    """Why inline Python code cannot be trusted as harmless, or None."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return "python -c code does not parse: cannot be inspected"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return "python -c code imports modules (it can run anything): cannot be inspected"
        if isinstance(node, ast.Name) and node.id in PY_DYNAMIC:
            return "python -c code uses %s (dynamic code): cannot be inspected" % node.id
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return "python -c code reaches %s: cannot be inspected" % node.attr
    return None


def _skip_options(args, takes_value):
    """Index of the first operand in ARGS after options (and the values TAKES_VALUE options carry)."""
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            return i + 1
        if not tok.startswith("-") or tok == "-":
            return i
        if tok in takes_value:
            i += 1
        i += 1
    return i


def _inline_flag(args, flags):
    """(index of the inline code in ARGS, or None) for an interpreter taking code via FLAGS."""
    for i, tok in enumerate(args):
        if tok == "--":
            return None
        if tok in flags:
            return i + 1 if i + 1 < len(args) else len(args)
        if not tok.startswith("-"):
            return None
    return None


def _shell_code_index(args):
    """For `sh [options] ...`: (index of the -c script, or None, index of the first operand)."""
    has_c, i = False, 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            i += 1
            break
        if tok.startswith("--"):
            i += 2 if tok in ("--rcfile", "--init-file") else 1
            continue
        if tok.startswith(("-", "+")) and len(tok) > 1:
            has_c = has_c or (tok[0] == "-" and "c" in tok[1:])
            i += 2 if tok[1:] in ("o", "O") else 1
            continue
        break
    return (i if has_c else None), i


def script_reason(script, depth):
    """Why a shell script string (sh -c SCRIPT) is destructive or opaque, or None."""
    if depth > MAX_DEPTH:
        return "nested too deep to inspect"
    for marker in OPAQUE_SCRIPT:
        if marker in script:
            return "shell script uses %r (cannot be inspected): %r" % (marker, _short(script))
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError as exc:
        return "shell script cannot be parsed (%s): %r" % (exc, _short(script))
    commands, current, redirect = [], [], False
    for tok in tokens:
        if tok and all(ch in "();&|" for ch in tok):
            commands.append(current)
            current, redirect = [], False
        elif tok and all(ch in "<>&|" for ch in tok):
            redirect = True
        elif redirect:
            redirect = False
            if tok.startswith("/dev/") and not tok.startswith(SAFE_DEVICES):
                return "shell script writes to a device (%s)" % tok
            reason = word_reason(tok) or _token_reason(tok)
            if reason:
                return reason
        else:
            current.append(tok)
    commands.append(current)
    for cmd in commands:
        while cmd and cmd[0] in SHELL_KEYWORDS:
            cmd = cmd[1:]
        reason = argv_reason(cmd, depth + 1)
        if reason:
            return reason
    return None


def _interpreter_reason(base, args, depth):
    family = "python" if PYTHON.match(base) else base
    flags = ("-c",) if family == "python" else INLINE_CODE[family]
    if family == "python":
        index = None
        for i, tok in enumerate(args):
            if tok == "--" or not tok.startswith("-"):
                break
            if tok.startswith("-") and not tok.startswith("--") and tok.endswith("c"):
                index = i + 1
                break
    elif family in ("awk", "gawk", "mawk", "nawk"):
        first = _skip_options(args, {"-f", "-v", "-F"})
        index = None if any(t == "-f" or t.startswith("-f") for t in args[:first]) else first
    else:
        index = _inline_flag(args, flags)
    if index is None:   # a script file: trusted by its name, like any program
        first = _skip_options(args, {"-m", "-W", "-X", "-f", "-v", "-F"})
        if first < len(args):
            return word_reason(os.path.basename(args[first])) or _args_reason(args[first + 1:], depth)
        return _args_reason(args, depth)
    code = args[index] if index < len(args) else ""
    reason = word_reason(code) or _token_reason(code)
    if reason:
        return reason
    if family == "python":
        return _python_code_reason(code)
    return "inline %s code cannot be inspected" % base


def _args_reason(args, depth):
    for tok in args:
        reason = _token_reason(tok) or word_reason(tok)
        if reason:
            return reason
        if any(ch.isspace() for ch in tok):   # a command string for a remote or inner shell
            try:
                shlex.split(tok)
            except ValueError:
                continue
            reason = script_reason(tok, depth + 1)
            if reason:
                return reason
    return None


def argv_reason(argv, depth=0):
    """Why an argv is destructive or opaque (a short reason), or None when it looks harmless."""
    if depth > MAX_DEPTH:
        return "nested too deep to inspect"
    i = 0
    while i < len(argv) and ASSIGNMENT.match(argv[i]):
        reason = _token_reason(argv[i])
        if reason:
            return reason
        i += 1
    argv = list(argv[i:])
    if not argv:
        return None
    prog, args = argv[0], argv[1:]
    base = os.path.basename(prog)
    if prog.startswith("$"):
        return "the program comes from %s, unknown until it runs" % prog
    reason = _token_reason(prog) or word_reason(base)
    if reason:
        return reason
    if base in ("eval",):
        return "eval runs text that cannot be inspected"
    if base in ("source", "."):
        return _args_reason(args, depth)
    if base in SHELLS:
        code, first = _shell_code_index(args)
        if code is not None:
            if code >= len(args):
                return "%s -c without a script" % base
            return script_reason(args[code], depth + 1) or _args_reason(args[code + 1:], depth)
        if first >= len(args):
            return "%s reads its script from standard input: cannot be inspected" % base
        return argv_reason(args[first:], depth + 1)
    if PYTHON.match(base) or base in INLINE_CODE:
        return _interpreter_reason(base, args, depth)
    if base in WRAPPERS:
        takes_value, operands = WRAPPERS[base]
        if base in ("su", "runuser", "flock") and any(t in ("-c", "--command") for t in args):
            at = max(i for i, t in enumerate(args) if t in ("-c", "--command"))
            return script_reason(args[at + 1] if at + 1 < len(args) else "", depth + 1) \
                or _args_reason(args[:at], depth)
        if base == "env":
            split = [i for i, t in enumerate(args) if t in ("-S", "--split-string") or t.startswith("--split-string=")]
            if split:
                at = split[0]
                text = args[at].split("=", 1)[1] if "=" in args[at] else (args[at + 1] if at + 1 < len(args) else "")
                try:
                    return argv_reason(shlex.split(text) + args[at + 2:], depth + 1)
                except ValueError:
                    return "env -S string cannot be parsed"
        start = _skip_options(args, takes_value)
        if base == "watch":
            return script_reason(" ".join(args[start:]), depth + 1)
        while start < len(args) and base == "env" and ASSIGNMENT.match(args[start]):
            start += 1
        return _args_reason(args[:start + operands], depth) or argv_reason(args[start + operands:], depth + 1)
    if base in ("curl",) and any(t in ("-K", "--config") or t.startswith("--config=") or re.match(r"^-[A-Za-z]*K", t)
                                 for t in args):
        return "curl reads its request from a config file (-K) that cannot be inspected"
    if base in ("wget",) and any(t in ("-i", "-e", "--input-file", "--execute", "--config") or
                                 t.startswith(("--input-file=", "--execute=", "--config=")) for t in args):
        return "wget reads commands from a file or -e that cannot be inspected"
    # an unknown wrapper (docker exec, ssh HOST, kubectl exec --): a shell or interpreter inside it
    for at in range(len(args)):
        inner = os.path.basename(args[at])
        if (inner in SHELLS and _shell_code_index(args[at + 1:])[0] is not None) or \
                ((PYTHON.match(inner) or inner in INLINE_CODE) and _inner_has_code(inner, args[at + 1:])):
            reason = _args_reason(args[:at], depth) or argv_reason(args[at:], depth + 1)
            if reason:
                return reason
    return _args_reason(args, depth)


def _inner_has_code(base, args):
    if PYTHON.match(base):
        return any(t.startswith("-") and not t.startswith("--") and t.endswith("c") for t in args[:3])
    flags = INLINE_CODE.get(base, ())
    return base in ("awk", "gawk", "mawk", "nawk") or any(t in flags for t in args[:3])


def destructive_word(command):
    """Why a stop command looks destructive (a word such as 'terminate', or a reason why it cannot
    be inspected), or None.

    Fail closed: a command that names such an action, at any depth of wrapping, is treated as
    destructive even when nobody declared it so, because running it without a verified durable
    copy can delete the only copy. The program's folder does not decide, its name does."""
    if isinstance(command, (list, tuple)):
        return argv_reason(list(command))
    try:
        argv = shlex.split(command)
    except ValueError:
        return "the command cannot be split into arguments"
    return argv_reason(argv)


# ----------------------------------------------------------------------------- the durable copy

def verify_durable(run_dir):
    """Re-check the run's durable copy now, with the one evidence parser: (ok, detail).

    status.json "sync" must say ok and verified and name results_dir and its manifest; the manifest
    must parse (evidence.read_manifest), belong to this run, list a result besides the logs, and
    match every file in results_dir, re-hashed (evidence.verify_tree)."""
    status = core.read_json(os.path.join(run_dir, "status.json"))
    sync = status.get("sync")
    if not isinstance(sync, dict):
        return False, "status.json has no sync record: the end-of-run sync has not run"
    if sync.get("ok") is not True or sync.get("verified") is not True:
        return False, "status.json sync says ok=%s verified=%s%s" % (
            sync.get("ok"), sync.get("verified"), (": %s" % sync["error"]) if sync.get("error") else "")
    results, manifest_path = sync.get("results_dir"), sync.get("manifest")
    if not isinstance(results, str) or not results or not os.path.isdir(results):
        return False, "sync.results_dir %r is not a directory here" % (results,)
    if not isinstance(manifest_path, str) or not manifest_path:
        return False, "status.json sync names no manifest"
    manifest, problems = evidence.read_manifest(manifest_path)
    if problems or manifest is None:
        first = (problems or [{"path": manifest_path, "detail": "unreadable"}])[0]
        return False, "manifest %s: %s: %s" % (manifest_path, first["path"], first["detail"])
    run_id = status.get("run_id")
    if isinstance(run_id, str) and run_id and manifest.get("run_id") != run_id:
        return False, "manifest %s is for run %r, not %r" % (manifest_path, manifest.get("run_id"), run_id)
    if all(e["path"].startswith("logs/") for e in manifest["files"]):
        return False, "the durable copy holds only the run's logs (no --output was declared): nothing " \
                      "protects a destructive stop"
    problems, hashed = evidence.verify_tree(results, manifest, progress=False)
    if problems:
        return False, "%d problem(s) at %s, first: %s %s: %s" % (
            len(problems), results, problems[0]["code"], problems[0]["path"], problems[0]["detail"])
    return True, "%d file(s), %d bytes re-verified (sha256) at %s against %s" % (
        manifest["file_count"], manifest["total_bytes"], results, manifest_path)


# ----------------------------------------------------------------------------- the watchdog

class Deadman(object):
    def __init__(self, run_dir, cfg, foreground):
        self.run_dir = run_dir
        self.cfg = cfg
        self.foreground = foreground
        self.armed_at = time.time()       # for the record only; every deadline is monotonic
        self.armed_mono = time.monotonic()
        self.state = "armed"
        self.ended_mono = None            # when the job was (first seen) over
        self.last_ssh = None              # last time a counted SSH session held the firing off
        self.ssh_wait_since = None        # when SSH sessions first held the firing off
        self.ssh_capped = False           # the SSH wait reached --ssh-wait-max-minutes
        self.ssh_seen = {}                # session key -> (activity, monotonic time it last changed)
        self.resumed_mono = None          # when the machine last woke from suspend
        self.last_other = None            # when another run on this node was last seen active
        self.progress_sig = None          # (mtime of heartbeat.json, of job.log) last seen
        self.progress_mono = self.armed_mono
        self.last_eval = self.armed_mono
        self.ack_sig = None
        self.ack_until_mono = None
        self.clock = (suspend_clock(), time.monotonic())
        self.last_note = None
        self.last_write = None
        self.stop_requested = None
        self.check_now = False
        self.firing = False
        self.fired = None

    # paths
    def p(self, name):
        return os.path.join(self.run_dir, name)

    def log(self, msg):
        line = "%s deadman[%d] %s\n" % (stamp(), os.getpid(), msg)
        try:
            with open(self.p("deadman.log"), "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            pass
        if self.foreground:
            sys.stderr.write(line)
            sys.stderr.flush()

    def note(self, msg):
        """Log msg only when it differs from the previous note (no log spam at each poll)."""
        if msg != self.last_note:
            self.last_note = msg
            self.log(msg)

    def write_state(self, extra=None):
        doc = {
            "pid": os.getpid(), "identity": core.process_identity(), "host": socket.gethostname(),
            "run_dir": self.run_dir, "armed_at": stamp(self.armed_at), "state": self.state, "updated_at": stamp(),
            "config": self.cfg, "last_check": self.last_note, "toolkit_version": core.toolkit_version(),
        }
        if self.fired:
            doc["fired"] = {"reason": self.fired.get("reason"), "ok": self.fired.get("ok"),
                            "fired_at": self.fired.get("fired_at")}
        if extra:
            doc.update(extra)
        core.atomic_write_json(self.p(STATE_FILE), doc)
        self.last_write = time.monotonic()

    def on_wake(self, _signum, _frame):
        self.check_now = True  # SIGUSR1 from `ack`: read ACK now, not at the next poll

    def on_signal(self, signum, _frame):
        if self.firing:
            self.log("ignoring signal %d while firing: finishing the stop sequence" % signum)
            return
        self.stop_requested = signum

    def wall_at(self, mono):
        """The wall-clock time a monotonic instant corresponds to (for messages only)."""
        return time.time() + (mono - time.monotonic())

    def from_wall(self, wall, now):
        """A monotonic instant for a wall time read from a file, no earlier than arming."""
        age = time.time() - wall
        return now - min(max(age, 0.0), now - self.armed_mono)

    # what the run looks like
    def job_facts(self, status):
        """(job_pid, job_alive, helper_alive) with pid-reuse caught by the recorded identities."""
        cfg = self.cfg
        started = core.parse_iso(status.get("started_at"))
        if status.get("job_pid"):
            job_pid, ident = status.get("job_pid"), status.get("job_identity")
        else:
            job_pid, ident = cfg.get("job_pid"), cfg.get("job_identity")
        job_alive = bool(job_pid) and core.record_alive(ident, job_pid, started)
        helper_alive = any(core.record_alive(status.get(k + "_identity"), status.get(k + "_pid"), started)
                           for k in ("supervisor", "launcher") if status.get(k + "_pid"))
        return job_pid, job_alive, helper_alive

    def track_progress(self, now):
        """Move the stall clock when heartbeat.json or job.log changed since the last look.

        The change is dated by the file's mtime, but never earlier than the previous look, so a
        wall-clock step moves the stall clock by one poll interval at most."""
        stamps = (mtime(self.p("heartbeat.json")), mtime(self.p("job.log")))
        if self.progress_sig is not None and stamps != self.progress_sig:
            newest = max([t for t in stamps if t is not None] or [time.time()])
            self.progress_mono = max(self.progress_mono, now - min(max(time.time() - newest, 0.0),
                                                                   now - self.last_eval))
        self.progress_sig = stamps

    def ack_postponed(self, ack, now):
        """True while an ACK's until (a wall time) lies ahead; converted once per ACK written."""
        until = ack.get("until")
        sig = (until, ack.get("at"))
        if sig != self.ack_sig:
            self.ack_sig = sig
            self.ack_until_mono = None
            if isinstance(until, (int, float)) and not isinstance(until, bool) and until == until:
                self.ack_until_mono = now + (until - time.time())
        return self.ack_until_mono is not None and now < self.ack_until_mono

    def counted_sessions(self, now):
        """SSH sessions that still hold the firing off: not idle past --ssh-idle-minutes."""
        sessions = ssh_sessions() or []
        idle_limit = self.cfg.get("ssh_idle_minutes") or 0.0
        seen, counted, idle = {}, [], []
        for sess in sessions:
            before = self.ssh_seen.get(sess["key"])
            changed = now if before is None or sess["activity"] != before[0] else before[1]
            seen[sess["key"]] = (sess["activity"], changed)
            if idle_limit and sess["activity"] is not None and now - changed >= idle_limit * 60:
                idle.append(sess["label"])
            else:
                counted.append(sess["label"])
        self.ssh_seen = seen
        return counted, idle

    def evaluate(self, now):
        """(reason, detail, job_pid, job_alive) when it should fire now, else None. NOW is monotonic."""
        cfg = self.cfg
        ack = core.read_json(self.p("ACK"))
        if ack.get("disarm") is True:
            return "disarm", "ACK says disarm", None, False
        postponed = self.ack_postponed(ack, now)

        status = core.read_json(self.p("status.json"))
        state = status.get("state")
        job_pid, job_alive, helper_alive = self.job_facts(status)
        self.track_progress(now)
        self.last_eval = now

        candidates = []
        if cfg["max_hours"] and now - self.armed_mono >= cfg["max_hours"] * 3600:
            candidates.append(("max_hours", "wall-clock cap of %g h since arming reached" % cfg["max_hours"]))

        if state in TERMINAL:
            if self.ended_mono is None:
                ended_at = core.parse_iso(status.get("ended_at"))
                self.ended_mono = self.from_wall(ended_at, now) if ended_at is not None else now
            active, why_over = False, "job %s (exit %s)" % (state, status.get("exit_code"))
        elif job_alive or (helper_alive and state in ACTIVE + (None,)):
            active, why_over = True, None
            self.ended_mono = None
            self.ssh_wait_since = self.last_ssh = None
            self.ssh_capped = False
        elif job_pid:
            if self.ended_mono is None:
                self.ended_mono = now
            active, why_over = False, "job pid %s is gone and no supervisor is alive (state %s)" % (job_pid, state)
        else:
            active, why_over = False, None

        if active:
            quiet = now - max(self.progress_mono, self.resumed_mono or self.armed_mono)
            if core.is_stalled(quiet, cfg["stall_minutes"]):
                candidates.append(("stall", "job alive (pid %s, state %s) but heartbeat.json and job.log "
                                            "unchanged for %s (limit %g min)"
                                   % (job_pid, state, dur(quiet), cfg["stall_minutes"])))
            if not candidates:
                self.note("watching: job active (state %s, pid %s)" % (state, job_pid))
        else:
            idle_since = self.ended_mono if self.ended_mono is not None else self.armed_mono
            holding = False
            # The node registry: another run on this node still trains, so the box is not idle.
            others = core.active_runs([os.path.dirname(self.run_dir)], exclude=[self.run_dir])
            if others:
                holding, self.last_other = True, now
                self.note("%s; holding: another run on this node is active (%s)"
                          % (why_over or "no job running", ", ".join(others[:5])))
            if self.last_other is not None:
                idle_since = max(idle_since, self.last_other)  # the grace starts when the last one ended
            if cfg["wait_ssh"] and not holding:
                counted, idle = self.counted_sessions(now)
                if counted:
                    if self.ssh_wait_since is None:
                        self.ssh_wait_since = now
                    if now - self.ssh_wait_since < cfg["ssh_wait_max_minutes"] * 60:
                        holding, self.last_ssh = True, now
                        self.note("job over; waiting for %d SSH session(s) to close: %s (at most until %s)"
                                  % (len(counted), ", ".join(counted),
                                     stamp(self.wall_at(self.ssh_wait_since + cfg["ssh_wait_max_minutes"] * 60))))
                    else:
                        self.ssh_capped = True
                        self.note("SSH wait cap of %g min reached: %d open session(s) no longer hold the firing "
                                  "off (%s)" % (cfg["ssh_wait_max_minutes"], len(counted), ", ".join(counted)))
                elif idle:
                    self.note("ignoring %d SSH session(s) idle for over %g min: %s"
                              % (len(idle), cfg["ssh_idle_minutes"], ", ".join(idle)))
            if self.last_ssh is not None:
                idle_since = max(idle_since, self.last_ssh)
            if self.resumed_mono is not None:
                idle_since = max(idle_since, self.resumed_mono)
            idle_for = now - idle_since
            if not holding and idle_for >= cfg["grace_minutes"] * 60:
                capped = " (SSH wait capped at %g min)" % cfg["ssh_wait_max_minutes"] if self.ssh_capped else ""
                if why_over:
                    candidates.append(("job_ended", "%s; no ACK within %g min%s"
                                       % (why_over, cfg["grace_minutes"], capped)))
                else:
                    candidates.append(("no_job", "no job, launcher or supervisor seen for %g min%s"
                                       % (cfg["grace_minutes"], capped)))
            elif not holding:
                self.note("%s; firing at %s unless acknowledged"
                          % (why_over or "no job running", stamp(self.wall_at(idle_since + cfg["grace_minutes"] * 60))))

        if not candidates:
            return None
        if postponed:
            self.note("would fire (%s) but ACK postpones until %s" % (candidates[0][0], stamp(ack.get("until"))))
            return None
        reason, detail = candidates[0]
        return reason, detail, job_pid, job_alive

    def loop(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGUSR1, self.on_wake)
        self.log("armed on %s: %s" % (self.run_dir, json.dumps(self.cfg, sort_keys=True)))
        while True:
            if self.stop_requested:
                self.state = "exited"
                self.log("exiting on signal %d: NOTHING WATCHES THIS RUN NOW" % self.stop_requested)
                self.write_state()
                return 0
            if not os.path.isdir(self.run_dir):
                # Someone removed the run on purpose; there is nothing left to record into or guard.
                sys.stderr.write("deadman: run dir %s is gone; standing down\n" % self.run_dir)
                return 0
            now = time.monotonic()
            clock = (suspend_clock(), now)
            slept = suspended_seconds(self.clock, clock)
            self.clock = clock
            if slept:
                # A laptop lid or host suspend froze the job and us alike: the heartbeat is old only
                # because time stood still for the job. Restart the stall and grace clocks.
                self.resumed_mono = now
                self.log("machine was suspended for about %s; stall and grace clocks restart now" % dur(slept))
            verdict = self.evaluate(now)
            if verdict and verdict[0] == "disarm":
                self.state = "disarmed"
                self.log("disarmed by ACK; exiting without stopping anything")
                self.write_state()
                return 0
            if verdict:
                return self.fire(*verdict)
            if self.last_write is None or now - self.last_write >= max(30.0, self.cfg["poll_seconds"]):
                self.write_state()
            # Sleep in short slices: time.sleep resumes after a handled signal (PEP 475),
            # so one long sleep would delay a requested exit by a whole poll interval.
            wake = time.monotonic() + self.cfg["poll_seconds"]
            while not self.stop_requested and not self.check_now and time.monotonic() < wake:
                time.sleep(min(0.5, self.cfg["poll_seconds"]))
            self.check_now = False

    # firing
    def save_fired(self):
        core.atomic_write_json(self.p(FIRED_FILE), self.fired)

    def still_the_job(self, job_pid):
        status = core.read_json(self.p("status.json"))
        if status.get("job_pid") == job_pid:
            return core.record_alive(status.get("job_identity"), job_pid, core.parse_iso(status.get("started_at")))
        return core.record_alive(self.cfg.get("job_identity"), job_pid)

    def wait_until(self, done, seconds):
        """Poll DONE() until it is true or SECONDS (monotonic) pass; returns the seconds waited."""
        start = time.monotonic()
        while not done() and time.monotonic() - start < seconds:
            time.sleep(min(0.2, self.cfg["poll_seconds"]))
        return time.monotonic() - start

    def term_job(self, job_pid):
        cfg = self.cfg
        pid = int(job_pid)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = None
        group = pgid == pid
        rec = {"signal": "SIGTERM", "target": ("process group %d" % pid) if group else ("pid %d" % pid),
               "grace_seconds": cfg["term_grace_seconds"]}
        if cfg["dry_run"]:
            rec["dry_run"] = True
            return rec
        if not self.still_the_job(pid):   # never signal a reused pid
            rec["skipped"] = "pid %d is no longer the recorded job (exited, or reused by another process)" % pid
            return rec
        rec["sent_at"] = stamp()
        try:
            if group:
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
        except OSError as exc:
            rec["error"] = str(exc)
        rec["waited_seconds"] = round(self.wait_until(lambda: not core.pid_alive(pid), cfg["term_grace_seconds"]), 2)
        rec["job_exited"] = not core.pid_alive(pid)

        def sync_over():  # give the supervisor a chance to finish its durable sync of what the job saved
            status = core.read_json(self.p("status.json"))
            return status.get("state") in TERMINAL or not core.record_alive(
                status.get("supervisor_identity"), status.get("supervisor_pid"),
                core.parse_iso(status.get("started_at")))
        self.wait_until(sync_over, cfg["sync_wait_seconds"])
        rec["state_after"] = core.read_json(self.p("status.json")).get("state")
        self.log("sent SIGTERM to %s; job exited: %s after %.1f s; run state now %s"
                 % (rec["target"], rec["job_exited"], rec["waited_seconds"], rec["state_after"]))
        return rec

    def run_limited(self, argv, timeout):
        """One external command under core.run_bounded: a record of rc, timed_out, seconds, output."""
        res = core.run_bounded(argv, timeout, cwd=self.run_dir)
        rec = {"rc": res.rc, "timed_out": res.timed_out, "seconds": round(res.seconds, 2),
               "output_tail": (res.output or "")[-300:]}
        if res.error:
            rec["error"] = res.error
        return rec

    def attempts(self, argv, what):
        """Run ARGV up to --retries times with exponential backoff, yielding each attempt's record;
        stops after the first success."""
        cfg = self.cfg
        for attempt in range(cfg["retries"]):
            rec = self.run_limited(argv, cfg["stop_timeout"])
            rec["at"] = stamp()
            self.log("%s attempt %d/%d: rc=%s%s" % (what, attempt + 1, cfg["retries"], rec["rc"],
                                                   " (timed out after %.1f s)" % rec["seconds"]
                                                   if rec["timed_out"] else ""))
            yield rec
            if rec["rc"] == 0:
                return
            if attempt + 1 < cfg["retries"]:
                time.sleep(cfg["retry_backoff"] * (2 ** attempt))

    def usable_fallback(self, already):
        """(fallback template, argv) when a fallback exists, differs from ALREADY, and can run now."""
        fallback = self.cfg["fallback_stop_cmd"]
        if not fallback or fallback == already:
            return None, None
        argv, missing = expand_argv(fallback)
        if missing:
            self.log("cannot run the fallback %r: unset variable(s) %s" % (fallback, ", ".join(missing)))
            return None, None
        why = destructive_word(argv)
        if why:
            self.log("not running the fallback %r: it expands to a destructive command (%s)" % (fallback, why))
            return None, None
        return fallback, argv

    def fire(self, reason, detail, job_pid, job_alive):
        cfg = self.cfg
        self.firing = True
        self.fired = {
            "reason": reason, "detail": detail, "fired_at": stamp(), "run_dir": self.run_dir,
            "host": socket.gethostname(), "deadman_pid": os.getpid(), "dry_run": cfg["dry_run"],
            "command": cfg["stop_cmd"], "command_source": cfg["stop_cmd_source"],
            "destructive": cfg["destructive"], "attempts": [], "ok": False,
            "toolkit_version": core.toolkit_version(),
        }
        self.save_fired()                       # the reason is on disk before anything else happens
        self.state = "fired"
        self.write_state()
        self.log("FIRED: %s: %s" % (reason, detail))

        if job_alive and job_pid:
            self.fired["job_term"] = self.term_job(job_pid)
            self.save_fired()

        if cfg["pre_stop_cmd"]:
            if cfg["dry_run"]:
                self.fired["pre_stop"] = {"command": cfg["pre_stop_cmd"], "dry_run": True}
            else:
                argv, missing = expand_argv(cfg["pre_stop_cmd"])
                if missing:
                    self.fired["pre_stop"] = {"command": cfg["pre_stop_cmd"], "rc": None,
                                              "error": "unset variable(s): " + ", ".join(missing)}
                else:
                    self.fired["pre_stop"] = dict(self.run_limited(argv, cfg["pre_stop_timeout"]),
                                                  command=cfg["pre_stop_cmd"])
                self.log("pre-stop command: %s" % json.dumps(self.fired["pre_stop"], sort_keys=True))
            self.save_fired()

        command, destructive = cfg["stop_cmd"], cfg["destructive"]
        argv, missing = expand_argv(command) if command else (None, [])
        if command and not missing and not destructive:
            why = destructive_word(argv)       # what the variables expanded to counts too
            if why:
                destructive = True
                self.fired.update(destructive=True, destructive_inferred_at_fire=why)
        if command and destructive:
            if not cfg["allow_destructive"]:
                gate_ok, why = False, "--allow-destructive was not given"
            else:
                gate_ok, why = verify_durable(self.run_dir)
            self.fired["destructive_gate"] = {"passed": gate_ok, "detail": why}
            if not gate_ok:
                self.fired["refused"] = "%s (%s)" % (REFUSED_MSG, why)
                self.fired["refused_command"] = command
                self.log("REFUSED destructive stop %r: %s" % (command, why))
                command, argv = self.usable_fallback(None)
                missing, destructive = [], False
                self.fired["command"], self.fired["destructive"] = command, False
                self.fired["command_source"] = "--fallback-stop-cmd" if command else None
            else:
                self.log("destructive stop allowed: %s" % why)

        if command and missing:
            self.fired["error"] = "stop command %r needs unset variable(s): %s" % (command, ", ".join(missing))
            self.log("cannot run %r: unset variable(s) %s" % (command, ", ".join(missing)))
            command, argv = self.usable_fallback(command)
            destructive = False
            if command:
                self.fired.update(command=command, destructive=False, command_source="--fallback-stop-cmd")
        if not command:
            self.fired["message"] = NO_STOP_MSG
            self.save_fired()
            self.log("!!! %s !!! Stop it by hand (profile meter-stop action)." % NO_STOP_MSG.upper())
            return self.finish(1)

        if cfg["dry_run"]:
            self.fired["would_run"] = command
            # Which $VARs resolved (names only: values can be ids or keys and stay out of files).
            names = sorted({m.group(1).strip("{}") for m in UNRESOLVED_VAR.finditer(command)})
            if names:
                self.fired["variables_resolved"] = names
            self.fired["message"] = "dry run: nothing was signalled or run"
            self.save_fired()
            self.log("DRY RUN: would run %r (destructive: %s)" % (command, destructive))
            return self.finish(0)

        for rec in self.attempts(argv, "stop"):
            self.fired["attempts"].append(rec)
            self.save_fired()
            if rec["rc"] == 0:
                self.fired["ok"] = True
                self.fired["message"] = "stop command succeeded"
                self.save_fired()
                return self.finish(0)
        failed = "stop command failed after %d attempt(s)" % cfg["retries"]
        fallback, fb_argv = self.usable_fallback(command)
        if fallback:
            self.log("%s; running the fallback %r" % (failed, fallback))
            self.fired["fallback"] = {"command": fallback, "attempts": [], "ok": False}
            for rec in self.attempts(fb_argv, "fallback stop"):
                self.fired["fallback"]["attempts"].append(rec)
                self.save_fired()
                if rec["rc"] == 0:
                    self.fired["ok"] = self.fired["fallback"]["ok"] = True
                    self.fired["message"] = "%s; the fallback stop command succeeded" % failed
                    self.save_fired()
                    return self.finish(0)
            failed += " and the fallback failed too"
        self.fired["message"] = "%s; the meter may still be running" % failed
        self.save_fired()
        self.log("!!! STOP FAILED (%s): the meter may still be running !!!" % failed)
        return self.finish(1)

    def finish(self, rc):
        self.write_state({"exit_code": rc})
        return rc


# ----------------------------------------------------------------------------- subcommands

def fnum(positive=False):
    """Minutes, hours, seconds: finite, >= 0 (> 0 when POSITIVE) and < 1e9 (absurd sizes overflow time APIs)."""
    return core.arg_number(float, 0.0, 1e9, low_open=positive)


def run_dir_arg(args):
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        raise core.UsageError("run dir %s %s" % (run_dir, "is not a directory" if os.path.exists(run_dir)
                                                   else "does not exist"))
    return run_dir


def live_deadman(run_dir):
    """The pid of a dead-man that is still running for run_dir (its recorded identity alive), else None."""
    st = core.deadman_state(run_dir)
    if st["word"] == "ARMED" and st["alive"] and st["pid"] != os.getpid():
        return st["pid"]
    return None


def take_lock(run_dir):
    """An fd holding an exclusive flock on deadman.lock; Refused when another dead-man holds it."""
    fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                holder = core.read_json(os.path.join(run_dir, STATE_FILE)).get("pid")
                raise core.Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                                   "deadman.py ack --run-dir %s --disarm" % (holder, run_dir, run_dir))
            # filesystems without flock (some FUSE mounts): fall back to the identity check alone
    live = live_deadman(run_dir)
    if live:
        os.close(fd)
        raise core.Refused("a dead-man (pid %s) already watches %s; disarm it first: "
                           "deadman.py ack --run-dir %s --disarm" % (live, run_dir, run_dir))
    return fd


def build_config(args, run_dir):
    cfg = {
        "stall_minutes": args.stall_minutes, "grace_minutes": args.grace_minutes,
        "max_hours": args.max_hours or 0.0, "wait_ssh": args.wait_ssh,
        "ssh_wait_max_minutes": args.ssh_wait_max_minutes, "ssh_idle_minutes": args.ssh_idle_minutes,
        "allow_destructive": args.allow_destructive, "retries": args.retries,
        "retry_backoff": args.retry_backoff, "stop_timeout": args.stop_timeout,
        "pre_stop_cmd": args.pre_stop_cmd, "pre_stop_timeout": args.pre_stop_timeout,
        "fallback_stop_cmd": args.fallback_stop_cmd, "term_grace_seconds": args.term_grace_seconds,
        "sync_wait_seconds": args.sync_wait_seconds, "poll_seconds": args.poll_seconds,
        "dry_run": args.dry_run, "job_pid": args.job_pid, "profile": None,
        "stop_cmd": None, "stop_cmd_source": None, "destructive": False,
    }
    if args.job_pid is not None:
        if args.job_pid <= 0:
            raise core.UsageError("--job-pid must be a positive pid")
        cfg["job_identity"] = core.process_identity(args.job_pid)
    if args.retries < 1:
        raise core.UsageError("--retries must be at least 1")
    for flag, value in (("--pre-stop-cmd", args.pre_stop_cmd), ("--fallback-stop-cmd", args.fallback_stop_cmd)):
        if value is not None:
            split_cmd(value, flag)
    warnings = []
    profile = args.profile
    if not profile:
        profile = core.read_json(os.path.join(run_dir, "run.json")).get("profile") or None
    cfg["profile"] = profile if isinstance(profile, str) else None
    if args.stop_cmd is not None:
        split_cmd(args.stop_cmd, "--stop-cmd")
        cfg.update(stop_cmd=args.stop_cmd, stop_cmd_source="--stop-cmd", destructive=args.stop_cmd_destructive)
    elif cfg["profile"]:
        try:
            defaults = core.profile_defaults(cfg["profile"])
        except core.UsageError as exc:
            if args.profile:
                raise
            defaults = None
            warnings.append("profile %s from run.json: %s" % (cfg["profile"], exc))
        if defaults and defaults.get("METER_STOP_CMD"):
            split_cmd(defaults["METER_STOP_CMD"], "METER_STOP_CMD of profile %s" % profile)
            cfg.update(stop_cmd=defaults["METER_STOP_CMD"], stop_cmd_source="profile:%s" % profile,
                       destructive=defaults.get("METER_STOP_DESTRUCTIVE") == "true")
            if defaults.get("METER_STOP_NEEDS"):
                cfg["stop_cmd_needs"] = defaults["METER_STOP_NEEDS"]
    if args.stop_cmd_destructive and args.stop_cmd is None:
        raise core.UsageError("--stop-cmd-destructive describes --stop-cmd; give --stop-cmd too")
    word = destructive_word(cfg["stop_cmd"]) if cfg["stop_cmd"] else None
    if word and not cfg["destructive"]:
        cfg["destructive"] = True
        cfg["destructive_inferred_from"] = word
        warnings.append("NOTE: the stop command looks destructive (%s), so it is treated as destructive (runs "
                        "only with --allow-destructive and a verified durable sync)" % word)
    fallback_word = destructive_word(cfg["fallback_stop_cmd"]) if cfg["fallback_stop_cmd"] else None
    if fallback_word:
        raise core.UsageError("--fallback-stop-cmd looks destructive (%s): the fallback must be non-destructive"
                              % fallback_word)
    if not cfg["stop_cmd"] and not cfg["fallback_stop_cmd"] and profile == "local":
        warnings.append("NOTE: profile local has no platform meter; if this fires it only records why (give "
                        "--stop-cmd to act, e.g. a suspend command)")
    elif not cfg["stop_cmd"] and not cfg["fallback_stop_cmd"]:
        warnings.append("WARNING: %s if this fires (no --stop-cmd, and profile %s has no METER_STOP_CMD); "
                        "it will only record why" % (NO_STOP_MSG, profile or "(none)"))
    if args.wait_ssh and ssh_sessions() is None:
        warnings.append("WARNING: --wait-ssh cannot see SSH sessions here (no /proc); it has no effect")
    if cfg["destructive"] and not args.allow_destructive:
        warnings.append("WARNING: the stop command is DESTRUCTIVE and --allow-destructive is not set: it will be "
                        "refused%s" % (" and the fallback run" if cfg["fallback_stop_cmd"]
                                       else "; with no --fallback-stop-cmd the meter keeps running"))
    return cfg, warnings


def retire_old_evidence(run_dir, log):
    """A new arming starts clean: an old disarm ACK or fired record would mislead it and run_status."""
    ack = core.read_json(os.path.join(run_dir, "ACK"))
    if ack.get("disarm") is True:
        os.unlink(os.path.join(run_dir, "ACK"))
        log("removed a disarm ACK left by an earlier dead-man")
    fired = os.path.join(run_dir, FIRED_FILE)
    if os.path.exists(fired):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        os.replace(fired, os.path.join(run_dir, "DEADMAN_FIRED.%s.json" % stamp))
        log("kept the earlier firing record as DEADMAN_FIRED.%s.json" % stamp)


def close_fds_except(keep):
    try:
        limit = os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        limit = 1024
    low = 3
    for fd in sorted(k for k in keep if k >= 3) + [min(limit, 65536)]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1


def detach_and_run(dm, lock_fd):
    """Double fork + setsid; the grandchild watches, the caller gets its pid. Returns that pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    rfd, wfd = os.pipe()
    child = os.fork()
    if child:
        os.close(wfd)
        os.waitpid(child, 0)
        chunks = []
        while True:
            chunk = os.read(rfd, 4096)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(rfd)
        answer = b"".join(chunks).decode("utf-8", "replace").strip()
        if not answer.startswith("ok "):
            raise RuntimeError(answer or "the detached dead-man died before reporting its pid")
        return int(answer.split()[1])
    rc = 1
    try:
        os.close(rfd)
        os.setsid()
        if os.fork():
            os._exit(0)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        # before the pid is published: an early ack's wake-up must not kill it (SIGUSR1's default)
        signal.signal(signal.SIGUSR1, getattr(dm, "on_wake", signal.SIG_IGN))
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        logfd = os.open(dm.p("deadman.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        close_fds_except({lock_fd, wfd})
        dm.write_state()
        os.write(wfd, ("ok %d\n" % os.getpid()).encode())
        os.close(wfd)
        wfd = None
        rc = dm.loop()
    except BaseException:  # the detached process has nobody to report to but its log
        try:
            dm.log("crashed:\n" + traceback.format_exc())
            if wfd is not None:
                os.write(wfd, ("error: %s\n" % sys.exc_info()[1]).encode())
        except Exception:
            pass
    finally:
        os._exit(rc)


def cmd_arm(args):
    run_dir = run_dir_arg(args)
    cfg, warnings = build_config(args, run_dir)
    lock_fd = take_lock(run_dir)
    dm = Deadman(run_dir, cfg, foreground=args.foreground)
    retire_old_evidence(run_dir, dm.log)
    for line in warnings:
        dm.log(line)
        sys.stderr.write(line + "\n")
    if args.foreground:
        signal.signal(signal.SIGUSR1, dm.on_wake)
        dm.write_state()
        if args.json:
            core.emit_json({"pid": os.getpid(), "run_dir": run_dir, "state": "armed", "foreground": True,
                            "config": cfg})
        return dm.loop()
    try:
        pid = detach_and_run(dm, lock_fd)
    except RuntimeError as exc:
        raise core.CheckFailed("the detached dead-man failed to start: %s (see %s)" % (exc, dm.p("deadman.log")))
    if args.json:
        core.emit_json({"pid": pid, "run_dir": run_dir, "state": "armed", "config": cfg})
    else:
        print(pid)
        sys.stderr.write("dead-man armed (pid %d) on %s; stop: %s\n"
                         % (pid, run_dir, cfg["stop_cmd"] or cfg["fallback_stop_cmd"] or "NONE"))
    return 0


def cmd_ack(args):
    run_dir = run_dir_arg(args)
    if args.disarm:
        doc = {"disarm": True, "at": stamp()}
        msg = "disarm requested: the dead-man is woken and exits now"
    else:
        minutes = args.postpone_minutes
        if minutes is None:
            minutes = core.deadman_state(run_dir, check_alive=False)["config"].get("grace_minutes")
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 <= minutes < 1e9:
                minutes = 15.0   # deadman.json is damaged or from elsewhere: the documented default
        until = time.time() + minutes * 60
        doc = {"until": until, "at": stamp()}
        msg = "postponed until %s (%g min)" % (stamp(until), minutes)
    core.atomic_write_json(os.path.join(run_dir, "ACK"), doc)
    live = live_deadman(run_dir)
    if live:  # wake it so the ACK takes effect now (a resume waits for the hand-over)
        try:
            os.kill(live, signal.SIGUSR1)
        except OSError:
            pass
    if args.json:
        core.emit_json(doc)
    else:
        print("ACK %s" % msg)
    return 0


def cmd_status(args):
    run_dir = run_dir_arg(args)
    st = core.deadman_state(run_dir)
    doc = core.read_json(os.path.join(run_dir, STATE_FILE)) or None
    fired, cfg = st["fired"], st["config"]
    ack = core.read_json(os.path.join(run_dir, "ACK")) or None
    sessions = ssh_sessions()
    word = st["word"]
    if word == "FIRED":
        rc = 7
        fired = fired or {}
        line = "reason=%s at %s stop_ok=%s %s" % (fired.get("reason"), fired.get("fired_at"), fired.get("ok"),
                                                   fired.get("refused") or fired.get("message") or "")
    elif word == "NONE":
        rc, line = 1, "no dead-man was armed for this run dir: nothing will stop the meter"
    elif word == "ARMED":
        rc = 0
        line = "pid=%s since %s stall=%sm grace=%sm cap=%s stop=%s%s" % (
            st["pid"], st["armed_at"], cfg.get("stall_minutes"), cfg.get("grace_minutes"),
            ("%gh" % cfg["max_hours"]) if isinstance(cfg.get("max_hours"), (int, float)) and cfg["max_hours"]
            else "off",
            json.dumps(cfg.get("stop_cmd") or cfg.get("fallback_stop_cmd")),
            " (dry run)" if cfg.get("dry_run") else "")
        until = (ack or {}).get("until")
        if isinstance(until, (int, float)) and not isinstance(until, bool) and until > time.time():
            line += " postponed-until=%s" % stamp(until)
    elif word == "DOWN":
        rc = 1
        line = "deadman.json says armed but pid %s is gone (or is another process now): nothing watches this " \
               "run; re-arm it" % st["pid"]
    else:
        rc, line = 1, "pid %s is not watching (state %s)" % (st["pid"], st["state"])
    out = {"run_dir": run_dir, "status": word, "watching": st["watching"], "alive": st["alive"],
           "deadman": doc, "fired": st["fired"], "ack": ack, "toolkit_version": core.toolkit_version(),
           "ssh_sessions": len(sessions) if sessions is not None else None}
    if args.json:
        core.emit_json(out)
    else:
        print("%s %s" % (word, line))
    return rc


def build_parser():
    top = core.Parser(prog="deadman.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog="Run `deadman.py arm --help` for every option.")
    sub = top.add_subparsers(dest="cmd", parser_class=core.Parser)

    arm = sub.add_parser("arm", help="start watching a run dir (detaches unless --foreground)")
    arm.add_argument("--run-dir", required=True)
    arm.add_argument("--stall-minutes", type=fnum(), default=core.DEFAULT_STALL_MINUTES,
                     help="fire when the job is alive but heartbeat.json/job.log are this old (0 = off; %g)"
                          % core.DEFAULT_STALL_MINUTES)
    arm.add_argument("--grace-minutes", type=fnum(), default=15.0,
                     help="fire this long after the job ended unless acknowledged (15)")
    arm.add_argument("--max-hours", type=fnum(), default=0.0, help="wall-clock cap since arming (0 = off)")
    arm.add_argument("--wait-ssh", action="store_true",
                     help="also wait while SSH sessions are open (SkyPilot's jobs_and_ssh idea), bounded below")
    arm.add_argument("--ssh-wait-max-minutes", type=fnum(positive=True), default=60.0,
                     help="open SSH sessions delay the firing by at most this much (60; always on)")
    arm.add_argument("--ssh-idle-minutes", type=fnum(), default=30.0,
                     help="an SSH session with no traffic for this long stops counting (30; 0 = off)")
    arm.add_argument("--profile", help="read METER_STOP_CMD/METER_STOP_DESTRUCTIVE from this profile")
    arm.add_argument("--stop-cmd", help="argv string run to stop the meter (overrides the profile)")
    arm.add_argument("--stop-cmd-destructive", action="store_true", help="--stop-cmd deletes data")
    arm.add_argument("--allow-destructive", action="store_true",
                     help="permit a destructive stop, and only after the durable sync re-verifies")
    arm.add_argument("--fallback-stop-cmd",
                     help="non-destructive argv string used when the stop is refused or fails every attempt")
    arm.add_argument("--pre-stop-cmd", help="argv string run before the stop (e.g. a last sync)")
    arm.add_argument("--pre-stop-timeout", type=fnum(), default=300.0, help="seconds (300)")
    arm.add_argument("--retries", type=int, default=3, help="attempts of the stop, and of the fallback (3)")
    arm.add_argument("--retry-backoff", type=fnum(), default=10.0, help="seconds before retry 2; doubles (10)")
    arm.add_argument("--stop-timeout", type=fnum(), default=120.0, help="hard seconds per stop attempt (120)")
    arm.add_argument("--term-grace-seconds", type=fnum(), default=30.0,
                     help="after SIGTERM to a live job's process group, wait this long for its checkpoint (30)")
    arm.add_argument("--sync-wait-seconds", type=fnum(), default=300.0,
                     help="then wait this long for the supervisor's durable sync to finish (300)")
    arm.add_argument("--job-pid", type=int, help="watch this pid when status.json has none")
    arm.add_argument("--poll-seconds", type=fnum(positive=True), default=30.0, help="check interval (30)")
    arm.add_argument("--dry-run", action="store_true", help="on firing, record what would happen; run nothing")
    arm.add_argument("--foreground", action="store_true", help="do not detach")
    arm.add_argument("--json", action="store_true", help="print the armed dead-man as JSON")

    ack = sub.add_parser("ack", help="postpone (default: by the armed grace) or disarm")
    ack.add_argument("--run-dir", required=True)
    group = ack.add_mutually_exclusive_group()
    group.add_argument("--postpone-minutes", type=fnum(), help="no firing before now + M minutes")
    group.add_argument("--disarm", action="store_true", help="the dead-man exits cleanly")
    ack.add_argument("--json", action="store_true", help="print the ACK written as JSON")

    st = sub.add_parser("status", help="is a dead-man watching this run? (0 armed, 1 nothing, 7 fired)")
    st.add_argument("--run-dir", required=True)
    st.add_argument("--json", action="store_true", help="print every field as JSON")
    return top


def main(argv=None):
    core.check_toolkit()
    args = build_parser().parse_args(argv)
    if not args.cmd:
        raise core.UsageError("give a command: arm, ack or status (see --help)")
    return {"arm": cmd_arm, "ack": cmd_ack, "status": cmd_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="deadman.py"))
