#!/usr/bin/env bash
# Reproduces the decode numbers and plot of docs/guide.md:
# with/without prefix reuse, the batch-size sweep drawn as
# docs/img/decode-latency-throughput.png (gnuplot), the speculative demo, and
# the JSON event log turned into TTFT/TPOT by scripts/research/decode-events.py.
#   scripts/research/plot-decode.sh [build-dir]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
KVMESH=$BUILD/bin/kvmesh
mkdir -p docs/img
"$KVMESH" decode --ranks 4 --repeat 3 --plot docs/img/decode-latency-throughput.png --events /tmp/kvmesh-decode-events.jsonl
rm -f docs/img/decode-latency-throughput.png.gp
scripts/research/decode-events.py /tmp/kvmesh-decode-events.jsonl
