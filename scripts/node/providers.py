#!/usr/bin/env python3
"""providers: one interface to the rented box's own provider API -- stop, terminate, state, list.

A stop is only as good as the state read back after it: a 200, a delete that was accepted or a timer the
provider agreed to is NOT a stopped meter. Every adapter reads the instance's state, and
stop_and_confirm() polls it (capped, 240 s by default) until the state says stopped or gone.

Confirmation that a lying or lagging API cannot fool (finding C5): CONFIRMED only when the state of THIS
instance id says stopped/gone on --confirm-reads consecutive reads (default 3) spanning at least
--confirm-span-seconds (default 20 s; env RGT_PROVIDER_CONFIRM_READS / RGT_PROVIDER_CONFIRM_SPAN_S set the
defaults, which is how tests shrink them through the dead-man). A read that failed (any ProviderError), an
answer for another instance id, or an ambiguous one is "unknown": it neither counts nor resets the streak,
and the reads go on until the cap. "gone" (a 404) and "missing" (a null object, which confirms only a
terminate) need at least two reads. A read that says running or stopping resets the streak (a state that
flaps EXITED -> RUNNING never confirms).

Library (node side, standard library only; the stop engine and the laptop's billing report import it):

  adapter_for(profile_id, environ=None) -> Adapter | None
      None where the platform gives the node no API (autodl, china, generic-ssh, local: the profile says
      how that box stops); ProviderError("config") when the platform has one but this box lacks what it
      needs (an id, a key). environ defaults to this process's environment over PID 1's.
  Adapter.name, Adapter.instance_id
  Adapter.state(timeout) -> "running" | "stopping" | "stopped" | "gone" | "missing" | "unknown"
  Adapter.stop(timeout), Adapter.terminate(timeout)       a request only; never a confirmation
  Adapter.confirmed(state, action) -> bool     stop: stopped or gone; terminate: gone or missing
  Adapter.list(timeout) -> {"instances": [...], "storage": [...]}   (laptop keys; $/h where given)
  stop_and_confirm(adapter, action, poll_s=10, cap_s=240, clock=time.monotonic, sleep=time.sleep,
                   reads=3, span_s=20, send=True)
      -> {"action", "confirmed", "state", "polls", "unknown_reads", "error", ...}   (send=False: read back only)
  ProviderError(kind, message, retry_after=None); kind in auth, rate, timeout, http, config, network.
      401/403 -> auth (never retried); 429 -> rate (retry_after from Retry-After); a hang is cut at the
      timeout (socket timeout plus an overall deadline) -> timeout.

Command line (a person checking a box by hand; the same calls the engine makes):

  providers.py state     --profile P [--timeout S] [--json]
  providers.py stop      --profile P [--timeout S] [--poll-seconds S] [--cap-seconds S] [--json]
  providers.py terminate --profile P --destructive [--timeout S] [--poll-seconds S] [--cap-seconds S] [--json]
  providers.py confirm   --profile P [--action stop|terminate] [--timeout S] [--poll-seconds S] [--cap-seconds S]
                         [--json]     read the state back only (no request): what a fallback stop is judged by
  stop, terminate and confirm also take [--confirm-reads N] [--confirm-span-seconds T].

Run as a script it runs the imported module `providers` (one ProviderError class, the one the adapters raise:
finding C3), never a second copy named __main__.

Keys come from the environment (or the 0600 key file a profile names) and never appear in argv, output,
logs or error lines: every error text and output line passes rgt_core.redact (a provider that echoes the
key in its error body is cut to ***).

Exit codes: 0 OK (state read; stop, terminate or confirm CONFIRMED); 1 NOT CONFIRMED, or the provider answered with
an error; 2 usage or configuration (no API on this platform, a missing id or key); 3 refused (terminate
without --destructive).
"""
import argparse
import json
import os
import socket
import sys
import time

import rgt_core as core

