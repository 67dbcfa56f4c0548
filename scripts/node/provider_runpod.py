#!/usr/bin/env python3
"""provider_runpod: RunPod adapter (GraphQL API), for providers.py and the stop engine.

Usage: provider_runpod.py COMMAND [OPTIONS]: providers.py's commands, options and exit codes with the
profile fixed (state, stop, terminate, confirm; --timeout --json --poll-seconds --cap-seconds
--confirm-reads --confirm-span-seconds --action --destructive).

Exit codes: as providers.py (0 OK/CONFIRMED, 1 NOT CONFIRMED or provider error, 2 usage/config, 3 refused).

Node side: the Pod's own id and the Pod-scoped key RunPod injects into every Pod (RUNPOD_POD_ID,
RUNPOD_API_KEY; docs.runpod.io/pods/templates/environment-variables). Laptop side: RUNPOD_API_KEY, else
api_key in the [default] profile of ~/.runpod/config.toml (the runpod SDK's file).

Calls (POST {base}/graphql, Authorization: Bearer <key>; what the runpod SDK and runpodctl send):
  state      query pod(input: {podId}) { desiredStatus runtime { uptimeInSeconds } }
             desiredStatus RUNNING -> running (EXITED with a runtime still attached -> stopping);
             EXITED -> stopped; TERMINATED -> gone; pod null -> missing (confirms a terminate only);
             an answer for another pod id -> unknown
  stop       mutation podStop(input: {podId})         (the volume disk keeps billing at 2x)
  terminate  mutation podTerminate(input: {podId})    (deletes container and volume disk)
  list       query myself { pods {...costPerHr...} networkVolumes {...} }
API base: RGT_RUNPOD_API_URL, else RUNPOD_API_BASE_URL (the SDK's variable), else https://api.runpod.io.
Confirmation: the Pod reads EXITED with no runtime (stop), or TERMINATED / no such Pod (terminate).
"""
import functools
import os
import re
import sys

import rgt_core as core
import providers as pv

NAME = "runpod"
POD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

POD_FIELDS = "id name desiredStatus costPerHr volumeInGb containerDiskInGb runtime { uptimeInSeconds }"
Q_POD = "query pod($podId: String!) { pod(input: {podId: $podId}) { %s } }" % POD_FIELDS
M_STOP = "mutation stopPod($podId: String!) { podStop(input: {podId: $podId}) { id desiredStatus } }"
M_TERMINATE = "mutation terminatePod($podId: String!) { podTerminate(input: {podId: $podId}) }"
# networkVolumeId on a GraphQL Pod: the Pod type's field (graphql-spec.runpod.io, as transcribed in
# my-opencode/runpod-api-helper runpod.types.ts; the REST API's Pod has networkVolume.id instead, docs.runpod.io
# api-reference openapi.json); checked 2026-12 against those, not against a live account. A query the API
# refuses is an error, so billing then says UNKNOWN provider runpod, never OK.
Q_FLEET = ("query myself { myself { pods { %s networkVolumeId "
           "runtime { ports { ip isIpPublic privatePort publicPort type } } } "
           "networkVolumes { id name size dataCenterId } } }" % POD_FIELDS)


def pod_state(pod, ident=None):
    """The state word of one pod object; IDENT (our pod id): an answer about another pod is unknown."""
    other = pv.not_this_instance(pod, ident)
    if other:
        return other
    status = str(pod.get("desiredStatus") or "").upper()
    if status == "TERMINATED":
        return "gone"
    if status == "EXITED":
        return "stopping" if pod.get("runtime") else "stopped"
    if status == "RUNNING":
        return "running"
    return "unknown"


