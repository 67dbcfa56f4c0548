#!/usr/bin/env python3
"""notify: tell the user, from the node itself, when a run ends, fails, stalls or the meter did not stop.

Runs ON THE GPU NODE (standard library only, Python 3.8+). The laptop may be asleep and the agent's
session gone; the watchers on the node call this module, and it sends each event to every configured
target: a signed generic webhook, Slack and Discord incoming webhooks, a Telegram bot, a Feishu/Lark
custom bot (signed), ntfy, and email over SMTP (STARTTLS + login). references/run-remote/notifications.md
shows the config, each target's request and how a webhook receiver checks the signature.

The library API (what the watchers call; none of it raises):

  emit(event, fields, *, config_path=None, spool_dir=None, timeout=None, events=None) -> dict
      Send EVENT (one of EVENTS) with FIELDS (a flat dict: run_id, exit_code, eta_s, reason ...) to
      each target whose `events` list takes it (EVENTS: a run's own list narrows that further).
      Targets run in parallel; the whole call returns within TIMEOUT seconds (default: the config's
      timeout_s, else 10) whatever a target does. A message a target did not take for a passing reason
      (no answer, HTTP 5xx/429, a dropped connection) is SPOOLED (an atomic 0600 file in the spool
      dir); one it refused for good (HTTP 4xx, a bad signature, a login refused) is DROPPED and
      recorded. Returns {"event", "sent": [names], "spooled": [names], "dropped": [names],
      "errors": {name: reason}, "skipped": reason-or-None}.
  flush_spool(config_path=None, spool_dir=None, budget_s=10.0, now=None) -> dict
      Retry spooled messages whose backoff has passed (30 s doubling to 1 h), oldest first, within
      BUDGET_S; a message older than max_age_h (24) or tried max_attempts (12) times is dropped and
      recorded. One flusher at a time (a lock file); a full or read-only disk ends it cleanly.
  status_line(spool_dir=None) -> str or None
      One line for run_status: what is unsent or was dropped (counted), to which target, since when, why,
      and "spool not writable" when a probe write fails. A failure the spool cannot hold (a full disk) is
      kept in a file in /dev/shm ($RGT_NOTIFY_LOST_DIR overrides), so another process still counts it.
  lost_count(spool_dir=None) -> int
      Messages dropped or refused in the last 24 h (the count `notify.py status --json` gives as "dropped").
  should_repeat(event_state, now) -> bool        (pure)
  note_repeat(event_state, now) -> dict          (pure)
      For STOP NOT CONFIRMED: send again until acknowledged, every every_s (900) doubling up to
      max_interval_s (4 h), at most max_count (8) times.

Who sends each event (every run-scoped sender passes the run's own list, run.json notify_events, as EVENTS):
  launched, finished, failed    supervise.py: the job started; the job ended and its sync is over
  first_progress                deadman.py: once per attempt, when its step first rises (step, total, eta_s)
  stalled                       deadman.py: it stopped a stalled run's job and left the box on for other runs
  deadman_fired                 deadman.py: it fired (then budget_100 when the cap it fired for is the budget's)
  budget_80                     deadman.py: once, when 80% of the hours the budget buys have passed
  disk_low                      deadman.py: once per crossing of the disk floor (the run dir's or durable dir's)
  stop_confirmed                stop_engine.py: the stop was read back as done (dead-man, idle watch)
  stop_not_confirmed            stop_engine.py, then deadman.py repeats it until an ACK (should_repeat)
  idle_stop                     idle_watch.py: it fired on an idle box
  boot_resume                   boot_resume.py: its boot sweep resumed a run or re-armed its dead-man
  lease_expired, reaped         the laptop's reaper (scripts/reap.py): a lease ran out on an unreachable box;
                                it stopped a box (or its stop is NOT CONFIRMED) from outside
  still_billing                 the reaper's opt-in digest (scripts/reap.py): the boxes the providers still bill
A dry-run dead-man tells no one.

Configuration: ONE JSON file on the node, mode 0600, owned by this user (refused otherwise, exit 3),
default ~/.config/rgt/notify.json ($RGT_NOTIFY_CONFIG overrides) -- never under the durable or
results dirs, so it never travels in a pull. Spool: ~/.cache/rgt/notify-spool/ ($RGT_NOTIFY_SPOOL).
Secrets (URLs with tokens, bot tokens, signing secrets, passwords) live only in that file: they are
never in argv, in a log line, in the spool, in a status line or in a message (any configured secret
found in FIELDS is replaced by ***). Write the file from the laptop with
`rgt.py notify setup HOST --from FILE` (the config travels on ssh's stdin to `notify.py install --stdin`).

Usage (the CLI, for a person or a shell script):
  notify.py install --stdin [--config PATH]        write the config read from stdin (0600, atomic)
  notify.py check   [--config PATH]                validate the config and its permissions; send nothing
  notify.py test    [--config PATH] [--timeout S] [--json]   a test message to EVERY target; OK/FAIL each
  notify.py emit EVENT [--field KEY=VALUE ...] [--events E1,E2] [--timeout S] [--config PATH]
                   [--spool-dir DIR] [--json]
  notify.py flush   [--budget-s S] [--config PATH] [--spool-dir DIR] [--json]
  notify.py status  [--spool-dir DIR] [--json]

Exit codes: 0 OK (emit: sent or spooled; status: nothing unsent); 1 a target failed (test), a message
was dropped (emit), something is unsent (status); 2 usage or bad config; 3 the config refused
(group/world-readable, not ours, not a regular file).
"""
import base64
import errno
import hashlib
import hmac
import json
import os
import re
import socket
import ssl
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import rgt_core as core

# ---------------------------------------------------------------- events

LAUNCHED = "launched"
FIRST_PROGRESS = "first_progress"
FINISHED = "finished"
FAILED = "failed"
STALLED = "stalled"
DEADMAN_FIRED = "deadman_fired"
STOP_CONFIRMED = "stop_confirmed"
STOP_NOT_CONFIRMED = "stop_not_confirmed"
IDLE_STOP = "idle_stop"
BOOT_RESUME = "boot_resume"
BUDGET_80 = "budget_80"
BUDGET_100 = "budget_100"
DISK_LOW = "disk_low"
LEASE_EXPIRED = "lease_expired"
REAPED = "reaped"
STILL_BILLING = "still_billing"
TEST = "test"

