#!/usr/bin/env python3
"""billing: what is still billing you, and what a run may cost (laptop side; rgt.py billing / launch / status).

Read-only. For every provider you have laptop credentials for, it lists every instance and storage object
through the provider's API (scripts/node/provider_*.py), with state and $/h where the API gives one, joins them
with the run ledger (rgt.py's, --ledger), and classifies each:

  UNKNOWN TO THE LEDGER      no launch in the ledger names this instance (by --instance, or by the ssh host)
  STOPPED, STORAGE BILLING   compute is off but its disk, volume or filesystem still bills until deleted
  RUNNING, NO ACTIVE RUN     compute bills, and no run the ledger knows on it is still in progress
  OK                         a run the ledger knows is in progress on it (or storage used by one)

Credentials (the providers' own CLIs' places; nothing is written):
  runpod      RUNPOD_API_KEY, else ~/.runpod/config.toml ([default] api_key)
  vastai      VAST_API_KEY, else $XDG_CONFIG_HOME/vastai/vast_api_key, else ~/.vast_api_key
  lambda      LAMBDA_API_KEY, else ~/.lambda_cloud/lambda_keys (api_key = ..., mode 0600)
  paperspace  PAPERSPACE_API_KEY
API bases can be pointed elsewhere with RGT_RUNPOD_API_URL (or RUNPOD_API_BASE_URL), RGT_VASTAI_API_URL (or
VAST_URL), RGT_LAMBDA_API_URL, RGT_PAPERSPACE_API_URL.

Usage:
  billing.py [--ledger FILE] [--timeout S] [--json]     (what `rgt.py billing` runs)

Exit codes: 0 everything listed is OK (or nothing is listed); 1 something is billing without a run, or a
provider could not be read; 2 usage.
"""
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402

PROVIDERS = ("runpod", "vastai", "lambda", "paperspace")
UNKNOWN, STOPPED, IDLE, OK = ("UNKNOWN TO THE LEDGER", "STOPPED, STORAGE BILLING", "RUNNING, NO ACTIVE RUN", "OK")
TERMINAL = runrec.REPORTED_OVER + ("launch_failed", "dead-man fired")   # and the ledger's own words for an end


# ---------------------------------------------------------------- the ledger, read for billing

def ledger_runs(events):
    """{(host, run_id): record} with what billing needs: instance, rate, budget, first launch time, state."""
    runs = {}
    for event in events:
        rid = event.get("run_id")
        if not rid:
            continue
        rec = runs.setdefault((event.get("host"), rid), {"host": event.get("host"), "run_id": rid, "gate": None,
                                                        "state": None, "instance": None, "rate_per_hour": None,
                                                        "max_cost": None, "max_hours": None, "launched_at": None})
        kind = event.get("event")
        if kind in ("launch", "resume") and event.get("state") == "launched":
            rec["gate"] = None
            if rec["launched_at"] is None:
                rec["launched_at"] = core.parse_iso(event.get("time"))
        if kind == "gate":
            rec["gate"] = event.get("verdict")
        for key in ("instance", "rate_per_hour", "max_cost", "max_hours", "profile"):
            if event.get(key) is not None:
                rec[key] = event[key]
        if event.get("state"):
            rec["state"] = str(event["state"]).lower()
    return runs


def active(rec):
    return rec.get("gate") != "PASS" and (rec.get("state") or "launched") not in TERMINAL


def host_name(host):
    """The machine part of an ssh target: user@[::1] -> ::1, user@host -> host."""
    host = (host or "").rsplit("@", 1)[-1]
    return host.strip("[]").lower()


def matches(item, rec):
    inst = rec.get("instance")
    if inst and inst == "%s:%s" % (item["provider"], item["id"]):
        return True
    host = host_name(rec.get("host"))
    names = {str(item.get(k)).lower() for k in ("ip", "ssh_host", "hostname") if item.get(k)}
    return bool(host) and host in names and not (inst and not inst.startswith(item["provider"] + ":"))


