#!/usr/bin/env python3
"""reap: the backstop off the box. Stops, through the provider's API, a box the node can no longer stop itself.

Every other stop authority (the dead-man, the idle watch, the boot re-arm) runs on the box it stops and dies
with it: a hung kernel, a killed dead-man, a box that lost its toolkit keeps billing. The reaper runs on the
laptop (or on a schedule: `rgt.py reap install`), joins the ledger, the provider's own state and one status
trip per box (rgt.py patrol, which reads each run's lease: runrec.LEASE, renewed by its dead-man every tick),
and STOPS (never terminates, except opt-in --terminate-after-days) when a rule holds:

  budget       a run's budget deadline (its first start + max_cost / rate, as the lease or the ledger says)
               has passed, and no other run on the box is still watched and healthy;
  done         every run on the box ended, each passed the teardown gate, and --done-grace-minutes passed
               since the last of them (the dead-man should have stopped the box by now);
  unwatched    the box answers, but a run that is not through the gate has no live dead-man: its lease
               ran out (a hung or killed watcher) --unwatched-grace-minutes ago, or it never had one;
  unreachable  the box does not answer, the last lease read has run out, a lease_expired message was sent
               at a reap before, and the box has been unreachable for a further lease TTL while the provider
               says it runs (so a network partition never stops a healthy run on one missed read).
A run whose dead-man was disarmed by the user (`rgt.py ack --disarm`) is the user's: no rule counts it.
The reaper acts only on boxes whose launch named --instance PROVIDER:ID, with the laptop's provider keys
(the same ones `rgt.py billing` reads). A stop is read back and retried like the node's (providers.py);
NOT CONFIRMED is notified and the next reap tries again. It is stateless and idempotent: every decision is a
ledger row (event "reap"), a reap holds a lock beside the ledger, so two reapers at once never both stop, and a
box the provider already reads as stopped is left alone. Each reap writes a heartbeat beside the ledger
(`rgt.py launch` warns when none is younger than 24 h).

Weekly digest (opt-in): --digest-days 7 with --notify-config sends one still_billing message every 7 days listing
each box a provider still bills (running, or stopped and billing its disk) and each box with ungated runs that the
reaper cannot see; a ledger row records it, so any number of scheduled reaps send it once.

Two-stage end (opt-in): --terminate-after-days N terminates an instance the reaper stopped N days ago whose
runs all passed the gate (a stopped RunPod pod or vast.ai instance still bills its disk); a lease_expired-style
warning goes out a day before. Never a terminate without the gate's PASS.

Usage:
  rgt.py reap [--dry-run] [--json] [--notify-config FILE] [--ledger FILE] [--lock-wait S]
              [--ssh-config FILE] [-p|--port PORT] [-i|--identity KEY] [--node-dir DIR] [--trip-timeout S]
              [--done-grace-minutes M] [--unwatched-grace-minutes M] [--terminate-after-days N]
              [--timeout S] [--poll-seconds S] [--cap-seconds S] [--digest-days D]
  rgt.py reap install --cron | --systemd | --launchd [--every-minutes M] [--print]
  rgt.py reap uninstall --cron | --systemd | --launchd

Exit codes: 0 nothing needed a stop, or every stop it made is confirmed; 1 a stop NOT CONFIRMED, or a box or
provider could not be read; 2 usage; 3 refused (another reap holds the lock past --lock-wait); 10 --dry-run
found a box it would stop.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402
import ledger as ledger_mod  # noqa: E402  (scripts/ledger.py)
import runrec  # noqa: E402

RULES = ("budget", "done", "unwatched", "unreachable")
WOULD_STOP = 10
SSH_UNREACHABLE = 255
TERMINAL = runrec.REPORTED_OVER   # run_status's words for a run that is over
HEARTBEAT = "reap-heartbeat.json"
LOCK = "reap.lock"
HEARTBEAT_WARN_S = 24 * 3600


# ---------------------------------------------------------------- what the ledger says of each box

def boxes_of(events):
    """{box address: {"host", "box", "instance": (provider, id) or None, "runs": {rid: facts}, "reaps": [rows]}}
    from the ONE fold of the ledger (ledger.fold, keyed by box identity): the runs rgt.py launched, their budgets,
    the last lease a status read, the reaper's rows."""
    runs, folded = ledger_mod.fold(events)
    boxes = {}
    for key, rec in folded.items():
        if not key[0]:
            continue   # a row with neither box nor host names no box
        box = boxes.setdefault(key[0], {"host": rec["host"], "box": key[0], "instance": None, "runs": {},
                                        "reaps": []})
        box["host"] = rec["host"] or box["host"]
        box["reaps"].extend(rec.get("reaps") or [])
    for key, rec in runs.items():
        box = boxes.get(key[0])
        if box is None:
            continue
        if rec.get("instance"):
            provider, _, ident = rec["instance"].partition(":")
            box["instance"] = (provider, ident)
        box["runs"][rec["run_id"]] = {"run_id": rec["run_id"], "gate": rec["gate"], "gate_at": rec.get("gate_at"),
                                      "state": rec.get("run_state") or rec.get("state"),
                                      "first_launch": rec.get("first_launch"), "max_cost": rec.get("max_cost"),
                                      "rate": rec.get("rate_per_hour"), "lease": rec.get("lease"),
                                      "lease_read_at": rec.get("lease_read_at"), "budget": rec.get("budget")}
    for box in boxes.values():
        box["reaps"].sort(key=lambda row: row.get("time") or "")
    return boxes


