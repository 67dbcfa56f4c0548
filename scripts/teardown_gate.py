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
  5. no other generation of the run exists only on the node, unless --keep-generation N names the one this
     pull holds. A later attempt that did not continue an earlier one (resume --force-restart of a trainer with
     no resume adapter) leaves the earlier attempt's verified results in DURABLE/generations/RID/N, and a
     teardown destroys them; the untrained model of the restart must never pass alone. Pull a kept one with
     pull_verified.py --generation N (DEST/RID@generation-N, --source .../generations/RID/N here), or keep the
     current results with --keep-generation <their attempt>.
On a pass its first line ends with how the run ended (succeeded, or INTERRUPTED / FAILED, the attempt, the exit
code and the step its results stand at of the total, e.g. "results at step 2 of 6"), then the profile's meter-stop action, what that destroys and what keeps billing
(from profiles/index.json), the run id, file count and bytes, that it covers this run only (a box
that ran several runs needs scripts/node/final_sweep.py first), and that it did NOT tear anything down.
A pass leaves one file on the node, RUN_DIR/pulled.json (the pulled files' digest): the dead-man's
destructive gate takes it as the copy off the box that a terminate needs (node finding C1).

Usage:
  teardown_gate.py --pulled DEST/<run_id> --profile NAME
                   --source [HOST:]ROOT [--rsh "ssh -F cfg"]
                   [--load-check "CMD {}"]... [--inspect] [--load-glob GLOB]... [--load-timeout S] [--jobs N]
                   [--stall-seconds S] [--keep-generation N] [--verdict-file PATH] [--json]

  python3 teardown_gate.py --pulled ./pulled/run-42 --source gpu-box:/workspace/durable/results/run-42 \\
      --profile runpod --load-check "python3 check_ckpt.py {}"

The verdict is the gate's own: --verdict-file PATH gets it (JSON, atomically) before a word is printed, and
a stdout that closes early (`| head -1`) never changes the exit code.

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
import re
import shlex
import socket
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import destructive  # noqa: E402  (what the node's destructive gate accepts as a pull record)
import evidence  # noqa: E402  (the node's manifest format; local side only)
import pull_verified as pv  # noqa: E402
import rgt_core as core  # noqa: E402
import sync as node_sync  # noqa: E402  (where a run's kept generations live)

# The gate proves one run; a box that ran a queue or a sweep holds others the pull never listed.
SWEEP_HINT = ("  this gate covers run %s only: if the box ran other runs, first run on it "
              "`python3 ~/rgt-bin/final_sweep.py --runs-dir %s` (exit 0 = every run saved)")


# The run's place on the node, and whether it still runs there: pull_verified.py owns both (it asks too).
results_root, run_dir_of, run_activity = pv.results_root, pv.run_dir_of, pv.run_activity
run_state_program = pv.run_state_program


def runs_dir_of(source):
    """DURABLE_DIR/runs on the node, read off a --source of the form [HOST:]DURABLE_DIR/results/RID (or a kept
    generation of it)."""
    _host, root = pv.parse_source(source)
    parent = os.path.dirname(results_root(root).rstrip("/"))
    if os.path.basename(parent) == "results":
        return pv.remote_quote(os.path.join(os.path.dirname(parent), "runs"))   # a leading ~/ stays expandable
    return "DURABLE_DIR/runs"
DEFAULT_LOAD_GLOBS = ("**/*.pt", "**/*.pth", "**/*.ckpt", "**/*.safetensors")


UsageError = core.UsageError


def record_pull(host, run_dir, manifest: dict, rsh) -> dict:
    """After a pass, leave RUN_DIR/pulled.json on the node: the files this verified pull holds (one digest), which
    the dead-man's destructive gate accepts as a copy off the box (destructive.off_box_copy, finding C1). Best
    effort: {"ok", "path", "error"}; a plain `cat > tmp && mv` over ssh, so no Python runs there for it."""
    if not run_dir:
        return {"ok": False, "path": None, "error": "the run dir on the node is not known (give --run-dir)"}
    doc = {"files_digest": destructive.files_digest(manifest), "run_id": manifest.get("run_id"),
           "file_count": manifest.get("file_count"), "verified_at": core.utc_iso(),
           "by": "teardown_gate.py on %s" % core.printable(socket.gethostname())}
    target = os.path.join(run_dir, destructive.PULLED)
    try:
        if host is None:
            core.atomic_write_json(os.path.expanduser(target), doc)
        else:
            tmp = target + ".tmp"
            command = "umask 077 && cat > %s && mv -f %s %s" % (pv.remote_quote(tmp), pv.remote_quote(tmp),
                                                                pv.remote_quote(target))
            done = subprocess.run(pv.rsh_argv(rsh) + [host, command], input=json.dumps(doc).encode("utf-8"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            if done.returncode != 0:
                raise OSError(done.stderr.decode("utf-8", "replace").strip()[-200:] or "rc %d" % done.returncode)
    except (OSError, subprocess.TimeoutExpired, core.UsageError) as exc:
        return {"ok": False, "path": target, "error": core.printable(str(getattr(exc, "strerror", None) or exc))}
    return {"ok": True, "path": target, "error": None}


def generations(activity, root) -> dict:
    """Which generation of the run this pull holds and which others exist only on the node.

    -> {"pulled": N or None (unknown: a run from an older toolkit), "current": the generation in the results dir,
    "kept": {N: dir} (earlier generations the node keeps), "why": {dir: why kept}, "others": [N...] (every
    generation but the pulled one: the current results too when a kept generation was pulled)}."""
    gen = (activity or {}).get("generation") or {}
    current = gen.get("attempt") if isinstance(gen.get("attempt"), int) else None
    kept = {}
    for folder in gen.get("kept") or []:
        name = os.path.basename(str(folder).rstrip("/"))
        if name.isdigit():
            kept[int(name)] = str(folder)
    mine = node_sync.generation_of(root)
    pulled = mine[1] if mine else current
    others = set(kept) | ({current} if current is not None else set())
    others.discard(pulled)
    why = gen.get("why") if isinstance(gen.get("why"), dict) else {}
    return {"pulled": pulled, "current": current, "kept": kept, "why": why, "others": sorted(others)}


def generation_text(gens, number) -> str:
    """'generation 1 (attempt 1's verified results, kept in DIR because WHY)' for one generation of GENS."""
    if number == gens["current"]:
        return "generation %d (the current results, attempt %d's)" % (number, number)
    folder = gens["kept"].get(number)
    why = gens["why"].get(folder) if folder else None
    return "generation %d (attempt %d's verified results, kept in %s%s)" % (
        number, number, folder, " because " + str(why) if why else "")


def generation_reasons(gens, keep, run_id, host) -> list:
    """Refuse while another generation exists only on the node, unless KEEP names the one this pull holds."""
    where = "rgt.py pull %s %s --generation N" % (host or "HOST", run_id)
    pulled = gens["pulled"]
    if keep is not None and pulled is not None and keep != pulled:
        return [pv.problem("generation", "generation %d" % keep, (
            "--keep-generation %d, but this pull holds generation %d: pull generation %d home (%s, or "
            "pull_verified.py --generation %d) and gate that pull" % (keep, pulled, keep, where.replace(
                "N", str(keep)), keep)))]
    if keep is not None and pulled is None and keep in gens["kept"]:
        return [pv.problem("generation", "generation %d" % keep, (
            "--keep-generation %d, but this pull holds the current results: pull generation %d home (%s) and "
            "gate that pull" % (keep, keep, where.replace("N", str(keep)))))]
    if keep is None and gens["others"]:
        held = "generation %d" % pulled if pulled is not None else "the current results"
        return [pv.problem("generation", ", ".join("generation %d" % n for n in gens["others"]), (
            "%s exist%s only on the node, and a teardown destroys %s; this pull holds %s. Say which generation "
            "to keep: pull another one home (%s, or pull_verified.py --generation N) and gate that pull with "
            "--keep-generation N, or keep this one: --keep-generation %s" % (
                "; ".join(generation_text(gens, n) for n in gens["others"]),
                "s" if len(gens["others"]) == 1 else "", "it" if len(gens["others"]) == 1 else "them", held,
                where, pulled if pulled is not None else "N")))]
    return []


def generation_line(gens, keep) -> str:
    """Which generation of the run's results the gate verified, and what a teardown destroys on the node."""
    pulled = gens["pulled"]
    which = ("generation %d (the results of attempt %d)" % (pulled, pulled) if pulled is not None
             else "the current results (no generation recorded: a run from an older toolkit)")
    if keep is not None:
        which += ", the one you chose to keep (--keep-generation %d)" % keep
    if not gens["others"]:
        return "verified " + which
    return ("verified %s; NOT pulled, on the node only, DESTROYED by a teardown: %s" % (
        which, "; ".join(generation_text(gens, n) for n in gens["others"])))


def number_text(value) -> str:
    return "%d" % value if value == int(value) else "%g" % value


STATE_WORD = re.compile(r"^[a-z_]{1,24}$")   # a state as the run record spells it; anything else reads "unknown"


def run_state_text(activity) -> str:
    """The run's state for the PASS line: 'run interrupted (attempt 2, exit 143), results at step 2 of 6'."""
    if not activity or activity.get("state") is None:
        return "run state not known: %s" % ((activity or {}).get("why") or "no run dir to check (--run-dir)")
    state = activity["state"] if STATE_WORD.match(str(activity["state"])) else "unknown"
    bits = [b for b in (
        "attempt %s" % activity["attempt"] if isinstance(activity.get("attempt"), int) else None,
        "exit %s" % activity["exit_code"] if isinstance(activity.get("exit_code"), int) else None) if b]
    text = "run %s%s" % (state.upper() if state != "succeeded" else state, " (%s)" % ", ".join(bits) if bits else "")
    step, total = activity.get("results_step"), activity.get("total_steps")
    if isinstance(step, (int, float)):
        text += ", results at step %s%s" % (number_text(step), " of %s" % number_text(total)
                                            if isinstance(total, (int, float)) and total else "")
    return text


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
    parser.add_argument("--keep-generation", type=core.arg_number(int, 1, 1 << 30), metavar="N",
                        help="the generation of the run you keep (its attempt number). Needed when the node holds "
                             "more than one: a --force-restart without a resume adapter keeps the earlier "
                             "attempt's results as DURABLE/generations/RID/N. Without it the gate refuses while "
                             "any generation other than the pulled one exists only on the node; with it, N must be "
                             "the generation this pull holds (pull_verified.py --generation N for a kept one), and "
                             "the PASS names the generations a teardown destroys")
    parser.add_argument("--verdict-file", metavar="PATH",
                        help="also write the JSON verdict to PATH (atomically) before anything is printed, so a "
                             "caller records the gate's own verdict even when stdout closes early (rgt.py gate)")
    parser.add_argument("--json", action="store_true", help="print a JSON verdict on stdout")
    return parser.parse_args(argv)


def deliver(args, verdict: dict, lines, code: int) -> int:
    """Record the verdict (--verdict-file) first, then print it. A stdout closed early (`| head -1`) loses only
    the words: the verdict and the exit code stay the gate's own."""
    if args.verdict_file:
        try:
            core.atomic_write_json(args.verdict_file, dict(verdict, exit_code=code))
        except OSError as exc:
            core.say_error("cannot write --verdict-file %s: %s" % (args.verdict_file, exc.strerror or exc),
                           "teardown_gate.py")
    core.write_stdout(json.dumps(verdict, indent=2) + "\n" if args.json else "".join(line + "\n" for line in lines))
    return code


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
    activity = None
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
    gens = generations(activity, root)
    verdict["generations"] = {"pulled": gens["pulled"], "current": gens["current"], "keep": args.keep_generation,
                              "only_on_node": {str(n): gens["kept"].get(n, "the results dir") for n in gens["others"]}}
    if activity is not None or args.keep_generation is not None:
        rid = pulled_manifest["run_id"] if pulled_manifest is not None else os.path.basename(pulled_dir)
        reasons += generation_reasons(gens, args.keep_generation, rid, host)
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
        lines = [f"REFUSED teardown gate for {verdict.get('run_id', pulled_dir)}: {len(reasons)} reason(s)"]
        for item in reasons[:pv.MAX_REPORTED]:
            lines.append(f"REASON {item['code']}: {item['path']}: {item['detail']}")
        if len(reasons) > pv.MAX_REPORTED:
            lines.append(f"REASON ... and {len(reasons) - pv.MAX_REPORTED} more (use --json)")
        lines.append("Do not stop the meter or delete anything on the node yet: fix the reasons, pull again "
                     "(pull_verified.py), then re-run this gate.")
        lines.append(never)
        return deliver(args, verdict, lines, 3)

    state = run_state_text(activity)
    verdict["pull_recorded"] = record_pull(host, run_dir, pulled_manifest, args.rsh)
    verdict.update({"ok": True, "verdict": "PASS", "meter_stop": profile.get("billing"), "state_text": state,
                    "profile_index": index_info, "other_runs": (SWEEP_HINT % (verdict["run_id"], runs_dir_of(args.source))).strip()})
    checks = verdict.get("load_checks") or []
    node_mode = verdict["node_manifest"]["mode"]
    lines = [f"PASS teardown gate for run {verdict['run_id']}: {verdict['file_count']} files, "
             f"{verdict['total_bytes']} bytes ({pv.human(verdict['total_bytes'])}) in {pulled_dir}; {state}",
             f"  match the node's current files ({node_mode}) and re-verified locally"
             + (f"; {len(checks)} load-check(s) passed" if checks else "")]
    if activity and activity.get("state") not in (None, "succeeded"):
        lines.append("  WARN the run did not succeed (%s): these are the results it had saved when it stopped, "
                     "not a finished training; resume it before tearing down if it should go on" % state)
    lines.append("  " + generation_line(gens, args.keep_generation))
    recorded = verdict["pull_recorded"]
    lines.append("  pull recorded on the node (%s): a destructive stop may now erase the box's copy" % recorded["path"]
                 if recorded.get("ok") else "  NOTE the pull is not recorded on the node (%s): its dead-man still "
                 "refuses a terminate unless the results sit on persistent storage" % recorded.get("error"))
    lines += meter_lines(args.profile, profile)
    lines.append(SWEEP_HINT % (verdict["run_id"], runs_dir_of(args.source)))
    lines.append(never + " Stopping the meter is yours to do, with the user's go-ahead.")
    return deliver(args, verdict, lines, 0)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog='teardown_gate.py'))
