"""The stop that holds when the provider misbehaves (issue 36, findings C3, C4, C5, C7, C8, N12, N17).

Every stop here runs the path the box runs: the dead-man as a process -> the stop engine -> `providers.py` as a
subprocess -> a stand-in API (tools/provider_standins.py, its fault simulator scripting each call). The fault
matrix holds every (mode x adapter) case to one rule: the record says CONFIRMED only when the simulator really
stopped that instance; otherwise NOT CONFIRMED, a notification, and a retry of the whole stop.

Confirmation is shrunk for tests through the environment (2 reads over 0.1 s), the provider cap through
--confirm-seconds, the retries' first gap through --stop-retry-minutes; no test sleeps before an assert.
"""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from conftest import NODE, REPO, wait_for, webhook_target
from conftest import read_json as read
from watch_fixture import DEADMAN, POLL, finished_run, stand_in

sys.path.insert(0, str(REPO / "tools"))
from provider_standins import Instance, StandIn  # noqa: E402

PROVIDERS_PY = str(NODE / "providers.py")
RUN_STATUS = str(NODE / "run_status.py")
KEY = "canaryKEY-9f1e3d5b7a2c4e6f8a0b"          # searched for everywhere after an echo-the-key fire
IDS = {"runpod": "pod36x", "vastai": "3636", "lambda": "lam36x", "paperspace": "psm36x"}
FAST = {"RGT_PROVIDER_CONFIRM_READS": "2", "RGT_PROVIDER_CONFIRM_SPAN_S": "0.1"}
QUIET_DISK = ("--disk-floor-gb", "0", "--disk-floor-inodes", "0")


def provider_env(tmp, provider, api):
    """The box's environment for PROVIDER's node adapter, pointed at the stand-in (key files 0600)."""
    env = dict(os.environ, **FAST)
    env.pop("RGT_DEBUG", None)
    if provider == "runpod":
        env.update(RUNPOD_POD_ID=IDS[provider], RUNPOD_API_KEY=KEY, RGT_RUNPOD_API_URL=api.url)
    elif provider == "vastai":
        env.update(CONTAINER_ID=IDS[provider], CONTAINER_API_KEY=KEY, RGT_VASTAI_API_URL=api.url)
    else:
        keys = tmp / ("%s_keys" % provider)
        keys.write_text("api_key = %s\n" % KEY)
        keys.chmod(0o600)
        if provider == "lambda":
            env.update(RGT_LAMBDA_KEY_FILE=str(keys), RGT_LAMBDA_INSTANCE_ID=IDS[provider], RGT_LAMBDA_API_URL=api.url)
        else:
            env.update(RGT_PAPERSPACE_KEY_FILE=str(keys), RGT_PAPERSPACE_MACHINE_ID=IDS[provider],
                       RGT_PAPERSPACE_API_URL=api.url)
    return env


def standin(provider, faults=None, **inst):
    box = Instance(IDS[provider], **inst)
    box.faults = dict(faults or {})
    return StandIn(provider, KEY, [box], retry_after="0.1", slow_s=0.5), box


