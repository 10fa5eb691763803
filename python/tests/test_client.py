"""kvmesh.Client and kvmesh.EmbeddedCluster: every call against an in-process
cluster and against daemons, bytes compared, misses per item, bad input raising."""

import threading

import numpy as np
import pytest
import torch

import kvmesh
from conftest import MODEL, embedded_config

BT = MODEL["block_tokens"]


def tokens(n, base=1000):
    return list(range(base, base + n))


def blocks(client, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, client.block_bytes, dtype=np.uint8) for _ in range(n)]


def test_model_and_keys(client):
    assert client.model["num_layers"] == MODEL["num_layers"]
    assert client.block_tokens == BT
    assert client.block_bytes == 2 * 4 * 4 * BT * 64 * 2
    assert client.num_nodes == 3
    keys = client.keys(tokens(100))
    assert len(keys) == 100 // BT  # the trailing partial block has no key
    assert all(isinstance(k, tuple) and len(k) == 2 and 0 <= k[0] < 2**64 and 0 <= k[1] < 2**64 for k in keys)
    assert keys == client.keys(tokens(100))
    # A key names its whole prefix: changing token 0 changes every key.
    other = client.keys([7] + tokens(99, 1001))
    assert not set(keys) & set(other)
    # A slice has its own keys; the same tokens in every accepted form give the same keys.
    assert client.keys(tokens(100), layers=(0, 1))[0] != keys[0]
    assert client.keys(np.arange(1000, 1100, dtype=np.int64)) == keys
    assert client.keys(torch.arange(1000, 1100)) == keys
    assert client.keys(range(1000, 1100)) == keys
    assert kvmesh.key_from_hex(kvmesh.key_hex(keys[0])) == keys[0]
    assert client.exists_each(np.array(keys, dtype=np.uint64)) == [False] * len(keys)  # numpy keys too


def test_tenants_never_share_keys():
    with kvmesh.EmbeddedCluster(embedded_config(), tenant="a") as a, \
            kvmesh.EmbeddedCluster(embedded_config(), tenant="b") as b:
        assert not set(a.keys(tokens(64))) & set(b.keys(tokens(64)))


def test_put_match_get_bytes(client):
    t = tokens(6 * BT + 5)
    assert client.match_prefix(t) == 0
    data = blocks(client, 6, seed=1)
    client.put(t, data[:2])
    assert client.match_prefix(t) == 2
    client.put(t, data[2:], first_block=2)
    assert client.match_prefix(t) == 6
    keys = client.keys(t)
    for k, d in zip(keys, data):
        assert client.get(k) == d.tobytes()
    diverged = list(t)
    diverged[3 * BT + 1] += 1
    assert client.match_prefix(diverged) == 3