KINDS = ("auth", "rate", "timeout", "http", "config", "network")
STATES = ("running", "stopping", "stopped", "gone", "missing", "unknown")
ACTIONS = ("stop", "terminate")
DEFAULT_CAP_S = 240.0
DEFAULT_POLL_S = 10.0
DEFAULT_TIMEOUT_S = 30.0
# Confirmation (C5): this many consecutive stopped/gone reads spanning at least this long. 3 reads 10 s apart
# outlast one stale cache answer and a state that flaps back; well inside the 240 s cap.
DEFAULT_CONFIRM_READS = 3
DEFAULT_CONFIRM_SPAN_S = 20.0
READS_ENV, SPAN_ENV = "RGT_PROVIDER_CONFIRM_READS", "RGT_PROVIDER_CONFIRM_SPAN_S"
ABSENT = ("gone", "missing")     # read twice at least: one 404 or null can be a lagging replica
MAX_BODY = 8 << 20
# Profiles whose platform gives the node no API to stop itself; the profile's METER_STOP_CMD says how.
NO_API = ("autodl", "china", "generic-ssh", "local")
# The adapters' shared header, one row each (D10): profile -> (module, API base, the variables that override the
# base, first set wins: tests point them at 127.0.0.1; the SDK's or CLI's own variable where it has one).
ADAPTERS = {
    "runpod": ("provider_runpod", "https://api.runpod.io", ("RGT_RUNPOD_API_URL", "RUNPOD_API_BASE_URL")),
    "vastai": ("provider_vastai", "https://console.vast.ai", ("RGT_VASTAI_API_URL", "VAST_URL")),
    "lambda": ("provider_lambda", "https://cloud.lambdalabs.com/api/v1", ("RGT_LAMBDA_API_URL",)),
    "paperspace": ("provider_paperspace", "https://api.paperspace.com/v1", ("RGT_PAPERSPACE_API_URL",)),
}
MODULES = {profile: spec[0] for profile, spec in ADAPTERS.items()}


class ProviderError(Exception):
    """A provider call that did not give an answer we can trust. Its text never holds a key."""

    def __init__(self, kind, message, retry_after=None):
        if kind not in KINDS:
            raise ValueError("unknown ProviderError kind %r" % kind)
        message = core.redact(message)
        super().__init__(message)
        self.kind, self.message, self.retry_after = kind, message, retry_after

    def as_dict(self):
        return {"kind": self.kind, "message": self.message, "retry_after": self.retry_after}

    def __str__(self):
        return "%s: %s" % (self.kind, self.message)


# ---------------------------------------------------------------- environment

