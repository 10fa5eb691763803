# shellcheck shell=bash  # sourced by scripts/multihost.sh (no shebang)
# scripts/multihost-test-etcd.sh — the etcd phase of `scripts/multihost.sh
# test` (docs/multihost.md, "The etcd phase"), sourced through
# scripts/multihost-test.sh (its helpers and MT_* settings are used here).
#
# The control plane on etcd across the namespace hosts: a three-member etcd
# cluster (/usr/bin/etcd, Debian's etcd-server) on h1..h3, each member at an
# address of its own (10.213.0.10<i>, a second address on h<i>'s link) so that
# a coordinator can be cut off from etcd alone; `kvmesh coordinator`s on h0
# and the launch host, one leading by an etcd lease; nodes n0..n2 on h1..h3
# (`kvmesh node`, both coordinators listed). Under the load client (every byte
# compared), three faults, each while a node (n3) joins and three new clients
# start, and undone after:
#   leader_killed            the leading coordinator SIGKILLed (restarted after)
#   etcd_member_killed       etcd's raft leader SIGKILLed (restarted after)
#   coordinator_partitioned  the leading coordinator's host cannot reach any etcd
#                            member (a neighbour entry with a MAC no one has per
#                            member address: its packets go nowhere)
# Written to $MT_WORK/etcd.json: coordinators, etcd members, leader changes,
# failover_ms per fault (from the fault to the next map a coordinator
# published, by its map_published event), the clients started during the
# faults and how many succeeded, each fault's hit rate (64 blocks put just
# before it, read just before and once recovered: equal), and the published
# epochs (each used once, each following the one before).
# shellcheck disable=SC2153,SC2034

MT_ETCD_MEMBERS="1 2 3"
MT_ETCD_LEASE_MS=2000
# A node's registration (renewed every third of dead_after_ms) outlives the
# time a cut-off coordinator takes to send its nodes on (lease_ms after its
# last round that reached etcd, then 503s): they re-register through the
# other coordinator before their keys expire, so the map does not change
# (docs/launch.md: dead_after_ms at least 3 x lease_ms).
MT_ETCD_DEAD_AFTER_MS=6000

mt_etcd_addr() { echo "$MH_SUBNET.$((100 + $1))"; }
mt_etcd_endpoints() {
  local i out=""
  for i in $MT_ETCD_MEMBERS; do out+="${out:+,}$(mt_etcd_addr "$i"):2379"; done
  echo "$out"
}
mt_etcd_coordinator_hosts() { echo "0 $((MT_HOSTS - 1))"; }
mt_etcd_coordinators() {
  local h out=""
  for h in $(mt_etcd_coordinator_hosts); do out+="${out:+,}$(mh_addr "$h"):7070"; done
  echo "$out"
}
mt_etcd_on_launch() { mh_exec "$MT_ID" "h$((MT_HOSTS - 1))" "$@"; }

# The cluster config on stdout, one file for every coordinator (each gets its
# own address with `kvmesh coordinator --host`; $.coordinator.host is h<H>'s):
# the TCP phase's cluster, a fourth node n3 on h3 (it joins during faults),
# both coordinators listed and the control plane in the etcd cluster.
mt_etcd_config() {
  mt_config tcp | python3 -c '
import json, sys
c = json.load(sys.stdin)
host, coordinators, endpoints, n3_host, lease_ms, dead_ms = sys.argv[1:7]
c["name"] = "multihost-etcd"
n3 = dict(c["nodes"][-1], id="n3", host=n3_host, ports={"data": 7110, "http": 7111, "resp": 7112})
c["nodes"].append(n3)
# Room for several seconds of the load: the hit sets are not evicted while a fault lasts.
for n in c["nodes"]:
    n["memory"] = {"device": "256MiB", "host": "256MiB"}
c["coordinator"].update(host=host, addresses=coordinators.split(","), dead_after_ms=int(dead_ms),
                        etcd={"endpoints": endpoints.split(","), "lease_ms": int(lease_ms), "request_timeout_ms": 500})
print(json.dumps(c, indent=1))' "$(mh_addr "$1")" "$(mt_etcd_coordinators)" "$(mt_etcd_endpoints)" "$(mh_addr 3)" \
    "$MT_ETCD_LEASE_MS" "$MT_ETCD_DEAD_AFTER_MS"
}

