"""Help that answers (issue 30): every option of every script has help text, every --help ends with the
exit codes, and every tool's docstring opens with one line saying what it guarantees.

Options are read the way an agent reads them: by running `--help` (and `SUB --help` for each subcommand)
and parsing argparse's listing. A shell script's --help is checked for the exit codes only (its options
are documented in its header, which test_toolkit holds to what the script accepts)."""
import ast
import os
import re
import subprocess
import sys

import pytest

from conftest import LAPTOP_LIBRARIES, LIBRARY_MODULES, NODE, REPO, SCRIPTS, TOOL_LIBRARIES, TOOLS

sys.path.insert(0, str(NODE))
import rgt_core as core  # noqa: E402

# Imported, never run: no --help (test_a_library_module_has_no_command_line holds them to that).
LIBRARY_PATHS = sorted([NODE / name for name in LIBRARY_MODULES] + [TOOLS / name for name in TOOL_LIBRARIES]
                       + [SCRIPTS / name for name in LAPTOP_LIBRARIES])
LIBRARIES = {p.name for p in LIBRARY_PATHS}
PYTHON = sorted([p for p in SCRIPTS.glob("*.py") if p.name not in LIBRARIES] + [p for p in NODE.glob("*.py") if p.name not in LIBRARIES]
                + [p for p in TOOLS.glob("*.py") if p.name not in LIBRARIES] + sorted((REPO / "evals").glob("*.py")))
SHELL = sorted(NODE.glob("*.sh"))

ENV = dict(os.environ, RGT_SKIP_VERSION_CHECK="1", COLUMNS="100")
ITEM = re.compile(r"^(  |    )(\S.*?)(?:\s{2,}(\S.*))?$")
SECTION = re.compile(r"^[A-Za-z][\w ,()-]*:\s*$")


def run_help(cmd):
    res = subprocess.run(cmd + ["--help"], capture_output=True, text=True, env=ENV, timeout=60)
    return res.returncode, res.stdout


def items_without_help(text):
    """The options, positionals and subcommands argparse lists with no help text.

    Inside a section ('options:', 'positional arguments:', a named group) an entry is a line indented two
    spaces (four for a subcommand under its {a,b} line); its help is on the same line after two spaces or
    on the next line indented six or more. The {a,b} line itself needs none: its subcommands carry it."""
    out, inside, lines = [], False, text.splitlines()
    for i, line in enumerate(lines):
        if SECTION.match(line):
            inside = not line.lower().startswith(("usage", "exit", "example"))
            continue
        if not line.strip():
            inside = False
            continue
        m = ITEM.match(line) if inside else None
        if not m or m.group(3) or m.group(2).startswith("{"):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if re.match(r"^ {6,}\S", nxt):
            continue  # the help is on the next, deeper-indented line
        out.append(m.group(2).strip())
    return out


def subcommands(text, prog=None):
    """Subcommand names: from the usage line ({a,b,c}), else the four-space entries argparse lists under a
    positional with a metavar (COMMAND), else (a --help that prints its docstring, launcher.py's) the
    docstring's Usage lines `  PROG SUB ...`."""
    m = re.search(r"\{([a-z][a-z0-9_-]*(?:,[a-z][a-z0-9_-]*)*)\}", text.split("\n\n")[0])
    if m:
        return m.group(1).split(",")
    section = re.search(r"^positional arguments:\n((?:  .*\n?)+)", text, re.M)
    if section:
        return re.findall(r"^    ([a-z][a-z0-9_-]*)(?:\s{2,}|$)", section.group(1), re.M)
    if prog:
        found = re.findall(r"^  %s ([a-z][a-z0-9_-]*)\b" % re.escape(prog), text, re.M)
        return list(dict.fromkeys(found))
    return []


def ends_with_exit_codes(text):
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return bool(paragraphs) and paragraphs[-1].lstrip().lower().startswith("exit codes")


def help_problems(path):
    """[problem] for one Python tool: entries without help, and --help outputs not ending in the exit codes."""
    problems = []
    rc, text = run_help([sys.executable, str(path)])
    if rc != 0 or not text.strip():
        return ["%s --help exits %d with %d chars on stdout" % (path.name, rc, len(text))]
    pages = [(path.name, text)]
    for sub in subcommands(text, path.name):
        rc, more = run_help([sys.executable, str(path), sub])
        if rc != 0:
            problems.append("%s %s --help exits %d" % (path.name, sub, rc))
        elif more != text:
            pages.append(("%s %s" % (path.name, sub), more))
    for name, page in pages:
        bare = items_without_help(page)
        if bare:
            problems.append("%s --help: no help text for %s" % (name, ", ".join(bare)))
        if not ends_with_exit_codes(page):
            problems.append("%s --help does not end with the exit codes" % name)
    return problems


