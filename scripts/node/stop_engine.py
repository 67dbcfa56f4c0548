#!/usr/bin/env python3
"""The one meter-stop engine: plan, run, confirm, retry, fall back, escalate.

Guarantee: a stop counts only when it is confirmed (or cannot be confirmed and says so); a stop
that cannot run is refused when it is armed, not discovered when it fires; no full or read-only
disk and no error in record keeping keeps the stop command from running.

Used by every watcher: the run dead-man, its idle-box mode (idle_watch.py) and the boot re-arm
(which re-arms the dead-man with the same plan). A library module (no command line).

  plan     stop_plan(): the command (explicit, else the profile's METER_STOP_CMD), destructive
           inference (destructive.py, at arm and again on the expanded argv at fire), $VAR / ${VAR}
           from the environment then PID 1's (containers keep the platform's ids there), and the
           program resolved on PATH at arm time. A file that is not a valid executable (a script
           without "#!", AutoDL's in-container `shutdown` is one) runs through /bin/sh, as a shell
           would run it; the path found at arm is the one run at fire, never a later one on PATH.
  run      each attempt under rgt_core.run_bounded (a hard timeout that holds with children),
           --retries attempts with exponential backoff, then the non-destructive fallback.
  confirm  by the provider's state where an adapter exists (providers.py), polled up to a cap;
           otherwise, for a stop meant to end the machine, "this process is still running
           --confirm-seconds later" means NOT confirmed. A command that is not meant to end the
           machine (a custom hook) cannot be confirmed: confirmed is null.
  escalate at the first NOT CONFIRMED and when every stop failed: a record ("escalations") and a
           notification through notify.py when that module is configured; never blocking.

A provider plan (findings C3-C5) runs `providers.py stop` as a subprocess, as on the box: exit 0 only when
the state of THIS instance read stopped/gone on consecutive reads (providers.py says how many, over how
long). Two more rules hold it to the truth:
  still up  a provider stop of this box that read CONFIRMED is revoked (confirmed false, escalated, the
           sequence goes on) when this process is still running cfg still_up_seconds later (default 180;
           0 = no check, for a rehearsal off the box): the box it stopped was this one.
  fallback  a fallback's exit code never confirms a provider stop (C4): after it exits 0 the provider's state
           is read back (`providers.py confirm`, no request sent); only a confirming read-back counts.
Every attempt's output and error passes rgt_core.redact before it is recorded (C8).

The fired record (the caller's dict) gains: attempts[], fallback{}, ok, confirmed (true/false/null),
confirmation{}, escalations[], message.
"""
import errno
import os
import shlex
import socket
import sys
import time

import destructive
import rgt_core as core

UNRESOLVED_VAR = destructive.re.compile(r"\$(\{\w+\}|\w+)")
NO_STOP_MSG = "no on-node stop command; the meter is still running"
REFUSED_MSG = "refused: destructive stop without verified durable sync"
NOT_CONFIRMED = "STOP NOT CONFIRMED"
# Programs whose success should end this machine (or container): their effect can be confirmed by
# our own survival. A custom hook (a script that suspends a queue, a test stand-in) cannot.
ENDS_BOX = {"shutdown", "poweroff", "halt", "runpodctl", "vastai", "init", "telinit"}
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
DEFAULT_CONFIRM_SECONDS = 90.0
DEFAULT_PROVIDER_CAP_SECONDS = 240.0
DEFAULT_STILL_UP_SECONDS = 180.0   # a stopped pod/instance/machine takes its container down within seconds
SLICE = 0.5


def split_cmd(text, what):
    """shlex-split an argv string; UsageError when empty or unbalanced."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise core.UsageError("%s cannot be split into arguments: %s" % (what, exc))
    if not argv:
        raise core.UsageError("%s is empty" % what)
    return argv


def init_environ():
    """PID 1's environment: in a container it holds what the platform injected (pod or instance ids),
    which an SSH login shell - and so everything started from it - often does not see."""
    try:
        with open("/proc/1/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def variable_names(text):
    return sorted({m.group(1).strip("{}") for m in UNRESOLVED_VAR.finditer(text or "")})


def expand_argv(text, environ=None):
    """argv with $VAR/${VAR} expanded from the environment, then from PID 1's; (argv, [unresolved names])."""
    tokens = shlex.split(text)
    names = set(variable_names(text))
    env = dict(os.environ if environ is None else environ)
    if names - set(env):
        extra = init_environ()
        env.update({k: extra[k] for k in names - set(env) if k in extra})

    def sub(match):
        return env.get(match.group(1).strip("{}"), match.group(0))
    argv = [UNRESOLVED_VAR.sub(sub, tok) for tok in tokens]
    return argv, sorted(n for n in names if n not in env)


