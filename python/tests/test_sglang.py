"""The SGLang HiCache backend's engine-free core (kvmesh.adapters.sglang),
driven as SGLang's cache controller drives a storage backend, with host pools
laid out as SGLang lays them out. The whole engine path (SGLang's factory,
controller and host pools) drives the shipped class in test_sglang_engine.py."""

from types import SimpleNamespace

import pytest
import torch

import kvmesh

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


def storage_config(rank=0, size=1, mla=False, cp_rank=0, cp_size=1, extra=None):
    return SimpleNamespace(tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1, attn_cp_rank=cp_rank,
                           attn_cp_size=cp_size, is_mla_model=mla, model_name="org/model-8b", extra_config=extra)


def backend(client, pool, **kw):
    b = KvmeshHiCacheStorage(storage_config(**kw), {}, client=client)
    b.register_mem_pool_host(pool)
    return b


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_round_trip_through_registered_pools(client, layout):
    a_pool, b_pool = MHAHostPool(layout, seed=1), MHAHostPool(layout, seed=2)
    a, b = backend(client, a_pool), backend(client, b_pool)
    assert b._plans["kv"].parts == (2 if layout == "page_first" else 2 * a_pool.layer_num)
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
    s._diagnoser.drain()  # its directory entry is written by its own thread: not counted below
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
    assert s.get_stats() is None  # SGLang's StorageMetrics come from kvmesh.sglang
    assert s.stats()["saved_blocks"] > 0


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


def flat_page(pool, slot):
    """SGLang's get_data_page(index, flat=True) of MHATokenToKVPoolHost."""
    s = slice(slot * PAGE, (slot + 1) * PAGE)
    return (pool.kv_buffer[:, s] if pool.layout == "page_first" else pool.kv_buffer[:, :, s]).flatten()


def set_flat_page(pool, slot, data):
    s = slice(slot * PAGE, (slot + 1) * PAGE)
    if pool.layout == "page_first":
        pool.kv_buffer[:, s] = data.view(2, PAGE, pool.layer_num, pool.head_num, pool.head_dim)
    else:
        pool.kv_buffer[:, :, s] = data.view(2, pool.layer_num, PAGE, pool.head_num, pool.head_dim)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_generic_and_zero_copy_paths_agree(client, layout):
    """A page stored through the generic path (flat pages, SGLang's batch_set)
    is found by batch_exists and read by the zero-copy path, and the other way
    round: both store a page as the parts get_page_buffer_meta names."""
    a_pool, b_pool = MHAHostPool(layout, seed=21), MHAHostPool(layout, seed=22)
    a, b = backend(client, a_pool), backend(client, b_pool)
    keys = [f"g-{layout}-{i}" for i in range(3)]
    assert a.batch_set(keys, [flat_page(a_pool, s) for s in (1, 2, 3)])
    assert b.batch_exists(keys) == 3
    assert b.batch_get_v1(keys, indices([5, 6, 7])) == [True] * 3
    for src, dst in zip((1, 2, 3), (5, 6, 7)):
        assert torch.equal(a_pool.page(src), b_pool.page(dst))
    keys2 = [f"z-{layout}-{i}" for i in range(2)]
    assert b.batch_set_v1(keys2, indices([8, 9])) == [True, True]
    dummies = [torch.zeros(2 * a_pool.layer_num * PAGE * a_pool.head_num * a_pool.head_dim, dtype=torch.float16)
               for _ in keys2]
    got = a.batch_get(keys2, dummies)
    assert all(g is d for g, d in zip(got, dummies))
    for slot, d in zip((10, 11), dummies):
        set_flat_page(a_pool, slot, d)
    for src, dst in zip((8, 9), (10, 11)):
        assert torch.equal(b_pool.page(src), a_pool.page(dst))


def test_zero_copy_is_chosen_unless_the_user_chose(client):
    cfg = storage_config(extra={})
    s = KvmeshHiCacheStorage(cfg, {}, client=client)
    assert cfg.extra_config["interface_v1"] == 1  # SGLang reads it after register_mem_pool_host
    s.register_mem_pool_host(MHAHostPool("page_first", seed=31))
    assert cfg.extra_config["interface_v1"] == 1

    class NoMeta:  # a pool without get_page_buffer_meta: the generic path
        page_size, layout, layer_num = PAGE, "page_first", 1
        kv_buffer = torch.zeros(2, 4 * PAGE, 1, 1, 8, dtype=torch.float16)

        def get_dummy_flat_data_page(self):
            return torch.zeros(2 * PAGE * 8, dtype=torch.float16)

    cfg2 = storage_config(extra={})
    s2 = KvmeshHiCacheStorage(cfg2, {}, client=client)
    s2.register_mem_pool_host(NoMeta())
    assert cfg2.extra_config["interface_v1"] == 0
    cfg3 = storage_config(extra={"interface_v1": 0})
    KvmeshHiCacheStorage(cfg3, {}, client=client).register_mem_pool_host(MHAHostPool("page_first", seed=32))
    assert cfg3.extra_config["interface_v1"] == 0  # the user's choice stands
    with pytest.raises(TypeError, match="kwargs dict"):
        KvmeshHiCacheStorage(storage_config(), client)  # a client where SGLang passes its kwargs