def seconds_since(iso, now):
    at = core.parse_iso(iso) if iso else None
    return None if at is None else max(0.0, now - at)


def lease_age(run, now):
    """The run's lease age now, from the last copy the ledger holds (node clock age + laptop time since read)."""
    lease = run.get("lease") or {}
    since = seconds_since(run.get("lease_read_at"), now)
    if not isinstance(lease.get("age_s"), (int, float)) or since is None:
        return None
    return lease["age_s"] + since


def budget_deadline(run):
    """Epoch seconds the run's budget runs out: the node's lease says, else first launch + max_cost / rate."""
    lease = run.get("lease") or {}
    at = core.parse_iso(lease.get("budget_deadline")) if lease.get("budget_deadline") else None
    if at is not None:
        return at
    start = core.parse_iso(run["first_launch"]) if run.get("first_launch") else None
    if start is None or not run.get("max_cost") or not run.get("rate"):
        return None
    return start + core.budget_hours(run["max_cost"], run["rate"]) * 3600.0


# ---------------------------------------------------------------- the facts of now

def provider_state(box, opts):
    """(state, error): the provider's word for the box's instance, read with the laptop's own keys."""
    import providers
    provider, ident = box["instance"]
    try:
        adapter = providers.laptop_adapter(provider)
    except (KeyError, ValueError, providers.ProviderError) as exc:
        return "unknown", "no adapter for %s (%s)" % (provider, exc)
    if adapter is None:
        return "unknown", "no laptop credentials for %s" % provider
    adapter.instance_id = ident
    try:
        return adapter.state(opts.timeout), None
    except providers.ProviderError as exc:
        return "unknown", str(exc)


def status_trip(box, opts):
    """(reachable, {rid: run_status dict}): one rgt.py patrol trip to the box for all its runs; reachable is None
    when patrol could place none of them (the alias now leads to another box than the ledger's)."""
    argv = [sys.executable, os.path.join(HERE, "rgt.py")] + opts.ssh_options + [
        "--json", "patrol", box["host"]] + sorted(box["runs"]) + ["--min-free-gb", "0"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=opts.trip_timeout)
    except subprocess.TimeoutExpired:
        return False, {}
    if res.returncode == SSH_UNREACHABLE or "could not reach" in res.stderr:
        return False, {}
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        return False, {}
    runs = {r.get("run_id"): r.get("status") or {} for r in doc.get("runs") or []}
    if runs and all(str(st.get("reason", "")).startswith("cannot locate") for st in runs.values()):
        return None, {}       # ssh now reaches another box than the ledger's: nothing was asked, nothing known
    return True, runs


# ---------------------------------------------------------------- the rules

