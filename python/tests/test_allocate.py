"""Client.allocate: registered memory owned by a Python object with the buffer
protocol. Round trips through numpy and torch views of it (embedded, daemons
over TCP, daemons over UCX), and its lifetime: views outlive the Allocation
object, close() refuses while views exist, the client may close first."""

import gc
import re
import signal
import threading
import time
import urllib.request

import numpy as np
import pytest
import torch

import kvmesh
from conftest import daemons_over, embedded_config, scaled

BT = 16


def blocks(client, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, client.block_bytes), dtype=np.uint8)


def round_trip(c, n=12, seed=7):
    """Puts n blocks from a numpy view of one allocation and reads them into a
    torch view of another, by buffer and by address; returns the data."""
    bb = c.block_bytes
    keys = c.keys(list(range(1000, 1000 + n * BT)))
    src, dst = c.allocate(n * bb), c.allocate(n * bb)
    assert src.nbytes == n * bb and len(src) == n * bb and src.registered and not src.closed
    assert src.region.allocated and src.region.obj is None and src.region.registered
    assert src.address % 4096 == 0 and src.region.address == src.address
    assert {src.region.id, dst.region.id} <= {r.id for r in c.regions}
    data = blocks(c, n, seed)
    s = np.frombuffer(src, dtype=np.uint8).reshape(n, bb)
    s[:] = data
    assert all(c.put_from(keys, [s[i] for i in range(n)]))
    d = torch.frombuffer(dst, dtype=torch.uint8).view(n, bb)
    st = c.get_into(keys, [d[i] for i in range(n)])
    assert all(x.ok and x.size == bb for x in st)
    assert bytes(memoryview(dst)) == data.tobytes()
    # By address, into the other half of the blocks' order.
    d.zero_()
    assert all(c.get_into_ptrs(keys, [dst.address + (n - 1 - i) * bb for i in range(n)], bb))
    assert np.array_equal(np.frombuffer(dst, dtype=np.uint8).reshape(n, bb)[::-1], data)
    # put_from_ptrs from the allocation, under other keys.
    keys2 = c.keys(list(range(50000, 50000 + n * BT)))
    assert all(c.put_from_ptrs(keys2, [src.address + i * bb for i in range(n)], bb))
    out = [bytearray(bb) for _ in keys2]
    assert all(c.get_into(keys2, out))
    assert all(bytes(o) == data[i].tobytes() for i, o in enumerate(out))
    return src, dst, data


def test_allocations_round_trip_through_numpy_and_torch_views(client):
    src, dst, _ = round_trip(client)
    del src, dst
    gc.collect()
    assert client.regions == []  # the last reference gone: unregistered and freed


def test_allocate_refuses_zero_bytes(embedded):
    with pytest.raises(kvmesh.InvalidArgumentError):
        embedded.allocate(0)


def test_the_allocation_outlives_its_object_while_a_numpy_view_exists(embedded):
    c = embedded
    bb = c.block_bytes
    a = c.allocate(4 * bb)
    view = np.frombuffer(a, dtype=np.uint8).reshape(4, bb)
    region = a.region
    del a
    gc.collect()
    assert region.registered and len(c.regions) == 1  # the view holds the allocation
    keys = c.keys(list(range(4 * BT)))
    data = blocks(c, 4, 3)
    assert all(c.put_from(keys, list(data)))
    assert all(c.get_into(keys, [view[i] for i in range(4)]))
    assert np.array_equal(view, data)
    del view
    gc.collect()
    assert not region.registered and c.regions == []


def test_close_refuses_while_a_view_exists_and_then_refuses_new_views(embedded):
    c = embedded
    a = c.allocate(1 << 20)
    m = memoryview(a)
    arr = np.frombuffer(a, dtype=np.float16)
    assert a.exports == 2
    with pytest.raises(BufferError):
        a.close()
    with pytest.raises(BufferError):
        with a:
            pass
    assert a.registered and not a.closed
    m.release()
    del arr
    gc.collect()
    assert a.exports == 0
    a.close()
    assert a.closed and not a.registered and c.regions == []
    a.close()  # twice is fine
    with pytest.raises(ValueError):
        memoryview(a)
    with pytest.raises(kvmesh.InvalidArgumentError, match="closed"):
        c.get_into(c.keys(list(range(BT))), [a])


def test_a_torch_view_keeps_the_memory_after_close(embedded):
    # torch.frombuffer keeps a reference to the object but no buffer export, so
    # close() succeeds; the memory must still be there for the tensor.
    c = embedded
    a = c.allocate(1 << 16)
    t = torch.frombuffer(a, dtype=torch.int32)
    a.close()
    del a
    gc.collect()
    t.copy_(torch.arange(t.numel(), dtype=torch.int32))
    assert int(t.sum()) == sum(range(t.numel()))
    assert c.regions == []


def test_closing_the_client_first_leaves_the_views_valid():
    c = kvmesh.EmbeddedCluster(embedded_config(), tenant="client-first")
    bb = c.block_bytes
    a = c.allocate(2 * bb)
    arr = np.frombuffer(a, dtype=np.uint8)
    t = torch.frombuffer(a, dtype=torch.uint8)
    keys = c.keys(list(range(2 * BT)))
    assert all(c.put_from(keys, list(blocks(c, 2, 5))))
    assert all(c.get_into(keys, [arr[:bb], arr[bb:]]))
    before = arr.copy()
    c.close()
    assert c.closed and not a.registered
    assert np.array_equal(arr, before)
    arr[:] = 7  # still writable memory
    assert int(t[-1]) == 7
    with pytest.raises(kvmesh.FailedPreconditionError):
        c.get_into(keys, [arr[:bb], arr[bb:]])
    with pytest.raises(BufferError):
        a.close()
    del arr
    gc.collect()
    a.close()
    del c, a, t
    gc.collect()


