#!/usr/bin/env bash
# reap_vram_zombies.sh — find processes that hold GPU memory, tell orphans from owned jobs, and (only when
# asked) stop the orphans. Use it when a new job hits CUDA out-of-memory on a GPU that "should" be empty.
#
# Usage:
#   bash reap_vram_zombies.sh                      # list and classify; never kills (the default)
#   bash reap_vram_zombies.sh --kill               # SIGTERM each ORPHAN, SIGKILL after --grace seconds
#   bash reap_vram_zombies.sh --pids-from FILE     # classify the PIDs in FILE (one per line) instead of asking
#                                                  # nvidia-smi; for tests and for PIDs found another way
#   bash reap_vram_zombies.sh --json               # one JSON object on stdout instead of the lines
#
# Options:
#   --kill            signal the ORPHAN processes (without it nothing is ever signalled)
#   --grace S         seconds between SIGTERM and SIGKILL (default 10)
#   --min-age S       younger processes are never orphans (default 120)
#   --pids-from FILE  classify these PIDs (one per line, "PID, anything" allowed, # comments)
#   --reaper NAME     another process name that adopts orphans, e.g. a custom init (repeatable)
#   --json            print {"status", "summary", "kill", "processes": [{"class", "pid", "name", "source",
#                     "mem_mib", "why"}], "actions": [{"action", "pid", "detail"}], "orphans", "owned",
#                     "killed"} instead of the lines; "status" is OK, FAIL or NO_GPU
#   -h, --help        this text
#
# Where PIDs come from: nvidia-smi's compute-apps query plus every process with a /dev/nvidiaN device open
# (found through /proc/*/fd — this also catches holders nvidia-smi cannot show). A PID that nvidia-smi lists
# but that holds no /dev/nvidia* here (another PID namespace, e.g. a host PID seen from a container) is
# reported as ELSEWHERE and never touched.
#
# A PID is an ORPHAN only when ALL of this is proven, in this order (the first failed proof makes it OWNED):
#   not PID 1, not this script or one of its ancestors; parent is PID 1 or a known init/reaper
#   (init, systemd, tini, dumb-init, docker-init, catatonit, s6-svscan); no controlling terminal; not its own
#   session leader (a job started with setsid on purpose); its session leader is gone (no live tmux pane,
#   screen window or login shell holds it); TMUX/STY in its environment point to no live server (an
#   unreadable environment counts as "cannot prove"); SIGHUP is not ignored (nohup marks a deliberate
#   detach); no RGT_RUN_DIR with a live run; older than --min-age. Each line says which proof decided.
# Never signalled: PID 1, this script and its ancestors, anything not classified ORPHAN, and a PID whose
# start time changed since it was classified (PID reuse).
#
# Output: one line per PID starting with ORPHAN, OWNED, YOUNG, DEFUNCT, ELSEWHERE or GONE; with --kill,
# KILLED, SKIP or FAIL lines; last line "RESULT: ...". Errors: one line "reap_vram_zombies.sh: error: ...".
# Every nvidia-smi call has a hard timeout (15 s).
#
# Exit codes: 0 listed (and, with --kill, every orphan is gone); 1 an orphan survived or could not be
# signalled; 2 usage error. Without --pids-from and with no NVIDIA GPU: "RESULT: NO_GPU", exit 0.
set -u

KILL=0
GRACE=10
MIN_AGE=120
PIDS_FROM=""
JSON=0
PROCS=()
ACTIONS=()
REAPERS=" init systemd tini dumb-init docker-init catatonit s6-svscan "

usage() { sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }
die_usage() { echo "reap_vram_zombies.sh: error: $1 (see --help)" >&2; exit 2; }
is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
need_uint() { if [ "$2" -lt 2 ] || ! is_uint "$3"; then die_usage "$1 needs a whole number of seconds"; fi; }

while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --kill) KILL=1; shift ;;
        --json) JSON=1; shift ;;
        --grace) need_uint "$1" $# "${2:-}"; GRACE=$2; shift 2 ;;
        --min-age) need_uint "$1" $# "${2:-}"; MIN_AGE=$2; shift 2 ;;
        --pids-from) [ $# -ge 2 ] && [ -n "$2" ] || die_usage "--pids-from needs a file"; PIDS_FROM=$2; shift 2 ;;
        --reaper) [ $# -ge 2 ] && [[ "$2" =~ ^[A-Za-z0-9._-]+$ ]] || die_usage "--reaper needs a process name"
            REAPERS="$REAPERS$2 "; shift 2 ;;
        *) die_usage "unknown argument: $1" ;;
    esac
