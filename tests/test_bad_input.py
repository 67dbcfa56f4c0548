"""Bad input to every script: one clear line and exit 2 for usage errors, never a traceback, never a silent
success, never lost data.

One table, one row per (script, bad input). Each row names the script, its arguments (``{key}`` is filled
from the paths the row's setup made), the expected exit code and a fragment the output must carry. A row
with exit code 2 is a usage error: its fragment is looked for on stderr, which must be exactly one line.
Other rows (a damaged state file the script must survive) look for the fragment on stdout or stderr.
Every row checks that no Python traceback reached stderr.

Nothing here needs the network, a GPU or a long run: each script refuses before doing real work.
"""
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAPTOP_LIBRARIES, REPO, link_and_device, need_root, pyenv_python

PY = sys.executable
# Variables a developer's shell may carry that would change what the scripts read.
SCRUB = ("DATA_DIR", "DURABLE_DIR", "HF_HOME", "RGT_PROFILE", "RGT_PROFILE_INDEX", "RGT_HEARTBEAT", "RGT_RUN_ID",
         "RGT_RUN_DIR", "RGT_PIP_MIRROR", "RGT_CHECK_TIMEOUT", "PIP_INDEX_URL", "HF_ENDPOINT", "DISK_FLOOR_GB",
         "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def put(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# ---------------------------------------------------------------- setups (tmp -> extra keys, optional "env")

def run_dir_with(**files):
    """A run dir holding the given state files (name -> JSON-able object, raw str or bytes)."""
    def setup(tmp):
        run = tmp / "run"
        run.mkdir()
        for name, data in files.items():
            put(run / name.replace("__", "."), data)
        return {"rd": run}
    return setup


def live_run_dir_with(**files):
    """Like run_dir_with, with this test process's pid as the 'live' job or dead-man pid."""
    def setup(tmp):
        own = {k: json.loads(json.dumps(v).replace('"@pid"', str(os.getpid()))) if not isinstance(v, (str, bytes))
               else v for k, v in files.items()}
        return run_dir_with(**own)(tmp)
    return setup


def profile_index(profiles):
    """RGT_PROFILE_INDEX pointing at an index whose "profiles" member is the given (malformed) value."""
    def setup(tmp):
        index = put(tmp / "idx" / "index.json", {"generated_by": "test", "schema_version": 1, "profiles": profiles})
        return {"index": index, "env": {"RGT_PROFILE_INDEX": str(index)}}
    return setup


def with_env(**env):
    def setup(tmp):
        return {"env": dict(env)}
    return setup


def both(*setups):
    def setup(tmp):
        out = {"env": {}}
        for one in setups:
            got = one(tmp)
            out["env"].update(got.pop("env", {}))
            out.update(got)
        return out
    return setup


def unverified_pull(tmp):
    pulled = tmp / "pulled" / "r1"
    pulled.mkdir(parents=True)
    return {"pulled": pulled, "manifest": put(tmp / "node" / "PULL_MANIFEST.json", "{}")}


def queue_with_damaged_attempts(tmp):
    """A queue whose only cell has an unreadable attempt counter, as a crash or a hand edit leaves it."""
    queue = put(tmp / "q.txt", "true\n")
    cell = "L001-" + hashlib.sha256(b"true").hexdigest()[:8]
    put(tmp / "q.queue" / "cells" / cell / "status", "failed\n")
    put(tmp / "q.queue" / "cells" / cell / "attempts", "x y\n")
    return {"queue": queue}


def queue_with_damaged_status(tmp):
    """A queue whose cell status file holds garbage (quotes, a backslash): the JSON summary stays valid."""
    queue = put(tmp / "q.txt", "true\n")
    cell = "L001-" + hashlib.sha256(b"true").hexdigest()[:8]
    put(tmp / "q.queue" / "cells" / cell / "reason", 'a "quoted" \\ reason\n')
    put(tmp / "q.queue" / "cells" / cell / "exit_code", "not a number\n")
    return {"queue": queue}


def fifo(tmp):
    os.mkfifo(tmp / "pipe")
    return {"fifo": tmp / "pipe"}


def dangling(tmp):
    (tmp / "link").symlink_to(tmp / "nowhere")
    return {"link": tmp / "link"}


def zero_byte(tmp):
    return {"zero": put(tmp / "zero.bin", b"")}


def csv_file(tmp):
    return {"csv": put(tmp / "mem.csv", "time,host_total_mib\n")}


def non_utf8_result(tmp):
    res = tmp / "res"
    res.mkdir()
    (res / os.fsdecode(b"model-\xff.bin")).write_bytes(b"weights")
    return {"res": res}


def nothing(tmp):
    return {}


MALFORMED_PROFILES = {"bad-entry": "not an object", "bad-defaults": {"defaults": "nope", "billing": "b"}}

# ---------------------------------------------------------------- the table

TR = "examples/train_resumable.py"
CASES = [
    # script, args, setup, exit code, fragment
    # status_facts.sh (rgt.py status's node side): a missing run dir is a fact, not an error
    ("scripts/node/status_facts.sh", [], nothing, 2, "give RUN_DIR NODE_DIR MARK"),
    ("scripts/node/status_facts.sh", ["{tmp}", "{tmp}"], nothing, 2, "give RUN_DIR NODE_DIR MARK"),
    ("scripts/node/status_facts.sh", ["{tmp}/no such dir", "{tmp}", "M"], nothing, 0, "@@M facts\nnodir\n"),
    # run_status.py
    ("scripts/node/run_status.py", [], nothing, 2, "required: run_dir"),
    ("scripts/node/run_status.py", ["{file}"], nothing, 2, "not a directory"),
    ("scripts/node/run_status.py", ["{tmp}/bad\udcffname " + "x" * 300], nothing, 2, "no such run dir"),
    ("scripts/node/run_status.py", ["{rd}", "--no-gpu"], run_dir_with(status__json=b"\xff\xfe{"), 2, "not valid JSON"),
    ("scripts/node/run_status.py", ["{tmp}", "--stall-minutes", "nan"], nothing, 2, "--stall-minutes"),
    ("scripts/node/run_status.py", ["{tmp}", "--watch", "inf", "--no-gpu"], nothing, 2, "--watch"),
    ("scripts/node/run_status.py", ["{rd}", "--no-gpu"], run_dir_with(status__json=[], run__json={"run_id": "r"}),
     2, "does not hold a JSON object"),
    ("scripts/node/run_status.py", ["{rd}", "--no-gpu"],
     live_run_dir_with(status__json={"state": "running", "job_pid": "@pid"},
                       heartbeat__json='{"step": 5, "total_steps": 10, "sec_per_step": Infinity, "time": NaN}'),
     4, "RUNNING"),
    # deadman.py
    ("scripts/node/deadman.py", [], nothing, 2, "give a command"),
    ("scripts/node/deadman.py", ["arm", "--run-dir", "{file}"], nothing, 2, "is not a directory"),
    ("scripts/node/deadman.py", ["ack", "--run-dir", "{rd}", "--postpone-minutes", "inf"], run_dir_with(), 2,
     "--postpone-minutes"),
    ("scripts/node/deadman.py", ["arm", "--run-dir", "{rd}", "--poll-seconds", "inf", "--foreground", "--dry-run"],
     run_dir_with(), 2, "--poll-seconds"),
    ("scripts/node/deadman.py", ["arm", "--run-dir", "{rd}", "--profile", "bad-defaults", "--foreground", "--dry-run",
                            "--grace-minutes", "0", "--poll-seconds", "0.05"],
     both(run_dir_with(), profile_index(MALFORMED_PROFILES)), 2, "malformed"),
    ("scripts/node/deadman.py", ["ack", "--run-dir", "{rd}"], run_dir_with(deadman__json={"state": "x", "config": "x"}),
     0, "ACK postponed"),
    ("scripts/node/deadman.py", ["status", "--run-dir", "{rd}"],
     live_run_dir_with(deadman__json={"state": "armed", "pid": "@pid", "config": "damaged"},
                       ACK={"until": 1e300}), 0, "ARMED"),
    # train_resumable.py
    (TR, [], nothing, 2, "required: --ckpt-dir, --steps"),
    (TR, ["--ckpt-dir", "{tmp}/ck", "--steps", "2", "--step-seconds", "nan", "--backend", "pure"], nothing, 2,
     "--step-seconds"),
    (TR, ["--ckpt-dir", "{tmp}/ck", "--steps", "2", "--lr", "nan", "--backend", "pure"], nothing, 2, "--lr"),
    (TR, ["--ckpt-dir", "{file}", "--steps", "2", "--backend", "pure"], nothing, 2, "is not a directory"),
    (TR, ["--ckpt-dir", "{tmp}/ck", "--steps", "2", "--heartbeat", "{missing}/hb.json", "--backend", "pure"],
     nothing, 2, "heartbeat file"),
    # build_pull_manifest.py
    ("scripts/node/build_pull_manifest.py", [], nothing, 2, "required: --root, --roster"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{file}", "--roster", "x"], nothing, 2, "is not a directory"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "file.txt", "--out", "{dir}"], nothing, 2,
     "is a directory"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "file.txt", "--out", ""], nothing, 2,
     "--out is empty"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{res}", "--roster", "**", "--out", "-"], non_utf8_result, 1,
     "not valid UTF-8"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "file.txt", "--allow-empty", "../x"],
     nothing, 2, "roster entry '../x'"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "file.txt", "--out", "{fifo}"], fifo, 2,
     "refusing to replace"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "file.txt", "--out", "{link}"], dangling,
     2, "it is a symlink"),
    ("scripts/node/build_pull_manifest.py", ["--root", "{tmp}", "--roster", "zero.bin"], zero_byte, 1,
     "FAIL empty-file: zero.bin"),
    # pull_verified.py
    ("scripts/pull_verified.py", [], nothing, 2, "required: --source, --dest"),
    ("scripts/pull_verified.py", ["--source", "{missing}", "--dest", "{tmp}/dest"], nothing, 2, "not a directory"),
    ("scripts/pull_verified.py", ["--source", "{dir}", "--dest", "{tmp}/dest", "--rsh", "ssh -o 'unbalanced"],
     nothing, 2, "--rsh"),
    ("scripts/pull_verified.py", ["--source", "{dir}", "--dest", "{tmp}/dest", "--rsh", ""], nothing, 2,
     "--rsh is empty"),
    ("scripts/pull_verified.py", ["--source", "{dir}", "--dest", "{file}"], nothing, 2, "not a directory"),
    # rgt.py (the laptop CLI: each refuses before any ssh call)
    ("scripts/rgt.py", [], nothing, 2, "give a command"),
    ("scripts/rgt.py", ["launch", "gpu-box"], nothing, 2, "required: --profile, --run-id"),
    ("scripts/rgt.py", ["logs", "gpu-box", "r1", "--lines", "x"], nothing, 2, "--lines"),
    ("scripts/rgt.py", ["--ledger", "{tmp}/empty.jsonl", "sweep", "gpu-box"], nothing, 2, "no run of gpu-box"),
    # notify_cli.py (rgt.py notify)
    ("scripts/notify_cli.py", ["bogus"], nothing, 2, "invalid choice"),
    ("scripts/notify_cli.py", ["setup", "gpu-box"], nothing, 2, "--from"),
    ("scripts/notify_cli.py", ["setup", "gpu-box", "--from", "{tmp}/absent.json"], nothing, 2, "cannot read"),
    # billing.py (rgt.py billing)
    ("scripts/billing.py", ["--timeout", "nan"], nothing, 2, "--timeout"),
    ("scripts/billing.py", ["--timeout", "0"], nothing, 2, "--timeout"),
    ("scripts/billing.py", ["--ledger", "{tmp}"], nothing, 2, "cannot read the ledger"),
    ("scripts/rgt.py", ["launch", "gpu-box", "--profile", "local", "--run-id", "r1", "--max-cost", "5", "--",
                        "true"], nothing, 2, "needs the hourly rate"),
    ("scripts/rgt.py", ["resume", "gpu-box", "r1", "--max-cost", "0"], nothing, 2, "--max-cost"),
    # reap.py (rgt.py reap)
    ("scripts/reap.py", ["--timeout", "nan"], nothing, 2, "--timeout"),
    ("scripts/reap.py", ["install"], nothing, 2, "--cron, --systemd or --launchd"),
    ("scripts/reap.py", ["--notify-config", "{tmp}/absent.json"], nothing, 2, "no such file"),
    # idle_watch.py
    ("scripts/node/idle_watch.py", [], nothing, 2, "give a command"),
    ("scripts/node/idle_watch.py", ["arm", "--watch-dir", "{tmp}/w", "--stop-cmd", "'unbalanced"], nothing, 2,
     "cannot be split"),
    ("scripts/node/idle_watch.py", ["arm", "--watch-dir", "{tmp}/w", "--stop-cmd", "true", "--util-below", "nan"],
     nothing, 2, "--util-below"),
    ("scripts/node/idle_watch.py", ["status", "--watch-dir", "{missing}"], nothing, 2, "not a directory"),
    # boot_resume.py
    ("scripts/node/boot_resume.py", [], nothing, 2, "give --runs-dir (at boot) or --run"),
    ("scripts/node/boot_resume.py", ["--run", "{missing}"], nothing, 2, "is not a directory"),
    ("scripts/node/boot_resume.py", ["--run", "{tmp}"], nothing, 2, "is not a run dir"),
    ("scripts/node/boot_resume.py", ["--runs-dir", "{tmp}", "--max-attempts", "2"], nothing, 2, "needs --run"),
    ("scripts/node/boot_resume.py", ["--runs-dir", "{tmp}", "--give-up-hours", "nan"], nothing, 2,
     "--give-up-hours"),
    ("scripts/node/boot_resume.py", ["--runs-dir", "{missing}"], nothing, 2, "not a directory"),
    ("scripts/node/boot_resume.py", ["--runs-dir", "{tmp}", "--max-cost", "5"], nothing, 2, "needs --run"),
    ("scripts/node/boot_resume.py", ["--run", "{tmp}", "--max-cost", "nan"], nothing, 2, "--max-cost"),
    ("scripts/node/boot_resume.py", ["--runs-dir", "{file}"], nothing, 2, "not a directory"),
    # final_sweep.py
    ("scripts/node/final_sweep.py", [], nothing, 2, "required: --runs-dir"),
    ("scripts/node/final_sweep.py", ["--runs-dir", "{missing}"], nothing, 2, "not a directory"),
    ("scripts/node/final_sweep.py", ["--runs-dir", "{tmp}", "--jobs", "0"], nothing, 2, "--jobs"),
    # lookup.py
    ("scripts/lookup.py", [], nothing, 2, "give an entry ID"),
    ("scripts/lookup.py", ["--in", "{missing}", "oom"], nothing, 2, "no such file"),
    ("scripts/lookup.py", ["--top", "0", "oom"], nothing, 2, "--top"),
    # teardown_gate.py
    ("scripts/teardown_gate.py", [], nothing, 2, "required: --pulled, --source, --profile"),
    ("scripts/teardown_gate.py", ["--pulled", "{tmp}", "--source", "", "--profile", "local"], nothing, 2,
     "--source is empty"),
    ("scripts/teardown_gate.py", ["--pulled", "{tmp}", "--manifest", "{file}", "--profile", "local"], nothing, 2,
     "required: --source"),
    ("scripts/teardown_gate.py", ["--pulled", "{missing}", "--source", "{tmp}", "--profile", "local"], nothing,
     2, "--pulled"),
    ("scripts/teardown_gate.py", ["--pulled", "{pulled}", "--source", "{tmp}/node", "--profile", "local",
                                  "--load-timeout", "nan"], unverified_pull, 2, "--load-timeout"),
    ("scripts/teardown_gate.py", ["--pulled", "{pulled}", "--source", "{tmp}/node", "--profile", "bad-entry"],
     both(unverified_pull, profile_index(MALFORMED_PROFILES)), 3, "malformed"),
    ("scripts/teardown_gate.py", ["--pulled", "{pulled}", "--source", "{tmp}/node", "--profile", "local"],
     both(unverified_pull, profile_index("runpod")), 3, "not a profile index"),
    ("scripts/teardown_gate.py", ["--pulled", "{pulled}", "--source", "{tmp}/node", "--profile", "local"],
     both(unverified_pull, lambda tmp: {"env": {"RGT_PROFILE_INDEX": str(tmp / "no-index.json")}}), 3,
     "is not a file"),
    # node_probe.py
    ("scripts/node/node_probe.py", ["--gpu-timeout", "inf"], nothing, 2, "--gpu-timeout"),
    ("scripts/node/node_probe.py", ["--profile", "", "--gpu-timeout", "1"], nothing, 2, "--profile is empty"),
    ("scripts/node/node_probe.py", ["--data-dir", "{file}", "--min-free-gb", "1", "--gpu-timeout", "1"], nothing, 2,
     "is not a directory"),
    ("scripts/node/node_probe.py", ["--profile", "bad-entry", "--gpu-timeout", "1"], profile_index(MALFORMED_PROFILES),
     2, "malformed"),
    ("scripts/node/node_probe.py", ["--min-free-gb", "-1"], nothing, 2, "--min-free-gb"),
    ("scripts/node/node_probe.py", ["--out", "{fifo}", "--gpu-timeout", "1"], fifo, 2, "refusing to replace"),
    ("scripts/node/node_probe.py", ["--out", "", "--gpu-timeout", "1"], nothing, 2, "--out is empty"),
    ("scripts/node/node_probe.py", ["disk-gate"], nothing, 2, "required: PATH"),
    ("scripts/node/node_probe.py", ["disk-gate", "{tmp}", "--min-free-inodes", "-5"], nothing, 2, "--min-free-inodes"),
    ("scripts/node/node_probe.py", ["disk-gate", "{tmp}", "--min-free-gb", "1e12"], nothing, 3, "below the floor"),
    # fetch_resumable.py
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:99999/x", "--out", "{tmp}/o"], nothing, 2, "Port out of range"),
    ("scripts/node/fetch_resumable.py", ["http://[::1/x", "--out", "{tmp}/o"], nothing, 2, "Invalid IPv6 URL"),
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:9/x", "--out", "{tmp}/o", "--retries", "1",
                                    "--connect-timeout", "inf"], nothing, 2, "--connect-timeout"),
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:9/x", "--out", "", "--retries", "1"], nothing, 2,
     "--out is empty"),
    ("scripts/node/fetch_resumable.py", ["ftp://gpu-box/x", "--out", "{tmp}/o"], nothing, 2, "not an http(s) URL"),
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:9/x", "--out", "{fifo}", "--force"], fifo, 2,
     "refusing to replace"),
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:9/x", "--out", "{link}"], dangling, 2, "it is a symlink"),
    ("scripts/node/fetch_resumable.py", ["http://127.0.0.1:9/x", "--out", "{tmp}/o", "--auth-env", ""], nothing, 2,
     "--auth-env"),
    # check_staleness.py
    ("tools/check_staleness.py", ["--today", "2026-13"], nothing, 2, "--today"),
    ("tools/check_staleness.py", ["--max-age-months", "six"], nothing, 2, "--max-age-months"),
    ("tools/check_staleness.py", ["--root", "{missing}"], nothing, 2, "neither profiles/ nor references/"),
    # reconcile.py
    ("scripts/reconcile.py", [], nothing, 2, "required: documents"),
    ("scripts/reconcile.py", ["{file}", "--abs-tol", "nan"], nothing, 2, "--abs-tol"),
    ("scripts/reconcile.py", ["{file}", "--base", "{missing}"], nothing, 2, "--base"),
    ("scripts/reconcile.py", ["{missing}"], nothing, 2, "document not found"),
    ("scripts/reconcile.py", ["{doc}"], lambda tmp: {"doc": put(tmp / "doc.md", b"acc \xff 76.1\n")}, 2, "cannot read"),
    # render_job.py
    ("scripts/render_job.py", ["{file}"], nothing, 2, "required: --to"),
    ("scripts/render_job.py", ["{missing}", "--to", "slurm"], nothing, 2, "no such request file"),
    ("scripts/render_job.py", ["{file}", "--to", "slurm"], nothing, 2, "is not valid JSON"),
    ("scripts/render_job.py", ["{file}", "--to", "nomad"], nothing, 2, "invalid choice"),
    ("scripts/render_job.py", ["{req}", "--to", "k8s-job"],
     lambda tmp: {"req": put(tmp / "req.json", {"name": "a", "command": ["t.py"], "workdir": "/w",
                                               "resources": {"nodes": 1, "time_limit_minutes": 10},
                                               "outputs": {"durable_dir": "/d", "roster": ["f"]}})},
     2, "needs outputs.pvc"),
    ("scripts/render_job.py", ["{req}", "--to", "slurm", "--out", "{dir}"],
     lambda tmp: {"req": put(tmp / "req.json", {"name": "a"})}, 2, "is a directory"),
    # install_skill.py (HOME is the test's own folder)
    ("scripts/install_skill.py", ["--target", ""], nothing, 2, "empty path"),
    ("scripts/install_skill.py", ["--target", "{file}"], nothing, 2, "is not a directory"),
    ("scripts/install_skill.py", ["--link", "--target", "{file}/skills"], nothing, 2, "is not a directory"),
    ("scripts/install_skill.py", ["--agent", "notepad"], nothing, 2, "invalid choice"),
    # build_profile_index.py
    ("tools/build_profile_index.py", ["--bogus"], nothing, 2, "unrecognized arguments"),
    ("tools/build_profile_index.py", ["--root", "", "--check"], nothing, 2, "empty path"),
    ("tools/build_profile_index.py", ["--root", "{file}", "--check"], nothing, 2, "is not a directory"),
    # bench_manifest.py (tiny sizes: the refusal must come before any data is written)
    ("tools/bench_manifest.py", ["--dir", "{file}", "--size-mb", "1", "--small-count", "1", "--small-kb", "1",
                                   "--repeat", "1"], nothing, 2, "--dir"),
    ("tools/bench_manifest.py", ["--buffer-mb", "nan", "--size-mb", "1", "--small-count", "1", "--small-kb", "1",
                                   "--repeat", "1", "--dir", "{dir}"], nothing, 2, "--buffer-mb"),
    ("tools/bench_manifest.py", ["--size-mb", "x"], nothing, 2, "invalid int value"),
    # demo_lifecycle.py
    ("scripts/demo_lifecycle.py", ["--workdir", "{file}"], nothing, 2, "is not a directory"),
    ("scripts/demo_lifecycle.py", ["--workdir", "{file}/demo"], nothing, 2, "is not a directory"),
    ("scripts/demo_lifecycle.py", ["--bogus"], nothing, 2, "unrecognized arguments"),
    # run_one.sh (--disk-floor-gb 0 so a full disk here cannot mask the check)
    ("scripts/node/run_one.sh", ["--run-dir", "{file}", "--no-deadman", "--disk-floor-gb", "0", "--", "false"], nothing,
     2, "is not a directory"),
    ("scripts/node/run_one.sh", ["--durable-dir", "{file}", "--no-deadman", "--disk-floor-gb", "0", "--", "false"],
     nothing, 2, "is not a directory"),
    ("scripts/node/run_one.sh", ["--run-dir", "{tmp}/run", "--poll-seconds", "0", "--no-deadman", "--disk-floor-gb", "0",
                            "--", "false"], nothing, 2, "--poll-seconds"),
    ("scripts/node/run_one.sh", ["--profile", "local", "--run-dir", "{tmp}/run", "--no-deadman", "--", "false"],
     profile_index("runpod"), 2, "is not a profile index"),
    ("scripts/node/run_one.sh", ["--profile", "bad-defaults", "--run-dir", "{tmp}/run", "--no-deadman", "--", "false"],
     profile_index(MALFORMED_PROFILES), 2, "malformed"),
    ("scripts/node/run_one.sh", ["--", ], nothing, 2, "no command given"),
    ("scripts/node/run_one.sh", ["--run-dir", "{tmp}/run", "--no-deadman", "--grace-minutes", "5", "--", "false"], nothing,
     2, "conflicts"),
    # run_queue.sh
    ("scripts/node/run_queue.sh", ["{file}", "--queue-dir", ""], nothing, 2, "--queue-dir is empty"),
    ("scripts/node/run_queue.sh", ["{file}", "--queue-dir", "{file}"], nothing, 2, "cannot create"),
    ("scripts/node/run_queue.sh", ["{missing}"], nothing, 2, "not found"),
    ("scripts/node/run_queue.sh", ["--retry-failed", "{queue}"], queue_with_damaged_attempts, 0, "QUEUE OK"),
    ("scripts/node/run_queue.sh", ["{file}", "--stop-grace", "soon"], nothing, 2, "--stop-grace"),
    ("scripts/node/run_queue.sh", ["{file}", "--inode-floor", "-1"], nothing, 2, "--inode-floor"),
    ("scripts/node/run_queue.sh", ["{queue}", "--json"], queue_with_damaged_status, 0, '"all_succeeded": true'),
    # mem_monitor.sh
    ("scripts/node/mem_monitor.sh", ["--out", "{dir}", "--count", "1", "--interval", "0.01"], nothing, 2,
     "is a directory"),
    ("scripts/node/mem_monitor.sh", ["--out", "", "--count", "1", "--interval", "0.01"], nothing, 2, "--out"),
    ("scripts/node/mem_monitor.sh", ["--cgroup-dir", "{dir}", "--count", "1", "--interval", "0.01"], nothing, 2,
     "not a memory cgroup"),
    ("scripts/node/mem_monitor.sh", ["--threshold", "150", "--count", "1", "--interval", "0.01"], nothing, 2,
     "--threshold"),
    ("scripts/node/mem_monitor.sh", ["--pid", "1", "--cgroup-dir", "{dir}", "--count", "1", "--interval", "0.01"], nothing,
     2, "give one"),
    ("scripts/node/mem_monitor.sh", ["--out", "{csv}", "--json", "--count", "1", "--interval", "0.01"], csv_file, 2,
     "already holds CSV"),
    # reap_vram_zombies.sh
    ("scripts/node/reap_vram_zombies.sh", ["--pids-from", "{dir}"], nothing, 2, "is a directory"),
    ("scripts/node/reap_vram_zombies.sh", ["--pids-from", ""], nothing, 2, "--pids-from"),
    ("scripts/node/reap_vram_zombies.sh", ["--pids-from", "{file}"], nothing, 2, "is not a PID"),
    # setup-china-mirrors.sh (executed with --check: a bad knob must stop it before any probe)
    ("scripts/node/setup-china-mirrors.sh", ["--check", "--quiet"],
     with_env(RGT_PIP_MIRROR="nope", RGT_CHECK_TIMEOUT="1", HF_ENDPOINT="http://127.0.0.1:9"), 2, "RGT_PIP_MIRROR"),
    ("scripts/node/setup-china-mirrors.sh", ["--check", "--quiet"], with_env(RGT_CHECK_TIMEOUT="soon"), 2,
     "RGT_CHECK_TIMEOUT"),
    ("scripts/node/setup-china-mirrors.sh", ["--bogus"], nothing, 2, "unknown argument"),
    ("scripts/node/setup-china-mirrors.sh", [], nothing, 2, "source this file"),
    # gpu_health.sh
    ("scripts/node/gpu_health.sh", ["--gpu", "x"], nothing, 2, "--gpu needs a whole number"),
    ("scripts/node/gpu_health.sh", ["--timeout", "0"], nothing, 2, "--timeout must be > 0"),
    ("scripts/node/gpu_health.sh", ["--bogus"], nothing, 2, "unknown argument"),
    ("scripts/node/gpu_health.sh", ["--json", "--timeout", "x"], nothing, 2, "--timeout needs a whole number"),
    # run_forensics.py
    ("scripts/run_forensics.py", [], nothing, 2, "give a command"),
    ("scripts/run_forensics.py", ["list", "{missing}"], nothing, 2, "is not a directory"),
    ("scripts/run_forensics.py", ["curve", "{tmp}", "--metric", "loss", "--z", "nan"], nothing, 2, "--z"),
    ("scripts/run_forensics.py", ["curve", "{tmp}", "--metric", ""], nothing, 2, "--metric is empty"),
    ("scripts/run_forensics.py", ["list", "{tmp}", "--metric", "lr"], nothing, 2, "give --mode"),
    ("scripts/run_forensics.py", ["diff", "{file}", "{tmp}"], nothing, 2, "is not a directory"),
    ("scripts/run_forensics.py", ["curve", "{rd}", "--metric", "loss"], run_dir_with(run__json=b"\xff{"), 5,
     "no source logs"),
    ("scripts/run_forensics.py", ["steps"], nothing, 2, "required: FILE"),
    ("scripts/run_forensics.py", ["steps", "{missing}"], nothing, 2, "is not a file"),
    ("scripts/run_forensics.py", ["steps", "{file}"], nothing, 2, "is not a *.jsonl or *.csv"),
    ("scripts/run_forensics.py", ["curve", "{tmp}", "--metric", "loss", "--log-regex", r"iter (\d+): (?P<loss>\S+)"],
     nothing, 2, "has no (?P<step>...) group"),
    ("scripts/run_forensics.py", ["list", "{tmp}", "--log-regex", r"iter (?P<step>\d+"], nothing, 2,
     "does not compile"),
    ("scripts/run_forensics.py", ["steps", "{file}", "--log-regex", r"iter (?P<step>\d+)"], nothing, 2,
     "names no metric"),
    ("scripts/run_forensics.py", ["steps", "{file}", "--log-regex", r"a (?P<step>\d+) (?P<x>\S+)", "--log-regex",
                                  r"b (?P<step>\d+) (?P<x>\S+)"], nothing, 2, "both name 'x'"),
    ("scripts/run_forensics.py", ["list", "{rd}"], run_dir_with(job__log="iter 1: loss 2.5\n"), 5,
     "--log-regex"),
    # repro.py
    ("scripts/repro.py", [], nothing, 2, "required: RUN_DIR"),
    ("scripts/repro.py", ["{missing}"], nothing, 2, "is not a directory"),
    ("scripts/repro.py", ["{tmp}", "--rtol", "nan"], nothing, 2, "--rtol"),
    ("scripts/repro.py", ["{tmp}", "--map", "relative=x"], nothing, 2, "absolute OLD"),
    ("scripts/repro.py", ["{rd}"], run_dir_with(run__json={"cmd": ["true"], "cwd": "/"}), 3, "no env.json"),
    ("scripts/repro.py", ["{rd}"], run_dir_with(run__json=b"\xff{", env__json={}), 2, "not valid JSON"),
    ("scripts/repro.py", ["{rd}", "-o", "{rd}/run.json", "--force"], run_dir_with(run__json={"cmd": ["true"]}), 2,
     "inside the run dir"),
    ("scripts/repro.py", ["{dir}", "-o", "{file}"], nothing, 2, "already exists"),
    ("scripts/repro.py", ["{tmp}", "-o", "{missing}/repro.sh"], nothing, 2, "does not exist"),
    # run_env.py
    ("scripts/node/run_env.py", [], nothing, 2, "required: RUN_DIR"),
    ("scripts/node/run_env.py", ["{file}"], nothing, 2, "is not a directory"),
    ("scripts/node/run_env.py", ["{tmp}", "--timeout", "inf"], nothing, 2, "--timeout"),
    ("scripts/node/run_env.py", ["{tmp}", "--cwd", "{missing}"], nothing, 2, "is not a directory"),
    ("scripts/node/run_env.py", ["{tmp}", "--compare", "{file}"], nothing, 2, "not valid JSON"),
    ("scripts/node/run_env.py", ["{tmp}", "--compare", "{rd}/env.json"],
     run_dir_with(env__json={"python": "3.11.7", "data": ["/data/x"]}), 2, "not a run_env.py record"),
    ("scripts/node/run_env.py", ["{tmp}", "--data", "{missing}"], nothing, 2, "does not exist"),
    # reap_vram_zombies.sh --json with a damaged PID list: still one usage line, no JSON half-written
    ("scripts/node/reap_vram_zombies.sh", ["--json", "--pids-from", "{file}"], nothing, 2, "is not a PID"),
]