def decide(box, reachable, statuses, now, opts):
    """(rule or None, why, notify_only): what the reaper does with a box the provider reads as running."""
    runs = box["runs"]
    lease_of = {rid: (statuses.get(rid) or {}).get("lease") if reachable else None for rid in runs}

    def disarmed(rid):
        lease = lease_of.get(rid) or runs[rid].get("lease") or {}
        return lease.get("state") == "disarmed"

    def healthy(rid):
        st, lease = statuses.get(rid) or {}, lease_of.get(rid) or {}
        return st.get("status") in ("running", "starting", "syncing") and lease and not lease.get("expired")

    spent = [rid for rid in runs if budget_deadline(runs[rid]) is not None and now > budget_deadline(runs[rid])]
    if spent and not any(healthy(rid) for rid in runs if rid not in spent):
        return "budget", "run %s passed its budget deadline (%s)" % (
            spent[0], core.utc_iso(budget_deadline(runs[spent[0]]))), False
    if reachable is None:
        return None, "its runs cannot be placed on the box this alias reaches now (a changed ssh config?)", False
    if reachable:
        ended = {rid: (statuses.get(rid) or {}).get("status") in TERMINAL for rid in runs}
        gated = {rid: runs[rid].get("gate") == "PASS" for rid in runs}
        if runs and all(ended.values()) and all(gated.values()):
            last = max(seconds_since(runs[rid].get("gate_at"), now) or 0.0 for rid in runs)
            if min(seconds_since(runs[rid].get("gate_at"), now) or 0.0 for rid in runs) >= opts.done_grace * 60:
                return "done", "every run ended and passed the gate; the box is still up %s after the last " \
                               "gate" % core.human_age(last), False
        for rid in sorted(runs):
            if gated[rid] and ended[rid] or disarmed(rid):
                continue
            lease = lease_of.get(rid)
            if lease is None:
                continue      # an older toolkit writes no lease: nothing to measure a grace by
            if lease.get("state") in ("exited",) or lease.get("expired"):
                over = lease.get("age_s", 0.0) - lease.get("ttl_s", 0.0)
                if over >= opts.unwatched_grace * 60:
                    return "unwatched", "run %s: its dead-man's lease ran out %s ago (state %s)" % (
                        rid, core.human_age(lease.get("age_s", 0.0)), lease.get("state")), False
        return None, "the box answers and its runs are watched", False
    # unreachable
    ages = [(lease_age(runs[rid], now), (runs[rid].get("lease") or {}).get("ttl_s") or 0.0) for rid in runs
            if not disarmed(rid) and not (runs[rid].get("gate") == "PASS")]
    ages = [(age, ttl) for age, ttl in ages if age is not None]
    if not ages or not all(age > ttl for age, ttl in ages):
        return None, "unreachable, but a lease still holds (or none was ever read)", False
    since = unreachable_since(box)
    told = any(r.get("notice") == "lease_expired" for r in reaps_since_reachable(box))
    ttl = max(t for _a, t in ages)
    if told and since is not None and now - since >= ttl:
        return "unreachable", "unreachable for %s and every lease ran out (newest %s old)" % (
            core.human_age(now - since), core.human_age(min(a for a, _t in ages))), False
    return "unreachable", "unreachable and every lease ran out: told first, stopped at a later reap after one " \
                          "more TTL (%s)" % core.human_age(ttl), True


def reaps_since_reachable(box):
    rows = []
    for row in box["reaps"]:
        if row.get("reachable") is True:
            rows = []
        elif row.get("reachable") is False:      # None: the alias led elsewhere, says nothing of this box
            rows.append(row)
    return rows


def unreachable_since(box):
    rows = reaps_since_reachable(box)
    return core.parse_iso(rows[0].get("time")) if rows else None


# ---------------------------------------------------------------- acting

def stop_box(box, opts, action="stop"):
    """The provider stop, read back (providers.stop_and_confirm) -> its result dict."""
    import providers
    provider, ident = box["instance"]
    adapter = providers.laptop_adapter(provider)
    adapter.instance_id = ident
    # the node's confirmation rule (finding C5), with the same $RGT_PROVIDER_CONFIRM_READS/_SPAN_S overrides
    confirm = {"reads": providers.env_default(providers.READS_ENV, int, providers.DEFAULT_CONFIRM_READS, 1, 1000),
               "span_s": providers.env_default(providers.SPAN_ENV, float, providers.DEFAULT_CONFIRM_SPAN_S, 0.0,
                                               3600.0)}
    return providers.stop_and_confirm(adapter, action, poll_s=opts.poll_seconds, cap_s=opts.cap_seconds, **confirm,
                                      request_timeout=opts.timeout)


