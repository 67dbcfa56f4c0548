#!/usr/bin/env python3
"""final_sweep.py: before release, every run's outputs are on durable storage and verify, or are named unsaved.

A box that ran a queue or an ablation holds many run dirs. Some synced, some crashed before their
sync, some wrote more after it, some filled the disk. Releasing the box destroys whatever is only on
it. For each run dir under --runs-dir (DURABLE_DIR/runs), in order:
  1. a run whose job, supervisor or launcher is still alive (or a resume is starting it) is not touched:
     RUNNING (the box is not ready);
  2. the durable copy is checked: its PULL_MANIFEST.json parses and every file in it re-hashes;
  3. the job's current outputs (the output globs in run.json, in the job's cwd) that the run's own attempts
     wrote (files.json; for an attempt that died unrecorded, changed while it ran) are compared with it;
     other files the globs match are left alone (a note):
     a file that is new, changed (size, then SHA-256) or missing from the durable copy makes it stale.
     A file changed after the run's own sync read its outputs may be another writer's (a later run in
     the same cwd, as in any queue or ablation): with the same bytes in another run's durable copy it
     is left alone (a note); changed and saved nowhere, it is a CONFLICT: no sync runs, because it
     would replace the verified copy;
  4. a missing, damaged or stale copy is synced again (the run's own end-of-run sync, sync.py
     in its own-files mode: only files the run's own attempts recorded in its files.json, never another run's
     files from a shared working dir; copies hashed while copying, a damaged checkpoint never replaces a
     good copy), then checked again. --check-only reports instead of syncing.
  5. a run the user acknowledges with --ack RID (one that produced nothing: it crashed before its first save,
     or its output globs match nothing) that still cannot be saved is ACKED instead of FAILED: its record and
     logs are synced alone (sync.py --logs-only: the crash log, under a manifest of their own, so `rgt.py pull`
     and the gate take them like any results), and it no longer blocks the sweep. An ack never applies to a run
     that is RUNNING or in CONFLICT, and a run that can be saved is saved (SYNCED), ack or not.
The sweep writes nothing but what the run's own sync writes, and a run that died with the box is marked failed
through the run record (runrec.fail_if_dead, under its lock); it never deletes anything.

Usage:
  final_sweep.py --runs-dir DIR [--runs-dir DIR]... [--check-only] [--ack RID]... [--jobs N] [--json]

Output: one line per run (OK, SYNCED, SAVED, ACKED, RUNNING, STALE, CONFLICT, FAILED) with the run's own state and
exit code, and a verdict; OK only for a run that succeeded, SAVED for one whose outputs verify on
durable storage but that crashed, was interrupted or failed its own sync. Or --json:
{"ok", "runs": [{"run_id", "run_dir", "verdict", "state", "exit_code", "results_dir", "file_count", "problems",
"left_alone"}]}.

Exit codes: 0 every run's outputs are on durable storage and verify, or were acknowledged with --ack (safe to
release, as far as the runs go: still pull and gate what you need); 1 at least one run is RUNNING, in CONFLICT, could not be
synced or still fails verification (each listed); 2 usage; 4 --check-only found runs that need a sync (work to do, not a
refusal).
"""
import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import evidence  # noqa: E402
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402
from sync import plan_outputs  # noqa: E402

PROG = "final_sweep.py"
NEEDS_SYNC = 4   # --check-only found work to do: a finding, not a refusal (review D9)


def run_dirs(roots):
    for root in roots:
        for name in sorted(os.listdir(root)):
            path = os.path.join(os.path.abspath(root), name)
            if os.path.isdir(path) and (os.path.exists(os.path.join(path, "status.json"))
                                        or os.path.exists(os.path.join(path, "run.json"))):
                yield path


def alive(status, run_dir):
    """An active run one of whose processes lives (runrec.activity: a launch still starting counts)."""
    return status.get("state") in runrec.ACTIVE and bool(runrec.activity(status, run_dir)["any"])


