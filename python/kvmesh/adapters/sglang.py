"""kvmesh as SGLang's HiCache L3 storage backend: the engine-free core.

SGLang loads :class:`kvmesh.sglang.KvmeshStorage` through its ``dynamic``
backend (``module_path`` ``"kvmesh.sglang"``, ``class_name``
``"KvmeshStorage"``), which derives from SGLang's ``HiCacheStorage`` and from
this class. This module does not import SGLang.

The contract followed is SGLang's (sgl-project/sglang at commit
001067fffe33427bee0ed2f007fb7551a1d76b44:
``python/sglang/srt/mem_cache/hicache_storage.py``,
``storage/backend_factory.py``, ``managers/cache_controller.py``; the host
pools' page APIs and the hybrid controller as of that era; the facts relied
on are listed in ``python/tests/standins/sglang``, whose stand-in drives this
class in the tests):

- construction ``backend_class(storage_config, kwargs)`` (the factory's
  kwargs dict, not a client), then ``register_mem_pool_host(host_pool)``, then
  the controller picks its page functions from
  ``storage_config.extra_config["interface_v1"]``: this backend sets it to 1
  (zero copy, ``batch_get_v1`` / ``batch_set_v1`` straight between the host
  pool and the nodes) when the user did not, and back to 0 when the pool has
  no ``get_page_buffer_meta``.
- Both page paths store a page the same way, so ``batch_exists`` finds what
  either wrote and either reads what the other wrote: one kvmesh key per
  part of the page, a part being what ``get_page_buffer_meta`` returns for it
  (K and V; or K and V of every layer for ``layer_first``; one latent run for
  MLA); a flat page (the generic ``batch_set`` / ``batch_get``) is cut into
  the same parts (``layer_first`` MHA flat pages hold every K before every V,
  so their cuts are permuted).
- Keys: ``text_keys(page hash, salt)`` then one ``derive_keys`` tag per part;
  the salt names the tenant, the model, the pool and its layout, and the rank:
  tensor-parallel rank (left out for MLA, whose ranks hold the same bytes),
  pipeline rank, and context-parallel rank (attention CP ranks hold
  different tokens of a page and must not overwrite each other).
- The v2 pool API (hybrid models): ``register_mem_host_pool_v2``,
  ``batch_exists_v2`` with the ``all_pages`` / ``trailing_pages`` hit
  policies tested on the KV page hashes, ``batch_get_v2`` /
  ``batch_set_v2`` for mamba, sliding-window, indexer and draft pools.
"""

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _core
from ..errors import Error
from ._client import make_client
from ._diagnose import Diagnoser, Miss
from ._stats import AdapterStats, serve_metrics
from ._memory import whole_storage

logger = logging.getLogger(__name__)

KV = "kv"
_VALUE = b"value"  # the tag of a value that is not a page


def _name(x: Any) -> str:
    """A pool name (SGLang's PoolName is a str enum) as its plain value."""
    return str(getattr(x, "value", x))


def _sizes(sizes: Any, n: int) -> List[int]:
    if isinstance(sizes, int):
        return [sizes] * n
    return [int(s) for s in sizes]


