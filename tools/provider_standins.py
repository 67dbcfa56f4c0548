"""Stand-in provider APIs on 127.0.0.1: just the endpoints our adapters, the runpod SDK and the vastai CLI use.

Written from the providers' own documentation and clients (see profiles/<platform>.md, section 5) and held to
the real contract by tests/test_providers.py, which runs the runpod SDK and the vastai CLI from PyPI against
them. State advances by request count, never by wall time: after a stop, an instance in mode "normal" reads
"stopping" for `lag` state reads, then stopped. Modes per instance:

  normal       the action takes effect after `lag` state reads
  never_stops  the action answers 200 (success) and the instance keeps running
  hang         every request about this instance blocks (until the stand-in closes; at most 60 s)
  401          every request about it is refused with 401
  429          the first `rate_limited` requests answer 429 with Retry-After, then it behaves as normal

Accounts: the stand-in accepts only `Authorization: Bearer <key>`; any other key gets 401.

The fault simulator (issue 36): Instance(faults={"action": [...], "state": [...]}) scripts each call about the
instance, one entry per call, the last entry repeating ("action" is the stop or terminate request, "state" a
read). Entries:

  honest     the call as a well-behaved provider answers it (the default)
  ignore     an action answered 200 that does nothing (200-but-still-running)
  running / stopped   a read that says so whatever the truth (stopped: a lie; alternate them to flap)
  429        429 with Retry-After (StandIn retry_after, "0.1" by default)
  500        HTTP 500
  hang       no answer until the stand-in closes (at most 60 s)
  slow       the honest answer after StandIn slow_s seconds (longer than the client's timeout)
  malformed  200 with a body that is not JSON
  null       200 with a null object (runpod pod: null, vast instances: null, lambda data: null, paperspace null)
  404        HTTP 404 for this call only (eventual consistency: the next entry finds it again)
  foreign    a read answered about another instance id, which reads stopped
  401        the key refused for this call (401 mid-run)
  reset      the connection dropped without an answer (what a client sees as refused/reset)
  echo_key   HTTP 400 whose error text echoes the caller's Authorization header (the key)

Instance.really_stopped() is the truth a test holds a CONFIRMED record to.
"""
import copy
import socket
import struct
import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG_MAX_S = 60.0


class Instance(object):
    def __init__(self, ident, name=None, state="running", mode="normal", lag=1, rate=1.25, rate_limited=0,
                 ip="192.0.2.10", ssh_port=22022):
        self.id, self.name, self.state, self.mode, self.lag = str(ident), name or "box-%s" % ident, state, mode, lag
        self.rate, self.rate_limited, self.ip, self.ssh_port = rate, rate_limited, ip, ssh_port
        self.pending, self.countdown, self.deleted = None, 0, False
        self.faults, self.calls = {}, {}

    def fault(self, kind):
        """The scripted behaviour of this KIND of call ("action" or "state"), advancing its script."""
        script = self.faults.get(kind) or ["honest"]
        index = self.calls.get(kind, 0)
        self.calls[kind] = index + 1
        return script[min(index, len(script) - 1)]

    def really_stopped(self):
        return self.deleted or self.state in ("stopped", "gone")

    def act(self, action):
        """stop or terminate was asked: what a well-behaved provider starts doing."""
        if self.mode == "never_stops":
            return
        self.pending, self.countdown = action, self.lag

    def read(self):
        """One state read: a pending action progresses one step (stand-ins count reads, not seconds)."""
        if self.pending:
            if self.countdown <= 0:
                if self.pending == "stop":
                    self.state = "stopped"
                else:
                    self.deleted, self.state = True, "gone"
                self.pending = None
            else:
                self.countdown -= 1
        return self.state

    def transitional(self):
        return self.pending is not None


class Volume(object):
    def __init__(self, ident, name=None, size_gb=50, region="XX-1", attached_to=None, on_volume=True):
        self.id, self.name, self.size_gb, self.region = str(ident), name or "vol-%s" % ident, size_gb, region
        self.attached_to = attached_to   # the instance id it is attached to (issue 37: billing joins on it)
        self.on_volume = on_volume       # vast.ai: the volume's own "instances" names it (else only volume_info)


