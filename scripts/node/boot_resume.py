#!/usr/bin/env python3
"""After a restart, every unfinished run is resumed (when opted in) or marked failed, and is watched by a dead-man.

A restart (an interruptible instance resuming, a VM or workstation reboot) kills the job, its
supervisor and its dead-man together; status.json still says running and the box bills idle. Run
this once at boot (the profile says which hook: vast.ai's on-start script, a container start
command, `@reboot` cron or a systemd unit). For each run under --runs-dir whose status says
starting/running/stalled/syncing but whose supervisor and job are gone:
  - the run opted in (run_one.sh --auto-resume), has attempts left (--max-attempts, default 3) and budget
    left (RUN_DIR/budget.json: the cost so far, rate x the hours since the run's first start, is below the cap):
    the recorded launch is replayed word for word in the job's cwd, as the next attempt; its resume
    adapters pick the newest good checkpoint and run_one.sh arms a fresh dead-man first;
  - otherwise, or with no attempts or budget left: the run is marked failed ("the node restarted") and a
    dead-man is armed on it (the run's profile's stop), so the meter stops after the grace period
    unless someone acknowledges.
Each run the sweep resumes or re-arms is told as boot_resume (notify.py, when a target is configured and the
run's notify_events takes it): run_id, attempt, resume_from, action.
A finished run whose dead-man died with the box before its work was done (still armed in the run's
grace, firing, or fired with the stop not confirmed or failed; or ended by the shutdown's signal in an
earlier boot) gets its dead-man re-armed with its own settings (finding N2).
Runs with a live supervisor, job or launcher (a launch still starting), runs an explicit resume holds
(RUN_DIR/resume.lock), and other finished runs, are left alone; one sweep runs at a time on the box (an flock,
boot_resume.lock beside the box registry), so a boot hook that fires twice resumes each run once. A crash loop cannot bill forever:
besides --max-attempts, no run is resumed once its first attempt started more than --give-up-hours
ago (default 48); it is re-armed instead.

--run RUN_DIR resumes that one run now, as its next attempt, whatever its opt-in (the agent's
explicit resume after a preemption or a failure, `rgt.py resume`): the recorded launch is replayed
in the job's cwd; a dead-man still armed from the last attempt is disarmed first and its settings
re-armed if the relaunch fails, so one dead-man watches the run at any time. That hand-over runs in
a child in its own session, which a dropped ssh session or a killed resume does not stop; it records
its result in RUN_DIR/resume.json. Refused (exit 3) while an attempt is still live (its supervisor
or job alive: a second live attempt is never started), while another resume of the run holds
RUN_DIR/resume.lock, while the last dead-man is stopping the box, for a succeeded run, with no
recorded launch, with a damaged attempt number, past either cap, with its budget spent (the line says spent,
cap and how to go on), or, unless --force-restart, when the
launch has no resume adapter and the results dir holds verified outputs (the restart from step 0 would
supersede them; they are kept as DURABLE/generations/RID/<attempt>/ either way, and the reply says so). In the boot sweep a failed
relaunch re-arms the dead-man, and a run whose records are damaged is reported and re-armed without
stopping the sweep of the others.

Usage:
  boot_resume.py --runs-dir DIR [--runs-dir DIR]... [--give-up-hours H] [--dry-run] [--json]
  boot_resume.py --run RUN_DIR [--max-attempts N] [--give-up-hours H] [--force-restart] [--max-cost USD]
                 [--dry-run] [--json]

  @reboot  python3 ~/rgt-bin/boot_resume.py --runs-dir /workspace/durable/runs >> ~/rgt/boot.log 2>&1

--dry-run says what it would do and changes nothing. Output: one line per run acted on (or JSON). With
--run it also says which checkpoint the next attempt resumes from (resume_from, resume_args), or warns
that it starts over (the launch recorded no resume adapters, or no good checkpoint matches them).

--max-attempts N (with --run) overrides the cap recorded at launch (default 3).

--max-cost USD (with --run) is the explicit way on for a run whose budget is spent: the run's new cap, all
attempts together, which must exceed what it has spent (else refused, 3). It is written to RUN_DIR/budget.json
with the old cap and the amount spent ("raised"), the relaunch's dead-man holds it (the launch's budget and
the wall-clock cap it bought follow the new cap), and the reply's "budget" says from, to and spent. A run
launched without a budget is refused (3). A boot sweep never changes a cap.

Exit codes: 0 every orphaned run was resumed or re-armed (or there was none; with --run: resumed);
1 something could not be done (its line says what); 2 usage; 3 --run refused (the line says why: a live
attempt, a cap, a spent budget, a --max-cost not above the amount spent).
"""
import glob
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402

