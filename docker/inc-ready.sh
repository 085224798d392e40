#!/bin/bash
# inc-ready ADDR: healthcheck of the controller container. Succeeds once the controller
# at ADDR answers and every switch of its topology has registered. Asks with the host
# credential of the controller's own token file (mounted at /run/secrets).
set -uo pipefail
TOKEN_FILE=/run/secrets/inc-controller-token
# inc-entrypoint's own copy, when the mounted secret belongs to another user.
[ -e /run/inc-controller.token ] && TOKEN_FILE=/run/inc-controller.token
if [ -z "${INC_CONTROLLER_TOKEN:-}" ] && [ -e "$TOKEN_FILE" ]; then
    INC_CONTROLLER_TOKEN="$(inc-controller token --token-file "$TOKEN_FILE" --role host)" || exit 1
    export INC_CONTROLLER_TOKEN
fi
out="$(inc-controller status --controller "${1:?usage: inc-ready CONTROLLER_ADDR}" 2>&1)" || {
    echo "$out" >&2
    exit 1
}
if grep -q 'NOT CONNECTED' <<<"$out"; then
    grep 'NOT CONNECTED' <<<"$out" >&2
    exit 1
fi
grep -q '^switches:' <<<"$out"