declare -A MT_ETCD_PID MT_ETCD_CPID MT_ETCD_NPID
MT_ETCD_STARTS=0

mt_etcd_start_member() {   # I: member e<I> on h<I> (a restart keeps its data directory)
  local i=$1 a peers="" j
  a=$(mt_etcd_addr "$i")
  for j in $MT_ETCD_MEMBERS; do peers+="${peers:+,}e$j=http://$(mt_etcd_addr "$j"):2380"; done
  mt_bg "$MT_WORK/etcd$i.$((MT_ETCD_STARTS++))" "h$i" /usr/bin/etcd --name "e$i" --data-dir "$MT_WORK/etcd$i.data" \
    --listen-client-urls "http://$a:2379" --advertise-client-urls "http://$a:2379" \
    --listen-peer-urls "http://$a:2380" --initial-advertise-peer-urls "http://$a:2380" \
    --initial-cluster "$peers" --initial-cluster-token "kvmesh-$MT_ID" --initial-cluster-state new > /dev/null
  MT_ETCD_PID[$i]=${MT_PIDS[-1]}
}

mt_etcd_wait_healthy() {   # SECONDS: every member answers
  local end=$((SECONDS + $1))
  while ((SECONDS < end)); do
    mt_etcd_on_launch etcdctl --endpoints "$(mt_etcd_endpoints)" --dial-timeout 1s --command-timeout 1s \
      endpoint health > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

mt_etcd_start_coordinator() {   # H
  local h=$1 log="$MT_WORK/coordinator-h$1.$((MT_ETCD_STARTS++))"
  mt_bg "$log" "h$h" "$MT_KVMESH" coordinator --config "$MT_WORK/etcd-cluster.json" --host "$(mh_addr "$h")" > /dev/null
  MT_ETCD_CPID[$h]=${MT_PIDS[-1]}
  mt_wait_line "$log.out" '"event":"listening"' 20 || mt_fail "coordinator on h$h did not listen in 20 s"
}

mt_etcd_launch_node() {   # I: node n<I>, on h<I+1> (n3 on h3); its log in MT_ETCD_NLOG
  local i=$1 h=$(($1 + 1))
  ((h > 3)) && h=3
  MT_ETCD_NLOG="$MT_WORK/etcd-node$i.$((MT_ETCD_STARTS++))"
  mt_bg "$MT_ETCD_NLOG" "h$h" "$MT_KVMESH" node --config "$MT_WORK/etcd-cluster.json" --id "n$i" > /dev/null
  MT_ETCD_NPID[$i]=${MT_PIDS[-1]}
}
mt_etcd_start_node() {   # I: launched, and listening
  mt_etcd_launch_node "$1"
  mt_wait_line "$MT_ETCD_NLOG.out" '"event":"listening"' 20 || mt_fail "node n$1 did not listen in 20 s"
}

# Polls the coordinators from the launch host (one Python process, every
# 50 ms) for up to SECONDS: `leader` prints the host index of the one whose
# /stats says it leads; `map N` returns once one answers a map of N nodes.
mt_etcd_poll() {
  local what=$1 arg=$2 seconds=$3 hosts="" h
  for h in $(mt_etcd_coordinator_hosts); do hosts+="${hosts:+,}$h=$(mh_addr "$h")"; done
  mt_etcd_on_launch python3 -c '
import json, sys, time, urllib.request
what, arg, end, hosts = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3]), sys.argv[4].split(",")
def get(addr, path):
    try:
        return json.loads(urllib.request.urlopen("http://%s:7070%s" % (addr, path), timeout=0.5).read())
    except Exception:
        return None
while time.monotonic() < end:
    for h in hosts:
        index, addr = h.split("=")
        if what == "leader":
            s = get(addr, "/stats")
            if s and s.get("etcd", {}).get("leader"):
                print(index)
                sys.exit(0)
        else:
            m = get(addr, "/map")
            if m and len(m.get("nodes", [])) == int(arg):
                sys.exit(0)
    time.sleep(0.05)
