#!/usr/bin/env python3
"""run_env.py: records a run's interpreter, packages, git state and data hashes as RUN_DIR/env.json, no secrets.

A number is only as trustworthy as the record of how it was made. This writes, beside run.json:
  python     version, implementation and executable of the JOB's interpreter (not this one's):
             asked by running that interpreter with a short probe, under a hard timeout
  torch      torch version and the CUDA / HIP it was built with (read from torch/version.py, never
             imported), the cuDNN wheel's version when pip installed one (else null); null when
             there is no torch there
  packages   name -> version of every installed distribution, from the interpreter's own metadata
             (importlib.metadata; `pip list` only for an interpreter older than 3.8)
  git        commit, branch, dirty (tracked changes), diff_sha256 and diff_bytes of the tracked
             changes (one fixed set of `git diff` flags, so the same tree gives the same hash on
             any machine), untracked files (count and the first names), the remote URL (no
             credential: see below), the repo top level and the job cwd inside it; with tracked
             changes the diff is saved as RUN_DIR/code.patch (up to 16 MiB) unless --no-patch
  host, gpus hostname; GPU names and driver from nvidia-smi when it is there
  seeds      only environment variables that are seeds: PYTHONHASHSEED, SEED and any *_SEED;
             no other environment value is ever read into the record (they hold secrets)
  data       for each --data PATH: size, file count and SHA-256 (a directory: a digest over its
             sorted files' relative paths, sizes and SHA-256s)

No credential is recorded from a URL, wherever one appears (the remote, the command, an error
text): a URL with a scheme loses everything up to its last '@' (user, password, token) and its
?query and #fragment; a `user:secret@host:path` remote loses its `user:secret@`.

Where the job's interpreter and cwd come from: --python / --cwd when given; else run.json in
RUN_DIR (the launcher writes it: cmd[0] when it is a Python, else the #! line of the program
cmd[0] names, e.g. torchrun's); else python3 on PATH and the current directory.

The supervisor records it in a thread as the job starts (errors in RUN_DIR/env.log), so a launch never waits
for or fails on it, and the end-of-run sync waits for it (bounded) so env.json reaches the results; RGT_NO_RUN_ENV=1
in the launcher's environment skips it.

Usage:
  run_env.py RUN_DIR [--python EXE] [--cwd DIR] [--data PATH]... [--no-patch] [--timeout S] [--json]
  run_env.py RUN_DIR --compare OLD_ENV_JSON [--python EXE] [--cwd DIR] [--data PATH]... [--json]

  --python EXE     the job's interpreter (default: as above)
  --cwd DIR        the job's working directory, where git is asked (default: as above)
  --data PATH      a data file or directory to fingerprint (repeatable)
  --no-patch       do not save code.patch even when the tree has tracked changes
  --timeout S      hard timeout of each external command (default 60)
  --compare FILE   record RUN_DIR/env.json as usual, then compare it with FILE (another run's
                   env.json): python, torch, CUDA, cuDNN, GPU names and package versions are
                   WARN lines when they differ; the data FILE recorded is fingerprinted again
                   (unless --data is given) and a changed or missing data set is a FAIL line;
                   a FILE that is not a run_env.py record (schema rgt-env/1, each section of the
                   shape this tool writes) is a usage error
  --json           print the record (or the comparison) as JSON instead of a summary line

Exit codes: 0 recorded (with --compare: everything matches); 1 with --compare, the environment
differs; 2 usage; 4 with --compare, a data fingerprint differs or a data path is missing (the
numbers cannot be expected to match; not 3, which is only for refusals).
"""
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rgt_core as core  # noqa: E402

PROG = "run_env.py"
ENV_NAME = "env.json"
PATCH_NAME = "code.patch"
SCHEMA = "rgt-env/1"
PATCH_LIMIT = 16 << 20
PACKAGE_LIMIT = 3000
UNTRACKED_SHOWN = 20
DATA_FILE_LIMIT = 200000
SEED_NAMES = ("PYTHONHASHSEED", "SEED")
# One fixed `git diff` for the dirty-tree hash: no pager, colour, external or textconv drivers,
# rename detection, abbreviated ids or custom prefixes, whatever the user's git config says.
GIT_DIFF_ARGS = ["-c", "core.abbrev=no", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
                 "-c", "diff.relative=false", "-c", "core.quotePath=true", "diff", "--binary", "--full-index",
                 "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--unified=3",
                 "--src-prefix=a/", "--dst-prefix=b/", "HEAD", "--"]
