#!/usr/bin/env python3
"""SSH sessions on this box, and the one rule for when they hold a watcher's stop off.

Guarantee: every authenticated OpenSSH connection is seen, also a port forward with no shell
(`ssh -N -L ...`, how Jupyter and TensorBoard are reached), and no session holds the meter on for
ever: one whose traffic has not moved for --ssh-idle-minutes stops counting, and all of them stop
counting --ssh-wait-max-minutes after they first held the stop off. Used by the dead-man and by its
idle-box mode. A library module (no command line).

Sessions are found in /proc by process title: "sshd: USER@pts/N", "sshd: USER@notty", "sshd: USER"
(a connection with no session channel: a tunnel), and the same with "sshd-session:" (OpenSSH 9.8+).
The listener ("sshd: /usr/sbin/sshd -D [listener] ...") and the bracketed privileged, network and
pre-auth helpers ("[priv]", "[net]", "[preauth]") are not sessions. utmp (`who`) is not used:
containers often keep none, and non-interactive sessions never appear there. Traffic is read from
/proc/PID/io (root can read it, the usual case on a rented box) and terminal times.

Whose sessions count (finding N13): a watcher passes its --ssh-user (default: the user who armed it;
"*" = everyone), so another user's login on a shared box does not hold this run's stop off. A session
with neither readable counters nor a terminal has no measurable idle time: idle_problem() says so, the
dead-man says it at arm time and in its status, and such a session counts until the wait cap. For a box
with several sshd servers (and the tests), $RGT_SSHD_PID limits the sessions to those under that listener.
"""
import os
import pwd
import re

import rgt_core as core

SESSION_TITLE = re.compile(r"^sshd(?:-session)?: ([^\s/@\[][^\s@\[]*)(?:@(\S+))?\s*$")


def parse_title(title):
    """(user, channel) for a session process title, else None. channel is the tty, "notty" or "tunnel"."""
    match = SESSION_TITLE.match(title.strip())
    if not match:
        return None
    return match.group(1), match.group(2) or "tunnel"


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


def arming_user():
    """The name of the user this process runs as (the default --ssh-user)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, OSError):
        return str(os.geteuid())


def _parent(proc, pid):
    try:
        with open(os.path.join(proc, str(pid), "stat")) as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _under(proc, pid, ancestor):
    """True when ANCESTOR is PID or one of its parents (a few levels: sshd's session processes are shallow)."""
    for _ in range(8):
        if pid is None or pid <= 1:
            return False
        if pid == ancestor:
            return True
        pid = _parent(proc, pid)
    return False


def ssh_sessions(proc="/proc", user=None):
    """Authenticated OpenSSH sessions on this host (of USER only, unless USER is None or "*"), or None
    without /proc.

    Each: {"key": pid + start time, "label": "user@tty" (or user@tunnel), "user", "activity": what changes
    when data flows (traffic counters, terminal times), or None where nothing can be read}."""
    if not os.path.isdir(os.path.join(proc, "self")):
        return None
    try:
        listener = int(os.environ.get("RGT_SSHD_PID") or 0)
    except ValueError:
        listener = 0
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "cmdline"), "rb") as fh:
                raw = fh.read(256)
        except OSError:
            continue
        parsed = parse_title(raw.replace(b"\0", b" ").decode("utf-8", "replace"))
        if not parsed:
            continue
        who, channel = parsed
        if user not in (None, "*") and who != user:
            continue
        if listener and not _under(proc, int(name), listener):
            continue
        io, tty = _io_counters(name), _tty_times(channel)
        ident = core.process_identity(int(name))
        found.append({"key": "%s:%s" % (name, ident.get("start_ticks")), "label": "%s@%s" % (who, channel),
                      "user": who, "activity": None if io is None and tty is None else (io, tty)})
    return sorted(found, key=lambda s: s["label"])


def idle_problem(found, idle_minutes):
    """Why --ssh-idle-minutes cannot work for FOUND (the sessions that count), or None."""
    if not idle_minutes or found is None:
        return None
    blind = [s["label"] for s in found if s.get("activity") is None]
    if blind:
        return ("SSH idle time UNMEASURABLE for %d session(s) (%s): sshd's /proc/PID/io is unreadable (not root) "
                "and they have no terminal; they count until --ssh-wait-max-minutes"
                % (len(blind), ", ".join(blind[:5])))
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return ("SSH idle time may be UNMEASURABLE: not root, so sshd's /proc/PID/io is unreadable; a session "
                "without a terminal (ssh -N, a command) counts until --ssh-wait-max-minutes")
    return None


class SshRule(object):
    """Do SSH sessions hold the stop off now? One rule for every watcher (pure given its inputs).

    hold(now, sessions) -> (holding, counted labels, idle labels, capped). NOW is monotonic seconds."""

    def __init__(self, idle_minutes, max_minutes):
        self.idle_limit = float(idle_minutes or 0.0) * 60.0
        self.max_wait = float(max_minutes or 0.0) * 60.0
        self.seen = {}          # key -> (activity, when it last changed)
        self.since = None       # when sessions first held the stop off
        self.capped = False

    def reset(self):
        self.since, self.capped = None, False

    def hold(self, now, sessions):
        seen, counted, idle = {}, [], []
        for sess in sessions or []:
            before = self.seen.get(sess["key"])
            changed = now if before is None or sess["activity"] != before[0] else before[1]
            seen[sess["key"]] = (sess["activity"], changed)
            if self.idle_limit and sess["activity"] is not None and now - changed >= self.idle_limit:
                idle.append(sess["label"])
            else:
                counted.append(sess["label"])
        self.seen = seen
        if not counted:
            self.reset()     # the cap counts from when sessions last began to hold, not for ever
            return False, counted, idle, False
        if self.since is None:
            self.since = now
        if self.max_wait and now - self.since >= self.max_wait:
            self.capped = True
            return False, counted, idle, True
        return True, counted, idle, False
