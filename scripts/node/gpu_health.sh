#!/usr/bin/env bash
# gpu_health.sh — one-shot health check of the NVIDIA GPUs on this node, before you pay for a long run.
#
# Usage:
#   bash gpu_health.sh                      # all GPUs
#   bash gpu_health.sh --gpu 0 --gpu 3      # only these indices
#   bash gpu_health.sh --require-gpu        # a box without an NVIDIA GPU is a failure, not a notice
#   bash gpu_health.sh --json               # one JSON object on stdout instead of the lines
#
# Options:
#   --gpu N          check only GPU index N (repeatable; default: every GPU)
#   --require-gpu    no NVIDIA GPU here (nvidia-smi absent) is a failure (exit 1), not a notice
#   --temp-warn C    WARN at or above this temperature (default 83)
#   --timeout S      hard time limit for each nvidia-smi and dmesg call, in whole seconds (default 10)
#   --json           print {"status", "summary", "gpus", "fails", "warns", "checks": [{"status",
#                    "message"}]} instead of the lines; "status" is the RESULT word
#   -h, --help       this text
#
# Checks, one line each with a fixed first word OK / WARN / FAIL:
#   driver reachable (nvidia-smi -L), temperature, persistence mode, uncorrected ECC errors
#   (volatile), retired-page / row-remap state, active clock-slowdown reasons (thermal, power brake),
#   compute processes already holding memory, and NVRM Xid lines in the kernel log (when readable).
# The last line is "RESULT: OK|WARN|FAIL|NO_GPU — ...". Errors: one line "gpu_health.sh: error: ...".
#
# Notes: dmesg inside a container may show the host's kernel log (other tenants' GPUs) or be blocked
# (kernel.dmesg_restrict=1); an unreadable log is a WARN, never a silent pass. Xid codes treated as
# hardware failures: 48 (double-bit ECC), 62, 64, 74 (NVLink), 79 (fell off the bus), 95, 119, 120.
#
# Exit codes:
#   0  no FAIL (WARN lines are advice), or no NVIDIA GPU here: "RESULT: NO_GPU" (nvidia-smi absent)
#   1  at least one FAIL: do not launch on this box (re-rent another one); also NO_GPU with --require-gpu
#   2  usage error
set -u

TEMP_WARN=83
TIMEOUT=10
REQUIRE_GPU=0
JSON=0
WANT_GPUS=()
CHECKS=()
STATUS=OK
FAILS=0
WARNS=0

usage() { sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }
die_usage() { echo "gpu_health.sh: error: $1 (see --help)" >&2; exit 2; }
is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

uint_arg() {  # uint_arg OPTION ARGC VALUE — exit 2 unless VALUE is a whole number
    if [ "$2" -lt 2 ] || ! is_uint "$3"; then die_usage "$1 needs a whole number"; fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --gpu) uint_arg "$1" $# "${2:-}"; WANT_GPUS+=("$2"); shift 2 ;;
        --temp-warn) uint_arg "$1" $# "${2:-}"; TEMP_WARN=$2; shift 2 ;;
        --timeout) uint_arg "$1" $# "${2:-}"; [ "$2" -gt 0 ] || die_usage "--timeout must be > 0"
            TIMEOUT=$2; shift 2 ;;
        --require-gpu) REQUIRE_GPU=1; shift ;;
        --json) JSON=1; shift ;;
        *) die_usage "unknown argument: $1" ;;
    esac
done

jstr() {  # jstr TEXT: J = a JSON string literal (other control characters become spaces)
    local LC_ALL=C s=${1//\\/\\\\}
    s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
    J="\"${s//[$'\x01'-$'\x1f']/ }\""
}

# finish WORD SUMMARY EXIT — the RESULT line (or the JSON object) and exit.
finish() {
    local item checks="" sep="" gpus="" idx
    if [ "$JSON" -eq 0 ]; then
        echo "RESULT: $1 — $2"
        exit "$3"
    fi
    for item in "${CHECKS[@]+"${CHECKS[@]}"}"; do
        jstr "${item#*|}"; checks+="$sep"$'\n    '"{\"status\": \"${item%%|*}\", \"message\": $J}"; sep=","
    done
    sep=""
    for idx in "${all_idx[@]+"${all_idx[@]}"}"; do gpus+="$sep$idx"; sep=", "; done
    jstr "$2"
    printf '{\n  "status": "%s",\n  "summary": %s,\n  "gpus": [%s],\n  "fails": %d,\n  "warns": %d,\n%s\n' \
        "$1" "$J" "$gpus" "$FAILS" "$WARNS" "  \"checks\": [$checks"$'\n  ]\n}' |
        if command -v iconv >/dev/null 2>&1; then iconv -f UTF-8 -t UTF-8 -c; else cat; fi  # valid UTF-8 only
    exit "$3"
}

line() {  # line WORD message — print one result line and escalate the overall status
    if [ "$JSON" -eq 0 ]; then printf '%-4s %s\n' "$1" "$2"; fi
    CHECKS+=("$1|$2")
    case "$1" in
        FAIL) STATUS=FAIL; FAILS=$((FAILS + 1)) ;;
        WARN) [ "$STATUS" = FAIL ] || STATUS=WARN; WARNS=$((WARNS + 1)) ;;
    esac
}

