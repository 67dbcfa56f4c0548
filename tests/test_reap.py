"""The reaper (issue 39): a backstop off the box that stops, through the provider's API, what the node can no longer
stop. Drills with real processes: a real sshd on 127.0.0.1 is the box, rgt.py launches a real run there (its
dead-man a dry run, so only the reaper can stop anything), the provider is tools/provider_standins.py's vast.ai
stand-in, and `rgt.py reap` runs as its own process with the laptop's keys in its environment.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, read_json, runs_from, wait_for, webhook_target
from sshd_fixture import rgt

sys.path.insert(0, str(SCRIPTS.parent / "tools"))
from provider_standins import Instance, StandIn  # noqa: E402

KEY = "reap-canary-key-0c9d8e7f6a5b"
INSTANCE = "4242"
LOOP = "import time\nfor i in range(100000):\n    print('step %d/100000' % i, flush=True)\n    time.sleep(0.2)\n"


@pytest.fixture
def box(tmp_path, sshd_server):
    """The toolkit pushed to the test sshd and a vast.ai stand-in whose instance 4242 runs."""
    res = rgt(tmp_path, sshd_server, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stderr
    with StandIn("vastai", KEY, [Instance(INSTANCE, lag=0, rate=3600.0)]) as api:
        yield tmp_path, sshd_server, api
    for run_dir in (tmp_path / "durable" / "runs").glob("*"):
        stop_everything(run_dir, signal.SIGKILL)


def stop_everything(run_dir, sig):
    """SIG to the run's job group, its supervisor and its dead-man (SIGSTOP: the box hangs)."""
    status, dm = read_json(run_dir / "status.json"), read_json(run_dir / "deadman.json")
    for pid in (status.get("job_pid"), status.get("supervisor_pid"), dm.get("pid")):
        if not runs_from(pid, run_dir):       # gone already: its pid may be another test's process now
            continue
        for send in (lambda: os.killpg(os.getpgid(pid), sig), lambda: os.kill(pid, sig)):
            try:
                send()
            except OSError:
                pass
        if sig == signal.SIGKILL:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass


def launch(tmp_path, server, rid, *options, job=LOOP, ttl="2", max_cost=None):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    cost = ["--max-cost", str(max_cost)] if max_cost is not None else []
    res = rgt(tmp_path, server, "launch", "gpu-box", "--profile", "local", "--run-id", rid,
              "--durable-dir", str(tmp_path / "durable"), "--cwd", str(work), "--rate-per-hour", "3600",
              "--instance", "vastai:" + INSTANCE, *cost, "--", "--deadman-dry-run", "--poll-seconds", "0.2",
              "--deadman-arg", "--lease-ttl-seconds", "--deadman-arg", ttl, *options, "--", "python3", "-c", job)
    assert res.returncode == 0, res.stdout + res.stderr
    run_dir = tmp_path / "durable" / "runs" / rid
    wait_for(lambda: (run_dir / "lease.json").exists(), what="the dead-man's first lease")
    return run_dir


def reap(tmp_path, server, api, *extra, config=None, wait=True):
    """`rgt.py reap` as its own process, with the laptop's vast.ai key in its environment."""
    argv = [sys.executable, str(SCRIPTS / "rgt.py"), "--ssh-config", str(config or server.config), "--ledger",
            str(tmp_path / "ledger.jsonl"), "--node-dir", str(tmp_path / "node-bin"), "reap", "--json", "--poll-seconds", "0", "--cap-seconds", "30",
            "--timeout", "10"] + list(extra)
    env = dict(os.environ, HOME=str(tmp_path / "laptop-home"), VAST_API_KEY=KEY, RGT_VASTAI_API_URL=api.url,
               RGT_PROVIDER_CONFIRM_SPAN_S="0.3")     # C5's rule, its 20 s span shrunk
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err
    return proc.returncode, json.loads(out), err


def stops(api):
    return [c for c in api.log if c["method"] == "PUT" and INSTANCE in c["path"]]


def rows(tmp_path, event="reap"):
    return [json.loads(l) for l in (tmp_path / "ledger.jsonl").read_text().splitlines()
            if json.loads(l).get("event") == event]


