"""One statement per fact (issue 30): the default disk floor is one constant in rgt_core that every tool reads,
and the atomic-save recipe is written out once in the references, which all other entries link to. Each
check is paired with a test that shows it catches a second copy."""
import json
import os
import re
import subprocess
import sys

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
