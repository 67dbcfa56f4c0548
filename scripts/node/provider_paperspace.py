#!/usr/bin/env python3
"""provider_paperspace: Paperspace adapter (the v1 API at api.paperspace.com), for providers.py.

Usage: provider_paperspace.py COMMAND [OPTIONS]: providers.py's commands, options and exit codes with the
profile fixed (state, stop, terminate, confirm; --timeout --json --poll-seconds --cap-seconds
--confirm-reads --confirm-span-seconds --action --destructive).

Exit codes: as providers.py (0 OK/CONFIRMED, 1 NOT CONFIRMED or provider error, 2 usage/config, 3 refused).

A Paperspace machine gets no id or key from the platform. On the node this adapter is opt-in: the user sets
RGT_PAPERSPACE_MACHINE_ID and places a key file only its owner can read (mode 0600; RGT_PAPERSPACE_KEY_FILE,
default ~/.config/rgt/paperspace_key, one `api_key = <key>` line), never argv. Paperspace keys are
team-scoped: anyone who reads it can stop, start or delete every machine of the team.

Calls (Authorization: Bearer <key>; Paperspace OpenAPI v1):
  state      GET    /machines/{id}        state off -> stopped; stopping -> stopping;
                                          ready/serviceready/starting/restarting/upgrading/provisioning ->
                                          running; HTTP 404 -> gone; an answer about
                                          another machine id -> unknown
  stop       PATCH  /machines/{id}/stop   (the disk keeps billing while the machine exists)
  terminate  DELETE /machines/{id}        (deletes the machine and its disk)
  list       GET    /machines             (usageRate and storageRate as the API gives them; unit unverified)
API base: RGT_PAPERSPACE_API_URL, else https://api.paperspace.com/v1.
Confirmation: state reads off (stop), or the machine answers 404 (terminate).
"""
import functools
import re
import sys
import urllib.parse

import rgt_core as core
import providers as pv

NAME = "paperspace"
MACHINE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
STATE = {"off": "stopped", "stopping": "stopping", "ready": "running", "serviceready": "running",
         "starting": "running", "restarting": "running", "upgrading": "running", "provisioning": "running"}


def machine_state(machine, ident=None):
    other = pv.not_this_instance(machine, ident)
    if other:
        return other
    if machine.get("dtDeleted"):
        return "gone"
    return STATE.get(str(machine.get("state") or "").lower(), "unknown")


class Paperspace(pv.Adapter):
    name = NAME
    confirmation = "GET /machines/{id} reads state off (stop), or answers 404 (terminate)"

    def _call(self, method, path, body=None, timeout=pv.DEFAULT_TIMEOUT_S, ok_missing=False, query=None):
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        return pv.http_json(method, url, {"Authorization": "Bearer " + self._key}, body, timeout, ok_missing)

    def state(self, timeout=pv.DEFAULT_TIMEOUT_S):
        doc = self._call("GET", "/machines/%s" % self._need_instance(), timeout=timeout, ok_missing=True)
        if doc is pv.MISSING:
            return "gone"
        if not isinstance(doc, dict):
            raise pv.ProviderError("http", "paperspace: answer is not an object")
        return machine_state(doc, self.instance_id)

    def stop(self, timeout=pv.DEFAULT_TIMEOUT_S):
        return self._call("PATCH", "/machines/%s/stop" % self._need_instance(), timeout=timeout)

    def terminate(self, timeout=pv.DEFAULT_TIMEOUT_S):
        doc = self._call("DELETE", "/machines/%s" % self._need_instance(), timeout=timeout, ok_missing=True)
        return None if doc is pv.MISSING else doc

    def list(self, timeout=pv.DEFAULT_TIMEOUT_S):
        instances, after, pages = [], None, 0
        while True:
            doc = self._call("GET", "/machines", timeout=timeout, query={"after": after} if after else None)
            for m in pv.listed(doc, "items", "paperspace machines"):
                instances.append(pv.row(NAME, "machine", m.get("id"), m.get("name"), machine_state(m), None,
                                        m.get("state"), ip=m.get("publicIp"), usage_rate=m.get("usageRate"),
                                        storage_rate=m.get("storageRate"),
                                        stopped_bills="its storage at storageRate %s" % m.get("storageRate")
                                        if m.get("storageRate") is not None else None,
                                        rate_note="usageRate/storageRate as the API gives them (unit unverified)"))
            after, pages = doc.get("nextPage"), pages + 1
            if not doc.get("hasMore") or not after or pages >= 40:
                break
        return {"instances": instances, "storage": []}


def node_adapter(environ):
    ident = pv.need(environ, "RGT_PAPERSPACE_MACHINE_ID", "Paperspace gives a machine no id of its own")
    if not MACHINE_ID.match(ident):
        raise pv.ProviderError("config", "RGT_PAPERSPACE_MACHINE_ID does not look like a machine id")
    path = (environ.get("RGT_PAPERSPACE_KEY_FILE") or "").strip() or "~/.config/rgt/paperspace_key"
    key = pv.read_key_file(path, "paperspace").get("api_key")
    if not key:
        raise pv.ProviderError("config", "paperspace key file %s has no 'api_key = ...' line" % path)
    return Paperspace(key, ident, pv.api_base(NAME, environ))


def laptop_adapter(environ, home):
    key = (environ.get("PAPERSPACE_API_KEY") or "").strip()
    return Paperspace(key, None, pv.api_base(NAME, environ)) if key else None


if __name__ == "__main__":   # the providers CLI, this adapter's profile fixed (providers.main checks the toolkit)
    sys.exit(core.run_main(functools.partial(pv.main, fixed_profile=NAME), prog="provider_paperspace.py"))
