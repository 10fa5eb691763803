"""A node's KV events, read as an outside indexer reads them (docs/kv-events.md).

The subscriber below is written from vLLM's KV-event format, not from kvmesh's
code: vllm/distributed/kv_events.py of vllm-project/vllm at commit
b4e69e0af33f4698e157a262cc787fe61983cd3d (ZmqEventPublisher: PUB frames
[topic, 8-byte big-endian sequence number, payload]; a ROUTER replay socket
that takes [empty, 8-byte big-endian start sequence] and answers
[empty, seq, payload] per buffered batch, then seq -1 with an empty payload;
EventBatch(ts, events) and the tagged structs BlockStored, BlockRemoved,
AllBlocksCleared, all msgspec array_like: an array whose first element is the
struct's name) with the fields of the same file in its later form, read at
vMaroon/vllm commit 9e22f1fa6821e6682c603ed7e70e570c74cab28a:
EventBatch(ts, events, data_parallel_rank=None), BlockStored(block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, ...),
BlockRemoved(block_hashes, medium); a block hash is ExternalBlockHash = bytes | int.
The one kvmesh addition it uses is the snapshot request (third frame
b"kvmesh-snapshot"), for gaps that replay cannot fill.

A real node daemon with three tiers (device budget in host memory on this
machine, host, SSD) is filled to about three times what it holds, so blocks
are demoted and finally evicted; the subscriber restarts twice while the node
keeps changing: after a short absence replay fills the gap, after a long one
(more batches than the replay buffer keeps) a snapshot does. At the end the
events must name exactly what the node holds: every block the node reports as
stored is in the reconstructed state, none that it no longer has, and the
count per tier matches the node's own figures.
"""

import json
import os
import time
import urllib.error
import urllib.request

import msgpack
import numpy as np
import pytest
import zmq

import kvmesh
from conftest import MODEL, Daemons, scaled

BLOCK_BYTES = 2 * 4 * 4 * 16 * 64 * 2  # MODEL's full block: 64 KiB
SNAPSHOT = b"kvmesh-snapshot"


def decode_batch(payload):
    """EventBatch -> list of (kind, medium, [hash, ...])."""
    batch = msgpack.unpackb(payload, raw=False)
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float)
    out = []
    for ev in events:
        tag = ev[0]
        if tag == "BlockStored":
            out.append(("stored", ev[6], ev[1]))
        elif tag == "BlockRemoved":
            out.append(("removed", ev[2], ev[1]))
        elif tag == "AllBlocksCleared":
            out.append(("cleared", None, []))
        else:
            raise AssertionError(f"unknown event {tag!r}")
    return out


def key_of(h):
    assert isinstance(h, bytes) and len(h) == 16, h
    return (int.from_bytes(h[:8], "big"), int.from_bytes(h[8:], "big"))


