#!/usr/bin/env bash
# mem_monitor.sh — sample memory every N seconds into a CSV, and say when the job nears its cgroup limit.
#
# A job that dies with exit code 137 was sent SIGKILL, most often by the kernel OOM killer because the
# container's cgroup hit its memory limit — even while `free` shows plenty of host RAM. Run this next to the
# job (its own tmux window, or nohup) and the CSV shows what grew; the oom_kills column proves the cause.
#
# Usage:
#   bash mem_monitor.sh --out "$DURABLE_DIR/mem.csv"                 # every 5 s until stopped
#   bash mem_monitor.sh --interval 1 --count 60 --threshold 85        # one minute at 1 s, warn at 85 %
#   bash mem_monitor.sh --pid 12345 --out mem.csv                     # read the cgroup of process 12345
#   bash mem_monitor.sh --cgroup-dir /sys/fs/cgroup/system.slice/x.scope   # an explicit cgroup directory
#   bash mem_monitor.sh --count 1 --json                              # one JSON snapshot
#
# Options:
#   --interval S     seconds between samples (default 5, decimals allowed)
#   --count N        samples to take (default 0 = until stopped)
#   --out FILE       append to FILE (the CSV header is written when the file is new or empty; default stdout)
#   --threshold PCT  warn at this percentage of the limit (default 90)
#   --pid PID        read the cgroup of process PID
#   --cgroup-dir DIR read this cgroup directory
#   --quiet          no per-sample warnings on stderr
#   --json           JSON Lines instead of CSV: one object per sample with the CSV columns as keys (numbers,
#                    or null when not available) plus "status": OK, WARN (at or above the threshold, or an
#                    earlier OOM kill counted) or FAIL (the OOM kill counter rose during this run)
#   -h, --help       this text
#
# CSV columns (MiB unless named otherwise; empty = not available here):
#   time,host_total_mib,host_available_mib,cg_usage_mib,cg_working_set_mib,cg_limit_mib,cg_pct,oom_kills,
#   shm_used_mib,shm_total_mib,gpu_mem_used_mib,gpu_mem_total_mib
# cg_working_set = usage minus inactive file cache (cache the kernel can drop before killing anything);
# cg_pct = working set / limit. With no cgroup limit, the threshold applies to host RAM in use instead.
# GPU columns are summed over all GPUs (nvidia-smi, 5 s hard timeout); empty without an NVIDIA GPU.
# Errors: one line "mem_monitor.sh: error: ...".
#
# Exit codes: 0 finished (or stopped by SIGINT/SIGTERM) with no warning; 1 the threshold was crossed or
# an OOM kill was counted during the run; 2 usage error.
set -u

INTERVAL=5
COUNT=0
OUT=""
THRESHOLD=90
PID_ARG=""
CG_DIR=""
QUIET=0
JSON=0
UNLIMITED=1152921504606846976  # 2^60: larger limits mean "no limit" (v1 writes ~2^63)
HEADER="time,host_total_mib,host_available_mib,cg_usage_mib,cg_working_set_mib,cg_limit_mib,cg_pct,oom_kills,\
shm_used_mib,shm_total_mib,gpu_mem_used_mib,gpu_mem_total_mib"

usage() { sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }
die_usage() { echo "mem_monitor.sh: error: $1 (see --help)" >&2; exit 2; }
is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
is_num() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }
need_arg() { if [ "$2" -lt 2 ]; then die_usage "$1 needs a value"; fi; }

while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --interval) need_arg "$1" $#; is_num "$2" || die_usage "--interval must be a number of seconds"
            INTERVAL=$2; shift 2 ;;
        --count) need_arg "$1" $#; is_uint "$2" || die_usage "--count must be a whole number"; COUNT=$2; shift 2 ;;
        --out) need_arg "$1" $#; [ -n "$2" ] || die_usage "--out needs a file name"; OUT=$2; shift 2 ;;
        --threshold) need_arg "$1" $#; is_num "$2" || die_usage "--threshold must be a percentage"
            THRESHOLD=$2; shift 2 ;;
        --pid) need_arg "$1" $#; is_uint "$2" || die_usage "--pid must be a process id"; PID_ARG=$2; shift 2 ;;
        --cgroup-dir) need_arg "$1" $#; CG_DIR=$2; shift 2 ;;
        --quiet) QUIET=1; shift ;;
        --json) JSON=1; shift ;;
        *) die_usage "unknown argument: $1" ;;
    esac
