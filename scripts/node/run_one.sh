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
#              [--progress-regex RE] [--total-steps N] [--auto-resume [--max-attempts N]]
#              [--notify-events E1,E2,...] -- CMD [ARGS...]
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
#   --notify-events LIST  the events this run sends (comma-separated: launched, first_progress, finished,
#                         failed, ...; default: every event its notification targets take; run.json
#                         notify_events; targets: rgt.py notify setup)
#
# Two Python starts (launcher.py), so a job that exits at once is reported within a second or two:
# PREPARE loads the profile's defaults from profiles/index.json (variables already set in the environment
# win; flags win over both), refuses below the disk floor (free bytes AND inodes on DATA_DIR, DURABLE_DIR and
# the run dir's filesystem) or when DURABLE_DIR/results is not writable, with --require-gpu refuses when
# `nvidia-smi -L` lists no GPU or does not answer within --gpu-timeout seconds (15) (a restart that came back
# with zero GPUs, or a hung driver, bills for nothing), then creates the run dir and takes its lock. The shell
# then sources PROXY_HOOK when it is an existing file (sourced, never eval'd). START writes run.json and
# status.json, ARMS THE DEAD-MAN (deadman.py's own code, forked from that process), starts a detached
# supervisor (supervise.py, in tmux when installed, else in its own session) that survives the SSH session,
# runs CMD in its own process group with output appended to job.log, forwards SIGTERM/SIGINT/SIGHUP to that
# group as the run's stop signal (spot grace), waits until the WHOLE group is gone (a backgrounded writer
# finishes first), then syncs (sync.py); START prints the report and, with --wait, waits for the end.
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
# writable, no GPU, a run id whose run dir already holds a run - live, over or its budget spent: a launch
# never reuses one; resume it (rgt.py resume, boot_resume.py --run) or pick a new --run-id -, a dead-man
# still armed on this run dir, the dead-man could not be armed).
set -uo pipefail

PROG=run_one.sh
LAUNCH_WORDS=("$@")   # this launch, word for word: what boot_resume.py replays after a restart
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
LAUNCHER="$SCRIPT_DIR/launcher.py"
PY0=${RGT_PYTHON:-python3}   # prepare runs on this; it answers the real interpreter for the rest

# launcher.py does the JSON and filesystem work (-E -S: no PYTHON* variables, no site-packages).
die() { printf '%s: error: %s\n' "$PROG" "$1" >&2; exit "${2:-2}"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&2; }
is_num() { [[ "$1" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]]; }

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
    --notify-events) need_val "$@"; ADAPT+=("$1=$2"); shift 2 ;;
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

GLOB_ARGS=()   # --output / --allow-empty as --opt=VALUE, so a value can never read as an option
for g in "${OUTPUTS[@]}"; do GLOB_ARGS+=("--output=$g"); done
for g in "${ALLOW_EMPTY[@]}"; do GLOB_ARGS+=("--allow-empty=$g"); done

# ---------------------------------------------------------------------------------- prepare
# One Python start for everything that can refuse the launch: the globs, the adapters, the profile's defaults (variables
# already set in the environment win, flags win over both), where the run goes, the disk floor (free bytes AND
# inodes on DATA_DIR, DURABLE_DIR and the run dir's filesystem; DURABLE_DIR/results writable), the GPU gate;
# then the run dir and its lock (held for this shell's pid). It answers KEY NUL VALUE NUL pairs, among them the
# real interpreter behind a pyenv/conda shim (PY), so the next start skips the shim.
command -v "$PY0" >/dev/null 2>&1 ||
  die "python3 is not installed (or RGT_PYTHON=$PY0 is not a program); run_one.sh needs Python 3.8+" 1
prep=(prepare --launcher-pid "$$" "--profile=$PROFILE" "--run-id=$RUN_ID" "--run-dir=$RUN_DIR"
      "--durable-dir=$DURABLE_ARG" "--tag=${CMD[0]}")