KEY_PACKAGES = ("torch", "torchvision", "torchaudio", "numpy", "scipy", "transformers", "accelerate", "datasets",
                "deepspeed", "peft", "trl", "timm", "lightning", "pytorch-lightning", "jax", "jaxlib",
                "tensorflow", "xformers", "flash-attn", "triton", "vllm", "bitsandbytes", "scikit-learn")

# Run by the job's interpreter (any Python 3): one JSON line on stdout. It never imports torch (seconds of
# start-up, and a CUDA init on a busy GPU): torch/version.py is read as text; the packages come from the
# installed distributions' metadata (Python 3.8+), the same list `pip list` prints, without pip's start-up.
PROBE = r"""
import json, os, platform, re, sys
out = {"version": platform.python_version(), "implementation": platform.python_implementation(),
       "executable": sys.executable, "prefix": sys.prefix, "packages": None, "packages_error": None}
try:
    from importlib import metadata
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name.lower().replace("_", "-")] = str(dist.version)
    out["packages"] = found
except ImportError:
    out["packages_error"] = "no importlib.metadata (Python < 3.8)"
except Exception as exc:
    out["packages_error"] = "%s: %s" % (type(exc).__name__, exc)
torch = None
try:
    from importlib.util import find_spec
    spec = find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        values = {}
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as handle:
            for line in handle:
                m = re.match(r"(__version__|cuda|hip)\s*(?::[^=]*)?=\s*['\"]?([^'\"\s]*)", line)
                if m:
                    values[m.group(1)] = None if m.group(2) in ("", "None") else m.group(2)
        torch = {"version": values.get("__version__"), "cuda": values.get("cuda"), "hip": values.get("hip")}
except Exception as exc:
    torch = {"error": "%s: %s" % (type(exc).__name__, exc)}
out["torch"] = torch
print(json.dumps(out))
"""
CUDNN_PACKAGES = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn-cu11")


def is_python_name(word):
    return bool(re.match(r"^(python|pypy)[0-9.]*(w|m)?$", os.path.basename(word or "")))