def durable_problems(results, jobs):
    """(manifest or None, problems) for the durable copy in RESULTS."""
    path = os.path.join(results, evidence.MANIFEST_NAME)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        return None, ["no durable manifest (%s)" % (exc.strerror or exc)]
    manifest, bad = evidence.parse_manifest(raw)
    if bad:
        return None, ["durable manifest malformed: %s" % bad[0]["detail"]]
    found, _ = evidence.verify_tree(results, manifest, jobs, skip_partial=True, label="sweep", progress=False)
    return manifest, ["durable %s: %s" % (p["path"], p["code"]) for p in found]


def synced_at(status):
    """When the run's last sync started reading its outputs (epoch seconds), or None: a run whose current
    attempt never synced (it died) owns whatever its outputs hold now."""
    sync = status.get("sync") if isinstance(status.get("sync"), dict) else {}
    epoch = sync.get("started_epoch")
    if isinstance(epoch, (int, float)) and not isinstance(epoch, bool):
        return float(epoch)
    started = core.parse_iso(sync.get("started_at"))
    return started + 2.0 if started is not None else None  # whole seconds only: two of slack


def saved_elsewhere(run_dirs_list):
    """{sha256: run id} over the durable manifests of every run dir (as recorded, not re-hashed here:
    each run's own check re-hashes its copy)."""
    index = {}
    for run_dir in run_dirs_list:
        run = core.read_json(os.path.join(run_dir, "run.json"))
        results = runrec.results_dir(run_dir, run)
        doc = core.read_json(os.path.join(results, evidence.MANIFEST_NAME))
        for entry in doc.get("files") or []:
            if isinstance(entry, dict) and isinstance(entry.get("sha256"), str):
                index.setdefault(entry["sha256"], run.get("run_id") or os.path.basename(run_dir))
    return index


def stale_outputs(run, status, manifest, notes, elsewhere):
    """(stale, conflicts) for the outputs in the job's cwd against the verified durable copy.

    stale: files the copy lacks or holds in another version (a sync fixes them). A file changed after
    the run's sync read its outputs may be another writer's (a later run in the same cwd, as in any
    queue or ablation): when another run's durable copy holds the same bytes it is left alone (NOTES);
    a new one is still saved; a changed one that is saved nowhere is a conflict: a sync would replace
    the verified copy with it, so nothing is synced and the run is reported."""
    cwd, outputs = run.get("cwd"), run.get("outputs") or []
    if not outputs or not cwd or not os.path.isdir(cwd):
        return [], []
    plan, _errors = plan_outputs(cwd, outputs)
    held = {e["path"]: e for e in manifest["files"]}
    cutoff = synced_at(status)
    own = run.get("run_id")
    stale, conflicts = [], []
    run_dir = run.get("run_dir") or ""
    mine, others = runrec.recorded(run_dir), runrec.other_owners(run_dir)
    windows = runrec.unrecorded_windows(run_dir)
    for rel, source in sorted(plan.items()):
        entry = held.get(rel)
        who, which = runrec.owner_of(run_dir, source, mine, others, windows)
        own_path = os.path.realpath(source) in {key[0] for key in mine}
        if who != "self" and not (who is None and own_path):   # never another run's file, nor a new one (R4)
            notes.append("%s: left alone: %s" % (rel, "written by run %s" % which if who == "other" else
                                                 "no attempt of this run wrote it (it changed after the run "
                                                 "ended, or predates it)"))
            continue
        try:
            info = os.stat(source)
            if entry is not None and info.st_size == entry["size"] and core.sha256_file(source)[1] == entry["sha256"]:
                continue
            if cutoff is not None and info.st_mtime > cutoff:
                other = elsewhere().get(core.sha256_file(source)[1])
                if other and other != own:
                    notes.append("%s: changed after this run's sync; the same bytes are in run %s's durable copy, "
                                 "so this run's verified copy stays" % (rel, other))
                elif entry is not None:
                    conflicts.append("%s: changed after this run's sync and saved nowhere; a sync would replace "
                                     "the verified copy, so none ran (copy the file aside if it is needed)" % rel)
                else:
                    stale.append("%s: not on durable storage" % rel)
            elif entry is None:
                stale.append("%s: not on durable storage" % rel)
            else:
                stale.append("%s: changed since the sync" % rel)
        except (OSError, ValueError) as exc:
            stale.append("%s: unreadable (%s)" % (rel, getattr(exc, "strerror", None) or exc))
    return stale, conflicts


