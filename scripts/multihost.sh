#!/usr/bin/env bash
# Many machines on one: N "hosts" as network namespaces joined by a bridge,
# Open MPI launching across them, and network faults (docs/multihost.md).
#
#   scripts/multihost.sh up N            make hosts h0..h(N-1); prints the instance and an export line
#   scripts/multihost.sh exec HOST CMD   run CMD on a host (in its namespace, with its hostname)
#   scripts/multihost.sh mpirun ARGS     mpirun from the launch host over the instance's hostfile
#   scripts/multihost.sh cut|heal HOST           a host's link down / up
#   scripts/multihost.sh limit HOST RATE|unlimit HOST   tc tbf on the host's link, both directions
#   scripts/multihost.sh partition A B|unpartition A B  A and B cannot reach each other; the rest can
#   scripts/multihost.sh down [ID]       remove instance ID, or every instance no running test holds
#                                        (those `up` made, leftovers of killed runs)
#   scripts/multihost.sh test [--json-out F] [--keep] [--bench-seconds S] [--bench-reps N]
#                             [--phases "tcp ucx decode etcd_short"]
#                                        the multi-host test (scripts/multihost-test.sh); phase
#                                        `etcd` (ctest multihost_etcd) runs all three etcd faults
#                                        (scripts/multihost-test-etcd.sh)
#
# Every host h<i> is network namespace kvmesh-<ID>-h<i> with one link: a
# veth pair whose outer end is on bridge kvmb<ID> (in the root namespace,
# which has no address on it) and whose inner end is eth0 with address
# 10.213.0.(10+i)/24; each host has its own loopback. /etc/netns/<ns>/hosts
# names every host (ip netns exec mounts it over /etc/hosts). The last host
# is the launch host: mpirun runs there, like on a login node, and the
# hostfile ($MH_STATE/<ID>/hostfile, one slot per host) lists the others.
#
# The verbs other than up/down/test find the instance in $KVMESH_MULTIHOST
# (printed by `up`) or --id ID given first. Needs root (CAP_NET_ADMIN and
# CAP_SYS_ADMIN: namespaces, links, tc).
set -euo pipefail

MH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MH_STATE=/run/kvmesh-multihost
MH_SUBNET=10.213.0
MH_MASK=24

mh_die() {
  echo "multihost: $*" >&2
  exit 1
}

mh_ns() { echo "kvmesh-$1-h$2"; }        # ID I -> namespace
mh_veth() { echo "kvmv$1h$2"; }          # ID I -> the link's outer end (<= 15 chars)
mh_bridge() { echo "kvmb$1"; }
mh_addr() { echo "$MH_SUBNET.$((10 + $1))"; }
mh_index() {                             # h3 -> 3
  [[ $1 =~ ^h([0-9]+)$ ]] || mh_die "bad host \"$1\" (expected h0, h1, ...)"
  echo "${BASH_REMATCH[1]}"
}
mh_hosts() { cat "$MH_STATE/$1/hosts"; }

# Can this machine make network namespaces, links and bridges? Prints why not.
mh_can() {
  local probe="kvmesh-probe-$$"
  if [[ $(id -u) != 0 ]]; then
    echo "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    return 1
  fi
  for tool in ip tc unshare mpirun; do
    command -v "$tool" > /dev/null || {
      echo "$tool is not installed"
      return 1
    }
  done
  local err
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "ip netns add failed: $err"
    return 1
  fi
  if ! err=$(ip -n "$probe" link add kvmprobe0 type veth peer name kvmprobe1 2>&1 &&
    ip -n "$probe" link add kvmprobeb type bridge 2>&1); then
    ip netns del "$probe" 2> /dev/null || true
    echo "veth/bridge creation failed: $err"
    return 1
  fi
  if ! err=$(ip netns exec "$probe" unshare --uts true 2>&1); then
    ip netns del "$probe" 2> /dev/null || true
    echo "ip netns exec ... unshare --uts failed: $err"
    return 1
  fi
  if ! err=$(mkdir -p "/etc/netns/$probe" 2>&1 && rmdir "/etc/netns/$probe" 2>&1); then
    ip netns del "$probe" 2> /dev/null || true
    echo "/etc/netns is not writable: $err"
    return 1
  fi
  ip netns del "$probe"
  return 0
}

