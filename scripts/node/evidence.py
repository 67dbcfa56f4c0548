"""evidence: the one manifest format and verifier the sync, the pull, the dead-man and the gate all use.

A manifest (schema: manifest.schema.json beside this file, "rgt-pull-manifest/1") binds a run id
to the exact files of a result: relative POSIX path, size, SHA-256 and, for known checkpoint
formats, the format whose sanity check passed. The same code builds and checks it everywhere:

  the durable sync at the end of a run (run_one.sh -> supervise.py -> sync.py) writes one;
  build_pull_manifest.py writes one on demand (and on stdout for the teardown gate's re-hash);
  the dead-man checks the durable copy against it before any destructive stop;
  pull_verified.py and teardown_gate.py check the pulled copy against it.

Content, not only copies: a zero-byte file fails unless the manifest's allow_empty globs cover
it; a torch zip archive must have a readable central directory, a safetensors header must parse
and fit the file, a pickle must end with its STOP opcode, a .json file must parse.

Roster rules (globs relative to the root, POSIX separators): * matches within one component,
? one character, [abc] a set, ** any number of components; unlike a shell, * and ** also match
names that start with a dot (a DCP checkpoint's .metadata is never left out). An entry matching a
directory takes every file under it. Every entry must match a file; an empty result is a failure.
"""
import json
import os
import re
import stat
import struct

import rgt_core as core

SCHEMA = "rgt-pull-manifest/1"
MANIFEST_NAME = "PULL_MANIFEST.json"
VERIFIED_NAME = "PULL_VERIFIED.json"
RESERVED_TOP = (MANIFEST_NAME, VERIFIED_NAME)
PARTIAL_DIR = ".rsync-partial"
RUN_ID_RE = core.RUN_ID_RE
HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
STAMP_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$")
ENTRY_KEYS = {"path", "size", "sha256"}
OPTIONAL_ENTRY_KEYS = {"format"}
FORMATS = ("torch-zip", "safetensors", "pickle", "json")
MAX_JSON_CHECK = 64 << 20


def problem(code, path, detail):
    return {"code": code, "path": path, "detail": detail}


# ---------------------------------------------------------------- content checks

def _head(path, count):
    with open(path, "rb") as handle:
        return handle.read(count)


def content_check(path, rel=None):
    """(format or None, problem text or None) for one regular file, by extension and magic bytes.

    Cheap: reads a header or the zip central directory, never the whole file (the hash does that)."""
    name = (rel or path).lower()
    try:
        size = os.path.getsize(path)
        head = _head(path, 8)
    except OSError as exc:
        return None, "unreadable: %s" % (exc.strerror or exc)
    if size == 0:
        return None, None  # the zero-byte rule is applied by the caller against allow_empty
    if head[:4] == b"PK\x03\x04" and name.endswith((".pt", ".pth", ".ckpt", ".bin", ".tar", ".zip")):
        try:
            import zipfile   # here: every node tool imports this module, few read a zip
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            return "torch-zip", "zip archive is damaged or truncated (%s); the save was cut off" % exc
        if name.endswith((".pt", ".pth", ".ckpt")) and not any(n.endswith("data.pkl") for n in names):
            return "torch-zip", "zip archive holds no data.pkl: not a torch checkpoint"
        return "torch-zip", None
    if name.endswith((".pt", ".pth", ".ckpt")):
        if head[:1] == b"\x80":  # the legacy (non-zip) torch format starts with a pickle
            return "pickle", None
        return None, "not a torch checkpoint: no zip or pickle header (truncated, or written by something else)"
    if name.endswith(".safetensors"):
        if size < 8:
            return "safetensors", "shorter than its 8-byte header length"
        length = struct.unpack("<Q", head[:8])[0]
        if length > size - 8 or length > 100 << 20:
            return "safetensors", "header length %d does not fit a %d-byte file (truncated)" % (length, size)
        try:
            with open(path, "rb") as handle:
                handle.seek(8)
                header = json.loads(handle.read(length).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, OSError) as exc:
            return "safetensors", "header does not parse: %s" % exc
        if not isinstance(header, dict):
            return "safetensors", "header is not a JSON object"
        ends = [v.get("data_offsets", [0, 0])[1] for k, v in header.items()
                if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
                and len(v["data_offsets"]) == 2]
        if ends and max(ends) > size - 8 - length:
            return "safetensors", "tensors end at byte %d of a %d-byte data section (truncated)" % (
                max(ends), size - 8 - length)
        return "safetensors", None
    if name.endswith((".pkl", ".pickle")):
        try:
            with open(path, "rb") as handle:
                handle.seek(-1, os.SEEK_END)
                last = handle.read(1)
        except OSError as exc:
            return "pickle", "unreadable: %s" % (exc.strerror or exc)
        if last != b".":
            return "pickle", "does not end with the pickle STOP opcode (truncated)"
        return "pickle", None
    if name.endswith(".json") and size <= MAX_JSON_CHECK:
        try:
            with open(path, "rb") as handle:
                json.loads(handle.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            return "json", "is not valid JSON (truncated?): %s" % exc
        except OSError as exc:
            return "json", "unreadable: %s" % (exc.strerror or exc)
        return "json", None
    return None, None


def allowed_empty(rel, allow_empty):
    return any(compile_pattern(p).fullmatch(c) for p in allow_empty for c in ancestors_and_self(rel))


# ---------------------------------------------------------------- roster patterns and walking

def _segment_regex(segment):
    """Regex for one path component of a glob (no slashes inside)."""
    out = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            start = i + 1
            if segment[start:start + 1] in ("!", "^"):
                start += 1
            if segment[start:start + 1] == "]":
                start += 1
            close = segment.find("]", start)
            if close < 0:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1:close]
                negate = body[:1] in ("!", "^")
                if negate:
                    body = body[1:]
                body = "".join("\\" + c if c in "\\^[]" else c for c in body)
                out.append("[" + ("^/" if negate else "") + body + "]")
                i = close
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def check_pattern(pattern):
    """Normalise a roster/glob entry or raise core.UsageError saying what is wrong with it."""
    text = pattern.strip()
    while text.startswith("./"):
        text = text[2:]
    text = text.rstrip("/")
    if not text:
        raise core.UsageError(f"roster entry {pattern!r} is empty")
    if text.startswith("/"):
        raise core.UsageError(f"roster entry {pattern!r} is absolute; give it relative to --root")
    if "\\" in text or "\x00" in text:
        raise core.UsageError(f"roster entry {pattern!r} contains a backslash or NUL; use POSIX '/' separators")
    parts = text.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise core.UsageError(f"roster entry {pattern!r} has an empty, '.' or '..' component")
    return text


