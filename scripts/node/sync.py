#!/usr/bin/env python3
"""sync.py: the durable sync, the one copy of a run's outputs to its results dir (the one evidence format).

The supervisor runs it when the job's process group is gone; final_sweep.py and a person run it again for a
finished run (after freeing disk, say). Python 3.8+, standard library only.

What it copies: the launch's output globs (relative to the job's cwd; * and ** match dotfiles), the run's record
(run.json, env.json, code.patch, at the top, unless an output has that name) and its logs (job.log,
supervisor.log, deadman.log -> logs/), so a pulled copy serves repro.py and run_forensics.py as a run dir.
Each copy is hashed while it is copied, fsynced and content-checked before it replaces anything. A source that
changes during its copy, a zero-byte file (unless an allow-empty glob of the launch covers it) or a damaged checkpoint never
replaces the previous durable copy: the old one stays and status.json sync.kept_previous says so. A later
attempt that did not continue the earlier one never replaces its verified results: they are kept whole under
DURABLE/generations/RID/<attempt>/ (sync.kept_generation). It did not continue it when it had no resume adapter,
found no checkpoint, or resumed at a step below the one the results stand at from a checkpoint that is not this
run's newest (a resume from the newest one continues the run, unless the trainer started at step 0 or 1:
then it ignored its resume argument). Each sync records that step
(sync.step, generation.json: this attempt's heartbeat.json, else its last job.log line the launch's progress
regex matches); the attempt's first step (its supervisor's first look at heartbeat.json, else its first
progress regex line) is compared with it; unknown steps count a resume as continuing (sync.continuity says
which). Then PULL_MANIFEST.json is built over the results
dir (evidence.build_manifest; roster = the outputs + the record + logs/**), which re-reads every copy. A full
disk ends in sync_failed with the error recorded (a small reserve file in the run dir is given up so the final
status can still be written).

Usage:
  sync.py --run-dir D [--own-only] [--logs-only]
      sync a finished run again; 0 ok, 1 failed, 2 usage, 3 refused (its supervisor is alive: it syncs by
      itself at the end); with --own-only (final_sweep.py) only files this run's attempts recorded in
      files.json are copied; with --logs-only (final_sweep.py --ack) only the record and logs, under a manifest
      of their own (sync.logs_only), and the run's state stays what it was

Exit codes: 0 ok, 1 the sync failed, 2 usage, 3 refused.
"""
import errno
import hashlib
import os
import shutil
import stat
import sys
import time

import rgt_core as core
import runrec
import evidence
import progress

PROG = "sync.py"
RUN = "run.json"
PART_SUFFIX = ".rgt-part"
TERMINAL = runrec.TERMINAL
LOG_NAMES = ("job.log", "supervisor.log", "deadman.log")
LOGS_ROSTER = "logs/**"
# The run's own record, beside the outputs at the top of the results dir, so a pulled copy is a run dir for
# repro.py and run_forensics.py: the launch (run.json), the environment (env.json), uncommitted code (code.patch).
RECORD_NAMES = ("run.json", "env.json", "code.patch")
RUN_ENV_WAIT_SECONDS = 120  # run_env's own probes time out at 60 s each; it normally takes a fraction of a second
GLOB_CHARS = "*?["
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
PROGRESS_SECONDS = 30.0
HEARTBEAT = "heartbeat.json"
MTIME_SLACK = 0.05   # a file written just after the job started may carry an mtime a clock tick before it
PROGRESS_SOURCE = "job.log (--progress-regex)"

set_status = runrec.set_status
run_path, say, read_status = runrec.path, core.say, runrec.status   # one copy each (runrec, rgt_core)
unlink_quiet = core.unlink_quiet


def split_literal(pattern):
    """'out/sub/*.bin' -> (['out', 'sub'], ['*.bin']): the components before the first glob character."""
    parts = pattern.split("/")
    index = 0
    while index < len(parts) and not any(ch in parts[index] for ch in GLOB_CHARS):
        index += 1
    return parts[:index], parts[index:]