def lease_expired(run_dir, extra=0.0):
    doc = read_json(run_dir / "lease.json")
    return doc and time.time() - doc["renewed_at"] > doc["ttl_s"] + extra


@pytest.mark.drill("reaper stops a hung box")
def test_a_hung_box_is_stopped_from_outside(box):
    """Every process of the run and its dead-man SIGSTOPped: the lease stops being renewed; a reap before the
    lease ran out does nothing; the first reap after stops the instance and reads it back as stopped."""
    tmp_path, server, api = box
    run_dir = launch(tmp_path, server, "hung")
    code, doc, _err = reap(tmp_path, server, api)
    assert code == 0 and doc["decisions"][0]["action"] == "none" and not stops(api), doc   # fresh lease: hands off
    lease = read_json(run_dir / "lease.json")
    assert lease["deadman"]["state"] == "armed" and lease["ttl_s"] == 2.0

    stop_everything(run_dir, signal.SIGSTOP)
    wait_for(lambda: lease_expired(run_dir, 0.5), what="the hung box's lease to run out")
    code, doc, _err = reap(tmp_path, server, api, "--unwatched-grace-minutes", "0")
    decision = doc["decisions"][0]
    assert code == 0 and decision["rule"] == "unwatched" and decision["confirmed"] is True, doc
    assert len(stops(api)) == 1 and api.instances[INSTANCE].state == "stopped"
    assert [(r["rule"], r.get("state")) for r in rows(tmp_path)][-1] == ("unwatched", "reaped")

    code, doc, _err = reap(tmp_path, server, api)                 # idempotent: a stopped box is left alone
    assert code == 0 and doc["decisions"][0]["provider_state"] == "stopped" and len(stops(api)) == 1
    stop_everything(run_dir, signal.SIGCONT)


@pytest.mark.drill("reaper stops at the budget when the dead-man is dead")
def test_a_killed_dead_man_with_a_budget_is_reaped_at_the_deadline(box):
    tmp_path, server, api = box
    run_dir = launch(tmp_path, server, "budget", ttl="120", max_cost=6)       # 6 at 3600/h: a 6 s budget
    dm = read_json(run_dir / "deadman.json")["pid"]
    os.kill(dm, signal.SIGKILL)
    deadline = time.time() + 6.0
    code, doc, _err = reap(tmp_path, server, api)
    if time.time() < deadline:                     # before the deadline nothing stops (on a fast enough box)
        assert doc["decisions"][0]["action"] == "none" and not stops(api), doc
    wait_for(lambda: time.time() > deadline + 0.5, timeout=60)
    code, doc, _err = reap(tmp_path, server, api)
    decision = doc["decisions"][0]
    assert code == 0 and decision["rule"] == "budget" and decision["confirmed"] is True, doc
    assert len(stops(api)) == 1


