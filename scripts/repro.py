#!/usr/bin/env python3
"""repro.py: write a script that re-runs a recorded run and checks its numbers (laptop or node).

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
     min, max and mean, within --rtol (relative) and --atol (absolute)

Usage:
  repro.py RUN_DIR [-o repro.sh] [--repo DIR] [--rtol R] [--atol A] [--metrics-file PATH]...
           [--ignore KEY]... [--map OLD=NEW]... [--allow-unpinned] [--strict-env] [--json]
  bash repro.sh [WORKDIR]        (default WORKDIR: ./repro-<run id>-<UTC time>; must not exist)

  -o, --out FILE       where to write the script (default repro.sh; '-' for stdout)
  --repo DIR           the git repository holding the commit (default: the recorded top level)
  --rtol R             relative tolerance of the number check (default 1e-6; GPU runs: 1e-2 or so)
  --atol A             absolute tolerance, added to the relative one (default: exact to the digit)
  --metrics-file PATH  a metrics file inside RUN_DIR to check (repeatable; default: every *.jsonl
                       and *.csv in it, previous/ and logs/ left out)
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

Exit codes (repro.py): 0 written; 2 usage; 3 refused (no env.json or run.json, code not pinned,
a patch whose hash is not the recorded one, nothing to compare).
Exit codes (the script): 0 reproduced within tolerance; 1 numbers differ or the re-run failed;
2 usage (WORKDIR exists); 3 cannot reproduce (commit missing, patch or data mismatch, --strict-env).
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
import run_forensics as rf  # noqa: E402  (the same metrics readers)

PROG = "repro.py"
REPO_ROOT = os.path.dirname(HERE)
TIMING = re.compile(r"(^|[._/])(_?time|timestamp|wall_?time|_runtime|runtime|elapsed|duration|secs?|seconds|"
                    r"sec_per_step|s_per_step|.*per_sec(ond)?|throughput|mem|memory|.*_mem|.*_mib|.*_mb|.*_gb)$")
REDUCERS = ("last", "min", "max", "mean")
BAD_KEY = re.compile(r"[\s#@]|[*/]\d+(\.\d+)?$|-->")


def q(text):
    return shlex.quote(str(text))


def rewrite_word(word, maps, cwd, toplevel):
    """A command word as bash: each mapped path prefix becomes its variable ("$NEW_RUN"...)."""
    head, value = "", word
    if word.startswith("-") and "=" in word:
        head, value = word.split("=", 1)
        head += "="
    if value == ".." or value.startswith("../"):
        resolved = os.path.normpath(os.path.join(cwd, value))
        if not toplevel or not (resolved + os.sep).startswith(toplevel.rstrip(os.sep) + os.sep):
            value = resolved  # outside the repo: the same place from the fresh checkout
    for old, new in maps:
        if value == old or value.startswith(old.rstrip(os.sep) + os.sep):
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


def claims_for(run_dir, rel, ignore, warnings):
    """Markdown lines binding the old run's numbers to the same file in the new run."""
    full = os.path.join(run_dir, rel)
    if re.search(r"[\s#]", rel):
        warnings.append("%s is not checked: reconcile.py bindings cannot hold whitespace or '#'" % rel)
        return []
    records = rf.read_jsonl(full) if rel.lower().endswith(".jsonl") else rf.read_csv(full)
    values = {}
    for rec in records:
        for key, raw in rf.flatten(rec).items():
            number = rf.as_number(raw)
            if number is not None:
                values.setdefault(key, []).append(number)
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
            lines.append("- %s %s: %r <!-- metric: %s#%s@%s -->" % (key, red, got[red], rel, key, red))
    return lines


