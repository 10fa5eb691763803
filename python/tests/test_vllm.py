"""The vLLM connector's engine-free core (kvmesh.adapters.vllm), driven as
vLLM's scheduler and model runner drive a KV connector v1, against an
embedded cluster and daemons: where a block's bytes lie in every paged layout
vLLM hands out, loads byte for byte, sliding-window groups, MLA ranks, load
errors, sessions, and the reasons a miss is given. The whole engine (vLLM's
factory, scheduler and runner) drives the shipped class in
test_vllm_engine.py."""

import json
import urllib.request
from types import SimpleNamespace

import pytest
import torch

import kvmesh
from conftest import scaled
from kvmesh.adapters import render_metrics, serve_metrics
from kvmesh.adapters.vllm import KvmeshConnector, block_runs

BS, LAYERS, HEADS, DIM, NUM_BLOCKS = 16, 4, 4, 64, 32
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def spec(kind="full", window=0):
    cls = {"full": "FullAttentionSpec", "sliding": "SlidingWindowSpec", "mla": "MLAAttentionSpec",
           "mamba": "MambaSpec"}[kind]
    return type(cls, (), {"sliding_window": window, "block_size": BS})()


def kv_cache_config(groups=None):
    groups = groups or [("full", NAMES, 0)]
    return SimpleNamespace(num_blocks=NUM_BLOCKS, kv_cache_groups=[
        SimpleNamespace(layer_names=list(names), kv_cache_spec=spec(kind, w)) for kind, names, w in groups])


def vllm_config(block_size=BS, model="org/model-8b", tenant="", engine="e", tp=1, mla=False, **extra):
    extra = dict(extra, tenant=tenant)
    return SimpleNamespace(cache_config=SimpleNamespace(block_size=block_size),
                           model_config=SimpleNamespace(model=model, use_mla=mla),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1, rank=0),
                           kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra, engine_id=engine))


def paged(layout, gen=None):
    """A layer's paged KV as vLLM lays it out (CPU, fp16)."""
    g = gen or torch.Generator().manual_seed(0)
    if layout == "nhd":  # FlashAttention (2, blocks, tokens, heads, dim)
        return torch.randn(2, NUM_BLOCKS, BS, HEADS, DIM, generator=g).half()
    if layout == "hnd":  # the same logical shape over head-major memory
        return torch.randn(2, NUM_BLOCKS, HEADS, BS, DIM, generator=g).half().permute(0, 1, 3, 2, 4)
    if layout == "packed":  # (blocks, heads, tokens, 2 * dim) with NHD strides
        return torch.randn(NUM_BLOCKS, BS, HEADS, 2 * DIM, generator=g).half().permute(0, 2, 1, 3)
    if layout == "flashinfer":  # (blocks, 2, tokens, heads, dim)
        return torch.randn(NUM_BLOCKS, 2, BS, HEADS, DIM, generator=g).half()
    if layout == "mla":  # (blocks, tokens, kv_lora_rank + rope dim)
        return torch.randn(NUM_BLOCKS, BS, 576, generator=g).half()
    raise ValueError(layout)


def block_of(kv, layout, b):
    return kv[b] if layout in ("packed", "flashinfer", "mla") else kv[:, b]


