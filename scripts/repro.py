#!/usr/bin/env python3
"""repro.py: writes a script that re-runs a recorded run from pinned code and checks its numbers; refuses the unpinned.

From RUN_DIR/run.json (the exact command and cwd the launcher recorded) and RUN_DIR/env.json
(scripts/node/run_env.py: commit, dirty state, Python, torch, CUDA, packages, seeds, data
fingerprints), it writes a bash script that:
  1. checks out the recorded commit into a fresh git worktree (never touching your own tree); a
     dirty tree is reproduced only from RUN_DIR/code.patch whose SHA-256 is the recorded diff hash,
     applied and then hashed again the same way; untracked files are named as a warning
  2. exports the recorded seeds (PYTHONHASHSEED, SEED, *_SEED)
  3. records the new environment beside the new run and compares it with the old one: Python,
     torch, CUDA, cuDNN, GPUs, packages (WARN, or stop with --strict-env), data fingerprints (stop)
  4. re-runs the exact command in WORKDIR/src (the checkout) with the old run dir's paths moved
     to the fresh WORKDIR/run, the old cwd to the checkout, and ../ paths outside the repo made
     absolute; its output goes to WORKDIR/run/job.log
  5. checks the new metrics against the old ones with scripts/reconcile.py: for every numeric key
     of every JSONL/CSV metrics file of the old run (timing and memory keys left out), its last,
     min, max and mean, within --rtol (relative) and --atol (absolute). Both sides are read the
     way run_forensics.py reads a curve: the last value logged for each step, in step order, so a
     resumed run that logged some steps twice counts each step once (the re-run's files go
     through `run_forensics.py steps` into WORKDIR/steps/ first)

The command's own paths are checked too: an absolute path (also the value after '=' of an option
word, and a ../ path that leaves the repository) that is neither in the old run dir, nor in the checkout, nor
a recorded data set is one the re-run reads or writes in place, outside WORKDIR: a WARN line
names each one (an existing file there is overwritten by a re-run that writes it); --map moves it.

Usage:
  repro.py RUN_DIR [-o repro.sh] [--force] [--repo DIR] [--rtol R] [--atol A] [--metrics-file PATH]...
           [--log-regex RE]... [--ignore KEY]... [--map OLD=NEW]... [--allow-unpinned] [--strict-env] [--json]
  bash repro.sh [WORKDIR]        (default WORKDIR: ./repro-<run id>-<UTC time>; must not exist)

  -o, --out FILE       where to write the script (default repro.sh; '-' for stdout). Never inside
                       RUN_DIR (the run's record is evidence: refused, --force or not); an
                       existing FILE is refused unless --force
  --force              replace an existing --out FILE (outside RUN_DIR)
  --repo DIR           the git repository holding the commit (default: the recorded top level)
  --rtol R             relative tolerance of the number check (default 1e-6; GPU runs: 1e-2 or so)
  --atol A             absolute tolerance, added to the relative one (default: exact to the digit)
  --metrics-file PATH  a metrics file inside RUN_DIR to check (repeatable; default: every *.jsonl
                       and *.csv in it, previous/ and logs/ left out)
  --log-regex RE       also check the numbers the job printed: RUN_DIR's job.log (or a pulled copy's
                       logs/job.log) read through RE exactly as run_forensics.py --log-regex reads it
                       (a (?P<step>) group, one named group per metric, (?P<epoch>) for an epoch-and-batch
                       log; repeatable, one per kind of line), against the re-run's job.log read the same
                       way. For a stdout-only trainer (nanoGPT without W&B) this is the only record:
                         --log-regex 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'
  --ignore KEY         a metric key not to check (repeatable), on top of the timing keys
  --map OLD=NEW        also rewrite the path prefix OLD to NEW in the command (repeatable): an
                       output folder outside the run dir that a re-run must not reuse
  --allow-unpinned     write the script even when the code cannot be pinned (no git commit, or a
                       dirty tree without a matching code.patch); the script then warns loudly
  --strict-env         the script stops when the environment differs (default: WARN and go on)
  --json               print what was written (and every warning) as JSON

Environment of the script: RGT_HOME (this checkout, for run_env.py and reconcile.py), RGT_PY
(a Python 3.8+ for those tools, default python3), REPRO_PYTHON (the job's interpreter to check,
default the recorded one).

Exit codes (repro.py): 0 written; 2 usage (an --out inside RUN_DIR or already there included); 3 refused (no env.json or run.json, code not pinned,
a patch whose hash is not the recorded one, nothing to compare).
Exit codes (the script): 0 reproduced within tolerance; 1 numbers differ or the re-run failed;
2 usage (WORKDIR exists); 3 refused: it cannot reproduce, so it stops before the re-run (commit missing, patch or data
mismatch, --strict-env).
"""
import math
import os
import re
import shlex
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
sys.path.insert(0, HERE)
import rgt_core as core  # noqa: E402
import run_env  # noqa: E402  (the same git diff flags for the dirty-tree hash)
import metrics_readers as rf  # noqa: E402  (the readers run_forensics.py uses)

