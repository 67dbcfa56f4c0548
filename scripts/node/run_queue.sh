#!/usr/bin/env bash
# run_queue.sh -- run the commands of a queue file one after another, resumably, with a disk gate
# before each one and a status record per cell.
#
# Usage:
#   run_queue.sh [options] QUEUE_FILE
#     --queue-dir DIR       state directory (default: QUEUE_FILE without extension + ".queue")
#     --disk-floor-gb N     refuse a cell when free space is below N GiB (default $DISK_FLOOR_GB or 1);
#                           measured on $DATA_DIR when set (its nearest existing parent if it is
#                           not created yet), else the current directory
#     --inode-floor N       also refuse below N free inodes (default 1000; skipped on filesystems
#                           that report no inode count)
#     --stop-on-fail        stop at the first failed cell (later cells are marked not_run)
#     --retry-failed        re-run cells that failed in an earlier pass (default: keep them failed)
#     --dry-run             list the cells, their ids and recorded statuses; run nothing
#     -h, --help
#
# Queue file: one shell command per line, run with `bash -c` in the current directory, stdin from
# /dev/null. Lines starting with # and blank lines are skipped; CRLF line ends are tolerated.
# The queue file is read once at start, so editing it later changes nothing in a running pass.
# Each cell's id is L<line number>-<first 8 hex of sha256(command)>, e.g. L004-9c1e03ab: editing a
# line makes it a new cell; inserting lines above finished cells renumbers them (comment lines
# out instead of deleting them, and append new cells at the end).
#
# State, under QUEUE_DIR:
#   cells/<id>/status      pending | running | succeeded | failed | interrupted | refused_disk | not_run
#   cells/<id>/exit_code   the command's exit status
#   cells/<id>/log         its stdout+stderr, appended across attempts
#   cells/<id>/{cmd,pid,started,ended,attempts,reason}
#   queue_status.json      summary, written atomically by python3 ($RGT_PYTHON overrides; skipped with a
#                          warning when there is none)
#   queue.lock/            one pass per queue dir; a lock left by a dead pass is taken over
#
# Resuming: run the same command again. Succeeded cells are skipped; a cell recorded as running
# (the pass died: kill -9, reboot) or interrupted is run again from the start, so give long cells
# their own checkpoint/resume (examples/train_resumable.py). If that cell's old process is still
# alive the pass refuses to start (exit 3) instead of running it twice.
#
# Environment given to each cell: RGT_CELL_ID, RGT_CELL_DIR, RGT_QUEUE_DIR, and RGT_HEARTBEAT
# (kept when already set, e.g. by run_one.sh, so the run's dead-man sees the cell's heartbeat;
# else <cell dir>/heartbeat.json).
#
# Detach the queue itself, not its cells: e.g.
#   scripts/node/run_one.sh --run-id sweep-1 -- bash scripts/node/run_queue.sh sweep.txt
#   tmux new -d -s q1 'bash scripts/node/run_queue.sh sweep.txt'
# SIGTERM/SIGINT/SIGHUP: forwarded to the running cell (SIGTERM), which is then recorded as
# interrupted; the pass writes its summary and exits 128+signal.
#
# Exit codes: 0 every cell succeeded; 1 at least one cell failed, was refused or did not run;
#   2 usage error (bad option, missing or empty queue file); 3 refused to start (another live pass
#   holds the lock, or an interrupted cell's process is still running); 128+N stopped by signal N.

set -uo pipefail

PROG=run_queue
QUEUE_FILE=""
QUEUE_DIR=""
QUEUE_DIR_SET=0
FLOOR_GB="${DISK_FLOOR_GB:-1}"
INODE_FLOOR=1000
STOP_ON_FAIL=0
RETRY_FAILED=0
DRY_RUN=0

usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
}

die() {
    printf '%s: %s\n' "$PROG" "$*" >&2
    exit 2
}

is_number() {
    [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]
}

