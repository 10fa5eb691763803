#!/usr/bin/env python3
"""An LMCache-style Redis connector against `kvmesh proxy`, end to end.

Starts a real `kvmesh coordinator`, three `kvmesh node`s and a `kvmesh proxy`
on 127.0.0.1 (ports chosen at run time, a password set through $.auth.token),
and drives the proxy with redis-py's asyncio client (a pool of connections,
the password in the connection URL) the way a Redis-backed KV connector does:

  store:  SET <key>kv_bytes <chunk>, then SET <key>metadata <28 bytes>
  load:   GET <key>metadata, then GET <key>kv_bytes
  exists: EXISTS <key>metadata, one key after another
  forget: DEL <key>metadata when the chunk is gone

Checks, in order:
  1. chunks of 1, 4 and 32 MiB are stored (none refused) and every one reads
     back byte for byte, with its metadata;
  2. after the cluster was filled with 2.5 times its capacity, every key
     whose metadata still exists reads its whole chunk back, equal:
     0 metadata keys are left without their chunk (co-located, co-evicted);
     and eviction did happen (not every key survived), some keys survived;
  3. a data command before AUTH is refused with NOAUTH.
Every process is killed at the end, whatever happens (and dies with this
script if it is killed itself: PR_SET_PDEATHSIG; tests/launch.py), and a
failure shows the end of each daemon's stderr. Exit 77 (ctest: skipped)
when redis-py is not installed.
"""
import argparse
import asyncio
import json
import os
import random
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch import TIME_SCALE, Daemons  # noqa: E402  (tests/launch.py)

try:
    import redis.asyncio as aioredis
    import redis.exceptions
except ImportError:  # pragma: no cover
    print("SKIP: redis-py (python3-redis) is not installed")
    sys.exit(77)

MiB = 1 << 20
NODES = ["n0", "n1", "n2"]
# Step 1 puts 73 MiB on one node (both 32 MiB chunks land on n0). With 96 MiB
# nodes (2 stripes of 48 one-MiB pages, each page owned by one size class) a
# stripe could run out of pages for a small class and evict a whole group in
# step 1: 1 run in about 15 under load. 128 MiB leaves a stripe 20 pages of room.
NODE_BYTES = 128 * MiB
PASSWORD = "s3cret-connector"
# Bounds grow with the build (TIME_SCALE, sanitizers: 4): under TSan a 32 MiB value through the
# proxy outlasted an unscaled 5 s node timeout in 2 of 3 runs.


def config(coord_port: int) -> dict:
    return {
        "name": "resp-connector",
        "model": {"model_id": "connector", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
                  "dtype": "fp16", "block_tokens": 16},
        "nodes": [{"id": n, "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0},
                   "memory": {"host": NODE_BYTES}} for n in NODES],
        # Two stripes: a 32 MiB chunk's 1 MiB parts spread over 32 MiB per stripe; eight size
        # classes: a 28-byte metadata value takes a 9 KiB chunk, not a 146 KiB one.
        "store": {"stripes": 2, "slot_bytes": "1MiB", "size_classes": 8},
        "transport": {"backend": "tcp", "io_threads": 2, "timeout_ms": 5000 * TIME_SCALE},
        "coordinator": {"host": "127.0.0.1", "port": coord_port, "heartbeat_ms": 200, "dead_after_ms": 3000 * TIME_SCALE},
        "auth": {"token": PASSWORD},
        "resp": {"max_value_bytes": "64MiB"},
    }


def chunk_bytes(key: str, size: int) -> bytes:
    return random.Random(key).randbytes(size)


def metadata(key: str, size: int) -> bytes:
    # 28 bytes, as an LMCache-style connector keeps: shape, dtype, format, length.
    return struct.pack("<4sIIIIII", b"KVMD", size, 4, 16, 64, 2, len(key))


async def store(r, key: str, size: int) -> None:
    ok = await r.set(key + "kv_bytes", chunk_bytes(key, size))
    assert ok is True, f"SET {key}kv_bytes answered {ok!r}"
    ok = await r.set(key + "metadata", metadata(key, size))
    assert ok is True, f"SET {key}metadata answered {ok!r}"


async def load(r, key: str, size: int):
    """None when the metadata is gone; else (metadata ok, chunk or None)."""
    md = await r.get(key + "metadata")
    if md is None:
        return None
    chunk = await r.get(key + "kv_bytes")
    return md == metadata(key, size), chunk


