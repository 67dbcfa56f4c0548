"""Results outlive the node: manifest builder, verified pull, teardown gate.

Remote flows run against a real sshd on 127.0.0.1 (tests/sshd_fixture.py) with real rsync; the
property tests use a local-path source so they stay fast. Every failure drill asserts its own
reason line and that nothing was promoted.
"""
import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from conftest import NODE, SCRIPTS, missing, need, need_module, path_without
from results_fixture import (BUILD, GATE, HEAD, PROFILE, PULL, ROSTER, RUN, build, flip_byte, make_results,  # noqa: F401
                            pull, run)

sys.path.insert(0, str(SCRIPTS)); sys.path.insert(0, str(NODE))
import evidence  # noqa: E402
import pull_verified  # noqa: E402  (pure helpers, tested in-process)

SCHEMA = NODE / "manifest.schema.json"

# ---------------------------------------------------------------- helpers

def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def fail_codes(stdout: str) -> set:
    return set(re.findall(r"^FAIL ([a-z0-9-]+):", stdout, re.M))


def assert_not_promoted(dest: Path, run_id: str = RUN):
    assert not (dest / run_id).exists(), "a failed pull must not be promoted"


@pytest.fixture(scope="module")
def schema_validator():
    jsonschema = need_module("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# ---------------------------------------------------------------- manifest builder

def test_manifest_follows_contract_and_schema(tmp_path, schema_validator):
    root = make_results(tmp_path / "r")
    done = build(root, ROSTER, RUN, "--json", "--jobs", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    manifest_path = root / "PULL_MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    schema_validator.validate(manifest)
    assert summary["manifest_sha256"] == sha(manifest_path)
    assert manifest["schema"] == "rgt-pull-manifest/1" and manifest["run_id"] == RUN
    assert manifest["roster"] == list(ROSTER)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", manifest["created_at"])
    paths = [e["path"] for e in manifest["files"]]
    assert paths == sorted(["ckpt/epoch_1.pt", "ckpt/sub/epoch_2.pt", "metrics.jsonl", "final.json"])
    for entry in manifest["files"]:
        assert entry["size"] == (root / entry["path"]).stat().st_size
        assert entry["sha256"] == sha(root / entry["path"])
    assert manifest["file_count"] == 4
    assert manifest["total_bytes"] == sum(e["size"] for e in manifest["files"])
    # A second build with a catch-all roster must never list the manifest itself.
    again = build(root, ("**",))
    assert again.returncode == 0, again.stdout + again.stderr
    listed = [e["path"] for e in json.loads(manifest_path.read_text())["files"]]
    assert "PULL_MANIFEST.json" not in listed and "logs/train.log" in listed
    assert not list(root.glob(".PULL_MANIFEST.json.*")), "temp file left behind"


def test_schema_rejects_unsafe_paths_and_shapes(schema_validator):
    good = {"schema": "rgt-pull-manifest/1", "run_id": "r1", "created_at": "2026-12-02T13:00:00Z",
            "roster": ["**"], "file_count": 1, "total_bytes": 1,
            "files": [{"path": "ok/file.pt", "size": 1, "sha256": "a" * 64}]}
    assert schema_validator.is_valid(good)
    for bad_path in ("../x", "/etc/passwd", "a/../b", "a\\b", "a//b", "./a", "a/", "PULL_VERIFIED.json",
                     "x/.rsync-partial/y", "a\nb", ""):
        case = json.loads(json.dumps(good))
        case["files"][0]["path"] = bad_path
        assert not schema_validator.is_valid(case), bad_path
    for key, value in (("run_id", "../up"), ("files", []), ("roster", []), ("schema", "other/1")):
        case = dict(good, **{key: value})
        assert not schema_validator.is_valid(case), key


def test_unmatched_roster_entries_are_named_and_nothing_written(tmp_path):
    root = make_results(tmp_path / "r")
    done = build(root, ("ckpt/**", "nope/*.pt", "missing.json"))
    assert done.returncode == 1
    assert "FAIL unmatched: nope/*.pt:" in done.stdout and "FAIL unmatched: missing.json:" in done.stdout
    assert "ckpt/**" not in done.stdout
    assert not (root / "PULL_MANIFEST.json").exists()


@pytest.mark.drill("empty roster fails")
def test_empty_roster_or_empty_result_is_a_failure(tmp_path):
    empty = tmp_path / "empty"
    (empty / "ckpt").mkdir(parents=True)
    no_roster = run(BUILD, "--root", empty, "--run-id", RUN)
    assert no_roster.returncode == 2 and "--roster" in no_roster.stderr
    nothing = build(empty, ("**",))
    assert nothing.returncode == 1 and "FAIL unmatched: **" in nothing.stdout
    assert not (empty / "PULL_MANIFEST.json").exists()
    for bad in ("../outside", "/abs/path"):
        refused = build(empty, (bad,))
        assert refused.returncode == 2 and "roster entry" in refused.stderr


@pytest.mark.drill("damaged evidence fails with a reason")
def test_symlink_escape_and_special_files_are_rejected(tmp_path):
    root = make_results(tmp_path / "r")
    secret = tmp_path / "outside.txt"
    secret.write_text("not yours")
    os.symlink(secret, root / "ckpt" / "sneaky.pt")
    os.mkfifo(root / "ckpt" / "pipe")
    done = build(root)
    assert done.returncode == 1
    assert re.search(r"^FAIL escape: ckpt/sneaky\.pt: symlink resolves outside the root", done.stdout, re.M)
    assert re.search(r"^FAIL special: ckpt/pipe: fifo", done.stdout, re.M)
    assert not (root / "PULL_MANIFEST.json").exists()
    # Outside the roster the same entries do not matter.
    assert build(root, ("metrics.jsonl",)).returncode == 0


def test_symlink_inside_root_is_hashed_as_content_and_pulled_as_file(tmp_path):
    need("rsync")
    root = make_results(tmp_path / "r")
    os.symlink("ckpt/epoch_1.pt", root / "best.pt")
    done = build(root, ROSTER + ("best.pt",))
    assert done.returncode == 0, done.stdout
    entries = {e["path"]: e for e in json.loads((root / "PULL_MANIFEST.json").read_text())["files"]}
    assert entries["best.pt"]["sha256"] == entries["ckpt/epoch_1.pt"]["sha256"]
    pulled = pull(str(root), tmp_path / "dest")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    copy = tmp_path / "dest" / RUN / "best.pt"
    assert copy.is_file() and not copy.is_symlink()
    assert copy.read_bytes() == (root / "ckpt" / "epoch_1.pt").read_bytes()


# ---------------------------------------------------------------- pull over ssh

def test_full_pull_over_ssh(sshd_server, node, tmp_path):
    dest = tmp_path / "dest"
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["status"] == "promoted" and summary["ok"] is True
    final = dest / RUN
    verified = json.loads((final / "PULL_VERIFIED.json").read_text())
    assert verified["run_id"] == RUN
    assert verified["manifest_sha256"] == sha(node / "PULL_MANIFEST.json")
    assert (final / "PULL_MANIFEST.json").read_bytes() == (node / "PULL_MANIFEST.json").read_bytes()
    manifest = json.loads((node / "PULL_MANIFEST.json").read_text())
    assert verified["file_count"] == manifest["file_count"] == 4
    assert verified["total_bytes"] == manifest["total_bytes"]
    assert verified["source"] == f"gpu-box:{node}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", verified["verified_at"])
    for entry in manifest["files"]:
        assert (final / entry["path"]).read_bytes() == (node / entry["path"]).read_bytes()
    pulled = {p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file()}
    assert pulled == {e["path"] for e in manifest["files"]} | {"PULL_MANIFEST.json", "PULL_VERIFIED.json"}
    assert not (dest / f".staging-{RUN}").exists()

    # Re-running is idempotent ...
    again = pull(f"gpu-box:{node}", dest, sshd_server.rsh)
    assert again.returncode == 0 and "ALREADY" in again.stdout
    # ... but a different pull of the same run id is never written over the verified one.
    (node / "final.json").write_text(json.dumps({"steps_done": 60}))
    assert build(node).returncode == 0
    clash = pull(f"gpu-box:{node}", dest, sshd_server.rsh)
    assert clash.returncode == 3 and "refusing to overwrite" in clash.stdout
    assert json.loads((final / "final.json").read_text())["steps_done"] == 50


@pytest.mark.drill("interrupted pull resumes")
def test_interrupted_pull_resumes_and_reuses_partial_data(sshd_server, node, tmp_path):
    size = 6 * 1024 * 1024
    (node / "ckpt" / "big.pt").write_bytes(HEAD + os.urandom(size))
    assert build(node).returncode == 0
    dest = tmp_path / "dest"
    staging = dest / f".staging-{RUN}"

    def start_and_interrupt(sig, bwlimit, threshold):
        proc = subprocess.Popen([sys.executable, str(PULL), "--source", f"gpu-box:{node}", "--dest", str(dest),
                                 "--rsh", sshd_server.rsh, "--bwlimit", str(bwlimit)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        deadline = time.monotonic() + 20
        seen = 0
        while time.monotonic() < deadline and proc.poll() is None:
            temps = glob.glob(str(staging / "ckpt" / ".big.pt.*"))
            seen = max([os.path.getsize(t) for t in temps] + [0])
            if seen >= threshold:
                break
            time.sleep(0.05)
        assert proc.poll() is None and seen >= threshold, "transfer finished or never started; cannot interrupt"
        os.killpg(proc.pid, sig)  # what Ctrl-C (or a crash) does to the whole foreground group
        out, _ = proc.communicate(timeout=30)
        return proc.returncode, out

    rc, out = start_and_interrupt(signal.SIGINT, 1024, 1024 * 1024)
    assert rc == 130 and "INTERRUPTED" in out, out
    partial = staging / "ckpt" / ".rsync-partial" / "big.pt"
    assert partial.is_file() and 0 < partial.stat().st_size < size
    kept = partial.stat().st_size
    assert_not_promoted(dest)

    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stats = json.loads(done.stdout)["rsync"]
    # The kept partial was the basis of the second transfer: its blocks matched instead of being resent.
    assert stats["matched_bytes"] >= kept - 64 * 1024, stats
    total = json.loads((node / "PULL_MANIFEST.json").read_text())["total_bytes"]
    assert stats["literal_bytes"] <= total - kept + 64 * 1024, stats  # everything else, not the kept part
    assert (dest / RUN / "ckpt" / "big.pt").read_bytes() == (node / "ckpt" / "big.pt").read_bytes()
    assert not partial.exists() and not (dest / RUN / "ckpt" / ".rsync-partial").exists()


@pytest.mark.drill("interrupted pull resumes")
def test_hard_kill_leftover_is_adopted_on_resume(sshd_server, node, tmp_path):
    size = 4 * 1024 * 1024
    (node / "ckpt" / "big.pt").write_bytes(HEAD + os.urandom(size))
    assert build(node).returncode == 0
    dest = tmp_path / "dest"
    staging = dest / f".staging-{RUN}"
    proc = subprocess.Popen([sys.executable, str(PULL), "--source", f"gpu-box:{node}", "--dest", str(dest),
                             "--rsh", sshd_server.rsh, "--bwlimit", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        temps = glob.glob(str(staging / "ckpt" / ".big.pt.*"))
        if temps and os.path.getsize(temps[0]) >= 1024 * 1024:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no cleanup at all: rsync's temp file stays behind
    proc.wait(10)
    assert glob.glob(str(staging / "ckpt" / ".big.pt.*")), "expected rsync's temp file after kill -9"
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stats = json.loads(done.stdout)["rsync"]
    assert stats["matched_bytes"] > 0 and stats["literal_bytes"] < size, stats
    assert sha(dest / RUN / "ckpt" / "big.pt") == sha(node / "ckpt" / "big.pt")


@pytest.mark.parametrize("fault, code, path, words", [
    ("flip", "sha256", "ckpt/epoch_1.pt", "content differs from the manifest"),
    ("truncate", "truncated", "ckpt/sub/epoch_2.pt", "of 90006 bytes"),
    ("delete", "missing", "metrics.jsonl", "in the manifest but not here"),
])
@pytest.mark.drill("damaged evidence fails with a reason")
def test_node_side_damage_fails_with_its_own_reason(sshd_server, node, tmp_path, fault, code, path, words):
    target = node / path
    if fault == "flip":
        flip_byte(target, 70_000)
    elif fault == "truncate":
        with open(target, "r+b") as handle:
            handle.truncate(1000)
    else:
        target.unlink()
    dest = tmp_path / "dest"
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh)
    assert done.returncode == 1
    assert re.search(rf"^FAIL {code}: {re.escape(path)}: .*{re.escape(words)}", done.stdout, re.M), done.stdout
    assert fail_codes(done.stdout) - {"rsync"} == {code}, done.stdout
    assert "NOT PROMOTED" in done.stdout
    assert_not_promoted(dest)
    assert (dest / f".staging-{RUN}").is_dir(), "staging must be kept for the next attempt"


@pytest.mark.drill("damaged evidence fails with a reason")
def test_extra_file_in_staging_fails_then_clean_rerun_passes(sshd_server, node, tmp_path):
    dest = tmp_path / "dest"
    staging = dest / f".staging-{RUN}"
    (staging / "ckpt").mkdir(parents=True)
    (staging / "ckpt" / "stale_epoch_0.pt").write_bytes(b"left over from an earlier roster")
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh)
    assert done.returncode == 1
    assert re.search(r"^FAIL extra: ckpt/stale_epoch_0\.pt: present but not in the manifest", done.stdout, re.M)
    assert fail_codes(done.stdout) == {"extra"}
    assert_not_promoted(dest)
    fresh = pull(f"gpu-box:{node}", dest, sshd_server.rsh, "--fresh")
    assert fresh.returncode == 0, fresh.stdout
    assert not (dest / RUN / "ckpt" / "stale_epoch_0.pt").exists()


def test_remote_root_forms_reach_rsync_and_ssh_correctly():
    argv = pull_verified.rsync_argv("rsync", "gpu-box", "~/runs/a b", "/d/st", "/d/l", "ssh -F c", None, False)
    assert argv[-2:] == ["gpu-box:runs/a b/", "/d/st/"]  # rsync --files-from would take "~/" literally
    assert pull_verified.rsync_argv("rsync", "gpu-box", "~", "/d", "/l", None, 10, False)[-2] == "gpu-box:./"
    assert pull_verified.remote_quote("~/runs/a b") == "~/'runs/a b'"  # ssh side: ~ still expands
    assert pull_verified.parse_source("user@gpu-box:/w/r") == ("user@gpu-box", "/w/r")
    assert pull_verified.parse_source("./local:dir/x") == (None, "./local:dir/x")
    for bad in ("gpu-box::module/x", ":/x", "gpu-box:", "-oProxyCommand=x:/y"):
        with pytest.raises(pull_verified.UsageError):
            pull_verified.parse_source(bad)


@pytest.mark.parametrize("bad_path, words", [
    ("../escape.pt", "'..' component"),
    ("ckpt/../../../etc/cron.d/x", "'..' component"),
    ("/etc/passwd", "absolute path"),
    ("ckpt\\epoch_1.pt", "backslash"),
    ("ckpt/a\u0000b", "NUL byte"),
    ("PULL_VERIFIED.json", "reserved name"),
])
@pytest.mark.drill("damaged evidence fails with a reason")
def test_unsafe_manifest_paths_rejected_before_pulling(sshd_server, node, tmp_path, bad_path, words):
    manifest = json.loads((node / "PULL_MANIFEST.json").read_text())
    manifest["files"][0]["path"] = bad_path
    (node / "PULL_MANIFEST.json").write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh)
    assert done.returncode == 1
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("FAIL unsafe-path:"))
    assert words in line, done.stdout
    assert "NOTHING PULLED" in done.stdout
    assert not dest.exists(), "nothing may be created before the manifest is known to be safe"


def test_duplicate_entries_rejected(node, tmp_path):
    manifest = json.loads((node / "PULL_MANIFEST.json").read_text())
    manifest["files"].append(dict(manifest["files"][0]))
    manifest["file_count"] += 1
    (node / "PULL_MANIFEST.json").write_text(json.dumps(manifest))
    done = pull(str(node), tmp_path / "dest")
    assert done.returncode == 1 and "FAIL duplicate: ckpt/epoch_1.pt: listed twice" in done.stdout
    assert not (tmp_path / "dest").exists()


# ---------------------------------------------------------------- teardown gate

def gate(pulled, profile_env, *args):
    return run(GATE, "--pulled", pulled, "--profile", "examplecloud", *args, env=profile_env)


def test_gate_passes_fresh_pull_and_prints_meter_stop(sshd_server, node, tmp_path, profile_env):
    dest = tmp_path / "dest"
    assert pull(f"gpu-box:{node}", dest, sshd_server.rsh).returncode == 0
    done = gate(dest / RUN, profile_env, "--source", f"gpu-box:{node}", "--rsh", sshd_server.rsh)
    assert done.returncode == 0, done.stdout + done.stderr
    total = json.loads((node / "PULL_MANIFEST.json").read_text())["total_bytes"]
    assert f"PASS teardown gate for run {RUN}: 4 files, {total} bytes" in done.stdout
    assert "re-hashed on the node now" in done.stdout
    assert PROFILE["billing"]["meter_stop_action"] in done.stdout
    assert PROFILE["billing"]["meter_stop_destroys"] in done.stdout
    assert PROFILE["billing"]["keeps_billing_when_paused"] in done.stdout
    assert "network volume" in done.stdout
    assert "did NOT" in done.stdout
    as_json = json.loads(gate(dest / RUN, profile_env, "--source", f"gpu-box:{node}", "--rsh", sshd_server.rsh,
                              "--json").stdout)
    assert as_json["verdict"] == "PASS" and as_json["teardown_performed"] is False


def test_gate_refuses_stale_pull(sshd_server, node, tmp_path, profile_env):
    dest = tmp_path / "dest"
    assert pull(f"gpu-box:{node}", dest, sshd_server.rsh).returncode == 0
    (node / "final.json").write_text(json.dumps({"steps_done": 80, "loss": 0.01}))  # job wrote more after the pull
    (node / "ckpt" / "epoch_3.pt").write_bytes(HEAD + b" new checkpoint")
    source = ("--source", f"gpu-box:{node}", "--rsh", sshd_server.rsh)
    done = gate(dest / RUN, profile_env, *source)
    assert done.returncode == 3, done.stdout
    assert re.search(r"^REASON stale: final\.json: changed on the node since the pull", done.stdout, re.M)
    assert re.search(r"^REASON stale: ckpt/epoch_3\.pt: on the node but not in the pull", done.stdout, re.M)
    assert "did NOT" in done.stdout and PROFILE["billing"]["meter_stop_action"] not in done.stdout
    # Rebuilding the stored manifest changes nothing: the gate never trusts a stored or local manifest.
    assert build(node).returncode == 0
    again = gate(dest / RUN, profile_env, *source)
    assert again.returncode == 3 and "REASON stale: final.json" in again.stdout
    for removed in ("--fetch-only", "--manifest"):
        refused = gate(dest / RUN, profile_env, *source, removed, *(["x"] if removed == "--manifest" else []))
        assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr


def test_gate_refuses_damaged_local_copy(node, tmp_path, profile_env):
    dest = tmp_path / "dest"
    assert pull(str(node), dest).returncode == 0
    flip_byte(dest / RUN / "ckpt" / "sub" / "epoch_2.pt", 12)
    done = gate(dest / RUN, profile_env, "--source", str(node))
    assert done.returncode == 3
    assert re.search(r"^REASON sha256: ckpt/sub/epoch_2\.pt: local copy: content differs", done.stdout, re.M)


def test_gate_load_checks(node, tmp_path, profile_env):
    dest = tmp_path / "dest"
    assert pull(str(node), dest).returncode == 0
    checker = tmp_path / "check_ckpt.py"
    checker.write_text("import sys\n"
                       "data = open(sys.argv[1], 'rb').read(6)\n"
                       "sys.exit(0 if data == b'\\x80\\x02GOOD' else 'bad header: %r' % data)\n")
    manifest = ("--source", str(node))
    ok = gate(dest / RUN, profile_env, *manifest, "--load-check", f"{sys.executable} {checker} {{}}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 load-check(s) passed" in ok.stdout
    failing = tmp_path / "fail_load.py"
    failing.write_text("import sys\nsys.exit('cannot unpickle ' + sys.argv[1].rsplit('/', 1)[-1])\n")
    bad = gate(dest / RUN, profile_env, *manifest, "--load-check", f"{sys.executable} {failing} {{}}")
    assert bad.returncode == 3
    assert re.search(r"^REASON load-check: ckpt/epoch_1\.pt: .* exited 1: cannot unpickle epoch_1\.pt",
                     bad.stdout, re.M), bad.stdout
    nothing = gate(dest / RUN, profile_env, *manifest, "--load-check", f"{sys.executable} {checker} {{}}",
                   "--load-glob", "**/*.safetensors")
    assert nothing.returncode == 3 and "would check nothing" in nothing.stdout


def test_gate_reads_the_generated_profile_index(node, tmp_path):
    index = SCRIPTS.parent / "profiles" / "index.json"
    if not index.is_file():
        missing("profiles/index.json not generated yet (tools/build_profile_index.py)")
    local = json.loads(index.read_text())["profiles"]["local"]
    assert pull(str(node), tmp_path / "dest").returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "RGT_PROFILE_INDEX"}  # default lookup next to scripts/
    done = run(GATE, "--pulled", tmp_path / "dest" / RUN, "--source", str(node), "--profile", "local", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert local["billing"]["meter_stop_action"] in done.stdout and "did NOT" in done.stdout


def test_gate_refuses_without_verified_pull_and_rejects_unknown_profile(node, tmp_path, profile_env):
    bare = tmp_path / "copied-by-hand" / RUN
    bare.mkdir(parents=True)
    done = gate(bare, profile_env, "--source", str(node))
    assert done.returncode == 3 and "not a verified pull" in done.stdout
    unknown = run(GATE, "--pulled", bare, "--profile", "no-such-cloud", "--source", str(node),
                  env=profile_env)
    assert unknown.returncode == 2 and "unknown --profile" in unknown.stderr and "Traceback" not in unknown.stderr


# ---------------------------------------------------------------- properties

from hypothesis import given, settings, HealthCheck, strategies as st  # noqa: E402

FILES = st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=3)  # .dat: no format check, any bytes are a valid file


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contents=FILES, data=st.data())
def test_any_single_byte_change_on_the_node_is_caught(contents, data):
    need("rsync")
    index = data.draw(st.integers(0, len(contents) - 1), label="file")
    offset = data.draw(st.integers(0, len(contents[index]) - 1), label="offset")
    mask = data.draw(st.integers(1, 255), label="xor")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "node"
        (root / "out").mkdir(parents=True)
        for i, blob in enumerate(contents):
            (root / "out" / f"f{i}.dat").write_bytes(blob)
        assert build(root, ("out",)).returncode == 0
        flip_byte(root / "out" / f"f{index}.dat", offset, mask)
        done = pull(str(root), Path(tmp) / "dest")
        assert done.returncode == 1
        assert f"FAIL sha256: out/f{index}.dat:" in done.stdout
        assert fail_codes(done.stdout) == {"sha256"}
        assert not (Path(tmp) / "dest" / RUN).exists()


