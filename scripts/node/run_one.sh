#!/usr/bin/env bash
# run_one.sh — launch ONE training command on this node so that it looks after itself.
#
# Usage:
#   run_one.sh [--profile NAME] [--run-id ID] [--run-dir DIR] [--durable-dir DIR] [--output GLOB]...
#              [--disk-floor-gb N] [--stall-minutes M] [--grace-minutes M] [--max-hours H]
#              [--deadman-dry-run] [--no-deadman] [--deadman-arg ARG]... [--wait] [--poll-seconds S]
#              [--require-gpu] -- CMD [ARGS...]
#
# In order: load the profile's defaults from profiles/index.json (variables already set in the
# environment win; flags win over both) -> source PROXY_HOOK when it is an existing file (sourced,
# never eval'd) -> refuse below the disk floor (free bytes AND inodes on DATA_DIR, DURABLE_DIR and
# the run dir's filesystem) -> with --require-gpu, refuse when nvidia-smi lists no GPU (a restart
# that came back with zero GPUs bills for nothing) -> create the run dir and take its lock ->
# write run.json and status.json -> ARM THE DEAD-MAN (deadman.py next to this script) -> start a
# detached supervisor (tmux when installed, else setsid+nohup) that survives the SSH session, runs
# CMD with output appended to job.log, forwards SIGTERM/SIGINT/SIGHUP to the job's process group
# as SIGTERM (spot grace), records the exit code, then copies the --output globs (relative to the current
# directory) to $DURABLE_DIR/results/$RUN_ID/ and verifies every copy by sha256 (sync.json).
#
# A sync that fails or does not verify, or an --output glob that matches nothing, makes the run
# sync_failed and the supervisor exit non-zero even when training exited 0.
#
# tmux: each run gets its own tmux server (socket rgt-<run_id>) so the job inherits THIS shell's
# environment (proxy hook, HF_* variables); an already-running tmux server would hand the new
# session its own, older environment. Attach with: tmux -L rgt-<run_id> attach -t rgt-<run_id>
#
# Extra knobs (environment): DISK_FLOOR_INODES (default 10000 free inodes), RGT_PROFILE (profile
# when --profile is absent), RGT_PROFILE_INDEX (path of index.json). --deadman-arg passes one
# argument through to `deadman.py arm` (e.g. --deadman-arg --allow-destructive).
#
# Exit codes: 0 launched (or, with --wait, the job and its sync succeeded); with --wait the job's
# own exit code when it failed, or 1 when the job exited 0 but the durable sync failed;
# 1 the supervisor could not be started; 2 usage; 3 a gate refused (disk floor, no GPU, run dir locked by a
# live run, a dead-man still armed on this run dir, the dead-man could not be armed).
set -uo pipefail

PROG=run_one.sh
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
DEADMAN="$SCRIPT_DIR/deadman.py"
PY=${RGT_PYTHON:-}
resolve_python() {  # once: a pyenv/conda shim costs ~0.2 s a call; children inherit RGT_PYTHON
  [ -n "$PY" ] && return 0
  PY=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=""
  [ -n "$PY" ] || { printf '%s: error: python3 is not installed; run_one.sh needs Python 3.8+\n' "$PROG" >&2; exit 1; }
  export RGT_PYTHON="$PY"
}

# All JSON and filesystem work the shell is bad at, in one stdlib-only Python helper
# (run with -E -S: no PYTHON* variables, no site-packages; about 40 ms a call).
PYHELP=$(cat <<'PY'
import json, os, sys, time

def iso(ts=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))

def load(path):
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}

def save(path, obj):
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)

def update(path, **fields):
    doc = load(path)
    doc.update(fields)
    doc["updated_at"] = iso()
    save(path, doc)

def alive(pid):
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except OSError:
        pass
    try:
        with open("/proc/%d/stat" % int(pid)) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True

