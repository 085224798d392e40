#!/bin/sh
# Point-to-point throughput of the userspace RoCEv2 transport across a veth pair
# between two network namespaces this script creates (and always removes).
#
#   sudo hosts/scripts/bench-veth.sh [--seconds S] [--mtu BYTES] [--bin PATH] [--pcap FILE]
#
# Default binary: target/release/inccl-p2p-bench (built if missing). With --pcap, the
# first 2000 frames on the receiving veth are captured (dumpcap) into FILE, so
# `inc-pcap check FILE` can verify the ICRC over the headers the kernel really sent.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
seconds=5
mtu=1024
bin=""
pcap=""
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --mtu) mtu=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --pcap) pcap=$2; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "bench-veth.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$bin" ]; then
    bin=${CARGO_TARGET_DIR:-$root/target}/release/inccl-p2p-bench
    [ -x "$bin" ] || cargo build --release -p inccl-hosts --bin inccl-p2p-bench --manifest-path "$root/Cargo.toml"
fi
[ "$(id -u)" = 0 ] || { echo "bench-veth.sh: needs root (network namespaces)" >&2; exit 1; }

a=inccl-p2p-a-$$
b=inccl-p2p-b-$$
out=$(mktemp)
cap=""
cleanup() {
    [ -n "$cap" ] && kill "$cap" 2>/dev/null
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    rm -f "$out"
}
trap cleanup EXIT INT TERM

ip netns add "$a"
ip netns add "$b"
ip link add veth-a netns "$a" mtu 9000 type veth peer name veth-b netns "$b" mtu 9000
ip -n "$a" addr add 10.250.0.1/30 dev veth-a
ip -n "$b" addr add 10.250.0.2/30 dev veth-b
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set veth-a up
ip -n "$b" link set veth-b up

if [ -n "$pcap" ]; then
    ip netns exec "$b" dumpcap -q -i veth-b -c 2000 -w "$pcap" 2>/dev/null &
    cap=$!
    sleep 1
fi
ip netns exec "$b" "$bin" recv --bind 10.250.0.2:4791 --peer 10.250.0.1 --seconds "$seconds" >"$out" 2>&1 &
rx=$!
sleep 0.5
ip netns exec "$a" "$bin" send --bind 10.250.0.1 --to 10.250.0.2:4791 --mtu "$mtu" --seconds "$seconds"
status=0
wait "$rx" || status=$?
cat "$out"
if [ -n "$cap" ]; then
    wait "$cap" || true
    cap=""
    echo "capture: $pcap"
fi
exit "$status"
