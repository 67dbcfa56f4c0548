"""Git projects for the reproduction drills (test_repro.py, test_run_env.py)."""
import subprocess

from conftest import need


def git(cwd, *args):
    res = subprocess.run(["git", "-C", str(cwd), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def committed_project(tmp_path, source):
    """A git repo in TMP_PATH/proj whose one commit holds job.py = SOURCE."""
    need("git")
    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q")
    (proj / "job.py").write_text(source)
    git(proj, "add", "job.py")
    git(proj, "commit", "-qm", "job")
    return proj