class StandIn(object):
    """One provider's API on 127.0.0.1:<free port>. Use as a context manager; .url is its API base."""

    def __init__(self, provider, key, instances=(), volumes=(), retry_after="0.1", slow_s=1.0):
        self.provider, self.key = provider, key
        self.retry_after, self.slow_s = retry_after, slow_s
        self.instances = {i.id: i for i in instances}
        self.volumes = list(volumes)
        self.log = []
        self.list_fault = None   # one of LIST_FAULTS: every list request gets that malformed answer (issue 37)
        self.lock = threading.Lock()
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.handle(self, "GET")

            def do_POST(self):
                outer.handle(self, "POST")

            def do_PUT(self):
                outer.handle(self, "PUT")

            def do_PATCH(self):
                outer.handle(self, "PATCH")

            def do_DELETE(self):
                outer.handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ------------------------------------------------------------ lifecycle
    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    @property
    def root(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    @property
    def url(self):
        """The API base our adapters take (RGT_<PROVIDER>_API_URL)."""
        return self.root + {"runpod": "", "vastai": "", "lambda": "/api/v1", "paperspace": "/v1"}[self.provider]

    def calls(self, method=None):
        return [c for c in self.log if method is None or c["method"] == method]

    # ------------------------------------------------------------ plumbing
    def handle(self, req, method):
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        parts = urllib.parse.urlsplit(req.path)
        try:
            body = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except ValueError:
            body = None
        with self.lock:
            self.log.append({"method": method, "path": parts.path, "query": urllib.parse.parse_qs(parts.query),
                             "body": body, "auth": req.headers.get("Authorization") == "Bearer " + self.key})
        if req.headers.get("Authorization") != "Bearer " + self.key:
            return self.reply(req, 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
        if self.list_fault and is_list_request(self.provider, method, parts.path, body):
            return self.reply_list_fault(req)
        route = getattr(self, "route_" + self.provider)
        try:
            status, doc, inst = route(method, parts.path, urllib.parse.parse_qs(parts.query), body)
        except KeyError:
            return self.reply(req, 404, {"error": "not_found"})
        if inst is not None and inst.mode == "hang":
            self.closing.wait(HANG_MAX_S)
            return
        if inst is not None and inst.mode == "401":
            return self.reply(req, 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
        if inst is not None and inst.mode == "429" and inst.rate_limited > 0:
            inst.rate_limited -= 1
            return self.reply(req, 429, {"detail": "API requests too frequent"}, {"Retry-After": "0"})
        if callable(doc):
            if inst is not None:
                kind = "state" if doc.__name__ == "read" else "action"
                with self.lock:
                    behaviour = inst.fault(kind)
                if behaviour != "honest":
                    return self.misbehave(req, behaviour, kind, inst, doc)
            status, doc = doc()
        return self.reply(req, status, doc)

    # ------------------------------------------------------------ the fault simulator
    def misbehave(self, req, behaviour, kind, inst, honest):
        if behaviour == "hang":
            self.closing.wait(HANG_MAX_S)
            return None
        if behaviour == "slow":
            self.closing.wait(self.slow_s)
            return self.reply(req, *honest())
        if behaviour == "reset":
            req.close_connection = True
            try:   # RST, not FIN: the client sees the connection refused or reset
                req.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                req.connection.close()
            except OSError:
                pass
            return None
        if behaviour == "ignore":
            if kind == "state":
                return self.reply(req, *honest())
            saved, inst.mode = inst.mode, "never_stops"
            try:
                return self.reply(req, *honest())
            finally:
                inst.mode = saved
        fixed = {"429": (429, {"error": "rate limited"}, {"Retry-After": str(self.retry_after)}),
                 "500": (500, {"error": "internal server error"}, None),
                 "404": (404, {"error": "not_found", "message": "Not found"}, None),
                 "401": (401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}, None),
                 "echo_key": (400, {"error": "invalid api key: %s" % req.headers.get("Authorization"),
                                    "message": "invalid api key: %s" % req.headers.get("Authorization")}, None)}
        if behaviour in fixed:
            return self.reply(req, *fixed[behaviour])
        if behaviour == "malformed":
            return self.reply(req, 200, None, raw=b"<html><body>502 bad gateway</body></html>")
        if behaviour == "null":
            return self.reply(req, 200, {"runpod": {"data": {"pod": None}}, "vastai": {"instances": None},
                                         "lambda": {"data": None}, "paperspace": None}[self.provider])
        if behaviour in ("running", "stopped", "foreign"):
            fake = copy.copy(inst)
            fake.pending, fake.mode = None, "normal"
            fake.state = "running" if behaviour == "running" else ("gone" if self.provider == "lambda" else "stopped")
            if behaviour == "foreign":
                fake.id = "9999" if self.provider == "vastai" else "other-instance-9999"
            return self.reply(req, 200, self.render(fake))
        raise ValueError("unknown stand-in behaviour %r" % behaviour)

    def render(self, inst):
        """One honest state answer about INST, as this provider shapes it."""
        if self.provider == "runpod":
            return {"data": {"pod": self.runpod_pod(inst)}}
        if self.provider == "vastai":
            return {"instances": self.vast_instance(inst)}
        if self.provider == "lambda":
            return {"data": self.lambda_instance(inst)}
        return self.paperspace_machine(inst)

    def reply(self, req, status, doc, headers=None, raw=None):
        raw = json.dumps(doc).encode("utf-8") if raw is None else raw
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(raw)))
            for name, value in (headers or {}).items():
                req.send_header(name, value)
            req.end_headers()
            req.wfile.write(raw)
        except OSError:
            pass

    def find(self, ident):
        inst = self.instances.get(str(ident))
        if inst is None:
            raise KeyError(ident)
        return inst

    def live(self):
        return [i for i in self.instances.values() if not i.deleted]

    # ------------------------------------------------------------ RunPod (GraphQL at /graphql)
    def route_runpod(self, method, path, query, body):
        if method != "POST" or path != "/graphql" or not isinstance(body, dict):
            raise KeyError(path)
        text = body.get("query") or ""
        variables = body.get("variables") or {}

        def pod_id(field):
            found = re.search(field + r"\s*\(\s*input\s*:\s*\{\s*podId\s*:\s*(?:\"([^\"]+)\"|\$podId)", text)
            if not found:
                raise KeyError(field)
            return found.group(1) or variables.get("podId")

        if re.search(r"\bpodStop\s*\(", text):
            inst = self.instances.get(pod_id("podStop"))
            if inst is None or inst.deleted:
                return 200, {"errors": [{"message": "pod not found"}], "data": None}, None

            def stop():
                inst.act("stop")
                return 200, {"data": {"podStop": {"id": inst.id, "desiredStatus": "EXITED"}}}
            return 200, stop, inst
        if re.search(r"\bpodTerminate\s*\(", text):
            inst = self.instances.get(pod_id("podTerminate"))
            if inst is None or inst.deleted:
                return 200, {"errors": [{"message": "pod not found"}], "data": None}, None

            def terminate():
                inst.act("terminate")
                return 200, {"data": {"podTerminate": None}}
            return 200, terminate, inst
        if re.search(r"\bpod\s*\(\s*input", text):
            inst = self.instances.get(pod_id("pod"))

            def read():
                if inst is None:
                    return 200, {"data": {"pod": None}}
                inst.read()
                return 200, {"data": {"pod": None if inst.deleted else self.runpod_pod(inst)}}
            return 200, read, inst
        if re.search(r"\bmyself\s*\{", text):
            data = {"id": "user-1", "pubKey": "",
                    "pods": [self.runpod_pod(i) for i in self.live()],
                    "networkVolumes": [{"id": v.id, "name": v.name, "size": v.size_gb, "dataCenterId": v.region}
                                       for v in self.volumes]}
            return 200, {"data": {"myself": data}}, None
        raise KeyError("query")

    def runpod_pod(self, inst):
        running = inst.state == "running" or (inst.transitional() and inst.pending == "stop" and inst.countdown > 0)
        status = {"running": "RUNNING", "stopped": "EXITED", "gone": "TERMINATED"}[inst.state]
        if inst.pending == "stop" and inst.mode != "never_stops":
            status = "EXITED"  # the desired status flips at once; the runtime lingers until the container stops
        return {"id": inst.id, "name": inst.name, "desiredStatus": status, "costPerHr": inst.rate,
                "containerDiskInGb": 20, "volumeInGb": 40, "volumeMountPath": "/workspace", "gpuCount": 1,
                "imageName": "example/image:1", "dockerArgs": "", "dockerId": None, "env": [], "lastStatusChange": "",
                "networkVolumeId": next((v.id for v in self.volumes if v.attached_to == inst.id), None),
                "machineId": "m-1", "memoryInGb": 31, "podType": "RESERVED", "port": 22, "ports": "22/tcp",
                "uptimeSeconds": 60 if running else 0, "vcpuCount": 8, "machine": {"gpuDisplayName": "GPU"},
                "runtime": {"uptimeInSeconds": 60, "ports": [{"ip": inst.ip, "isIpPublic": True, "privatePort": 22,
                                                               "publicPort": inst.ssh_port, "type": "tcp"}]}
                if running else None}

    # ------------------------------------------------------------ vast.ai (REST, /api/v0 and /api/v1)
    def route_vastai(self, method, path, query, body):
        one = re.match(r"^/api/v0/instances/(\d+)/?$", path)
        if one:
            inst = self.instances.get(one.group(1))
            if method == "GET":
                def read():
                    if inst is None or inst.deleted:
                        return 200, {"instances": None}
                    inst.read()
                    return 200, {"instances": None if inst.deleted else self.vast_instance(inst)}
                return 200, read, inst
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "Instance not found"}, None
            if method == "PUT" and isinstance(body, dict) and body.get("state") == "stopped":
                def stop():
                    inst.act("stop")
                    return 200, {"success": True}
                return 200, stop, inst
            if method == "DELETE":
                def destroy():
                    inst.act("terminate")
                    return 200, {"success": True}
                return 200, destroy, inst
            raise KeyError(path)
        if method == "GET" and path == "/api/v1/instances/":
            return 200, {"instances": [self.vast_instance(i) for i in self.live()], "next_token": None,
                         "total_instances": len(self.live())}, None
        if method == "GET" and path in ("/api/v0/volumes", "/api/v0/volumes/"):
            return 200, {"volumes": [{"id": int(v.id) if v.id.isdigit() else v.id, "label": v.name, "status": "stopped",
                                      "disk_space": v.size_gb, "storage_total_cost": 0.42, "start_date": 1.7e9,
                                      "instances": [int(v.attached_to)] if v.attached_to and v.on_volume else [],
                                      "public_ipaddr": None} for v in self.volumes]}, None
        raise KeyError(path)

    def vast_instance(self, inst):
        cur = {"running": "running", "stopped": "stopped", "gone": "unloaded"}[inst.state]
        actual = {"running": "running", "stopped": "exited", "gone": None}[inst.state]
        intended = "stopped" if (inst.pending == "stop" or inst.state == "stopped") else "running"
        return {"id": int(inst.id), "label": inst.name, "actual_status": actual, "intended_status": intended,
                "cur_state": cur, "next_state": cur, "dph_total": inst.rate, "public_ipaddr": inst.ip,
                "ssh_host": "ssh.example.invalid", "ssh_port": inst.ssh_port, "start_date": 1.7e9, "extra_env": [],
                "gpu_name": "GPU", "num_gpus": 1, "disk_space": 40, "status_msg": "", "machine_id": 7,
                "volume_info": [{"id": int(v.id) if v.id.isdigit() else v.id, "avail_space": 10,
                                 "total_space": v.size_gb} for v in self.volumes if v.attached_to == inst.id]}

    # ------------------------------------------------------------ Lambda (REST, /api/v1)
    def route_lambda(self, method, path, query, body):
        one = re.match(r"^/api/v1/instances/([A-Za-z0-9_-]+)$", path)
        if one and method == "GET":
            inst = self.instances.get(one.group(1))

            def read():
                if inst is None or inst.deleted:
                    return 404, {"error": {"code": "global/object-does-not-exist", "message": "Not found"}}
                inst.read()
                if inst.deleted:
                    return 404, {"error": {"code": "global/object-does-not-exist", "message": "Not found"}}
                return 200, {"data": self.lambda_instance(inst)}
            return 200, read, inst
        if method == "POST" and path == "/api/v1/instance-operations/terminate":
            ids = (body or {}).get("instance_ids") or []
            insts = [self.find(i) for i in ids]

            def terminate():
                for inst in insts:
                    inst.act("terminate")
                return 200, {"data": {"terminated_instances": [self.lambda_instance(i) for i in insts]}}
            return 200, terminate, (insts[0] if insts else None)
        if method == "GET" and path == "/api/v1/instances":
            return 200, {"data": [self.lambda_instance(i) for i in self.live()]}, None
        if method == "GET" and path == "/api/v1/file-systems":
            return 200, {"data": [{"id": v.id, "name": v.name, "region": {"name": v.region}, "is_in_use": False,
                                   "mount_point": "/lambda/nfs/" + v.name} for v in self.volumes]}, None
        raise KeyError(path)

    def lambda_instance(self, inst):
        status = "terminating" if inst.pending == "terminate" else {"running": "active", "stopped": "active",
                                                                      "gone": "terminated"}[inst.state]
        return {"id": inst.id, "name": inst.name, "status": status, "ip": inst.ip, "hostname": "host.example.invalid",
                "instance_type": {"name": "gpu_1x_example", "price_cents_per_hour": int(round(inst.rate * 100))},
                "region": {"name": "xx-1"},
                "file_system_names": [v.name for v in self.volumes if v.attached_to == inst.id]}

    # ------------------------------------------------------------ Paperspace (REST, /v1)
    def route_paperspace(self, method, path, query, body):
        stop = re.match(r"^/v1/machines/([A-Za-z0-9_-]+)/stop$", path)
        one = re.match(r"^/v1/machines/([A-Za-z0-9_-]+)$", path)
        if stop and method == "PATCH":
            inst = self.find(stop.group(1))

            def do_stop():
                inst.act("stop")
                return 200, {"event": {"id": "ev-1", "name": "stop", "state": "new"}}
            return 200, do_stop, inst
        if one and method in ("GET", "DELETE"):
            inst = self.instances.get(one.group(1))
            if method == "DELETE":
                if inst is None or inst.deleted:
                    raise KeyError(path)

                def delete():
                    inst.act("terminate")
                    return 200, {"event": {"id": "ev-2", "name": "deactivate", "state": "new"}}
                return 200, delete, inst

            def read():
                if inst is None or inst.deleted:
                    return 404, {"message": "Not found", "code": "NOT_FOUND"}
                inst.read()
                if inst.deleted:
                    return 404, {"message": "Not found", "code": "NOT_FOUND"}
                return 200, self.paperspace_machine(inst)
            return 200, read, inst
        if method == "GET" and path == "/v1/machines":
            return 200, {"items": [self.paperspace_machine(i) for i in self.live()], "hasMore": False,
                         "nextPage": None}, None
        raise KeyError(path)

    def paperspace_machine(self, inst):
        state = "stopping" if inst.pending == "stop" else {"running": "ready", "stopped": "off", "gone": "off"}[inst.state]
        return {"id": inst.id, "name": inst.name, "state": state, "publicIp": inst.ip, "usageRate": inst.rate,
                "storageRate": 0.1, "dtDeleted": None, "machineType": "GPU", "region": "xx1"}


