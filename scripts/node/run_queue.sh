#!/usr/bin/env bash
# run_queue.sh -- run the commands of a queue file one after another, resumably, with a disk gate
# before each one and a status record per cell.
#
# Usage:
#   run_queue.sh [options] QUEUE_FILE
#     --queue-dir DIR       state directory (default: QUEUE_FILE without extension + ".queue")
#     --disk-floor-gb N     refuse a cell when free space is below N GiB (default $DISK_FLOOR_GB, else
#                           the toolkit's one floor, as run_one.sh, read from rgt_core.py's
#                           disk_floor_gb; it was 1 before 2026-12); measured on $DATA_DIR when set
#                           (its nearest existing parent if it is not created yet), else the current
#                           directory
#     --inode-floor N       refuse a cell below N free inodes (default: the toolkit's one inode floor,
#                           rgt_core.py's min_free_inodes; skipped on filesystems
#                           that report no inode count)
#     --stop-grace S        when the queue is stopped, give the running cell's process group S seconds
#                           after SIGTERM before SIGKILL (default 20: below the dead-man's 30 s job grace,
#                           so under run_one.sh the queue's own SIGKILL of the cell comes first)
#     --stop-on-fail        stop at the first failed cell (later cells are marked not_run)
#     --retry-failed        re-run cells that failed in an earlier pass (default: keep them failed)
#     --dry-run             list the cells, their ids and recorded statuses; run nothing
#     --json                print the per-cell summary (the queue_status.json document) on stdout at the
#                           end; the progress lines then go to stderr
#     -h, --help
#
# Queue file: one shell command per line, run with `bash -c` in the current directory, stdin from
# /dev/null. Lines starting with # and blank lines are skipped; CRLF line ends are tolerated.
# The queue file is read once at start, so editing it later changes nothing in a running pass.
# Each cell's id is L<line number>-<first 8 hex of sha256(command)>, e.g. L004-9c1e03ab: editing a
# line makes it a new cell; inserting lines above finished cells renumbers them (comment lines
# out instead of deleting them, and append new cells at the end).
#
# Under run_one.sh (RGT_RUN_DIR set), each cell's output is also copied to the queue's stderr, i.e. the run's
# job.log, while the cell runs: a cell that only prints is progress, never a stall, for the run's dead-man.
#
# Each cell runs in its own session and process group (setsid). A cell ends when its whole process
# group has exited: after the command returns, the queue waits for the background processes it left
# (an async checkpoint writer, an uploader) before it records the result and starts the next cell.
# Detach a process that must outlive its cell with setsid.
#
# The disk gate is the toolkit's own (node_probe.py disk-gate beside this script, i.e. rgt_core's
# disk_gate), run with a hard timeout; it needs python3 ($RGT_PYTHON overrides).
#
# State, under QUEUE_DIR:
#   cells/<id>/status      pending | running | succeeded | failed | interrupted | refused_disk | not_run
#   cells/<id>/exit_code   the command's exit status
#   cells/<id>/log         its stdout+stderr, appended across attempts
#   cells/<id>/pgid        its process group (= the pid of its session leader), with start_ticks and
#                          boot_id: the identity that tells a live old cell from a reused pid
#   cells/<id>/{cmd,pid,started,ended,attempts,reason}
#   queue_status.json      the per-cell summary, replaced atomically: {schema: rgt-queue-status/1,
#                          queue_file, queue_dir, state (running|finished|interrupted|dry_run), status (OK or
#                          FAIL once finished, null while running), pid, updated_at, counts, all_succeeded,
#                          cells: [{id, line, cmd, status, exit_code, started_at, ended_at, seconds, attempts,
#                          pgid, reason}]}
#   queue.lock/            one pass per queue dir; a lock left by a dead pass is taken over
#
# Resuming: run the same command again. Succeeded cells are skipped; a cell recorded as running
# (the pass died: kill -9, reboot) or interrupted is run again from the start, so give long cells
# their own checkpoint/resume (examples/train_resumable.py). If any cell's old process group is
# still alive (a pass was killed while its cell ran on) the pass refuses to start (exit 3), so a
# cell is never started twice.
#
# Detach the queue itself, not its cells, e.g. start this script as the job of run_one.sh, or in a
# detached tmux session.
# SIGTERM/SIGINT/SIGHUP: the running cell's whole process group gets SIGTERM (SIGKILL after
# --stop-grace); the queue waits until the group is gone, records the cell as interrupted, writes
# its summary and exits 128+signal.
#
# Exit codes: 0 every cell succeeded; 1 at least one cell failed, was refused or did not run;
#   2 usage error (bad option, missing or empty queue file, no python3); 3 refused to start (another
#   live pass holds the lock, or a cell's old process group is still running); 128+N stopped by
#   signal N.

