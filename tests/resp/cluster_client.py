#!/usr/bin/env python3
"""redis-py's Redis Cluster client against kvmesh nodes in cluster mode, end to end.

Starts a real `kvmesh coordinator` and three `kvmesh node`s with
$.resp.cluster (and a password, $.auth.token) on 127.0.0.1, ports chosen at
run time, and drives them with redis-py's `RedisCluster`, which reads the slot
map (CLUSTER SLOTS), the key positions (COMMAND) and follows -MOVED itself:

  1. from one startup node the client finds the three nodes and all 16384
     slots;
  2. 300 keys of 1 B to 2.5 MiB (larger ones span several blocks) and a
     hash-tagged MSET/MGET are written and read back byte for byte, and an
     LMCache-style <key>kv_bytes / <key>metadata pair is stored and loaded;
  3. each key is held by its slot's owner: a plain connection to another node
     is answered -MOVED <slot> <owner>;
  4. one node is SIGKILLed: within a bound, the client reads every key of the
     survivors equal and the dead node's keys as None (a miss, not an error).

Every process is killed at the end, whatever happens (and dies with this
script: PR_SET_PDEATHSIG; tests/launch.py), and a failure shows the end
of each daemon's stderr. Exit 77 (ctest: skipped) without redis-py.
"""
import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import TIME_SCALE, Daemons  # noqa: E402  (tests/launch.py)

try:
    import redis
    from redis.cluster import RedisCluster, ClusterNode
except ImportError:  # pragma: no cover
    print("SKIP: redis-py (python3-redis) with redis.cluster is not installed")
    sys.exit(77)

NODES = ["n0", "n1", "n2"]
PASSWORD = "s3cret-cluster"


def config() -> dict:
    return {
        "name": "resp-cluster",
        "model": {"model_id": "cluster", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
                  "dtype": "fp16", "block_tokens": 16},
        "nodes": [{"id": n, "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0},
                   "memory": {"host": "384MiB"}} for n in NODES],
        "store": {"stripes": 2, "slot_bytes": "1MiB", "size_classes": 8},
        "transport": {"backend": "tcp", "io_threads": 2, "timeout_ms": 5000},
        "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 200, "dead_after_ms": 1000},
        "auth": {"token": PASSWORD},
        "resp": {"cluster": True},
    }


def value(key: str) -> bytes:
    rng = random.Random(key)
    size = rng.choice([1, 100, 16 << 10, 300 << 10, (1 << 20) - 40, (1 << 20) + 1, (5 << 19)])
    return rng.randbytes(size)


def wait_for(what, predicate, timeout=15.0):
    timeout *= TIME_SCALE
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            if predicate():
                return
        except (redis.exceptions.RedisError, ConnectionError, OSError) as e:  # the map is moving
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout}s (last error: {last!r})")


def main(kvmesh: str) -> int:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, Daemons(binary=kvmesh, log_dir=tmp) as procs:
        path = os.path.join(tmp, "cluster.json")
        with open(path, "w") as f:
            json.dump(config(), f)
        coord = procs.launch("coordinator", ["coordinator", "--config", path, "--port", "0"])
        addr = f"127.0.0.1:{coord['ports']['http']}"
        ports = {}
        for n in NODES:
            ev = procs.launch(n, ["node", "--config", path, "--id", n, "--coordinator", addr])
            ports[n] = ev["ports"]["resp"]

        # 1. Every node serves its share of a map of three nodes covering all slots.
        def agreed(n):
            maps = []
            for node, port in ports.items():
                if not procs.alive(node):
                    continue
                r = redis.Redis(port=port, password=PASSWORD)
                maps.append(sorted((s[0], s[1], s[2][1]) for s in r.execute_command("CLUSTER SLOTS")))
                r.close()
            covered = sum(b - a + 1 for a, b, _ in maps[0])
            return all(m == maps[0] for m in maps) and len({p for _, _, p in maps[0]}) == n and covered == 16384
        wait_for("three nodes agree on the slots", lambda: agreed(3))
        rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", ports["n0"])], password=PASSWORD)
        assert len(rc.get_nodes()) == 3, rc.get_nodes()
        owners = {rc.nodes_manager.get_node_from_slot(s).port for s in range(16384)}
        assert owners == set(ports.values()), owners

        # 2. Values of every size, a hash-tag group and a connector's pair, through the cluster client.
        keys = [f"chunk:{i}" for i in range(300)]
        for k in keys:
            assert rc.set(k, value(k)) is True, k
        got = {k: rc.get(k) for k in keys}
        missing = [k for k in keys if got[k] is None]
        wrong = [k for k in keys if got[k] is not None and got[k] != value(k)]
        assert not missing and not wrong, f"missing {missing}, wrong {[(k, len(got[k]), len(value(k))) for k in wrong]}"
        got = rc.mget_nonatomic(keys[:40])
        assert got == [value(k) for k in keys[:40]]
        assert rc.mset({"{req9}.a": b"1", "{req9}.b": b"2"}) is True
        assert rc.mget("{req9}.a", "{req9}.b") == [b"1", b"2"]
        chunk = random.Random(7).randbytes(3 << 20)
        assert rc.set("lmc@model@0@abcdkv_bytes", chunk) is True
        assert rc.set("lmc@model@0@abcdmetadata", b"M" * 28) is True
        assert rc.get("lmc@model@0@abcdmetadata") == b"M" * 28
        assert rc.get("lmc@model@0@abcdkv_bytes") == chunk
        assert rc.exists("chunk:1", "chunk:2") == 2
        assert rc.delete("chunk:0") == 1 and rc.get("chunk:0") is None

        # 3. A key's owner holds it; any other node redirects to the owner.
        for k in keys[1:40]:
            slot = rc.keyslot(k)
            owner = rc.nodes_manager.get_node_from_slot(slot).port
            for node, port in ports.items():
                if port == owner:
                    continue
                r = redis.Redis(port=port, password=PASSWORD)
                try:
                    r.get(k)
                    raise AssertionError(f"{node} answered {k} (slot {slot}) it does not own")
                except redis.exceptions.ResponseError as e:
                    assert str(e) == f"MOVED {slot} 127.0.0.1:{owner}", str(e)
                finally:
                    r.close()

        # 4. A dead node's slots move to the survivors: its keys miss, the others' stay.
        dead_port = ports["n2"]
        dead = {k for k in keys[1:] if rc.nodes_manager.get_node_from_slot(rc.keyslot(k)).port == dead_port}
        procs.kill("n2")
        wait_for("two nodes agree on the slots", lambda: agreed(2))

        def survivors_answer():
            for k in keys[1:]:
                v = rc.get(k)
                if k in dead:
                    assert v is None, f"{k} of the dead node read {len(v)} bytes"
                elif v != value(k):
                    return False
            return True
        # redis-py 4.3 prints each connection error it retries on to stderr: keep them unless the wait fails.
        noise = io.StringIO()
        try:
            with contextlib.redirect_stderr(noise):
                wait_for("the cluster client reads the survivors' keys and misses the dead node's",
                         survivors_answer)
        except AssertionError:
            sys.stderr.write(noise.getvalue()[-20000:])
            raise
        assert dead, "the killed node held none of the keys"
        print(f"OK: 300 keys over 3 nodes, {len(dead)} lost with n2, {time.time() - t0:.1f}s")
        return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmesh", required=True)
    sys.exit(main(ap.parse_args().kvmesh))