class Indexer:
    """What an indexer keeps: the blocks of each medium, and the last sequence applied."""

    def __init__(self, host, port, replay_port):
        self.host, self.port, self.replay_port = host, port, replay_port
        self.ctx = zmq.Context()
        self.media = {}
        self.last = -1
        self.replays = self.snapshots = self.continuations = 0
        self.sub = None

    def connect(self):
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://{self.host}:{self.port}")

    def disconnect(self):
        self.sub.close(linger=0)
        self.sub = None

    def apply(self, payload):
        for kind, medium, hashes in decode_batch(payload):
            if kind == "cleared":
                self.media.clear()
            elif kind == "stored":
                self.media.setdefault(medium, set()).update(key_of(h) for h in hashes)
            else:
                self.media.setdefault(medium, set()).difference_update(key_of(h) for h in hashes)

    def request(self, body, ends=None):
        """[(seq, payload), ...] the replay socket answers to `body`, up to its end marker; the end
        marker's payload (a snapshot's continuation cursor, or b"") is appended to `ends` if given."""
        s = self.ctx.socket(zmq.DEALER)
        s.connect(f"tcp://{self.host}:{self.replay_port}")
        s.send_multipart([b"", body])
        out = []
        try:
            while True:
                assert s.poll(scaled(5000)), "the replay socket did not answer"
                empty, seq, payload = s.recv_multipart()
                assert empty == b""
                seq = int.from_bytes(seq, "big", signed=True)
                if seq == -1:
                    if ends is None:
                        assert payload == b""
                    else:
                        ends.append(payload)
                    return out
                out.append((seq, payload))
        finally:
            s.close(linger=0)

    def recover(self):
        """Fills the gap after self.last: replay when the buffer still has it, else a snapshot."""
        got = self.request((self.last + 1).to_bytes(8, "big"))
        if got and got[0][0] == self.last + 1:
            self.replays += 1
            for seq, payload in got:
                if seq == self.last + 1:
                    self.apply(payload)
                    self.last = seq
            return
        self.snapshots += 1
        ends = []
        snap = self.request(SNAPSHOT, ends)
        assert snap, "empty snapshot"
        self.media.clear()
        for seq, payload in snap:
            assert seq == snap[0][0]  # every batch of a snapshot's answer carries the sequence it reflects
            self.apply(payload)
        self.last = snap[0][0]
        while ends[-1]:  # a continuation: the listing goes on after this cursor
            self.continuations += 1
            for _, payload in self.request(SNAPSHOT + ends[-1], ends):
                self.apply(payload)

    def poll(self, timeout_ms):
        """Applies what arrives within timeout_ms; False when nothing did."""
        if not self.sub.poll(timeout_ms):
            return False
        topic, seq, payload = self.sub.recv_multipart()
        assert topic == b"kvmesh-test"
        seq = int.from_bytes(seq, "big")
        if seq <= self.last:
            return True  # already applied through replay or a snapshot
        if seq != self.last + 1:
            self.recover()
            if seq <= self.last:
                return True
            assert seq == self.last + 1, (seq, self.last)
        self.apply(payload)
        self.last = seq
        return True