done
awk -v i="$INTERVAL" 'BEGIN { exit !(i > 0) }' || die_usage "--interval must be > 0"
awk -v t="$THRESHOLD" 'BEGIN { exit !(t > 0 && t <= 100) }' || die_usage "--threshold must be a percentage in (0, 100]"
if [ -n "$PID_ARG" ] && [ ! -r "/proc/$PID_ARG/cgroup" ]; then die_usage "no readable /proc/$PID_ARG/cgroup"; fi
if [ -n "$PID_ARG" ] && [ -n "$CG_DIR" ]; then die_usage "--pid and --cgroup-dir both pick the cgroup; give one"; fi
if [ -n "$CG_DIR" ] && [ ! -d "$CG_DIR" ]; then die_usage "--cgroup-dir $CG_DIR is not a directory"; fi
if [ -n "$CG_DIR" ] && [ ! -e "$CG_DIR/memory.current" ] && [ ! -e "$CG_DIR/memory.usage_in_bytes" ]; then
    die_usage "--cgroup-dir $CG_DIR has no memory.current or memory.usage_in_bytes: not a memory cgroup"
fi
if [ -n "$OUT" ] && [ -d "$OUT" ]; then die_usage "--out $OUT is a directory; give a file name"; fi
if [ -n "$OUT" ]; then
    out_dir=$(dirname -- "$OUT")
    [ -d "$out_dir" ] && [ -w "$out_dir" ] || die_usage "--out directory $out_dir is missing or not writable"
    first_line=""
    [ ! -s "$OUT" ] || IFS= read -r first_line < "$OUT"
    if [ "$JSON" -eq 1 ] && [ "${first_line%%,*}" = time ]; then
        die_usage "--out $OUT already holds CSV; give --json another file"
    fi
    if [ "$JSON" -eq 0 ] && [ "${first_line:0:1}" = "{" ]; then
        die_usage "--out $OUT already holds JSON Lines; add --json or give another file"
    fi
fi

# ---- locate the cgroup: CG_VER (1|2), CG_LEAF (our directory), CG_ROOT (where limits stop nesting)
CG_VER=""; CG_LEAF=""; CG_ROOT=""
if [ -n "$CG_DIR" ]; then
    CG_LEAF=${CG_DIR%/}; CG_ROOT=$CG_LEAF
    if [ -e "$CG_LEAF/memory.current" ]; then CG_VER=2; else CG_VER=1; fi
else
    src="/proc/${PID_ARG:-self}/cgroup"
    if [ -e /sys/fs/cgroup/cgroup.controllers ]; then
        CG_VER=2; CG_ROOT=/sys/fs/cgroup
        rel=$(sed -n 's/^0::\(.*\)$/\1/p' "$src" 2>/dev/null | head -n 1)
    elif [ -d /sys/fs/cgroup/memory ]; then
        CG_VER=1; CG_ROOT=/sys/fs/cgroup/memory
        rel=$(awk -F: '{ n = split($2, c, ","); for (k = 1; k <= n; k++) if (c[k] == "memory") print $3 }' \
            "$src" 2>/dev/null | head -n 1)
    else
        rel=""
    fi
    if [ -n "$CG_ROOT" ]; then
        CG_LEAF="$CG_ROOT${rel%/}"
        [ -d "$CG_LEAF" ] || CG_LEAF=$CG_ROOT  # cgroup namespace: our own cgroup is the mount root
    fi
