"""Provider adapters, the verified stop, `rgt.py billing` and the budget (issue 24; GUIDE §6 wave 3).

Stand-in APIs (tests/provider_standins.py) run on 127.0.0.1 and are held to the real clients' contract: the
runpod SDK and the vastai CLI, pinned in requirements-dev.txt, run against the same stand-ins. Stand-ins
advance by request count and the stop loop takes an injected clock, so no test here waits on wall time
except the hang drills, which only assert an upper bound.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import NODE, SCRIPTS, TOOLS, missing
sys.path.insert(0, str(TOOLS))
from provider_standins import Instance, StandIn, Volume  # noqa: E402  (tools/: the demo uses them too)
from sshd_fixture import sshd_server  # noqa: F401

sys.path.insert(0, str(NODE))
sys.path.insert(0, str(SCRIPTS))
import providers as pv  # noqa: E402
import provider_lambda  # noqa: E402
import provider_paperspace  # noqa: E402
import provider_runpod  # noqa: E402
import provider_vastai  # noqa: E402
import billing  # noqa: E402

KEY = "canary-key-5f3b9e1d7c2a4b6e8d0f"   # searched for in every output below
CLASSES = {"runpod": provider_runpod.RunPod, "vastai": provider_vastai.VastAI, "lambda": provider_lambda.Lambda,
           "paperspace": provider_paperspace.Paperspace}
URL_VAR = {"runpod": "RGT_RUNPOD_API_URL", "vastai": "RGT_VASTAI_API_URL", "lambda": "RGT_LAMBDA_API_URL",
           "paperspace": "RGT_PAPERSPACE_API_URL"}
STOPPABLE = ("runpod", "vastai", "paperspace")          # Lambda has no stop: terminate is its meter stop
IDS = {"runpod": "pod7x", "vastai": "4242", "lambda": "0920582c7ff0", "paperspace": "psm1x"}


class FakeClock(object):
    """time.monotonic and time.sleep for stop_and_confirm: sleeping moves the clock, nothing waits."""

    def __init__(self):
        self.now, self.slept = 1000.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def adapter(provider, standin, ident=None):
    return CLASSES[provider](KEY, ident or IDS[provider], standin.url)


def standin(provider, **inst):
    return StandIn(provider, KEY, [Instance(IDS[provider], **inst)])


def meter_stop(provider):
    return "stop" if provider in STOPPABLE else "terminate"


# ---------------------------------------------------------------- stop -> state -> confirmed

@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_provider_stop_is_confirmed_by_the_state_read_back(provider):
    with standin(provider, lag=2) as api:
        ad = adapter(provider, api)
        assert ad.state(10) == "running"
        clock = FakeClock()
        res = pv.stop_and_confirm(ad, meter_stop(provider), poll_s=10, cap_s=240, clock=clock, sleep=clock.sleep)
    assert res["confirmed"] is True and res["error"] is None, res
    assert res["state"] == ("stopped" if provider in STOPPABLE else "gone")
    # two reads while the provider is still stopping, then 3 confirming reads spanning 20 s (C5)
    assert res["polls"] == 5 and res["unknown_reads"] == 0
    assert clock.slept == [10, 10, 10, 10]


@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_provider_terminate_is_confirmed_only_when_gone(provider):
    with standin(provider, lag=1) as api:
        ad = adapter(provider, api)
        clock = FakeClock()
        res = pv.stop_and_confirm(ad, "terminate", poll_s=5, cap_s=240, clock=clock, sleep=clock.sleep)
        assert res["confirmed"] and res["state"] in ("gone", "missing") and res["polls"] == 6, res  # 5 s reads over 20 s
        assert ad.state(10) in ("gone", "missing")  # and stays gone (404, null, or TERMINATED)
        assert ad.list(10)["instances"] == []


@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_verified_stop_a_200_that_never_stops_is_not_confirmed(provider):
    with standin(provider, mode="never_stops") as api:
        ad = adapter(provider, api)
        clock = FakeClock()
        res = pv.stop_and_confirm(ad, meter_stop(provider), poll_s=10, cap_s=240, clock=clock, sleep=clock.sleep)
        action_calls = [c for c in api.log if c["method"] != "GET" and "pod(" not in json.dumps(c["body"] or "")]
    assert res["confirmed"] is False and res["state"] == "running"
    assert res["error"]["kind"] == "timeout" and "NOT CONFIRMED" in res["error"]["message"]
    assert 20 <= res["polls"] <= 25 and clock.now - 1000.0 <= 240  # capped at 4 minutes
    assert action_calls, "the stop request was sent and answered 200"


def test_verified_stop_rule_never_takes_an_answer_for_a_state():
    class Liar(pv.Adapter):
        name = "liar"

        def stop(self, timeout):
            return {"success": True, "desiredStatus": "EXITED"}

        def state(self, timeout):
            return "running"

    clock = FakeClock()
    res = pv.stop_and_confirm(Liar("k", "i"), "stop", poll_s=30, cap_s=240, clock=clock, sleep=clock.sleep)
    assert res["confirmed"] is False and res["polls"] == 8
    ad = pv.Adapter("k", "i")
    assert ad.confirmed("stopped", "stop") and ad.confirmed("gone", "stop") and ad.confirmed("gone", "terminate")
    assert not any(ad.confirmed(s, "terminate") for s in ("running", "stopping", "stopped", "unknown"))
    assert not any(ad.confirmed(s, "stop") for s in ("running", "stopping", "unknown"))


def test_verified_stop_rule_rate_limits_wait_their_retry_after_and_auth_ends_at_once():
    class Flaky(pv.Adapter):
        name = "flaky"

        def __init__(self, errors):
            pv.Adapter.__init__(self, "k", "i")
            self.errors, self.reads = list(errors), 0

        def stop(self, timeout):
            if self.errors:
                raise self.errors.pop(0)

        def state(self, timeout):
            self.reads += 1
            return "stopped"

    clock = FakeClock()
    res = pv.stop_and_confirm(Flaky([pv.ProviderError("rate", "429", 7), pv.ProviderError("network", "reset")]),
                              "stop", poll_s=10, cap_s=240, clock=clock, sleep=clock.sleep)
    # 3 stop requests (429, reset, accepted), then 3 confirming reads spanning 20 s
    assert res["confirmed"] and res["requests"] == 6 and clock.slept == [7, 10, 10, 10]
    flaky = Flaky([pv.ProviderError("auth", "401")])
    res = pv.stop_and_confirm(flaky, "stop", clock=clock, sleep=clock.sleep)
    assert not res["confirmed"] and res["error"]["kind"] == "auth" and res["requests"] == 1 and flaky.reads == 0


# ---------------------------------------------------------------- 401, 429, hang

@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_provider_401_is_an_auth_error_and_is_not_retried(provider):
    with standin(provider, mode="401") as api:
        ad = adapter(provider, api)
        with pytest.raises(pv.ProviderError) as err:
            ad.state(10)
        assert err.value.kind == "auth" and KEY not in str(err.value)
        clock = FakeClock()
        res = pv.stop_and_confirm(ad, meter_stop(provider), clock=clock, sleep=clock.sleep)
    assert res["error"]["kind"] == "auth" and res["requests"] == 1 and not res["confirmed"]


def test_provider_a_wrong_key_is_401_from_the_stand_in_too():
    with standin("vastai") as api:
        with pytest.raises(pv.ProviderError) as err:
            provider_vastai.VastAI("some-other-key", IDS["vastai"], api.url).state(10)
    assert err.value.kind == "auth"


@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_provider_429_carries_retry_after_then_the_stop_goes_through(provider):
    with standin(provider, mode="429", rate_limited=2, lag=0) as api:
        ad = adapter(provider, api)
        with pytest.raises(pv.ProviderError) as err:
            ad.state(10)
        assert err.value.kind == "rate" and err.value.retry_after == 0.0
        clock = FakeClock()
        res = pv.stop_and_confirm(ad, meter_stop(provider), poll_s=10, cap_s=240, clock=clock, sleep=clock.sleep)
    assert res["confirmed"] and res["requests"] == res["polls"] + 2, res  # one more 429, then the action


@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_provider_a_hanging_api_is_cut_at_the_timeout(provider):
    with standin(provider, mode="hang") as api:
        ad = adapter(provider, api)
        began = time.monotonic()
        with pytest.raises(pv.ProviderError) as err:
            ad.state(0.5)
        assert err.value.kind == "timeout"
        res = pv.stop_and_confirm(ad, meter_stop(provider), poll_s=0.2, cap_s=1.5, request_timeout=0.5)
        elapsed = time.monotonic() - began
    assert not res["confirmed"] and res["error"]["kind"] == "timeout"
    assert elapsed < 20, elapsed  # bounded by the timeouts (0.5 s + a 1.5 s cap), never by the server


# ---------------------------------------------------------------- adapter_for and the node's credentials

def test_provider_adapter_for_platforms_without_an_api_is_none():
    for profile in ("autodl", "china", "generic-ssh", "local"):
        assert pv.adapter_for(profile, {}) is None
    with pytest.raises(pv.ProviderError) as err:
        pv.adapter_for("no-such-cloud", {})
    assert err.value.kind == "config"


def test_provider_adapter_for_reads_the_ids_and_keys_the_platforms_inject(tmp_path):
    rp = pv.adapter_for("runpod", {"RUNPOD_POD_ID": "pod7x", "RUNPOD_API_KEY": KEY,
                                   "RUNPOD_API_BASE_URL": "http://127.0.0.1:9"})
    assert (rp.name, rp.instance_id, rp.url) == ("runpod", "pod7x", "http://127.0.0.1:9")
    assert pv.adapter_for("runpod", {"RUNPOD_POD_ID": "p", "RUNPOD_API_KEY": KEY}).url == "https://api.runpod.io"
    va = pv.adapter_for("vastai", {"CONTAINER_ID": "4242", "CONTAINER_API_KEY": KEY})
    assert (va.instance_id, va.url) == ("4242", "https://console.vast.ai")
    assert KEY not in repr(rp) + repr(va) + json.dumps(rp.describe()) + json.dumps(va.describe())
    for profile, env, fragment in (("runpod", {"RUNPOD_API_KEY": KEY}, "RUNPOD_POD_ID"),
                                   ("vastai", {"CONTAINER_ID": "4242"}, "CONTAINER_API_KEY"),
                                   ("vastai", {"CONTAINER_ID": "42; rm", "CONTAINER_API_KEY": KEY}, "number"),
                                   ("paperspace", {}, "RGT_PAPERSPACE_MACHINE_ID")):
        with pytest.raises(pv.ProviderError) as err:
            pv.adapter_for(profile, env)
        assert err.value.kind == "config" and fragment in str(err.value)


def test_provider_lambda_key_file_must_be_0600_and_name_the_instance(tmp_path):
    keys = tmp_path / "lambda_keys"
    keys.write_text("api_key = %s\n" % KEY)
    keys.chmod(0o644)
    env = {"RGT_LAMBDA_KEY_FILE": str(keys), "RGT_LAMBDA_INSTANCE_ID": "0920582c7ff0"}
    with pytest.raises(pv.ProviderError) as err:
        pv.adapter_for("lambda", env)
    assert err.value.kind == "config" and "chmod 600" in str(err.value) and KEY not in str(err.value)
    keys.chmod(0o600)
    assert pv.adapter_for("lambda", env).instance_id == "0920582c7ff0"
    with pytest.raises(pv.ProviderError) as err:
        pv.adapter_for("lambda", {"RGT_LAMBDA_KEY_FILE": str(keys)})
    assert "RGT_LAMBDA_INSTANCE_ID" in str(err.value)
    keys.write_text("api_key = %s\ninstance_id = abc123\n" % KEY)
    assert pv.adapter_for("lambda", {"RGT_LAMBDA_KEY_FILE": str(keys)}).instance_id == "abc123"
    with pytest.raises(pv.ProviderError) as err:
        pv.adapter_for("lambda", env).stop(1)
    assert err.value.kind == "config" and "terminate" in str(err.value)


def node_env(tmp_path, provider, api):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "CONTAINER_", "RGT_", "VAST"))}
    env.update({URL_VAR[provider]: api.url, "HOME": str(tmp_path)})
    if provider == "runpod":
        env.update(RUNPOD_POD_ID=IDS["runpod"], RUNPOD_API_KEY=KEY)
    elif provider == "vastai":
        env.update(CONTAINER_ID=IDS["vastai"], CONTAINER_API_KEY=KEY)
    else:
        keys = tmp_path / ("%s_key" % provider)
        keys.write_text("api_key = %s\n" % KEY)
        keys.chmod(0o600)
        var = "RGT_%s_KEY_FILE" % provider.upper()
        env.update({var: str(keys), "RGT_%s_%s" % (provider.upper(), "INSTANCE_ID" if provider == "lambda"
                                                   else "MACHINE_ID"): IDS[provider]})
    return env


@pytest.mark.parametrize("provider", sorted(CLASSES))
def test_provider_cli_confirms_and_never_prints_the_key(tmp_path, provider):
    tool = NODE / ("provider_%s.py" % provider)
    action = meter_stop(provider)
    with standin(provider, lag=1) as api:
        env = node_env(tmp_path, provider, api)
        state = subprocess.run([sys.executable, str(tool), "state", "--json"], env=env, capture_output=True,
                               text=True, timeout=60)
        cmd = [sys.executable, str(tool), action, "--json", "--poll-seconds", "0.05", "--confirm-span-seconds", "0.3"]
        refused = (subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
                   if action == "terminate" else None)  # terminate without --destructive: refused, nothing sent
        done = subprocess.run(cmd + (["--destructive"] if action == "terminate" else []), env=env,
                              capture_output=True, text=True, timeout=60)
    assert state.returncode == 0 and json.loads(state.stdout)["state"] == "running", state.stderr
    if refused is not None:
        assert refused.returncode == 3 and "--destructive" in refused.stderr
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["confirmed"] is True and doc["provider"] == provider and doc["confirmation"]
    for out in (state.stdout, state.stderr, done.stdout, done.stderr):
        assert KEY not in out


def test_provider_cli_says_not_confirmed_exit_1_and_no_api_exit_2(tmp_path):
    with standin("vastai", mode="never_stops") as api:
        env = node_env(tmp_path, "vastai", api)
        res = subprocess.run([sys.executable, str(NODE / "providers.py"), "stop", "--profile", "vastai",
                              "--poll-seconds", "0.05", "--cap-seconds", "0.5"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert res.returncode == 1 and "NOT CONFIRMED" in res.stdout and KEY not in res.stdout + res.stderr
    res = subprocess.run([sys.executable, str(NODE / "providers.py"), "stop", "--profile", "autodl"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no API" in res.stderr and "shutdown" in res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


# ---------------------------------------------------------------- the real clients hold the stand-ins to the contract

def test_provider_contract_runpod_sdk_against_the_stand_in(tmp_path):
    try:
        import runpod  # noqa: F401
    except ImportError:
        missing("the runpod SDK is not installed (pip install -r requirements-dev.txt)")
    script = (
        "import json, os, runpod\n"
        "runpod.api_key = os.environ['RGT_TEST_KEY']\n"
        "out = {'before': runpod.get_pod('pod7x')['desiredStatus']}\n"
        "out['stop'] = runpod.stop_pod('pod7x')\n"
        "out['pods'] = [(p['id'], p['desiredStatus'], p['costPerHr']) for p in runpod.get_pods()]\n"
        "out['volumes'] = [v['id'] for v in runpod.get_user()['networkVolumes']]\n"
        "print(json.dumps(out))\n")
    with StandIn("runpod", KEY, [Instance("pod7x", lag=1, rate=0.69), Instance("other", rate=2.0)],
                 [Volume("nv1")]) as api:
        env = dict(os.environ, HOME=str(tmp_path), RUNPOD_API_BASE_URL=api.url, RGT_TEST_KEY=KEY)
        env.pop("RGT_RUNPOD_API_URL", None)
        res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr[-2000:]
        sdk = json.loads(res.stdout)
        ours = pv.adapter_for("runpod", {"RUNPOD_POD_ID": "pod7x", "RUNPOD_API_KEY": KEY,
                                         "RUNPOD_API_BASE_URL": api.url})
        states = [ours.state(10), ours.state(10)]
        listed = ours.list(10)
        gql = [c for c in api.log if c["path"] == "/graphql"]
    assert sdk["before"] == "RUNNING" and sdk["stop"] == {"id": "pod7x", "desiredStatus": "EXITED"}
    assert ("other", "RUNNING", 2.0) in [tuple(p) for p in sdk["pods"]] and sdk["volumes"] == ["nv1"]
    assert states == ["stopping", "stopped"]  # the SDK's stop, read back through our adapter
    assert len(gql) == len(api.log) and all(c["auth"] for c in api.log)  # one endpoint, Bearer key, both clients
    assert {i["id"]: i["rate_per_hour"] for i in listed["instances"]} == {"pod7x": 0.69, "other": 2.0}
    assert [s["id"] for s in listed["storage"]] == ["nv1"]


def vastai_cli():
    exe = shutil.which("vastai")
    if not exe:
        missing("the vastai CLI is not installed (pip install -r requirements-dev.txt)")
    return exe


def test_provider_contract_vastai_cli_against_the_stand_in(tmp_path):
    exe = vastai_cli()
    with StandIn("vastai", KEY, [Instance("4242", lag=0, rate=0.41), Instance("777", rate=1.1)],
                 [Volume("31")]) as api:
        env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"), VAST_API_KEY=KEY,
                   VASTAI_NO_UPDATE_CHECK="1")

        def cli(*words):
            res = subprocess.run([exe, "--url", api.url] + list(words), env=env, capture_output=True, text=True,
                                 timeout=180)
            assert res.returncode == 0, res.stdout + res.stderr
            return res.stdout

        shown = json.loads(cli("show", "instance", "4242", "--raw"))
        cli("stop", "instance", "4242")
        ours = provider_vastai.VastAI(KEY, "4242", api.url)
        after_cli_stop = ours.state(10)
        fleet = json.loads(cli("show", "instances", "--raw"))
        volumes = json.loads(cli("show", "volumes", "--raw"))
        ours.terminate(10)
        gone = json.loads(cli("show", "instance", "4242", "--raw"))
        methods = [(c["method"], c["path"]) for c in api.log]
    assert shown["actual_status"] == "running" and shown["dph_total"] == 0.41
    assert after_cli_stop == "stopped"  # the CLI's stop, read back by our adapter
    assert sorted((i["id"], i["cur_state"]) for i in fleet) == [(777, "running"), (4242, "stopped")]
    assert [v["id"] for v in volumes] == [31]
    assert gone == {"instances": None}  # our destroy, read back by the CLI
    assert ("PUT", "/api/v0/instances/4242/") in methods and ("DELETE", "/api/v0/instances/4242/") in methods
    assert all(c["auth"] for c in api.log)


# ---------------------------------------------------------------- rgt.py billing: a mixed fleet, classified

def ledger_file(tmp_path, rows):
    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(dict(r, time=r.get("time", "2026-12-01T00:00:00Z"))) + "\n" for r in rows))
    return path


def test_billing_classifies_a_mixed_fleet_and_changes_nothing(tmp_path):
    ledger = ledger_file(tmp_path, [
        {"event": "launch", "host": "box-a", "box": "root@192.0.2.21:22022", "run_id": "train-a",   # by address
         "state": "launched"},
        {"event": "launch", "host": "box-b", "run_id": "train-b", "state": "launched", "instance": "vastai:502"},
        {"event": "status", "host": "box-b", "run_id": "train-b", "state": "succeeded"},
        {"event": "launch", "host": "box-c", "run_id": "train-c", "state": "launched", "instance": "runpod:podc"},
    ])
    vast = StandIn("vastai", KEY, [Instance("501", ip="192.0.2.21", rate=0.5),        # ledger run in progress
                                   Instance("502", rate=0.8),                         # its run finished
                                   Instance("503", rate=1.5)],                        # never in the ledger
                   [Volume("61")])
    pod = StandIn("runpod", KEY, [Instance("podc", state="stopped", rate=0.7)], [Volume("nvx")])
    with vast, pod:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST", "LAMBDA", "PAPERSPACE",
                                                                         "RGT_"))}
        env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"), RGT_VASTAI_API_URL=vast.url,
                   RGT_RUNPOD_API_URL=pod.url)
        (tmp_path / "cfg" / "vastai").mkdir(parents=True)
        (tmp_path / "cfg" / "vastai" / "vast_api_key").write_text(KEY + "\n")  # the vastai CLI's key file
        (tmp_path / ".runpod").mkdir()
        (tmp_path / ".runpod" / "config.toml").write_text('[default]\napi_key = "%s"\n' % KEY)  # the SDK's file
        before = ledger.read_bytes()
        res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(ledger), "--json", "billing"],
                             env=env, capture_output=True, text=True, timeout=120)
        human = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(ledger), "billing"],
                               env=env, capture_output=True, text=True, timeout=120)
        writes = [c for c in vast.log + pod.log if c["method"] in ("PUT", "DELETE", "PATCH") or
                  "mutation" in json.dumps(c["body"] or "")]
    assert res.returncode == 1, res.stderr  # something bills without a run
    doc = json.loads(res.stdout)
    labels = {(i["provider"], i["id"]): i["label"] for i in doc["items"]}
    assert labels == {("vastai", "501"): "OK", ("vastai", "502"): "RUNNING, NO ACTIVE RUN",
                      ("vastai", "503"): "UNKNOWN TO THE LEDGER", ("vastai", "61"): "STORAGE BILLING",  # unattached
                      ("runpod", "podc"): "STOPPED, STORAGE BILLING", ("runpod", "nvx"): "STORAGE BILLING"}
    assert doc["unattended_rate_per_hour"] == 2.3  # 0.8 + 1.5: compute billing without a run
    assert {p["provider"]: p["credentials"] for p in doc["providers"]} == {
        "runpod": True, "vastai": True, "lambda": False, "paperspace": False}
    assert writes == [] and ledger.read_bytes() == before  # read-only
    assert "UNKNOWN TO THE LEDGER" in human.stdout and "$1.50/h" in human.stdout and human.returncode == 1
    assert KEY not in res.stdout + res.stderr + human.stdout + human.stderr


def test_billing_lambda_and_paperspace_fleets_and_a_refused_key(tmp_path):
    lam = StandIn("lambda", KEY, [Instance("l1", rate=1.29)], [Volume("fs1")])
    ps = StandIn("paperspace", "another-key", [Instance("m1")])
    with lam, ps:
        keys = tmp_path / "lambda_keys"
        keys.write_text("api_key = %s\n" % KEY)
        keys.chmod(0o600)
        env = {"RGT_LAMBDA_KEY_FILE": str(keys), "RGT_LAMBDA_API_URL": lam.url, "PAPERSPACE_API_KEY": KEY,
               "RGT_PAPERSPACE_API_URL": ps.url}
        doc = billing.report_billing([], environ=env, home=str(tmp_path), timeout=10)
    assert {(i["provider"], i["id"], i["label"], i["rate_per_hour"]) for i in doc["items"]} == {
        ("lambda", "l1", "UNKNOWN TO THE LEDGER", 1.29), ("lambda", "fs1", "STORAGE BILLING", None)}
    err = [p for p in doc["providers"] if p["provider"] == "paperspace"][0]["error"]
    assert err["kind"] == "auth" and doc["ok"] is False


def test_billing_with_nothing_listed_is_ok(tmp_path):
    doc = billing.report_billing([], environ={}, home=str(tmp_path))
    assert doc["ok"] and doc["items"] == [] and not any(p["credentials"] for p in doc["providers"])


# ---------------------------------------------------------------- the budget

def test_billing_budget_buys_a_wall_clock_cap_rounded_down():
    told = ["--deadman-arg", "--budget-usd=10", "--deadman-arg", "--rate-per-hour=3"]   # for budget_80 / budget_100
    opts, hours, note = billing.plan_budget(10.0, 3.0, ["--output", "ckpt/*"])
    assert opts == ["--output", "ckpt/*", "--max-hours", "3.3333"] + told and hours == 3.3333
    assert "at most 10.00" in note
    opts, hours, _ = billing.plan_budget(10.0, 3.0, ["--max-hours", "2", "--wait"])   # tighter cap kept
    assert opts == ["--wait", "--max-hours", "2"] + told and hours == 2.0
    opts, hours, _ = billing.plan_budget(10.0, 1.0, ["--max-hours=24"])               # looser cap replaced
    assert opts[:2] == ["--max-hours", "10"] and hours == 10.0
    opts, hours, _ = billing.plan_budget(12345.678, 10.0, [])                          # never rounded up
    assert opts[:2] == ["--max-hours", "1234.5678"] and hours == 1234.5678
    assert billing.plan_budget(None, None, ["--wait"]) == (["--wait"], None, None)
    with pytest.raises(billing.core.UsageError):
        billing.plan_budget(10.0, None, [])


def test_billing_cost_so_far_comes_from_the_ledger_row():
    events = [{"event": "launch", "host": "h", "run_id": "r", "state": "launched", "time": "2026-12-01T00:00:00Z",
               "rate_per_hour": 2.5, "max_cost": 20.0},
              {"event": "resume", "host": "h", "run_id": "r", "state": "launched", "time": "2026-12-01T02:00:00Z"}]
    now = billing.core.parse_iso("2026-12-01T03:00:00Z")
    cost = billing.cost_so_far(events, "h", "r", now=now)
    assert cost["cost"] == 7.5 and cost["hours"] == 3.0 and "budget 20.00" in cost["line"]
    assert billing.cost_so_far(events, "h", "r", rate=1.0, now=now)["cost"] == 3.0
    assert billing.cost_so_far(events, "h", "other", now=now)["cost"] is None


@pytest.mark.parametrize("args,fragment", [
    (["--max-cost", "5"], "needs the hourly rate"),
    (["--max-cost", "-1", "--rate-per-hour", "2"], "--max-cost"),
    (["--max-cost", "5", "--instance", "nowhere:1"], "PROVIDER:ID"),
])
def test_billing_bad_budget_input_is_one_line_exit_2(tmp_path, args, fragment):
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(tmp_path / "l.jsonl"), "launch",
                          "gpu-box", "--profile", "local", "--run-id", "r1"] + args + ["--", "true"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(tmp_path)))
    assert res.returncode == 2 and fragment in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "l.jsonl").exists()  # refused before anything ran or was recorded


def find_key(doc, key):
    """The first value of KEY anywhere in a JSON document (the dead-man's state layout is not ours)."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for item in doc:
            found = find_key(item, key)
            if found is not None:
                return found
    return None


def test_billing_max_cost_arms_the_dead_man_cap_and_status_shows_cost(tmp_path, sshd_server, monkeypatch):  # noqa: F811
    from sshd_fixture import rgt
    durable, work = tmp_path / "durable", tmp_path / "work"
    assert rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar").returncode == 0
    runs = {}
    with StandIn("vastai", KEY, [Instance("4242", rate=0.5)]) as api:
        monkeypatch.setenv("RGT_VASTAI_API_URL", api.url)   # the laptop's vast.ai credentials
        monkeypatch.setenv("VAST_API_KEY", KEY)
        for rid, budget in (("budget-1", ["--max-cost", "3", "--rate-per-hour", "2"]),
                            ("budget-2", ["--max-cost", "1", "--instance", "vastai:4242"])):
            res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", rid,
                      "--durable-dir", str(durable), "--cwd", str(work), *budget, "--",
                      "--deadman-dry-run", "--wait", "--poll-seconds", "0.2", "--", "python3", "-c", "pass")
            assert res.returncode == 0, res.stdout + res.stderr
            runs[rid] = res
    assert "budget:     budget: at most 3.00 (1.5 h at 2/h)" in runs["budget-1"].stdout
    assert "at most 1.00 (2 h at 0.5/h)" in runs["budget-2"].stdout  # the rate the provider lists
    for rid, hours, budget, rate in (("budget-1", 1.5, 3.0, 2.0), ("budget-2", 2.0, 1.0, 0.5)):
        state = json.loads((durable / "runs" / rid / "deadman.json").read_text())
        assert find_key(state, "max_hours") == hours, state  # the dead-man's wall-clock cap is the budget's
        # and it knows the budget, to tell budget_80 and budget_100 (notify.py)
        assert (find_key(state, "budget_usd"), find_key(state, "rate_per_hour")) == (budget, rate), state
    events = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    launch = [e for e in events if e["event"] == "launch" and e["run_id"] == "budget-2"][0]
    assert (launch["instance"], launch["rate_per_hour"], launch["max_cost"], launch["max_hours"]) == \
        ("vastai:4242", 0.5, 1.0, 2.0)
    status = rgt(tmp_path, sshd_server, "--json", "status", "gpu-box", "budget-1")
    cost = json.loads(status.stdout)["cost_from_ledger"]
    assert cost["rate_per_hour"] == 2 and cost["max_cost"] == 3 and cost["cost"] is not None
    assert "cost so far:" in rgt(tmp_path, sshd_server, "status", "gpu-box", "budget-1").stdout
    assert KEY not in (tmp_path / "ledger.jsonl").read_text()