def main(argv=None):
    parser = core.Parser(prog=PROG, description="Write a reproduction script for a recorded run (see the docstring).")
    parser.add_argument("run_dir")
    parser.add_argument("-o", "--out", default="repro.sh")
    parser.add_argument("--repo", default=None)
    parser.add_argument("--rtol", type=core.arg_number(float, 0.0, 1.0), default=1e-6)
    parser.add_argument("--atol", type=core.arg_number(float, 0.0), default=None)
    parser.add_argument("--metrics-file", action="append", default=[])
    parser.add_argument("--ignore", action="append", default=[])
    parser.add_argument("--map", action="append", default=[])
    parser.add_argument("--allow-unpinned", action="store_true")
    parser.add_argument("--strict-env", action="store_true")
    parser.add_argument("--json", action="store_true")
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
    claims = []
    for rel in files:
        claims += claims_for(run_dir, rel, set(args.ignore), warnings)
    if not claims:
        raise core.Refused("nothing to compare: no numeric metrics in %s (give --metrics-file)" % (
            ", ".join(files) or "any *.jsonl/*.csv of " + run_dir))
    sub = git.get("cwd_in_repo") or "."
    maps = list(extra)
    maps += [(v, '"$NEW_RUN"') for v in path_variants(run_dir)]
    if commit:
        maps += [(v, '"$SRC"/%s' % q(sub) if sub != "." else '"$SRC"') for v in path_variants(cwd)]
        maps += [(v, '"$SRC"') for v in path_variants(toplevel)] if toplevel else []
    maps.sort(key=lambda m: -len(m[0]))
    words, changed = [], []
    for word in cmd:
        rendered, moved = rewrite_word(word, maps, cwd, toplevel if commit else None)
        words.append(rendered)
        if moved:
            changed.append(word)
    for word in cmd:
        if os.path.isabs(word) and os.path.exists(word) and not any(
                word == m or word.startswith(m.rstrip(os.sep) + os.sep) for m, _n in maps) and word not in (
                (d or {}).get("path") for d in env.get("data") or []) and not os.path.isfile(word):
            warnings.append("the command names %s, outside the run dir: a re-run may read or overwrite it "
                            "(--map %s=NEW moves it)" % (word, word))
    job_py = (env.get("python") or {}).get("executable") or cmd[0]
    seeds = env.get("seeds") if isinstance(env.get("seeds"), dict) else {}
    run_id = re.sub(r"[^A-Za-z0-9._-]", "_", str(run.get("run_id") or os.path.basename(run_dir)))[:60]
    diff_cmd = " ".join(q(w) for w in run_env.GIT_DIFF_ARGS)
    lines = [
        "#!/usr/bin/env bash",
        "# Re-run %s from its record and check its numbers." % run_id,
        "# Generated by scripts/repro.py %s from %s." % (core.utc_iso(), run_dir),
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
        lines += ["say \"WARN the code is not pinned (no git commit was recorded): running in %s as it is now\"" % cwd,
                  "SRC=%s" % q(cwd), "SUB=."]
    for warning in warnings:
        lines.append("say %s" % q("WARN " + warning))
    lines += ["", "echo \"[2/5] seeds\""]
    for key in sorted(seeds):
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            lines.append("export %s=%s" % (key, q(seeds[key])))
    lines += ["say %s" % q("seeds: " + (", ".join("%s=%s" % kv for kv in sorted(seeds.items())) or "none recorded")),
              "", "echo \"[3/5] environment and data\"",
              "\"$RGT_PY\" \"$RGT_HOME/scripts/node/run_env.py\" \"$NEW_RUN\" --python \"$JOB_PY\" "
              "--cwd \"$SRC/$SUB\" --compare \"$ORIG_RUN/env.json\"",
              "rc=$?",
              "[ \"$rc\" -ne 3 ] || die \"the data differs from what the run used: the numbers cannot match\"",
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
              "cat > \"$WORK/expected.md\" <<'RGT_EXPECTED'",
              "# %s: the recorded run's numbers, bound to the re-run's files" % run_id]
    lines += claims
    lines += ["RGT_EXPECTED",
              "TOL=(--rel-tol \"$RTOL\")",
              "[ -z \"$ATOL\" ] || TOL+=(--abs-tol \"$ATOL\")",
              "\"$RGT_PY\" \"$RGT_HOME/scripts/reconcile.py\" --quiet --base \"$NEW_RUN\" \"${TOL[@]}\" "
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
              "metrics_files": files, "rewritten_words": changed, "warnings": warnings}
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
