"""Regression tests for the red-team report (../shared/reports/redteam-2026-12.md), one per finding.

Each test replays the report's attack against the real scripts (real sshd on 127.0.0.1, real rsync and
tar, real processes) and asserts the behaviour the report expects. Findings already covered by a test
elsewhere are listed here with that test's name and not repeated:

  1  test_run_one.py::test_finding_1_sync_waits_until_the_jobs_process_group_is_empty,
     ::test_finding_1_a_source_that_changes_during_its_copy_fails_that_file
  2  test_run_one.py::test_finding_2_dotfiles_in_an_output_glob_are_synced
  3  test_deadman.py::test_finding_3_* (wrapped stops detected, report repro never runs the destroy)
  4  test_run_queue.py::test_finding_4_* (the whole cell tree stops; a live interrupted cell is refused)
  5  test_node_probe.py::test_finding_5_*, test_bad_input.py::test_finding_5_manifest_out_never_replaces_*,
     test_node_utils.py::test_finding_5_fetch_never_replaces_a_symlink_or_a_device, test_core.py::
     test_atomic_write_refuses_a_symlink_and_keeps_it / _a_fifo / _a_device_node
  6  test_launch_race.py::test_finding_6_*
  7  test_deadman.py::test_finding_7_*, test_core.py::test_run_bounded_holds_its_timeout_against_a_detached_child
  8  test_run_status.py::test_finding_8_*
  9  test_node_utils.py::test_finding_9_range_ignoring_server_that_drops_gives_up_then_falls_back
 10  test_deadman.py::test_finding_10_*
 11  test_deadman.py::test_finding_11_*, test_run_status.py::test_finding_11_*, test_core.py::test_pid_reuse_is_not_alive
 12  test_run_one.py::test_finding_12_require_gpu_times_out_a_hung_nvidia_smi
 13  test_deadman.py::test_finding_13_* (over the real sshd)
 14  test_run_one.py::test_finding_14_full_durable_disk_during_the_sync_ends_sync_failed,
     test_run_status.py::test_finding_14_syncing_with_a_dead_supervisor_is_sync_failed
 15  test_run_one.py::test_finding_15_output_matching_only_a_dangling_symlink_or_fifo_is_sync_failed
 20  test_node_utils.py::test_finding_20_no_signed_url_on_disk
 21  test_run_one.py::test_finding_21_non_ascii_run_dir_launches_under_dash_and_the_c_locale
 22  test_run_one.py::test_finding_22_unwritable_durable_results_dir_is_refused_at_launch
 23  (Python 3.6 part) test_bad_input.py::test_finding_23_python36_node_gets_one_line_not_a_traceback

The tests below cover 16-19 and 23-26.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, SCRIPTS, need, path_without, wait_for
from results_fixture import GATE, PULL, RUN, build, flip_byte, make_results, pull, run

pytestmark = pytest.mark.drill("red-team findings stay fixed")   # every test here is a finding


def pids_with(*needles):
    """Live (non-zombie) processes whose command line holds every NEEDLE."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{name}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(n in cmd for n in needles):
            found.append(int(name))
    return found


# ---------------------------------------------------------------- 16: "ALREADY verified" on a corrupted copy

def test_finding_16_already_pulled_copy_is_rehashed(node, tmp_path):
    dest = tmp_path / "pulled"
    assert pull(str(node), dest).returncode == 0
    flip_byte(dest / RUN / "ckpt" / "epoch_1.pt", 77)          # same size, one byte changed locally
    again = pull(str(node), dest)
    claims_verified = again.returncode == 0 and "not re-verified" not in again.stdout
    assert not claims_verified, again.stdout
    assert again.returncode == 3 and "epoch_1.pt" in again.stdout + again.stderr


# ---------------------------------------------------------------- 17: kill -9 of the puller orphans rsync

