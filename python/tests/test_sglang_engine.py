"""kvmesh's SGLang HiCache backend, loaded and driven the way SGLang does it.

SGLang cannot be installed here, so ``python/tests/standins/sglang`` is a
stand-in of the parts that matter (each of its modules names the upstream
file and commit it follows): the storage contract (``hicache_storage``),
the backend factory, the host pools with upstream's buffer layouts, and the
cache controllers (``HiCacheController``, ``HybridCacheController``) with
their real storage threads. This module puts that directory first on
``sys.path`` (only here), so ``import sglang`` is the stand-in, and kvmesh's
backend is loaded only by name: ``storage_backend="dynamic"`` with
extra_config ``{"backend_name": "kvmesh", "module_path": "kvmesh.sglang",
"class_name": "KvmeshStorage", "coordinator": ..., "tenant": ...}``.

Two groups of tests:

* ``test_standin_*``: the stand-in checked against itself and against
  backends written here (a dict-backed one that behaves as upstream's
  ``HiCacheFile`` and a zero-copy one), plus the stand-in's own ``file``
  backend; also two backends with known bugs, to show the stand-in catches
  them. No kvmesh daemons.
* ``test_kvmesh_*``: the shipped backend against real daemons (conftest's
  ``engine_daemons``: cluster_configs/engines-local.json, the README's cluster): a request's pages backed up by one controller are found and
  read back, byte for byte, by another (fresh host pool, fresh backend), for
  MHA in every layout, MLA, a Mamba hybrid; generic <-> zero-copy paths;
  context- and tensor-parallel ranks; the all_pages / trailing_pages hit
  policies. Only the SGLang contract is used, plus ``get_stats()`` being a
  dict.

Run by hand: ``PYTHONPATH=build/python KVMESH_BIN=build/bin/kvmesh
/usr/bin/python3 -m pytest -q python/tests/test_sglang_engine.py``.
"""

import ctypes
import os
import sys
import threading
import uuid

# The stand-ins go first on sys.path here, and only here (not in conftest.py);
# the entry stays (other modules may share the directory, and the backend is
# imported lazily by the factory during the tests).
STANDINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins")
if STANDINS not in sys.path:
    sys.path.insert(0, STANDINS)

import pytest  # noqa: E402
import sglang  # noqa: E402
import torch  # noqa: E402

assert os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__))) == STANDINS, \
    f"sglang resolves to {sglang.__file__}, not to the stand-in"

from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.managers.standin_scheduler import StandinScheduler  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    STORAGE_BATCH_SIZE,
    HiCacheFile,
    file_config_suffix,
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    count_pool_hits,
)
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: E402
from sglang.srt.mem_cache.memory_pool import (  # noqa: E402
    DSATokenToKVPool,
    MambaPool,
    MHATokenToKVPool,
    MLATokenToKVPool,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.pool_host import (  # noqa: E402
    DSAIndexerPoolHost,
    HostPoolGroup,
    MambaPoolHost,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    PoolEntry,
)
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402
from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: E402
from sglang.srt.standin_dist import InProcessGroup  # noqa: E402

PAGE, LAYERS, HEADS, HEAD_DIM = 16, 4, 4, 64
POOL_PAGES = 24  # device pool pages; the host pool gets one more (upstream's alignment)
MODEL_NAME = "org/engine-test-1b"
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
WAIT_S = 20.0

# What the shipped backend is expected to choose when extra_config has no
# "interface_v1": zero copy (it sets interface_v1 in the extra_config dict
# it is given, before the controller reads it) for every pool here, all of
# which have get_page_buffer_meta.
KVMESH_DEFAULT_ZERO_COPY = True


# ---- models: device pool descriptors, host pools ---------------------------------

class Model:
    """The host side of one rank: its KV host pool (and sidecars for hybrids).

    kind: "mha", "mla", "mamba" (MHA KV anchor + Mamba state) or "dsa" (MLA
    KV anchor + DSA indexer)."""

    def __init__(self, kind, layout, dtype=None):
        self.kind, self.layout = kind, layout
        size = POOL_PAGES * PAGE
        self.mamba = self.indexer = None
        if kind in ("mha", "mamba"):
            self.device = MHATokenToKVPool(size, PAGE, dtype or torch.float16, HEADS, HEAD_DIM, LAYERS)
            self.kv = MHATokenToKVPoolHost(self.device, 1.0, 0, PAGE, layout)
        elif kind == "mla":
            self.device = MLATokenToKVPool(size, PAGE, dtype or torch.bfloat16, 64, 16, LAYERS)
            self.kv = MLATokenToKVPoolHost(self.device, 1.0, 0, PAGE, layout)
        elif kind == "dsa":
            self.device = DSATokenToKVPool(size, PAGE, dtype or torch.bfloat16, 64, 16, LAYERS, index_head_dim=64,
                                           quant_block_size=64)
            self.kv = MLATokenToKVPoolHost(self.device, 1.0, 0, PAGE, layout)
        else:
            raise ValueError(kind)
        self.host = self.kv
        if kind == "mamba":
            self.mamba_device = MambaPool(8, 2, conv_state_shapes=[(3, 32)], temporal_state_shape=(4, 8, 8))
            self.mamba = MambaPoolHost(self.mamba_device, 1.0, 0, layout="page_first")
            self.host = HostPoolGroup([PoolEntry(PoolName.KV, self.kv, self.device, is_primary_index_anchor=True),
                                       PoolEntry(PoolName.MAMBA, self.mamba, self.mamba_device)])
        if kind == "dsa":
            self.indexer = DSAIndexerPoolHost(self.device, self.kv)
            self.host = HostPoolGroup([PoolEntry(PoolName.KV, self.kv, self.device, is_primary_index_anchor=True),
                                       PoolEntry(PoolName.INDEXER, self.indexer, self.device)])

    @property
    def hybrid(self):
        return self.kind in ("mamba", "dsa")

    def buffers(self):
        out = []
        for pool in (self.kv, self.mamba, self.indexer):
            if pool is None:
                continue
            bufs = pool.kv_buffer if isinstance(pool.kv_buffer, (list, tuple)) else [pool.kv_buffer]
            out += [b for b in bufs if b.numel() > 0]
        return out

    def fill(self, seed):
        g = torch.Generator().manual_seed(seed)
        for b in self.buffers():
            raw = b.view(-1).view(torch.uint8)
            raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=g))
        return self

    def zero(self):
        for b in self.buffers():
            b.zero_()
        return self