def plan_outputs(cwd, patterns):
    """Select the --output globs under CWD with evidence's roster rules -> (plan {rel: source}, errors).

    Each glob is walked from its literal leading directories (a checkpoint dir that is a symlink
    to the data disk is followed, a huge cwd is not walked for 'ckpt/*'). A symlink to a regular
    file is copied as that file; a dangling symlink, a FIFO, a device or an unreadable entry that
    a glob matches is an error, as is a glob that matches nothing."""
    groups = {}
    for pattern in patterns:
        literal, rest = split_literal(pattern)
        if not rest and os.path.isdir(os.path.join(cwd, *literal)):
            prefix, sub = literal, "**"
        elif not rest:
            prefix, sub = literal[:-1], literal[-1]
        else:
            prefix, sub = literal, "/".join(rest)
        groups.setdefault("/".join(prefix), []).append((pattern, sub))
    plan, errors = {}, []
    for prefix, members in sorted(groups.items()):
        base = os.path.join(cwd, *prefix.split("/")) if prefix else cwd
        subs = sorted({sub for _p, sub in members})
        if not os.path.isdir(base):
            chosen, problems, unmatched = {}, [], subs
        else:
            root = os.path.realpath(base)
            chosen, problems, _notes, unmatched = evidence.select(root, subs, set())

        def full(rel):
            return "%s/%s" % (prefix, rel) if prefix else rel

        for rel, real in chosen.items():
            plan[full(rel)] = real
        for prob in problems:
            rel = prob["path"]
            if prob["code"] == "unmatched":
                continue
            if prob["code"] == "escape":  # a link to a file elsewhere: copying it makes a real, durable file
                target = os.path.realpath(os.path.join(base, rel))
                try:
                    mode = os.stat(target).st_mode
                except OSError as exc:
                    errors.append("%s: dangling symlink: its target %s is missing or unreadable (%s)"
                                  % (full(rel), target, exc.strerror or exc))
                    continue
                if stat.S_ISREG(mode):
                    plan[full(rel)] = target
                else:
                    errors.append("%s: a symlink to %s, which is not a regular file; name its files instead"
                                  % (full(rel), target))
                continue
            errors.append("%s: %s" % (core.printable(full(rel)), prob["detail"]))
        for pattern, sub in members:
            if sub in unmatched:
                errors.append("--output %s matched nothing (relative to %s)" % (pattern, cwd))
    for rel in sorted(plan):
        if os.path.basename(plan[rel]) == runrec.RAW_ARGV:   # the unscrubbed launch never leaves the run dir
            del plan[rel]
            continue
        why = evidence.path_problem(rel)
        if why:
            errors.append("%s: cannot be synced: %s" % (core.printable(rel), why))
            del plan[rel]
    return plan, errors