def test_finding_17_killing_the_puller_kills_its_rsync(sshd_server, tmp_path):
    need("rsync")
    root = make_results(tmp_path / "node" / "results")
    with open(root / "ckpt" / "big.pt", "wb") as fh:           # ~100 s at the rate cap below
        fh.write(b"\x80\x02GOOD" + b"\0" * (48 << 20))
    assert build(root).returncode == 0
    dest = tmp_path / "pulled"
    staging = str(dest / f".staging-{RUN}")
    puller = subprocess.Popen([sys.executable, str(PULL), "--source", f"gpu-box:{root}", "--dest", str(dest),
                               "--rsh", sshd_server.rsh, "--transport", "rsync", "--bwlimit", "500"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: pids_with("rsync", staging), 90), "rsync never started"
        puller.kill()
        puller.wait(30)
        assert wait_for(lambda: not pids_with("rsync", staging), 30), \
            "rsync still writes into staging after its puller was killed"
        second = pull(f"gpu-box:{root}", dest, sshd_server.rsh)
        assert not (second.returncode == 0 and pids_with("rsync", staging))
    finally:
        if puller.poll() is None:
            puller.kill()
            puller.wait(30)
        for pid in pids_with("rsync", staging) + pids_with("rsync", "--server", str(root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---------------------------------------------------------------- 18: the gate loses the node's FAIL reason

class _Recorded(subprocess.Popen):
    started = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Recorded.started.append(self)


class _LateThread(threading.Thread):
    """A thread that starts its work only once every recorded child has been reaped (30 s cap): the
    schedule under which a second reader of the child's stderr loses the race."""

    def run(self):
        end = time.monotonic() + 30
        while time.monotonic() < end and any(p.returncode is None for p in _Recorded.started):
            time.sleep(0.02)
        super().run()


def test_finding_18_the_gate_keeps_the_nodes_fail_reason(node, tmp_path, profile_env, monkeypatch, capsys):
    sys.path.insert(0, str(SCRIPTS))
    import teardown_gate
    dest = tmp_path / "pulled"
    assert pull(str(node), dest).returncode == 0
    (node / "final.json").unlink()                              # the node lost a pulled file after the pull
    monkeypatch.setenv("RGT_PROFILE_INDEX", profile_env["RGT_PROFILE_INDEX"])
    monkeypatch.setattr(_Recorded, "started", [])
    monkeypatch.setattr(teardown_gate.subprocess, "Popen", _Recorded)
    monkeypatch.setattr(teardown_gate.threading, "Thread", _LateThread)
    code = teardown_gate.main(["--pulled", str(dest / RUN), "--profile", "examplecloud", "--source", str(node)])
    out, err = capsys.readouterr()
    assert code == 3, out
    assert "REASON node:" in out and "FAIL unmatched: final.json" in out, out
    assert "closed file" not in err


# ---------------------------------------------------------------- 19: reconcile tolerance with an exponent

def test_finding_19_scientific_notation_gets_its_own_precision(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"lr": 0.3, "loss": 2.5e-05, "wd": 0.00030004, "steps": 1540}))
    (tmp_path / "drift.md").write_text("lr 3e-4 <!-- metric: m.json#lr -->\n"
                                       "loss 9.9e-5 <!-- metric: m.json#loss -->\n")
    drift = run(SCRIPTS / "reconcile.py", tmp_path / "drift.md")
    assert drift.returncode == 1, drift.stdout
    assert drift.stdout.count("DRIFT") == 2, drift.stdout
    (tmp_path / "ok.md").write_text("wd 3.0E-04 <!-- metric: m.json#wd -->\n"
                                    "loss 2.5e-5 <!-- metric: m.json#loss -->\n"
                                    "steps 1.5e3 <!-- metric: m.json#steps -->\n")
    ok = run(SCRIPTS / "reconcile.py", tmp_path / "ok.md", "--json")
    assert ok.returncode == 0, ok.stdout
    tolerances = sorted(r["tolerance"] for r in json.loads(ok.stdout)["results"])
    assert tolerances[0] == pytest.approx(0.5e-6, rel=1e-3) and tolerances[-1] == pytest.approx(50, rel=1e-3)


# ---------------------------------------------------------------- 23: tracebacks and undocumented exit codes

def test_finding_23_install_skill_over_long_project_is_one_line_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPTS / "install_skill.py"), "--dry-run", "--project", "a" * 300],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "--project" in done.stderr