# ----------------------------------------------------------------------------- the program

def needs_shell(path):
    """True when PATH is a regular file execve would refuse with ENOEXEC (no "#!", not ELF), or one
    without the execute bit that a shell can still read: both run through /bin/sh."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return False
    if not os.access(path, os.X_OK):
        return True
    return not (head.startswith(b"#!") or head == b"\x7fELF")


def resolve_program(name, search_path=None):
    """(absolute path, via_sh, problem): where NAME runs from, or why it cannot run.

    The sbin folders are searched after PATH: an SSH session's PATH often lacks them while the
    platform's stop (shutdown) lives there."""
    if "/" in name:
        candidates = [os.path.abspath(name)]
    else:
        dirs = (search_path if search_path is not None else os.environ.get("PATH", "")).split(os.pathsep)
        candidates = [os.path.join(d or ".", name) for d in dirs + [s for s in SBIN if s not in dirs]]
    unreadable = None
    for path in candidates:
        if not os.path.isfile(path):
            continue
        if os.access(path, os.X_OK) or os.access(path, os.R_OK):
            return os.path.abspath(path), needs_shell(path), None
        unreadable = path
    if unreadable:
        return None, False, "%s is neither executable nor readable" % unreadable
    return None, False, "%s is not found%s" % (name, "" if "/" in name else " on PATH or in " + ":".join(SBIN))


def runnable(argv, plan_program=None):
    """The argv to execute: the program resolved at arm time when the name is unchanged, else now;
    a file that is not a valid executable goes through /bin/sh. (argv, problem)."""
    name = argv[0]
    if plan_program and plan_program.get("name") == name and plan_program.get("path"):
        path, via_sh = plan_program["path"], plan_program.get("via_sh")
        if not os.path.isfile(path):
            path, via_sh, problem = resolve_program(name)
            if problem:
                return None, problem
    else:
        path, via_sh, problem = resolve_program(name)
        if problem:
            return None, problem
    return (["/bin/sh", path] if via_sh else [path]) + list(argv[1:]), None


def describe_program(command):
    """{"name", "path", "via_sh"} for COMMAND's program as found now, or (None, problem)."""
    argv = shlex.split(command)
    name = argv[0]
    if UNRESOLVED_VAR.search(name):
        return {"name": name, "path": None, "via_sh": False}, None  # resolved at fire time
    path, via_sh, problem = resolve_program(name)
    if problem:
        return None, problem
    return {"name": name, "path": path, "via_sh": via_sh}, None


# ----------------------------------------------------------------------------- the plan

def ends_box(command, source, profile):
    """Should this stop end the machine (so our own survival disproves it)?"""
    try:
        base = os.path.basename(shlex.split(command)[0])
    except (ValueError, IndexError):
        return False
    return base in ENDS_BOX