def copy_verify(src, dst):
    """Copy with cp -p semantics, fsync, re-read the copy: (size, sha256 of source, sha256 of copy)."""
    import hashlib
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dst), ".%s.part" % os.path.basename(dst))
    h_src, size, shown = hashlib.sha256(), 0, time.time()
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            h_src.update(block)
            fout.write(block)
            size += len(block)
            if time.time() - shown > 30:  # a long copy is progress, not a stall, for the dead-man
                shown = time.time()
                print("[rgt] syncing %s: %d MiB so far" % (os.path.basename(src), size >> 20), flush=True)
        fout.flush()
        os.fsync(fout.fileno())
        try:  # drop the cached pages so the check below reads what reached the storage
            os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):
            pass
    st = os.stat(src)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(tmp, st.st_mode & 0o7777)
    os.replace(tmp, dst)
    h_dst = hashlib.sha256()
    with open(dst, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h_dst.update(block)
    return size, h_src.hexdigest(), h_dst.hexdigest()

def do_sync(run_dir):
    """Copy run.json's outputs to results_dir, verify each copy, write sync.json; True when all verified."""
    import glob
    run = load(os.path.join(run_dir, "run.json"))
    outputs, cwd, dest = run.get("outputs") or [], run.get("cwd") or ".", run.get("results_dir")
    doc = {"ok": False, "verified": False, "dest": dest, "files": [], "outputs": outputs,
           "started_at": iso(), "finished_at": None, "error": None}
    out_path = os.path.join(run_dir, "sync.json")
    if not outputs:
        doc.update(ok=True, finished_at=iso(), note="no --output globs declared: nothing was copied to durable storage")
        save(out_path, doc)
        print("[rgt] no --output declared: nothing to sync", flush=True)
        return True
    try:
        plan, missing = {}, []
        for pattern in outputs:
            matches = sorted(glob.glob(os.path.join(cwd, pattern), recursive=True))
            if not matches:
                missing.append(pattern)
            for match in matches:
                rel = os.path.relpath(match, cwd)
                if rel == ".." or rel.startswith(".." + os.sep):
                    rel = os.path.basename(match)
                pairs = []
                if os.path.isdir(match):
                    for root, _dirs, files in os.walk(match):
                        pairs += [(os.path.join(root, n), os.path.normpath(os.path.join(rel, os.path.relpath(
                            os.path.join(root, n), match)))) for n in sorted(files)]
                elif os.path.isfile(match):
                    pairs.append((match, os.path.normpath(rel)))
                for src, dst_rel in pairs:
                    if dst_rel in plan and os.path.realpath(plan[dst_rel]) != os.path.realpath(src):
                        raise RuntimeError("%s and %s would both land on %s" % (plan[dst_rel], src, dst_rel))
                    plan[dst_rel] = src
        if missing:
            raise RuntimeError("output glob(s) matched nothing: %s (relative to %s)" % (", ".join(missing), cwd))
        os.makedirs(dest, exist_ok=True)
        total = 0
        for rel, src in sorted(plan.items()):
            size, sha_src, sha_dst = copy_verify(src, os.path.join(dest, rel))
            if sha_src != sha_dst:
                raise RuntimeError("copy of %s does not match its source (sha256 %s != %s)" % (rel, sha_dst, sha_src))
            doc["files"].append({"path": rel.replace(os.sep, "/"), "size": size, "sha256": sha_dst})
            total += size
            print("[rgt] synced %s (%d bytes, sha256 %s...)" % (rel, size, sha_dst[:12]), flush=True)
        doc.update(ok=True, verified=True, total_bytes=total)
    except Exception as exc:
        doc["error"] = "%s: %s" % (type(exc).__name__, exc)
        print("[rgt] SYNC FAILED: %s" % doc["error"], flush=True)
    doc["finished_at"] = iso()
    save(out_path, doc)
    return doc["ok"]

def main(argv):
    op = argv[0]
    if op == "profile":  # INDEX NAME -> KEY\0VALUE\0 pairs of its defaults
        profiles = load(argv[1]).get("profiles")
        if not isinstance(profiles, dict):
            sys.stderr.write("run_one.sh: error: %s is not a readable profile index (no \"profiles\" object)\n"
                             % argv[1])
            return 2
        if argv[2] not in profiles:
            sys.stderr.write("run_one.sh: error: profile %r is not in %s (known: %s)\n"
                             % (argv[2], argv[1], ", ".join(sorted(profiles)) or "none"))
            return 2
        prof = profiles[argv[2]]
        defaults = (prof.get("defaults") or {}) if isinstance(prof, dict) else None
        if not isinstance(defaults, dict):
            sys.stderr.write("run_one.sh: error: profile %r in %s is malformed (its defaults are not an object)\n"
                             % (argv[2], argv[1]))
            return 2
        for key, value in sorted(defaults.items()):
            if value is None or isinstance(value, (dict, list)):
                continue
            value = ("true" if value else "false") if isinstance(value, bool) else str(value)
            sys.stdout.write("%s\0%s\0" % (key, os.path.expanduser(value) if value.startswith("~/") else value))
    elif op == "disk":  # FLOOR_GIB FLOOR_INODES PATH... -> exit 3 when any filesystem is below
        floor_gib, floor_inodes, bad, seen = float(argv[1]), int(argv[2]), 0, set()
        for path in argv[3:]:
            probe = os.path.abspath(path)
            while not os.path.exists(probe):
                probe = os.path.dirname(probe)
            dev = os.stat(probe).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            st = os.statvfs(probe)
            gib = st.f_bavail * st.f_frsize / float(1 << 30)
            low = gib < floor_gib or (st.f_files > 0 and st.f_favail < floor_inodes)
            bad += low
            sys.stderr.write("%s disk %s: %.1f GiB free (floor %g), %s\n" % (
                "REFUSED" if low else "ok", probe, gib, floor_gib, "inodes not reported" if st.f_files == 0
                else "%d free inodes (floor %d)" % (st.f_favail, floor_inodes)))
        return 3 if bad else 0
    elif op == "init":  # RUN_DIR RUN_ID CWD PROFILE DURABLE RESULTS DETACH LAUNCHER CHECK_DM N OUT... -- CMD...
        run_dir, run_id, cwd, profile, durable, results, detach, launcher, check_dm, n = argv[1:11]
        outputs, cmd = argv[11:11 + int(n)], argv[11 + int(n):]
        dm = load(os.path.join(run_dir, "deadman.json"))
        if check_dm == "1" and dm.get("state") == "armed" and alive(dm.get("pid")):
            sys.stderr.write("run_one.sh: error: a dead-man (pid %s) is still armed on %s; disarm it first: "
                             "deadman.py ack --run-dir %s --disarm\n" % (dm.get("pid"), run_dir, run_dir))
            return 3
        import socket
        save(os.path.join(run_dir, "run.json"), {
            "run_id": run_id, "cmd": cmd, "cwd": cwd, "profile": profile or None, "host": socket.gethostname(),
            "created_at": iso(), "outputs": outputs, "durable_dir": durable or None,
            "results_dir": results or None, "run_dir": run_dir})
        save(os.path.join(run_dir, "status.json"), {
            "run_id": run_id, "state": "starting", "job_pid": None, "exit_code": None, "started_at": None,
            "ended_at": None, "updated_at": iso(), "detach": detach, "launcher_pid": int(launcher),
            "supervisor_pid": None})
    elif op == "set":  # FILE key=JSON ... ("@now" = the current time)
        fields = {}
        for pair in argv[2:]:
            key, _, raw = pair.partition("=")
            fields[key] = iso() if raw == "@now" else json.loads(raw)
        update(argv[1], **fields)
    elif op == "fail":  # RUN_DIR MESSAGE
        update(os.path.join(argv[1], "status.json"), state="failed", error=argv[2], ended_at=iso())
    elif op == "sup-start":  # RUN_DIR PID -> RUN_ID\0CWD\0CMD...\0
        run = load(os.path.join(argv[1], "run.json"))
        update(os.path.join(argv[1], "status.json"), supervisor_pid=int(argv[2]))
        sys.stdout.write("".join("%s\0" % a for a in [run.get("run_id") or "", run.get("cwd") or ""] +
                                 (run.get("cmd") or [])))
    elif op == "finish":  # RUN_DIR RC: syncing -> sync -> final state; exit 0 synced, 1 not
        run_dir, rc = argv[1], int(argv[2])
        status_path = os.path.join(run_dir, "status.json")
        update(status_path, state="syncing", exit_code=rc, ended_at=iso())
        ok = do_sync(run_dir)
        update(status_path, state="failed" if rc else ("succeeded" if ok else "sync_failed"), exit_code=rc, sync_ok=ok)
        return 0 if ok else 1
    elif op == "get":  # FILE KEY... -> one value a line ("" for null)
        doc = load(argv[1])
        for key in argv[2:]:
            value = doc.get(key)
            print("" if value is None else value)
    else:
        sys.stderr.write("unknown helper op %s\n" % op)
        return 2
    return 0

sys.exit(main(sys.argv[1:]))
PY
)

