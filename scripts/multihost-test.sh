# shellcheck shell=bash  # sourced by scripts/multihost.sh (no shebang)
# scripts/multihost-test.sh — `scripts/multihost.sh test`, sourced by it
# (docs/multihost.md). Five hosts: h0 coordinator (rank 0), h1..h3 nodes n0..n2
# (ranks 1..3), h4 the launch host (mpirun) with the clients and the RESP proxy.
#
#  1. `kvmesh serve` over TCP across h0..h3, `kvmesh proxy` on h4; throughput
#     from h4 to each node host, kvmesh PUT/GET vs raw TCP, in the same run.
#  2. Load from h4 (NetworkClient: prefix cache + live sequences; Redis clients
#     through the proxy; every byte read back compared) while the faults come
#     one after another, each followed by the time until every node serves
#     again: a node host's link down; its link limited to 1 Gbit/s (tc tbf);
#     the coordinator's host cut off; a node partitioned from the coordinator
#     but still reachable by the clients (2 replicas: do reads fail over?).
#  3. The same cluster over UCX (UCX_TLS=tcp; every endpoint's lanes checked),
#     throughput, load and a link down.
#  4. `kvmesh serve --decode` (= decode --mpi) across h0..h3 gives the same tokens
#     as 4 ranks as threads; then `kvmesh decode --mpi` with a rank's host cut
#     off mid-run must fail with a clear error within its bound, never hang.
#  5. The control plane on etcd (scripts/multihost-test-etcd.sh): three etcd
#     members, two coordinators, the leader killed under load (`etcd_short`,
#     the default); `--phases etcd` adds an etcd member killed and the leader
#     cut off from etcd.
# Last line on stdout: one JSON object (hosts, ranks, calls, bytes_compared,
# wrong_bytes, faults, max_recovery_ms, ...). Exit 0 when every check held.

MT_HOSTS=5
MT_NODES=3

mt_log() { echo "multihost test [$(date +%T)] $*" >&2; }
mt_fail() {
  mt_log "FAILED: $*"
  MT_FAILURES+=("$*")
}

mt_config() {   # BACKEND -> a cluster config on stdout
  local nodes="" i
  for ((i = 0; i < MT_NODES; i++)); do
    nodes+="${i:+,}
    {\"id\": \"n$i\", \"host\": \"$(mh_addr $((i + 1)))\", \"ports\": {\"data\": 7100, \"http\": 7101, \"resp\": 7102},
     \"memory\": {\"device\": \"64MiB\", \"host\": \"64MiB\"}}"
  done
  nodes=${nodes#,}
  cat << EOF
{
  "name": "multihost-$1",
  "model": {"model_id": "kvmesh-demo-1b", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64, "dtype": "fp16",
            "block_tokens": 16},
  "nodes": [$nodes
  ],
  "placement": {"replicas": 2},
  "store": {"stripes": 8, "slot_bytes": "256KiB", "verify_checksums": true},
  "transport": {"backend": "$1", "io_threads": 2, "max_frame_bytes": "64MiB", "timeout_ms": 1000,
                "connect_timeout_ms": 500},
  "coordinator": {"host": "$(mh_addr 0)", "port": 7070, "heartbeat_ms": 200, "dead_after_ms": 2000}
}
EOF
}

# Waits up to SECONDS for a line matching PATTERN in FILE.
mt_wait_line() {
  local file=$1 pattern=$2 seconds=$3
  local end=$((SECONDS + seconds))
  while ((SECONDS < end)); do
    grep -q -- "$pattern" "$file" 2> /dev/null && return 0
    sleep 0.1
  done
  return 1
}

# Background processes of this test, by pid, ended in mt_cleanup.
MT_PIDS=()
mt_bg() {   # LOG HOST CMD... (stdout and stderr to LOG.out / LOG.err)
  local log=$1 host=$2
  shift 2
  mh_exec_argv "$MT_ID" "$host" "$@"
  "${MH_ARGV[@]}" > "$log.out" 2> "$log.err" &
  MT_PIDS+=("$!")
  echo $!
}
mt_stop_pid() {   # PID [SECONDS]: SIGTERM, then SIGKILL after the grace
  local pid=$1 grace=${2:-10}
  kill -0 "$pid" 2> /dev/null || return 0
  kill -TERM "$pid" 2> /dev/null || true
  for ((t = 0; t < grace * 10; t++)); do
    kill -0 "$pid" 2> /dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2> /dev/null || true
}

mt_cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ -n ${MT_LOAD_PID:-} ]]; then kill -KILL "$MT_LOAD_PID" 2> /dev/null || true; fi
  local p
  for p in "${MT_PIDS[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  if [[ -n ${MT_WATCHDOG:-} ]]; then kill "$MT_WATCHDOG" 2> /dev/null || true; fi
  [[ -n ${MT_ID:-} ]] && mh_down_one "$MT_ID"
  if [[ -n ${MT_WORK:-} ]]; then
    if ((rc == 0)) && [[ -z ${MT_KEEP:-} ]]; then rm -rf "$MT_WORK"; else mt_log "logs kept in $MT_WORK"; fi
  fi
  exit "$rc"
}