def tell(opts, event, fields):
    if not opts.notify_config:
        return None
    import notify
    try:
        return notify.emit(event, fields, config_path=opts.notify_config, timeout=10)
    except Exception as exc:  # noqa: BLE001  a message never blocks a stop
        return {"error": str(exc)[:200]}


@contextlib.contextmanager
def reap_lock(ledger_file, wait_s):
    """One reap at a time per ledger (a flock beside it): a second reaper waits, then finds the box stopped."""
    import fcntl
    path = os.path.join(os.path.dirname(os.path.abspath(ledger_file)), LOCK)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise core.Refused("another reap holds %s for more than %g s" % (path, wait_s))
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def reap(opts):
    path = ledger_mod.path(opts.ledger)
    now = time.time()
    decisions, code = [], 0
    with reap_lock(path, opts.lock_wait):
        events = list(ledger_mod.events(path))
        boxes = boxes_of(events)
        for key in sorted(boxes):
            box = boxes[key]
            d = {"box": box["box"], "host": box["host"], "instance": ":".join(box["instance"]) if box["instance"]
                 else None, "runs": sorted(box["runs"]), "action": "none", "rule": None}
            decisions.append(d)
            if not box["runs"]:
                d["why"] = "no run of rgt.py's here"
                continue
            if box["instance"] is None:
                d["why"] = "no --instance at launch: the reaper cannot reach this box's provider"
                continue
            state, error = provider_state(box, opts)
            d["provider_state"] = state
            if state in ("stopped", "gone"):
                d["why"] = "the provider reads it as %s" % state
                d.update(terminate_due(box, opts, now, state))
                continue
            if state != "running":
                d["why"] = "the provider's state is %s%s" % (state, ": " + error if error else "")
                d["action"], code = "unknown", max(code, 1)
                continue
            reachable, statuses = status_trip(box, opts)
            d["reachable"] = reachable
            rule, why, notice_only = decide(box, reachable, statuses, now, opts)
            d["rule"], d["why"] = rule, why
            if reachable is None and not rule:
                d["action"], code = "unknown", max(code, 1)
            row = {"event": "reap", "host": box["host"], "box": box["box"], "reachable": reachable,
                   "provider_state": state, "rule": rule}
            if rule and notice_only:
                d["action"] = "notify"
                if not opts.dry_run:
                    d["notified"] = tell(opts, "lease_expired", {"box": box["host"], "reason": why})
                    row["notice"] = "lease_expired"
            elif rule:
                d["action"] = "stop"
                if opts.dry_run:
                    code = max(code, WOULD_STOP)
                else:
                    result = stop_box(box, opts)
                    d["confirmed"], d["result"] = result.get("confirmed"), result
                    row.update(action="stop", confirmed=result.get("confirmed"),
                               state="reaped" if result.get("confirmed") else "reap_not_confirmed")
                    d["notified"] = tell(opts, "reaped", {"box": box["host"], "rule": rule, "reason": why,
                                                          "confirmed": result.get("confirmed")})
                    if not result.get("confirmed"):
                        code = max(code, 1)
            if not opts.dry_run:
                ledger_mod.append(path, **row)
        if opts.digest_days and not opts.dry_run:
            digest = still_billing_digest(events, boxes, decisions, opts, now)
            if digest:
                ledger_mod.append(path, event="reap", notice="digest", boxes=digest["boxes"])
                decisions.append({"box": None, "host": None, "action": "digest", "rule": None,
                                  "why": digest["text"], "notified": digest["notified"]})
        if not opts.dry_run:
            core.atomic_write_json(os.path.join(os.path.dirname(os.path.abspath(path)), HEARTBEAT),
                                   {"reaped_at": core.utc_iso(now), "boxes": len(decisions), "exit": code})
    return decisions, code