DROP_ON_REPLAY = ("--wait", "--json")  # a boot hook must not block, and reads no JSON


def attempt_of(status):
    """The attempt number status.json records (1 when absent), or None when it is not a whole number."""
    value = status.get("attempt", 1) if isinstance(status, dict) else None
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def deadman_busy(run_dir):
    """True while a dead-man process holds the run's deadman.lock (armed, firing or standing down)."""
    return core.lock_held(os.path.join(run_dir, "deadman.lock"), exclusive=True)


def orphaned(run_dir):
    """(status, run) when the run should be running but nothing of it is alive, else None."""
    status = core.read_json(os.path.join(run_dir, "status.json"))
    if status.get("state") not in runrec.ACTIVE:
        return None
    # a launch still starting (its run_one.sh alive, no supervisor yet) is not orphaned (finding A5)
    if runrec.activity(status)["any"]:
        return None
    return status, core.read_json(os.path.join(run_dir, "run.json"))


def first_started(run_dir, status):
    """Epoch seconds when the run's first attempt started (earlier attempts' status in previous/)."""
    stamps = [status.get("started_at")]
    for old in glob.glob(os.path.join(run_dir, "previous", "*", "status.json")):
        stamps.append(core.read_json(old).get("started_at"))
    epochs = [core.parse_iso(s) for s in stamps if isinstance(s, str)]
    epochs = [e for e in epochs if e is not None]
    return min(epochs) if epochs else None


def over_caps(run_dir, status, run, give_up_hours, max_attempts=None, new_cap=None):
    """Why the run must not get another attempt (a cap reached: attempts, --give-up-hours, the budget), else
    None. NEW_CAP: the run's budget as --max-cost would raise it."""
    attempt = attempt_of(status)
    if attempt is None:
        return "status.json's attempt %r is not a number" % status.get("attempt")
    cap = max_attempts or run.get("max_attempts") or 3
    if isinstance(cap, bool) or not isinstance(cap, int):
        return "run.json's max_attempts %r is not a number" % cap
    if attempt >= cap:
        return "attempt %d of at most %d already used" % (attempt, cap)
    first = first_started(run_dir, status)
    if first is not None and time.time() - first > give_up_hours * 3600:
        return "its first attempt started %.1f h ago, past --give-up-hours %g" % ((time.time() - first) / 3600,
                                                                                  give_up_hours)
    return over_budget(run_dir, new_cap)


def over_budget(run_dir, new_cap=None, now=None):
    """Why the run's budget forbids another attempt, else None: the cost so far on the run's budget clock
    (runrec: rate x the hours since its first start, less suspended time) is at or past its cap, or past
    NEW_CAP (--max-cost) when one is given. A run with no budget clock is not limited here."""
    clock = runrec.read_budget(run_dir)
    spent = None if clock is None else runrec.budget_spent_usd(clock, time.time() if now is None else now)
    cap = None if clock is None else clock.get("budget_usd")
    if spent is None or isinstance(cap, bool) or not isinstance(cap, (int, float)):
        return None
    if new_cap is not None:
        return None if new_cap > spent else (
            "--max-cost %s does not exceed the %s USD this run has already spent (its cap: %s USD); give more than "
            "that" % (core.money(new_cap), core.money(spent), core.money(cap)))
    if spent < cap:
        return None
    return ("budget spent: %s of its %s USD cap (%g/h since the run's first start, suspended time left out); "
            "another attempt would bill past it - to go on, resume with --max-cost N, N above %s, to raise the cap"
            % (core.money(spent), core.money(cap), clock["rate_per_hour"], core.money(spent)))


