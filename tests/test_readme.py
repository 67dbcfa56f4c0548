"""What the README and the references teach runs as written: the README walk-through on a plain ssh box,
where pulls and the ledger land, and the lifecycle's `rgt.py launch` with the 143 hint (newcomer findings,
field R16).
"""
import os
import subprocess
import sys

from conftest import NODE, REPO, SCRIPTS
from laptop_fixture import durable  # noqa: F401
from sshd_fixture import rgt


# ---------------------------------------------------------------- newcomer 1, 2: the README's walk-through

def readme_walkthrough():
    text = (REPO / "README.md").read_text()
    block = text.split("## Use it without an agent", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = []
    for line in block.strip().splitlines():
        line = line.split(" # ", 1)[0].strip()
        for part in line.replace("&&", ";").split(";"):
            if part.strip().startswith("$R "):
                lines.append(part.strip()[3:])
    return text, lines


def test_finding_newcomer_1_the_readme_walkthrough_runs_on_a_plain_ssh_box(tmp_path, sshd_server, durable):  # noqa: F811
    """Each `$R ...` line of the README, as written, against the test sshd (a plain box, not a Pod): HOST is the
    test alias, '~/proj' a folder of this test, and launch gets --durable-dir here (its home is this machine's)."""
    import shlex
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    _text, lines = readme_walkthrough()
    launch = next(l for l in lines if l.startswith("launch "))
    profile = shlex.split(launch)[shlex.split(launch).index("--profile") + 1]
    durable_default = sys.modules["rgt_core"].profile_defaults(profile).get("DURABLE_DIR") or ""
    assert durable_default.startswith(("~/", os.path.expanduser("~") + "/")), \
        "the README launches with --profile %s, whose durable dir %r is not on every ssh box" % (profile, durable_default)
    assert cli  # the CLI the README names is this one
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("import os\nos.makedirs('ckpt', exist_ok=True)\n"
                                   "open('ckpt/final.json', 'w').write('{}')\nprint('step 1/1')\n")
    for line in lines:
        words = [w.replace("HOST", "gpu-box") for w in shlex.split(line)]
        words = [str(work) if w == "~/proj" else w for w in words]
        if words[0] == "launch":
            cut = words.index("--")
            words[cut:cut] = ["--durable-dir", str(durable)]
            words[words.index("--", cut + 2) + 1:words.index("--", cut + 2) + 1] = ["--deadman-dry-run", "--wait"]
        res = rgt(tmp_path, sshd_server, *words)
        if words[0] == "status":
            ok = res.returncode == 0 and "SUCCEEDED" in res.stdout
        elif words[0] == "resume":
            ok = res.returncode == 3 and "succeeded" in res.stdout   # nothing to resume: it says so
        else:
            ok = res.returncode == 0
        assert ok, (line, res.returncode, res.stdout, res.stderr)
    assert (tmp_path / "pulled" / "exp1" / "ckpt" / "final.json").is_file()


def test_finding_newcomer_2_the_readme_says_where_pulls_and_the_ledger_land(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    text, _lines = readme_walkthrough()
    dest = cli.build_parser().parse_args(["pull", "h", "r1"]).dest
    assert "./%s/RID/" % dest in text                     # pull's default --dest, as the README names it
    env = dict(os.environ)
    env.pop("XDG_STATE_HOME", None)
    default = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import rgt; "
                              "print(rgt.ledger_path())" % str(SCRIPTS)], capture_output=True, text=True,
                             env=env).stdout.strip()
    assert default.replace(os.path.expanduser("~"), "~") in text
    assert "$XDG_STATE_HOME/remote-gpu-trainer/ledger.jsonl" in text


# ---------------------------------------------------------------- field R16: lifecycle.md teaches rgt.py launch

def test_finding_field_R16_lifecycle_teaches_rgt_launch_and_the_143_hint(tmp_path):
    doc = (REPO / "references" / "run-remote" / "lifecycle.md").read_text()
    assert "still suggests fixing" not in doc
    phase3 = doc.split("## Phase 3", 1)[1].split("\n## ", 1)[0]
    first_block = phase3.split("```bash", 1)[1].split("```", 1)[0]
    assert first_block.strip().startswith("python3 scripts/rgt.py launch"), first_block
    assert "no ledger row" in phase3
    drill = doc.split("Then the drill", 1)[1].split("**Check**", 1)[0]
    assert "$R launch" in drill and "$R resume" in drill and "run_one.sh" not in drill
    # what the doc says of exit 143 is what run_status.py's hint says
    sys.path.insert(0, str(NODE))
    import run_status
    src = (NODE / "run_status.py").read_text()
    assert "rgt.py resume" in src and "rgt.py resume" in drill + doc.split("drill-a` ends", 1)[1][:400]
    assert run_status  # imported: the hint lives there
    # every rgt.py line the doc shows parses as the CLI's own syntax
    import shlex
    sys.path.insert(0, str(SCRIPTS))
    import rgt as cli
    shown = [l for l in doc.replace("\\\n", " ").splitlines() if "scripts/rgt.py launch" in l or l.startswith("$R ")]
    assert shown
    for line in shown:
        words = shlex.split(line.split(" # ", 1)[0].replace("$R ", "python3 scripts/rgt.py "))
        words = words[words.index("scripts/rgt.py") + 1:]
        argv = words[:words.index("--")] if "--" in words else words
        cli.build_parser().parse_args([w.replace("$", "") for w in argv])   # a usage error raises SystemExit