def copy_file(src, tmp, on_bytes=None):
    """Copy SRC to TMP while hashing it (core.sha256_file), fsync the copy, drop its cached pages.

    Returns (size, sha256). Raises ValueError when SRC changed while it was copied (size or
    mtime moved: something still writes it), OSError when a read or write fails."""
    fout = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        def write_all(chunk):
            done = 0
            while done < len(chunk):
                done += os.write(fout, chunk[done:])

        size, digest = core.sha256_file(src, on_bytes=on_bytes, sink=write_all)
        os.fsync(fout)
        if hasattr(os, "posix_fadvise"):  # the manifest's re-read then reads the storage, not the cache
            try:
                os.posix_fadvise(fout, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
    finally:
        os.close(fout)
    st = os.stat(src)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(tmp, stat.S_IMODE(st.st_mode) & 0o777)
    return size, digest


def heartbeat_step(run_dir, since):
    """The step in heartbeat.json when this attempt wrote it (changed at or after SINCE, its job's start),
    else None: the file an earlier attempt left behind is not this attempt's progress."""
    path = run_path(run_dir, HEARTBEAT)
    ident = runrec.identity(path)
    if ident is None or progress.num(since) is None or ident[1] / 1e9 < since - MTIME_SLACK:
        return None
    step = progress.num(core.read_json(path).get("step"))
    return int(step) if step is not None and step >= 0 else None


def attempt_steps(run_dir, meta, status):
    """Where this attempt's progress started and where it stands -> (first, last), each {"step", "source"} or
    None when unknown. First: the step its supervisor saw first in heartbeat.json (status.json first_step),
    else its first --progress-regex line in job.log. Last: heartbeat.json as this attempt left it, else its
    last --progress-regex line. The same readers as run_status.py (progress.py)."""
    first = status.get("first_step") if isinstance(status.get("first_step"), dict) else None
    if first is not None and progress.num(first.get("step")) is None:
        first = None
    last = None
    step = heartbeat_step(run_dir, status.get("job_started_epoch"))
    if step is not None:
        last = {"step": step, "source": HEARTBEAT}
    pattern = meta.get("progress_regex")
    if pattern and (first is None or last is None):
        low, high = progress.attempt_steps(run_path(run_dir, "job.log"), pattern)
        if first is None and low is not None:
            first = {"step": low, "source": PROGRESS_SOURCE}
        if last is None and high is not None:
            last = {"step": high, "source": PROGRESS_SOURCE}
    return first, last


def generations_dir(results):
    """Where the earlier generations of the run whose results dir is RESULTS are kept: DURABLE/generations/RID
    for RESULTS = DURABLE/results/RID, else RESULTS' parent/generations. Generation N is its folder N. The
    laptop's pull and gate read the same rule off a node path (never made absolute here)."""
    results = results.rstrip("/") or "/"
    parent = os.path.dirname(results)
    if os.path.basename(parent) == "results":
        return os.path.join(os.path.dirname(parent), "generations", os.path.basename(results))
    return os.path.join(parent, "generations")


def generation_of(root):
    """(results dir, N) for ROOT = DURABLE/generations/RID/N (a kept generation), else None."""
    root = root.rstrip("/")
    head, number = os.path.split(root)
    gens, rid = os.path.split(head)
    if not (number.isdigit() and rid and os.path.basename(gens) == "generations"):
        return None
    return os.path.join(os.path.dirname(gens), "results", rid), int(number)


class Sync(object):
    """One end-of-run sync into the results dir; .run() -> the status.json "sync" object."""

    def __init__(self, run_dir, note=None, own_only=False, env_record=None, logs_only=False):
        self.run_dir = run_dir
        self.own_only = own_only
        self.logs_only = logs_only   # the record and logs only: a run that produced nothing (final_sweep.py --ack)
        self.env_record = env_record   # the supervisor's run_env thread, when it is the one syncing
        self.left_out = []
        self.meta = core.read_json(run_path(run_dir, RUN))
        self.results = runrec.results_dir(run_dir, self.meta)
        self.note = note or (lambda text: None)
        self.errors, self.kept, self.copied, self.folders = [], [], {}, set()
        self.old_manifest_dropped = False
        self.meter_last = time.monotonic()
        self.meter_bytes = 0

    def progress(self, name):
        def on_bytes(count):  # a long copy is progress, not a stall, for the dead-man (job.log moves)
            self.meter_bytes += count
            if time.monotonic() - self.meter_last >= PROGRESS_SECONDS:
                self.meter_last = time.monotonic()
                self.note("syncing %s: %d MiB so far" % (name, self.meter_bytes >> 20))
        return on_bytes

    def drop_old_manifest(self):
        """The results dir is about to change: an old manifest would no longer describe it."""
        if not self.old_manifest_dropped:
            unlink_quiet(os.path.join(self.results, evidence.MANIFEST_NAME))
            self.old_manifest_dropped = True

    def clean_parts(self):
        for folder, _dirs, names in os.walk(self.results):
            for name in names:
                if name.endswith(PART_SUFFIX):
                    unlink_quiet(os.path.join(folder, name))

    def copy_changing(self, rel, src, tmp, snapshot):
        """copy_file -> (size, sha256); (None, None) when the source kept changing. A log (SNAPSHOT) that
        the dead-man is still appending to gets three tries, then the copy is taken as it is."""
        for attempt in range(3 if snapshot else 1):
            try:
                return copy_file(src, tmp, None if snapshot else self.progress(rel))
            except ValueError as exc:
                if "changed" not in str(exc):
                    raise
        if snapshot:
            return core.sha256_file(tmp)
        return None, None

    def copy_one(self, rel, src, snapshot):
        """Copy one file into place; False when the disk is full (stop copying)."""
        dst = os.path.join(self.results, *rel.split("/"))
        folder = os.path.dirname(dst)
        tmp = os.path.join(folder, ".%s%s" % (os.path.basename(dst)[:100], PART_SUFFIX))
        reason = None
        try:
            os.makedirs(folder, exist_ok=True)
            size, digest = self.copy_changing(rel, src, tmp, snapshot)
            if digest is None:
                reason = ("changed while it was being copied (something outside the job's process group still "
                          "writes it?)")
            elif size == 0 and not evidence.allowed_empty(rel, self.allow_empty):
                reason = "zero bytes (a save that was killed?); allow it with --allow-empty GLOB if empty is expected"
            else:
                reason = evidence.content_check(tmp, rel)[1]
            if reason is None:
                self.drop_old_manifest()
                os.replace(tmp, dst)
                self.folders.add(folder)
                self.copied[rel] = digest
                self.note("synced %s (%d bytes, sha256 %s...)" % (rel, size, digest[:12]))
                return True
        except (OSError, ValueError) as exc:
            unlink_quiet(tmp)
            reason = "copy failed: %s" % (getattr(exc, "strerror", None) or exc)
            self.reject(rel, dst, reason)
            return not (isinstance(exc, OSError) and exc.errno in FULL_DISK)
        unlink_quiet(tmp)
        self.reject(rel, dst, reason)
        return True

    def reject(self, rel, dst, reason):
        if os.path.isfile(dst):
            self.kept.append({"path": rel, "reason": reason})
            self.errors.append("%s: %s; the previous durable copy was kept" % (rel, reason))
        else:
            self.errors.append("%s: %s" % (rel, reason))

    def wait_for_run_env(self, limit=RUN_ENV_WAIT_SECONDS):
        """A job that ended within seconds may beat the environment record (run_env, started with the job) to
        the finish: give it up to LIMIT seconds, so env.json and code.patch are part of the sync. Never longer:
        it is a record."""
        if self.env_record is not None and self.env_record.is_alive():
            self.note("waiting up to %d s for the environment record (env.json)" % limit)
            self.env_record.join(limit)

    def run(self):
        outputs = [] if self.logs_only else list(self.meta.get("outputs") or [])
        self.allow_empty = [LOGS_ROSTER] + list(self.meta.get("allow_empty") or [])
        run_id = self.meta.get("run_id") or os.path.basename(self.run_dir)
        doc = {"ok": False, "verified": False, "results_dir": self.results, "manifest": None, "file_count": 0,
               "total_bytes": 0, "error": None, "kept_previous": self.kept, "started_at": core.utc_iso(),
               "started_epoch": time.time(),  # exact: a file changed after this is not what the sync saw
               "finished_at": None}
        plan, plan_errors = plan_outputs(self.meta.get("cwd") or ".", outputs)
        self.errors.extend(plan_errors)
        plan = self.own_plan(plan, outputs)
        doc.update(left_out=self.left_out, generation=self.meta.get("attempt") or 1, kept_generation=None,
                   logs_only=self.logs_only)
        # the step the results stand at once this sync lands (generation.json keeps it for the next attempt)
        self.first_step, doc["step"] = attempt_steps(self.run_dir, self.meta, read_status(self.run_dir))
        if not self.keep_generation(doc):
            return self.done(doc)
        logs = [("logs/" + name, run_path(self.run_dir, name)) for name in LOG_NAMES
                if os.path.isfile(run_path(self.run_dir, name))]
        for rel, _src in logs:
            if rel in plan:
                self.errors.append("--output %s collides with the run's own log of that name" % rel)
                del plan[rel]
        self.wait_for_run_env()
        records = [(name, run_path(self.run_dir, name)) for name in RECORD_NAMES
                   if name not in plan and os.path.isfile(run_path(self.run_dir, name))]  # a job's own file wins
        try:
            os.makedirs(self.results, exist_ok=True)
            self.clean_parts()
        except OSError as exc:
            self.errors.append("cannot create the results dir %s: %s" % (self.results, exc.strerror or exc))
            return self.done(doc)
        # outputs first, then the record, logs last (the sync's own notes go to job.log)
        copies = [(item, False) for item in sorted(plan.items()) + records] + [(item, True) for item in logs]
        for (rel, src), snapshot in copies:
            if not self.copy_one(rel, src, snapshot):
                self.errors.append("stopped copying: the results filesystem is full or read-only")
                break
        for folder in self.folders:
            core.fsync_dir(folder)
        self.write_manifest(doc, outputs + [rel for rel, _src in records if rel in self.copied] + [LOGS_ROSTER],
                            run_id)
        return self.done(doc)

    def own_plan(self, plan, outputs):
        """The outputs this run may copy: never a file another run on the box recorded as its own; for a sweep
        (OWN_ONLY), only files this run's attempts recorded (or changed while an unrecorded attempt ran)."""
        mine, others = runrec.recorded(self.run_dir), runrec.other_owners(self.run_dir)
        windows = runrec.unrecorded_windows(self.run_dir)
        kept = {}
        for rel, src in sorted(plan.items()):
            who, which = runrec.owner_of(self.run_dir, src, mine, others, windows)
            if who == "other":
                self.left_out.append({"path": rel, "why": "written by run %s" % which})
            elif who is None and self.own_only:
                self.left_out.append({"path": rel, "why": "no attempt of this run wrote it"})
            else:
                kept[rel] = src
        if self.left_out:
            self.note("left out (not this run's files): %s" % ", ".join(
                "%s (%s)" % (i["path"], i["why"]) for i in self.left_out[:5]))
            if outputs and not kept:
                self.errors.append("no file of this run's own matches its --output globs (%d left out: another "
                                   "run's, or not written by this run)" % len(self.left_out))
        return kept

    def generations_dir(self):
        return generations_dir(os.path.abspath(self.results))

    def keep_generation(self, doc):
        """Before a later attempt that did not continue the earlier one (see not_continued) replaces a verified
        durable copy, the copy is kept whole (hard links, else copies) in GENERATIONS/<its attempt>/ with its
        manifest, so it can be pulled and verified like any results dir. False when it could not be kept:
        nothing is replaced then."""
        attempt = self.meta.get("attempt") or 1
        manifest = os.path.join(self.results, evidence.MANIFEST_NAME)
        last = core.read_json(run_path(self.run_dir, runrec.GENERATION))
        before = last.get("attempt") if isinstance(last.get("attempt"), int) else (attempt - 1 if attempt > 1
                                                                                    else None)
        doc["generations"] = self.generation_list()
        if before is None or before >= attempt or not os.path.isfile(manifest):
            return True
        why = self.not_continued(doc, attempt, before, last)
        if why is None:
            return True
        target = os.path.join(self.generations_dir(), str(before))
        if os.path.isdir(target):
            doc["kept_generation"] = {"attempt": before, "dir": target, "why": why}
            return True
        tmp = target + ".rgt-part"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            for folder, _dirs, names in os.walk(self.results):
                rel_dir = os.path.relpath(folder, self.results)
                out_dir = os.path.normpath(os.path.join(tmp, rel_dir))
                os.makedirs(out_dir, exist_ok=True)
                for name in names:
                    if name.endswith(PART_SUFFIX):
                        continue
                    src, dst = os.path.join(folder, name), os.path.join(out_dir, name)
                    try:
                        os.link(src, dst)   # the sync replaces files by rename, so a link keeps the old bytes
                    except OSError:
                        shutil.copy2(src, dst)
            os.replace(tmp, target)
            core.fsync_dir(os.path.dirname(target))
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self.errors.append("the previous generation (attempt %d) could not be kept in %s (%s); nothing was "
                               "replaced" % (before, target, exc.strerror or exc))
            return False
        doc["kept_generation"] = {"attempt": before, "dir": target, "why": why}
        doc["generations"] = self.generation_list()
        self.note("kept generation %d (the verified results of attempt %d) in %s: %s" % (before, before, target, why))
        return True

    def not_continued(self, doc, attempt, before, last):
        """Why attempt ATTEMPT did not continue attempt BEFORE, whose verified results (generation.json LAST)
        the results dir holds, or None when it did or when that cannot be told; doc["continuity"] says which.
        It did not: it had no resume adapter, found no checkpoint, resumed from a checkpoint other than this
        run's newest (an old one, or one given with --resume-from) at a step below the one the durable copy
        stands at, or started at step 0 or 1 whatever it was given (a trainer that ignored its resume argument)."""
        resume = read_status(self.run_dir).get("resume")
        durable = progress.num(last.get("step"))
        first = self.first_step
        info = {"continued": None, "resumed_step": first and first["step"], "resumed_source": first and first["source"],
                "durable_step": durable, "durable_source": last.get("step_source"), "durable_attempt": before}
        doc["continuity"] = info
        if not (isinstance(resume, dict) and resume.get("from")):
            info.update(continued=False, why="attempt %d %s, so its sync would replace attempt %d's verified results"
                        % (attempt, "had no resume adapter" if resume is None else
                           "found no checkpoint to resume from", before))
            return info["why"]
        own = resume.get("newest_own") or resume.get("restored_from")
        if own and not (first is not None and durable is not None and first["step"] <= 1 < durable):
            # A trainer logs steps past its last save: after a crash its first step is below the durable copy's
            # last one, yet it continues from this run's newest checkpoint. Only a start at step 0 or 1 says it
            # ignored its resume argument.
            info.update(continued=True, why="attempt %d resumed from %s, this run's newest checkpoint%s" % (
                attempt, resume["from"], "" if first is None else " (first step %s)" % first["step"]))
            return None
        if durable is None or first is None:
            unknown = [text for text, missing in (
                ("attempt %d recorded no step with its results" % before, durable is None),
                ("attempt %d showed no first step" % attempt, first is None)) if missing]
            info["why"] = ("attempt %d resumed from %s; whether that continued attempt %d's step is unknown (%s: no "
                           "heartbeat.json step or --progress-regex line), so it counts as continuing, as any resume "
                           "from a checkpoint" % (attempt, resume["from"], before, "; ".join(unknown)))
            self.note(info["why"])
            return None
        if first["step"] < durable:
            info.update(continued=False, why=(
                "attempt %d resumed at step %s (from %s), below the durable copy's step %s (attempt %d's): it did not "
                "continue attempt %d, so its sync would replace attempt %d's verified results"
                % (attempt, first["step"], resume["from"], durable, before, before, before)))
            return info["why"]
        info.update(continued=True, why="attempt %d resumed at step %s (from %s), at or past the durable copy's step "
                    "%s (attempt %d's)" % (attempt, first["step"], resume["from"], durable, before))
        return None

    def generation_list(self):
        root = self.generations_dir()
        try:
            return [os.path.join(root, n) for n in sorted(os.listdir(root), key=lambda n: (len(n), n))
                    if n.isdigit()]
        except OSError:
            return []

    def kept_generations(self, doc):
        """{dir: why} of every generation of the run kept so far: generation.json's list, and this sync's."""
        kept = core.read_json(run_path(self.run_dir, runrec.GENERATION)).get("kept")
        kept = dict(kept) if isinstance(kept, dict) else {}
        if isinstance(doc.get("kept_generation"), dict):
            kept[doc["kept_generation"]["dir"]] = doc["kept_generation"]["why"]
        return kept

    def write_manifest(self, doc, roster, run_id):
        try:
            manifest, problems, _notes = evidence.build_manifest(self.results, roster, run_id,
                                                                 allow_empty=self.allow_empty, progress=False,
                                                                 on_bytes=self.progress("the manifest re-read"))
        except (OSError, core.UsageError) as exc:
            manifest, problems = None, [evidence.problem("manifest", self.results, str(exc))]
        if manifest is None:
            self.drop_old_manifest()
            self.errors.append("no manifest: %s" % "; ".join("%s: %s" % (p["path"], p["detail"]) for p in problems[:5]))
            return
        entries = {e["path"]: e for e in manifest["files"]}
        bad = sorted(rel for rel, digest in self.copied.items() if entries.get(rel, {}).get("sha256") != digest)
        files, tree_problems = evidence.scan_tree(self.results)
        extra = sorted(set(files) - set(entries))
        if bad:
            self.errors.append("the durable copy of %s does not match what was read from the source"
                               % ", ".join(bad[:5]))
        if extra or tree_problems:
            self.errors.append("the results dir holds files outside the roster (from an earlier attempt with other "
                               "--output globs?): %s" % ", ".join((extra + [p["path"] for p in tree_problems])[:5]))
        try:
            core.atomic_write(os.path.join(self.results, evidence.MANIFEST_NAME), evidence.manifest_bytes(manifest))
        except OSError as exc:
            self.drop_old_manifest()
            self.errors.append("cannot write %s: %s" % (evidence.MANIFEST_NAME, exc.strerror or exc))
            return
        doc.update(manifest=os.path.join(self.results, evidence.MANIFEST_NAME), file_count=manifest["file_count"],
                   total_bytes=manifest["total_bytes"], verified=not bad and not extra and not tree_problems)

    def done(self, doc):
        doc["ok"] = bool(doc["verified"] and not self.errors)
        if doc["verified"] and doc.get("manifest"):
            try:
                with open(doc["manifest"], "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            except OSError:
                digest = None
            step = doc.get("step") or {}
            core.write_json_best_effort(run_path(self.run_dir, runrec.GENERATION), {
                "attempt": self.meta.get("attempt") or 1, "results_dir": self.results, "manifest_sha256": digest,
                "step": step.get("step"), "step_source": step.get("source"), "kept": self.kept_generations(doc),
                "at": core.utc_iso()})
        doc["error"] = "; ".join(self.errors) if self.errors else None
        doc["finished_at"] = core.utc_iso()
        if doc["ok"]:
            self.note("sync verified: %d file(s), %s in %s (manifest %s)" % (
                doc["file_count"], core.human_bytes(doc["total_bytes"]), self.results, evidence.MANIFEST_NAME))
        else:
            self.note("SYNC FAILED: %s" % doc["error"])
        return doc


def op_sync(args):
    run_dir = os.path.abspath(args.run_dir)
    doc = read_status(run_dir)
    if not doc:
        raise core.UsageError("%s has no readable status.json: not a run dir" % run_dir)
    if doc.get("state") not in TERMINAL + ("syncing",) or core.identity_alive(doc.get("supervisor_identity")):
        raise core.Refused("the run is %s and its supervisor is alive: it syncs by itself at the end"
                           % doc.get("state"))
    sync = Sync(run_dir, lambda text: say("[rgt] " + text), own_only=args.own_only, logs_only=args.logs_only).run()
    rc = doc.get("exit_code")
    # no exit code: the job never finished (its supervisor died with the box), so it did not succeed
    state = "failed" if rc or rc is None else ("succeeded" if sync["ok"] else "sync_failed")
    if args.logs_only and state == "succeeded":   # its logs are saved, its outputs are not: not a success
        state = doc.get("state") if doc.get("state") in TERMINAL and doc.get("state") != "succeeded" else "sync_failed"
    if doc.get("state") == "interrupted":   # a re-sync never hides that the run was cut short
        state = "interrupted"
    error = set_status(run_dir, state=state, sync=sync)
    if error:
        raise core.CheckFailed(error)
    return 0 if sync["ok"] else 1


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog=PROG, description="Sync a finished run's outputs to its results dir again.",
                         formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--run-dir", required=True, help="the run dir (holds run.json and status.json)")
    parser.add_argument("--own-only", action="store_true",
                        help="copy only the files this run's attempts recorded in files.json (final_sweep.py)")
    parser.add_argument("--logs-only", action="store_true",
                        help="copy only the run's record and logs, no outputs: a run that produced nothing, "
                             "acknowledged with final_sweep.py --ack, so its crash log can be pulled")
    return op_sync(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog=PROG))
