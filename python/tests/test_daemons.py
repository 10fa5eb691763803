"""kvmesh.Client against real daemons: a client from a config file, the GIL
released while a call waits on a stalled node, unregister waiting for a call
in flight, registered memory over UCX, and a killed node's blocks coming back
as per-item misses."""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

import kvmesh
from conftest import DAEMONS_CONFIG, Daemons, daemons_over, scaled
from launch import die_with_parent

BT = 16


def fill(client, n, seed, base):
    t = list(range(base, base + n * BT))
    rng = np.random.default_rng(seed)
    data = [rng.integers(0, 256, client.block_bytes, dtype=np.uint8) for _ in range(n)]
    client.put(t, data)
    return client.keys(t), data


def cluster_epoch(daemons):
    with kvmesh.Client(daemons.address, tenant="epoch-probe", timeout_ms=scaled(2000)) as p:
        return p.epoch


def stalled_node_scenario(daemons, run):
    """Runs `run(e0)`, a scenario that stops a node and needs the client's
    map, taken at cluster epoch e0, to hold that node when the stop begins.
    On an overloaded machine a node can miss heartbeats for `dead_after_ms`
    (1 s in this config) and be dropped and re-admitted before that; the
    client's map then lacks the node and the call never waits on it. `run`
    returns None when it finds the epoch moved before its stop, else its
    result; at most three tries. (The stop itself may outlast dead_after_ms:
    what happens after it is the scenario.)"""
    for _ in range(3):
        daemons.wait_nodes(3)
        e0 = cluster_epoch(daemons)
        out = run(e0)
        daemons.wait_nodes(3)
        if out is not None:
            return out
    pytest.fail("the cluster's membership changed during each of three tries")


def test_client_from_a_config_file(daemons, tmp_path):
    cfg = json.load(open(DAEMONS_CONFIG))
    host, port = daemons.address.split(":")
    cfg["coordinator"]["port"] = int(port)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cfg))
    with kvmesh.Client(config=str(path), tenant="from-config") as c:
        assert c.num_nodes == 3 and c.epoch >= 1
        keys, data = fill(c, 4, seed=1, base=100)
        assert c.match_prefix(list(range(100, 100 + 4 * BT))) == 4
        assert c.get(keys[3]) == data[3].tobytes()
    # The config's own port (7070) is not what the test's coordinator listens on.
    cfg["coordinator"]["port"] = 0
    path.write_text(json.dumps(cfg))
    with pytest.raises(kvmesh.InvalidArgumentError):
        kvmesh.Client(config=str(path))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_from_a_config_tries_each_of_its_coordinator_addresses(daemons, tmp_path):
    # $.coordinator.addresses (an etcd-backed control plane lists every
    # coordinator): the first is down, the client goes on to the next.
    cfg = json.load(open(DAEMONS_CONFIG))
    cfg["coordinator"]["port"] = 0
    cfg["coordinator"]["addresses"] = [f"127.0.0.1:{free_port()}", daemons.address]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cfg))
    with kvmesh.Client(config=str(path), tenant="addresses", connect_timeout_ms=300) as c:
        assert c.num_nodes == 3
        keys, data = fill(c, 4, seed=3, base=200)
        assert c.get(keys[1]) == data[1].tobytes()


ETCD = "/usr/bin/etcd"