def stop_plan(stop_cmd=None, stop_cmd_destructive=False, profile=None, profile_explicit=False,
              fallback_stop_cmd=None, pre_stop_cmd=None, confirm_seconds=None, dry_run=False,
              allow_destructive=False):
    """The checked stop plan -> (plan dict, warnings). Raises UsageError for a malformed command and
    Refused for one that cannot run here (so the watcher is not armed on a stop that would fail)."""
    warnings = []
    plan = {"stop_cmd": None, "stop_cmd_source": None, "destructive": False, "profile": profile,
            "fallback_stop_cmd": fallback_stop_cmd, "pre_stop_cmd": pre_stop_cmd}
    for flag, value in (("--pre-stop-cmd", pre_stop_cmd), ("--fallback-stop-cmd", fallback_stop_cmd)):
        if value is not None:
            split_cmd(value, flag)
    if stop_cmd is not None:
        split_cmd(stop_cmd, "--stop-cmd")
        plan.update(stop_cmd=stop_cmd, stop_cmd_source="--stop-cmd", destructive=bool(stop_cmd_destructive))
    elif profile:
        try:
            defaults = core.profile_defaults(profile)
        except core.UsageError as exc:
            if profile_explicit:
                raise
            defaults = None
            warnings.append("profile %s from run.json: %s" % (profile, exc))
        if defaults and defaults.get("METER_STOP_CMD"):
            split_cmd(defaults["METER_STOP_CMD"], "METER_STOP_CMD of profile %s" % profile)
            plan.update(stop_cmd=defaults["METER_STOP_CMD"], stop_cmd_source="profile:%s" % profile,
                        destructive=defaults.get("METER_STOP_DESTRUCTIVE") == "true")
            if defaults.get("METER_STOP_NEEDS"):
                plan["stop_cmd_needs"] = defaults["METER_STOP_NEEDS"]
    if stop_cmd_destructive and stop_cmd is None:
        raise core.UsageError("--stop-cmd-destructive describes --stop-cmd; give --stop-cmd too")
    if stop_cmd is None and profile:
        provider_stop(plan, profile, warnings, confirm_seconds)
    word = destructive.destructive_word(plan["stop_cmd"]) if plan["stop_cmd"] else None
    if word and not plan["destructive"]:
        plan.update(destructive=True, destructive_inferred_from=word)
        warnings.append("NOTE: the stop command looks destructive (%s), so it is treated as destructive (runs "
                        "only with --allow-destructive and a verified durable sync)" % word)
    fallback_word = destructive.destructive_word(fallback_stop_cmd) if fallback_stop_cmd else None
    if fallback_word:
        raise core.UsageError("--fallback-stop-cmd looks destructive (%s): the fallback must be non-destructive"
                              % fallback_word)
    # Checked now, not when it fires: the program, and the variables it needs.
    for key, what in (("stop_cmd", "the stop command"), ("fallback_stop_cmd", "--fallback-stop-cmd"),
                      ("pre_stop_cmd", "--pre-stop-cmd")):
        command = plan[key]
        if not command:
            continue
        program, problem = describe_program(command)
        missing = expand_argv(command)[1]
        if not problem and missing:
            problem = "it needs %s, unset here and in PID 1's environment" % ", ".join("$" + m for m in missing)
        if problem:
            line = "%s %r cannot run: %s" % (what, command, problem)
            if key == "fallback_stop_cmd" and plan.get("fallback_auto"):
                warnings.append("NOTE: the profile's own command %r cannot run here (%s): no fallback after the "
                                "API stop" % (command, problem))
                plan["fallback_stop_cmd"] = None
                continue
            if key == "stop_cmd" and plan["destructive"] and not allow_destructive:
                warnings.append("NOTE: " + line + " (it is refused anyway: destructive, no --allow-destructive)")
            elif dry_run:
                warnings.append("WARNING (dry run, armed anyway): " + line)
            elif key == "stop_cmd" and fallback_stop_cmd and missing and program is not None:
                warnings.append("WARNING: %s; the fallback runs instead if it is still unset at fire time" % line)
            else:
                raise core.Refused(line + "; fix it (or give a stop that runs here) before arming")
        plan[key.replace("_cmd", "_program")] = program
        if program and program.get("via_sh"):
            warnings.append("NOTE: %s is not a valid executable (no #! line or no execute bit): it runs "
                            "through /bin/sh" % program["path"])
    plan["ends_box"] = bool(plan["stop_cmd"]) and ends_box(plan["stop_cmd"], plan["stop_cmd_source"], profile) \
        and plan.get("confirm_by") != "provider"
    if confirm_seconds is None:
        confirm_seconds = DEFAULT_CONFIRM_SECONDS if plan["ends_box"] else 0.0
    plan["confirm_seconds"] = float(confirm_seconds)
    if confirm_seconds and not plan["ends_box"] and plan.get("confirm_by") != "provider":
        plan["ends_box"] = True   # asked for explicitly: the stop is meant to end this machine
    return plan, warnings


