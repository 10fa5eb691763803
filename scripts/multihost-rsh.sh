#!/usr/bin/env bash
# The rsh agent Open MPI uses to start its daemons on the "hosts" of a
# scripts/multihost.sh instance (docs/multihost.md):
#
#   mpirun --mca plm_rsh_agent scripts/multihost-rsh.sh --hostfile H ...
#
# Open MPI runs it as `AGENT HOST COMMAND...`, COMMAND being a shell command
# line (it assumes the remote shell is sh-like, as with ssh). HOST is a name
# of the hostfile (h0, h1, ...); the agent runs COMMAND on that host: inside
# the host's network namespace ($KVMESH_MULTIHOST_NETNS_PREFIX + HOST) and a
# UTS namespace of its own whose hostname is HOST, so the daemon and its
# ranks see the host's address, its loopback and its name, like ssh into a
# machine would give them. Everything else (files, the build tree) is shared,
# as on a cluster with a shared file system.
set -euo pipefail

# ssh-style options Open MPI or a user may pass before the host: ignored.
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -l | -p | -o | -i) shift 2 ;;
    *) shift ;;
  esac
done
if [[ $# -lt 2 ]]; then
  echo "usage: $0 HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
prefix=${KVMESH_MULTIHOST_NETNS_PREFIX:?KVMESH_MULTIHOST_NETNS_PREFIX is not set (scripts/multihost.sh exports it)}
ns=$prefix$host
if [[ ! -e /run/netns/$ns ]]; then
  echo "multihost-rsh: no host \"$host\" (network namespace $ns does not exist)" >&2
  exit 255
fi
# As ssh does: the remaining words form one command line for the remote shell.
# shellcheck disable=SC2016 # $0 and $1 are the inner shell's
exec ip netns exec "$ns" unshare --uts -- /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*"
