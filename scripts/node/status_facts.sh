#!/bin/sh
# status_facts.sh — what run_status.py reads about one run, gathered with no Python, for `rgt.py status`.
#
# Usage: sh status_facts.sh RUN_DIR NODE_DIR MARK
#
# `rgt.py status` answers in one ssh round trip: this script prints the run dir's state files and their
# mtimes, the tail of job.log, the /proc line of every process the state files record, the disk, the GPUs
# and the output files the run's globs may match; the laptop replays them through run_status.py's own
# classify() (scripts/remote_status.py). Starting Python on the node cost more than the rest of the trip
# on a fast link; this starts five short processes (date, stat twice, awk, tail), plus find for output
# globs and nvidia-smi on a GPU box. Read-only. POSIX sh with GNU stat, tail and find: where a fact is
# missing or unsure, the laptop asks run_status.py on the node instead.
#
# Output (LC_ALL=C): sections, each opened by a line "@@MARK NAME [ARG]" (MARK: a random word from the
# caller, so no content can forge one). A raw section's bytes run to the newline before the next header.
#   facts     lines: dir PATH | now S.N | stat NAME MODE SIZE MTIME DEV | disk FRSIZE BAVAIL BLOCKS FFREE FILES
#             | host NAME | boot ID | btime S | proc PID /proc-line-or-"-" | version V (VERSION.json)
#             | nodir [exists]
#   file NAME          run.json, status.json, heartbeat.json, deadman.json, DEADMAN_FIRED.json, exit_code,
#                      lease.json
#   tail               job.log's last TAIL bytes
#   attempt OFFSET     a resumed attempt's part of job.log from byte OFFSET (the newline before its start note)
#   outputs            find's "TYPE MTIME PATH" lines for the run's output globs (a superset of their matches)
#   outputs-rc RC      find's exit status
#   gpu RC             nvidia-smi's CSV (RC none: not installed; notimeout: no timeout(1) to bound it)
#   end
#
# Exit codes: 0 once it started (a missing fact is a missing line); 2 usage.
LC_ALL=C
export LC_ALL
case ${1:-} in -h|--help) sed -n '2,/^LC_ALL=C/p' "$0" | sed -e '/^LC_ALL=C/d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
[ $# -eq 3 ] || { echo "status_facts.sh: error: give RUN_DIR NODE_DIR MARK (see --help)" >&2; exit 2; }
node_dir=$2 mark=$3
case $node_dir in /*) ;; *) node_dir=$PWD/$node_dir ;; esac
TAIL=262144                 # progress.log_progress reads this much of job.log's end
SCAN=67108864               # progress.attempt_steps looks this far back for the attempt's start
STATE_FILES="run.json status.json heartbeat.json deadman.json DEADMAN_FIRED.json exit_code lease.json"

section() { printf '\n@@%s %s\n' "$mark" "$*"; }

section facts
cd "$1" 2>/dev/null || { echo nodir; [ -e "$1" ] && echo exists; section end; exit 0; }
echo "dir $PWD"
echo "now $(date +%s.%N)"
# shellcheck disable=SC2086  # fixed words
stat -c 'stat %n %f %s %.9Y %d' . $STATE_FILES job.log run.lock outputs.txt 2>/dev/null
echo "disk $(stat -f -c '%S %a %b %d %c' .)"
set --
for name in $STATE_FILES; do [ -f "$name" ] && set -- "$@" "$name"; done
# One awk prints the state files, then the facts they lead to: the /proc line of every pid they record, the
# host, the boot and the toolkit's version. It exits 3 when status.json says the attempt resumed.
awk -v mark="$mark" -v stamp="$node_dir/VERSION.json" '
function section(name) { printf "\n@@%s %s\n", mark, name }
FNR == 1 { section("file " FILENAME) }
{ print }
FILENAME ~ /^(status|deadman)\.json$/ && /"[a-z_]*pid": [0-9]/ { v = $0; sub(/.*: /, "", v); sub(/,.*/, "", v); if (v ~ /^[0-9]+$/) pids[v] = 1 }
FILENAME == "status.json" && (/"attempt": ([2-9]|[1-9][0-9])/ || /"from": "/) { resumed = 1 }
END {
    section("facts")
    if ((getline line < "/proc/sys/kernel/hostname") > 0) print "host " line
    if ((getline line < "/proc/sys/kernel/random/boot_id") > 0) print "boot " line
    while ((getline line < "/proc/stat") > 0) if (line ~ /^btime /) { split(line, f, " "); print "btime " f[2]; break }
    for (pid in pids) { line = "-"; if ((getline line < ("/proc/" pid "/stat")) <= 0) line = "-"; print "proc " pid " " line }
    while ((getline line < stamp) > 0) if (line ~ /^  "version": "/) { sub(/^  "version": "/, "", line); sub(/".*/, "", line); print "version " line }
    exit resumed ? 3 : 0
}' "$@" /dev/null
resumed=$?

if [ -f job.log ]; then
    section tail
    tail -c "$TAIL" job.log
    # a resumed attempt's ETA counts from its first step: the part of job.log after its start note
    if [ "$resumed" = 3 ]; then
        size=$(stat -c %s job.log)
        skip=$((size > SCAN ? size - SCAN : 0))
        at=$(tail -c "+$((skip + 1))" job.log | grep -abo '^\[rgt [0-9:]*\] starting: ' | tail -n 1)
        if [ -n "$at" ]; then   # from the newline before the note, which the note's pattern needs
            from=$((skip + ${at%%:*} > 0 ? skip + ${at%%:*} - 1 : 0))
            section attempt "$from"
            tail -c "+$((from + 1))" job.log | head -c "$TAIL"
        fi
    fi
fi

if [ -f outputs.txt ]; then   # line 1 the job's cwd, then one --output glob per line (launcher.py writes it)
    {
        read -r cwd
        set --
        while IFS= read -r glob; do set -- "$@" -o -path "./$glob" -o -path "./$glob/*"; done
    } < outputs.txt
    if [ $# -gt 0 ] && cd "$cwd" 2>/dev/null; then
        shift   # the first -o
        section outputs
        find . \( "$@" \) \( -type f -o -type l \) -printf '%y %T@ %P\n' 2>/dev/null
        section outputs-rc $?
    fi
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
    section gpu none
elif ! command -v timeout >/dev/null 2>&1; then
    section gpu notimeout
else
    out=$(timeout -k 1 3 nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total \
          --format=csv,noheader,nounits 2>&1)
    section gpu $?
    printf '%s' "$out"
fi
section end
