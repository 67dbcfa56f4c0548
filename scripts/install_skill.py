#!/usr/bin/env python3
"""Installs the skill into agents' skill folders, never over a folder that is not this skill's, and checks the copy.

Usage:
  python3 scripts/install_skill.py                      # Claude Code + the shared ~/.agents/skills
  python3 scripts/install_skill.py --agent claude       # just ~/.claude/skills/remote-gpu-trainer
  python3 scripts/install_skill.py --agent codex --link # symlink to this checkout (edits show live)
  python3 scripts/install_skill.py --target DIR         # any skills folder
  python3 scripts/install_skill.py --dry-run            # say what would happen, change nothing

Agents and folders (user scope; --project DIR installs under DIR instead of HOME):
  claude                        ~/.claude/skills/
  codex, cursor, gemini, copilot ~/.agents/skills/   (the shared, vendor-neutral folder)

A copy carries what an agent needs (SKILL.md, references, profiles, scripts, examples, LICENSE),
not tests, evals or CI. The folder is always named remote-gpu-trainer, as the spec requires.
An existing install of ours (marked by .rgt-install.json, or a symlink to a checkout of this
skill) is replaced atomically; any other folder is left alone unless --force.

Exit codes: 0 installed (or would be, with --dry-run); 1 the installed copy failed verification;
2 usage or bad input; 3 refused to overwrite a folder that is not ours.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

SKILL = "remote-gpu-trainer"
MARKER = ".rgt-install.json"
CARRIED = ["SKILL.md", "LICENSE", "README.md", "SECURITY.md", "references", "profiles", "scripts", "examples"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".DS_Store")
AGENT_DIRS = {
    "claude": ".claude/skills",
    "codex": ".agents/skills",
    "cursor": ".agents/skills",
    "gemini": ".agents/skills",
    "copilot": ".agents/skills",
}
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


class Refused(Exception):
    """The target exists and is not ours."""


class BadInstall(Exception):
    """The installed copy does not verify."""


def frontmatter_name(skill_md: Path) -> str:
    """Return the `name:` of a SKILL.md frontmatter, or '' when it has none."""
    try:
        text = skill_md.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    if not text.startswith("---\n"):
        return ""
    end = text.find("\n---", 4)
    if end < 0:
        return ""
    for line in text[4:end].splitlines():
        m = re.match(r"name:\s*[\"']?([^\"'#]+?)[\"']?\s*$", line)
        if m:
            return m.group(1)
    return ""


def is_ours(dest: Path) -> bool:
    if dest.is_symlink():
        return frontmatter_name(dest / "SKILL.md") == SKILL
    return (dest / MARKER).is_file() and frontmatter_name(dest / "SKILL.md") == SKILL


def verify(dest: Path) -> None:
    """The install is usable: SKILL.md names itself and every relative link in it resolves."""
    skill_md = dest / "SKILL.md"
    name = frontmatter_name(skill_md)
    if name != SKILL:
        raise BadInstall(f"{skill_md}: frontmatter name is {name!r}, expected {SKILL!r}")
    if dest.name != SKILL:
        raise BadInstall(f"{dest}: folder must be named {SKILL}")
    broken = [t for t in LINK.findall(skill_md.read_text(encoding="utf-8"))
              if "://" not in t and not (dest / t).exists()]
    if broken:
        raise BadInstall(f"{skill_md}: links that do not resolve in the install: {', '.join(broken)}")


def copy_tree(src: Path, staging: Path) -> None:
    staging.mkdir()
    for item in CARRIED:
        path = src / item
        if path.is_dir():
            shutil.copytree(path, staging / item, ignore=IGNORED, symlinks=True)
        elif path.is_file():
            shutil.copy2(path, staging / item)
    marker = {"skill": SKILL, "source": str(src), "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "mode": "copy"}
    (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def holds_checkout(dest: Path, src: Path) -> bool:
    """Whether DEST is SRC, or a folder SRC lives in (a git clone installed in place, reached through any
    link): replacing DEST would delete the very checkout the installer runs from."""
    here, there = os.path.realpath(src), os.path.realpath(dest)
    return here == there or here.startswith(there.rstrip(os.sep) + os.sep)


def install_one(src: Path, skills_dir: Path, link: bool, force: bool, dry_run: bool) -> str:
    dest = skills_dir / SKILL
    if holds_checkout(dest, src):
        raise Refused(f"{dest} is this checkout itself; replacing it would delete it")
    exists = dest.exists() or dest.is_symlink()
    if exists and not is_ours(dest) and not force:
        hint = " (a git clone: update it with git pull)" if (dest / ".git").exists() else ""
        raise Refused(f"{dest} exists and is not an install of ours{hint}; use --force to replace it")
    kind = "symlink" if link else "copy"
    if dry_run:
        return f"DRY-RUN would {'replace' if exists else 'create'} {kind}: {dest}" + (f" -> {src}" if link else "")
    skills_dir.mkdir(parents=True, exist_ok=True)
    # Build and verify the new install beside the old one (under the skill's own name, which the
    # spec requires), then swap: any failure before the swap leaves the old install untouched.
    work = Path(tempfile.mkdtemp(prefix=".rgt-install-", dir=skills_dir))
    try:
        new = work / SKILL
        if link:
            new.symlink_to(src, target_is_directory=True)
        else:
            copy_tree(src, new)
        verify(new)
        if exists:
            os.rename(dest, work / "previous")
        os.rename(new, dest)
    finally:
        remove(work)
    return f"OK {'replaced' if exists else 'created'} {kind}: {dest}"


class Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr (exit 2), not the whole usage block."""
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (try --help)\n")
        sys.exit(2)