# ------------------------------------------------------------ list faults (issue 37: billing fails closed)
# A provider's fleet listing that answers 2xx without the list: each adapter must read it as an error, never as
# an empty account. Set StandIn.list_fault to one of these; every list request (RunPod's `myself` query, vast.ai's
# instances and volumes, Lambda's instances and file systems, Paperspace's machines) gets that answer.
LIST_FAULTS = ("error_object", "empty_body", "wrong_shape", "empty_object", "null_account", "list_shaped", "hang")

_ERROR_OBJECTS = {
    "runpod": {"errors": [{"message": "Something went wrong. Please try again later."}], "data": None},
    "vastai": {"success": False, "error": "auth_error", "msg": "Invalid user key"},
    "lambda": {"error": {"code": "global/internal-error", "message": "Internal error"}},
    "paperspace": {"message": "Internal error", "code": "INTERNAL_ERROR"},
}
_WRONG_SHAPES = {   # a list, under a key the adapter does not read (or the right key holding no list)
    "runpod": {"data": {"myself": {"id": "user-1", "pods": {"nodes": []}, "networkVolumes": []}}},
    "vastai": {"data": [{"id": 1, "actual_status": "running", "dph_total": 9.6}]},
    "lambda": {"instances": [{"id": "l-1", "status": "active"}]},
    "paperspace": {"machines": [{"id": "m-1", "state": "ready"}]},
}
_NULL_ACCOUNTS = {
    "runpod": {"data": {"myself": None}},
    "vastai": {"instances": None},
    "lambda": {"data": None},
    "paperspace": {"items": None, "hasMore": False},
}