# up N [OWNER_PID]: prints the new instance's id.
mh_up() {
  local n=$1 owner=${2:-0}
  [[ $n =~ ^[0-9]+$ && $n -ge 2 && $n -le 32 ]] || mh_die "up: N must be 2..32"
  mkdir -p "$MH_STATE"
  local id
  while :; do
    id=$(printf '%04x' $((RANDOM % 65536)))
    mkdir "$MH_STATE/$id" 2> /dev/null && break
  done
  echo "$n" > "$MH_STATE/$id/hosts"
  echo "$owner" > "$MH_STATE/$id/owner"
  local br
  br=$(mh_bridge "$id")
  ip link add "$br" type bridge
  ip link set "$br" up
  local hosts_file
  hosts_file=$(mktemp)
  printf '127.0.0.1 localhost\n' > "$hosts_file"
  for ((i = 0; i < n; i++)); do printf '%s h%d\n' "$(mh_addr $i)" "$i" >> "$hosts_file"; done
  : > "$MH_STATE/$id/hostfile"
  for ((i = 0; i < n; i++)); do
    local ns veth
    ns=$(mh_ns "$id" $i)
    veth=$(mh_veth "$id" $i)
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip -n "$ns" addr add "$(mh_addr $i)/$MH_MASK" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    cp "$hosts_file" "/etc/netns/$ns/hosts"
    # The launch host is not a compute host: ranks go to h0..h(N-2) in order.
    ((i < n - 1)) && echo "h$i slots=1" >> "$MH_STATE/$id/hostfile"
  done
  rm -f "$hosts_file"
  # The bridge forwards once every port is up; wait until h0 reaches the last host.
  local last=$((n - 1))
  for ((t = 0; t < 100; t++)); do
    local answer
    answer=$(ip netns exec "$(mh_ns "$id" $last)" bash -c "exec 3<>/dev/tcp/$(mh_addr 0)/9" 2>&1 || true)
    [[ $answer == *refused* ]] && break
    sleep 0.05
  done
  echo "$id"
}

# down ID: kills what still runs on its hosts, removes namespaces, links, files.
mh_down_one() {
  local id=$1 n
  [[ -d $MH_STATE/$id ]] || return 0
  n=$(cat "$MH_STATE/$id/hosts" 2> /dev/null || echo 0)
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(mh_ns "$id" $i)
    if [[ -e /run/netns/$ns ]]; then
      # Only processes inside this instance's namespaces: nothing else is touched.
      local pid
      for pid in $(ip netns pids "$ns" 2> /dev/null || true); do kill -9 "$pid" 2> /dev/null || true; done
    fi
  done
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(mh_ns "$id" $i)
    if [[ -e /run/netns/$ns ]]; then ip netns del "$ns" 2> /dev/null || true; fi
    rm -rf "/etc/netns/$ns"
    ip link del "$(mh_veth "$id" $i)" 2> /dev/null || true
  done
  ip link del "$(mh_bridge "$id")" 2> /dev/null || true
  rm -rf "${MH_STATE:?}/$id"
}