def providers_cli(env, *args, timeout=60):
    """providers.py run AS A SCRIPT, the way the stop engine runs it."""
    return subprocess.run([sys.executable, PROVIDERS_PY, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def meter_action(provider):
    return ["terminate", "--destructive"] if provider == "lambda" else ["stop"]


class Fire(object):
    """One foreground dead-man over a finished run, its stop through PROVIDER's stand-in."""

    def __init__(self, tmp, provider, faults, hook_env, *extra):
        self.tmp, self.provider = tmp, provider
        tmp.mkdir(parents=True, exist_ok=True)
        self.api, self.box = standin(provider, faults)
        self.api.__enter__()
        self.run = finished_run(tmp, run_id="r-%s" % tmp.name)
        self.fallback, self.fallback_calls = stand_in(tmp, "fallback", rc=0)
        self.env = dict(provider_env(tmp, provider, self.api), RGT_REGISTRY=str(tmp / "registry"), **hook_env)
        args = [sys.executable, DEADMAN, "arm", "--run-dir", str(self.run), "--foreground", "--profile", provider,
                "--poll-seconds", POLL, "--grace-minutes", "0", "--confirm-seconds", "0.5", "--retries", "1",
                "--retry-backoff", "0", "--still-up-seconds", "0", "--stop-retry-minutes", "0.004",
                "--repeat-minutes", "0.002", "--fallback-stop-cmd", self.fallback, *QUIET_DISK]
        self.proc = subprocess.Popen(args + list(map(str, extra)), env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)

    def fired(self):
        return read(self.run / "DEADMAN_FIRED.json")

    def actions(self):
        return [c for c in self.api.log if self.is_action(c)]

    def is_action(self, call):
        if self.provider == "runpod":
            return "podStop" in json.dumps(call["body"] or "") or "podTerminate" in json.dumps(call["body"] or "")
        return call["method"] != "GET"

    def settled(self):
        """Exited by itself, or NOT CONFIRMED with the whole stop sent again by a retry."""
        if self.proc.poll() is not None:
            return True
        retry = self.fired().get("stop_retry") or {}
        return retry.get("tries", 0) >= 1 and (retry.get("state") == "waiting" and retry.get("tries", 0) >= 1
                                               or len(self.actions()) >= 2)

    def end(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=60)
        self.api.close()


def status_line(run, env):
    res = subprocess.run([sys.executable, RUN_STATUS, str(run), "--no-gpu"], capture_output=True, text=True,
                         env=env, timeout=60)
    return res.stdout + res.stderr


@pytest.fixture
def hook(tmp_path):
    server, heard, values = webhook_target(tmp_path, "stop-engine-hook-secret")
    yield heard, values
    server.shutdown()
    server.server_close()


def told(heard, run, event):
    return [h for h in heard if h.get("event") == event and str(run) in json.dumps(h.get("fields"))]


# ----------------------------------------------------------------------------- C3: one error class

KINDS = {  # what the stand-in does to the stop request -> the ProviderError kind the adapter raises
    "auth": ["401"], "rate": ["429", "honest"], "timeout": ["hang"], "http": ["500"], "network": ["reset"]}


@pytest.mark.parametrize("provider", sorted(IDS))
def test_finding_node_C3_every_provider_error_kind_is_handled_by_providers_py_run_as_a_script(tmp_path, provider):
    """Run as a script (what the engine runs), each kind each adapter raises is caught by providers.py's own
    handling: a 429 waits its Retry-After and the stop goes on to CONFIRMED; the others end NOT CONFIRMED with
    that kind, never 'unexpected ProviderError'."""
    for kind, script in sorted(KINDS.items()):
        api, box = standin(provider, {"action": script})
        with api:
            env = provider_env(tmp_path, provider, api)
            res = providers_cli(env, *meter_action(provider), "--profile", provider, "--cap-seconds", "1.5",
                                "--poll-seconds", "0.05", "--timeout", "0.3", "--json")
        assert "unexpected" not in res.stderr and "Traceback" not in res.stderr, (kind, res.stderr)
        doc = json.loads(res.stdout)
        if kind == "rate":
            assert res.returncode == 0 and doc["confirmed"] and box.really_stopped(), (kind, doc)
            assert doc["requests"] >= 2
        else:
            assert res.returncode == 1 and doc["confirmed"] is False and doc["error"]["kind"] == kind, (kind, doc)
    if provider == "lambda":   # config: Lambda has no stop
        api, _box = standin(provider)
        with api:
            res = providers_cli(provider_env(tmp_path, provider, api), "stop", "--profile", "lambda", "--json",
                                "--cap-seconds", "1")
        assert res.returncode == 1 and json.loads(res.stdout)["error"]["kind"] == "config", res.stderr


# ----------------------------------------------------------------------------- C5: confirmation

FOOLS = {   # each must end NOT CONFIRMED (the instance was never stopped, or never seen stopped)
    "flapping": {"action": ["ignore"], "state": ["stopped", "running"] * 50},
    "null_object": {"action": ["ignore"], "state": ["null"]},
    "foreign_id": {"action": ["ignore"], "state": ["foreign"]},
    "one_404_then_found": {"action": ["ignore"], "state": ["404", "honest"]},
    "failed_reads": {"action": ["ignore"], "state": ["500", "malformed", "reset", "401"]},
}


@pytest.mark.parametrize("provider", ["runpod", "vastai", "paperspace"])
def test_finding_node_C5_a_lying_flapping_or_foreign_answer_never_confirms(tmp_path, provider):
    for name, faults in sorted(FOOLS.items()):
        api, box = standin(provider, faults)
        with api:
            res = providers_cli(provider_env(tmp_path, provider, api), "stop", "--profile", provider, "--json",
                                "--cap-seconds", "0.8", "--poll-seconds", "0.05", "--timeout", "0.3")
        doc = json.loads(res.stdout)
        assert res.returncode == 1 and doc["confirmed"] is False and not box.really_stopped(), (name, doc)
    # unknown reads neither count nor reset: stopped, failed, stopped confirms (2 reads over 0.1 s)
    api, box = standin(provider, {"state": ["honest", "500", "honest"]}, lag=0)
    with api:
        res = providers_cli(provider_env(tmp_path, provider, api), "stop", "--profile", provider, "--json",
                            "--cap-seconds", "5", "--poll-seconds", "0.06", "--timeout", "0.5")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["confirmed"] and box.really_stopped(), doc
    assert doc["unknown_reads"] == 1 and doc["polls"] >= 3, doc


def test_finding_node_C5_gone_is_read_twice_and_one_confirming_read_is_not_enough(tmp_path):
    api, box = standin("vastai", {"action": ["ignore"], "state": ["404", "running"]})
    with api:
        env = dict(provider_env(tmp_path, "vastai", api), RGT_PROVIDER_CONFIRM_READS="1",
                   RGT_PROVIDER_CONFIRM_SPAN_S="0")
        res = providers_cli(env, "stop", "--profile", "vastai", "--json", "--cap-seconds", "0.6",
                            "--poll-seconds", "0.05", "--timeout", "0.3")
    assert res.returncode == 1 and not json.loads(res.stdout)["confirmed"], res.stdout   # even with N = 1
    api, box = standin("runpod", lag=0)
    with api:
        env = dict(provider_env(tmp_path, "runpod", api), RGT_PROVIDER_CONFIRM_READS="3",
                   RGT_PROVIDER_CONFIRM_SPAN_S="0.3")
        res = providers_cli(env, "stop", "--profile", "runpod", "--json", "--cap-seconds", "5",
                            "--poll-seconds", "0.05", "--timeout", "0.5")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["confirmed"] and doc["polls"] >= 7, doc   # 3 reads AND 0.3 s at 0.05 s


def test_finding_node_C5_a_box_still_up_after_its_confirmed_stop_revokes_the_confirmation(tmp_path, hook):
    heard, hook_env = hook
    fire = Fire(tmp_path / "revoke", "runpod", {}, hook_env, "--still-up-seconds", "0.3")
    try:
        wait_for(lambda: any(a.get("revoked") for a in fire.fired().get("attempts") or []), 60, what="a revocation")
        fired = fire.fired()
        assert fired["confirmed"] is False and fired["escalations"], fired
        assert "still up" in fired["escalations"][0]["why"]
        wait_for(lambda: told(heard, fire.run, "stop_not_confirmed"), 30, what="the escalation told")
    finally:
        fire.end()


# ----------------------------------------------------------------------------- C4, C7, N12

def test_finding_node_C4_a_fallback_that_exits_0_never_confirms_a_provider_stop(tmp_path, hook):
    heard, hook_env = hook
    fire = Fire(tmp_path / "c4", "runpod", {"action": ["ignore"]}, hook_env)
    try:
        wait_for(lambda: (fire.fired().get("fallback") or {}).get("attempts") and
                 fire.fired()["fallback"]["attempts"][-1].get("confirmation"), 60, what="the fallback's read-back")
        fired = fire.fired()
        attempt = fired["fallback"]["attempts"][-1]
        assert attempt["rc"] == 0 and attempt["confirmed"] is False, attempt
        assert attempt["confirmation"]["method"] == "provider_read_back"
        assert fired["confirmed"] is False and fired["ok"] is False and not fire.box.really_stopped()
        wait_for(lambda: "ok" not in fire.fired().get("message", "x") or fire.fired().get("stop_retry"), 30)
        line = status_line(fire.run, fire.env)
        assert "stop command ok" not in line and "STOP NOT CONFIRMED" in line, line
    finally:
        fire.end()


def test_finding_node_C7_the_dead_man_retries_the_whole_stop_until_an_ack(tmp_path, hook):
    heard, hook_env = hook
    fire = Fire(tmp_path / "c7", "vastai", {"action": ["ignore"]}, hook_env)
    try:
        wait_for(lambda: (fire.fired().get("stop_retry") or {}).get("tries", 0) >= 2 and len(fire.actions()) >= 3,
                 90, what="two retries, each sending the stop again")
        assert fire.proc.poll() is None                       # still there: it never gives up
        fallback_runs = len(fire.fallback_calls.read_text().splitlines())
        assert fallback_runs >= 2                              # each retry runs the fallback too
        line = status_line(fire.run, fire.env)
        assert "stop retried" in line and "since" in line, line
        wait_for(lambda: len(told(heard, fire.run, "stop_not_confirmed")) >= 2, 60, what="the repeated message")
        subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(fire.run)], env=fire.env, check=True,
                       capture_output=True, timeout=60)
        _out, err = fire.proc.communicate(timeout=90)
        assert fire.proc.returncode == 1, err
        retry = fire.fired()["stop_retry"]
        assert retry["state"] == "acknowledged" and retry["tries"] >= 2, retry
    finally:
        fire.end()