# event -> (severity, title)
EVENT_INFO = {
    LAUNCHED: ("info", "Run launched"),
    FIRST_PROGRESS: ("info", "First progress"),
    FINISHED: ("info", "Run finished"),
    FAILED: ("critical", "Run FAILED"),
    STALLED: ("warning", "Run STALLED"),
    DEADMAN_FIRED: ("critical", "Dead-man FIRED"),
    STOP_CONFIRMED: ("info", "Meter stop confirmed"),
    STOP_NOT_CONFIRMED: ("critical", "STOP NOT CONFIRMED: the box may still bill"),
    IDLE_STOP: ("warning", "Idle box stopped"),
    BOOT_RESUME: ("warning", "Box restarted, run resumed"),
    BUDGET_80: ("warning", "Budget 80% spent"),
    BUDGET_100: ("critical", "Budget spent"),
    DISK_LOW: ("warning", "Disk low"),
    LEASE_EXPIRED: ("critical", "Box unreachable and its lease ran out"),
    REAPED: ("critical", "Reaper stopped a box"),
    STILL_BILLING: ("warning", "Still billing"),
    TEST: ("info", "Test message"),
}
EVENTS = tuple(e for e in EVENT_INFO if e != TEST)
NTFY_PRIORITY = {"info": "3", "warning": "4", "critical": "5"}
NTFY_TAGS = {"info": "information_source", "warning": "warning", "critical": "rotating_light"}

# ---------------------------------------------------------------- limits and defaults

DEFAULT_TOTAL_TIMEOUT_S = 10.0      # emit: every target together
DEFAULT_TARGET_TIMEOUT_S = 5.0      # one target's socket timeout
MAX_CONFIG_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 64 * 1024
MAX_TEXT = 3500                     # Telegram takes 4096, Feishu bodies 20 KB; Discord is cut to 2000
DISCORD_MAX = 2000
SPOOL_BACKOFF_S = 30.0
SPOOL_BACKOFF_MAX_S = 3600.0
SPOOL_MAX_AGE_H = 24.0
SPOOL_MAX_ATTEMPTS = 12
SPOOL_MAX_MESSAGES = 500
FAILURES_KEPT = 50
FAILURES_SHOWN_S = 24 * 3600.0
REPEAT_EVERY_S = 900.0
REPEAT_MAX_INTERVAL_S = 4 * 3600.0
REPEAT_MAX_COUNT = 8

TYPES = ("webhook", "slack", "discord", "telegram", "feishu", "ntfy", "smtp")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
COMMON_KEYS = {"type", "name", "events", "timeout_s"}
HTTP_KEYS = {"allow_http", "ca_file"}
TARGET_KEYS = {
    "webhook": ({"url", "secret"}, {"url", "secret"} | HTTP_KEYS),
    "slack": ({"url"}, {"url"} | HTTP_KEYS),
    "discord": ({"url"}, {"url", "username"} | HTTP_KEYS),
    "telegram": ({"bot_token", "chat_id"}, {"bot_token", "chat_id", "api_base"} | HTTP_KEYS),
    "feishu": ({"url"}, {"url", "secret"} | HTTP_KEYS),
    "ntfy": ({"url"}, {"url", "token", "priority"} | HTTP_KEYS),
    "smtp": ({"host", "from", "to"}, {"host", "port", "tls", "username", "password", "from", "to", "ca_file"}),
}
SECRET_KEYS = ("url", "secret", "bot_token", "token", "password", "username")
URL_WORDS = {"services", "open-apis", "webhooks", "sendmessage"}
TOP_KEYS = {"targets", "box", "timeout_s", "spool"}
SPOOL_KEYS = {"max_age_h", "max_attempts", "max_messages"}

USER_AGENT = "rgt-notify/1"


def default_config_path():
    return os.environ.get("RGT_NOTIFY_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "rgt",
                                                                "notify.json")


def default_spool_dir():
    return os.environ.get("RGT_NOTIFY_SPOOL") or os.path.join(os.path.expanduser("~"), ".cache", "rgt",
                                                               "notify-spool")


class ConfigRefused(core.Refused):
    """The config file is not private to this user."""


class Permanent(Exception):
    """The target refused the message for good: retrying will not help."""


class Transient(Exception):
    """The target did not take the message this time: spool and retry."""


# ---------------------------------------------------------------- configuration

