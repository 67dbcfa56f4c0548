#!/usr/bin/env python3
"""rgt: the laptop side, a command per phase; launch arms the dead-man first, resume never runs two live attempts.

Every command builds its ssh call from argv (each remote word quoted; "~/" kept for the node's
shell to expand), so no user input is ever pasted into a shell string. HOST is an ssh alias or
user@host; -p/-i/--ssh-config add the usual ssh options. All the ssh calls of one command (push makes
three, pull and gate several) share one connection: a multiplexing master whose socket sits in a private
folder under /tmp, closed when the command ends (RGT_SSH_MUX=0 turns this off; RGT_SSH_CONTROL_PARENT
moves the folder). Every push, launch, pull and gate is
appended to a run ledger in the user's state dir (host, profile, run id, attempt, state, time), so
`rgt.py ledger` can list what may still bill; a relaunched attempt is listed again until gated.

Usage:
  rgt.py [global options] push   HOST [--transport auto|rsync|tar]
  rgt.py [global options] probe  HOST [--profile P] [-- NODE_PROBE_ARGS...]
  rgt.py [global options] launch HOST --profile P --run-id RID [--cwd DIR] [--durable-dir DIR]
                                 [--rate-per-hour X] [--max-cost USD] [--instance PROVIDER:ID]
                                 [-- RUN_ONE_ARGS... --] -- CMD [ARGS...]
  rgt.py [global options] status HOST RID [--rate-per-hour X]
  rgt.py [global options] patrol HOST [RID...] [--rate-per-hour X] [--min-free-gb G]
  rgt.py [global options] logs   HOST RID [--lines N] [--log job|supervisor|deadman]
  rgt.py [global options] ack    HOST RID (--postpone-minutes M | --disarm)
  rgt.py [global options] resume HOST RID [--max-attempts N] [--give-up-hours H] [--force-restart]
                                 [--max-cost USD] [--dry-run]
  rgt.py [global options] pull   HOST RID [--dest DIR] [--transport auto|rsync|tar] [--generation N]
  rgt.py [global options] gate   HOST RID [--dest DIR] [--profile P] [--no-inspect] [--keep-generation N]
  rgt.py [global options] sweep  HOST [--check-only] [--ack RID]...
  rgt.py [global options] ledger [--all]
  rgt.py [global options] notify setup HOST --from FILE [--config-path PATH]
  rgt.py [global options] notify test  HOST [--config-path PATH]
  rgt.py [global options] billing [--timeout S]

Global options (before the command):
  --json              machine-readable output (one JSON object on stdout)
  -p, --port PORT     ssh port
  -i, --identity KEY  ssh identity file
  --ssh-config FILE   ssh client config (ssh -F)
  --node-dir DIR      where the node toolkit lives on the node (default ~/rgt-bin)
  --ledger FILE       the run ledger (default $XDG_STATE_HOME/remote-gpu-trainer/ledger.jsonl)

patrol: the scheduled check-in (Claude Code `/loop 30m`, cron, an automation): read-only, ONE ssh round trip
for every run of HOST not yet through the gate (or the RIDs given), a short report every time (state,
step/ETA, newest checkpoint age, disk headroom, dead-man, cost so far). Exit 0 when every run is healthy,
in progress or cleanly done; 10 to escalate (stalled, failed, sync_failed, dead-man fired or down,
finished but unwatched, disk below --min-free-gb, default the toolkit's one disk floor,
rgt_core.DEFAULT_DISK_FLOOR_GB). A fired dead-man's line says STOP CONFIRMED, STOP NOT CONFIRMED or STOP FAILED.
A run the ledger holds no run dir for is its own UNKNOWN line (escalated); the others are still checked.
status and pull record the run dir they used (--durable-dir reaches a run rgt.py did not launch).

launch: everything after the first `--` up to a second `--` goes to run_one.sh unchanged (its
output globs, stall minutes, wall-clock cap, GPU requirement: see run_one.sh); the words after the
last `--` are the job. With one `--` only, all of it is the job. A launch with no resume adapter
(--resume-glob/--resume-arg) warns that a restart would supersede its results. The run dir is
DURABLE_DIR/runs/RID (DURABLE_DIR from --durable-dir, else the profile), the results dir
DURABLE_DIR/results/RID; later commands find both in the ledger. A run id the node already holds (or the ledger
launched on that box) is refused, exit 3, nothing started: continue it with resume. `rgt.py launch --help` lists:
  run_one.sh options most launches use: --output GLOB, --stall-minutes M, --max-hours H, --require-gpu, --wait
  run_one.sh resume adapters for a trainer you did not write: --resume-glob, --resume-arg ('--init_from=resume')
  and --progress-regex, so that resume continues from the newest checkpoint instead of step 0 (run_one.sh);
  --total-steps N for a trainer that prints no total (status then shows step/N and an ETA)
  deadman.py arm options, one word per --deadman-arg: --stop-cmd 'CMD' for a stop of your own, and for one that
  destroys data --stop-cmd-destructive with --allow-destructive (it then fires only after a verified sync)

resume: after a preemption or a failed attempt, relaunch the run's recorded launch in the same run dir as
attempt N+1 (boot_resume.py --run on the node): its resume adapters pick the newest good checkpoint, the
last attempt's dead-man hands over to the new one. Refused (exit 3) while an attempt is still live, for a
succeeded run, past the attempt cap (--max-attempts overrides the launch's) or --give-up-hours, and for a
run with no resume adapter whose verified outputs its restart from step 0 would supersede, unless
--force-restart (the old outputs are then kept on the node as a generation, DURABLE_DIR/generations/RID/N).
Refused (exit 3) too when the run's budget is spent (its cost so far, the one formula below, at or past its cap):
the line says spent, cap and currency. The way on is explicit: `resume --max-cost USD` sets the run's new cap (all
attempts together; it must exceed what is spent), recorded on the node (RUN_DIR/budget.json, "raised") and as
this resume's ledger row (max_cost, budget_raised); the new attempt's dead-man holds it.

status and patrol: one ssh round trip each; the node runs status_facts.sh (no Python starts there) and this
laptop classifies what it sent by run_status.py's own rules (scripts/remote_status.py). A run those facts cannot
settle (another toolkit version on the node, busybox tools) is asked of the node's run_status.py in one more trip.

sweep: before a box that ran several runs is released, final_sweep.py on it over the runs dirs the ledger
knows for HOST (or --durable-dir's): every run verified on durable storage, stale ones synced again, what
cannot be saved listed; its exit codes pass through (0 every run saved, 1 not, 4 --check-only found work).
A run that produced nothing (it crashed before its first save) blocks it until you acknowledge it with --ack RID:
it then reads ACKED and its record and logs are saved alone, so `rgt.py pull HOST RID` brings the crash log home.

billing: what is still billing you, read-only (scripts/billing.py): every instance and storage object your laptop
credentials can see (RunPod, vast.ai, Lambda, Paperspace), with $/h where the API gives it, joined with this
ledger by box identity: UNKNOWN TO THE LEDGER, STOPPED, STORAGE BILLING, RUNNING, NO ACTIVE RUN, OK. Exit 1 when
anything is billing without a run; exit 4 when a provider cannot be read or seen (UNKNOWN provider, CANNOT SEE),
never "nothing listed". It changes nothing.

budget: launch --max-cost USD with --rate-per-hour X (or --instance PROVIDER:ID, whose rate the provider lists)
prints the most the run can cost and passes the matching --max-hours to run_one.sh (a tighter cap given to
run_one.sh is kept), so the dead-man stops the box at the budget. --instance also records which provider
instance the run is on, for billing. The budget is the run's, not an attempt's: the dead-man counts it from the
run's first start across resumes, re-arms and reboots (RUN_DIR/budget.json). status shows one cost so far and
its basis (scripts/ledger.py): the rate x that clock, else x the hours since the ledger's first launch.

gate: the teardown gate with our checkpoint inspector on every pulled checkpoint (--no-inspect skips
that part; the byte-for-byte match with the node is never skipped). Its PASS line says how the run ended
(succeeded, or INTERRUPTED / FAILED at step S of T). While the node holds another generation of the run (an
earlier attempt's results a --force-restart kept in DURABLE_DIR/generations/RID/N) it refuses until you say
which one to keep: `pull --generation N` brings generation N home, `gate --keep-generation N` gates it (or the
current results, when N is theirs). The ledger records the gate's own verdict, even when stdout closes early.

push and pull: rsync when both ends have it, else a tar stream over ssh (--transport forces one); a node
with no tar either makes and reads the stream with python3's tarfile (python3 is all the toolkit needs).
Push and pull say which ran. The node folder gets the toolkit plus profiles/index.json, then the node's copy of the core checks that
every file matches the version stamp; the command prints the version the node now runs.

Exit codes: 0 OK (status: the run succeeded); 1 a check failed (ledger: a torn row was found, so the list
may be missing a run); 2 usage or bad input; 3 refused (a gate, a resume, a pull over other content), never anything else; status passes
run_status.py's codes through (4 running, 5 starting, 6 stalled, 7 dead-man fired, 8 finished but UNWATCHED); sweep
4 --check-only found work, billing 4 its view is incomplete (billing.py); 10 patrol escalates; 12 launch or resume refused: the ledger cannot record it (read-only, full disk), so nothing
was started on the node; 255 ssh could not reach HOST; pull and gate killed by SIGINT or SIGTERM end their tool
with them and exit 130 or 143 (an interrupted pull leaves a ledger row: event pull, result interrupted).
`rgt.py COMMAND --help` ends with that command's own codes.
"""
import os
import subprocess
import sys

import fast_start   # scripts/fast_start.py: a status connects first, while the rest of this file loads
EARLY = fast_start.status_trip(sys.argv[1:]) if __name__ == "__main__" else None

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_SRC = os.path.join(HERE, "node")
REPO = os.path.dirname(HERE)
sys.path.insert(0, NODE_SRC)
import rgt_core as core  # noqa: E402
import ledger  # noqa: E402  (scripts/ledger.py: the ledger's file, rows, fold and cost so far)
import runrec  # noqa: E402  (the run's state words)

