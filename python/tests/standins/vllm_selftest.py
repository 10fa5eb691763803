"""Self-test of the vLLM stand-in (python/tests/standins/vllm): a connector
written the way upstream's ExampleConnector is
(vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py @
00231834dc62bb1127ec5c8f2e6762c87d2f477e: keeps block copies in a shared store
keyed by the token prefix, loads in ``start_load_kv`` from
``forward_context.no_compile_layers[name].kv_cache``, saves in
``save_kv_layer``, no-op ``wait_for_layer_load`` / ``wait_for_save``), loaded
by name through the stand-in's factory, and tests that check the stand-in
drives it as vLLM would: store then hit, preemption and resumption, finish,
hybrid groups, MLA, TP 2, load failures, layouts, start-up checks, and the
AttributeError a connector that skips the base ``__init__`` gets.

Needs no kvmesh. python/tests/test_vllm_engine.py imports the tests (so ctest
runs them); ``python -m pytest python/tests/standins/vllm_selftest.py`` runs
them alone (with ``python/tests/standins`` on sys.path, which this module
ensures).

Differences from ExampleConnector, on purpose: it stores every full block (not
only whole prompts), per KV cache group and per TP rank; it loads only the
blocks beyond ``num_computed_tokens`` and skips null (out-of-window) block
entries; extra config can make it SupportsHMA, asynchronous, or fail loads.
"""

import hashlib
import os
import sys
from dataclasses import dataclass, field

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path[0] != _HERE:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402

assert getattr(vllm, "STANDIN", False), f"not the stand-in: {vllm.__file__}"

from vllm._standin.harness import CASES, admitted_block_ids, check_request_blocks, make_vllm_config  # noqa: E402
from vllm.config import CUDAGraphMode, KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA, supports_hma)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # noqa: E402
from vllm.engine.arg_utils import make_arg_parser, parse_kv_transfer_config  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402

MODULE = "vllm_selftest"
_STORES: dict = {}


def _prefix_key(tokens) -> bytes:
    return hashlib.blake2b(repr(tuple(tokens)).encode(), digest_size=16).digest()


@dataclass
class _Op:
    req_id: str
    tokens: list
    block_ids: tuple
    first: int
    count: int
    is_store: bool


@dataclass
class DictConnectorMetadata(KVConnectorMetadata):
    ops: list = field(default_factory=list)


class DictConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._setup(vllm_config, role, kv_cache_config)

    def _setup(self, vllm_config, role, kv_cache_config):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._block_size = vllm_config.cache_config.block_size
        self._store = _STORES.setdefault(extra.get("store", "default"), {})
        self._tp = vllm_config.parallel_config.tensor_parallel_size
        self._async = bool(extra.get("async_load", False))
        self._fail = set(extra.get("fail_load_blocks", ()))
        self._defer = dict(extra.get("defer_lookups", {}))  # req_id -> answer None this many times
        self._deferred: dict = {}
        self._groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self._layer_group = {n: g for g, grp in enumerate(self._groups) for n in grp.layer_names}
        if role == KVConnectorRole.WORKER or extra.get("rank_in_scheduler"):
            self._rank = get_tensor_model_parallel_rank()  # the worker's rank (AssertionError on the scheduler)
        # scheduler side
        self._requests: dict = {}
        self._lookup: dict = {}
        self._pending: dict = {}
        self._tracked: dict = {}
        self.finished: list = []
        # worker side
        self._kv_caches: dict = {}
        self._errors: set = set()
        self._recving: set = set()

    # ---- scheduler side ----------------------------------------------------------
    def on_new_request(self, request) -> None:
        self._requests[request.request_id] = request

    def _stored_blocks(self, tokens) -> int:
        n = 0
        while (n + 1) * self._block_size <= len(tokens):
            key = _prefix_key(tokens[:(n + 1) * self._block_size])
            if not all(("done", key, r) in self._store for r in range(self._tp)):
                break
            n += 1
        return n

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self._deferred.get(request.request_id, 0) < self._defer.get(request.request_id, 0):
            self._deferred[request.request_id] = self._deferred.get(request.request_id, 0) + 1
            return None, False
        tokens = list(request.all_token_ids)
        usable = (len(tokens) - 1) // self._block_size  # leave a token to compute
        hit = min(self._stored_blocks(tokens), usable) * self._block_size
        self._lookup[request.request_id] = num_computed_tokens
        if hit <= num_computed_tokens:
            return 0, False
        return hit - num_computed_tokens, self._async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens > 0:
            self._pending[request.request_id] = (request, blocks.get_block_ids(), num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        meta = DictConnectorMetadata()
        bs = self._block_size
        for req_id in scheduler_output.finished_req_ids:
            self._tracked.pop(req_id, None)
        for req_id, (request, block_ids, ext) in self._pending.items():
            local = self._lookup[req_id]
            meta.ops.append(_Op(req_id, list(request.all_token_ids[:local + ext]), block_ids, local // bs,
                                ext // bs, False))
            t = self._tracked.setdefault(req_id, {"block_ids": block_ids, "stored": 0})
            t["stored"] = max(t["stored"], (local + ext) // bs)
        self._pending.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            t = self._tracked.setdefault(new.req_id, {"stored": 0})
            t["block_ids"] = tuple(list(g) for g in new.block_ids)
            self._add_store(meta, new.req_id, t, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            t = self._tracked.setdefault(req_id, {"stored": 0, "block_ids": tuple([] for _ in self._groups)})
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                t["block_ids"] = tuple(list(g) for g in new_ids)
            elif new_ids is not None:
                t["block_ids"] = tuple(old + list(n) for old, n in zip(t["block_ids"], new_ids))
            self._add_store(meta, req_id, t, cached.num_computed_tokens[i] + scheduled[req_id])
        return meta

    def _add_store(self, meta, req_id, t, computed):
        tokens = list(self._requests[req_id].all_token_ids)
        full = min(computed, len(tokens)) // self._block_size
        if full > t["stored"]:
            meta.ops.append(_Op(req_id, tokens[:full * self._block_size], t["block_ids"], t["stored"],
                                full - t["stored"], True))
            t["stored"] = full

    def request_finished(self, request, block_ids):
        self.finished.append((request.request_id, block_ids))
        return False, None

    # ---- worker side ----------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        assert set(kv_caches) == set(self._layer_group), "a tensor for every layer of every group"
        self._kv_caches = dict(kv_caches)

    def _block(self, kv, bid):
        legacy = kv.dim() == 5 and kv.shape[0] == 2 and kv.shape[1] == self._kv_cache_config.num_blocks
        return kv[:, bid] if legacy else kv[bid]

    def _blocks(self, op, layer_name):
        g = self._layer_group[layer_name]
        for j in range(op.first, op.first + op.count):
            bid = op.block_ids[g][j]
            if bid == 0:  # the null block: out of the sliding window
                continue
            yield j, bid, (layer_name, _prefix_key(op.tokens[:(j + 1) * self._block_size]), self._rank)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for op in meta.ops:
            if op.is_store:
                continue
            for name, layer in forward_context.no_compile_layers.items():
                for j, bid, key in self._blocks(op, name):
                    if j in self._fail or key not in self._store:
                        self._errors.add(bid)
                        continue
                    self._block(layer.kv_cache, bid).copy_(self._store[key])
            if self._async:
                self._recving.add(op.req_id)
        self._fail = set()  # fail once

    def wait_for_layer_load(self, layer_name):
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        assert kv_layer is self._kv_caches[layer_name] or kv_layer.data_ptr() == self._kv_caches[layer_name].data_ptr()
        for op in self._get_connector_metadata().ops:
            if op.is_store:
                for _, bid, key in self._blocks(op, layer_name):
                    self._store[key] = self._block(kv_layer, bid).clone()

    def wait_for_save(self):
        for op in self._get_connector_metadata().ops:
            if op.is_store:
                for j in range(op.first, op.first + op.count):
                    self._store[("done", _prefix_key(op.tokens[:(j + 1) * self._block_size]), self._rank)] = True

    def get_finished(self, finished_req_ids):
        recving, self._recving = self._recving, set()
        return None, (recving or None)

    def get_block_ids_with_load_errors(self):
        errors, self._errors = self._errors, set()
        return errors


class DictConnectorHMA(DictConnector, SupportsHMA):
    def request_finished_all_groups(self, request, block_ids):
        self.finished.append((request.request_id, block_ids))
        return False, None


class HNDConnector(DictConnectorHMA):
    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None if vllm_config.model_config.use_mla else "HND"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return bool(extra_config.get("layerwise", True))


class NoBaseInitConnector(DictConnectorHMA):
    """Sets its own fields and never runs KVConnectorBase_V1.__init__ (the bug)."""

    def __init__(self, vllm_config, role, kv_cache_config):
        self._vllm_config = vllm_config
        self._role = role
        self._kv_cache_config = kv_cache_config
        self._connector_metadata = None
        self._setup(vllm_config, role, kv_cache_config)


class TwoArgConnector(DictConnectorHMA):
    def __init__(self, vllm_config, role):  # the deprecated signature
        super().__init__(vllm_config, role, None)


class MissingBuildMeta(KVConnectorBase_V1):
    def start_load_kv(self, forward_context, **kwargs): ...
    def wait_for_layer_load(self, layer_name): ...
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): ...
    def wait_for_save(self): ...
    def get_num_new_matched_tokens(self, request, num_computed_tokens): return 0, False
    def update_state_after_alloc(self, request, blocks, num_external_tokens): ...


# ---- helpers ----------------------------------------------------------------------------

def ktc(name="DictConnectorHMA", store="s", **extra):
    return KVTransferConfig(kv_connector=name, kv_connector_module_path=MODULE, kv_role="kv_both",
                            kv_connector_extra_config={"store": store, **extra})


def prompt(n, base):
    return [(base * 7919 + i * 104729) % 31991 for i in range(n)]


@pytest.fixture
def engines(monkeypatch):
    made = []
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)

    def make(case, kv=None, layout="case", **kw):
        lay = case.layout if layout == "case" else layout
        if lay is None:
            monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
        else:
            monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", lay)
        made.append(EngineCore(make_vllm_config(case, kv, **kw)))
        return made[-1]

    yield make
    for e in made:
        e.shutdown()
    _STORES.clear()


def run_one(engine, tokens, max_tokens=6, req_id=None):
    r = engine.make_request(tokens, max_tokens=max_tokens, request_id=req_id)
    engine.add_request(r)
    return engine.run([r.request_id])[r.request_id]


# ---- tests ------------------------------------------------------------------------------

def test_base_class_is_the_003df29_contract():
    abstract = {"start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"}
    assert KVConnectorBase_V1.__abstractmethods__ == frozenset(abstract)
    assert SupportsHMA.__abstractmethods__ == frozenset({"request_finished_all_groups"})
    cfg = make_vllm_config(CASES["fa-NHD"], ktc("DictConnector"), disable_hybrid_kv_cache_manager=True)
    with pytest.raises(TypeError):
        MissingBuildMeta(cfg, KVConnectorRole.SCHEDULER, None)
    with pytest.raises(TypeError):
        KVConnectorBase_V1.get_required_kvcache_layout(cfg)
    assert DictConnector.get_required_kvcache_layout(cfg) is None
    assert DictConnector.requires_piecewise_for_cudagraph({}) is False
    assert supports_hma(DictConnectorHMA) and not supports_hma(DictConnector)
    assert [r.value for r in KVConnectorRole] == [0, 1]
    skipped = NoBaseInitConnector(cfg, KVConnectorRole.SCHEDULER, None)
    with pytest.raises(AttributeError, match="_kv_transfer_config"):
        skipped.requires_kv_delivery  # noqa: B018 -- the base __init__ never ran
    assert DictConnector(cfg, KVConnectorRole.SCHEDULER, None).requires_kv_delivery is True  # kv_both
    no_ktc = make_vllm_config(CASES["fa-NHD"], None)
    with pytest.raises(ValueError, match="kv_transfer_config must be set"):
        DictConnector(no_ktc, KVConnectorRole.SCHEDULER, None)


def test_factory_loads_by_module_path_and_checks():
    assert KVConnectorFactory.get_connector_class(ktc()) is DictConnectorHMA
    with pytest.raises(ValueError, match="empty string"):
        KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector="X", kv_role="kv_both",
                                                                kv_connector_module_path=""))
    with pytest.raises(AttributeError, match="Class Nope not found in vllm_selftest"):
        KVConnectorFactory.get_connector_class(ktc("Nope"))
    with pytest.raises(ValueError, match="deprecated 2-argument"):
        KVConnectorFactory.get_connector_class(ktc("TwoArgConnector"))
    with pytest.raises(ValueError, match="Unsupported connector type"):
        KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector="Nope", kv_role="kv_both"))
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig(kv_connector="X")
    # HMA: None + non-HMA connector -> auto-disabled; explicit False -> create_connector refuses.
    auto = make_vllm_config(CASES["hybrid"], ktc("DictConnector"))
    assert auto.scheduler_config.disable_hybrid_kv_cache_manager is True
    kept = make_vllm_config(CASES["hybrid"], ktc("DictConnectorHMA"))
    assert kept.scheduler_config.disable_hybrid_kv_cache_manager is False
    forced = make_vllm_config(CASES["hybrid"], ktc("DictConnector"), disable_hybrid_kv_cache_manager=False)
    with pytest.raises(ValueError, match="does not support HMA but HMA is enabled"):
        KVConnectorFactory.create_connector(forced, KVConnectorRole.SCHEDULER, None)
    with pytest.raises(ValueError, match="does not support HMA"):
        EngineCore(forced)


