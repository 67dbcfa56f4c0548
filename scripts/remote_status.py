"""remote_status: `rgt.py status` in one ssh round trip, classified on the laptop by run_status.py's own rules.

The node runs scripts/node/status_facts.sh (a shell script: no Python starts there) and prints the run dir's
state files, job.log's tail, the /proc line of each recorded process, the disk, the GPUs and the candidate
outputs. Here those facts are laid out again in a private temp dir (same names, sizes and mtimes; job.log
sparse, with its tail and the attempt's start at their real offsets) and run_status.classify() reads that
dir with a Snapshot for everything beyond the files. One classifier, so the laptop and the node cannot
disagree on a state.

Whenever a fact is missing or unsure (an older toolkit on the node, a different toolkit version, a pid the
shell did not read, busybox tools, a symlinked output), Incomplete is raised and the caller asks
run_status.py on the node instead: slower, never different.

The node is untrusted input (finding_laptop_L1): a rented box may send any bytes. Only the names
status_facts.sh itself sends are laid out (NAMES: plain words, no "/" or ".."), each at most once, with sizes,
mtimes and bodies in range; the files are created with O_EXCL|O_NOFOLLOW inside a fresh private temp dir.
Anything else is Incomplete, so the node's run_status.py answers instead; nothing is ever written elsewhere.
"""
import os
import secrets
import shutil
import tempfile

import rgt_core as core
import run_status
import evidence

LOG = "job.log"
# Every name status_facts.sh sends (its STATE_FILES, job.log, run.lock, outputs.txt and the run dir itself).
STATE_FILES = ("run.json", "status.json", "heartbeat.json", "deadman.json", core.DEADMAN_FIRED_FILE, "exit_code",
               "lease.json")
NAMES = frozenset(STATE_FILES + (LOG, "run.lock", "outputs.txt", "."))
MAX_STATE_FILE = 8 << 20       # the node's state files are a few KB; a bigger one is not believed
MAX_LOG = 1 << 40              # a job.log size past 1 TiB is not believed (its replay is a sparse file)
MAX_MTIME = 1 << 33            # seconds: year 2242


class Incomplete(Exception):
    """The facts cannot decide the status exactly: ask run_status.py on the node."""


def new_mark():
    return "rgt" + secrets.token_hex(8)


def command(node_dir_word, run_dir_word, python_word, mark, fallback_args=()):
    """The node-side shell line: status_facts.sh when the node has it, else run_status.py --json (an older
    toolkit); its exit status is theirs. The words are already quoted for the node's shell (rgt.remote_word)."""
    facts = '"$d"/status_facts.sh'
    return ('d=%s; if [ -r %s ]; then sh %s %s "$d" %s; else %s -S "$d"/run_status.py %s --json%s; fi'
            % (node_dir_word, facts, facts, run_dir_word, mark, python_word, run_dir_word,
               "".join(" " + w for w in fallback_args)))


def sections(raw, mark):
    """[(name, arg, bytes)] of status_facts.sh's output; None when RAW is not that output. Whatever a login
    script printed before it is skipped: no such text can carry this call's random MARK."""
    head = b"\n@@" + mark.encode() + b" "
    start = raw.find(head + b"facts\n")
    if start < 0:
        return None
    out = []
    for piece in raw[start + len(head):].split(head):
        title, _, body = piece.partition(b"\n")
        name, _, arg = title.decode("utf-8", "replace").partition(" ")
        out.append((name, arg, body))
    return out


def number(text, kind=float):
    try:
        value = kind(text)
    except (TypeError, ValueError, OverflowError):
        raise Incomplete("unreadable fact %r" % (text,))
    if value != value or value in (float("inf"), float("-inf")):
        raise Incomplete("unreadable fact %r" % (text,))
    return value


def known_name(name, seen):
    """NAME when status_facts.sh could have sent it and it was not sent before; else Incomplete."""
    if name not in NAMES:
        raise Incomplete("the node sent a file name status_facts.sh never sends: %r" % name[:80])
    if name in seen:
        raise Incomplete("the node sent %s twice" % name)
    return name


def stat_fields(name, fields):
    """(mode, size, mtime, dev) of one stat line, each in the range a real file has; else Incomplete."""
    mode, size, mtime, dev = (number(fields[0], lambda t: int(t, 16)), number(fields[1], int),
                              number(fields[2]), number(fields[3], int))
    kind = mode & 0o170000
    limit = MAX_LOG if name == LOG else MAX_STATE_FILE
    if kind not in (0o100000, 0o040000) or not 0 <= size <= limit or not 0 <= mtime <= MAX_MTIME or dev < 0:
        raise Incomplete("an implausible stat line for %s" % name)
    return mode, size, mtime, dev