[ -n "$FLOOR_ARG" ] && prep+=("--disk-floor-gb=$FLOOR_ARG")
[ "$NEED_GPU" = 1 ] && prep+=(--require-gpu "--gpu-timeout=$GPU_TIMEOUT")
settings=$("$PY0" -E -S "$LAUNCHER" "${prep[@]}" "${GLOB_ARGS[@]}" "${ADAPT[@]}" | tr '\0' '\n') || exit "$?"
PY="" FLOOR_GB="" FLOOR_INODES=""
while IFS= read -r key && IFS= read -r value; do
  case "$key" in
    PY) PY=$value; export RGT_PYTHON="$value" ;;
    PROFILE|RUN_ID|RUN_DIR|RESULTS_DIR|FLOOR_GB|FLOOR_INODES) printf -v "$key" '%s' "$value" ;;
    RGT_PROFILE_INDEX) [ -z "$PROFILE" ] || export RGT_PROFILE_INDEX="$value" ;;  # the dead-man reads the same index
    DATA_DIR|DURABLE_DIR|HF_HOME|PROXY_HOOK) [ -z "$value" ] || printf -v "$key" '%s' "$value" ;;
  esac
done <<<"$settings"
[ -n "$PY" ] && [ -n "$RUN_DIR" ] || die "launcher.py prepare answered nothing usable" 1
LOCK="$RUN_DIR/run.lock"
# shellcheck disable=SC2329  # invoked by the EXIT trap
release_lock() {  # the supervisor writes its own pid into the lock when it takes the run over
  if [ "$(cat "$LOCK/pid" 2>/dev/null)" = "$$" ]; then rm -rf "$LOCK"; fi
}
trap release_lock EXIT
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

# ---------------------------------------------------------------------------------- start
# One Python start for the rest: run.json and status.json, the dead-man (armed in that process: a fork, no new
# interpreter), the supervisor (tmux or setsid; it records itself in status.json under a lock, so a job that
# exits at once is reported with its own code), then the report (with --wait, the end). Whatever fails before
# a supervisor claims the run leaves a failed status and no armed dead-man.
start=(start --run-dir "$RUN_DIR" --run-id "$RUN_ID" --cwd "$PWD" --results-dir "$RESULTS_DIR" --launcher-pid "$$"
       "--profile=$PROFILE" "--durable-dir=${DURABLE_DIR:-}" --poll-seconds "${POLL:-1}")
if [ "$NO_DM" = 1 ]; then
  start+=(--no-deadman)
else
  dm=()
  [ -n "$PROFILE" ] && dm+=(--profile "$PROFILE")
  [ -n "$STALL" ] && dm+=(--stall-minutes "$STALL")
  [ -n "$GRACE" ] && dm+=(--grace-minutes "$GRACE")
  [ -n "$MAXH" ] && dm+=(--max-hours "$MAXH")
  [ -n "$POLL" ] && dm+=(--poll-seconds "$POLL")
  [ "$DM_DRY" = 1 ] && dm+=(--dry-run)
  # the dead-man tells disk_low below the floor this launch was gated on
  dm+=("--disk-floor-gb=$FLOOR_GB" "--disk-floor-inodes=$FLOOR_INODES")
  for word in "${dm[@]}" "${DM_EXTRA[@]}"; do start+=("--deadman-arg=$word"); done
fi
[ "$WAIT" = 1 ] && start+=(--wait)
[ "$JSON" = 1 ] && start+=(--json)
# The job's words and this launch's reach start on its stdin (NUL-separated: a count, the launch, the job), not
# its argv: the dead-man is a fork of start, and a `pgrep -f train.py` / `pkill -f train.py` must never match it.
{ printf '%s\0' "${#LAUNCH_WORDS[@]}" "${LAUNCH_WORDS[@]}" "${CMD[@]}"; } |
  "$PY" -E -S "$LAUNCHER" "${start[@]}" "${GLOB_ARGS[@]}" "${ADAPT[@]}" --words-on-stdin
exit "$?"
