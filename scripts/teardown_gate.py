#!/usr/bin/env python3
"""Passes only when the pull matches the node's current manifest, re-hashed on the node; never tears down.

Local side. Run it after pull_verified.py and BEFORE you terminate, destroy or release anything.
It passes only when all of these hold:
  0. no attempt of the run still runs on the node (its run dir, DURABLE/runs/RID beside the --source
     DURABLE/results/RID, or --run-dir): a resumed attempt that runs on would make the pull stale;
  1. DEST/<run_id>/PULL_VERIFIED.json belongs to the PULL_MANIFEST.json kept beside it;
  2. the node's CURRENT files are exactly the files that were pulled (same paths, sizes, SHA-256).
     The manifest is always recomputed on the node now, never taken from a stored or local copy: our
     build_pull_manifest.py is streamed to `python3 -` over ssh (or run locally for a local ROOT) with
     the roster and run id recorded in the pulled manifest, writing nothing on the node; so a file
     changed, added or deleted after the pull is caught even when nobody rebuilt the stored manifest
     (a node that prints nothing for --stall-seconds S, default 300, while re-hashing is a refusal);
  3. every pulled file still verifies locally (re-hashed; no missing, extra or changed files);
  4. each --load-check command exits 0 for every pulled file matching --load-glob (default: *.pt,
     *.pth, *.ckpt, *.safetensors at any depth). "{}" in the command becomes the file's path; the
     command is split with shlex and run without a shell, in the pulled directory. --inspect adds our
     checkpoint inspector (ckpt_inspect.py) as one more load check; a pull with no checkpoint passes it.
On a pass it prints the profile's meter-stop action, what that destroys and what keeps billing
(from profiles/index.json), the run id, file count and bytes, that it covers this run only (a box
that ran several runs needs scripts/node/final_sweep.py first), and that it did NOT tear anything down.

Usage:
  teardown_gate.py --pulled DEST/<run_id> --profile NAME
                   --source [HOST:]ROOT [--rsh "ssh -F cfg"]
                   [--load-check "CMD {}"]... [--inspect] [--load-glob GLOB]... [--load-timeout S] [--jobs N]
                   [--stall-seconds S] [--json]

  python3 teardown_gate.py --pulled ./pulled/run-42 --source gpu-box:/workspace/durable/results/run-42 \\
      --profile runpod --load-check "python3 check_ckpt.py {}"

Profile index: $RGT_PROFILE_INDEX (when set, that file or none), else <script dir>/../profiles/index.json,
else <script dir>/index.json.

Exit codes:
  0  pass: safe to stop the meter (do it yourself, with the user's go-ahead)
  2  usage or bad input (bad flags, unknown profile name)
  3  refused: every reason is listed; do not stop the meter or delete anything yet
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import evidence  # noqa: E402  (the node's manifest format; local side only)
import pull_verified as pv  # noqa: E402
import rgt_core as core  # noqa: E402

# The gate proves one run; a box that ran a queue or a sweep holds others the pull never listed.
SWEEP_HINT = ("  this gate covers run %s only: if the box ran other runs, first run on it "
              "`python3 ~/rgt-bin/final_sweep.py --runs-dir %s` (exit 0 = every run saved)")


def runs_dir_of(source):
    """DURABLE_DIR/runs on the node, read off a --source of the form [HOST:]DURABLE_DIR/results/RID."""
    _host, root = pv.parse_source(source)
    parent = os.path.dirname(root.rstrip("/"))
    if os.path.basename(parent) == "results":
        return pv.remote_quote(os.path.join(os.path.dirname(parent), "runs"))   # a leading ~/ stays expandable
    return "DURABLE_DIR/runs"
DEFAULT_LOAD_GLOBS = ("**/*.pt", "**/*.pth", "**/*.ckpt", "**/*.safetensors")


def run_dir_of(root):
    """DURABLE_DIR/runs/RID for a results root DURABLE_DIR/results/RID, else None."""
    parent, rid = os.path.split(root.rstrip("/"))
    if os.path.basename(parent) == "results" and rid:
        return os.path.join(os.path.dirname(parent), "runs", rid)
    return None


def run_activity(host, run_dir: str, rsh) -> dict:
    """rgt_core.run_activity for RUN_DIR on the node (the core streamed to `python3 -`, nothing written there),
    or here for a local run dir. Raises pv.FetchError when the node does not answer."""
    script = os.path.join(HERE, "node", "rgt_core.py")
    if host is None:
        argv, payload = [sys.executable, script, "--run-state", os.path.expanduser(run_dir)], None
    else:
        argv = pv.rsh_argv(rsh) + [host, "python3 - --run-state " + pv.remote_quote(run_dir)]
        payload = core.streamed_program(script, modules=())
    try:
        done = subprocess.run(argv, input=payload, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                              stdin=None if payload is not None else subprocess.DEVNULL)
        doc = json.loads(done.stdout.decode("utf-8", "replace"))
        if not isinstance(doc, dict) or "live" not in doc:
            raise ValueError("no answer")
        return doc
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise pv.FetchError(f"cannot tell whether run {run_dir} still runs on {host or 'this machine'} "
                            f"({getattr(exc, 'strerror', None) or exc})")


UsageError = core.UsageError


def generation_line(activity) -> str:
    """Which generation of the run's results the gate verified, and where earlier ones are kept on the node."""
    gen = (activity or {}).get("generation") or {}
    which = ("generation %s (the results of attempt %s)" % (gen["attempt"], gen["attempt"])
             if gen.get("attempt") else "the current results (no generation recorded: a run from an older toolkit)")
    kept = gen.get("kept") or []
    why = gen.get("why") if isinstance(gen.get("why"), dict) else {}
    named = ["%s (kept because %s)" % (d, why[d]) if why.get(d) else d for d in kept]
    return "verified %s%s" % (which, "; earlier generations kept on the node, NOT verified by this gate: "
                              + ", ".join(named) if kept else "")