while [ "$#" -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --queue-dir) [ "$#" -ge 2 ] || die "--queue-dir needs a value"; QUEUE_DIR="$2"; QUEUE_DIR_SET=1; shift 2 ;;
        --queue-dir=*) QUEUE_DIR="${1#*=}"; QUEUE_DIR_SET=1; shift ;;
        --disk-floor-gb) [ "$#" -ge 2 ] || die "--disk-floor-gb needs a value"; FLOOR_GB="$2"; shift 2 ;;
        --disk-floor-gb=*) FLOOR_GB="${1#*=}"; shift ;;
        --inode-floor) [ "$#" -ge 2 ] || die "--inode-floor needs a value"; INODE_FLOOR="$2"; shift 2 ;;
        --inode-floor=*) INODE_FLOOR="${1#*=}"; shift ;;
        --stop-on-fail) STOP_ON_FAIL=1; shift ;;
        --retry-failed) RETRY_FAILED=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$QUEUE_FILE" ] || die "only one queue file, got '$QUEUE_FILE' and '$1'"; QUEUE_FILE="$1"; shift ;;
    esac
done
if [ "$#" -gt 0 ]; then
    [ -z "$QUEUE_FILE" ] && [ "$#" -eq 1 ] || die "only one queue file"
    QUEUE_FILE="$1"
fi
[ -n "$QUEUE_FILE" ] || die "usage: run_queue.sh [options] QUEUE_FILE (see --help)"
[ -f "$QUEUE_FILE" ] && [ -r "$QUEUE_FILE" ] || die "queue file not found or unreadable: $QUEUE_FILE"
is_number "$FLOOR_GB" || die "--disk-floor-gb must be a number of GB, got '$FLOOR_GB'"
if [ "$QUEUE_DIR_SET" -eq 1 ] && [ -z "$QUEUE_DIR" ]; then die "--queue-dir is empty"; fi
[[ "$INODE_FLOOR" =~ ^[0-9]+$ ]] || die "--inode-floor must be a whole number, got '$INODE_FLOOR'"
if [ -z "$QUEUE_DIR" ]; then
    base="${QUEUE_FILE%.*}"
    [ "$base" != "" ] || base="$QUEUE_FILE"
    QUEUE_DIR="$base.queue"
fi
# The gate measures DATA_DIR (or the current directory); when DATA_DIR does not exist yet, the
# nearest existing parent, which is the filesystem it will be created on.
GATE_DIR="${DATA_DIR:-$PWD}"
while [ ! -d "$GATE_DIR" ] && [ "$GATE_DIR" != / ] && [ "$GATE_DIR" != . ]; do
    GATE_DIR=$(dirname "$GATE_DIR")
done

# ---------------------------------------------------------------- helpers

now() { date +%s; }

hash8() {
    local h
    if command -v sha256sum >/dev/null 2>&1; then
        h=$(printf '%s' "$1" | sha256sum)
    elif command -v shasum >/dev/null 2>&1; then
        h=$(printf '%s' "$1" | shasum -a 256)
    else
        h=$(printf '%s' "$1" | "${RGT_PYTHON:-python3}" -c \
            'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
    fi
    printf '%s' "${h:0:8}"
}

# put FILE CONTENT: replace FILE atomically (temp file in the same directory, then mv).
put() {
    local tmp="$1.tmp.$$"
    printf '%s\n' "$2" >"$tmp" && mv -f "$tmp" "$1"
}

get() {
    local v=""
    [ -f "$1" ] && IFS= read -r v <"$1"
    printf '%s' "$v"
}

# A zombie (exited, not yet reaped) counts as dead.
pid_alive() {
    local rest
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 1
    if [ -r "/proc/$1/stat" ]; then
        rest=$(cut -d')' -f2- <"/proc/$1/stat" 2>/dev/null)
        case "$rest" in " Z"*) return 1 ;; esac
    fi
    return 0
}

# Is PID still the process of cell ID? Guards against a recycled pid when /proc shows the environment.
cell_alive() {
    pid_alive "$1" || return 1
    if [ -r "/proc/$1/environ" ]; then
        tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qx "RGT_CELL_ID=$2" || return 1
    fi
    return 0
}

# ---------------------------------------------------------------- read the queue once