def still_billing_digest(events, boxes, decisions, opts, now):
    """The opt-in digest (--digest-days): once per that many days, one message listing every box the providers
    still bill (running, or stopped with its disk) and every box with runs not through the gate that the reaper
    cannot see (no --instance). None when it is not due; a due digest with nothing to list sends nothing."""
    last = max((core.parse_iso(e.get("time")) or 0.0 for e in events
                if e.get("event") == "reap" and e.get("notice") == "digest"), default=0.0)
    if now - last < opts.digest_days * 86400.0:
        return None
    lines = []
    for d in decisions:
        if d.get("box") not in boxes:
            continue
        open_runs = [rid for rid, run in boxes[d["box"]]["runs"].items() if run.get("gate") != "PASS"]
        if d.get("provider_state") in ("running", "stopped"):
            lines.append("%s (%s) %s%s" % (d["host"], d["instance"], d["provider_state"],
                                          ", runs not gated: " + ", ".join(open_runs) if open_runs else ""))
        elif d.get("instance") is None and open_runs:
            lines.append("%s cannot be seen (no --instance), runs not gated: %s" % (d["host"], ", ".join(open_runs)))
    if not lines:
        return {"boxes": 0, "text": "nothing billing that the ledger knows of", "notified": None}
    text = "%d box(es) still billing or unseen: %s" % (len(lines), "; ".join(lines))
    return {"boxes": len(lines), "text": text,
            "notified": tell(opts, "still_billing", {"boxes": len(lines), "reason": text[:1500]})}


def terminate_due(box, opts, now, state):
    """Two-stage end: after --terminate-after-days of a stop the reaper made, every run gate-passed -> terminate."""
    if not opts.terminate_after_days or state != "stopped":
        return {}
    stops = [r for r in box["reaps"] if r.get("state") == "reaped"]
    if not stops or not all(run.get("gate") == "PASS" for run in box["runs"].values()):
        return {"terminate": "not due (needs a reaper's stop and every run through the gate)"}
    age = seconds_since(stops[-1].get("time"), now) or 0.0
    due = opts.terminate_after_days * 86400.0
    if age < due - 86400.0:
        return {"terminate": "due in %s" % core.human_age(due - age)}
    if age < due:
        if not opts.dry_run and not any(r.get("notice") == "terminate_soon" for r in box["reaps"]):
            tell(opts, "lease_expired", {"box": box["host"], "reason": "terminate in %s (stopped disks still bill)"
                                         % core.human_age(due - age)})
            ledger_mod.append(ledger_mod.path(opts.ledger), event="reap", host=box["host"],
                                   box=box["box"], reachable=None, notice="terminate_soon")
        return {"terminate": "in %s, told" % core.human_age(due - age)}
    if opts.dry_run:
        return {"action": "terminate"}
    result = stop_box(box, opts, action="terminate")
    ledger_mod.append(ledger_mod.path(opts.ledger), event="reap", host=box["host"], box=box["box"],
                           action="terminate", confirmed=result.get("confirmed"),
                           state="terminated" if result.get("confirmed") else "reap_not_confirmed")
    return {"action": "terminate", "confirmed": result.get("confirmed")}


# ---------------------------------------------------------------- the schedule

UNIT = "rgt-reap"


def schedule_files(opts):
    """{path: text} the schedule installs for --cron/--systemd/--launchd."""
    cmd = [sys.executable, os.path.join(HERE, "rgt.py")] + opts.ssh_options + ["reap"]
    if opts.notify_config:
        cmd += ["--notify-config", opts.notify_config]
    if opts.digest_days:
        cmd += ["--digest-days", "%g" % opts.digest_days]
    line = " ".join(core.shell_quote(w) for w in cmd) if hasattr(core, "shell_quote") else " ".join(
        __import__("shlex").quote(w) for w in cmd)
    home = os.path.expanduser("~")
    if opts.systemd:
        base = os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "systemd", "user")
        return {os.path.join(base, UNIT + ".service"):
                "[Unit]\nDescription=remote-gpu-trainer reaper (stops boxes the node cannot)\n\n[Service]\n"
                "Type=oneshot\nExecStart=%s\n" % line,
                os.path.join(base, UNIT + ".timer"):
                "[Unit]\nDescription=run %s every %d minutes\n\n[Timer]\nOnBootSec=2min\nOnUnitActiveSec=%dmin\n"
                "Persistent=true\n\n[Install]\nWantedBy=timers.target\n" % (UNIT, opts.every_minutes,
                                                                          opts.every_minutes)}
    if opts.launchd:
        args = "".join("    <string>%s</string>\n" % w.replace("&", "&amp;").replace("<", "&lt;") for w in cmd)
        return {os.path.join(home, "Library", "LaunchAgents", "dev.remote-gpu-trainer.reap.plist"):
                '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" '
                '"http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n<plist version="1.0">\n<dict>\n'
                "  <key>Label</key><string>dev.remote-gpu-trainer.reap</string>\n  <key>ProgramArguments</key>\n"
                "  <array>\n%s  </array>\n  <key>StartInterval</key><integer>%d</integer>\n</dict>\n</plist>\n"
                % (args, opts.every_minutes * 60)}
    return {"crontab": "*/%d * * * * %s >/dev/null 2>&1  # %s\n" % (opts.every_minutes, line, UNIT)}


