#!/usr/bin/env bash
# run_one.sh — launch ONE training command on this node so that it looks after itself.
#
# Usage:
#   run_one.sh [--profile NAME] [--run-id ID] [--run-dir DIR] [--durable-dir DIR] [--output GLOB]...
#              [--allow-empty GLOB]... [--disk-floor-gb N] [--stall-minutes M] [--grace-minutes M]
#              [--max-hours H] [--deadman-dry-run] [--no-deadman] [--deadman-arg ARG]... [--wait]
#              [--poll-seconds S] [--require-gpu] [--gpu-timeout S] [--json]
#              [--stop-signal TERM|INT|HUP|USR1|USR2|QUIT] [--resume-glob GLOB --resume-arg TEMPLATE]
#              [--resume-from PATH]
#              [--progress-regex RE] [--total-steps N] [--auto-resume [--max-attempts N]] -- CMD [ARGS...]
#
# Adapters for training code we did not write (recorded in run.json, applied by the supervisor):
#   --stop-signal SIG     what the job's process group gets on preemption or stop (default TERM; a
#                         trainer whose clean exit is its Ctrl-C path wants INT)
#   --resume-glob GLOB    its checkpoints (relative to the job's cwd); with --resume-arg TEMPLATE
#                         ("{}" = the path, e.g. the trainer's resume flag and {}) the resume arguments join CMD
#                         only when a match exists and passes the content check: the newest good one,
#                         skipping torn or empty ones (recorded in status.json "resume"); only checkpoints
#                         this run's own attempts wrote (files.json) count, never another run's in a shared dir
#   --resume-from PATH    resume attempt 1 (or any) from this checkpoint, whoever wrote it (with --resume-arg)
#   --progress-regex RE   read step and total from job.log lines (named groups step, total, or the
#                         first two groups), so status has a step and an ETA without a heartbeat
#   --total-steps N       the run's total steps, for a trainer that prints or writes none (run.json
#                         total_steps): run_status then shows step/N and an ETA
#   --auto-resume         after a restart of the box, boot_resume.py relaunches this exact launch as
#                         the next attempt (with the resume adapters above), at most --max-attempts
#                         times in all (default 3); without it, boot_resume.py only re-arms the dead-man
#
# In order: load the profile's defaults from profiles/index.json (variables already set in the
# environment win; flags win over both) -> source PROXY_HOOK when it is an existing file (sourced,
# never eval'd) -> refuse below the disk floor (free bytes AND inodes on DATA_DIR, DURABLE_DIR and
# the run dir's filesystem) or when DURABLE_DIR/results is not writable -> with --require-gpu,
# refuse when `nvidia-smi -L` lists no GPU or does not answer within --gpu-timeout seconds (15)
# (a restart that came back with zero GPUs, or a hung driver, bills for nothing) -> create the run
# dir and take its lock -> write run.json and status.json -> ARM THE DEAD-MAN (deadman.py next to
# this script) -> start a detached supervisor (supervise.py, in tmux when installed, else in its
# own session) that survives the SSH session, runs CMD in its own process group with output
# appended to job.log, forwards SIGTERM/SIGINT/SIGHUP to that group as SIGTERM (spot grace),
# waits until the WHOLE group is gone (a backgrounded writer finishes first), then syncs.
#
# The sync copies the --output globs (relative to the current directory; * and ** match dotfiles)
# and the run's logs (job.log, supervisor.log, deadman.log -> logs/) to the results dir,
# $DURABLE_DIR/results/$RUN_ID/ (RUN_DIR/results without a durable dir), and writes
# PULL_MANIFEST.json there (the one evidence format; every copy re-read and hashed). A zero-byte
# file (unless an --allow-empty GLOB covers it), a damaged checkpoint or a file that changes
# while it is copied never replaces the previous durable copy. The outcome is status.json "sync".
# A sync that fails, an --output glob that matches nothing or matches only a dangling symlink or
# a FIFO, or a full durable disk makes the run sync_failed and the supervisor exit non-zero, even
# when training exited 0.
#
# The launcher learns that the supervisor started from status.json (supervisor_identity, written
# under a lock), so a job that exits at once is reported with its own exit code and state.
#
# tmux: each run gets its own tmux server (socket rgt-<run_id>) so the job inherits THIS shell's
# environment (proxy hook, HF_* variables); an already-running tmux server would hand the new
# session its own, older environment. Attach with: tmux -L rgt-<run_id> attach -t rgt-<run_id>
#
# --json prints the launch report (run id, run dir, detach, supervisor pid, dead-man pid and
# state, watch commands, results dir) as one JSON object on stdout; with --wait, after the run,
# with its final state, exit code and sync outcome under "final".
#
# The disk floor: --disk-floor-gb N, else DISK_FLOOR_GB (environment, then the profile), else the
# toolkit's one floor (`python3 rgt_core.py --default disk_floor_gb` prints it).
# Extra knobs (environment): DISK_FLOOR_INODES (default: the toolkit's inode floor,
# `python3 rgt_core.py --default min_free_inodes`), RGT_PROFILE (profile when --profile is absent), RGT_PROFILE_INDEX (path of index.json). --deadman-arg passes one
# argument through to `deadman.py arm` (e.g. --deadman-arg --allow-destructive).
#
# Exit codes: 0 launched (or, with --wait, the job and its sync succeeded); with --wait the job's
# own exit code when it failed, or 1 when the job exited 0 but the durable sync failed;
# 1 the supervisor could not be started; 2 usage; 3 a gate refused (disk floor, durable dir not
# writable, no GPU, run dir locked by a live run, a dead-man still armed on this run dir, the
# dead-man could not be armed).
set -uo pipefail