@pytest.mark.parametrize("path", PYTHON, ids=lambda p: p.name)
def test_every_option_has_help_and_help_ends_with_exit_codes(path):
    assert help_problems(path) == []


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_shell_help_ends_with_exit_codes(path):
    res = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True, env=ENV, timeout=60)
    assert res.returncode == 0, res.stderr[-300:]
    assert ends_with_exit_codes(res.stdout), res.stdout[-400:]


def docstring_problems(path):
    """The docstring must open with one line of its own (what the tool guarantees), then a blank line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
    lines = doc.strip("\n").split("\n")
    if not lines[0].strip():
        return ["%s has no docstring" % path.name]
    if len(lines) > 1 and lines[1].strip():
        return ["%s: the docstring's first line runs on into a second: %r" % (path.name, lines[1][:60])]
    if len(lines[0]) > 120:
        return ["%s: the first line is %d chars (at most 120)" % (path.name, len(lines[0]))]
    return []


@pytest.mark.parametrize("path", PYTHON + LIBRARY_PATHS, ids=lambda p: p.name)
def test_docstring_opens_with_one_line(path):
    assert docstring_problems(path) == []


def has_main_block(path):
    """True when the module runs something as a script (a top-level `if __name__ == "__main__":`)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__":
            return True
    return False


# The core answers `--version` (rgt.py push) and `--default` (the shell scripts): not a tool a person calls.
@pytest.mark.parametrize("path", [p for p in LIBRARY_PATHS if p.name != "rgt_core.py"], ids=lambda p: p.name)
def test_a_library_module_has_no_command_line(path):
    """The help checks skip LIBRARY_MODULES and TOOL_LIBRARIES; that is only right while they cannot be run."""
    assert not has_main_block(path), \
        "%s runs as a script: take it off its list in tests/conftest.py and give it help text" % path.name


def test_epilog_helper_names_every_code():
    text = core.exit_codes_epilog()
    assert text.startswith("Exit codes:")
    for code in ("0", "1", "2", "3"):
        assert re.search(r"\b%s\b" % code, text)
    assert "nothing matched" in core.exit_codes_epilog(fail="nothing matched")


# ---------------------------------------------------------------- the checks can fail

BARE = """usage: x.py [-h] [--json] [--out FILE] {a,b} ...

positional arguments:
  {a,b}
    a          does a
    b
  path         a path

options:
  -h, --help   show this help message and exit
  --json
  --out FILE   where to write
  --long-option-name LONG_OPTION_NAME
                        help on the next line

Exit codes: 0 ok; 1 failed.
"""


def test_parser_finds_bare_options_and_a_missing_epilog():
    assert items_without_help(BARE) == ["b", "--json"]
    assert ends_with_exit_codes(BARE)
    assert not ends_with_exit_codes(BARE.replace("Exit codes: 0 ok; 1 failed.\n", "See the README.\n"))
    assert subcommands(BARE) == ["a", "b"]
    assert subcommands("usage: r [-h] COMMAND\n\npositional arguments:\n  COMMAND\n    push   p\n    gate\n") \
        == ["push", "gate"]


def test_a_runnable_library_is_noticed(tmp_path):
    tool = tmp_path / "lib.py"
    tool.write_text('"""A library."""\n\n\ndef f():\n    return 1\n')
    assert not has_main_block(tool)
    tool.write_text('"""A library."""\nimport sys\n\nif __name__ == "__main__":\n    sys.exit(0)\n')
    assert has_main_block(tool)


def test_a_docstring_that_runs_on_fails(tmp_path):
    tool = tmp_path / "t.py"
    tool.write_text('"""Does a thing and\nthen another."""\n')
    assert docstring_problems(tool)
    tool.write_text('"""Does a thing.\n\nMore."""\n')
    assert docstring_problems(tool) == []


def test_a_tool_without_help_text_fails(tmp_path):
    tool = tmp_path / "bare.py"
    tool.write_text('"""Does a thing."""\nimport argparse\np = argparse.ArgumentParser()\n'
                    'p.add_argument("--json", action="store_true")\np.parse_args()\n')
    problems = help_problems(tool)
    assert any("--json" in p for p in problems) and any("exit codes" in p for p in problems)


# ---------------------------------------------------------------- review D9: each command's own exit codes

RGT = SCRIPTS / "rgt.py"
# rgt.py COMMAND -> (the tool whose exit code it passes on, the line of that tool's "Exit codes" paragraph that
# applies, or None for all of it), and the codes rgt.py itself adds (read from its constants, not written here).
PASSES_ON = {"probe": (NODE / "node_probe.py", None), "launch": (NODE / "run_one.sh", None),
             "status": (NODE / "run_status.py", None), "ack": (NODE / "deadman.py", "ack"),
             "resume": (NODE / "boot_resume.py", None), "pull": (SCRIPTS / "pull_verified.py", None),
             "gate": (SCRIPTS / "teardown_gate.py", None), "sweep": (NODE / "final_sweep.py", None),
             "notify": (SCRIPTS / "notify_cli.py", None), "billing": (SCRIPTS / "billing.py", None)}