def check(run_dir, args, notes=None):
    """-> (run, status, results, manifest, problems that a sync could fix, conflicts no sync may touch)."""
    run = core.read_json(os.path.join(run_dir, "run.json"))
    status = core.read_json(os.path.join(run_dir, "status.json"))
    results = runrec.results_dir(run_dir, run)
    manifest, problems = durable_problems(results, args.jobs)
    conflicts = []
    if manifest is not None and not problems:
        problems, conflicts = stale_outputs(run, status, manifest, [] if notes is None else notes, args.elsewhere)
    return run, status, results, manifest, problems, conflicts


def sweep_one(run_dir, args):
    notes = []
    run, status, results, manifest, problems, conflicts = check(run_dir, args, notes)
    item = {"run_id": run.get("run_id") or status.get("run_id") or os.path.basename(run_dir), "run_dir": run_dir,
            "results_dir": results, "state": status.get("state"), "exit_code": status.get("exit_code"),
            "file_count": None, "problems": problems,
            "left_alone": notes}
    if conflicts and not alive(status, run_dir):
        item.update(verdict="CONFLICT", problems=conflicts + problems)
        return item
    if alive(status, run_dir):
        return running(item, status)
    if not problems:
        item.update(verdict="OK", file_count=manifest["file_count"])
        if isinstance(status.get("sync"), dict) and status["sync"].get("logs_only"):
            notes.append("only its record and logs are saved: it was acknowledged (--ack) as a run that produced "
                         "nothing")
        return item
    if args.check_only:
        item["verdict"] = "STALE"
        return item
    if not run:
        item.update(verdict="FAILED", problems=problems + ["no run.json: nothing says what to sync"])
        return item
    # an active run with nothing of it alive died with the box: the run record marks it failed, under its lock,
    # unless a process of it came alive meanwhile (finding D1)
    why = "found dead by final_sweep.py (state was %s); outputs synced as they were" % status.get("state")
    _marked, live, _problem = runrec.fail_if_dead(run_dir, why)
    if live:
        return running(item, status)
    res = core.run_bounded([sys.executable, os.path.join(HERE, "sync.py"), "--run-dir", run_dir,
                            "--own-only"], args.sync_timeout)
    _run, _status, results, manifest, after, _conflicts = check(run_dir, args)
    if res.rc == 0 and not after:
        item.update(verdict="SYNCED", file_count=manifest["file_count"], problems=[], fixed=problems)
    else:
        why = res.output.strip().splitlines()[-1:] or ["sync exit %s" % res.rc]
        item.update(verdict="FAILED", problems=after + ["sync: " + why[0][:300]])
        if item["run_id"] in args.ack:
            acknowledge(item, run_dir, args)
    return item


def running(item, status):
    item.update(verdict="RUNNING", problems=["still %s: wait for it, or stop it, before releasing the box"
                                             % status.get("state")])
    return item


