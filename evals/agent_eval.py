#!/usr/bin/env python3
"""Tier-2 evals: runs each case through a real agent CLI with the skill installed; grades against must-cover points.

For every prompt it installs the skill (scripts/install_skill.py) into a fresh temporary folder, runs
the agent command there, captures the answer and, where the agent reports them, the files it read
and their sizes, then grades the answer against the case's must-cover points: with --judge-cmd, or
by a key-term rubric (a point counts as covered when at least half of its content words are in the
answer). It writes results.json and summary.md into --out.

Usage:
  python3 evals/agent_eval.py --agent-cmd 'claude -p {prompt} --output-format stream-json --verbose' --limit 5
  python3 evals/agent_eval.py --agent-cmd 'codex exec {prompt}' --scope project
  python3 evals/agent_eval.py --agent-cmd 'gemini -p {prompt}' --triggers-only

Options:
  --agent-cmd CMD    shell command that runs the agent once; {prompt} is replaced by the prompt, shell-quoted,
                     {prompt_file} by a file holding it; without either the prompt goes to stdin
  --judge-cmd CMD    optional grader: gets {"prompt", "answer", "must_cover"} as JSON on stdin and prints
                     {"covered": [true, false, ...]} (one per point); default: the key-term rubric
  --agent NAME       which agent's skill folder to install into: claude, codex, gemini, copilot, cursor, all
                     (default all)
  --scope SCOPE      home: HOME points at a temporary home holding the skill (the agent then needs its key
                     in the environment); project: the skill goes under a temporary working folder and HOME
                     is left alone (default project)
  --cases FILE       cases file (default evals/cases.jsonl)
  --triggers FILE    trigger prompts (default evals/triggers.jsonl)
  --only ID          run only this case or trigger id (repeatable)
  --limit N          at most N cases and N trigger prompts
  --cases-only       skip the trigger prompts
  --triggers-only    skip the cases
  --timeout S        seconds per agent run (default 600)
  --pass-score F     share of must-cover points an answer needs to pass (default 0.5)
  --out DIR          where results.json and summary.md go (default: a new folder under the system temp dir)

What the agent read: RGT_EVAL_READ_LOG names a file in the run's environment; an agent or wrapper may
append one JSON line per file read ({"path": ..., "chars": ...}). Claude Code's `--output-format
stream-json` output is also understood: its Read and Skill tool calls are the read log, its result
event the answer. A trigger prompt counts as loading the skill when the read log holds its SKILL.md
or a Skill call names remote-gpu-trainer.

Exit codes: 0 every graded answer passed; 1 some failed or an agent run failed; 2 usage or bad input.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "scripts" / "node"))
import rgt_core as core  # noqa: E402  (one error line, one exit-code contract, the one atomic write)

SKILL = "remote-gpu-trainer"
STOP = set("""a an the and or of to in on for with by at from as is are be it its this that than then
when what which who how why not no do does can may must only also into over under after before about
your you their they them our we""".split())


def load_jsonl(path):
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError as exc:
                raise core.UsageError("%s:%d is not JSON: %s" % (path, n, exc))
    return out


# ---------------------------------------------------------------- grading

def point_words(point):
    return {w for w in re.findall(r"[a-z0-9][a-z0-9_.-]*[a-z0-9]|[\u3400-\u9fff]{2,}", point.lower())
            if w not in STOP and (len(w) > 3 or w.isdigit() or "_" in w or "." in w)}


def rubric(answer, must_cover):
    """[covered?] per point: at least half of the point's content words appear in the answer."""
    text = answer.lower()
    out = []
    for point in must_cover:
        words = point_words(point)
        hit = sum(1 for w in words if w in text)
        out.append(bool(words) and hit * 2 >= len(words))
    return out