def provider_stop(plan, profile, warnings, cap_seconds=None):
    """Where the platform's API can stop this box (providers.py) and its ids are here, the stop is the API's
    stop-then-read-back (exit 0 only once the state says stopped or gone); the profile's command becomes the
    fallback. Lambda has no stop, only terminate: that plan is destructive, behind the same gate."""
    try:
        import providers
        adapter = providers.adapter_for(profile)
    except ImportError:
        return
    except Exception as exc:  # noqa: BLE001  (ProviderError: no id or key on this box)
        warnings.append("NOTE: the %s API cannot confirm this stop here (%s); the profile's command runs and "
                        "is confirmed by this box going down" % (profile, exc))
        return
    if adapter is None:
        return
    action = "terminate" if getattr(adapter, "stop_unsupported", False) or profile == "lambda" else "stop"
    cap = float(cap_seconds) if cap_seconds else DEFAULT_PROVIDER_CAP_SECONDS
    timing = "--cap-seconds %g --poll-seconds %g --timeout %g" % (cap, min(10.0, max(0.05, cap / 8)),
                                                                  min(30.0, max(0.2, cap / 4)))
    script = "%s %s" % (shlex.quote(sys.executable), shlex.quote(os.path.join(core.NODE_DIR, "providers.py")))
    command = "%s %s --profile %s %s" % (script, action, profile, timing)
    plan["provider_confirm_cmd"] = "%s confirm --profile %s --action %s %s" % (script, profile, action, timing)
    if plan["stop_cmd"] and not plan["destructive"] and not plan.get("fallback_stop_cmd"):
        plan.update(fallback_stop_cmd=plan["stop_cmd"], fallback_auto=True)
    plan.update(stop_cmd=command, stop_cmd_source="provider:%s" % profile, destructive=action == "terminate",
                confirm_by="provider", provider_action=action)
    warnings.append("NOTE: the stop goes through the %s API (%s, confirmed by reading the state back)"
                    % (profile, action))


# ----------------------------------------------------------------------------- the destructive gate

def verify_durable(run_dir, profile=None):
    """Re-check the run's durable copy now, with the one evidence parser: (ok, detail).

    status.json "sync" must say ok and verified and name results_dir and its manifest; the manifest
    must parse (evidence.read_manifest), belong to this run, list a result besides the logs, and
    match every file in results_dir, re-hashed (evidence.verify_tree); and the copy must outlive the
    instance (destructive.off_box_copy: off the root disk on a network or the PROFILE's persistent
    mount, or a verified pull recorded), finding C1."""
    import evidence
    status = core.read_json(os.path.join(run_dir, "status.json"))
    sync = status.get("sync")
    if not isinstance(sync, dict):
        return False, "status.json has no sync record: the end-of-run sync has not run"
    if sync.get("ok") is not True or sync.get("verified") is not True:
        return False, "status.json sync says ok=%s verified=%s%s" % (
            sync.get("ok"), sync.get("verified"), (": %s" % sync["error"]) if sync.get("error") else "")
    results, manifest_path = sync.get("results_dir"), sync.get("manifest")
    if not isinstance(results, str) or not results or not os.path.isdir(results):
        return False, "sync.results_dir %r is not a directory here" % (results,)
    if not isinstance(manifest_path, str) or not manifest_path:
        return False, "status.json sync names no manifest"
    manifest, problems = evidence.read_manifest(manifest_path)
    if problems or manifest is None:
        first = (problems or [{"path": manifest_path, "detail": "unreadable"}])[0]
        return False, "manifest %s: %s: %s" % (manifest_path, first["path"], first["detail"])
    run_id = status.get("run_id")
    if isinstance(run_id, str) and run_id and manifest.get("run_id") != run_id:
        return False, "manifest %s is for run %r, not %r" % (manifest_path, manifest.get("run_id"), run_id)
    if all(e["path"].startswith("logs/") for e in manifest["files"]):
        return False, "the durable copy holds only the run's logs (no --output was declared): nothing " \
                      "protects a destructive stop"
    problems, _hashed = evidence.verify_tree(results, manifest, progress=False)
    if problems:
        return False, "%d problem(s) at %s, first: %s %s: %s" % (
            len(problems), results, problems[0]["code"], problems[0]["path"], problems[0]["detail"])
    off_box, where = destructive.off_box_copy(results, run_dir, manifest, destructive.persistent_paths(profile))
    if not off_box:
        return False, "the durable copy re-verified but would not outlive the instance: %s" % where
    return True, "%d file(s), %d bytes re-verified (sha256) at %s against %s; %s" % (
        manifest["file_count"], manifest["total_bytes"], results, manifest_path, where)


