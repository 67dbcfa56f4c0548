"""scripts/node/notify.py and `rgt.py notify` (issue 25): messages from the node when a run ends, fails,
stalls or the meter did not stop.

Every target is held to its own documentation (each test cites the page, read 2026-12) by a real
server on 127.0.0.1: an HTTP server that records each request and checks its shape and signature, and
a real SMTP server (aiosmtpd from PyPI) that requires STARTTLS before it accepts a login. Then the
failure drills: a target that hangs (emit still returns within its budget), one that fails then
recovers (the spool retries), a full disk under the spool (gives up cleanly, never raises), and the
canary: a secret planted in the config is found in no file the chain writes on either side but the
0600 config itself, and never in an argv.
"""
import base64
import errno
import hashlib
import hmac
import http.server
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import NODE, REPO, SCRIPTS, missing, need, need_module, need_root
from sshd_fixture import sshd_server  # noqa: F401

sys.path.insert(0, str(NODE))
sys.path.insert(0, str(SCRIPTS))
import notify  # noqa: E402

NOTIFY = NODE / "notify.py"
RGT = SCRIPTS / "rgt.py"
ENV = dict(os.environ, RGT_SKIP_VERSION_CHECK="0")


# ---------------------------------------------------------------- helpers

class Headers(dict):
    """Header names are case-insensitive (RFC 9110), as in any web framework's header map."""

    def __init__(self, items=()):
        super().__init__((k.lower(), v) for k, v in dict(items).items())

    def __getitem__(self, key):
        return super().__getitem__(key.lower())

    def get(self, key, default=None):
        return super().get(key.lower(), default)