def judge(cmd, prompt, answer, must_cover, timeout):
    payload = json.dumps({"prompt": prompt, "answer": answer, "must_cover": must_cover})
    res = subprocess.run(cmd, shell=True, input=payload, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise core.CheckFailed("judge command exited %d: %s" % (res.returncode, res.stderr.strip()[-300:]))
    try:
        covered = json.loads(res.stdout)["covered"]
    except (ValueError, KeyError, TypeError):
        raise core.CheckFailed("judge command printed no {\"covered\": [...]} JSON")
    if not isinstance(covered, list) or len(covered) != len(must_cover):
        raise core.CheckFailed("judge returned %r for %d points" % (covered, len(must_cover)))
    return [bool(c) for c in covered]


# ---------------------------------------------------------------- running the agent

def install(agent, scope, base):
    """Install the skill for one run; returns (env changes, working folder)."""
    work = base / "work"
    work.mkdir()
    argv = [sys.executable, str(ROOT / "scripts" / "install_skill.py"), "--agent", agent]
    env = {}
    if scope == "home":
        home = base / "home"
        home.mkdir()
        argv += ["--project", str(home)]
        env["HOME"] = str(home)
    else:
        argv += ["--project", str(work)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise core.CheckFailed("install_skill.py failed: %s" % (res.stderr.strip() or res.stdout.strip())[-300:])
    return env, work


def parse_stream(stdout):
    """(answer, reads) from Claude Code stream-json output, or (None, []) when it is not that."""
    lines = [l for l in stdout.splitlines() if l.strip()]
    events = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            return None, []
        if isinstance(obj, dict):
            events.append(obj)
    if not events:
        return None, []
    answer, reads = None, []
    for ev in events:
        if ev.get("type") == "result" and isinstance(ev.get("result"), str):
            answer = ev["result"]
        content = (ev.get("message") or {}).get("content") if isinstance(ev.get("message"), dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                args = block.get("input") or {}
                if block.get("name") == "Read" and args.get("file_path"):
                    reads.append({"path": args["file_path"], "chars": None})
                elif block.get("name") == "Skill":
                    reads.append({"path": "skill:%s" % (args.get("skill") or args.get("name") or ""), "chars": None})
    return answer, reads


def read_log(path):
    reads = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("path"):
                chars = obj.get("chars")
                reads.append({"path": str(obj["path"]), "chars": chars if isinstance(chars, int) else None})
    return reads


def run_agent(args, prompt):
    """One agent run in a fresh install: {"answer", "reads", "rc", "seconds", "error"}."""
    with tempfile.TemporaryDirectory(prefix="rgt-agent-eval-") as tmp:
        base = Path(tmp)
        env_changes, work = install(args.agent, args.scope, base)
        prompt_file = base / "prompt.txt"
        prompt_file.write_text(prompt, encoding="utf-8")
        log = base / "reads.jsonl"
        cmd = args.agent_cmd.replace("{prompt_file}", shlex.quote(str(prompt_file)))
        uses_prompt = "{prompt}" in args.agent_cmd or "{prompt_file}" in args.agent_cmd
        cmd = cmd.replace("{prompt}", shlex.quote(prompt))
        env = dict(os.environ, RGT_EVAL_READ_LOG=str(log), RGT_EVAL_SKILL=SKILL, **env_changes)
        start = time.time()
        try:
            res = subprocess.run(cmd, shell=True, cwd=str(work), env=env, capture_output=True, text=True,
                                 input=None if uses_prompt else prompt, timeout=args.timeout)
            rc, out, err = res.returncode, res.stdout, res.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = 124, exc.stdout or "", "timed out after %ss" % args.timeout
            out = out.decode(errors="replace") if isinstance(out, bytes) else out
        answer, reads = parse_stream(out)
        reads = read_log(log) + reads
        return {"answer": out.strip() if answer is None else answer, "reads": reads, "rc": rc,
                "seconds": round(time.time() - start, 1), "error": err.strip()[-500:] if rc else ""}


def loaded_skill(reads):
    for r in reads:
        p = r["path"].replace("\\", "/")
        if p.endswith(SKILL + "/SKILL.md") or (p.startswith("skill:") and SKILL in p):
            return True
    return False


# ---------------------------------------------------------------- report

def summary_md(report):
    c, t = report["cases"], report["triggers"]
    lines = ["# Tier-2 agent eval", "",
             "- agent command: `%s`" % report["agent_cmd"],
             "- grader: %s" % report["grader"],
             "- date (UTC): %s" % report["date"], ""]
    if c["results"]:
        lines += ["Cases: %d of %d passed (mean coverage %.0f%%)." % (c["passed"], len(c["results"]),
                                                                     100 * c["mean_score"]), "",
                  "| case | score | passed | files read | chars read |", "|---|---|---|---|---|"]
        for r in c["results"]:
            chars = r["chars_read"] if r["chars_read"] is not None else "?"
            lines.append("| %s | %.2f | %s | %d | %s |" % (r["id"], r["score"], "yes" if r["passed"] else "no",
                                                            len(r["reads"]), chars))
        lines.append("")
    if t["results"]:
        lines += ["Triggers: %d of %d right (skill loaded when it should, and not when it should not)." % (
            t["right"], len(t["results"])), ""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = core.Parser(prog="agent_eval.py", description=__doc__.split("\n")[0],
                    formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
                    epilog=__doc__.split("\n", 2)[2])
    p.add_argument("--agent-cmd", required=True, metavar="CMD", help="shell command that runs the agent once")
    p.add_argument("--judge-cmd", metavar="CMD", help="optional grader command")
    p.add_argument("--agent", default="all", choices=["claude", "codex", "gemini", "copilot", "cursor", "all"],
                   help="which agent's skills folder to install into (default all)")
    p.add_argument("--scope", default="project", choices=["home", "project"],
                   help="install under a temporary HOME or a temporary project folder (default project)")
    p.add_argument("--cases", type=Path, default=HERE / "cases.jsonl", metavar="FILE",
                   help="cases file (default evals/cases.jsonl)")
    p.add_argument("--triggers", type=Path, default=HERE / "triggers.jsonl", metavar="FILE",
                   help="trigger prompts (default evals/triggers.jsonl)")
    p.add_argument("--only", action="append", metavar="ID", help="run only this id (repeatable)")
    p.add_argument("--limit", type=core.arg_number(int, 1), metavar="N", help="run only the first N cases and triggers")
    p.add_argument("--cases-only", action="store_true", help="skip the trigger prompts")
    p.add_argument("--triggers-only", action="store_true", help="skip the cases")
    p.add_argument("--timeout", type=core.arg_number(float, 0, low_open=True), default=600.0, metavar="S",
                   help="seconds per agent run (default 600)")
    p.add_argument("--pass-score", type=core.arg_number(float, 0.0, 1.0000001), default=0.5, metavar="F",
                   help="share of must-cover points an answer needs (default 0.5)")
    p.add_argument("--out", type=Path, metavar="DIR", help="where results.json and summary.md go")
    args = p.parse_args(argv)
    if not args.agent_cmd.strip():
        raise core.UsageError("--agent-cmd is empty")
    if args.cases_only and args.triggers_only:
        raise core.UsageError("--cases-only and --triggers-only exclude each other")
    for f in ((args.cases,) if not args.triggers_only else ()) + ((args.triggers,) if not args.cases_only else ()):
        if not f.is_file():
            raise core.UsageError("no such file: %s" % f)
    cases = [] if args.triggers_only else load_jsonl(args.cases)
    triggers = [] if args.cases_only else load_jsonl(args.triggers)
    if args.only:
        cases = [c for c in cases if c.get("id") in args.only]
        triggers = [t for t in triggers if t.get("id") in args.only]
        if not cases and not triggers:
            raise core.UsageError("no case or trigger has id %s" % ", ".join(args.only))
    if args.limit:
        cases, triggers = cases[:args.limit], triggers[:args.limit]
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="rgt-agent-eval-%s-" % time.strftime("%Y%m%dT%H%M%SZ",
                                                                                           time.gmtime())))
    out_dir.mkdir(parents=True, exist_ok=True)

    case_results, failed_runs = [], 0
    for case in cases:
        run = run_agent(args, case["prompt"])
        failed_runs += run["rc"] != 0
        covered = (judge(args.judge_cmd, case["prompt"], run["answer"], case["must_cover"], args.timeout)
                   if args.judge_cmd else rubric(run["answer"], case["must_cover"]))
        score = sum(covered) / float(max(1, len(covered)))
        sizes = [r["chars"] for r in run["reads"]]
        case_results.append({
            "id": case["id"], "score": round(score, 3), "passed": run["rc"] == 0 and score >= args.pass_score,
            "covered": covered, "key_terms_in_answer": [k for k in case.get("key_terms", [])
                                                         if k.lower() in run["answer"].lower()],
            "reads": run["reads"], "chars_read": sum(sizes) if sizes and None not in sizes else None,
            "read_expected": [f for f in case.get("expected_files", [])
                              if any(r["path"].replace("\\", "/").endswith(f) for r in run["reads"])],
            "rc": run["rc"], "seconds": run["seconds"], "error": run["error"], "answer": run["answer"]})
        sys.stderr.write("%s %s score %.2f\n" % ("PASS" if case_results[-1]["passed"] else "FAIL", case["id"], score))
    trigger_results = []
    for t in triggers:
        run = run_agent(args, t["prompt"])
        failed_runs += run["rc"] != 0
        loaded = loaded_skill(run["reads"])
        trigger_results.append({"id": t["id"], "should_trigger": bool(t["should_trigger"]), "loaded": loaded,
                                "right": loaded == bool(t["should_trigger"]), "rc": run["rc"],
                                "reads": run["reads"]})
    report = {
        "date": core.utc_iso(), "agent_cmd": args.agent_cmd,
        "grader": "judge: `%s`" % args.judge_cmd if args.judge_cmd else "key-term rubric (half of each point's words)",
        "pass_score": args.pass_score,
        "cases": {"results": case_results, "passed": sum(1 for r in case_results if r["passed"]),
                  "mean_score": sum(r["score"] for r in case_results) / float(max(1, len(case_results)))},
        "triggers": {"results": trigger_results, "right": sum(1 for r in trigger_results if r["right"])},
        "failed_runs": failed_runs,
    }
    core.atomic_write_json(str(out_dir / "results.json"), report)
    core.atomic_write(str(out_dir / "summary.md"), summary_md(report).encode("utf-8"))
    sys.stdout.write(summary_md(report))
    sys.stdout.write("results: %s\n" % (out_dir / "results.json"))
    bad = (report["cases"]["passed"] < len(case_results) or failed_runs
           or report["triggers"]["right"] < len(trigger_results))
    return core.EXIT_FAIL if bad else core.EXIT_OK


if __name__ == "__main__":
    sys.exit(core.run_main(main, prog="agent_eval.py"))
