#!/bin/bash
# inc-entrypoint: entrypoint of every INC image. Gives this container's interfaces the
# names, MACs and addresses of the topology, then runs the command (exec "$@").
#
# INC_ROLE        controller | switch | host (set by the image)
# INC_IFACES      space-separated LOCATOR=NAME,MAC,ADDR, written by
#                 `inc-controller export`:
#                   LOCATOR  the IPv4 address Docker gave the interface (compose),
#                            the subnet SUBNET/PREFIX of the network Docker picked
#                            the address from (swarm: stack deploy ignores fixed
#                            addresses), or the interface's name (containerlab names
#                            it already)
#                   NAME     final name: a switch port's name, a host's data interface,
#                            mgmt0
#                   MAC      MAC to set, or - to keep Docker's (ignored under
#                            INC_KEEP_MACS=1)
#                   ADDR     ip/prefix to configure, - for none (switch ports have no
#                            kernel address, so only the switch process answers ARP and
#                            the kernel never answers RoCE with ICMP), or docker to
#                            keep Docker's (Swarm's management network: others reach
#                            this container by its service name)
# INC_LINK_MTU    MTU of data interfaces (every NAME but mgmt0), if set
# INC_KEEP_MACS   1: keep Docker's MAC on every interface, and run a switch with its
#                 ports' actual MACs (--port SWITCH:PORT=PORT,mac=MAC appended to the
#                 command), which it reports to the controller, whose rules then use
#                 them. Default: 1 when the interfaces are located by subnet (Swarm: an
#                 overlay carries frames between nodes only to MACs Docker gave its
#                 endpoints), else 0 (compose, containerlab: the topology's MACs).
# INC_IFACE_WAIT  seconds to wait for interfaces to appear (default 30; containerlab
#                 adds them after the container started)
# INCCL_TRANSPORT verbs: hosts create the Soft-RoCE device rxe0 on $INCCL_IFACE
# Credentials are files, never variables of the container: a switch presents
# /run/secrets/inc-switch-token (exported to inc-switch as INC_CONTROLLER_TOKEN by this
# script), a host /run/secrets/inc-host-token (read by inc-collective), the controller
# reads /run/secrets/inc-controller-token itself (serve --token-file).
set -euo pipefail

ME="inc-entrypoint[${HOSTNAME:-?}]"
log() { echo "$ME: $*" >&2; }
die() { log "$*"; exit 1; }

ROLE="${INC_ROLE:-}"
case "$ROLE" in controller|switch|host) ;; *) die "INC_ROLE must be controller, switch or host (got '$ROLE')" ;; esac
WAIT="${INC_IFACE_WAIT:-30}"

is_ipv4() { [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; }
is_cidr() { [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+/[0-9]+$ ]]; }
ip2int() { local IFS=.; set -- $1; echo $((($1 << 24) + ($2 << 16) + ($3 << 8) + $4)); }