class Recorder(http.server.ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that records every request and answers from a script of replies.

    replies: a list of (status, body bytes, content type) used in order, the last one repeated;
    a reply of "hang" holds the connection open without answering until release is set."""
    daemon_threads = True

    def __init__(self, replies=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests = []
        self.replies = list(replies or [(200, b"ok", "text/plain")])
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.server_address[1]

    def next_reply(self):
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def close(self):
        self.release.set()
        self.shutdown()
        self.server_close()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.requests.append({"path": self.path, "headers": Headers(self.headers.items()), "body": body})
        reply = self.server.next_reply()
        if reply == "hang":
            self.server.release.wait(60)
            return
        status, payload, ctype = reply
        self.send_response(status)
        if status in (301, 302, 307, 308):
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def servers():
    made = []

    def make(replies=None):
        server = Recorder(replies)
        made.append(server)
        return server
    yield make
    for server in made:
        server.close()


def write_config(path, doc, mode=0o600):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    os.chmod(path, mode)
    return str(path)


def node_cli(*args, stdin=None, timeout=60):
    return subprocess.run([sys.executable, str(NOTIFY)] + [str(a) for a in args], input=stdin,
                          capture_output=True, timeout=timeout)


def verify_from_docs(headers, body, secret):
    """Run the receiver's verification snippet exactly as references/run-remote/notifications.md prints it."""
    doc = (REPO / "references" / "run-remote" / "notifications.md").read_text()
    section = doc.split("## Verify the webhook signature", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {}
    exec(compile(code, "notifications.md snippet", "exec"), scope)
    return scope["verify"](headers, body, secret)


SECRET = "whsec-0123456789abcdef-test"


# ---------------------------------------------------------------- each target's request shape

def test_notif_webhook_is_signed_and_the_documented_check_verifies_it(tmp_path, servers):
    """Our own contract (notifications.md): JSON body; X-RGT-Timestamp + X-RGT-Signature = sha256=HMAC(secret,
    timestamp + "." + body). The receiver snippet printed in the docs accepts it, and refuses a changed body,
    a wrong secret and a stale timestamp."""
    srv = servers()
    cfg = write_config(tmp_path / "notify.json", {"box": "box-a", "targets": [
        {"type": "webhook", "name": "hook", "url": srv.base + "/in", "secret": SECRET, "allow_http": True}]})
    out = notify.emit(notify.FINISHED, {"run_id": "exp-1", "exit_code": 0, "bytes_synced": 5 << 20},
                      config_path=cfg, spool_dir=str(tmp_path / "spool"))
    assert out["sent"] == ["hook"] and not out["spooled"] and not out["dropped"], out
    req = srv.requests[0]
    assert req["path"] == "/in" and req["headers"]["Content-Type"] == "application/json"
    body = json.loads(req["body"])
    assert body["event"] == "finished" and body["fields"]["exit_code"] == 0 and body["box"] == "box-a"
    assert body["id"] == req["headers"]["X-RGT-Delivery"] and req["headers"]["X-RGT-Event"] == "finished"
    assert "exp-1" in body["text"] and "5.0 MiB" in body["text"]
    assert verify_from_docs(req["headers"], req["body"], SECRET) is True
    assert verify_from_docs(req["headers"], req["body"] + b" ", SECRET) is False
    assert verify_from_docs(req["headers"], req["body"], SECRET + "x") is False
    old = str(int(req["headers"]["X-RGT-Timestamp"]) - 3600)
    stale = Headers(dict(req["headers"], **{"x-rgt-timestamp": old,
                                            "x-rgt-signature": notify.webhook_signature(SECRET, old, req["body"])}))
    assert verify_from_docs(stale, req["body"], SECRET) is False   # replayed an hour later


def test_notif_slack_incoming_webhook_shape(tmp_path, servers):
    """Slack incoming webhooks: POST a JSON body with "text" to the webhook URL, Content-type
    application/json; the three characters & < > escaped as &amp; &lt; &gt;.
    https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks (read 2026-12)"""
    srv = servers()
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "slack", "url": srv.base + "/services/T0/B0/XXXXXXXXXXXX", "allow_http": True}]})
    out = notify.emit(notify.FAILED, {"run_id": "r1", "reason": "loss <nan> & exit 3"}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["slack"], out
    req = srv.requests[0]
    assert req["headers"]["Content-Type"] == "application/json"
    body = json.loads(req["body"])
    assert list(body) == ["text"] and "Run FAILED" in body["text"]
    assert "loss &lt;nan&gt; &amp; exit 3" in body["text"] and "<nan>" not in body["text"]


def test_notif_discord_execute_webhook_shape(tmp_path, servers):
    """Discord Execute Webhook: POST JSON with "content" (at most 2000 characters), optional "username",
    "allowed_mentions"; ?wait=true makes Discord confirm the message was saved (200 + the message).
    https://discord.com/developers/docs/resources/webhook#execute-webhook (read 2026-12)"""
    srv = servers([(200, b'{"id": "1"}', "application/json")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "discord", "url": srv.base + "/api/webhooks/1/tok", "allow_http": True}]})
    out = notify.emit(notify.STALLED, {"run_id": "r1", "note": "@everyone " + "x" * 5000}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["discord"], out
    req = srv.requests[0]
    assert req["path"] == "/api/webhooks/1/tok?wait=true"
    body = json.loads(req["body"])
    assert len(body["content"]) <= 2000 and "Run STALLED" in body["content"]
    assert body["allowed_mentions"] == {"parse": []} and body["username"] == "rgt"   # no @everyone ping


def test_notif_telegram_send_message_shape_and_a_refusal(tmp_path, servers):
    """Telegram Bot API: POST https://api.telegram.org/bot<token>/sendMessage with chat_id and text
    (1-4096 characters); the answer is JSON with "ok", and on error "description".
    https://core.telegram.org/bots/api#sendmessage and #making-requests (read 2026-12)"""
    srv = servers([(200, b'{"ok": true, "result": {"message_id": 7}}', "application/json"),
                   (400, b'{"ok": false, "error_code": 400, "description": "Bad Request: chat not found"}',
                    "application/json")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "telegram", "bot_token": "123456:ABC-def_ghi", "chat_id": 4242, "api_base": srv.base,
         "allow_http": True}]})
    out = notify.emit(notify.DEADMAN_FIRED, {"run_id": "r1", "reason": "stall"}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["telegram"], out
    req = srv.requests[0]
    assert req["path"] == "/bot123456:ABC-def_ghi/sendMessage"
    body = json.loads(req["body"])
    assert body["chat_id"] == 4242 and body["text"].startswith("[rgt] Dead-man FIRED - run r1")
    assert len(body["text"]) <= 4096
    out = notify.emit(notify.DEADMAN_FIRED, {"run_id": "r1"}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["dropped"] == ["telegram"] and "chat not found" in out["errors"]["telegram"]   # 400: for good
    assert "ABC-def_ghi" not in json.dumps(out)


def feishu_expected_sign(timestamp, secret):
    """Written from the Feishu/Lark page, independently of notify.py: string_to_sign = timestamp + "\\n" +
    secret is the HMAC-SHA256 KEY, the message is empty, the digest is base64-encoded."""
    mac = hmac.new(("%s\n%s" % (timestamp, secret)).encode(), digestmod=hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def test_notif_feishu_lark_custom_bot_signature(tmp_path, servers):
    """Feishu/Lark custom bot: POST JSON {"msg_type": "text", "content": {"text": ...}}; with signature
    verification on, add "timestamp" (seconds, within one hour) and "sign" as above. A bad sign is answered
    HTTP 200 with {"code": 19021, "msg": "sign match fail or timestamp is not within one hour ..."}.
    https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot and
    https://open.larksuite.com/document/client-docs/bot-v3/add-custom-bot (read 2026-12)"""
    secret = "feishu-secret-abc123"
    srv = servers([(200, b'{"code": 0, "msg": "success", "data": {}}', "application/json"),
                   (200, b'{"code": 19021, "data": {}, "msg": "sign match fail or timestamp is not within one '
                         b'hour from current time"}', "application/json")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "feishu", "name": "lark", "url": srv.base + "/open-apis/bot/v2/hook/abcdef123456",
         "secret": secret, "allow_http": True}]})
    out = notify.emit(notify.BUDGET_80, {"run_id": "r1", "spent": 8.0, "budget": 10.0}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["lark"], out
    body = json.loads(srv.requests[0]["body"])
    assert body["msg_type"] == "text" and "Budget 80% spent" in body["content"]["text"]
    assert abs(int(body["timestamp"]) - time.time()) < 3600
    assert body["sign"] == feishu_expected_sign(body["timestamp"], secret)
    assert feishu_expected_sign(body["timestamp"], secret + "x") != body["sign"]
    out = notify.emit(notify.BUDGET_80, {"run_id": "r1"}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["dropped"] == ["lark"] and "19021" in out["errors"]["lark"]


def test_notif_ntfy_publish_shape(tmp_path, servers):
    """ntfy: POST (or PUT) the message as the body to the topic URL; Title, Priority (1-5) and Tags
    (comma-separated) as headers; a protected topic takes "Authorization: Bearer <token>".
    https://docs.ntfy.sh/publish/ (read 2026-12)"""
    srv = servers([(200, b'{"id": "x", "event": "message"}', "application/json")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "ntfy", "url": srv.base + "/rgt-phone-7f3k", "token": "tk_abcdefghijklmnop", "allow_http": True}]})
    out = notify.emit(notify.STOP_NOT_CONFIRMED, {"run_id": "r1", "box_up_s": 300}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["ntfy"], out
    req = srv.requests[0]
    assert req["path"] == "/rgt-phone-7f3k"
    h = req["headers"]
    assert h["Priority"] == "5" and "rotating_light" in h["Tags"].split(",")
    assert h["Title"].startswith("[rgt] STOP NOT CONFIRMED") and h["Authorization"] == "Bearer tk_abcdefghijklmnop"
    assert req["body"].decode().startswith("[rgt] STOP NOT CONFIRMED") and "box_up_s: 5m" in req["body"].decode()


# ---------------------------------------------------------------- SMTP

def self_signed(tmp_path):
    openssl = need("openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return str(key), str(cert)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def smtp_server(tmp_path):
    """aiosmtpd on 127.0.0.1 that offers STARTTLS, requires it, and accepts AUTH only over TLS."""
    need_module("aiosmtpd")
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword
    key, cert = self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    seen = {"auth": [], "mail": []}

    class Sink:
        async def handle_DATA(self, server, session, envelope):
            seen["mail"].append({"from": envelope.mail_from, "to": list(envelope.rcpt_tos),
                                 "data": envelope.content, "tls": session.ssl is not None,
                                 "authenticated": session.authenticated})
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        ok = isinstance(auth_data, LoginPassword) and auth_data.login == b"rgt@example.org" \
            and auth_data.password == b"mail-pass-123"
        seen["auth"].append({"mechanism": mechanism, "tls": session.ssl is not None, "ok": ok})
        return AuthResult(success=ok, handled=False)   # handled=False: answer 535, not silence

    controllers = []

    def start(starttls=True):
        kwargs = dict(tls_context=ctx, require_starttls=True) if starttls else {}
        controller = Controller(Sink(), hostname="127.0.0.1", port=free_port(), authenticator=authenticator,
                                auth_require_tls=True, **kwargs)
        controller.start()
        controllers.append(controller)
        return controller
    yield start, seen, cert
    for controller in controllers:
        controller.stop()


def smtp_target(port, cert, **extra):
    target = {"type": "smtp", "name": "mail", "host": "127.0.0.1", "port": port, "tls": "starttls",
              "username": "rgt@example.org", "password": "mail-pass-123", "from": "rgt@example.org",
              "to": ["me@example.org"], "ca_file": cert}
    target.update(extra)
    return target


def test_notif_smtp_starttls_then_login_then_mail(tmp_path, smtp_server):
    """SMTP submission: EHLO, STARTTLS (RFC 3207), EHLO again, AUTH (RFC 4954), MAIL/RCPT/DATA; the server
    here refuses AUTH before TLS, so a login that worked proves the order. Python's smtplib does each step:
    https://docs.python.org/3/library/smtplib.html (read 2026-12)"""
    start, seen, cert = smtp_server
    server = start()
    cfg = write_config(tmp_path / "n.json", {"targets": [smtp_target(server.port, cert)]})
    out = notify.emit(notify.DISK_LOW, {"run_id": "r1", "free_bytes": 1 << 30}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["mail"], out
    assert seen["auth"] and all(a["tls"] and a["ok"] for a in seen["auth"])
    mail = seen["mail"][0]
    assert mail["tls"] and mail["from"] == "rgt@example.org" and mail["to"] == ["me@example.org"]
    text = mail["data"].decode()
    assert "Subject: [rgt] Disk low - run r1" in text and "X-RGT-Event: disk_low" in text
    # a wrong password is a refusal for good: dropped, not spooled, and the password is not in the reason
    cfg = write_config(tmp_path / "n2.json", {"targets": [smtp_target(server.port, cert, password="wrong-pass-9")]})
    out = notify.emit(notify.DISK_LOW, {}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["dropped"] == ["mail"] and "login refused" in out["errors"]["mail"], out["errors"]
    assert "wrong-pass-9" not in json.dumps(out)


def test_notif_smtp_never_logs_in_without_tls(tmp_path, smtp_server):
    """A server that offers no STARTTLS: the client refuses to go on (no AUTH sent in clear)."""
    start, seen, cert = smtp_server
    server = start(starttls=False)
    cfg = write_config(tmp_path / "n.json", {"targets": [smtp_target(server.port, cert)]})
    out = notify.emit(notify.FAILED, {}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["dropped"] == ["mail"] and "no STARTTLS" in out["errors"]["mail"]
    assert seen["auth"] == [] and seen["mail"] == []


# ---------------------------------------------------------------- routing, redaction, redirects

def test_notif_events_go_where_the_config_and_the_run_say(tmp_path, servers):
    a, b = servers(), servers()
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "slack", "name": "all", "url": a.base + "/a", "allow_http": True},
        {"type": "slack", "name": "alarms", "url": b.base + "/b", "allow_http": True,
         "events": ["failed", "stop_not_confirmed"]}]})
    spool = str(tmp_path / "s")
    assert notify.emit(notify.LAUNCHED, {}, config_path=cfg, spool_dir=spool)["sent"] == ["all"]
    assert sorted(notify.emit(notify.FAILED, {}, config_path=cfg, spool_dir=spool)["sent"]) == ["alarms", "all"]
    # a run's own list narrows every target's
    out = notify.emit(notify.LAUNCHED, {}, config_path=cfg, spool_dir=spool, events=["failed"])
    assert out["sent"] == [] and out["skipped"] == "no target takes launched"
    assert len(a.requests) == 2 and len(b.requests) == 1
    assert notify.emit("no_such_event", {}, config_path=cfg, spool_dir=spool)["skipped"].startswith("unknown event")
    assert notify.emit(notify.FAILED, {}, config_path=str(tmp_path / "none.json"),
                       spool_dir=spool)["skipped"].startswith("no notify config")


def test_notif_a_secret_in_the_fields_is_masked(tmp_path, servers):
    srv = servers()
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "webhook", "url": srv.base + "/h", "secret": SECRET, "allow_http": True}]})
    out = notify.emit(notify.FAILED, {"reason": "curl failed: %s rejected" % SECRET}, config_path=cfg,
                      spool_dir=str(tmp_path / "s"))
    assert out["sent"] == ["webhook"]
    assert SECRET.encode() not in srv.requests[0]["body"] and b"curl failed: *** rejected" in srv.requests[0]["body"]