def page_bytes(pool, index):
    """The bytes of one page (slot, for Mamba) of a host pool, in its flat order."""
    return pool.get_data_page(int(index), flat=True).contiguous().view(torch.uint8).clone()


def same_pages(pool_a, idx_a, pool_b, idx_b, pages, page_size=PAGE):
    return all(torch.equal(page_bytes(pool_a, idx_a[i * page_size]), page_bytes(pool_b, idx_b[i * page_size]))
               for i in range(pages))


def tokens(pages, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 50000, (pages * PAGE,), generator=g).tolist()


# ---- controllers -----------------------------------------------------------------

class Rig:
    """Controllers of one test (each rank: a controller with its own host pool
    and backend instance), detached at the end."""

    def __init__(self):
        self.controllers, self.groups = [], []

    def group(self, ranks):
        g = InProcessGroup(ranks, timeout_s=WAIT_S, name=f"g{len(self.groups)}")
        self.groups.append(g)
        return g

    def controller(self, model, extra_config, backend="dynamic", tp=None, cp=None, model_name=MODEL_NAME,
                   metrics=False):
        cls = HybridCacheController if model.hybrid else HiCacheController
        ctl = cls(TokenToKVPoolAllocator(model.device), model.host, PAGE, tp_group=tp, attn_cp_group=cp,
                  storage_backend=backend, prefetch_threshold=PAGE, model_name=model_name,
                  storage_backend_extra_config=None if extra_config is None else dict(extra_config),
                  enable_storage_metrics=metrics)
        self.controllers.append(ctl)
        return ctl, StandinScheduler(ctl, timeout_s=WAIT_S)

    def close(self):
        for g in self.groups:
            g.abort()
        errors = []
        for ctl in self.controllers:
            try:
                if ctl.enable_storage:
                    ctl.detach_storage_backend()
            except Exception as e:  # keep detaching the others
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def rig():
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def zero_copy(ctl):
    return ctl.page_set_func == ctl._page_set_zero_copy and ctl.page_get_func == ctl._page_get_zero_copy


def generic(ctl):
    return ctl.page_set_func == ctl._generic_page_set and ctl.page_get_func == ctl._generic_page_get


def mamba_backup(sched, model, toks, slot):
    """The HiMamba cache's backup transfer: the node's state under its last page's hash."""
    return [PoolTransfer(PoolName.MAMBA, host_indices=slot, keys=[sched.page_hashes(toks)[-1]],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES)]


def mamba_prefetch(model):
    """The HiMamba cache's prefetch transfer: a fresh slot, a placeholder key."""
    return [PoolTransfer(PoolName.MAMBA, host_indices=model.mamba.alloc(1), keys=["__placeholder__"],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES)]


def indexer_transfer():
    return [PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV, hit_policy=PoolHitPolicy.ALL_PAGES)]


def backup(sched, model, toks, skip_pages=1, last_hash=None, extra_pools=None, expect_tokens=None):
    """Backs up toks from host slots of model (after skip_pages unused pages); the slots."""
    if skip_pages:
        model.host.alloc(skip_pages * PAGE)
    idx = model.host.alloc(len(toks))
    op = sched.wait_backup(sched.backup(idx, toks, last_hash=last_hash, extra_pools=extra_pools))
    assert op.completed_tokens == (len(toks) if expect_tokens is None else expect_tokens)
    return idx


def roundtrip(rig, kind, layout, cfg_a, cfg_b, pages=5, seed=1, check_a=None, check_b=None, backend="dynamic",
              metrics=False):
    """A backs up one request; B (fresh pool, fresh backend) prefetches it and
    must hold A's pages (and Mamba state) byte for byte. With metrics, both
    controllers have storage metrics on and their get_stats() goes through
    SGLang's collector afterwards."""
    a, b = Model(kind, layout).fill(seed), Model(kind, layout).zero()
    ctl_a, sa = rig.controller(a, cfg_a, backend=backend, metrics=metrics)
    ctl_b, sb = rig.controller(b, cfg_b, backend=backend, metrics=metrics)
    for ctl, check in ((ctl_a, check_a), (ctl_b, check_b)):
        if check is not None:
            assert check(ctl), f"page functions: {ctl.page_set_func.__name__}, {ctl.page_get_func.__name__}"
    toks = tokens(pages, seed)
    extra_a = extra_b = None
    if kind == "mamba":
        a.mamba.alloc(1)
        slot_a = a.mamba.alloc(1)
        extra_a, extra_b = mamba_backup(sa, a, toks, slot_a), mamba_prefetch(b)
    elif kind == "dsa":
        extra_a, extra_b = indexer_transfer(), indexer_transfer()
    idx_a = backup(sa, a, toks, extra_pools=extra_a)
    b.host.alloc(3 * PAGE)  # B's pages land elsewhere than A's
    res = sb.prefetch("req-b", toks, extra_pools=extra_b)
    assert res.storage_hit_count == pages * PAGE, "batch_exists did not report every page"
    assert res.completed_tokens == pages * PAGE
    assert same_pages(a.kv, idx_a, b.kv, res.host_indices, pages)
    if kind == "mamba":
        assert res.pool_hits.get("mamba") == 1
        assert torch.equal(page_bytes(a.mamba, slot_a[0]), page_bytes(b.mamba, extra_b[0].host_indices[0]))
    if kind == "dsa":
        assert same_pages(a.indexer, idx_a, b.indexer, res.host_indices, pages)
    if metrics:
        sa.check_hicache_events()
        sb.check_hicache_events()
    return ctl_a, ctl_b