sys.exit(1)' "$what" "$arg" "$seconds" "$hosts"
}
mt_etcd_leader() { mt_etcd_poll leader - "$1"; }   # SECONDS -> the host index of the leading coordinator
mt_etcd_wait_map() { mt_etcd_poll map "$1" "$2"; }   # N SECONDS: some coordinator answers a map of N nodes

# Marks the start of fault NAME (its time, for the failover's measure).
mt_etcd_mark() {
  MT_ETCD_FAULT=$1
  MT_ETCD_T0=$(date +%s%N)
  echo "{\"fault\":\"$1\",\"t0_ms\":$((MT_ETCD_T0 / 1000000))${2:+,$2}}" >> "$MT_WORK/etcd-faults.jsonl"
}

# Right after a fault is injected: three new clients start at once (each
# connects through the coordinator list, puts and reads back its blocks), and
# n3 starts, to join (mt_etcd_during waits for both).
MT_ETCD_SALT=1
mt_etcd_after_inject() {
  local k
  MT_ETCD_FRESH=()
  for k in 1 2 3; do
    mh_exec_argv "$MT_ID" "h$((MT_HOSTS - 1))" "$MT_CLIENT" fresh --coordinator "$(mt_etcd_coordinators)" \
      --salt "$((MT_ETCD_SALT++))"
    "${MH_ARGV[@]}" >> "$MT_WORK/fresh-$MT_ETCD_FAULT.jsonl" 2>> "$MT_WORK/fresh.err" &
    MT_ETCD_FRESH+=("$!")
  done
  MT_ETCD_FRESH_STARTED=$((($(date +%s%N) - MT_ETCD_T0) / 1000000))
  mt_etcd_launch_node 3
}

mt_etcd_kill_leader() {
  local h
  h=$(mt_etcd_leader 10) || {
    mt_fail "leader_killed: no coordinator leads"
    return
  }
  MT_ETCD_VICTIM=$h
  mt_etcd_mark leader_killed "\"host\":\"h$h\""
  kill -KILL "${MT_ETCD_CPID[$h]}"
  mt_etcd_after_inject
  mt_log "leader_killed: the coordinator on h$h (leader) SIGKILLed"
}
mt_etcd_restart_victim() {
  mt_etcd_start_coordinator "$MT_ETCD_VICTIM"
  mt_etcd_leave_n3
}

mt_etcd_raft_leader() {   # -> the index of the etcd member that leads raft
  mt_etcd_on_launch etcdctl --endpoints "$(mt_etcd_endpoints)" --command-timeout 2s endpoint status -w json |
    python3 -c '
import json, sys
for e in json.load(sys.stdin):
    s = e["Status"]
    if s["header"]["member_id"] == s["leader"]:
        print(int(e["Endpoint"].split(":")[0].split(".")[3]) - 100)
        break'
}
mt_etcd_kill_member() {
  local i
  i=$(mt_etcd_raft_leader)
  [[ -n $i ]] || i=1
  MT_ETCD_VICTIM=$i
  mt_etcd_mark etcd_member_killed "\"member\":\"e$i\""
  kill -KILL "${MT_ETCD_PID[$i]}"
  mt_etcd_after_inject
  mt_log "etcd_member_killed: e$i on h$i (raft leader) SIGKILLed"
}
mt_etcd_restart_member() {
  mt_etcd_start_member "$MT_ETCD_VICTIM"
  mt_etcd_wait_healthy 20 || mt_fail "etcd member e$MT_ETCD_VICTIM did not rejoin in 20 s"
  mt_etcd_leave_n3
}

mt_etcd_cut_leader() {
  local h i
  h=$(mt_etcd_leader 10) || {
    mt_fail "coordinator_partitioned: no coordinator leads"
    return
  }
  MT_ETCD_VICTIM=$h
  mt_etcd_mark coordinator_partitioned "\"host\":\"h$h\""
  for i in $MT_ETCD_MEMBERS; do
    ip -n "$(mh_ns "$MT_ID" "$h")" neigh replace "$(mt_etcd_addr "$i")" lladdr 02:00:5e:00:de:ad nud permanent dev eth0
  done
  mt_etcd_after_inject
  mt_log "coordinator_partitioned: the coordinator on h$h (leader) cut off from every etcd member"
}
mt_etcd_uncut_leader() {
  local i
  for i in $MT_ETCD_MEMBERS; do
    ip -n "$(mh_ns "$MT_ID" "$MT_ETCD_VICTIM")" neigh del "$(mt_etcd_addr "$i")" dev eth0 2> /dev/null || true
  done
  mt_etcd_leave_n3
}