set -uo pipefail

PROG=run_queue.sh
NODE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
QUEUE_FILE=""
QUEUE_DIR=""
QUEUE_DIR_SET=0
FLOOR_GB="${DISK_FLOOR_GB:-}"   # empty: the toolkit's floor, read from rgt_core.py below
INODE_FLOOR=""
STOP_GRACE=20
STOP_ON_FAIL=0
RETRY_FAILED=0
DRY_RUN=0
JSON=0
GATE_TIMEOUT=120
PYTHON="${RGT_PYTHON:-python3}"

usage() {
    sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0"
}

die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 2
}

is_number() {
    [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]
}

is_uint() {
    [[ "$1" =~ ^[0-9]{1,18}$ ]]
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
        --stop-grace) [ "$#" -ge 2 ] || die "--stop-grace needs a value"; STOP_GRACE="$2"; shift 2 ;;
        --stop-grace=*) STOP_GRACE="${1#*=}"; shift ;;
        --stop-on-fail) STOP_ON_FAIL=1; shift ;;
        --retry-failed) RETRY_FAILED=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --json) JSON=1; shift ;;
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
if [ -z "$FLOOR_GB" ]; then
    FLOOR_GB=$(timeout -k 5 30 "$PYTHON" "$NODE_DIR/rgt_core.py" --default disk_floor_gb 2>/dev/null) ||
        die "cannot read the toolkit's disk floor (\"$PYTHON\" \"$NODE_DIR/rgt_core.py\" --default disk_floor_gb): pass --disk-floor-gb N"
fi
is_number "$FLOOR_GB" || die "--disk-floor-gb must be a number of GB, got '$FLOOR_GB'"
if [ "$QUEUE_DIR_SET" -eq 1 ] && [ -z "$QUEUE_DIR" ]; then die "--queue-dir is empty"; fi
[ -z "$INODE_FLOOR" ] || is_uint "$INODE_FLOOR" || die "--inode-floor must be a whole number, got '$INODE_FLOOR'"
is_uint "$STOP_GRACE" || die "--stop-grace must be a whole number of seconds, got '$STOP_GRACE'"
if [ -z "$QUEUE_DIR" ]; then
    base="${QUEUE_FILE%.*}"
    [ "$base" != "" ] || base="$QUEUE_FILE"
    QUEUE_DIR="$base.queue"
fi
# The gate measures DATA_DIR (or the current directory); the core measures a directory that does not
# exist yet on its nearest existing parent, the filesystem it will be created on.
GATE_DIR="${DATA_DIR:-$PWD}"
# With --json, stdout carries only the JSON document: everything else goes to stderr.
exec 3>&1
[ "$JSON" -eq 0 ] || exec 1>&2

# ---------------------------------------------------------------- helpers

now() { printf '%(%s)T' -1; }

iso() {  # iso EPOCH -> 2026-01-31T12:00:00Z
    local TZ=UTC
    printf '%(%Y-%m-%dT%H:%M:%SZ)T' "$1"
}