# ---- backends written here (stand-in self-test) ------------------------------------

_STORES = {}
_STORES_LOCK = threading.Lock()


class DictBackend(HiCacheStorage):
    """An in-memory backend that behaves as upstream's HiCacheFile (keys
    ``{key}{suffix}``, suffix by model / tp unless MLA / pp / cp; one flat page
    per key; set skips what exists; v2 sidecars ``{key}.{pool}``), plus the
    zero-copy v1 calls (one entry per page holding its parts, read and written
    at get_page_buffer_meta's addresses). extra_config "store" names the
    shared store; every call is recorded in ``calls``."""

    def __init__(self, storage_config, kwargs):
        assert kwargs == {}, kwargs
        self.storage_config, self.calls = storage_config, []
        c = storage_config
        self.suffix = file_config_suffix(c)  # namespaced as HiCacheFile does
        with _STORES_LOCK:
            self.store = _STORES.setdefault(c.extra_config["store"], {})
        self.lock = _STORES_LOCK

    def _k(self, key):
        return key + self.suffix

    def _rec(self, name, *args):
        self.calls.append((name,) + args)

    def register_mem_pool_host(self, mem_pool_host):
        self._rec("register_mem_pool_host")
        super().register_mem_pool_host(mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        self._rec("register_mem_host_pool_v2", str(host_pool_name))
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def get(self, key, target_location=None, target_sizes=None):
        with self.lock:
            v = self.store.get(self._k(key))
        if v is None:
            return None
        target_location.view(-1).view(torch.uint8).copy_(torch.frombuffer(bytearray(v), dtype=torch.uint8))
        return target_location

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        self._rec("batch_get", len(keys))
        return [self.get(k, t) for k, t in zip(keys, target_locations)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        with self.lock:
            if self._k(key) not in self.store:
                self.store[self._k(key)] = value.contiguous().view(torch.uint8).numpy().tobytes()
        return True

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        self._rec("batch_set", len(keys))
        return all(self.set(k, v) for k, v in zip(keys, values))

    def exists(self, key):
        with self.lock:
            return self._k(key) in self.store

    def batch_exists(self, keys, extra_info=None):
        self._rec("batch_exists", len(keys))
        return super().batch_exists(keys, extra_info)

    # zero copy
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        self._rec("batch_set_v1", len(keys))
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        per = len(ptrs) // len(keys)
        with self.lock:
            for i, k in enumerate(keys):
                if self._k(k) not in self.store:
                    self.store[self._k(k)] = [ctypes.string_at(p, s) for p, s in
                                              zip(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per])]
        return [True] * len(keys)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        self._rec("batch_get_v1", len(keys))
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        per = len(ptrs) // len(keys)
        out = []
        for i, k in enumerate(keys):
            with self.lock:
                parts = self.store.get(self._k(k))
            ok = isinstance(parts, list) and [len(p) for p in parts] == sizes[i * per:(i + 1) * per]
            if ok:
                for p, data in zip(ptrs[i * per:(i + 1) * per], parts):
                    ctypes.memmove(p, data, len(data))
            out.append(ok)
        return out

    # v2 sidecars, as HiCacheFile
    def _comp(self, key, name):
        return self._k(key) if name == PoolName.KV else self._k(f"{key}.{name}")

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        self._rec("batch_exists_v2", len(keys), [(str(t.name), list(t.keys or [])) for t in pool_transfers or []])
        with self.lock:
            have = set(self.store)
        kv = 0
        while kv < len(keys) and self._comp(keys[kv], PoolName.KV) in have:
            kv += 1
        hits, final = ({PoolName.KV: kv} if kv else {}), kv
        for t in pool_transfers or []:
            if final == 0:
                break
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = 0
                while boundary < kv and self._comp(keys[boundary], t.name) in have:
                    boundary += 1
            else:
                n = max(1, len(t.keys) if t.keys else 1)
                boundary = next((p for p in range(kv, 0, -1)
                                 if all(self._comp(keys[i], t.name) in have for i in range(max(0, p - n), p))), 0)
            if boundary:
                hits[t.name] = boundary
            final = min(final, boundary)
        return PoolTransferResult(final, hits)

    def _io_v2(self, transfers, write):
        out = {}
        for t in transfers:
            pool, keys = self.registered_pools[t.name], t.keys or []
            if t.host_indices is None or t.host_indices.numel() != len(keys) * pool.page_size:
                out[t.name] = [False] * len(keys)
                continue
            res = []
            for i, k in enumerate(keys):
                at, sk = int(t.host_indices[i * pool.page_size]), (k if t.name == PoolName.KV else f"{k}.{t.name}")
                if write:
                    res.append(self.set(sk, pool.get_data_page(at, flat=True)))
                else:
                    data = self.get(sk, pool.get_dummy_flat_data_page())
                    if data is not None:
                        pool.set_from_flat_data_page(at, data)
                    res.append(data is not None)
            out[t.name] = res
        return out

    def batch_set_v2(self, transfers, extra_info=None):
        self._rec("batch_set_v2", [(str(t.name), list(t.keys or [])) for t in transfers])
        return self._io_v2(transfers, True)

    def batch_get_v2(self, transfers, extra_info=None):
        self._rec("batch_get_v2", [(str(t.name), list(t.keys or [])) for t in transfers])
        return self._io_v2(transfers, False)

    def close(self):
        self._rec("close")

    def get_stats(self):
        return StorageMetrics(backup_pgs=[c[1] for c in self.calls if c[0] in ("batch_set", "batch_set_v1")])


class DictStatsBackend(DictBackend):
    """get_stats() as a plain dict: what SGLang's metrics collector refuses."""

    def get_stats(self):
        return {"backup_pgs": [1]}


class ClientArgBackend(DictBackend):
    """Bug 1: reads the factory's second positional argument as a client
    object (``__init__(self, storage_config=None, client=None)``), as kvmesh's
    old adapter did; the factory passes the kwargs dict ``{}`` there."""

    def __init__(self, storage_config=None, client=None):
        super().__init__(storage_config, {})
        self.client = client if client is not None else object()
        self.closed = False

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.region = self.client.register(mem_pool_host.kv_buffer)

    def close(self):
        ClientArgBackend.closed_instances.append(self)

    closed_instances = []


class PartKeysBackend(DictBackend):
    """Bug 2: batch_set (the generic path) stores one key per page, but
    batch_exists asks for one key per zero-copy part of a page, as kvmesh's
    old adapter did."""

    def batch_exists(self, keys, extra_info=None):
        parts = len(self.mem_pool_host.get_page_buffer_meta(torch.arange(PAGE))[0])
        expanded = [f"{k}#{j}" for k in keys for j in range(parts)]
        return HiCacheStorage.batch_exists(self, expanded, extra_info) // parts


class SelfChoosingBackend(DictBackend):
    """Chooses the zero-copy path itself, the way a dynamic backend can: by
    setting interface_v1 in its extra_config (the controller's own dict)
    before the controller reads it, unless the user set it."""

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self.storage_config.extra_config.setdefault("interface_v1", 1)


class NotABackend:
    def __init__(self, *args):
        pass


class ArgsRecorder(DictBackend):
    seen = []

    def __init__(self, *args, **kwargs):
        ArgsRecorder.seen.append((args, kwargs))
        super().__init__(*args, **kwargs)


def dict_cfg(store, **extra):
    cfg = {"backend_name": "dict", "module_path": __name__, "class_name": "DictBackend", "store": store}
    cfg.update(extra)
    return cfg


def backend_of(ctl):
    return ctl.storage_backend


# ==== stand-in self-test ===========================================================

def test_standin_contract_types():
    fields = [f for f in HiCacheStorageConfig.__dataclass_fields__]
    assert fields == ["tp_rank", "tp_size", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size", "is_mla_model",
                      "enable_storage_metrics", "is_page_first_layout", "model_name", "dp_rank", "dp_size",
                      "tp_lcm_size", "should_split_heads", "extra_config"]
    assert HiCacheStorage.__abstractmethods__ == {"get", "batch_get", "set", "batch_set", "exists"}
    assert STORAGE_BATCH_SIZE == 128
    assert PoolName.MAMBA == "mamba" and {PoolName.MAMBA: 1}["mamba"] == 1 and f"k.{PoolName.MAMBA}" == "k.mamba"
    assert [f for f in PoolTransfer.__dataclass_fields__] == ["name", "host_indices", "device_indices", "keys",
                                                             "hit_policy", "nodes_to_load", "indices_from_pool"]
    assert list(PoolTransferResult.__dataclass_fields__) == ["kv_hit_pages", "extra_pool_hit_pages"]
    r = PoolTransferResult.empty()
    r.update_kv_hit_pages(3), r.update_kv_hit_pages(2), r.update_extra_pool_hit_pages({"mamba": 1})
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (3, {"mamba": 1})
    assert count_pool_hits({"a": [True, True, False, True], "b": [True], "c": []}) == {"a": 2, "b": 1, "c": 0}
    for name in ("batch_get_v1", "batch_set_v1"):
        with pytest.raises(NotImplementedError):
            getattr(HiCacheStorage, name)(None, ["k"], torch.arange(PAGE))
    for name in ("batch_get_v2", "batch_set_v2", "batch_exists_v2"):
        with pytest.raises(NotImplementedError):
            getattr(HiCacheStorage, name)(None, [])
    assert not hasattr(HiCacheStorage, "close")


def test_standin_hash_chain():
    import hashlib

    toks = tokens(3, seed=7)
    h = get_hash_str(toks, None, page_size=PAGE)
    prev = b""
    for i in range(3):
        d = hashlib.sha256(prev + b"".join(t.to_bytes(4, "little") for t in toks[i * PAGE:(i + 1) * PAGE]))
        assert h[i] == d.hexdigest()
        prev = d.digest()
    assert get_hash_str(toks[PAGE:], h[0], page_size=PAGE) == h[1:]
    assert get_hash_str(toks[:PAGE]) == h[0] and len(get_hash_str(toks[:PAGE + 1], page_size=PAGE)) == 2


def test_standin_factory_dynamic(rig):
    cfg = HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=None)
    with pytest.raises(ValueError, match="Unknown storage backend"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    for missing in ("backend_name", "module_path", "class_name"):
        c = dict_cfg("factory")
        del c[missing]
        cfg.extra_config = c
        with pytest.raises(ValueError, match=f"Missing required field '{missing}'"):
            StorageBackendFactory.create_backend("dynamic", cfg, None)
    cfg.extra_config = dict_cfg("factory", class_name="NotABackend")
    with pytest.raises(TypeError, match="must inherit from HiCacheStorage"):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    cfg.extra_config = dict_cfg("factory", module_path="no_such_module_here")
    with pytest.raises(ImportError):
        StorageBackendFactory.create_backend("dynamic", cfg, None)
    # Construction is backend_class(storage_config, kwargs): the kwargs dict, positionally.
    ArgsRecorder.seen.clear()
    model = Model("mha", "page_first")
    ctl, _ = rig.controller(model, dict_cfg("factory", class_name="ArgsRecorder", interface_v1=0, tp_lcm_size=None))
    (args, kwargs), = ArgsRecorder.seen
    assert len(args) == 2 and args[0] is ctl.storage_config and args[1] == {} and kwargs == {}
    sc = ctl.storage_config
    assert (sc.tp_rank, sc.tp_size, sc.attn_cp_rank, sc.attn_cp_size, sc.is_mla_model, sc.is_page_first_layout,
            sc.model_name) == (0, 1, 0, 1, False, True, MODEL_NAME)
    assert "tp_lcm_size" not in sc.extra_config and sc.extra_config["class_name"] == "ArgsRecorder"
    assert backend_of(ctl).mem_pool_host is model.kv and generic(ctl)
    assert backend_of(ctl).calls[0] == ("register_mem_pool_host",)


def test_standin_builtin_file_backend(rig, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(tmp_path / "hicache"))
    ctl_a, ctl_b = roundtrip(rig, "mha", "page_first", None, None, check_a=generic, check_b=generic,
                             backend="file")
    assert isinstance(ctl_a.storage_backend, HiCacheFile) and ctl_a.storage_config.extra_config == {}
    names = sorted(os.listdir(tmp_path / "hicache"))
    assert len(names) == 5 and all(n.endswith("_org-engine-test-1b_0_1.bin") for n in names)


@pytest.fixture
def file_backend_rig(rig, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(tmp_path / "hicache"))
    return rig


class DynamicFile(HiCacheFile):
    """The stand-in's HiCacheFile loaded as a *dynamic* backend (its own
    ``__init__(storage_config, file_path)`` would take the factory's kwargs
    dict for the path)."""

    def __init__(self, storage_config, kwargs):
        super().__init__(storage_config)


def file_cfg():
    return {"backend_name": "file", "module_path": __name__, "class_name": "DynamicFile"}


@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS]
                         + [("mamba", "page_first"), ("dsa", "page_first")])
