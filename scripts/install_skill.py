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

A copy records the SHA-256 of every file it installed in .rgt-install.json. A re-run (the update path)
compares the install with that record first: when a file was changed or added there, it refuses, listing
them, and changes nothing. --force (for that, or for a folder that is not ours) moves the old tree aside
to ../.rgt-replaced/remote-gpu-trainer-<UTC time> beside the skills folder and prints where: nothing of
it is deleted. An older copy with no record is kept aside the same way; an unchanged one is replaced.

Exit codes: 0 installed (or would be, with --dry-run); 1 the installed copy failed verification;
2 usage or bad input; 3 refused to overwrite a folder that is not ours; 4 refused: our install was
changed since it was installed (the files are listed; --force keeps the old tree aside).
"""
import argparse
import fnmatch
import hashlib
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
IGNORED_NAMES = ("__pycache__", "*.pyc", ".pytest_cache", ".DS_Store")   # made by running the tools, not ours
IGNORED = shutil.ignore_patterns(*IGNORED_NAMES)
ASIDE = ".rgt-replaced"   # beside the skills folder, where no agent looks for skills
SHOWN = 20                # files named in a refusal; the rest are counted
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


class Changed(Exception):
    """Our install holds files its user changed or added (finding_laptop_L9): exit 4."""


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


def tree_hashes(root: Path) -> dict:
    """{relative posix path: sha256} of every file under ROOT (a symlink by its target), past the names
    running the tools makes (IGNORED_NAMES); the marker itself is not part of the install's content."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not any(fnmatch.fnmatch(d, pat) for pat in IGNORED_NAMES)
                         and not os.path.islink(os.path.join(folder, d)))
        links = [d for d in os.listdir(folder) if os.path.islink(os.path.join(folder, d))
                 and os.path.isdir(os.path.join(folder, d))]
        for name in sorted(set(files) | set(links)):
            if any(fnmatch.fnmatch(name, pat) for pat in IGNORED_NAMES):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if rel == MARKER:
                continue
            if os.path.islink(path):
                found[rel] = "link:" + os.readlink(path)
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            found[rel] = digest.hexdigest()
    return found


def user_changes(dest: Path):
    """(changed, added) files of our copy install at DEST against the hashes it recorded; None when it has no
    record (a copy from before the record existed), so nothing about it can be told."""
    try:
        recorded = json.loads((dest / MARKER).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return None
    now = tree_hashes(dest)
    changed = sorted(rel for rel, digest in now.items() if rel in recorded and recorded[rel] != digest)
    added = sorted(rel for rel in now if rel not in recorded)
    return changed, added


def listed(names) -> str:
    return ", ".join(names[:SHOWN]) + (" and %d more" % (len(names) - SHOWN) if len(names) > SHOWN else "")


def aside_path(skills_dir: Path) -> Path:
    """A fresh folder name for an old tree kept aside: ../.rgt-replaced/remote-gpu-trainer-<UTC time>[-N]."""
    base = skills_dir.parent / ASIDE / ("%s-%s" % (SKILL, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    path, number = base, 1
    while os.path.lexists(path):
        number += 1
        path = base.with_name("%s-%d" % (base.name, number))
    return path


def copy_tree(src: Path, staging: Path) -> None:
    staging.mkdir()
    for item in CARRIED:
        path = src / item
        if path.is_dir():
            shutil.copytree(path, staging / item, ignore=IGNORED, symlinks=True)
        elif path.is_file():
            shutil.copy2(path, staging / item)
    marker = {"skill": SKILL, "source": str(src), "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "mode": "copy", "files": tree_hashes(staging)}   # what a later re-run compares the install with
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
    why_aside = None   # why the old tree is kept (moved aside) rather than removed
    if exists and not dest.is_symlink():   # replacing a link deletes nothing behind it
        diff = user_changes(dest) if is_ours(dest) else ([], [])
        if not is_ours(dest):
            why_aside = "it was not an install of ours"
        elif diff is None:
            why_aside = "it is an older install with no record of the files it installed"
        elif diff[0] or diff[1]:
            what = "; ".join(part for part in ("changed: " + listed(diff[0]) if diff[0] else "",
                                               "added: " + listed(diff[1]) if diff[1] else "") if part)
            if not force:
                raise Changed(f"{dest} was changed since it was installed ({what}); nothing was touched: copy "
                              "your files elsewhere first, or re-run with --force, which moves the old tree aside "
                              "(never deletes it)")
            why_aside = f"it held your own files ({what})"
    aside = aside_path(skills_dir) if why_aside else None
    if dry_run:
        return f"DRY-RUN would {'replace' if exists else 'create'} {kind}: {dest}" + (f" -> {src}" if link else "") \
            + (f"; the old tree would be kept at {aside} ({why_aside})" if aside else "")
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
        if aside:
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.rename(dest, aside)     # same filesystem as a rule; EXDEV fails here, before anything moved
        elif exists:
            os.rename(dest, work / "previous")
        try:
            os.rename(new, dest)
        except OSError:
            if aside:
                os.rename(aside, dest)
            raise
    finally:
        remove(work)
    kept = f"\nKEPT the old tree at {aside} ({why_aside}): nothing of it was deleted" if aside else ""
    return f"OK {'replaced' if exists else 'created'} {kind}: {dest}" + kept


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
    ap.add_argument("--force", action="store_true", help="replace a folder that is not an install of ours, or our "
                    "install holding files you changed or added: the old tree is moved aside, never deleted")
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
        except Changed as exc:
            print(f"REFUSED {exc}", file=sys.stderr)
            status = max(status, 4)
        except BadInstall as exc:
            print(f"FAIL {exc}", file=sys.stderr)
            status = status or 1
        except OSError as exc:
            print(f"FAIL {folder}: {exc.strerror or exc}", file=sys.stderr)
            status = status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