def is_list_request(provider, method, path, body):
    """Whether this request lists the account's fleet (what billing reads)."""
    if provider == "runpod":
        text = (body or {}).get("query") if isinstance(body, dict) else ""
        return method == "POST" and path == "/graphql" and bool(re.search(r"\bmyself\s*\{", text or ""))
    return method == "GET" and path.rstrip("/") in {
        "vastai": ("/api/v1/instances", "/api/v0/volumes"),
        "lambda": ("/api/v1/instances", "/api/v1/file-systems"),
        "paperspace": ("/v1/machines",)}[provider]


def list_fault_body(provider, fault):
    """The raw bytes of FAULT's answer for PROVIDER (None: no answer at all, the request hangs)."""
    if fault == "hang":
        return None
    if fault == "empty_body":
        return b""
    doc = {"error_object": _ERROR_OBJECTS, "wrong_shape": _WRONG_SHAPES, "null_account": _NULL_ACCOUNTS}.get(fault)
    doc = doc[provider] if doc else {"empty_object": {}, "list_shaped": [{"id": "x"}]}[fault]
    return json.dumps(doc).encode("utf-8")


def _reply_list_fault(self, req):
    raw = list_fault_body(self.provider, self.list_fault)
    if raw is None:
        self.closing.wait(HANG_MAX_S)
        return
    try:
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)
    except OSError:
        pass


StandIn.reply_list_fault = _reply_list_fault


def wait_until(predicate, seconds=10.0):
    """For tests that must see a background effect; polls, never sleeps blind."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()