class RunPod(pv.Adapter):
    name = NAME
    confirmation = "pod(podId).desiredStatus reads EXITED with runtime null (stop); TERMINATED or null (terminate)"

    def _gql(self, query, variables, timeout):
        doc = pv.http_json("POST", self.url + "/graphql", {"Authorization": "Bearer " + self._key},
                           {"query": query, "variables": variables}, timeout)
        if not isinstance(doc, dict):
            raise pv.ProviderError("http", "runpod: GraphQL answer is not an object")
        errors = doc.get("errors")
        if errors:
            first = errors[0] if isinstance(errors, list) and errors else {}
            msg = str(first.get("message") if isinstance(first, dict) else first)[:200]
            kind = "auth" if "unauthor" in msg.lower() or "forbidden" in msg.lower() else "http"
            raise pv.ProviderError(kind, "runpod: GraphQL error: %s" % core.redact(msg))
        data = doc.get("data")
        if not isinstance(data, dict):
            raise pv.ProviderError("http", "runpod: GraphQL answer has no data")
        return data

    def state(self, timeout=pv.DEFAULT_TIMEOUT_S):
        ident = self._need_instance()
        return pod_state(self._gql(Q_POD, {"podId": ident}, timeout).get("pod"), ident)

    def stop(self, timeout=pv.DEFAULT_TIMEOUT_S):
        return self._gql(M_STOP, {"podId": self._need_instance()}, timeout).get("podStop")

    def terminate(self, timeout=pv.DEFAULT_TIMEOUT_S):
        return self._gql(M_TERMINATE, {"podId": self._need_instance()}, timeout).get("podTerminate")

    def list(self, timeout=pv.DEFAULT_TIMEOUT_S):
        me = self._gql(Q_FLEET, {}, timeout).get("myself")
        if not isinstance(me, dict):
            raise pv.ProviderError("http", "runpod: answer has no account (myself is %s)" % (
                "null" if me is None else type(me).__name__))
        instances, storage = [], []
        for pod in pv.listed(me, "pods", "runpod pods"):
            ips = [p for p in ((pod.get("runtime") or {}).get("ports") or []) if isinstance(p, dict)]
            ssh = next((p for p in ips if p.get("privatePort") == 22 and p.get("isIpPublic")), None)
            instances.append(pv.row(NAME, "pod", pod.get("id"), pod.get("name"), pod_state(pod), pod.get("costPerHr"),
                                    pod.get("desiredStatus"), volume_gb=pod.get("volumeInGb"),
                                    volumes=[str(pod["networkVolumeId"])] if pod.get("networkVolumeId") else None,
                                    stopped_bills="its %s GB volume only (the API gives no price)" %
                                    pod.get("volumeInGb") if pod.get("volumeInGb") else None,
                                    ip=ssh.get("ip") if ssh else None, ssh_port=ssh.get("publicPort") if ssh else None))
        for vol in pv.listed(me, "networkVolumes", "runpod network volumes"):
            storage.append(pv.row(NAME, "network volume", vol.get("id"), vol.get("name"), "exists", None, None,
                                  size_gb=vol.get("size"), region=vol.get("dataCenterId"),
                                  rate_note="bills per GB while it exists; the API gives no price"))
        return {"instances": instances, "storage": storage}


def node_adapter(environ):
    pod = pv.need(environ, "RUNPOD_POD_ID", "RunPod sets it in every Pod")
    if not POD_ID.match(pod):
        raise pv.ProviderError("config", "RUNPOD_POD_ID does not look like a Pod id")
    key = pv.need(environ, "RUNPOD_API_KEY", "the Pod-scoped key RunPod injects")
    return RunPod(key, pod, pv.api_base(NAME, environ))


def laptop_adapter(environ, home):
    key = (environ.get("RUNPOD_API_KEY") or "").strip() or config_toml_key(os.path.join(home, ".runpod", "config.toml"))
    if not key:
        return None
    return RunPod(key, None, pv.api_base(NAME, environ))


def config_toml_key(path):
    """api_key of the [default] profile in the SDK's config.toml (a tiny reader: Python 3.8 has no tomllib)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return None
    section = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().strip("\"'")
            continue
        name, sep, value = line.partition("=")
        if sep and section == "default" and name.strip().lower() in ("api_key", "apikey"):
            return value.strip().strip("\"'") or None
    return None


if __name__ == "__main__":   # the providers CLI, this adapter's profile fixed (providers.main checks the toolkit)
    sys.exit(core.run_main(functools.partial(pv.main, fixed_profile=NAME), prog="provider_runpod.py"))