class Facts(object):
    """status_facts.sh's output, parsed."""

    def __init__(self, raw, mark):
        parts = sections(raw, mark)
        if parts is None:
            raise ValueError("not status_facts.sh output")
        if not parts or parts[-1][0] != "end":
            raise Incomplete("the node's answer was cut short")
        self.lines, self.files, self.stat, self.procs = [], {}, {}, {}
        self.tail = self.attempt = self.outputs = self.gpu = None
        self.outputs_rc = self.gpu_rc = None
        for name, arg, body in parts:
            if name == "facts":
                self.lines += body.decode("utf-8", "replace").splitlines()
            elif name == "file":
                self.files[known_name(arg, self.files)] = body
            elif name == "tail":
                self.tail = body
            elif name == "attempt":
                self.attempt = (number(arg, int), body)
                if not 0 <= self.attempt[0] <= MAX_LOG:
                    raise Incomplete("an implausible attempt offset %s" % arg[:40])
            elif name == "outputs":
                self.outputs = body
            elif name == "outputs-rc":
                self.outputs_rc = arg
            elif name == "gpu":
                self.gpu_rc, self.gpu = arg, body
        self.fact = {}
        for line in self.lines:
            key, _, value = line.partition(" ")
            if key == "stat":
                fields = value.rsplit(" ", 4)
                if len(fields) != 5:
                    raise Incomplete("unreadable stat line %r" % line[:120])
                self.stat[known_name(fields[0], self.stat)] = stat_fields(fields[0], fields[1:])
            elif key == "proc":
                pid, _, text = value.partition(" ")
                self.procs[number(pid, int)] = None if text == "-" else text
            elif key:
                self.fact[key] = value


class SnapshotProcs(core.Procs):
    """The node's process table as status_facts.sh read it."""

    def __init__(self, facts):
        self.table, self.boot = facts.procs, facts.fact.get("boot") or None

    def _line(self, pid):
        if pid not in self.table:
            raise Incomplete("pid %s is recorded but was not read on the node" % pid)
        return self.table[pid]

    def exists(self, pid):
        return self._line(pid) is not None

    def stat(self, pid):
        line = self._line(pid)
        try:
            return line.rsplit(")", 1)[1].split() if line is not None else None
        except IndexError:
            return None

    def boot_id(self):
        return self.boot

    def boot_time(self):
        raise Incomplete("a record without a process identity (an older toolkit) needs the node's clock ticks")


class Snapshot(run_status.Here):
    """run_status's machine, answered from the facts instead of this laptop."""

    def __init__(self, facts, run_dir):
        self.facts, self.run_dir = facts, run_dir
        self.procs = SnapshotProcs(facts)
        self._now = number(facts.fact.get("now"))

    def now(self):
        return self._now

    def hostname(self):
        return self.facts.fact.get("host") or ""

    def disk(self, _mirror):
        words = (self.facts.fact.get("disk") or "").split()
        here = self.facts.stat.get(".")
        if len(words) != 5 or here is None:
            raise Incomplete("no disk figures from the node")
        frsize, bavail, blocks, ffree, files = (number(w, int) for w in words)   # Linux: f_favail is f_ffree
        return run_status.disk_percentages(core.disk_figures(self.run_dir, self.run_dir, here[3], frsize, bavail,
                                                             blocks, ffree, files))

    def newest_output(self, run):
        outputs, cwd = (run or {}).get("outputs"), (run or {}).get("cwd")
        if not isinstance(outputs, list) or not outputs or not isinstance(cwd, str):
            return None
        if self.facts.outputs_rc is None:
            if "outputs.txt" in self.facts.stat:
                return None   # the job's cwd is gone: nothing to match, as on the node
            raise Incomplete("no output list on the node (a run launched by an older toolkit)")
        if self.facts.outputs_rc != "0" and not self.facts.outputs:
            raise Incomplete("find could not list the outputs (no GNU find?)")
        try:
            compiled = [evidence.compile_pattern(evidence.check_pattern(o)) for o in outputs if isinstance(o, str)]
        except core.UsageError:
            return None
        newest = None
        for line in (self.facts.outputs or b"").decode("utf-8", "surrogateescape").split("\n"):
            kind, _, rest = line.partition(" ")
            stamp, _, rel = rest.partition(" ")
            if not rel or not any(rx.fullmatch(c) for rx in compiled for c in evidence.ancestors_and_self(rel)):
                continue
            if kind != "f":
                raise Incomplete("an output is a symlink (%s): the node resolves it" % rel)
            if evidence.name_problem(rel):
                continue
            stamp = number(stamp)
            if newest is None or stamp > newest[0]:
                newest = (stamp, rel)
        return newest

    def gpu(self, timeout):
        rc, out = self.facts.gpu_rc, (self.facts.gpu or b"").decode("utf-8", "replace")
        if rc is None or rc == "notimeout":
            raise Incomplete("the node could not bound nvidia-smi")
        if rc == "none":
            return None, "nvidia-smi not found"
        if rc in ("124", "137"):     # timeout(1): TERM after 3 s, KILL a second later
            return run_status.gpu_parse(None, out, True, timeout)
        return run_status.gpu_parse(number(rc, int), out)

    def toolkit_version(self):
        return self.facts.fact.get("version") or None


