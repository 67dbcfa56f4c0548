#!/usr/bin/env bash
# setup-china-mirrors.sh — point Hugging Face, pip and conda caches at mirrors and the data disk, for a
# node behind the GFW (or any box where huggingface.co / pypi.org are slow). SOURCE it; it only exports.
#
# Usage:
#   . scripts/node/setup-china-mirrors.sh            # in bash: export the settings into THIS shell
#   . scripts/node/setup-china-mirrors.sh --check    # ...then test that the endpoints answer
#   bash scripts/node/setup-china-mirrors.sh --check # executed: apply in a child shell and test only
#   bash scripts/node/setup-china-mirrors.sh --check --json   # ...and print the result as one JSON object
#   Quiet: pass --quiet, or set RGT_QUIET=1. Pick the pip mirror with RGT_PIP_MIRROR=tuna|aliyun|ustc.
#
# Options:
#   --check      after applying, test that HF_ENDPOINT and PIP_INDEX_URL answer (curl, else wget; each
#                probe has a hard timeout of RGT_CHECK_TIMEOUT seconds, default 6)
#   --quiet      say nothing on stderr (same as RGT_QUIET=1)
#   --json       with --check: print {"status": "OK"|"FAIL", "endpoints": [{"url", "ok", "http_status"}]}
#                on stdout instead of the OK/FAIL lines (URLs masked as below)
#   -h, --help   this text (executed only)
#
# What it sets — each one ONLY when it is not already set, so sourcing twice changes nothing more and a
# value you exported yourself always wins:
#   HF_ENDPOINT=https://hf-mirror.com   (must be exported before python imports huggingface_hub)
#   HF_HUB_DISABLE_XET=1                (the Xet transfer path does not go through an HF_ENDPOINT mirror)
#   HF_HOME, MODELSCOPE_CACHE, PIP_CACHE_DIR, CONDA_PKGS_DIRS under $DATA_DIR   (only when DATA_DIR is set)
#   PIP_INDEX_URL=<mirror>/simple       (Tsinghua TUNA by default)
#   no_proxy and NO_PROXY: only when http_proxy/https_proxy (any case) is set — adds localhost, 127.0.0.1
#   and the mirror hosts, keeping existing entries, so the proxy you added for one site does not
#   carry the domestic mirrors overseas. Nothing is touched when no proxy is set.
# conda channels are not changed (they live in ~/.condarc); never point pytorch-nightly at a mirror.
# Values are printed with any user:password@ part masked; proxy values are never printed.
#
# When sourced, arguments other than --check/--quiet/--json are ignored: they may be the caller's own.
#
# Exit codes (return codes when sourced): 0 applied (and, with --check, every endpoint answered); 1 --check
# found an endpoint that did not answer (no curl or wget is also a 1, said per endpoint); 2 executed without
# --check (it must be sourced to have any effect), or bad usage (one line "setup-china-mirrors.sh: error: ...").

if (return 0 2>/dev/null); then _rgt_cm_sourced=1; else _rgt_cm_sourced=0; fi

_rgt_cm_say() {
    if [ "${_rgt_cm_quiet:-0}" != 1 ]; then printf '[mirrors] %s\n' "$*" >&2; fi
}

_rgt_cm_mask() {  # hide user:password@ in a URL
    case "$1" in
        *://*@*) printf '%s://***@%s' "${1%%://*}" "${1#*@}" ;;
        *) printf '%s' "$1" ;;
    esac
}

