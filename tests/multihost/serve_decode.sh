#!/usr/bin/env bash
# `mpirun ... kvmesh serve --config F --decode [decode options]` is `kvmesh
# decode --mpi --config F [options]`: the same tokens as the decode with its
# ranks as threads; without --decode, serve still refuses decode's options.
# Usage: serve_decode.sh MPIEXEC KVMESH CONFIG
set -euo pipefail
mpiexec=$1 kvmesh=$2 config=$3
args=(--json --sweep '' --no-spec --conversations 2 --agents 1)
digest() {
  python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["transport"], j["ranks"], j["with_reuse"]["token_digest"])'
}
threads=$("$kvmesh" decode --ranks 2 --config "$config" "${args[@]}" | digest)
serve=$("$mpiexec" --allow-run-as-root --oversubscribe -np 2 "$kvmesh" serve --config "$config" --decode "${args[@]}" | digest)
echo "decode --ranks 2:             $threads"
echo "mpirun -np 2 serve --decode:  $serve"
[[ ${serve%% *} == mpi && ${threads%% *} == threads ]] || { echo "FAIL: transports"; exit 1; }
[[ ${serve##* } == "${threads##* }" ]] || { echo "FAIL: token digests differ"; exit 1; }
if err=$("$kvmesh" serve --config "$config" --batch 4 2>&1); then
  echo "FAIL: serve without --decode accepted a decode option"
  exit 1
fi
grep -qE "not expected:.*--batch" <<< "$err" || { echo "FAIL: unexpected refusal: $err"; exit 1; }
echo "serve without --decode refuses --batch: ok"
