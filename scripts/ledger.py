"""ledger: the run ledger on the laptop, and the one way it is read (stdlib only; no command line).

Every laptop module that reads or writes the ledger uses this one: rgt.py (launch, status, ledger, ...),
billing.py, notify_cli.py and reap.py. It imports none of them, so no import circle runs through it.

  path(explicit)          the ledger file: --ledger, else $XDG_STATE_HOME/remote-gpu-trainer/ledger.jsonl
  append(path, **row)     one row as ONE fsynced write of one JSON line; a short write is undone
  writable(path)          UsageError unless a row could be appended now (checked before the node acts)
  events(path, torn)      the rows in order; torn lines are skipped (and reported in TORN)
  fold(events)            ({(address, machine id, run id): run}, {(address, machine id): box}): the ONE fold,
                          keyed by box identity (user@hostname:port as ssh resolves it, plus the node's machine
                          id); rows older than box addresses key by their host string
  cost_so_far(...)        what a run has cost: rate x the run's budget clock, with the basis said
  reuse_refusal(rec, ...) why a launch of a run id the box already ran is refused (None: it never started)

A run's state ("run_state") is set only by rows that ask the node or start an attempt (launch, resume,
status, patrol): a later pull or gate row never turns a finished run back into a running one.

Cost so far, one formula on the node and here (runrec.budget_spent_hours): the hours since the run's FIRST
start, across attempts, re-arms and reboots, less the time the box was suspended. The node's dead-man keeps
that clock in RUN_DIR/budget.json; a status row copies it into the ledger ("budget"). Without such a copy the
laptop counts from the ledger's first launch row (nothing subtracted: an upper bound).
"""
import errno
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.join(HERE, "node") not in sys.path:
    sys.path.insert(0, os.path.join(HERE, "node"))
import rgt_core as core  # noqa: E402
import runrec  # noqa: E402  (the run's state words; the budget clock)

# rows that say what the run is doing now; any other row (pull, gate, sweep, reap) leaves run_state alone
RUN_STATE_EVENTS = ("launch", "resume", "status", "patrol")
TERMINAL = runrec.REPORTED_OVER + ("launch_failed", "dead-man fired")   # and the ledger's own words for an end


def path(explicit=None):
    if explicit:
        return explicit
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "remote-gpu-trainer", "ledger.jsonl")


class LedgerError(OSError):
    """The ledger could not be written (read-only, full, gone)."""


def append(file, **event):
    """Append one event as ONE write of one JSON line (fsynced): the ledger only ever grows. A short write (a
    full disk) is undone (the file is cut back to its old size) and raised, so a torn row never glues itself to
    the next one; a file that does not end in a newline (a crash mid-row) gets one first."""
    event["time"] = core.utc_iso()
    os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        lead = b""
        if size:
            os.lseek(fd, size - 1, os.SEEK_SET)
            lead = b"" if os.read(fd, 1) == b"\n" else b"\n"
        data = lead + (json.dumps(event, sort_keys=True) + "\n").encode("utf-8")
        try:
            written = os.write(fd, data)
        except OSError:
            written = -1
            raise
        finally:
            if written != len(data):
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
        if written != len(data):
            raise LedgerError(errno.ENOSPC, "short write (%d of %d bytes; disk full?), row undone" % (
                written, len(data)))
        os.fsync(fd)
    finally:
        os.close(fd)