def node_stats(http_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/stats", timeout=scaled(5)) as r:
        return json.loads(r.read())


def test_events_reconstruct_the_node_across_subscriber_restarts(tmp_path):
    cfg = {
        "model": dict(MODEL),
        "nodes": [{"id": "n0", "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0},
                   "memory": {"device": "2MiB", "host": "2MiB", "ssd": "4MiB", "ssd_path": str(tmp_path)}}],
        "store": {"stripes": 1, "slot_bytes": BLOCK_BYTES, "size_classes": 1},
        "transport": {"backend": "tcp", "timeout_ms": scaled(5000)},
        "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 200, "dead_after_ms": 5000},
        "events": {"enabled": True, "topic": "kvmesh-test", "replay_buffer": 256, "max_batch_events": 1},
    }
    path = tmp_path / "events.json"
    path.write_text(json.dumps(cfg))
    d = Daemons(config=str(path), nodes=("n0",)).start()
    try:
        ports = d.listening["n0"]["ports"]
        assert ports["events"] > 0 and ports["events_replay"] > 0
        ix = Indexer("127.0.0.1", ports["events"], ports["events_replay"])
        ix.connect()
        rng = np.random.default_rng(7)
        keys = []
        with kvmesh.Client(d.address, timeout_ms=scaled(5000)) as c:

            def put(n):
                new = [(int(a), int(b)) for a, b in rng.integers(1, 2**63, size=(n, 2), dtype=np.int64)]
                blocks = [np.full(BLOCK_BYTES, i % 251, dtype=np.uint8) for i in range(n)]
                for st in c.put_from(new, blocks):
                    assert st, st
                keys.extend(new)

            def settle():
                """Reads until the subscriber has every batch the node numbered and the node is quiet."""
                end = time.monotonic() + scaled(20)
                while time.monotonic() < end:
                    got = ix.poll(50)
                    ev = node_stats(ports["http"])["events"]
                    last = ev["batches"] + ev["gaps"] - 1
                    if ix.last == last and not ix.poll(300):
                        return
                    if not got and ix.last < last:
                        ix.recover()  # behind, and nothing arrives (a SUB that joined after the last batch)
                raise AssertionError(f"subscriber stuck at {ix.last}: {node_stats(ports['http'])['events']}")

            put(40)  # fits the device tier
            settle()
            # Restart 1: a short absence (fewer batches than the replay buffer keeps).
            ix.disconnect()
            put(12)
            ix.connect()
            put(4)
            settle()
            assert ix.replays >= 1 and ix.snapshots == 0, (ix.replays, ix.snapshots)
            # Restart 2: a long absence, many times the replay buffer: a snapshot.
            ix.disconnect()
            put(300)  # more than twice the node's 128 blocks: demotions, then SSD evictions
            ix.connect()
            put(4)
            settle()
            assert ix.snapshots >= 1, (ix.replays, ix.snapshots)
            # One block a batch: a snapshot answer lists at most 64 blocks, the node holds ~128.
            assert ix.continuations >= 1, ix.continuations
            # Some more churn, read live.
            put(60)
            settle()

            present = c.exists_each(keys)
        st = node_stats(ports["http"])
        held = set().union(*ix.media.values())
        stored = {k for k, p in zip(keys, present) if p}
        assert len(stored) < len(keys) - 100, "the node was not filled past capacity"
        missing = stored - held
        left = held - stored
        assert not missing, f"{len(missing)} stored blocks missing from the events"
        assert not left, f"{len(left)} removed blocks left in the events"
        assert len(ix.media.get("GPU", ())) == st["blocks"]
        assert len(ix.media.get("CPU", ())) == st["tiers"]["host"]["blocks"]
        assert len(ix.media.get("DISK", ())) == st["tiers"]["ssd"]["blocks"]
        assert st["tiers"]["host"]["blocks"] > 0 and st["tiers"]["ssd"]["blocks"] > 0
    finally:
        d.stop()


def test_kv_index_routes_on_engine_events():
    """kvmesh.KvIndex fed with batches packed here from vLLM's format (an engine's int hashes, medium nil)."""

    def batch(*events):
        return msgpack.packb([time.time(), list(events)])

    ix = kvmesh.KvIndex()
    shared = [101, 102, 103, 104]
    ix.apply_batch("a", batch(["BlockStored", shared + [201, 202], None, [], 16, None, None, None]))
    ix.apply_batch("b", batch(["BlockStored", shared + [301], None, [], 16, None, "GPU", None]))
    ix.apply_batch("c", batch(["BlockStored", shared, None, [], 16, None, "CPU", None]))
    keys = [(0, h) for h in shared + [201, 202]]
    r = ix.route(keys, ["a", "b", "c", "d"])
    assert [m["instance"] for m in r] == ["a", "b", "c", "d"]
    assert [m["blocks"] for m in r] == [6, 4, 4, 0]
    assert r[1]["gpu_blocks"] == 4 and r[2]["gpu_blocks"] == 0 and r[2]["cpu_blocks"] == 4
    # a removal shortens a's prefix; a tie on prefix goes to the less loaded instance
    ix.apply_batch("a", batch(["BlockRemoved", [201], None]))
    ix.set_load("a", 0.9)
    r = ix.route(keys, ["a", "b"])
    assert r[0]["instance"] == "b" and r[0]["blocks"] == 4 and r[1]["blocks"] == 4
    ix.apply_batch("b", batch(["AllBlocksCleared"]))
    assert ix.route(keys, ["b"])[0]["blocks"] == 0
    with pytest.raises(kvmesh.InvalidArgumentError):
        ix.apply_batch("a", b"\xc1 not msgpack")


def test_kv_index_approximate_mode_follows_routing_history():
    """No engine events: blocks routed to an instance count as on its device until the TTL passes."""
    ttl = 1.0
    ix = kvmesh.KvIndex(approx_ttl=ttl)
    system = [(0, h) for h in (11, 12, 13)]
    turn1 = system + [(0, 21), (0, 22)]
    turn2 = turn1 + [(0, 23)]
    assert ix.route(turn2, ["e0", "e1"])[0]["blocks"] == 0
    ix.routed("e1", turn1)
    ix.routed("e0", system)
    r = ix.route(turn2, ["e0", "e1"])
    assert [(m["instance"], m["blocks"], m["gpu_blocks"]) for m in r] == [("e1", 5, 5), ("e0", 3, 3)]
    assert ix.approx_entries == 8
    time.sleep(ttl * 1.5)
    assert [m["blocks"] for m in ix.route(turn2, ["e0", "e1"])] == [0, 0]
    with pytest.raises(kvmesh.Error):
        kvmesh.KvIndex().routed("e0", system)  # approximate mode is off


def test_route_service_answers_over_http(tmp_path):
    """`kvmesh route` subscribed to a node's events answers POST /route for tokens the client stored."""
    cfg = {
        "model": dict(MODEL),
        "nodes": [{"id": "n0", "host": "127.0.0.1", "ports": {"data": 0, "http": 0, "resp": 0},
                   "memory": {"host": "16MiB"}}],
        "store": {"stripes": 1, "slot_bytes": BLOCK_BYTES},
        "transport": {"backend": "tcp", "timeout_ms": scaled(5000)},
        "coordinator": {"host": "127.0.0.1", "port": 0, "heartbeat_ms": 200, "dead_after_ms": 5000},
        "events": {"enabled": True},
    }
    path = tmp_path / "route.json"
    path.write_text(json.dumps(cfg))
    d = Daemons(config=str(path), nodes=("n0",)).start()
    try:
        ports = d.listening["n0"]["ports"]
        source = f"n0=tcp://127.0.0.1:{ports['events']},tcp://127.0.0.1:{ports['events_replay']}"
        ev = d.launch("route", ["route", "--config", str(path), "--source", source, "--port", "0"])
        url = f"http://127.0.0.1:{ev['ports']['http']}"

        def post(what, body):
            req = urllib.request.Request(url + what, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=scaled(5)) as r:
                return json.loads(r.read())

        tokens = list(range(1000, 1000 + 16 * 6))  # 6 full blocks
        with kvmesh.Client(d.address, timeout_ms=scaled(5000)) as c:
            c.put(tokens[:16 * 4], [bytes(BLOCK_BYTES)] * 4)
        end = time.monotonic() + scaled(10)
        while True:
            r = post("/route", {"tokens": tokens, "candidates": ["n0", "elsewhere"]})
            if r["matches"][0]["blocks"] == 4 or time.monotonic() > end:
                break
            time.sleep(0.05)
        assert r["keys"] == 6
        assert r["matches"][0] == {**r["matches"][0], "instance": "n0", "blocks": 4, "gpu_blocks": 4}
        assert r["matches"][1]["instance"] == "elsewhere" and r["matches"][1]["blocks"] == 0
        assert post("/load", {"instance": "n0", "load": 0.5}) == {"ok": True}
        assert post("/route", {"tokens": tokens})["matches"][0]["load"] == 0.5
        with pytest.raises(urllib.error.HTTPError) as e:
            post("/route", {"tokens": "not a list"})
        assert e.value.code == 400
    finally:
        d.stop()


def test_route_service_approximate_mode_over_http(tmp_path):
    """`kvmesh route --instance ... --approx-ttl`: no event source; POST /routed places a prompt on an
    engine, /route then finds its prefix there, and the TTL takes it away again."""
    path = tmp_path / "route.json"
    path.write_text(json.dumps({"model": dict(MODEL), "nodes": [{"id": "n0", "host": "127.0.0.1", "memory": {"host": "16MiB"}}]}))
    d = Daemons(config=str(path), nodes=())
    try:
        ttl = scaled(2.0)
        ev = d.launch("route", ["route", "--config", str(path), "--instance", "e0", "--instance", "e1",
                                "--approx-ttl", str(ttl), "--port", "0"])
        url = f"http://127.0.0.1:{ev['ports']['http']}"

        def post(what, body):
            req = urllib.request.Request(url + what, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=scaled(5)) as r:
                return json.loads(r.read())

        system = list(range(5000, 5000 + 16 * 3))        # 3 blocks shared by both turns
        turn1 = system + list(range(9000, 9000 + 16 * 2))  # 5 blocks
        assert [m["blocks"] for m in post("/route", {"tokens": turn1})["matches"]] == [0, 0]
        t0 = time.monotonic()
        assert post("/routed", {"instance": "e1", "tokens": turn1}) == {"ok": True}
        assert post("/routed", {"instance": "e0", "tokens": system}) == {"ok": True}
        r = post("/route", {"tokens": turn1 + list(range(7000, 7016))})
        assert time.monotonic() - t0 < ttl, "the machine is too slow for this TTL"
        assert [(m["instance"], m["blocks"]) for m in r["matches"]] == [("e1", 5), ("e0", 3)]
        end = time.monotonic() + scaled(10)
        while post("/route", {"tokens": turn1})["matches"][0]["blocks"] != 0 and time.monotonic() < end:
            time.sleep(0.1)
        assert time.monotonic() - t0 >= ttl
        assert [m["blocks"] for m in post("/route", {"tokens": turn1})["matches"]] == [0, 0]
        with pytest.raises(urllib.error.HTTPError) as e:
            post("/routed", {"instance": "e0", "tokens": "not a list"})
        assert e.value.code == 400
    finally:
        d.stop()
