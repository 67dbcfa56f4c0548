"""rgt_core: the one shared core; each safety rule (atomic write, liveness, disk gate, exit codes) lives here once.

Every node script imports this file as a sibling (`import rgt_core as core`); the laptop tools
import it from scripts/node/. Each safety rule that guards money or data lives here once:

  atomic_write / atomic_write_json   temp file, fsync, rename, directory fsync; temp removed on
                                     failure; refuses to replace anything that is not a regular
                                     file (a device, a FIFO, a symlink); "-" means stdout
  process_identity / pid_alive       pid + start time + boot id, so a reused pid is not "alive"
  record_alive / process_start_epoch  liveness of a process a state file recorded (its identity, else
                                     the bare pid checked against when the record was made)
  sha256_file                        streamed SHA-256 that notices a file changing under it (a sink
                                     can write a copy of exactly the bytes hashed)
  profile_index_path / load_profile  the profile index lookup (one search order, one error)
  disk_check / disk_gate             free bytes AND inodes, plus a write probe, one inode floor
  budget_hours                       the wall-clock hours a budget buys (billing's cap, the dead-man's messages)
  progress_age / is_stalled          the stall rule (one default, read from the dead-man's config)
  deadman_state                      what watches a run dir: ARMED, DOWN, FIRED, DISARMED, EXITED, NONE
  run_bounded                        an external command with a hard timeout that holds even when
                                     the command leaves detached children holding its output
  die_with_parent                    a Popen preexec_fn: the child gets SIGTERM when we die, even by
                                     SIGKILL (Linux prctl; a no-op elsewhere)
  Parser / run_main / die            one-line errors with one prefix and the exit-code contract
  protect_from_oom                   a watcher asks the kernel's OOM killer to take anything but itself
  safe_text / safe_line / guard_output  node- or run-controlled text made harmless for a terminal (controls
                                     escaped); guard_output wraps a tool's human stdout and stderr with it
  exit_codes_epilog                  the closing 'Exit codes' paragraph of every --help
  help_description                   a docstring as --help text, its 'Exit codes' paragraph left to the epilog
  arg_number                         an argparse type for a bounded finite number (nan/inf refused)
  check_toolkit / toolkit_version    the node folder's version stamp (VERSION.json)
  tar_pack_shell / tar_unpack_shell  a tar stream over ssh on a host with no tar (python3 tarfile)
  redact / redact_doc                secrets cut from a text (or every string of a record) before it is recorded,
                                     logged, told or shown: key values from the environment (*_API_KEY, *_TOKEN,
                                     *_SECRET, *_PASSWORD; this process's and PID 1's) and from the providers' key
                                     files, Authorization / Bearer values, api_key= and token= words, URL
                                     credentials and query strings

Exit codes shared by every script: 0 OK, 1 a check failed, 2 usage or bad input, 3 a gate refused.
"""
import argparse
import errno
import json
import math
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time

if sys.version_info < (3, 8):  # Ubuntu 18.04 images still ship 3.6: say so instead of a traceback
    sys.stderr.write("error: the node toolkit needs Python 3.8+, this is %d.%d\n" % sys.version_info[:2])
    sys.exit(2)

NODE_DIR = os.path.dirname(os.path.abspath(__file__))
STAMP_NAME = "VERSION.json"

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
# The one status vocabulary. Check results use the first row; run states the second.
OK, FAIL, REFUSED, STALE, WARN, SKIP = "OK", "FAIL", "REFUSED", "STALE", "WARN", "SKIP"

DEFAULT_MIN_FREE_INODES = 10000
# The one disk floor a launch or a queue cell is refused below (GiB free), when neither the flag, DISK_FLOOR_GB
# nor the profile names one; the audit, the patrol and the gates read it here, the shell scripts through
# `python3 rgt_core.py --default disk_floor_gb`.
DEFAULT_DISK_FLOOR_GB = 10.0
DEFAULTS = {"disk_floor_gb": DEFAULT_DISK_FLOOR_GB, "min_free_inodes": DEFAULT_MIN_FREE_INODES}
DEFAULT_STALL_MINUTES = 30.0
# The one run-id rule (finding D4): the launch, the laptop, the manifest and both schemas (manifest.schema.json,
# job_request.schema.json) use this pattern; run_one.sh spells it in bash and a test holds the copies equal.
RUN_ID_MAX = 100
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,%d}$" % (RUN_ID_MAX - 1)
RUN_ID_RE = re.compile(RUN_ID_PATTERN)
HEARTBEAT_NAMES = ("heartbeat.json", "job.log")


# Terminal controls a node, a run or a log may carry: C0 (ESC among them), DEL, C1, and the Unicode marks that
# reorder or hide text (bidi embeddings and isolates, line/paragraph separators). finding_laptop_L10.
_UNSAFE_CHARS = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"


def safe_text(value, keep="\t\n"):
    """VALUE as text a terminal shows as it is: each control character except those in KEEP is written as an
    escape (ESC as \\u001b), so text from a node or a run can neither move the cursor, clear the screen, set the
    window title nor hide words. For printing only: --json output keeps the raw value."""
    value = value if isinstance(value, str) else str(value)
    pattern = _SAFE_PATTERNS.get(keep)
    if pattern is None:
        kept = "".join("\\x%02x" % ord(c) for c in keep)
        pattern = _SAFE_PATTERNS[keep] = re.compile(("(?![%s])" % kept if keep else "") + "[%s]" % _UNSAFE_CHARS)
    return pattern.sub(lambda m: "\\u%04x" % ord(m.group()), value)   # the JSON spelling: valid in a JSON line too


def safe_line(value):
    """safe_text for a one-line field: newlines and tabs escaped too."""
    return safe_text(value, keep="")


_SAFE_PATTERNS = {}