def test_finding_field_N12_not_confirmed_says_the_real_exit_codes_and_pending_before_any_attempt(tmp_path, hook):
    heard, hook_env = hook
    fire = Fire(tmp_path / "n12", "runpod", {"action": ["ignore"]}, hook_env, "--retries", "2",
                "--fallback-stop-cmd", stand_in(tmp_path, "fails", rc=1)[0])
    try:
        wait_for(lambda: fire.fired().get("stop_retry"), 60, what="the first sequence's end")
        fired = fire.fired()
        assert [a["rc"] for a in fired["attempts"]] == [1, 1]
        assert "exit codes 1, 1" in fired["message"] and "exited 0" not in fired["message"], fired["message"]
        line = status_line(fire.run, fire.env)
        assert "exit codes 1, 1" in line and "exited 0" not in line, line
    finally:
        fire.end()
    run = finished_run(tmp_path / "pending")
    (run / "DEADMAN_FIRED.json").write_text(json.dumps({"reason": "stall", "fired_at": "2026-12-05T00:00:00Z",
                                                         "attempts": [], "ok": False, "confirmed": None}))
    line = status_line(run, fire.env)
    assert "stop pending" in line and "FAILED" not in line, line


def test_finding_field_N17_a_refused_destructive_stop_and_its_fallback_are_said_as_such(tmp_path):
    run = finished_run(tmp_path)
    stop, stop_calls = stand_in(tmp_path, "destroy")
    fallback, fallback_calls = stand_in(tmp_path, "suspend")
    res = subprocess.run([sys.executable, DEADMAN, "arm", "--run-dir", str(run), "--foreground", "--poll-seconds",
                          POLL, "--grace-minutes", "0", "--stop-cmd", stop, "--stop-cmd-destructive",
                          "--fallback-stop-cmd", fallback, "--stop-retry-minutes", "0", *QUIET_DISK],
                         capture_output=True, text=True, timeout=60)
    assert not stop_calls.exists() and fallback_calls.exists(), res.stderr
    line = status_line(run, os.environ)
    assert "destructive stop refused, fallback ran (unconfirmed)" in line, line
    assert "stop command ok" not in line


