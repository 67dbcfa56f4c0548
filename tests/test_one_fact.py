"""One statement per fact (issue 30): the default disk floor is one constant in rgt_core that every tool reads,
and the atomic-save recipe is written out once in the references, which all other entries link to. Each
check is paired with a test that shows it catches a second copy."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import NODE, REPO, SCRIPTS

# ---------------------------------------------------------------- the disk floor

# A numeric default next to a disk-floor name: shell `${DISK_FLOOR_GB:-1}` / `FLOOR_GB=10`, Python
# `default=10.0` on a floor option, or a floor constant other than rgt_core's own.
FLOOR_NAME = r"(disk[_-]?floor|floor[_-]gb|min[_-]free[_-]gb|FLOOR_GB|DISK_FLOOR)"
FLOOR_DEFAULTS = [
    re.compile(r"DISK_FLOOR_GB:-\s*[0-9.]"),
    re.compile(r"\bFLOOR(_GB)?=[\"']?[0-9]"),
    re.compile(FLOOR_NAME + r".*\bdefault\s*=\s*[0-9.]", re.I),
    re.compile(FLOOR_NAME + r"\w*\s*=\s*[0-9.]+\s*(#.*)?$", re.I),
]
OWNER = ("scripts/node/rgt_core.py", "DEFAULT_DISK_FLOOR_GB = ")


def floor_defaults(text):
    """Lines of TEXT that state a numeric disk-floor default."""
    return [line.strip() for line in text.splitlines() if any(rx.search(line) for rx in FLOOR_DEFAULTS)]


def code_files():
    for folder in ("scripts", "scripts/node", "tools", "examples"):
        for path in sorted((REPO / folder).glob("*")):
            if path.suffix in (".py", ".sh"):
                yield path


def test_the_disk_floor_default_is_stated_once():
    found = []
    for path in code_files():
        rel = str(path.relative_to(REPO))
        for line in floor_defaults(path.read_text(encoding="utf-8")):
            if (rel, True) != (OWNER[0], line.startswith(OWNER[1])):
                found.append("%s: %s" % (rel, line))
    assert found == [], "a second disk-floor default (read rgt_core.DEFAULT_DISK_FLOOR_GB instead):\n" + \
        "\n".join(found)


def test_the_floor_check_catches_a_second_default():
    for line in ('FLOOR_GB="${DISK_FLOOR_GB:-1}"', "FLOOR=${FLOOR_ARG:-${DISK_FLOOR_GB:-10}}",
                 'p.add_argument("--min-free-gb", type=float, default=10.0, help="x")',
                 '    p.add_argument("--floor-gb", type=float, default=5,', "DISK_FLOOR = 10"):
        assert floor_defaults(line), line
    for line in ('p.add_argument("--min-free-gb", default=core.DEFAULT_DISK_FLOOR_GB)', 'FLOOR_GB="${DISK_FLOOR_GB:-}"',
                 "--disk-floor-gb) need_val \"$@\"; FLOOR_ARG=$2; shift 2 ;;"):
        assert not floor_defaults(line), line


def python_out(code):
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(REPO))
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_every_tool_reads_the_one_floor(tmp_path):
    sys.path.insert(0, str(NODE))
    try:
        import rgt_core as core
    finally:
        sys.path.pop(0)
    floor = core.DEFAULT_DISK_FLOOR_GB
    # the shell scripts' one source
    printed = subprocess.run([sys.executable, str(NODE / "rgt_core.py"), "--default", "disk_floor_gb"],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and float(printed.stdout) == floor
    # the Python tools' parsers: node_probe disk-gate, launcher prepare (run_one.sh's gate), rgt.py patrol
    got = json.loads(python_out(
        "import json, sys; sys.path[:0] = [%r, %r]\n"
        "import node_probe, launcher, rgt\n"
        "gate = node_probe.build_gate_parser().parse_args(['/tmp'])\n"
        "import os; os.environ.pop('DISK_FLOOR_INODES', None)\n"
        "prep = launcher.build_parser().parse_args(['prepare', '--launcher-pid', '1'])\n"
        "floor_gb, floor_inodes = launcher.disk_floors(prep, {})\n"
        "pa = rgt.build_parser().parse_args(['patrol', 'host'])\n"
        "print(json.dumps([gate.min_free_gb, gate.min_free_inodes, floor_gb, floor_inodes, pa.min_free_gb]))"
        % (str(NODE), str(SCRIPTS))))
    assert got == [floor, core.DEFAULT_MIN_FREE_INODES, floor, core.DEFAULT_MIN_FREE_INODES, floor]
    # run_queue.sh without a floor reads the same number
    (tmp_path / "q.txt").write_text("true\n")
    env = {k: v for k, v in os.environ.items() if k != "DISK_FLOOR_GB"}
    env["RGT_PYTHON"] = sys.executable
    res = subprocess.run(["bash", str(NODE / "run_queue.sh"), "--dry-run", "q.txt"], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and ("disk floor %g GB" % floor) in res.stdout, res.stdout + res.stderr
    # and the node probe's gate says why it defaults to the floor rather than off
    helped = subprocess.run([sys.executable, str(NODE / "node_probe.py"), "disk-gate", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert "default %g" % floor in helped.stdout and "a bare gate refuses where a launch" in " ".join(
        helped.stdout.split())


# ---------------------------------------------------------------- the atomic-save recipe

CANONICAL = REPO / "references" / "run-remote" / "spot-resilience.md"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def save_recipes(paths):
    """(path, block) for each fenced code block that is a full atomic save: a rename into place after an fsync."""
    found = []
    for path in paths:
        for block in FENCE.findall(path.read_text(encoding="utf-8")):
            if "os.replace" in block and "fsync" in block:
                found.append((path, block))
    return found


def doc_files():
    return [REPO / "SKILL.md", REPO / "README.md", *sorted((REPO / "references").rglob("*.md")),
            *sorted((REPO / "profiles").glob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]


def test_the_atomic_save_recipe_is_written_once():
    found = save_recipes(doc_files())
    assert [str(p.relative_to(REPO)) for p, _b in found] == [str(CANONICAL.relative_to(REPO))], \
        "one full atomic-save recipe, in spot-resilience.md section 4; link to it instead of copying"
    block = found[0][1]
    assert "os.O_RDONLY" in block and block.count("fsync") >= 2, "the recipe fsyncs the file and the directory"


def test_the_recipe_check_catches_a_second_copy(tmp_path):
    copy = tmp_path / "copy.md"
    copy.write_text("# x\n\n```python\nwith open(tmp, 'wb') as f:\n    f.write(b)\n    os.fsync(f.fileno())\n"
                    "os.replace(tmp, path)\n```\n")
    assert len(save_recipes(doc_files() + [copy])) == 2


def test_the_recipe_does_what_it_says(tmp_path):
    """Run the canonical block: a save lands whole, and a save that fails midway keeps the old file and leaves
    no temp file behind (a full disk must not also hold a half-written copy)."""
    block = save_recipes([CANONICAL])[0][1]
    code = "\n".join(line for line in block.splitlines() if "torch" not in line)
    scope = {}
    exec(compile(code, str(CANONICAL), "exec"), scope)
    atomic_save = scope["atomic_save"]
    target = tmp_path / "ckpt.pt"
    atomic_save(str(target), lambda f: f.write(b"generation 1"))
    assert target.read_bytes() == b"generation 1"

    def torn(f):
        f.write(b"half of generation 2")
        raise OSError(28, "No space left on device")
    try:
        atomic_save(str(target), torn)
    except OSError:
        pass
    else:
        raise AssertionError("the failed save did not raise")
    assert target.read_bytes() == b"generation 1"
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]


# ---------------------------------------------------------------- provider facts (issue 40)
# One home per provider fact. Each FACT names the statement (regexes whose group `v` is the value stated), where
# its value lives (a profile field, or a literal for a fact whose home is a reference table) and, when the
# data flags it as uncertain, what a statement elsewhere must carry: a hedge word or a link to the home.
# The check reads every paragraph, list item and table row of SKILL.md, README.md, references/ and profiles/
# (the frontmatter is the home itself, so it is not read) and reports each statement that disagrees.

OTHER_PLATFORMS = r"AWS|GCP|Azure|GKE|vast|Kubernetes|Slurm|Lambda|Paperspace|AutoDL"
HEDGE_WORDS = re.compile(r"unconfirmed|unverified|not confirmed|reported|removed|disputed|last documented", re.I)
FACTS = {
    "runpod spot grace (s)": {
        "topic": r"SIGKILL|SIGTERM|grace|warning window|reclaim|spot",
        "patterns": [r"RunPod(?:(?!%s).){0,90}?\b(?P<v>\d+)\s?s\b" % OTHER_PLATFORMS,
                     r"\b(?P<v>\d+)\s?s\b[^|]{0,12}RunPod"],
        "field": ("runpod", "interruption.grace_seconds"),
        "home": r"runpod\.md|\bRP\d",
    },
    "GKE non-system pod grace (s)": {
        "topic": r"GKE",
        "patterns": [r"(?P<v>\d+)\s?s of (?:the node's |a |the )?30\s?s",
                     r"GKE[^|]{0,60}?(?:window|grace|caps?)[^|]{0,40}?\((?P<v>\d+)\s?s"],
        "value": "15",
    },
    "RunPod network-volume billing interval": {
        "topic": r"bill|charge",
        "patterns": [r"[Nn]etwork volumes?(?: storage)?[^.|]{0,40}?\b(?P<v>hourly|per[- ]second|disputed)\b"],
        "value": "hourly",
        "only": r"RunPod|runpod",
    },
    "Lambda OS shutdown ends billing": {
        "topic": r"shutdown",
        "patterns": [r"(?P<v>shutdown)[^|]{0,80}?(?:bill|meter|stops nothing)"],
        "field": ("lambda", "billing.os_shutdown_stops_billing"),
        "only": r"Lambda|lambda",
        "home": r"\bLA1\b|lambda\.md#la1",
    },
    "AutoDL in-instance shutdown is 关机": {
        "topic": r"shutdown",
        "patterns": [r"`(?P<v>shutdown)`[^|.]{0,60}?(?:same 关机|act as 关机|powers (?:the instance )?off|"
                     r"stop (?:its own |the )?meter|inside the instance)"],
        "field": ("autodl", "billing.meter_stop_action"),
        "only": r"AutoDL|autodl|关机",
        "home": r"\bAD8\b|autodl\.md",
    },
    "Gpushare /hy-tmp wiped after (h)": {
        "topic": r"hy-tmp",
        "patterns": [r"/hy-tmp`?[^|]{0,60}?\b(?P<v>\d+)\s?h\b"],
        "value": "24",
    },
    "AutoDL powered-off instance released after (days)": {
        "topic": r"AutoDL|autodl|关机",
        "patterns": [r"(?:powered[- ]off|关机)[^|.]{0,60}?\b(?P<v>\d+) days", r"连续关机(?P<v>\d+)天"],
        "value": "15",
        "only": r"AutoDL|autodl|连续关机",
    },
    "RunPod stopped volume disk rate (x running)": {
        "topic": r"volume disk",
        "patterns": [r"volume disk[^|.]{0,40}?\b(?P<v>\d+(?:\.\d+)?×|\d+(?:\.\d+)?x|twice|three times)"],
        "value": "2",
        "same": {"2×": "2", "2x": "2", "twice": "2"},
        "only": r"RunPod|runpod|Pod",
    },
    "AutoDL 无卡模式 rate": {
        "topic": r"无卡模式",
        "patterns": [r"无卡模式[^|.]{0,60}?(?P<v>small[^|.;,)]*fee|\d+(?:\.\d+)?\s*元)"],
        "value": None,  # no amount is verified: stating one anywhere is a second, unsourced fact
    },
}


def doc_units(path):
    """The paragraphs, list items and table rows of PATH's body, each folded to one line (a profile's
    frontmatter is the fact's home, so it is left out)."""
    from test_profile_consistency import body_units
    text = path.read_text(encoding="utf-8")
    if path.parent.name == "profiles" and text.startswith("---\n"):
        text = text.split("\n---\n", 1)[1]
    return body_units(text)