# ----------------------------------------------------------------------------- running it

class Engine(object):
    """Carries out a plan. SAVE(record) and LOG(line) are the caller's best-effort writers; they must
    never raise (the watcher's guard makes them so). SLEEP and CLOCK are injectable for rule tests."""

    def __init__(self, plan, cfg, record, save, log, run_dir=None, sleep=time.sleep, clock=time.monotonic,
                 adapter=None, notify=None):
        self.plan, self.cfg, self.rec = plan, cfg, record
        self.save, self.log, self.run_dir = save, log, run_dir
        self.sleep, self.clock = sleep, clock
        self.adapter, self.notify = adapter, notify
        self.rec.setdefault("attempts", [])
        self.rec.setdefault("escalations", [])
        self.rec.setdefault("ok", False)
        self.rec.setdefault("confirmed", None)

    def once(self, argv, timeout, program=None):
        cmd, problem = runnable(argv, program)
        if problem:
            return {"rc": 127, "timed_out": False, "seconds": 0.0, "output_tail": "", "error": problem,
                    "at": core.utc_iso()}
        cwd = self.run_dir if self.run_dir and os.path.isdir(self.run_dir) else "/"
        res = core.run_bounded(cmd, timeout, cwd=cwd)
        out = {"rc": res.rc, "timed_out": res.timed_out, "seconds": round(res.seconds, 2),
               "output_tail": core.redact(res.output or "")[-300:], "at": core.utc_iso()}
        if cmd[0] == "/bin/sh" and argv[0] != "/bin/sh":
            out["via_sh"] = True
        if res.error:
            out["error"] = core.redact(res.error)
        return out

    def pre_stop(self):
        command = self.plan.get("pre_stop_cmd")
        if not command:
            return
        if self.cfg.get("dry_run"):
            self.rec["pre_stop"] = {"command": command, "dry_run": True}
        else:
            argv, missing = expand_argv(command)
            if missing:
                self.rec["pre_stop"] = {"command": command, "rc": None,
                                        "error": "unset variable(s): " + ", ".join(missing)}
            else:
                self.rec["pre_stop"] = dict(self.once(argv, self.cfg["pre_stop_timeout"],
                                                      self.plan.get("pre_stop_program")), command=command)
            self.log("pre-stop command: rc=%s" % self.rec["pre_stop"].get("rc"))
        self.save()

    def usable_fallback(self, already):
        fallback = self.plan.get("fallback_stop_cmd")
        if not fallback or fallback == already:
            return None, None
        argv, missing = expand_argv(fallback)
        if missing:
            self.log("cannot run the fallback %r: unset variable(s) %s" % (fallback, ", ".join(missing)))
            return None, None
        why = destructive.destructive_word(argv)
        if why:
            self.log("not running the fallback %r: it expands to a destructive command (%s)" % (fallback, why))
            return None, None
        return fallback, argv

    def choose(self):
        """(command, argv, program) to run first, after the destructive gate; None when nothing can run."""
        plan, cfg, rec = self.plan, self.cfg, self.rec
        command, is_destructive = plan.get("stop_cmd"), plan.get("destructive")
        argv, missing = expand_argv(command) if command else (None, [])
        if command and not missing and not is_destructive:
            why = destructive.destructive_word(argv)   # what the variables expanded to counts too
            if why:
                is_destructive = True
                rec.update(destructive=True, destructive_inferred_at_fire=why)
        if command and is_destructive:
            if not cfg.get("allow_destructive"):
                gate_ok, why = False, "--allow-destructive was not given"
            else:
                gate_ok, why = verify_durable(self.run_dir, plan.get("profile")) if self.run_dir else (False, "no run dir to verify")
            rec["destructive_gate"] = {"passed": gate_ok, "detail": why}
            if not gate_ok:
                rec["refused"] = "%s (%s)" % (REFUSED_MSG, why)
                rec["refused_command"] = command
                self.log("REFUSED destructive stop %r: %s" % (command, why))
                command, argv = self.usable_fallback(None)
                rec.update(command=command, destructive=False,
                           command_source="--fallback-stop-cmd" if command else None)
                return (command, argv, plan.get("fallback_stop_program")) if command else None
            self.log("destructive stop allowed: %s" % why)
        if command and missing:
            rec["error"] = "stop command %r needs unset variable(s): %s" % (command, ", ".join(missing))
            self.log("cannot run %r: unset variable(s) %s" % (command, ", ".join(missing)))
            command, argv = self.usable_fallback(command)
            if command:
                rec.update(command=command, destructive=False, command_source="--fallback-stop-cmd")
                return command, argv, plan.get("fallback_stop_program")
            return None
        return (command, argv, plan.get("stop_program")) if command else None

    def confirm(self, action_rec):
        """True (provider says stopped/gone), False (not stopped: NOT CONFIRMED), None (cannot tell)."""
        seconds = self.plan.get("confirm_seconds") or 0.0
        if not self.plan.get("ends_box") or not seconds:
            action_rec["confirmation"] = {"method": None, "detail": "this stop is not meant to end the machine: "
                                                                   "nothing to confirm it by"}
            return None
        if self.cfg.get("dry_run"):
            return None
        start = self.clock()
        self.rec["confirming_until"] = core.utc_iso(time.time() + seconds)
        self.rec["boot_id"] = core.boot_id()
        self.save()
        while self.clock() - start < seconds:
            self.sleep(min(SLICE, seconds))
        # Still here: the machine (or this container) did not go down.
        action_rec["confirmation"] = {"method": "still_up", "detail": "this box was still up %.0f s after the stop "
                                      "exited 0" % (self.clock() - start)}
        return False

    def read_back(self, rec):
        """After a fallback exited 0 on a provider plan: does the provider's state confirm it? (C4)"""
        command = self.plan.get("provider_confirm_cmd")
        if not command:
            rec["confirmation"] = {"method": None, "detail": "no provider read-back for this plan"}
            return False
        res = self.once(split_cmd(command, "the provider read-back"), self.cfg["stop_timeout"] +
                        (self.plan.get("confirm_seconds") or DEFAULT_PROVIDER_CAP_SECONDS))
        ok = res["rc"] == 0
        rec["confirmation"] = {"method": "provider_read_back", "rc": res["rc"], "output_tail": res["output_tail"],
                               "detail": "the fallback exited 0 and the provider's state %s" % (
                                   "confirms the stop" if ok else "did NOT confirm it (exit %s)" % res["rc"])}
        self.log("fallback read back from the provider: rc=%s (%s)" % (res["rc"], "confirmed" if ok else
                                                                       "NOT CONFIRMED"))
        if not ok and not self.rec["escalations"]:
            self.escalate("%s: the fallback exited 0 but the provider's state does not say stopped" % NOT_CONFIRMED)
        return ok

    def still_up(self, rec):
        """A provider stop of THIS box read CONFIRMED: is this process still running still_up_seconds later?
        True revokes the confirmation (C5): the state the provider gave was not this box's."""
        seconds = self.cfg.get("still_up_seconds", DEFAULT_STILL_UP_SECONDS)
        if not seconds or self.cfg.get("dry_run"):
            return False
        rec["confirmed"] = self.rec["confirmed"] = True
        self.rec["still_up_check_until"] = core.utc_iso(time.time() + seconds)
        self.save()
        start = self.clock()
        while self.clock() - start < seconds:
            self.sleep(min(SLICE, seconds))
        self.rec.pop("still_up_check_until", None)
        rec["revoked"] = {"at": core.utc_iso(), "detail": "the provider's state read stopped, but this box was still "
                          "up %.0f s later: confirmation revoked" % (self.clock() - start)}
        # Revoked before the escalation saves the record: no reader may see "revoked" beside "confirmed".
        rec["confirmed"] = self.rec["confirmed"] = False
        self.log("REVOKED: %s" % rec["revoked"]["detail"])
        self.escalate("%s: %s" % (NOT_CONFIRMED, rec["revoked"]["detail"]))
        return True

    def escalate(self, why):
        entry = {"at": core.utc_iso(), "why": why, "host": socket.gethostname()}
        self.rec["escalations"].append(entry)
        self.log("!!! %s: %s !!!" % (NOT_CONFIRMED if "confirm" in why.lower() else "STOP FAILED", why))
        self.tell("stop_not_confirmed", why=why, attempts=len(self.rec["attempts"]))
        self.save()

    def tell(self, event, **fields):
        if self.notify is not None and not self.cfg.get("dry_run"):   # a rehearsal tells no one
            summary = self.notify(event, dict(fields, reason=self.rec.get("reason")))
            if isinstance(summary, dict):
                self.rec.setdefault("notified", []).append(
                    {"event": event, "sent": summary.get("sent"), "spooled": summary.get("spooled"),
                     "skipped": summary.get("skipped")})

    def attempts(self, argv, program, what, into):
        """Run up to --retries attempts; True once one exits 0 and is not disproved."""
        retries = max(1, int(self.cfg.get("retries") or 1))
        for attempt in range(retries):
            timeout = self.cfg["stop_timeout"]
            if self.plan.get("confirm_by") == "provider" and what == "stop":
                timeout = max(timeout, (self.plan.get("confirm_seconds") or DEFAULT_PROVIDER_CAP_SECONDS) + 60)
            rec = self.once(argv, timeout, program)
            into.append(rec)
            self.log("%s attempt %d/%d: rc=%s%s%s" % (what, attempt + 1, retries, rec["rc"],
                                                      " (timed out after %.1f s)" % rec["seconds"]
                                                      if rec["timed_out"] else "",
                                                      " via /bin/sh" if rec.get("via_sh") else ""))
            self.save()
            if self.plan.get("confirm_by") == "provider" and what == "stop":
                # providers.py exits 0 only once the provider's state says stopped or gone, 1 when it did not.
                rec["confirmation"] = {"method": "provider", "detail": "the provider's state %s"
                                       % ("confirms the stop" if rec["rc"] == 0 else "did not confirm it")}
                if rec["rc"] == 0 and self.still_up(rec):
                    rec["confirmed"] = self.rec["confirmed"] = False
                elif rec["rc"] == 0:
                    rec["confirmed"] = self.rec["confirmed"] = True
                    return True
                elif rec["rc"] == 1:
                    rec["confirmed"] = self.rec["confirmed"] = False
                    if not self.rec["escalations"]:
                        self.escalate("%s: the provider still reports the box running after the stop" % NOT_CONFIRMED)
            elif rec["rc"] == 0 and self.plan.get("confirm_by") == "provider":
                # A fallback's exit code never confirms a provider stop (C4): read the provider's state back.
                if self.read_back(rec) and not self.still_up(rec):
                    rec["confirmed"] = self.rec["confirmed"] = True
                    return True
                rec["confirmed"] = self.rec["confirmed"] = False
                self.save()
            elif rec["rc"] == 0:
                confirmed = self.confirm(rec)
                rec["confirmed"] = confirmed
                self.rec["confirmed"] = confirmed
                if confirmed is not False:
                    return True
                if not self.rec["escalations"]:
                    self.escalate("%s: %s exited 0 but %s" % (NOT_CONFIRMED, what,
                                                              rec["confirmation"].get("detail")))
                self.save()
            if attempt + 1 < retries:
                self.sleep(self.cfg.get("retry_backoff", 0) * (2 ** attempt))
        return False

    def run(self):
        """The whole sequence after the caller's own preparations: 0 stopped (or nothing to confirm), 1 not."""
        self.pre_stop()
        chosen = self.choose()
        if not chosen:
            self.rec["message"] = NO_STOP_MSG
            self.save()
            self.log("!!! %s !!! Stop it by hand (profile meter-stop action)." % NO_STOP_MSG.upper())
            self.escalate("no stop command could run: " + NO_STOP_MSG)
            return 1
        command, argv, program = chosen
        if self.cfg.get("dry_run"):
            self.rec["would_run"] = command
            names = variable_names(command)   # names only: values can be ids or keys
            if names:
                self.rec["variables_resolved"] = names
            self.rec["message"] = "dry run: nothing was signalled or run"
            self.save()
            self.log("DRY RUN: would run %r" % command)
            return 0
        if self.attempts(argv, program, "stop", self.rec["attempts"]):
            return self.done("stop command succeeded")
        failed = "stop command failed after %d attempt(s) (%s)" % (len(self.rec["attempts"]),
                                                                 exit_codes(self.rec["attempts"]))
        if self.rec["confirmed"] is False:   # the real exit codes, not "exited 0" (finding N12)
            failed = "the stop was NOT CONFIRMED after %d attempt(s) (%s)" % (
                len(self.rec["attempts"]), exit_codes(self.rec["attempts"]))
        fallback, fb_argv = self.usable_fallback(command)
        if fallback:
            self.log("%s; running the fallback %r" % (failed, fallback))
            self.rec["fallback"] = {"command": fallback, "attempts": [], "ok": False}
            if self.attempts(fb_argv, self.plan.get("fallback_stop_program"), "fallback stop",
                             self.rec["fallback"]["attempts"]):
                self.rec["fallback"]["ok"] = True
                return self.done("%s; the fallback stop command succeeded" % failed)
            failed += " and the fallback %s (%s)" % (
                "was NOT CONFIRMED by the provider's state" if self.rec["fallback"]["attempts"] and all(
                    a.get("rc") == 0 for a in self.rec["fallback"]["attempts"]) else "failed too",
                exit_codes(self.rec["fallback"]["attempts"]))
        self.rec["ok"] = False
        self.rec["message"] = "%s; the meter may still be running" % failed
        self.escalate(self.rec["message"])
        return 1

    def done(self, message):
        confirmed = self.rec["confirmed"]
        if confirmed:
            self.tell("stop_confirmed", method=(self.rec.get("attempts") or [{}])[-1].get("confirmation", {}).get("method"))
        self.rec["ok"] = True
        self.rec["message"] = message + ("" if confirmed is None else " (confirmed)")
        self.save()
        return 0