DEFAULT_NODE_DIR = "~/rgt-bin"
SSH_UNREACHABLE = 255
HOST_RE = fast_start.HOST_RE


# ---------------------------------------------------------------- quoting and ssh

class Raw(str):
    """A word remote_word passes through as it is: a shell expansion this module built itself."""


def remote_word(word):
    """Quote one word for the node's POSIX shell; a leading ~/ stays expandable."""
    if isinstance(word, Raw):
        return str(word)
    word = str(word)
    if word == "~":
        return '"$HOME"'
    if word.startswith("~/"):
        return '"$HOME"/' + shlex.quote(word[2:])
    return shlex.quote(word)


def remote_command(*argvs, cwd=None):
    """One shell line that runs each argv in turn (&&), optionally after mkdir -p + cd CWD."""
    parts = []
    if cwd:
        parts += ["mkdir -p " + remote_word(cwd), "cd " + remote_word(cwd)]
    parts += [" ".join(remote_word(w) for w in argv) for argv in argvs]
    return " && ".join(parts)


ONE_CALL = ("status", "logs", "ack", "launch")   # commands that make exactly one ssh call
MUX_PERSIST_S = 60      # an idle master outlives a crashed rgt.py by at most this long
SOCKET_PATH_MAX = 100   # sockaddr_un holds 104-108 bytes; ssh first binds PATH plus 17 characters
# The most of a node's answer kept in memory (per stream); a node may send without end (finding_laptop_L14).
ANSWER_MAX = 256 << 20
STATUS_ANSWER_MAX = 32 << 20    # one run's facts: two 256 KiB log pieces, the state files, the output list
NODE_JSON_MAX = 8 << 20         # one run_status.py --json object
AnswerTooLarge = fast_start.AnswerTooLarge