def pid1_environ():
    """PID 1's environment (where a container keeps RUNPOD_POD_ID, CONTAINER_API_KEY ...); {} if unreadable."""
    try:
        with open("/proc/1/environ", "rb") as handle:
            raw = handle.read(1 << 20)
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            out[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def default_environ():
    """This process's environment over PID 1's: an ssh shell often lacks what the container was given."""
    merged = pid1_environ()
    merged.update(os.environ)
    return merged


def need(environ, name, why):
    value = (environ.get(name) or "").strip()
    if not value:
        raise ProviderError("config", "%s is not set (%s); run from the box's own environment or export it "
                            "from /proc/1/environ" % (name, why))
    return value


def base_url(environ, names, default):
    """The first of NAMES set in ENVIRON (tests point these at 127.0.0.1), else DEFAULT; no trailing /."""
    for name in names:
        value = (environ.get(name) or "").strip()
        if value:
            if not value.startswith(("http://", "https://")):
                raise ProviderError("config", "%s must be an http(s) URL" % name)
            return value.rstrip("/")
    return default


def read_key_file(path, what):
    """KEY = VALUE lines from a key file only its owner can read (0600 or stricter); refuse anything looser."""
    path = os.path.expanduser(path)
    try:
        info = os.stat(path)
    except OSError:
        raise ProviderError("config", "%s key file %s does not exist" % (what, path))
    if info.st_mode & 0o077:
        raise ProviderError("config", "%s key file %s is readable by others (mode %o); chmod 600 it" % (
            what, path, info.st_mode & 0o777))
    values = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, sep, value = line.partition("=")
                if sep and name.strip() and not name.strip().startswith("#"):
                    values[name.strip().lower()] = value.strip().strip("\"'")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProviderError("config", "cannot read %s key file %s (%s)" % (what, path, type(exc).__name__))
    return values


# ---------------------------------------------------------------- HTTP with a hard deadline

def _retry_after(value):
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    import email.utils
    try:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def http_json(method, url, headers=None, body=None, timeout=DEFAULT_TIMEOUT_S, ok_missing=False):
    """One request; the decoded JSON answer (None for an empty body). Every blocking step (connect, send,
    each read) gets the time left until one overall deadline, so a server that hangs or trickles bytes
    cannot hold the caller past TIMEOUT. ok_missing: a 404 returns the marker MISSING instead of raising."""
    import http.client
    import urllib.parse
    deadline = time.monotonic() + max(0.05, float(timeout))
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError("config", "not an http(s) URL: %s" % _safe_url(url))
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    payload = None if body is None else json.dumps(body).encode("utf-8")
    send_headers = {"Accept": "application/json", "User-Agent": "remote-gpu-trainer-providers"}
    if payload is not None:
        send_headers["Content-Type"] = "application/json"
    send_headers.update(headers or {})

    def left():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline")
        return remaining

    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=left())
    what = "%s %s" % (method, _safe_url(url))
    try:
        conn.request(method, target, body=payload, headers=send_headers)
        if conn.sock is not None:
            conn.sock.settimeout(left())
        resp = conn.getresponse()
        chunks, size = [], 0
        while True:
            if conn.sock is not None:
                conn.sock.settimeout(left())
            chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_BODY:
                raise ProviderError("http", "%s: answer larger than %d bytes" % (what, MAX_BODY))
            chunks.append(chunk)
        status, raw = resp.status, b"".join(chunks)
        retry_after = _retry_after(resp.getheader("Retry-After"))
    except socket.timeout:
        raise ProviderError("timeout", "%s: no answer within %.0f s" % (what, float(timeout)))
    except ProviderError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise ProviderError("network", "%s: %s" % (what, type(exc).__name__))
    finally:
        conn.close()
    if status in (401, 403):
        raise ProviderError("auth", "%s: HTTP %d, the key was refused (wrong, revoked, or not allowed this "
                            "call); not retried" % (what, status))
    if status == 429:
        raise ProviderError("rate", "%s: HTTP 429, rate limited%s" % (
            what, "" if retry_after is None else "; retry after %.0f s" % retry_after), retry_after)
    if status == 404 and ok_missing:
        return MISSING
    if status >= 300:
        raise ProviderError("http", "%s: HTTP %d%s" % (what, status, _error_hint(raw)))
    if not raw.strip():
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProviderError("http", "%s: HTTP %d with a body that is not JSON" % (what, status))


class _Missing(object):
    def __repr__(self):
        return "MISSING"


MISSING = _Missing()


def _safe_url(url):
    """URL without its query string (a key could ride there) and without user info."""
    import urllib.parse
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += ":%d" % parts.port
    return "%s://%s%s" % (parts.scheme, host, parts.path)


def _error_hint(raw):
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return ""
    msg = None
    if isinstance(doc, dict):
        err = doc.get("error")
        msg = doc.get("msg") or doc.get("message") or (err.get("message") if isinstance(err, dict) else err)
    return (": %s" % core.redact(str(msg))[:200]) if msg else ""


# ---------------------------------------------------------------- the interface

class Adapter(object):
    """One provider, one instance (node side), or one account (laptop side, instance_id None)."""

    name = "?"
    confirmation = "the instance's state reads stopped, or the instance is gone"

    def __init__(self, api_key, instance_id=None, url=None):
        self._key = api_key
        self.instance_id = instance_id
        self.url = url

    def __repr__(self):  # never the key
        return "<%s adapter instance=%s url=%s>" % (self.name, self.instance_id, self.url)

    def describe(self):
        return {"provider": self.name, "instance_id": self.instance_id, "api": self.url,
                "confirmation": self.confirmation}

    def _need_instance(self):
        if not self.instance_id:
            raise ProviderError("config", "%s: no instance id for this call" % self.name)
        return self.instance_id

    def state(self, timeout=DEFAULT_TIMEOUT_S):
        raise NotImplementedError

    def stop(self, timeout=DEFAULT_TIMEOUT_S):
        raise NotImplementedError

    def terminate(self, timeout=DEFAULT_TIMEOUT_S):
        raise NotImplementedError

    def list(self, timeout=DEFAULT_TIMEOUT_S):
        raise NotImplementedError

    def confirmed(self, state, action):
        """A stop is confirmed by the state alone, never by the answer to the request. "missing" (a null
        object) says only that the API no longer shows it: enough for a terminate, never for a stop."""
        if action == "stop":
            return state in ("stopped", "gone")
        if action == "terminate":
            return state in ABSENT
        raise ValueError("unknown action %r" % action)

    def mine(self, ident):
        """Is an answer about IDENT about this adapter's instance? (An answer for another id is unknown: C5.)"""
        return ident is not None and str(ident) == str(self.instance_id)