def classify(items, runs):
    """Label each listed item (instances first: storage is OK only while a run on that provider is active)."""
    busy = set()
    for item in items:
        if item["kind"] in STORAGE_KINDS:
            continue
        recs = [r for r in runs.values() if matches(item, r)]
        item["ledger"] = [{"host": r["host"], "run_id": r["run_id"], "state": r.get("state"), "gate": r.get("gate")}
                          for r in recs]
        live = [r for r in recs if active(r)]
        if not recs:
            item["label"] = UNKNOWN
        elif item["state"] == "stopped":
            item["label"] = STOPPED
        elif item["state"] == "gone":
            item["label"] = OK
        elif not live:
            item["label"] = IDLE
        else:
            item["label"] = OK
            busy.add(item["provider"])
    for item in items:
        if item["kind"] in STORAGE_KINDS:
            item["ledger"] = []
            item["label"] = OK if item["provider"] in busy else STOPPED
    return items


STORAGE_KINDS = ("network volume", "volume", "filesystem")


def collect(environ=None, home=None, timeout=30.0, only=None):
    """(items, providers): every instance and storage object the laptop's credentials can see."""
    import providers as pv   # here, not at the top: rgt.py imports this module for every command
    items, report = [], []
    for name in only or PROVIDERS:
        try:
            adapter = pv.laptop_adapter(name, environ, home)
        except pv.ProviderError as exc:
            report.append({"provider": name, "credentials": True, "error": exc.as_dict()})
            continue
        if adapter is None:
            report.append({"provider": name, "credentials": False, "error": None})
            continue
        try:
            listed = adapter.list(timeout)
        except pv.ProviderError as exc:
            report.append({"provider": name, "credentials": True, "error": exc.as_dict()})
            continue
        got = listed.get("instances", []) + listed.get("storage", [])
        report.append({"provider": name, "credentials": True, "error": None, "listed": len(got)})
        items.extend(got)
    return items, report


def report_billing(events, environ=None, home=None, timeout=30.0):
    items, providers = collect(environ, home, timeout)
    classify(items, ledger_runs(events))
    counts = {}
    for item in items:
        counts[item["label"]] = counts.get(item["label"], 0) + 1
    known_rate = [i["rate_per_hour"] for i in items if i["label"] != OK and i.get("rate_per_hour") and
                  i["state"] not in ("stopped", "gone")]
    return {"items": items, "providers": providers, "counts": counts,
            "unattended_rate_per_hour": round(sum(known_rate), 4) if known_rate else 0.0,
            "ok": all(i["label"] == OK for i in items) and not any(p.get("error") for p in providers)}


def human_report(doc):
    lines = []
    for p in doc["providers"]:
        if p.get("error"):
            lines.append("%s %-10s could not be read: %s" % (core.FAIL, p["provider"], p["error"]["message"]))
        elif not p["credentials"]:
            lines.append("%s %-10s no laptop credentials (skipped)" % (core.SKIP, p["provider"]))
    order = {UNKNOWN: 0, IDLE: 1, STOPPED: 2, OK: 3}
    for item in sorted(doc["items"], key=lambda i: (order[i["label"]], i["provider"], i["id"])):
        rate = "$%.2f/h" % item["rate_per_hour"] if item.get("rate_per_hour") is not None else "$?/h"
        runs = ", ".join("%s %s" % (r["host"], r["run_id"]) for r in item.get("ledger") or []) or "-"
        lines.append("%-24s %-10s %-15s %-14s %-9s %-8s %s  ledger: %s" % (
            item["label"], item["provider"], item["kind"], item["id"], item["state"], rate, item.get("name") or "",
            runs))
    if not doc["items"]:
        lines.append("%s nothing listed by any provider you have credentials for" % core.OK)
    elif doc["ok"]:
        lines.append("%s everything billing has a run in progress" % core.OK)
    else:
        lines.append("%s compute billing without a run: $%.2f/h where the API gives a rate; storage bills until "
                     "deleted. This report changes nothing." % (core.WARN, doc["unattended_rate_per_hour"]))
    return "\n".join(lines)


# ---------------------------------------------------------------- budget and cost so far