def _tensor_bytes(t: Any) -> Any:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    import torch

    return t.contiguous().view(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.contiguous().view(-1)


@dataclass
class PoolTransferResult:
    """SGLang's PoolTransferResult (the entry module passes SGLang's own)."""
    kv_hit_pages: int
    extra_pool_hit_pages: Dict[str, int] = field(default_factory=dict)


@dataclass
class _Plan:
    """How one pool's pages become kvmesh keys."""
    name: str
    salt: bytes
    parts: int
    sizes: List[int]  # bytes of each part, in get_page_buffer_meta order
    flat_order: List[int]  # part index of each cut of a flat page, in flat order
    page_size: int
    zero_copy: bool
    desc: str
    tags: List[bytes] = field(default_factory=list)

    def keys(self, pages: Sequence[str]) -> np.ndarray:
        base = _core.text_keys(list(pages), self.salt)
        return _core.derive_keys(base, self.tags)


class KvmeshHiCacheStorage:
    """SGLang HiCache storage over kvmesh (the engine-free core; SGLang loads
    :class:`kvmesh.sglang.KvmeshStorage`).

    storage_config: SGLang's ``HiCacheStorageConfig`` (tp/pp/attn_cp ranks,
    is_mla_model, model_name, extra_config) or None. kwargs: the factory's
    kwargs dict (unused). extra_config: ``coordinator`` or ``config``,
    ``tenant``, ``token``, ``timeout_ms`` (the kvmesh client),
    ``use_allocate``, ``metrics_port``; ``interface_v1`` as SGLang reads it.
    client: a kvmesh Client to use instead of one made from extra_config.

    Thread-safety: SGLang calls a backend from its prefetch, I/O and backup
    threads at once; every method is safe to call concurrently.
    """

    def __init__(self, storage_config: Any = None, kwargs: Any = None, *, client: Any = None, tenant: str = "",
                 use_allocate: Optional[bool] = None, result_type: Any = PoolTransferResult):
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError("KvmeshHiCacheStorage(storage_config, kwargs): the second argument is SGLang's "
                            "factory kwargs dict; pass a kvmesh client as client=...")
        extra = getattr(storage_config, "extra_config", None)
        if extra is None:
            extra = {}
        self._extra = extra
        self._owns_client = client is None
        if client is None:
            client = make_client(dict(extra, tenant=extra.get("tenant", tenant)), engine="sglang",
                                 client_id="kvmesh-sglang")
        self.client = client
        self._tenant = str(extra.get("tenant", tenant))
        self._model = str(getattr(storage_config, "model_name", None) or "")
        self._mla = bool(getattr(storage_config, "is_mla_model", False))
        tp, tp_size = int(getattr(storage_config, "tp_rank", 0)), int(getattr(storage_config, "tp_size", 1))
        rank = "mla" if self._mla else f"tp{tp}/{tp_size}"
        pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        if pp_size > 1:
            rank += f"/pp{getattr(storage_config, 'pp_rank', 0)}/{pp_size}"
        cp_size = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        if cp_size > 1:
            rank += f"/cp{getattr(storage_config, 'attn_cp_rank', 0)}/{cp_size}"
        self._rank = rank
        self._prefix = f"sglang\0{self._tenant}\0{self._model}\0{rank}\0"
        self._result_type = result_type
        # Zero copy unless the user chose: SGLang reads this after register_mem_pool_host.
        self._chose_interface = isinstance(extra, dict) and "interface_v1" not in extra
        if self._chose_interface:
            extra["interface_v1"] = 1
        self.mem_pool_host = None
        self.registered_pools: Dict[str, Any] = {}
        self._plans: Dict[str, _Plan] = {}
        self._regions: Dict[int, Any] = {}
        self._regions_lock = threading.Lock()
        self._allocations = []
        use_allocate = extra.get("use_allocate", use_allocate)
        self.use_allocate = hasattr(client, "allocate") if use_allocate is None else bool(use_allocate)
        self._stats = AdapterStats("sglang", "storage", rank)
        self._diagnoser: Optional[Diagnoser] = None
        self._warned: set = set()
        self._metrics_lock = threading.Lock()
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        self._prefetch_bw: List[float] = []
        self._backup_bw: List[float] = []
        if extra.get("metrics_port") is not None:
            port = serve_metrics(int(extra["metrics_port"]))
            logger.info("kvmesh: storage metrics on http://127.0.0.1:%d/metrics", port)

    # ---- host pools ----------------------------------------------------------------
    def alloc_host_buffer(self, dims: Any, dtype: Any) -> Any:
        """A CPU tensor of shape dims for a host pool's kv_buffer, in memory from
        ``Client.allocate`` when use_allocate (registered already: the
        fastest path over UCX), else torch.empty. The memory lives as long as
        the tensor."""
        import torch

        if not self.use_allocate:
            return torch.empty(dims, dtype=dtype, device="cpu")
        numel = 1
        for d in dims:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        alloc = self.client.allocate(max(nbytes, 1))
        self._allocations.append(alloc)
        return torch.frombuffer(alloc, dtype=torch.uint8)[:nbytes].view(dtype).view(*dims)

    def _register_buffers(self, pool: Any) -> None:
        import torch

        bufs = getattr(pool, "kv_buffer", None)
        if bufs is None:
            return
        if not isinstance(bufs, (list, tuple)):
            bufs = [bufs]
        for buf in bufs:
            if not isinstance(buf, torch.Tensor) or buf.numel() == 0:
                continue
            p, whole = whole_storage(buf)
            with self._regions_lock:
                if p in self._regions or self._allocated(p, whole.numel() * whole.element_size()):
                    continue
                self._regions[p] = self.client.register(whole)

    def _allocated(self, p: int, n: int) -> bool:
        return any(a.registered and a.address <= p and p + n <= a.address + a.nbytes for a in self._allocations)

    def _plan(self, name: str, pool: Any) -> _Plan:
        """Parts of a page of `pool`, probed through its page APIs."""
        import torch

        page = int(getattr(pool, "page_size", 1) or 1)
        zero_copy = hasattr(pool, "get_page_buffer_meta") and getattr(pool, "kv_buffer", None) is not None
        sizes: List[int] = []
        if zero_copy:
            try:
                ptrs, sz = pool.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
                sizes = _sizes(sz, len(ptrs))
            except Exception as e:  # noqa: BLE001 - a pool whose layout has no page meta: the generic path
                logger.info("kvmesh: %s pool has no zero-copy page layout (%s)", name, e)
                zero_copy = False
        if not sizes:
            try:
                flat = pool.get_dummy_flat_data_page()
                sizes = [flat.numel() * flat.element_size()]
            except Exception:  # noqa: BLE001 - no page API at all (a logical anchor)
                sizes = [0]
        parts = len(sizes)
        layout = str(getattr(pool, "layout", ""))
        layers = int(getattr(pool, "layer_num", 0) or 0)
        order = list(range(parts))
        if not self._mla and name == KV and layout == "layer_first" and layers and parts == 2 * layers:
            # the flat page is (2, layers, page, heads, dim): every K, then every V
            order = [2 * c if c < layers else 2 * (c - layers) + 1 for c in range(parts)]
        dims = ",".join(str(getattr(pool, a, "")) for a in ("layer_num", "head_num", "head_dim"))
        desc = f"{type(pool).__name__}|{layout}|{str(getattr(pool, 'dtype', '')).replace('torch.', '')}|{dims}|" \
               f"p{page}|" + ",".join(map(str, sizes))
        plan = _Plan(name, f"{self._prefix}{name}\0{desc}".encode(), parts, sizes, order, page, zero_copy, desc)
        plan.tags = [str(j).encode() for j in range(parts)]
        return plan

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the KV host pool's memory once (buffers from
        alloc_host_buffer are registered already) and probes its page parts."""
        self.mem_pool_host = mem_pool_host
        self._register_buffers(mem_pool_host)
        plan = self._plan(KV, mem_pool_host)
        self._plans[KV] = plan
        if self._chose_interface and not plan.zero_copy:
            self._extra["interface_v1"] = 0  # the controller then takes the generic path
        entry = {"engine": "sglang", "kind": "text", "model": self._model, "tenant": self._tenant,
                 "block_size": plan.page_size, "salt": plan.salt.hex(), "tag": plan.tags[0].hex(),
                 "layout": plan.desc}
        if self._diagnoser is None:
            self._diagnoser = Diagnoser(self.client, self._stats, entry)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A pool of a hybrid model (mamba, swa, indexer, draft; kv is the anchor
        registered already)."""
        name = _name(host_pool_name)
        self.registered_pools[name] = host_pool
        if name == KV and KV in self._plans and host_pool is self.mem_pool_host:
            return
        self._register_buffers(host_pool)
        self._plans[name] = self._plan(name, host_pool)

    def _kv_plan(self) -> _Plan:
        plan = self._plans.get(KV)
        if plan is None:
            raise RuntimeError("kvmesh: register_mem_pool_host was not called")
        return plan

    # ---- existence -------------------------------------------------------------------
    def _leading(self, plan: _Plan, pages: Sequence[str]) -> int:
        if not pages:
            return 0
        return self.client.exists(plan.keys(pages)) // plan.parts

    def _each(self, plan: _Plan, pages: Sequence[str]) -> np.ndarray:
        have = np.asarray(self.client.exists_each(plan.keys(pages)), dtype=bool)
        return have.reshape(len(pages), plan.parts).all(axis=1)

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of consecutive pages, from the first, stored with every part."""
        if not keys:
            return 0
        plan = self._kv_plan()
        t0 = time.perf_counter()
        errors = self.client.stats()["node_errors"]
        try:
            hit = self._leading(plan, keys)
            down = hit < len(keys) and self.client.stats()["node_errors"] != errors
        except Error as e:
            logger.warning("kvmesh: batch_exists failed (a miss): %s", e)
            hit, down = 0, True
        self._stats.lookup_time(time.perf_counter() - t0)
        self._stats.add(lookups=1, lookup_tokens=len(keys) * plan.page_size, hit_tokens=hit * plan.page_size)
        if down:  # a node did not answer: its pages read as misses
            self._stats.miss("unavailable")
        elif self._diagnoser is not None and hit < len(keys):
            self._diagnoser.submit(self._miss(keys[hit]))
        if self._diagnoser is not None and hit:
            self._diagnoser.remember(list(keys[:hit]))
        return hit

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def _miss(self, page: str) -> Miss:
        def probe(entry: dict) -> Optional[list]:
            if entry.get("kind") != "text":
                return None
            base = _core.text_keys([page], bytes.fromhex(entry["salt"]))
            return _core.derive_keys(base, bytes.fromhex(entry["tag"]))[0].tolist()

        return Miss(page, probe)

    # ---- zero copy: pages of a registered host pool -----------------------------
    def _meta(self, pool: Any, plan: _Plan, n: int, host_indices: Any) -> Tuple[List[int], List[int]]:
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        sizes = _sizes(sizes, len(ptrs))
        if len(ptrs) != n * plan.parts:
            raise ValueError(f"kvmesh: {n} keys but {len(ptrs)} buffer parts ({plan.parts} per page of the "
                             f"{plan.name} pool)")
        return list(ptrs), sizes

    def _refused(self, what: str, e: Exception, sizes: List[int]) -> None:
        key = (what, str(e))
        if key not in self._warned:
            self._warned.add(key)
            logger.error("kvmesh: a %s of pages with parts up to %d bytes was refused: %s (the nodes' "
                         "$.store.slot_bytes must hold the largest part: docs/engines.md, store sizing)",
                         what, max(sizes, default=0), e)

    def _get_ptrs(self, plan: _Plan, keys: List[str], ptrs: List[int], sizes: List[int]) -> List[bool]:
        try:
            res = self.client.get_into_ptrs(plan.keys(keys), ptrs, sizes)
        except Error as e:  # a miss for every page, never a crash of SGLang's I/O thread
            self._refused("load", e, sizes)
            return [False] * len(keys)
        p = plan.parts
        return [all(res[i * p + j].ok and res[i * p + j].size == sizes[i * p + j] for j in range(p))
                for i in range(len(keys))]

    def _set_ptrs(self, plan: _Plan, keys: List[str], ptrs: List[int], sizes: List[int]) -> List[bool]:
        part_keys = plan.keys(keys)
        ok = [True] * len(part_keys)
        try:
            have = self.client.exists_each(part_keys)
            todo = [i for i, h in enumerate(have) if not h]
            if todo:
                res = self.client.put_from_ptrs(part_keys[todo], [ptrs[i] for i in todo],
                                                [sizes[i] for i in todo])
                for i, r in zip(todo, res):
                    ok[i] = r.ok
        except Error as e:  # not stored (a later miss), never a crash of SGLang's backup thread
            self._refused("save", e, sizes)
            return [False] * len(keys)
        p = plan.parts
        return [all(ok[i * p:(i + 1) * p]) for i in range(len(keys))]

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page straight into the host pool at host_indices; one bool per key."""
        if not keys:
            return []
        plan = self._kv_plan()
        t0 = time.perf_counter()
        ptrs, sizes = self._meta(self.mem_pool_host, plan, len(keys), host_indices)
        ok = self._get_ptrs(plan, keys, ptrs, sizes)
        self._moved(ok, sum(sizes), time.perf_counter() - t0, load=True)
        return ok

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores each page straight from the host pool; parts already stored are not sent again."""
        if not keys:
            return []
        plan = self._kv_plan()
        t0 = time.perf_counter()
        ptrs, sizes = self._meta(self.mem_pool_host, plan, len(keys), host_indices)
        ok = self._set_ptrs(plan, keys, ptrs, sizes)
        self._moved(ok, sum(sizes), time.perf_counter() - t0, load=False)
        if self._diagnoser is not None:
            self._diagnoser.remember([k for k, o in zip(keys, ok) if o])
        return ok

    # ---- the generic path: flat pages (and single values) ------------------------
    def _cuts(self, plan: _Plan, flat: Any) -> Optional[List[Any]]:
        """The flat page's bytes cut into the plan's parts, in part order (views)."""
        b = _tensor_bytes(flat)
        if b.numel() != sum(plan.sizes):
            return None
        cuts: List[Any] = [None] * plan.parts
        off = 0
        for part in plan.flat_order:
            cuts[part] = b[off:off + plan.sizes[part]]
            off += plan.sizes[part]
        return cuts

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """True when every page was stored (False, never an exception, when
        kvmesh refuses: SGLang's backup thread would die of one)."""
        try:
            return self._batch_set(keys, values, target_locations, target_sizes)
        except Error as e:
            self._refused("save", e, self._plans[KV].sizes if KV in self._plans else [])
            self._stats.add(save_errors=len(keys))
            return False

    def _batch_set(self, keys: List[str], values: Any, target_locations: Any, target_sizes: Any) -> bool:
        """True when every page was stored. A value the size of a page is
        stored as the page's parts (the zero-copy path finds it); any other
        value, or one by address, as one value of its own (not a page:
        batch_exists does not count it)."""
        if not keys:
            return True
        plan = self._plans.get(KV)
        t0 = time.perf_counter()
        if values is not None:
            part_keys, bufs = [], []
            one = _core.text_keys(list(keys), plan.salt if plan else self._prefix.encode())
            for i, v in enumerate(values):
                cuts = self._cuts(plan, v) if plan is not None else None
                if cuts is None:
                    part_keys.append(_core.derive_keys(one[i:i + 1], _VALUE)[0])
                    bufs.append(_tensor_bytes(v) if hasattr(v, "contiguous") else v)
                else:
                    part_keys += list(plan.keys([keys[i]]))
                    bufs += cuts
            res = self.client.put_from(np.asarray(part_keys, dtype=np.uint64), bufs)
            ok = all(r.ok for r in res)
        elif target_locations is not None:
            base = _core.text_keys(list(keys), plan.salt if plan else self._prefix.encode())
            res = self.client.put_from_ptrs(_core.derive_keys(base, _VALUE), target_locations,
                                            _sizes(target_sizes, len(keys)))
            ok = all(r.ok for r in res)
        else:
            raise ValueError("batch_set needs values or target_locations")
        self._moved([ok] * len(keys), 0, time.perf_counter() - t0, load=False)
        if ok and self._diagnoser is not None:
            self._diagnoser.remember(list(keys))
        return ok

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """One entry per key: the filled target, or None on a miss (every one
        when kvmesh refuses the call)."""
        try:
            return self._batch_get(keys, target_locations, target_sizes)
        except Error as e:
            self._refused("load", e, self._plans[KV].sizes if KV in self._plans else [])
            self._stats.add(load_errors=len(keys))
            return [None] * len(keys)

    def _batch_get(self, keys: List[str], target_locations: Any, target_sizes: Any) -> List[Any]:
        """One entry per key: the filled target, or None on a miss. Targets are
        tensors (SGLang's dummy flat pages: filled from the page's parts), or
        addresses in registered memory with target_sizes. Without targets the
        values come back as new uint8 tensors."""
        import torch

        if not keys:
            return []
        plan = self._plans.get(KV)
        one = _core.derive_keys(_core.text_keys(list(keys), plan.salt if plan else self._prefix.encode()), _VALUE)
        t0 = time.perf_counter()
        if target_locations is None:
            out = []
            for i in range(len(keys)):
                try:
                    out.append(torch.frombuffer(bytearray(self.client.get(one[i].tolist())), dtype=torch.uint8))
                except LookupError:
                    out.append(None)
            return out
        if isinstance(target_locations[0], int):
            res = self.client.get_into_ptrs(one, target_locations, _sizes(target_sizes, len(keys)))
            return [t if r.ok else None for t, r in zip(target_locations, res)]
        out: List[Any] = [None] * len(keys)
        part_keys, bufs, owners, singles = [], [], [], []
        for i, t in enumerate(target_locations):
            cuts = self._cuts(plan, t) if plan is not None else None
            if cuts is None:
                singles.append(i)
                continue
            part_keys += list(plan.keys([keys[i]]))
            bufs += cuts
            owners += [i] * plan.parts
        if part_keys:
            res = self.client.get_into(np.asarray(part_keys, dtype=np.uint64), bufs)
            good: Dict[int, bool] = {}
            for i, r, b in zip(owners, res, bufs):
                good[i] = good.get(i, True) and r.ok and r.size == b.numel()
            for i, g in good.items():
                out[i] = target_locations[i] if g else None
        if singles:
            res = self.client.get_into(one[singles], [_tensor_bytes(target_locations[i]) for i in singles])
            for i, r in zip(singles, res):
                out[i] = target_locations[i] if r.ok else None
        self._moved([o is not None for o in out], 0, time.perf_counter() - t0, load=True)
        return out

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        out = self.batch_get([key], None if target_location is None else [target_location],
                             None if target_sizes is None else [target_sizes])
        return out[0]

    # ---- the v2 pool API (hybrid models) -------------------------------------------
    def _pool_plan(self, name: str) -> _Plan:
        plan = self._plans.get(name)
        if plan is None:
            raise KeyError(f"kvmesh: pool {name!r} was not registered (register_mem_host_pool_v2)")
        return plan

    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """Longest usable prefix over the KV pages and every pool: a pool's pages
        are looked up under the KV page hashes; ``all_pages`` needs every page of
        the prefix, ``trailing_pages`` the last len(transfer.keys) of it."""
        kv_buffer = getattr(self.mem_pool_host, "kv_buffer", True)
        kv = self.batch_exists(keys, extra_info) if kv_buffer is not None else len(keys)
        hits: Dict[str, int] = {KV: kv} if kv > 0 else {}
        final = kv
        for t in pool_transfers or []:
            if final == 0:
                break
            name = _name(t.name)
            plan = self._pool_plan(name)
            have = self._each(plan, keys[:kv]) if kv else np.zeros(0, bool)
            policy = _name(getattr(t, "hit_policy", "all_pages"))
            if policy == "trailing_pages":
                n = max(1, len(t.keys or []))
                boundary = 0
                for end in range(kv, 0, -1):
                    if have[max(0, end - n):end].all():
                        boundary = end
                        break
            else:
                bad = np.flatnonzero(~have)
                boundary = int(bad[0]) if bad.size else kv
            if boundary > 0:
                hits[name] = boundary
            final = min(final, boundary)
        return self._result_type(final, hits)

    def _pool_io(self, transfers: Any, load: bool) -> Dict[str, List[bool]]:
        out: Dict[str, List[bool]] = {}
        for t in transfers:
            name = _name(t.name)
            pool = self.registered_pools.get(name, self.mem_pool_host if name == KV else None)
            plan = self._pool_plan(name)
            keys = list(t.keys or [])
            idx = t.host_indices
            if pool is None or idx is None or int(idx.numel()) != len(keys) * plan.page_size:
                out[name] = [False] * len(keys)
                continue
            if not keys:
                out[name] = []
                continue
            t0 = time.perf_counter()
            try:
                ok, sizes = self._pool_move(pool, plan, keys, idx, load)
            except Error as e:
                self._refused("load" if load else "save", e, plan.sizes)
                ok, sizes = [False] * len(keys), []
            self._moved(ok, sum(sizes), time.perf_counter() - t0, load=load)
            out[name] = ok
        return out

    def _pool_move(self, pool: Any, plan: _Plan, keys: List[str], idx: Any,
                   load: bool) -> Tuple[List[bool], List[int]]:
        """One transfer of a v2 pool: zero copy through its page meta, else through its flat pages."""
        if plan.zero_copy:
            ptrs, sizes = self._meta(pool, plan, len(keys), idx)
            ok = self._get_ptrs(plan, keys, ptrs, sizes) if load else self._set_ptrs(plan, keys, ptrs, sizes)
            return ok, sizes
        ok = []
        for i, k in enumerate(keys):
            at = idx[i * plan.page_size]
            if load:
                page = pool.get_dummy_flat_data_page()
                res = self.client.get_into(plan.keys([k]), self._cuts(plan, page))
                good = all(r.ok for r in res)
                if good:
                    pool.set_from_flat_data_page(at, page)
            else:
                res = self.client.put_from(plan.keys([k]), self._cuts(plan, pool.get_data_page(at, flat=True)))
                good = all(r.ok for r in res)
            ok.append(good)
        return ok, plan.sizes * len(keys)

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._pool_io(transfers, load=True)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
        return self._pool_io(transfers, load=False)

    # ---- housekeeping ------------------------------------------------------------------
    def _moved(self, ok: List[bool], nbytes: int, seconds: float, load: bool) -> None:
        good = sum(ok)
        if load:
            self._stats.add(loaded_blocks=good, load_errors=len(ok) - good)
        else:
            self._stats.add(saved_blocks=good, save_errors=len(ok) - good)
        with self._metrics_lock:
            pgs, bw = (self._prefetch_pgs, self._prefetch_bw) if load else (self._backup_pgs, self._backup_bw)
            pgs.append(len(ok))
            if nbytes and seconds > 0:
                bw.append(nbytes / seconds / 1e9)

    def take_storage_metrics(self) -> Tuple[List[int], List[int], List[float], List[float]]:
        """Pages and GB/s per batch since the last call (SGLang's StorageMetrics fields:
        prefetch_pgs, backup_pgs, prefetch_bandwidth, backup_bandwidth)."""
        with self._metrics_lock:
            out = (self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw)
            self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw = [], [], [], []
        return out

    def stats(self) -> dict:
        """Counters of this backend (hit rate, misses by reason, pages moved)."""
        return self._stats.snapshot()

    def get_stats(self) -> Any:
        """SGLang reads this with --enable-storage-metrics and expects its own
        StorageMetrics (kvmesh.sglang returns one); the core has none: use stats()."""
        return None

    def clear(self) -> None:
        """kvmesh evicts by itself and cannot list a tenant's keys: nothing to do."""
        logger.info("kvmesh: clear() leaves stored pages to kvmesh's eviction")

    def close(self) -> None:
        """Unregisters the pools' memory (and closes the client this backend made).
        Memory from alloc_host_buffer stays valid for the pools' tensors."""
        if self._diagnoser is not None:
            self._diagnoser.close()
        for r in self._regions.values():
            if r.registered:
                self.client.unregister(r)
        self._regions = {}
        for a in self._allocations:
            if a.registered:
                self.client.unregister(a.region)
        self._allocations = []
        if self._owns_client:
            self.client.close()