def writable(file):
    """Raise UsageError unless a row could be appended to FILE now (folder creatable, file openable): checked
    before a command acts on the node, so a launch never runs unrecorded."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
        os.close(os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    except OSError as exc:
        raise core.UsageError("the run ledger %s cannot be written (%s): nothing was started; pass --ledger FILE "
                              "(or set XDG_STATE_HOME) to a writable place" % (file, exc.strerror or exc))


def events(file, torn=None):
    """The ledger's rows in order. Lines that are not one JSON object (a row torn by a crash or a full disk)
    are skipped and, when TORN is a list, reported there as (line number, first characters)."""
    rows = []
    try:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if isinstance(event, dict):
                    rows.append(event)
                elif torn is not None:
                    torn.append((number, line.strip()[:80]))
    except (FileNotFoundError, NotADirectoryError):
        pass   # no ledger there (yet): nothing recorded
    except OSError as exc:
        raise core.UsageError("cannot read the ledger %s: %s" % (file, exc.strerror))
    return rows


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fold(rows):
    """Fold rows into one record per (box, run id), plus one per box. A box key is (address, machine id):
    rows written before the box's machine id was known count for the first machine seen at that address; a
    push that finds another machine there starts a new box. Rows older than box addresses key by host."""
    runs, boxes, machine_at = {}, {}, {}
    for index, event in enumerate(rows):
        address = event.get("box") or event.get("host")
        if address is None and event.get("event") == "reap":
            continue      # the reaper's digest row: about every box, no box of its own
        mid = event.get("machine_id") if event.get("event") == "push" else None
        if mid and machine_at.get(address) is None and (address, None) in boxes:
            for table in (runs, boxes):   # the first machine id learned for this address: adopt the rows
                for key in [k for k in table if (k[0], k[1]) == (address, None)]:
                    rec = table.pop(key)
                    rec["machine_id"] = mid
                    table[(address, mid) + key[2:]] = rec
        if mid:
            machine_at[address] = mid
        key = (address, machine_at.get(address))
        box = boxes.setdefault(key, {"host": event.get("host"), "box": address, "machine_id": key[1],
                                     "aliases": [], "last_seen": None, "last_push": -1, "last_run_event": -1,
                                     "reaps": []})
        box["last_seen"], box["host"] = event.get("time"), event.get("host") or box["host"]
        if event.get("host") and event["host"] not in box["aliases"]:
            box["aliases"].append(event["host"])
        if event.get("event") == "push":
            box["last_push"] = index
        if event.get("event") == "reap" and not event.get("run_id"):
            box["reaps"].append(event)
        rid = event.get("run_id")
        if not rid:
            continue
        box["last_run_event"] = index
        rec = runs.setdefault(key + (rid,), {"host": event.get("host"), "box": address, "machine_id": key[1],
                                              "run_id": rid, "gate": None, "gate_at": None, "run_state": None,
                                              "instance": None, "rate_per_hour": None, "max_cost": None,
                                              "max_hours": None, "first_launch": None, "lease": None,
                                              "lease_read_at": None, "budget": None, "budget_read_at": None})
        for field in ("profile", "run_dir", "results_dir", "state", "dest"):
            if event.get(field):
                rec[field] = event[field]
        if event.get("instance") and ":" in str(event["instance"]):
            rec["instance"] = str(event["instance"])
        for field in ("rate_per_hour", "max_cost", "max_hours"):
            if _number(event.get(field)) is not None:
                rec[field] = event[field]
        if event.get("state") and event.get("event") in RUN_STATE_EVENTS:
            rec["run_state"] = str(event["state"]).lower()
        if isinstance(event.get("lease"), dict):
            rec["lease"], rec["lease_read_at"] = event["lease"], event.get("time")
        if isinstance(event.get("budget"), dict):
            rec["budget"], rec["budget_read_at"] = event["budget"], event.get("time")
        attempt = event.get("attempt")
        if isinstance(attempt, int) and not isinstance(attempt, bool):
            if event.get("event") == "gate" or attempt >= (rec.get("attempt") or 0):
                rec["attempt"] = attempt
        if event.get("event") == "gate":
            rec["gate"], rec["gate_at"] = event.get("verdict"), event.get("time")
            rec["gated_attempt"] = attempt
        elif event.get("event") in ("launch", "resume") and event.get("state") == "launched":
            rec["gate"] = None  # a new attempt runs (and bills) again: an earlier gate PASS no longer covers it
            rec["first_launch"] = rec["first_launch"] or event.get("time")
        elif rec["gate"] == "PASS" and event.get("event") in ("status", "patrol") and (
                event.get("state") in runrec.REPORTED_ACTIVE or
                (isinstance(attempt, int) and isinstance(rec.get("gated_attempt"), int) and
                 attempt > rec["gated_attempt"])):
            rec["gate"] = None  # the node says an attempt runs that the gate never saw: it bills again
        rec["last_event"], rec["last_seen"] = event.get("event"), event.get("time")
        rec["host"] = event.get("host") or rec["host"]
    return runs, boxes


def last_reap(box):
    """The reaper's last stop or terminate of BOX (a fold() box): {action, rule, confirmed, time}, or None."""
    acts = [r for r in box.get("reaps") or [] if r.get("action") in ("stop", "terminate")]
    if not acts:
        return None
    row = acts[-1]
    return {"action": row["action"], "rule": row.get("rule"), "confirmed": row.get("confirmed"),
            "time": row.get("time")}