def fact_value(fact):
    if "field" not in fact:
        return fact["value"], False
    from test_profile_consistency import resolve_field, split_profile
    pid, field = fact["field"]
    fm, _ = split_profile((REPO / "profiles" / (pid + ".md")).read_text(encoding="utf-8"))
    _found, value, _ = resolve_field(fm, field)
    uncertain = field in {e["field"] for e in fm.get("uncertain") or []}
    return value, uncertain


def fact_problems(files, facts=FACTS):
    """['file: fact: what is wrong'] for each statement that disagrees with the fact's one home."""
    problems = []
    for key, fact in facts.items():
        value, uncertain = fact_value(fact)
        for path in files:
            rel = path.relative_to(REPO).as_posix() if REPO in path.parents else path.name
            owner = "field" in fact and path.name == fact["field"][0] + ".md"
            for unit in doc_units(path):
                if not re.search(fact["topic"], unit) or ("only" in fact and not owner
                                                          and not re.search(fact["only"], unit)):
                    continue
                for rx in fact["patterns"]:
                    for m in re.finditer(rx, unit):
                        said = fact.get("same", {}).get(m.group("v"), m.group("v"))
                        if "field" in fact and type(value) is int and said != str(value):
                            problems.append("%s: %s is %s here but %s in its home: %s" % (rel, key, said, value,
                                                                                         unit[:100]))
                        elif "value" in fact and fact["value"] is None:
                            problems.append("%s: %s stated (%r) but unverified in its home" % (rel, key, said))
                        elif "value" in fact and said != fact["value"]:
                            problems.append("%s: %s is %r here, %r in its home: %s" % (rel, key, said,
                                                                                      fact["value"], unit[:100]))
                        elif uncertain and not HEDGE_WORDS.search(unit) and not re.search(fact["home"], unit):
                            problems.append("%s: %s is uncertain in its home but stated flatly here (hedge it or "
                                            "link the home): %s" % (rel, key, unit[:100]))
    return problems


