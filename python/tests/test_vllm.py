"""The vLLM KV connector adapter, driven as vLLM's scheduler and model runner
drive a KV connector v1, with each layer's KV in vLLM's paged layout
[2, num_blocks, block_size, num_kv_heads, head_dim]."""

import json
import urllib.request
from types import SimpleNamespace

import pytest
import torch

import kvmesh
from conftest import scaled
from kvmesh.adapters.vllm import KvmeshConnector

BS, LAYERS, HEADS, DIM, NUM_BLOCKS = 16, 4, 4, 64, 32
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def vllm_config(block_size=BS):
    return SimpleNamespace(cache_config=SimpleNamespace(block_size=block_size),
                           kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))


KV_CACHE_CONFIG = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=NAMES)])


class Blocks:  # vLLM's KVCacheBlocks, as the connector uses it
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (self.ids,)


def new_req(req_id, tokens, block_ids, computed):  # vLLM's NewRequestData
    return SimpleNamespace(req_id=req_id, prompt_token_ids=tokens, block_ids=(list(block_ids),),
                           num_computed_tokens=computed)


def sched_out(new=(), cached=None, scheduled=None):  # vLLM's SchedulerOutput
    return SimpleNamespace(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached,
                           num_scheduled_tokens=dict(scheduled or {}))