@pytest.mark.skipif(not os.access(ETCD, os.X_OK), reason=f"{ETCD} is missing (Debian: etcd-server)")
def test_client_from_a_config_fails_over_between_coordinators_on_etcd(tmp_path):
    # A real etcd, two coordinators keeping the map in it, three nodes; the
    # Python client from a config that lists both coordinators. The one it
    # talks to is killed: the client keeps its blocks, and a client created
    # from the same config afterwards (its first address dead) connects
    # through the other and reads them back.
    client_url, peer_url = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    etcd = subprocess.Popen([ETCD, "--name", "t", "--data-dir", str(tmp_path / "etcd"),
                             "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", f"t={peer_url}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "etcd.log", "wb"),
                            start_new_session=True, preexec_fn=die_with_parent)
    d = Daemons(log_dir=str(tmp_path))
    try:
        end = time.monotonic() + scaled(10)
        while True:  # etcd's v3 gateway answers once the member serves
            try:
                urllib.request.urlopen(urllib.request.Request(client_url + "/v3/kv/range", b'{"key":"AA=="}'),
                                       timeout=1).read()
                break
            except OSError:
                assert time.monotonic() < end, open(tmp_path / "etcd.log").read()[-2000:]
                time.sleep(0.05)
        cfg = json.load(open(DAEMONS_CONFIG))
        cfg["coordinator"]["etcd"] = {"endpoints": [client_url[len("http://"):]], "lease_ms": 2000,
                                      "request_timeout_ms": 500}
        server_cfg = tmp_path / "server.json"
        server_cfg.write_text(json.dumps(cfg))
        addresses = []
        for name in ("c0", "c1"):
            ev = d.launch(name, ["coordinator", "--config", str(server_cfg), "--port", "0"])
            addresses.append(f"127.0.0.1:{ev['ports']['http']}")
        for n in ("n0", "n1", "n2"):
            d.launch(n, ["node", "--config", str(server_cfg), "--id", n, "--coordinator", ",".join(addresses)])
        cfg["coordinator"]["port"] = 0
        cfg["coordinator"]["addresses"] = addresses
        client_cfg = tmp_path / "client.json"
        client_cfg.write_text(json.dumps(cfg))
        end = time.monotonic() + scaled(15)
        while True:  # the leader publishes the map of the three nodes
            try:
                with kvmesh.Client(config=str(client_cfg), tenant="probe") as p:
                    if p.num_nodes == 3:
                        break
            except kvmesh.Error:
                pass
            assert time.monotonic() < end, "no map of three nodes: " + d.log("c0") + d.log("c1")
            time.sleep(0.1)
        with kvmesh.Client(config=str(client_cfg), tenant="failover", refresh_ms=200) as c:
            keys, data = fill(c, 8, seed=4, base=300)
            d.kill("c0")  # the first address: the one every client and node talks to
            assert [c.get(k) for k in keys] == [b.tobytes() for b in data]
            with kvmesh.Client(config=str(client_cfg), tenant="failover", connect_timeout_ms=300) as late:
                assert late.num_nodes == 3
                assert [late.get(k) for k in keys] == [b.tobytes() for b in data]
            # The first client refreshes its map from the surviving coordinator and still finds every block.
            time.sleep(0.5)
            assert c.match_prefix(list(range(300, 300 + 8 * BT))) == 8
    finally:
        d.kill_all()
        etcd.kill()
        etcd.wait()


def test_unreachable_coordinator_raises():
    with pytest.raises(kvmesh.Error) as e:
        kvmesh.Client("127.0.0.1:1", timeout_ms=300, connect_timeout_ms=100)
    assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "IO_ERROR")