def acknowledge(item, run_dir, args):
    """--ack RID for a run whose outputs cannot be saved: its record and logs are synced alone (sync.py
    --logs-only) so its crash log can be pulled, and it reads ACKED, not FAILED."""
    given_up = item["problems"]
    res = core.run_bounded([sys.executable, os.path.join(HERE, "sync.py"), "--run-dir", run_dir, "--logs-only"],
                           args.sync_timeout)
    _run, _status, results, manifest, after, _conflicts = check(run_dir, args)
    if res.rc == 0 and not after:
        logs = "its record and logs are on durable storage (%d files in %s): pull them like any results" % (
            manifest["file_count"], results)
        item["file_count"] = manifest["file_count"]
    else:
        why = res.output.strip().splitlines()[-1:] or ["sync exit %s" % res.rc]
        logs = "its logs could not be saved either (%s): read them on the box before releasing it" % why[0][:200]
    item.update(verdict="ACKED", acked=True, given_up=given_up,
                problems=["acknowledged with --ack: its outputs are NOT saved (%s); %s" % (
                    "; ".join(given_up[:2]), logs)])


def state_text(item):
    """The run's real state for the text line: 'state failed, exit 139'."""
    code = item.get("exit_code")
    return "state %s%s" % (item.get("state") or "unknown", "" if code is None else ", exit %s" % code)


def text_word(item):
    """OK only for a run that succeeded and whose outputs verify; a run that crashed, was interrupted or never
    synced but whose outputs are now safe reads SAVED (its evidence is durable, its run did not succeed)."""
    if item["verdict"] == "OK" and item.get("state") != "succeeded":
        return "SAVED"
    return item["verdict"]


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog=PROG, description="Before release: every run's outputs on durable storage, verified.",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--runs-dir", action="append", required=True, help="a runs dir (DURABLE_DIR/runs)")
    parser.add_argument("--check-only", action="store_true", help="report what needs a sync; sync nothing")
    parser.add_argument("--ack", action="append", default=[], metavar="RID",
                        help="acknowledge that run RID produced nothing worth saving: when its outputs cannot be "
                             "saved it reads ACKED (its record and logs synced alone, so they can be pulled) and "
                             "no longer blocks the sweep (repeatable)")
    parser.add_argument("--jobs", type=core.arg_number(int, 1, 257), default=4, help="parallel hashing (4)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    core.guard_output(getattr(args, "json", False))   # run ids and reasons come from the runs: finding_laptop_L10
    args.sync_timeout = 6 * 3600.0
    for root in args.runs_dir:
        if not os.path.isdir(root):
            raise core.UsageError("--runs-dir %s is not a directory" % root)
    dirs = list(run_dirs(args.runs_dir))
    known = {core.read_json(os.path.join(d, "run.json")).get("run_id") or os.path.basename(d) for d in dirs}
    for rid in args.ack:
        if rid not in known:
            raise core.UsageError("--ack %s: no run %s under %s" % (rid, rid, ", ".join(args.runs_dir)))
    args.elsewhere = functools.lru_cache(maxsize=None)(lambda: saved_elsewhere(dirs))  # built once, if needed
    items = [sweep_one(d, args) for d in dirs]
    bad = [i for i in items if i["verdict"] in ("RUNNING", "FAILED", "CONFLICT")]
    stale = [i for i in items if i["verdict"] == "STALE"]
    ok = not bad and not stale
    if args.json:
        core.emit_json({"ok": ok, "runs": items})
    else:
        for i in items:
            detail = "; ".join(i["problems"][:3]) if i["problems"] else "%s files verified" % i["file_count"]
            print("%-8s %s (%s): %s" % (text_word(i), i["run_id"], state_text(i), detail))
            for note in i["left_alone"][:5]:
                print("         note: %s" % note)
        if not items:
            print("%s no run dirs under %s" % (core.OK, ", ".join(args.runs_dir)))
        elif ok:
            print("%s every run's outputs are on durable storage and verify (%d runs)" % (core.OK, len(items)))
        else:
            print("%s do not release the box yet: %d run(s) %s" % (
                core.FAIL, len(bad) + len(stale), "need a sync (run without --check-only)" if not bad else
                "are running or could not be saved"))
    return 1 if bad else NEEDS_SYNC if stale else 0


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