def exit_codes(attempts):
    """'exit codes 1, 1, 1' (a timeout says so): what the attempts really ended with (N12)."""
    codes = ["timed out" if a.get("timed_out") else str(a.get("rc")) for a in attempts or []]
    return ("exit code%s %s" % ("" if len(codes) == 1 else "s", ", ".join(codes))) if codes else "no attempt ran"


def notify_config_problem():
    """Finding C10: a notify config the node refuses would make every message of a watcher vanish. Each watcher's
    arm refuses (exit 3, one line) so the launch says so, instead of a watcher that tells no one; the dead-man's
    re-arm after a restart (--notify-refused-ok) warns instead, since a run must never be left unwatched. No
    config is fine. -> the problem in one line, or None."""
    try:
        import notify
    except ImportError:
        return None
    try:
        notify.load_config()
    except (core.UsageError, core.Refused) as exc:
        return ("the notify config is refused (%s): no message would be sent; fix it (notify.py check) or move "
                "it away, then arm again" % str(exc).splitlines()[0][:300])
    return None


def notifier(base_fields, events=None):
    """send(event, fields) through notify.py (bounded, never raising), or None when it is absent. EVENTS is
    the run's own event list (runrec.notify_events; None: every event the targets take).
    Fields never carry a stop command: an expanded $VAR can hold a token."""
    try:
        import notify
    except ImportError:
        return None

    def send(event, fields):
        try:   # every field redacted: an error a provider echoed the key into is told as ***
            return notify.emit(event, core.redact_doc(dict(base_fields, **fields)), timeout=5, events=events)
        except Exception as exc:  # noqa: BLE001  a message never ends the stop sequence
            return {"error": core.redact(str(exc))[:200]}
    return send


def is_full_disk(exc):
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