def compile_pattern(pattern):
    """Compile a normalised glob with ** support into a regex matched against whole relative paths."""
    parts = pattern.split("/")
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
        else:
            regex += _segment_regex(part) + ("" if last else "/")
    return re.compile(regex, re.DOTALL)


def ancestors_and_self(rel):
    """'a/b/c' -> ['a/b/c', 'a/b', 'a'] (the path, then each parent directory)."""
    out = [rel]
    while "/" in rel:
        rel = rel.rsplit("/", 1)[0]
        out.append(rel)
    return out


# ---------------------------------------------------------------- walking the root

def _special_kind(mode):
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"


def _inside(root_real, target):
    return target == root_real or target.startswith(root_real.rstrip("/") + "/")


def name_problem(rel):
    """Why a relative path cannot go into a manifest, or None."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8; rename it"
    if "\\" in rel:
        return "file name contains a backslash; rename it (the puller refuses backslashes)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in rel):
        return "file name contains a control character (newline, tab ...); rename it"
    return None


def walk_root(root_real, skip):
    """Yield (rel, kind, detail, real_path) for every non-directory entry under root.

    kind: file | link-file (target inside root) | link-dir | escape | dangling | special.
    Directories are descended without following symlinks.
    """
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        abs_dir = os.path.join(root_real, rel_dir) if rel_dir else root_real
        try:
            entries = list(os.scandir(abs_dir))
        except OSError as exc:
            yield rel_dir or ".", "unreadable", f"cannot list directory: {exc.strerror}", None
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in skip:
                continue
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(root_real, target):
                        yield rel, "escape", f"symlink resolves outside the root (to {target})", None
                        continue
                    try:
                        mode = os.stat(entry.path).st_mode
                    except OSError as exc:
                        yield rel, "dangling", f"symlink target is unreadable or missing: {exc.strerror}", None
                        continue
                    if stat.S_ISREG(mode):
                        yield rel, "link-file", "", target
                    elif stat.S_ISDIR(mode):
                        yield rel, "link-dir", "symlinked directory not followed; list its real path", None
                    else:
                        yield rel, "special", f"symlink to a {_special_kind(mode)}", None
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    yield rel, "file", "", entry.path
                else:
                    mode = entry.stat(follow_symlinks=False).st_mode
                    yield rel, "special", f"{_special_kind(mode)} cannot be pulled", None
            except OSError as exc:
                yield rel, "unreadable", exc.strerror or str(exc), None



def select(root_real, patterns, skip):
    """Apply the roster. Returns (chosen {rel: real_path}, problems, notes, unmatched patterns)."""
    compiled = [(p, compile_pattern(p)) for p in patterns]
    hits = {p: 0 for p in patterns}
    skipped_hits = {p: 0 for p in patterns}
    chosen, problems, notes = {}, [], []
    for rel, kind, detail, real in walk_root(root_real, skip):
        candidates = ancestors_and_self(rel)
        matching = [p for p, rx in compiled if any(rx.fullmatch(c) for c in candidates)]
        if not matching:
            continue
        if kind == "link-dir":
            for p in matching:
                skipped_hits[p] += 1
            notes.append({"path": rel, "reason": detail})
            continue
        for p in matching:
            hits[p] += 1
        if kind in ("file", "link-file"):
            bad_name = name_problem(rel)
            if bad_name:
                problems.append({"code": "bad-name", "path": rel, "detail": bad_name})
            else:
                chosen[rel] = real
        else:
            problems.append({"code": kind, "path": rel, "detail": detail})
    unmatched = []
    for p in patterns:
        if hits[p] == 0:
            hint = " (it matched only symlinked directories, which are not followed)" if skipped_hits[p] else ""
            unmatched.append(p)
            problems.append({"code": "unmatched", "path": p,
                             "detail": "roster entry matches no file under the root" + hint})
    return chosen, problems, notes, unmatched



# ---------------------------------------------------------------- building

def build_manifest(root, patterns, run_id, allow_empty=(), skip=(), jobs=4, bufsize=1 << 20, progress=True,
                   on_bytes=None):
    """Select the roster under ROOT, hash and content-check every file. ON_BYTES(count), when given, hears
    every chunk hashed (a long re-read is progress, not a stall).

    Returns (manifest or None, problems, notes). Nothing is written here."""
    root_real = os.path.realpath(root)
    chosen, problems, notes, _ = select(root_real, patterns, set(RESERVED_TOP) | set(skip))
    if problems:
        return None, problems, notes
    if not chosen:
        return None, [problem("empty", ".", "the roster selected no files")], notes
    sizes = {}
    for rel, real in chosen.items():
        try:
            sizes[rel] = os.stat(real).st_size
        except OSError:
            sizes[rel] = 0
    meter = core.Progress("hashing", sum(sizes.values()), enabled=progress)
    order = sorted(chosen, key=lambda r: -sizes[r])  # big files first balances the workers
    counted = meter.add if on_bytes is None else (lambda n: (meter.add(n), on_bytes(n)))

    def work(rel):
        try:
            size, digest = core.sha256_file(chosen[rel], bufsize, counted)
        except (OSError, ValueError) as exc:
            return rel, None, problem("unreadable", rel, exc.strerror if isinstance(exc, OSError) and
                                      exc.strerror else str(exc))
        if size == 0 and not allowed_empty(rel, allow_empty):
            return rel, None, problem("empty-file", rel, "zero bytes (a save that was killed?); allow it with "
                                                         "--allow-empty GLOB if empty is expected")
        fmt, reason = content_check(chosen[rel], rel)
        if reason:
            return rel, None, problem("content", rel, reason)
        entry = {"path": rel, "size": size, "sha256": digest}
        if fmt:
            entry["format"] = fmt
        return rel, entry, None

    entries = []
    from concurrent.futures import ThreadPoolExecutor   # only where files are hashed (not at import)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(order)))) as pool:
        for _rel, entry, bad in pool.map(work, order):
            if bad:
                problems.append(bad)
            else:
                entries.append(entry)
    meter.close()
    if problems:
        return None, sorted(problems, key=lambda p: p["path"]), notes
    entries.sort(key=lambda e: e["path"])
    manifest = {"schema": SCHEMA, "run_id": run_id, "created_at": core.utc_iso(), "roster": list(patterns),
                "file_count": len(entries), "total_bytes": sum(e["size"] for e in entries), "files": entries}
    if allow_empty:
        manifest["allow_empty"] = list(allow_empty)
    return manifest, [], notes


def manifest_bytes(manifest):
    return (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def read_manifest(path):
    """Parse the manifest file at PATH -> (manifest or None, problems)."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        return None, [problem("manifest", path, "cannot read: %s" % (exc.strerror or exc))]
    return parse_manifest(raw)


