# shellcheck shell=bash  # sourced by scripts/multihost.sh (no shebang)
# scripts/multihost-test-phases.sh — the phases of `scripts/multihost.sh test`
# and its entry point mh_test (sourced through scripts/multihost-test.sh, which
# describes them and defines the helpers and MT_* settings used here).
# shellcheck disable=SC2153,SC2034

mt_phase_tcp() {
  mt_log "phase 1: kvmesh serve over TCP on h0..h$MT_NODES, proxy and clients on h$((MT_HOSTS - 1))"
  mt_config tcp > "$MT_WORK/cluster-tcp.json"
  mt_serve "$MT_WORK/cluster-tcp.json" "$MT_WORK/serve-tcp" || return 1
  mt_proxy "$MT_WORK/proxy-tcp" "$MT_WORK/cluster-tcp.json"
  mt_bench "$MT_WORK/bench-tcp.json" --seconds "$MT_BENCH_SECONDS" --reps "$MT_BENCH_REPS"
  mt_log "throughput over TCP: $(mt_bench_summary "$MT_WORK/bench-tcp.json")"

  mt_log "phase 2: load and faults"
  mt_load_start "$MT_WORK/load-tcp" --stale-epoch-refusal
  sleep 2
  mt_fault link_down 4 mt_cut_h1 mt_heal_h1
  mt_fault rate_limit 4 mt_limit_h2 mt_unlimit_h2 mt_bench_n1_limited
  mt_fault coordinator_cut 4 mt_cut_h0 mt_heal_h0
  mt_fault partition 4 mt_part_h2_h0 mt_unpart_h2_h0
  mt_load_stop
  echo "$MT_REPLY" > "$MT_WORK/load-tcp.report.json"
  mt_stop_pid "$MT_PROXY_PID"
  mt_stop_serve "$MT_WORK/serve-tcp"
}