@pytest.mark.drill("reaper waits out an unreachable box with a fresh lease")
def test_an_unreachable_box_is_told_first_and_stopped_only_after_a_second_ttl(box):
    """sshd unreachable (a broken network path to the same box): with a fresh lease nothing happens; once the
    lease ran out a notification goes out and nothing stops; a later reap, a TTL on, stops it."""
    tmp_path, server, api = box
    launch(tmp_path, server, "cut", ttl="3")
    rgt(tmp_path, server, "status", "gpu-box", "cut")               # the ledger keeps this copy of the lease
    read_at = time.time()
    assert rows(tmp_path, "status")[-1]["lease"]["ttl_s"] == 3.0
    # the same box (ssh -G resolves the same user, host and port) behind a broken network path, with no
    # multiplexing master to reuse
    cut = tmp_path / "cut_ssh_config"
    cut.write_text(Path(server.config).read_text().replace(
        "Host gpu-box\n", "Host gpu-box\n  ProxyCommand /bin/false\n  ControlPath none\n  ControlMaster no\n", 1))
    moved = tmp_path / "moved_ssh_config"     # the alias now leads to another address: not this box, not "down"
    moved.write_text(Path(server.config).read_text().replace("Port %d" % server.port, "Port 1", 1))
    code, doc, _err = reap(tmp_path, server, api, config=moved)
    assert code == 1 and doc["decisions"][0]["action"] == "unknown" and doc["decisions"][0]["reachable"] is None
    assert not stops(api) and not [r for r in rows(tmp_path) if r.get("reachable") is False], doc
    hook, heard, env = webhook_target(tmp_path, "reap-signing-secret-0123")
    try:
        code, doc, _err = reap(tmp_path, server, api, "--notify-config", env["RGT_NOTIFY_CONFIG"], config=cut)
        first = doc["decisions"][0]
        assert first["reachable"] is False and first["action"] == "none" and not stops(api), doc
        # the laptop sees no renewal now: the copy it read runs out 3 s after it was read
        wait_for(lambda: time.time() - read_at > 3.5, timeout=60)
        code, doc, _err = reap(tmp_path, server, api, "--notify-config", env["RGT_NOTIFY_CONFIG"], config=cut)
        told = doc["decisions"][0]
        assert told["action"] == "notify" and told["rule"] == "unreachable" and not stops(api), doc
        assert any(h.get("event") == "lease_expired" for h in heard), (heard, told.get("notified"))
        since = time.time()
        wait_for(lambda: time.time() - since > 3.5, timeout=60)
        code, doc, _err = reap(tmp_path, server, api, "--notify-config", env["RGT_NOTIFY_CONFIG"], config=cut)
        last = doc["decisions"][0]
        assert code == 0 and last["action"] == "stop" and last["confirmed"] is True, doc
        assert len(stops(api)) == 1 and any(h.get("event") == "reaped" for h in heard)
    finally:
        hook.shutdown()
        hook.server_close()


@pytest.mark.drill("reaper stops a finished, gate-passed box once")
def test_a_gate_passed_box_is_stopped_after_the_grace_and_two_reapers_stop_once(box):
    tmp_path, server, api = box
    job = "import os; os.makedirs('out', exist_ok=True); open('out/r.txt', 'w').write('done'); print('step 1/1')"
    launch(tmp_path, server, "done", "--output", "out/*", "--wait", job=job, ttl="60")
    assert rgt(tmp_path, server, "status", "gpu-box", "done").returncode == 0
    pulled = tmp_path / "pulled"
    assert rgt(tmp_path, server, "pull", "gpu-box", "done", "--dest", str(pulled)).returncode == 0
    gate = rgt(tmp_path, server, "gate", "gpu-box", "done", "--dest", str(pulled))
    assert gate.returncode == 0, gate.stdout + gate.stderr
    code, doc, _err = reap(tmp_path, server, api, "--dry-run", "--done-grace-minutes", "0")
    assert code == 10 and doc["decisions"][0]["rule"] == "done" and not stops(api), json.dumps(doc)   # says only
    assert not rows(tmp_path)
    both = [reap(tmp_path, server, api, "--done-grace-minutes", "0", wait=False) for _ in range(2)]
    results = [(p.wait(300), json.loads(p.stdout.read())) for p in both]
    assert [code for code, _doc in results] == [0, 0], results
    actions = sorted(d["decisions"][0]["action"] for _c, d in results)
    assert actions == ["none", "stop"] and len(stops(api)) == 1, results
    listed = rgt(tmp_path, server, "ledger", "--all")                 # the ledger says who stopped it, and why
    assert "REAPED gpu-box" in listed.stdout and "rule done" in listed.stdout, listed.stdout
    doc = json.loads(rgt(tmp_path, server, "--json", "ledger", "--all").stdout)
    assert [(r["action"], r["rule"], r["confirmed"]) for r in doc["reaped"]] == [("stop", "done", True)], doc
    env = dict(os.environ, HOME=str(tmp_path / "laptop-home"), VAST_API_KEY=KEY, RGT_VASTAI_API_URL=api.url)
    bill = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "--ledger", str(tmp_path / "ledger.jsonl"),
                           "billing"], capture_output=True, text=True, env=env, timeout=120)
    line = [l for l in bill.stdout.splitlines() if INSTANCE in l]
    assert line and "REAPED by the reaper (rule done" in line[0], bill.stdout + bill.stderr
    for proc in both:
        proc.stdout.close()
        proc.stderr.close()