# ----------------------------------------------------------------------------- C8: the key never persists

def test_finding_node_C8_a_provider_that_echoes_the_key_leaves_it_nowhere(tmp_path, hook):
    heard, hook_env = hook
    faults = {"action": ["echo_key"], "state": ["echo_key"]}
    fire = Fire(tmp_path / "c8", "runpod", faults, hook_env)
    try:
        wait_for(lambda: (fire.fired().get("stop_retry") or {}).get("tries", 0) >= 1 and
                 fire.fired()["stop_retry"].get("state") == "waiting", 90, what="a retry done")
        assert any("invalid api key" in a.get("output_tail", "") for a in fire.fired()["attempts"])
        outputs = [status_line(fire.run, fire.env)]
        for args in (["status", "--run-dir", str(fire.run), "--json"], ["status", "--run-dir", str(fire.run)]):
            res = subprocess.run([sys.executable, DEADMAN, *args], capture_output=True, text=True, env=fire.env,
                                 timeout=60)
            outputs.append(res.stdout + res.stderr)
        facts = subprocess.run(["sh", str(NODE / "status_facts.sh"), str(fire.run), str(NODE), "MARK36"],
                               capture_output=True, text=True, env=fire.env, timeout=60)   # what `rgt.py status`
        assert "invalid api key" in facts.stdout                                       # carries to the laptop
        outputs.append(facts.stdout + facts.stderr)
        subprocess.run([sys.executable, DEADMAN, "ack", "--run-dir", str(fire.run)], env=fire.env, check=True,
                       capture_output=True, timeout=60)
        _out, err = fire.proc.communicate(timeout=90)
    finally:
        fire.end()
    assert KEY not in err
    hits = [str(p) for p in tmp_path.rglob("*") if p.is_file() and p.name != "runpod_keys" and
            KEY in p.read_text(errors="replace")]          # run dir, deadman.log, spool, registry
    assert hits == []
    assert all(KEY not in text for text in outputs), outputs
    assert heard and KEY not in json.dumps(heard)