# down with no id: every instance no running `test` holds (owner 0: made by
# `up`; or an owner process that is gone: a killed run), and namespaces and
# links of our naming that no instance records.
# mh_down_stale tests: only the leftovers of tests (owner gone), not `up`'s.
mh_down_stale() {
  local only_tests=${1:-} d id owner
  for d in "$MH_STATE"/*/; do
    [[ -d $d ]] || continue
    id=$(basename "$d")
    owner=$(cat "$d/owner" 2> /dev/null || echo 0)
    if [[ $owner != 0 ]] && kill -0 "$owner" 2> /dev/null; then
      [[ -z $only_tests ]] && echo "multihost: instance $id is in use by pid $owner: kept" >&2
      continue
    fi
    [[ -n $only_tests && $owner == 0 ]] && continue
    mh_down_one "$id"
    echo "multihost: removed instance $id" >&2
  done
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}' | grep -E '^kvmesh-[0-9a-f]{4}-h[0-9]+$' || true); do
    id=${ns#kvmesh-}
    id=${id%%-*}
    [[ -d $MH_STATE/$id ]] && continue
    local pid
    for pid in $(ip netns pids "$ns" 2> /dev/null || true); do kill -9 "$pid" 2> /dev/null || true; done
    ip netns del "$ns" 2> /dev/null || true
    rm -rf "/etc/netns/$ns"
    echo "multihost: removed orphan namespace $ns" >&2
  done
  local link
  for link in $(ip -o link show 2> /dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E '^kvm(b[0-9a-f]{4}|v[0-9a-f]{4}h[0-9]+)$' || true); do
    id=${link:4:4}
    [[ -d $MH_STATE/$id ]] && continue
    ip link del "$link" 2> /dev/null || true
    echo "multihost: removed orphan link $link" >&2
  done
}

# exec ID HOST CMD...: CMD on HOST (its network namespace, its hostname).
# mh_exec_argv sets MH_ARGV to that command line instead, for a caller that
# runs it in the background (then $! is CMD's own pid: ip, unshare and sh
# each exec the next).
mh_exec_argv() {
  local id=$1 host=$2
  shift 2
  local i
  i=$(mh_index "$host")
  # shellcheck disable=SC2016 # $0 and $@ are the inner shell's
  MH_ARGV=(ip netns exec "$(mh_ns "$id" "$i")" unshare --uts -- /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@")
}
mh_exec() {
  mh_exec_argv "$@"
  "${MH_ARGV[@]}"
}

mh_launch_host() { echo "h$(($(mh_hosts "$1") - 1))"; }

# mpirun ID ARGS...: mpirun on the launch host, its daemons started on the
# other hosts through the rsh agent (scripts/multihost-rsh.sh); the
# hostfile lists h0..h(N-2), so rank r runs on h<r>. UCX_TLS=tcp for every rank: UCX would otherwise use shared memory
# (sysv, posix, cma) between the namespaces, which share IPC, /dev/shm and
# process ids (one machine underneath), so a test would not cross the network
# it means to. Both interfaces lists keep Open MPI to the hosts' links.
# mh_mpirun_argv sets MH_ARGV (see mh_exec_argv).
mh_mpirun_argv() {
  local id=$1
  shift
  local launch
  launch=$(mh_launch_host "$id")
  # odls_base_sigkill_timeout: after SIGTERM a rank gets 10 s (not Open MPI's
  # 1 s) to stop before SIGKILL; a node that says goodbye to a coordinator
  # stopping at the same time, on loaded cores, can need more than 1 s.
  # ASAN_OPTIONS: an ASan build's ranks unwind leak stacks in full, so they
  # reach Open MPI's libraries (scripts/lsan.supp); ignored by other builds.
  mh_exec_argv "$id" "$launch" env \
    KVMESH_MULTIHOST_NETNS_PREFIX="kvmesh-$id-" UCX_TLS=tcp \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
    mpirun --allow-run-as-root --oversubscribe \
    --hostfile "$MH_STATE/$id/hostfile" \
    --mca plm_rsh_agent "$MH_ROOT/scripts/multihost-rsh.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include "$MH_SUBNET.0/$MH_MASK" --mca btl_tcp_if_include "$MH_SUBNET.0/$MH_MASK" \
    --mca btl tcp,vader,self --mca odls_base_sigkill_timeout 10 -x UCX_TLS "$@"
}
mh_mpirun() {
  mh_mpirun_argv "$@"
  "${MH_ARGV[@]}"
}

# Faults. A cut is the host's link down (the outer end of its veth): the
# host's packets go nowhere, its TCP connections stall (no reset), as when a
# cable is pulled. A partition of A and B gives each a permanent neighbour
# entry for the other with a MAC no one has: their frames are dropped by the
# bridge, silently, while both still reach every other host.
mh_cut() { ip link set "$(mh_veth "$1" "$(mh_index "$2")")" down; }
mh_heal() { ip link set "$(mh_veth "$1" "$(mh_index "$2")")" up; }
mh_limit() {   # ID HOST RATE (tc units: 1gbit, 500mbit)
  local i veth ns
  i=$(mh_index "$2")
  veth=$(mh_veth "$1" "$i")
  ns=$(mh_ns "$1" "$i")
  tc qdisc replace dev "$veth" root tbf rate "$3" burst 256kb latency 50ms
  tc -n "$ns" qdisc replace dev eth0 root tbf rate "$3" burst 256kb latency 50ms
}
mh_unlimit() {
  local i
  i=$(mh_index "$2")
  tc qdisc del dev "$(mh_veth "$1" "$i")" root 2> /dev/null || true
  tc -n "$(mh_ns "$1" "$i")" qdisc del dev eth0 root 2> /dev/null || true
}
mh_partition() {   # ID A B
  local a b
  a=$(mh_index "$2")
  b=$(mh_index "$3")
  ip -n "$(mh_ns "$1" "$a")" neigh replace "$(mh_addr "$b")" lladdr 02:00:5e:00:de:ad nud permanent dev eth0
  ip -n "$(mh_ns "$1" "$b")" neigh replace "$(mh_addr "$a")" lladdr 02:00:5e:00:de:ad nud permanent dev eth0
}
mh_unpartition() {
  local a b
  a=$(mh_index "$2")
  b=$(mh_index "$3")
  ip -n "$(mh_ns "$1" "$a")" neigh del "$(mh_addr "$b")" dev eth0 2> /dev/null || true
  ip -n "$(mh_ns "$1" "$b")" neigh del "$(mh_addr "$a")" dev eth0 2> /dev/null || true
}

mh_instance() {
  local id=${MH_ID:-${KVMESH_MULTIHOST:-}}
  [[ -n $id ]] || mh_die "no instance: run \`$0 up N\` and export KVMESH_MULTIHOST, or pass --id ID"
  [[ -d $MH_STATE/$id ]] || mh_die "no instance $id (see $MH_STATE)"
  echo "$id"
}

mh_main() {
  MH_ID=
  if [[ ${1:-} == --id ]]; then
    MH_ID=$2
    shift 2
  fi
  local verb=${1:-}
  [[ -n $verb ]] && shift
  case $verb in
    up)
      local why
      why=$(mh_can) || mh_die "cannot make hosts here: $why"
      local id
      id=$(mh_up "${1:-4}")
      echo "multihost: instance $id: hosts h0..h$(($(mh_hosts "$id") - 1)) at $MH_SUBNET.10.., hostfile $MH_STATE/$id/hostfile" >&2
      echo "export KVMESH_MULTIHOST=$id"
      ;;
    down)
      if [[ -n ${1:-$MH_ID} ]]; then mh_down_one "${1:-$MH_ID}"; else mh_down_stale; fi
      ;;
    exec)
      mh_exec_argv "$(mh_instance)" "$@"
      exec "${MH_ARGV[@]}"
      ;;
    mpirun)
      mh_mpirun_argv "$(mh_instance)" "$@"
      exec "${MH_ARGV[@]}"
      ;;
    cut | heal | limit | unlimit | partition | unpartition) "mh_$verb" "$(mh_instance)" "$@" ;;
    addr) mh_addr "$(mh_index "$1")" ;;
    can) mh_can ;;
    test) source "$MH_ROOT/scripts/multihost-test.sh" && mh_test "$@" ;;
    *)
      sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then mh_main "$@"; fi
