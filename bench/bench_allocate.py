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
import contextlib
import ctypes
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

import kvmesh

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(HERE)


def start(binary, args, timeout_s=15.0):
    """Starts a daemon; returns (process, its 'listening' event)."""
    # PR_SET_PDEATHSIG (1): the daemon gets SIGKILL if this script dies first.
    die_with_parent = lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # noqa: E731
    p = subprocess.Popen([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                         preexec_fn=die_with_parent)
    end, buf = time.monotonic() + timeout_s, b""
    while time.monotonic() < end and p.poll() is None:
        if not select.select([p.stdout], [], [], 0.2)[0]:
            continue
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        for line in buf.split(b"\n")[:-1]:
            if line.startswith(b"{") and json.loads(line).get("event") == "listening":
                return p, json.loads(line)
    os.killpg(p.pid, signal.SIGKILL)
    raise RuntimeError(f"{' '.join(args[:1])} did not start")


@contextlib.contextmanager
def daemons(binary, cfg, timeout_s=15.0):
    """A coordinator and cfg's nodes started from a temporary copy of cfg (its
    coordinator port is made 0: a free one); yields the coordinator's
    "host:port" once every node is listed, SIGKILLs them all at the end."""
    cfg = dict(cfg, coordinator=dict(cfg["coordinator"], port=0))
    procs = []
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(cfg, f)
        f.flush()
        try:
            p, ev = start(binary, ["coordinator", "--config", f.name, "--port", "0"])
            procs.append(p)
            coordinator = f"127.0.0.1:{ev['ports']['http']}"
            for n in cfg["nodes"]:
                procs.append(start(binary, ["node", "--config", f.name, "--id", n["id"],
                                            "--coordinator", coordinator])[0])
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                with urllib.request.urlopen(f"http://{coordinator}/nodes", timeout=1) as r:
                    if len(json.loads(r.read())["nodes"]) == len(cfg["nodes"]):
                        break
                time.sleep(0.05)
            yield coordinator
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                p.stdout.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=["ucx", "tcp"], default="ucx" if kvmesh.HAVE_UCX else "tcp")
    ap.add_argument("--kvmesh-bin", default=os.environ.get("KVMESH_BIN", os.path.join(SOURCE_DIR, "build", "bin",
                                                                                       "kvmesh")))
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=64, help="blocks stored (256 KiB each)")
    ap.add_argument("--batch", type=int, default=16, help="blocks per get_into call")
    ap.add_argument("--rounds", type=int, default=200, help="timed calls per destination")
    args = ap.parse_args()

    cfg = json.load(open(os.path.join(SOURCE_DIR, "cluster_configs", "daemons-local.json")))
    cfg["model"]["num_layers"] = 16  # 16 layers x K,V x 4 heads x 16 tokens x 64 dims x fp16 = 256 KiB
    cfg["nodes"] = cfg["nodes"][:args.nodes]
    cfg["transport"]["backend"] = args.transport
    with daemons(args.kvmesh_bin, cfg) as coordinator:
        run(coordinator, args)


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