def replay_argv(run):
    import runrec
    words = list(runrec.raw_launch(run.get("run_dir") or "", run)[1])
    cut = words.index("--") if "--" in words else len(words)
    options = capped_words([w for w in words[:cut] if w not in DROP_ON_REPLAY],
                           runrec.read_budget(run["run_dir"]) if run.get("run_dir") else None)
    return options + words[cut:]


def _number(value):
    return None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)


def budget_hours_for(old_cap, new_cap, rate, hours):
    """HOURS (a dead-man's --max-hours) for NEW_CAP: what the budget buys when HOURS was what OLD_CAP bought (a
    launch's --max-cost sets it so), else HOURS unchanged (a tighter cap the user gave stays)."""
    if hours is None or old_cap is None or abs(hours - core.budget_hours(old_cap, rate)) > 1e-9:
        return hours
    return core.budget_hours(new_cap, rate)


def capped_words(options, clock):
    """run_one.sh OPTIONS with the run's cap as its budget clock holds it (budget.json; `--max-cost` on a resume
    changes it there): the dead-man's --budget-usd, and the --max-hours the old cap bought."""
    cap, rate = _number((clock or {}).get("budget_usd")), _number((clock or {}).get("rate_per_hour"))
    if cap is None or rate is None or rate <= 0:
        return options
    out, old = list(options), None
    for i, word in enumerate(out):
        after_arg = i > 0 and out[i - 1] == "--deadman-arg"
        if after_arg and word.startswith("--budget-usd="):
            old, out[i] = word.split("=", 1)[1], "--budget-usd=%.12g" % cap
        elif after_arg and word == "--budget-usd" and i + 2 < len(out) and out[i + 1] == "--deadman-arg":
            old, out[i + 2] = out[i + 2], "%.12g" % cap
    try:
        old = None if old is None else float(old)
    except ValueError:
        old = None
    if old is None or old == cap:
        return out
    for i, word in enumerate(out[:-1]):
        if word == "--max-hours":
            try:
                out[i + 1] = "%.12g" % budget_hours_for(old, cap, rate, float(out[i + 1]))
            except ValueError:
                pass
    return out


def rearm_args(run_dir):
    """The killed dead-man's own settings (deadman.json): every option, the stop included (deadman.cfg_to_argv);
    its budget as the run's budget clock holds it now (a cap `--max-cost` changed since it was armed)."""
    import deadman
    cfg = core.read_json(os.path.join(run_dir, "deadman.json")).get("config") or {}
    if not isinstance(cfg, dict):
        return []
    clock = runrec.read_budget(run_dir) or {}
    cap, old = _number(clock.get("budget_usd")), _number(cfg.get("budget_usd"))
    rate = _number(cfg.get("rate_per_hour"))
    if cap is not None and old is not None and rate and cap != old:
        cfg = dict(cfg, budget_usd=cap, max_hours=budget_hours_for(old, cap, rate, _number(cfg.get("max_hours"))))
    return deadman.cfg_to_argv(cfg)


def mark_failed(run_dir, status, why):
    """The run record says failed (runrec: under the status lock, best effort on a full disk)."""
    import runrec
    status.update(state="failed", error=why, ended_at=status.get("ended_at") or core.utc_iso())
    problem = runrec.set_status(run_dir, state="failed", error=why, ended_at=status["ended_at"])
    if problem:
        raise OSError(problem)


def cannot_replay(run):
    argv, cwd = replay_argv(run), run.get("cwd")
    if not argv:
        return "run.json has no recorded launch"
    if not cwd or not os.path.isdir(cwd):
        return "the job's cwd %r is gone" % cwd
    return None


def relaunch(run_dir, run):
    """Replay the recorded launch as the next attempt -> (ok, seconds, last output line)."""
    started = time.monotonic()
    res = core.run_bounded(["bash", os.path.join(HERE, "run_one.sh")] + replay_argv(run), 600, cwd=run.get("cwd"))
    return res.rc == 0, round(time.monotonic() - started, 1), res.output.strip().splitlines()[-1:] if res.rc else None


