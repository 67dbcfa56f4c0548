"""The toolkit's shape (GUIDE §6): one core, no hidden programs, documented options, one version."""
import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import LAPTOP_LIBRARIES, LIBRARY_MODULES, NODE, REPO, SCRIPTS, TOOLS, missing

NODE_PY = sorted(p for p in NODE.glob("*.py") if p.name not in LIBRARY_MODULES)  # the node's runnable tools
LAPTOP_PY = sorted(p for p in SCRIPTS.glob("*.py") if p.name not in LAPTOP_LIBRARIES)   # runnable
MAINTAINER_PY = sorted(TOOLS.glob("*.py"))
SHELL = sorted(NODE.glob("*.sh"))
# The safety helpers that exist once, in the core; a tool defining one of these is a drifting copy.
CORE_ONLY = {"atomic_write", "atomic_write_json", "write_atomic", "write_json_atomic", "fsync_dir", "pid_alive",
             "process_identity", "sha256_file", "hash_file", "load_profile", "profile_defaults", "find_index",
             "index_path", "profile_index_candidates", "disk_gate", "parse_manifest", "path_problem",
             "verify_tree", "scan_tree", "check_pattern", "compile_pattern", "utc_now", "iso", "human"}


def functions(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.mark.parametrize("path", NODE_PY + LAPTOP_PY + MAINTAINER_PY, ids=lambda p: p.name)
def test_no_private_copy_of_a_core_helper(path):
    assert functions(path) & CORE_ONLY == set()


def test_the_copy_check_can_fail(tmp_path):
    bad = tmp_path / "tool.py"
    bad.write_text("def atomic_write(path, data):\n    pass\n")
    assert functions(bad) & CORE_ONLY == {"atomic_write"}


def calls_check_toolkit(path):
    """Whether PATH calls core.check_toolkit(), itself or through the node module whose main() it runs as its
    own command line (a provider adapter runs providers.main)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "check_toolkit":
            return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "main" and isinstance(node.value, ast.Name):
            owner = path.parent / (aliases.get(node.value.id, "") + ".py")
            if owner != path and owner.is_file() and calls_check_toolkit(owner):
                return True
    return False


@pytest.mark.parametrize("path", NODE_PY, ids=lambda p: p.name)
def test_every_node_tool_checks_the_toolkit_version(path):
    assert calls_check_toolkit(path), f"{path.name} never calls core.check_toolkit()"


def test_a_tool_that_runs_another_tools_main_checks_through_it(tmp_path):
    (tmp_path / "lib.py").write_text("def main(argv=None):\n    return 0\n")
    (tmp_path / "tool.py").write_text("import functools\nimport lib as pv\n\nif __name__ == '__main__':\n"
                                      "    functools.partial(pv.main, fixed_profile='x')()\n")
    assert not calls_check_toolkit(tmp_path / "tool.py")
    (tmp_path / "lib.py").write_text("import rgt_core as core\n\ndef main(argv=None):\n    core.check_toolkit()\n")
    assert calls_check_toolkit(tmp_path / "tool.py")


PY_IN_SHELL = re.compile(r"^\s*(import \w+|from \w+ import |def \w+\(.*\):\s*$)")


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_no_python_hidden_in_shell(path):
    lines = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if PY_IN_SHELL.match(line)]
    heredocs = re.findall(r"<<-?\s*['\"]?(PY|PYTHON)\b", path.read_text(encoding="utf-8"))
    assert not lines and not heredocs, f"{path.name}: Python at lines {lines[:5]}"


# ---------------------------------------------------------------- options: documented both ways

# rgt.py commands that hand every word to a script of their own, whose docstring this test checks separately.
DELEGATED = {"reap": "reap.py"}
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")


def python_doc_and_accepted(path):
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    env = dict(os.environ, RGT_SKIP_VERSION_CHECK="1")
    res = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, f"{path.name} --help: {res.stderr[-300:]}"
    accepted = res.stdout
    # A tool with subcommands accepts what each subcommand's --help lists, too: the ones its usage
    # shows as {a,b}, lists under "positional arguments", or its docstring shows as "<tool> <word>".
    subs = set()
    choices = re.search(r"\{([a-z][a-z0-9_-]*(?:,[a-z][a-z0-9_-]*)+)\}", res.stdout)
    subs.update(choices.group(1).split(",") if choices else ())
    subs.update(re.findall(r"^    ([a-z][a-z0-9_-]+)(?:\s{2,}|$)", res.stdout, re.M))
    subs.update(re.findall(r"\b%s\s+([a-z][a-z0-9_-]+)\b" % re.escape(path.name), doc))
    for sub in sorted(subs):
        if path.name == "rgt.py" and sub in DELEGATED:
            continue      # its own script's docstring documents it (that script is checked on its own)
        more = subprocess.run([sys.executable, str(path), sub, "--help"], capture_output=True, text=True, env=env,
                              timeout=60)
        if more.returncode == 0 and more.stdout != res.stdout:
            accepted += more.stdout
    return doc, accepted


def shell_doc_and_accepted(path):
    text = path.read_text(encoding="utf-8")
    header = []
    for line in text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    accepted = " ".join(re.findall(r"^\s*((?:-\w\|)?--[a-z][a-z0-9-]+(?:\|--[a-z][a-z0-9-]+)*)\)", text, re.M))
    return "\n".join(header), accepted


def own_options(name, doc):
    """Options the docs name for this tool: a line showing another command (deadman.py ack ..., rsync ...,
    torchrun ...) documents that command's options, not ours, and is left out."""
    other = re.compile(r"\b(?!%s\b)[\w-]+\.(?:py|sh)\b|\b(rsync|ssh|torchrun|tmux|nvidia-smi|pip|curl|hf)\b"
                       % re.escape(name))
    return {opt for line in doc.splitlines() if not other.search(line) for opt in OPTION.findall(line)}


@pytest.mark.parametrize("path", NODE_PY + LAPTOP_PY + MAINTAINER_PY + SHELL, ids=lambda p: p.name)
def test_every_accepted_option_is_documented(path):
    doc, accepted = (shell_doc_and_accepted if path.suffix == ".sh" else python_doc_and_accepted)(path)
    documented = set(OPTION.findall(doc))
    undocumented = set(OPTION.findall(accepted)) - documented - {"--help"}
    assert not undocumented, f"{path.name}: accepted but not in its docstring/header: {sorted(undocumented)}"


@pytest.mark.parametrize("path", NODE_PY + LAPTOP_PY + MAINTAINER_PY + SHELL, ids=lambda p: p.name)
def test_every_documented_option_is_accepted(path):
    doc, accepted = (shell_doc_and_accepted if path.suffix == ".sh" else python_doc_and_accepted)(path)
    made_up = own_options(path.name, doc) - set(OPTION.findall(accepted)) - {"--help"}
    assert not made_up, f"{path.name}: its docstring/header names options it does not accept: {sorted(made_up)}"


# ---------------------------------------------------------------- old Pythons get one line

def old_python(version):
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", version + "*", "bin", "python" + version)))
    path = found[-1] if found else shutil.which("python" + version)
    if not path:
        missing(f"python{version} is not installed (pyenv install {version}, or put any python{version} on PATH; "
                "the GitHub workflow takes one from conda-forge)")
    return path


@pytest.mark.parametrize("path", NODE_PY, ids=lambda p: p.name)
def test_python_36_gets_one_clear_line(path):
    res = subprocess.run([old_python("3.6"), str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "needs Python 3.8+" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_delegated_command_is_checked_in_its_own_script():
    """The skip above holds only while the script that owns the command is itself in the checked list."""
    assert all(SCRIPTS / name in LAPTOP_PY for name in DELEGATED.values())