def test_gil_is_released_while_a_get_waits_on_a_stalled_node(daemons):
    # The timeout grows with the build: the two running nodes must answer within it.
    def run(e0):
        with kvmesh.Client(daemons.address, tenant="gil", timeout_ms=scaled(600), refresh_ms=0) as c:
            keys, data = fill(c, 48, seed=2, base=1000)  # spread over the three nodes
            outs = [bytearray(c.block_bytes) for _ in keys]
            ticks = [0]
            stop = threading.Event()

            def spin():  # pure Python: runs only while nobody holds the GIL
                while not stop.is_set():
                    ticks[0] += 1

            if c.epoch != e0 or cluster_epoch(daemons) != e0:
                return None  # membership changed before the stop: the map may lack n1
            daemons.signal("n1", signal.SIGSTOP)
            spinner = threading.Thread(target=spin)
            try:
                spinner.start()
                time.sleep(0.05)
                before, t0 = ticks[0], time.monotonic()
                st = c.get_into(keys, outs)
                waited, during = time.monotonic() - t0, ticks[0] - before
            finally:
                stop.set()
                spinner.join()
                daemons.signal("n1", signal.SIGCONT)
            return st, waited, during, outs, data, len(keys)

    st, waited, during, outs, data, n = stalled_node_scenario(daemons, run)
    assert waited >= scaled(0.4)  # the stalled node held the call to its timeout ...
    assert during > 10000  # ... and Python ran meanwhile
    codes = {s.code for s in st}
    missed = [i for i, s in enumerate(st) if not s.ok]
    assert missed and len(missed) < n
    assert codes <= {"OK", "DEADLINE_EXCEEDED", "UNAVAILABLE"}
    assert all(st[i].miss for i in missed)
    assert all(bytes(outs[i]) == data[i].tobytes() for i in range(n) if st[i].ok)


def test_unregister_waits_for_a_call_in_flight(daemons):
    import torch
    # The get waits on the stopped n0 for its whole timeout (1.5 s, grown with
    # the build); unregister is called once the router has counted the get,
    # and must not return before the get has.
    def run(e0):
        with kvmesh.Client(daemons.address, tenant="unregister", timeout_ms=scaled(1500), refresh_ms=0) as c:
            keys, data = fill(c, 24, seed=5, base=3000)  # spread over the three nodes
            bb = c.block_bytes
            pool = torch.zeros(len(keys), bb, dtype=torch.uint8)
            region = c.register(pool)
            ptrs = [pool[i].data_ptr() for i in range(len(keys))]
            results, calling = [], threading.Event()

            def getter():
                calling.set()
                g0 = time.monotonic()
                st = c.get_into_ptrs(keys, ptrs, bb)
                results.append((st, g0, time.monotonic()))

            gets = c.stats()["gets"]
            if c.epoch != e0 or cluster_epoch(daemons) != e0:
                return None  # membership changed before the stop: the map may lack n0
            daemons.signal("n0", signal.SIGSTOP)
            try:
                th = threading.Thread(target=getter)
                th.start()
                assert calling.wait(scaled(10))
                deadline = time.monotonic() + scaled(5)
                while c.stats()["gets"] == gets and time.monotonic() < deadline:
                    time.sleep(0.005)  # until the get is in the router (then waiting on n0)
                c.unregister(region)
                unregistered = time.monotonic()
                th.join()
            finally:
                daemons.signal("n0", signal.SIGCONT)
            st, g0, g1 = results[0]
            return st, g0, g1, unregistered, region.registered, c.regions, pool, data

    st, g0, g1, unregistered, registered, regions, pool, data = stalled_node_scenario(daemons, run)
    assert g1 - g0 >= scaled(1.0)  # the get did wait on n0 ...
    assert unregistered - g0 >= scaled(1.0)  # ... and unregister was held until it returned
    assert any(s.ok for s in st) and any(s.miss for s in st)
    assert all(bytes(pool[i].numpy()) == data[i].tobytes() for i, s in enumerate(st) if s.ok)
    assert not registered and regions == []


@pytest.mark.skipif(not kvmesh.HAVE_UCX, reason="kvmesh built without UCX")
def test_registered_memory_over_ucx(tmp_path):
    import torch
    d = daemons_over("ucx", tmp_path)
    try:
        with kvmesh.Client(d.address, tenant="ucx") as c:
            keys = c.keys(list(range(20 * BT)))
            src = torch.randint(0, 256, (20, c.block_bytes), dtype=torch.uint8)
            dst = torch.zeros_like(src)
            c.register(src)
            c.register(dst)
            assert all(c.put_from_ptrs(keys, [src[i].data_ptr() for i in range(20)], c.block_bytes))
            assert all(c.get_into_ptrs(keys, [dst[i].data_ptr() for i in range(20)], c.block_bytes))
            assert torch.equal(src, dst)
            plain = [bytearray(c.block_bytes) for _ in keys]  # unregistered: through a bounce buffer
            assert all(c.get_into(keys, plain))
            assert all(bytes(p) == bytes(src[i].numpy()) for i, p in enumerate(plain))
    finally:
        d.stop()