pyh() { "$PY" -E -S -c "$PYHELP" "$@"; }
die() { printf '%s: error: %s\n' "$PROG" "$1" >&2; exit "${2:-2}"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&2; }
is_num() { [[ "$1" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]]; }
pid_alive() {  # exists and is not a zombie
  local stat
  [ -n "${1:-}" ] || return 1
  kill -0 "$1" 2>/dev/null || [ -d "/proc/$1" ] || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

usage() {
  sed -n '2,/^set -uo/p' "$SELF" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------------------------- supervisor
# Internal: `run_one.sh --supervise RUN_DIR` runs inside tmux or setsid. Everything it needs is
# in run.json; the environment is inherited from the launcher.
supervise() {
  local run_dir=$1 job_log rc=0 sync_rc state cwd
  local -a meta=() cmd=()
  job_log="$run_dir/job.log"
  exec 2>>"$run_dir/supervisor.log"
  note() { printf '[rgt %s] %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$job_log"; }
  JOB_PID=""
  PENDING_SIG=""
  forward() {
    if [ -z "$JOB_PID" ]; then PENDING_SIG=$1; return; fi
    note "supervisor got SIG$1: forwarding SIGTERM to the job's process group $JOB_PID"
    kill -TERM -- "-$JOB_PID" 2>/dev/null || kill -TERM "$JOB_PID" 2>/dev/null || true
  }
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  trap 'forward HUP' HUP

  # record who supervises, then take the run lock over from the launcher (it waits for this)
  mapfile -d '' meta < <(pyh sup-start "$run_dir" "$$")
  printf '%s\n' "$$" >"$run_dir/run.lock/pid.tmp" && mv -f "$run_dir/run.lock/pid.tmp" "$run_dir/run.lock/pid"
  cwd=${meta[1]:-}
  cmd=("${meta[@]:2}")
  RGT_RUN_DIR=$run_dir
  RGT_RUN_ID=${meta[0]:-}
  RGT_HEARTBEAT="$run_dir/heartbeat.json"
  export RGT_RUN_DIR RGT_RUN_ID RGT_HEARTBEAT
  if [ "${#cmd[@]}" -eq 0 ] || ! cd "$cwd"; then
    note "cannot start: no command in run.json or cwd '$cwd' is gone"
    rc=127
  else
    note "starting: ${cmd[*]} (cwd $cwd)"
    if command -v setsid >/dev/null 2>&1; then   # own process group: signals reach the whole job tree
      setsid "${cmd[@]}" </dev/null >>"$job_log" 2>&1 &
    else
      "${cmd[@]}" </dev/null >>"$job_log" 2>&1 &
    fi
    JOB_PID=$!
    pyh set "$run_dir/status.json" 'state="running"' "job_pid=$JOB_PID" 'started_at=@now'
    [ -n "$PENDING_SIG" ] && forward "$PENDING_SIG"
    while :; do
      wait "$JOB_PID"
      rc=$?
      # a trapped signal interrupts `wait` with rc>128 while the job still runs: wait again
      if [ "$rc" -gt 128 ] && kill -0 "$JOB_PID" 2>/dev/null; then continue; fi
      break
    done
    note "job exited with code $rc"
  fi
  printf '%s\n' "$rc" >"$run_dir/.exit_code.tmp" && mv -f "$run_dir/.exit_code.tmp" "$run_dir/exit_code"
  pyh finish "$run_dir" "$rc" >>"$job_log" 2>&1
  sync_rc=$?
  if [ "$rc" -ne 0 ]; then state=failed; elif [ "$sync_rc" -ne 0 ]; then state=sync_failed; else state=succeeded; fi
  note "run finished: state $state, job exit code $rc"
  if [ "$(cat "$run_dir/run.lock/pid" 2>/dev/null)" = "$$" ]; then rm -rf "$run_dir/run.lock"; fi
  # This run's private tmux server ends with this process; its socket file would stay behind.
  if [ -n "${TMUX:-}" ]; then rm -f "${TMUX%%,*}"; fi
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
  [ "$sync_rc" -eq 0 ] || exit 1
  exit 0
}

if [ "${1:-}" = "--supervise" ]; then
  [ -n "${2:-}" ] && [ -d "$2" ] || die "--supervise needs an existing run dir"
  resolve_python
  supervise "$2"
fi

# ---------------------------------------------------------------------------------- arguments
PROFILE="" RUN_ID="" RUN_DIR="" DURABLE_ARG="" FLOOR_ARG="" STALL="" GRACE="" MAXH="" POLL=""
DM_DRY=0 NO_DM=0 WAIT=0 NEED_GPU=0
OUTPUTS=() DM_EXTRA=()
need_val() { [ "$#" -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --profile) need_val "$@"; PROFILE=$2; shift 2 ;;
    --run-id) need_val "$@"; RUN_ID=$2; shift 2 ;;
    --run-dir) need_val "$@"; RUN_DIR=$2; shift 2 ;;
    --durable-dir) need_val "$@"; DURABLE_ARG=$2; shift 2 ;;
    --output) need_val "$@"; OUTPUTS+=("$2"); shift 2 ;;
    --disk-floor-gb) need_val "$@"; FLOOR_ARG=$2; shift 2 ;;
    --stall-minutes) need_val "$@"; STALL=$2; shift 2 ;;
    --grace-minutes) need_val "$@"; GRACE=$2; shift 2 ;;
    --max-hours) need_val "$@"; MAXH=$2; shift 2 ;;
    --poll-seconds) need_val "$@"; POLL=$2; shift 2 ;;
    --deadman-arg) need_val "$@"; DM_EXTRA+=("$2"); shift 2 ;;
    --deadman-dry-run) DM_DRY=1; shift ;;
    --no-deadman) NO_DM=1; shift ;;
    --wait) WAIT=1; shift ;;
    --require-gpu) NEED_GPU=1; shift ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (the command goes after --; see --help)" ;;
  esac
