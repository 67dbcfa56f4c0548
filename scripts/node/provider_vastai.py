#!/usr/bin/env python3
"""provider_vastai: vast.ai adapter (REST API), for providers.py and the stop engine.

Usage: provider_vastai.py COMMAND [OPTIONS]: providers.py's commands, options and exit codes with the
profile fixed (state, stop, terminate, confirm; --timeout --json --poll-seconds --cap-seconds
--confirm-reads --confirm-span-seconds --action --destructive).

Exit codes: as providers.py (0 OK/CONFIRMED, 1 NOT CONFIRMED or provider error, 2 usage/config, 3 refused).

Node side: the instance's own id and its per-instance key, both set by vast.ai in every instance
(CONTAINER_ID, CONTAINER_API_KEY; that key can only start, stop or destroy its own instance, and read it:
docs.vast.ai/guides/instances/docker-environment, api-reference/hello-world). Laptop side: VAST_API_KEY, else
$XDG_CONFIG_HOME/vastai/vast_api_key (default ~/.config/vastai/vast_api_key), else ~/.vast_api_key (the
vastai CLI's order).

Calls (Authorization: Bearer <key>; the paths the vastai CLI uses):
  state      GET    /api/v0/instances/{id}/?owner=me   -> {"instances": {...} | null}
             cur_state unloaded or HTTP 404 -> gone; instances null -> missing (confirms a terminate only);
             instances.id not this instance -> unknown; cur_state stopped (container not running) ->
             stopped; intended_status stopped otherwise -> stopping; actual_status unknown/offline -> unknown
  stop       PUT    /api/v0/instances/{id}/  {"state": "stopped"}   (disk keeps billing)
  terminate  DELETE /api/v0/instances/{id}/                          (destroys the instance and its disk)
  list       GET    /api/v1/instances/ (paged by next_token), GET /api/v0/volumes?owner=me&type=all_volume
             A volume is attached where either side says so: the volume's "instances" (an array; the vastai
             CLI's volume table shows it, and docs.vast.ai/api-reference/volumes/list-volumes documents it, its
             items' inner shape not: an id or an object's "id" is read) or an instance's "volume_info" (objects
             with "id": the vastai CLI's own instance table reads them, vast-ai/vast-cli vast.py _fmt_volumes);
             verified 2026-12. Neither matching: the volume is listed as billing.
API base: RGT_VASTAI_API_URL, else VAST_URL (the CLI's variable), else https://console.vast.ai.
Confirmation: cur_state reads stopped (stop), or unloaded / no such instance (terminate).
"""
import functools
import json
import os
import sys
import urllib.parse

import rgt_core as core
import providers as pv

NAME = "vastai"
RUNNING = ("running", "loading", "rebooting", "frozen", "created", "scheduling")


def instance_state(inst, ident=None):
    """The state word of one instance object; IDENT (ours): an answer about another instance is unknown."""
    other = pv.not_this_instance(inst, ident)
    if other:
        return other
    cur = str(inst.get("cur_state") or "").lower()
    actual = str(inst.get("actual_status") or "").lower()
    intended = str(inst.get("intended_status") or "").lower()
    if cur == "unloaded":
        return "gone"
    if cur == "stopped" and actual != "running":
        return "stopped"
    if intended == "stopped":
        return "stopping"
    if actual in ("unknown", "offline"):
        return "unknown"
    if cur == "running" or actual in RUNNING or not actual:
        return "running"
    return "unknown"