def shebang_python(program):
    """The interpreter a script's #! line names when it is a Python (torchrun, accelerate ...), else None."""
    try:
        with open(program, "rb") as handle:
            line = handle.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not line.startswith("#!"):
        return None
    words = line[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    return words[0] if words and is_python_name(words[0]) else None


def job_python(run, override=None):
    """(interpreter, how it was chosen) for the job that run.json describes."""
    if override:
        return override, "--python"
    cmd = run.get("cmd") if isinstance(run.get("cmd"), list) else []
    cwd = run.get("cwd") if isinstance(run.get("cwd"), str) else None
    first = cmd[0] if cmd and isinstance(cmd[0], str) else ""
    if first:
        found = first if os.sep in first else shutil.which(first)
        if found and cwd and not os.path.isabs(found):
            found = os.path.join(cwd, found)
        if is_python_name(first):
            return found or first, "run.json cmd[0]"
        via = shebang_python(found) if found else None
        if via:
            return via, "the #! line of %s" % first
    return shutil.which("python3") or sys.executable, "python3 on PATH"


def probe_python(python, timeout):
    res = core.run_bounded([python, "-c", PROBE], timeout)
    if res.rc != 0:
        why = res.error or ("timed out after %gs" % timeout if res.timed_out else res.output.strip()[-300:])
        return {"executable": python, "error": why or "exit %s" % res.rc}, None, None
    try:
        info = json.loads(res.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"executable": python, "error": "the probe printed no JSON"}, None, None
    torch = info.pop("torch", None)
    packages = info.pop("packages", None)
    if isinstance(torch, dict) and "error" not in torch:   # cuDNN: the wheel torch depends on (pip installs)
        torch["cudnn"] = next((packages[p] for p in CUDNN_PACKAGES if isinstance(packages, dict) and p in packages),
                              None)
    return info, torch, packages


def pip_packages(python, timeout):
    res = core.run_bounded([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                           timeout, max_output=8 << 20)
    if res.rc != 0:
        return None, (res.error or ("timed out" if res.timed_out else res.output.strip()[-200:]) or "pip failed")
    text = res.output.strip()
    start = text.find("[")  # pip may print a warning line before the list
    try:
        rows = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        rows = None
    if not isinstance(rows, list):
        return None, "pip list printed no JSON list"
    out = {}
    for row in rows[:PACKAGE_LIMIT]:
        if isinstance(row, dict) and isinstance(row.get("name"), str):
            out[row["name"].lower().replace("_", "-")] = str(row.get("version"))
    return out, None


# One redaction rule for every record the toolkit writes: it lives in the core (rgt_core.clean_url).
URL_IN_TEXT, clean_url, scrub_urls, scrub_record = core.URL_IN_TEXT, core.clean_url, core.scrub_urls, core.scrub_record


def git(cwd, args, timeout, max_output=1 << 20):
    return core.run_bounded(["git", "-C", cwd] + args, timeout, max_output=max_output)


def git_state(cwd, timeout, patch_to=None):
    """The git record of CWD -> dict (commit None when CWD is not in a work tree or git is missing)."""
    top = git(cwd, ["rev-parse", "--show-toplevel"], timeout)
    if top.rc != 0:
        return {"commit": None, "error": (top.error or top.output.strip()[-200:] or "not a git work tree")}
    toplevel = top.output.strip().splitlines()[-1]
    head = git(cwd, ["rev-parse", "--verify", "HEAD"], timeout)
    if head.rc != 0:
        return {"commit": None, "toplevel": toplevel, "error": "the repository has no commit yet"}
    out = {"commit": head.output.strip(), "toplevel": toplevel,
           "cwd_in_repo": os.path.relpath(os.path.realpath(cwd), os.path.realpath(toplevel))}
    branch = git(cwd, ["symbolic-ref", "--quiet", "--short", "HEAD"], timeout)
    out["branch"] = branch.output.strip() if branch.rc == 0 else None
    remote = git(cwd, ["config", "--get", "remote.origin.url"], timeout)
    out["remote"] = clean_url(remote.output.strip()) if remote.rc == 0 else None
    status = git(cwd, ["status", "--porcelain", "--untracked-files=normal"], timeout, max_output=4 << 20)
    untracked = [line[3:] for line in status.output.splitlines() if line.startswith("?? ")]
    out["untracked_count"] = len(untracked)
    out["untracked"] = untracked[:UNTRACKED_SHOWN]
    fd, tmp = tempfile.mkstemp(prefix=".rgt-diff.", suffix=".patch")
    os.close(fd)
    try:
        res = core.run_bounded(["git", "-C", toplevel] + GIT_DIFF_ARGS[:-2] + ["--output=" + tmp] + GIT_DIFF_ARGS[-2:],
                               timeout)
        if res.rc != 0:
            out.update(dirty=None, diff_sha256=None, diff_bytes=None,
                       error="git diff failed: %s" % (res.error or res.output.strip()[-200:]))
            return out
        size, digest = core.sha256_file(tmp)
        out.update(dirty=size > 0, diff_bytes=size, diff_sha256=digest if size else None, patch=None)
        if size and patch_to and size <= PATCH_LIMIT:
            with open(tmp, "rb") as handle:
                core.atomic_write(patch_to, handle.read())
            out["patch"] = os.path.basename(patch_to)
        elif size and patch_to:
            out["patch_skipped"] = "the diff is %s, over the %s limit" % (core.human_bytes(size),
                                                                       core.human_bytes(PATCH_LIMIT))
    finally:
        os.unlink(tmp)
    return out


def gpu_names(timeout):
    if not shutil.which("nvidia-smi"):
        return None
    res = core.run_bounded(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout)
    if res.rc != 0:
        return {"error": res.error or ("timed out" if res.timed_out else res.output.strip()[-200:])}
    names, driver = [], None
    for line in res.output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if parts and parts[0]:
            names.append(parts[0])
            driver = parts[1] if len(parts) > 1 else driver
    return {"names": names, "driver": driver}


def is_seed_name(name):
    """The variables recorded as seeds (and the only ones repro.sh exports): PYTHONHASHSEED, SEED, *_SEED."""
    return isinstance(name, str) and bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name)) and (
        name in SEED_NAMES or name.endswith("_SEED"))


def seed_vars(environ=None):
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if is_seed_name(k)}


def fingerprint(path, progress=True):
    """{"path", "kind", "size", "files", "sha256"} of a data file or directory (None sha when missing)."""
    full = os.path.abspath(path)
    if os.path.isfile(full):
        size, digest = core.sha256_file(full)
        return {"path": full, "kind": "file", "size": size, "files": 1, "sha256": digest}
    if not os.path.isdir(full):
        return {"path": full, "kind": "missing", "size": None, "files": 0, "sha256": None}
    entries, skipped = [], 0
    for folder, dirs, files in os.walk(full):
        dirs.sort()
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(folder, name), full)
            if os.path.islink(os.path.join(folder, name)) or not os.path.isfile(os.path.join(folder, name)):
                skipped += 1
                continue
            entries.append(rel)
            if len(entries) > DATA_FILE_LIMIT:
                raise core.UsageError("--data %s holds more than %d files; fingerprint a manifest or a "
                                      "smaller folder" % (path, DATA_FILE_LIMIT))
    meter = core.Progress("fingerprint %s" % os.path.basename(full), enabled=progress)
    combined, total = hashlib.sha256(), 0
    for rel in sorted(entries):
        size, digest = core.sha256_file(os.path.join(full, rel), on_bytes=meter.add)
        total += size
        combined.update(("%s\0%d\0%s\n" % (rel, size, digest)).encode("utf-8", "surrogateescape"))
    meter.close()
    return {"path": full, "kind": "dir", "size": total, "files": len(entries), "sha256": combined.hexdigest(),
            "skipped_links_or_special": skipped}