bounded() {  # bounded CMD ARGS... — run with the --timeout hard limit (SIGKILL 2 s after SIGTERM)
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 2 "$TIMEOUT" "$@"
    else
        "$@"
    fi
}

smi() { bounded nvidia-smi "$@"; }  # a wedged driver cannot hang the check

# query FIELD — print "index|value" per GPU; non-zero when this driver does not know the field.
query() {
    local out
    out=$(smi --query-gpu="index,$1" --format=csv,noheader,nounits 2>/dev/null) || return 1
    printf '%s\n' "$out" | sed -e 's/^ *\([0-9][0-9]*\) *, *\(.*\)$/\1|\2/' -e 's/ *$//'
}

value_for() {  # value_for INDEX <<< "index|value lines"
    local idx=$1 row
    while IFS= read -r row; do
        if [ "${row%%|*}" = "$idx" ]; then printf '%s' "${row#*|}"; return 0; fi
    done
    return 1
}

is_hexmask() { [[ "$1" =~ ^0[xX][0-9a-fA-F]{1,16}$ ]]; }
na() {  # value missing or not supported on this card
    case "$1" in '' | '[N/A]' | 'N/A' | '[Not Supported]' | 'Not Supported' | '[Unknown Error]') return 0 ;; esac
    return 1
}

all_idx=()
if ! command -v nvidia-smi >/dev/null 2>&1; then
    if [ "$REQUIRE_GPU" -eq 1 ]; then
        line FAIL "no NVIDIA GPU: nvidia-smi is not on PATH and --require-gpu was given"
        finish NO_GPU "no NVIDIA GPU on this node (required); pick a GPU instance or fix the driver" 1
    fi
    finish NO_GPU "no NVIDIA GPU on this node (nvidia-smi not found on PATH); nothing to check" 0
fi

if ! listing=$(smi -L 2>&1); then
    [ -n "$listing" ] || listing="no answer within ${TIMEOUT}s (hung driver?)"
    line FAIL "nvidia-smi cannot reach the driver: $(printf '%s' "$listing" | head -n 1)"
    why="the GPU driver is not usable (mismatched driver/library, lost GPU, or a hung driver)"
    finish FAIL "$why; do not launch here" 1
fi

indices=$(query index) || indices=""
while IFS= read -r row; do
    [ -n "$row" ] && all_idx+=("${row%%|*}")
done <<< "$indices"
if [ "${#all_idx[@]}" -eq 0 ]; then
    line FAIL "nvidia-smi is present but lists no GPU"
    finish FAIL "no GPU visible to the driver (container started without GPUs?)" 1
fi
if [ "${#WANT_GPUS[@]}" -gt 0 ]; then
    for want in "${WANT_GPUS[@]}"; do
        printf '%s\n' "${all_idx[@]}" | grep -qx -- "$want" ||
            die_usage "GPU index $want does not exist (have: ${all_idx[*]})"
    done
    all_idx=("${WANT_GPUS[@]}")
fi

names=$(query name) || names=""
mem=$(query memory.used) || mem=""
memtot=$(query memory.total) || memtot=""
temps=$(query temperature.gpu) || temps=""
persist=$(query persistence_mode) || persist=""
ecc_unc=$(query ecc.errors.uncorrected.volatile.total) || ecc_unc=""
retired=$(query retired_pages.pending) || retired=""
remap_fail=$(query remapped_rows.failure) || remap_fail=""
remap_pend=$(query remapped_rows.pending) || remap_pend=""
reasons=$(query clocks_event_reasons.active) || reasons=$(query clocks_throttle_reasons.active) || reasons=""