PROG = "repro.py"
REPO_ROOT = os.path.dirname(HERE)
TIMING = re.compile(r"(^|[._/])(_?time|timestamp|wall_?time|_runtime|runtime|elapsed|duration|secs?|seconds|"
                    r"sec_per_step|s_per_step|.*per_sec(ond)?|throughput|mem|memory|.*_mem|.*_mib|.*_mb|.*_gb)$")
REDUCERS = ("last", "min", "max", "mean")
BAD_KEY = re.compile(r"[\s#@]|[*/]\d+(\.\d+)?$|-->")


def q(text):
    return shlex.quote(str(text))


def split_word(word, cwd, toplevel):
    """(head, value) of a command word: '--opt=' and VALUE for --opt=VALUE, else '' and the word; a ../
    VALUE that leaves the repository (or any ../ VALUE without one) is made absolute from CWD."""
    head, value = "", word
    if word.startswith("-") and "=" in word:
        head, value = word.split("=", 1)
        head += "="
    if value == ".." or value.startswith("../"):
        resolved = os.path.normpath(os.path.join(cwd, value))
        if not toplevel or not (resolved + os.sep).startswith(toplevel.rstrip(os.sep) + os.sep):
            value = resolved  # outside the repo: the same place from the fresh checkout
    return head, value


def under(path, prefix):
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


def rewrite_word(word, maps, cwd, toplevel):
    """A command word as bash: each mapped path prefix becomes its variable ("$NEW_RUN"...)."""
    head, value = split_word(word, cwd, toplevel)
    for old, new in maps:
        if under(value, old):
            rest = value[len(old.rstrip(os.sep)):]
            return q(head) + new + (q(rest) if rest else "") if head else new + (q(rest) if rest else ""), True
    return q(head + value), value != word[len(head):]


def path_variants(path):
    out = []
    for cand in (os.path.abspath(path), os.path.realpath(path)):
        if cand not in out:
            out.append(cand)
    return out


def metric_files(run_dir, given):
    if given:
        out = []
        for path in given:
            full = os.path.abspath(os.path.join(run_dir, path))
            if not (full + os.sep).startswith(run_dir + os.sep) or not os.path.isfile(full):
                raise core.UsageError("--metrics-file %s is not a file inside %s" % (path, run_dir))
            out.append(os.path.relpath(full, run_dir))
        return out
    found = []
    for folder, _dirs, files in rf.walk(run_dir):
        for name in files:
            if name.lower().endswith((".jsonl", ".csv")):
                found.append(os.path.relpath(os.path.join(folder, name), run_dir))
    return found


def steps_name(rel):
    """Where the re-run's REL, read per step by `run_forensics.py steps`, lands under WORKDIR/steps/."""
    return os.path.join("steps", rel if rel.lower().endswith(".jsonl") else rel + ".jsonl")


def claims_for(run_dir, rel, ignore, warnings):
    """Markdown lines binding the old run's numbers (last value per step, the reader run_forensics.py uses)
    to the re-run's same file as `run_forensics.py steps` writes it."""
    full = os.path.join(run_dir, rel)
    if re.search(r"[\s#]", rel):
        warnings.append("%s is not checked: reconcile.py bindings cannot hold whitespace or '#'" % rel)
        return []
    records = rf.read_jsonl(full) if rel.lower().endswith(".jsonl") else rf.read_csv(full)
    return claim_lines(rf.records_to_series(records), rel, steps_name(rel), ignore, warnings)


