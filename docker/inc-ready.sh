#!/bin/bash
# inc-ready ADDR: healthcheck of the controller container. Succeeds once the controller
# at ADDR answers and every switch of its topology has registered.
set -uo pipefail
out="$(inc-controller status --controller "${1:?usage: inc-ready CONTROLLER_ADDR}" 2>&1)" || {
    echo "$out" >&2
    exit 1
}
if grep -q 'NOT CONNECTED' <<<"$out"; then
    grep 'NOT CONNECTED' <<<"$out" >&2
    exit 1
fi
grep -q '^switches:' <<<"$out"