done
if [ -n "$PIDS_FROM" ] && [ ! -r "$PIDS_FROM" ]; then die_usage "--pids-from $PIDS_FROM is not readable"; fi
if [ -n "$PIDS_FROM" ] && [ -d "$PIDS_FROM" ]; then die_usage "--pids-from $PIDS_FROM is a directory, not a file"; fi

jstr() {  # jstr TEXT: J = a JSON string literal (other control characters become spaces)
    local LC_ALL=C s=${1//\\/\\\\}
    s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
    J="\"${s//[$'\x01'-$'\x1f']/ }\""
}

# report CLASS PID NAME SOURCE MEM WHY — one classified PID: a line, or a record for --json.
report() {
    local memtxt=""
    if [ "$JSON" -eq 1 ]; then PROCS+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"$'\t'"$5"$'\t'"$6"); return; fi
    if [ "$1" = ELSEWHERE ]; then
        printf 'ELSEWHERE %s mem=%sMiB — %s\n' "$2" "$5" "$6"
        return
    fi
    if [ "$5" != "-" ]; then memtxt=" mem=${5}MiB"; fi
    printf '%-9s %s (%s) src=%s%s — %s\n' "$1" "$2" "$3" "$4" "$memtxt" "$6"
}

# action WORD PID DETAIL — what --kill did to one PID ("KILLED 42 with SIGTERM").
action() {
    if [ "$JSON" -eq 1 ]; then ACTIONS+=("$1"$'\t'"$2"$'\t'"$3"); return; fi
    printf '%-6s %s %s\n' "$1" "$2" "$3"
}

# finish STATUS SUMMARY EXIT — the RESULT line (or the JSON object) and exit.
finish() {
    local item f procs="" acts="" sep="" mem
    if [ "$JSON" -eq 0 ]; then
        if [ "$1" = NO_GPU ]; then echo "RESULT: NO_GPU — $2"; else echo "RESULT: $2"; fi
        exit "$3"
    fi
    for item in "${PROCS[@]+"${PROCS[@]}"}"; do
        IFS=$'\t' read -r -a f <<< "$item"
        mem=${f[4]}; is_uint "$mem" || mem=null
        procs+="$sep"$'\n    '"{\"class\": \"${f[0]}\", \"pid\": ${f[1]}"
        jstr "${f[2]}"; procs+=", \"name\": $J"
        jstr "${f[3]}"; procs+=", \"source\": $J, \"mem_mib\": $mem"
        jstr "${f[5]}"; procs+=", \"why\": $J}"; sep=","
    done
    sep=""
    for item in "${ACTIONS[@]+"${ACTIONS[@]}"}"; do
        IFS=$'\t' read -r -a f <<< "$item"
        jstr "${f[2]}"; acts+="$sep"$'\n    '"{\"action\": \"${f[0]}\", \"pid\": ${f[1]}, \"detail\": $J}"; sep=","
    done
    jstr "$2"
    printf '{\n  "status": "%s",\n  "summary": %s,\n  "kill": %s,\n  "orphans": %d,\n  "owned": %d,\n' \
        "$1" "$J" "$([ "$KILL" -eq 1 ] && echo true || echo false)" "${n_orphan:-0}" "${n_owned:-0}"
    printf '  "killed": %d,\n  "processes": [%s\n  ],\n  "actions": [%s\n  ]\n}\n' "${killed:-0}" "$procs" "$acts"
    exit "$3"
}

CLK_TCK=$(getconf CLK_TCK 2>/dev/null) || CLK_TCK=100
is_uint "$CLK_TCK" || CLK_TCK=100

# stat_of PID — sets ST_STATE ST_PPID ST_SID ST_TTY ST_START ST_COMM; non-zero when the PID is gone.
stat_of() {
    local raw rest f
    raw=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$raw" ] || return 1
    ST_COMM=${raw#*(}; ST_COMM=${ST_COMM%)*}
    rest=${raw##*) }
    read -r -a f <<< "$rest"
    ST_STATE=${f[0]}; ST_PPID=${f[1]}; ST_SID=${f[3]}; ST_TTY=${f[4]}; ST_START=${f[19]}
}

alive() {  # alive PID — exists and is not a zombie
    stat_of "$1" || return 1
    [ "$ST_STATE" != Z ]
}

comm_of() { local c; c=$(cat "/proc/$1/comm" 2>/dev/null) || c="?"; printf '%s' "$c"; }

age_of() {  # age_of STARTTIME_TICKS — whole seconds since the process started
    local up
    up=$(cut -d' ' -f1 /proc/uptime 2>/dev/null); up=${up%%.*}
    echo $(( up - $1 / CLK_TCK ))
}

# Ancestors of this script (never signalled).
ANCESTORS=" "
p=$$
while is_uint "$p" && [ "$p" -gt 1 ]; do
    ANCESTORS="$ANCESTORS$p "
    stat_of "$p" || break
    p=$ST_PPID
done

holds_gpu_device() {  # holds_gpu_device PID — has /dev/nvidiaN or /dev/nvidia-uvm open
    local fd target
    for fd in /proc/"$1"/fd/*; do
        target=$(readlink "$fd" 2>/dev/null) || continue
        case "$target" in /dev/nvidia[0-9]* | /dev/nvidia-uvm) return 0 ;; esac
    done
    return 1
}

# classify PID — sets CLASS (ORPHAN|OWNED|YOUNG|DEFUNCT|GONE) and WHY; START keeps the start time.
classify() {
    local pid=$1 pcomm tmux_pid sty_pid sigign run_dir envdump age
    CLASS=OWNED; WHY=""; START=""
    if ! stat_of "$pid"; then CLASS=GONE; WHY="no such process"; return; fi
    START=$ST_START
    if [ "$pid" -eq 1 ]; then WHY="PID 1 (init) is never touched"; return; fi
    if [ "$pid" -eq $$ ]; then WHY="this script"; return; fi
    case "$ANCESTORS" in *" $pid "*) WHY="an ancestor of this script (your shell or session)"; return ;; esac
    if [ "$ST_STATE" = Z ]; then
        CLASS=DEFUNCT; WHY="already dead (zombie entry); it frees memory once parent $ST_PPID reaps it"; return
    fi
    pcomm=$(comm_of "$ST_PPID")
    if [ "$ST_PPID" -ne 1 ] && [[ "$REAPERS" != *" $pcomm "* ]]; then
        WHY="parent $ST_PPID ($pcomm) is alive and is not an init/reaper"; return
    fi
    if [ "$ST_TTY" != 0 ]; then WHY="has a controlling terminal"; return; fi
    if [ "$ST_SID" -eq "$pid" ]; then WHY="is its own session leader (deliberately detached with setsid)"; return; fi
    if [ "$ST_SID" -gt 0 ] && alive "$ST_SID"; then
        WHY="its session leader $ST_SID ($(comm_of "$ST_SID")) is alive (tmux pane, screen window or login shell)"
        return
    fi
    envdump=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null) || {
        WHY="cannot read its environment to rule out tmux/screen (run as root or as its owner)"; return; }
    tmux_pid=$(printf '%s\n' "$envdump" | sed -n 's/^TMUX=[^,]*,\([0-9][0-9]*\),.*/\1/p' | head -n 1)
    if [ -n "$tmux_pid" ] && alive "$tmux_pid"; then WHY="TMUX points to live tmux server $tmux_pid"; return; fi
    sty_pid=$(printf '%s\n' "$envdump" | sed -n 's/^STY=\([0-9][0-9]*\)\..*/\1/p' | head -n 1)
    if [ -n "$sty_pid" ] && alive "$sty_pid"; then WHY="STY points to live screen session $sty_pid"; return; fi
    run_dir=$(printf '%s\n' "$envdump" | sed -n 's/^RGT_RUN_DIR=//p' | head -n 1)
    if [ -n "$run_dir" ] && [ -f "$run_dir/status.json" ] &&
        grep -Eq '"state" *: *"(starting|running|syncing)"' "$run_dir/status.json"; then
        WHY="belongs to live run $run_dir"; return
    fi
    sigign=$(sed -n 's/^SigIgn:[[:space:]]*\([0-9a-fA-F]*\)$/\1/p' "/proc/$pid/status" 2>/dev/null)
    if [ -z "$sigign" ]; then WHY="cannot read its signal mask"; return; fi
    if (( 16#${sigign: -1} & 1 )); then WHY="ignores SIGHUP (started under nohup: a deliberate detach)"; return; fi
    age=$(age_of "$ST_START")
    if [ "$age" -lt "$MIN_AGE" ]; then CLASS=YOUNG; WHY="only ${age}s old (< --min-age $MIN_AGE)"; return; fi
    CLASS=ORPHAN
    WHY="parent is $ST_PPID ($pcomm), no tty, session leader $ST_SID gone, no live tmux/screen, SIGHUP not"
    WHY="$WHY ignored, ${age}s old"
}

# ---- collect PIDs: "pid<TAB>source<TAB>mem_mib"
entries=""
if [ -n "$PIDS_FROM" ]; then
    while IFS= read -r row || [ -n "$row" ]; do
        row=${row%%#*}
        tok=$(printf '%s' "$row" | tr ',' ' ' | awk '{ print $1 }')
        [ -n "$tok" ] || continue
        is_uint "$tok" || die_usage "--pids-from: '$tok' is not a PID"
        entries="$entries$tok	file	-"$'\n'
    done < "$PIDS_FROM"
else
    have_dev=0
    for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && have_dev=1 && break; done
    if ! command -v nvidia-smi >/dev/null 2>&1 && [ "$have_dev" -eq 0 ]; then
        finish NO_GPU "no NVIDIA GPU on this node (no nvidia-smi, no /dev/nvidia*); nothing holds VRAM" 0
    fi
    if command -v nvidia-smi >/dev/null 2>&1; then
        apps=$(timeout -k 2 15 nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits \
            2>/dev/null) ||
            echo "WARN nvidia-smi could not list compute apps; relying on the /dev/nvidia* scan" >&2
        while IFS=, read -r apid amem; do
            apid=${apid// /}; amem=${amem// /}
            is_uint "$apid" && entries="$entries$apid	nvidia-smi	${amem:--}"$'\n'
        done <<< "${apps:-}"
    fi
    if [ "$have_dev" -eq 1 ]; then
        for fdir in /proc/[0-9]*; do
            dpid=${fdir#/proc/}
            holds_gpu_device "$dpid" && entries="$entries$dpid	device	-"$'\n'
        done
    fi
fi

declare -A SEEN=()
orphans=(); n_owned=0; n_orphan=0
while IFS=$'\t' read -r pid src memv; do
    [ -n "$pid" ] || continue
    [ -z "${SEEN[$pid]:-}" ] || continue
    SEEN[$pid]=1
    if [ "$src" = nvidia-smi ] && ! holds_gpu_device "$pid"; then
        report ELSEWHERE "$pid" "-" "$src" "$memv" \
            "listed by nvidia-smi but holds no /dev/nvidia* in this PID namespace; never touched"
        continue
    fi
    classify "$pid"
    name="-"
    if [ "$CLASS" != GONE ]; then name=$(comm_of "$pid"); fi
    report "$CLASS" "$pid" "$name" "$src" "$memv" "$WHY"
    case "$CLASS" in
        ORPHAN) orphans+=("$pid:$START"); n_orphan=$((n_orphan + 1)) ;;
        OWNED | YOUNG) n_owned=$((n_owned + 1)) ;;
    esac
done <<< "$entries"

killed=0
if [ "$KILL" -eq 0 ]; then
    if [ "$n_orphan" -gt 0 ]; then
        msg="$n_orphan orphan(s), $n_owned owned/young — dry run, nothing signalled;"
        finish OK "$msg re-run with --kill to stop the ORPHAN lines" 0
    fi
    finish OK "no orphans ($n_owned owned/young) — nothing to do" 0
fi

rc=0
for item in "${orphans[@]+"${orphans[@]}"}"; do
    pid=${item%%:*}; start=${item#*:}
    # Re-check right before signalling: same process (start time) and still an orphan.
    classify "$pid"
    if [ "$CLASS" = GONE ] || [ "$CLASS" = DEFUNCT ]; then action KILLED "$pid" "exited by itself"; continue; fi
    if [ "$START" != "$start" ] || [ "$CLASS" != ORPHAN ]; then
        action SKIP "$pid" "changed since it was listed ($CLASS: $WHY); not signalled"; continue
    fi
    if ! kill -TERM "$pid" 2>/dev/null; then
        action FAIL "$pid" "SIGTERM refused (another user's process?)"; rc=1; continue
    fi
    waited=0
    while alive "$pid" && [ "$ST_START" = "$start" ] && [ "$waited" -lt $((GRACE * 10)) ]; do
        sleep 0.1; waited=$((waited + 1))
    done
    if ! alive "$pid" || [ "$ST_START" != "$start" ]; then
        action KILLED "$pid" "with SIGTERM"; killed=$((killed + 1)); continue
    fi
    kill -KILL "$pid" 2>/dev/null
    waited=0
    while alive "$pid" && [ "$ST_START" = "$start" ] && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
    if alive "$pid" && [ "$ST_START" = "$start" ]; then
        msg="survived SIGKILL (stuck in the driver, state $ST_STATE):"
        action FAIL "$pid" "$msg reset the GPU or restart the container"
        rc=1
    else
        action KILLED "$pid" "with SIGKILL after ${GRACE}s grace"; killed=$((killed + 1))
    fi
done
status=OK
[ "$rc" -eq 0 ] || status=FAIL
finish "$status" "$killed of $n_orphan orphan(s) stopped; $n_owned owned/young left alone" "$rc"
