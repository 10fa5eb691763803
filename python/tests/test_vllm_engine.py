"""kvmesh's shipped vLLM connector, loaded and driven as vLLM does it.

vLLM cannot be installed here, so a stand-in of vLLM's connector loading and
calling sequence (python/tests/standins/vllm, following vllm-project/vllm at
003df2961dd8830c317a61f9745ccd557da9fa06) plays the engine: its
KVConnectorFactory imports the connector by name from the
``--kv-transfer-config`` JSON a user pastes, its engine core builds the
workers (worker connectors, then the paged KV caches they register) and then
the scheduler (scheduler connector), and its scheduler and model runner call
the connector in vLLM's order. The model is a toy whose K/V are a function of
the token prefix and whose tokens depend on the KV it attends to, read from
the paged cache: so a test can compare the KV a connector loaded, byte for
byte, with what the engine computes itself, and an engine's output with a run
without a connector.

Only the vLLM contract is relied on, plus ``connector.stats()["hit_tokens"]``.
Real daemons of the README's cluster for the engines (conftest.py
``engine_daemons``: cluster_configs/engines-local.json), a tenant per test, vLLM block size 16
(the cluster's block_tokens).

The stand-in's own self-test (python/tests/standins/vllm_selftest.py, no
kvmesh needed) runs here too.
"""

import dataclasses
import importlib
import os
import re
import signal
import sys
import uuid

import pytest

STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins")
if "vllm" in sys.modules and not getattr(sys.modules["vllm"], "STANDIN", False):
    raise ImportError(f"a real vllm ({sys.modules['vllm'].__file__}) is already imported; "
                      "these tests need the stand-in in python/tests/standins")
if sys.path[0] != STANDINS:
    sys.path.insert(0, STANDINS)

import torch  # noqa: E402

import vllm  # noqa: E402
from conftest import TIME_SCALE, scaled  # noqa: E402
from vllm._standin.harness import CASES, admitted_block_ids, check_request_blocks, make_vllm_config  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma  # noqa: E402
from vllm.engine.arg_utils import make_arg_parser  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm_selftest import (  # noqa: E402,F401  (the stand-in's self-test)
    engines,
    test_abort_finishes_once,
    test_async_load,
    test_chunked_prefill_stores_every_chunk,
    test_lookup_answered_none_is_asked_again,
    test_base_class_is_the_003df29_contract,
    test_cli_json_and_startup_reads,
    test_connector_that_skips_the_base_init_fails_at_scheduler_construction,
    test_factory_loads_by_module_path_and_checks,
    test_load_failure_on_a_hybrid_model_fails_as_upstream,
    test_load_failure_recompute,
    test_local_prefix_cache_then_connector,
    test_natural_preemption_when_blocks_run_out,
    test_non_hma_connector_on_hybrid_model_gets_one_group,
    test_parallel_state_is_per_worker_and_absent_on_the_scheduler,
    test_preemption_resumption_and_finish,
    test_store_then_hit,
    test_tp2_each_rank_its_heads,
)

assert vllm.STANDIN and vllm.__file__.startswith(STANDINS), vllm.__file__
# Imported: the stand-in's submodules resolve through vllm.__path__ and the
# factory finds vllm_selftest in sys.modules, so the path entry can go now.
sys.path.remove(STANDINS)

MHA = ["fa-NHD", "fa-HND", "packed-NHD", "packed-HND"]
ALL = MHA + ["flashinfer-HND", "mla", "hybrid", "hybrid-packed-HND"]


@pytest.fixture(scope="module", autouse=True)
def _standin_only_here():
    """The stand-in is on sys.path only while this module imports it; after the
    module neither it nor kvmesh.vllm (bound to it) stays in sys.modules."""
    yield
    for name in list(sys.modules):
        if name in ("vllm", "vllm_selftest", "kvmesh.vllm") or name.startswith("vllm."):
            del sys.modules[name]
    kvmesh = sys.modules.get("kvmesh")
    if kvmesh is not None and "vllm" in vars(kvmesh):
        delattr(kvmesh, "vllm")