def test_notif_a_redirect_is_refused_not_followed(tmp_path, servers):
    """Following a redirect could carry a token to another host: it is a failure with a reason."""
    srv = servers([(302, b"", "text/plain")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "ntfy", "url": srv.base + "/topic-abcdef", "token": "tk_secret_token_1", "allow_http": True}]})
    out = notify.emit(notify.FAILED, {}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["dropped"] == ["ntfy"] and "redirect refused" in out["errors"]["ntfy"]
    assert len(srv.requests) == 1


# ---------------------------------------------------------------- drills: hang, recover, full disk

def test_notif_a_hanging_target_cannot_hold_the_chain(tmp_path, servers):
    """A target that accepts and never answers: emit returns by its budget (2 s here; the bound asserted is a
    generous 20 s), the healthy target still got its message, the hanging one is spooled for later."""
    hang, good = servers(["hang"]), servers()
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "webhook", "name": "stuck", "url": hang.base + "/h", "secret": SECRET, "allow_http": True,
         "timeout_s": 60},
        {"type": "slack", "name": "fine", "url": good.base + "/s", "allow_http": True}]})
    started = time.monotonic()
    out = notify.emit(notify.DEADMAN_FIRED, {"run_id": "r1"}, config_path=cfg, spool_dir=str(tmp_path / "s"),
                      timeout=2)
    assert time.monotonic() - started < 20
    assert out["sent"] == ["fine"] and out["spooled"] == ["stuck"], out
    assert "no answer" in out["errors"]["stuck"]


