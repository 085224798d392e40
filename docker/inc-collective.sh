#!/bin/bash
# inc-collective: run one host program of this host container's rank and exit with its
# status (0 PASS, 1 FAIL: a wrong element, 2 error). The topology fixes rank, world
# size, rank 0's address and the controller (set by `inc-controller export`); the run
# is chosen by the environment or the options:
#
#   inc-collective [allreduce|reduce|broadcast|allgather|reducescatter|barrier] [--count N]
#                  [--dtype T[,T...]|all]
#                  [--op OP[,OP...]|all] [--root R] [--iters N] [--warmup N]
#
#   (types and operators as the host programs: inccl-allreduce --help; for AllGather
#   and ReduceScatter the count is per rank's block)
#
#   INC_COLLECTIVE (allreduce), INC_COUNT (65536), INC_DTYPE (int32), INC_OP (sum),
#   INC_ROOT (0), INC_ITERS (1), INC_WARMUP (0)
#
# Every element of every iteration is checked by the program; the result line ends in
# PASS or FAIL. Rank 0 presents the host credential from /run/secrets/inc-host-token
# (mounted by the exported compose/containerlab file) unless INC_CONTROLLER_TOKEN is set.
set -euo pipefail

die() { echo "inc-collective: $*" >&2; exit 2; }

collective="${INC_COLLECTIVE:-allreduce}"
count="${INC_COUNT:-65536}"
dtype="${INC_DTYPE:-int32}"
op="${INC_OP:-sum}"
root="${INC_ROOT:-0}"
iters="${INC_ITERS:-1}"
warmup="${INC_WARMUP:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        allreduce|reduce|broadcast|allgather|reducescatter|barrier) collective="$1"; shift ;;
        --count) count="${2:?}"; shift 2 ;;
        --dtype) dtype="${2:?}"; shift 2 ;;
        --op) op="${2:?}"; shift 2 ;;
        --root) root="${2:?}"; shift 2 ;;
        --iters) iters="${2:?}"; shift 2 ;;
        --warmup) warmup="${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$collective" in allreduce|reduce|broadcast|allgather|reducescatter|barrier) ;; *) die "unknown collective '$collective'" ;; esac
for v in INC_RANK INC_WORLD INC_MASTER; do
    [ -n "${!v:-}" ] || die "$v is not set (this container was not created from an exported compose or containerlab file)"
done

if [ -z "${INC_CONTROLLER_TOKEN:-}" ] && [ -e /run/secrets/inc-host-token ]; then
    INC_CONTROLLER_TOKEN="$(cat /run/secrets/inc-host-token)" \
        || die "cannot read the host credential /run/secrets/inc-host-token"
    export INC_CONTROLLER_TOKEN
fi

exec "inccl-$collective" "$INC_WORLD" "$INC_MASTER" "$INC_RANK" "$count" \
    --dtype "$dtype" --op "$op" --root "$root" --iters "$iters" --warmup "$warmup"