class VastAI(pv.Adapter):
    name = NAME
    confirmation = "GET /api/v0/instances/{id}/ reads cur_state stopped (stop); unloaded or instances null (terminate)"

    def _call(self, method, path, body=None, query=None, timeout=pv.DEFAULT_TIMEOUT_S, ok_missing=False):
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        return pv.http_json(method, url, {"Authorization": "Bearer " + self._key}, body, timeout, ok_missing)

    def _path(self):
        ident = self._need_instance()
        if not ident.isdigit():
            raise pv.ProviderError("config", "vast.ai instance id must be a number")
        return "/api/v0/instances/%s/" % ident

    def state(self, timeout=pv.DEFAULT_TIMEOUT_S):
        doc = self._call("GET", self._path(), query={"owner": "me"}, timeout=timeout, ok_missing=True)
        if doc is pv.MISSING:
            return "gone"
        if not isinstance(doc, dict) or "instances" not in doc:
            raise pv.ProviderError("http", "vastai: answer has no 'instances' key")
        return instance_state(doc.get("instances"), self.instance_id)

    def stop(self, timeout=pv.DEFAULT_TIMEOUT_S):
        return self._checked(self._call("PUT", self._path(), {"state": "stopped"}, timeout=timeout))

    def terminate(self, timeout=pv.DEFAULT_TIMEOUT_S):
        doc = self._call("DELETE", self._path(), {}, timeout=timeout, ok_missing=True)
        return None if doc is pv.MISSING else self._checked(doc)

    def _checked(self, doc):
        if isinstance(doc, dict) and doc.get("success") is False:
            raise pv.ProviderError("http", "vastai: request refused: %s" % core.redact(str(doc.get("msg") or
                                                                                         doc.get("error")))[:200])
        return doc

    def list(self, timeout=pv.DEFAULT_TIMEOUT_S):
        instances, storage, token, pages = [], [], None, 0
        while True:
            query = {"select_filters": "{}", "order_by": json.dumps([{"col": "id", "dir": "asc"}]), "limit": "25"}
            if token:
                query["after_token"] = token
            doc = self._call("GET", "/api/v1/instances/", query=query, timeout=timeout)
            for inst in pv.listed(doc, "instances", "vastai instances"):
                mounted = [str(v["id"]) for v in inst.get("volume_info") or [] if isinstance(v, dict) and
                           v.get("id") is not None] if isinstance(inst.get("volume_info"), list) else []
                instances.append(pv.row(NAME, "instance", inst.get("id"), inst.get("label"), instance_state(inst),
                                        inst.get("dph_total"), inst.get("actual_status"),
                                        ip=inst.get("public_ipaddr"), ssh_host=inst.get("ssh_host"),
                                        ssh_port=inst.get("ssh_port"), volumes=mounted or None))
            token, pages = doc.get("next_token"), pages + 1
            if not token or pages >= 40:
                break
        doc = self._call("GET", "/api/v0/volumes", query={"owner": "me", "type": "all_volume"}, timeout=timeout)
        for vol in pv.listed(doc, "volumes", "vastai volumes"):
            attached = vol.get("instances") if isinstance(vol.get("instances"), list) else []
            storage.append(pv.row(NAME, "volume", vol.get("id"), vol.get("label") or vol.get("name"),
                                  str(vol.get("status") or "exists"), None, vol.get("status"),
                                  size_gb=vol.get("disk_space"), total_cost=vol.get("storage_total_cost"),
                                  attached_to=[str(i.get("id") if isinstance(i, dict) else i) for i in attached],
                                  rate_note="bills while it exists; the API gives the total so far, not a rate"))
        return {"instances": instances, "storage": storage}


def node_adapter(environ):
    ident = pv.need(environ, "CONTAINER_ID", "vast.ai sets it in every instance")
    key = pv.need(environ, "CONTAINER_API_KEY", "the per-instance key vast.ai injects")
    adapter = VastAI(key, ident, pv.api_base(NAME, environ))
    adapter._path()  # a malformed id is a config error now, not at stop time
    return adapter


def laptop_key(environ, home):
    key = (environ.get("VAST_API_KEY") or "").strip()
    if key:
        return key
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for path in (os.path.join(xdg, "vastai", "vast_api_key"), os.path.join(home, ".vast_api_key")):
        try:
            with open(path, encoding="utf-8") as handle:
                key = handle.read(4096).strip()
        except (OSError, UnicodeDecodeError):
            continue
        if key:
            return key
    return None


def laptop_adapter(environ, home):
    key = laptop_key(environ, home)
    return VastAI(key, None, pv.api_base(NAME, environ)) if key else None


if __name__ == "__main__":   # the providers CLI, this adapter's profile fixed (providers.main checks the toolkit)
    sys.exit(core.run_main(functools.partial(pv.main, fixed_profile=NAME), prog="provider_vastai.py"))