# ---- the cluster -------------------------------------------------------------

# Starts `kvmesh serve` on h0..h3 with config $1; waits for the bootstrap line.
mt_serve() {
  local cfg=$1 log=$2
  shift 2
  mh_mpirun_argv "$MT_ID" -np $((MT_NODES + 1)) "$@" "$MT_KVMESH" serve --config "$cfg"
  "${MH_ARGV[@]}" > "$log.out" 2> "$log.err" &
  MT_SERVE_PID=$!
  MT_PIDS+=("$MT_SERVE_PID")
  if ! mt_wait_line "$log.out" '"event":"bootstrap"' 60; then
    mt_fail "kvmesh serve did not bootstrap in 60 s ($log.err: $(tail -3 "$log.err" | tr '\n' ' '))"
    return 1
  fi
  # Every rank on its own host: the coordinator on h0's address, node n(r-1) on h(r)'s.
  local boot
  boot=$(grep '"event":"bootstrap"' "$log.out" | head -1)
  local i
  grep -q "\"coordinator\":\"$(mh_addr 0):7070\"" <<< "$boot" || mt_fail "coordinator not on h0: $boot"
  for ((i = 0; i < MT_NODES; i++)); do
    grep -q "node n$i tcp://$(mh_addr $((i + 1))):7100" <<< "$boot" || mt_fail "node n$i not on h$((i + 1)): $boot"
  done
  mt_log "serve: $(grep -o '"ranks":[0-9]*' <<< "$boot"), endpoints on h0..h$MT_NODES"
}

mt_stop_serve() {
  local log=$1
  kill -TERM "$MT_SERVE_PID" 2> /dev/null || true
  local t
  for ((t = 0; t < 200; t++)); do
    kill -0 "$MT_SERVE_PID" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$MT_SERVE_PID" 2> /dev/null; then
    mt_fail "kvmesh serve did not stop within 20 s of SIGTERM"
    kill -KILL "$MT_SERVE_PID" 2> /dev/null || true
  fi
  wait "$MT_SERVE_PID" 2> /dev/null || true
  local stopped
  stopped=$(grep -c '"event":"stopped"' "$log.out" || true)
  ((stopped == MT_NODES + 1)) ||
    mt_fail "$stopped of $((MT_NODES + 1)) ranks printed stopped after SIGTERM ($log.err: $(tail -3 "$log.err" | tr '\n' ' '))"
}

mt_proxy() {
  MT_PROXY_PID=$(mt_bg "$1" "h$((MT_HOSTS - 1))" "$MT_KVMESH" proxy --config "$2" --coordinator "$(mh_addr 0):7070" \
    --host "$(mh_addr $((MT_HOSTS - 1)))" --resp-port 6380)
  mt_wait_line "$1.out" '"event":"listening"' 30 || mt_fail "kvmesh proxy did not listen in 30 s"
}

# ---- the load client and its faults ---------------------------------------------

# MT_LOAD_COORDINATORS: the coordinators (default h0's); MT_LOAD_NO_PROXY: no RESP clients.
mt_load_start() {   # LOG [extra client args]
  local log=$1
  shift
  local launch="h$((MT_HOSTS - 1))"
  local proxy=(--proxy "$(mh_addr $((MT_HOSTS - 1))):6380")
  [[ -n ${MT_LOAD_NO_PROXY:-} ]] && proxy=()
  mh_exec_argv "$MT_ID" "$launch" "$MT_CLIENT" load --coordinator "${MT_LOAD_COORDINATORS:-$(mh_addr 0):7070}" \
    --nodes "$MT_NODES" "${proxy[@]}" --work-dir "$MT_WORK/client" "$@"
  coproc "${MH_ARGV[@]}" 2> "$log.err"
  MT_LOAD_PID=$COPROC_PID
  exec {MT_LOAD_IN}>&"${COPROC[1]}" {MT_LOAD_OUT}<&"${COPROC[0]}"
  : > "$log.out"
  MT_LOAD_LOG=$log
}