def test_a_killed_nodes_blocks_are_misses_not_errors():
    d = Daemons().start()
    try:
        with kvmesh.Client(d.address, tenant="kill", timeout_ms=1000, refresh_ms=100) as c:
            keys, data = fill(c, 30, seed=3, base=5000)
            assert c.exists(keys) == 30
            d.signal("n2", signal.SIGKILL)
            outs = [bytearray(c.block_bytes) for _ in keys]
            st = c.get_into(keys, outs)
            hits = [i for i, s in enumerate(st) if s.ok]
            assert 0 < len(hits) < 30
            assert all(s.miss for s in st if not s.ok)
            assert all(bytes(outs[i]) == data[i].tobytes() for i in hits)
            assert c.match_prefix(list(range(5000, 5000 + 30 * BT))) < 30
            d.wait_nodes(2)
            deadline = time.monotonic() + scaled(5)
            while c.num_nodes != 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert c.num_nodes == 2
            # New blocks go to the two nodes left and read back whole.
            keys2, data2 = fill(c, 10, seed=4, base=9000)
            outs = [bytearray(c.block_bytes) for _ in keys2]
            assert all(c.get_into(keys2, outs))
            assert all(bytes(o) == x.tobytes() for o, x in zip(outs, data2))
    finally:
        d.stop()


def test_tenants_never_read_each_others_blocks(tmp_path):
    cfg = json.load(open(DAEMONS_CONFIG))
    cfg["auth"] = {"token": "cluster-secret", "tenants": [
        {"name": "alpha", "token": "alpha-pass"}, {"name": "beta", "password": "beta-pass"}]}
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(cfg))
    d = Daemons(config=str(path), secret="cluster-secret").start()
    try:
        tokens = list(range(7000, 7000 + 4 * BT))
        with kvmesh.Client(d.address, tenant="alpha", token="alpha-pass") as a, \
                kvmesh.Client(d.address, tenant="beta", token="beta-pass", salt="alpha") as b:
            keys = a.keys(tokens)
            assert b.keys(tokens) == keys  # the same salt: the same key bytes
            data = [np.full(a.block_bytes, i + 1, dtype=np.uint8) for i in range(4)]
            assert all(a.put_from(keys, data))
            raw = (0x1234, 0x5678)
            assert all(a.put_from([raw], [data[0]]))
            # beta sends the very same key bytes: nothing of alpha's is there.
            assert b.exists(keys) == 0 and b.match_prefix(tokens) == 0
            outs = [bytearray(b.block_bytes) for _ in keys]
            st = b.get_into(keys + [raw], outs + [bytearray(b.block_bytes)])
            assert all(s.code == "NOT_FOUND" for s in st)
            b.erase(keys)  # erases nothing of alpha's
            # beta's own block under the same key is beta's; alpha still reads its own.
            assert all(b.put_from([raw], [data[3]]))
            got = [bytearray(a.block_bytes) for _ in keys]
            assert all(a.get_into(keys, got)) and all(bytes(g) == x.tobytes() for g, x in zip(got, data))
            assert a.get(raw) == data[0].tobytes() and b.get(raw) == data[3].tobytes()
        # The cluster secret sees neither tenant's blocks; a wrong tenant token is refused.
        with kvmesh.Client(d.address, token="cluster-secret", salt="alpha") as c:
            assert c.exists(c.keys(tokens)) == 0
        with pytest.raises(kvmesh.Error):
            with kvmesh.Client(d.address, tenant="alpha", token="beta-pass", connect_timeout_ms=500) as bad:
                bad.get_into([raw], [bytearray(bad.block_bytes)])
    finally:
        d.stop()