IDS=()
CMDS=()
LINES=()
lineno=0
while IFS= read -r raw || [ -n "$raw" ]; do
    lineno=$((lineno + 1))
    line="${raw%$'\r'}"
    line="${line#"${line%%[![:space:]]*}"}"
    line="${line%"${line##*[![:space:]]}"}"
    [ -z "$line" ] && continue
    case "$line" in \#*) continue ;; esac
    IDS+=("$(printf 'L%03d-%s' "$lineno" "$(hash8 "$line")")")
    CMDS+=("$line")
    LINES+=("$lineno")
done <"$QUEUE_FILE"
[ "${#IDS[@]}" -gt 0 ] || die "queue file has no commands: $QUEUE_FILE"

cell_status() {
    local s
    s=$(get "$QUEUE_DIR/cells/$1/status")
    printf '%s' "${s:-pending}"
}

print_table() {
    local i id st rc secs started ended cmd
    printf '%-14s %-12s %-5s %-7s %s\n' CELL STATUS EXIT SECONDS COMMAND
    for i in "${!IDS[@]}"; do
        id="${IDS[$i]}"
        st=$(cell_status "$id")
        rc=$(get "$QUEUE_DIR/cells/$id/exit_code")
        started=$(get "$QUEUE_DIR/cells/$id/started")
        ended=$(get "$QUEUE_DIR/cells/$id/ended")
        secs="-"
        if [ -n "$started" ] && [ -n "$ended" ] && [ "$ended" -ge "$started" ] 2>/dev/null; then
            secs=$((ended - started))
        fi
        cmd="${CMDS[$i]}"
        [ "${#cmd}" -le 70 ] || cmd="${cmd:0:67}..."
        printf '%-14s %-12s %-5s %-7s %s\n' "$id" "$st" "${rc:--}" "$secs" "$cmd"
    done
}

if [ "$DRY_RUN" -eq 1 ]; then
    printf 'queue %s: %d cell(s); state in %s; disk floor %s GB on %s\n' \
        "$QUEUE_FILE" "${#IDS[@]}" "$QUEUE_DIR" "$FLOOR_GB" "$GATE_DIR"
    print_table
    exit 0
fi

# ---------------------------------------------------------------- lock and state

mkdir_err=$(mkdir -p "$QUEUE_DIR/cells" 2>&1) || die "cannot create $QUEUE_DIR: ${mkdir_err##*: }"
QUEUE_DIR=$(cd "$QUEUE_DIR" && pwd)
LOCK="$QUEUE_DIR/queue.lock"
if ! mkdir "$LOCK" 2>/dev/null; then
    holder=$(get "$LOCK/pid")
    if pid_alive "$holder"; then
        printf '%s: REFUSED another pass holds %s (pid %s)\n' "$PROG" "$LOCK" "$holder" >&2
        exit 3
    fi
    printf '%s: taking over a lock left by dead pid %s\n' "$PROG" "${holder:-?}" >&2
    rm -rf "$LOCK"
    mkdir "$LOCK" || die "cannot take the lock $LOCK"
fi
put "$LOCK/pid" "$$"
# shellcheck disable=SC2329  # called from the EXIT trap
cleanup() {
    [ "$(get "$LOCK/pid")" = "$$" ] && rm -rf "$LOCK"
}
trap cleanup EXIT

# A cell recorded as running whose process still lives must not be started a second time.
for id in "${IDS[@]}"; do
    if [ "$(cell_status "$id")" = running ]; then
        old=$(get "$QUEUE_DIR/cells/$id/pid")
        if cell_alive "$old" "$id"; then
            printf '%s: REFUSED cell %s from an earlier pass is still running as pid %s; wait for it or ' \
                "$PROG" "$id" "$old" >&2
            printf 'stop it, then run the queue again\n' >&2
            exit 3
        fi
    fi
done

# Resolve the interpreter once: a version-manager shim (pyenv, conda) costs a noticeable fraction
# of a second on every call.
PYTHON="${RGT_PYTHON:-}"
if [ -z "$PYTHON" ]; then
    PYTHON=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || PYTHON=""
    [ -n "$PYTHON" ] || PYTHON=python3
fi
HAVE_PY=1
command -v "$PYTHON" >/dev/null 2>&1 || HAVE_PY=0
[ "$HAVE_PY" -eq 1 ] || printf '%s: %s not found: queue_status.json will not be written\n' "$PROG" "$PYTHON" >&2

write_summary() {
    [ "$HAVE_PY" -eq 1 ] || return 0
    local args=() i
    for i in "${!IDS[@]}"; do
        args+=("${IDS[$i]}" "${LINES[$i]}")
    done
    if ! "$PYTHON" - "$QUEUE_DIR" "$QUEUE_FILE" "$1" "$$" "${args[@]}" <<'PY'
import json, os, sys, tempfile, time
qdir, qfile, state, pid = sys.argv[1:5]
rest = sys.argv[5:]
def rd(cell, name):
    try:
        with open(os.path.join(qdir, "cells", cell, name), encoding="utf-8", errors="replace") as fh:
            return fh.read().rstrip("\n")
    except OSError:
        return None
def as_int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
def iso(ts):
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
cells, counts = [], {}
for i in range(0, len(rest), 2):
    cid, line = rest[i], int(rest[i + 1])
    status = rd(cid, "status") or "pending"
    started, ended = as_int(rd(cid, "started")), as_int(rd(cid, "ended"))
    counts[status] = counts.get(status, 0) + 1
    cells.append({"id": cid, "line": line, "cmd": rd(cid, "cmd"), "status": status,
                  "exit_code": as_int(rd(cid, "exit_code")), "started_at": iso(started),
                  "ended_at": iso(ended) if status != "running" else None,
                  "seconds": (ended - started) if (started is not None and ended is not None
                                                   and status != "running") else None,
                  "attempts": as_int(rd(cid, "attempts")) or 0, "reason": rd(cid, "reason")})
doc = {"schema": "rgt-queue-status/1", "queue_file": os.path.abspath(qfile), "queue_dir": qdir,
       "state": state, "pid": int(pid), "updated_at": iso(time.time()), "counts": counts,
       "all_succeeded": all(c["status"] == "succeeded" for c in cells), "cells": cells}
dest = os.path.join(qdir, "queue_status.json")
fd, tmp = tempfile.mkstemp(prefix=".queue_status.", suffix=".tmp", dir=qdir)
with os.fdopen(fd, "w") as fh:
    json.dump(doc, fh, indent=1, sort_keys=True)
    fh.write("\n")
    fh.flush()
    os.fsync(fh.fileno())
os.replace(tmp, dest)
PY
    then
        echo "$PROG: could not write queue_status.json" >&2
    fi
}

# ---------------------------------------------------------------- signals

STOPPING=""
CHILD=""
# shellcheck disable=SC2329  # called from the signal traps
on_signal() {
    [ -n "$STOPPING" ] || STOPPING="$1"
    if [ -n "$CHILD" ] && pid_alive "$CHILD"; then
        kill -TERM "$CHILD" 2>/dev/null
    fi
}
trap 'on_signal 15' TERM
trap 'on_signal 2' INT
trap 'on_signal 1' HUP

# ---------------------------------------------------------------- disk gate

# Prints a reason and returns 1 when the gate refuses.
disk_gate() {
    local avail_kb ifree
    avail_kb=$(df -Pk "$GATE_DIR" 2>/dev/null | awk 'NR==2 {print $4}')
    if ! [[ "$avail_kb" =~ ^[0-9]+$ ]]; then
        printf 'cannot read free space of %s' "$GATE_DIR"
        return 1
    fi
    if awk -v a="$avail_kb" -v f="$FLOOR_GB" 'BEGIN {exit !(a < f * 1048576)}'; then
        printf 'free space on %s is %s GB, below the floor of %s GB' "$GATE_DIR" \
            "$(awk -v a="$avail_kb" 'BEGIN {printf "%.2f", a / 1048576}')" "$FLOOR_GB"
        return 1
    fi
    ifree=$(df -Pi "$GATE_DIR" 2>/dev/null | awk 'NR==2 {print ($2 > 0) ? $4 : "n/a"}')
    if [[ "$ifree" =~ ^[0-9]+$ ]] && [ "$ifree" -lt "$INODE_FLOOR" ]; then
        printf 'free inodes on %s: %s, below the floor of %s' "$GATE_DIR" "$ifree" "$INODE_FLOOR"
        return 1
    fi
    return 0
}

# ---------------------------------------------------------------- the pass

printf '=== queue %s: %d cell(s), state in %s, pid %s ===\n' "$QUEUE_FILE" "${#IDS[@]}" "$QUEUE_DIR" "$$"
write_summary running
failed_any=0
for i in "${!IDS[@]}"; do
    id="${IDS[$i]}"
    cmd="${CMDS[$i]}"
    cdir="$QUEUE_DIR/cells/$id"
    mkdir -p "$cdir"
    [ -f "$cdir/cmd" ] || put "$cdir/cmd" "$cmd"
    prev=$(cell_status "$id")
    tag="[$((i + 1))/${#IDS[@]}] $id"
    if [ -n "$STOPPING" ]; then
        break
    fi
    case "$prev" in
        succeeded)
            printf '%s skip: succeeded in an earlier pass\n' "$tag"
            continue ;;
        failed)
            if [ "$RETRY_FAILED" -eq 0 ]; then
                printf '%s skip: failed in an earlier pass (exit %s); --retry-failed runs it again\n' \
                    "$tag" "$(get "$cdir/exit_code")"
                failed_any=1
                continue
            fi ;;
        running)
            printf '%s previous attempt was cut off (pass died); running it again\n' "$tag"
            printf '=== %s previous attempt was cut off; re-running\n' "$(date -u +%FT%TZ)" >>"$cdir/log" ;;
    esac
    if [ "$failed_any" -eq 1 ] && [ "$STOP_ON_FAIL" -eq 1 ]; then
        put "$cdir/status" not_run
        put "$cdir/reason" "an earlier cell failed and --stop-on-fail is set"
        continue
    fi
    if ! reason=$(disk_gate); then
        printf '%s REFUSED: %s\n' "$tag" "$reason"
        put "$cdir/reason" "$reason"
        put "$cdir/status" refused_disk
        rm -f "$cdir/exit_code" "$cdir/started" "$cdir/ended"
        failed_any=1
        write_summary running
        continue
    fi

    attempts=$(get "$cdir/attempts")
    [[ "$attempts" =~ ^[0-9]{1,9}$ ]] || attempts=0   # a damaged count must not stop the pass
    put "$cdir/attempts" "$(( 10#$attempts + 1 ))"
    rm -f "$cdir/exit_code" "$cdir/ended" "$cdir/reason"
    put "$cdir/started" "$(now)"
    printf '=== %s start cell %s (line %s): %s\n' "$(date -u +%FT%TZ)" "$id" "${LINES[$i]}" "$cmd" >>"$cdir/log"
    printf '%s START %s\n' "$tag" "$cmd"
    RGT_CELL_ID="$id" RGT_CELL_DIR="$cdir" RGT_QUEUE_DIR="$QUEUE_DIR" \
        RGT_HEARTBEAT="${RGT_HEARTBEAT:-$cdir/heartbeat.json}" \
        bash -c "$cmd" </dev/null >>"$cdir/log" 2>&1 &
    CHILD=$!
    put "$cdir/pid" "$CHILD"
    put "$cdir/status" running
    write_summary running

    wait "$CHILD"
    rc=$?
    while pid_alive "$CHILD"; do      # a trapped signal cut the wait short; the cell is still shutting down
        wait "$CHILD"
        rc=$?
    done
    wait "$CHILD" 2>/dev/null         # bash keeps the real status: this returns it even after a cut-off wait
    again=$?
    [ "$again" -eq 127 ] || rc=$again
    CHILD=""

    put "$cdir/ended" "$(now)"
    put "$cdir/exit_code" "$rc"
    printf '=== %s end cell %s: exit %s\n' "$(date -u +%FT%TZ)" "$id" "$rc" >>"$cdir/log"
    if [ "$rc" -eq 0 ]; then
        put "$cdir/status" succeeded
        printf '%s OK (exit 0)\n' "$tag"
    elif [ -n "$STOPPING" ]; then
        put "$cdir/status" interrupted
        put "$cdir/reason" "queue received signal $STOPPING"
        printf '%s INTERRUPTED (exit %s); the next pass runs it again\n' "$tag" "$rc"
    else
        put "$cdir/status" failed
        failed_any=1
        printf '%s FAILED (exit %s); log: %s\n' "$tag" "$rc" "$cdir/log"
    fi
    write_summary running
done

echo "=== summary ==="
print_table
if [ -n "$STOPPING" ]; then
    write_summary interrupted
    printf '%s: stopped by signal %s; run the same command again to continue\n' "$PROG" "$STOPPING" >&2
    exit $((128 + STOPPING))
fi
write_summary finished
all_ok=1
for id in "${IDS[@]}"; do
    [ "$(cell_status "$id")" = succeeded ] || all_ok=0
done
if [ "$all_ok" -eq 1 ]; then
    printf 'QUEUE OK: all %d cell(s) succeeded\n' "${#IDS[@]}"
    exit 0
fi
printf 'QUEUE FAILED: not every cell succeeded (see the table; logs in %s/cells/<id>/log)\n' "$QUEUE_DIR"
exit 1