mt_load_say() {   # COMMAND EXPECTED-EVENT TIMEOUT -> the answer line in MT_REPLY
  echo "$1" >&"$MT_LOAD_IN"
  MT_REPLY=
  local line end=$((SECONDS + $3))
  while ((SECONDS < end)) && read -r -t $((end - SECONDS + 1)) -u "$MT_LOAD_OUT" line; do
    echo "$line" >> "$MT_LOAD_LOG.out"
    if [[ $line == *"\"event\":\"$2\""* ]]; then
      MT_REPLY=$line
      return 0
    fi
  done
  mt_fail "load client: no \"$2\" answer to \"$1\" within $3 s"
  return 1
}

mt_load_stop() {   # -> the report line in MT_REPLY
  mt_load_say stop report 60 || true
  exec {MT_LOAD_IN}>&- {MT_LOAD_OUT}<&-
  local rc=0
  wait "$MT_LOAD_PID" 2> /dev/null || rc=$?
  MT_LOAD_PID=
  if ((rc != 0)); then
    local inv
    inv=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["invariants"]))' "$MT_REPLY" 2> /dev/null)
    mt_fail "load client exited $rc: ${inv:-no report; $(tail -3 "$MT_LOAD_LOG.err" | tr '\n' ' ')}"
  fi
}

# NAME DURATION INJECT HEAL [DURING]: one fault under load; its record is
# appended to $MT_WORK/faults.jsonl.
mt_fault() {
  local name=$1 duration=$2 inject=$3 heal=$4 during=${5:-}
  mt_load_say "arm $name" armed 30 || return 1
  $inject
  mt_load_say "fault $name" fault 10 || { $heal; return 1; }
  local t0=$SECONDS
  [[ -n $during ]] && $during
  local left=$((duration - (SECONDS - t0)))
  ((left > 0)) && sleep "$left"
  # The client stops probing first, so that nothing after the heal counts as
  # during the fault; the recovery is timed from the heal.
  mt_load_say "end $name" ended 30 || { $heal; return 1; }
  $heal
  mt_load_say "restore $name" recovered 60 || return 1
  echo "$MT_REPLY" >> "$MT_WORK/faults.jsonl"
  mt_log "$name: $(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); d=j["during"]; print("recovered in %.0f ms; during: map %d..%d nodes, probes %d ok %d failed, canary %s" % (j["recovery_ms"], d["map_nodes_min"], d["map_nodes_max"], d["probes_ok"], d["probes_failed"], "%d/%d served at the end" % (d["canary_served_last"], d["canary_blocks"]) if d["canary_reads"] else "not read (no read finished)"))' "$MT_REPLY")"
}

# Fault bodies (closures over MT_ID); h1 holds n0, h2 n1, h3 n2.
mt_cut_h1() { mh_cut "$MT_ID" h1; }
mt_heal_h1() { mh_heal "$MT_ID" h1; }
mt_cut_h3() { mh_cut "$MT_ID" h3; }
mt_heal_h3() { mh_heal "$MT_ID" h3; }
mt_limit_h2() { mh_limit "$MT_ID" h2 1gbit; }
mt_unlimit_h2() { mh_unlimit "$MT_ID" h2; }
mt_cut_h0() { mh_cut "$MT_ID" h0; }
mt_heal_h0() { mh_heal "$MT_ID" h0; }
mt_part_h2_h0() { mh_partition "$MT_ID" h2 h0; }
mt_unpart_h2_h0() { mh_unpartition "$MT_ID" h2 h0; }
mt_bench_n1_limited() {
  mh_exec "$MT_ID" "h$((MT_HOSTS - 1))" "$MT_CLIENT" bench --coordinator "$(mh_addr 0):7070" --node n1 \
    --seconds 0.5 --reps 1 > "$MT_WORK/bench-limited.json" 2> "$MT_WORK/bench-limited.err" ||
    mt_fail "bench under the rate limit failed: $(tail -2 "$MT_WORK/bench-limited.err")"
}

mt_bench() {   # OUT [bench args]
  local out=$1
  shift
  mh_exec "$MT_ID" "h$((MT_HOSTS - 1))" "$MT_CLIENT" bench --coordinator "$(mh_addr 0):7070" "$@" > "$out" 2> "$out.err" ||
    mt_fail "bench failed: $(tail -2 "$out.err")"
}

mt_sinks() {
  local i
  for ((i = 1; i <= MT_NODES; i++)); do
    mt_bg "$MT_WORK/sink$i" "h$i" "$MT_CLIENT" sink --listen "$(mh_addr $i):7199" > /dev/null
  done
  for ((i = 1; i <= MT_NODES; i++)); do
    mt_wait_line "$MT_WORK/sink$i.out" '"raw_sink"' 20 || mt_fail "raw sink on h$i did not listen"
  done
}

source "$MH_ROOT/scripts/multihost-test-phases.sh"
source "$MH_ROOT/scripts/multihost-test-etcd.sh"