done
[ "$#" -gt 0 ] || die "no command given: run_one.sh [options] -- CMD [ARGS...]"
CMD=("$@")
for pair in "--disk-floor-gb=$FLOOR_ARG" "--stall-minutes=$STALL" "--grace-minutes=$GRACE" \
            "--max-hours=$MAXH" "--poll-seconds=$POLL"; do
  value=${pair#*=}
  [ -z "$value" ] || is_num "$value" || die "${pair%%=*} wants a non-negative number, got '$value'"
done
if [ -n "$POLL" ] && ! [[ "$POLL" =~ [1-9] ]]; then die "--poll-seconds must be > 0, got '$POLL'"; fi
if [ "$NO_DM" = 1 ] && [ "$DM_DRY$STALL$GRACE$MAXH${#DM_EXTRA[@]}" != 00 ]; then
  die "--no-deadman conflicts with --deadman-dry-run, --deadman-arg, --stall-minutes, --grace-minutes and --max-hours"
fi
if [ -n "$RUN_ID" ] && ! [[ "$RUN_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]]; then
  die "--run-id may hold letters, digits, '.', '_' and '-' (max 100), got '$RUN_ID'"
fi

resolve_python

# ---------------------------------------------------------------------------------- profile
PROFILE=${PROFILE:-${RGT_PROFILE:-}}
INDEX=""
if [ -n "${RGT_PROFILE_INDEX:-}" ]; then
  INDEX=$RGT_PROFILE_INDEX
elif [ -f "$SCRIPT_DIR/../../profiles/index.json" ]; then
  INDEX=$(cd "$SCRIPT_DIR/../../profiles" && pwd)/index.json
elif [ -f "$SCRIPT_DIR/index.json" ]; then
  INDEX="$SCRIPT_DIR/index.json"
fi
if [ -n "$PROFILE" ]; then
  [ -n "$INDEX" ] && [ -f "$INDEX" ] ||
    die "profile '$PROFILE' asked for but no profiles/index.json found (set RGT_PROFILE_INDEX)"
  defaults=$(pyh profile "$INDEX" "$PROFILE" | tr '\0' '\n') || exit 2
  while IFS= read -r key && IFS= read -r value; do
    case "$key" in
      DATA_DIR|DURABLE_DIR|HF_HOME|PROXY_HOOK|DISK_FLOOR_GB) ;;
      *) continue ;;
    esac
    if [ -z "${!key:-}" ]; then
      printf -v "$key" '%s' "$value"
    fi
  done <<<"$defaults"
fi
[ -n "$DURABLE_ARG" ] && DURABLE_DIR=$DURABLE_ARG
for var in DATA_DIR DURABLE_DIR HF_HOME; do
  if [ -n "${!var:-}" ]; then export "${var?}"; fi
done
export RGT_PROFILE_INDEX="$INDEX"

# ---------------------------------------------------------------------------------- proxy hook
if [ -n "${PROXY_HOOK:-}" ]; then
  if [ -f "$PROXY_HOOK" ]; then
    set +u
    # shellcheck source=/dev/null
    . "$PROXY_HOOK" || warn "proxy hook $PROXY_HOOK returned non-zero; continuing"
    set -u
  else
    warn "PROXY_HOOK=$PROXY_HOOK is not a file; continuing without it"
  fi
fi

# ---------------------------------------------------------------------------------- where
if [ -z "$RUN_ID" ]; then
  if [ -n "$RUN_DIR" ]; then
    RUN_ID=$(basename "$RUN_DIR")
  else
    tag=$(basename "${CMD[0]}" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-24)
    RUN_ID="$(date -u +%Y%m%dT%H%M%SZ)-${tag}-$RANDOM"
  fi
  [[ "$RUN_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]] || RUN_ID="run-$(date -u +%Y%m%dT%H%M%SZ)-$RANDOM"
fi
if [ -z "$RUN_DIR" ]; then
  [ -n "${DURABLE_DIR:-}" ] ||
    die "no place for the run: pass --durable-dir DIR, --run-dir DIR, set DURABLE_DIR or --profile"
  RUN_DIR="$DURABLE_DIR/runs/$RUN_ID"
fi
RESULTS_DIR=""
if [ "${#OUTPUTS[@]}" -gt 0 ]; then
  [ -n "${DURABLE_DIR:-}" ] || die "--output needs a durable destination: pass --durable-dir or set DURABLE_DIR"
  RESULTS_DIR="$DURABLE_DIR/results/$RUN_ID"
fi
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
case "$RESULTS_DIR" in ""|/*) ;; *) RESULTS_DIR="$PWD/$RESULTS_DIR" ;; esac
there=$RUN_DIR   # a file where the run dir must go is bad input, not a launch failure
while [ ! -e "$there" ] && [ ! -L "$there" ]; do there=$(dirname "$there"); done
[ -d "$there" ] || die "cannot use run dir $RUN_DIR: $there is not a directory"

# ---------------------------------------------------------------------------------- disk gate
FLOOR=${FLOOR_ARG:-${DISK_FLOOR_GB:-10}}
is_num "$FLOOR" || die "DISK_FLOOR_GB must be a number, got '$FLOOR'"
INODE_FLOOR=${DISK_FLOOR_INODES:-10000}
[[ "$INODE_FLOOR" =~ ^[0-9]+$ ]] || die "DISK_FLOOR_INODES must be an integer, got '$INODE_FLOOR'"
gate_paths=("$RUN_DIR")
[ -n "${DATA_DIR:-}" ] && gate_paths+=("$DATA_DIR")
[ -n "${DURABLE_DIR:-}" ] && gate_paths+=("$DURABLE_DIR")
if ! pyh disk "$FLOOR" "$INODE_FLOOR" "${gate_paths[@]}"; then
  die "disk floor not met (need ${FLOOR} GiB and ${INODE_FLOOR} inodes free): free space first (df -h; df -i);\
 nothing was started" 3
fi

# ---------------------------------------------------------------------------------- GPU gate
# A GPU job on a box whose GPU is gone (a restart that found "0 GPUs", a broken driver) bills for nothing.
if [ "$NEED_GPU" = 1 ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [ "${gpus:-0}" -lt 1 ]; then
    die "--require-gpu: nvidia-smi lists no GPU (missing driver, or the box came back without one); nothing was\
 started" 3
  fi
  printf 'ok GPU gate: %s GPU(s) listed by nvidia-smi\n' "$gpus" >&2
fi

# ---------------------------------------------------------------------------------- run dir + lock
mkdir_err=$(mkdir -p "$RUN_DIR" 2>&1) || die "cannot create run dir $RUN_DIR: ${mkdir_err##*: }" 1
RUN_DIR=$(cd "$RUN_DIR" && pwd)
LOCK="$RUN_DIR/run.lock"
LOCK_MINE=0
# shellcheck disable=SC2329  # invoked by the EXIT trap
release_lock() {
  if [ "$LOCK_MINE" = 1 ] && [ "$(cat "$LOCK/pid" 2>/dev/null)" = "$$" ]; then rm -rf "$LOCK"; fi
  LOCK_MINE=0
}
trap release_lock EXIT
for _attempt in 1 2 3 4 5; do
  if mkdir "$LOCK" 2>/dev/null; then
    printf '%s\n' "$$" >"$LOCK/pid"
    LOCK_MINE=1
    break
  fi
  owner=$(cat "$LOCK/pid" 2>/dev/null || true)
  if [ -z "$owner" ]; then sleep 0.5; continue; fi   # being created right now
  if pid_alive "$owner"; then
    die "run dir $RUN_DIR is locked by live pid $owner (a run is using it); choose another --run-id" 3
  fi
  warn "reclaiming stale lock $LOCK (pid $owner is gone)"
  mv "$LOCK" "$LOCK.stale.$$" 2>/dev/null && rm -rf "$LOCK.stale.$$"
done
[ "$LOCK_MINE" = 1 ] || die "could not take the lock $LOCK" 3

DETACH=setsid
command -v tmux >/dev/null 2>&1 && DETACH=tmux
pyh init "$RUN_DIR" "$RUN_ID" "$PWD" "$PROFILE" "${DURABLE_DIR:-}" "$RESULTS_DIR" "$DETACH" "$$" \
  "$((1 - NO_DM))" "${#OUTPUTS[@]}" "${OUTPUTS[@]}" "${CMD[@]}"
init_rc=$?
[ "$init_rc" -eq 0 ] || exit "$([ "$init_rc" -eq 3 ] && echo 3 || echo 1)"
# a relaunch in the same run dir (resume after preemption) keeps the old evidence apart
old=()
for f in exit_code sync.json DEADMAN_FIRED.json ACK; do [ -e "$RUN_DIR/$f" ] && old+=("$f"); done
if [ "${#old[@]}" -gt 0 ]; then
  prev="$RUN_DIR/previous/$(date -u +%Y%m%dT%H%M%SZ)-$$"
  mkdir -p "$prev" && for f in "${old[@]}"; do mv "$RUN_DIR/$f" "$prev/"; done
  warn "earlier attempt's ${old[*]} moved to $prev"
fi

touch "$RUN_DIR/job.log"

fail_launch() {  # MESSAGE EXIT: leave a readable failed status, never a dangling dead-man
  pyh fail "$RUN_DIR" "$1" 2>/dev/null
  if [ -n "${DM_PID:-}" ]; then "$PY" "$DEADMAN" ack --run-dir "$RUN_DIR" --disarm >/dev/null 2>&1; fi
  die "$1" "$2"
}

# ---------------------------------------------------------------------------------- dead-man
DM_PID=""
if [ "$NO_DM" = 1 ]; then
  warn "!!! --no-deadman: NOTHING on this node will stop the meter if the job hangs, ends or the node is forgotten !!!"
else
  dm_args=(arm --run-dir "$RUN_DIR")
  [ -n "$PROFILE" ] && dm_args+=(--profile "$PROFILE")
  [ -n "$STALL" ] && dm_args+=(--stall-minutes "$STALL")
  [ -n "$GRACE" ] && dm_args+=(--grace-minutes "$GRACE")
  [ -n "$MAXH" ] && dm_args+=(--max-hours "$MAXH")
  [ -n "$POLL" ] && dm_args+=(--poll-seconds "$POLL")
  [ "$DM_DRY" = 1 ] && dm_args+=(--dry-run)
  dm_args+=("${DM_EXTRA[@]}")
  DM_PID=$("$PY" "$DEADMAN" "${dm_args[@]}")
  dm_rc=$?
  if [ "$dm_rc" -ne 0 ] || ! [[ "$DM_PID" =~ ^[0-9]+$ ]]; then
    DM_PID=""
    [ "$dm_rc" -eq 2 ] && fail_launch "deadman.py rejected its arguments (see above); nothing was started" 2
    fail_launch "the dead-man could not be armed (deadman.py exit $dm_rc); nothing was started" 3
  fi
fi

# ---------------------------------------------------------------------------------- detach
SAFE_ID=${RUN_ID//[.:]/_}
TMUX_NAME="rgt-$SAFE_ID"
if [ "$DETACH" = tmux ]; then
  sup_cmd="exec bash $(printf '%q' "$SELF") --supervise $(printf '%q' "$RUN_DIR")"
  if ! env -u TMUX tmux -L "$TMUX_NAME" new-session -d -s "$TMUX_NAME" -c "$PWD" "$sup_cmd" 2>"$RUN_DIR/.tmux.err"; then
    warn "tmux could not start a session ($(head -c 200 "$RUN_DIR/.tmux.err")); falling back to setsid+nohup"
    DETACH=setsid
    pyh set "$RUN_DIR/status.json" 'detach="setsid"'
  fi
  rm -f "$RUN_DIR/.tmux.err"
fi
if [ "$DETACH" = setsid ]; then
  # the subshell exits at once, so the supervisor is re-parented and never our zombie
  if command -v setsid >/dev/null 2>&1; then
    (setsid nohup bash "$SELF" --supervise "$RUN_DIR" </dev/null >/dev/null 2>&1 &)
  else
    warn "setsid is missing: using nohup alone (the job may share this terminal's process group)"
    (nohup bash "$SELF" --supervise "$RUN_DIR" </dev/null >/dev/null 2>&1 &)
  fi
fi

# hand the lock over: the supervisor writes its pid into run.lock/pid once it has recorded itself
SUP_PID=""
for _i in $(seq 1 300); do
  owner=$(cat "$LOCK/pid" 2>/dev/null || true)
  if [ -n "$owner" ] && [ "$owner" != "$$" ]; then SUP_PID=$owner; break; fi
  sleep 0.1
done
[ -n "$SUP_PID" ] || fail_launch "the supervisor did not start within 30 s ($DETACH); see $RUN_DIR/supervisor.log" 1
LOCK_MINE=0   # the supervisor owns the lock now

# ---------------------------------------------------------------------------------- report
echo "run id:   $RUN_ID"
echo "run dir:  $RUN_DIR"
if [ "$DETACH" = tmux ]; then
  echo "detach:   tmux session $TMUX_NAME on its own server (socket $TMUX_NAME), supervisor pid $SUP_PID"
else
  echo "detach:   setsid+nohup, supervisor pid $SUP_PID"
fi
if [ -n "$DM_PID" ]; then
  echo "dead-man: armed, pid $DM_PID$([ "$DM_DRY" = 1 ] && echo ' (DRY RUN: records, stops nothing)')"
else
  echo "dead-man: DISABLED (--no-deadman) - nothing stops the meter for you"
fi
echo "watch:    python3 $SCRIPT_DIR/run_status.py $RUN_DIR"
echo "          tail -f $RUN_DIR/job.log"
[ "$DETACH" = tmux ] && echo "          tmux -L $TMUX_NAME attach -t $TMUX_NAME"
[ -n "$DM_PID" ] && echo "ack:      python3 $DEADMAN ack --run-dir $RUN_DIR --postpone-minutes 60   (or --disarm)"
[ "${#OUTPUTS[@]}" -gt 0 ] && echo "results:  $RESULTS_DIR (sha256-verified; see sync.json)"
[ "${#OUTPUTS[@]}" -gt 0 ] || warn "no --output given: nothing will be copied to durable storage when the job ends"

[ "$WAIT" = 1 ] || exit 0

# ---------------------------------------------------------------------------------- --wait
wait_poll=${POLL:-2}
while pid_alive "$SUP_PID"; do sleep "$wait_poll"; done
{ IFS= read -r state; IFS= read -r code; } < <(pyh get "$RUN_DIR/status.json" state exit_code)
echo "finished: state ${state:-?}, job exit code ${code:-?}"
case "$state" in
  succeeded) exit 0 ;;
  sync_failed) exit 1 ;;
  failed) if [[ "$code" =~ ^[0-9]+$ ]] && [ "$code" -ne 0 ]; then exit "$code"; fi; exit 1 ;;
  *) warn "the supervisor (pid $SUP_PID) is gone but the run is still '${state:-?}': see $RUN_DIR/job.log"; exit 1 ;;
esac
