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
"""
import os
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


def ssh_sessions(proc="/proc"):
    """Authenticated OpenSSH sessions on this host, or None without /proc.

    Each: {"key": pid + start time, "label": "user@tty" (or user@tunnel), "activity": what changes
    when data flows (traffic counters, terminal times), or None where nothing can be read}."""
    if not os.path.isdir(os.path.join(proc, "self")):
        return None
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
        user, channel = parsed
        io, tty = _io_counters(name), _tty_times(channel)
        ident = core.process_identity(int(name))
        found.append({"key": "%s:%s" % (name, ident.get("start_ticks")), "label": "%s@%s" % (user, channel),
                      "activity": None if io is None and tty is None else (io, tty)})
    return sorted(found, key=lambda s: s["label"])


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
