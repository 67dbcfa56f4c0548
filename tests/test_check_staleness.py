"""tools/check_staleness.py: old and future "verified" stamps are listed; --strict makes them fail."""
import json
import subprocess
import sys

from conftest import NODE, REPO, SCRIPTS, TOOLS


def run(*args):
    res = subprocess.run([sys.executable, str(TOOLS / "check_staleness.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=30)
    assert "Traceback" not in res.stderr
    return res


def tree(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "references" / "run-remote").mkdir(parents=True)
    (tmp_path / "profiles" / "x.md").write_text("---\nverified: 2026-01\n---\n# X\nSource: u (verified 2026-11)\n")
    (tmp_path / "references" / "run-remote" / "r.md").write_text("Source: u (verified 2027-03)\nplain 2020-01\n")
    return tmp_path


def test_lists_stale_and_future_stamps(tmp_path):
    res = run("--root", tree(tmp_path), "--today", "2026-12", "--max-age-months", "6", "--json")
    found = {(f["file"], f["status"], f["age_months"]) for f in json.loads(res.stdout)["findings"]}
    assert found == {("profiles/x.md", "STALE", 11), ("references/run-remote/r.md", "FUTURE", -3)}
    assert res.returncode == 1  # a stamp in the future is a typo, not advice


def test_advisory_unless_strict(tmp_path):
    root = tree(tmp_path)
    (root / "references" / "run-remote" / "r.md").write_text("Source: u (verified 2026-10)\n")
    assert run("--root", root, "--today", "2026-12").returncode == 0
    strict = run("--root", root, "--today", "2026-12", "--strict")
    assert strict.returncode == 1 and "STALE profiles/x.md:2 verified 2026-01" in strict.stdout
    assert run("--root", root, "--today", "2026-12", "--strict", "--max-age-months", "12").returncode == 0


def test_runs_on_the_repo_and_rejects_bad_input(tmp_path):
    res = run("--root", REPO, "--json")
    assert res.returncode in (0, 1) and json.loads(res.stdout)["stamps"] > 50
    for bad in (["--today", "2026-13"], ["--max-age-months", "-1"], ["--root", tmp_path]):
        res = run(*bad)
        assert res.returncode == 2 and res.stderr.count("\n") == 1