async def main(kvmesh: str) -> int:
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, Daemons(binary=kvmesh, log_dir=tmp) as procs:
        cfg_path = os.path.join(tmp, "cluster.json")
        with open(cfg_path, "w") as f:
            json.dump(config(0), f)
        coord = procs.launch("coordinator", ["coordinator", "--config", cfg_path, "--port", "0"])
        coord_addr = f"127.0.0.1:{coord['ports']['http']}"
        for n in NODES:
            procs.launch(n, ["node", "--config", cfg_path, "--id", n, "--coordinator", coord_addr])
        time.sleep(0.8)  # every node registered (heartbeat 200 ms)
        px = procs.launch("proxy", ["proxy", "--config", cfg_path, "--coordinator", coord_addr, "--resp-port", "0"])
        assert px["nodes"] == len(NODES), px
        port = px["ports"]["resp"]

        # 3. NOAUTH before AUTH (a client without the password).
        anon = aioredis.Redis(host="127.0.0.1", port=port)
        try:
            await anon.set("x", "y")
            raise AssertionError("SET without AUTH was accepted")
        except redis.exceptions.AuthenticationError as e:
            assert "NOAUTH" in str(e) or "Authentication required" in str(e), e
        except redis.exceptions.ResponseError as e:
            assert "NOAUTH" in str(e), e
        await anon.close()

        url = f"redis://:{PASSWORD}@127.0.0.1:{port}/0"
        r = aioredis.from_url(url, max_connections=8, socket_timeout=60 * TIME_SCALE)
        sem = asyncio.Semaphore(8)

        async def bounded(coro):
            async with sem:
                return await coro

        # 1. 1, 4 and 32 MiB chunks: stored, read back equal.
        sizes = [1 * MiB] * 6 + [4 * MiB] * 4 + [32 * MiB] * 2
        keys = [f"model@tp0:round1:chunk{i:03d}@" for i in range(len(sizes))]
        await asyncio.gather(*(bounded(store(r, k, s)) for k, s in zip(keys, sizes)))
        for k, s in zip(keys, sizes):
            got = await load(r, k, s)
            assert got is not None, f"{k}: metadata missing right after SET"
            md_ok, chunk = got
            assert md_ok, f"{k}: metadata differs"
            assert chunk == chunk_bytes(k, s), f"{k}: chunk of {s} bytes read back different"
        print(f"1. {len(sizes)} chunks (1, 4, 32 MiB) stored and read back equal, none refused")

        # 2. Fill to 2.5 times the cluster's capacity, then check every pair.
        capacity = NODE_BYTES * len(NODES)
        fill_sizes = []
        rng = random.Random(7)
        total = sum(sizes)
        while total < 2.5 * capacity:
            s = rng.choice([1 * MiB, 4 * MiB, 4 * MiB, 32 * MiB])
            fill_sizes.append(s)
            total += s
        fill_keys = [f"model@tp0:round2:chunk{i:04d}@" for i in range(len(fill_sizes))]
        await asyncio.gather(*(bounded(store(r, k, s)) for k, s in zip(fill_keys, fill_sizes)))
        all_keys = list(zip(keys, sizes)) + list(zip(fill_keys, fill_sizes))
        present = without_chunk = wrong = 0
        for k, s in all_keys:
            if not await r.exists(k + "metadata"):
                continue
            present += 1
            got = await load(r, k, s)
            if got is None:
                continue  # evicted between EXISTS and GET: a miss, not a broken pair
            md_ok, chunk = got
            if chunk is None:
                without_chunk += 1
                await r.delete(k + "metadata")
            elif not md_ok or chunk != chunk_bytes(k, s):
                wrong += 1
        print(f"2. filled {total / MiB:.0f} MiB into {capacity / MiB:.0f} MiB ({total / capacity:.1f}x): "
              f"{len(all_keys)} pairs, {present} metadata keys left, {without_chunk} without their chunk, "
              f"{wrong} wrong")
        assert without_chunk == 0, f"{without_chunk} metadata keys lost their chunk"
        assert wrong == 0, f"{wrong} chunks read back wrong"
        assert 0 < present < len(all_keys), f"{present} of {len(all_keys)} left: no eviction, or nothing kept"
        await r.close()
        print(f"3. NOAUTH before AUTH; the password in the URL works. {time.time() - t0:.1f} s")
        return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmesh", required=True)
    sys.exit(asyncio.run(main(ap.parse_args().kvmesh)))