# ----------------------------------------------------------------------------- the fault matrix

MATRIX = {   # mode -> the stand-in's script for the stop request ("action") and the state reads
    "honest": {},
    "still_running": {"action": ["ignore"]},
    "flapping": {"action": ["ignore"], "state": ["stopped", "running"] * 100},
    "rate_limited": {"action": ["429", "honest"], "state": ["429", "honest"]},
    "server_error": {"action": ["500", "honest"]},
    "hang": {"action": ["hang"]},
    "slower_than_timeout": {"action": ["slow", "honest"]},
    "malformed_body": {"action": ["ignore"], "state": ["malformed"]},
    "null_object": {"action": ["honest"], "state": ["null"]},
    "404_then_found": {"action": ["ignore"], "state": ["404", "honest"]},
    "another_instance_id": {"action": ["ignore"], "state": ["foreign"]},
    "401_mid_run": {"action": ["ignore"], "state": ["honest", "401"]},
    "connection_refused": {"action": ["reset"], "state": ["reset"]},
    "echoes_the_key": {"action": ["echo_key"], "state": ["echo_key"]},
}
MUST_CONFIRM = ("honest", "rate_limited")
# Lambda's only meter stop is terminate: destructive, so behind the verified-sync gate (test_providers.py and
# the C3 rule above drive its adapter); the matrix runs the three adapters whose stop the dead-man sends itself.
MATRIX_PROVIDERS = ("runpod", "vastai", "paperspace")


@pytest.mark.drill("provider faults: CONFIRMED only when stopped")
@pytest.mark.parametrize("mode", sorted(MATRIX))
def test_drill_provider_fault_matrix(tmp_path, hook, mode):
    """One mode, every adapter at once: CONFIRMED only when the simulator really stopped that instance;
    otherwise NOT CONFIRMED, escalated and told, and the whole stop sent again by a retry."""
    heard, hook_env = hook
    fires = [Fire(tmp_path / provider, provider, MATRIX[mode], hook_env) for provider in MATRIX_PROVIDERS]
    try:
        wait_for(lambda: all(f.settled() for f in fires), 120, what="every case settled")
        for fire in fires:
            fired, case = fire.fired(), "%s/%s" % (mode, fire.provider)
            if fired.get("confirmed") is True:
                assert fire.box.really_stopped(), "FALSE CONFIRMATION " + case
                assert fire.proc.wait(timeout=60) == 0, case
                continue
            assert mode not in MUST_CONFIRM, case
            assert fired["escalations"] and fired["confirmed"] is False, (case, fired)
            assert told(heard, fire.run, "stop_not_confirmed"), case
            assert fired["stop_retry"]["tries"] >= 1 or fired["stop_retry"]["state"] == "confirmed", case
        assert all(KEY not in (f.run / "DEADMAN_FIRED.json").read_text() for f in fires)
    finally:
        for fire in fires:
            fire.end()