def test_cli_json_and_startup_reads(engines):
    line = ('{"kv_connector":"HNDConnector","kv_connector_module_path":"vllm_selftest",'
            '"kv_role":"kv_both","kv_connector_extra_config":{"store":"cli"}}')
    parsed = parse_kv_transfer_config(line)
    args = make_arg_parser().parse_args(["--kv-transfer-config", line, "--no-disable-hybrid-kv-cache-manager"])
    same = {**parsed.__dict__, "engine_id": args.kv_transfer_config.engine_id}  # a fresh uuid each parse
    assert args.kv_transfer_config == KVTransferConfig(**same)
    assert args.disable_hybrid_kv_cache_manager is False
    assert parsed.is_kv_producer and parsed.is_kv_consumer and parsed.engine_id
    e = engines(CASES["fa-NHD"], parsed, layout=None)
    assert e.vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert e.scheduler.requires_kv_delivery is True  # kv_both and the base's default
    assert e.runner().kv_cache_layout == "HND"  # the connector class's preference
    t = e.runner().kv_caches["model.layers.0.self_attn.attn"]
    assert t.shape == (2, 96, 16, 4, 64) and not t.is_contiguous()
    # Worker connectors exist before the caches are registered; then register, then host ops.
    names = [c[0] for c in e.runner().connector_calls[:3]]
    assert names == ["created", "register_kv_caches", "set_host_xfer_buffer_ops"]
    # The environment wins over the connector's preference.
    e2 = engines(CASES["fa-NHD"], parse_kv_transfer_config(line), layout="NHD")
    assert e2.runner().kv_cache_layout == "NHD"
    assert e2.runner().kv_caches["model.layers.0.self_attn.attn"].is_contiguous()
    # Without a connector preference: NHD; with enforce_eager / no full graphs: untouched.
    e3 = engines(CASES["packed-NHD"], ktc(store="cli3"), layout=None, cudagraph_mode=CUDAGraphMode.PIECEWISE)
    assert e3.runner().kv_cache_layout == "NHD"
    p = e3.runner().kv_caches["model.layers.0.self_attn.attn"]
    assert p.shape == (96, 4, 16, 128) and p.stride() == (16 * 4 * 128, 128, 4 * 128, 1)