@pytest.fixture(autouse=True)
def _time_bound():
    """Every test ends within a bound (an alarm in the main thread)."""
    def expire(*_):
        raise TimeoutError("test_vllm_engine: over its time bound")
    prev = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, scaled(45))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, prev)


def kv_transfer_config_json(daemons, tenant: str) -> str:
    """What a user pastes after ``vllm serve <model> --kv-transfer-config``
    (docs/engines.md's line with this test's coordinator and a tenant). In a
    slowed-down (sanitizer) build the scheduler's lookup bound grows with it."""
    slow = ',"lookup_timeout_ms":%d' % scaled(100) if TIME_SCALE > 1 else ""
    return ('{"kv_connector":"KvmeshConnector","kv_connector_module_path":"kvmesh.vllm","kv_role":"kv_both",'
            '"kv_load_failure_policy":"recompute",'
            '"kv_connector_extra_config":{"coordinator":"%s","tenant":"%s"%s}}' % (daemons.address, tenant, slow))


@pytest.fixture
def kvmesh_engines(engine_daemons, request, monkeypatch):
    """make(case, tp=1, connector=True, **config) -> EngineCore; every engine of
    a test shares the test's tenant; all are shut down at the end."""
    tenant = "vllm-engine-" + re.sub(r"[^A-Za-z0-9]+", "-", request.node.name) + "-" + uuid.uuid4().hex[:8]
    line = kv_transfer_config_json(engine_daemons, tenant)
    made = []

    def make(case, connector=True, **kw):
        if case.layout is None:
            monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
        else:
            monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", case.layout)
        ktc = make_arg_parser().parse_args(["--kv-transfer-config", line]).kv_transfer_config if connector \
            else None
        made.append(EngineCore(make_vllm_config(case, ktc, **kw)))
        return made[-1]

    make.line = line
    yield make
    for e in made:
        e.shutdown()


def prompt(n, base):
    return [(base * 7919 + i * 104729) % 31991 for i in range(n)]


def run_one(engine, tokens, max_tokens=4, req_id=None):
    r = engine.make_request(tokens, max_tokens=max_tokens, request_id=req_id)
    engine.add_request(r)
    return engine.run([r.request_id])[r.request_id]


def step_until_scheduled(engine, req_id, max_steps=20):
    """Steps until the request's first forward pass (an asynchronous load first
    waits a step or more)."""
    for _ in range(max_steps):
        engine.step()
        if req_id in engine.scheduler.history[-1].num_scheduled_tokens:
            return
    raise AssertionError(f"{req_id} never scheduled")


def hit_tokens(engine) -> int:
    conns = [engine.scheduler.connector] + [engine.worker_connector(r)
                                            for r in range(len(engine.model_executor.workers))]
    return sum(int(c.stats().get("hit_tokens", 0)) for c in conns if hasattr(c, "stats"))


def finished_once(engine, req_ids):
    name = "request_finished_all_groups"
    return [len(engine.scheduler.calls(name, r)) for r in req_ids] == [1] * len(req_ids)


@pytest.mark.parametrize("case", ALL)
def test_second_engine_loads_what_the_first_stored(kvmesh_engines, case):
    """A stores a 100-token request; B (fresh connectors, same config) gets the
    whole stored prefix in blocks from get_num_new_matched_tokens, loads it, and
    its paged KV of those blocks equals what B's model computes; B's outputs are
    a connector-less engine's."""
    c = CASES[case]
    p = prompt(100, 1)
    a = kvmesh_engines(c)
    run_one(a, p)
    assert not a.kv_mismatches

    b = kvmesh_engines(c)
    q = p + prompt(20, 2)
    b.add_request(b.make_request(q, max_tokens=4, request_id="q"))
    step_until_scheduled(b, "q")
    lookup = b.scheduler.calls("get_num_new_matched_tokens", "q")[0]
    assert lookup.args["num_computed_tokens"] == 0
    assert lookup.result[0] == 96  # six whole blocks, the stored prefix
    assert b.scheduler.calls("update_state_after_alloc", "q")[0].args["num_external_tokens"] == 96
    ids = admitted_block_ids(b, "q")
    if c.hybrid:  # the sliding-window group holds only the window: null block 0 before it
        assert ids[1][:4] == [0, 0, 0, 0] and 0 not in ids[1][4:6] and 0 not in ids[0]
    assert check_request_blocks(b, q, ids, range(6)) == []
    assert hit_tokens(b) > 0

    # A prompt that is exactly the stored blocks: one token must stay to compute.
    b.add_request(b.make_request(p[:96], max_tokens=3, request_id="edge"))
    outs = b.run(["q", "edge"])
    assert b.scheduler.calls("get_num_new_matched_tokens", "edge")[0].result[0] == 80
    assert finished_once(b, ["q", "edge"])
    assert not b.kv_mismatches

    ref = kvmesh_engines(c, connector=False)
    assert run_one(ref, q) == outs["q"]
    assert run_one(ref, p[:96], max_tokens=3) == outs["edge"]