def gate_profile(name: str):
    """(profile, index path), or (None, reason) when no index is found; an unknown name is a UsageError."""
    path = core.profile_index_path()
    if path is None:
        if os.environ.get("RGT_PROFILE_INDEX"):
            return None, f"RGT_PROFILE_INDEX={os.environ['RGT_PROFILE_INDEX']} is not a file"
        return None, "profiles/index.json not found (set RGT_PROFILE_INDEX or run tools/build_profile_index.py)"
    index = core.read_json(path)
    profiles = index.get("profiles") if isinstance(index, dict) else None
    if isinstance(profiles, dict) and name not in profiles:
        raise UsageError(f"unknown --profile {name!r}; known: {', '.join(sorted(profiles)) or 'none'}")
    try:
        return core.load_profile(name), path
    except UsageError as exc:  # a malformed index refuses the gate (exit 3); it is not the caller's typo
        return None, str(exc)


def meter_lines(name: str, profile: dict) -> list:
    billing = profile.get("billing") or {}
    lines = [f"meter stop ({profile.get('title', name)}): {billing.get('meter_stop_action')}",
             f"  that destroys: {billing.get('meter_stop_destroys')}"]
    pause = billing.get("pause_action")
    if pause:
        lines.append(f"  pause instead: {pause}")
        lines.append(f"  still billing while paused: {billing.get('keeps_billing_when_paused')}")
    else:
        lines.append("  pause instead: none on this platform")
        lines.append(f"  still billing: {billing.get('keeps_billing_when_paused')}")
    tiers = profile.get("storage") if isinstance(profile.get("storage"), list) else []
    survivors = [tier.get("tier") for tier in tiers if isinstance(tier, dict) and tier.get("survives_destroy")]
    if survivors:
        lines.append(f"  survives the meter stop (storage that survives can keep billing): "
                     f"{', '.join(map(str, survivors))}")
    if billing.get("auto_release"):
        lines.append(f"  clocks that delete or release on their own: {billing['auto_release']}")
    shutdown = billing.get("os_shutdown_stops_billing")
    shutdown_text = {True: "yes", False: "NO - use the action above"}.get(shutdown, "unknown - use the action above")
    lines.append(f"  does an OS shutdown stop billing? {shutdown_text}")
    lines.append(f"  (facts verified {profile.get('verified', 'unknown')}; profiles/{name}.md)")
    return lines