def test_connector_that_skips_the_base_init_fails_at_scheduler_construction(engines):
    with pytest.raises(AttributeError, match="_kv_transfer_config"):
        engines(CASES["fa-NHD"], ktc("NoBaseInitConnector"))


def test_parallel_state_is_per_worker_and_absent_on_the_scheduler(engines):
    e = engines(CASES["fa-NHD"], ktc(store="ps"), tp=2)
    assert [e.worker_connector(r)._rank for r in (0, 1)] == [0, 1]
    # TP 2 ("mp" executor): the engine-core process has no group; a scheduler-side call raises.
    with pytest.raises(AssertionError, match="tensor model parallel group is not initialized"):
        engines(CASES["fa-NHD"], ktc(store="ps2", rank_in_scheduler=True), tp=2)
    with pytest.raises(AssertionError, match="tensor model parallel group is not initialized"):
        engines(CASES["fa-NHD"], ktc(store="ps3", rank_in_scheduler=True), executor_backend="mp")
    # TP 1 ("uni" executor): the worker lives in the engine-core process, groups included.
    e1 = engines(CASES["fa-NHD"], ktc(store="ps4", rank_in_scheduler=True))
    assert e1.scheduler.connector._rank == 0
    assert e1.model_executor.workers[0].process is e1.process