def test_notif_fails_then_recovers_through_the_spool(tmp_path, servers):
    """HTTP 500 -> spooled, status shows it; the retry is not due before its backoff; when due it goes out with
    the same delivery id (so a receiver can drop a duplicate) and a fresh, valid signature."""
    srv = servers([(500, b"oops", "text/plain"), (200, b"ok", "text/plain")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "webhook", "name": "hook", "url": srv.base + "/h", "secret": SECRET, "allow_http": True}]})
    spool = str(tmp_path / "spool")
    out = notify.emit(notify.FAILED, {"run_id": "r9", "exit_code": 3}, config_path=cfg, spool_dir=spool)
    assert out["spooled"] == ["hook"] and out["errors"]["hook"].startswith("HTTP 500"), out
    line = notify.status_line(spool)
    assert line.startswith("notify: 1 message unsent to webhook 'hook' since ") and "HTTP 500" in line
    (entry_path,) = [p for p in Path(spool).iterdir() if p.name.startswith("msg-")]
    assert stat.S_IMODE(entry_path.stat().st_mode) == 0o600
    entry = json.loads(entry_path.read_text())
    early = notify.flush_spool(cfg, spool, budget_s=5, now=entry["last_try"] + 1)
    assert early["sent"] == [] and early["waiting"] == 1 and len(srv.requests) == 1
    due = notify.flush_spool(cfg, spool, budget_s=5, now=entry["next_try"] + 1)
    assert due["sent"] == ["hook:failed"], due
    assert notify.status_line(spool) is None and not list(Path(spool).glob("msg-*"))
    first, second = srv.requests
    assert first["headers"]["X-RGT-Delivery"] == second["headers"]["X-RGT-Delivery"]
    assert verify_from_docs(second["headers"], second["body"], SECRET)