def arm_again(run_dir):
    """Arm a dead-man with the last one's settings -> (ok, last output line)."""
    arm = [sys.executable, os.path.join(HERE, "deadman.py"), "arm", "--run-dir", run_dir, "--notify-refused-ok"] \
        + rearm_args(run_dir)   # a refused notify config warns: the run must be watched whatever it says
    res = core.run_bounded(arm, 60)
    return res.rc == 0, res.output.strip().splitlines()[-1:] if res.rc else None


def resume(run_dir, status, run, dry_run, give_up_hours):
    attempt = attempt_of(status) or 1
    why_not = None
    if not run.get("auto_resume"):
        why_not = "not launched with --auto-resume"
    else:
        why_not = cannot_replay(run) or over_caps(run_dir, status, run, give_up_hours)
    if why_not is None:
        if dry_run:
            return {"run_dir": run_dir, "action": "would resume", "attempt": attempt + 1, "ok": True}
        mark_failed(run_dir, status, "the node restarted during attempt %d; resumed as attempt %d" % (attempt, attempt + 1))
        resume_from = predicted_resume(run)
        ok, seconds, detail = relaunch(run_dir, run)
        result = {"run_dir": run_dir, "action": "resumed", "attempt": attempt + 1, "ok": ok,
                  "seconds_to_launch": seconds, "detail": detail}
        if not ok and not core.deadman_state(run_dir)["watching"]:  # the box is idle now: watch it anyway
            result["rearmed"] = arm_again(run_dir)[0]
        tell_boot(run_dir, run, result, resume_from)
        return result
    if dry_run:
        return {"run_dir": run_dir, "action": "would re-arm the dead-man", "why": why_not, "ok": True}
    mark_failed(run_dir, status, "the node restarted during attempt %d (%s)" % (attempt, why_not))
    ok, detail = arm_again(run_dir)
    result = {"run_dir": run_dir, "action": "re-armed the dead-man", "why": why_not, "ok": ok, "detail": detail}
    tell_boot(run_dir, run, dict(result, attempt=attempt))
    return result


def predicted_resume(run):
    """The checkpoint the next attempt will resume from (resume_plan: the supervisor's own choice), or None."""
    try:
        return resume_plan(run).get("resume_from")
    except Exception:  # noqa: BLE001  a message's detail never stops a relaunch
        return None


def tell_boot(run_dir, run, result, resume_from=None):
    """boot_resume to the user (notify.py; bounded, never raises). RUN is run.json as the sweep read it, before
    a relaunch rewrote it: its notify_events is the list the run was launched with."""
    try:
        import runrec
        import stop_engine
        send = stop_engine.notifier({}, runrec.notify_events(run_dir, run))
        if send is not None:
            send("boot_resume", {"run_id": run.get("run_id") or os.path.basename(run_dir),
                                 "attempt": result.get("attempt"), "resume_from": resume_from,
                                 "action": result.get("action"), "ok": result.get("ok"), "why": result.get("why")})
    except Exception:  # noqa: BLE001
        pass


def unfinished_watch(run_dir):
    """Why RUN_DIR's dead-man must be armed again although the run is over, or None (finding N2): it died with
    the box while its work was not done: still armed (the run's grace running), firing, or fired with a stop
    not confirmed (confirmed false, or the stop failed). Ended by a signal (a shutdown's SIGTERM) in an
    earlier boot counts too. A dry run, a disarm, or a stop that ran and was not disproved is done."""
    doc = core.read_json(os.path.join(run_dir, core.DEADMAN_FILE))
    if not doc or deadman_busy(run_dir):
        return None
    st = core.deadman_state(run_dir)
    if st["watching"] or st["alive"]:
        return None
    state, fired = st["state"], st["fired"] or {}
    if state == "armed" and not fired:
        return "its dead-man died with the box before the run's grace ran out"
    if state in ("firing", "fired", "telling") or fired:
        if fired.get("dry_run"):
            return None
        if fired.get("confirmed") is False or fired.get("ok") is False:
            return "its dead-man fired but the stop was %s" % ("not confirmed" if fired.get("confirmed") is False
                                                              else "not done")
        return None
    booted = (doc.get("identity") or {}).get("boot_id") if isinstance(doc.get("identity"), dict) else None
    if state == "exited" and booted and booted != core.boot_id():
        return "its dead-man was ended by the shutdown before the run's grace ran out"
    return None