def test_abort_finishes_once(engines):
    c = CASES["fa-NHD"]
    e = engines(c, ktc(store="abort"))
    e.add_request(e.make_request(prompt(50, 17), max_tokens=20, request_id="a"))
    e.step()
    e.step()
    e.abort_requests(["a"])
    e.run()
    assert len(e.scheduler.calls("request_finished_all_groups", "a")) == 1
    assert "a" in e.scheduler.history[-1].finished_req_ids and not e.scheduler.requests


@pytest.mark.parametrize("case", ["fa-NHD", "fa-HND", "packed-NHD", "packed-HND", "flashinfer-HND", "mla",
                                  "hybrid"])
def test_store_then_hit(engines, case):
    c = CASES[case]
    a = engines(c, ktc(store=case))
    p = prompt(100, 1)
    out_a = run_one(a, p)
    assert not a.kv_mismatches
    b = engines(c, ktc(store=case))
    q = p + prompt(20, 2)
    r = b.make_request(q, max_tokens=6, request_id="q")
    b.add_request(r)
    b.step()
    (lookup,) = b.scheduler.calls("get_num_new_matched_tokens", "q")
    assert lookup.args["num_computed_tokens"] == 0 and lookup.result == (96, False)
    ids = admitted_block_ids(b, "q")
    assert b.scheduler.calls("update_state_after_alloc", "q")[0].args["num_external_tokens"] == 96
    if c.hybrid:
        assert len(ids) == 2 and ids[1][:4] == [0, 0, 0, 0] and 0 not in ids[1][4:] and 0 not in ids[0]
    assert check_request_blocks(b, q, ids, range(6)) == []
    out_b = b.run(["q"])["q"]
    ref = engines(c, None)
    assert run_one(ref, q) == out_b and out_a == run_one(ref, p)
    assert not b.kv_mismatches and not ref.kv_mismatches
    finished = b.scheduler.calls("request_finished_all_groups", "q")
    assert len(finished) == 1 and len(finished[0].args["block_ids"]) == len(b.kv_cache_config.kv_cache_groups)


def test_non_hma_connector_on_hybrid_model_gets_one_group(engines):
    c = CASES["hybrid"]
    a = engines(c, ktc("DictConnector", store="nonhma"))
    assert len(a.kv_cache_config.kv_cache_groups) == 1
    run_one(a, prompt(100, 3))
    b = engines(c, ktc("DictConnector", store="nonhma"))
    q = prompt(100, 3) + [5, 6, 7]
    out = run_one(b, q, req_id="q")
    assert b.scheduler.calls("get_num_new_matched_tokens", "q")[0].result == (96, False)
    assert len(b.scheduler.calls("request_finished", "q")) == 1
    assert not b.scheduler.calls("request_finished_all_groups")
    assert out == run_one(engines(c, None), q) and not b.kv_mismatches