class SafeStream(object):
    """A text stream that writes safe_text() of whatever it is given: a tool's human output, where any line may
    quote a node, a run or a log. Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, data):
        return self._stream.write(safe_text(data))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_output(json_mode=False):
    """Route this process's human output (stdout and stderr) through SafeStream; --json output stays raw."""
    if not json_mode:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and not isinstance(stream, SafeStream):
                setattr(sys, name, SafeStream(stream))


INTERPRETER_FILE = ".python"   # the node's real interpreter, recorded by `rgt_core.py --version --record-interpreter`
# ... one record per box (INTERPRETER_FILE-<box key>): a home folder on NFS is shared by boxes whose
# interpreters live in different places (finding_field_N14). The key is computed the same way by the shell
# line rgt.py sends (rgt.node_python): `uname -n` and the first 12 of the machine id, odd characters dropped.
BOX_KEY_SHELL = ("n=$(uname -n | tr -cd 'A-Za-z0-9._-'); m=$(cat /etc/machine-id 2>/dev/null || "
                 "cat /var/lib/dbus/machine-id 2>/dev/null); m=$(printf %s \"$m\" | tr -cd 'A-Za-z0-9' | cut -c1-12)")


def interpreter_record_name():
    """This box's interpreter record beside the toolkit: .python-<node name>-<machine id, 12>, as BOX_KEY_SHELL."""
    name = re.sub(r"[^A-Za-z0-9._-]", "", os.uname().nodename)
    machine = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                machine = handle.read()
            break
        except OSError:
            continue
    return "%s-%s-%s" % (INTERPRETER_FILE, name, re.sub(r"[^A-Za-z0-9]", "", machine)[:12])

# RGT_TRACE_STARTS=FILE: every toolkit process appends "pid TAB argv..." as it starts, to count what a command
# costs in interpreter starts (a launch: three; tests/test_fast_paths.py).
if os.environ.get("RGT_TRACE_STARTS"):
    try:
        with open(os.environ["RGT_TRACE_STARTS"], "a") as _trace:
            _trace.write("\t".join([str(os.getpid())] + sys.argv) + "\n")
    except OSError:
        pass

RawHelp = argparse.RawDescriptionHelpFormatter  # keeps a docstring's layout in --help
EXIT_MEANINGS = (("0", "ok", "success"), ("1", "fail", "a check failed"), ("2", "usage", "usage or bad input"),
                 ("3", "refused", "a gate refused"))


def exit_codes_epilog(doc=None, **meanings):
    """The one closing paragraph of every --help: 'Exit codes: 0 success; 1 a check failed; ...'.

    With DOC (a tool's module docstring) it is that docstring's own 'Exit codes' paragraph, so a tool states
    its codes once; otherwise the shared contract, where a tool may name what a code means for it (ok=,
    fail=, usage=, refused=; refused=None leaves out 3 for a tool with no gate; extra='5 ...' adds a code)."""
    if doc:
        for para in doc.strip().split("\n\n"):
            if para.lstrip().lower().startswith("exit codes"):
                return para.strip("\n")
    extra = meanings.pop("extra", None)
    parts = []
    for code, key, default in EXIT_MEANINGS:
        text = meanings.pop(key, default)
        if text is not None:
            parts.append("%s %s" % (code, text))
    if meanings:
        raise TypeError("exit_codes_epilog: unknown keys %s" % sorted(meanings))
    if extra:
        parts.append(extra)
    return "Exit codes: " + "; ".join(parts) + "."


def help_description(doc):
    """DOC (a tool's module docstring) without its 'Exit codes' paragraph: the --help description of a tool
    whose epilog is exit_codes_epilog(DOC), so the codes are stated once and close the help."""
    paras = [p for p in (doc or "").strip("\n").split("\n\n") if not p.lstrip().lower().startswith("exit codes")]
    return "\n\n".join(paras)


class UsageError(Exception):
    """Bad flags or bad input: exit 2."""


class Refused(Exception):
    """A gate refused: exit 3."""


class CheckFailed(Exception):
    """A check failed: exit 1."""


# ---------------------------------------------------------------- errors, output, main

def prog_name():
    return os.path.basename(sys.argv[0]) or "rgt"


def say(line):
    """One line on stderr, flushed (the node tools' progress and gate lines)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def unlink_quiet(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def say_error(message, prog=None):
    """The one error line: '<prog>: error: <message>' on stderr, newlines folded."""
    text = " ".join(str(message).split("\n"))
    sys.stderr.write("%s: error: %s\n" % (prog or prog_name(), text))


def die(message, code=EXIT_USAGE, prog=None):
    say_error(message, prog)
    sys.exit(code)


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, never the whole usage block."""

    def error(self, message):
        raise UsageError("%s (see --help)" % message)


def arg_number(kind=float, low=0.0, high=float("inf"), low_open=False):
    """An argparse type: a KIND in [LOW, HIGH), or (LOW, HIGH) with LOW_OPEN; nan and inf never pass."""
    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a number" % text)
        if not ((value > low if low_open else value >= low) and value < high):  # nan fails every comparison
            raise argparse.ArgumentTypeError("%r must be %s %g%s" % (
                text, ">" if low_open else ">=", low, "" if high == float("inf") else " and < %g" % high))
        return value
    return convert


def run_main(main, argv=None, prog=None):
    """Run main(argv) -> int with the shared exit-code contract; never lets a traceback out.

    RGT_DEBUG=1 re-raises unexpected exceptions (for developers)."""
    try:
        return int(main(argv) or 0)
    except UsageError as exc:
        say_error(exc, prog)
        return EXIT_USAGE
    except Refused as exc:
        say_error("REFUSED: %s" % exc, prog)
        return EXIT_REFUSED
    except CheckFailed as exc:
        say_error(exc, prog)
        return EXIT_FAIL
    except KeyboardInterrupt:
        say_error("interrupted", prog)
        return 130
    except BrokenPipeError:
        return EXIT_FAIL
    except Exception as exc:  # the contract: one line, not a traceback
        if os.environ.get("RGT_DEBUG") == "1":
            raise
        say_error("unexpected %s: %s (RGT_DEBUG=1 shows the traceback)" % (type(exc).__name__, exc), prog)
        return EXIT_FAIL