fi
if [ "$CG_VER" = 2 ]; then
    F_USAGE=memory.current; F_LIMIT=memory.max; K_INACTIVE=inactive_file
else
    F_USAGE=memory.usage_in_bytes; F_LIMIT=memory.limit_in_bytes; K_INACTIVE=total_inactive_file
fi

read_num() { local v; v=$(head -c 64 "$1" 2>/dev/null) || return 1; v=${v%%[!0-9]*}; [ -n "$v" ] && echo "$v"; }

cg_limit() {  # tightest limit from the leaf up to CG_ROOT; empty when unlimited or unreadable
    local d=$CG_LEAF best="" v
    while [ -n "$d" ]; do
        v=$(read_num "$d/$F_LIMIT") || v=""
        if [ -n "$v" ] && [ "$v" -lt "$UNLIMITED" ]; then
            if [ -z "$best" ] || [ "$v" -lt "$best" ]; then best=$v; fi
        fi
        [ "$d" = "$CG_ROOT" ] && break
        case "$d" in "$CG_ROOT"/*) d=${d%/*} ;; *) break ;; esac
    done
    echo "$best"
}

stat_key() {  # stat_key FILE KEY — value of "KEY N" lines (memory.stat, memory.events, memory.oom_control)
    awk -v k="$2" '$1 == k { print $2; exit }' "$1" 2>/dev/null
}

mib() { [ -n "$1" ] && echo $(( $1 / 1048576 )); }

sample() {  # print one CSV row
    local now total avail usage inactive ws limit pct oom shm_used shm_total gpu_used gpu_total g
    now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    total=$(awk '$1 == "MemTotal:" { printf "%d", $2 / 1024 }' /proc/meminfo 2>/dev/null)  # MiB
    avail=$(awk '$1 == "MemAvailable:" { printf "%d", $2 / 1024 }' /proc/meminfo 2>/dev/null)
    usage=""; ws=""; limit=""; pct=""; oom=""
    if [ -n "$CG_LEAF" ]; then
        usage=$(read_num "$CG_LEAF/$F_USAGE") || usage=""
        inactive=$(stat_key "$CG_LEAF/memory.stat" "$K_INACTIVE")
        [ -n "$inactive" ] || inactive=$(stat_key "$CG_LEAF/memory.stat" inactive_file)
        if [ -n "$usage" ]; then
            ws=$usage
            if [ -n "$inactive" ] && [ "$inactive" -le "$usage" ]; then ws=$(( usage - inactive )); fi
        fi
        limit=$(cg_limit)
        if [ "$CG_VER" = 2 ]; then
            oom=$(stat_key "$CG_LEAF/memory.events" oom_kill)
        else
            oom=$(stat_key "$CG_LEAF/memory.oom_control" oom_kill)
        fi
    fi
    if [ -n "$limit" ] && [ -n "$ws" ] && [ "$limit" -gt 0 ]; then
        pct=$(awk -v a="$ws" -v b="$limit" 'BEGIN { printf "%.1f", 100 * a / b }')
    fi
    read -r shm_total shm_used < <(timeout -k 1 5 df -Pk /dev/shm 2>/dev/null |
        awk 'NR == 2 { printf "%d %d", $2 / 1024, $3 / 1024 }')
    gpu_used=""; gpu_total=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        g=$(timeout -k 1 5 nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits 2>/dev/null |
            awk -F, '$1 + 0 == $1 { u += $1; t += $2; n++ } END { if (n) print u, t }')
        [ -n "$g" ] && read -r gpu_used gpu_total <<< "$g"
    fi
    printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$now" "$total" "$avail" "$(mib "$usage")" \
        "$(mib "$ws")" "$(mib "$limit")" "$pct" "$oom" "${shm_used:-}" "${shm_total:-}" "$gpu_used" "$gpu_total"
}

emit() {
    if [ -n "$OUT" ]; then printf '%s\n' "$1" >> "$OUT"; else printf '%s\n' "$1"; fi
}

as_json() {  # as_json CSV_ROW STATUS — the row as one JSON object (keys from HEADER; empty cells are null)
    local -a keys vals
    local i v obj="{"
    IFS=, read -r -a keys <<< "$HEADER"
    IFS=, read -r -a vals <<< "$1,"
    for i in "${!keys[@]}"; do
        v=${vals[$i]:-}
        if [ "$i" -eq 0 ]; then v="\"$v\""; elif ! is_num "$v"; then v=null; fi
        obj+="\"${keys[$i]}\": $v, "
    done
    printf '%s"status": "%s"}' "$obj" "$2"
}

ALERT=0
trap 'exit "$ALERT"' INT TERM

if [ "$JSON" -eq 0 ] && { [ -z "$OUT" ] || [ ! -s "$OUT" ]; }; then emit "$HEADER"; fi
if [ "$QUIET" -eq 0 ]; then
    echo "mem_monitor: cgroup v${CG_VER:-?} at ${CG_LEAF:-<none>}; every ${INTERVAL}s; warn at ${THRESHOLD}%" \
        "-> ${OUT:-stdout}" >&2
fi

n=0; prev_oom=""; above=0; since_warn=0
while :; do
    row=$(sample)
    IFS=, read -r r_time _ _ _ r_ws r_limit r_cgpct r_oom _ <<< "$row"
    word=OK
    if [ -n "$r_cgpct" ]; then pct=$r_cgpct; scope=cgroup
    else
        pct=$(awk '$1 == "MemTotal:" { t = $2 } $1 == "MemAvailable:" { a = $2 }
            END { if (t > 0) printf "%.1f", 100 * (t - a) / t }' /proc/meminfo 2>/dev/null); scope=host
    fi
    since_warn=$((since_warn + 1))
    if [ -n "$pct" ] && awk -v p="$pct" -v t="$THRESHOLD" 'BEGIN { exit !(p >= t) }'; then
        ALERT=1; word=WARN
        # warn when crossing the threshold, then at most every 60 samples while it stays above
        if [ "$QUIET" -eq 0 ] && { [ "$above" -eq 0 ] || [ "$since_warn" -ge 60 ]; }; then
            since_warn=0
            if [ "$scope" = cgroup ]; then
                echo "WARN $r_time cgroup memory at ${pct}% of its limit (working set ${r_ws} MiB of ${r_limit} MiB):" \
                    "at 100% the kernel OOM killer sends SIGKILL (exit 137)" >&2
            else
                echo "WARN $r_time host RAM ${pct}% in use (no cgroup limit found): the OOM killer acts near 100%" >&2
            fi
        fi
        above=1
    else
        if [ "$above" -eq 1 ] && [ "$QUIET" -eq 0 ]; then
            echo "OK   $r_time memory back below ${THRESHOLD}% ($scope: ${pct:-?}%)" >&2
        fi
        above=0
    fi
    if [ -n "$r_oom" ]; then
        if [ -z "$prev_oom" ] && [ "$r_oom" -gt 0 ]; then
            ALERT=1; word=WARN
            [ "$QUIET" -eq 1 ] || echo "WARN $r_time this cgroup already counts $r_oom OOM kill(s):" \
                "an earlier exit 137 was the memory limit" >&2
        elif [ -n "$prev_oom" ] && [ "$r_oom" -gt "$prev_oom" ]; then
            ALERT=1; word=FAIL
            [ "$QUIET" -eq 1 ] || echo "FAIL $r_time OOM kill counter rose $prev_oom -> $r_oom:" \
                "a process in this cgroup was SIGKILLed for memory (exit 137)" >&2
        fi
        prev_oom=$r_oom
    fi
    if [ "$JSON" -eq 1 ]; then emit "$(as_json "$row" "$word")"; else emit "$row"; fi
    n=$((n + 1))
    if [ "$COUNT" -gt 0 ] && [ "$n" -ge "$COUNT" ]; then break; fi
    sleep "$INTERVAL"
done
exit "$ALERT"