def test_notif_the_spool_gives_up_after_its_age_and_says_so(tmp_path, servers):
    srv = servers([(503, b"down", "text/plain")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "discord", "name": "dc", "url": srv.base + "/d", "allow_http": True}]})
    spool = str(tmp_path / "spool")
    assert notify.emit(notify.STALLED, {}, config_path=cfg, spool_dir=spool)["spooled"] == ["dc"]
    out = notify.flush_spool(cfg, spool, budget_s=5, now=time.time() + 25 * 3600)
    assert out["dropped"] == ["dc:stalled"] and "gave up" in out["errors"]["dc"]
    assert len(srv.requests) == 1                        # given up without another try
    line = notify.status_line(spool)
    assert "1 message to discord 'dc' dropped" in line and "unsent" not in line


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["ENOSPC", "EROFS"])
def test_notif_full_or_read_only_disk_under_the_spool_gives_up_cleanly(tmp_path, servers, monkeypatch, code):
    """The spool's writer raises ENOSPC or EROFS (injected): emit and flush return, never raise; the message is
    reported dropped with the reason, status_line still tells (from memory), and a spooled entry whose rewrite
    fails during a flush stays as it was for the next round."""
    srv = servers([(500, b"x", "text/plain")])
    cfg = write_config(tmp_path / "n.json", {"targets": [
        {"type": "slack", "name": "sl", "url": srv.base + "/s", "allow_http": True}]})
    spool = str(tmp_path / "spool")
    assert notify.emit(notify.FAILED, {"run_id": "r0"}, config_path=cfg, spool_dir=spool)["spooled"] == ["sl"]
    (kept,) = Path(spool).glob("msg-*")
    before = kept.read_bytes()

    def broken(path, data):
        raise OSError(code, os.strerror(code), path)
    monkeypatch.setattr(notify, "_spool_write", broken)
    out = notify.emit(notify.DEADMAN_FIRED, {"run_id": "r1"}, config_path=cfg, spool_dir=spool)
    assert out["dropped"] == ["sl"] and out["spooled"] == []
    assert os.strerror(code) in out["errors"]["sl"]
    line = notify.status_line(spool)
    assert "1 message unsent to slack 'sl'" in line and "1 message to slack 'sl' dropped" in line
    assert os.strerror(code) in line
    due = json.loads(before)["next_try"] + 1
    flushed = notify.flush_spool(cfg, spool, budget_s=5, now=due)
    assert flushed["skipped"] == "spool not writable; entries left as they were" and flushed["dropped"] == []
    assert kept.read_bytes() == before and len(srv.requests) == 3