def listed(doc, key, who):
    """The list under KEY in a list answer DOC, or ProviderError: a 2xx answer that is not an object, says
    success false, carries an error, or lacks the list is never read as an empty account (issue 37)."""
    if not isinstance(doc, dict):
        raise ProviderError("http", "%s: answer is %s, not an object with %r" % (
            who, "empty" if doc is None else type(doc).__name__, key))
    if doc.get("success") is False or doc.get("error") or doc.get("errors"):
        why = doc.get("msg") or doc.get("error") or doc.get("errors")
        if isinstance(why, dict):
            why = why.get("message") or why.get("code")
        raise ProviderError("http", "%s: the answer is an error: %s" % (who, str(why)[:200]))
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ProviderError("http", "%s: answer has no %r list" % (who, key))
    return items


def not_this_instance(obj, ident):
    """"missing" when OBJ, an API's answer about one instance, is no object; "unknown" when it is about another
    instance than IDENT (None: any will do); else None, and the adapter reads OBJ's state."""
    if not isinstance(obj, dict):
        return "missing"
    if ident is not None and str(obj.get("id")) != str(ident):
        return "unknown"
    return None


def api_base(profile_id, environ):
    """PROFILE_ID's API base URL from ENVIRON (its ADAPTERS row)."""
    _, default, names = ADAPTERS[profile_id]
    return base_url(environ, names, default)


def row(provider, kind, ident, name=None, state="unknown", rate=None, raw_status=None, **extra):
    """One listed instance or storage object, the same shape for every provider."""
    out = {"provider": provider, "kind": kind, "id": str(ident), "name": name, "state": state,
           "rate_per_hour": None if rate is None else round(float(rate), 4), "raw_status": raw_status}
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def module_for(profile_id):
    import importlib
    return importlib.import_module(MODULES[profile_id])


def adapter_for(profile_id, environ=None):
    """The node's own adapter for PROFILE_ID, or None where the platform gives the node no API."""
    if profile_id in NO_API:
        return None
    if profile_id not in MODULES:
        raise ProviderError("config", "profile %r: no provider adapter and not a known API-less platform "
                            "(known: %s)" % (profile_id, ", ".join(sorted(list(MODULES) + list(NO_API)))))
    return module_for(profile_id).node_adapter(default_environ() if environ is None else environ)


def laptop_adapter(profile_id, environ=None, home=None):
    """The account-wide adapter from the laptop's own credentials (CLI config or variable), or None."""
    environ = os.environ if environ is None else environ
    home = home or os.path.expanduser("~")
    return module_for(profile_id).laptop_adapter(environ, home)


# ---------------------------------------------------------------- stop, then read the state back