def rearm_unfinished(run_dir, dry_run):
    """A finished run whose dead-man had not finished its work: arm it again with its own settings."""
    why = unfinished_watch(run_dir)
    if why is None:
        return None
    if dry_run:
        return {"run_dir": run_dir, "action": "would re-arm the dead-man", "why": why, "ok": True}
    ok, detail = arm_again(run_dir)
    result = {"run_dir": run_dir, "action": "re-armed the dead-man", "why": why, "ok": ok, "detail": detail}
    tell_boot(run_dir, core.read_json(os.path.join(run_dir, "run.json")), result)
    return result


def boot_sweep_one(run_dir, args):
    """One run of the boot sweep; a run whose records are damaged is reported (and re-armed when it can be),
    never allowed to stop the sweep of the others. A run that an explicit resume holds (its resume.lock) is
    left to it; otherwise the sweep holds that lock itself while it decides and relaunches."""
    import fcntl
    try:
        try:
            lock = os.open(os.path.join(run_dir, RESUME_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            lock = None   # a read-only run dir: nothing can be resumed there anyway; orphaned() decides
        try:
            if lock is not None:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return {"run_dir": run_dir, "action": "left alone", "ok": True,
                            "why": "another resume of this run is in progress"}
            found = orphaned(run_dir)   # read under the lock, as it is now
            if found:
                return resume(run_dir, found[0], found[1], args.dry_run, args.give_up_hours)
            return rearm_unfinished(run_dir, args.dry_run)
        finally:
            if lock is not None:
                os.close(lock)
    except Exception as exc:  # noqa: BLE001  (one broken run must not leave the rest unwatched)
        result = {"run_dir": run_dir, "action": "skipped", "ok": False,
                  "why": "unexpected %s: %s" % (type(exc).__name__, str(exc)[:200])}
        if not args.dry_run and not core.deadman_state(run_dir)["watching"]:
            result["rearmed"] = arm_again(run_dir)[0]
            tell_boot(run_dir, core.read_json(os.path.join(run_dir, "run.json")), result)
        return result


RESUME_LOCK = "resume.lock"
RESUME_RECORD = "resume.json"
HAND_OVER_SECONDS = 90


def resume_one(run_dir, args):
    """--run: the explicit resume of one run -> (exit code, result). One resume per run at a time (an
    flock on RUN_DIR/resume.lock, held from the checks to the end of the relaunch)."""
    import fcntl
    status = core.read_json(os.path.join(run_dir, "status.json"))
    run = core.read_json(os.path.join(run_dir, "run.json"))
    if not status and not run:
        raise core.UsageError("--run %s is not a run dir (no status.json or run.json)" % run_dir)
    lock = os.open(os.path.join(run_dir, RESUME_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 3, {"run_dir": run_dir, "ok": False, "action": "refused", "attempt": None,
                       "why": "another resume of this run is in progress; wait for it (rgt.py status)"}
        status = core.read_json(os.path.join(run_dir, "status.json"))  # as it is now, under the lock
        code, result = resume_checks(run_dir, status, run, args)
        if code is not None:
            return code, result
        if args.max_cost is not None:
            stopped = new_budget(run_dir, args.max_cost, result)
            if stopped:
                return stopped
        return hand_over_detached(run_dir, status, run, result)
    finally:
        os.close(lock)


def new_budget(run_dir, cap, result):
    """--max-cost CAP, once every check passed: the run's budget clock gets the new cap (runrec.raise_budget,
    with what was spent) before the relaunch, whose dead-man then holds it. -> (exit code, result) when the
    resume must stop here, else None. RESULT["budget"] says what changed."""
    clock = runrec.read_budget(run_dir)
    spent = runrec.budget_spent_usd(clock, time.time())
    try:
        runrec.raise_budget(run_dir, clock, cap, spent)
    except OSError as exc:
        result.update(ok=False, action="resume failed", why="the new cap could not be recorded in %s (%s); "
                      "nothing was started" % (runrec.BUDGET, exc.strerror or exc))
        return 1, result
    result["budget"] = {"from": clock.get("budget_usd"), "to": cap, "spent": round(spent, 6),
                        "rate_per_hour": clock.get("rate_per_hour")}
    return None


SUPERVISOR_EXIT_SECONDS = 60


def live_parts(status):
    act = runrec.activity(status)
    return [name for name in ("supervisor", "job") if act[name]]


def resume_checks(run_dir, status, run, args):
    """(exit code, result) when the resume stops here (refused, or a dry run), else (None, result)."""
    attempt = attempt_of(status)
    result = {"run_dir": run_dir, "attempt": None if attempt is None else attempt + 1, "ok": False,
              "action": "refused"}
    live = live_parts(status)
    if live == ["supervisor"] and status.get("state") not in runrec.ACTIVE:
        # the attempt is over (final status written) and its supervisor is tidying up: give it a moment
        deadline = time.monotonic() + SUPERVISOR_EXIT_SECONDS
        while live and time.monotonic() < deadline:
            time.sleep(0.2)
            live = live_parts(status)
    dm = core.deadman_state(run_dir)
    if attempt is None:
        why = "status.json's attempt %r is not a number; repair it by hand first" % status.get("attempt")
    elif live:
        why = "attempt %d is still live (%s pid %s); a second live attempt is never started - stop it first" % (
            attempt, live[0], status.get(live[0] + "_pid"))
    elif status.get("state") == "succeeded":
        why = "it succeeded; nothing to resume (a new run id starts a new run)"
    elif not dm["watching"] and deadman_busy(run_dir):
        why = ("its dead-man is stopping the box now (%s); resume after the stop finishes, if the box is still "
               "there" % dm["word"].lower())
    elif args.max_cost is not None and runrec.budget_spent_usd(runrec.read_budget(run_dir) or {}, 0) is None:
        why = ("--max-cost changes a run's budget, and this run has none (launched without --max-cost, or its "
               "dead-man never started the budget clock, RUN_DIR/%s)" % runrec.BUDGET)
    else:
        why = cannot_replay(run) or over_caps(run_dir, status, run, args.give_up_hours, args.max_attempts,
                                              args.max_cost)
    if why:
        result["why"] = why
        return 3, result
    result["ok"] = True
    result.update(resume_plan(run))
    lost = restart_loses(run, status, attempt)
    if lost:
        result["would_supersede"] = lost
        if not args.force_restart:
            if args.dry_run:
                result["warning"] = (result.get("warning") or "") + "; " + lost["text"] + (
                    ": a real resume refuses without --force-restart")
            else:
                result.update(ok=False, action="refused", why=lost["text"] + ": pass --force-restart to go ahead")
                return 3, result
    if args.dry_run:
        result["action"] = "would resume"
        if args.max_cost is not None:
            result["warning"] = ((result.get("warning") + "; ") if result.get("warning") else "") + (
                "would set the run's budget to %s USD" % core.money(args.max_cost))
        return 0, result
    return None, result


def restart_loses(run, status, attempt):
    """What a restart from step 0 (no resume adapter) would supersede: the verified durable outputs of the last
    attempt (not its logs or record) -> {"attempt", "files", "kept_as", "text"}, or None."""
    import sync
    if run.get("resume_arg"):
        return None
    results = run.get("results_dir") or ""
    manifest = core.read_json(os.path.join(results, "PULL_MANIFEST.json"))
    files = [e.get("path") for e in manifest.get("files") or [] if isinstance(e, dict)
             and isinstance(e.get("path"), str) and not e["path"].startswith("logs/")
             and e["path"] not in sync.RECORD_NAMES]
    if not files:
        return None
    sync = sync.Sync(run.get("run_dir") or "", None)
    kept_as = os.path.join(sync.generations_dir(), str(attempt))
    text = ("the launch recorded no resume adapter (--resume-glob/--resume-arg): attempt %d restarts from step 0, "
            "and its sync supersedes the verified durable results of attempt %d (%d output file(s): %s); they "
            "are kept as generation %d in %s, but the pull and the gate then take the new attempt's"
            % (attempt + 1, attempt, len(files), ", ".join(files[:3]) + (" ..." if len(files) > 3 else ""), attempt,
               kept_as))
    return {"attempt": attempt, "files": files, "kept_as": kept_as, "text": text}


def resume_plan(run):
    """What the next attempt will resume from (the launch's adapters, as supervise.py applies them), and a
    warning when it will start over: {"resume_from", "resume_args", "warning"}."""
    import supervise
    extra, record = supervise.resume_choice(run)
    plan = {"resume_from": (record or {}).get("from"), "resume_args": extra, "warning": None,
            "restored_from": (record or {}).get("restored_from"), "written_by": (record or {}).get("written_by")}
    if record is None:
        plan["warning"] = ("the launch recorded no --resume-glob/--resume-arg: the job restarts with its original "
                           "arguments, from step 0 unless the trainer resumes by itself")
    elif record.get("from") is None:
        plan["warning"] = "no good checkpoint matches %r in %s: the job starts fresh%s" % (
            run.get("resume_glob"), run.get("cwd"), "".join("; skipped %s (%s)" % (k["path"], k["why"])
                                                          for k in record.get("skipped", [])[:3]))
    return plan


def hand_over_detached(run_dir, status, run, result):
    """Disarm the last dead-man, relaunch, re-arm if the relaunch fails: in a child in its own session, so
    a dropped ssh session or a killed resume never leaves the run with nothing watching it. The child
    writes RUN_DIR/resume.json; this process waits for it and reports what it wrote."""
    record = os.path.join(run_dir, RESUME_RECORD)
    core.atomic_write_json(record, dict(result, action="resuming", ok=False, started_at=core.utc_iso()))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: survives its parent, holds the inherited resume lock until it is done
        code = 1
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            code, done = hand_over(run_dir, status, run, dict(result))
            core.atomic_write_json(record, dict(done, exit_code=code, finished_at=core.utc_iso()))
        finally:
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    done = core.read_json(record)
    done.pop("finished_at", None)
    code = done.pop("exit_code", None)
    if code is None:
        code = 1
        done = dict(result, ok=False, action="resume failed",
                    why="the hand-over step ended without a result (wait status %d); see rgt.py status" % wait_status)
    return code, done


def hand_over(run_dir, status, run, result):
    attempt = result["attempt"] - 1
    handed_over = False
    if core.deadman_state(run_dir)["watching"]:  # the last attempt's dead-man hands the run to the new one
        ack = core.run_bounded([sys.executable, os.path.join(HERE, "deadman.py"), "ack", "--run-dir", run_dir,
                                "--disarm"], 60)
        if ack.rc != 0:
            result.update(ok=False, action="refused", why="the armed dead-man would not disarm: " + ack.output[-200:])
            return 1, result
        handed_over = True
        deadline = time.monotonic() + HAND_OVER_SECONDS   # woken by the ack; a stuck one is waited for, never killed
        while deadman_busy(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        if deadman_busy(run_dir):
            result.update(ok=False, action="refused", why="the armed dead-man did not stand down within %d s"
                          % HAND_OVER_SECONDS)
            return 1, result
    if status.get("state") in runrec.ACTIVE:
        mark_failed(run_dir, status, "attempt %d died with nothing left alive; resumed as attempt %d" % (
            attempt, attempt + 1))
    ok, seconds, detail = relaunch(run_dir, run)
    result.update(action="resumed", ok=ok, seconds_to_launch=seconds, detail=detail)
    if not ok and handed_over and not core.deadman_state(run_dir)["watching"]:  # never leave it unwatched
        result["rearmed"] = arm_again(run_dir)[0]
    return (0 if ok else 1), result


def sweep_lock():
    """Hold the box-wide boot-sweep lock (an flock beside the box registry) until this process ends; a second
    sweep waits for the first, then finds the runs it relaunched alive and leaves them alone."""
    import fcntl
    import runrec
    folder = os.path.dirname(os.path.abspath(runrec.registry_dir()))
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, "boot_resume.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise core.CheckFailed("cannot take the boot-sweep lock in %s: %s" % (folder, exc.strerror or exc))
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def main(argv=None):
    core.check_toolkit()
    parser = core.Parser(prog="boot_resume.py", description="After a restart: resume or re-arm unfinished runs "
                         "(see the docstring).", formatter_class=core.RawHelp, epilog=core.exit_codes_epilog(__doc__))
    parser.add_argument("--runs-dir", action="append", help="a runs dir (DURABLE_DIR/runs)")
    parser.add_argument("--run", help="resume this one run dir now, as its next attempt")
    parser.add_argument("--max-attempts", type=int, help="with --run: the attempt cap (default: as launched, 3)")
    parser.add_argument("--give-up-hours", type=core.arg_number(float, 0.0, 1e6, low_open=True), default=48.0,
                        help="no resume once the first attempt started longer ago than this (default 48)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    parser.add_argument("--force-restart", action="store_true",
                        help="with --run: resume a run that has no resume adapter although its restart from step 0 "
                             "supersedes the verified durable outputs (they are kept as a generation)")
    parser.add_argument("--max-cost", type=core.arg_number(float, 0.0, low_open=True), metavar="USD",
                        help="with --run: the run's new budget (all attempts together), above what it has spent; "
                             "recorded in RUN_DIR/budget.json, and the new attempt's dead-man holds it")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if bool(args.run) == bool(args.runs_dir):
        raise core.UsageError("give --runs-dir (at boot) or --run RUN_DIR (one explicit resume), not both or neither")
    if args.max_attempts is not None and (not args.run or args.max_attempts < 1):
        raise core.UsageError("--max-attempts needs --run and must be at least 1")
    if args.max_cost is not None and not args.run:
        raise core.UsageError("--max-cost needs --run (a boot sweep never raises a budget)")
    if args.run:
        if not os.path.isdir(args.run):
            raise core.UsageError("--run %s is not a directory" % args.run)
        code, r = resume_one(os.path.abspath(args.run), args)
        if args.json:
            core.emit_json(dict(r, exit_code=code))
        else:
            print("%s %s: %s%s" % (core.OK if r["ok"] else core.FAIL, os.path.basename(r["run_dir"]), r["action"],
                                   (" (%s)" % r["why"]) if r.get("why") else " as attempt %d" % r["attempt"]))
            if r.get("resume_from"):
                print("resume: from %s (written by: %s)%s, adds %s" % (
                    r["resume_from"], r.get("written_by") or "?", " (put back from its verified durable copy "
                                                      "%s)" % r["restored_from"] if r.get("restored_from") else "",
                                                      " ".join(r.get("resume_args") or [])))
            if r.get("budget"):
                print("budget: the run's cap is now %s USD (was %s; %s spent so far)" % (
                    core.money(r["budget"]["to"]), core.money(r["budget"]["from"]), core.money(r["budget"]["spent"])))
            if r.get("warning"):
                print("WARN %s" % r["warning"])
        return code
    for runs in args.runs_dir:
        if not os.path.isdir(runs):
            raise core.UsageError("--runs-dir %s is not a directory" % runs)
    box_lock = sweep_lock()   # one boot sweep at a time on this box (a hook firing twice, a person and a hook)
    results = []
    for runs in args.runs_dir:
        for name in sorted(os.listdir(runs)):
            run_dir = os.path.join(os.path.abspath(runs), name)
            result = boot_sweep_one(run_dir, args) if os.path.isdir(run_dir) else None
            if result:
                results.append(result)
    ok = all(r["ok"] for r in results)
    if args.json:
        core.emit_json({"ok": ok, "runs": results})
    else:
        for r in results:
            print("%s %s: %s%s" % (core.OK if r["ok"] else core.FAIL, os.path.basename(r["run_dir"]), r["action"],
                                   (" (%s)" % r["why"]) if r.get("why") else
                                   (" as attempt %d" % r["attempt"]) if r.get("attempt") else ""))
        if not results:
            print("%s no unfinished run to resume or re-arm" % core.OK)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="boot_resume.py"))