def printable(text):
    """TEXT with any undecodable bytes of a file name (surrogateescape) shown as \\xNN: safe to print and record."""
    if not isinstance(text, str):
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def map_strings(obj, fn):
    """OBJ (JSON-shaped) with FN applied to every string in it, dict keys included."""
    if isinstance(obj, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_strings(v, fn) for v in obj]
    return fn(obj) if isinstance(obj, str) else obj


def _printable_all(obj):
    return map_strings(obj, printable)


def dumps(obj):
    """JSON text that always encodes as UTF-8: a non-UTF-8 file name anywhere in OBJ is escaped (printable)."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(_printable_all(obj), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def emit_json(obj, stream=None):
    """Machine-readable output: sorted keys, two-space indent, one trailing newline."""
    (stream or sys.stdout).write(dumps(obj))
    (stream or sys.stdout).flush()


def write_stdout(text):
    """Write TEXT to stdout and flush -> whether it got there. A reader that went away (`| head -1`, a closed
    pipe) costs only the words: stdout is pointed at /dev/null so the exit flush cannot fail either, and the
    caller's verdict and exit code stay its own."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
        return True
    except (BrokenPipeError, ValueError, OSError):
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass
        return False


def utc_iso(ts=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))


def parse_iso(text):
    """'YYYY-MM-DDTHH:MM:SSZ' (or with fractional seconds / +00:00) -> epoch seconds, or None."""
    if not isinstance(text, str) or len(text) < 19:
        return None
    import calendar
    try:
        return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def human_bytes(count):
    count = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return "%d %s" % (count, unit) if unit == "B" else "%.1f %s" % (count, unit)
        count /= 1024.0
    return "%.1f TiB" % count


def human_age(seconds):
    if seconds is None:
        return "n/a"
    seconds = max(0, int(seconds))
    if seconds < 120:
        return "%ds" % seconds
    if seconds < 7200:
        return "%dm" % (seconds // 60)
    if seconds < 172800:
        return "%.1fh" % (seconds / 3600.0)
    return "%.1fd" % (seconds / 86400.0)


class Progress(object):
    """Byte meter on stderr: a live line on a TTY, a line every 15 s otherwise (thread-safe)."""

    def __init__(self, label, total=0, enabled=True):
        self.label, self.total, self.done = label, total, 0
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()
        self.enabled = enabled
        self.start = self.last = time.monotonic()
        self.interval = 0.25 if self.tty else 15.0
        self.printed = False

    def add(self, count):
        with self.lock:
            self.done += count
            now = time.monotonic()
            if self.enabled and now - self.last >= self.interval and now - self.start >= 1.0:
                self.last = now
                rate = self.done / max(now - self.start, 1e-9)
                line = "%s: %s/%s, %s/s" % (self.label, human_bytes(self.done), human_bytes(self.total),
                                             human_bytes(rate))
                sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else (line + "\n"))
                sys.stderr.flush()
                self.printed = True

    def close(self):
        if self.printed and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# ---------------------------------------------------------------- atomic writes

def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def lstat_or_usage(path, what):
    """os.lstat(PATH); a missing PATH raises FileNotFoundError, any other failure a UsageError "WHAT PATH: why"."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UsageError("%s %s: %s" % (what, path, exc.strerror or exc))


def check_replaceable(path):
    """Raise UsageError unless PATH is absent or a regular file (never clobber /dev/null or a link)."""
    try:
        st = lstat_or_usage(path, "cannot use")
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UsageError("refusing to replace %s: it is a symlink (give the real path, or '-' for stdout)" % path)
    if stat.S_ISDIR(st.st_mode):
        raise UsageError("%s is a directory; give a file path" % path)
    if not stat.S_ISREG(st.st_mode):
        raise UsageError("refusing to replace %s: it is a device, FIFO or socket, not a regular file "
                         "(use '-' for stdout)" % path)


def atomic_write(path, data, mode=None):
    """Write bytes or text to PATH so a reader sees the old or the new content, never a torn one.

    Temp file beside the target, fsync, rename, fsync of the directory; the temp file is removed on
    any failure. "-" writes to stdout. An existing non-regular target is refused (UsageError)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if path == "-":
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(data.decode("utf-8"))
        else:
            out.write(data)
        sys.stdout.flush()
        return
    check_replaceable(path)
    folder = os.path.dirname(os.path.abspath(path))
    import tempfile   # here, not at the top: every laptop command would pay for it (shutil, random)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path)[:100], suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is None:
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except OSError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(folder)


def atomic_write_json(path, obj):
    atomic_write(path, dumps(obj))


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
RESERVE_BYTES = 256 << 10


def make_reserve(path, size=RESERVE_BYTES):
    """Hold SIZE real bytes at PATH (written, not sparse) so a full disk can be given room back."""
    try:
        with open(path, "wb") as handle:
            handle.write(b"\0" * size)
            handle.flush()
            os.fsync(handle.fileno())
        return True
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return False


def release_reserve(path):
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def write_json_best_effort(path, obj, reserve=None):
    """atomic_write_json that never raises: on a full or read-only disk the RESERVE file (if any) is
    given up and the write tried once more. Returns None, or why it could not be written."""
    for attempt in (0, 1):
        try:
            atomic_write_json(path, obj)
            return None
        except (OSError, UsageError) as exc:
            error = "cannot write %s: %s" % (os.path.basename(path), getattr(exc, "strerror", None) or exc)
            full = isinstance(exc, OSError) and exc.errno in FULL_DISK_ERRNOS
            if attempt or not full or not reserve or not release_reserve(reserve):
                return error
    return None


def read_json(path, default=None):
    """A JSON object from PATH; DEFAULT (None -> {}) when missing, unreadable, invalid or not an object."""
    try:
        with open(path, encoding="utf-8") as handle:
            obj = json.load(handle)
    except (OSError, ValueError):
        return {} if default is None else default
    return obj if isinstance(obj, dict) else ({} if default is None else default)