def stop_and_confirm(adapter, action, poll_s=DEFAULT_POLL_S, cap_s=DEFAULT_CAP_S, clock=time.monotonic,
                     sleep=time.sleep, request_timeout=DEFAULT_TIMEOUT_S, reads=DEFAULT_CONFIRM_READS,
                     span_s=DEFAULT_CONFIRM_SPAN_S, send=True):
    """Send ACTION ("stop" or "terminate") once (SEND False: send nothing, only read back), then read the state
    every POLL_S until READS consecutive confirming reads span SPAN_S, or CAP_S runs out. Pure loop: CLOCK and
    SLEEP are injectable, so rule tests never wait. The request: a rate limit waits its Retry-After (within the
    cap) and tries again; a refused key, a config or HTTP error ends at once; network errors and hangs are
    retried until the cap. The reads: a failed, foreign or ambiguous read is "unknown" (neither counts nor
    resets); running/stopping resets the streak. Returns {action, confirmed, state, polls, unknown_reads,
    error, requests, elapsed_s, provider, instance_id}; confirmed is True only when the reads said so."""
    if action not in ACTIONS:
        raise ValueError("action must be stop or terminate, not %r" % action)
    reads = max(1, int(reads))
    start = clock()
    out = {"action": action, "confirmed": False, "state": "unknown", "polls": 0, "unknown_reads": 0,
           "error": None, "requests": 0, "sent": bool(send),
           "provider": getattr(adapter, "name", None), "instance_id": getattr(adapter, "instance_id", None)}

    def left():
        return cap_s - (clock() - start)

    def call(fn):
        """FN(timeout) with rate/network retries inside the cap; (result, None) or (None, ProviderError)."""
        last = None
        while True:
            budget = left()
            if budget <= 0:   # the last error says what kept failing (a network outage stays "network")
                return None, last or ProviderError("timeout", "the %.0f s cap ran out" % cap_s)
            out["requests"] += 1
            try:
                return fn(min(request_timeout, budget)), None
            except ProviderError as exc:
                last = exc
                if exc.kind in ("auth", "config", "http"):
                    return None, exc
                wait = exc.retry_after if (exc.kind == "rate" and exc.retry_after is not None) else poll_s
                if wait >= left():
                    return None, exc
                sleep(max(0.0, wait))

    if send:
        _, err = call(getattr(adapter, action))
        if err is not None:
            out["error"] = err.as_dict()
            out["elapsed_s"] = round(clock() - start, 3)
            return out
    streak, last_err = [], None          # clock times of the consecutive confirming reads
    while True:
        wait = poll_s
        budget = left()
        if budget <= 0:
            break
        out["requests"] += 1
        try:
            state = adapter.state(min(request_timeout, budget))
        except ProviderError as exc:
            if exc.kind == "config":
                out["error"] = exc.as_dict()
                break
            state, last_err = "unknown", exc
            if exc.kind == "rate" and exc.retry_after is not None:
                wait = max(poll_s, exc.retry_after)
        out["polls"] += 1
        out["state"] = state
        if state not in STATES or state == "unknown" or (state == "missing" and not adapter.confirmed(state, action)):
            out["unknown_reads"] += 1            # neither counts nor resets (a null object says nothing of a stop)
        elif adapter.confirmed(state, action):
            streak.append((clock(), state))
        else:
            streak = []                           # running or stopping again: start over
        need = max(reads, 2) if any(s in ABSENT for _, s in streak) else reads
        if len(streak) >= need and streak[-1][0] - streak[0][0] >= span_s:
            out["confirmed"] = True
            out["state"] = streak[-1][1]
            break
        if wait >= left():
            break
        sleep(wait)
    if not out["confirmed"] and out["error"] is None:
        why = "" if last_err is None else "; last failed read: %s" % last_err
        out["error"] = {"kind": "timeout", "retry_after": None, "message": "state %r after %d read(s) (%d unknown) "
                        "in %.0f s, %d consecutive confirming read(s) needed over %g s: %s NOT CONFIRMED%s" % (
                            out["state"], out["polls"], out["unknown_reads"], cap_s, reads, span_s, action, why)}
    out["elapsed_s"] = round(clock() - start, 3)
    return out


# ---------------------------------------------------------------- command line