def test_get_into_and_put_from_every_buffer_kind(client):
    t = tokens(4 * BT, base=5000)
    keys = client.keys(t)
    data = blocks(client, 4, seed=2)
    st = client.put_from(keys, [data[0], bytearray(data[1].tobytes()), memoryview(data[2].tobytes()),
                                torch.from_numpy(data[3].copy())])
    assert [s.code for s in st] == ["OK"] * 4
    assert all(s.ok and s.size == client.block_bytes for s in st)
    outs = [bytearray(client.block_bytes), np.zeros(client.block_bytes, np.uint8),
            torch.zeros(client.block_bytes // 2, dtype=torch.float16), memoryview(bytearray(client.block_bytes))]
    st = client.get_into(keys, outs)
    assert all(s.ok and s.size == client.block_bytes for s in st)
    assert bytes(outs[0]) == data[0].tobytes()
    assert outs[1].tobytes() == data[1].tobytes()
    assert outs[2].numpy().tobytes() == data[2].tobytes()
    assert bytes(outs[3]) == data[3].tobytes()


def test_misses_are_per_item(client):
    t = tokens(3 * BT, base=9000)
    keys = client.keys(t)
    data = blocks(client, 3, seed=3)
    client.put_from([keys[0], keys[2]], [data[0], data[2]])
    outs = [bytearray(client.block_bytes) for _ in keys]
    st = client.get_into(keys, outs)
    assert [s.code for s in st] == ["OK", "NOT_FOUND", "OK"]
    assert st[1].miss and not st[1].ok and not bool(st[1])
    assert bytes(outs[0]) == data[0].tobytes() and bytes(outs[2]) == data[2].tobytes()
    assert client.exists(keys) == 1  # consecutive hits from the first
    assert client.exists_each(keys) == [True, False, True]
    assert client.exists([]) == 0
    # A destination too small: RESOURCE_EXHAUSTED with the size needed.
    small = bytearray(100)
    st = client.get_into(keys[:1], [small])
    assert st[0].code == "RESOURCE_EXHAUSTED" and st[0].size == client.block_bytes and not st[0].miss
    with pytest.raises(kvmesh.NotFoundError) as e:
        client.get(keys[1])
    assert e.value.code == "NOT_FOUND" and isinstance(e.value, LookupError) and isinstance(e.value, kvmesh.Error)
    client.release(keys)  # an eviction hint: nothing leaves now, absent keys are fine
    assert client.exists_each(keys) == [True, False, True]
    client.erase(keys)
    assert client.exists_each(keys) == [False, False, False]


def test_registered_memory_zero_copy(client):
    t = tokens(8 * BT, base=20000)
    keys = client.keys(t)
    bb = client.block_bytes
    pool = torch.zeros(8, bb, dtype=torch.uint8)
    src = torch.from_numpy(np.stack(blocks(client, 8, seed=4)))
    region = client.register(src)
    assert region.registered and region.writable and not region.device
    assert region.nbytes == 8 * bb and region.address == src.data_ptr() and region.obj is src
    pool_region = client.register(pool)
    assert [r.id for r in client.regions] == [region.id, pool_region.id]
    st = client.put_from_ptrs(keys, [src[i].data_ptr() for i in range(8)], bb)
    assert all(s.ok for s in st)
    st = client.get_into_ptrs(keys, [pool[i].data_ptr() for i in range(8)], [bb] * 8)
    assert all(s.ok for s in st)
    assert torch.equal(pool, src)
    # Views of a registered tensor go through get_into as well.
    pool.zero_()
    assert all(client.get_into(keys, [pool[i] for i in range(8)]))
    assert torch.equal(pool, src)
    # Overlapping registration, addresses outside every region, unknown regions: errors.
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.register(pool[2:4])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into_ptrs(keys[:1], [pool.data_ptr() + 8 * bb - 10], bb)
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.put_from_ptrs(keys[:1], [12345], bb)
    client.unregister(pool_region)
    assert not pool_region.registered and pool_region.obj is None
    with pytest.raises(kvmesh.NotFoundError):
        client.unregister(pool_region)
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into_ptrs(keys[:1], [pool.data_ptr()], bb)


class _Made:
    """Items a sequence makes on access (as a numpy array makes its rows):
    each records when it is finalized, and its __del__ keeps it alive
    (resurrects it), so a call that used it after letting it go is caught
    here instead of reading freed memory."""
    finalized = []
    late = []  # items read after they were finalized

    @classmethod
    def reset(cls):
        cls.finalized.clear()
        cls.late.clear()


class _Pair(tuple):
    def __getitem__(self, i):
        if any(x is self for x in _Made.finalized):
            _Made.late.append(self)
        return tuple.__getitem__(self, i)

    def __del__(self):
        _Made.finalized.append(self)


class _Block(bytearray):
    def __del__(self):
        _Made.finalized.append(self)


class _Fresh:
    """A sequence whose items are made anew on every access; it notes which
    items were already finalized when the next one is asked for."""

    def __init__(self, make, n):
        self.make, self.n = make, n
        self.made = None  # id() of the last item made: holding the item would keep it alive
        self.gone_before_next = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        # A finalized item stays alive in _Made.finalized, so its id is not reused.
        self.gone_before_next += any(id(x) == self.made for x in _Made.finalized)
        item = self.make(i)
        self.made = id(item)
        return item


def test_items_made_on_access_are_held_while_read(client):
    """The keys, blocks and pointers of a call may be items a sequence makes
    on access (a numpy array's rows and scalars). Each is held while the call
    reads it: none is finalized before it is read (it was, once, under
    ASan: a row freed and then used)."""
    t = tokens(4 * BT, base=40000)
    keys = client.keys(t)
    data = blocks(client, 4, seed=9)
    _Made.reset()
    try:
        blocks_seq = _Fresh(lambda i: _Block(data[i].tobytes()), 4)
        client.put(t, blocks_seq)
        # A put holds every block until the call is done.
        assert blocks_seq.gone_before_next == 0
        key_seq = _Fresh(lambda i: _Pair(keys[i]), 4)
        assert client.exists_each(key_seq) == [True] * 4
        outs = [bytearray(client.block_bytes) for _ in keys]
        assert all(client.get_into(_Fresh(lambda i: _Pair(keys[i]), 4), outs))
        assert [bytes(o) for o in outs] == [d.tobytes() for d in data]
        assert not _Made.late, "a key was read after it was finalized"
    finally:
        _Made.reset()
    # numpy and torch arrays of keys, pointers and sizes.
    assert client.exists_each(np.array(keys, dtype=np.uint64)) == [True] * 4
    pool = torch.zeros(4, client.block_bytes, dtype=torch.uint8)
    region = client.register(pool)
    try:
        ptrs = np.array([pool[i].data_ptr() for i in range(4)], dtype=np.uint64)
        st = client.get_into_ptrs(np.array(keys, dtype=np.uint64), ptrs, np.full(4, client.block_bytes))
        assert all(s.ok for s in st)
        assert bytes(pool.numpy()) == b"".join(d.tobytes() for d in data)
        pool.zero_()
        assert all(client.get_into_ptrs(keys, torch.tensor(ptrs.astype(np.int64)), client.block_bytes))
        assert bytes(pool.numpy()) == b"".join(d.tobytes() for d in data)
    finally:
        client.unregister(region)


def test_read_only_memory_is_for_put_only(client):
    bb = client.block_bytes
    payload = bytes(range(256)) * (bb // 256)
    keys = client.keys(tokens(BT, base=777))
    region = client.register(payload)
    assert not region.writable
    import ctypes
    address = ctypes.cast(ctypes.c_char_p(payload), ctypes.c_void_p).value
    assert address == region.address
    assert client.put_from_ptrs(keys, [address], bb)[0].ok
    assert client.get(keys[0]) == payload
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into_ptrs(keys, [address], bb)
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into(keys, [payload])


def test_bad_input_raises(client):
    keys = client.keys(tokens(2 * BT))
    bb = client.block_bytes
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into([(1,)], [bytearray(bb)])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into([(-1, 0)], [bytearray(bb)])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into([(2**64, 0)], [bytearray(bb)])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into(keys, [bytearray(bb)])  # one buffer for two keys
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.get_into(keys[:1], [torch.zeros(bb // 2, 2, dtype=torch.uint8).t()])  # not contiguous
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.put_from(keys[:1], [object()])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix([2**40])
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix("not tokens")
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix(np.zeros(4, np.float32))
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix(tokens(32), colour="blue")
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix(tokens(32), priority=9)
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.match_prefix(tokens(32), layers=(3, 1))
    with pytest.raises(kvmesh.InvalidArgumentError):
        client.put(tokens(2 * BT), [bytearray(bb)] * 3)  # more blocks than the tokens have
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        client.put(tokens(2 * BT), [bytearray(bb)], first_block=2)


def test_options_reach_the_call(client):
    t = tokens(2 * BT, base=4242)
    data = blocks(client, 2, seed=5)
    client.put(t, data, priority=3, layers=(0, 2))
    assert client.match_prefix(t) == 0  # stored for a slice, not for the whole model
    assert client.match_prefix(t, layers=(0, 2)) == 2
    key = client.keys(t, layers=(0, 2))[0]
    client.put_from([key], [data[1]])  # the stored block stays ...
    assert client.get(key) == data[0].tobytes()
    client.put_from([key], [data[1]], replace=True)  # ... unless replaced
    assert client.get(key) == data[1].tobytes()


def test_sequences(client):
    m = client.model
    prompt = tokens(3 * BT + 4, base=31000)
    seq = client.create_sequence(prompt, priority=2)
    assert seq.prefix_tokens == 0 and seq.layers == (0, m["num_layers"]) and seq.heads == (0, m["num_kv_heads"])
    n = len(prompt)
    kb = seq.kv_bytes(n)
    assert kb == m["num_layers"] * n * m["num_kv_heads"] * m["head_dim"] * 2
    rng = np.random.default_rng(6)
    k, v = rng.integers(0, 256, kb, dtype=np.uint8), rng.integers(0, 256, kb, dtype=np.uint8)
    assert seq.append(prompt, k, v) == 0
    info = seq.info()
    assert info["length"] == n and info["sealed_blocks"] == 3 and info["tokens"] == prompt
    rk, rv = seq.read(0, n)
    assert rk == k.tobytes() and rv == v.tobytes()
    fork = seq.fork()
    seq.truncate(4)
    assert seq.info()["length"] == n - 4 and fork.info()["length"] == n
    fork.release()
    seq.release()
    # The sealed blocks stay cached: a new sequence on the same prompt attaches them.
    with client.create_sequence(prompt) as again:
        assert again.prefix_tokens == 3 * BT
    with pytest.raises(kvmesh.InvalidArgumentError):
        seq.append(tokens(2), k[:10], v[:10])


def test_concurrent_threads_read_their_own_bytes(client):
    t = tokens(16 * BT, base=60000)
    keys = client.keys(t)
    data = blocks(client, 16, seed=7)
    client.put(t, data)
    errors = []

    def reader(i):
        for _ in range(20):
            out = [bytearray(client.block_bytes) for _ in keys]
            st = client.get_into(keys, out)
            if not all(st) or any(bytes(o) != d.tobytes() for o, d in zip(out, data)):
                errors.append(i)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


def test_closed_client_raises():
    c = kvmesh.EmbeddedCluster(embedded_config())
    buf = torch.zeros(c.block_bytes, dtype=torch.uint8)
    region = c.register(buf)
    c.close()
    assert c.closed and not region.registered and c.regions == []
    with pytest.raises(kvmesh.FailedPreconditionError) as e:
        c.match_prefix(tokens(32))
    assert e.value.code == "FAILED_PRECONDITION"
    c.close()  # twice is fine


def test_bad_config_names_the_field():
    cfg = embedded_config()
    cfg["model"]["block_tokens"] = 0
    with pytest.raises(kvmesh.InvalidArgumentError) as e:
        kvmesh.EmbeddedCluster(cfg)
    assert "block_tokens" in e.value.message
    with pytest.raises(kvmesh.Error):
        kvmesh.EmbeddedCluster("/nonexistent/cluster.json")
    with pytest.raises(kvmesh.InvalidArgumentError):
        kvmesh.Client()  # neither a coordinator nor a config


def test_config_as_path_and_text(tmp_path):
    import json
    p = tmp_path / "c.json"
    p.write_text(json.dumps(embedded_config(nodes=2)))
    for cfg in (str(p), p, p.read_text()):
        with kvmesh.EmbeddedCluster(cfg) as c:
            assert c.num_nodes == 2
