#!/usr/bin/env python3
"""provider_lambda: Lambda Cloud adapter (REST API v1), for providers.py and the stop engine.

Usage: provider_lambda.py COMMAND [OPTIONS]: providers.py's commands, options and exit codes with the
profile fixed (state, stop, terminate, confirm; --timeout --json --poll-seconds --cap-seconds
--confirm-reads --confirm-span-seconds --action --destructive).

Exit codes: as providers.py (0 OK/CONFIRMED, 1 NOT CONFIRMED or provider error, 2 usage/config, 3 refused).

Lambda gives an instance neither its own id nor a key. On the node this adapter is opt-in: the user
places a key file only its owner can read (mode 0600; RGT_LAMBDA_KEY_FILE, default
~/.lambda_cloud/lambda_keys, the `api_key = <key>` format SkyPilot also reads) and names the instance with
RGT_LAMBDA_INSTANCE_ID or an `instance_id = <id>` line in that file. The key never goes in argv.

WHAT THAT KEY CAN DO: a Lambda API key has full access to the account (no scoped keys). Anyone who reads it
from the box can launch instances on your bill, terminate every other instance of the account, and delete
filesystems. Use a dedicated key for the run and revoke it after teardown (profiles/lambda.md, section 5).

There is no stop on Lambda: `stop` is refused (config error) and `terminate` is the meter stop. It erases
the instance's own disk; an attached filesystem survives (and keeps billing).

Calls (Authorization: Bearer <key>):
  state      GET  /instances/{id}        status booting/active/unhealthy -> running, terminating -> stopping,
                                         terminated or HTTP 404 -> gone; data.id not
                                         this instance -> unknown
  terminate  POST /instance-operations/terminate  {"instance_ids": [id]}
  list       GET  /instances, GET /file-systems    (price_cents_per_hour of the instance type, where given)
API base: RGT_LAMBDA_API_URL, else https://cloud.lambdalabs.com/api/v1.
Confirmation: GET /instances/{id} answers 404 or status terminated.
"""
import functools
import os
import re
import sys

import rgt_core as core
import providers as pv

NAME = "lambda"
INSTANCE_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
STATUS = {"booting": "running", "active": "running", "unhealthy": "running", "terminating": "stopping",
          "terminated": "gone", "preempted": "gone"}


def instance_state(inst, ident=None):
    other = pv.not_this_instance(inst, ident)
    if other:
        return other
    return STATUS.get(str(inst.get("status") or "").lower(), "unknown")


class Lambda(pv.Adapter):
    name = NAME
    confirmation = "GET /instances/{id} answers 404 or status terminated (terminate; Lambda has no stop)"

    def _call(self, method, path, body=None, timeout=pv.DEFAULT_TIMEOUT_S, ok_missing=False):
        return pv.http_json(method, self.url + path, {"Authorization": "Bearer " + self._key}, body, timeout,
                            ok_missing)

    def state(self, timeout=pv.DEFAULT_TIMEOUT_S):
        doc = self._call("GET", "/instances/%s" % self._need_instance(), timeout=timeout, ok_missing=True)
        if doc is pv.MISSING:
            return "gone"
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise pv.ProviderError("http", "lambda: answer has no data object")
        return instance_state(doc["data"], self.instance_id)

    def stop(self, timeout=pv.DEFAULT_TIMEOUT_S):
        raise pv.ProviderError("config", "lambda has no stop: terminate is the only meter stop (it erases the "
                               "instance disk)")

    def terminate(self, timeout=pv.DEFAULT_TIMEOUT_S):
        return self._call("POST", "/instance-operations/terminate", {"instance_ids": [self._need_instance()]},
                          timeout=timeout)

    def confirmed(self, state, action):
        return state in pv.ABSENT if action in ("stop", "terminate") else pv.Adapter.confirmed(self, state, action)

    def list(self, timeout=pv.DEFAULT_TIMEOUT_S):
        instances, storage = [], []
        for inst in pv.listed(self._call("GET", "/instances", timeout=timeout), "data", "lambda instances"):
            itype = inst.get("instance_type") or {}
            cents = itype.get("price_cents_per_hour")
            instances.append(pv.row(NAME, "instance", inst.get("id"), inst.get("name"), instance_state(inst),
                                    None if cents is None else cents / 100.0, inst.get("status"),
                                    ip=inst.get("ip"), hostname=inst.get("hostname"), type=itype.get("name"),
                                    volumes=[str(n) for n in inst.get("file_system_names") or []]))
        for fs in pv.listed(self._call("GET", "/file-systems", timeout=timeout), "data", "lambda file systems"):
            storage.append(pv.row(NAME, "filesystem", fs.get("id"), fs.get("name"), "exists", None, None,
                                  region=(fs.get("region") or {}).get("name"), in_use=fs.get("is_in_use"),
                                  rate_note="bills per GB used while it exists, attached or not"))
        return {"instances": instances, "storage": storage}


def node_adapter(environ):
    path = (environ.get("RGT_LAMBDA_KEY_FILE") or "").strip() or "~/.lambda_cloud/lambda_keys"
    values = pv.read_key_file(path, "lambda")
    key = values.get("api_key")
    if not key:
        raise pv.ProviderError("config", "lambda key file %s has no 'api_key = ...' line" % path)
    ident = (environ.get("RGT_LAMBDA_INSTANCE_ID") or "").strip() or values.get("instance_id")
    if not ident:
        raise pv.ProviderError("config", "lambda gives the box no id of its own: set RGT_LAMBDA_INSTANCE_ID or "
                               "an 'instance_id = ...' line in %s" % path)
    if not INSTANCE_ID.match(ident):
        raise pv.ProviderError("config", "RGT_LAMBDA_INSTANCE_ID does not look like a Lambda instance id")
    return Lambda(key, ident, pv.api_base(NAME, environ))


def laptop_adapter(environ, home):
    key = (environ.get("LAMBDA_API_KEY") or "").strip()
    if not key:
        path = (environ.get("RGT_LAMBDA_KEY_FILE") or "").strip() or os.path.join(home, ".lambda_cloud", "lambda_keys")
        if not os.path.exists(path):
            return None   # only a missing file means "no credentials"; a loose or broken one is an error
        key = pv.read_key_file(path, "lambda").get("api_key")
        if not key:
            raise pv.ProviderError("config", "lambda key file %s has no 'api_key = ...' line" % path)
    return Lambda(key, None, pv.api_base(NAME, environ)) if key else None


if __name__ == "__main__":   # the providers CLI, this adapter's profile fixed (providers.main checks the toolkit)
    sys.exit(core.run_main(functools.partial(pv.main, fixed_profile=NAME), prog="provider_lambda.py"))