class Engine:
    """One vLLM instance: a scheduler-side and a worker-side connector and the paged KV."""

    def __init__(self, client, seed, layout="nhd", groups=None, **cfg):
        self.layout = layout
        conf = vllm_config(**cfg)
        kcc = kv_cache_config(groups)
        self.worker = KvmeshConnector(conf, "WORKER", kcc, client=client)
        g = torch.Generator().manual_seed(seed)
        self.kv = {n: paged(layout, g) for n in NAMES}
        self.worker.register_kv_caches(self.kv)
        self.scheduler = KvmeshConnector(conf, "SCHEDULER", kcc, client=client)
        self.gen = g

    def step(self, out, computes):
        """One forward pass; computes: block ids whose KV this step writes, per layer."""
        meta = self.scheduler.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(SimpleNamespace(attn_metadata=None))
        for name in NAMES:
            self.worker.wait_for_layer_load(name)
            for b in computes:  # "attention" writes this step's K and V into the paged blocks
                blk = block_of(self.kv[name], self.layout, b)
                blk.copy_(torch.randn(blk.shape, generator=self.gen).half())
            self.worker.save_kv_layer(name, self.kv[name], None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return meta

    def run(self, req_id, tokens, table, params=None, preloaded=0):
        """Match, allocate, one forward pass over the whole prompt, finish:
        vLLM's scheduler calls in order. table: block ids per group. Returns
        the tokens kvmesh had."""
        req = SimpleNamespace(request_id=req_id, prompt_token_ids=tokens, kv_transfer_params=params)
        hit, load_async = self.scheduler.get_num_new_matched_tokens(req, preloaded)
        assert load_async is False
        self.scheduler.update_state_after_alloc(req, None, hit)
        computed = preloaded + hit
        self.step(sched_out([new_req(req_id, tokens, table, computed)], scheduled={req_id: len(tokens) - computed}),
                  computes=[b for b in table[0][computed // BS:] if b])
        self.scheduler.request_finished(req, table)
        return hit

    def close(self):
        self.worker.shutdown()
        self.scheduler.shutdown()


def new_req(req_id, tokens, table, computed):  # vLLM's NewRequestData
    return SimpleNamespace(req_id=req_id, prompt_token_ids=tokens, block_ids=tuple(list(t) for t in table),
                           num_computed_tokens=computed)


def sched_out(new=(), cached=None, scheduled=None):  # vLLM's SchedulerOutput
    return SimpleNamespace(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
                           num_scheduled_tokens=dict(scheduled or {}))


@pytest.fixture
def engines(client):
    made = []

    def make(seed, **kw):
        made.append(Engine(client, seed, **kw))
        return made[-1]

    yield make
    for e in made:
        e.close()


def prompt(n, base=100):
    return list(range(base, base + n))


@pytest.mark.parametrize("layout", ["nhd", "hnd", "packed", "flashinfer", "mla"])
def test_where_a_blocks_bytes_lie(layout):
    """block_runs finds each block's runs from the strides: the bytes at the
    offsets are exactly the block's elements, whatever the layout."""
    kv = paged(layout)
    dim, r, offs, run, desc = block_runs(kv, NUM_BLOCKS)
    es = kv.element_size()
    raw = kv.new_empty(0).set_(kv.storage()).view(torch.uint8)
    for b in (0, 7, NUM_BLOCKS - 1):
        got = torch.cat([raw[(b * kv.stride(dim) + o) * es:(b * kv.stride(dim) + o + run) * es] for o in offs])
        want = block_of(kv, layout, b)
        assert got.numel() == want.numel() * es
        assert sorted(got.view(torch.float16).tolist()) == sorted(want.flatten().tolist())
    expected_runs = {"nhd": 2, "hnd": 2, "packed": 1, "flashinfer": 1, "mla": 1}[layout]
    assert len(offs) == expected_runs and r == 1
    # Layouts whose bytes differ never share a descriptor (nor keys).
    others = {block_runs(paged(x), NUM_BLOCKS)[4] for x in ("nhd", "hnd", "packed", "flashinfer", "mla") if x != layout}
    assert desc not in others


def test_kernel_blocks_smaller_than_the_block():
    """vLLM may split a block into kernel blocks: dim 0 is blocks * r."""
    kv = torch.arange(NUM_BLOCKS * 4 * 4 * HEADS * 8, dtype=torch.float32).view(NUM_BLOCKS * 4, HEADS, 4, 8)
    dim, r, offs, run, _ = block_runs(kv, NUM_BLOCKS)
    assert (dim, r) == (0, 4) and len(offs) == 4 and run == HEADS * 4 * 8


@pytest.mark.parametrize("layout", ["nhd", "hnd", "packed"])
def test_second_engine_loads_the_prefix_the_first_saved(engines, layout):
    a, b = engines(1, layout=layout), engines(2, layout=layout)
    p = prompt(100)
    ids_a = [5, 9, 2, 14, 7, 11, 3]
    assert a.run("r1", p, [ids_a]) == 0
    assert a.worker.stats()["saved_blocks"] == 6 * LAYERS  # full prompt blocks only, every layer

    # Engine b: the same 100 tokens and 20 more. 6 blocks come from kvmesh.
    p2 = p + prompt(20, base=5000)
    req2 = SimpleNamespace(request_id="r2", prompt_token_ids=p2)
    assert b.scheduler.get_num_new_matched_tokens(req2, 0) == (96, False)
    assert b.scheduler.get_num_new_matched_tokens(req2, 0) == (96, False)  # asked again: the same
    ids_b = [30, 1, 17, 4, 22, 8, 13, 25]
    b.scheduler.update_state_after_alloc(req2, None, 96)
    meta = b.step(sched_out([new_req("r2", p2, [ids_b], 96)], scheduled={"r2": 24}), computes=ids_b[6:])
    assert [(t.first_block, t.block_ids) for t in meta.loads] == [(0, [ids_b[:6]])]
    assert [(t.first_block, t.block_ids) for t in meta.saves] == [(6, [[ids_b[6]]])]
    assert b.worker.get_block_ids_with_load_errors() == set()
    for name in NAMES:
        for i in range(6):  # K and V, byte for byte
            assert torch.equal(block_of(b.kv[name], layout, ids_b[i]), block_of(a.kv[name], layout, ids_a[i]))
    # Block 6, computed by b, is now stored as well.
    req3 = SimpleNamespace(request_id="r3", prompt_token_ids=p2)
    assert a.scheduler.get_num_new_matched_tokens(req3, 0) == (112, False)
    # Tokens vLLM's own prefix cache already has are not counted again.
    assert a.scheduler.get_num_new_matched_tokens(req3, 32) == (80, False)
    s = b.scheduler.stats()
    assert s["lookups"] == 1 and s["hit_tokens"] == 96 and s["lookup_tokens"] == 112


def test_a_whole_prompt_hit_leaves_one_token(engines):
    a, b = engines(3), engines(4)
    p = prompt(64, base=400)
    a.run("w", p, [[1, 2, 3, 4, 5]])
    req = SimpleNamespace(request_id="w2", prompt_token_ids=p)
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)  # 64 stored, 1 token to compute
    short = SimpleNamespace(request_id="q3", prompt_token_ids=p[:16])
    assert b.scheduler.get_num_new_matched_tokens(short, 0) == (0, False)


def test_match_stops_at_the_first_incomplete_block(engines, client):
    a = engines(5, lookup="exact")
    p = prompt(90, base=7000)
    a.run("q", p, [[1, 2, 3, 4, 5, 6]])  # block 0 is vLLM's null block: never a real one
    req = SimpleNamespace(request_id="q2", prompt_token_ids=p)
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (80, False)
    # Layer 2's V run of block 3 gone: blocks 0..2 remain whole ("exact" probes every run).
    chains = kvmesh.chain_keys(p, BS, a.scheduler._chain_salt)
    layer = a.worker._layers[NAMES[2]]
    client.erase(kvmesh.derive_keys(chains[3:4], layer.tags[1]))
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)


def test_blocks_lost_before_the_load_are_reported(engines, client):
    a, b = engines(6), engines(7)
    p = prompt(64, base=9100)
    a.run("w", p, [[10, 11, 12, 13]])
    req = SimpleNamespace(request_id="w2", prompt_token_ids=p + [1])
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (64, False)
    b.scheduler.update_state_after_alloc(req, None, 64)
    chains = kvmesh.chain_keys(p, BS, a.scheduler._chain_salt)
    client.erase(kvmesh.derive_keys(chains[2:3], a.worker._layers[NAMES[1]].tags[0]))  # after the match
    b.step(sched_out([new_req("w2", p + [1], [[20, 21, 22, 23, 24]], 64)], scheduled={"w2": 1}), computes=[24])
    assert b.worker.get_block_ids_with_load_errors() == {22}
    assert b.worker.get_block_ids_with_load_errors() == set()  # reported once
    assert b.worker.stats()["load_errors"] == 1
    for name in NAMES:
        for i in (0, 1, 3):
            assert torch.equal(b.kv[name][:, 20 + i], a.kv[name][:, 10 + i])


def test_chunked_prefill_saves_each_chunks_full_blocks(engines):
    a = engines(8)
    p = prompt(70, base=12000)
    ids = [3, 4, 5, 6, 7]
    req = SimpleNamespace(request_id="c", prompt_token_ids=p)
    a.scheduler.get_num_new_matched_tokens(req, 0)
    a.scheduler.update_state_after_alloc(req, None, 0)
    m1 = a.step(sched_out([new_req("c", p, [ids[:3]], 0)], scheduled={"c": 40}), computes=ids[:3])
    assert [(s.first_block, s.block_ids) for s in m1.saves] == [(0, [[3, 4]])]
    cached = SimpleNamespace(req_ids=["c"], resumed_req_ids=set(), new_block_ids=[([6, 7],)],
                             num_computed_tokens=[40])
    m2 = a.step(sched_out(cached=cached, scheduled={"c": 30}), computes=ids[2:])
    assert [(s.first_block, s.block_ids) for s in m2.saves] == [(2, [[5, 6]])]
    req2 = SimpleNamespace(request_id="c2", prompt_token_ids=p)
    assert a.scheduler.get_num_new_matched_tokens(req2, 0) == (64, False)


def test_a_resumed_request_loads_into_its_new_blocks(engines):
    """After a preemption vLLM looks the request up again and hands the whole
    new block table in scheduled_cached_reqs (resumed_req_ids)."""
    a, b = engines(9), engines(10)
    p = prompt(48, base=15000)
    a.run("s", p, [[1, 2, 3]])
    req = SimpleNamespace(request_id="s2", prompt_token_ids=p + [9])
    b.scheduler.get_num_new_matched_tokens(req, 0)
    b.scheduler.update_state_after_alloc(req, None, 48)
    b.step(sched_out([new_req("s2", p + [9], [[4, 5, 6, 7]], 48)], scheduled={"s2": 1}), computes=[7])
    # Preempted (no connector call), then resumed into other blocks.
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    b.scheduler.update_state_after_alloc(req, None, 48)
    cached = SimpleNamespace(req_ids=["s2"], resumed_req_ids={"s2"}, new_block_ids=[([20, 21, 22, 23],)],
                             num_computed_tokens=[48])
    meta = b.step(sched_out(cached=cached, scheduled={"s2": 1}), computes=[23])
    assert [(t.first_block, t.block_ids) for t in meta.loads] == [(0, [[20, 21, 22]])]
    for name in NAMES:
        assert torch.equal(b.kv[name][:, 20:23], a.kv[name][:, 1:4])


def test_loads_start_per_layer_and_finish_on_wait(engines):
    a, b = engines(11), engines(12)
    p = prompt(48, base=16000)
    a.run("s", p, [[1, 2, 3]])
    req = SimpleNamespace(request_id="s2", prompt_token_ids=p + [9])
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    b.scheduler.update_state_after_alloc(req, None, 48)
    meta = b.scheduler.build_connector_meta(sched_out([new_req("s2", p + [9], [[4, 5, 6, 7]], 48)],
                                                      scheduled={"s2": 1}))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_load_kv(None)
    assert sorted(b.worker._loads) == sorted(NAMES)  # one transfer in flight per layer
    for name in reversed(NAMES):  # any order
        b.worker.wait_for_layer_load(name)
        assert torch.equal(b.kv[name][:, 4:7], a.kv[name][:, 1:4])
    b.worker.clear_connector_metadata()


SW = [("full", NAMES[:2], 0), ("sliding", NAMES[2:], 32)]


def test_sliding_window_groups_move_only_the_window(engines):
    """Hybrid model: layers 0-1 full attention, 2-3 a 32-token sliding window
    (two blocks). Saves cover every computed block; a hit loads every block of
    the full group but only the window's blocks of the sliding group, and
    never null block 0."""
    a, b = engines(13, groups=SW), engines(14, groups=SW)
    p = prompt(100, base=17000)
    full, slid = [1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]
    a.run("h", p, [full, slid])
    assert a.worker.stats()["saved_blocks"] == 6 * LAYERS
    p2 = p[:96] + prompt(10, base=18000)
    req = SimpleNamespace(request_id="h2", prompt_token_ids=p2)
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (96, False)
    b.scheduler.update_state_after_alloc(req, None, 96)
    # vLLM's sliding-window manager hands null blocks outside the window.
    table = [[21, 22, 23, 24, 25, 26, 27], [0, 0, 0, 0, 28, 29, 30]]
    meta = b.step(sched_out([new_req("h2", p2, table, 96)], scheduled={"h2": 10}), computes=[27])
    [load] = meta.loads
    assert load.block_ids == [[21, 22, 23, 24, 25, 26], [0, 0, 0, 0, 28, 29]]
    for i in range(6):
        for name in NAMES[:2]:
            assert torch.equal(b.kv[name][:, table[0][i]], a.kv[name][:, full[i]])
    for i in (4, 5):
        for name in NAMES[2:]:
            assert torch.equal(b.kv[name][:, table[1][i]], a.kv[name][:, slid[i]])
    assert b.worker.stats()["loaded_blocks"] == 6 * 2 + 2 * 2
    # The window's blocks gone (block 5 of the sliding group): the hit shrinks
    # to a prefix whose own window is whole.
    chains = kvmesh.chain_keys(p, BS, a.scheduler._chain_salt)
    b.scheduler.client.erase(kvmesh.derive_keys(chains[5:6], a.worker._layers[NAMES[3]].tags))
    req3 = SimpleNamespace(request_id="h3", prompt_token_ids=p2)
    assert b.scheduler.get_num_new_matched_tokens(req3, 0) == (80, False)


def test_mla_ranks_share_one_copy(client):
    """MLA: every tensor-parallel rank holds the same latent cache; rank 0
    stores it (rank-free keys), every rank loads it."""
    cfg = dict(tp=2, mla=True, engine="mla")
    kcc = kv_cache_config([("mla", NAMES, 0)])
    workers, kvs = [], []
    try:
        for rank in (0, 1):
            conf = vllm_config(**cfg)
            conf.parallel_config.rank = rank
            w = KvmeshConnector(conf, "WORKER", kcc, client=client)
            kv = {n: paged("mla", torch.Generator().manual_seed(40)) for n in NAMES}
            w.register_kv_caches(kv)
            workers.append(w)
            kvs.append(kv)
        sched = KvmeshConnector(vllm_config(**cfg), "SCHEDULER", kcc, client=client)
        assert KvmeshConnector.get_required_kvcache_layout(vllm_config(**cfg)) is None
        p = prompt(40, base=19000)
        req = SimpleNamespace(request_id="m", prompt_token_ids=p)
        assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
        sched.update_state_after_alloc(req, None, 0)
        meta = sched.build_connector_meta(sched_out([new_req("m", p, [[1, 2, 3]], 0)], scheduled={"m": 40}))
        for w in workers:
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for n in NAMES:
                w.save_kv_layer(n, None, None)
            w.wait_for_save()
            w.clear_connector_metadata()
        assert workers[0].stats()["saved_blocks"] == 2 * LAYERS and workers[1].stats()["saved_blocks"] == 0
        req2 = SimpleNamespace(request_id="m2", prompt_token_ids=p)
        assert sched.get_num_new_matched_tokens(req2, 0) == (32, False)
        sched.update_state_after_alloc(req2, None, 32)
        meta = sched.build_connector_meta(sched_out([new_req("m2", p, [[5, 6, 7]], 32)], scheduled={"m2": 8}))
        for w, kv in zip(workers, kvs):
            w.bind_connector_metadata(meta)
            w.start_load_kv(None)
            for n in NAMES:
                w.wait_for_layer_load(n)
                assert torch.equal(kv[n][5:7], kvs[0][n][1:3])
            w.clear_connector_metadata()
        sched.shutdown()
    finally:
        for w in workers:
            w.shutdown()


def test_tensor_parallel_ranks_keep_their_own_heads(client):
    kcc = kv_cache_config()
    workers, kvs = [], []
    try:
        for rank in (0, 1):
            conf = vllm_config(tp=2, engine="tp")
            conf.parallel_config.rank = rank
            w = KvmeshConnector(conf, "WORKER", kcc, client=client)
            kv = {n: paged("nhd", torch.Generator().manual_seed(50 + rank)) for n in NAMES}
            w.register_kv_caches(kv)
            workers.append(w)
            kvs.append(kv)
        assert workers[0]._layers[NAMES[0]].tags != workers[1]._layers[NAMES[0]].tags
        sched = KvmeshConnector(vllm_config(tp=2, engine="tp"), "SCHEDULER", kcc, client=client)
        p = prompt(33, base=20000)
        req = SimpleNamespace(request_id="t", prompt_token_ids=p)
        sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, None, 0)
        meta = sched.build_connector_meta(sched_out([new_req("t", p, [[1, 2, 3]], 0)], scheduled={"t": 33}))
        workers[0].bind_connector_metadata(meta)  # rank 1 never saves: no hit for the engine
        for n in NAMES:
            workers[0].save_kv_layer(n, None, None)
        workers[0].wait_for_save()
        req2 = SimpleNamespace(request_id="t2", prompt_token_ids=p)
        assert sched.get_num_new_matched_tokens(req2, 0) == (0, False)
        workers[1].bind_connector_metadata(meta)
        for n in NAMES:
            workers[1].save_kv_layer(n, None, None)
        workers[1].wait_for_save()
        assert sched.get_num_new_matched_tokens(req2, 0) == (32, False)
        sched.shutdown()
    finally:
        for w in workers:
            w.shutdown()


def node_releases(daemons):
    """Blocks the daemons' nodes have released (their /stats), all tenants."""
    total = 0
    for n in daemons.node_ids:
        port = daemons.listening[n]["ports"]["http"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=scaled(2)) as r:
            total += json.loads(r.read())["releases"]
    return total


def test_a_closed_session_releases_its_own_blocks(daemons):
    """kv_transfer_params {"kvmesh.session", "kvmesh.session_closes"}: on the
    closing request's finish, the blocks the session computed and no other
    request hit are released on the nodes (every run of every layer); shared
    blocks are not, and nothing is erased."""
    runs = LAYERS * 2  # nhd: K and V per layer
    with kvmesh.Client(daemons.address, tenant="tests-vllm-sessions", timeout_ms=scaled(2000)) as client:
        a = Engine(client, 21)
        try:
            shared = prompt(32, base=30000)  # two blocks every request below starts with
            doc = shared + prompt(48, base=31000)
            s = {"kvmesh.session": "s"}
            assert a.run("s-1", doc + [7], [list(range(1, 7))], s) == 0  # saves blocks 0..4
            assert a.scheduler.released_blocks == 0  # the session is still open
            # Another request, of no session, reads the first two blocks: no longer s's own.
            assert a.run("o-1", shared + prompt(20, base=32000), [[20, 21, 22, 23]]) == 32
            follow = doc + prompt(40, base=33000)
            before = node_releases(daemons)
            closes = {"kvmesh.session": "s", "kvmesh.session_closes": True}
            assert a.run("s-2", follow, [list(range(8, 16))], closes) == 80
            assert a.scheduler.released_blocks == 5  # blocks 2..4 of s-1, 5..6 of s-2
            assert node_releases(daemons) - before == 5 * runs
            probe = SimpleNamespace(request_id="p", prompt_token_ids=follow)
            assert a.scheduler.get_num_new_matched_tokens(probe, 0) == (112, False)  # a hint, not an erase
            a.scheduler.request_finished(probe, [])

            # A block read before, evicted and computed again is not the new session's own.
            chains = kvmesh.chain_keys(doc, BS, a.scheduler._chain_salt)
            client.erase(kvmesh.derive_keys(chains[4:5], a.worker._layers[NAMES[-1]].tags))
            before = node_releases(daemons)
            again = doc + prompt(20, base=33500)  # blocks 0..3 hit, 4 computed again, 5 new
            assert a.run("w-1", again, [list(range(16, 23))], {"kvmesh.session_closes": True}) == 64
            assert a.scheduler.released_blocks == 5 + 1
            assert node_releases(daemons) - before == 1 * runs
            assert a.scheduler._sessions.empty()
        finally:
            a.close()


def test_misses_say_why(client):
    """A miss is classified off the engine's thread: no key, evicted, another
    layout, another model or tenant salt of the same prompt, or a model kvmesh
    does not move."""
    a = Engine(client, 60, engine="a")
    others = []
    try:
        p = prompt(50, base=40000)
        a.run("x", p, [[1, 2, 3, 4]])

        def miss(engine, req_id, tokens):
            # Earlier misses (run "x"'s own lookup) are classified off-thread:
            # count from after they are, or one lands inside this window.
            if engine.scheduler._diagnoser is not None:
                engine.scheduler._diagnoser.drain(scaled(5))
            before = dict(engine.scheduler.stats()["misses"])
            req = SimpleNamespace(request_id=req_id, prompt_token_ids=tokens)
            hit, _ = engine.scheduler.get_num_new_matched_tokens(req, 0)
            engine.scheduler.update_state_after_alloc(req, None, hit)
            if engine.scheduler._diagnoser is not None:
                engine.scheduler._diagnoser.drain(scaled(5))
            after = engine.scheduler.stats()["misses"]
            return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

        assert miss(a, "new", prompt(40, base=41000)) == {"no_key": 1}
        hnd = Engine(client, 61, layout="hnd", engine="b")
        others.append(hnd)
        assert miss(hnd, "l", p) == {"other_layout": 1}
        named = Engine(client, 62, engine="c", model="/models/model-8b")
        others.append(named)
        assert miss(named, "m", p) == {"other_model": 1}
        salted = Engine(client, 63, engine="d", tenant="someone-else")
        others.append(salted)
        assert miss(salted, "t", p) == {"other_tenant": 1}
        # Engine a read the prompt before; its blocks gone, a miss is "evicted".
        assert miss(a, "again", p) == {}
        chains = kvmesh.chain_keys(p, BS, a.scheduler._chain_salt)
        client.erase(kvmesh.derive_keys(chains[:3], a.worker._layers[NAMES[-1]].tags))
        assert miss(a, "gone", p) == {"evicted": 1}
        mamba = Engine(client, 64, engine="f", groups=[("full", NAMES[:2], 0), ("mamba", NAMES[2:], 0)])
        others.append(mamba)
        assert miss(mamba, "u", p) == {"unsupported": 1}
        s = a.scheduler.stats()
        assert s["lookups"] == 4 and 0 < s["hit_rate"] < 1
        text = render_metrics()
        assert 'kvmesh_connector_misses_total{engine="vllm",role="scheduler",rank="scheduler",reason="evicted"}' \
            in text
    finally:
        for e in [a] + others:
            e.close()


def test_metrics_endpoint_serves_prometheus_text(client):
    port = serve_metrics(0)
    assert serve_metrics(0) == port  # one server per process
    e = Engine(client, 70, engine="metrics")
    try:
        e.run("x", prompt(40, base=50000), [[1, 2, 3]])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(2)) as r:
            body = r.read().decode()
        assert "# TYPE kvmesh_connector_lookups_total counter" in body
        assert 'kvmesh_connector_saved_blocks_total{engine="vllm",role="worker"' in body
    finally:
        e.close()