# Current name of the interface LOCATOR points at (empty if not there yet).
find_iface() {
    local loc="$1"
    if is_ipv4 "$loc"; then
        ip -o -4 addr show | awk -v a="$loc" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}'
    elif is_cidr "$loc"; then
        # The interface with an address inside the subnet; two would be a broken export.
        local net mask dev addr found=""
        mask=$(((0xffffffff << (32 - ${loc#*/})) & 0xffffffff))
        net=$(($(ip2int "${loc%/*}") & mask))
        while read -r _ dev _ addr _; do
            [ $(($(ip2int "${addr%/*}") & mask)) = "$net" ] || continue
            [ -z "$found" ] || die "interfaces $found and $dev both have an address in $loc"
            found="$dev"
        done < <(ip -o -4 addr show)
        echo "$found"
    elif [ -e "/sys/class/net/$loc" ]; then
        echo "$loc"
    fi
}

declare -a CUR=() NAME=() MAC=() ADDR=()
KEEP_MACS="${INC_KEEP_MACS:-}"
for entry in ${INC_IFACES:-}; do
    loc="${entry%%=*}"
    IFS=, read -r name mac addr <<<"${entry#*=}"
    [ -n "$loc" ] && [ -n "$name" ] && [ -n "$mac" ] && [ -n "$addr" ] \
        || die "malformed INC_IFACES entry '$entry' (want LOCATOR=NAME,MAC,ADDR)"
    if [ -z "${INC_KEEP_MACS:-}" ] && is_cidr "$loc"; then KEEP_MACS=1; fi
    deadline=$((SECONDS + WAIT))
    cur="$(find_iface "$loc")"
    while [ -z "$cur" ]; do
        [ $SECONDS -lt $deadline ] || die "interface for $name (located by $loc) did not appear within ${WAIT}s; have: $(ls /sys/class/net | tr '\n' ' ')"
        sleep 0.2
        cur="$(find_iface "$loc")"
    done
    CUR+=("$cur"); NAME+=("$name"); MAC+=("$mac"); ADDR+=("$addr")
done

# Rename in two steps: a final name may be another interface's current name (eth0).
for i in "${!CUR[@]}"; do
    ip link set dev "${CUR[$i]}" down
    if [ "${CUR[$i]}" != "${NAME[$i]}" ]; then
        ip link set dev "${CUR[$i]}" name "inctmp$i"
        CUR[$i]="inctmp$i"
    fi
done
summary=()
for i in "${!CUR[@]}"; do
    dev="${NAME[$i]}"
    [ "${CUR[$i]}" = "$dev" ] || ip link set dev "${CUR[$i]}" name "$dev"
    if [ "$KEEP_MACS" = 1 ]; then
        MAC[$i]="$(cat "/sys/class/net/$dev/address")"
    elif [ "${MAC[$i]}" != - ]; then
        ip link set dev "$dev" address "${MAC[$i]}"
    fi
    if [ -n "${INC_LINK_MTU:-}" ] && [ "$dev" != mgmt0 ]; then
        ip link set dev "$dev" mtu "$INC_LINK_MTU"
    fi
    # Docker's carrier address goes and the topology's (if any) takes its place, unless
    # the entry keeps Docker's (recorded for the summary).
    case "${ADDR[$i]}" in
        docker) ADDR[$i]="$(ip -o -4 addr show dev "$dev" | awk '{print $4; exit}')" ;;
        -) ip -4 addr flush dev "$dev" ;;
        *) ip -4 addr flush dev "$dev" && ip addr add "${ADDR[$i]}" dev "$dev" ;;
    esac
    # veth leaves TX checksums to an offload that never happens for frames that stay
    # virtual; RoCE receivers drop such packets.
    ethtool -K "$dev" tx off >/dev/null 2>&1 || { [ "$ROLE" != host ] || die "ethtool -K $dev tx off failed"; }
    if [ "$ROLE" = switch ] && [ "$dev" != mgmt0 ] && command -v nft >/dev/null; then
        # Drop every data frame at nftables ingress, behind the switch's packet sockets
        # and XDP (which see it first): otherwise the kernel also receives each one,
        # looks up a route for an address it does not own and drops it, a few percent
        # of the switch's CPU. Same as scripts/netns-up.
        t=inc_switch_ports c="port_${dev//[^A-Za-z0-9_]/_}"
        { nft add table netdev $t &&
            nft add chain netdev $t "$c" "{ type filter hook ingress device \"$dev\" priority 0; policy accept; }" &&
            nft add rule netdev $t "$c" drop; } ||
            log "nftables ingress drop on $dev failed: the kernel keeps receiving its frames (slower, not wrong)"
    fi
    ip link set dev "$dev" up
    summary+=("$dev ${ADDR[$i]} ${MAC[$i]}")
done

if [ "$ROLE" = switch ]; then
    # The switch process is the data plane: a routing kernel would forward and answer
    # frames behind its back. Compose sets this with sysctls; containerlab nodes are
    # privileged, so it can be written here.
    f=/proc/sys/net/ipv4/ip_forward
    [ "$(cat $f)" = 0 ] || echo 0 >$f 2>/dev/null || true
    [ "$(cat $f)" = 0 ] || die "net.ipv4.ip_forward is 1 in this container and cannot be changed"
fi
{ echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; } 2>/dev/null || true

# The switch takes its ports' MACs from the topology unless told otherwise: with
# Docker's MACs kept, name each port with its interface's MAC (it reports them when it
# registers; the controller's rules use them). Only for `--switch NAME` without --port.
if [ "$ROLE" = switch ] && [ "$KEEP_MACS" = 1 ]; then
    sw="" has_port=0 prev=""
    for a in "$@"; do
        [ "$prev" = --switch ] && sw="$a"
        case "$a" in --switch=*) sw="${a#--switch=}" ;; --port|--port=*) has_port=1 ;; esac
        prev="$a"
    done
    if [ -n "$sw" ] && [ "$has_port" = 0 ]; then
        ports=()
        for i in "${!NAME[@]}"; do
            [ "${NAME[$i]}" = mgmt0 ] || ports+=(--port "$sw:${NAME[$i]}=${NAME[$i]},mac=${MAC[$i]}")
        done
        if [ "${#ports[@]}" -gt 0 ]; then
            set -- "$@" "${ports[@]}"
            log "switch $sw runs with Docker's MACs: ${ports[*]}"
        fi
    fi
fi

if [ "$ROLE" = switch ] && [ -z "${INC_CONTROLLER_TOKEN:-}" ] && [ -e /run/secrets/inc-switch-token ]; then
    INC_CONTROLLER_TOKEN="$(cat /run/secrets/inc-switch-token)" \
        || die "cannot read the switch credential /run/secrets/inc-switch-token"
    export INC_CONTROLLER_TOKEN
fi

if [ "$ROLE" = host ] && [ "${INCCL_TRANSPORT:-udp}" = verbs ]; then
    dev="${INCCL_IFACE:-eth0}"
    if ! rdma link show 2>/dev/null | grep -q "netdev $dev\b"; then
        [ -d /sys/module/rdma_rxe ] \
            || die "INCCL_TRANSPORT=verbs needs Soft-RoCE, but this kernel has no rdma_rxe module loaded (run 'modprobe rdma_rxe' on the Docker host, or use the userspace transport: unset INCCL_TRANSPORT)"
        rdma link add rxe0 type rxe netdev "$dev" || die "rdma link add rxe0 type rxe netdev $dev failed"
    fi
    log "Soft-RoCE: $(rdma link show | grep "netdev $dev\b")"
fi

# The controller trusts only a token file of its own user (inc-controller README). The
# secret is a bind mount owned by whoever exported the deployment: hand the controller a
# copy this container's user owns, and point the command line at it.
SECRET=/run/secrets/inc-controller-token
CONTROLLER_TOKEN_COPY=/run/inc-controller.token
if [ "$ROLE" = controller ] && [ -e "$SECRET" ] && [ ! -O "$SECRET" ]; then
    (umask 077 && cp "$SECRET" "$CONTROLLER_TOKEN_COPY") || die "cannot copy $SECRET"
    args=()
    for a in "$@"; do
        if [ "$a" = "$SECRET" ]; then args+=("$CONTROLLER_TOKEN_COPY"); else args+=("$a"); fi
    done
    set -- "${args[@]}"
fi

log "$ROLE ready: ${summary[*]:-no interfaces to configure}"
exec "$@"
