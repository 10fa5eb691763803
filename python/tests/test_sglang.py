"""The SGLang HiCache adapter, driven as SGLang's cache controller drives a
storage backend, with host pools laid out as SGLang lays them out."""

from types import SimpleNamespace

import pytest
import torch

from kvmesh.adapters.sglang import KvmeshHiCacheStorage

PAGE = 16


class MHAHostPool:
    """A host KV pool with the layout and get_page_buffer_meta of SGLang's
    MHATokenToKVPoolHost (python/sglang/srt/mem_cache/pool_host/mha.py):
    kv_buffer is [2, size, layers, heads, head_dim] ("page_first") or
    [2, layers, size, heads, head_dim] ("layer_first"); each page is K and V
    (page_first) or K and V of every layer (layer_first), each contiguous."""

    def __init__(self, layout, pages=16, layers=4, heads=4, head_dim=64, dtype=torch.float16, seed=0, alloc=None):
        self.layout, self.page_size, self.size = layout, PAGE, pages * PAGE
        self.layer_num, self.head_num, self.head_dim, self.dtype = layers, heads, head_dim, dtype
        dims = (2, self.size, layers, heads, head_dim) if layout == "page_first" else \
            (2, layers, self.size, heads, head_dim)
        g = torch.Generator().manual_seed(seed)
        data = torch.randn(dims, generator=g).to(dtype)
        self.kv_buffer = data if alloc is None else alloc(dims, dtype)  # alloc: the backend's alloc_host_buffer
        if alloc is not None:
            self.kv_buffer.copy_(data)

    def get_page_buffer_meta(self, indices):
        token = self.head_num * self.head_dim * self.kv_buffer.element_size()
        base = self.kv_buffer.data_ptr()
        idx = indices.tolist()
        ptrs = []
        if self.layout == "page_first":
            v_offset = self.size * self.layer_num * token
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * token
                ptrs += [k, k + v_offset]
            return ptrs, [self.page_size * self.layer_num * token] * len(ptrs)
        v_offset = self.layer_num * self.size * token
        for i in range(0, len(idx), self.page_size):
            for layer in range(self.layer_num):
                k = base + (layer * self.size + idx[i]) * token
                ptrs += [k, k + v_offset]
        return ptrs, [self.page_size * token] * len(ptrs)

    def page(self, slot):
        """K and V of the page in pool slot `slot` (every layer)."""
        s = slice(slot * PAGE, (slot + 1) * PAGE)
        return self.kv_buffer[:, s] if self.layout == "page_first" else self.kv_buffer[:, :, s]


def indices(slots):
    return torch.cat([torch.arange(s * PAGE, (s + 1) * PAGE) for s in slots])


def storage_config(rank=0, size=1, mla=False):
    return SimpleNamespace(tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1, is_mla_model=mla,
                           model_name="org/model-8b", extra_config=None)


def backend(client, pool, **kw):
    b = KvmeshHiCacheStorage(storage_config(**kw), client=client)
    b.register_mem_pool_host(pool)
    return b


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_round_trip_through_registered_pools(client, layout):
    a_pool, b_pool = MHAHostPool(layout, seed=1), MHAHostPool(layout, seed=2)
    a, b = backend(client, a_pool), backend(client, b_pool)
    assert b._parts == (2 if layout == "page_first" else 2 * a_pool.layer_num)
    assert len(client.regions) == 2  # each pool registered once
    keys = [f"page-{layout}-{i}" for i in range(5)]
    assert b.batch_exists(keys) == 0
    assert a.batch_set_v1(keys, indices([3, 0, 7, 1, 9])) == [True] * 5
    assert b.batch_exists(keys) == 5 and b.exists(keys[2])
    # Into other slots of another pool, byte for byte.
    assert b.batch_get_v1(keys, indices([10, 11, 12, 13, 14])) == [True] * 5
    for src, dst in zip([3, 0, 7, 1, 9], [10, 11, 12, 13, 14]):
        assert torch.equal(a_pool.page(src), b_pool.page(dst))
    assert not torch.equal(a_pool.page(2), b_pool.page(2))  # untouched slots stay


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pools_in_memory_from_allocate_need_no_registration(client, layout):
    a = KvmeshHiCacheStorage(storage_config(), client=client)
    b = KvmeshHiCacheStorage(storage_config(), client=client)
    assert a.use_allocate and b.use_allocate  # on by default: the client has allocate
    a_pool = MHAHostPool(layout, seed=11, alloc=a.alloc_host_buffer)
    b_pool = MHAHostPool(layout, seed=12, alloc=b.alloc_host_buffer)
    assert len(client.regions) == 2 and all(r.allocated for r in client.regions)
    a.register_mem_pool_host(a_pool)
    b.register_mem_pool_host(b_pool)
    assert len(client.regions) == 2  # nothing registered again
    keys = [f"alloc-{layout}-{i}" for i in range(4)]
    assert a.batch_set_v1(keys, indices([2, 5, 0, 8])) == [True] * 4
    assert b.batch_get_v1(keys, indices([1, 3, 4, 6])) == [True] * 4
    for src, dst in zip([2, 5, 0, 8], [1, 3, 4, 6]):
        assert torch.equal(a_pool.page(src), b_pool.page(dst))
    a.close()
    b.close()
    assert client.regions == []
    b_pool.kv_buffer.fill_(1)  # the pool's memory outlives the backend
    assert bool((b_pool.kv_buffer == 1).all())