def log_steps_name(index):
    """Where the re-run's job.log read through --log-regex #INDEX (`run_forensics.py steps`) lands."""
    return os.path.join("steps", "job.log.%d.jsonl" % index)


def log_claims(run_dir, regexes, ignore, warnings):
    """(claim lines, [(index, regex)] checked) for the old run's job.log (the run dir's, else a pulled copy's
    logs/job.log) read through each --log-regex as run_forensics.py reads it, bound to the re-run's job.log
    read the same way."""
    files = rf.log_files(run_dir)
    if not files:
        warnings.append("--log-regex given, but %s holds no %s: no log numbers are checked"
                        % (run_dir, " or ".join(rf.LOG_NAMES)))
        return [], []
    rel = files[0]
    try:
        found = rf.log_series(os.path.join(run_dir, *rel.split("/")), regexes)
    except OSError as exc:
        warnings.append("%s is not checked: %s" % (rel, exc.strerror or exc))
        return [], []
    lines, used = [], []
    for index, (series, _bad) in enumerate(found, 1):
        if not series:
            warnings.append("--log-regex #%d matched no line of %s with a numeric step: nothing of it is checked"
                            % (index, rel))
            continue
        got = claim_lines(series, "%s#%d" % (rel, index), log_steps_name(index), ignore, warnings)
        if got:
            lines += got
            used.append((index, regexes[index - 1]))
    return lines, used


def claim_lines(series, label, bound, ignore, warnings):
    """The claim lines for SERIES ({name: [(step, value)]}, last value per step, in step order), bound to BOUND
    (a per-step JSONL file under WORKDIR); LABEL names the source in warnings."""
    values = {key: [v for _step, v in points] for key, points in series.items()}
    rel = label
    lines = []
    for key in sorted(values):
        if key in ignore or TIMING.search(key.lower()):
            continue
        if BAD_KEY.search(key):
            warnings.append("%s#%s is not checked: the key cannot be written as a reconcile.py binding" % (rel, key))
            continue
        xs = values[key]
        if not all(math.isfinite(x) for x in xs):
            warnings.append("%s#%s holds NaN/inf: not checked (run_forensics.py curve shows where)" % (rel, key))
            continue
        got = {"last": xs[-1], "min": min(xs), "max": max(xs), "mean": statistics.fmean(xs)}
        for red in REDUCERS:
            lines.append("- %s %s: %r <!-- metric: %s#%s@%s -->" % (key, red, got[red], bound, key, red))
    return lines


def check_out(out, run_dir, force):
    """Raise UsageError unless the script may be written to OUT: never inside RUN_DIR (its record is
    evidence), never over an existing file without FORCE, and only into an existing folder."""
    full = os.path.abspath(out)
    folder = os.path.dirname(full)
    if not os.path.isdir(folder):
        raise core.UsageError("--out %s: the folder %s does not exist" % (out, folder))
    real = os.path.join(os.path.realpath(folder), os.path.basename(full))
    if any(under(cand, os.path.realpath(run_dir)) for cand in (full, real)):
        raise core.UsageError("--out %s is inside the run dir %s, whose files are the run's evidence; write the "
                              "script somewhere else" % (out, run_dir))
    if os.path.lexists(full) and not force:
        raise core.UsageError("--out %s already exists; give a new path, or --force to replace it" % out)


def outside_paths(cmd, maps, cwd, toplevel, data_paths):
    """WARN lines for each path in CMD (after the program) a re-run would use in place, outside WORKDIR."""
    lines, seen = [], set()
    for word in cmd[1:]:
        _head, value = split_word(word, cwd, toplevel)
        if not os.path.isabs(value):
            continue
        value = os.path.normpath(value)
        if value in seen or value in data_paths:
            continue
        if any(under(value, old) for old, _new in maps) or any(under(value, p) for p in ("/dev", "/proc", "/sys")):
            continue
        seen.add(value)
        what = ("an existing file: if the job writes it, the re-run overwrites it" if os.path.isfile(value)
                else "an existing folder: a re-run may write into it" if os.path.isdir(value)
                else "not there now: a re-run that writes it creates it there")
        lines.append("the command names %s outside the run dir and the checkout (%s); the re-run uses it in "
                     "place (--map %s=NEW gives the re-run its own)" % (value, what, value))
    return lines