def test_each_provider_fact_is_stated_one_way():
    assert fact_problems(doc_files()) == []


@pytest.mark.parametrize("planted, expect", [
    ("### U87 — x\n\nOn GKE Spot nodes the node-level window (30 s, extendable to 120 s) caps it anyway.\n",
     "GKE non-system pod grace (s) is '30'"),
    ("The warning window is 2 min on AWS, about 5 s on RunPod and zero on vast.ai.\n", "stated flatly"),
    ("| RunPod Spot | SIGTERM, then SIGKILL | 8 s | flag |\n", "runpod spot grace (s) is 8"),
    ("RunPod network volumes are disputed (hourly or per second) in billing.\n", "'disputed' here"),
    ("On Lambda Cloud a `shutdown` stops nothing; billing goes on.\n", "Lambda OS shutdown ends billing"),
    ("On AutoDL `shutdown` typed inside the instance is the same 关机 as the console button.\n",
     "AutoDL in-instance shutdown"),
    ("AutoDL: 无卡模式 (CPU-only, small hourly fee).\n", "AutoDL 无卡模式 rate stated"),
    ("On 恒源云 `/hy-tmp` is wiped once off over 48 h.\n", "Gpushare /hy-tmp wiped after (h) is '48'"),
    ("An AutoDL instance powered off for 30 days is released.\n", "released after (days) is '30'"),
    ("A stopped RunPod Pod bills its volume disk at 3× the running rate.\n", "rate (x running) is '3×'"),
])
def test_the_fact_check_catches_a_second_statement(tmp_path, planted, expect):
    extra = tmp_path / "planted.md"
    extra.write_text("# planted\n\n" + planted, encoding="utf-8")
    problems = fact_problems([extra])
    assert any(expect in p for p in problems), problems