_rgt_cm_host() {  # host part of a URL, without credentials or port
    local h=${1#*://}
    h=${h%%/*}; h=${h##*@}; h=${h%%:*}
    printf '%s' "$h"
}

_rgt_cm_default() {  # _rgt_cm_default NAME VALUE — export NAME=VALUE unless NAME is already non-empty
    local current
    current=${!1:-}
    if [ -n "$current" ]; then
        export "${1?}"
        _rgt_cm_say "$1 kept: $(_rgt_cm_mask "$current")"
    else
        export "$1=$2"
        _rgt_cm_say "$1 set: $(_rgt_cm_mask "$2")"
    fi
}

_rgt_cm_add_no_proxy() {  # merge localhost, loopback and the given hosts into no_proxy and NO_PROXY
    local merged="" item host
    for item in $(printf '%s,%s' "${no_proxy:-}" "${NO_PROXY:-}" | tr ',' ' ') localhost 127.0.0.1 "$@"; do
        host=$(printf '%s' "$item" | tr -d '[:space:]')
        [ -n "$host" ] || continue
        case ",$merged," in *",$host,"*) ;; *) merged="${merged:+$merged,}$host" ;; esac
    done
    export no_proxy="$merged" NO_PROXY="$merged"
}

_rgt_cm_apply() {
    local pip_url hosts h
    _rgt_cm_default HF_ENDPOINT https://hf-mirror.com
    _rgt_cm_default HF_HUB_DISABLE_XET 1
    case "${HF_HUB_DISABLE_XET}" in
        1 | [Tt][Rr][Uu][Ee] | [Yy][Ee][Ss] | [Oo][Nn]) ;;
        *) _rgt_cm_say "note: HF_HUB_DISABLE_XET=${HF_HUB_DISABLE_XET} keeps Xet on; Xet downloads skip the mirror" ;;
    esac
    if [ -n "${DATA_DIR:-}" ]; then
        _rgt_cm_default HF_HOME "$DATA_DIR/hf"
        _rgt_cm_default MODELSCOPE_CACHE "$DATA_DIR/modelscope"
        _rgt_cm_default PIP_CACHE_DIR "$DATA_DIR/cache/pip"
        _rgt_cm_default CONDA_PKGS_DIRS "$DATA_DIR/cache/conda-pkgs"
        mkdir -p "$HF_HOME" "$MODELSCOPE_CACHE" "$PIP_CACHE_DIR" "$CONDA_PKGS_DIRS" 2>/dev/null ||
            _rgt_cm_say "warning: could not create cache dirs under $DATA_DIR"
    else
        _rgt_cm_say "DATA_DIR not set: caches stay where they are (set DATA_DIR to put them on the data disk)"
    fi
    case "${RGT_PIP_MIRROR:-tuna}" in
        aliyun) pip_url=https://mirrors.aliyun.com/pypi/simple ;;
        ustc) pip_url=https://pypi.mirrors.ustc.edu.cn/simple ;;
        *) pip_url=https://pypi.tuna.tsinghua.edu.cn/simple ;;
    esac
    _rgt_cm_default PIP_INDEX_URL "$pip_url"
    if [ -n "${http_proxy:-}${https_proxy:-}${HTTP_PROXY:-}${HTTPS_PROXY:-}" ]; then
        hosts=""
        for h in "$(_rgt_cm_host "$HF_ENDPOINT")" "$(_rgt_cm_host "$PIP_INDEX_URL")"; do
            case "$h" in '' | huggingface.co | pypi.org) ;; *) hosts="$hosts $h" ;; esac
        done
        # shellcheck disable=SC2086  # $hosts is a space-separated list of host names
        _rgt_cm_add_no_proxy $hosts
        _rgt_cm_say "proxy is set (value not shown): no_proxy/NO_PROXY now exempt $no_proxy"
    fi
}

_rgt_cm_bounded() {  # _rgt_cm_bounded SECONDS CMD... — a hard time limit on top of the tool's own
    if command -v timeout >/dev/null 2>&1; then timeout -k 2 "$@"; else shift; "$@"; fi
}

_rgt_cm_probe() {  # _rgt_cm_probe URL SECONDS — prints the HTTP status, non-zero when there is no answer
    local code
    if command -v curl >/dev/null 2>&1; then
        code=$(_rgt_cm_bounded "$(( ${2%.*} + 3 ))" curl -sS -o /dev/null -I -L --max-redirs 3 -m "$2" \
            -w '%{http_code}' "$1" 2>/dev/null) || code=""
    elif command -v wget >/dev/null 2>&1; then
        code=$(_rgt_cm_bounded "$(( ${2%.*} + 3 ))" wget -q -S --spider --max-redirect=3 -T "$2" -t 1 "$1" 2>&1 |
            awk '$1 ~ /^HTTP\// { code = $2 } END { print code }') || code=""
    else
        printf 'no curl or wget'
        return 1
    fi
    printf '%s' "${code:-none}"
    case "$code" in [1-4][0-9][0-9]) return 0 ;; *) return 1 ;; esac
}

_rgt_cm_jstr() {  # _rgt_cm_jstr TEXT — a JSON string literal (other control characters become spaces)
    local LC_ALL=C s=${1//\\/\\\\}
    s=${s//\"/\\\"}; s=${s//$'\t'/\\t}; s=${s//$'\n'/\\n}; s=${s//$'\r'/\\r}
    printf '"%s"' "${s//[$'\x01'-$'\x1f']/ }"
}

_rgt_cm_check() {
    local timeout=${RGT_CHECK_TIMEOUT:-6} url status bad=0 items="" sep="" ok
    for url in "$HF_ENDPOINT" "$PIP_INDEX_URL"; do
        if status=$(_rgt_cm_probe "$url" "$timeout"); then
            ok=true
            [ "${_rgt_cm_json:-0}" = 1 ] || printf 'OK   %s answered (HTTP %s)\n' "$(_rgt_cm_mask "$url")" "$status"
        else
            ok=false
            bad=1
            [ "${_rgt_cm_json:-0}" = 1 ] ||
                printf 'FAIL %s did not answer within %ss (%s): try another mirror, or check the proxy/no_proxy\n' \
                    "$(_rgt_cm_mask "$url")" "$timeout" "$status"
        fi
        case "$status" in [1-5][0-9][0-9]) ;; *) status="" ;; esac
        items+="$sep"$'\n    '"{\"url\": $(_rgt_cm_jstr "$(_rgt_cm_mask "$url")"), \"ok\": $ok,"
        items+=" \"http_status\": ${status:-null}}"
        sep=","
    done
    if [ "${_rgt_cm_json:-0}" = 1 ]; then
        [ "$bad" -eq 0 ] && ok=OK || ok=FAIL
        printf '{\n  "status": "%s",\n  "endpoints": [%s\n  ]\n}\n' "$ok" "$items"
    fi
    return "$bad"
}

_rgt_cm_main() {
    local mode=$1 check=0 arg
    shift
    _rgt_cm_quiet=${RGT_QUIET:-0}
    _rgt_cm_json=0
    for arg in "$@"; do
        case "$arg" in
            --check) check=1 ;;
            --quiet) _rgt_cm_quiet=1 ;;
            --json) _rgt_cm_json=1 ;;
            -h | --help)
                [ "$mode" = executed ] && sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
                return 0 ;;
            *)
                if [ "$mode" = executed ]; then
                    echo "setup-china-mirrors.sh: error: unknown argument: $arg (see --help)" >&2
                    return 2
                fi ;;
        esac
    done
    case "${RGT_PIP_MIRROR:-tuna}" in
        tuna | aliyun | ustc) ;;
        *)
            echo "setup-china-mirrors.sh: error: RGT_PIP_MIRROR must be tuna, aliyun or ustc, got '$RGT_PIP_MIRROR'" >&2
            return 2 ;;
    esac
    if [ "$check" -eq 1 ] && ! [[ "${RGT_CHECK_TIMEOUT:-6}" =~ ^[0-9]+([.][0-9]+)?$ && "${RGT_CHECK_TIMEOUT:-6}" =~ [1-9] ]]
    then
        echo "setup-china-mirrors.sh: error: RGT_CHECK_TIMEOUT must be a number of seconds > 0" >&2
        return 2
    fi
    if [ "$mode" = executed ] && [ "$check" -eq 0 ]; then
        echo "setup-china-mirrors.sh: error: source this file so the exports reach your shell:" \
            ". ${0} (or run it with --check to test reachability only)" >&2
        return 2
    fi
    _rgt_cm_apply
    if [ "$check" -eq 1 ]; then _rgt_cm_check; return $?; fi
    return 0
}

_rgt_cm_cleanup() {
    unset -f _rgt_cm_say _rgt_cm_mask _rgt_cm_host _rgt_cm_default _rgt_cm_add_no_proxy _rgt_cm_apply \
        _rgt_cm_bounded _rgt_cm_probe _rgt_cm_jstr _rgt_cm_check _rgt_cm_main _rgt_cm_cleanup
    unset _rgt_cm_quiet _rgt_cm_sourced _rgt_cm_json
}

if [ "$_rgt_cm_sourced" = 1 ]; then
    _rgt_cm_main sourced "$@"
    case $? in
        0) _rgt_cm_cleanup; return 0 ;;
        1) _rgt_cm_cleanup; return 1 ;;
        *) _rgt_cm_cleanup; return 2 ;;
    esac
fi
_rgt_cm_main executed "$@"
exit $?