def nonempty_path(text: str) -> Path:
    if not text:   # Path("") would silently mean the current directory
        raise argparse.ArgumentTypeError("empty path")
    return Path(text)


def main(argv=None) -> int:
    ap = Parser(description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--agent", action="append", choices=sorted(AGENT_DIRS) + ["all"],
                    help="agent to install for (repeatable; default: claude and the shared ~/.agents folder)")
    ap.add_argument("--target", action="append", type=nonempty_path, metavar="DIR",
                    help="a skills folder to install into (repeatable); the skill lands in DIR/remote-gpu-trainer")
    ap.add_argument("--project", type=nonempty_path, metavar="DIR", help="install under DIR instead of HOME")
    ap.add_argument("--link", action="store_true", help="symlink to this checkout instead of copying")
    ap.add_argument("--force", action="store_true", help="replace a folder that is not an install of ours")
    ap.add_argument("--dry-run", action="store_true", help="print what would happen, change nothing")
    args = ap.parse_args(argv)
    for folder in args.target or []:
        there = os.path.abspath(folder)
        while not os.path.lexists(there):   # the part of the path that exists already
            there = os.path.dirname(there)
        if not os.path.isdir(there):
            ap.error(f"--target {folder}: {there} is not a directory")

    src = Path(__file__).resolve().parent.parent
    if frontmatter_name(src / "SKILL.md") != SKILL:
        print(f"error: {src} is not a checkout of {SKILL} (no SKILL.md naming it)", file=sys.stderr)
        return 2
    base = args.project if args.project else Path.home()
    if args.project and not os.path.isdir(args.project):   # os.path: an over-long name is False, not OSError
        print(f"error: --project {args.project} is not a directory", file=sys.stderr)
        return 2
    agents = args.agent or ([] if args.target else ["claude", "codex"])
    if "all" in agents:
        agents = sorted(AGENT_DIRS)
    folders = []
    for agent in agents:
        folder = base / AGENT_DIRS[agent]
        if folder not in folders:
            folders.append(folder)
    for folder in args.target or []:
        if folder.resolve() not in [f.resolve() for f in folders]:
            folders.append(folder)

    carried = [src / item for item in CARRIED if (src / item).is_dir()]
    for folder in folders:   # staging under a carried folder would be copied into itself, forever
        inside = [c for c in carried if os.path.realpath(folder) == os.path.realpath(c)
                  or os.path.realpath(folder).startswith(os.path.realpath(c) + os.sep)]
        if inside:
            print(f"error: {folder} is inside {inside[0]}, which the install copies; pick a folder outside "
                  f"the checkout's {', '.join(CARRIED)}", file=sys.stderr)
            return 2

    status = 0
    for folder in folders:
        if holds_checkout(folder / SKILL, src):   # copy or --link, --force or not: never delete the source
            print(f"SKIP {folder / SKILL} is this checkout itself (or holds it); nothing to install there")
            continue
        try:
            print(install_one(src, folder, args.link, args.force, args.dry_run))
        except Refused as exc:
            print(f"REFUSED {exc}", file=sys.stderr)
            status = max(status, 3)
        except BadInstall as exc:
            print(f"FAIL {exc}", file=sys.stderr)
            status = status or 1
        except OSError as exc:
            print(f"FAIL {folder}: {exc.strerror or exc}", file=sys.stderr)
            status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