# ---------------------------------------------------------------- runpodctl verbs: one table, aliases named

VERB_ROW = re.compile(r"`runpodctl ((?:pod |stop |remove |start )[a-z]+)[^`]*`")
LIFECYCLE = re.compile(r"runpodctl\s+((?:pod|pods)\s+(?:stop|delete|rm|remove|start)|(?:stop|remove|start)\s+pods?)\b")


def runpod_verb_table():
    text = (REPO / "profiles" / "runpod.md").read_text(encoding="utf-8")
    rows = [l for l in text.splitlines() if l.startswith("| `runpodctl") or l.startswith("| — | `runpodctl")]
    verbs = set()
    for row in rows:
        verbs.update(VERB_ROW.findall(row))
        verbs.update("pod " + a for a in re.findall(r"`pod (rm|remove)`", row))
    return verbs, rows


def test_runpod_verb_table_names_every_terminate_alias():
    verbs, rows = runpod_verb_table()
    assert {"pod delete", "pod rm", "pod remove", "remove pod", "pod stop", "stop pod"} <= verbs
    terminate = [r for r in rows if "pod delete" in r]
    assert terminate and "terminate" in terminate[0] and "`pod rm`" in terminate[0]


def runpodctl_outside_the_table(paths):
    verbs, _ = runpod_verb_table()
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for verb in LIFECYCLE.findall(line):
                if " ".join(verb.split()) not in verbs:
                    found.append("%s:%d: runpodctl %s" % (path.name, n, verb))
    return found