def file_set(manifest):
    return {(e["path"], e["size"], e["sha256"]) for e in manifest["files"]}


# ---------------------------------------------------------------- validation

def path_problem(path):
    """Why a manifest path is unsafe or malformed, or None when it is fine."""
    if not isinstance(path, str) or not path:
        return "path is empty or not a string"
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith("/"):
        return "absolute path; manifest paths must be relative to the root"
    if "\\" in path:
        return "contains a backslash (a Windows separator or an escape); refusing to guess"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return "contains a control character (newline, tab ...)"
    parts = path.split("/")
    if ".." in parts:
        return "has a '..' component that would write outside the destination"
    if "" in parts or "." in parts:
        return "has an empty or '.' component (not in normal form)"
    if path in RESERVED_TOP:
        return "is a reserved name (the puller writes this file itself)"
    if PARTIAL_DIR in parts:
        return f"uses the reserved resume directory name {PARTIAL_DIR}"
    return None


def parse_manifest(raw: bytes):
    """Validate structure and every path. Returns (manifest or None, problems)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, [problem("manifest", "<manifest>", f"not valid UTF-8 JSON: {exc}")]
    if not isinstance(data, dict):
        return None, [problem("manifest", "<manifest>", "top level is not a JSON object")]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(problem("manifest", "schema", f"expected {SCHEMA!r}, found {data.get('schema')!r}"))
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        problems.append(problem("manifest", "run_id", f"{run_id!r} is not a safe run id (letters, digits, . _ -)"))
    if not isinstance(data.get("created_at"), str) or not STAMP_RE.match(data["created_at"]):
        problems.append(problem("manifest", "created_at", "missing or not ISO-8601 UTC (YYYY-MM-DDTHH:MM:SSZ)"))
    roster = data.get("roster")
    if not isinstance(roster, list) or not roster or not all(isinstance(r, str) and r for r in roster):
        problems.append(problem("manifest", "roster", "must be a non-empty list of globs"))
    allow_empty = data.get("allow_empty", [])
    if not isinstance(allow_empty, list) or not all(isinstance(a, str) and a for a in allow_empty):
        problems.append(problem("manifest", "allow_empty", "must be a list of globs"))
        allow_empty = []
    else:
        try:
            allow_empty = [check_pattern(a) for a in allow_empty]
        except core.UsageError as exc:
            problems.append(problem("manifest", "allow_empty", str(exc)))
            allow_empty = []
    unknown = set(data) - {"schema", "run_id", "created_at", "roster", "file_count", "total_bytes", "files",
                           "allow_empty"}
    if unknown:
        problems.append(problem("manifest", "<manifest>", "unknown field(s): %s" % ", ".join(sorted(unknown))))
    files = data.get("files")
    if not isinstance(files, list) or not files:
        problems.append(problem("manifest", "files", "must be a non-empty list (an empty pull proves nothing)"))
        return data, problems
    first_index = {}
    total = 0
    for index, entry in enumerate(files):
        where = f"files[{index}]"
        if not isinstance(entry, dict) or not ENTRY_KEYS <= set(entry) or set(entry) - ENTRY_KEYS - OPTIONAL_ENTRY_KEYS:
            problems.append(problem("manifest", where, "entry must be an object with path, size, sha256 "
                                                       "(and optionally format)"))
            continue
        if "format" in entry and entry["format"] not in FORMATS:
            problems.append(problem("manifest", where, "format must be one of %s" % ", ".join(FORMATS)))
            continue
        path = entry["path"]
        reason = path_problem(path)
        if reason:
            problems.append(problem("unsafe-path", repr(path), f"{where} {reason}"))
            continue
        size = entry["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            problems.append(problem("manifest", path, f"{where} size must be a non-negative integer"))
            continue
        if not isinstance(entry["sha256"], str) or not HEX64_RE.match(entry["sha256"]):
            problems.append(problem("manifest", path, f"{where} sha256 must be 64 lowercase hex digits"))
            continue
        if size == 0 and not allowed_empty(path, allow_empty):
            problems.append(problem("empty-file", path, f"{where} is zero bytes and allow_empty does not cover it "
                                                        "(a killed save proves nothing)"))
            continue
        if path in first_index:
            problems.append(problem("duplicate", path, f"listed twice (files[{first_index[path]}] and {where})"))
            continue
        first_index[path] = index
        total += size
    for path in first_index:
        parent = path
        while "/" in parent:
            parent = parent.rsplit("/", 1)[0]
            if parent in first_index:
                problems.append(problem("path-conflict", path, f"'{parent}' is listed as a file and as its parent"))
                break
    if not problems:
        if data.get("file_count") != len(files):
            problems.append(problem("manifest", "file_count",
                                    f"says {data.get('file_count')!r}, files lists {len(files)}"))
        if data.get("total_bytes") != total:
            problems.append(problem("manifest", "total_bytes",
                                    f"says {data.get('total_bytes')!r}, sizes sum to {total}"))
    return data, problems



# ---------------------------------------------------------------- verification

def scan_tree(root, skip_partial=True):
    """Map every plain file under root to its size; symlinks and special files are problems."""
    files, problems = {}, []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except OSError as exc:
            problems.append(problem("unreadable", rel_dir or ".", f"cannot list directory: {exc.strerror}"))
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if not rel_dir and entry.name in RESERVED_TOP:
                continue
            if entry.is_symlink():
                problems.append(problem("symlink", rel,
                                        "a symlink in the pulled tree; pulled data must be plain files"))
            elif entry.is_dir(follow_symlinks=False):
                if not (skip_partial and entry.name == PARTIAL_DIR):
                    stack.append(rel)
            elif entry.is_file(follow_symlinks=False):
                files[rel] = entry.stat(follow_symlinks=False).st_size
            else:
                problems.append(problem("special", rel, "a FIFO, socket or device where a file should be"))
    return files, problems


def written_identity(st):
    """What must still hold for a file whose SHA-256 was taken while it was written: the same inode, size and
    modification time (a later write, truncation or replacement changes one of them)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def verify_tree(root, manifest, jobs=4, skip_partial=True, label="verifying", progress=True, hashed=None):
    """Compare a directory with the manifest. Returns (problems, bytes hashed).

    HASHED maps a path to (sha256, written_identity) for files whose every byte was hashed as it was written
    (the tar stream does this): such a file is not read again while its identity still holds; its digest is
    compared with the manifest's like any other. Every other file is read and hashed here."""
    hashed = hashed or {}
    actual, problems = scan_tree(root, skip_partial)
    expected = {e["path"]: e for e in manifest["files"]}
    for rel in sorted(set(actual) - set(expected)):
        problems.append(problem("extra", rel, "present but not in the manifest (left from an earlier pull or "
                                              "added by hand); delete it, or re-run with --fresh"))
    flagged = {p["path"] for p in problems}
    for rel in sorted(set(expected) - set(actual)):
        if rel in flagged:
            continue
        problems.append(problem("missing", rel, "in the manifest but not here (deleted or renamed on the node "
                                                "after the manifest was built, or the transfer failed)"))
    to_hash = []
    for rel in sorted(set(expected) & set(actual)):
        want, have = expected[rel]["size"], actual[rel]
        if have < want:
            problems.append(problem("truncated", rel, f"{have} of {want} bytes (cut off, or still being written "
                                                      "on the node)"))
        elif have > want:
            problems.append(problem("size", rel, f"{have} bytes, the manifest says {want} (changed after the "
                                                 "manifest was built?)"))
        else:
            to_hash.append(rel)
    total = sum(expected[r]["size"] for r in to_hash)
    meter = core.Progress(label, total, enabled=progress)
    to_hash.sort(key=lambda r: -expected[r]["size"])

    def work(rel):
        try:
            known = hashed.get(rel)
            if known is not None and written_identity(os.lstat(os.path.join(root, rel))) == known[1]:
                meter.add(expected[rel]["size"])
                return rel, known[0], None
            return rel, core.sha256_file(os.path.join(root, rel), on_bytes=meter.add)[1], None
        except (OSError, ValueError) as exc:
            return rel, "", getattr(exc, "strerror", None) or str(exc)

    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(to_hash) or 1)))
    futures = [pool.submit(work, rel) for rel in to_hash]
    try:
        for future in futures:
            rel, digest, error = future.result()
            if error:
                problems.append(problem("unreadable", rel, error))
            elif digest != expected[rel]["sha256"]:
                problems.append(problem("sha256", rel, "content differs from the manifest (flipped or changed "
                                                       f"bytes; got {digest[:12]}..., want "
                                                       f"{expected[rel]['sha256'][:12]}...)"))
    finally:
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
    meter.close()
    order = {"unsafe-path": 0, "missing": 1, "truncated": 2, "size": 3, "sha256": 4, "extra": 5}
    problems.sort(key=lambda p: (order.get(p["code"], 9), p["path"]))
    return problems, total
