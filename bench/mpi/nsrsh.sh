#!/bin/sh
# nsrsh [ssh options] HOST CMD... (written by inc-bench): the rsh agent Open MPI uses to
# start orted on an emulated host; runs the command words with sh -c, as sshd would.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec "@DIR@/nsexec" "$host" sh -c "$*"