def test_an_allocation_keeps_its_client_open():
    a = kvmesh.EmbeddedCluster(embedded_config(), tenant="kept").allocate(1 << 20)
    gc.collect()
    c = a.client
    assert not c.closed and c.num_nodes == 3 and a.registered
    keys = c.keys(list(range(BT)))
    data = blocks(c, 1, 9)[0]
    assert all(c.put_from(keys, [data]))
    view = memoryview(a)[:c.block_bytes]
    assert all(c.get_into(keys, [view]))
    assert bytes(view) == data.tobytes()
    view.release()
    c.close()


def test_dropping_an_allocation_under_a_call_in_flight_waits_for_it(daemons):
    # get_into_ptrs holds the region (and so the memory), not the Python object:
    # the last reference going away mid-call unregisters only after the call.
    # The timeout grows with the build: the running nodes must answer within it.
    # 2 s, not less: under a loaded CI machine this thread may first run again
    # hundreds of ms after the get started; the get must still be in flight then.
    with kvmesh.Client(daemons.address, tenant="drop-in-flight", timeout_ms=scaled(2000), refresh_ms=0) as c:
        bb, n = c.block_bytes, 24
        keys = c.keys(list(range(3000, 3000 + n * BT)))
        data = blocks(c, n, 21)
        assert all(c.put_from(keys, list(data)))
        a = c.allocate(n * bb)
        base = a.address
        results = []
        gets = c.stats()["gets"]
        daemons.signal("n0", signal.SIGSTOP)
        try:
            th = threading.Thread(target=lambda: results.append(
                c.get_into_ptrs(keys, [base + i * bb for i in range(n)], bb)))
            th.start()
            deadline = time.monotonic() + scaled(5)
            while c.stats()["gets"] == gets and time.monotonic() < deadline:
                time.sleep(0.005)  # until the get is in the router (then waiting on n0)
            t0 = time.monotonic()
            del a
            gc.collect()  # the Allocation's end: unregister, which waits for the call
            waited = time.monotonic() - t0
            th.join()
        finally:
            daemons.signal("n0", signal.SIGCONT)
        assert waited >= scaled(0.2)  # held until the get returned (its timeout is 2 s, scaled)
        assert c.regions == []
        st = results[0]
        assert any(s.ok for s in st) and any(s.miss for s in st)
    daemons.wait_nodes(3)


def node_metric(d, node, name):
    port = d.listening[node]["ports"]["http"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        m = re.search(rf"^{name} (\d+)", r.read().decode(), re.M)
    return int(m.group(1)) if m else 0


@pytest.mark.skipif(not kvmesh.HAVE_UCX, reason="kvmesh built without UCX")
def test_allocations_over_ucx_move_one_sided(tmp_path):
    # Without local reads: every GET goes to the node as GET_INTO.
    d = daemons_over("ucx", tmp_path, ucx={"local_reads": False})
    try:
        with kvmesh.Client(d.address, tenant="ucx-allocate") as c:
            moved = sum(node_metric(d, n, "kvmesh_ucx_one_sided_bytes_total") for n in d.node_ids)
            src, dst, data = round_trip(c, n=20)
            after = sum(node_metric(d, n, "kvmesh_ucx_one_sided_bytes_total") for n in d.node_ids)
            # put_from, get_into, get_into_ptrs and put_from_ptrs on allocations: one-sided, no bounce.
            assert after - moved >= 4 * data.nbytes
            src.close()
            dst.close()
            assert c.regions == []
    finally:
        d.stop()


def test_the_benchmark_runs_and_checks_its_bytes():
    import os
    import subprocess
    import sys
    from conftest import KVMESH_BIN, SOURCE_DIR, scaled
    bench = os.path.join(SOURCE_DIR, "bench", "bench_allocate.py")
    p = subprocess.run([sys.executable, bench, "--transport", "tcp", "--kvmesh-bin", KVMESH_BIN, "--blocks", "8",
                        "--batch", "4", "--rounds", "3"], capture_output=True, text=True, timeout=scaled(120))
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^ratio register / allocate \(median time\): [\d.]+x$", p.stdout, re.M), p.stdout


@pytest.mark.skipif(not kvmesh.HAVE_UCX, reason="kvmesh built without UCX")
def test_gets_over_ucx_on_the_nodes_host_are_local_reads(tmp_path):
    # With local reads (the default) the client maps the nodes' pools: GETs
    # move no byte through the nodes (only the puts are one-sided), return
    # the same bytes, and come back to the nodes as hits.
    d = daemons_over("ucx", tmp_path)
    try:
        with kvmesh.Client(d.address) as c:
            moved = sum(node_metric(d, n, "kvmesh_ucx_one_sided_bytes_total") for n in d.node_ids)
            hits = sum(node_metric(d, n, "kvmesh_store_hits_total") for n in d.node_ids)
            src, dst, data = round_trip(c, n=20)
            after = sum(node_metric(d, n, "kvmesh_ucx_one_sided_bytes_total") for n in d.node_ids)
            # put_from and put_from_ptrs one-sided; get_into, get_into_ptrs and the bytearray gets local.
            assert 2 * data.nbytes <= after - moved < 3 * data.nbytes
            deadline = time.monotonic() + scaled(5)
            while sum(node_metric(d, n, "kvmesh_store_hits_total") for n in d.node_ids) < hits + 60:
                assert time.monotonic() < deadline, "the local reads never reached the nodes as hits"
                time.sleep(0.02)
            src.close()
            dst.close()
    finally:
        d.stop()