def test_notif_full_tmpfs_spool_is_a_clean_give_up(tmp_path, servers):
    """The same on a real full filesystem: a 64 KiB tmpfs filled to the brim (root only)."""
    need_root("mounting a tmpfs")       # skips on a laptop, fails in CI (finding_review_B6)
    need("mount")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                         timeout=30)
    if res.returncode != 0:
        missing("cannot mount a tmpfs here (a container needs CAP_SYS_ADMIN: docker run --privileged): %s"
                % res.stderr.decode().strip())
    try:
        spool = mnt / "spool"
        spool.mkdir()
        try:
            with open(mnt / "filler", "wb") as fh:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        srv = servers([(500, b"x", "text/plain")])
        cfg = write_config(tmp_path / "n.json", {"targets": [
            {"type": "slack", "name": "sl", "url": srv.base + "/s", "allow_http": True}]})
        out = notify.emit(notify.FAILED, {"run_id": "r1"}, config_path=cfg, spool_dir=str(spool))
        assert out["dropped"] == ["sl"] and "not kept" in out["errors"]["sl"], out
        assert notify.status_line(str(spool))
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


# ---------------------------------------------------------------- STOP NOT CONFIRMED repeats

def test_notif_should_repeat_until_acknowledged_with_a_cap():
    state, now, sent_at = {}, 1000.0, []
    for minute in range(0, 60 * 24):
        t = now + minute * 60
        if notify.should_repeat(state, t):
            state = notify.note_repeat(state, t)
            sent_at.append(minute)
    # 15 min, then the gap doubles to a 4 h ceiling, and 8 messages at most
    assert sent_at == [0, 15, 45, 105, 225, 465, 705, 945]
    assert notify.should_repeat(dict(state, count=1), state["last_sent"] + 900) is True
    assert notify.should_repeat(dict(state, count=1, acknowledged=True), state["last_sent"] + 10 ** 6) is False
    assert notify.should_repeat({"count": 1, "last_sent": 0, "every_s": 60}, 59) is False


# ---------------------------------------------------------------- config: private, valid, clear errors

def test_notif_config_readable_by_others_is_refused(tmp_path, servers):
    srv = servers()
    doc = {"targets": [{"type": "slack", "url": srv.base + "/s", "allow_http": True}]}
    cfg = write_config(tmp_path / "n.json", doc, mode=0o644)
    out = notify.emit(notify.FAILED, {}, config_path=cfg, spool_dir=str(tmp_path / "s"))
    assert out["sent"] == [] and "readable by group or others" in out["skipped"] and not srv.requests
    res = node_cli("check", "--config", cfg)
    assert res.returncode == 3 and res.stderr.decode().count("\n") == 1 and b"chmod 600" in res.stderr
    link = tmp_path / "link.json"
    os.chmod(cfg, 0o600)
    link.symlink_to(cfg)
    res = node_cli("check", "--config", link)
    assert res.returncode == 3 and b"is a link" in res.stderr
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo, 0o600)
    res = node_cli("check", "--config", fifo, timeout=30)                    # refused, not a hang
    assert res.returncode == 3 and b"not a regular file" in res.stderr


@pytest.mark.parametrize("target, fragment", [
    ({"type": "slack", "url": "http://hooks.example/x"}, "plain http"),
    ({"type": "webhook", "url": "https://h.example/x", "secret": "short"}, "at least 16"),
    ({"type": "smtp", "host": "h", "tls": "none", "username": "u", "password": "CANARY-pw-1", "from": "a@b",
      "to": "c@d"}, "in clear"),
    ({"type": "ntfy", "url": "https://ntfy.example/t", "events": ["failed", "oops"]}, "unknown event"),
    ({"type": "telegram", "bot_token": "CANARY-tok-1"}, "missing chat_id"),
    ({"type": "discord", "url": "https://d.example/x", "secert": "CANARY-x"}, "unknown key"),
    ({"type": "pager"}, "type must be one of"),
])
def test_notif_bad_config_is_one_line_exit_2_and_quotes_no_secret(tmp_path, target, fragment):
    res = node_cli("install", "--stdin", "--config", tmp_path / "n.json", stdin=json.dumps({"targets": [target]}).encode())
    err = res.stderr.decode()
    assert res.returncode == 2 and err.count("\n") == 1 and fragment in err, err
    assert "CANARY" not in err and "Traceback" not in err and not (tmp_path / "n.json").exists()