def test_standin_generic_roundtrip_file(file_backend_rig, kind, layout):
    roundtrip(file_backend_rig, kind, layout, file_cfg(), file_cfg(), check_a=generic, check_b=generic)


@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS])
def test_standin_zero_copy_roundtrip_dict(rig, kind, layout):
    store = f"zc-{kind}-{layout}"
    _STORES.pop(store, None)
    ctl_a, ctl_b = roundtrip(rig, kind, layout, dict_cfg(store, interface_v1=1), dict_cfg(store, interface_v1=1),
                             check_a=zero_copy, check_b=zero_copy)
    assert [c[0] for c in backend_of(ctl_a).calls] == ["register_mem_pool_host", "batch_set_v1"]
    assert [c[0] for c in backend_of(ctl_b).calls] == ["register_mem_pool_host", "batch_exists", "batch_get_v1"]


@pytest.mark.parametrize("iface", [None, 0, 1])
def test_standin_backend_may_choose_zero_copy(rig, iface):
    """The controller picks the page functions after register_mem_pool_host,
    from storage_config.extra_config["interface_v1"]."""
    store = f"choose-{iface}"
    _STORES.pop(store, None)
    extra = {} if iface is None else {"interface_v1": iface}
    check = generic if iface == 0 else zero_copy
    roundtrip(rig, "mha", "layer_first", dict_cfg(store, class_name="SelfChoosingBackend", **extra),
              dict_cfg(store, class_name="SelfChoosingBackend", **extra), check_a=check, check_b=check)