def active(rec):
    """The ledger says this run may still be running: not through the gate, and no row that asked the node
    (or started it) says it ended."""
    return rec.get("gate") != "PASS" and (rec.get("run_state") or "launched") not in TERMINAL


def find_run(runs, rid, box=None, host=None):
    """The run RID on BOX (an address), else the newest one recorded under HOST (an alias or old host key)."""
    found = [rec for key, rec in runs.items() if key[2] == rid and box and key[0] == box]
    found = found or [rec for key, rec in runs.items() if key[2] == rid and host and
                      (rec.get("host") == host or key[0] == host)]
    return found[-1] if found else None


def reuse_refusal(rec, host, rid):
    """Why a launch of RID must not start when the ledger already holds a started run RID on the box (REC, a fold()
    run): None when no attempt of it ever started there (a launch the node refused, or ssh never reached). The node refuses it too (launcher.py): this says it
    before a row is written, so the refusal never marks that run's record failed (finding field N19)."""
    if not (rec and (rec.get("first_launch") or rec.get("attempt"))):   # an attempt number: the node made the run
        return None
    return ("run %s was launched on %s already (the ledger: attempt %s, %s): a launch never reuses a run; continue "
            "it with `rgt.py resume %s %s`, or launch under a new --run-id; nothing was started"
            % (rid, host, rec.get("attempt") or "?", rec.get("run_state") or "launched", host, rid))


money = core.money   # one money format, the node's too (rgt_core.money)


def cost_so_far(rows, host, rid, rate=None, now=None, box=None):
    """{rate_per_hour, hours, cost, max_cost, basis, line}: rate x the run's budget clock (module docstring).
    The node's clock (budget.json, as the last status row copied it) when the ledger holds one, else the hours
    since the ledger's first launch row."""
    import time
    runs, _boxes = fold(rows)
    rec = find_run(runs, rid, box, host) or {}
    rate = rate if rate is not None else rec.get("rate_per_hour")
    now = time.time() if now is None else now
    node = rec.get("budget") if isinstance(rec.get("budget"), dict) else None
    hours, basis = None, None
    if node and _number(node.get("first_start")) is not None:
        hours = runrec.budget_spent_hours(node, now)
        basis = "since the run's first start, less %s suspended (the node's budget clock)" % core.human_age(
            _number(node.get("suspended_s")) or 0)
    elif rec.get("first_launch") and core.parse_iso(rec["first_launch"]):
        hours = runrec.budget_spent_hours({"first_start": core.parse_iso(rec["first_launch"])}, now)
        basis = "since the first launch, from the ledger"
    out = {"rate_per_hour": rate, "hours": None if hours is None else round(hours, 4), "cost": None,
           "max_cost": rec.get("max_cost"), "basis": basis}
    if rate is None or hours is None:
        out["line"] = "cost so far: unknown (%s)" % ("no launch of this run in the ledger" if hours is None else
                                                     "no rate: pass --rate-per-hour, or launch with one")
        return out
    out["cost"] = round(rate * hours, 6)
    out["line"] = "cost so far: %s (%.4g/h x %.4g h %s)%s" % (
        money(out["cost"]), rate, hours, basis, "" if out["max_cost"] is None else "; budget %s" %
        money(out["max_cost"]))
    return out