def test_reap_help_names_every_rule_and_exit_code():
    out = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "reap", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    for word in ("budget", "done", "unwatched", "unreachable", "--terminate-after-days", "Exit codes", "10"):
        assert word in out


def test_install_prints_each_schedule_without_writing(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path))
    for flag, sign in (("--cron", "*/15 * * * *"), ("--systemd", "OnUnitActiveSec=15min"),
                       ("--launchd", "<key>StartInterval</key><integer>900</integer>")):
        res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "reap", "install", flag, "--print"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode == 0 and sign in res.stdout and "rgt.py" in res.stdout, res.stderr
    assert not any(tmp_path.iterdir())
    res = subprocess.run([sys.executable, str(SCRIPTS / "rgt.py"), "reap", "install"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 2 and "--cron" in res.stderr


def test_install_systemd_writes_the_units_and_uninstall_removes_them(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    base = [sys.executable, str(SCRIPTS / "rgt.py"), "reap"]
    res = subprocess.run(base + ["install", "--systemd", "--every-minutes", "5"], capture_output=True, text=True,
                         timeout=60, env=env)
    unit = tmp_path / "cfg" / "systemd" / "user"
    assert res.returncode == 0 and "OnUnitActiveSec=5min" in (unit / "rgt-reap.timer").read_text(), res.stderr
    assert "reap" in (unit / "rgt-reap.service").read_text()
    res = subprocess.run(base + ["uninstall", "--systemd"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0 and not list(unit.iterdir())


def test_the_ci_schedule_template_runs_the_reaper_with_keys_only_from_secrets():
    import shlex
    import yaml
    doc = yaml.safe_load((SCRIPTS.parent / "examples" / "reaper-schedule.yml").read_text())
    job = doc["jobs"]["reap"]
    assert doc[True]["schedule"][0]["cron"] and doc["concurrency"] == "reaper"   # YAML reads `on:` as True
    step = next(s for s in job["steps"] if s.get("name") == "reap")
    assert all(v.startswith("${{ secrets.") for v in step["env"].values())
    words = shlex.split(step["run"].splitlines()[-1].replace("$notify", ""))
    cut = words.index("reap")
    sys.path.insert(0, str(SCRIPTS))
    import reap
    opts = reap.build_parser().parse_args([w for w in words[2:cut] + words[cut + 1:]])
    assert opts.ledger == "state/ledger.jsonl" and opts.action == "run" and not opts.dry_run


def test_the_opt_in_digest_lists_what_still_bills_once_per_period(box):
    """--digest-days: one still_billing message names the running box and its ungated run; a second reap within
    the period sends none (a ledger row remembers it); without the option nothing is sent; a dry run tells no one."""
    tmp_path, server, api = box
    launch(tmp_path, server, "dig", ttl="60")
    hook, heard, env = webhook_target(tmp_path, "digest-signing-secret-0123")
    try:
        config = env["RGT_NOTIFY_CONFIG"]
        reap(tmp_path, server, api, "--notify-config", config)
        reap(tmp_path, server, api, "--notify-config", config, "--digest-days", "7", "--dry-run")
        assert not [h for h in heard if h.get("event") == "still_billing"], heard
        code, doc, _err = reap(tmp_path, server, api, "--notify-config", config, "--digest-days", "7")
        digest = [d for d in doc["decisions"] if d["action"] == "digest"]
        assert code == 0 and len(digest) == 1 and "runs not gated: dig" in digest[0]["why"], doc
        wait_for(lambda: [h for h in heard if h.get("event") == "still_billing"], what="the digest message")
        code, doc, _err = reap(tmp_path, server, api, "--notify-config", config, "--digest-days", "7")
        assert not [d for d in doc["decisions"] if d["action"] == "digest"], doc
        assert len([h for h in heard if h.get("event") == "still_billing"]) == 1, heard
        assert [r for r in rows(tmp_path) if r.get("notice") == "digest"][0]["boxes"] == 1
        assert not stops(api)
    finally:
        hook.shutdown()
        hook.server_close()
