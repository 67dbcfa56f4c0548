"""Terminate only over an off-box copy (issue 38; ../shared/reports/redteam-2026-12-05-node.md C1).

A destructive stop erases the instance's own disks, so the gate (stop_engine.verify_durable, through
destructive.off_box_copy) passes only when the re-verified durable copy lives on another filesystem that outlives
the instance (a network filesystem, or the persistent mount the profile names, checked by device and mountinfo), or
when the teardown gate recorded a verified pull of those files (RUN_DIR/pulled.json). Otherwise the non-destructive
fallback runs, or nothing does and the record says why; never the terminate. Real dead-men, run in the foreground.
"""
import json
import os
import subprocess

import sys

import pytest

from conftest import NODE, missing, need_root
from test_deadman import (REFUSED, arm_fg, calls_of, destructive, evidence, make_run, make_sync, read, record_pull,
                          stand_in, torch_like)

FILES = {"ckpt/best.pt": torch_like(), "metrics.json": b'{"acc": 0.9}'}


def terminate_args(tmp_path, fallback=True):
    destroy, d_calls = stand_in(tmp_path, "terminate")
    pause, p_calls = stand_in(tmp_path, "pause")
    args = ["--grace-minutes", "0", "--stop-cmd", destroy, "--stop-cmd-destructive", "--allow-destructive"]
    if fallback:
        args += ["--fallback-stop-cmd", pause]
    return args, d_calls, p_calls


def synced_run(tmp_path, results):
    run = make_run(tmp_path, state="succeeded", exit_code=0)
    make_sync(run, results, dict(FILES), run_id="r1")
    return run


def test_finding_node_C1_terminate_over_a_copy_on_the_instance_disk_is_refused_and_the_fallback_runs(tmp_path):
    run = synced_run(tmp_path, tmp_path / "durable" / "results" / "r1")   # generic-ssh's default: under home
    args, d_calls, p_calls = terminate_args(tmp_path)
    res = arm_fg(run, *args)
    assert res.returncode == 0, res.stderr
    fired = read(run, "DEADMAN_FIRED.json")
    assert calls_of(d_calls) == [], "the terminate ran over a copy it erases"
    assert len(calls_of(p_calls)) == 1, "the non-destructive fallback did not run"
    gate = fired["destructive_gate"]
    assert gate["passed"] is False and "would not outlive the instance" in gate["detail"], gate
    assert "re-verified" in gate["detail"] and fired["refused"].startswith(REFUSED), fired


def test_finding_node_C1_without_a_fallback_nothing_runs_and_the_record_says_why(tmp_path):
    run = synced_run(tmp_path, tmp_path / "durable" / "results" / "r1")
    args, d_calls, _p = terminate_args(tmp_path, fallback=False)
    arm_fg(run, *args)
    fired = read(run, "DEADMAN_FIRED.json")
    assert calls_of(d_calls) == [] and fired["ok"] is False, fired
    assert "would not outlive the instance" in fired["destructive_gate"]["detail"]


def test_finding_node_C1_a_verified_pull_of_these_files_lets_the_terminate_run(tmp_path):
    results = tmp_path / "durable" / "results" / "r1"
    run = synced_run(tmp_path, results)
    record_pull(run, results)
    args, d_calls, p_calls = terminate_args(tmp_path)
    assert arm_fg(run, *args).returncode == 0
    fired = read(run, "DEADMAN_FIRED.json")
    assert len(calls_of(d_calls)) == 1 and calls_of(p_calls) == [], fired
    assert fired["destructive_gate"]["passed"] is True and "verified pull" in fired["destructive_gate"]["detail"]


def test_finding_node_C1_a_pull_of_other_files_is_not_an_off_box_copy(tmp_path):
    results = tmp_path / "durable" / "results" / "r1"
    run = synced_run(tmp_path, results)
    (run / "pulled.json").write_text(json.dumps({"files_digest": "0" * 64, "verified_at": "x"}))
    args, d_calls, p_calls = terminate_args(tmp_path)
    arm_fg(run, *args)
    assert calls_of(d_calls) == [] and len(calls_of(p_calls)) == 1
    assert "other files" in read(run, "DEADMAN_FIRED.json")["destructive_gate"]["detail"]