def test_use_allocate_off_takes_plain_memory_and_registers_it(client):
    cfg = storage_config()
    cfg.extra_config = {"use_allocate": False}
    s = KvmeshHiCacheStorage(cfg, client=client)
    assert not s.use_allocate
    pool = MHAHostPool("page_first", seed=13, alloc=s.alloc_host_buffer)
    assert client.regions == []
    s.register_mem_pool_host(pool)
    assert len(client.regions) == 1 and not client.regions[0].allocated
    assert s.batch_set_v1(["plain"], indices([0])) == [True]


def test_misses_and_consecutive_hits(client):
    pool = MHAHostPool("page_first", seed=3)
    s = backend(client, pool)
    assert s.batch_set_v1(["a", "b", "d"], indices([0, 1, 2])) == [True] * 3
    assert s.batch_exists(["a", "b", "c", "d"]) == 2
    assert not s.exists("c")
    before = pool.page(5).clone()
    got = s.batch_get_v1(["a", "c", "d"], indices([4, 5, 6]))
    assert got == [True, False, True]
    assert torch.equal(pool.page(4), pool.page(0)) and torch.equal(pool.page(6), pool.page(2))
    assert torch.equal(pool.page(5), before)
    assert s.batch_get_v1([], torch.zeros(0, dtype=torch.int64)) == [] and s.batch_exists([]) == 0


def test_stored_pages_are_not_sent_again(client):
    pool = MHAHostPool("page_first", seed=4)
    s = backend(client, pool)
    assert s.batch_set_v1(["x", "y"], indices([0, 1])) == [True, True]
    sent = client.stats()["put_blocks"]
    assert s.batch_set_v1(["x", "y", "z"], indices([0, 1, 2])) == [True] * 3
    assert client.stats()["put_blocks"] == sent + 2  # only z's K and V


def test_ranks_keep_their_own_pages_but_mla_shares(client):
    pool0, pool1 = MHAHostPool("page_first", seed=5), MHAHostPool("page_first", seed=6)
    r0, r1 = backend(client, pool0, rank=0, size=2), backend(client, pool1, rank=1, size=2)
    assert r0.batch_set_v1(["p"], indices([0])) == [True]
    assert r1.batch_exists(["p"]) == 0
    m0 = KvmeshHiCacheStorage(storage_config(rank=0, size=2, mla=True), client=client)
    m1 = KvmeshHiCacheStorage(storage_config(rank=1, size=2, mla=True), client=client)
    assert m0.set("latent", torch.arange(64, dtype=torch.float32))
    out = torch.zeros(64, dtype=torch.float32)
    assert m1.get("latent", target_location=out) is out
    assert torch.equal(out, torch.arange(64, dtype=torch.float32))


def test_values_by_key(client):
    s = KvmeshHiCacheStorage(storage_config(), client=client)
    vals = [torch.full((256,), float(i), dtype=torch.bfloat16) for i in range(3)]
    assert s.batch_set(["v0", "v1", "v2"], values=vals)
    targets = [torch.zeros(256, dtype=torch.bfloat16) for _ in range(4)]
    got = s.batch_get(["v0", "v1", "nope", "v2"], target_locations=targets)
    assert got[2] is None
    assert all(torch.equal(got[i], vals[j]) for i, j in [(0, 0), (1, 1), (3, 2)])
    raw = s.batch_get(["v1", "nope"])  # no targets: new uint8 tensors
    assert raw[1] is None and torch.equal(raw[0], vals[1].view(torch.uint8))
    assert s.get("nope") is None
    # By address, inside registered memory.
    buf = torch.zeros(1024, dtype=torch.uint8)
    buf[:128] = torch.arange(128, dtype=torch.uint8)
    client.register(buf)
    assert s.set("addr", target_location=buf.data_ptr(), target_sizes=128) is True
    assert torch.equal(s.get("addr", target_location=torch.zeros(128, dtype=torch.uint8)), buf[:128])
    assert s.get("v2", target_location=buf.data_ptr() + 256, target_sizes=512) is not None
    assert torch.equal(buf[256:768], vals[2].view(torch.uint8))
    assert s.get("v2", target_location=buf.data_ptr() + 256, target_sizes=100) is None  # too small
    stats = s.get_stats()
    assert stats["puts"] > 0


def test_extra_config_makes_its_own_client(daemons):
    cfg = storage_config()
    cfg.extra_config = {"coordinator": daemons.address, "tenant": "sglang-own"}
    s = KvmeshHiCacheStorage(cfg)
    pool = MHAHostPool("page_first", seed=7)
    s.register_mem_pool_host(pool)
    assert s.batch_set_v1(["own"], indices([0])) == [True]
    assert s.batch_exists(["own"]) == 1
    s.close()
    assert s.client.closed