@pytest.mark.parametrize("case", ALL)
def test_hit_preempted_resumed_finished(kvmesh_engines, case):
    """A request that hit is preempted mid-decode (no connector call), looked up
    again and resumed (resumed_req_ids, full new block table), and finishes;
    another request finishes alongside; request_finished_all_groups once each."""
    c = CASES[case]
    p = prompt(100, 4)
    run_one(kvmesh_engines(c), p)

    b = kvmesh_engines(c)
    q = p + prompt(20, 5)
    b.add_request(b.make_request(q, max_tokens=10, request_id="q"))
    b.add_request(b.make_request(prompt(40, 6), max_tokens=3, request_id="other"))
    step_until_scheduled(b, "q")
    for _ in range(3):
        b.step()
    assert len(b.tokens["q"]) >= 3
    calls_before = len(b.scheduler.connector_calls)
    b.scheduler.preempt("q")
    b.step()
    so = b.scheduler.history[-1]
    assert so.preempted_req_ids == {"q"} and "q" not in so.num_scheduled_tokens
    assert [x.name for x in b.scheduler.connector_calls[calls_before:]
            if x.req_id == "q"] == []  # preemption calls nothing on the connector
    step_until_scheduled(b, "q")
    so = b.scheduler.history[-1]
    assert "q" in so.scheduled_cached_reqs.resumed_req_ids
    i = so.scheduled_cached_reqs.req_ids.index("q")
    ids = admitted_block_ids(b, "q", -1)
    assert so.scheduled_cached_reqs.new_block_ids[i] == ids
    lookups = b.scheduler.calls("get_num_new_matched_tokens", "q")
    assert len(lookups) >= 2 and lookups[-1].args["num_preemptions"] == 1
    assert lookups[-1].result[0] >= 96
    hit = lookups[-1].result[0]
    assert check_request_blocks(b, list(b.scheduler.requests["q"].all_token_ids), ids, range(hit // 16)) == []

    outs = b.run(["q", "other"])
    assert finished_once(b, ["q", "other"])
    assert not b.kv_mismatches
    ref = kvmesh_engines(c, connector=False)
    assert run_one(ref, q, max_tokens=10) == outs["q"]
    assert run_one(ref, prompt(40, 6), max_tokens=3) == outs["other"]


@pytest.mark.parametrize("case", ["fa-NHD", "hybrid"])
def test_chunked_prefill_then_hit(kvmesh_engines, case):
    """A prefills in chunks (running requests' later chunks arrive as cached
    requests); B still finds every full prompt block."""
    c = CASES[case]
    p = prompt(100, 16)
    a = kvmesh_engines(c, max_num_batched_tokens=40)
    out_a = run_one(a, p, req_id="p")
    assert [so.num_scheduled_tokens.get("p") for so in a.scheduler.history[:3]] == [40, 40, 20]
    b = kvmesh_engines(c)
    out_b = run_one(b, p + [9], req_id="q")
    assert b.scheduler.calls("get_num_new_matched_tokens", "q")[0].result[0] == 96
    assert not a.kv_mismatches and not b.kv_mismatches
    ref = kvmesh_engines(c, connector=False)
    assert run_one(ref, p) == out_a and run_one(ref, p + [9]) == out_b


@pytest.mark.parametrize("case", ["fa-NHD", "packed-HND", "mla"])
def test_tensor_parallel_2(kvmesh_engines, case):
    """TP 2: each rank's own heads round-trip (a rank holding the other's bytes
    would differ); MLA ranks both load the one latent cache."""
    c = CASES[case]
    p = prompt(100, 11)
    run_one(kvmesh_engines(c, tp=2), p)
    b = kvmesh_engines(c, tp=2)
    q = p + [7, 7, 7]
    b.add_request(b.make_request(q, max_tokens=4, request_id="q"))
    step_until_scheduled(b, "q")
    assert b.scheduler.calls("get_num_new_matched_tokens", "q")[0].result[0] == 96
    ids = admitted_block_ids(b, "q")
    assert check_request_blocks(b, q, ids, range(6)) == []
    r0, r1 = b.runner(0), b.runner(1)
    layer = r0.layer_names[0]
    if c.mla:
        assert torch.equal(r0.read_block(layer, ids[0][2]), r1.read_block(layer, ids[0][2]))
    else:
        assert r0.heads != r1.heads and not torch.equal(r0.read_block(layer, ids[0][2]),
                                                        r1.read_block(layer, ids[0][2]))
    out = b.run(["q"])["q"]
    assert not b.kv_mismatches
    assert out == run_one(kvmesh_engines(c, connector=False), q)


def test_startup_checks(kvmesh_engines, monkeypatch):
    """The start-up reads vLLM makes of the class and of the scheduler-side
    connector, for a hybrid model with full CUDA graphs requested."""
    c = CASES["hybrid"]
    e = kvmesh_engines(c, cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE)
    cfg = e.vllm_config
    cls = KVConnectorFactory.get_connector_class(cfg.kv_transfer_config)
    assert cls is importlib.import_module("kvmesh.vllm").KvmeshConnector
    assert supports_hma(cls) and cfg.scheduler_config.disable_hybrid_kv_cache_manager is False
    assert len(e.kv_cache_config.kv_cache_groups) == 2
    assert cls.requires_piecewise_for_cudagraph(cfg.kv_transfer_config.kv_connector_extra_config) is True
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert e.scheduler.requires_kv_delivery is False
    assert type(e.scheduler.connector) is cls and type(e.worker_connector()) is cls
    # Worker connector first, then its caches registered (every layer of both groups).
    calls = e.runner().connector_calls
    assert calls[0] == ("created", True) and calls[1][0] == "register_kv_caches"
    assert calls[1][1] == sorted(e.runner().layer_names)

    # The layout the class asks for is the one the runner allocates (no override).
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    for name in ("fa-NHD", "mla"):
        case = CASES[name]
        probe = make_vllm_config(case, cfg.kv_transfer_config)
        want = cls.get_required_kvcache_layout(probe)
        assert want in (None, "NHD", "HND", "LBNHC", "LBHNC")
        f = kvmesh_engines(dataclasses.replace(case, layout=None))
        if not case.mla:
            assert f.runner().kv_cache_layout == {"LBNHC": "NHD", "LBHNC": "HND"}.get(want, want or "NHD")
        run_one(f, prompt(40, 21))
        assert not f.kv_mismatches


def test_local_prefix_cache_first(kvmesh_engines):
    """With vLLM's own prefix cache on, the connector is asked for tokens beyond
    the local hit and returns only those."""
    c = CASES["fa-NHD"]
    p = prompt(100, 12)
    run_one(kvmesh_engines(c), p)
    b = kvmesh_engines(c, enable_prefix_caching=True)
    run_one(b, p[:64] + [1, 2], req_id="first")
    out = run_one(b, p + [3], req_id="second")
    lookup = b.scheduler.calls("get_num_new_matched_tokens", "second")[0]
    assert lookup.args["num_computed_tokens"] == 64 and lookup.result[0] == 32
    assert not b.kv_mismatches
    assert out == run_one(kvmesh_engines(c, connector=False), p + [3])