def crontab_lines():
    res = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    return res.stdout.splitlines() if res.returncode == 0 else []


def install(opts, remove=False):
    if not (opts.cron or opts.systemd or opts.launchd):
        raise core.UsageError("say which scheduler: --cron, --systemd or --launchd")
    files = schedule_files(opts)
    if opts.print_only:
        for path, body in files.items():
            print("# %s\n%s" % (path, body))
        return 0
    if opts.cron:
        try:
            kept = [l for l in crontab_lines() if not l.rstrip().endswith("# " + UNIT)]
            new = kept + ([] if remove else [files["crontab"].rstrip("\n")])
            res = subprocess.run(["crontab", "-"], input="\n".join(new) + "\n", text=True, capture_output=True,
                                 timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise core.CheckFailed("crontab could not be run: %s" % exc)
        if res.returncode != 0:
            raise core.CheckFailed("crontab refused the schedule: %s" % res.stderr.strip()[:200])
        present = any(l.rstrip().endswith("# " + UNIT) for l in crontab_lines())
        if present == remove:
            raise core.CheckFailed("crontab -l does not show the change")
        print("%s %s the reaper %s crontab (every %d min)" % (core.OK, "removed" if remove else "installed",
                                                           "from" if remove else "in", opts.every_minutes))
        return 0
    for path, body in files.items():
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            core.atomic_write(path, body.encode())
        if os.path.exists(path) == remove:
            raise core.CheckFailed("%s is not as it should be" % path)
        print("%s %s %s" % (core.OK, "removed" if remove else "wrote", path))
    if not remove:
        print("next: %s" % ("systemctl --user daemon-reload && systemctl --user enable --now %s.timer" % UNIT
                            if opts.systemd else "launchctl load -w %s" % next(iter(files))))
    return 0


def heartbeat_warning(ledger_file, now=None):
    """One line when no reap wrote its heartbeat beside LEDGER_FILE in 24 h; None otherwise."""
    path = os.path.join(os.path.dirname(os.path.abspath(ledger_file)), HEARTBEAT)
    doc = core.read_json(path)
    at = core.parse_iso(doc.get("reaped_at")) if doc.get("reaped_at") else None
    now = time.time() if now is None else now
    if at is not None and now - at < HEARTBEAT_WARN_S:
        return None
    return ("WARN no reaper has run for this ledger in 24 h: nothing off the box stops it if it hangs "
            "(rgt.py reap install --cron)")


# ---------------------------------------------------------------- command line

def build_parser():
    parser = core.Parser(prog="rgt.py reap", description=core.help_description(__doc__),
                         formatter_class=core.RawHelp,
                         epilog="Exit codes: 0 nothing to stop, or every stop confirmed; 1 a stop NOT CONFIRMED, or "
                                "a box or provider unreadable; 2 usage; 3 another reap holds the lock; 10 "
                                "--dry-run would stop a box.")
    parser.add_argument("action", nargs="?", choices=("run", "install", "uninstall"), default="run")
    parser.add_argument("--ledger", help="the run ledger (default: rgt.py's)")
    parser.add_argument("--ssh-config", help="ssh config for the status trips")
    parser.add_argument("-p", "--port", help="ssh port")
    parser.add_argument("-i", "--identity", help="ssh identity file")
    parser.add_argument("--node-dir", help="the toolkit's folder on the nodes (default: rgt.py's)")
    parser.add_argument("--dry-run", action="store_true", help="say what it would do and why; change nothing")
    parser.add_argument("--json", action="store_true", help="each decision with its facts, as one JSON object")
    parser.add_argument("--notify-config", help="a 0600 notify.json on this machine (lease_expired, reaped)")
    number = core.arg_number(float, 0.0)
    parser.add_argument("--done-grace-minutes", dest="done_grace", type=number, default=30.0,
                        help="rule done: minutes after the last gate PASS (default 30)")
    parser.add_argument("--unwatched-grace-minutes", dest="unwatched_grace", type=number, default=10.0,
                        help="rule unwatched: minutes past the lease's TTL (default 10)")
    parser.add_argument("--terminate-after-days", type=core.arg_number(float, 0.0, low_open=True),
                        help="opt-in: terminate an instance the reaper stopped this many days ago, all runs "
                             "gate-passed (told a day before)")
    parser.add_argument("--timeout", type=core.arg_number(float, 0.0, 600, low_open=True), default=30.0,
                        help="seconds one provider request may take (default 30)")
    parser.add_argument("--poll-seconds", type=core.arg_number(float, 0.0, 600), default=10.0,
                        help="seconds between state reads after a stop (default 10)")
    parser.add_argument("--cap-seconds", type=core.arg_number(float, 0.0, 3600, low_open=True), default=240.0,
                        help="how long a stop is read back before NOT CONFIRMED (default 240)")
    parser.add_argument("--trip-timeout", type=core.arg_number(float, 0.0, 3600, low_open=True), default=180.0,
                        help="seconds the status trip to one box may take (default 180)")
    parser.add_argument("--digest-days", type=core.arg_number(float, 0.0, 366, low_open=True),
                        help="opt-in: every this many days, a still_billing message (--notify-config) listing the "
                             "boxes still billing (e.g. 7)")
    parser.add_argument("--lock-wait", type=core.arg_number(float, 0.0, 3600), default=600.0,
                        help="seconds to wait for another reap's lock (default 600)")
    for flag in ("--cron", "--systemd", "--launchd"):
        parser.add_argument(flag, action="store_true", help="install/uninstall: the %s schedule" % flag[2:])
    parser.add_argument("--every-minutes", type=int, default=15, help="install: how often (default 15)")
    parser.add_argument("--print", dest="print_only", action="store_true", help="install: print, write nothing")
    return parser


def main(argv=None):
    opts = build_parser().parse_args(argv)
    core.guard_output(opts.json)
    opts.ssh_options = [w for flag, value in (("--ssh-config", opts.ssh_config), ("-p", opts.port),
                                              ("-i", opts.identity), ("--ledger", opts.ledger),
                                              ("--node-dir", opts.node_dir)) if value
                        for w in (flag, value)]
    if opts.action in ("install", "uninstall"):
        return install(opts, remove=opts.action == "uninstall")
    if opts.notify_config:           # a config that cannot send is said now, not found out at the first stop
        import notify
        if notify.load_config(opts.notify_config) is None:
            raise core.UsageError("--notify-config %s: no such file" % opts.notify_config)
    decisions, code = reap(opts)
    if opts.json:
        core.emit_json({"ok": code == 0, "dry_run": opts.dry_run, "decisions": decisions, "exit": code})
        return code
    if not decisions:
        print("%s reap: the ledger names no box" % core.OK)
    for d in decisions:
        word = {"stop": "REAPED" if d.get("confirmed") else ("WOULD STOP" if opts.dry_run else "NOT CONFIRMED"),
                "notify": "TOLD", "unknown": "UNKNOWN", "terminate": "TERMINATED",
                "digest": "DIGEST"}.get(d["action"], core.OK)
        print("%-13s %s%s%s: %s" % (word, d["host"] or "all boxes", " (%s)" % d["instance"] if d.get("instance") else "",
                                     " rule %s" % d["rule"] if d.get("rule") else "", d.get("why")))
    return code


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="rgt.py reap"))