@pytest.mark.parametrize("case", ["fa-HND", "hybrid"])
def test_preemption_resumption_and_finish(engines, case):
    c = CASES[case]
    a = engines(c, ktc(store="pre" + case))
    p = prompt(100, 4)
    run_one(a, p)
    b = engines(c, ktc(store="pre" + case))
    q = p + prompt(20, 5)
    b.add_request(b.make_request(q, max_tokens=10, request_id="q"))
    b.add_request(b.make_request(prompt(40, 6), max_tokens=3, request_id="other"))
    for _ in range(4):
        b.step()
    b.scheduler.preempt("q")
    b.step()
    so = b.scheduler.history[-1]
    assert so.preempted_req_ids == {"q"} and "q" not in so.num_scheduled_tokens
    b.step()
    so = b.scheduler.history[-1]
    assert "q" in so.scheduled_cached_reqs.resumed_req_ids
    i = so.scheduled_cached_reqs.req_ids.index("q")
    assert so.scheduled_cached_reqs.new_block_ids[i] == admitted_block_ids(b, "q", 1)
    lookups = b.scheduler.calls("get_num_new_matched_tokens", "q")
    assert len(lookups) == 2 and lookups[1].args["num_preemptions"] == 1 and lookups[1].result[0] >= 96
    outs = b.run(["q", "other"])
    ref = engines(c, None)
    assert run_one(ref, q, max_tokens=10) == outs["q"]
    assert run_one(ref, prompt(40, 6), max_tokens=3) == outs["other"]
    name = "request_finished_all_groups"
    assert [len(b.scheduler.calls(name, r)) for r in ("q", "other")] == [1, 1]
    assert not b.kv_mismatches
    # Workers heard of both finishes; preemption reached handle_preemptions through the metadata.
    got = [d for n, d in b.runner().connector_calls if n == "get_finished" and d]
    assert {"q", "other"} <= set().union(*got)
    assert ("handle_preemptions", {"q"}) in b.runner().connector_calls


def test_natural_preemption_when_blocks_run_out(engines):
    c = CASES["fa-NHD"]
    e = engines(c, ktc(store="nat"), num_blocks=12)
    e.add_request(e.make_request(prompt(80, 7), max_tokens=40, request_id="x"))
    e.add_request(e.make_request(prompt(80, 8), max_tokens=40, request_id="y"))
    outs = e.run(["x", "y"])
    pre = [so.preempted_req_ids for so in e.scheduler.history if so.preempted_req_ids]
    assert pre and not e.kv_mismatches
    ref = engines(c, None)
    assert run_one(ref, prompt(80, 7), max_tokens=40) == outs["x"]


def test_load_failure_recompute(engines):
    c = CASES["fa-NHD"]
    a = engines(c, ktc(store="fail"))
    p = prompt(100, 9)
    run_one(a, p)
    kv = ktc(store="fail", fail_load_blocks=[3])
    kv.kv_load_failure_policy = "recompute"
    b = engines(c, kv)
    out = run_one(b, p + [1, 2, 3], req_id="q")
    assert b.scheduler.history[1].scheduled_cached_reqs.num_computed_tokens == [48]  # truncated to block 3
    assert out == run_one(engines(c, None), p + [1, 2, 3]) and not b.kv_mismatches


def test_load_failure_on_a_hybrid_model_fails_as_upstream(engines):
    """scheduler.py@003df29 reads group 0 only, by unpacking
    ``(req_block_ids,) = get_block_ids(req_id)``: with two KV cache groups a
    reported load error raises ValueError (upstream's "TODO HMA")."""
    c = CASES["hybrid"]
    p = prompt(100, 18)
    run_one(engines(c, ktc(store="failhma")), p)
    kv = ktc(store="failhma", fail_load_blocks=[4])
    kv.kv_load_failure_policy = "recompute"
    b = engines(c, kv)
    b.add_request(b.make_request(p + [1], max_tokens=3, request_id="q"))
    with pytest.raises(ValueError, match="too many values to unpack"):
        b.step()