mt_etcd_leave_n3() {
  [[ -n ${MT_ETCD_NPID[3]:-} ]] || return 0
  mt_stop_pid "${MT_ETCD_NPID[3]}"
  MT_ETCD_NPID[3]=
}

# During each fault: the fault lasts until a coordinator publishes a map with
# n3 (or 20 s) and the new clients are done.
mt_etcd_during() {
  local p
  mt_wait_line "$MT_ETCD_NLOG.out" '"event":"listening"' 20 || mt_fail "node n3 did not listen in 20 s"
  mt_etcd_wait_map 4 20 || mt_fail "$MT_ETCD_FAULT: no coordinator published a map with n3 within 20 s"
  for p in "${MT_ETCD_FRESH[@]}"; do
    wait "$p" || mt_fail "$MT_ETCD_FAULT: a client started during the fault failed"
  done
  echo "{\"fault\":\"$MT_ETCD_FAULT\",\"clients\":${#MT_ETCD_FRESH[@]},\"started_within_ms\":$MT_ETCD_FRESH_STARTED}" \
    >> "$MT_WORK/etcd-fresh.jsonl"
}

# NAME INJECT HEAL: fresh hit set put and read (the hit rate before), the
# fault under load, and the hit set read again once recovered (after).
mt_etcd_fault() {
  mt_load_say hitset hitset 30 || return 1
  mt_load_say "hitrate $1 before" hitrate 30 && echo "$MT_REPLY" >> "$MT_WORK/etcd-hitrate.jsonl"
  mt_fault "$1" 1 "$2" "$3" mt_etcd_during
  mt_load_say "hitrate $1 after" hitrate 30 && echo "$MT_REPLY" >> "$MT_WORK/etcd-hitrate.jsonl"
}

# `--phases etcd`: the three faults; `etcd_short` (the test's default, in CI): the leader killed only.
mt_phase_etcd_short() {
  MT_ETCD_FAULTS=leader_killed mt_phase_etcd
}

MT_ETCD_FAULTS="leader_killed etcd_member_killed coordinator_partitioned"
mt_phase_etcd() {
  mt_log "phase etcd ($MT_ETCD_FAULTS): three etcd members on h1..h3, coordinators on h0 and h$((MT_HOSTS - 1)), nodes on h1..h3"
  local i h
  for i in $MT_ETCD_MEMBERS; do
    ip -n "$(mh_ns "$MT_ID" "$i")" addr replace "$(mt_etcd_addr "$i")/$MH_MASK" dev eth0
    mt_etcd_start_member "$i"
  done
  mt_etcd_wait_healthy 30 || {
    mt_fail "the etcd cluster was not healthy within 30 s"
    return 1
  }
  mt_etcd_config "$(mt_etcd_coordinator_hosts | awk '{print $1}')" > "$MT_WORK/etcd-cluster.json"
  for h in $(mt_etcd_coordinator_hosts); do mt_etcd_start_coordinator "$h"; done
  h=$(mt_etcd_leader 15) || {
    mt_fail "no coordinator led within 15 s"
    return 1
  }
  for i in 0 1 2; do mt_etcd_start_node "$i"; done
  mt_etcd_wait_map 3 20 || {
    mt_fail "no map of 3 nodes within 20 s"
    return 1
  }
  mt_log "etcd: $(mt_etcd_endpoints); coordinators $(mt_etcd_coordinators), h$h leads"

  # No live-sequence clients: the soak's sequence checks take a node outside
  # n0..n2 (n3, joining) for a killed one.
  MT_LOAD_COORDINATORS=$(mt_etcd_coordinators) MT_LOAD_NO_PROXY=1 mt_load_start "$MT_WORK/load-etcd" \
    --stale-epoch-refusal --seq-threads 0
  sleep 1
  local f
  for f in $MT_ETCD_FAULTS; do
    case $f in
      leader_killed) mt_etcd_fault leader_killed mt_etcd_kill_leader mt_etcd_restart_victim ;;
      etcd_member_killed) mt_etcd_fault etcd_member_killed mt_etcd_kill_member mt_etcd_restart_member ;;
      coordinator_partitioned) mt_etcd_fault coordinator_partitioned mt_etcd_cut_leader mt_etcd_uncut_leader ;;
    esac
  done
  mt_load_stop
  echo "$MT_REPLY" > "$MT_WORK/load-etcd.report.json"

  # Leader changes are counted up to here: stopping a leader makes another lead.
  echo "$(($(date +%s%N) / 1000000))" > "$MT_WORK/etcd-stop-ms"
  for i in 0 1 2; do mt_stop_pid "${MT_ETCD_NPID[$i]}"; done
  for h in $(mt_etcd_coordinator_hosts); do mt_stop_pid "${MT_ETCD_CPID[$h]}"; done
  for i in $MT_ETCD_MEMBERS; do mt_stop_pid "${MT_ETCD_PID[$i]}"; done
  mt_etcd_report
}