def test_standin_storage_metrics(rig):
    """get_stats() is read only with storage metrics on, through SGLang's
    collector: None or a StorageMetrics; a dict fails its assertion."""
    _STORES.pop("metrics", None)
    ctl_a, _ = roundtrip(rig, "mha", "page_first", dict_cfg("metrics"), dict_cfg("metrics"), metrics=True)
    assert ctl_a.storage_config.enable_storage_metrics
    with pytest.raises(AssertionError):
        roundtrip(rig, "mha", "page_first", dict_cfg("metrics", class_name="DictStatsBackend"),
                  dict_cfg("metrics", class_name="DictStatsBackend"), metrics=True)


def test_standin_batches_of_128_pages(rig):
    """A request over 128 pages goes to the backend in batches of 128."""
    store = "batches"
    _STORES.pop(store, None)
    global POOL_PAGES
    saved, POOL_PAGES = POOL_PAGES, 140
    try:
        roundtrip(rig, "mha", "page_first", dict_cfg(store), dict_cfg(store), pages=130)
    finally:
        POOL_PAGES = saved
    a, b = (backend_of(c) for c in rig.controllers)
    assert [c for c in a.calls if c[0] == "batch_set"] == [("batch_set", 128), ("batch_set", 2)]
    assert [c for c in b.calls if c[0] != "register_mem_pool_host"] == [
        ("batch_exists", 128), ("batch_exists", 2), ("batch_get", 128), ("batch_get", 2)]