def test_async_load(engines):
    c = CASES["packed-NHD"]
    a = engines(c, ktc(store="async"))
    p = prompt(64, 10)
    run_one(a, p)
    b = engines(c, ktc(store="async", async_load=True))
    out = run_one(b, p, req_id="q")  # a full-prompt hit: 48 tokens (one left to compute would be 63)
    (lookup,) = b.scheduler.calls("get_num_new_matched_tokens", "q")
    assert lookup.result == (48, True)
    allocs = b.scheduler.calls("update_state_after_alloc", "q")
    assert [x.args["num_external_tokens"] for x in allocs] == [48, 0]
    assert b.scheduler.history[0].num_scheduled_tokens == {}
    assert out == run_one(engines(c, None), p) and not b.kv_mismatches


@pytest.mark.parametrize("case", ["fa-HND", "mla"])
def test_tp2_each_rank_its_heads(engines, case):
    c = CASES[case]
    a = engines(c, ktc(store="tp" + case), tp=2)
    p = prompt(100, 11)
    run_one(a, p)
    b = engines(c, ktc(store="tp" + case), tp=2)
    q = p + [7, 7, 7]
    b.add_request(b.make_request(q, max_tokens=4, request_id="q"))
    b.step()
    assert check_request_blocks(b, q, admitted_block_ids(b, "q"), range(6)) == []
    r0, r1 = b.runner(0), b.runner(1)
    if c.mla:
        assert torch.equal(r0.read_block(r0.layer_names[0], 1), r1.read_block(r1.layer_names[0], 1))
    else:
        assert r0.heads != r1.heads
    out = b.run(["q"])["q"]
    assert out == run_one(engines(c, None, tp=2), q, max_tokens=4) == run_one(engines(c, None), q, max_tokens=4)


def test_lookup_answered_none_is_asked_again(engines):
    c = CASES["fa-NHD"]
    p = prompt(100, 13)
    run_one(engines(c, ktc(store="none")), p)
    b = engines(c, ktc(store="none", defer_lookups={"q": 2}))
    b.add_request(b.make_request(p + [1], max_tokens=3, request_id="q"))
    b.add_request(b.make_request(prompt(30, 14), max_tokens=3, request_id="other"))
    b.step()
    b.step()
    assert [x.result for x in b.scheduler.calls("get_num_new_matched_tokens", "q")] == [(None, False)] * 2
    assert all("q" not in so.num_scheduled_tokens for so in b.scheduler.history)
    assert "other" in b.scheduler.history[0].num_scheduled_tokens  # the skip does not block the queue
    outs = b.run(["q", "other"])
    assert b.scheduler.calls("get_num_new_matched_tokens", "q")[2].result == (96, False)
    assert outs["q"] == run_one(engines(c, None), p + [1], max_tokens=3) and not b.kv_mismatches


@pytest.mark.parametrize("case", ["fa-NHD", "hybrid"])
def test_chunked_prefill_stores_every_chunk(engines, case):
    c = CASES[case]
    a = engines(c, ktc(store="chunk" + case), max_num_batched_tokens=40)
    p = prompt(100, 15)
    out_a = run_one(a, p)
    assert [so.num_scheduled_tokens.get("req-0") for so in a.scheduler.history[:3]] == [40, 40, 20]
    assert a.scheduler.history[1].scheduled_cached_reqs.req_ids == ["req-0"]
    b = engines(c, ktc(store="chunk" + case), max_num_batched_tokens=40)
    out_b = run_one(b, p, req_id="q")
    assert b.scheduler.calls("get_num_new_matched_tokens", "q")[0].result == (96, False)
    assert out_a == out_b and not a.kv_mismatches and not b.kv_mismatches


def test_local_prefix_cache_then_connector(engines):
    c = CASES["fa-NHD"]
    a = engines(c, ktc(store="local"))
    p = prompt(100, 12)
    run_one(a, p)
    b = engines(c, ktc(store="local"), enable_prefix_caching=True)
    run_one(b, p[:64] + [1, 2], req_id="first")
    run_one(b, p + [3], req_id="second")
    (lookup,) = b.scheduler.calls("get_num_new_matched_tokens", "second")
    assert lookup.args["num_computed_tokens"] == 64 and lookup.result == (32, False)
    assert not b.kv_mismatches


__all__ = [n for n in dir() if n.startswith("test_")] + ["engines"]