def load_json_strict(path, what="file"):
    """A JSON object from PATH or UsageError saying exactly what is wrong."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise UsageError("cannot read %s %s: %s" % (what, path, exc.strerror or exc))
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError("%s %s is not valid JSON: %s" % (what, path, exc))
    if not isinstance(obj, dict):
        raise UsageError("%s %s is not a JSON object" % (what, path))
    return obj


# ---------------------------------------------------------------- processes

def _pid(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number > 0 else None
    return None


class Procs(object):
    """The process table liveness is read from: this machine's (kill(0) and /proc). run_status's one-trip form on
    the laptop passes a table the node's shell gathered instead (remote_status.py), so one rule decides both."""

    def exists(self, pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True   # exists, owned by someone else
        except OSError:
            return False
        return True

    def stat(self, pid):
        """/proc/PID/stat's fields after the command name, or None (no such process, or no /proc: macOS)."""
        try:
            with open("/proc/%d/stat" % pid) as handle:
                return handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None

    def boot_id(self):
        try:
            with open("/proc/sys/kernel/random/boot_id") as handle:
                return handle.read().strip() or None
        except OSError:
            return None

    def boot_time(self):
        """(btime from /proc/stat, clock ticks per second), or None where unknown."""
        try:
            with open("/proc/stat") as handle:
                btime = next((int(line.split()[1]) for line in handle if line.startswith("btime ")), None)
            hertz = os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None
        return None if btime is None or hertz <= 0 else (btime, hertz)


HERE = Procs()


def _proc_stat(pid):
    return HERE.stat(pid)


def protect_from_oom(score=-1000):
    """Ask the OOM killer to spare this process (a watcher must outlive the job whose memory ran out): write
    SCORE to /proc/self/oom_score_adj. True when it took; False where lowering needs privileges this process
    lacks (CAP_SYS_RESOURCE) or there is no /proc."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("%d\n" % score)
        with open("/proc/self/oom_score_adj") as fh:
            return int(fh.read().strip()) == score
    except (OSError, ValueError):
        return False


def boot_id():
    return HERE.boot_id()


def process_identity(pid=None):
    """{"pid", "start_ticks", "boot_id"} for PID (default: this process); start/boot None off Linux."""
    pid = os.getpid() if pid is None else _pid(pid)
    fields = _proc_stat(pid) if pid else None
    start = int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None
    return {"pid": pid, "start_ticks": start, "boot_id": boot_id()}


def pid_alive(pid, start_ticks=None, boot=None, procs=HERE):
    """True when PID runs and is not a zombie, and (when given) is the same process that was recorded:
    same start time and same boot. A pid reused after a restart is therefore not alive."""
    pid = _pid(pid)
    if pid is None or not procs.exists(pid):
        return False
    now_boot = procs.boot_id()
    if boot and now_boot and boot != now_boot:
        return False
    fields = procs.stat(pid)
    if fields is None:
        return True  # no /proc (macOS laptop): kill(0) is all we know
    if fields[0] in ("Z", "X"):
        return False
    if start_ticks is not None and len(fields) > 19 and fields[19].isdigit() and int(fields[19]) != int(start_ticks):
        return False
    return True


def identity_alive(ident, procs=HERE):
    """pid_alive for a recorded identity dict (or a bare pid)."""
    if isinstance(ident, dict):
        return pid_alive(ident.get("pid"), ident.get("start_ticks"), ident.get("boot_id"), procs)
    return pid_alive(ident, procs=procs)


def group_alive(pgid):
    """True while any process of process group PGID exists (zombies aside)."""
    pgid = _pid(pgid)
    if pgid is None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:  # killpg(0) also succeeds for a group of zombies only; look closer where /proc exists
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if name.isdigit():
            fields = _proc_stat(int(name))
            if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def process_start_epoch(pid, procs=HERE):
    """Wall-clock time PID started (boot time + start ticks from /proc), or None where unknown."""
    pid = _pid(pid)
    fields = procs.stat(pid) if pid else None
    ticks = int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None
    boot = procs.boot_time() if ticks is not None else None
    return None if boot is None else boot[0] + ticks / float(boot[1])


REUSE_SLACK_SECONDS = 60.0


def record_alive(identity=None, pid=None, not_after=None, procs=HERE):
    """Is the process a state file recorded still that same process?

    IDENTITY (a process_identity dict) decides whenever it was recorded: pid, start time and boot
    must all match. A record without one (written by an older toolkit) falls back to the bare PID,
    and NOT_AFTER (epoch seconds: when the record says the process was already running, e.g. a
    run's started_at or a dead-man's armed_at) catches a pid reused by a process that started
    later than that (beyond REUSE_SLACK_SECONDS of clock and truncation slack). PROCS: the process
    table to read (this machine's by default)."""
    if isinstance(identity, dict) and _pid(identity.get("pid")):
        return identity_alive(identity, procs)
    if not pid_alive(pid, procs=procs):
        return False
    if isinstance(not_after, (int, float)) and not isinstance(not_after, bool):
        started = process_start_epoch(pid, procs)
        if started is not None and started > not_after + REUSE_SLACK_SECONDS:
            return False
    return True


class Bounded(object):
    """Result of run_bounded: rc (None when killed), timed_out, output (text), seconds."""

    def __init__(self, rc, timed_out, output, seconds, error=None):
        self.rc, self.timed_out, self.output, self.seconds, self.error = rc, timed_out, output, seconds, error

    def as_dict(self):
        return {"rc": self.rc, "timed_out": self.timed_out, "seconds": round(self.seconds, 2),
                "output": self.output, "error": self.error}


def run_bounded(argv, timeout, env=None, cwd=None, max_output=65536, kill_grace=2.0):
    """Run ARGV with a hard TIMEOUT (monotonic) that holds even when it leaves children behind.

    The command gets its own session; its output goes to a temp file, not a pipe, so a detached
    grandchild that keeps the descriptor open cannot make us wait. On timeout the whole process
    group gets SIGTERM, then SIGKILL after KILL_GRACE seconds."""
    start = time.monotonic()
    try:
        import tempfile
        out = tempfile.TemporaryFile()
    except OSError:  # a full or read-only temp disk must not keep a stop command from running
        out = None
    try:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                    stdout=out if out is not None else subprocess.DEVNULL,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        except OSError as exc:
            rc = 127 if exc.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC) else 126
            return Bounded(rc, False, "", time.monotonic() - start, "cannot run %s: %s" % (argv[0], exc.strerror))
        timed_out = False
        try:
            proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, pause in ((signal.SIGTERM, kill_grace), (signal.SIGKILL, 1.0)):
                try:
                    os.killpg(proc.pid, sig)
                except OSError:
                    pass
                try:
                    proc.wait(timeout=pause)
                    break
                except subprocess.TimeoutExpired:
                    continue
        seconds = time.monotonic() - start
        text = ""
        if out is not None:
            out.seek(0)
            text = out.read(max_output).decode("utf-8", "replace")
    finally:
        if out is not None:
            out.close()
    return Bounded(None if timed_out else proc.returncode, timed_out, text, seconds)


def _parent_death_setter(sig):
    """Resolve prctl in the parent (no dlopen after fork); None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm():
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:    # the parent died between fork and prctl: nobody will signal us
            os._exit(1)
    return arm


def die_with_parent(sig=signal.SIGTERM):
    """A preexec_fn for a child that must not outlive us (an rsync writing into our staging dir after
    the puller was killed -9 would race the next pull). Only the direct child is covered; its own
    children notice their parent going away through the pipes it held. None where unsupported."""
    return _parent_death_setter(sig)


# ---------------------------------------------------------------- hashing

_local = threading.local()


def sha256_file(path, bufsize=1 << 20, on_bytes=None, sink=None):
    """Stream one regular file through SHA-256 -> (size, hexdigest).

    Does not follow a final symlink; raises OSError, or ValueError when the file is not regular or
    changed (size or mtime) while it was read. SINK, when given, is called with each chunk read (a
    memoryview, valid only during the call): a copy written by it is exactly the bytes hashed."""
    view = getattr(_local, "view", None)
    if view is None or len(view) != bufsize:
        view = _local.view = memoryview(bytearray(bufsize))
    import hashlib   # OpenSSL's start-up is paid by the commands that hash, not by every one
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise ValueError("not a regular file")
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                pass
        total = 0
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            while True:
                count = handle.readinto(view)
                if not count:
                    break
                digest.update(view[:count])
                if sink is not None:
                    sink(view[:count])
                total += count
                if on_bytes is not None:
                    on_bytes(count)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if total != after.st_size or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise ValueError("file changed while it was being read (is something still writing it?)")
    return total, digest.hexdigest()


# ---------------------------------------------------------------- profiles

def profile_index_path():
    """The profile index: $RGT_PROFILE_INDEX when set (that file or nothing), else index.json beside
    this core (the pushed node folder), else the repo's profiles/index.json. None when none exists."""
    env = os.environ.get("RGT_PROFILE_INDEX")
    if env:
        return env if os.path.isfile(env) else None
    for cand in (os.path.join(NODE_DIR, "index.json"),
                 os.path.join(NODE_DIR, "..", "..", "profiles", "index.json")):
        if os.path.isfile(cand):
            return os.path.normpath(cand)
    return None


def load_profile(name):
    """The profile NAME from the index, or UsageError with one clear reason."""
    if not isinstance(name, str) or not name.strip():
        raise UsageError("--profile is empty")
    path = profile_index_path()
    if path is None:
        raise UsageError("profile %r asked for but no profile index found (set RGT_PROFILE_INDEX, or push "
                         "profiles/index.json with the node folder)" % name)
    index = load_json_strict(path, "profile index")
    profiles = index.get("profiles")
    if not isinstance(profiles, dict):
        raise UsageError("%s is not a profile index (no \"profiles\" object)" % path)
    if name not in profiles:
        raise UsageError("profile %r is not in %s (known: %s)" % (name, path, ", ".join(sorted(profiles)) or "none"))
    prof = profiles[name]
    if not isinstance(prof, dict) or not isinstance(prof.get("defaults", {}), dict):
        raise UsageError("profile %r in %s is malformed (not an object, or its defaults are not one)" % (name, path))
    return prof


def profile_defaults(name):
    """Scalar defaults of profile NAME as strings ('~/' expanded; booleans as true/false)."""
    out = {}
    for key, value in sorted((load_profile(name).get("defaults") or {}).items()):
        if value is None or isinstance(value, (dict, list)):
            continue
        value = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out[key] = os.path.expanduser(value) if value.startswith("~/") else value
    return out


# ---------------------------------------------------------------- disk gate

def nearest_existing(path):
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def disk_check(path):
    """Free bytes and inodes of the filesystem holding PATH (or its nearest existing parent)."""
    probe = nearest_existing(path)
    st = os.statvfs(probe)
    return disk_figures(path, probe, os.stat(probe).st_dev, st.f_frsize, st.f_bavail, st.f_blocks, st.f_favail,
                        st.f_files)


def disk_figures(path, probe, dev, frsize, bavail, blocks, favail, files):
    """disk_check's dict from statvfs numbers (also as `stat -f` prints them on a node: remote_status.py)."""
    free = bavail * frsize
    return {"path": path, "measured_at": probe, "dev": dev,
            "free_bytes": free, "free_gib": round(free / float(1 << 30), 2), "total_bytes": blocks * frsize,
            "free_inodes": favail if files > 0 else None, "total_inodes": files if files > 0 else None}


def write_probe(folder):
    """None when a file can be created and removed in FOLDER (created if missing), else the reason."""
    try:
        os.makedirs(folder, exist_ok=True)
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix=".rgt-write-probe.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
        return None
    except OSError as exc:
        return "%s is not writable: %s" % (folder, exc.strerror or exc)


def disk_gate(paths, min_free_gb, min_free_inodes=DEFAULT_MIN_FREE_INODES, writable=()):
    """Check each distinct filesystem of PATHS against the floors, and each WRITABLE dir with a probe.

    Returns (ok, checks): one dict per filesystem / probe with a status word and a line to print;
    a filesystem's dict also says which floor it is under (low_bytes, low_inodes) and the floors."""
    checks, seen, ok = [], set(), True
    for path in paths:
        if not path:
            continue
        try:
            info = disk_check(path)
        except OSError as exc:
            checks.append({"status": FAIL, "path": path, "line": "cannot measure %s: %s" % (path, exc.strerror)})
            ok = False
            continue
        if info["dev"] in seen:
            continue
        seen.add(info["dev"])
        low_bytes = info["free_bytes"] < float(min_free_gb) * (1 << 30)  # bytes, not the rounded GiB
        low_inodes = info["free_inodes"] is not None and info["free_inodes"] < int(min_free_inodes)
        info.update(low_bytes=low_bytes, low_inodes=low_inodes, min_free_gb=float(min_free_gb),
                    min_free_inodes=int(min_free_inodes))
        info["status"] = REFUSED if (low_bytes or low_inodes) else OK
        info["line"] = "%s disk %s: %.1f GiB free (floor %g), %s" % (
            info["status"], info["measured_at"], info["free_gib"], float(min_free_gb),
            "inodes not reported" if info["free_inodes"] is None
            else "%d free inodes (floor %d)" % (info["free_inodes"], int(min_free_inodes)))
        ok = ok and info["status"] == OK
        checks.append(info)
    for folder in writable:
        reason = write_probe(folder)
        checks.append({"status": REFUSED if reason else OK, "path": folder,
                       "line": ("REFUSED %s" % reason) if reason else "OK %s is writable" % folder})
        ok = ok and reason is None
    return ok, checks


def budget_hours(max_cost, rate):
    """The hours MAX_COST buys at RATE per hour, rounded DOWN to 1/10000 h so a cap never buys more than the
    budget. Both must be positive and finite (the callers check)."""
    return math.floor(max_cost / rate * 10000) / 10000.0


def money(value):
    """VALUE with the precision it needs: two decimals from 1 up, else enough significant digits that a
    small amount (0.02, 0.0035) never prints as 0.00 ("?" for None). The laptop and the node print money alike."""
    if value is None:
        return "?"
    value = float(value)
    if value == 0 or abs(value) >= 1:
        return "%.2f" % value
    return "%.3g" % value if abs(value) >= 0.001 else "%.2g" % value


# ---------------------------------------------------------------- the stall rule

def progress_age(run_dir, now=None):
    """Seconds since the run last showed progress: the newest mtime of heartbeat.json and job.log."""
    stamps = []
    for name in HEARTBEAT_NAMES:
        try:
            stamps.append(os.stat(os.path.join(run_dir, name)).st_mtime)
        except OSError:
            pass
    if not stamps:
        return None
    return max(0.0, (time.time() if now is None else now) - max(stamps))


def stall_minutes_for(run_dir, override=None):
    """The stall limit for a run: OVERRIDE, else what its dead-man was armed with, else the default.
    0 means "never stalled" (the dead-man was armed with the stall rule off)."""
    if override is not None:
        return float(override)
    config = read_json(os.path.join(run_dir, "deadman.json")).get("config")
    value = config.get("stall_minutes") if isinstance(config, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return DEFAULT_STALL_MINUTES


def is_stalled(age_seconds, stall_minutes):
    return bool(stall_minutes) and age_seconds is not None and age_seconds > float(stall_minutes) * 60.0


# ---------------------------------------------------------------- secrets in URLs
# A presigned data URL or an https://user:token@ remote in a job's argv, an error text or a git remote: every
# record the toolkit writes (env.json, run.json, job.log's notes, repro.sh) passes through these first.

URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")


def clean_url(url):
    """A URL with no credential left in it -> str (None for an empty one).

    With a scheme (https://, ssh://, git+https:// ...): everything up to the LAST '@' after the scheme goes
    (user, password or token; a password may hold an unencoded '@'), then any ?query and #fragment (a
    `?private_token=`, a signed-URL signature). Without one (scp form `user@host:path`): a `user:secret@`
    part goes, a plain ssh login name stays."""
    url = (url or "").strip()
    if not url:
        return None
    scheme = re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", url)
    if scheme:
        rest = url[scheme.end():]
        rest = rest[rest.rfind("@") + 1:]
        return scheme.group(0) + re.split(r"[?#]", rest, 1)[0]
    head, at, tail = url.rpartition("@")
    return tail if at and ":" in head else url


def scrub_urls(text):
    """TEXT (an error message, a command word, a log line) with every URL in it passed through clean_url."""
    return URL_IN_TEXT.sub(lambda m: clean_url(m.group(0)), text) if isinstance(text, str) else text


def scrub_record(obj):
    """Every string of a record (keys too) through scrub_urls: a command, error texts and a git remote may
    all quote a URL, and the records travel (durable storage, the laptop, reviewers)."""
    return map_strings(obj, scrub_urls)


SECRET_NAME = re.compile(r"(?i)(_API_KEY|_APIKEY|_TOKEN|_SECRET|_PASSWORD|_PASSWD|^API_KEY|^TOKEN)$")
# Key files the provider adapters read (their `api_key = ...` values are secrets wherever they surface).
KEY_FILE_VARS = {"RGT_LAMBDA_KEY_FILE": "~/.lambda_cloud/lambda_keys",
                 "RGT_PAPERSPACE_KEY_FILE": "~/.config/rgt/paperspace_key"}
SECRET_WORDS = re.compile(r"(?i)((?:authorization|proxy-authorization)\s*[:=]\s*(?:bearer\s+|basic\s+|token\s+)?"
                          r"|\b(?:bearer|basic)\s+"
                          r"|\b[\w-]*(?:api[_-]?key|apikey|token|secret|password|passwd)[\"']?\s*[=:]\s*[\"']?)"
                          r"(?!\$)([^\s\"'&,;}]+)")      # a $VAR is a name, not a value
MIN_SECRET_LEN = 6       # shorter values ("1", "yes") are not keys and would blank out ordinary words


def secret_values(environ=None):
    """The secret values this box holds: *_API_KEY / *_TOKEN / *_SECRET / *_PASSWORD variables of this process
    and of PID 1 (a container keeps the platform's key there), and api_key lines of the providers' key files."""
    envs = [os.environ if environ is None else environ]
    if environ is None:
        try:
            with open("/proc/1/environ", "rb") as handle:
                raw = handle.read(1 << 20)
            envs.append({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, _, v in
                         (item.partition(b"=") for item in raw.split(b"\0")) if k})
        except OSError:
            pass
    found = set()
    for env in envs:
        for name, value in env.items():
            if SECRET_NAME.search(name) and value and len(value.strip()) >= MIN_SECRET_LEN:
                found.add(value.strip())
        for var, default in KEY_FILE_VARS.items():
            path = os.path.expanduser((env.get(var) or "").strip() or default)
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read(1 << 16)
            except (OSError, UnicodeDecodeError):
                continue
            for line in text.splitlines():
                name, sep, value = line.partition("=")
                value = value.strip().strip("\"'")
                if sep and "key" in name.lower() and len(value) >= MIN_SECRET_LEN:
                    found.add(value)
    return sorted(found, key=len, reverse=True)   # longest first: a key that contains another goes whole


def redact(text, environ=None):
    """TEXT with every secret cut to ***: the values secret_values() finds, Authorization / Bearer values,
    api_key= / token= / password= words, and URL credentials and query strings (scrub_urls). The one
    redaction every provider and notify error, record, log line and status line passes through (C8)."""
    if not isinstance(text, str) or not text:
        return text
    for value in secret_values(environ):
        if value in text:
            text = text.replace(value, "***")
    text = SECRET_WORDS.sub(lambda m: m.group(1) + ("***" if m.group(2) != "***" else m.group(2)), text)
    return scrub_urls(text)


def redact_doc(obj, environ=None):
    """Every string of a JSON-shaped record through redact (the secret list read once)."""
    values = secret_values(environ)

    def one(text):
        for value in values:
            if value in text:
                text = text.replace(value, "***")
        return redact(text, environ={}) if text else text
    return map_strings(obj, one)


def url_secrets(words):
    """The words of an argv that carry a URL credential (user:pw@, a query or fragment): what scrub_urls
    would change. Empty when the argv is safe to record as it is."""
    return [w for w in words if isinstance(w, str) and scrub_urls(w) != w]


# ---------------------------------------------------------------- the dead-man's record

DEADMAN_FILE = "deadman.json"
DEADMAN_FIRED_FILE = "DEADMAN_FIRED.json"




def lock_held(path, exclusive=False):
    """Whether another process holds a flock on PATH now (a shared one counts only when EXCLUSIVE is asked)."""
    try:
        import fcntl
        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def deadman_state(run_dir, check_alive=True, procs=HERE):
    """What watches the run in RUN_DIR, read from deadman.json and DEADMAN_FIRED.json -> dict.

    word: ARMED (its process is alive, or CHECK_ALIVE is False: the pid is on another host),
    DOWN (says armed but its process is gone: nothing watches), FIRED (a firing record exists),
    DISARMED (acknowledged off on purpose), EXITED (stopped by a signal: nothing watches),
    NONE (never armed), or the recorded state in capitals. watching is True only for a live ARMED
    one. Also: pid, alive (None when not checked), state, armed_at, config (a dict), fired (the
    record or None). PROCS: the process table to read liveness from (this machine's by default)."""
    doc = read_json(os.path.join(run_dir, DEADMAN_FILE))
    fired_path = os.path.join(run_dir, DEADMAN_FIRED_FILE)
    fired = read_json(fired_path) if os.path.exists(fired_path) else None
    state = doc.get("state") if isinstance(doc.get("state"), str) else None
    alive = None
    if check_alive and doc:
        alive = record_alive(doc.get("identity"), doc.get("pid"), parse_iso(doc.get("armed_at")), procs)
    if fired is not None or state == "fired":
        word = "FIRED"
    elif not doc:
        word = "NONE"
    elif state == "armed":
        word = "DOWN" if alive is False else "ARMED"
    else:
        word = (state or "unknown").upper()
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    return {"word": word, "watching": word == "ARMED" and alive is not False, "alive": alive,
            "pid": _pid(doc.get("pid")), "state": state, "armed_at": doc.get("armed_at"), "config": config,
            "fired": fired}


# ---------------------------------------------------------------- the version stamp

def file_sha256(path):
    return sha256_file(path)[1]


def read_stamp(folder=NODE_DIR):
    return read_json(os.path.join(folder, STAMP_NAME))


def toolkit_version(folder=NODE_DIR):
    version = read_stamp(folder).get("version")
    return version if isinstance(version, str) else None


def toolkit_problems(folder=NODE_DIR):
    """Why the files in FOLDER are not the one version VERSION.json names ([] when they are)."""
    stamp = read_stamp(folder)
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return ["%s is missing or unreadable beside the toolkit" % STAMP_NAME]
    problems = []
    for name, want in sorted(files.items()):
        try:
            have = file_sha256(os.path.join(folder, name))
        except (OSError, ValueError):
            problems.append("%s is missing" % name)
            continue
        if have != want:
            problems.append("%s is not the stamped version" % name)
    return problems


def check_toolkit():
    """Refuse (exit 3) to run beside a different version of the core: the node folder must be one
    version, as stamped in VERSION.json by tools/stamp_node.py. RGT_SKIP_VERSION_CHECK=1 skips it."""
    if os.environ.get("RGT_SKIP_VERSION_CHECK") == "1":
        return
    problems = toolkit_problems()
    if problems:
        die("REFUSED: the node toolkit in %s is not one version (%s); push the whole scripts/node folder "
            "again (maintainers: python3 tools/stamp_node.py)" % (NODE_DIR, "; ".join(problems[:3])),
            EXIT_REFUSED)


def streamed_program(main_path, modules=("rgt_core", "evidence"), entry=None):
    """Python source that runs MAIN_PATH with the core MODULES loaded from memory, for `ssh HOST python3 -`:
    a node tool runs on a host that has no toolkit pushed, and nothing is written there. The parts come
    from this one checkout, so the version check has nothing to compare and is skipped. ENTRY: the source to
    run instead of MAIN_PATH's (MAIN_PATH then only names it)."""
    lines = ["import os, sys, types", "os.environ['RGT_SKIP_VERSION_CHECK'] = '1'"]
    for name in modules:
        with open(os.path.join(NODE_DIR, name + ".py"), encoding="utf-8") as handle:
            source = handle.read()
        lines.append("_m = types.ModuleType(%r); _m.__file__ = %r; sys.modules[%r] = _m; "
                     "exec(compile(%r, %r, 'exec'), _m.__dict__)" % (name, name + ".py", name, source, name + ".py"))
    if entry is None:
        with open(main_path, encoding="utf-8") as handle:
            entry = handle.read()
    source, base = entry, os.path.basename(main_path)
    lines.append("sys.argv[0] = %r; exec(compile(%r, %r, 'exec'), {'__name__': '__main__', '__file__': %r})"
                 % (base, source, base, base))
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---------------------------------------------------------------- tar streams on a host without tar
# A minimal rented container may have neither rsync nor tar, but it has python3 (the toolkit runs on it).
# These two programs run there as `python3 -c` and speak the same uncompressed tar stream as `tar`.

TAR_PACK_PY = r"""
import os, sys, tarfile
out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT, dereference=True)
rc = 0
for raw in sys.stdin.buffer.read().split(b"\n"):
    if raw:
        name = os.fsdecode(raw)
        try:
            out.add(name, recursive=False)
        except OSError as exc:
            sys.stderr.write("python3 tar: %s: %s\n" % (name, exc.strerror or exc))
            rc = 2
out.close()
sys.exit(rc)
"""

TAR_UNPACK_PY = r"""
import os, sys, tarfile
dest = sys.argv[1]
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as stream:
    for member in stream:
        if not member.isreg() or "/" in member.name or member.name.startswith("."):
            sys.exit("python3 untar: refused member %r (only plain top-level files)" % member.name)
        path = os.path.join(dest, member.name)
        part = path + ".rgt-part"
        with open(part, "wb") as handle:
            handle.write(stream.extractfile(member).read())
        os.chmod(part, (member.mode & 0o755) | 0o600)
        os.replace(part, path)
"""

NO_TAR_NOTE = "rgt: no tar on this host; python3 tarfile makes the stream"


def tar_pack_shell(quote):
    """A POSIX sh command, run in the source folder, that writes to stdout a tar of the ./NAMES read from
    stdin (symlinks sent as their content): tar where it exists, else TAR_PACK_PY. QUOTE: shlex.quote."""
    return ("if command -v tar >/dev/null 2>&1; then tar -chf - -T -; else echo %s >&2; exec python3 -c %s; fi"
            % (quote(NO_TAR_NOTE), quote(TAR_PACK_PY)))


def tar_unpack_shell(quote, dest_word):
    """A POSIX sh command that unpacks a flat tar from stdin into DEST_WORD (already quoted for the shell,
    so a leading "$HOME"/ can expand): tar where it exists, else TAR_UNPACK_PY."""
    return ("if command -v tar >/dev/null 2>&1; then tar -x -f - -C %s; else echo %s >&2; exec python3 -c %s %s; fi"
            % (dest_word, quote(NO_TAR_NOTE), quote(TAR_UNPACK_PY), dest_word))


def _main(argv=None):
    """`python3 rgt_core.py --version`: print the stamped version when every file matches it (exit 0),
    else the mismatches (exit 3). What the laptop's push runs on the node to prove the copy.
    `--default NAME` prints one of the toolkit's defaults (DEFAULTS), for the shell scripts to read."""
    parser = Parser(prog="rgt_core.py", description="The node toolkit's shared core.",
                    epilog=exit_codes_epilog(fail=None, refused="the toolkit's files are not one version"))
    parser.add_argument("--version", action="store_true", help="print the toolkit version after checking it")
    parser.add_argument("--record-interpreter", action="store_true",
                        help="with --version: write this interpreter's path to %s-<box> beside the toolkit, one "
                             "per box (rgt.py then skips a pyenv/conda shim on every later command)" % INTERPRETER_FILE)
    parser.add_argument("--default", choices=sorted(DEFAULTS), metavar="NAME",
                        help="print a toolkit default: %s" % ", ".join(
                            "%s (%g)" % (k, v) for k, v in sorted(DEFAULTS.items())))
    args = parser.parse_args(argv)
    if args.default:
        print("%g" % DEFAULTS[args.default])
        return EXIT_OK
    if not args.version:
        raise UsageError("nothing to do: rgt_core.py is imported by the tools; try --version")
    problems = toolkit_problems()
    if problems:
        raise Refused("the toolkit in %s is not one version: %s" % (NODE_DIR, "; ".join(problems)))
    if args.record_interpreter:
        # a venv keeps its own path; each box its own record (a shared home holds several)
        atomic_write(os.path.join(NODE_DIR, interpreter_record_name()), sys.executable + "\n")
    print(toolkit_version())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_main(_main, prog="rgt_core.py"))
