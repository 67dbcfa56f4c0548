#!/usr/bin/env python3
"""billing: what is still billing you, and what a run may cost (laptop side; rgt.py billing / launch / status).

Read-only. For every provider you have laptop credentials for, it lists every instance and storage object
through the provider's API (scripts/node/provider_*.py), with state and $/h where the API gives one, joins them
with the run ledger (scripts/ledger.py, --ledger) by box identity, and classifies each:

  UNKNOWN TO THE LEDGER      no run in the ledger is on this very box: its --instance PROVIDER:ID, or its ssh
                             address (host AND port; a shared gateway host alone never matches)
  RUNNING, NO ACTIVE RUN     compute bills, and no run the ledger knows on it is still in progress
  STOPPED, STORAGE BILLING   compute is off; what it bills while stopped (its disk or volume) is shown
  STORAGE BILLING            a volume or filesystem not attached to an instance with a live run: it bills until
                             deleted (shown with the rate the API gives, or what it bills by)
  OK                         a run the ledger knows is in progress on it (or storage attached to such a box)

And for the view itself, it fails closed:
  UNKNOWN provider X: why    the provider could not be read: an error, a timeout, an answer of the wrong shape
                             (an error object, an empty body, no instance list), or a key file that cannot be
                             used (unreadable, or readable by others). Never read as "nothing listed".
  CANNOT SEE X               the ledger has live runs there and the laptop has no credentials for X
  NOT LISTED BY X            a live ledger run on X that X does not list: terminated (nothing bills), or under
                             another account or key (it may still bill)

OK is printed only when every provider with credentials answered, the ledger's providers are all seen, and
everything billing is matched to a live run on that very box.

Credentials (the providers' own CLIs' places; nothing is written):
  runpod      RUNPOD_API_KEY, else ~/.runpod/config.toml ([default] api_key)
  vastai      VAST_API_KEY, else $XDG_CONFIG_HOME/vastai/vast_api_key, else ~/.vast_api_key
  lambda      LAMBDA_API_KEY, else ~/.lambda_cloud/lambda_keys (api_key = ..., mode 0600)
  paperspace  PAPERSPACE_API_KEY
API bases can be pointed elsewhere with RGT_RUNPOD_API_URL (or RUNPOD_API_BASE_URL), RGT_VASTAI_API_URL (or
VAST_URL), RGT_LAMBDA_API_URL, RGT_PAPERSPACE_API_URL.

Usage:
  billing.py [--ledger FILE] [--timeout S] [--json]     (what `rgt.py billing` runs)

Exit codes: 0 everything listed is OK (or nothing is listed, and the ledger has no live run where the laptop
cannot look); 1 something is billing without a run, or a live ledger run is not listed; 2 usage; 4 the view is
incomplete: a provider could not be read (UNKNOWN provider) or cannot be seen (CANNOT SEE), so nothing it
bills is known.
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402
import ledger  # noqa: E402  (scripts/ledger.py: the one fold of the ledger, keyed by box identity)

PROVIDERS = ("runpod", "vastai", "lambda", "paperspace")
UNKNOWN, STOPPED, IDLE, OK = ("UNKNOWN TO THE LEDGER", "STOPPED, STORAGE BILLING", "RUNNING, NO ACTIVE RUN", "OK")
STORAGE = "STORAGE BILLING"
UNKNOWN_PROVIDER, CANNOT_SEE, NOT_LISTED = "UNKNOWN provider", "CANNOT SEE", "NOT LISTED BY"
EXIT_INCOMPLETE = 4
STORAGE_KINDS = ("network volume", "volume", "filesystem")
money = ledger.money


# ---------------------------------------------------------------- joining the ledger's runs to the listing

def address_parts(address):
    """(host, port or None) of a box address user@host:port (or an old row's bare host)."""
    host = (address or "").rsplit("@", 1)[-1]
    port = None
    if host.startswith("["):
        inner, _, rest = host[1:].partition("]")
        host, port = inner, rest[1:] if rest.startswith(":") else None
    elif host.count(":") == 1:
        host, port = host.split(":")
    return host.lower(), (port if port and port.isdigit() else None)


def matches(item, rec):
    """Whether run REC is on listed instance ITEM: the launch's --instance PROVIDER:ID when it has one, else
    the box address, host AND port (many instances share one ssh gateway host; the port tells them apart)."""
    inst = rec.get("instance")
    if inst:
        return inst == "%s:%s" % (item["provider"], item["id"])
    host, port = address_parts(rec.get("box") or rec.get("host"))
    names = {str(item.get(k)).lower() for k in ("ip", "ssh_host", "hostname") if item.get(k)}
    if not host or host not in names:
        return False
    listed_port = str(item["ssh_port"]) if item.get("ssh_port") is not None else "22"
    return (port or "22") == listed_port


def run_provider(rec):
    """The provider a ledger run is on, as the ledger says (its --instance, else its profile), or None."""
    inst = rec.get("instance") or ""
    name = inst.partition(":")[0] if ":" in inst else rec.get("profile")
    return name if name in PROVIDERS else None


def run_ref(rec):
    return {"host": rec.get("host"), "box": rec.get("box"), "run_id": rec["run_id"], "state": rec.get("run_state"),
            "gate": rec.get("gate"), "instance": rec.get("instance")}


def classify(items, runs):
    """Label each listed item. Instances first; then storage: OK only when attached to an instance that has a
    live run (by the attachment the API reports), else STORAGE BILLING."""
    live_boxes = set()
    for item in items:
        if item["kind"] in STORAGE_KINDS:
            continue
        recs = [r for r in runs.values() if matches(item, r)]
        item["ledger"] = [run_ref(r) for r in recs]
        live = [r for r in recs if ledger.active(r)]
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
            live_boxes.add((item["provider"], item["id"]))
            live_boxes.update((item["provider"], "vol:" + v) for v in item.get("volumes") or [])
        if item["state"] == "stopped":   # what it bills while stopped, not its running price
            item["running_rate_per_hour"], item["rate_per_hour"] = item.get("rate_per_hour"), None
            item["bills_now"] = item.get("stopped_bills") or "its disk while it exists (the API gives no price)"
    for item in items:
        if item["kind"] not in STORAGE_KINDS:
            continue
        item["ledger"] = []
        attached = [(item["provider"], i) for i in item.get("attached_to") or []]
        named = [(item["provider"], "vol:" + n) for n in (item["id"], item.get("name")) if n]
        if any(a in live_boxes for a in attached + named):
            item["label"] = OK
        else:
            item["label"] = STORAGE
            item["bills_now"] = item.get("rate_note") or "bills while it exists"
    return items


def unlisted_runs(items, runs, providers):
    """Live ledger runs on a provider that answered but does not list their box, and the providers the ledger
    has live runs on that the laptop cannot look at."""
    answered = {p["provider"] for p in providers if p["credentials"] and not p.get("error")}
    blind = {p["provider"] for p in providers if not p["credentials"]}
    matched = {id(r) for i in items if i["kind"] not in STORAGE_KINDS for r in runs.values() if matches(i, r)}
    missing, unseen = [], {}
    for rec in runs.values():
        name = run_provider(rec)
        if not name or not ledger.active(rec):
            continue
        if name in blind:
            unseen.setdefault(name, []).append(run_ref(rec))
        elif name in answered and id(rec) not in matched:
            missing.append(dict(run_ref(rec), provider=name))
    return missing, unseen


def collect(environ=None, home=None, timeout=30.0, only=None):
    """(items, providers): every instance and storage object the laptop's credentials can see. A provider that
    cannot be read (an error, a timeout, a wrong-shaped answer, a key file that cannot be used) has an error."""
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
            got = listed["instances"] + listed["storage"]
            if not all(isinstance(i, dict) and i.get("id") not in (None, "None") for i in got):
                raise pv.ProviderError("http", "%s: a listed item has no id" % name)
        except pv.ProviderError as exc:
            report.append({"provider": name, "credentials": True, "error": exc.as_dict()})
            continue
        except (AttributeError, KeyError, TypeError, ValueError) as exc:   # a shape no adapter check foresaw
            report.append({"provider": name, "credentials": True, "error": {
                "kind": "http", "message": "%s: answer of an unexpected shape (%s)" % (name, type(exc).__name__),
                "retry_after": None}})
            continue
        report.append({"provider": name, "credentials": True, "error": None, "listed": len(got)})
        items.extend(got)
    return items, report


def report_billing(events, environ=None, home=None, timeout=30.0):
    items, providers = collect(environ, home, timeout)
    runs, boxes = ledger.fold(events)   # the one fold, keyed by box identity
    classify(items, runs)
    for item in items:   # the reaper's last stop of the box this item is, said beside it
        keys = {(r["box"], r["machine_id"]) for r in runs.values() if matches(item, r)}
        reaps = [ledger.last_reap(boxes[k]) for k in keys if k in boxes and ledger.last_reap(boxes[k])]
        if reaps:
            item["reaped"] = max(reaps, key=lambda r: r.get("time") or "")
    missing, unseen = unlisted_runs(items, runs, providers)
    for p in providers:
        p["cannot_see"] = unseen.get(p["provider"])
    counts = {}
    for item in items:
        counts[item["label"]] = counts.get(item["label"], 0) + 1
    known_rate = [i["rate_per_hour"] for i in items if i["label"] != OK and i.get("rate_per_hour") and
                  i["state"] not in ("stopped", "gone")]
    incomplete = any(p.get("error") or p.get("cannot_see") for p in providers)
    ok = all(i["label"] == OK for i in items) and not missing and not incomplete
    return {"items": items, "providers": providers, "counts": counts, "not_listed": missing,
            "unattended_rate_per_hour": round(sum(known_rate), 4) if known_rate else 0.0,
            "ok": ok, "incomplete": incomplete,
            "exit": core.EXIT_OK if ok else EXIT_INCOMPLETE if incomplete else core.EXIT_FAIL}


def human_report(doc):
    lines = []
    for p in doc["providers"]:
        if p.get("error"):
            lines.append("%s %s: %s" % (UNKNOWN_PROVIDER, p["provider"], p["error"]["message"]))
        elif p.get("cannot_see"):
            lines.append("%s %s: the ledger has %d live run(s) there (%s) and the laptop has no credentials for "
                         "%s; what it bills is unknown" % (
                             CANNOT_SEE, p["provider"], len(p["cannot_see"]),
                             ", ".join("%s %s" % (r["box"], r["run_id"]) for r in p["cannot_see"]), p["provider"]))
        elif not p["credentials"]:
            lines.append("%s %-10s no laptop credentials, and no live run of the ledger's there (skipped)" % (
                core.SKIP, p["provider"]))
    order = {UNKNOWN: 0, IDLE: 1, STOPPED: 2, STORAGE: 3, OK: 4}
    for item in sorted(doc["items"], key=lambda i: (order[i["label"]], i["provider"], i["id"])):
        rate = "$%s/h" % money(item["rate_per_hour"]) if item.get("rate_per_hour") is not None else "$?/h"
        if item.get("bills_now"):
            rate += " (bills %s)" % item["bills_now"] if item["label"] != STORAGE else " (%s)" % item["bills_now"]
        runs = ", ".join("%s %s" % (r["box"] or r["host"], r["run_id"]) for r in item.get("ledger") or []) or "-"
        reaped = item.get("reaped")
        lines.append("%-24s %-10s %-15s %-14s %-9s %-8s %s  ledger: %s%s" % (
            item["label"], item["provider"], item["kind"], item["id"], item["state"], rate, item.get("name") or "",
            runs, "  %s by the reaper (rule %s, %s)" % ("REAPED" if reaped["confirmed"] else "REAP NOT CONFIRMED",
                                                      reaped["rule"] or "-", reaped["time"]) if reaped else ""))
    for rec in doc["not_listed"]:
        lines.append("%s %s: ledger run %s on %s (%s) is not listed: terminated (nothing bills), or under another "
                     "account or key (it may still bill)" % (NOT_LISTED, rec["provider"], rec["run_id"],
                                                            rec["box"] or rec["host"], rec["instance"] or "no --instance"))
    if doc["ok"]:
        skipped = [p["provider"] for p in doc["providers"] if not p["credentials"]]
        lines.append("%s %s%s" % (core.OK, "everything billing has a run in progress on that very box" if doc["items"]
                                  else "nothing listed by any provider you have credentials for",
                                  "; not looked at (no laptop credentials): %s" % ", ".join(skipped) if skipped
                                  else ""))
    elif doc["incomplete"]:
        lines.append("%s the view is INCOMPLETE: a provider above could not be read or seen, so what it bills is "
                     "unknown (not zero). This report changes nothing." % core.FAIL)
    else:
        lines.append("%s compute billing without a run: $%s/h where the API gives a rate; storage bills until "
                     "deleted. This report changes nothing." % (core.WARN, money(doc["unattended_rate_per_hour"])))
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
    note = ("budget: at most %s (%.4g h at %.4g/h); counted from the run's first start across attempts, "
            "re-arms and reboots; the dead-man's wall-clock cap is --max-hours %g" % (money(max_cost), hours, rate, hours))
    if given is not None:
        try:
            given_h = float(given)
        except ValueError:
            raise core.UsageError("--max-hours %r is not a number" % given)
        if given_h <= hours:
            hours = given_h
            note = "budget: --max-hours %g is already within %s at %.4g/h (most it can cost: %s)" % (
                given_h, money(max_cost), rate, money(given_h * rate))
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


cost_so_far = ledger.cost_so_far   # one formula, one module (ledger.py); kept here for billing's callers


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
    return doc["exit"]


def main(argv=None):
    args = build_parser().parse_args(argv)
    path = ledger.path(args.ledger)
    return run(ledger.events(path), path, args.json, args.timeout)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="billing.py"))