def record(run_dir, python=None, cwd=None, data=(), save_patch=True, timeout=60.0):
    run = core.read_json(os.path.join(run_dir, "run.json"))
    exe, how = job_python(run, python)
    job_cwd = cwd or (run.get("cwd") if isinstance(run.get("cwd"), str) and os.path.isdir(run.get("cwd"))
                      else os.getcwd())
    py, torch, packages = probe_python(exe, timeout)
    py["chosen_by"] = how
    pip_error = py.pop("packages_error", None)
    if packages is None and "error" not in py:   # an interpreter older than 3.8: ask pip (slower)
        packages, pip_error = pip_packages(py.get("executable") or exe, timeout)
    elif isinstance(packages, dict) and len(packages) > PACKAGE_LIMIT:
        packages = dict(sorted(packages.items())[:PACKAGE_LIMIT])
    doc = {"schema": SCHEMA, "recorded_at": core.utc_iso(), "host": socket.gethostname(), "cwd": os.path.abspath(job_cwd),
           "cmd": run.get("cmd") if isinstance(run.get("cmd"), list) else None,
           "python": py, "torch": torch, "packages": packages, "pip_error": pip_error,
           "key_packages": {k: packages[k] for k in KEY_PACKAGES if packages and k in packages},
           "git": git_state(job_cwd, timeout, os.path.join(run_dir, PATCH_NAME) if save_patch else None),
           "gpus": gpu_names(min(timeout, 15.0)), "seeds": seed_vars(),
           "data": [fingerprint(p) for p in data], "toolkit": core.toolkit_version()}
    doc = scrub_record(doc)
    core.atomic_write_json(os.path.join(run_dir, ENV_NAME), doc)
    return doc


def summary(doc):
    g = doc.get("git") or {}
    torch = doc.get("torch") or {}
    gpus = (doc.get("gpus") or {}).get("names") if isinstance(doc.get("gpus"), dict) else None
    return "OK env.json: python %s, torch %s (cuda %s), %s packages, git %s%s, seeds %s, %d data set(s), gpus %s" % (
        (doc.get("python") or {}).get("version", "?"), torch.get("version") if torch else "none",
        torch.get("cuda") if torch else "-", len(doc.get("packages") or {}),
        (g.get("commit") or "none")[:12], " DIRTY" if g.get("dirty") else "",
        ",".join(sorted(doc.get("seeds") or {})) or "none", len(doc.get("data") or []),
        ",".join(gpus) if gpus else "none")


SECTION_TYPES = (("python", dict), ("torch", dict), ("gpus", dict), ("packages", dict), ("git", dict),
                 ("seeds", dict), ("data", list))


def check_record(old, path):
    """Raise UsageError unless OLD (loaded from PATH) has the shape record() writes."""
    what = "--compare %s is not a run_env.py record" % path
    if old.get("schema") != SCHEMA:
        raise core.UsageError("%s (schema %s, expected %s)" % (what, json.dumps(old.get("schema")), SCHEMA))
    for key, kind in SECTION_TYPES:
        if old.get(key) is not None and not isinstance(old[key], kind):
            raise core.UsageError("%s: %s is a %s, not %s" % (what, key, type(old[key]).__name__,
                                                              "an object" if kind is dict else "a list"))
    for item in old.get("data") or []:
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            raise core.UsageError("%s: a data entry is not an object with a path: %s" % (
                what, json.dumps(item)[:80]))