class Ssh(object):
    """ssh to one box. Every call of one rgt.py command shares ONE connection: the first call opens a
    multiplexing master (ControlMaster=auto) whose socket lives in a private 0700 folder made for this command
    under /tmp (a short path: socket paths are limited to about 104 bytes); close() ends the master
    (`ssh -O exit`) and removes the folder. The tools rgt.py starts (pull, gate) get the same options in
    `rsh`, so their rsync and tar streams ride the same connection. -F, -p and -i pass through unchanged."""

    def __init__(self, host, port=None, identity=None, config=None, mux=True):
        if not HOST_RE.match(host or ""):  # an alias, user@host, host:port-free name or [v6]; never an option
            raise core.UsageError("HOST %r is not an ssh alias or user@host" % host)
        self.host = host
        self.base = fast_start.ssh_base(port, identity, config)
        self.control_dir = self.control_path = None
        if mux:
            self._open_mux()

    def _open_mux(self):
        """Add the multiplexing options, or leave them out (RGT_SSH_MUX=0, no unix sockets, a parent folder
        whose path is too long or holds characters ssh would expand): then each call connects on its own."""
        if os.name != "posix" or os.environ.get("RGT_SSH_MUX", "1") == "0":
            return
        parent = os.environ.get("RGT_SSH_CONTROL_PARENT") or ("/tmp" if os.path.isdir("/tmp") else None)
        try:
            import tempfile
            folder = tempfile.mkdtemp(prefix="rgt-", dir=parent)     # mode 0700, a fresh random name
        except OSError:
            return
        path = os.path.join(folder, "m")
        if len(path.encode()) > SOCKET_PATH_MAX or re.search(r"[%\s]", path):
            os.rmdir(folder)
            return
        self.control_dir, self.control_path = folder, path
        self.base += ["-o", "ControlMaster=auto", "-o", "ControlPath=" + path,
                      "-o", "ControlPersist=%d" % MUX_PERSIST_S]

    def close(self):
        """End the master (when one was opened) and remove the control folder. Never raises."""
        if not self.control_dir:
            return
        try:
            if os.path.exists(self.control_path):
                subprocess.run(self.base + ["-O", "exit", self.host], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.control_dir, ignore_errors=True)
        self.control_dir = None

    @property
    def rsh(self):
        """The same ssh as one string, for tools that take --rsh / rsync -e."""
        return " ".join(shlex.quote(w) for w in self.base)

    def argv(self, command):
        return self.base + [self.host, command]

    def start(self, command):
        """Open the connection for COMMAND now and return a fast_start.Trip; its input is written later."""
        try:
            return fast_start.Trip(self.argv(command))
        except FileNotFoundError:
            raise core.UsageError("ssh is not installed on this machine")

    def run(self, command, timeout=600, stdin=None, capture=True, limit=ANSWER_MAX):
        """CompletedProcess of COMMAND on the node. A captured answer is kept up to LIMIT bytes per stream: past
        that the call is ended and AnswerTooLarge raised (the node is untrusted input: finding_laptop_L14)."""
        try:
            if not capture:
                return subprocess.run(self.argv(command), input=stdin, timeout=timeout)
            proc = subprocess.Popen(self.argv(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            out, err = fast_start.collect(proc, stdin, timeout, limit)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        except FileNotFoundError:
            raise core.UsageError("ssh is not installed on this machine")
        except subprocess.TimeoutExpired:
            raise core.CheckFailed("ssh %s timed out after %d s" % (self.host, timeout))


def text(raw):
    return (raw or b"").decode("utf-8", "replace")


def say(line):
    """print() for a line that holds words a node sent."""
    print(core.safe_text(line))


def shown(raw):
    """A node's output as text safe to print: its terminal controls escaped (finding_laptop_L10)."""
    return core.safe_text(text(raw) if not isinstance(raw, str) else raw)


class Unreachable(core.CheckFailed):
    """ssh itself failed (exit 255): the node was not reached, so nothing ran there."""


def checked(res, what):
    if res.returncode == SSH_UNREACHABLE:
        err = text(res.stderr).strip()
        hint = ("; is HOST an alias in your ssh config? Pass --ssh-config FILE if it is not ~/.ssh/config"
                if "Could not resolve hostname" in err else "")
        raise Unreachable("ssh could not reach the node for %s: %s%s" % (what, err[-300:], hint))
    return res


# ---------------------------------------------------------------- the ledger

# The ledger's file, rows and fold are scripts/ledger.py's; these names stay for rgt.py's callers and tests.
ledger_path, LedgerError, ledger_append = ledger.path, ledger.LedgerError, ledger.append


def record(args, **event):
    """One ledger row for this command's box; never fails the command: when the row cannot be written, one
    WARN line says so and what the node did stays reported. Returns whether it was written."""
    path = ledger_path(args.ledger)
    address, machine = box_of(args)
    event.setdefault("host", args.host)
    event["box"] = address
    if machine and "machine_id" not in event:
        event["machine_id"] = machine
    try:
        ledger_append(path, **event)
        return True
    except OSError as exc:
        sys.stderr.write("WARN could not record this %s in the ledger %s (%s): `rgt.py ledger` will not list it; "
                         "what the node did is reported above and stands\n" % (event.get("event"), path,
                                                                             exc.strerror or exc))
        return False


ledger_events = ledger.events


# A box is who answers at an address: user@hostname:port as ssh resolves HOST (an alias, -p, the config's User),
# plus the node's own /etc/machine-id read at push. Two boxes behind one gateway differ by port; a new box
# behind an old alias or a reused gateway port differs by address or machine id.

def resolve_address(host, port=None, config=None):
    """user@hostname:port as ssh would connect to HOST (`ssh -G`, which reads the config and connects to
    nothing); HOST[:PORT] when ssh cannot say."""
    argv = ["ssh"] + (["-F", config] if config else []) + (["-p", str(port)] if port else []) + ["-G", host]
    try:
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = b""
    conf = {}
    for line in text(out).splitlines():
        key, _, value = line.partition(" ")
        conf.setdefault(key.lower(), value.strip())
    if conf.get("hostname") and conf.get("port"):
        return "%s@%s:%s" % (conf.get("user") or "?", conf["hostname"], conf["port"])
    return host + (":%s" % port if port else "")


def box_of(args):
    """(address, machine id or None) of the box this command talks to; the machine id is the newest one a
    push to that address recorded."""
    if getattr(args, "_box", None) is None:
        address = resolve_address(args.host, args.port, args.ssh_config)
        machine = None
        for event in ledger_events(ledger_path(args.ledger)):
            if event.get("event") == "push" and event.get("box") == address and event.get("machine_id"):
                machine = event["machine_id"]
        args._box = (address, machine)
    return args._box


def box_label(address, machine):
    return address + (" [machine %s]" % machine[:12] if machine else "")


ledger_runs = ledger.fold


def box_runs(args):
    """{run id: record} of this command's box, from the ledger."""
    runs, _ = ledger_runs(ledger_events(ledger_path(args.ledger)))
    address, machine = box_of(args)
    mine = {key[2]: rec for key, rec in runs.items() if key[:2] == (address, machine)}
    for key, rec in runs.items():   # rows from before boxes had addresses: keyed by the host string
        if key[0] == args.host and key[1] is None and key[2] not in mine:
            mine[key[2]] = rec
    return mine


def known_run(args, rid):
    rec = box_runs(args).get(rid)
    if rec is None or not rec.get("run_dir"):
        raise core.UsageError("no launch of run %r on %s in the ledger %s (launch it with rgt.py, or pass "
                              "--durable-dir)" % (rid, args.host, ledger_path(args.ledger)))
    return rec


def run_paths(args, rid, profile=None):
    """(run_dir, results_dir, profile) on the node: from --durable-dir/profile, else the ledger."""
    durable = getattr(args, "durable_dir", None)
    if not durable and profile:
        durable = core.profile_defaults(profile).get("DURABLE_DIR")
        if durable and durable.startswith(os.path.expanduser("~") + os.sep):
            durable = "~/" + durable[len(os.path.expanduser("~")) + 1:]  # the node's home, not ours
    if durable:
        durable = durable.rstrip("/")
        return durable + "/runs/" + rid, durable + "/results/" + rid, profile
    if getattr(args, "command", None) == "launch":   # a new run: the ledger cannot know it yet
        raise core.UsageError("profile %s has no default durable dir (DURABLE_DIR): pass --durable-dir DIR, a "
                              "folder on storage that outlives the box (see profiles/%s.md, Storage)"
                              % (profile, profile))
    rec = known_run(args, rid)
    return rec["run_dir"], rec.get("results_dir"), rec.get("profile") or profile


def check_run_id(rid):
    if not core.RUN_ID_RE.match(rid or ""):   # the one rule, shared with the node and the schemas (review D4)
        raise core.UsageError("run id %r: letters, digits, '.', '_' and '-' only (max %d)" % (rid, core.RUN_ID_MAX))
    return rid


# ---------------------------------------------------------------- push

def tar_stream(files):
    """The toolkit as an uncompressed tar in memory (a few hundred KB)."""
    import io
    buf = io.BytesIO()
    import tarfile
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for local, name in files:
            info = archive.gettarinfo(local, arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(local, "rb") as handle:
                archive.addfile(info, handle)
    return buf.getvalue()


def toolkit_files():
    files = [(os.path.join(NODE_SRC, n), n) for n in sorted(os.listdir(NODE_SRC))
             if os.path.isfile(os.path.join(NODE_SRC, n)) and not n.startswith(".") and n != "index.json"]
    index = core.profile_index_path() or os.path.join(REPO, "profiles", "index.json")
    if os.path.isfile(index):
        files.append((index, "index.json"))
    return files


def cmd_push(args, ssh):
    if core.toolkit_problems(NODE_SRC):
        raise core.Refused("this checkout's node toolkit is not one version: %s (run tools/stamp_node.py)"
                           % "; ".join(core.toolkit_problems(NODE_SRC)[:3]))
    files = toolkit_files()
    node = args.node_dir
    probe = checked(ssh.run(remote_command(["mkdir", "-p", node]) + " || exit 1; for p in rsync tar; do "
                            "command -v $p >/dev/null 2>&1 && echo $p; done; for f in /etc/machine-id "
                            "/var/lib/dbus/machine-id; do [ -r $f ] && { echo machine-id:$(head -c 64 $f); break; }; "
                            "done; echo probed", timeout=120), "push")
    if probe.returncode != 0:
        raise core.CheckFailed("cannot create %s on %s: %s" % (node, args.host, text(probe.stderr).strip()))
    has = text(probe.stdout).split()
    found = re.search(r"^machine-id:([0-9A-Za-z-]{8,64})\s*$", text(probe.stdout), re.M)
    machine = found.group(1) if found else None   # the node's own identity: tells two boxes at one address apart
    node_rsync, packer = "rsync" in has, "tar" if "tar" in has else "python3"
    transport = args.transport
    if transport == "auto":
        transport = "rsync" if node_rsync and shutil.which("rsync") else "tar"
    if transport == "rsync":
        if not shutil.which("rsync") or not node_rsync:
            raise core.UsageError("--transport rsync: rsync is missing on %s" % ("this machine" if not
                                  shutil.which("rsync") else "the node"))
        target = node[2:] if node.startswith("~/") else node  # rsync resolves relative paths from $HOME
        argv = ["rsync", "-a", "--chmod=u+rwX", "-e", ssh.rsh] + [f for f, _ in files[:-1]] + \
               ["%s:%s/" % (args.host, target)]
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        if res.returncode == 0 and files[-1][1] == "index.json":
            res = subprocess.run(["rsync", "-a", "-e", ssh.rsh, files[-1][0], "%s:%s/index.json" % (args.host, target)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    else:  # tar on the node, or python3's tarfile where a minimal image has no tar
        res = ssh.run(core.tar_unpack_shell(shlex.quote, remote_word(node)), stdin=tar_stream(files), timeout=600)
    if res.returncode != 0:
        raise core.CheckFailed("push over %s failed: %s" % (transport, text(res.stderr).strip()[-300:]))
    check = checked(ssh.run(remote_command(["python3", node + "/rgt_core.py", "--version", "--record-interpreter"]), timeout=120), "push")
    version = text(check.stdout).strip()
    want = core.toolkit_version(NODE_SRC)
    if check.returncode != 0 or version != want:
        raise core.CheckFailed("the node's toolkit did not verify (version %r, want %r): %s"
                               % (version, want, text(check.stderr).strip()[-300:]))
    address, known = box_of(args)
    args._box = (address, machine or known)
    record(args, event="push", node_dir=node, machine_id=machine, version=version, transport=transport)
    if machine and known and machine != known:
        sys.stderr.write("NOTE %s now reaches another machine than before (machine id %s, was %s): a new box; the "
                         "runs recorded for the old one stay listed in `rgt.py ledger`\n"
                         % (address, machine[:12], known[:12]))
    how = transport if transport == "rsync" or packer == "tar" else "a tar stream (python3 tarfile: no tar there)"
    return report(args, {"ok": True, "host": args.host, "node_dir": node, "version": version,
                         "transport": transport, "node_tar": None if transport == "rsync" else packer,
                         "files": len(files)},
                  "%s pushed the node toolkit %s to %s:%s over %s (%d files)"
                  % (core.OK, version, args.host, node, how, len(files)))


# ---------------------------------------------------------------- probe, launch, status, logs, ack

def node_tool(args, name):
    return args.node_dir + "/" + name


def node_python(args):
    """The node's interpreter as one shell word: the real one `push` recorded for THIS box (a pyenv or conda
    shim costs 0.2-0.3 s a call, most of a status round trip), else python3 when that record is missing or
    stale. The record is per box (rgt_core.interpreter_record_name: a shared NFS home holds one per box) and
    the interpreter is run once (-S -c '') before it is used: a path another box wrote, or one gone since,
    falls back to python3 (finding_field_N14). The tools that import nothing beyond the toolkit run with -S
    (no site-packages scan: 20-30 ms where a .pth file imports something)."""
    record_path = remote_word(args.node_dir) + '/%s-"$n-$m"' % core.INTERPRETER_FILE
    return Raw('"$( %s; { read -r p < %s && [ -x "$p" ] && "$p" -S -c "" >/dev/null && printf %%s "$p"; } '
               '</dev/null 2>/dev/null || printf python3)"' % (core.BOX_KEY_SHELL, record_path))


def node_json(args, ssh, argv, what, timeout, limit=ANSWER_MAX):
    """Run a node tool that prints one JSON object -> (result, the object); its stderr shown when it gave none."""
    try:
        res = checked(ssh.run(remote_command(argv), timeout=timeout, limit=limit), what)
    except AnswerTooLarge:
        raise core.CheckFailed("%s: the node's answer passed %d MiB; ended it" % (what, limit >> 20))
    return res, node_doc(args, res, argv)


def node_doc(args, res, argv):
    """The one JSON object node tool ARGV printed in RES; CheckFailed (its stderr shown) when it gave none."""
    try:
        doc = json.loads(text(res.stdout))
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        sys.stderr.write(shown(res.stderr))
        tool = next(w for w in argv[1:] if not w.startswith("-"))   # past the interpreter's own flags
        raise core.CheckFailed("%s on %s gave no JSON (exit %d)" % (os.path.basename(tool), args.host, res.returncode))
    return doc


def again(args, *words):
    """This CLI with the global options given now, plus WORDS: a line the user can paste as it is."""
    line = ["python3", "scripts/rgt.py"]
    for flag, value in (("--ssh-config", args.ssh_config), ("-p", args.port), ("-i", args.identity),
                        ("--ledger", args.ledger)):
        if value is not None:
            line += [flag, str(value)]
    if args.node_dir != DEFAULT_NODE_DIR:
        line += ["--node-dir", args.node_dir]
    return " ".join(shlex.quote(w) for w in line + [str(w) for w in words])


def cmd_probe(args, ssh):
    argv = [node_python(args), node_tool(args, "node_probe.py")]
    if args.profile:
        argv += ["--profile", args.profile]
    if args.durable_dir and "--durable-dir" not in args.rest:
        argv += ["--durable-dir", args.durable_dir]
    argv += args.rest + (["--json"] if args.json and "--json" not in args.rest else [])
    res = checked(ssh.run(remote_command(argv)), "probe")
    sys.stdout.write(shown(res.stdout))
    sys.stderr.write(shown(res.stderr))
    return res.returncode


def split_launch(rest):
    """[run_one options] -- CMD, or CMD alone, from what followed the first --."""
    if "--" in rest:
        cut = rest.index("--")
        return rest[:cut], rest[cut + 1:]
    return [], rest


def cmd_launch(args, ssh):
    rid = check_run_id(args.run_id)
    run_dir, results_dir, profile = run_paths(args, rid, args.profile)
    options, job = split_launch(args.rest)
    if not job:
        raise core.UsageError("no job command: rgt.py launch HOST --profile P --run-id RID -- CMD [ARGS...]")
    refusal = ledger.reuse_refusal(box_runs(args).get(rid), args.host, rid)
    if refusal:   # before any row: a refused relaunch never marks the run it names failed (N19)
        raise core.Refused(refusal)
    options, budget = launch_budget(args, options)
    argv = [Raw("RGT_PYTHON=" + node_python(args)), "bash", node_tool(args, "run_one.sh"), "--profile", profile,
            "--run-id", rid, "--run-dir", run_dir]
    durable = args.durable_dir or run_dir.rsplit("/runs/", 1)[0]
    argv += ["--durable-dir", durable]   # never a DURABLE_DIR of the node's environment: pull and gate look here
    node_json = "--json" not in options  # the node answers where the run went (review D4): recorded as given
    argv += options + (["--json"] if node_json else []) + ["--"] + job
    # the first ledger row, before the node acts and before any warning: a refusal is the only line
    pending_row(args, run_id=rid, profile=profile, run_dir=run_dir, results_dir=results_dir, **budget["ledger"])
    import reap
    reaper = reap.heartbeat_warning(ledger_path(args.ledger)) if args.instance else None
    if reaper:           # only a launch that names its instance can be reaped
        sys.stderr.write(reaper + "\n")
    secrets = core.url_secrets(job)
    if secrets:
        sys.stderr.write("WARN %d job argument(s) hold a URL credential (user:password@ or a signed query): the "
                         "node records the command (run.json, job.log); pass it through an environment file or "
                         "a 0600 file the job reads instead\n" % len(secrets))
    if not any(o.split("=", 1)[0] in ("--resume-glob", "--resume-arg") for o in options):
        # said now, while the launch can still change: later, a restart's results replace this attempt's (N18)
        sys.stderr.write("WARN no resume adapter (--resume-glob/--resume-arg): unless the job resumes by itself, "
                         "a resume after a preemption or failure restarts it from step 0, and its results then "
                         "supersede this attempt's (resume --force-restart keeps them on the node as a "
                         "generation)\n")
    try:
        res = checked(ssh.run(remote_command(argv, cwd=args.cwd)), "launch")
    except Unreachable:   # the node never ran it (ssh exit 255): the pending row must not list a live run
        record(args, event="launch", run_id=rid, profile=profile, run_dir=run_dir, results_dir=results_dir,
               state="launch_failed", rc=SSH_UNREACHABLE)
        raise
    out, err = text(res.stdout), text(res.stderr)
    ok = res.returncode == 0
    answer = node_answer(out)
    run_dir, results_dir = answer.get("run_dir") or run_dir, answer.get("results_dir") or results_dir
    if answer and node_json:
        out = launch_text(answer)
    fields = {"ok": ok, "host": args.host, "run_id": rid, "run_dir": run_dir, "results_dir": results_dir,
              "budget": budget["note"],
              "watch": again(args, "status", args.host, rid), "eta": "unknown until the "
              "first progress line (see status)", "cost_so_far": cost_line(args.rate_per_hour, 0.0),
              "teardown": "NOT through the gate: the box may bill until you pull, gate and stop it",
              "node_output": out.strip().splitlines()[-12:], "rc": res.returncode}
    if not args.json:
        sys.stderr.write(shown(err))
        sys.stdout.write(shown(out))
    human = "\n".join(["run id:     %s" % rid, "watch:      %s" % fields["watch"], "ETA:        %s" % fields["eta"],
                       "cost:       %s" % fields["cost_so_far"], "teardown:   %s" % fields["teardown"]]
                      + (["budget:     %s" % budget["note"]] if budget["note"] else []))
    report(args, fields, human if ok else "%s launch of %s exited %d" % (core.FAIL, rid, res.returncode))
    sys.stdout.flush()
    record(args, event="launch", run_id=rid, profile=profile, run_dir=run_dir, results_dir=results_dir,
           state="launched" if ok else "launch_failed", rc=res.returncode,
           attempt=answer.get("attempt") if isinstance(answer.get("attempt"), int) else None, **budget["ledger"])
    return res.returncode


LEDGER_REFUSED = 12


class LedgerRefused(core.UsageError):
    """The ledger cannot record a launch: nothing starts on the node (exit LEDGER_REFUSED)."""


def pending_row(args, event="launch_pending", state="launching", **fields):
    """A launch's or resume's first ledger row (EVENT, STATE), written BEFORE the node acts: a ledger that cannot
    take it (read-only, or a full disk, which a writability check cannot see) refuses the command, so no attempt
    ever bills unlisted; a later row lost to a disk that filled meanwhile leaves this one listing it."""
    path = ledger_path(args.ledger)
    address, machine = box_of(args)
    try:
        ledger_append(path, event=event, host=args.host, box=address, state=state,
                      **dict(fields, **({"machine_id": machine} if machine else {})))
    except OSError as exc:
        raise LedgerRefused("the run ledger %s cannot be written (%s): nothing was started on %s; free space there, "
                            "or pass --ledger FILE (or set XDG_STATE_HOME) to a writable place"
                            % (path, exc.strerror or exc, args.host))


def node_answer(out):
    """run_one.sh --json's launch report (the node's own run_dir, results_dir, attempt), or {} when the node
    printed none (it refused before the report)."""
    try:
        doc = json.loads(out)
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if not (k in ("run_dir", "results_dir") and not isinstance(v, str))}


def launch_text(answer):
    """The node's launch report as run_one.sh prints it without --json."""
    import launcher
    lines = launcher.report_text(answer)
    final = answer.get("final") if isinstance(answer.get("final"), dict) else None
    if final:
        lines += "finished: state %s, job exit code %s\n" % (final.get("state") or "?", "?" if
                                                             final.get("exit_code") is None else final["exit_code"])
    return lines


def ledger_attempt(args, rid):
    """The run's latest attempt number in the ledger (for rows of commands that do not ask the node)."""
    return (box_runs(args).get(rid) or {}).get("attempt")


def cost_line(rate, hours):
    if rate is None:
        return "unknown (pass --rate-per-hour with the price the user pays; never guess one)"
    return "%s so far at %.4g/h" % (ledger.money(rate * hours), rate)


class StatusCall(object):
    """One run's status as the node answers it in one trip: status_facts.sh's facts, classified here by
    run_status.py's rules (remote_status.py); the node's run_status.py where the facts cannot settle it."""

    def __init__(self, args, rid):
        import remote_status   # imported while the trip connects (cmd_status), never before it
        self.rid, (self.run_dir, self.results_dir) = rid, run_paths(args, rid)[:2]
        self.mark, self.rate = remote_status.new_mark(), args.rate_per_hour
        cost = ["--rate-per-hour", str(args.rate_per_hour)] if args.rate_per_hour is not None else []
        self.argv = [node_python(args), "-S", node_tool(args, "run_status.py"), self.run_dir, "--json"] + cost
        self.script = remote_status.command(remote_word(args.node_dir), remote_word(self.run_dir), self.argv[0],
                                            self.mark, [remote_word(w) for w in cost])

    def settle(self, raw, rc):
        """(status, exit code) from what the node printed; None when only its run_status.py can tell."""
        import remote_status
        try:
            status = remote_status.classify(raw, self.mark, self.run_dir, self.rate)
            return status, status["exit"]
        except remote_status.Incomplete:
            return None
        except ValueError:    # an older toolkit on the node: its run_status.py answered
            try:
                status = json.loads(text(raw))
            except ValueError:
                status = None
            if not isinstance(status, dict):
                raise core.CheckFailed("run_status.py gave no JSON (exit %d)" % rc)
            return status, rc


def lease_fields(status):
    """The run's lease as status read it, for its ledger row: the reaper (scripts/reap.py) works from the last
    copy when the box no longer answers."""
    lease = status.get("lease")
    return {"lease": lease} if isinstance(lease, dict) else {}


def cmd_status(args, ssh):
    rid = check_run_id(args.run_id)
    # The handshake is most of the trip: it starts first and the ledger is read meanwhile. The node's `sh -s`
    # runs only the script sent on stdin, so a run the ledger does not know runs nothing there.
    trip = args.early or ssh.start(fast_start.STATUS_SHELL)
    try:
        call = StatusCall(args, rid)
    except BaseException:
        trip.abandon()
        raise
    settled = None
    try:
        res = checked(trip.finish((call.script + "\n").encode(), 120, STATUS_ANSWER_MAX), "status")
    except subprocess.TimeoutExpired:
        raise core.CheckFailed("ssh %s timed out after 120 s" % args.host)
    except AnswerTooLarge:
        res = None           # more than any run's facts: the node's run_status.py answers instead
    if res is not None:
        try:
            settled = call.settle(res.stdout, res.returncode)
        except core.CheckFailed:
            sys.stderr.write(core.safe_text(text(res.stderr)))
            raise core.CheckFailed("run_status.py on %s gave no JSON (exit %d)" % (args.host, res.returncode))
    if settled is None:      # only the node can tell: ask its run_status.py (a second trip)
        res, status = node_json(args, ssh, call.argv, "status", 120, NODE_JSON_MAX)
        settled = status, res.returncode
    status, code = settled
    state = status.get("status") or status.get("state")
    # the run dir this status used goes in its row: a run reached with --durable-dir is then known to later
    # commands (patrol, pull), never a run the ledger lists without a place (finding_laptop_L12)
    record(args, event="status", run_id=rid, state=state, attempt=status.get("attempt"), run_dir=call.run_dir,
           results_dir=call.results_dir, **lease_fields(status))
    one_cost(status, ledger_cost(args, rid, (status.get("lease") or {}).get("budget")))
    if args.json:
        core.emit_json(status)
    else:
        print(core.safe_line(status.get("line") or "%s %s" % (str(state).upper(), rid)))
        print(core.safe_line(status["cost_from_ledger"]["line"]))
        if status.get("hint"):
            print("hint: %s" % core.safe_line(status["hint"]))
    return code


NODE_COST_BIT = re.compile(r" cost ~[0-9.]+ over [0-9.]+[smhd]")


def one_cost(status, spent):
    """Status shows ONE cost and its basis: the run's budget clock (ledger.cost_so_far) when it is known, else
    the node's job time x rate (a lower bound: the box may have billed longer)."""
    if spent.get("cost") is not None:
        status["line"] = NODE_COST_BIT.sub("", status.get("line") or "")
        status["cost_so_far"], status["cost_hours"], status["cost_basis"] = (spent["cost"], spent["hours"],
                                                                             spent["basis"])
    elif status.get("cost_so_far") is not None:
        status["line"] = NODE_COST_BIT.sub("", status.get("line") or "")
        spent = dict(spent, cost=status["cost_so_far"], hours=status.get("cost_hours"),
                     basis="the job's time on the node (a lower bound: the box may have billed longer)")
        spent["line"] = "cost so far: %s (%s)" % (ledger.money(spent["cost"]), spent["basis"])
        status["cost_basis"] = spent["basis"]
    status["cost_from_ledger"] = spent


def cmd_logs(args, ssh):
    rid = check_run_id(args.run_id)
    run_dir, _r, _p = run_paths(args, rid)
    if args.lines < 1:
        raise core.UsageError("--lines must be at least 1")
    res = checked(ssh.run(remote_command(["tail", "-n", str(args.lines), run_dir + "/" + args.log + ".log"]),
                          timeout=120), "logs")
    if args.json:
        core.emit_json({"run_id": rid, "log": args.log, "lines": text(res.stdout).splitlines(),
                        "ok": res.returncode == 0})
    else:
        sys.stdout.write(shown(res.stdout))
        sys.stderr.write(shown(res.stderr))
    return 0 if res.returncode == 0 else 1


def cmd_ack(args, ssh):
    rid = check_run_id(args.run_id)
    run_dir, _r, _p = run_paths(args, rid)
    argv = [node_python(args), "-S", node_tool(args, "deadman.py"), "ack", "--run-dir", run_dir]
    argv += ["--disarm"] if args.disarm else ["--postpone-minutes", str(args.postpone_minutes)]
    res = checked(ssh.run(remote_command(argv), timeout=120), "ack")
    record(args, event="ack", run_id=rid,
                  attempt=ledger_attempt(args, rid), action="disarm" if args.disarm else "postpone %s min" % args.postpone_minutes)
    sys.stdout.write(shown(res.stdout))
    sys.stderr.write(shown(res.stderr))
    return res.returncode


def cmd_resume(args, ssh):
    rid = check_run_id(args.run_id)
    run_dir, _r, profile = run_paths(args, rid)
    argv = [node_python(args), node_tool(args, "boot_resume.py"), "--run", run_dir, "--json"]
    if args.max_attempts is not None:
        argv += ["--max-attempts", str(args.max_attempts)]
    if args.give_up_hours is not None:
        argv += ["--give-up-hours", str(args.give_up_hours)]
    argv += ["--dry-run"] if args.dry_run else []
    argv += ["--force-restart"] if getattr(args, "force_restart", False) else []
    argv += ["--max-cost", "%.12g" % args.max_cost] if args.max_cost is not None else []
    if not args.dry_run:   # launch's rule: a row before the node acts, else refused (12), nothing resumed (N20)
        pending_row(args, "resume_pending", "resuming", run_id=rid, profile=profile, run_dir=run_dir)
    # boot_resume waits up to 90 s for the old dead-man and 600 s for the relaunch: leave it room
    res, result = node_json(args, ssh, argv, "resume", 900)
    if not args.dry_run:
        launched = result.get("action") == "resumed" and result.get("ok")
        raised = result.get("budget") if isinstance(result.get("budget"), dict) else None
        # a refused or failed resume leaves the run at its current attempt; boot_resume names the next one
        record(args, event="resume", run_id=rid, profile=profile,
                      run_dir=run_dir, attempt=result.get("attempt") if launched else ledger_attempt(args, rid),
                      state="launched" if launched else "resume_" + str(result.get("action")), rc=res.returncode,
                      **({"max_cost": raised.get("to"), "budget_raised": raised} if raised else {}))
    if args.json:
        core.emit_json(result)
    else:
        line = "%s %s: %s" % (core.OK if result.get("ok") else core.FAIL, rid, result.get("action"))
        line += (" (%s)" % result["why"]) if result.get("why") else " as attempt %s" % result.get("attempt")
        say(line)
        if result.get("resume_from") and result.get("restored_from"):
            # the job's own copy is torn, empty or gone: say which file the attempt really starts from
            say("resume:     from %s as put back from its verified durable copy %s (the job's own copy is torn, "
                  "empty or gone; it is kept aside), adds %s" % (result["resume_from"], result["restored_from"],
                                                                 " ".join(result.get("resume_args") or [])))
        elif result.get("resume_from"):
            say("resume:     from %s, adds %s" % (result["resume_from"], " ".join(result.get("resume_args") or [])))
        if isinstance(result.get("budget"), dict):   # the cap changed: said, never silent
            raised = result["budget"]
            say("budget:     the run's cap is now %s USD (was %s; %s spent so far)" % (
                ledger.money(raised.get("to")), ledger.money(raised.get("from")), ledger.money(raised.get("spent"))))
        if result.get("warning") and result.get("ok"):   # a refusal says why in its one line, not what would run
            say("WARN %s" % result["warning"])
        lost = result.get("would_supersede")
        if lost and result.get("ok"):
            say("generation: attempt %s's verified outputs are kept in %s" % (lost.get("attempt"),
                                                                             lost.get("kept_as")))
        if result.get("detail"):
            say("node: %s" % " ".join(result["detail"]))
        if result.get("action") == "resumed" and result.get("ok"):
            print("watch:      %s" % again(args, "status", args.host, rid))
    return res.returncode


PATROL_ESCALATE = 10
PATROL_MARK = "@@rgt-exit "
BAD_STATES = ("stalled",) + tuple(w for w in runrec.REPORTED_OVER if w != "succeeded")


def patrol_trip(args, ssh, jobs, read):
    """Run each (shell line, call) of JOBS in ONE ssh call -> {rid: read(call, its output, its exit code)}."""
    parts = [line + "; printf '\n%s%%s@@\n' \"$?\"" % PATROL_MARK for line, _call in jobs]
    limit = min(STATUS_ANSWER_MAX * len(jobs), 4 * STATUS_ANSWER_MAX)
    try:
        res = checked(ssh.run("; ".join(parts), timeout=300, limit=limit), "patrol")
    except AnswerTooLarge:      # each run is then asked again (or reported unknown), never buffered without end
        return {call.rid: None if read is not read_node_json else
                ({"status": "unknown", "reason": "the node's answer passed %d MiB" % (limit >> 20)}, None)
                for _line, call in jobs}
    pieces = re.split(br"\n?" + re.escape(PATROL_MARK.encode()) + br"(\d+)@@\n", res.stdout or b"")
    done = {}
    for index, (_line, call) in enumerate(jobs):
        if 2 * index + 1 < len(pieces):
            try:
                done[call.rid] = read(call, pieces[2 * index], int(pieces[2 * index + 1]))
            except (core.CheckFailed, core.UsageError) as exc:
                done[call.rid] = ({"status": "unknown", "reason": str(exc)}, None)
    return done


def read_node_json(call, raw, rc):
    try:
        st = json.loads(text(raw))
    except ValueError:
        st = None
    return (st, rc) if isinstance(st, dict) else None


def patrol_verdict(st, min_free_gb):
    """(escalate?, why) for one run_status JSON object."""
    why = []
    if st.get("status") in BAD_STATES:
        why.append(st["status"])
    if st.get("unwatched"):
        why.append("finished but nothing watches the meter")
    dm = st.get("deadman") or {}
    if st.get("status") in ("running", "starting", "syncing") and dm.get("word") in ("DOWN", "EXITED"):
        why.append("dead-man %s while the job runs" % dm["word"])
    free = (st.get("disk") or {}).get("free_bytes")
    if isinstance(free, (int, float)) and free < min_free_gb * (1 << 30):
        why.append("disk %s free < %g GiB" % (core.human_bytes(free), min_free_gb))
    return bool(why), why


def patrol_line(rid, st):
    bits = [rid, str(st.get("status", "?")).upper()]
    if st.get("step") is not None:
        bits.append("step %s/%s" % (st["step"], st.get("total_steps") or "?"))
    if st.get("eta_s") is not None and st.get("status") in ("running", "stalled"):
        bits.append("eta %s" % core.human_age(st["eta_s"]))
    if st.get("newest_output_age_s") is not None:
        bits.append("ckpt %s old" % core.human_age(st["newest_output_age_s"]))
    free = (st.get("disk") or {}).get("free_bytes")
    if free is not None:
        bits.append("disk %s free" % core.human_bytes(free))
    dm = st.get("deadman") or {}
    bits.append("deadman %s" % (dm.get("word") or "?").lower())
    if st.get("status") == "deadman_fired":   # a stop read back as done, and one that is not, never share a line
        bits.append("dry run (nothing stopped)" if dm.get("dry_run") else
                    "STOP CONFIRMED" if dm.get("stop_confirmed") is True else
                    "STOP FAILED" if dm.get("stop_ok") is False else "STOP NOT CONFIRMED")
    if st.get("cost_so_far") is not None:
        bits.append("cost ~%.2f" % st["cost_so_far"])
    return " ".join(bits)


def cmd_patrol(args, ssh):
    if args.run_ids:
        rids = [check_run_id(r) for r in args.run_ids]
    else:
        rids = sorted(rid for rid, r in box_runs(args).items() if r.get("gate") != "PASS")
    if not rids:
        return report(args, {"ok": True, "host": args.host, "runs": [], "escalate": False},
                      "%s patrol %s: no run of this box waits for the gate (ledger %s)"
                      % (core.OK, args.host, ledger_path(args.ledger)))
    calls, settled = [], {}
    for rid in rids:   # a run the ledger cannot place is its own UNKNOWN line; the others are still checked
        try:
            calls.append(StatusCall(args, rid))
        except core.UsageError:
            settled[rid] = ({"status": "unknown", "reason": "cannot locate run %s: the ledger has no run dir for it "
                             "(run `%s` once)" % (rid, again(args, "status", args.host, rid, "--durable-dir",
                                                             "DURABLE_DIR"))}, None)
    if calls:
        settled.update(patrol_trip(args, ssh, [(c.script, c) for c in calls], lambda c, raw, rc: c.settle(raw, rc)))
    unsettled = [c for c in calls if settled.get(c.rid) is None]
    if unsettled:      # what only the node's run_status.py can tell, asked in one more trip
        settled.update(patrol_trip(args, ssh, [(remote_command(c.argv), c) for c in unsettled], read_node_json))
    results, escalate, lines = [], False, []
    for rid in rids:
        st = (settled.get(rid) or ({"status": "unknown", "reason": "run_status.py gave no JSON (is the toolkit "
                                                                     "pushed?)"}, None))[0]
        bad, why = patrol_verdict(st, args.min_free_gb)
        if st.get("status") == "unknown":
            bad, why = True, [st["reason"]]
        escalate = escalate or bad
        results.append({"run_id": rid, "escalate": bad, "why": why, "status": st})
        lines.append("  " + core.safe_line(patrol_line(rid, st) + ("  <- ESCALATE: " + "; ".join(why) if bad else "")))
        if any(c.rid == rid for c in calls):   # a run not located was not asked: no row about it
            record(args, event="patrol", run_id=rid, state=st.get("status"),
                   attempt=st.get("attempt"), **lease_fields(st))
    head = "%s patrol %s: %d run(s)%s" % ("ESCALATE" if escalate else core.OK, args.host, len(rids),
                                         "" if escalate else ", nothing needs you")
    if args.json:
        core.emit_json({"ok": not escalate, "host": args.host, "escalate": escalate, "runs": results})
    else:
        print("\n".join([head] + lines))
    return PATROL_ESCALATE if escalate else 0


# ---------------------------------------------------------------- pull, gate

def laptop_tool(name):
    return [sys.executable, os.path.join(HERE, name)]


CHILD_GRACE_S = 30   # how long a child told to end gets before it is killed
GROUP_SIGNAL_S = 1.0  # a signal sent to the whole process group (Ctrl-C, timeout(1)) reaches the child itself


def run_child(argv):
    """(exit code, the signal that interrupted us or None) of laptop tool ARGV. A SIGTERM or SIGINT sent to
    rgt.py alone (an agent's timeout kills by pid) is passed on to the child, which is waited for, so neither
    it nor its transfer outlives us holding the pull lock; the child also dies with us if we are killed -9.
    The caller's `finally` then closes the ssh master and its control folder (finding_laptop_L13)."""
    import signal
    got = []
    proc = subprocess.Popen(argv, preexec_fn=core.die_with_parent())
    previous = {sig: signal.signal(sig, lambda signum, _frame: got.append((signum, time.monotonic())))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    forwarded = killed = False
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if not got:
                continue
            waited = time.monotonic() - got[0][1]
            # a group signal (Ctrl-C, timeout(1)) reached the child too: it gets a moment to end by it before
            # we pass the signal on, so it is never asked twice
            if not forwarded and waited >= GROUP_SIGNAL_S:
                forwarded = True
                try:
                    proc.send_signal(got[0][0])
                except OSError:
                    pass
            elif not killed and waited >= GROUP_SIGNAL_S + CHILD_GRACE_S:
                killed = True
                proc.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc, (got[0][0] if got else None)


def interrupted_code(signum):
    return 128 + int(signum)


def cmd_pull(args, ssh):
    rid = check_run_id(args.run_id)
    run_dir, results, _p = run_paths(args, rid)
    argv = laptop_tool("pull_verified.py") + ["--source", "%s:%s" % (args.host, results), "--dest", args.dest,
                                             "--rsh", ssh.rsh, "--transport", args.transport] + (["--json"] if args.json else [])
    if args.generation is not None:
        argv += ["--generation", str(args.generation)]
    rc, signum = run_child(argv)
    if signum is not None and rc != 0:   # killed by its caller: the pull stopped with it, and the ledger says so
        record(args, event="pull", run_id=rid, dest=args.dest, generation=args.generation, result="interrupted",
               state="pull_interrupted", attempt=ledger_attempt(args, rid), run_dir=run_dir, results_dir=results)
        core.say_error("pull interrupted (%s): re-run the same command to continue" % signal_name(signum),
                       "rgt.py")
        return interrupted_code(signum)
    # the run dir this pull used is recorded (--durable-dir reaches runs the ledger did not launch: L12)
    record(args, event="pull", run_id=rid, dest=args.dest, generation=args.generation,
           state="pulled" if rc == 0 else "pull_failed", attempt=ledger_attempt(args, rid), run_dir=run_dir,
           results_dir=results)
    return rc


def signal_name(signum):
    import signal
    return signal.Signals(signum).name


def cmd_gate(args, ssh):
    import tempfile
    import pull_verified
    import sync as node_sync
    rid = check_run_id(args.run_id)
    run_dir, results, profile = run_paths(args, rid, None)
    profile = args.profile or profile
    if not profile:
        raise core.UsageError("which platform? pass --profile (the ledger has none for %s)" % rid)
    pulled, source = os.path.join(args.dest, rid), results
    keep = args.keep_generation
    if keep is not None and os.path.isdir(os.path.join(args.dest, pull_verified.pulled_name(rid, keep))):
        # the kept generation was pulled home (pull --generation N): gate that pull against its folder on the node
        pulled = os.path.join(args.dest, pull_verified.pulled_name(rid, keep))
        source = os.path.join(node_sync.generations_dir(results), str(keep))
    folder = tempfile.mkdtemp(prefix="rgt-gate-")
    verdict_file = os.path.join(folder, "verdict.json")
    argv = laptop_tool("teardown_gate.py") + ["--pulled", pulled, "--source", "%s:%s" % (args.host, source),
                                              "--rsh", ssh.rsh, "--run-dir", run_dir, "--profile", profile,
                                              "--verdict-file", verdict_file] \
        + ([] if args.no_inspect else ["--inspect"]) + (["--json"] if args.json else []) \
        + (["--keep-generation", str(keep)] if keep is not None else [])
    try:
        rc, signum = run_child(argv)
        # the gate's own verdict, written before it printed a word: a stdout closed early (`| head -1`) changes
        # nothing here; no verdict file (the gate died first) is a refusal
        doc = core.read_json(verdict_file)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if signum is not None and doc.get("verdict") is None:   # ended before it reached a verdict: nothing to record
        core.say_error("gate interrupted (%s) before its verdict: nothing recorded" % signal_name(signum), "rgt.py")
        return interrupted_code(signum)
    verdict = doc.get("verdict") if doc.get("verdict") in ("PASS", "REFUSED") else "REFUSED"
    code = doc.get("exit_code") if isinstance(doc.get("exit_code"), int) else (rc or 3)
    record(args, event="gate", run_id=rid, verdict=verdict, attempt=ledger_attempt(args, rid),
           keep_generation=keep, run_state=doc.get("state_text"))
    if verdict == "PASS" and not args.json:
        core.write_stdout("sweep:      %s   (other runs on this box)\n" % again(args, "sweep", args.host))
    return code if verdict == "PASS" or code else 3


def cmd_sweep(args, ssh):
    """final_sweep.py on the node over every runs dir this box's runs use (the ledger's), or --durable-dir's."""
    if args.durable_dir:
        roots = [args.durable_dir.rstrip("/") + "/runs"]
    else:
        roots = sorted({r["run_dir"].rsplit("/", 1)[0] for r in box_runs(args).values() if r.get("run_dir")})
    if not roots:
        raise core.UsageError("no run of %s in the ledger %s: pass --durable-dir" % (args.host, ledger_path(args.ledger)))
    argv = [node_python(args), node_tool(args, "final_sweep.py")]
    for root in roots:
        argv += ["--runs-dir", root]
    for rid in args.ack:
        argv += ["--ack", check_run_id(rid)]
    argv += (["--check-only"] if args.check_only else []) + (["--json"] if args.json else [])
    res = checked(ssh.run(remote_command(argv), timeout=7 * 3600), "sweep")
    sys.stdout.write(shown(res.stdout))
    sys.stderr.write(shown(res.stderr))
    record(args, event="sweep", runs_dirs=roots,
                  state="all saved" if res.returncode == 0 else "sweep exit %d" % res.returncode)
    return res.returncode


# ---------------------------------------------------------------- ledger

def cmd_ledger(args):
    path = ledger_path(args.ledger)
    torn = []
    events = ledger_events(path, torn)
    runs, boxes = ledger_runs(events)
    now = time.time()
    open_runs = [r for r in runs.values() if args.all or r.get("gate") != "PASS"]
    busy = {(r["box"], r["machine_id"]) for r in runs.values() if r.get("gate") != "PASS"}
    # a box bills until stopped: listed when nothing open is listed for it and it was pushed to after its last
    # run row (a fresh box, or a box pushed to again after its runs passed the gate)
    idle_boxes = [b for key, b in boxes.items() if key not in busy and b["last_push"] > b["last_run_event"]]
    for rec in open_runs + idle_boxes:
        seen = core.parse_iso(rec.get("last_seen"))
        rec["last_seen_ago"] = core.human_age(now - seen) if seen else "n/a"
    notes = []
    reached = {}
    for box in sorted(boxes.values(), key=lambda b: b["last_push"]):
        for alias in box["aliases"]:
            reached.setdefault(alias, []).append(box)
    for alias, seen_boxes in sorted(reached.items()):
        if len(seen_boxes) > 1 and alias != seen_boxes[-1]["box"]:
            notes.append("NOTE %s now reaches %s; it reached %s before: runs listed there are on that other box" % (
                alias, box_label(seen_boxes[-1]["box"], seen_boxes[-1]["machine_id"]),
                ", ".join(box_label(b["box"], b["machine_id"]) for b in seen_boxes[:-1])))
    torn_lines = ["WARN ledger line %d is not a whole row (torn by a crash or a full disk), not counted: %s" % t
                  for t in torn]
    reaped = [dict(ledger.last_reap(b), host=b["host"], box=b["box"]) for b in boxes.values() if ledger.last_reap(b)]
    notes += ["%s %s (box %s): the reaper's %s, rule %s, at %s" % (
        ("REAPED" if r["action"] == "stop" else "TERMINATED") if r["confirmed"] else "REAP NOT CONFIRMED",
        r["host"], r["box"], r["action"], r["rule"] or "-", r["time"]) for r in reaped]
    if args.json:
        for box in idle_boxes:
            box.pop("last_push", None), box.pop("last_run_event", None)
        core.emit_json({"ledger": path, "runs": sorted(open_runs, key=lambda r: (r["host"], r["box"], r["run_id"])),
                        "boxes_without_runs": idle_boxes, "notes": notes, "reaped": reaped,
                        "torn_rows": [{"line": n, "text": t} for n, t in torn]})
        return 1 if torn else 0
    for line in torn_lines:
        print(line)
    if not open_runs and not idle_boxes:
        print("%s nothing in %s is waiting for the teardown gate" % (core.OK, path))
        for line in notes:
            print(line)
        return 1 if torn else 0
    for rec in sorted(open_runs, key=lambda r: (r["host"], r["box"], r["run_id"])):
        tag = ("PASSED gate" if rec.get("gate") == "PASS" else
               "NOT GATED (no meter)" if rec.get("profile") == "local" else "MAY STILL BE BILLING")
        print("%-22s %-14s %-30s attempt %-3s last %-10s seen %s ago (%s)  box %s" % (
              tag, rec["host"], rec["run_id"], rec.get("attempt") or "?", rec.get("last_event"),
              rec["last_seen_ago"], rec.get("state") or "?", box_label(rec["box"], rec.get("machine_id"))))
    for box in idle_boxes:
        print("%-22s %-14s %-30s seen %s ago  box %s" % ("MAY STILL BE BILLING", box["host"], "(pushed, no run)",
                                                        box["last_seen_ago"], box_label(box["box"], box["machine_id"])))
    for line in notes:
        print(line)
    return 1 if torn else 0


# ---------------------------------------------------------------- billing and budget (scripts/billing.py)

def launch_budget(args, options):
    """--max-cost and --instance: the run_one options with the budget's --max-hours, and what the ledger keeps."""
    import billing
    rate = args.rate_per_hour
    if args.instance and args.max_cost is not None and rate is None:
        rate = billing.rate_from_provider(args.instance)
    options, hours, note = billing.plan_budget(args.max_cost, rate, options)
    rows = {k: v for k, v in (("instance", args.instance), ("rate_per_hour", rate), ("max_cost", args.max_cost),
                              ("max_hours", hours)) if v is not None}
    if note and not args.json:
        sys.stderr.write("rgt.py: %s\n" % note)
    return options, {"ledger": rows, "note": note}


def ledger_cost(args, rid, budget=None):
    """The run's cost so far (ledger.cost_so_far), counting BUDGET (the node's budget clock a status just
    read) when there is one."""
    rows = ledger_events(ledger_path(args.ledger))
    if isinstance(budget, dict):
        rows = rows + [{"event": "status", "host": args.host, "box": box_of(args)[0], "run_id": rid,
                        "budget": budget}]
    return ledger.cost_so_far(rows, args.host, rid, args.rate_per_hour, box=box_of(args)[0])


def cmd_billing(args):
    import billing
    path = ledger_path(args.ledger)
    return billing.run(ledger_events(path), path, args.json, args.timeout)


# ---------------------------------------------------------------- arguments

def global_options(parser, suppress):
    """The global options, accepted before or after the command (after: they override)."""
    kw = {"default": argparse.SUPPRESS} if suppress else {}
    parser.add_argument("--json", action="store_true", help="machine-readable output", **kw)
    parser.add_argument("-p", "--port", type=int, help="ssh port", **kw)
    parser.add_argument("-i", "--identity", help="ssh identity file", **kw)
    parser.add_argument("--ssh-config", help="ssh client config (ssh -F)", **kw)
    parser.add_argument("--node-dir", help="node toolkit folder (default ~/rgt-bin)",
                        **(kw or {"default": DEFAULT_NODE_DIR}))
    parser.add_argument("--ledger", help="run ledger file", **kw)


EXIT_EPILOG = core.exit_codes_epilog(__doc__)
# Each command's own codes (review D9): the ones it makes, and those of the node or laptop tool whose exit code it
# passes on (that tool's docstring says them first). Every ssh command adds 255; any command exits 1 on a check
# that failed here (an ssh timeout, an answer that is not JSON) and 2 on usage.
_SSH = "; 255 ssh could not reach HOST (nothing ran there)."
_SIGNAL = "; 130 or 143 killed by SIGINT or SIGTERM (the tool stops with it)"
COMMAND_EXITS = {
    "push": "0 pushed, and the node's toolkit verified as this version; 1 the copy or the node's version check "
            "failed; 2 usage (a forced transport missing); 3 refused: this checkout's node toolkit is not one "
            "version (run tools/stamp_node.py)" + _SSH,
    "probe": "node_probe.py's: 0 probe done, every requested gate passed; 1 the probe could not run; 2 usage or "
             "bad input; 3 a gate refused (each reason on stderr)" + _SSH,
    "launch": "run_one.sh's: 0 launched (with --wait: the job and its sync succeeded; a failed job's own code); "
              "1 the supervisor could not be started (with --wait: the sync failed); 2 usage; 3 a gate refused "
              "(disk floor, durable dir, GPU, a run id the node or the ledger already holds: resume it); 12 refused before the node "
              "acts: the ledger cannot record the launch (read-only, full disk), nothing started" + _SSH,
    "status": "run_status.py's, passed through: 0 succeeded; 1 failed, sync_failed or interrupted; 2 usage, not a "
              "run dir or unreadable state; 4 running (or syncing); 5 starting; 6 stalled; 7 dead-man fired; "
              "8 finished but UNWATCHED (the dead-man is down or exited and never fired)" + _SSH,
    "patrol": "0 every run healthy, in progress or cleanly done; 1 a check failed here; 2 usage; 10 escalate "
              "(stalled, failed, sync_failed, dead-man fired or down, finished but unwatched, disk below "
              "--min-free-gb, a run the ledger cannot place)" + _SSH,
    "logs": "0 the log's tail was printed; 1 the node could not read it; 2 usage" + _SSH,
    "ack": "deadman.py ack's: 0 written; 1 the node could not run it; 2 usage (a bad run id or value)" + _SSH,
    "resume": "boot_resume.py --run's: 0 resumed (with --dry-run: it would be); 1 something could not be done "
              "(its line says what); 2 usage; 3 refused (an attempt still live, succeeded, past the attempt cap or --give-up-hours, the run's "
              "budget spent, a --max-cost not above the amount spent, a restart that would supersede verified "
              "outputs); 12 refused before the node acts: the ledger cannot record the resume (read-only, full "
              "disk), nothing resumed" + _SSH,
    "pull": "pull_verified.py's: 0 verified and promoted (or already here, the same); 1 a check failed "
            "(nothing promoted); 2 usage or bad environment; 3 refused: DEST/RID exists with other content"
            + _SIGNAL + _SSH,
    "gate": "teardown_gate.py's: 0 pass, safe to stop the meter; 1 a check failed here; 2 usage or bad input; "
            "3 refused (every reason listed; a gate that died before its verdict is refused too)" + _SIGNAL + _SSH,
    "sweep": "final_sweep.py's: 0 every run saved and verified, or acknowledged; 1 a run is RUNNING, in CONFLICT, "
             "unsynced or unverified; 2 usage (no run of HOST in the ledger); 4 --check-only found runs that need "
             "a sync" + _SSH,
    "ledger": "0 listed; 1 a torn row was found (the list may be missing a run); 2 usage",
}


def command_epilog(name, before=None):
    """NAME's --help closing paragraph, from COMMAND_EXITS (after BEFORE, a paragraph of its own)."""
    codes = "Exit codes (rgt.py %s): %s" % (name, COMMAND_EXITS[name].rstrip("."))
    import textwrap
    return (before + "\n\n" if before else "") + textwrap.fill(codes + ".", 110, break_on_hyphens=False)
LAUNCH_EPILOG = """the job, and what goes to run_one.sh:
  rgt.py launch HOST --profile P --run-id RID -- CMD [ARGS...]
  rgt.py launch HOST --profile P --run-id RID -- RUN_ONE_ARGS... -- CMD [ARGS...]

RUN_ONE_ARGS (bash scripts/node/run_one.sh --help has them all): --output GLOB (what the sync saves),
--stall-minutes M, --max-hours H, --require-gpu, --wait; for a trainer you did not write, the resume
adapters --resume-glob 'out/ckpt.pt' --resume-arg '--init_from=resume' (a {} in it becomes the checkpoint
path) and --progress-regex 'iter (?P<step>\\d+):', so `rgt.py resume` continues from the newest checkpoint.
A trainer that prints no total: add --total-steps N, so status shows step/N and an ETA.
The dead-man runs the profile's METER_STOP_CMD; give it your own stop with --deadman-arg, one argument each:
  --deadman-arg --stop-cmd --deadman-arg 'CMD'   (a stop that destroys data adds --deadman-arg
  --stop-cmd-destructive --deadman-arg --allow-destructive; it then fires only after a verified sync)
Copy the project to the node yourself first (rsync, or git clone there): push ships only the toolkit."""


COMMANDS = ("push", "probe", "launch", "status", "patrol", "logs", "ack", "resume", "pull", "gate", "sweep",
            "notify", "ledger", "billing", "reap")
VALUED_OPTIONS = ("-p", "--port", "-i", "--identity", "--ssh-config", "--node-dir", "--ledger")


def command_word(argv):
    """The command ARGV names, found without argparse; None when unsure (help, an abbreviated option)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in VALUED_OPTIONS:
            skip = True
        elif word in ("-h", "--help"):
            return None
        elif not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(only=None):
    """The whole CLI; ONLY: build just that command's parser (argparse's set-up of all of them costs more than
    the rest of a status before it connects)."""
    parser = core.Parser(prog="rgt.py", description="The laptop side, one command per phase (see the docstring).",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_EPILOG)
    global_options(parser, suppress=False)
    shared = core.Parser(add_help=False)
    global_options(shared, suppress=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=core.Parser,
                                help="one phase of the chain; rgt.py COMMAND --help for its options")

    def wanted(name):
        return only is None or only == name

    def host_cmd(name, help_text, run_id=False, epilog=None):
        p = sub.add_parser(name, help=help_text, parents=[shared],
                           epilog=command_epilog(name, epilog),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("host", help="ssh alias or user@host")
        if run_id:
            p.add_argument("run_id", help="the run id")
        p.add_argument("--durable-dir", help="the node's DURABLE_DIR (default: the ledger, or the profile)")
        return p

    if wanted("push"):
        p = host_cmd("push", "copy the node toolkit to the node and verify its version")
        p.add_argument("--transport", choices=("auto", "rsync", "tar"), default="auto",
                       help="rsync, a tar stream over ssh, or auto (rsync when both ends have it)")
    if wanted("probe"):
        p = host_cmd("probe", "audit the node (node_probe.py); gate options after --")
        p.add_argument("--profile", help="the node's platform profile (DATA_DIR and DURABLE_DIR defaults)")
    if wanted("launch"):
        p = host_cmd("launch", "start a job through run_one.sh (dead-man first, detached)", epilog=LAUNCH_EPILOG)
        p.add_argument("--profile", required=True, help="the node's platform profile (meter-stop, dirs, proxy hook)")
        p.add_argument("--run-id", required=True, help="a new run id (letters, digits, . _ -); one that exists is refused (3): resume it")
        p.add_argument("--cwd", help="the job's working directory on the node (created)")
        p.add_argument("--rate-per-hour", type=float, help="the price the user pays, for the cost line")
        p.add_argument("--max-cost", type=core.arg_number(float, 0.0, low_open=True),
                       help="the run's budget in the rate's currency (all attempts together): arms the "
                            "dead-man's cap to match")
        p.add_argument("--instance", help="PROVIDER:ID of the box (billing joins on it; a budget reads its rate there)")
    if wanted("status"):
        p = host_cmd("status", "what a run is doing, in one round trip (run_status.py's states and exit codes)",
                     run_id=True)
        p.add_argument("--rate-per-hour", type=float, help="the price the user pays, for the cost line")
    if wanted("patrol"):
        p = host_cmd("patrol", "the scheduled check-in: one round trip, a short report, exit 10 to escalate")
        p.add_argument("run_ids", nargs="*", metavar="RID", help="runs to check (default: the ledger's open runs)")
        p.add_argument("--rate-per-hour", type=float, help="the price the user pays, for the cost line")
        p.add_argument("--min-free-gb", type=float, default=core.DEFAULT_DISK_FLOOR_GB,
                       help="escalate below this much free disk, GiB (default %g: the toolkit's one floor, "
                            "rgt_core.DEFAULT_DISK_FLOOR_GB)" % core.DEFAULT_DISK_FLOOR_GB)
    if wanted("logs"):
        p = host_cmd("logs", "the tail of a run's log", run_id=True)
        p.add_argument("--lines", type=int, default=40, help="lines from the end (default 40)")
        p.add_argument("--log", choices=("job", "supervisor", "deadman"), default="job",
                       help="which log: the job's (default), the supervisor's or the dead-man's")
    if wanted("ack"):
        p = host_cmd("ack", "postpone or disarm the run's dead-man", run_id=True)
        g = p.add_mutually_exclusive_group(required=True)
        g.add_argument("--postpone-minutes", type=float, help="push the dead-man's deadline back this many minutes")
        g.add_argument("--disarm", action="store_true", help="turn the dead-man off for this run (you watch it now)")
    if wanted("resume"):
        p = host_cmd("resume", "relaunch a preempted or failed run as its next attempt", run_id=True)
        p.add_argument("--max-attempts", type=int, help="attempt cap for this resume (default: the launch's, 3)")
        p.add_argument("--give-up-hours", type=float, help="refuse once the first attempt started longer ago (48)")
        p.add_argument("--force-restart", action="store_true",
                       help="resume a run with no resume adapter even though its restart from step 0 supersedes the "
                            "verified durable outputs (kept as a generation on the node)")
        p.add_argument("--max-cost", type=core.arg_number(float, 0.0, low_open=True), metavar="USD",
                       help="the run's new budget, all attempts together, above what it has spent: the way on "
                            "for a run whose budget is spent (recorded on the node and in the ledger)")
        p.add_argument("--dry-run", action="store_true", help="say what would happen, change nothing")
    if wanted("pull"):
        p = host_cmd("pull", "copy the results home and verify every byte", run_id=True)
        p.add_argument("--dest", default="pulled", help="local folder; the run lands in DEST/RID (default pulled)")
        p.add_argument("--transport", choices=("auto", "rsync", "tar"), default="auto",
                       help="rsync, a tar stream over ssh, or auto (rsync when both ends have it)")
        p.add_argument("--generation", type=core.arg_number(int, 1, 1 << 30), metavar="N",
                       help="bring home generation N instead of the current results: attempt N's verified results, "
                            "kept on the node when a later attempt did not continue it (resume --force-restart); "
                            "lands in DEST/RID@generation-N, verified byte for byte as any pull")
    if wanted("gate"):
        p = host_cmd("gate", "the teardown gate: is it safe to stop the meter?", run_id=True)
        p.add_argument("--dest", default="pulled", help="where the pull put the run (DEST/RID; default pulled)")
        p.add_argument("--profile", help="the platform profile whose meter-stop action the pass prints")
        p.add_argument("--no-inspect", action="store_true", help="skip the checkpoint load checks (ckpt_inspect.py)")
        p.add_argument("--keep-generation", type=core.arg_number(int, 1, 1 << 30), metavar="N",
                       help="the generation you keep when the node holds more than one (refused without it): "
                            "the current results' attempt number, or a kept one pulled with pull --generation N "
                            "(DEST/RID@generation-N is then gated); the PASS names what a teardown destroys")
    if wanted("sweep"):
        p = host_cmd("sweep", "before release: every run of the box on durable storage, verified (final_sweep.py)")
        p.add_argument("--check-only", action="store_true", help="report what needs a sync; sync nothing")
        p.add_argument("--ack", action="append", default=[], metavar="RID",
                       help="acknowledge that run RID produced nothing worth saving: ACKED instead of FAILED, its "
                            "record and logs saved alone so `pull HOST RID` brings the crash log home (repeatable)")
    if wanted("notify"):
        import notify_cli
        notify_cli.add_parser(sub, shared)
    if wanted("ledger"):
        p = sub.add_parser("ledger", help="runs and boxes not yet through the teardown gate", parents=[shared],
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=command_epilog("ledger"))
        p.add_argument("--all", action="store_true", help="also list runs that passed the gate")
    if wanted("billing"):
        import billing  # `rgt.py billing` runs billing.run(), so its exit codes are billing.py's
        p = sub.add_parser("billing", help="what is still billing you, joined with the ledger (read-only)",
                           parents=[shared], formatter_class=core.RawHelp, epilog=billing.EXIT_EPILOG)
        p.add_argument("--timeout", type=core.arg_number(float, 0.0, 600, low_open=True), default=30.0,
                       help="seconds one provider request may take")
    if wanted("reap"):   # listed for -h; dispatch() hands `reap` to scripts/reap.py and its own parser first
        p = sub.add_parser("reap", help="the backstop off the box: stop what the node can no longer stop "
                                        "(rgt.py reap --help)", add_help=False)
        p.add_argument("words", nargs=argparse.REMAINDER)
    return parser


def main(argv=None, early=None):
    """EARLY: the status trip fast_start opened for this command line, if any; used when this parse asks for
    exactly that ssh command, else dropped (nothing ran on the node)."""
    used = []
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv), early, used)
    finally:
        if early and not used:
            early.abandon()


def dispatch(argv, early, used):
    if command_word(argv) == "reap":      # scripts/reap.py has its own parser: it sees every word but "reap"
        import reap
        cut = next(i for i, w in enumerate(argv) if w == "reap")
        return reap.main(argv[:cut] + argv[cut + 1:])
    rest = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    args = build_parser(command_word(argv)).parse_args(argv)
    core.guard_output(getattr(args, "json", False))   # node-sent words reach this output: finding_laptop_L10
    args.rest = rest
    if not args.command:
        raise core.UsageError("give a command: push, probe, launch, status, patrol, logs, ack, resume, pull, gate, "
                              "sweep, ledger, notify, billing, reap")
    if rest and args.command not in ("probe", "launch"):
        raise core.UsageError("'--' is only for probe and launch")
    if args.command == "ledger":
        return cmd_ledger(args)
    if args.command == "billing":
        return cmd_billing(args)
    # a command that makes one call connects once anyway: a master would only add its start and its exit
    ssh = Ssh(args.host, args.port, args.identity, args.ssh_config, mux=args.command not in ONE_CALL)
    args.early = None
    if early and args.command == "status" and early.argv == ssh.argv(fast_start.STATUS_SHELL):
        args.early = early
        used.append(early)
    try:
        return globals()["cmd_" + args.command](args, ssh)
    except Unreachable as exc:
        core.say_error(str(exc), "rgt.py")
        return SSH_UNREACHABLE
    except LedgerRefused as exc:
        core.say_error(str(exc), "rgt.py")
        return LEDGER_REFUSED
    finally:
        ssh.close()   # one connection per command: the master ends with it


def cmd_notify(args, ssh):
    import notify_cli  # scripts/notify_cli.py: `rgt.py notify`
    return notify_cli.cmd_notify(args, ssh, sys.modules[__name__])


def report(args, fields, human):
    if args.json:
        core.emit_json(fields)
    else:
        print(core.safe_text(human))     # node-sent words may be in it; --json keeps them raw
    return 0 if fields.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(core.run_main(lambda argv: main(argv, EARLY), prog="rgt.py"))