def _number(value, what, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise core.UsageError("%s must be a number from %g to %g" % (what, low, high))
    return float(value)


def _check_url(url, what, allow_http):
    if not isinstance(url, str) or not url.strip() or any(c.isspace() for c in url):
        raise core.UsageError("%s: url must be a non-empty string without spaces" % what)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "https" or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise core.UsageError("%s: url is plain http: the message and its token would travel in clear "
                              "(use https, or set \"allow_http\": true for a server on your own network)" % what)
    raise core.UsageError("%s: url must start with https://" % what)


def validate_config(doc):
    """A parsed config -> the same dict with defaults filled in, or UsageError naming the first problem.
    No message ever quotes a secret value."""
    if not isinstance(doc, dict):
        raise core.UsageError("notify config must be a JSON object with a \"targets\" list")
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise core.UsageError("notify config: unknown key(s) %s (known: %s)" % (", ".join(unknown),
                                                                               ", ".join(sorted(TOP_KEYS))))
    targets = doc.get("targets")
    if not isinstance(targets, list) or not targets:
        raise core.UsageError("notify config: \"targets\" must be a non-empty list")
    if "box" in doc and not (isinstance(doc["box"], str) and 0 < len(doc["box"]) <= 80):
        raise core.UsageError("notify config: \"box\" must be a short label (1-80 characters)")
    if "timeout_s" in doc:
        _number(doc["timeout_s"], "notify config: timeout_s", 1, 120)
    spool = doc.get("spool", {})
    if not isinstance(spool, dict) or set(spool) - SPOOL_KEYS:
        raise core.UsageError("notify config: \"spool\" takes only %s" % ", ".join(sorted(SPOOL_KEYS)))
    if "max_age_h" in spool:
        _number(spool["max_age_h"], "spool.max_age_h", 0.01, 24 * 30)
    for key in ("max_attempts", "max_messages"):
        if key in spool:
            _number(spool[key], "spool." + key, 1, 100000)
    seen, out = set(), []
    for index, target in enumerate(targets):
        where = "notify config: targets[%d]" % index
        if not isinstance(target, dict):
            raise core.UsageError("%s is not an object" % where)
        kind = target.get("type")
        if kind not in TYPES:
            raise core.UsageError("%s: type must be one of %s" % (where, ", ".join(TYPES)))
        target = dict(target)
        target.setdefault("name", kind)
        name = target["name"]
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise core.UsageError("%s: name must be letters, digits, '.', '_' or '-' (max 64)" % where)
        where = "notify target %r (%s)" % (name, kind)
        if name in seen:
            raise core.UsageError("%s: two targets have this name; give each a distinct \"name\"" % where)
        seen.add(name)
        required, allowed = TARGET_KEYS[kind]
        unknown = sorted(set(target) - allowed - COMMON_KEYS)
        if unknown:
            raise core.UsageError("%s: unknown key(s) %s (known: %s)" % (where, ", ".join(unknown),
                                                                         ", ".join(sorted(allowed | COMMON_KEYS))))
        missing = sorted(k for k in required if target.get(k) in (None, "", []))
        if missing:
            raise core.UsageError("%s: missing %s" % (where, ", ".join(missing)))
        for key in ("secret", "bot_token", "token", "password", "username", "api_base", "ca_file", "from",
                    "host", "priority", "tls"):
            if key in target and not isinstance(target[key], str):
                raise core.UsageError("%s: %s must be a string" % (where, key))
        if "allow_http" in target and not isinstance(target["allow_http"], bool):
            raise core.UsageError("%s: allow_http must be true or false" % where)
        if "timeout_s" in target:
            _number(target["timeout_s"], where + ": timeout_s", 0.1, 120)
        events = target.get("events", ["*"])
        if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
            raise core.UsageError("%s: events must be a non-empty list of event names (or [\"*\"])" % where)
        bad = sorted(set(events) - set(EVENTS) - {"*"})
        if bad:
            raise core.UsageError("%s: unknown event(s) %s (known: %s)" % (where, ", ".join(bad), ", ".join(EVENTS)))
        if kind == "smtp":
            _check_smtp(target, where)
        elif kind == "telegram":
            if not isinstance(target["chat_id"], (str, int)) or isinstance(target["chat_id"], bool):
                raise core.UsageError("%s: chat_id must be a number or an @channel name" % where)
            _check_url(target.get("api_base", "https://api.telegram.org"), where, target.get("allow_http", False))
        else:
            _check_url(target["url"], where, target.get("allow_http", False))
        if kind == "ntfy" and target.get("priority") not in (None, "1", "2", "3", "4", "5"):
            raise core.UsageError("%s: priority must be \"1\" to \"5\"" % where)
        if kind == "webhook" and len(target["secret"]) < 16:
            raise core.UsageError("%s: secret must be at least 16 characters (it signs every message)" % where)
        out.append(target)
    doc = dict(doc)
    doc["targets"] = out
    return doc


def _check_smtp(target, where):
    tls = target.setdefault("tls", "starttls")
    if tls not in ("starttls", "ssl", "none"):
        raise core.UsageError("%s: tls must be starttls, ssl or none" % where)
    port = target.setdefault("port", 465 if tls == "ssl" else 587)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise core.UsageError("%s: port must be a number from 1 to 65535" % where)
    if tls == "none" and (target.get("username") or target.get("password")):
        raise core.UsageError("%s: tls none with a login would send the password in clear (use starttls or ssl)"
                              % where)
    if bool(target.get("username")) != bool(target.get("password")):
        raise core.UsageError("%s: give both username and password, or neither" % where)
    to = target["to"]
    to = [to] if isinstance(to, str) else to
    if not isinstance(to, list) or not to or not all(isinstance(a, str) and "@" in a for a in to):
        raise core.UsageError("%s: to must be an address or a list of addresses" % where)
    target["to"] = to
    if "@" not in target["from"]:
        raise core.UsageError("%s: from must be an address" % where)


def _refuse_unless_private(path, st):
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise ConfigRefused("notify config %s is not a regular file (a link or a device); write it with "
                            "`notify.py install --stdin`" % path)
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise ConfigRefused("notify config %s belongs to uid %d, not to this user (uid %d)"
                            % (path, st.st_uid, os.getuid()))
    if st.st_mode & 0o077:
        raise ConfigRefused("notify config %s is readable by group or others (mode %04o): it holds secrets; "
                            "run: chmod 600 %s" % (path, stat.S_IMODE(st.st_mode), path))


def check_private(path):
    """Refuse (ConfigRefused) a config anyone but this user could read or swap. Returns its lstat."""
    st = core.lstat_or_usage(path, "cannot read the notify config")
    _refuse_unless_private(path, st)
    return st


def read_private(path):
    """The bytes of the config at PATH, checked on the open file itself (no swap between check and read):
    not followed through a link, never blocking on a FIFO. FileNotFoundError when there is none."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigRefused("notify config %s is a link; write the file itself with "
                                "`notify.py install --stdin`" % path)
        raise core.UsageError("cannot read the notify config %s: %s" % (path, exc.strerror or exc))
    try:
        _refuse_unless_private(path, os.fstat(fd))
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise core.UsageError("cannot read the notify config %s: %s" % (path, exc.strerror or exc))
    finally:
        os.close(fd)


def parse_config_bytes(raw, what="notify config"):
    if len(raw) > MAX_CONFIG_BYTES:
        raise core.UsageError("%s is larger than %d KiB" % (what, MAX_CONFIG_BYTES // 1024))
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise core.UsageError("%s is not valid JSON: %s" % (what, exc.__class__.__name__ if isinstance(
            exc, UnicodeDecodeError) else "line %s column %s" % (getattr(exc, "lineno", "?"), getattr(exc, "colno", "?"))))
    return validate_config(doc)


def load_config(config_path=None):
    """The validated config, or None when there is no file. UsageError / ConfigRefused otherwise."""
    path = config_path or default_config_path()
    try:
        raw = read_private(path)
    except FileNotFoundError:
        return None
    return parse_config_bytes(raw, "notify config %s" % path)


def secrets_of(config):
    """Every secret string in CONFIG (for redaction); short ones too, but never an empty string."""
    found = set()
    for target in (config or {}).get("targets", []):
        for key in SECRET_KEYS:
            value = target.get(key)
            if isinstance(value, str) and len(value) >= 4:
                found.add(value)
                if key == "url":  # a URL's path and query often are the token itself
                    rest = value.split("://", 1)[-1]
                    for part in re.split(r"[/?&=#]", rest.split("/", 1)[-1] if "/" in rest else ""):
                        if len(part) >= 8 and part.lower() not in URL_WORDS:
                            found.add(part)
    return sorted(found, key=len, reverse=True)


def redact(text, secrets):
    text = str(text)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
    return text


# ---------------------------------------------------------------- the message

def _field_value(key, value):
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "n/a"
    if isinstance(value, (int, float)):
        if key.endswith("_bytes") or key == "bytes_synced":
            return core.human_bytes(value)
        if key.endswith("_s"):
            return core.human_age(value)
        return ("%.4g" % value) if isinstance(value, float) else str(value)
    return str(value)


def build_message(event, fields, config=None, now=None):
    """The rendered message: {id, event, severity, title, text, fields, box, time}. Pure but for the id."""
    secrets = secrets_of(config)
    severity, title = EVENT_INFO.get(event, ("warning", event))
    clean = {}
    for key, value in sorted((fields or {}).items()):
        key = redact(str(key), secrets)[:60]
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            value = json.dumps(value, sort_keys=True, default=str)
        clean[key] = redact(value, secrets)[:500] if isinstance(value, str) else value
    box = (config or {}).get("box") or socket.gethostname()
    run = clean.get("run_id")
    head = "[rgt] %s%s on %s" % (title, (" - run %s" % run) if run else "", box)
    lines = [head]
    for key, value in clean.items():
        if key != "run_id" and value is not None:   # a field with no value is left out, never "null"
            lines.append("%s: %s" % (key, _field_value(key, value)))
    text = "\n".join(lines)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT - 20] + "\n... (cut)"
    stamp = time.time() if now is None else now
    return {"id": uuid.uuid4().hex, "event": event, "severity": severity, "title": title, "head": head,
            "text": text, "fields": clean, "box": box, "time": core.utc_iso(stamp), "created": stamp}


# ---------------------------------------------------------------- targets

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is a failure: following it could carry a token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise Permanent("HTTP %d redirect refused (fix the URL in the config)" % code)


def _http_post(target, url, body, headers, timeout):
    """POST BODY to URL -> (status, response bytes). Transient / Permanent on failure; never quotes the URL."""
    handlers = [_NoRedirect()]
    if url.lower().startswith("https:"):
        ctx = ssl.create_default_context(cafile=target.get("ca_file") or None)
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    opener = urllib.request.build_opener(*handlers)
    headers = dict(headers)
    headers.setdefault("User-Agent", USER_AGENT)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(MAX_RESPONSE_BYTES)
    except urllib.error.HTTPError as exc:
        try:
            detail = exc.read(2000).decode("utf-8", "replace")
        except Exception:
            detail = ""
        reason = "HTTP %d %s" % (exc.code, _short(_error_detail(detail) or exc.reason))
        if exc.code in (408, 425, 429) or exc.code >= 500:
            raise Transient(reason)
        raise Permanent(reason)
    except Permanent:
        raise
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            raise Transient("TLS: %s" % _short(getattr(reason, "reason", None) or reason))
        raise Transient("connection: %s" % _short(getattr(reason, "strerror", None) or reason))
    except (socket.timeout, TimeoutError):
        raise Transient("no answer within %gs" % timeout)
    except (OSError, ValueError) as exc:  # a reset connection, a half-read response, a bad port
        raise Transient("%s: %s" % (type(exc).__name__, _short(getattr(exc, "strerror", None) or exc)))


def _short(text, limit=160):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _error_detail(body):
    """The useful words of an error body: Telegram's description, Feishu's msg, else the text itself."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.strip()
    if isinstance(doc, dict):
        for key in ("description", "msg", "message", "error"):
            if isinstance(doc.get(key), str):
                return doc[key]
    return body.strip()


def _json_body(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def webhook_signature(secret, timestamp, body):
    """'sha256=' + hex HMAC-SHA256(secret, timestamp + '.' + body): what X-RGT-Signature carries."""
    digest = hmac.new(secret.encode("utf-8"), str(timestamp).encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def feishu_sign(secret, timestamp):
    """Feishu/Lark custom-bot signature: base64(HMAC-SHA256(key=timestamp + "\\n" + secret, message=b"")),
    per open.feishu.cn/document/client-docs/bot-v3/add-custom-bot (verified 2026-12)."""
    key = ("%s\n%s" % (timestamp, secret)).encode("utf-8")
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


def _send_webhook(target, message, timeout):
    payload = {"schema": "rgt-notify/1", "id": message["id"], "event": message["event"],
               "severity": message["severity"], "title": message["title"], "text": message["text"],
               "fields": message["fields"], "box": message["box"], "time": message["time"]}
    body = _json_body(payload)
    stamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "X-RGT-Event": message["event"],
               "X-RGT-Delivery": message["id"], "X-RGT-Timestamp": stamp,
               "X-RGT-Signature": webhook_signature(target["secret"], stamp, body)}
    _http_post(target, target["url"], body, headers, timeout)


def _slack_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _send_slack(target, message, timeout):
    body = _json_body({"text": _slack_escape(message["text"])})
    _http_post(target, target["url"], body, {"Content-Type": "application/json"}, timeout)


def _send_discord(target, message, timeout):
    text = message["text"]
    if len(text) > DISCORD_MAX:
        text = text[:DISCORD_MAX - 10] + "\n... (cut)"
    url = target["url"] + ("&" if "?" in target["url"] else "?") + "wait=true"
    body = _json_body({"content": text, "username": target.get("username") or "rgt",
                       "allowed_mentions": {"parse": []}})
    _http_post(target, url, body, {"Content-Type": "application/json"}, timeout)


def _send_telegram(target, message, timeout):
    base = (target.get("api_base") or "https://api.telegram.org").rstrip("/")
    url = "%s/bot%s/sendMessage" % (base, target["bot_token"])
    body = _json_body({"chat_id": target["chat_id"], "text": message["text"]})
    _status, raw = _http_post(target, url, body, {"Content-Type": "application/json"}, timeout)
    doc = _loads(raw)
    if not (isinstance(doc, dict) and doc.get("ok") is True):
        raise Permanent("Telegram said not ok: %s" % _short(_error_detail(raw.decode("utf-8", "replace"))))


def _send_feishu(target, message, timeout):
    payload = {"msg_type": "text", "content": {"text": message["text"]}}
    if target.get("secret"):
        stamp = str(int(time.time()))
        payload["timestamp"] = stamp
        payload["sign"] = feishu_sign(target["secret"], stamp)
    _status, raw = _http_post(target, target["url"], _json_body(payload), {"Content-Type": "application/json"},
                              timeout)
    doc = _loads(raw)
    code = doc.get("code", doc.get("StatusCode")) if isinstance(doc, dict) else None
    if code not in (0, None):
        raise Permanent("Feishu code %s: %s" % (code, _short(doc.get("msg") or doc.get("StatusMessage") or "")))


def _send_ntfy(target, message, timeout):
    severity = message["severity"]
    headers = {"Content-Type": "text/plain; charset=utf-8",
               "Title": message["head"].encode("ascii", "replace").decode("ascii"),
               "Priority": target.get("priority") or NTFY_PRIORITY[severity],
               "Tags": "%s,rgt,%s" % (NTFY_TAGS[severity], message["event"])}
    if target.get("token"):
        headers["Authorization"] = "Bearer %s" % target["token"]
    _http_post(target, target["url"], message["text"].encode("utf-8"), headers, timeout)


def _send_smtp(target, message, timeout):
    import smtplib
    from email.message import EmailMessage
    mail = EmailMessage()
    mail["Subject"] = message["head"]
    mail["From"] = target["from"]
    mail["To"] = ", ".join(target["to"])
    mail["X-RGT-Event"] = message["event"]
    mail.set_content(message["text"])
    tls = target.get("tls", "starttls")
    ctx = ssl.create_default_context(cafile=target.get("ca_file") or None)
    client = None
    try:
        if tls == "ssl":
            client = smtplib.SMTP_SSL(target["host"], target["port"], timeout=timeout, context=ctx)
        else:
            client = smtplib.SMTP(target["host"], target["port"], timeout=timeout)
        client.ehlo()
        if tls == "starttls":
            if not client.has_extn("starttls"):
                raise Permanent("the mail server offers no STARTTLS; refusing to send in clear")
            client.starttls(context=ctx)
            client.ehlo()
        if target.get("username"):
            client.login(target["username"], target["password"])
        client.send_message(mail)
    except Permanent:
        raise
    except smtplib.SMTPAuthenticationError as exc:
        raise Permanent("SMTP login refused (%s)" % exc.smtp_code)
    except smtplib.SMTPNotSupportedError as exc:
        raise Permanent("SMTP: %s" % _short(exc))
    except smtplib.SMTPRecipientsRefused:
        raise Permanent("SMTP: every recipient refused")
    except smtplib.SMTPResponseException as exc:
        reason = "SMTP %s %s" % (exc.smtp_code, _short(exc.smtp_error.decode("utf-8", "replace")
                                                       if isinstance(exc.smtp_error, bytes) else exc.smtp_error))
        if 400 <= exc.smtp_code < 500:
            raise Transient(reason)
        raise Permanent(reason)
    except ssl.SSLError as exc:
        raise Transient("TLS: %s" % _short(getattr(exc, "reason", None) or exc))
    except (socket.timeout, TimeoutError):
        raise Transient("no answer within %gs" % timeout)
    except (smtplib.SMTPException, OSError) as exc:
        raise Transient("SMTP %s: %s" % (type(exc).__name__, _short(getattr(exc, "strerror", None) or exc)))
    finally:
        if client is not None:
            try:
                client.quit()
            except Exception:
                try:
                    client.close()
                except Exception:
                    pass


def _loads(raw):
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None


SENDERS = {"webhook": _send_webhook, "slack": _send_slack, "discord": _send_discord, "telegram": _send_telegram,
           "feishu": _send_feishu, "ntfy": _send_ntfy, "smtp": _send_smtp}


def label(target):
    return "%s %r" % (target["type"], target["name"])


def send_all(targets, message, deadline, secrets=()):
    """Send MESSAGE to each target in parallel; wait no later than DEADLINE (monotonic).
    -> {name: (outcome, reason)} with outcome "sent", "transient" or "permanent". Never raises."""
    results, lock, threads = {}, threading.Lock(), []

    def work(target):
        timeout = max(0.1, min(float(target.get("timeout_s", DEFAULT_TARGET_TIMEOUT_S)),
                               deadline - time.monotonic()))
        try:
            SENDERS[target["type"]](target, message, timeout)
            outcome = ("sent", None)
        except Permanent as exc:
            outcome = ("permanent", redact(exc, secrets))
        except Transient as exc:
            outcome = ("transient", redact(exc, secrets))
        except Exception as exc:  # a bug in a sender must not stop the chain
            outcome = ("transient", redact("%s: %s" % (type(exc).__name__, _short(exc)), secrets))
        with lock:
            results.setdefault(target["name"], outcome)

    for target in targets:
        thread = threading.Thread(target=work, args=(target,), name="rgt-notify-%s" % target["name"], daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        for target in targets:  # still talking at the deadline: counted as not sent (its thread is a daemon)
            results.setdefault(target["name"], ("transient", "no answer within the %s budget" % "notify"))
        return dict(results)


# ---------------------------------------------------------------- the spool

_MEMORY_FAILURES = []   # failures that could not be written (full or read-only disk): shown by status_line


def _spool_write(path, data):
    """The one writer of spool and failure files (tests replace it to simulate a full disk)."""
    core.atomic_write(path, data, mode=0o600)


def _ensure_dir(path):
    os.makedirs(path, mode=0o700, exist_ok=True)


def _spool_name(message, target_name):
    return "msg-%d-%s-%s.json" % (int(message["created"] * 1000), message["id"][:12], target_name)


def _spool_files(spool_dir):
    try:
        names = sorted(n for n in os.listdir(spool_dir) if n.startswith("msg-") and n.endswith(".json"))
    except OSError:
        return []
    return [os.path.join(spool_dir, n) for n in names]


def _spool(spool_dir, message, target, reason, limits):
    """Write one spool entry -> None, or why it could not be kept."""
    try:
        _ensure_dir(spool_dir)
        if len(_spool_files(spool_dir)) >= limits["max_messages"]:
            return "the spool already holds %d messages" % limits["max_messages"]
        entry = {"schema": "rgt-notify-spool/1", "target": target["name"], "type": target["type"],
                 "attempts": 1, "last_error": reason, "last_try": time.time(),
                 "next_try": time.time() + SPOOL_BACKOFF_S, "message": message}
        _spool_write(os.path.join(spool_dir, _spool_name(message, target["name"])), core.dumps(entry))
        return None
    except OSError as exc:
        return "spool not writable (%s)" % (exc.strerror or errno.errorcode.get(exc.errno, exc))
    except Exception as exc:
        return "spool failed (%s)" % type(exc).__name__


def _record_failure(spool_dir, target, event, reason, kind="dropped"):
    """Remember a message that will not be sent (for status_line). In memory when the disk refuses."""
    entry = {"time": time.time(), "target": target.get("name"), "type": target.get("type"), "event": event,
             "reason": reason, "kind": kind}
    path = os.path.join(spool_dir, "failures.json")
    try:
        _ensure_dir(spool_dir)
        doc = core.read_json(path)
        entries = [e for e in doc.get("entries", []) if isinstance(e, dict)][-(FAILURES_KEPT - 1):] + [entry]
        _spool_write(path, core.dumps({"schema": "rgt-notify-failures/1", "entries": entries}))
    except Exception:
        _MEMORY_FAILURES.append(dict(entry, spool_dir=os.path.abspath(spool_dir)))
        del _MEMORY_FAILURES[:-FAILURES_KEPT]
        _record_lost(spool_dir, entry)


def lost_path(spool_dir):
    """Where a failure goes when the spool itself refuses it (finding C9): a file per spool dir in memory-backed
    /dev/shm (else the temp dir; $RGT_NOTIFY_LOST_DIR overrides), so a full spool disk cannot hide it from
    `notify.py status` run by another process."""
    base = os.environ.get("RGT_NOTIFY_LOST_DIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    if not base:
        import tempfile
        base = tempfile.gettempdir()
    key = hashlib.sha256(os.path.abspath(spool_dir).encode("utf-8", "replace")).hexdigest()[:16]
    return os.path.join(base, "rgt-notify-lost-%d-%s.json" % (os.getuid() if hasattr(os, "getuid") else 0, key))


def _record_lost(spool_dir, entry):
    path = lost_path(spool_dir)
    try:
        doc = core.read_json(path)
        entries = [e for e in doc.get("entries", []) if isinstance(e, dict)][-(FAILURES_KEPT - 1):] + [entry]
        core.atomic_write(path, core.dumps({"schema": "rgt-notify-failures/1", "spool_dir": os.path.abspath(
            spool_dir), "entries": entries}), mode=0o600)
    except Exception:   # nowhere left to write: the process's memory and the caller's log line remain
        pass


def spool_problem(spool_dir=None):
    """Why the spool dir cannot take a write now (a probe file), or None. Only an existing dir is probed."""
    spool_dir = spool_dir or default_spool_dir()
    if not os.path.isdir(spool_dir):
        parent = os.path.dirname(os.path.abspath(spool_dir))
        if os.path.exists(parent) and not os.path.isdir(parent):
            return "spool dir %s cannot be made (%s is not a directory)" % (spool_dir, parent)
        return None
    probe = os.path.join(spool_dir, ".probe-%d" % os.getpid())
    try:
        _spool_write(probe, b"probe\n")
    except OSError as exc:
        return "spool not writable (%s)" % (exc.strerror or errno.errorcode.get(exc.errno, exc))
    except Exception as exc:
        return "spool not writable (%s)" % type(exc).__name__
    _remove(probe)
    return None


def _limits(config):
    spool = (config or {}).get("spool", {})
    return {"max_age_h": float(spool.get("max_age_h", SPOOL_MAX_AGE_H)),
            "max_attempts": int(spool.get("max_attempts", SPOOL_MAX_ATTEMPTS)),
            "max_messages": int(spool.get("max_messages", SPOOL_MAX_MESSAGES))}


def _wants(target, event, run_events):
    wanted = target.get("events", ["*"])
    if "*" not in wanted and event not in wanted:
        return False
    return run_events is None or event in run_events


# ---------------------------------------------------------------- the API

def emit(event, fields, *, config_path=None, spool_dir=None, timeout=None, events=None):
    """Send EVENT with FIELDS to the configured targets; spool what could not go now. Never raises;
    returns within TIMEOUT seconds (default the config's timeout_s, else 10) plus a few ms."""
    summary = {"event": event, "sent": [], "spooled": [], "dropped": [], "errors": {}, "skipped": None}
    try:
        started = time.monotonic()
        spool_dir = spool_dir or default_spool_dir()
        if event not in EVENT_INFO:
            summary["skipped"] = "unknown event %r (known: %s)" % (event, ", ".join(EVENTS))
            return summary
        try:
            config = load_config(config_path)
        except (core.UsageError, core.Refused) as exc:
            summary["skipped"] = "notify config unusable: %s" % exc
            _record_failure(spool_dir, {"name": "config", "type": "config"}, event, summary["skipped"])
            return summary
        if config is None:
            summary["skipped"] = "no notify config at %s" % (config_path or default_config_path())
            return summary
        run_events = None if events is None else set(events)
        targets = [t for t in config["targets"] if event == TEST or _wants(t, event, run_events)]
        if not targets:
            summary["skipped"] = "no target takes %s" % event
            return summary
        budget = float(timeout if timeout is not None else config.get("timeout_s", DEFAULT_TOTAL_TIMEOUT_S))
        secrets = secrets_of(config)
        message = build_message(event, fields, config)
        results = send_all(targets, message, started + budget, secrets)
        limits = _limits(config)
        for target in targets:
            outcome, reason = results[target["name"]]
            if outcome == "sent":
                summary["sent"].append(target["name"])
                continue
            summary["errors"][target["name"]] = reason
            if outcome == "transient":
                why = _spool(spool_dir, message, target, reason, limits)
                if why is None:
                    summary["spooled"].append(target["name"])
                    continue
                reason = "%s; not kept: %s" % (reason, why)
                summary["errors"][target["name"]] = reason
            summary["dropped"].append(target["name"])
            _record_failure(spool_dir, target, event, reason)
    except Exception as exc:  # the contract: never raise into a watcher
        summary["skipped"] = summary["skipped"] or "notify error: %s" % type(exc).__name__
    return summary


def flush_spool(config_path=None, spool_dir=None, budget_s=10.0, now=None):
    """Retry spooled messages that are due. Never raises. -> {"sent", "dropped", "waiting", "errors", "busy"}"""
    result = {"sent": [], "dropped": [], "waiting": 0, "errors": {}, "busy": False, "skipped": None}
    lock_fd = None
    try:
        started = time.monotonic()
        deadline = started + float(budget_s)
        spool_dir = spool_dir or default_spool_dir()
        files = _spool_files(spool_dir)
        if not files:
            return result
        try:
            config = load_config(config_path)
        except (core.UsageError, core.Refused) as exc:
            result["skipped"] = "notify config unusable: %s" % exc
            result["waiting"] = len(files)
            return result
        if config is None:
            result["skipped"] = "no notify config at %s" % (config_path or default_config_path())
            result["waiting"] = len(files)
            return result
        lock_fd = _try_lock(spool_dir)
        if lock_fd is False:
            result["busy"] = True
            result["waiting"] = len(files)
            return result
        targets = {t["name"]: t for t in config["targets"]}
        secrets = secrets_of(config)
        limits = _limits(config)
        wall = time.time() if now is None else now
        failing = set()     # a target that failed this round is not tried again this round
        for path in files:
            entry = core.read_json(path)
            message = entry.get("message")
            name = entry.get("target")
            if not isinstance(message, dict) or not isinstance(name, str):
                _remove(path)
                continue
            target = targets.get(name)
            if target is None:
                _drop(path, spool_dir, {"name": name, "type": entry.get("type")}, message,
                      "target no longer in the notify config", result)
                continue
            age_h = (wall - float(message.get("created", wall))) / 3600.0
            if age_h > limits["max_age_h"] or int(entry.get("attempts", 0)) >= limits["max_attempts"]:
                _drop(path, spool_dir, target, message, "gave up after %d tries over %s: %s" % (
                    int(entry.get("attempts", 0)), core.human_age(age_h * 3600), entry.get("last_error")), result)
                continue
            if name in failing or float(entry.get("next_try", 0)) > wall or time.monotonic() >= deadline:
                result["waiting"] += 1
                continue
            outcome, reason = send_all([target], message, deadline, secrets)[name]
            if outcome == "sent":
                _remove(path)
                result["sent"].append("%s:%s" % (name, message.get("event")))
            elif outcome == "permanent":
                _drop(path, spool_dir, target, message, reason, result)
            else:
                failing.add(name)
                result["errors"][name] = reason
                result["waiting"] += 1
                attempts = int(entry.get("attempts", 0)) + 1
                entry.update(attempts=attempts, last_error=reason, last_try=wall,
                             next_try=wall + min(SPOOL_BACKOFF_MAX_S, SPOOL_BACKOFF_S * 2 ** (attempts - 1)))
                try:
                    _spool_write(path, core.dumps(entry))
                except Exception:   # full or read-only disk: the old entry stays, tried again next round
                    result["skipped"] = "spool not writable; entries left as they were"
                    break
    except Exception as exc:
        result["skipped"] = result["skipped"] or "notify error: %s" % type(exc).__name__
    finally:
        if lock_fd not in (None, False):
            try:
                os.close(lock_fd)
            except OSError:
                pass
    return result


def _try_lock(spool_dir):
    """A non-blocking flock on SPOOL_DIR/.flush.lock -> fd, False when another flusher holds it, None
    when no lock can be made (read-only disk: flush anyway, nothing can be rewritten either)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(os.path.join(spool_dir, ".flush.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return False


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _drop(path, spool_dir, target, message, reason, result):
    _remove(path)
    result["dropped"].append("%s:%s" % (target.get("name"), message.get("event")))
    result["errors"][target.get("name")] = reason
    _record_failure(spool_dir, target, message.get("event"), reason)


def pending(spool_dir=None):
    """What waits in the spool, per target: {name: {"count", "since", "last_error", "type"}}."""
    spool_dir = spool_dir or default_spool_dir()
    out = {}
    for path in _spool_files(spool_dir):
        entry = core.read_json(path)
        message = entry.get("message") if isinstance(entry.get("message"), dict) else {}
        name = str(entry.get("target"))
        rec = out.setdefault(name, {"count": 0, "since": None, "last_error": None, "type": entry.get("type")})
        rec["count"] += 1
        created = message.get("created")
        if isinstance(created, (int, float)) and (rec["since"] is None or created < rec["since"]):
            rec["since"] = created
        rec["last_error"] = entry.get("last_error") or rec["last_error"]
    return out


def recent_failures(spool_dir=None, now=None):
    spool_dir = spool_dir or default_spool_dir()
    now = time.time() if now is None else now
    entries = [e for e in core.read_json(os.path.join(spool_dir, "failures.json")).get("entries", [])
               if isinstance(e, dict)]
    mine = os.path.abspath(spool_dir)
    seen = set()
    for entry in [e for e in _MEMORY_FAILURES if e.get("spool_dir") == mine] + [
            e for e in core.read_json(lost_path(spool_dir)).get("entries", []) if isinstance(e, dict)]:
        sig = (entry.get("time"), entry.get("target"), entry.get("event"))
        if sig not in seen:   # this process's memory and the lost file hold the same failure
            seen.add(sig)
            entries.append(entry)
    return [e for e in entries if isinstance(e.get("time"), (int, float)) and now - e["time"] <= FAILURES_SHOWN_S]


def status_line(spool_dir=None):
    """One line for run_status, or None when every message went out. Never raises."""
    try:
        parts = []
        for name, rec in sorted(pending(spool_dir).items()):
            parts.append("%d message%s unsent to %s %r since %s: %s" % (
                rec["count"], "" if rec["count"] == 1 else "s", rec["type"], name,
                core.utc_iso(rec["since"]) if rec["since"] else "?", _short(rec["last_error"] or "?", 100)))
        dropped = {}
        for entry in recent_failures(spool_dir):
            rec = dropped.setdefault(entry.get("target"), {"count": 0, "type": entry.get("type"), "last": entry})
            rec["count"] += 1
            rec["last"] = entry
        for name, rec in sorted(dropped.items(), key=lambda item: str(item[0])):
            parts.append("%d message%s to %s %r dropped (last %s: %s)" % (
                rec["count"], "" if rec["count"] == 1 else "s", rec["type"], name,
                core.utc_iso(rec["last"]["time"]), _short(rec["last"].get("reason") or "?", 100)))
        problem = spool_problem(spool_dir)
        if problem:
            parts.append(problem)
        if not parts:
            return None
        return _short("notify: " + "; ".join(parts), 400)
    except Exception as exc:
        return "notify: status unreadable (%s)" % type(exc).__name__


def should_repeat(event_state, now):
    """Pure: send STOP NOT CONFIRMED (or any repeated event) again now?

    EVENT_STATE: {"count": messages sent so far, "last_sent": epoch of the last one, "acknowledged": bool,
    optional "every_s" (900), "max_interval_s" (14400), "max_count" (8)}. The gap doubles after each
    message (15 min, 30, 1 h, 2 h, 4 h, 4 h ...). False once acknowledged or at the cap."""
    state = event_state or {}
    if state.get("acknowledged"):
        return False
    count = int(state.get("count") or 0)
    if count <= 0:
        return True
    if count >= int(state.get("max_count", REPEAT_MAX_COUNT)):
        return False
    last = state.get("last_sent")
    if not isinstance(last, (int, float)) or isinstance(last, bool):
        return True
    gap = min(float(state.get("every_s", REPEAT_EVERY_S)) * 2 ** (count - 1),
              float(state.get("max_interval_s", REPEAT_MAX_INTERVAL_S)))
    return now - last >= gap


def note_repeat(event_state, now):
    """Pure: the state after one more message was sent at NOW (a new dict)."""
    state = dict(event_state or {})
    state["count"] = int(state.get("count") or 0) + 1
    state["last_sent"] = now
    state.setdefault("first_sent", now)
    return state


# ---------------------------------------------------------------- the CLI

def _install(args):
    if not args.stdin:
        raise core.UsageError("install reads the config from stdin only: notify.py install --stdin < FILE "
                              "(never from argv, so no secret lands in ps or a shell history)")
    raw = sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
    config = parse_config_bytes(raw, "the notify config on stdin")
    path = args.config or default_config_path()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise core.CheckFailed("cannot create %s: %s" % (folder, exc.strerror or exc))
    try:
        core.atomic_write(path, core.dumps(config), mode=0o600)
        check_private(path)
    except OSError as exc:
        raise core.CheckFailed("cannot write %s: %s" % (path, exc.strerror or exc))
    names = ["%s %s" % (t["type"], t["name"]) for t in config["targets"]]
    return _out(args, {"ok": True, "config": path, "targets": names},
                "%s notify config written to %s (mode 0600): %d target(s): %s"
                % (core.OK, path, len(names), ", ".join(names)))


def _load_for_cli(args):
    path = args.config or default_config_path()
    config = load_config(path)
    if config is None:
        raise core.UsageError("no notify config at %s (write one with: rgt.py notify setup HOST --from FILE)" % path)
    return path, config


def _check(args):
    path, config = _load_for_cli(args)
    names = ["%s %s (%s)" % (t["type"], t["name"], ",".join(t.get("events", ["*"]))) for t in config["targets"]]
    return _out(args, {"ok": True, "config": path, "targets": names},
                "%s notify config %s: %d target(s): %s" % (core.OK, path, len(names), "; ".join(names)))


def _test(args):
    path, config = _load_for_cli(args)
    budget = args.timeout or float(config.get("timeout_s", DEFAULT_TOTAL_TIMEOUT_S))
    message = build_message(TEST, {"note": "a test from notify.py test; nothing is wrong"}, config)
    results = send_all(config["targets"], message, time.monotonic() + budget, secrets_of(config))
    rows, lines, ok = [], [], True
    for target in config["targets"]:
        outcome, reason = results[target["name"]]
        good = outcome == "sent"
        ok = ok and good
        rows.append({"target": target["name"], "type": target["type"], "status": core.OK if good else core.FAIL,
                     "reason": reason})
        lines.append("%-4s %s%s" % (core.OK if good else core.FAIL, label(target), "" if good else ": " + reason))
    _out(args, {"ok": ok, "config": path, "targets": rows}, "\n".join(lines))
    return core.EXIT_OK if ok else core.EXIT_FAIL


def _emit(args):
    fields = {}
    for item in args.field or []:
        if "=" not in item:
            raise core.UsageError("--field %r: give KEY=VALUE" % item)
        key, value = item.split("=", 1)
        try:
            fields[key] = json.loads(value) if re.match(r"^-?\d+(\.\d+)?$", value) else value
        except ValueError:
            fields[key] = value
    if args.event not in EVENT_INFO:
        raise core.UsageError("unknown event %r (known: %s)" % (args.event, ", ".join(EVENTS + (TEST,))))
    events = None if args.events is None else [e for e in args.events.split(",") if e]
    summary = emit(args.event, fields, config_path=args.config, spool_dir=args.spool_dir, timeout=args.timeout,
                   events=events)
    line = "%s %s: sent %s; spooled %s; dropped %s%s" % (
        core.FAIL if summary["dropped"] else core.OK, args.event, ",".join(summary["sent"]) or "-",
        ",".join(summary["spooled"]) or "-", ",".join(summary["dropped"]) or "-",
        ("; " + summary["skipped"]) if summary["skipped"] else "")
    _out(args, summary, line)
    return core.EXIT_FAIL if summary["dropped"] else core.EXIT_OK


def _flush(args):
    result = flush_spool(args.config, args.spool_dir, budget_s=args.budget_s)
    line = "%s flush: sent %d, dropped %d, waiting %d%s" % (
        core.FAIL if result["dropped"] else core.OK, len(result["sent"]), len(result["dropped"]), result["waiting"],
        ("; " + result["skipped"]) if result["skipped"] else "")
    _out(args, result, line)
    return core.EXIT_FAIL if result["dropped"] else core.EXIT_OK


def lost_count(spool_dir=None):
    """How many messages were dropped or refused (recent_failures: the last 24 h), or 0. Never raises."""
    try:
        return len(recent_failures(spool_dir))
    except Exception:
        return 0


def _status(args):
    line = status_line(args.spool_dir)
    dropped = lost_count(args.spool_dir)
    _out(args, {"ok": line is None, "line": line, "dropped": dropped,
                "unsent": sum(rec["count"] for rec in pending(args.spool_dir).values())},
         line or "%s notify: nothing unsent" % core.OK)
    return core.EXIT_OK if line is None else core.EXIT_FAIL


def _out(args, obj, human):
    if getattr(args, "json", False):
        core.emit_json(obj)
    else:
        print(human)
    return core.EXIT_OK


def build_parser():
    usage = next(para for para in __doc__.split("\n\n") if para.startswith("Usage"))
    exit_codes = core.exit_codes_epilog(__doc__)
    parser = core.Parser(prog="notify.py", description="Send run events from the node (see the docstring).",
                         formatter_class=core.RawHelp, epilog=usage + "\n\n" + exit_codes)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=core.Parser,
                                help="what to do; notify.py COMMAND --help for its options")
    common = core.Parser(add_help=False)
    common.add_argument("--config", help="the notify config (default ~/.config/rgt/notify.json)")
    common.add_argument("--json", action="store_true", help="machine-readable output")

    def command(name, help_text):
        return sub.add_parser(name, parents=[common], help=help_text, formatter_class=core.RawHelp,
                              epilog=exit_codes)

    p = command("install", "write the config read from stdin (0600, atomic)")
    p.add_argument("--stdin", action="store_true", help="read the config from stdin (the only way)")
    command("check", "validate the config and its permissions; send nothing")
    p = command("test", "send a test message to every target")
    p.add_argument("--timeout", type=core.arg_number(float, 0.1, 600), help="seconds for all targets together")
    p = command("emit", "send one event")
    p.add_argument("event", help="one of: " + ", ".join(EVENTS + (TEST,)))
    p.add_argument("--field", action="append", metavar="KEY=VALUE", help="a field of the message (repeatable)")
    p.add_argument("--events", help="this run's own event list (comma-separated): narrows each target's list")
    p.add_argument("--spool-dir", help="the spool (default ~/.cache/rgt/notify-spool)")
    p.add_argument("--timeout", type=core.arg_number(float, 0.1, 600), help="seconds for all targets together")
    p = command("flush", "retry spooled messages that are due")
    p.add_argument("--spool-dir", help="the spool (default ~/.cache/rgt/notify-spool)")
    p.add_argument("--budget-s", type=core.arg_number(float, 0.1, 3600), default=10.0,
                   help="seconds the whole flush may take (default 10)")
    p = command("status", "one line: what is unsent or was dropped")
    p.add_argument("--spool-dir", help="the spool (default ~/.cache/rgt/notify-spool)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.command:
        raise core.UsageError("give a command: install, check, test, emit, flush, status")
    core.check_toolkit()
    return {"install": _install, "check": _check, "test": _test, "emit": _emit, "flush": _flush,
            "status": _status}[args.command](args)


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="notify.py"))