mt_phase_ucx() {
  mt_log "phase 3: the same cluster over UCX (UCX_TLS=tcp)"
  mt_config ucx > "$MT_WORK/cluster-ucx.json"
  # Every UCX endpoint's lanes go to a log: they must all be tcp.
  export UCX_LOG_LEVEL=info UCX_LOG_FILE="$MT_WORK/ucx/ucx.%h.%p.log" UCX_TLS=tcp
  mkdir -p "$MT_WORK/ucx"
  mt_serve "$MT_WORK/cluster-ucx.json" "$MT_WORK/serve-ucx" -x UCX_LOG_LEVEL -x UCX_LOG_FILE || return 1
  mt_proxy "$MT_WORK/proxy-ucx" "$MT_WORK/cluster-ucx.json"
  mt_bench "$MT_WORK/bench-ucx.json" --seconds "$MT_BENCH_SECONDS" --reps "$MT_BENCH_REPS"
  mt_log "throughput over UCX: $(mt_bench_summary "$MT_WORK/bench-ucx.json")"
  # A UCX send in flight to a host that went silent is not cut off at the
  # call's timeout: the channel cancels it and then waits for UCX to give it
  # back, which happens when the link returns (transport/ucx_channel.cc,
  # Await). Calls here may last the cut's 4 s and the seconds UCX takes to
  # resume the connection after it; the longest is reported (max_call_ms).
  mt_load_start "$MT_WORK/load-ucx" --stale-epoch-refusal --timeout-margin-ms 9000
  sleep 2
  mt_fault ucx_link_down 4 mt_cut_h3 mt_heal_h3
  mt_load_stop
  echo "$MT_REPLY" > "$MT_WORK/load-ucx.report.json"
  # Every node answered requests over UCX (the client falls back to TCP for a
  # node it cannot reach over UCX: that must not be what happened).
  local i n
  for ((i = 1; i <= MT_NODES; i++)); do
    n=$(mh_exec "$MT_ID" "h$((MT_HOSTS - 1))" bash -c \
      "exec 3<>/dev/tcp/$(mh_addr $i)/7101 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3" |
      awk '/^kvmesh_ucx_requests_total/ {print $2}')
    [[ ${n:-0} != 0 ]] || mt_fail "node on h$i answered no request over UCX"
    echo "{\"node\":\"n$((i - 1))\",\"ucx_requests\":${n:-0}}" >> "$MT_WORK/ucx-requests.jsonl"
  done
  mt_stop_pid "$MT_PROXY_PID"
  mt_stop_serve "$MT_WORK/serve-ucx"
  unset UCX_LOG_LEVEL UCX_LOG_FILE
  local lanes shm
  lanes=$(cat "$MT_WORK"/ucx/*.log 2> /dev/null | grep -c 'ep_cfg\[' || true)
  shm=$(cat "$MT_WORK"/ucx/*.log 2> /dev/null | grep 'ep_cfg\[' | grep -Ec 'posix|sysv|cma|xpmem|knem' || true)
  echo "{\"endpoint_configs\":$lanes,\"shared_memory\":$shm}" > "$MT_WORK/ucx-lanes.json"
  ((lanes > 0)) || mt_fail "no UCX endpoint configuration was logged"
  ((shm == 0)) || mt_fail "$shm UCX endpoint configurations use shared memory between hosts"
  mt_log "UCX: $lanes endpoint configurations logged, $shm with shared memory"
}

mt_phase_decode() {
  mt_log "phase 4: decode across hosts"
  local launch="h$((MT_HOSTS - 1))"
  local args=(--json --sweep '' --no-spec --conversations 4 --agents 1)
  mh_exec "$MT_ID" "$launch" "$MT_KVMESH" decode --ranks "$MT_NODES1" "${args[@]}" --config "$MT_WORK/cluster-tcp.json" \
    > "$MT_WORK/decode-threads.json" 2> "$MT_WORK/decode-threads.err" || mt_fail "decode as threads failed"
  mh_mpirun "$MT_ID" -np "$MT_NODES1" "$MT_KVMESH" serve --config "$MT_WORK/cluster-tcp.json" --decode "${args[@]}" \
    > "$MT_WORK/decode-mpi.json" 2> "$MT_WORK/decode-mpi.err" || mt_fail "serve --decode across hosts failed"
  local a b
  a=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["with_reuse"]["token_digest"])' "$MT_WORK/decode-threads.json" 2> /dev/null)
  b=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["with_reuse"]["token_digest"])' "$MT_WORK/decode-mpi.json" 2> /dev/null)
  if [[ -z $a || $a != "$b" ]]; then
    mt_fail "serve --decode across hosts: token digest \"$b\", 4 ranks as threads \"$a\""
  else
    mt_log "serve --decode across h0..h$MT_NODES: same tokens as threads (digest $a)"
  fi

  # A rank's host cut off mid-run. Open MPI's daemons watch their links with
  # TCP keepalive (1 s idle, 3 probes 1 s apart here): mpirun reports the lost
  # host and ends the job.
  mh_mpirun_argv "$MT_ID" --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 \
    --mca oob_tcp_keepalive_probes 3 -np "$MT_NODES1" "$MT_KVMESH" decode --mpi --config "$MT_WORK/cluster-tcp.json" \
    --sweep '' --no-spec --repeat 50
  "${MH_ARGV[@]}" > "$MT_WORK/decode-cut.out" 2> "$MT_WORK/decode-cut.err" &
  local pid=$!
  MT_PIDS+=("$pid")
  if ! mt_wait_line "$MT_WORK/decode-cut.out" 'kvmesh decode: ' 60; then
    mt_fail "decode --mpi did not start in 60 s"
    return 1
  fi
  sleep 1
  mh_cut "$MT_ID" h3
  local t0 rc=0
  t0=$(date +%s%N)
  local bound=$MT_DECODE_BOUND
  while kill -0 "$pid" 2> /dev/null && (($(date +%s%N) - t0 < bound * 1000000000)); do sleep 0.05; done
  local ms=$((($(date +%s%N) - t0) / 1000000))
  if kill -0 "$pid" 2> /dev/null; then
    mt_fail "decode --mpi still running ${bound} s after rank 3's host was cut off (a hang)"
    kill -KILL "$pid" 2> /dev/null || true
    rc=124
  fi
  wait "$pid" 2> /dev/null || rc=$?
  mh_heal "$MT_ID" h3
  ((rc != 0)) || mt_fail "decode --mpi exited 0 with a rank's host cut off"
  local why
  why=$(grep -m1 -iE 'lost communication|unreachable|timed out|timeout' "$MT_WORK/decode-cut.err" "$MT_WORK/decode-cut.out" | sed 's/^[^:]*://' || true)
  [[ -n $why ]] || mt_fail "decode --mpi ended without saying why (exit $rc)"
  mt_log "decode --mpi with h3 cut: exit $rc after $ms ms: $why"
  # The cut host's Open MPI daemon and rank go once it is reachable again.
  local left=1
  for ((t = 0; t < 150; t++)); do
    left=$(ip netns pids "$(mh_ns "$MT_ID" 3)" 2> /dev/null | xargs -r ps -o comm= -p | grep -cE '^(orted|kvmesh)$' || true)
    ((left == 0)) && break
    sleep 0.1
  done
  ((left == 0)) || mt_fail "$left Open MPI or kvmesh processes left on h3 15 s after its link came back"
  python3 -c 'import json,sys; print(json.dumps({"exit": int(sys.argv[1]), "error_after_ms": int(sys.argv[2]), "error": sys.argv[3].strip(), "leftover_processes": int(sys.argv[4])}))' \
    "$rc" "$ms" "$why" "$left" > "$MT_WORK/decode-cut.json"
}

mt_bench_summary() {
  python3 - "$1" << 'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result (%s)" % e); sys.exit(0)
print("; ".join("%s %s put %.2f get %.2f GB/s, raw up %.2f down %.2f (put/raw %.2fx, get/raw %.2fx)" % (
    h["node"], h["host"], h["gbps"]["put"], h["gbps"]["get"], h["gbps"]["raw_up"], h["gbps"]["raw_down"],
    h["ratio"]["put_over_raw_up"], h["ratio"]["get_over_raw_down"]) for h in j["hosts"]))
EOF
}

mt_summary() {
  python3 "$MH_ROOT/scripts/multihost-summary.py" "$MT_WORK" "$MT_HOSTS" "$((MT_NODES + 1))" "${#MT_FAILURES[@]}" \
    "${MT_FAILURES[@]}"
}

mh_test() {
  local skip_code=77 json_out=""
  MT_KVMESH=$MH_ROOT/build/bin/kvmesh
  MT_CLIENT=$MH_ROOT/build/bin/kvmesh_multihost_client
  MT_BENCH_SECONDS=0.5
  MT_BENCH_REPS=1
  MT_DECODE_BOUND=30
  MT_KEEP=
  local phases="tcp ucx decode etcd_short"
  while [[ $# -gt 0 ]]; do
    case $1 in
      --kvmesh) MT_KVMESH=$2; shift 2 ;;
      --client) MT_CLIENT=$2; shift 2 ;;
      --skip-code) skip_code=$2; shift 2 ;;
      --json-out) json_out=$2; shift 2 ;;
      --bench-seconds) MT_BENCH_SECONDS=$2; shift 2 ;;
      --bench-reps) MT_BENCH_REPS=$2; shift 2 ;;
      --phases) phases=$2; shift 2 ;;
      --keep) MT_KEEP=1; shift ;;
      *) mh_die "test: unknown option $1" ;;
    esac
  done
  local why
  if ! why=$(mh_can); then
    echo "multihost: SKIPPED: cannot make hosts here: $why"
    exit "$skip_code"
  fi
  [[ -x $MT_KVMESH && -x $MT_CLIENT ]] || mh_die "test: build kvmesh and kvmesh_multihost_client first ($MT_KVMESH, $MT_CLIENT)"
  local libs
  libs=$(ldd "$MT_KVMESH")
  if [[ $libs != *libmpi* ]]; then
    echo "multihost: SKIPPED: $MT_KVMESH is built without MPI (KVMESH_WITH_MPI): kvmesh serve cannot run"
    exit "$skip_code"
  fi
  if [[ $libs != *libucp* ]]; then
    phases=${phases//ucx/}
    mt_log "this kvmesh has no UCX: the UCX phase is left out"
  fi
  if [[ ! -x /usr/bin/etcd ]]; then
    phases=$(tr ' ' '\n' <<< "$phases" | grep -v '^etcd' | tr '\n' ' ' || true)
    mt_log "/usr/bin/etcd is missing (Debian: etcd-server): the etcd phases are left out"
    if [[ -z ${phases// /} ]]; then
      echo "multihost: SKIPPED: no phase left to run (/usr/bin/etcd is missing)"
      exit "$skip_code"
    fi
  fi
  MT_NODES1=$((MT_NODES + 1))
  MT_FAILURES=()
  MT_WORK=$(mktemp -d /tmp/kvmesh-multihost.XXXXXX)
  trap mt_cleanup EXIT
  # Sanitizer builds run several times slower: their bounds grow with them
  # (KVMESH_TEST_TIME_SCALE, set by ctest from cmake/KvmeshHelpers.cmake).
  local bound=$((330 * ${KVMESH_TEST_TIME_SCALE:-1}))
  trap 'mt_fail "interrupted, or past the '"$bound"' s bound"; exit 130' INT TERM
  mh_down_stale tests  # what a killed earlier run left behind (its daemons would load the cores)
  MT_ID=$(mh_up "$MT_HOSTS" $$)
  mt_log "instance $MT_ID: hosts h0..h$((MT_HOSTS - 1)), work dir $MT_WORK"
  # Whatever hangs, the test ends: the watchdog stops it after the bound.
  (
    sleep "$bound" &
    s=$!
    trap 'kill $s; exit 0' TERM
    wait $s && kill -TERM $$
  ) > /dev/null 2>&1 &
  MT_WATCHDOG=$!
  mt_sinks
  local p
  for p in $phases; do
    "mt_phase_$p" || mt_fail "phase $p did not complete"
  done
  local line ok=0
  line=$(mt_summary) || ok=1
  [[ -n $json_out ]] && echo "$line" > "$json_out"
  echo "$line"
  return $ok
}