PROG=run_one.sh
LAUNCH_ARGS=()   # this launch, word for word: what boot_resume.py replays after a restart
for word in "$@"; do LAUNCH_ARGS+=("--launch-arg=w:$word"); done  # "w:": argparse eats a bare "--" value
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
DEADMAN="$SCRIPT_DIR/deadman.py"
LAUNCHER="$SCRIPT_DIR/launcher.py"
PY=${RGT_PYTHON:-}
resolve_python() {  # once: a pyenv/conda shim costs ~0.2 s a call; children inherit RGT_PYTHON
  [ -n "$PY" ] && return 0
  PY=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=""
  [ -n "$PY" ] || { printf '%s: error: python3 is not installed; run_one.sh needs Python 3.8+\n' "$PROG" >&2; exit 1; }
  export RGT_PYTHON="$PY"
}

# launcher.py does the JSON and filesystem work (-E -S: no PYTHON* variables, no site-packages).
sv() { "$PY" -E -S "$LAUNCHER" "$@"; }
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

# ---------------------------------------------------------------------------------- arguments
PROFILE="" RUN_ID="" RUN_DIR="" DURABLE_ARG="" FLOOR_ARG="" STALL="" GRACE="" MAXH="" POLL="" GPU_TIMEOUT=15
DM_DRY=0 NO_DM=0 WAIT=0 NEED_GPU=0 JSON=0
OUTPUTS=() ALLOW_EMPTY=() DM_EXTRA=() ADAPT=()
need_val() { [ "$#" -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --profile) need_val "$@"; PROFILE=$2; shift 2 ;;
    --run-id) need_val "$@"; RUN_ID=$2; shift 2 ;;
    --run-dir) need_val "$@"; RUN_DIR=$2; shift 2 ;;
    --durable-dir) need_val "$@"; DURABLE_ARG=$2; shift 2 ;;
    --output) need_val "$@"; OUTPUTS+=("$2"); shift 2 ;;
    --allow-empty) need_val "$@"; ALLOW_EMPTY+=("$2"); shift 2 ;;
    --disk-floor-gb) need_val "$@"; FLOOR_ARG=$2; shift 2 ;;
    --stall-minutes) need_val "$@"; STALL=$2; shift 2 ;;
    --grace-minutes) need_val "$@"; GRACE=$2; shift 2 ;;
    --max-hours) need_val "$@"; MAXH=$2; shift 2 ;;
    --poll-seconds) need_val "$@"; POLL=$2; shift 2 ;;
    --gpu-timeout) need_val "$@"; GPU_TIMEOUT=$2; shift 2 ;;
    --deadman-arg) need_val "$@"; DM_EXTRA+=("$2"); shift 2 ;;
    --stop-signal|--resume-glob|--resume-arg|--resume-from|--progress-regex|--max-attempts|--total-steps)
      need_val "$@"; ADAPT+=("$1=$2"); shift 2 ;;
    --auto-resume) ADAPT+=("--auto-resume"); shift ;;
    --deadman-dry-run) DM_DRY=1; shift ;;
    --no-deadman) NO_DM=1; shift ;;
    --wait) WAIT=1; shift ;;
    --require-gpu) NEED_GPU=1; shift ;;
    --json) JSON=1; shift ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (the command goes after --; see --help)" ;;
  esac