# $MT_WORK/etcd.json from the coordinators' events (stderr: leader_elected,
# map_published with ts_ms), the faults' marks, the new clients and the hit rates.
mt_etcd_report() {
  python3 - "$MT_WORK" "$(mt_etcd_coordinator_hosts | wc -w)" "$(echo "$MT_ETCD_MEMBERS" | wc -w)" << 'EOF' > "$MT_WORK/etcd.json"
import glob, json, os, sys
work, coordinators, members = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def lines(path):
    out = []
    for p in sorted(glob.glob(os.path.join(work, path))):
        for l in open(p, errors="replace"):
            try:
                j = json.loads(l)
            except ValueError:
                continue
            if isinstance(j, dict):
                out.append(j)
    return out
events = lines("coordinator-h*.err")
stop_ms = int(open(os.path.join(work, "etcd-stop-ms")).read())
elected = sorted((e for e in events if e.get("event") == "leader_elected" and e["ts_ms"] < stop_ms),
                 key=lambda e: e["ts_ms"])
published = sorted((e for e in events if e.get("event") == "map_published"), key=lambda e: e["ts_ms"])
epochs = [e["epoch"] for e in published]
chained = all(b["previous"] == a["epoch"] for a, b in zip(published, published[1:]))
failover = {}
for f in lines("etcd-faults.jsonl"):
    after = [e["ts_ms"] - f["t0_ms"] for e in published if e["ts_ms"] >= f["t0_ms"]]
    failover[f["fault"]] = after[0] if after else None
fresh = lines("fresh-*.jsonl")
started = {j["fault"]: j["started_within_ms"] for j in lines("etcd-fresh.jsonl")}
hit_rate = {}
for h in lines("etcd-hitrate.jsonl"):
    fault, when = h["name"].split()
    hit_rate.setdefault(fault, {})[when] = h["rate"]
before = [r.get("before") for r in hit_rate.values()]
after = [r.get("after") for r in hit_rate.values()]
print(json.dumps({
    "coordinators": coordinators, "etcd_members": members,
    "leader_changes": max(0, len(elected) - 1), "leaders_elected": len(elected),
    "failover_ms": failover,
    "max_failover_ms": max((v for v in failover.values() if v is not None), default=None),
    "maps_published": len(published), "epochs_unique": len(set(epochs)) == len(epochs), "epochs_chained": chained,
    "new_clients_during_faults": len(fresh), "new_clients_ok": sum(1 for c in fresh if c.get("ok")),
    "new_clients_wrong_bytes": sum(c.get("wrong_bytes", 0) for c in fresh),
    "new_clients_bytes_compared": sum(c.get("bytes_compared", 0) for c in fresh),
    "new_clients_started_within_ms": started,
    # Started while the control plane was still failing over: before the fault's next map.
    "new_clients_started_before_next_map": bool(started) and all(
        failover.get(f) is not None and ms < failover[f] for f, ms in started.items()),
    "hit_rate": hit_rate,
    "hit_rate_before": None if None in before or not before else min(before),
    "hit_rate_after": None if None in after or not after else min(after),
    "hit_rates_equal": bool(hit_rate) and all(r.get("before") == r.get("after") for r in hit_rate.values()),
}))
EOF
  mt_log "etcd: $(cat "$MT_WORK/etcd.json")"
}
