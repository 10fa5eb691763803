#!/usr/bin/env python3
"""get_into of 256 KiB blocks into Client.allocate memory vs into a numpy array
registered with Client.register, against daemons this script starts
(`kvmesh coordinator` + nodes on 127.0.0.1, ports chosen at run time).

Both destinations are measured in the same run, rounds interleaved (A, B, B,
A, ...), over the same stored blocks; the figures are medians over rounds of
one get_into call of --batch blocks, and the ratio is register / allocate.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_allocate.py --transport ucx
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_allocate.py --transport tcp
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import kvmesh

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests"))
from launch import KVMESH_BIN, cluster  # noqa: E402  (tests/launch.py: the daemons' launcher)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=["ucx", "tcp"], default="ucx" if kvmesh.HAVE_UCX else "tcp")
    ap.add_argument("--kvmesh-bin", default=KVMESH_BIN)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=64, help="blocks stored (256 KiB each)")
    ap.add_argument("--batch", type=int, default=16, help="blocks per get_into call")
    ap.add_argument("--rounds", type=int, default=200, help="timed calls per destination")
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(SOURCE_DIR, "cluster_configs", "daemons-local.json")))
    cfg["model"]["num_layers"] = 16  # 16 layers x K,V x 4 heads x 16 tokens x 64 dims x fp16 = 256 KiB
    cfg["nodes"] = cfg["nodes"][:args.nodes]
    cfg["transport"]["backend"] = args.transport
    with cluster(cfg, binary=args.kvmesh_bin) as d:
        run(d.address, args)


def run(coordinator, args):
    with kvmesh.Client(coordinator, tenant=f"bench-allocate-{time.time_ns()}") as c:
        bb = c.block_bytes
        assert bb == 256 << 10, bb
        keys = c.keys(list(range(args.blocks * c.block_tokens)))
        data = np.random.default_rng(1).integers(0, 256, (args.blocks, bb), dtype=np.uint8)
        assert all(c.put_from(keys, list(data)))

        alloc = c.allocate(args.batch * bb)
        a_view = np.frombuffer(alloc, dtype=np.uint8).reshape(args.batch, bb)
        plain = np.zeros((args.batch, bb), dtype=np.uint8)
        c.register(plain)
        dests = {"allocate": [a_view[i] for i in range(args.batch)], "register": [plain[i] for i in range(args.batch)]}
        times = {k: [] for k in dests}
        order = ["allocate", "register"]
        for r in range(args.rounds + 5):  # 5 warm-up rounds per destination
            first = (r * args.batch) % (args.blocks - args.batch + 1)
            ks = keys[first:first + args.batch]
            for name in (order if r % 2 == 0 else order[::-1]):
                t0 = time.perf_counter()
                st = c.get_into(ks, dests[name])
                dt = time.perf_counter() - t0
                if not all(s.ok for s in st):
                    sys.exit(f"{name}: get_into failed: {st}")
                if r >= 5:
                    times[name].append(dt)
            assert np.array_equal(a_view, data[first:first + args.batch])
            assert np.array_equal(plain, data[first:first + args.batch])
        print(f"kvmesh get_into, {args.transport}, {args.nodes} node(s) on this host, {args.batch} x 256 KiB blocks "
              f"per call, medians of {args.rounds} calls each")
        print(f"{'destination':<34} {'median us/call':>14} {'GB/s':>8}")
        med = {}
        for name, label in [("register", "numpy array + Client.register"), ("allocate", "Client.allocate")]:
            med[name] = statistics.median(times[name])
            print(f"{label:<34} {med[name] * 1e6:>14.1f} {args.batch * bb / med[name] / 1e9:>8.2f}")
        print(f"ratio register / allocate (median time): {med['register'] / med['allocate']:.2f}x")
        del a_view, dests
        alloc.close()


if __name__ == "__main__":
    main()