def test_finding_node_C1_the_check_reads_device_and_mount_type(tmp_path):
    """off_box_copy as a table of mountinfo facts: the row must be the file's own device; a network type passes, a
    local one only when the profile names its mount; the root disk never does."""
    st = os.stat(str(tmp_path))
    ident = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))

    def check(point, dev, fstype, persistent=(), root="/proc"):   # /proc: a "root" on another device
        table = [("/", "0:1", "ext4", "/dev/vda"), (point, dev, fstype, "srv:/export")]
        return destructive.off_box_copy(str(tmp_path), table=table, persistent=persistent, root=root)[0]
    assert check(str(tmp_path), ident, "nfs4") is True
    assert check(str(tmp_path), ident, "ext4") is False
    assert check(str(tmp_path), ident, "ext4", persistent=(str(tmp_path.parent) + "/<name>",)) is True
    assert check(str(tmp_path), "9:9", "nfs4") is False, "a row for another device must not vouch for this file"
    assert check(str(tmp_path), ident, "nfs4", root=str(tmp_path)) is False, "the root disk is never off the box"
    text = "36 1 %s / /mnt/with\\040space rw - nfs4 srv:/x rw\n" % ident
    assert destructive.mounts(text) == [("/mnt/with space", ident, "nfs4", "srv:/x")]


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs mounted at TMP/lambda-nfs/fs1: "another filesystem" (root only); unmounted afterwards."""
    need_root("mounting a tmpfs as the persistent filesystem")
    point = tmp_path / "lambda-nfs" / "fs1"
    point.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(point)], capture_output=True,
                         text=True, timeout=30)
    if res.returncode != 0:
        missing("mounting a tmpfs as the persistent filesystem failed: %s" % res.stderr.strip())
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


@pytest.mark.parametrize("named", [True, False])
def test_finding_node_C1_another_filesystem_passes_only_when_the_profile_names_it(tmp_path, tmpfs, named):
    results = tmpfs / "results" / "r1"
    run = synced_run(tmp_path, results)
    storage = [{"tier": "instance disk", "path": "/home/ubuntu", "survives_destroy": False}]
    if named:   # like Lambda's /lambda/nfs/<name>
        storage.append({"tier": "filesystem (persistent)", "path": str(tmpfs.parent / "<name>"),
                        "survives_destroy": True})
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"generated_by": "test", "schema_version": 1, "profiles": {"box": {
        "platform": "box", "storage": storage, "defaults": {
            "DATA_DIR": None, "DURABLE_DIR": None, "HF_HOME": None, "PROXY_HOOK": None, "DISK_FLOOR_GB": 0,
            "METER_STOP_CMD": None, "METER_STOP_DESTRUCTIVE": False, "METER_STOP_NEEDS": None}}}}))
    args, d_calls, p_calls = terminate_args(tmp_path)
    env = dict(os.environ, RGT_PROFILE_INDEX=str(index))
    assert arm_fg(run, "--profile", "box", *args, env=env).returncode == 0
    gate = read(run, "DEADMAN_FIRED.json")["destructive_gate"]
    if named:
        assert len(calls_of(d_calls)) == 1 and gate["passed"] is True, gate
        assert "persistent storage the profile names" in gate["detail"], gate
    else:
        assert calls_of(d_calls) == [] and len(calls_of(p_calls)) == 1, gate
        assert "tmpfs" in gate["detail"] and "a disk of this instance" in gate["detail"], gate
    assert evidence.MANIFEST_NAME in os.listdir(str(results))


def test_finding_node_C1_a_gate_pass_records_the_pull_that_the_node_accepts(box, tmp_path, profile_env):
    """pull_verified.py then teardown_gate.py on a finished run: the pass leaves RUN_DIR/pulled.json, and the
    node's destructive gate then accepts that run's durable copy (and refuses again once the files change)."""
    sys.path.insert(0, str(NODE))
    import stop_engine
    from test_own_evidence import gate_lines, launch, trainer
    launch(box, "done", trainer(box, "done", ckpt="ckpt/done.txt"), "--output", "ckpt/*", "--wait")
    run = box.run_dir("done")
    before = stop_engine.verify_durable(str(run))
    assert before[0] is False and "would not outlive the instance" in before[1], before
    out = gate_lines(box, "done", tmp_path / "pulled", profile_env)
    assert "pull recorded on the node" in out, out
    assert read(run, "pulled.json")["run_id"] == "done"
    after = stop_engine.verify_durable(str(run))
    assert after[0] is True and "verified pull" in after[1], after