def env_default(name, kind, default, low, high):
    """A default from the environment (tests shrink the confirmation through the dead-man); bad -> DEFAULT."""
    try:
        value = kind(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if low <= value <= high else default


def build_parser(fixed_profile=None):
    prog = "%s" % ("provider_%s.py" % fixed_profile if fixed_profile else "providers.py")
    epilog = core.exit_codes_epilog(__doc__)  # provider_*.py run this parser too: their codes are these
    parser = core.Parser(prog=prog, description="Read, stop or terminate this box through its provider's API "
                         "(see the docstring).", formatter_class=core.RawHelp, epilog=epilog)
    sub = parser.add_subparsers(dest="command", metavar="{state,stop,terminate,confirm}", parser_class=core.Parser)
    for name in ("state", "stop", "terminate", "confirm"):
        p = sub.add_parser(name, help={"state": "read this instance's state",
                                       "stop": "stop, then poll the state until stopped (or the cap)",
                                       "terminate": "terminate (destroys the box's disk), then poll until gone",
                                       "confirm": "send nothing; poll the state until it confirms (or the cap)"
                                       }[name], formatter_class=core.RawHelp, epilog=epilog)
        if not fixed_profile:
            p.add_argument("--profile", required=True, help="the platform profile id")
        p.add_argument("--timeout", type=core.arg_number(float, 0.0, 3600, low_open=True), default=DEFAULT_TIMEOUT_S,
                       help="seconds one request may take (default 30)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name != "state":
            p.add_argument("--poll-seconds", type=core.arg_number(float, 0.0, 3600, low_open=True),
                           default=DEFAULT_POLL_S, help="seconds between state reads (default 10)")
            p.add_argument("--cap-seconds", type=core.arg_number(float, 0.0, 86400, low_open=True),
                           default=DEFAULT_CAP_S, help="give up unconfirmed after this long (default 240)")
            p.add_argument("--confirm-reads", type=core.arg_number(int, 1, 1000),
                           default=env_default(READS_ENV, int, DEFAULT_CONFIRM_READS, 1, 1000),
                           help="consecutive stopped/gone reads that confirm (default 3, or $%s)" % READS_ENV)
            p.add_argument("--confirm-span-seconds", type=core.arg_number(float, 0.0, 3600),
                           default=env_default(SPAN_ENV, float, DEFAULT_CONFIRM_SPAN_S, 0.0, 3600.0),
                           help="those reads span at least this long (default 20, or $%s)" % SPAN_ENV)
        if name == "terminate":
            p.add_argument("--destructive", action="store_true", help="required: terminate deletes the box's disk")
        if name == "confirm":
            p.add_argument("--action", choices=ACTIONS, default="stop",
                           help="what the state must show: stop (stopped or gone) or terminate (gone)")
    return parser


def main(argv=None, fixed_profile=None):
    core.check_toolkit()
    args = build_parser(fixed_profile).parse_args(argv)
    if not args.command:
        raise core.UsageError("give a command: state, stop or terminate (see --help)")
    profile = fixed_profile or args.profile
    if args.command == "terminate" and not args.destructive:
        raise core.Refused("terminate deletes the instance and its own disk; pass --destructive once the outputs "
                           "are pulled and verified")
    try:
        adapter = adapter_for(profile)
    except ProviderError as exc:
        raise core.UsageError(str(exc))
    if adapter is None:
        prof = core.load_profile(profile) if core.profile_index_path() else {}
        how = (prof.get("defaults") or {}).get("METER_STOP_CMD")
        raise core.UsageError("platform %r gives the node no API to stop itself; its profile's stop: %s" % (
            profile, how or "none (stop it from the console)"))
    if args.command == "state":
        try:
            state = adapter.state(args.timeout)
        except ProviderError as exc:
            return _report(args, dict(adapter.describe(), state=None, error=exc.as_dict()),
                           "%s %s %s: %s" % (core.FAIL, adapter.name, adapter.instance_id, exc), 1)
        return _report(args, dict(adapter.describe(), state=state, error=None),
                       "%s %s %s is %s" % (core.OK, adapter.name, adapter.instance_id, state), 0)
    action = args.action if args.command == "confirm" else args.command
    res = stop_and_confirm(adapter, action, poll_s=args.poll_seconds, cap_s=args.cap_seconds,
                           request_timeout=args.timeout, reads=args.confirm_reads, span_s=args.confirm_span_seconds,
                           send=args.command != "confirm")
    res.update(adapter.describe())
    what = "%s (read back only)" % action if args.command == "confirm" else action
    if res["confirmed"]:
        line = "%s %s %s CONFIRMED: state %s after %d read(s)" % (core.OK, what, adapter.instance_id,
                                                                  res["state"], res["polls"])
    else:
        line = "%s %s %s NOT CONFIRMED: state %s; %s" % (core.FAIL, what, adapter.instance_id, res["state"],
                                                         (res["error"] or {}).get("message", "no error"))
    return _report(args, res, line, 0 if res["confirmed"] else 1)


def _report(args, doc, line, code):
    if args.json:
        core.emit_json(core.redact_doc(doc))
    else:
        print(core.redact(line))
    return code


if __name__ == "__main__":
    # The adapters `import providers`: run that module, not this __main__ copy, so that the ProviderError they
    # raise is the one main() and stop_and_confirm() catch (finding C3).
    import providers
    sys.exit(core.run_main(providers.main, prog="providers.py"))
