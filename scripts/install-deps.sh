#!/usr/bin/env bash
# Installs the Debian 12 packages kvmesh needs to build, test and benchmark.
# Idempotent: when everything is present it returns in well under a second
# without touching apt. Needs root (or sudo) only when something is missing.
set -euo pipefail

PKGS=(
  cmake ninja-build g++ clang pkg-config
  clang-14 libclang-rt-14-dev   # the libFuzzer targets (scripts/fuzz.sh, CI's fuzz stage)
  libssl-dev openssl            # TLS (Boost.Asio ssl) and test certificates made at run time
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin
  libboost-dev nlohmann-json3-dev catch2
  libxxhash-dev liblz4-dev libzstd-dev libcli11-dev libspdlog-dev libabsl-dev liburing-dev
  libbenchmark-dev
  redis-server redis-tools   # the Redis baseline in benchmarks and the redis-cli tests
  gnuplot-nox                # PNG plots (replay, decode curves)
  python3                    # small helper scripts
  shellcheck                 # the shell scripts' lint (ctest shellcheck, scripts/shellcheck.sh)
  python3-dev pybind11-dev python3-pybind11        # the Python package (python/)
  python3-numpy python3-torch python3-pytest       # its tests and the PyTorch example
  libopenblas0-pthread       # BLAS for Debian's torch and numpy (the reference libblas3 is ~30x slower)
  python3-redis              # redis-py (asyncio): the Redis-connector test of the RESP proxy
  python3-venv python3-pip python3-setuptools python3-wheel   # pip install . (offline) and its test
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev   # KV events: the nodes' ZMQ PUB/ROUTER sockets, msgpack (docs/kv-events.md)
  python3-zmq python3-msgpack                 # the KV-event subscriber test (python/tests/test_kv_events.py)
  etcd-server etcd-client    # the etcd-backed control plane ($.coordinator.etcd): its tests and scripts/multihost.sh
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