def case_id(case):
    script, args = case[0], case[1]
    return f"{Path(script).name}:{' '.join(args)[:60] or '<no args>'}"


@pytest.mark.parametrize("script,args,setup,code,fragment", CASES, ids=[case_id(c) for c in CASES])
def test_bad_input(tmp_path, script, args, setup, code, fragment):
    keys = {"tmp": tmp_path, "file": put(tmp_path / "file.txt", "not a directory\n"), "dir": tmp_path / "empty-dir",
            "missing": tmp_path / "does-not-exist"}
    keys["dir"].mkdir()
    extra = setup(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(HOME=str(tmp_path / "home"), RGT_PYTHON=PY, **extra.pop("env", {}))
    keys.update(extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    argv = [arg.format(**keys) for arg in args]
    path = REPO / script
    cmd = (["bash", str(path)] if script.endswith(".sh") else [PY, str(path)]) + argv
    before = sorted(p.name for p in tmp_path.iterdir())
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, cwd=tmp_path,
                         stdin=subprocess.DEVNULL, timeout=20)
    shown = f"exit {res.returncode}\nstdout: {res.stdout[-800:]}\nstderr: {res.stderr[-1500:]}"
    assert "Traceback" not in res.stderr, shown
    assert res.returncode == code, shown
    if code == 2:
        assert len(res.stderr.strip().splitlines()) == 1, "a usage error must be ONE line on stderr\n" + shown
        assert fragment in res.stderr, shown
        after = sorted(p.name for p in tmp_path.iterdir())
        assert after == before, f"a refused command left files behind: {sorted(set(after) - set(before))}"
    else:
        assert fragment in res.stdout + res.stderr, shown


def test_every_script_has_three_bad_inputs():
    scripts = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scripts").iterdir()
                     if p.suffix in (".py", ".sh") and p.name not in LAPTOP_LIBRARIES) + [TR]
    counts = {s: sum(c[0] == s for c in CASES) for s in scripts}
    assert {s: n for s, n in counts.items() if n < 3} == {}


