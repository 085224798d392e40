#!/bin/sh
# nsexec HOST CMD... (written by inc-bench): run CMD "on" emulated host HOST: in its
# network namespace, with its own hostname (UTS namespace), and with private /etc/hosts
# (the emulated hosts) and an empty /etc/resolv.conf bind-mounted in the private mount
# namespace `ip netns exec` creates. Without them every name lookup waits for a DNS
# server the namespaces cannot reach, and mpirun/orted start-up fails.
host=$1; shift
exec ip netns exec "@PREFIX@-$host" unshare --uts sh -c '
  hostname "$0" && mount --bind "$1/hosts" /etc/hosts &&
  mount --bind "$1/resolv.conf" /etc/resolv.conf || exit 125
  shift; exec "$@"' "$host" "@DIR@" "$@"