def rebuild_manifest(host, root: str, rsh, roster, run_id: str, allow_empty=(),
                     stall_seconds: float = pv.DEFAULT_STALL_SECONDS) -> bytes:
    """Recompute the node's manifest now, writing nothing there. Raises pv.FetchError, also when the node
    says nothing at all (no manifest byte, no progress line) for STALL_SECONDS."""
    script = os.path.join(HERE, "node", "build_pull_manifest.py")
    tail = ["--run-id", run_id, "--out", "-"]
    for pattern in roster:
        tail += ["--roster", pattern]
    for pattern in allow_empty:
        tail += ["--allow-empty", pattern]
    if host is None:
        argv = [sys.executable, script, "--root", os.path.expanduser(root)] + tail
        stdin = subprocess.DEVNULL
        payload = None
    else:
        remote = "python3 - --root " + pv.remote_quote(root) + " " + " ".join(shlex.quote(a) for a in tail)
        argv = pv.rsh_argv(rsh) + [host, remote]
        stdin = subprocess.PIPE
        payload = core.streamed_program(script)
    try:
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise pv.FetchError(f"cannot run {argv[0]!r}: {exc.strerror or exc}")
    errors = []
    guard = pv.StallGuard(proc, stall_seconds)   # the node prints a progress line every 15 s while it hashes

    def relay():  # the one reader of stderr: show the node's hashing progress, keep its FAIL lines
        for raw in proc.stderr:
            guard.moved(len(raw))
            line = raw.decode("utf-8", "replace")
            errors.append(line.strip())
            sys.stderr.write("node: " + line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    if payload is not None:  # `python3 -` reads the whole program before it prints anything
        try:
            proc.stdin.write(payload)
        except OSError:
            pass             # ssh died early: its exit code and stderr say why
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
    chunks = []
    while True:
        chunk = proc.stdout.read1(1 << 16)
        if not chunk:
            break
        guard.moved(len(chunk))
        chunks.append(chunk)
    out = b"".join(chunks)
    proc.wait()
    guard.stop()
    reader.join(10)          # stderr hits EOF once every holder of it has exited
    if guard.fired:
        raise pv.FetchError(f"the node stopped answering: no output for {stall_seconds:.0f} s while re-hashing "
                            f"{root} (a stalled link, node or disk there); nothing was decided, run the gate again")
    if proc.returncode != 0:
        fails = [e for e in errors if e.startswith("FAIL")] or errors[-2:] or [f"exit {proc.returncode}"]
        where = f"on {host}" if host else "locally"
        raise pv.FetchError(f"rebuilding the manifest {where} failed (exit {proc.returncode}): "
                            + " | ".join(fails[:5]))
    return out


def compare(pulled: dict, current: dict) -> list:
    reasons = []
    if pulled["run_id"] != current["run_id"]:
        reasons.append(pv.problem("run-id", current["run_id"], f"the node's manifest is for run {current['run_id']}, "
                                                               f"the pull is run {pulled['run_id']}"))
    have = {e["path"]: e for e in pulled["files"]}
    now = {e["path"]: e for e in current["files"]}
    for rel in sorted(set(have) & set(now)):
        if (have[rel]["size"], have[rel]["sha256"]) != (now[rel]["size"], now[rel]["sha256"]):
            reasons.append(pv.problem("stale", rel, "changed on the node since the pull (size or SHA-256 differ); "
                                                    "pull again"))
    for rel in sorted(set(now) - set(have)):
        reasons.append(pv.problem("stale", rel, "on the node but not in the pull; pull again"))
    for rel in sorted(set(have) - set(now)):
        reasons.append(pv.problem("stale", rel, "in the pull but no longer in the node's manifest"))
    return reasons


INSPECT = f"{shlex.quote(sys.executable)} {shlex.quote(os.path.join(HERE, 'node', 'ckpt_inspect.py'))} {{}}"


def run_load_checks(pulled_dir: str, manifest: dict, templates, globs, timeout: float, skip: set,
                    none_ok: bool = False):
    reasons, results = [], []
    compiled = [evidence.compile_pattern(evidence.check_pattern(g)) for g in globs]
    targets = [e["path"] for e in manifest["files"]
               if any(rx.fullmatch(c) for rx in compiled for c in evidence.ancestors_and_self(e["path"]))]
    if not targets and none_ok:  # --inspect alone: a pull without checkpoints has nothing to inspect
        return reasons, results
    if not targets:
        reasons.append(pv.problem("load-check", ",".join(globs), "no pulled file matches --load-glob, so the "
                                                                 "load-check would check nothing"))
        return reasons, results
    for template in templates:
        tokens = shlex.split(template)
        for rel in targets:
            if rel in skip:
                continue
            path = os.path.join(pulled_dir, rel)
            argv = [t.replace("{}", path) for t in tokens]
            if not any("{}" in t for t in tokens):
                argv.append(path)
            entry = {"path": rel, "argv": argv, "rc": None}
            try:
                done = subprocess.run(argv, cwd=pulled_dir, stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=timeout)
                entry["rc"] = done.returncode
                if done.returncode != 0:
                    last = (done.stderr.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:200]
                    reasons.append(pv.problem("load-check", rel, f"`{template}` exited {done.returncode}"
                                                                 + (f": {last}" if last else "")))
            except FileNotFoundError:
                reasons.append(pv.problem("load-check", rel, f"command not found: {tokens[0]!r}"))
            except OSError as exc:  # not executable, a directory, a name too long: the check did not run
                reasons.append(pv.problem("load-check", rel, f"cannot run {tokens[0]!r}: {exc.strerror or exc}"))
            except subprocess.TimeoutExpired:
                reasons.append(pv.problem("load-check", rel, f"`{template}` ran longer than {timeout:.0f} s"))
            results.append(entry)
    return reasons, results


def parse_args(argv):
    parser = core.Parser(
        prog="teardown_gate.py",
        description="Pass only when the pulled run matches the node's current manifest and re-verifies. "
                    "Never tears down.",
        formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--pulled", required=True, help="the promoted pull, DEST/<run_id>")
    parser.add_argument("--source", required=True, help="[HOST:]ROOT on the node, as given to pull_verified.py; "
                                                         "its files are re-hashed there now")
    parser.add_argument("--rsh", help='remote shell, e.g. "ssh -F cfg"')
    parser.add_argument("--profile", required=True, help="platform profile id (profiles/<id>.md)")
    parser.add_argument("--load-check", action="append", default=[], metavar="CMD",
                        help='command run per checkpoint, "{}" = its path (repeatable)')
    parser.add_argument("--inspect", action="store_true",
                        help="also run scripts/node/ckpt_inspect.py on every checkpoint (container and, with "
                             "torch, a weights-only load); no checkpoints in the pull is not a reason")
    parser.add_argument("--load-glob", action="append", metavar="GLOB",
                        help="which pulled files are checkpoints (repeatable; default *.pt *.pth *.ckpt "
                             "*.safetensors at any depth)")
    parser.add_argument("--load-timeout", type=float, default=900.0, help="seconds per load-check (default 900)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="parallel re-hash workers")
    parser.add_argument("--stall-seconds", type=core.arg_number(float, 0.0, 1e6, low_open=True),
                        default=pv.DEFAULT_STALL_SECONDS,
                        help="refuse when the node says nothing for this long while re-hashing (default %d)"
                             % pv.DEFAULT_STALL_SECONDS)
    parser.add_argument("--run-dir", help="the run's run dir on the same host, checked for a live attempt "
                                          "(default: DURABLE/runs/RID for a --source DURABLE/results/RID)")
    parser.add_argument("--json", action="store_true", help="print a JSON verdict on stdout")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    core.guard_output(getattr(args, "json", False))   # file names and reasons come from the node: finding_laptop_L10
    try:
        if not args.source.strip():
            raise UsageError("--source is empty")
        host, root = pv.parse_source(args.source)
        if args.rsh is not None:
            pv.rsh_argv(args.rsh)
        for template in args.load_check:
            if not shlex.split(template):
                raise UsageError("--load-check is empty")
        globs = args.load_glob or list(DEFAULT_LOAD_GLOBS)
        for pattern in globs:
            evidence.check_pattern(pattern)
        if args.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        if not 0 < args.load_timeout < 1e9:   # also nan and inf
            raise UsageError("--load-timeout must be > 0 and < 1e9 seconds")
        pulled = os.path.expanduser(args.pulled)
        if not os.path.isdir(pulled):
            raise UsageError(f"--pulled {args.pulled} is not a directory"
                             + ("" if os.path.exists(pulled) else " (it does not exist)"))
        profile, index_info = gate_profile(args.profile)
    except (UsageError, pv.UsageError, ValueError) as exc:
        print(f"teardown_gate: {exc}", file=sys.stderr)
        return 2

    pulled_dir = os.path.abspath(os.path.expanduser(args.pulled))
    reasons, verdict = [], {"ok": False, "verdict": "REFUSED", "pulled": pulled_dir, "teardown_performed": False,
                            "profile": args.profile}
    pulled_manifest = None
    try:
        with open(os.path.join(pulled_dir, pv.MANIFEST_NAME), "rb") as handle:
            pulled_raw = handle.read()
        with open(os.path.join(pulled_dir, pv.VERIFIED_NAME), "rb") as handle:
            marker = json.loads(handle.read().decode("utf-8"))
        pulled_manifest, bad = pv.parse_manifest(pulled_raw)
        if bad:
            pulled_manifest = None
            reasons.append(pv.problem("pulled", pv.MANIFEST_NAME,
                                      "the kept manifest is malformed: " + bad[0]["detail"]))
        elif not isinstance(marker, dict) or marker.get("manifest_sha256") != hashlib.sha256(pulled_raw).hexdigest():
            reasons.append(pv.problem("pulled", pv.VERIFIED_NAME, f"does not match the {pv.MANIFEST_NAME} kept beside "
                                                                  "it; pull again with pull_verified.py"))
    except (OSError, ValueError) as exc:
        reasons.append(pv.problem("pulled", pulled_dir, "not a verified pull (PULL_VERIFIED.json / PULL_MANIFEST.json "
                                                        f"unreadable: {getattr(exc, 'strerror', None) or exc}); "
                                                        "run pull_verified.py first"))

    run_dir = args.run_dir or run_dir_of(root)
    verdict["run_dir"] = run_dir
    if run_dir:   # a resumed attempt still running: the pull holds an earlier attempt's results, not the last
        try:
            activity = run_activity(host, run_dir, args.rsh)
            verdict["run_state"] = activity
            if activity["live"]:
                reasons.append(pv.problem("running", run_dir, "%s: the run is not over, so its results are not "
                                                              "final; wait for it to end (rgt.py status), pull "
                                                              "again, then gate" % activity["why"]))
        except pv.FetchError as exc:
            reasons.append(pv.problem("node", run_dir, str(exc)))
    if pulled_manifest is not None:
        verdict.update({"run_id": pulled_manifest["run_id"], "file_count": pulled_manifest["file_count"],
                        "total_bytes": pulled_manifest["total_bytes"]})
        mode = "re-hashed on the node now"
        try:
            current_raw = rebuild_manifest(host, root, args.rsh, pulled_manifest["roster"],
                                           pulled_manifest["run_id"], pulled_manifest.get("allow_empty", []),
                                           args.stall_seconds)
        except pv.FetchError as exc:
            reasons.append(pv.problem("node", args.source, str(exc)))
            current_raw = None
        if current_raw is not None:
            current, bad = pv.parse_manifest(current_raw)
            verdict["node_manifest"] = {"mode": mode, "sha256": hashlib.sha256(current_raw).hexdigest(),
                                        "same_bytes": current_raw == pulled_raw}
            if bad:
                reasons += [pv.problem("node", b["path"], "node manifest: " + b["detail"]) for b in bad]
            else:
                reasons += compare(pulled_manifest, current)

        local_problems, _ = pv.verify_tree(pulled_dir, pulled_manifest, args.jobs, skip_partial=False,
                                           label="re-verifying")
        for item in local_problems:
            item["detail"] = "local copy: " + item["detail"]
        reasons += local_problems
        templates = list(args.load_check) + ([INSPECT] if args.inspect else [])
        if templates:
            broken = {p["path"] for p in local_problems}
            load_reasons, verdict["load_checks"] = run_load_checks(pulled_dir, pulled_manifest, templates,
                                                                   globs, args.load_timeout, broken,
                                                                   none_ok=not args.load_check)
            reasons += load_reasons

    if profile is None:
        reasons.append(pv.problem("profile", args.profile, index_info))
    elif not isinstance(profile.get("billing"), dict) or not profile["billing"].get("meter_stop_action"):
        reasons.append(pv.problem("profile", args.profile, "profile has no billing.meter_stop_action"))

    never = "NOT TORN DOWN: this gate did NOT stop, delete or release anything."
    verdict["reasons"] = reasons
    if reasons:
        if args.json:
            print(json.dumps(verdict, indent=2))
        else:
            print(f"REFUSED teardown gate for {verdict.get('run_id', pulled_dir)}: {len(reasons)} reason(s)")
            for item in reasons[:pv.MAX_REPORTED]:
                print(f"REASON {item['code']}: {item['path']}: {item['detail']}")
            if len(reasons) > pv.MAX_REPORTED:
                print(f"REASON ... and {len(reasons) - pv.MAX_REPORTED} more (use --json)")
            print("Do not stop the meter or delete anything on the node yet: fix the reasons, pull again "
                  "(pull_verified.py), then re-run this gate.")
            print(never)
        return 3

    lines = meter_lines(args.profile, profile)
    verdict.update({"ok": True, "verdict": "PASS", "meter_stop": profile.get("billing"),
                    "profile_index": index_info, "other_runs": (SWEEP_HINT % (verdict["run_id"], runs_dir_of(args.source))).strip()})
    if args.json:
        print(json.dumps(verdict, indent=2))
        return 0
    checks = verdict.get("load_checks") or []
    node_mode = verdict["node_manifest"]["mode"]
    print(f"PASS teardown gate for run {verdict['run_id']}: {verdict['file_count']} files, "
          f"{verdict['total_bytes']} bytes ({pv.human(verdict['total_bytes'])}) in {pulled_dir}")
    print(f"  match the node's current files ({node_mode}) and re-verified locally"
          + (f"; {len(checks)} load-check(s) passed" if checks else ""))
    print("  " + generation_line(verdict.get("run_state")))
    for line in lines:
        print(line)
    print(SWEEP_HINT % (verdict["run_id"], runs_dir_of(args.source)))
    print(never + " Stopping the meter is yours to do, with the user's go-ahead.")
    return 0


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog='teardown_gate.py'))