def test_standin_hybrid_call_order(rig):
    """Hybrid: v2 registration of every entry after register_mem_pool_host;
    the Mamba sidecar written before the KV pages; on a hit batch_exists_v2
    with a placeholder key, the KV pages, then batch_get_v2 with the real
    (last hit page's) key."""
    store = "hybrid-order"
    _STORES.pop(store, None)
    ctl_a, ctl_b = roundtrip(rig, "mamba", "page_first", dict_cfg(store), dict_cfg(store), pages=4)
    a, b = backend_of(ctl_a), backend_of(ctl_b)
    assert ctl_a.storage_host_pool is ctl_a.mem_pool_host.anchor_entry.host_pool
    hashes = get_hash_str(tokens(4, 1), None, page_size=PAGE)
    assert a.calls == [("register_mem_pool_host",), ("register_mem_host_pool_v2", "kv"),
                       ("register_mem_host_pool_v2", "mamba"), ("batch_set_v2", [("mamba", [hashes[-1]])]),
                       ("batch_set", 4)]
    assert b.calls[3:] == [("batch_exists_v2", 4, [("mamba", ["__placeholder__"])]), ("batch_get", 4),
                           ("batch_get_v2", [("mamba", [hashes[-1]])])]


@pytest.mark.parametrize("kind,group_kw", [("mha", "cp"), ("mha", "tp"), ("mla", "tp")])
def test_standin_ranks(rig, kind, group_kw):
    """CP ranks and MHA TP ranks read back their own bytes; MLA: only tp rank
    0 writes (backup_skip), every rank reads its bytes."""
    store = f"ranks-{kind}-{group_kw}"
    _STORES.pop(store, None)
    models, idx, fresh, results = ranks_roundtrip(rig, lambda: dict_cfg(store), kind, group_kw)
    assert [c.backup_skip for c in rig.controllers[:2]] == [False, kind == "mla"]
    for r, res in enumerate(results):
        src = 0 if kind == "mla" else r
        assert same_pages(models[src].kv, idx[src], fresh[r].kv, res.host_indices, 4), f"rank {r}"
        if kind == "mha":
            assert not same_pages(models[1 - r].kv, idx[1 - r], fresh[r].kv, res.host_indices, 1)


def test_standin_min_reduce_across_ranks(rig):
    """MHA TP: rank 1 stored only 2 of 4 pages, so both ranks load 2."""
    store = "tp-min"
    _STORES.pop(store, None)
    writers, readers = rig.group(2), rig.group(2)
    toks = tokens(4, 5)
    for r in range(2):
        m = Model("mha", "page_first").fill(20 + r)
        _, s = rig.controller(m, dict_cfg(store), tp=writers.handle(r))
        backup(s, m, toks if r == 0 else toks[:2 * PAGE])
    scheds = [rig.controller(Model("mha", "page_first").zero(), dict_cfg(store), tp=readers.handle(r))[1]
              for r in range(2)]
    ops = [s.start_prefetch("req", toks) for s in scheds]
    assert [s.wait_hit(op) for s, op in zip(scheds, ops)] == [2 * PAGE, 2 * PAGE]
    for s, op in zip(scheds, ops):
        assert s.load(op)
    assert [s.wait_done(op).completed_tokens for s, op in zip(scheds, ops)] == [2 * PAGE, 2 * PAGE]


def test_standin_trailing_and_all_pages(file_backend_rig):
    trailing_pages_scenario(file_backend_rig, file_cfg)
    all_pages_scenario(file_backend_rig, file_cfg)


@pytest.mark.parametrize("layout", MHA_LAYOUTS)
def test_standin_pool_parts_and_flat_pages(layout):
    """get_page_buffer_meta's parts are the tensor slices upstream's layout
    says; the flat page round-trips into another pool; the parts
    concatenated equal the flat page except for MHA layer_first (K0 V0 K1 V1
    ... against all K then all V)."""
    for kind in ("mha", "mla", "mamba", "dsa"):
        if (kind == "mla" and layout not in MLA_LAYOUTS) or (kind in ("mamba", "dsa") and layout != "page_first"):
            continue
        m, other = Model(kind, layout).fill(3), Model(kind, layout).zero()
        for attr, ps in (("kv", PAGE), ("mamba", 1), ("indexer", PAGE)):
            pool = getattr(m, attr)
            if pool is None:
                continue
            at, p = 2 * ps, 2
            ptrs, sizes = pool.get_page_buffer_meta(torch.arange(at, at + ps))
            parts = [ctypes.string_at(ptr, size) for ptr, size in zip(ptrs, sizes)]
            flat = page_bytes(pool, at).numpy().tobytes()
            assert sum(sizes) == len(flat) == pool.get_dummy_flat_data_page().view(torch.uint8).numel()
            kv = pool.kv_buffer
            mha = isinstance(pool, MHATokenToKVPoolHost)
            if mha:
                if layout == "layer_first":
                    want = [kv[s, layer, at:at + PAGE] for layer in range(LAYERS) for s in (0, 1)]
                elif layout == "page_first":
                    want = [kv[0, at:at + PAGE], kv[1, at:at + PAGE]]
                else:
                    want = [kv[0, p], kv[1, p]]
            elif attr == "kv" and layout == "layer_first":
                want = [kv[layer, at:at + PAGE] for layer in range(LAYERS)]
            elif attr == "kv":
                want = [kv[at:at + PAGE]] if layout == "page_first" else [kv[p]]
            elif attr == "mamba":
                want = [pool.temporal_buffer[at], pool.conv_buffer[0][at]]
            else:
                want = [pool.index_k_with_scale_buffer[p]]
            assert parts == [w.contiguous().view(torch.uint8).numpy().tobytes() for w in want], (kind, attr)
            assert (b"".join(parts) == flat) == (not (mha and layout == "layer_first")), (kind, attr)
            target = getattr(other, attr)
            target.set_from_flat_data_page(at, pool.get_data_page(at))
            assert page_bytes(target, at).numpy().tobytes() == flat