def test_context_parallel_ranks_never_overwrite_each_other(client):
    p0, p1 = MHAHostPool("page_first", seed=41), MHAHostPool("page_first", seed=42)
    r0 = backend(client, p0, cp_rank=0, cp_size=2)
    r1 = backend(client, p1, cp_rank=1, cp_size=2)
    assert r0.batch_set_v1(["cp"], indices([0])) == [True]
    assert r1.batch_exists(["cp"]) == 0  # rank 1's part of the page is not rank 0's
    assert r1.batch_set_v1(["cp"], indices([0])) == [True]
    q0, q1 = MHAHostPool("page_first", seed=43), MHAHostPool("page_first", seed=44)
    assert backend(client, q0, cp_rank=0, cp_size=2).batch_get_v1(["cp"], indices([3])) == [True]
    assert backend(client, q1, cp_rank=1, cp_size=2).batch_get_v1(["cp"], indices([3])) == [True]
    assert torch.equal(q0.page(3), p0.page(0)) and torch.equal(q1.page(3), p1.page(0))
    assert not torch.equal(p0.page(0), p1.page(0))


class SlotPool:
    """A sidecar host pool of one slot per page (SGLang's MambaPoolHost shape:
    page_size 1, one part per state buffer)."""

    def __init__(self, slots=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.page_size, self.layout = 1, "page_first"
        self.conv = torch.randn(slots, 2, 1, 24, generator=g)
        self.temporal = torch.randn(slots, 2, 1, 40, generator=g)
        self.kv_buffer = [self.temporal, self.conv]

    def get_page_buffer_meta(self, idx):
        ptrs, sizes = [], []
        for i in idx.tolist():
            for buf in self.kv_buffer:
                n = buf[0].numel() * buf.element_size()
                ptrs.append(buf.data_ptr() + i * n)
                sizes.append(n)
        return ptrs, sizes


def test_v2_pools_and_hit_policies(client):
    """batch_exists_v2: a pool's pages are looked up under the KV page hashes;
    all_pages caps the hit at the first missing page, trailing_pages needs only
    the last N pages of the prefix."""
    kv_pool, side, idx_pool = MHAHostPool("page_first", seed=51), SlotPool(seed=52), SlotPool(seed=53)
    s = backend(client, kv_pool)
    s.register_mem_host_pool_v2(kv_pool, "kv")
    s.register_mem_host_pool_v2(side, "mamba")
    s.register_mem_host_pool_v2(idx_pool, "indexer")
    pages = [f"v2-{i}" for i in range(4)]
    assert s.batch_set_v1(pages, indices([0, 1, 2, 3])) == [True] * 4
    T = SimpleNamespace
    # Mamba state stored only under the last page's hash (trailing_pages).
    assert s.batch_set_v2([T(name="mamba", host_indices=torch.tensor([5]), keys=[pages[3]])]) == {"mamba": [True]}
    res = s.batch_exists_v2(pages, [T(name="mamba", keys=["__placeholder__"], hit_policy="trailing_pages")])
    assert (res.kv_hit_pages, res.extra_pool_hit_pages) == (4, {"kv": 4, "mamba": 4})
    res = s.batch_exists_v2(pages[:3], [T(name="mamba", keys=["__placeholder__"], hit_policy="trailing_pages")])
    assert res.kv_hit_pages == 0
    # An indexer pool with every page but page 2 (all_pages): the prefix stops there.
    assert s.batch_set_v2([T(name="indexer", host_indices=torch.tensor([0, 1, 3]),
                             keys=[pages[0], pages[1], pages[3]])]) == {"indexer": [True] * 3}
    res = s.batch_exists_v2(pages, [T(name="indexer", keys=pages, hit_policy="all_pages")])
    assert (res.kv_hit_pages, res.extra_pool_hit_pages) == (2, {"kv": 4, "indexer": 2})
    # Read the state back into another slot of a fresh pool.
    fresh = SlotPool(seed=54)
    s2 = backend(client, MHAHostPool("page_first", seed=55))
    s2.register_mem_host_pool_v2(fresh, "mamba")
    got = s2.batch_get_v2([T(name="mamba", host_indices=torch.tensor([2]), keys=[pages[3]])])
    assert got == {"mamba": [True]}
    assert torch.equal(fresh.conv[2], side.conv[5]) and torch.equal(fresh.temporal[2], side.temporal[5])
    bad = s2.batch_get_v2([T(name="mamba", host_indices=torch.tensor([1, 2]), keys=[pages[3]])])
    assert bad == {"mamba": [False]}  # indices do not match the keys: nothing read


def test_misses_say_why(client):
    a = backend(client, MHAHostPool("page_first", seed=61))
    assert a.batch_set_v1(["w0", "w1"], indices([0, 1])) == [True, True]
    a._diagnoser.drain(5)  # a's directory entry is written off the caller's thread
    other = KvmeshHiCacheStorage(storage_config(rank=1, size=2), client=client)
    other.register_mem_pool_host(MHAHostPool("layer_first", seed=62))
    assert other.batch_exists(["w0", "w1"]) == 0
    other._diagnoser.drain(5)
    assert other.stats()["misses"]["other_layout"] == 1
    assert a.batch_exists(["nothing-here"]) == 0
    a._diagnoser.drain(5)
    assert a.stats()["misses"]["no_key"] == 1
    client.erase(a._plans["kv"].keys(["w1"]))
    assert a.batch_exists(["w0", "w1"]) == 1
    a._diagnoser.drain(5)
    assert a.stats()["misses"]["evicted"] == 1


def test_parts_larger_than_a_slot_are_refused_without_breaking_sglang():
    from conftest import embedded_config

    with kvmesh.EmbeddedCluster(embedded_config(store={"slot_bytes": "4KiB"})) as small:
        s = backend(small, MHAHostPool("page_first", seed=71))
        assert s.batch_set_v1(["big"], indices([0])) == [False]
        assert s.batch_set(["big"], [flat_page(s.mem_pool_host, 0)]) is False
        assert s.batch_get_v1(["big"], indices([1])) == [False]
        assert s.stats()["save_errors"] == 2