def test_notif_cli_usage_errors_are_exit_2(tmp_path):
    assert node_cli("install", "--config", tmp_path / "n.json").returncode == 2     # not from argv, only --stdin
    assert node_cli("install", "--stdin", stdin=b"{not json").returncode == 2
    assert node_cli("emit", "nope").returncode == 2
    assert node_cli("test", "--config", tmp_path / "missing.json").returncode == 2
    assert node_cli().returncode == 2


def test_notif_install_writes_0600_atomically(tmp_path):
    cfg = tmp_path / "deep" / "rgt" / "notify.json"
    doc = {"targets": [{"type": "ntfy", "url": "https://ntfy.example/topic-123456789"}]}
    res = node_cli("install", "--stdin", "--config", cfg, stdin=json.dumps(doc).encode())
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600 and stat.S_IMODE(cfg.parent.stat().st_mode) == 0o700
    assert b"topic-123456789" not in res.stdout + res.stderr                 # the URL is the secret of ntfy
    assert json.loads(cfg.read_text())["targets"][0]["url"] == doc["targets"][0]["url"]
    assert [p.name for p in cfg.parent.iterdir()] == ["notify.json"]          # no temp file left


# ---------------------------------------------------------------- the laptop side and the canary

class FakeSsh:
    """Records what rgt.py would run: the argv and what goes to stdin."""

    def __init__(self):
        self.calls = []
        self.base = ["ssh", "-o", "BatchMode=yes"]

    def argv(self, command):
        return self.base + ["gpu-box", command]

    def run(self, command, timeout=600, stdin=None, capture=True):
        self.calls.append({"argv": self.argv(command), "stdin": stdin})
        out = json.dumps({"ok": True, "config": "/node/notify.json", "targets": ["ntfy ntfy"]}).encode()
        return subprocess.CompletedProcess(self.argv(command), 0, out, b"")


def test_notif_setup_never_puts_the_secret_in_argv(tmp_path, monkeypatch):
    import rgt as cli
    canary = "CANARY-argv-%d" % os.getpid()
    src = write_config(tmp_path / "mine.json", {"targets": [
        {"type": "ntfy", "url": "https://ntfy.example/%s" % canary, "token": canary}]})
    args = cli.build_parser().parse_args(["--ledger", str(tmp_path / "ledger.jsonl"), "notify", "setup", "gpu-box",
                                          "--from", src])
    args.rest = []
    fake = FakeSsh()
    assert cli.cmd_notify(args, fake) == 0
    (call,) = fake.calls
    assert not any(canary in word for word in call["argv"])
    assert call["argv"][-1].endswith("notify.py install --stdin --json")
    assert canary.encode() in call["stdin"]                       # it travels, on stdin only
    assert canary not in (tmp_path / "ledger.jsonl").read_text()