def python36():
    return pyenv_python("3.6", "pyenv install 3.6.15, or put any python3.6 on PATH; the GitHub workflow takes one "
                               "from conda-forge")


@pytest.mark.parametrize("script", ["scripts/node/build_pull_manifest.py", "scripts/node/node_probe.py",
                                    "scripts/node/fetch_resumable.py"])
def test_finding_23_python36_node_gets_one_line_not_a_traceback(tmp_path, script):
    """On a Python 3.6 node the tool says it needs 3.8+ (old build_pull_manifest: SyntaxError traceback)."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "a.txt").write_text("x")
    res = subprocess.run([python36(), str(REPO / script), "--root", str(tmp_path / "r"), "--roster", "a.txt"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == ["error: the node toolkit needs Python 3.8+, this is 3.6"]


def test_finding_5_manifest_out_never_replaces_a_device_or_a_symlink(tmp_path):
    """The report's repro: build_pull_manifest --out onto a mknod'ed /dev/null twin (root only) or a symlink
    to /proc/self/fd/1. Refused with one line and exit 2 before any hashing; the target is untouched."""
    res_dir = tmp_path / "results"
    res_dir.mkdir()
    (res_dir / "metrics.json").write_text('{"loss": 0.5}')
    link = tmp_path / "fakestdout"
    link.symlink_to("/proc/self/fd/1")
    targets = link_and_device(tmp_path, link)
    for target in targets:
        res = subprocess.run([PY, str(REPO / "scripts/node/build_pull_manifest.py"), "--root", str(res_dir),
                              "--roster", "**", "--out", str(target)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stdout + res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "refusing to replace" in res.stderr
        assert res.stdout == "" and "Traceback" not in res.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    if len(targets) == 1:
        need_root("the device-node half of this check (mknod)")
    st = os.lstat(targets[1])
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fakenull", "fakestdout", "results"]