CODE = re.compile(r"(?:^|[;:,]\s*|\n\s*|\s{2,})(\d{1,3})\s+(?=[-a-zA-Z(])")


def exit_paragraph(path):
    """The 'Exit codes' paragraph of a tool's docstring (a shell script's comment header)."""
    if path.suffix == ".sh":
        lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in path.read_text().splitlines()
                 if ln.startswith("#")]
        doc = "\n".join(lines)
    else:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
    return next((p for p in re.split(r"\n\s*\n", doc) if p.lstrip().lower().startswith("exit codes")), "")


def tool_codes(path, line=None):
    text = exit_paragraph(path)
    if line:
        text = next(ln for ln in text.splitlines() if ln.strip().startswith(line))
    return set(CODE.findall(text))


def command_codes(name):
    """Every code `rgt.py NAME` can return: its tool's, rgt.py's own for that command, and the shared ones."""
    import rgt
    codes = {"0", "2"}
    if name in PASSES_ON:
        codes |= tool_codes(*PASSES_ON[name])
    if name not in ("ledger", "billing"):
        codes |= {str(rgt.SSH_UNREACHABLE), "1"}
    codes |= {"patrol": {str(rgt.PATROL_ESCALATE)}, "launch": {str(rgt.LEDGER_REFUSED)}, "resume": {str(rgt.LEDGER_REFUSED)},
              "pull": {"130", "143"}, "gate": {"130", "143"}, "ledger": {"1"}}.get(name, set())
    return codes


def test_finding_review_D9_each_rgt_command_ends_with_its_own_exit_codes():
    """patrol --help named no 10, status --help no 8: every command printed rgt's one shared paragraph."""
    sys.path.insert(0, str(SCRIPTS))
    import rgt
    pages = {}
    for name in rgt.COMMANDS:
        if name == "reap":
            continue   # scripts/reap.py's own parser answers `rgt.py reap --help` (held by the check above)
        rc, page = run_help([sys.executable, str(RGT), name])
        assert rc == 0 and ends_with_exit_codes(page), (name, page[-300:])
        paragraph = re.split(r"\n\s*\n", page.strip())[-1]
        named = set(re.findall(r"(?<![\w.-])(\d{1,3})(?![\w.])", paragraph))
        missing = command_codes(name) - named
        assert not missing, "rgt.py %s --help leaves out exit code(s) %s:\n%s" % (name, sorted(missing), paragraph)
        pages[name] = paragraph
    # one paragraph each, not the same one printed for all
    assert len(set(pages.values())) == len(pages), "two commands share one exit-codes paragraph"
    assert "UNWATCHED" in pages["status"] and "escalate" in pages["patrol"]


def test_finding_review_D9_exit_3_means_only_a_refusal():
    """Exit 3 meant 'nothing to read' (run_forensics), 'work to do' (final_sweep --check-only) and 'differs'
    (run_env --compare): every tool's documented 3 is now a refusal, and the codes moved are the ones used."""
    tools = sorted(SCRIPTS.glob("*.py")) + sorted(NODE.glob("*.py")) + sorted(NODE.glob("*.sh")) \
        + sorted(TOOLS.glob("*.py"))
    other = []
    for path in tools:
        for m in re.finditer(r"(?:^|[;:,]\s*|\n\s*|\s{2,})3\s+([^;\n]*)", exit_paragraph(path)):
            if "refus" not in m.group(1).lower():
                other.append("%s: 3 %s" % (path.name, m.group(1)[:80]))
    assert other == []
    sys.path.insert(0, str(SCRIPTS))
    import final_sweep
    import run_env
    import run_forensics
    assert (final_sweep.NEEDS_SYNC, run_env.DATA_DIFFERS, run_forensics.EXIT_MISSING) == (4, 4, 5)


def test_finding_review_D9_the_guard_reads_launcher_subcommands():
    """launcher.py --help prints its docstring, so the guard found no subcommand page to check (74 bare options)."""
    rc, text = run_help([sys.executable, str(NODE / "launcher.py")])
    assert rc == 0
    assert subcommands(text, "launcher.py") == ["prepare", "start", "init", "fail", "report"]
    assert help_problems(NODE / "launcher.py") == []


def test_the_code_reader_reads_every_layout():
    assert tool_codes(NODE / "run_status.py") == {"0", "1", "2", "4", "5", "6", "7", "8"}
    assert tool_codes(NODE / "deadman.py", "ack") == {"0", "2"}
    assert "9" not in tool_codes(SCRIPTS / "pull_verified.py")   # "kill -9" is no exit code