def test_standin_host_buffer_allocation_hook():
    """init_kv_buffer allocates through the pool's allocator: a function
    (dims, dtype) -> tensor (a backend's alloc_host_buffer) can provide it."""
    got = []

    def alloc(dims, dtype):
        got.append((dims, dtype))
        return torch.zeros(dims, dtype=dtype)

    device = MHATokenToKVPool(POOL_PAGES * PAGE, PAGE, torch.float16, HEADS, HEAD_DIM, LAYERS)
    pool = MHATokenToKVPoolHost(device, 1.0, 0, PAGE, "page_first", allocator_type=alloc)
    assert got == [((2, pool.size, LAYERS, HEADS, HEAD_DIM), torch.float16)]
    mamba = MambaPoolHost(MambaPool(4, 2, [(3, 32)], (4, 8, 8)), 1.0, 0, layout="page_first", allocator_type=alloc)
    assert [d for d, _ in got[1:]] == [tuple(b.shape) for b in mamba.kv_buffer]


def test_standin_catches_client_argument_bug(rig):
    """A backend taking the factory's 2nd argument ({}) for a client fails at
    register_mem_pool_host, the attach is rolled back and the backend closed."""
    ClientArgBackend.closed_instances.clear()
    ctl = HiCacheController(TokenToKVPoolAllocator(Model("mha", "page_first").device),
                            Model("mha", "page_first").kv, PAGE)
    rig.controllers.append(ctl)
    with pytest.raises(AttributeError, match="'dict' object has no attribute 'register'"):
        ctl.attach_storage_backend("dynamic", PAGE, MODEL_NAME, dict_cfg("bug1", class_name="ClientArgBackend"))
    assert not ctl.enable_storage and ctl.storage_backend is None and generic(ctl)
    assert len(ClientArgBackend.closed_instances) == 1
    with pytest.raises(ValueError, match="Failed to create storage backend"):
        m = Model("mha", "page_first")
        HiCacheController(TokenToKVPoolAllocator(m.device), m.kv, PAGE, storage_backend="no-such-backend")


def test_standin_catches_part_keys_bug(rig):
    """batch_exists expanding page keys into part keys while batch_set stores
    one key per page: every page is written, none is ever found."""
    for cls, want in (("PartKeysBackend", 0), ("DictBackend", 4)):
        store = f"bug2-{cls}"
        _STORES.pop(store, None)
        a, b = Model("mha", "page_first").fill(1), Model("mha", "page_first").zero()
        _, sa = rig.controller(a, dict_cfg(store, class_name=cls))
        _, sb = rig.controller(b, dict_cfg(store, class_name=cls))
        toks = tokens(4, 9)
        backup(sa, a, toks)
        assert sb.prefetch("req", toks).storage_hit_count == want * PAGE


# ---- scenarios shared by the self-test and the kvmesh tests ---------------------------