def test_layout_and_config_errors_are_clear(client):
    with pytest.raises(ValueError, match="coordinator"):
        KvmeshConnector(vllm_config(), "SCHEDULER", kv_cache_config())  # no client, no coordinator
    assert KvmeshConnector.requires_piecewise_for_cudagraph({}) is True
    assert KvmeshConnector.requires_piecewise_for_cudagraph({"layerwise": False}) is False
    assert KvmeshConnector.get_required_kvcache_layout(vllm_config()) == "NHD"
    assert KvmeshConnector.get_required_kvcache_layout(vllm_config(kv_cache_layout="HND")) == "HND"
    w = KvmeshConnector(vllm_config(), "WORKER", kv_cache_config(), client=client)
    try:
        assert w.requires_kv_delivery is False
        w.bind_connector_metadata(SimpleNamespace(loads=[object()], saves=[]))
        with pytest.raises(RuntimeError, match="register_kv_caches"):
            w.start_load_kv(None)
    finally:
        w.shutdown()


def test_layerwise_off_moves_every_layer_in_start_and_wait(engines):
    a = engines(80, layerwise=False, engine="nolayer")
    b = engines(81, layerwise=False, engine="nolayer")
    p = prompt(40, base=60000)
    assert a.run("n", p, [[1, 2, 3]]) == 0
    assert a.worker.stats()["saved_blocks"] == 2 * LAYERS
    req = SimpleNamespace(request_id="n2", prompt_token_ids=p)
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (32, False)
    b.scheduler.update_state_after_alloc(req, None, 32)
    meta = b.scheduler.build_connector_meta(sched_out([new_req("n2", p, [[7, 8, 9]], 32)], scheduled={"n2": 8}))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_load_kv(None)
    assert not b.worker._loads  # done before returning
    for name in NAMES:
        assert torch.equal(b.kv[name][:, 7:9], a.kv[name][:, 1:3])
    b.worker.clear_connector_metadata()