@pytest.mark.parametrize("case", ["empty-source", "load-check-not-executable", "load-check-directory",
                                  "load-check-long-name"])
def test_finding_23_teardown_gate_bad_input_keeps_the_exit_contract(node, tmp_path, profile_env, case):
    dest = tmp_path / "pulled"
    assert pull(str(node), dest).returncode == 0
    script = tmp_path / "check_ckpt.py"
    script.write_text("import sys\n")                           # not executable
    extra = {"empty-source": ["--source", ""],
             "load-check-not-executable": ["--source", node, "--load-check", script],
             "load-check-directory": ["--source", node, "--load-check", tmp_path],
             "load-check-long-name": ["--source", node, "--load-check", tmp_path / ("c" * 300)]}[case]
    done = run(GATE, "--pulled", dest / RUN, "--profile", "examplecloud", *extra, env=profile_env)
    assert done.returncode in (2, 3), (done.returncode, done.stdout, done.stderr)
    assert "unexpected" not in done.stderr and "Traceback" not in done.stderr
    if done.returncode == 3:
        assert "REASON load-check" in done.stdout


# ---------------------------------------------------------------- 24: a node without rsync

def test_finding_24_node_without_rsync_falls_back_to_tar(sshd_server, node, tmp_path):
    need("rsync")
    bare = path_without(tmp_path / "norsync", "rsync")
    wrapper = tmp_path / "norsync_ssh.sh"   # the node's shell sees a PATH without rsync; this side keeps it
    wrapper.write_text('#!/bin/bash\nhost=$1; shift\nexec ssh -F %s "$host" "export PATH=%s; $*"\n'
                       % (sshd_server.config, bare))
    wrapper.chmod(0o755)
    assert subprocess.run([str(wrapper), "gpu-box", "command -v rsync"], capture_output=True,
                          timeout=60).returncode != 0
    done = run(PULL, "--source", f"gpu-box:{node}", "--dest", tmp_path / "pulled", "--rsh", str(wrapper), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["transport"] == "tar" and not [p for p in summary["problems"] if p["code"] == "missing"]
    manifest = json.loads((node / "PULL_MANIFEST.json").read_text())
    for entry in manifest["files"]:
        assert (tmp_path / "pulled" / RUN / entry["path"]).read_bytes() == (node / entry["path"]).read_bytes()


# ---------------------------------------------------------------- 25: the gate trusts a manifest it holds

def test_finding_25_gate_refuses_the_pulls_own_manifest(node, tmp_path, profile_env):
    dest = tmp_path / "pulled"
    assert pull(str(node), dest).returncode == 0
    own = dest / RUN / "PULL_MANIFEST.json"
    done = run(GATE, "--pulled", dest / RUN, "--profile", "examplecloud", "--manifest", own, env=profile_env)
    assert done.returncode == 2 and "PASS" not in done.stdout, done.stdout
    # The only way to a PASS is the node's files re-hashed now: a file the node lost after the pull refuses,
    # though the stored manifest on the node still lists it.
    (node / "final.json").unlink()
    refused = run(GATE, "--pulled", dest / RUN, "--profile", "examplecloud", "--source", node, env=profile_env)
    assert refused.returncode == 3 and "REASON" in refused.stdout, refused.stdout


# ---------------------------------------------------------------- 26: install_skill copying itself

@pytest.mark.parametrize("inside", ["scripts", "references/sub"])
def test_finding_26_install_into_a_carried_folder_is_refused(tmp_path, inside):
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO, checkout, ignore=shutil.ignore_patterns(".git", "tests", "__pycache__", "evals", ".ci"))
    target = checkout / inside
    before = sorted(str(p) for p in checkout.rglob("*"))
    done = subprocess.run([sys.executable, str(checkout / "scripts" / "install_skill.py"), "--target", str(target)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 2, done.stderr[:500]
    assert done.stderr.count("\n") == 1 and len(done.stderr) < 1000
    assert sorted(str(p) for p in checkout.rglob("*")) == before, "the refused install left files behind"