done
[ "$#" -gt 0 ] || die "no command given: run_one.sh [options] -- CMD [ARGS...]"
CMD=("$@")
for pair in "--disk-floor-gb=$FLOOR_ARG" "--stall-minutes=$STALL" "--grace-minutes=$GRACE" \
            "--max-hours=$MAXH" "--poll-seconds=$POLL" "--gpu-timeout=$GPU_TIMEOUT"; do
  value=${pair#*=}
  [ -z "$value" ] || is_num "$value" || die "${pair%%=*} wants a non-negative number, got '$value'"
done
if [ -n "$POLL" ] && ! [[ "$POLL" =~ [1-9] ]]; then die "--poll-seconds must be > 0, got '$POLL'"; fi
[[ "$GPU_TIMEOUT" =~ [1-9] ]] || die "--gpu-timeout must be > 0, got '$GPU_TIMEOUT'"
if [ "$NO_DM" = 1 ] && [ "$DM_DRY$STALL$GRACE$MAXH${#DM_EXTRA[@]}" != 00 ]; then
  die "--no-deadman conflicts with --deadman-dry-run, --deadman-arg, --stall-minutes, --grace-minutes and --max-hours"
fi
if [ -n "$RUN_ID" ] && ! [[ "$RUN_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]]; then
  die "--run-id may hold letters, digits, '.', '_' and '-' (max 100), got '$RUN_ID'"
fi

resolve_python

GLOB_ARGS=()   # --output / --allow-empty as --opt=VALUE, so a value can never read as an option
for g in "${OUTPUTS[@]}"; do GLOB_ARGS+=("--output=$g"); done
for g in "${ALLOW_EMPTY[@]}"; do GLOB_ARGS+=("--allow-empty=$g"); done
if [ "${#GLOB_ARGS[@]}" -gt 0 ]; then sv check-patterns "${GLOB_ARGS[@]}" || exit "$?"; fi

# ---------------------------------------------------------------------------------- profile
PROFILE=${PROFILE:-${RGT_PROFILE:-}}
if [ -n "$PROFILE" ]; then
  defaults=$(sv profile "$PROFILE" | tr '\0' '\n') || exit "$?"
  while IFS= read -r key && IFS= read -r value; do
    case "$key" in
      @index) export RGT_PROFILE_INDEX="$value"; continue ;;   # the dead-man reads the same index
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
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
if [ -n "${DURABLE_DIR:-}" ]; then
  case "$DURABLE_DIR" in /*) ;; *) DURABLE_DIR="$PWD/$DURABLE_DIR" ;; esac
  RESULTS_DIR="$DURABLE_DIR/results/$RUN_ID"
else
  RESULTS_DIR="$RUN_DIR/results"
  [ "${#OUTPUTS[@]}" -eq 0 ] ||
    warn "no DURABLE_DIR: the outputs are copied to $RESULTS_DIR, which is only as durable as the run dir"
fi
there=$RUN_DIR   # a file where the run dir must go is bad input, not a launch failure
while [ ! -e "$there" ] && [ ! -L "$there" ]; do there=$(dirname "$there"); done
[ -d "$there" ] || die "cannot use run dir $RUN_DIR: $there is not a directory"

# ---------------------------------------------------------------------------------- gates
# Unset floors are left to launcher.py disk, whose defaults are rgt_core's (the toolkit's one floor each).
gate=(disk)
FLOOR=${FLOOR_ARG:-${DISK_FLOOR_GB:-}}
if [ -n "$FLOOR" ]; then
  is_num "$FLOOR" || die "DISK_FLOOR_GB must be a number, got '$FLOOR'"
  gate+=(--floor-gb "$FLOOR")
fi
INODE_FLOOR=${DISK_FLOOR_INODES:-}
if [ -n "$INODE_FLOOR" ]; then
  [[ "$INODE_FLOOR" =~ ^[0-9]+$ ]] || die "DISK_FLOOR_INODES must be an integer, got '$INODE_FLOOR'"
  gate+=(--floor-inodes "$INODE_FLOOR")
fi
# the end-of-run sync writes here: a read-only or unwritable durable dir is refused now, not after the GPU hours
[ -n "${DURABLE_DIR:-}" ] && gate+=("--writable=$DURABLE_DIR/results")
gate_paths=("$RUN_DIR")
[ -n "${DATA_DIR:-}" ] && gate_paths+=("$DATA_DIR")
[ -n "${DURABLE_DIR:-}" ] && gate_paths+=("$DURABLE_DIR")
sv "${gate[@]}" -- "${gate_paths[@]}" || exit "$?"

# A GPU job on a box whose GPU is gone (a restart that found "0 GPUs", a hung driver) bills for nothing.
if [ "$NEED_GPU" = 1 ]; then sv gpu-gate --timeout "$GPU_TIMEOUT" || exit "$?"; fi

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
init=(init --run-dir "$RUN_DIR" --run-id "$RUN_ID" --cwd "$PWD" --results-dir "$RESULTS_DIR" --detach "$DETACH"
      --launcher-pid "$$" "--profile=$PROFILE" "--durable-dir=${DURABLE_DIR:-}")
[ "$NO_DM" = 1 ] || init+=(--check-deadman)
sv "${init[@]}" "${GLOB_ARGS[@]}" "${ADAPT[@]}" "${LAUNCH_ARGS[@]}" -- "${CMD[@]}" || exit "$?"

fail_launch() {  # MESSAGE EXIT: nothing ran, so leave a readable failed status and no dangling dead-man
  sv fail --run-dir "$RUN_DIR" "--message=$1" &&
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
# launcher.py start returns once status.json records the supervisor (it may have finished already).
# When it fails, `launcher.py fail` succeeds only if no supervisor ever claimed the run, in a locked
# step after which none can: only then is disarming the dead-man safe.
SAFE_ID=${RUN_ID//[.:]/_}
if ! sv start --run-dir "$RUN_DIR" --detach "$DETACH" "--tmux-name=rgt-$SAFE_ID"; then
  if sv fail --run-dir "$RUN_DIR" "--message=the supervisor did not start" && [ -n "$DM_PID" ]; then
    "$PY" "$DEADMAN" ack --run-dir "$RUN_DIR" --disarm >/dev/null 2>&1
  fi
  exit 1
fi
LOCK_MINE=0   # the supervisor owns the lock now

# ---------------------------------------------------------------------------------- report
[ "${#OUTPUTS[@]}" -gt 0 ] ||
  warn "no --output given: only the run's logs will be copied to $RESULTS_DIR when the job ends"
report=(report --run-dir "$RUN_DIR" --poll-seconds "${POLL:-1}")
[ -n "$DM_PID" ] && report+=(--deadman-pid "$DM_PID")
[ "$DM_DRY" = 1 ] && report+=(--dry-run)
[ "$WAIT" = 1 ] && report+=(--wait)
[ "$JSON" = 1 ] && report+=(--json)
sv "${report[@]}"
exit "$?"