def section(doc, key):
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def compare(new, old):
    """Lines of differences between two env records -> (env_diffs, data_problems)."""
    env, data = [], []

    def differ(label, a, b):
        if a != b:
            env.append("WARN %s: recorded %s, here %s" % (label, a, b))

    differ("python", section(old, "python").get("version"), section(new, "python").get("version"))
    for key in ("version", "cuda", "hip", "cudnn"):
        differ("torch %s" % key, section(old, "torch").get(key), section(new, "torch").get(key))
    differ("GPUs", section(old, "gpus").get("names") if old.get("gpus") is not None else None,
           section(new, "gpus").get("names") if new.get("gpus") is not None else None)
    old_pk, new_pk = section(old, "packages"), section(new, "packages")
    for name in sorted(set(old_pk) | set(new_pk)):
        if old_pk.get(name) != new_pk.get(name):
            differ("package %s" % name, old_pk.get(name, "absent"), new_pk.get(name, "absent"))
    recorded = {d.get("path"): d for d in old.get("data") or [] if isinstance(d, dict)}
    for item in new.get("data") or []:
        want = recorded.get(item["path"])
        if item["sha256"] is None:
            data.append("FAIL data %s is missing here" % item["path"])
        elif want and want.get("sha256") != item["sha256"]:
            data.append("FAIL data %s changed: recorded sha256 %s, here %s" % (
                item["path"], str(want.get("sha256") or "none")[:16], item["sha256"][:16]))
    return env, data


def start_thread(run_dir):
    """Record RUN_DIR/env.json in a thread of the calling process (the supervisor's, as its job starts) ->
    the thread, or None when RGT_NO_RUN_ENV=1. It never raises into the caller: a failure goes to env.log."""
    if os.environ.get("RGT_NO_RUN_ENV") == "1":
        return None
    import threading
    import traceback

    def work():
        try:
            record(run_dir)
        except Exception:  # noqa: BLE001  (a record, never a reason for the run to fail)
            try:
                with open(os.path.join(run_dir, "env.log"), "a") as log:
                    log.write(traceback.format_exc())
            except OSError:
                pass
    thread = threading.Thread(target=work, name="run_env", daemon=True)
    thread.start()
    return thread


DATA_DIFFERS = 4   # --compare: the data is not the run's (a finding, not a refusal: review D9)


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog=PROG, description="Record a run's environment as RUN_DIR/env.json (see the docstring).",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run dir; env.json (and code.patch) are written here")
    parser.add_argument("--python", default=None, metavar="EXE",
                        help="the job's interpreter (default: run.json's, else python3 on PATH)")
    parser.add_argument("--cwd", default=None, metavar="DIR",
                        help="the job's working directory, where git is asked (default: run.json's, else here)")
    parser.add_argument("--data", action="append", default=[], metavar="PATH",
                        help="a data file or directory to fingerprint (repeatable)")
    parser.add_argument("--no-patch", action="store_true",
                        help="do not save code.patch even when the tree has tracked changes")
    parser.add_argument("--timeout", type=core.arg_number(float, 0.0, 3600.0, low_open=True), default=60.0,
                        metavar="S", help="hard timeout of each external command (default 60)")
    parser.add_argument("--compare", default=None, metavar="FILE",
                        help="record as usual, then compare with another run's env.json (WARN/FAIL lines)")
    parser.add_argument("--json", action="store_true", help="print the record (or the comparison) as JSON")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        raise core.UsageError("%s is not a directory" % args.run_dir)
    for label, value in (("--python", args.python), ("--cwd", args.cwd), ("--compare", args.compare)):
        if value is not None and not value.strip():
            raise core.UsageError("%s is empty" % label)
    if args.cwd and not os.path.isdir(args.cwd):
        raise core.UsageError("--cwd %s is not a directory" % args.cwd)
    old = core.load_json_strict(args.compare, "--compare") if args.compare else None
    if old is not None:
        check_record(old, args.compare)
    data = list(args.data)
    if old is not None and not data:
        data = [d.get("path") for d in old.get("data") or [] if isinstance(d, dict) and d.get("path")]
    elif any(not os.path.exists(p) for p in data) and old is None:
        missing = [p for p in data if not os.path.exists(p)]
        raise core.UsageError("--data %s does not exist" % missing[0])
    doc = record(run_dir, args.python, args.cwd, data, not args.no_patch, args.timeout)
    if old is None:
        if args.json:
            core.emit_json(doc)
        else:
            print(summary(doc))
        return 0
    env, problems = compare(doc, old)
    if args.json:
        core.emit_json({"env_differences": env, "data_problems": problems, "recorded": os.path.join(run_dir, ENV_NAME)})
    else:
        for line in env + problems:
            print(line)
        print("%s environment %s, data %s" % ("OK" if not env and not problems else "WARN" if not problems else "FAIL",
                                             "matches" if not env else "differs in %d item(s)" % len(env),
                                             "matches" if not problems else "DIFFERS"))
    return DATA_DIFFERS if problems else (1 if env else 0)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