@settings(max_examples=60, deadline=None)
@given(contents=FILES, data=st.data())
def test_verify_tree_catches_any_single_byte_change(contents, data):
    index = data.draw(st.integers(0, len(contents) - 1))
    offset = data.draw(st.integers(0, len(contents[index]) - 1))
    mask = data.draw(st.integers(1, 255))
    with tempfile.TemporaryDirectory() as tmp:
        entries = []
        for i, blob in enumerate(contents):
            Path(tmp, f"f{i}.bin").write_bytes(blob)
            entries.append({"path": f"f{i}.bin", "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()})
        manifest = {"files": entries}
        assert pull_verified.verify_tree(tmp, manifest, jobs=2)[0] == []
        flip_byte(Path(tmp, f"f{index}.bin"), offset, mask)
        problems, _ = pull_verified.verify_tree(tmp, manifest, jobs=2)
        assert [(p["code"], p["path"]) for p in problems] == [("sha256", f"f{index}.bin")]


SEGMENTS = st.sampled_from(["ckpt", "a.pt", "..", ".", "", "x\\y", "n\nl", "~", ".rsync-partial",
                            "PULL_MANIFEST.json", "..hidden", "é"])


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(SEGMENTS, min_size=1, max_size=4), absolute=st.booleans())
def test_puller_path_rules_agree_with_published_schema(parts, absolute, schema_validator):
    path = ("/" if absolute else "") + "/".join(parts)
    manifest = {"schema": "rgt-pull-manifest/1", "run_id": "r", "created_at": "2026-12-02T13:00:00Z",
                "roster": ["**"], "file_count": 1, "total_bytes": 0,
                "files": [{"path": path, "size": 0, "sha256": "0" * 64}]}
    assert schema_validator.is_valid(manifest) == (evidence.path_problem(path) is None), repr(path)


# ---------------------------------------------------------------- no rsync: the tar stream

def same_tree(node: Path, pulled: Path):
    manifest = json.loads((node / "PULL_MANIFEST.json").read_text())
    for entry in manifest["files"]:
        assert (pulled / entry["path"]).read_bytes() == (node / entry["path"]).read_bytes(), entry["path"]
    return manifest


def test_tar_transport_over_ssh_pulls_and_verifies(sshd_server, node, tmp_path):
    done = pull(f"gpu-box:{node}", tmp_path / "dest", sshd_server.rsh, "--transport", "tar", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["transport"] == "tar" and "rsync" not in summary
    manifest = same_tree(node, tmp_path / "dest" / RUN)
    assert summary["transfer"]["files_transferred"] == manifest["file_count"]
    assert (tmp_path / "dest" / RUN / "PULL_VERIFIED.json").exists()


@pytest.mark.drill("interrupted pull resumes")
def test_tar_transport_resumes_per_file(sshd_server, node, tmp_path):
    dest = tmp_path / "dest"
    staging = dest / f".staging-{RUN}"
    (staging / "ckpt").mkdir(parents=True)
    shutil.copyfile(node / "ckpt" / "epoch_1.pt", staging / "ckpt" / "epoch_1.pt")   # verified already
    (staging / "final.json").write_bytes(b'{"steps_done": 4}')                          # wrong: sent again
    done = pull(f"gpu-box:{node}", dest, sshd_server.rsh, "--transport", "tar", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    transfer = json.loads(done.stdout)["transfer"]
    manifest = same_tree(node, dest / RUN)
    assert transfer["files_reused"] == 1 and transfer["files_transferred"] == manifest["file_count"] - 1
    assert transfer["matched_bytes"] == (node / "ckpt" / "epoch_1.pt").stat().st_size


def test_tar_transport_reports_node_side_damage(sshd_server, node, tmp_path):
    target = node / "ckpt" / "epoch_1.pt"
    flip_byte(target, 70_000)
    done = pull(f"gpu-box:{node}", tmp_path / "dest", sshd_server.rsh, "--transport", "tar")
    assert done.returncode == 1
    assert re.search(r"^FAIL sha256: ckpt/epoch_1\.pt: content differs from the manifest", done.stdout, re.M)
    assert not (tmp_path / "dest" / RUN).exists()


def test_without_rsync_auto_picks_tar_locally_and_over_ssh(sshd_server, node, tmp_path):
    env = dict(os.environ, PATH=path_without(tmp_path / "bin", "rsync"))
    assert subprocess.run(["sh", "-c", "command -v rsync"], env=env, capture_output=True).returncode != 0
    for name, source, extra in (("local", str(node), ()), ("ssh", f"gpu-box:{node}", ("--rsh", sshd_server.rsh))):
        done = run(PULL, "--source", source, "--dest", tmp_path / name, *extra, "--json", env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["transport"] == "tar"
        same_tree(node, tmp_path / name / RUN)
    forced = run(PULL, "--source", str(node), "--dest", tmp_path / "forced", "--transport", "rsync", env=env)
    assert forced.returncode == 2 and "rsync is not installed" in forced.stderr


def test_a_node_without_tar_sends_the_stream_with_python3(bare_node_sshd, node, tmp_path):
    """A node with neither rsync nor tar: auto picks the tar stream and python3 makes it; a symlink inside
    the root arrives as its content; a re-run after a cut resends only the files staging lacks."""
    os.symlink("ckpt/epoch_1.pt", node / "best.pt")
    assert build(node, ROSTER + ("best.pt",)).returncode == 0
    dest = tmp_path / "dest"
    staging = dest / f".staging-{RUN}"
    (staging / "ckpt").mkdir(parents=True)
    shutil.copyfile(node / "ckpt" / "epoch_1.pt", staging / "ckpt" / "epoch_1.pt")   # verified already
    done = pull(f"gpu-box:{node}", dest, bare_node_sshd.rsh, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["transport"] == "tar" and summary["transfer"]["packer"] == "python3"
    manifest = same_tree(node, dest / RUN)
    assert summary["transfer"]["files_reused"] == 1
    assert summary["transfer"]["files_transferred"] == manifest["file_count"] - 1
    assert (dest / RUN / "best.pt").is_file() and not (dest / RUN / "best.pt").is_symlink()


def test_a_node_without_tar_still_reports_damage_by_file(bare_node_sshd, node, tmp_path):
    flip_byte(node / "ckpt" / "epoch_1.pt", 70_000)
    (node / "final.json").unlink()
    done = pull(f"gpu-box:{node}", tmp_path / "dest", bare_node_sshd.rsh)
    assert done.returncode == 1
    assert re.search(r"^FAIL sha256: ckpt/epoch_1\.pt: content differs from the manifest", done.stdout, re.M)
    assert re.search(r"^FAIL missing: final\.json", done.stdout, re.M), done.stdout
    assert "final.json" in done.stdout and not (tmp_path / "dest" / RUN).exists()


def test_a_laptop_without_tar_packs_a_local_source_with_python(node, tmp_path):
    env = dict(os.environ, PATH=path_without(tmp_path / "bin", "rsync", "tar"))
    done = run(PULL, "--source", node, "--dest", tmp_path / "dest", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["transfer"]["packer"] == "python3"
    same_tree(node, tmp_path / "dest" / RUN)


def test_tar_stream_with_an_unlisted_member_is_refused(tmp_path):
    """A stream that carries a file the manifest does not list is cut off; nothing outside staging appears."""
    root = make_results(tmp_path / "r")
    assert build(root).returncode == 0
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    evil = tmp_path / "evil"
    (evil / "x").mkdir(parents=True)
    (evil / "x" / "payload").write_text("not listed")
    # a "tar" that ignores the list and sends ../x/payload instead
    (fake_bin / "tar").write_text("#!/bin/sh\ncat >/dev/null\ncd %s && exec %s -cf - ../evil/x/payload\n"
                                  % (shlex.quote(str(tmp_path / "r")), shutil.which("tar")))
    (fake_bin / "tar").chmod(0o755)
    env = dict(os.environ, PATH=str(fake_bin) + os.pathsep + os.environ["PATH"])
    done = run(PULL, "--source", root, "--dest", tmp_path / "dest", "--transport", "tar", env=env)
    assert done.returncode == 1 and "unexpected member" in done.stdout
    assert not (tmp_path / "dest" / RUN).exists() and not (tmp_path / "x").exists()
    assert not list((tmp_path / "dest").rglob("payload"))


def test_gate_inspect_runs_the_checkpoint_inspector(tmp_path, profile_env):
    """--inspect: a checkpoint torch can load passes, noise with a checkpoint's name is a reason; a pull
    with no checkpoint at all passes (nothing to inspect)."""
    torch = need_module("torch")      # a real torch.save checkpoint
    root = tmp_path / "r"
    (root / "ckpt").mkdir(parents=True)
    torch.save({"model": torch.nn.Linear(2, 1).state_dict(), "step": 3}, root / "ckpt" / "good.pt")
    (root / "final.json").write_text('{"ok": true}')
    assert build(root, ("ckpt/**", "final.json")).returncode == 0
    assert pull(str(root), tmp_path / "dest").returncode == 0
    ok = gate(tmp_path / "dest" / RUN, profile_env, "--source", str(root), "--inspect")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 load-check(s) passed" in ok.stdout

    noisy = make_results(tmp_path / "n")   # checkpoints that are a pickle header and noise
    assert build(noisy).returncode == 0
    assert pull(str(noisy), tmp_path / "dest2").returncode == 0
    bad = gate(tmp_path / "dest2" / RUN, profile_env, "--source", str(noisy), "--inspect")
    assert bad.returncode == 3
    assert re.search(r"^REASON load-check: ckpt/epoch_1\.pt: .*ckpt_inspect\.py", bad.stdout, re.M), bad.stdout

    plain = tmp_path / "p"
    plain.mkdir()
    (plain / "final.json").write_text('{"ok": true}')
    assert build(plain, ("final.json",)).returncode == 0
    assert pull(str(plain), tmp_path / "dest3").returncode == 0
    none = gate(tmp_path / "dest3" / RUN, profile_env, "--source", str(plain), "--inspect")
    assert none.returncode == 0, none.stdout


# ---------------------------------------------------------------- red-team findings (reports/redteam-2026-12.md)
import threading  # noqa: E402
from conftest import wait_for  # noqa: E402


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

@pytest.mark.drill("red-team findings stay fixed")
def test_finding_16_already_pulled_copy_is_rehashed(node, tmp_path):
    dest = tmp_path / "pulled"
    assert pull(str(node), dest).returncode == 0
    flip_byte(dest / RUN / "ckpt" / "epoch_1.pt", 77)          # same size, one byte changed locally
    again = pull(str(node), dest)
    claims_verified = again.returncode == 0 and "not re-verified" not in again.stdout
    assert not claims_verified, again.stdout
    assert again.returncode == 3 and "epoch_1.pt" in again.stdout + again.stderr


# ---------------------------------------------------------------- 17: kill -9 of the puller orphans rsync

@pytest.mark.drill("red-team findings stay fixed")
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


@pytest.mark.drill("red-team findings stay fixed")
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


@pytest.mark.drill("red-team findings stay fixed")
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

@pytest.mark.drill("red-team findings stay fixed")
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

@pytest.mark.drill("red-team findings stay fixed")
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


# ---------------------------------------------------------------- laptop round 4 findings (issue 28)
from conftest import REPO  # noqa: E402


def run_py(script, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


FAKE_SSH = r'''
import os, subprocess, sys, tarfile, time
args = sys.argv[1:]
while args and args[0].startswith("-"):       # ssh options, if any
    args = args[2:] if args[0] in ("-F", "-p", "-i", "-o", "-l") else args[1:]
host, command = args[0], " ".join(args[1:])
mode = os.environ["FAKE_MODE"]
if command.startswith(("cat ", "command -v")):
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
if command.startswith("rsync"):               # rsync's server side never answers
    sys.stdin.buffer.read()
    sys.exit(0)
if command.startswith("python3 - --run-state"):   # is a run still running: answered by this machine
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
if command.startswith("python3 -"):           # the gate's re-hash: reads the program, then hangs
    sys.stdin.buffer.read()
    time.sleep(600)
    sys.exit(1)
sys.stdin.buffer.read()                       # the tar transport: the list of wanted files
info = tarfile.TarInfo(os.environ["FAKE_MEMBER"])
info.size = int(os.environ["FAKE_SIZE"])
out = sys.stdout.buffer
out.write(info.tobuf(format=tarfile.PAX_FORMAT))
if mode == "stall":                           # part of the member's data, then nothing
    out.write(b"x" * (info.size // 2))
    out.flush()
    time.sleep(600)
else:                                         # "huge": as many zeros as the header claims
    chunk = b"\0" * (1 << 20)
    for _ in range(info.size // len(chunk)):
        out.write(chunk)
out.flush()
'''


@pytest.fixture
def fake_node(tmp_path):
    """A results dir with a real manifest, and the ssh stand-in that serves it."""
    results = tmp_path / "node" / "results" / "fk1"
    (results / "out").mkdir(parents=True)
    (results / "out" / "final.json").write_text('{"ok": 1}')
    res = run_py(NODE / "build_pull_manifest.py", "--root", results, "--run-id", "fk1", "--roster", "out/*")
    assert res.returncode == 0, res.stderr
    fake = tmp_path / "fake_ssh.py"
    fake.write_text(FAKE_SSH)
    return results, "%s %s" % (sys.executable, fake)


def pull_via(results, rsh, dest, mode, *extra, member="./out/final.json", size=9):
    env = dict(os.environ, FAKE_MODE=mode, FAKE_MEMBER=member, FAKE_SIZE=str(size))
    return run_py(SCRIPTS / "pull_verified.py", "--source", "box:%s" % results, "--dest", dest, "--rsh", rsh,
                  "--stall-seconds", "2", *extra, env=env, timeout=300)


def test_finding_laptop_10_a_stalled_pull_or_gate_ends_in_one_line_and_can_resume(tmp_path, fake_node):
    results, rsh = fake_node
    dest = tmp_path / "pulled"
    res = pull_via(results, rsh, dest, "stall", "--transport", "tar")     # the header matches the manifest
    assert res.returncode == 1 and "STALLED: the node sent nothing for 2 s" in res.stdout, res.stdout + res.stderr
    assert (dest / ".staging-fk1").is_dir() and not (dest / "fk1").exists()   # kept for the next run
    if shutil.which("rsync"):
        res = pull_via(results, rsh, dest, "stall", "--transport", "rsync")
        assert res.returncode == 1 and "STALLED" in res.stdout, res.stdout + res.stderr
    # the gate's re-hash: the node reads the program and then says nothing
    pulled = tmp_path / "good"
    ok = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", pulled)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    env = dict(os.environ, FAKE_MODE="stall", FAKE_MEMBER="x", FAKE_SIZE="0")
    gate = run_py(SCRIPTS / "teardown_gate.py", "--pulled", pulled / "fk1", "--source", "box:%s" % results,
                  "--rsh", rsh, "--profile", "vastai", "--stall-seconds", "2", env=env, timeout=300)
    assert gate.returncode == 3 and "the node stopped answering: no output for 2 s" in gate.stdout,\
        gate.stdout + gate.stderr


def test_finding_laptop_11_a_tar_member_larger_than_the_manifest_is_never_written(tmp_path, fake_node):
    results, rsh = fake_node
    dest = tmp_path / "pulled"
    res = pull_via(results, rsh, dest, "huge", "--transport", "tar", size=64 << 20)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL size" in res.stdout and "the manifest says 9" in res.stdout, res.stdout
    biggest = max((p.stat().st_size for p in dest.rglob("*") if p.is_file() and p != dest / ".gitignore"),
                  default=0)
    assert biggest <= 9, "a %d-byte file landed on the laptop for a 9-byte manifest entry" % biggest


# ---------------------------------------------------------------- newcomer 3: what a pull leaves behind

def test_finding_newcomer_3_a_pull_leaves_no_lock_and_stays_out_of_git(tmp_path, fake_node):
    results, _rsh = fake_node
    project = tmp_path / "project"
    project.mkdir()
    assert subprocess.run(["git", "init", "-q", str(project)], capture_output=True).returncode == 0
    res = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", "pulled", cwd=project)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (project / "pulled" / "fk1" / "out" / "final.json").is_file()
    assert sorted(p.name for p in (project / "pulled").iterdir()) == [".gitignore", "fk1"]   # no .pull-fk1.lock
    status = subprocess.run(["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True)
    assert status.stdout == "", status.stdout          # pulled/ is not offered for a commit
    again = run_py(SCRIPTS / "pull_verified.py", "--source", results, "--dest", "pulled", cwd=project)
    assert again.returncode == 0 and "ALREADY" in again.stdout
    assert "pulled/" in (REPO / ".gitignore").read_text().split()   # nor in this checkout, where the README runs


# ---------------------------------------------------------------- laptop 13 (field R10), laptop 14 (review B4)

def test_finding_laptop_13_and_field_R10_the_pasteable_sweep_line_expands_tilde(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import teardown_gate
    word = teardown_gate.runs_dir_of("gpu:~/rgt/results/exp1")
    line = teardown_gate.SWEEP_HINT % ("exp1", word)
    assert "'~" not in line
    home = tmp_path / "nodehome"
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + word], capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)))
    assert out.stdout == "%s/rgt/runs\n" % home, out.stdout
    spaced = teardown_gate.runs_dir_of("gpu:~/my dur/results/exp1")
    out = subprocess.run(["bash", "-c", "printf '%s\\n' " + spaced], capture_output=True, text=True,
                         env=dict(os.environ, HOME=str(home)))
    assert out.stdout == "%s/my dur/runs\n" % home, out.stdout


# ---------------------------------------------------------------- laptop round 5 findings (issue 35)
import fcntl  # noqa: E402


RGT = SCRIPTS / "rgt.py"


from sshd_fixture import rgt  # noqa: E402


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pushed(tmp_path, server):
    res = rgt(tmp_path, server, "push", "gpu-box", "--transport", "tar")
    assert res.returncode == 0, res.stdout + res.stderr


# ssh as the stand-in node: `-G` answers as ssh does, `-O exit` ends no master, `cat` of the manifest runs here,
# and the tar stream hangs (a slow node), recording its pid and its parent's (pull_verified.py) first
HANGING_SSH = r'''#!/usr/bin/env python3
import os, subprocess, sys, time
argv = sys.argv[1:]
if "-G" in argv:
    print("user tester\nhostname 127.0.0.1\nport 22"); sys.exit(0)
if "-O" in argv:
    sys.exit(0)
command = argv[-1]
if "tar" in command:
    with open(os.environ["HANG_PIDS"], "w") as fh:
        fh.write("%d %d\n" % (os.getpid(), os.getppid()))
    time.sleep(600)
    sys.exit(1)
sys.exit(subprocess.run(["sh", "-c", command]).returncode)
'''


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_finding_laptop_L13_a_killed_pull_ends_its_child_and_leaves_a_ledger_row(tmp_path):
    results = tmp_path / "node" / "results" / "fk1"
    (results / "out").mkdir(parents=True)
    (results / "out" / "final.json").write_text('{"ok": 1}')
    res = subprocess.run([sys.executable, str(NODE / "build_pull_manifest.py"), "--root", str(results), "--run-id",
                          "fk1", "--roster", "out/*"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    bindir, ctl = tmp_path / "bin", tmp_path / "ctl"
    bindir.mkdir()
    ctl.mkdir()
    (bindir / "ssh").write_text(HANGING_SSH)
    (bindir / "ssh").chmod(0o755)
    pids, ledger = tmp_path / "hang.pids", tmp_path / "ledger.jsonl"
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), HANG_PIDS=str(pids),
               RGT_SSH_CONTROL_PARENT=str(ctl))
    proc = subprocess.Popen([sys.executable, str(RGT), "--ledger", str(ledger), "pull", "gpu", "fk1",
                             "--durable-dir", str(tmp_path / "node"), "--transport", "tar", "--dest",
                             str(tmp_path / "pulled")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: pids.is_file() and pids.read_text().endswith("\n"), 120), proc.stderr.read1()
        hanging, puller = map(int, pids.read_text().split())
        assert len(os.listdir(ctl)) == 1                     # this command's private ssh control folder
        proc.send_signal(signal.SIGTERM)                     # the caller's timeout: rgt.py alone, by pid
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out, err)
    assert b"pull interrupted" in err, err
    assert wait_for(lambda: not alive(puller) and not alive(hanging), 60), "pull_verified.py outlived rgt.py"
    assert os.listdir(ctl) == [], "the ssh control folder was left behind"
    with open(tmp_path / "pulled" / ".pull-fk1.lock", "a") as handle:   # the lock is free for the re-run
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    row = rows(ledger)[-1]
    assert (row["event"], row["result"], row["run_id"]) == ("pull", "interrupted", "fk1"), row
    assert row["run_dir"] == str(tmp_path / "node" / "runs" / "fk1")   # with --durable-dir: recorded (L12)


# ---------------------------------------------------------------- N18: what a running run, a launch and a failure say

WAITING_JOB = "import os, time\nprint('step 1/2', flush=True)\nwhile not os.path.exists('go'): time.sleep(0.05)\n"


def test_finding_field_N18_a_pull_of_a_running_run_says_still_running(tmp_path, sshd_server):  # noqa: F811
    durable, work = tmp_path / "durable", tmp_path / "work"
    work.mkdir()
    pushed(tmp_path, sshd_server)
    try:
        res = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "live1",
                  "--durable-dir", durable, "--cwd", work, "--", "--no-deadman", "--", "python3", "-c", WAITING_JOB)
        assert res.returncode == 0, res.stdout + res.stderr
        # a launch without resume adapters says what a restart would do to its results
        assert "WARN no resume adapter" in res.stderr and "supersede" in res.stderr, res.stderr
        assert wait_for(lambda: rgt(tmp_path, sshd_server, "status", "gpu-box", "live1").returncode == 4, 120)
        pull = rgt(tmp_path, sshd_server, "pull", "gpu-box", "live1", "--dest", tmp_path / "pulled")
        assert pull.returncode == 1, pull.stdout + pull.stderr
        assert "still running" in pull.stdout and "could not be fetched" not in pull.stdout, pull.stdout
    finally:
        (work / "go").write_text("")
    assert wait_for(lambda: rgt(tmp_path, sshd_server, "status", "gpu-box", "live1").returncode in (0, 1), 120)
    adapted = rgt(tmp_path, sshd_server, "launch", "gpu-box", "--profile", "local", "--run-id", "live2",
                  "--durable-dir", durable, "--cwd", work, "--", "--no-deadman", "--wait", "--resume-glob",
                  "ckpt/*", "--resume-arg", "--resume {}", "--", "python3", "-c", "1")
    assert adapted.returncode == 0 and "WARN no resume adapter" not in adapted.stderr, adapted.stderr


# ---------------------------------------------------------------- field N21: interrupted before the pull's lock

SLOW_SSH = r'''#!/bin/sh
# ssh as pull_verified.py runs it before its lock: the read whose command holds $HANG_AT hangs (its pid written
# first, as the marker), any other answers "not there"
case "$*" in
  *"$HANG_AT"*) echo $$ > "$HANG_PID.tmp"; mv "$HANG_PID.tmp" "$HANG_PID"; exec sleep 600 ;;
esac
echo "cat: no such file" >&2
exit 1
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
@pytest.mark.parametrize("phase", ["cat --", "--run-state"], ids=["manifest-read", "run-state-probe"])
def test_finding_field_N21_a_pull_interrupted_before_its_lock_ends_in_one_line(tmp_path, phase, sig):
    """Before its lock (the manifest's ssh read; the probe that asks whether the run still runs) SIGINT was a
    KeyboardInterrupt (a traceback while loading), SIGTERM and SIGHUP killed the pull outright with its ssh child
    left running, and the probe's `except Exception` could swallow the interrupt. Now each ends in one line, exit
    130 (the docstring's interrupted code), the ssh child gone and nothing in DEST."""
    bindir, marker, dest = tmp_path / "bin", tmp_path / "ssh.pid", tmp_path / "pulled"
    bindir.mkdir()
    (bindir / "ssh").write_text(SLOW_SSH)
    (bindir / "ssh").chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (bindir, os.environ["PATH"]), HANG_AT=phase, HANG_PID=str(marker))
    proc = subprocess.Popen([sys.executable, str(PULL), "--source", "gpu:/durable/results/n21", "--dest", str(dest),
                             "--transport", "tar"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert wait_for(lambda: marker.is_file(), 60), "the ssh stand-in never ran"
        ssh_pid = int(marker.read_text())
        proc.send_signal(sig)                               # by pid: the pull alone, as an agent's timeout does
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("INTERRUPTED (%s)" % sig.name), lines
    assert "re-run the same command" in lines[0]
    assert wait_for(lambda: not alive(ssh_pid), 30), "the ssh child outlived the pull"
    assert not dest.exists()                                # nothing written: the lock comes after DEST