def plan_budget(max_cost, rate, options):
    """The wall-clock cap a budget buys: (new run_one options, hours, note). An existing --max-hours that is
    already tighter is kept. Hours are rounded DOWN so the cap never buys more than the budget. The dead-man
    is also told the budget and the rate (--deadman-arg --budget-usd=, --rate-per-hour=), so it can send
    budget_80 and budget_100 (notify.py)."""
    if max_cost is None:
        return list(options), None, None
    if rate is None:
        raise core.UsageError("--max-cost needs the hourly rate: pass --rate-per-hour, or --instance "
                              "PROVIDER:ID with laptop credentials for that provider")
    if not (rate > 0 and max_cost > 0) or math.isinf(rate) or math.isinf(max_cost):
        raise core.UsageError("--max-cost and the rate must be positive numbers")
    hours = core.budget_hours(max_cost, rate)
    if hours <= 0:
        raise core.UsageError("--max-cost %.4g buys no time at %.4g/h" % (max_cost, rate))
    out, given = [], None
    skip = False
    for i, word in enumerate(options):
        if skip:
            skip = False
            continue
        if word == "--max-hours" and i + 1 < len(options):
            given, skip = options[i + 1], True
            continue
        if word.startswith("--max-hours="):
            given = word.split("=", 1)[1]
            continue
        out.append(word)
    note = "budget: at most %.2f (%.4g h at %.4g/h); the dead-man's wall-clock cap is --max-hours %g" % (
        max_cost, hours, rate, hours)
    if given is not None:
        try:
            given_h = float(given)
        except ValueError:
            raise core.UsageError("--max-hours %r is not a number" % given)
        if given_h <= hours:
            hours = given_h
            note = "budget: --max-hours %g is already within %.2f at %.4g/h (most it can cost: %.2f)" % (
                given_h, max_cost, rate, given_h * rate)
    out += ["--max-hours", "%.12g" % hours, "--deadman-arg", "--budget-usd=%.12g" % max_cost,
            "--deadman-arg", "--rate-per-hour=%.12g" % rate]
    return out, hours, note


def rate_from_provider(instance, environ=None, home=None, timeout=30.0):
    """$/h of INSTANCE ("provider:id") as the provider lists it, or None."""
    provider, sep, ident = (instance or "").partition(":")
    if not sep or provider not in PROVIDERS or not ident:
        raise core.UsageError("--instance must be PROVIDER:ID with PROVIDER one of %s" % ", ".join(PROVIDERS))
    items, report = collect(environ, home, timeout, only=(provider,))
    for item in items:
        if item["id"] == ident and item["kind"] not in STORAGE_KINDS:
            return item.get("rate_per_hour")
    return None


def cost_so_far(events, host, rid, rate=None, now=None):
    """{rate_per_hour, hours, cost, max_cost, line} from the ledger row: rate x hours since the first launch."""
    rec = ledger_runs(events).get((host, rid)) or {}
    rate = rate if rate is not None else rec.get("rate_per_hour")
    start = rec.get("launched_at")
    now = time.time() if now is None else now
    hours = max(0.0, (now - start) / 3600.0) if start else None
    out = {"rate_per_hour": rate, "hours": None if hours is None else round(hours, 4), "cost": None,
           "max_cost": rec.get("max_cost")}
    if rate is None or hours is None:
        out["line"] = "cost so far: unknown (%s)" % ("no launch of this run in the ledger" if hours is None else
                                                     "no rate: pass --rate-per-hour, or launch with one")
        return out
    out["cost"] = round(rate * hours, 2)
    out["line"] = "cost so far: %.2f (%.4g/h x %.2f h since the first launch, from the ledger)%s" % (
        out["cost"], rate, hours, "" if out["max_cost"] is None else "; budget %.2f" % out["max_cost"])
    return out


# ---------------------------------------------------------------- command line

EXIT_EPILOG = core.exit_codes_epilog(__doc__)  # rgt.py billing shows it too


def build_parser():
    parser = core.Parser(prog="billing.py", description="What is still billing you (read-only; see the docstring).",
                         formatter_class=core.RawHelp, epilog=EXIT_EPILOG)
    parser.add_argument("--ledger", help="the run ledger (default: rgt.py's)")
    parser.add_argument("--timeout", type=core.arg_number(float, 0.0, 600, low_open=True), default=30.0,
                        help="seconds one provider request may take (default 30)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def run(ledger_events, ledger_file, as_json, timeout):
    doc = report_billing(ledger_events, timeout=timeout)
    doc["ledger"] = ledger_file
    if as_json:
        core.emit_json(doc)
    else:
        print(human_report(doc))
    return 0 if doc["ok"] else 1


def main(argv=None):
    args = build_parser().parse_args(argv)
    import rgt
    path = rgt.ledger_path(args.ledger)
    return run(rgt.ledger_events(path), path, args.json, args.timeout)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="billing.py"))