def test_every_runpodctl_lifecycle_verb_is_in_the_profile_table():
    paths = doc_files() + [p for p in code_files()]
    assert runpodctl_outside_the_table(paths) == []


def test_the_verb_check_catches_an_unlisted_form(tmp_path):
    f = tmp_path / "x.md"
    f.write_text("run `runpodctl pods rm $RUNPOD_POD_ID` to clean up\n")
    assert runpodctl_outside_the_table([f]) == ["x.md:1: runpodctl pods rm"]


# ---------------------------------------------------------------- vast.ai: a destroy the dead-man runs skips the prompt

DESTROY_STOP = re.compile(r"--stop-cmd[= ]+['\"]?vastai destroy instances?\b(?P<rest>[^'\"`]*)")


def unattended_vast_destroys_without_yes(paths):
    """--stop-cmd 'vastai destroy instance …' lines without -y: the current CLI then asks [y/N], reads EOF with no
    terminal, prints Aborted. and exits 0 having destroyed nothing."""
    found = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in DESTROY_STOP.finditer(line):
                if not re.search(r"(^|\s)(-y|--yes)\b", m.group("rest")):
                    found.append("%s:%d" % (path.name, n))
    return found


def test_every_unattended_vast_destroy_passes_yes():
    assert unattended_vast_destroys_without_yes(doc_files() + list(code_files())) == []
    body = (REPO / "profiles" / "vastai.md").read_text(encoding="utf-8")
    assert "recycle instance" in body and "--cancel-unavail" in body


def test_the_yes_check_catches_a_prompting_destroy(tmp_path):
    f = tmp_path / "x.md"
    f.write_text("arm with --stop-cmd 'vastai destroy instance $CONTAINER_ID' --stop-cmd-destructive\n"
                 "arm with --stop-cmd 'vastai destroy instance -y $CONTAINER_ID' --stop-cmd-destructive\n")
    assert unattended_vast_destroys_without_yes([f]) == ["x.md:1"]