def trailing_pages_scenario(rig, cfg):
    """Two radix nodes, pages 0-3 (Mamba state S1 under page 3's hash) and
    4-7 (S2 under page 7's). A request for 6 pages hits 4 with S1; 8 pages, or
    10 of which 2 were never stored, hit 8 with S2."""
    a = Model("mamba", "page_first").fill(31)
    _, sa = rig.controller(a, cfg())
    toks = tokens(8, 31)
    h = sa.page_hashes(toks)
    slots = a.mamba.alloc(2)
    idx1 = backup(sa, a, toks[:4 * PAGE], extra_pools=mamba_backup(sa, a, toks[:4 * PAGE], slots[0:1]))
    idx2 = backup(sa, a, toks[4 * PAGE:], last_hash=h[3], skip_pages=0,
                  extra_pools=[PoolTransfer(PoolName.MAMBA, host_indices=slots[1:2], keys=[h[7]],
                                            hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    idx_a = torch.cat([idx1, idx2])
    extra_toks = toks + tokens(2, 32)
    for req, want_pages, state in ((toks[:6 * PAGE], 4, slots[0]), (toks, 8, slots[1]), (extra_toks, 8, slots[1])):
        b = Model("mamba", "page_first").zero()
        _, sb = rig.controller(b, cfg())
        extra = mamba_prefetch(b)
        res = sb.prefetch("req", req, extra_pools=extra)
        assert res.storage_hit_count == want_pages * PAGE, (len(req) // PAGE, res.storage_hit_count // PAGE)
        assert res.completed_tokens == want_pages * PAGE and res.pool_hits.get("mamba") == 1
        assert res.operation.pool_storage_result.kv_hit_pages == want_pages
        assert extra[0].keys == [h[want_pages - 1]]
        assert same_pages(a.kv, idx_a, b.kv, res.host_indices, want_pages)
        assert torch.equal(page_bytes(a.mamba, state), page_bytes(b.mamba, extra[0].host_indices[0]))


def all_pages_scenario(rig, cfg):
    """DSA: KV pages 0-5 stored, the indexer component of page 3 missing: the
    usable prefix is 3 pages, and those come with their indexer pages."""
    a = Model("dsa", "page_first").fill(41)
    ctl_a, sa = rig.controller(a, cfg())
    toks = tokens(6, 41)
    h = sa.page_hashes(toks)
    idx_a = torch.cat([
        backup(sa, a, toks[:3 * PAGE], extra_pools=indexer_transfer()),
        backup(sa, a, toks[3 * PAGE:4 * PAGE], last_hash=h[2], skip_pages=0),
        backup(sa, a, toks[4 * PAGE:], last_hash=h[3], skip_pages=0, extra_pools=indexer_transfer()),
    ])
    res = ctl_a.storage_backend.batch_exists_v2(h, indexer_transfer())
    assert res.kv_hit_pages == 3 and res.extra_pool_hit_pages.get("indexer") == 3
    b = Model("dsa", "page_first").zero()
    _, sb = rig.controller(b, cfg())
    res = sb.prefetch("req", toks, extra_pools=indexer_transfer())
    assert res.storage_hit_count == 3 * PAGE and res.completed_tokens == 3 * PAGE
    assert same_pages(a.kv, idx_a, b.kv, res.host_indices, 3)
    assert same_pages(a.indexer, idx_a, b.indexer, res.host_indices, 3)


# ==== kvmesh's shipped backend ========================================================

@pytest.fixture
def tenant(request):
    return f"sgl-engine-{request.node.name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kvmesh_cfg(engine_daemons, tenant):
    """extra_config for kvmesh's backend (a function: each controller gets its own dict)."""

    def make(**extra):
        cfg = {"backend_name": "kvmesh", "module_path": "kvmesh.sglang", "class_name": "KvmeshStorage",
               "coordinator": engine_daemons.address, "tenant": tenant}
        cfg.update(extra)
        return cfg

    return make


def default_path(ctl):
    return zero_copy(ctl) if KVMESH_DEFAULT_ZERO_COPY else generic(ctl)


@pytest.mark.parametrize("kind,layout", [("mha", lay) for lay in MHA_LAYOUTS] + [("mla", lay) for lay in MLA_LAYOUTS]
                         + [("mamba", "page_first"), ("dsa", "page_first")])
def test_kvmesh_roundtrip(rig, kvmesh_cfg, kind, layout):
    """Storage metrics on: get_stats() must pass SGLang's collector (None or a StorageMetrics)."""
    ctl_a, ctl_b = roundtrip(rig, kind, layout, kvmesh_cfg(), kvmesh_cfg(), check_a=default_path,
                             check_b=default_path, metrics=True)
    for ctl in (ctl_a, ctl_b):
        assert isinstance(ctl.storage_backend, HiCacheStorage)


@pytest.mark.parametrize("kind,layout", [("mha", "page_first"), ("mha", "layer_first"), ("mha", "page_head"),
                                         ("mla", "layer_first")])
@pytest.mark.parametrize("writer,reader", [(0, 1), (1, 0)], ids=["generic-to-zero-copy", "zero-copy-to-generic"])
def test_kvmesh_generic_and_zero_copy_interoperate(rig, kvmesh_cfg, kind, layout, writer, reader):
    paths = {0: generic, 1: zero_copy}
    roundtrip(rig, kind, layout, kvmesh_cfg(interface_v1=writer), kvmesh_cfg(interface_v1=reader),
              check_a=paths[writer], check_b=paths[reader])


def test_kvmesh_batches_of_128_pages(rig, kvmesh_cfg):
    global POOL_PAGES
    saved, POOL_PAGES = POOL_PAGES, 140
    try:
        roundtrip(rig, "mha", "page_first", kvmesh_cfg(), kvmesh_cfg(), pages=130)
    finally:
        POOL_PAGES = saved


def ranks_roundtrip(rig, cfg, kind, group_kw, ranks=2, pages=4):
    """Writers of every rank back up the same tokens from different contents;
    fresh readers of every rank prefetch them together. The readers' pages,
    and the writer each reader's bytes must match."""
    writers, readers = rig.group(ranks), rig.group(ranks)
    toks = tokens(pages, 51)
    models, idx = [], []
    for r in range(ranks):
        m = Model(kind, "page_first").fill(60 + r)
        ctl, s = rig.controller(m, cfg(), **{group_kw: writers.handle(r)})
        skip = ctl.backup_skip
        idx.append(backup(s, m, toks, expect_tokens=0 if skip else None))
        models.append(m)
    fresh = [Model(kind, "page_first").zero() for _ in range(ranks)]
    scheds = [rig.controller(fresh[r], cfg(), **{group_kw: readers.handle(r)})[1] for r in range(ranks)]
    ops = [s.start_prefetch("req", toks) for s in scheds]
    for s, op in zip(scheds, ops):
        assert s.wait_hit(op) == pages * PAGE
        assert s.load(op)
    results = [s.wait_done(op) for s, op in zip(scheds, ops)]
    for r, res in enumerate(results):
        assert res.completed_tokens == pages * PAGE
    return models, idx, fresh, results


@pytest.mark.parametrize("iface", [None, 0], ids=["default", "generic"])
@pytest.mark.parametrize("group_kw", ["cp", "tp"])
def test_kvmesh_ranks_keep_their_own_pages(rig, kvmesh_cfg, group_kw, iface):
    """attn_cp ranks (and MHA tp ranks) store the same page keys with
    different bytes; each reads back its own."""
    cfg = (lambda: kvmesh_cfg()) if iface is None else (lambda: kvmesh_cfg(interface_v1=iface))
    models, idx, fresh, results = ranks_roundtrip(rig, cfg, "mha", group_kw)
    for r, res in enumerate(results):
        assert same_pages(models[r].kv, idx[r], fresh[r].kv, res.host_indices, 4), f"rank {r}"
        assert not same_pages(models[1 - r].kv, idx[1 - r], fresh[r].kv, res.host_indices, 1), f"rank {r}"


@pytest.mark.parametrize("iface", [None, 0], ids=["default", "generic"])
def test_kvmesh_mla_tp_ranks_share(rig, kvmesh_cfg, iface):
    """MLA: only tp rank 0 backs up; rank 1 reads the same bytes."""
    cfg = (lambda: kvmesh_cfg()) if iface is None else (lambda: kvmesh_cfg(interface_v1=iface))
    models, idx, fresh, results = ranks_roundtrip(rig, cfg, "mla", "tp")
    for r, res in enumerate(results):
        assert same_pages(models[0].kv, idx[0], fresh[r].kv, res.host_indices, 4), f"rank {r}"


def test_kvmesh_trailing_pages(rig, kvmesh_cfg):
    trailing_pages_scenario(rig, kvmesh_cfg)


def test_kvmesh_all_pages(rig, kvmesh_cfg):
    all_pages_scenario(rig, kvmesh_cfg)
