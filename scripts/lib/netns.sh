# Helpers shared by scripts/netns-up and scripts/netns-down (sourced, not executed).

NETNS_STATE_DIR="${INC_STATE_DIR:-/run/inc-emulator}"

netns_die() { echo "$(basename "$0"): $*" >&2; exit 1; }
netns_log() { echo "[$(basename "$0")] $*" >&2; }

netns_require_root() {
    [ "$(id -u)" = 0 ] || netns_die "must run as root (network namespaces and veths need CAP_NET_ADMIN)"
    command -v ip >/dev/null || netns_die "iproute2 (ip) is not installed"
}

netns_check_prefix() {
    [[ "$1" =~ ^[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?$ ]] \
        || netns_die "invalid prefix '$1': 1-16 chars of [a-z0-9], '-' inside"
}

netns_state_file() { echo "$NETNS_STATE_DIR/$1.state"; }

# Temporary veth names in the root namespace: 'ix' + 4 hex chars of the prefix's
# hash + a counter. Deterministic per prefix, so netns-down finds leftovers even
# without a state file.
netns_tmp_tag() { printf 'ix%s' "$(printf '%s' "$1" | cksum | awk '{printf "%04x", $1 % 65536}')"; }

# Find the inc-controller binary: $INC_CONTROLLER, PATH, then the repo's target/.
netns_find_controller() {
    local root="$1" c
    for c in "${INC_CONTROLLER:-}" "$(command -v inc-controller 2>/dev/null || true)" \
        "$root/target/release/inc-controller" "$root/target/debug/inc-controller"; do
        if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
    done
    if command -v cargo >/dev/null; then
        (cd "$root" && cargo build --quiet -p inc-controller >&2) || return 1
        echo "$root/target/debug/inc-controller"
        return 0
    fi
    return 1
}

# Table holding the ingress drops of switch ports (inc-bench's kernel-forwarding
# reference flushes its rules while it needs the kernel to receive on these ports).
NETNS_SWITCH_PORT_TABLE=inc_switch_ports

# netns_switch_port_no_kernel_rx NS IFACE: drop every frame arriving on a switch port at
# nftables ingress. The switch's packet sockets (AF_PACKET, libpcap, DPDK's af_packet
# PMD) and XDP see frames before that hook, so the switch is unaffected; what goes is
# the kernel's own IPv4 receive of every data frame (route lookup for an address it
# does not own, then a drop: IpInAddrErrors), measured at 4-8 % of a 64 MiB AllReduce.
# Without nft, or with INC_NETNS_KERNEL_RX=1 (to measure the difference), the kernel
# keeps doing that work and nothing else changes.
netns_switch_port_no_kernel_rx() {
    local ns="$1" ifn="$2" t="$NETNS_SWITCH_PORT_TABLE"
    command -v nft >/dev/null && [ "${INC_NETNS_KERNEL_RX:-0}" != 1 ] || return 0
    ip netns exec "$ns" nft add table netdev "$t"
    ip netns exec "$ns" nft add chain netdev "$t" "port_${ifn//[^A-Za-z0-9_]/_}" \
        "{ type filter hook ingress device \"$ifn\" priority 0; policy accept; }"
    ip netns exec "$ns" nft add rule netdev "$t" "port_${ifn//[^A-Za-z0-9_]/_}" drop
}