hash8() {
    local h
    if command -v sha256sum >/dev/null 2>&1; then
        h=$(printf '%s' "$1" | sha256sum)
    elif command -v shasum >/dev/null 2>&1; then
        h=$(printf '%s' "$1" | shasum -a 256)
    elif command -v openssl >/dev/null 2>&1; then
        h=$(printf '%s' "$1" | openssl dgst -sha256 -r)
    else
        die "cannot hash cell ids: no sha256sum, shasum or openssl on PATH"
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

# readv FILE: REPLY = the file's first line ("" when it is absent). No fork: the summary reads every
# cell's files on each update.
readv() {
    REPLY=""
    [ -f "$1" ] && IFS= read -r REPLY <"$1"
    return 0
}

jstr() {  # jstr TEXT: J = a JSON string literal (control characters other than \t \n \r become spaces)
    local LC_ALL=C s=${1//\\/\\\\}
    s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
    J="\"${s//[$'\x01'-$'\x1f']/ }\""
}

jnum() { if is_uint "$1"; then J=$((10#$1)); else J=null; fi; }

jiso() {  # jiso EPOCH: J = "2026-01-31T12:00:00Z" (null when EPOCH is not a number)
    local TZ=UTC
    if is_uint "$1"; then printf -v J '"%(%Y-%m-%dT%H:%M:%SZ)T"' "$1"; else J=null; fi
}

# proc_stat PID: sets ST_STATE ST_PGRP ST_START from /proc/PID/stat; non-zero when there is none.
proc_stat() {
    local raw f
    [ -r "/proc/$1/stat" ] && IFS= read -r raw <"/proc/$1/stat" 2>/dev/null || return 1
    read -r -a f <<<"${raw##*) }"
    ST_STATE=${f[0]:-}; ST_PGRP=${f[2]:-}; ST_START=${f[19]:-}
}

BOOT_ID=""
[ -r /proc/sys/kernel/random/boot_id ] && IFS= read -r BOOT_ID </proc/sys/kernel/random/boot_id

# A zombie (exited, not yet reaped) counts as dead.
pid_alive() {
    is_uint "${1:-}" && [ "$1" -gt 0 ] && kill -0 "$1" 2>/dev/null || return 1
    if proc_stat "$1" && [ "$ST_STATE" = Z ]; then return 1; fi
    return 0
}

# group_alive PGID [START_TICKS [BOOT_ID]]: does a live (non-zombie) process of the group still run?
# A recorded start time that differs from the leader's pid now, or another boot, means the old group
# is gone (the kernel never reuses a pid while its process group has members).
group_alive() {
    local pg=${1:-} start=${2:-} boot=${3:-} f
    is_uint "$pg" && [ "$pg" -gt 1 ] || return 1
    if [ -n "$boot" ] && [ -n "$BOOT_ID" ] && [ "$boot" != "$BOOT_ID" ]; then return 1; fi
    if [ -n "$start" ] && proc_stat "$pg" && [ "$ST_START" != "$start" ]; then return 1; fi
    kill -0 -- "-$pg" 2>/dev/null || return 1
    [ -d /proc/self ] || return 0              # no /proc: kill -0 is all we know
    for f in /proc/[0-9]*; do
        proc_stat "${f#/proc/}" && [ "$ST_PGRP" = "$pg" ] && [ "$ST_STATE" != Z ] && return 0
    done
    return 1
}

# cell_group_alive ID: the cell's recorded process group still runs (older state: its recorded pid,
# checked against its environment).
cell_group_alive() {
    local d="$QUEUE_DIR/cells/$1" pg pid
    pg=$(get "$d/pgid")
    if [ -n "$pg" ]; then
        group_alive "$pg" "$(get "$d/start_ticks")" "$(get "$d/boot_id")"
        return
    fi
    pid=$(get "$d/pid")
    pid_alive "$pid" || return 1
    if [ -r "/proc/$pid/environ" ]; then
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "RGT_CELL_ID=$1" || return 1
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
        if is_uint "$started" && is_uint "$ended" && [ "$ended" -ge "$started" ]; then
            secs=$((ended - started))
        fi
        cmd="${CMDS[$i]}"
        [ "${#cmd}" -le 70 ] || cmd="${cmd:0:67}..."
        printf '%-14s %-12s %-5s %-7s %s\n' "$id" "$st" "${rc:--}" "$secs" "$cmd"
    done
}

# summary STATE: the queue_status.json document (rgt-queue-status/1) on stdout.
summary() {
    local i d st started ended secs att cells="" sep="" counts="" all=true result=null c row
    local -A count=()
    local -a order=()
    for i in "${!IDS[@]}"; do
        d="$QUEUE_DIR/cells/${IDS[$i]}"
        readv "$d/status"; st=${REPLY:-pending}
        [ -n "${count[$st]+x}" ] || order+=("$st")
        count[$st]=$(( ${count[$st]:-0} + 1 ))
        [ "$st" = succeeded ] || all=false
        jstr "${IDS[$i]}"; row="{\"id\": $J, \"line\": ${LINES[$i]}"
        jstr "${CMDS[$i]}"; row+=", \"cmd\": $J"
        jstr "$st"; row+=", \"status\": $J"
        readv "$d/exit_code"; jnum "$REPLY"; row+=", \"exit_code\": $J"
        readv "$d/started"; started=$REPLY; jiso "$started"; row+=", \"started_at\": $J"
        readv "$d/ended"; ended=$REPLY; [ "$st" != running ] || ended=""; jiso "$ended"; row+=", \"ended_at\": $J"
        secs=null
        if is_uint "$started" && is_uint "$ended" && [ "$ended" -ge "$started" ]; then secs=$((ended - started)); fi
        row+=", \"seconds\": $secs"
        readv "$d/attempts"; att=0; if [[ "$REPLY" =~ ^[0-9]{1,9}$ ]]; then att=$((10#$REPLY)); fi
        row+=", \"attempts\": $att"
        readv "$d/pgid"; jnum "$REPLY"; row+=", \"pgid\": $J"
        readv "$d/reason"; J=null; [ -z "$REPLY" ] || jstr "$REPLY"; row+=", \"reason\": $J}"
        cells+="$sep"$'\n    '"$row"; sep=","
    done
    for c in "${order[@]}"; do jstr "$c"; counts+="${counts:+, }$J: ${count[$c]}"; done
    case "$1" in
        finished) if [ "$all" = true ]; then result='"OK"'; else result='"FAIL"'; fi ;;
        interrupted) result='"FAIL"' ;;
    esac
    jstr "$QUEUE_FILE_ABS"; printf '{\n  "schema": "rgt-queue-status/1",\n  "queue_file": %s,\n' "$J"
    jstr "$QUEUE_DIR"; printf '  "queue_dir": %s,\n' "$J"
    jstr "$1"; printf '  "state": %s,\n  "status": %s,\n  "pid": %s,\n' "$J" "$result" "$$"
    jiso "$(now)"; printf '  "updated_at": %s,\n' "$J"
    printf '  "counts": {%s},\n  "all_succeeded": %s,\n  "cells": [%s\n  ]\n}\n' "$counts" "$all" "$cells"
}

# utf8_clean: stdin to stdout with invalid UTF-8 dropped (a JSON document must be valid UTF-8).
utf8_clean() {
    if command -v iconv >/dev/null 2>&1; then iconv -f UTF-8 -t UTF-8 -c; else cat; fi
}

QUEUE_FILE_ABS=$(cd "$(dirname "$QUEUE_FILE")" && printf '%s/%s' "$(pwd)" "$(basename "$QUEUE_FILE")")

if [ "$DRY_RUN" -eq 1 ]; then
    printf 'queue %s: %d cell(s); state in %s; disk floor %s GB on %s\n' \
        "$QUEUE_FILE" "${#IDS[@]}" "$QUEUE_DIR" "$FLOOR_GB" "$GATE_DIR"
    print_table
    if [ "$JSON" -eq 1 ]; then summary dry_run | utf8_clean >&3; fi
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: the disk gate needs python3 (set RGT_PYTHON)"
[ -f "$NODE_DIR/node_probe.py" ] || die "node_probe.py is missing beside $0: push the whole scripts/node folder"

# ---------------------------------------------------------------- lock and state

mkdir_err=$(mkdir -p "$QUEUE_DIR/cells" 2>&1) || die "cannot create $QUEUE_DIR: ${mkdir_err##*: }"
QUEUE_DIR=$(cd "$QUEUE_DIR" && pwd)
LOCK="$QUEUE_DIR/queue.lock"
lock_holder_alive() {
    local pid start
    pid=$(get "$LOCK/pid"); start=$(get "$LOCK/start_ticks")
    pid_alive "$pid" || return 1
    if [ -n "$start" ] && proc_stat "$pid" && [ "$ST_START" != "$start" ]; then return 1; fi
    return 0
}
if ! mkdir "$LOCK" 2>/dev/null; then
    holder=$(get "$LOCK/pid")
    if lock_holder_alive; then
        printf '%s: error: REFUSED another pass holds %s (pid %s)\n' "$PROG" "$LOCK" "$holder" >&2
        exit 3
    fi
    printf '%s: taking over a lock left by dead pid %s\n' "$PROG" "${holder:-?}" >&2
    rm -rf "$LOCK"
    mkdir "$LOCK" || die "cannot take the lock $LOCK"
fi
put "$LOCK/pid" "$$"
if proc_stat "$$"; then put "$LOCK/start_ticks" "$ST_START"; fi
# Under run_one.sh (RGT_RUN_DIR set) the queue is the run's job: a cell's output must reach the run's job.log
# (the queue's stderr), or the dead-man sees a healthy cell as stalled (finding A1). A relay (tail -f) copies
# the cell's log there while the cell runs; it is this queue's child, stopped after the cell.
RELAY=""
start_relay() {
    [ -n "${RGT_RUN_DIR:-}" ] || return 0
    command -v tail >/dev/null 2>&1 || return 0
    tail -c 0 -f "$1" >&2 </dev/null 3>&- &
    RELAY=$!
}
# shellcheck disable=SC2329  # also called from the EXIT trap
stop_relay() {
    [ -n "$RELAY" ] || return 0
    kill "$RELAY" 2>/dev/null
    wait "$RELAY" 2>/dev/null
    RELAY=""
}

# shellcheck disable=SC2329  # called from the EXIT trap
cleanup() {
    stop_relay
    [ "$(get "$LOCK/pid")" = "$$" ] && rm -rf "$LOCK"
}
trap cleanup EXIT

# A cell whose old process group still runs (a pass was killed, its cell lived on) must never be
# started a second time, whatever its recorded status says (finding 4: "interrupted" included).
for id in "${IDS[@]}"; do
    if cell_group_alive "$id"; then
        printf '%s: error: REFUSED cell %s (%s) from an earlier pass is still running as process group %s; ' \
            "$PROG" "$id" "$(cell_status "$id")" "$(get "$QUEUE_DIR/cells/$id/pgid")" >&2
        printf 'wait for it or stop it (kill -TERM -- -PGID), then run the queue again\n' >&2
        exit 3
    fi
done

write_summary() {
    local tmp="$QUEUE_DIR/.queue_status.json.tmp.$$"
    if ! { summary "$1" | utf8_clean >"$tmp" && mv -f "$tmp" "$QUEUE_DIR/queue_status.json"; }; then
        rm -f "$tmp"
        echo "$PROG: could not write queue_status.json" >&2
    fi
}

# ---------------------------------------------------------------- signals and the cell's process group

STOPPING=""
CHILD=""
STOP_TICKS=0
# signal_cell SIG: the running cell's whole process group; its leader alone while setsid has not run yet.
signal_cell() {
    [ -n "$CHILD" ] || return 0
    kill -"$1" -- "-$CHILD" 2>/dev/null || kill -"$1" "$CHILD" 2>/dev/null
}
# shellcheck disable=SC2329  # called from the signal traps
on_signal() {
    [ -n "$STOPPING" ] || STOPPING="$1"
    signal_cell TERM
}
trap 'on_signal 15' TERM
trap 'on_signal 2' INT
trap 'on_signal 1' HUP

# stop_tick: one 0.1 s step of a stop; SIGKILL for the group once --stop-grace has passed.
stop_tick() {
    STOP_TICKS=$((STOP_TICKS + 1))
    if [ "$STOP_TICKS" -eq $((STOP_GRACE * 10 + 1)) ]; then
        printf '%s: the cell did not stop within --stop-grace %ss: SIGKILL to process group %s\n' \
            "$PROG" "$STOP_GRACE" "$CHILD" >&2
        signal_cell KILL
    fi
    sleep 0.1
}

# run_cell ID DIR CMD: start CMD in its own session, wait for its leader and then for its whole group.
# Sets RC.
run_cell() {
    local id=$1 cdir=$2 cmd=$3 said=0 again
    start_relay "$cdir/log"
    if command -v setsid >/dev/null 2>&1; then
        RGT_CELL_ID="$id" RGT_CELL_DIR="$cdir" RGT_QUEUE_DIR="$QUEUE_DIR" \
            RGT_HEARTBEAT="${RGT_HEARTBEAT:-$cdir/heartbeat.json}" \
            setsid bash -c "$cmd" </dev/null >>"$cdir/log" 2>&1 3>&- &
        CHILD=$!
    else  # no setsid: job control gives the background job its own process group
        set -m
        RGT_CELL_ID="$id" RGT_CELL_DIR="$cdir" RGT_QUEUE_DIR="$QUEUE_DIR" \
            RGT_HEARTBEAT="${RGT_HEARTBEAT:-$cdir/heartbeat.json}" \
            bash -c "$cmd" </dev/null >>"$cdir/log" 2>&1 3>&- &
        CHILD=$!
        set +m
    fi
    STOP_TICKS=0
    put "$cdir/pid" "$CHILD"
    put "$cdir/pgid" "$CHILD"
    if proc_stat "$CHILD"; then put "$cdir/start_ticks" "$ST_START"; else rm -f "$cdir/start_ticks"; fi
    if [ -n "$BOOT_ID" ]; then put "$cdir/boot_id" "$BOOT_ID"; fi
    put "$cdir/status" running
    [ -z "$STOPPING" ] || signal_cell TERM      # a signal arrived while the cell was being started
    write_summary running

    RC=0
    while pid_alive "$CHILD"; do
        if [ -n "$STOPPING" ]; then
            stop_tick
        else
            wait "$CHILD"                       # returns when the leader exits, or a trapped signal arrives
            RC=$?
        fi
    done
    wait "$CHILD" 2>/dev/null                   # bash keeps the real status: this returns it once more
    again=$?
    [ "$again" -eq 127 ] || RC=$again
    # the leader is gone; the cell is over when its whole process group is
    while group_alive "$CHILD"; do
        if [ -n "$STOPPING" ]; then
            stop_tick
            continue
        fi
        if [ "$said" -eq 0 ]; then
            printf '    cell %s: its command returned %s; waiting for the processes it left in its group\n' \
                "$id" "$RC"
            said=1
        fi
        sleep 0.2
    done
    CHILD=""
    stop_relay
}

# ---------------------------------------------------------------- disk gate (the core's, via node_probe.py)

GATE_ARGS=(disk-gate --min-free-gb "$FLOOR_GB")
[ -z "$INODE_FLOOR" ] || GATE_ARGS+=(--min-free-inodes "$INODE_FLOOR")

# Prints a reason and returns 1 when the gate refuses (or cannot decide).
disk_gate() {
    local out rc first
    out=$(timeout -k 5 "$GATE_TIMEOUT" "$PYTHON" "$NODE_DIR/node_probe.py" "${GATE_ARGS[@]}" -- "$GATE_DIR" 2>&1 3>&-)
    rc=$?
    [ "$rc" -ne 0 ] || return 0
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        printf 'the disk gate did not answer within %ss (a hung filesystem at %s?)' "$GATE_TIMEOUT" "$GATE_DIR"
        return 1
    fi
    first=$(printf '%s\n' "$out" | grep -v '^OK ' | head -n 1)
    first=${first#node_probe.py: error: }
    printf '%s' "${first:-the disk gate failed (exit $rc)}"
    return 1
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
        running|interrupted)
            printf '%s previous attempt was cut off (%s); running it again\n' "$tag" "$prev"
            printf '=== %s previous attempt was cut off (%s); re-running\n' "$(iso "$(now)")" "$prev" >>"$cdir/log" ;;
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
    [ -z "$STOPPING" ] || break

    attempts=$(get "$cdir/attempts")
    [[ "$attempts" =~ ^[0-9]{1,9}$ ]] || attempts=0   # a damaged count must not stop the pass
    put "$cdir/attempts" "$(( 10#$attempts + 1 ))"
    rm -f "$cdir/exit_code" "$cdir/ended" "$cdir/reason"
    put "$cdir/started" "$(now)"
    printf '=== %s start cell %s (line %s): %s\n' "$(iso "$(now)")" "$id" "${LINES[$i]}" "$cmd" >>"$cdir/log"
    printf '%s START %s\n' "$tag" "$cmd"
    run_cell "$id" "$cdir" "$cmd"
    rc=$RC

    put "$cdir/ended" "$(now)"
    put "$cdir/exit_code" "$rc"
    printf '=== %s end cell %s: exit %s\n' "$(iso "$(now)")" "$id" "$rc" >>"$cdir/log"
    if [ "$rc" -eq 0 ] && [ -z "$STOPPING" ]; then
        put "$cdir/status" succeeded
        printf '%s OK (exit 0)\n' "$tag"
    elif [ -n "$STOPPING" ]; then
        put "$cdir/status" interrupted
        put "$cdir/reason" "queue received signal $STOPPING; the cell's process group was stopped"
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
    [ "$JSON" -eq 0 ] || cat "$QUEUE_DIR/queue_status.json" >&3
    printf '%s: stopped by signal %s; run the same command again to continue\n' "$PROG" "$STOPPING" >&2
    exit $((128 + STOPPING))
fi
write_summary finished
[ "$JSON" -eq 0 ] || cat "$QUEUE_DIR/queue_status.json" >&3
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
