#!/usr/bin/env python3
"""Is a stop command destructive? Fail-closed inference over an argv, looking through wrappers.

Guarantee: a command that names a destroying action at any depth of wrapping (env, sudo, sh -c,
python -c, ...), names a block device, or cannot be inspected is reported destructive, so it runs
only behind the verified-durable-copy gate. Used by the stop engine at arm time and again at fire
time on the expanded argv. A library module (no command line).
"""
import ast
import os
import re
import shlex

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
# A destructive stop (a terminate) erases the instance's own disks. Only a copy on a filesystem that outlives the
# instance, or one already pulled off the box and verified, makes it safe (finding C1).

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph", "glusterfs", "fuse.glusterfs",
              "lustre", "gpfs", "beegfs", "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs",
              "fuse.rclone", "fuse.mountpoint-s3", "fuse.blobfuse", "fuse.blobfuse2", "afs", "9p", "virtiofs")
MOUNTINFO = "/proc/self/mountinfo"
PULLED = "pulled.json"   # RUN_DIR/pulled.json: a verified pull of these results, recorded by the teardown gate


def _unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts(text=None):
    """[(mount point, "major:minor", fstype, source)] from /proc/self/mountinfo (or TEXT); [] when unreadable."""
    if text is None:
        try:
            with open(MOUNTINFO, "r", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            return []
    out = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or not rest:
            continue
        out.append((_unescape(fields[4]), fields[2], rest[0], _unescape(rest[1]) if len(rest) > 1 else ""))
    return out


def mount_of(path, table):
    """The mountinfo row whose mount point holds PATH (the last, longest match: later mounts hide earlier ones)."""
    best = None
    for row in table:
        point = row[0]
        if path == point or path.startswith(point.rstrip("/") + "/") or point == "/":
            if best is None or len(point) >= len(best[0]):
                best = row
    return best


def _named(point, pattern):
    """True when mount POINT is the profile's persistent PATTERN (a "<name>" part matches any one folder)."""
    parts, want = point.rstrip("/").split("/"), pattern.rstrip("/").split("/")
    return len(parts) == len(want) and all(w == p or (w.startswith("<") and w.endswith(">") and p)
                                           for p, w in zip(parts, want))


def persistent_paths(profile):
    """The storage paths a profile says survive a destroy (Lambda: /lambda/nfs/<name>); () without a profile."""
    if not profile:
        return ()
    try:
        import rgt_core
        storage = rgt_core.load_profile(profile).get("storage") or []
    except Exception:  # noqa: BLE001  (no index, an unknown profile: nothing is named)
        return ()
    return tuple(s["path"] for s in storage if isinstance(s, dict) and s.get("survives_destroy") is True
                 and isinstance(s.get("path"), str) and s["path"].startswith("/"))


def files_digest(manifest):
    """One hash for what a manifest lists (path, size, sha256 of each file), whatever its timestamps."""
    import hashlib
    import json
    rows = sorted([e["path"], e["size"], e["sha256"]] for e in manifest["files"])
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode("utf-8")).hexdigest()


def pulled_record(run_dir, manifest):
    """The gate's record (RUN_DIR/pulled.json) when it names exactly MANIFEST's files: (True, detail) or
    (False, why not)."""
    import json
    try:
        with open(os.path.join(run_dir, PULLED), "rb") as handle:
            doc = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False, "no verified pull recorded (%s)" % PULLED
    if not isinstance(doc, dict) or doc.get("files_digest") != files_digest(manifest):
        return False, "the pull recorded in %s is of other files than the durable copy now holds" % PULLED
    return True, "a verified pull of these files is recorded (%s at %s, %s)" % (
        PULLED, doc.get("verified_at"), str(doc.get("by") or "the teardown gate")[:60])


def off_box_copy(results_dir, run_dir=None, manifest=None, persistent=(), table=None, root="/"):
    """Does a copy of the results outlive a terminate of this instance? (ok, detail).

    Yes when a verified pull of MANIFEST's files is recorded in RUN_DIR/pulled.json, or when RESULTS_DIR lies on a
    filesystem other than the root disk's (st_dev) that is a network filesystem or a mount the profile names as
    persistent (PERSISTENT, e.g. /lambda/nfs/<name>), the mountinfo row matching the file's own device."""
    if run_dir and manifest:
        ok, pulled = pulled_record(run_dir, manifest)
        if ok:
            return True, pulled
    else:
        pulled = "no verified pull recorded"
    try:
        real = os.path.realpath(results_dir)
        dev, root_dev = os.stat(real).st_dev, os.stat(root).st_dev
    except OSError as exc:
        return False, "cannot stat %s: %s" % (results_dir, exc.strerror or exc)
    row = mount_of(real, mounts() if table is None else table)
    ident = "%d:%d" % (os.major(dev), os.minor(dev))
    where = ("%s on %s (%s)" % (row[2], row[0], row[3] or "?")) if row else "an unknown mount"
    if dev == root_dev:
        return False, "%s is on the root disk of this instance (device %s, %s): a terminate erases it with the " \
                      "instance; %s" % (results_dir, ident, where, pulled)
    if row is None or row[1] != ident:
        return False, "cannot tell which mount holds %s (device %s not in mountinfo); %s" % (results_dir, ident,
                                                                                          pulled)
    if row[2] in NETWORK_FS:
        return True, "%s is on a network filesystem, %s: it outlives the instance" % (results_dir, where)
    named = [p for p in persistent if _named(row[0], p)]
    if named:
        return True, "%s is on %s, the persistent storage the profile names (%s)" % (results_dir, where, named[0])
    return False, "%s is on %s, a disk of this instance as far as this box can tell (not a network filesystem, " \
                  "not the profile's persistent storage%s); %s" % (
                      results_dir, where, (": " + ", ".join(persistent)) if persistent else "", pulled)