def test_notif_setup_refuses_a_bad_file_before_any_ssh(tmp_path):
    bad = write_config(tmp_path / "bad.json", {"targets": [{"type": "slack", "url": "http://x.example/y"}]})
    for argv in (["notify", "setup", "gpu-box", "--from", bad], ["notify", "setup", "gpu-box", "--from", "/nope"],
                 ["notify", "test"], ["notify"]):
        res = subprocess.run([sys.executable, str(RGT), "--ssh-config", "/dev/null"] + argv, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, (argv, res.stderr)


def files_holding(root, needle, skip=()):
    hits = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if path in skip or os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as fh:
                if needle in fh.read():
                    hits.append(path)
    return hits


def test_notif_canary_secret_is_found_nowhere_but_its_0600_file(tmp_path, servers, sshd_server):  # noqa: F811
    """A canary planted in every secret slot of the config; setup, test, emit, a failing target (spooled),
    flush and status run through the real sshd and the node CLI; then every file under the node dirs, the
    laptop state and the spool is searched: only the 0600 config holds it, and no output line shows it."""
    canary = "CANARY%dq" % os.getpid()
    hook, broken, tg = servers(), servers([(500, b"down", "text/plain")]), servers(
        [(200, b'{"ok": true}', "application/json")])
    laptop, node = tmp_path / "laptop", tmp_path / "node"
    laptop.mkdir()
    node.mkdir()
    src = write_config(tmp_path / "input" / "notify-src.json", {"box": "box-a", "targets": [
        {"type": "webhook", "name": "hook", "url": hook.base + "/h/" + canary + "u", "secret": canary + "-signing",
         "allow_http": True},
        {"type": "ntfy", "name": "phone", "url": broken.base + "/" + canary + "topic", "token": canary + "tok",
         "allow_http": True},
        {"type": "telegram", "name": "tg", "bot_token": "99:" + canary, "chat_id": 1, "api_base": tg.base,
         "allow_http": True}]})
    cfg = node / "home" / ".config" / "rgt" / "notify.json"
    spool = node / "home" / ".cache" / "rgt" / "notify-spool"
    base = [sys.executable, str(RGT), "--ssh-config", str(sshd_server.config), "--node-dir", str(node / "rgt-bin"),
            "--ledger", str(laptop / "state" / "ledger.jsonl")]
    outputs = []

    def rgt(*args):
        res = subprocess.run(base + list(args), capture_output=True, text=True, timeout=300, cwd=laptop)
        outputs.append(res.stdout + res.stderr)
        return res

    assert rgt("push", "gpu-box", "--transport", "tar").returncode == 0, outputs[-1]
    res = rgt("notify", "setup", "gpu-box", "--from", src, "--config-path", str(cfg))
    assert res.returncode == 0, res.stderr
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    res = rgt("notify", "test", "gpu-box", "--config-path", str(cfg))
    assert res.returncode == 1, res.stdout + res.stderr                     # the ntfy server answers 500
    assert re.search(r"^OK +webhook 'hook'$", res.stdout, re.M) and re.search(r"^FAIL ntfy 'phone': HTTP 500", res.stdout, re.M)
    tool = "python3 %s/notify.py" % (node / "rgt-bin")
    for command in ("emit failed --field run_id=r1 --field exit_code=3 --config %s --spool-dir %s" % (cfg, spool),
                    "flush --budget-s 5 --config %s --spool-dir %s" % (cfg, spool),
                    "check --config %s" % cfg):
        ran = sshd_server.run("%s %s" % (tool, command))
        outputs.append(ran.stdout + ran.stderr)
    st = sshd_server.run("%s status --spool-dir %s" % (tool, spool))
    outputs.append(st.stdout + st.stderr)
    assert st.returncode == 1 and "unsent to ntfy 'phone'" in st.stdout
    assert any(p.name.startswith("msg-") for p in spool.iterdir())          # the spool is in the search
    assert len(hook.requests) == 2 and len(tg.requests) == 2                 # test + emit reached the others
    hits = files_holding(str(tmp_path), canary.encode(), skip={str(cfg), src})
    assert hits == [], hits
    assert not any(canary in out for out in outputs)


# ---------------------------------------------------------------- laptop round 5 findings (issue 35)


# ---------------------------------------------------------------- L16: the notify config among a run's results

def test_finding_laptop_L16_notify_setup_refuses_a_config_path_under_a_durable_or_results_dir(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    pulled = tmp_path / "pulled"
    events = [{"event": "launch", "run_id": "sec2", "profile": "vastai", "state": "launched", "attempt": 1,
               "run_dir": "~/rgt/runs/sec2", "results_dir": "~/rgt/results/sec2"},
              {"event": "pull", "run_id": "sec2", "dest": str(pulled), "state": "pulled"}]
    ledger.write_text("".join(json.dumps(dict(r, host="gpu", time="2026-12-05T10:00:0%dZ" % i)) + "\n"
                              for i, r in enumerate(events)))
    src = tmp_path / "n.json"
    src.write_text(json.dumps({"targets": [{"type": "ntfy", "url": "https://ntfy.example/topic"}]}))
    src.chmod(0o600)

    def setup(path):
        return subprocess.run([sys.executable, str(RGT), "--ssh-config", "/dev/null", "--ledger", str(ledger),
                               "notify", "setup", "gpu", "--from", str(src), "--config-path", path],
                              capture_output=True, text=True, timeout=120)
    for path in ("~/rgt/results/sec2/logs/notify.json", "~/rgt/runs/sec2/notify.json", "~/rgt/notify.json",
                 "~/rgt/results/../results/other/n.json", str(pulled / "sec2" / "notify.json")):
        res = setup(path)
        assert res.returncode == 2 and "durable or results dir" in res.stderr, (path, res.stderr)
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    # a path outside them goes on to the node (here: no node, so ssh's own 255)
    res = setup("~/.config/rgt/notify.json")
    assert res.returncode == 255 and "durable or results dir" not in res.stderr, res.stderr