def create(mirror, name):
    """A new file NAME in MIRROR, opened for writing: never through a link, never over an existing file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(os.path.join(mirror, name), flags, 0o600), "wb")


def lay_out(facts, mirror):
    """Recreate the run dir's files in MIRROR: contents, sizes where they matter (job.log), mtimes. The names
    are NAMES only (Facts refused any other), so every path is MIRROR/<one plain word>."""
    for name, (mode, size, mtime, _dev) in facts.stat.items():
        if name in (".", "outputs.txt"):
            continue
        if name not in NAMES or os.sep in name or name in ("..", ""):   # Facts checked; never trust one check
            raise Incomplete("refused file name %r" % name[:80])
        path = os.path.join(mirror, name)
        if mode & 0o170000 == 0o040000:
            if name != "run.lock":          # the run's lock is a folder; no state file or log is one
                raise Incomplete("the node says %s is a folder" % name)
            os.mkdir(path, 0o700)
        elif name == LOG:
            with create(mirror, name) as fh:
                fh.truncate(size)   # a hole: the parts not sent read as NUL bytes, which match nothing
                if facts.attempt:
                    fh.seek(min(facts.attempt[0], size))
                    fh.write(facts.attempt[1][:max(0, size - facts.attempt[0])])
                tail = facts.tail or b""
                fh.seek(max(0, size - len(tail)))
                fh.write(tail[-size:] if size else b"")
        else:
            if name not in facts.files and size:
                raise Incomplete("%s was listed but not sent" % name)
            body = facts.files.get(name, b"")
            if len(body) == size + 1 and body.endswith(b"\n"):
                body = body[:-1]   # awk ends the last line with a newline the file did not have
            with create(mirror, name) as fh:
                fh.write(body)
        ns = int(round(mtime * 1e9))
        os.utime(path, ns=(ns, ns), follow_symlinks=False)


def classify(raw, mark, run_dir, rate_per_hour=None):
    """The run_status dict (its "line" included) for status_facts.sh's output RAW; ValueError when RAW is
    not that output; Incomplete when only the node can decide; core.UsageError as run_status.py gives it."""
    facts = Facts(raw, mark)
    if "nodir" in facts.fact:
        raise core.UsageError(("not a directory: %s" if "exists" in facts.fact else "no such run dir: %s")
                              % run_dir)
    shown = facts.fact.get("dir") or run_dir
    if facts.fact.get("version") != core.toolkit_version():
        raise Incomplete("the node's toolkit is version %s, this laptop's %s"
                         % (facts.fact.get("version"), core.toolkit_version()))
    mirror = tempfile.mkdtemp(prefix="rgt-status-")
    try:
        try:
            lay_out(facts, mirror)
        except (OSError, ValueError, OverflowError) as exc:   # a laptop disk full, a size the fs refuses
            raise Incomplete("the facts could not be laid out here: %s" % exc)
        machine = Snapshot(facts, shown)
        try:
            r = run_status.classify(mirror, machine=machine, shown=shown)
            if rate_per_hour:
                run_status.add_cost(r, mirror, rate_per_hour, machine.now())
        except core.UsageError as exc:
            raise core.UsageError(str(exc).replace(mirror, shown))
        except (Incomplete, KeyboardInterrupt):
            raise
        except Exception as exc:     # state files no toolkit writes: the node's run_status.py says what it makes of them
            raise Incomplete("the replay could not read the node's facts (%s)" % type(exc).__name__)
        r["line"] = run_status.one_line(r)
        return r
    finally:
        shutil.rmtree(mirror, ignore_errors=True)