def main(argv=None):
    parser = core.Parser(prog=PROG, description="Write a reproduction script for a recorded run (see the docstring).",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the recorded run (env.json and run.json in it)")
    parser.add_argument("-o", "--out", default="repro.sh", metavar="FILE",
                        help="where to write the script (default repro.sh; '-' stdout; never inside RUN_DIR)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out FILE (outside RUN_DIR)")
    parser.add_argument("--repo", default=None, metavar="DIR",
                        help="the git repository holding the commit (default: the recorded top level)")
    parser.add_argument("--rtol", type=core.arg_number(float, 0.0, 1.0), default=1e-6, metavar="R",
                        help="relative tolerance of the number check (default 1e-6; GPU runs: about 1e-2)")
    parser.add_argument("--atol", type=core.arg_number(float, 0.0), default=None, metavar="A",
                        help="absolute tolerance added to the relative one (default: exact to the digit)")
    parser.add_argument("--metrics-file", action="append", default=[], metavar="PATH",
                        help="a metrics file inside RUN_DIR to check (repeatable; default every *.jsonl, *.csv)")
    parser.add_argument("--log-regex", action="append", default=[], metavar="RE", type=rf.log_regex_arg,
                        help="also check the numbers job.log holds, read through RE as run_forensics.py "
                             "--log-regex reads them (repeatable; a stdout-only trainer needs it)")
    parser.add_argument("--ignore", action="append", default=[], metavar="KEY",
                        help="a metric key not to check (repeatable), on top of the timing keys")
    parser.add_argument("--map", action="append", default=[], metavar="OLD=NEW",
                        help="also rewrite path prefix OLD to NEW in the command (repeatable)")
    parser.add_argument("--allow-unpinned", action="store_true",
                        help="write the script even when the code cannot be pinned (it then warns loudly)")
    parser.add_argument("--strict-env", action="store_true",
                        help="the script stops when the environment differs (default: WARN and go on)")
    parser.add_argument("--json", action="store_true", help="print what was written (and every warning) as JSON")
    args = parser.parse_args(argv)
    if not args.out:
        raise core.UsageError("--out is empty")
    run_dir = os.path.abspath(args.run_dir)
    if not os.path.isdir(run_dir):
        raise core.UsageError("%s is not a directory" % args.run_dir)
    extra = []
    for item in args.map:
        old, sep, new = item.partition("=")
        if not sep or not os.path.isabs(old) or not new:
            raise core.UsageError("--map %r: give OLD=NEW with an absolute OLD path" % item)
        extra.append((os.path.abspath(old), q(new)))
    if args.repo is not None and not os.path.isdir(args.repo):
        raise core.UsageError("--repo %s is not a directory" % args.repo)
    if args.out != "-":
        check_out(args.out, run_dir, args.force)
    for name in ("run.json", "env.json"):
        if not os.path.isfile(os.path.join(run_dir, name)):
            raise core.Refused("%s has no %s; %s" % (run_dir, name, "record it first: python3 scripts/node/run_env.py "
                                                     "RUN_DIR" if name == "env.json" else "launch with run_one.sh"))
    run = core.load_json_strict(os.path.join(run_dir, "run.json"), "run.json")
    env = core.load_json_strict(os.path.join(run_dir, "env.json"), "env.json")
    cmd = run.get("cmd")
    cwd = run.get("cwd") or env.get("cwd")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(w, str) for w in cmd) or not isinstance(cwd, str):
        raise core.Refused("run.json in %s has no usable cmd (a list of words) and cwd" % run_dir)
    git = env.get("git") if isinstance(env.get("git"), dict) else {}
    warnings = []
    commit, toplevel = git.get("commit"), git.get("toplevel")
    pinned = bool(commit)
    patch = None
    if not commit:
        warnings.append("the code is not pinned: %s was not a git work tree with a commit (%s)" % (
            cwd, git.get("error") or "no commit recorded"))
    elif git.get("dirty"):
        cand = os.path.join(run_dir, run_env.PATCH_NAME)
        if os.path.isfile(cand):
            have = core.sha256_file(cand)[1]
            if have != git.get("diff_sha256"):
                raise core.Refused("%s does not hash to the recorded diff (%s, recorded %s): it is not the tree "
                                   "the run used" % (cand, have[:16], str(git.get("diff_sha256"))[:16]))
            patch = cand
        else:
            pinned = False
            warnings.append("the tree had uncommitted changes (diff sha256 %s) and %s holds no code.patch: the "
                            "exact code cannot be rebuilt" % (str(git.get("diff_sha256"))[:16], run_dir))
    if not pinned and not args.allow_unpinned:
        raise core.Refused("; ".join(warnings) + "; commit the code and re-run, or pass --allow-unpinned")
    if git.get("untracked_count"):
        warnings.append("%d untracked file(s) were in the tree and are not reproduced: %s" % (
            git["untracked_count"], ", ".join(git.get("untracked") or [])[:300]))
    files = metric_files(run_dir, args.metrics_file)
    claims, checked = [], []
    for rel in files:
        if any(steps_name(rel) == steps_name(other) for other in checked):
            warnings.append("%s is not checked: its per-step copy would have the name of %s's" % (rel, steps_name(rel)))
            continue
        got = claims_for(run_dir, rel, set(args.ignore), warnings)
        if got:
            claims += got
            checked.append(rel)
    logged, log_checked = log_claims(run_dir, args.log_regex, set(args.ignore), warnings) if args.log_regex \
        else ([], [])
    claims += logged
    if not claims:
        hint = (" or --log-regex: %s holds the job's stdout (see run_forensics.py --help)" % rf.log_files(run_dir)[0]
                if rf.log_files(run_dir) and not args.log_regex else "")
        raise core.Refused("nothing to compare: no numeric metrics in %s (give --metrics-file%s)" % (
            ", ".join(files) or "any *.jsonl/*.csv of " + run_dir, hint))
    sub = git.get("cwd_in_repo") or "."
    maps = list(extra)
    maps += [(v, '"$NEW_RUN"') for v in path_variants(run_dir)]
    if commit:
        maps += [(v, '"$SRC"/%s' % q(sub) if sub != "." else '"$SRC"') for v in path_variants(cwd)]
        maps += [(v, '"$SRC"') for v in path_variants(toplevel)] if toplevel else []
    maps.sort(key=lambda m: -len(m[0]))
    secrets = core.url_secrets(cmd)
    if secrets:   # repro.sh is shared: a presigned URL or user:token@ in the argv must not travel with it
        cmd = [core.scrub_urls(w) for w in cmd]
        warnings.append("%d command word(s) held a URL credential, removed from repro.sh: give it to the job "
                        "through an environment variable or a 0600 file instead of its arguments" % len(secrets))
    words, changed = [], []
    for word in cmd:
        rendered, moved = rewrite_word(word, maps, cwd, toplevel if commit else None)
        words.append(rendered)
        if moved:
            changed.append(word)
    warnings += outside_paths(cmd, maps, cwd, toplevel if commit else None,
                              [d.get("path") for d in env.get("data") or [] if isinstance(d, dict)])
    job_py = (env.get("python") or {}).get("executable") or cmd[0]
    recorded = env.get("seeds") if isinstance(env.get("seeds"), dict) else {}
    # only what run_env.py records as a seed is exported: anything else in "seeds" (LD_PRELOAD, BASH_ENV,
    # PATH) did not come from the tool and would run code before the job does
    seeds = {k: str(v) for k, v in recorded.items() if run_env.is_seed_name(k)}
    odd = sorted(str(k) for k in recorded if not run_env.is_seed_name(k))
    if odd:
        warnings.append("env.json's seeds hold names that are not seed variables, NOT exported: %s"
                        % ", ".join(odd)[:300])
    run_id = re.sub(r"[^A-Za-z0-9._-]", "_", str(run.get("run_id") or os.path.basename(run_dir)))[:60]
    diff_cmd = " ".join(q(w) for w in run_env.GIT_DIFF_ARGS)
    lines = [
        "#!/usr/bin/env bash",
        "# Re-run %s from its record and check its numbers." % run_id,
        # the run dir is a path from anywhere (a pull, someone's archive): it is only ever a quoted word
        # (ORIG_RUN below), never comment text, where a newline in it would start a command (finding_laptop_L11)
        "# Generated by scripts/repro.py %s from the run dir in ORIG_RUN below." % core.utc_iso(),
        "# Usage: bash repro.sh [WORKDIR]   (WORKDIR must not exist; default ./repro-%s-<UTC time>)" % run_id,
        "# Exit: 0 reproduced within tolerance; 1 numbers differ or the re-run failed; 2 usage;",
        "#       3 cannot reproduce (commit missing, patch or data mismatch, environment with --strict-env).",
        "set -uo pipefail",
        "RGT_HOME=${RGT_HOME:-%s}" % q(REPO_ROOT),
        "RGT_PY=${RGT_PY:-python3}",
        "ORIG_RUN=%s" % q(run_dir),
        "REPO=%s" % q(os.path.abspath(args.repo) if args.repo else (toplevel or "")),
        "COMMIT=%s" % q(commit or ""),
        "PATCH=%s" % q(patch or ""),
        "DIFF_SHA=%s" % q(git.get("diff_sha256") or "" if patch else ""),
        "SUB=%s" % q(sub),
        "STRICT_ENV=%d" % (1 if args.strict_env else 0),
        "RTOL=%s" % q(repr(args.rtol)),
        "ATOL=%s" % q("" if args.atol is None else repr(args.atol)),
        "JOB_PY=${REPRO_PYTHON:-%s}" % q(job_py),
        "[ -x \"$JOB_PY\" ] || command -v \"$JOB_PY\" >/dev/null 2>&1 || JOB_PY=%s" % q(cmd[0]),
        "die() { printf 'repro: error: %s\\n' \"$1\" >&2; exit \"${2:-3}\"; }",
        "say() { printf 'repro: %s\\n' \"$*\" >&2; }",
        "sha() { if command -v sha256sum >/dev/null 2>&1; then sha256sum | cut -d' ' -f1; "
        "else shasum -a 256 | cut -d' ' -f1; fi; }",
        "[ $# -le 1 ] || die 'usage: bash repro.sh [WORKDIR]' 2",
        "WORK=${1:-\"$PWD/repro-%s-$(date -u +%%Y%%m%%dT%%H%%M%%SZ)\"}" % run_id,
        "[ ! -e \"$WORK\" ] || die \"$WORK exists: give a fresh folder\" 2",
        "mkdir -p \"$WORK\" || die \"cannot create $WORK\" 2",
        "WORK=$(cd \"$WORK\" && pwd)",
        "SRC=\"$WORK/src\"",
        "NEW_RUN=\"$WORK/run\"",
        "mkdir \"$NEW_RUN\" || exit 3",
        "",
        "echo \"[1/5] code\"",
    ]
    if commit:
        lines += [
            "[ -n \"$REPO\" ] && git -C \"$REPO\" cat-file -e \"$COMMIT^{commit}\" 2>/dev/null || "
            "die \"commit $COMMIT is not in ${REPO:-the repository} (fetch it, or set REPO=... in this script)\"",
            "git -C \"$REPO\" worktree add --quiet --detach \"$SRC\" \"$COMMIT\" || die \"cannot check out $COMMIT\"",
            "say \"checked out $COMMIT in $SRC (remove later: git -C $REPO worktree remove --force $SRC)\"",
        ]
        if patch:
            lines += [
                "[ \"$(sha < \"$PATCH\")\" = \"$DIFF_SHA\" ] || die \"$PATCH no longer hashes to the recorded diff\"",
                "git -C \"$SRC\" apply --index --binary \"$PATCH\" || die \"the recorded patch does not apply\"",
                "GOT=$(git -C \"$SRC\" %s | sha)" % diff_cmd,
                "[ \"$GOT\" = \"$DIFF_SHA\" ] || die \"the patched tree hashes to $GOT, the run's to $DIFF_SHA\"",
                "say \"applied code.patch: the tree matches the run's (diff sha256 ${DIFF_SHA:0:16})\"",
            ]
        elif git.get("dirty"):
            lines.append("say \"WARN the run's uncommitted changes are NOT reproduced (no code.patch); expect "
                         "different numbers\"")
    else:
        lines += ["say %s" % q("WARN the code is not pinned (no git commit was recorded): running in %s as it is "
                               "now" % cwd), "SRC=%s" % q(cwd), "SUB=."]
    for warning in warnings:
        lines.append("say %s" % q("WARN " + warning))
    lines += ["", "echo \"[2/5] seeds\""]
    for key in sorted(seeds):
        lines.append("export %s=%s" % (key, q(seeds[key])))
    lines += ["say %s" % q("seeds: " + (", ".join("%s=%s" % kv for kv in sorted(seeds.items())) or "none recorded")),
              "", "echo \"[3/5] environment and data\"",
              "\"$RGT_PY\" \"$RGT_HOME/scripts/node/run_env.py\" \"$NEW_RUN\" --python \"$JOB_PY\" "
              "--cwd \"$SRC/$SUB\" --compare \"$ORIG_RUN/env.json\"",
              "rc=$?",
              "[ \"$rc\" -ne %d ] || die \"the data differs from what the run used: the numbers cannot match\"" % run_env.DATA_DIFFERS,
              "[ \"$rc\" -eq 0 ] || [ \"$STRICT_ENV\" = 0 ] || die \"the environment differs (--strict-env)\"",
              "[ \"$rc\" -le 1 ] || die \"run_env.py failed (exit $rc)\"",
              "", "echo \"[4/5] re-run\"",
              "CMD=(%s)" % " ".join(words),
              "printf '%s\\n' \"${CMD[@]}\" > \"$NEW_RUN/cmd.txt\"",
              "say \"in $SRC/$SUB: ${CMD[*]}\"",
              "( cd \"$SRC/$SUB\" && exec \"${CMD[@]}\" ) 2>&1 | tee \"$NEW_RUN/job.log\"",
              "rc=${PIPESTATUS[0]}",
              "[ \"$rc\" -eq 0 ] || die \"the re-run failed (exit $rc); see $NEW_RUN/job.log\" 1",
              "", "echo \"[5/5] numbers\"",
              "# each metrics file read per step (the last value of each step), as the bindings below were"]
    for rel in checked:
        lines += ["mkdir -p \"$WORK\"/%s" % q(os.path.dirname(steps_name(rel))),
                  "\"$RGT_PY\" \"$RGT_HOME/scripts/run_forensics.py\" steps \"$NEW_RUN\"/%s > \"$WORK\"/%s || "
                  "say %s" % (q(rel), q(steps_name(rel)), q("WARN the re-run's %s could not be read per step" % rel))]
    for index, rx in log_checked:
        lines += ["mkdir -p \"$WORK\"/steps",
                  "\"$RGT_PY\" \"$RGT_HOME/scripts/run_forensics.py\" steps \"$NEW_RUN\"/job.log --log-regex %s > "
                  "\"$WORK\"/%s || say %s" % (q(rx.pattern), q(log_steps_name(index)),
                                             q("WARN the re-run's job.log could not be read per step through "
                                               "--log-regex #%d" % index))]
    lines += ["cat > \"$WORK/expected.md\" <<'RGT_EXPECTED'",
              "# %s: the recorded run's numbers, bound to the re-run's files read per step" % run_id]
    lines += claims
    lines += ["RGT_EXPECTED",
              "TOL=(--rel-tol \"$RTOL\")",
              "[ -z \"$ATOL\" ] || TOL+=(--abs-tol \"$ATOL\")",
              "\"$RGT_PY\" \"$RGT_HOME/scripts/reconcile.py\" --quiet --base \"$WORK\" \"${TOL[@]}\" "
              "\"$WORK/expected.md\"",
              "rc=$?",
              "if [ \"$rc\" -eq 0 ]; then echo \"REPRODUCED $ORIG_RUN -> $NEW_RUN (rtol $RTOL)\"; exit 0; fi",
              "echo \"DIFFERS the re-run's numbers do not match (reconcile.py exit $rc): see above; "
              "run_forensics.py diff $ORIG_RUN $NEW_RUN\"",
              "exit 1", ""]
    text = "\n".join(lines)
    core.atomic_write(args.out, text, mode=0o755 if args.out != "-" else None)
    report = {"script": args.out if args.out == "-" else os.path.abspath(args.out), "commit": commit,
              "dirty": bool(git.get("dirty")), "patch": patch, "pinned": pinned, "claims": len(claims),
              "metrics_files": files, "log_regex": [rx.pattern for _i, rx in log_checked],
              "rewritten_words": changed, "warnings": warnings}
    if args.json:
        core.emit_json(report)
    elif args.out != "-":
        print("OK wrote %s: commit %s%s, %d numbers to check in %s" % (
            report["script"], (commit or "none")[:12], " + code.patch" if patch else "", len(claims), ", ".join(files)))
        for warning in warnings:
            print("WARN %s" % warning)
    return 0


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