class Engine:
    """One vLLM instance: a scheduler-side and a worker-side connector and the paged KV."""

    def __init__(self, client, seed):
        self.scheduler = KvmeshConnector(vllm_config(), "SCHEDULER", KV_CACHE_CONFIG, client=client)
        self.worker = KvmeshConnector(vllm_config(), "WORKER", KV_CACHE_CONFIG, client=client)
        self.kv = {n: torch.zeros(2, NUM_BLOCKS, BS, HEADS, DIM, dtype=torch.float16) for n in NAMES}
        self.worker.register_kv_caches(self.kv)
        self.gen = torch.Generator().manual_seed(seed)

    def step(self, out, computes):
        """One forward pass; computes: (block_ids) whose KV this step writes, per layer."""
        meta = self.scheduler.build_connector_meta(out)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(SimpleNamespace(attn_metadata=None))
        for name in NAMES:
            self.worker.wait_for_layer_load(name)
            for b in computes:  # "attention" writes this step's K and V into the paged blocks
                self.kv[name][:, b] = torch.randn(2, BS, HEADS, DIM, generator=self.gen).half()
            self.worker.save_kv_layer(name, self.kv[name], None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return meta

    def close(self):
        self.worker.shutdown()
        self.scheduler.shutdown()


@pytest.fixture
def engines(client):
    made = []

    def make(seed):
        made.append(Engine(client, seed))
        return made[-1]

    yield make
    for e in made:
        e.close()


def prompt(n, base=100):
    return list(range(base, base + n))


def test_second_engine_loads_the_prefix_the_first_saved(engines):
    a, b = engines(1), engines(2)
    p = prompt(100)
    req = SimpleNamespace(request_id="r1", prompt_token_ids=p)
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    a.scheduler.update_state_after_alloc(req, Blocks([]), 0)
    ids_a = [5, 9, 2, 14, 7, 11, 3]
    meta = a.step(sched_out([new_req("r1", p, ids_a, 0)], scheduled={"r1": 100}), computes=ids_a)
    assert [(s.first_block, len(s.block_ids)) for s in meta.saves] == [(0, 6)]  # full prompt blocks only
    assert a.scheduler.request_finished(req, ids_a) == (False, None)

    # Engine b: the same 100 tokens and 20 more. 6 blocks come from kvmesh.
    p2 = p + prompt(20, base=5000)
    req2 = SimpleNamespace(request_id="r2", prompt_token_ids=p2)
    assert b.scheduler.get_num_new_matched_tokens(req2, 0) == (96, False)
    ids_b = [30, 1, 17, 4, 22, 8, 13, 25]
    b.scheduler.update_state_after_alloc(req2, Blocks(ids_b), 96)
    meta = b.step(sched_out([new_req("r2", p2, ids_b, 96)], scheduled={"r2": 24}), computes=ids_b[6:])
    assert [(t.first_block, t.block_ids) for t in meta.loads] == [(0, ids_b[:6])]
    assert [(t.first_block, t.block_ids) for t in meta.saves] == [(6, [ids_b[6]])]
    assert b.worker.get_block_ids_with_load_errors() == set()
    for name in NAMES:
        for i in range(6):
            assert torch.equal(b.kv[name][:, ids_b[i]], a.kv[name][:, ids_a[i]])  # K and V, byte for byte
    # Block 6, computed by b, is now stored as well.
    req3 = SimpleNamespace(request_id="r3", prompt_token_ids=p2)
    assert a.scheduler.get_num_new_matched_tokens(req3, 0) == (112, False)
    # Tokens vLLM's own prefix cache already has are not counted again.
    assert a.scheduler.get_num_new_matched_tokens(req3, 32) == (80, False)


def test_match_stops_at_the_first_incomplete_block(engines, client):
    a = engines(3)
    p = prompt(90, base=7000)
    ids = [0, 1, 2, 3, 4, 5]
    a.step(sched_out([new_req("q", p, ids, 0)], scheduled={"q": 90}), computes=ids)
    req = SimpleNamespace(request_id="q2", prompt_token_ids=p)
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (80, False)
    # Layer 2's V of block 3 gone: blocks 0..2 remain whole.
    k = client.keys(p, layers=(2, 3))[3]
    from kvmesh.adapters._keys import derive
    client.erase([derive(k, b"vllm-v")])
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    short = SimpleNamespace(request_id="q3", prompt_token_ids=p[:16])
    assert a.scheduler.get_num_new_matched_tokens(short, 0) == (0, False)  # one token must be left to compute


def test_blocks_lost_before_the_load_are_reported(engines, client):
    a, b = engines(4), engines(5)
    p = prompt(64, base=9100)
    ids = [10, 11, 12, 13]
    a.step(sched_out([new_req("w", p, ids, 0)], scheduled={"w": 64}), computes=ids)
    req = SimpleNamespace(request_id="w2", prompt_token_ids=p + [1])
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (64, False)
    b.scheduler.update_state_after_alloc(req, Blocks([20, 21, 22, 23, 24]), 64)
    client.erase([client.keys(p, layers=(1, 2))[2]])  # layer 1's K of block 2, after the match
    b.step(sched_out([new_req("w2", p + [1], [20, 21, 22, 23, 24], 64)], scheduled={"w2": 1}), computes=[24])
    assert b.worker.get_block_ids_with_load_errors() == {22}
    assert b.worker.get_block_ids_with_load_errors() == set()  # reported once
    for name in NAMES:
        for i in (0, 1, 3):
            assert torch.equal(b.kv[name][:, 20 + i], a.kv[name][:, 10 + i])


def test_chunked_prefill_saves_each_chunks_full_blocks(engines, client):
    a = engines(6)
    p = prompt(70, base=12000)
    ids = [3, 4, 5, 6, 7]
    m1 = a.step(sched_out([new_req("c", p, ids[:3], 0)], scheduled={"c": 40}), computes=ids[:3])
    assert [(s.first_block, len(s.block_ids)) for s in m1.saves] == [(0, 2)]
    cached = SimpleNamespace(req_ids=["c"], resumed_req_ids=set(), new_block_ids=[(ids[3:],)],
                             num_computed_tokens=[40])
    m2 = a.step(sched_out(cached=cached, scheduled={"c": 30}), computes=ids[2:])
    assert [(s.first_block, s.block_ids) for s in m2.saves] == [(2, [5, 6])]
    req = SimpleNamespace(request_id="c2", prompt_token_ids=p)
    assert a.scheduler.get_num_new_matched_tokens(req, 0) == (64, False)


def test_loads_start_per_layer_and_finish_on_wait(engines):
    a, b = engines(7), engines(8)
    p = prompt(48, base=15000)
    a.step(sched_out([new_req("s", p, [1, 2, 3], 0)], scheduled={"s": 48}), computes=[1, 2, 3])
    req = SimpleNamespace(request_id="s2", prompt_token_ids=p + [9])
    assert b.scheduler.get_num_new_matched_tokens(req, 0) == (48, False)
    b.scheduler.update_state_after_alloc(req, Blocks([4, 5, 6, 7]), 48)
    meta = b.scheduler.build_connector_meta(sched_out([new_req("s2", p + [9], [4, 5, 6, 7], 48)], scheduled={"s2": 1}))
    b.worker.bind_connector_metadata(meta)
    b.worker.start_load_kv(None)
    assert sorted(b.worker._loads) == sorted(NAMES)  # one transfer in flight per layer
    for name in reversed(NAMES):  # any order
        b.worker.wait_for_layer_load(name)
        assert torch.equal(b.kv[name][:, 4:7], a.kv[name][:, 1:4])
    b.worker.clear_connector_metadata()


def node_releases(daemons):
    """Blocks the daemons' nodes have released (their /stats), all tenants."""
    total = 0
    for n in daemons.node_ids:
        port = daemons.listening[n]["ports"]["http"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=scaled(2)) as r:
            total += json.loads(r.read())["releases"]
    return total


def run_request(engine, req_id, tokens, block_ids, params=None):
    """Match, allocate, one forward pass over the whole prompt, finish: vLLM's
    scheduler calls, in order. Returns the tokens kvmesh had."""
    req = SimpleNamespace(request_id=req_id, prompt_token_ids=tokens, kv_transfer_params=params)
    hit, _ = engine.scheduler.get_num_new_matched_tokens(req, 0)
    engine.scheduler.update_state_after_alloc(req, Blocks(block_ids), hit)
    engine.step(sched_out([new_req(req_id, tokens, block_ids, hit)], scheduled={req_id: len(tokens) - hit}),
                computes=block_ids[hit // BS:])
    engine.scheduler.request_finished(req, block_ids)
    return hit


def test_a_closed_session_releases_its_own_blocks(daemons):
    """kv_transfer_params {"kvmesh.session", "kvmesh.session_closes"}: on the
    closing request's finish, the blocks the session computed and no other
    request hit are released on the nodes (every layer's K and V); shared
    blocks are not, and nothing is erased."""
    with kvmesh.Client(daemons.address, tenant="tests-vllm-sessions", timeout_ms=scaled(2000)) as client:
        a = Engine(client, 21)
        try:
            shared = prompt(32, base=30000)  # two blocks every request below starts with
            doc = shared + prompt(48, base=31000)
            s = {"kvmesh.session": "s"}
            assert run_request(a, "s-1", doc + [7], list(range(6)), s) == 0  # saves blocks 0..4
            assert a.scheduler.released_blocks == 0  # the session is still open
            # Another request, of no session, reads the first two blocks: no longer s's own.
            assert run_request(a, "o-1", shared + prompt(20, base=32000), [20, 21, 22, 23]) == 32
            # s's follow-up reads its first prompt, computes two blocks more and closes s.
            follow = doc + prompt(40, base=33000)
            before = node_releases(daemons)
            closes = {"kvmesh.session": "s", "kvmesh.session_closes": True}
            assert run_request(a, "s-2", follow, list(range(8, 16)), closes) == 80
            assert a.scheduler.released_blocks == 5  # blocks 2..4 of s-1, 5..6 of s-2
            assert node_releases(daemons) - before == 5 * 2 * LAYERS
            # A hint, not an erase: every block is still there.
            probe = SimpleNamespace(request_id="p", prompt_token_ids=follow)
            assert a.scheduler.get_num_new_matched_tokens(probe, 0) == (112, False)
            a.scheduler.request_finished(probe, [])

            # A block read before, evicted and computed again is not the new session's own.
            client.erase(client.keys(doc, layers=(0, 1))[4:5])
            before = node_releases(daemons)
            again = doc + prompt(20, base=33500)  # blocks 0..3 hit, 4 computed again, 5 new
            assert run_request(a, "w-1", again, list(range(16, 23)), {"kvmesh.session_closes": True}) == 64
            assert a.scheduler.released_blocks == 5 + 1
            assert node_releases(daemons) - before == 1 * 2 * LAYERS

            # A request that closes without a session id is a session of its own.
            before = node_releases(daemons)
            one = shared + prompt(40, base=34000)
            assert run_request(a, "single", one, list(range(20, 25)), {"kvmesh.session_closes": True}) == 32
            assert a.scheduler.released_blocks == 6 + 2  # its blocks 2 and 3; 0 and 1 were stored before
            assert node_releases(daemons) - before == 2 * 2 * LAYERS
            # Blocks two sessions both saved are neither's own.
            twin = prompt(49, base=35000)  # three full blocks
            run_request(a, "t-1", twin, [1, 2, 3, 4], {"kvmesh.session": "t"})
            client.erase(client.keys(twin[:48], layers=(0, 1))[1:2])  # block 1 lost: u computes 1 and 2 again
            closes_u = {"kvmesh.session": "u", "kvmesh.session_closes": True}
            assert run_request(a, "u-1", twin, [5, 6, 7, 8], closes_u) == 16
            assert a.scheduler.released_blocks == 8  # block 0 is t's, 1 and 2 were t's first
            more = twin[:48] + prompt(17, base=36000)
            closes_t = {"kvmesh.session": "t", "kvmesh.session_closes": True}
            assert run_request(a, "t-2", more, [9, 10, 11, 12, 13], closes_t) == 48
            assert a.scheduler.released_blocks == 8 + 1  # only block 3; u read 0, 1 and 2
            # Nothing is left tracked.
            assert not a.scheduler._sessions and not a.scheduler._owner and not a.scheduler._req_session
            assert not a.scheduler._fresh and not a.scheduler._prompt_keys
        finally:
            a.close()


def test_layout_and_block_size_are_checked(client):
    with pytest.raises(ValueError):
        KvmeshConnector(vllm_config(block_size=32), "WORKER", KV_CACHE_CONFIG, client=client)
    w = KvmeshConnector(vllm_config(), "WORKER", KV_CACHE_CONFIG, client=client)
    try:
        with pytest.raises(ValueError):
            w.register_kv_caches({NAMES[0]: torch.zeros(NUM_BLOCKS, 2, BS, HEADS, DIM)})  # not vLLM's layout
        with pytest.raises(ValueError):
            w.register_kv_caches({"other.layer": torch.zeros(2, NUM_BLOCKS, BS, HEADS, DIM)})
    finally:
        w.shutdown()