for i in "${all_idx[@]}"; do
    tag="gpu$i"
    line OK "$tag $(value_for "$i" <<< "$names"): $(value_for "$i" <<< "$mem")/$(value_for "$i" <<< "$memtot") MiB used"

    t=$(value_for "$i" <<< "$temps")
    if na "$t" || ! is_uint "$t"; then
        line WARN "$tag temperature not reported (${t:-empty})"
    elif [ "$t" -ge "$TEMP_WARN" ]; then
        line WARN "$tag temperature ${t} C >= ${TEMP_WARN} C: near the throttle point; watch clocks during the run"
    else
        line OK "$tag temperature ${t} C"
    fi

    p=$(value_for "$i" <<< "$persist")
    if [ "$p" = "Disabled" ]; then
        line WARN "$tag persistence mode Disabled: each new process pays driver init; as root on a bare host run" \
            "'nvidia-smi -pm 1' (usually not allowed in containers)"
    elif na "$p"; then
        line OK "$tag persistence mode not reported"
    else
        line OK "$tag persistence mode $p"
    fi

    e=$(value_for "$i" <<< "$ecc_unc")
    if na "$e"; then
        line OK "$tag ECC counters not reported (ECC off or a consumer card)"
    elif is_uint "$e" && [ "$e" -gt 0 ]; then
        line FAIL "$tag $e uncorrected ECC errors since the last driver load: results may be corrupt; re-rent" \
            "another box (or reset the GPU on your own hardware)"
    else
        line OK "$tag uncorrected ECC errors: ${e:-0}"
    fi

    r=$(value_for "$i" <<< "$retired")
    [ "$r" = "Yes" ] && line WARN "$tag retired pages pending: a GPU reset or reboot is needed to apply them"
    f=$(value_for "$i" <<< "$remap_fail")
    [ "$f" = "Yes" ] && line FAIL "$tag row remapping FAILED: memory cannot be repaired; do not train on this GPU"
    rp=$(value_for "$i" <<< "$remap_pend")
    [ "$rp" = "Yes" ] && line WARN "$tag row remap pending: reset the GPU (or reboot) before a long run"

    m=$(value_for "$i" <<< "$reasons")
    is_hexmask "$m" || m="unreadable:${m:-empty}"
    case "$m" in
        0x* | 0X*)
            active=""
            (( m & 0x08 )) && active="$active HW_slowdown"
            (( m & 0x40 )) && active="$active HW_thermal"
            (( m & 0x80 )) && active="$active HW_power_brake"
            if [ -n "$active" ]; then
                line FAIL "$tag clocks held down by hardware:$active (mask $m): expect a large slowdown; re-rent or" \
                    "fix cooling/power"
            elif (( m & 0x20 )); then
                line WARN "$tag software thermal slowdown active (mask $m): the card is running hot"
            else
                line OK "$tag no thermal or power-brake slowdown (mask $m)"
            fi
            ;;
        *) line WARN "$tag clock slowdown reasons not reported (${m#unreadable:})" ;;
    esac
done

if apps=$(smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null); then
    apps=$(printf '%s\n' "$apps" | sed '/^ *$/d')
    if [ -n "$apps" ]; then
        n=$(printf '%s\n' "$apps" | wc -l | tr -d ' ')
        line WARN "$n compute process(es) already hold GPU memory: $(printf '%s' "$apps" | tr '\n' ';' | tr -s ' ')" \
            "— check with reap_vram_zombies.sh before launching"
    else
        line OK "no compute processes on the GPUs"
    fi
else
    line WARN "could not list compute processes"
fi

if klog=$(bounded dmesg 2>/dev/null) && [ -n "$klog" ]; then
    xids=$(printf '%s\n' "$klog" | grep 'NVRM: Xid' || true)
    if [ -z "$xids" ]; then
        line OK "no NVRM Xid lines in the kernel log"
    else
        codes=$(printf '%s\n' "$xids" | sed -n 's/.*NVRM: Xid ([^)]*): *\([0-9][0-9]*\).*/\1/p' | sort -n | uniq -c |
            awk '{printf "%s%s(x%s)", sep, $2, $1; sep=" "}')
        hard=""
        for c in $(printf '%s\n' "$xids" | sed -n 's/.*NVRM: Xid ([^)]*): *\([0-9][0-9]*\).*/\1/p' | sort -un); do
            case "$c" in 48 | 62 | 64 | 74 | 79 | 95 | 119 | 120) hard="$hard $c" ;; esac
        done
        last=$(printf '%s\n' "$xids" | tail -n 1 | cut -c1-160)
        if [ -n "$hard" ]; then
            line FAIL "kernel log has hardware Xid codes:$hard (all: $codes); last: $last"
        else
            line WARN "kernel log has Xid codes $codes (usually application faults); last: $last"
        fi
    fi
else
    line WARN "kernel log unreadable (not root, or kernel.dmesg_restrict=1): Xid scan skipped;" \
        "try 'sudo dmesg | grep -i xid'"
fi

case "$STATUS" in
    FAIL) finish FAIL "$FAILS failing check(s): do not start a long run on this box" 1 ;;
    WARN) finish WARN "usable; $WARNS warning(s) above are worth a look" 0 ;;
    *) finish OK "all checks passed on GPU(s) ${all_idx[*]}" 0 ;;
esac