def test_a_stalled_cluster_costs_the_scheduler_a_bounded_wait():
    """Nodes that stop answering make a lookup a miss ("unavailable") after
    lookup_timeout_ms, never a long stall of vLLM's scheduler thread."""
    import signal
    import time

    from conftest import Daemons

    d = Daemons().start()
    try:
        with kvmesh.Client(d.address, tenant="tests-vllm-stall", timeout_ms=scaled(2000)) as client:
            a = Engine(client, 90, engine="stall", lookup_timeout_ms=100)
            try:
                p = prompt(64, base=70000)
                a.run("s", p, [[1, 2, 3, 4, 5]])
                req = SimpleNamespace(request_id="s2", prompt_token_ids=p)
                assert a.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
                for n in d.node_ids:
                    d.signal(n, signal.SIGSTOP)
                t0 = time.monotonic()
                assert a.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
                assert time.monotonic() - t0 < scaled(1.0)
                a.scheduler.update_state_after_alloc(req, None, 0)
                assert a.scheduler.stats()["misses"]["unavailable"] == 1
            finally:
                for n in d.node_ids:
                    d.signal(n, signal.SIGCONT)
                a.close()
    finally:
        d.stop()


def test_runs_larger_than_a_slot_are_refused_without_breaking_the_engine(caplog):
    """A cluster whose slots are smaller than one run refuses every save: the
    connector counts the failures and logs why once; vLLM's step goes on."""
    from conftest import embedded_config

    with kvmesh.EmbeddedCluster(embedded_config(store={"slot_bytes": "4KiB"})) as small:
        e = Engine(small, 95, engine="small")
        try:
            with caplog.at_level("ERROR"):
                assert e.run("x", prompt(40, base=80000), [[1, 2, 3]]) == 0
                e.run("y", prompt(40, base=81000), [[4, 5, 6]])
            s = e.worker.stats()
            assert s["saved_blocks"] == 0 and s["save_errors"] == 2 * 2 * LAYERS
            refused = [r for r in caplog.records if "slot_bytes" in r.getMessage()]
            assert len(refused) == 1  # once, not once per layer and step
        finally:
            e.close()
