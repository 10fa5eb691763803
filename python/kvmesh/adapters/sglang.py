"""kvmesh as SGLang's HiCache L3 storage backend.

Method for method the shape of ``HiCacheStorage`` in SGLang's
``python/sglang/srt/mem_cache/hicache_storage.py`` (sgl-project/sglang, read at
commit 001067fffe33427bee0ed2f007fb7551a1d76b44): ``register_mem_pool_host``,
``batch_get_v1`` / ``batch_set_v1`` (zero copy into the host pool),
``get`` / ``batch_get`` / ``set`` / ``batch_set`` / ``exists`` /
``batch_exists`` (consecutive hits), ``clear``, ``get_stats``. The host pool is
used through ``get_page_buffer_meta(indices) -> (ptrs, sizes)`` as
``MHATokenToKVPoolHost`` in ``python/sglang/srt/mem_cache/pool_host/mha.py``
defines it: each page is one or more contiguous parts (page_first MHA: its K
and its V; layer_first: K and V of every layer; MLA: one).

This module does not import SGLang. To hand it to SGLang as a backend that
passes its ``isinstance`` checks, mix in the base class::

    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
    class Backend(KvmeshHiCacheStorage, HiCacheStorage): pass

Keys. A page key (SGLang's hash string) becomes one kvmesh key per part,
BLAKE2b of ``sglang | tenant | model | rank | page key | part``; the rank is
left out for MLA models, whose ranks hold the same bytes. The page-level calls
(``batch_exists``, ``batch_get_v1``, ``batch_set_v1``) address a page's parts;
``get`` / ``set`` and their batch forms address one value per key (as
SGLang's zero-copy backends do).
"""

import logging
from typing import Any, List, Optional

from .. import Client
from ._keys import from_text

logger = logging.getLogger(__name__)


def _sizes(sizes: Any, n: int) -> "list[int]":
    if isinstance(sizes, int):
        return [sizes] * n
    return [int(s) for s in sizes]


class KvmeshHiCacheStorage:
    """SGLang HiCache storage over kvmesh.

    storage_config: SGLang's ``HiCacheStorageConfig`` (tp_rank, tp_size,
    pp_rank, pp_size, is_mla_model, model_name, extra_config) or None.
    client: a kvmesh Client (or EmbeddedCluster) to use; otherwise one is
    made from extra_config ``{"coordinator": "host:port"}`` or
    ``{"config": "cluster.json"}``. tenant (or extra_config "tenant"): keys of
    different tenants never meet.

    use_allocate (or extra_config "use_allocate"): ``alloc_host_buffer`` takes
    the host pool's memory from ``Client.allocate`` (over UCX: shared memory
    the nodes of this host read and write themselves, the fastest path).
    None (the default) means on when the client has ``allocate``.

    Thread-safety: SGLang calls a backend from its prefetch and backup threads
    at once; every method here is safe to call concurrently.
    """

    def __init__(self, storage_config: Any = None, client: Optional[Client] = None, *, tenant: str = "",
                 use_allocate: Optional[bool] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self._owns_client = client is None
        if client is None:
            kw = {"tenant": extra.get("tenant", tenant)}
            if "timeout_ms" in extra:
                kw["timeout_ms"] = int(extra["timeout_ms"])
            client = Client(extra.get("coordinator"), config=extra.get("config"), **kw)
        self.client = client
        model = getattr(storage_config, "model_name", None) or ""
        tenant = extra.get("tenant", tenant)
        if getattr(storage_config, "is_mla_model", False):
            rank = "mla"
        else:
            rank = f"tp{getattr(storage_config, 'tp_rank', 0)}/{getattr(storage_config, 'tp_size', 1)}"
        if getattr(storage_config, "pp_size", 1) > 1:
            rank += f"/pp{storage_config.pp_rank}/{storage_config.pp_size}"
        self._prefix = f"sglang\0{tenant}\0{model}\0{rank}\0"
        self.mem_pool_host = None
        self._parts = 1
        self._regions = []
        self._allocations = []
        use_allocate = extra.get("use_allocate", use_allocate)
        self.use_allocate = hasattr(client, "allocate") if use_allocate is None else bool(use_allocate)

    # ---- the host pool ---------------------------------------------------------
    def alloc_host_buffer(self, dims: Any, dtype: Any) -> Any:
        """A CPU tensor of shape dims for the host pool's kv_buffer.

        With use_allocate its memory comes from ``Client.allocate`` (registered
        already; ``register_mem_pool_host`` then registers nothing), otherwise
        from ``torch.empty``. Give it to SGLang's host pool in place of its own
        allocation (the pool's ``init_kv_buffer``); the pool may still pin it
        (cudaHostRegister). The memory lives as long as the tensor."""
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

    def _allocated(self, buf: Any) -> bool:
        p, n = buf.data_ptr(), buf.numel() * buf.element_size()
        return any(a.registered and a.address <= p and p + n <= a.address + a.nbytes for a in self._allocations)

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers the host pool's buffers with kvmesh once (zero copy from then on);
        buffers from ``alloc_host_buffer`` are registered already."""
        import torch

        self.mem_pool_host = mem_pool_host
        buffers = mem_pool_host.kv_buffer
        if not isinstance(buffers, (list, tuple)):
            buffers = [buffers]
        for buf in buffers:
            if not self._allocated(buf):
                self._regions.append(self.client.register(buf))
        probe = torch.arange(mem_pool_host.page_size, dtype=torch.int64)
        ptrs, _ = mem_pool_host.get_page_buffer_meta(probe)
        self._parts = len(ptrs)

    def _page_keys(self, keys: List[str]) -> "list[tuple[int, int]]":
        if self._parts == 1:
            return [from_text(self._prefix + k) for k in keys]
        return [from_text(f"{self._prefix}{k}#{j}") for k in keys for j in range(self._parts)]

    def _value_key(self, key: str) -> "tuple[int, int]":
        return from_text(self._prefix + key)

    # ---- zero copy: pages of the registered host pool -------------------------
    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Reads each page straight into the host pool at host_indices; one bool per key."""
        if not keys:
            return []
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        sizes = _sizes(sizes, len(ptrs))
        if len(ptrs) != len(keys) * self._parts:
            raise ValueError(f"{len(keys)} keys but {len(ptrs)} buffer parts ({self._parts} per page)")
        res = self.client.get_into_ptrs(self._page_keys(keys), ptrs, sizes)
        p = self._parts
        return [all(res[i * p + j].ok and res[i * p + j].size == sizes[i * p + j] for j in range(p))
                for i in range(len(keys))]

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        """Stores each page straight from the host pool; pages already stored are not sent again."""
        if not keys:
            return []
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        sizes = _sizes(sizes, len(ptrs))
        if len(ptrs) != len(keys) * self._parts:
            raise ValueError(f"{len(keys)} keys but {len(ptrs)} buffer parts ({self._parts} per page)")
        page_keys = self._page_keys(keys)
        have = self.client.exists_each(page_keys)
        todo = [i for i, h in enumerate(have) if not h]
        ok = [True] * len(page_keys)
        if todo:
            res = self.client.put_from_ptrs([page_keys[i] for i in todo], [ptrs[i] for i in todo],
                                            [sizes[i] for i in todo])
            for i, r in zip(todo, res):
                ok[i] = r.ok
        p = self._parts
        return [all(ok[i * p:(i + 1) * p]) for i in range(len(keys))]

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Number of consecutive pages, from the first, stored with every part."""
        if not keys:
            return 0
        return self.client.exists(self._page_keys(keys)) // self._parts

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- one value per key ----------------------------------------------------
    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Stores value (a tensor or buffer), or target_sizes bytes at address target_location."""
        return self.batch_set([key], None if value is None else [value],
                              None if target_location is None else [target_location],
                              None if target_sizes is None else [target_sizes])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """True when every value was stored."""
        ks = [self._value_key(k) for k in keys]
        if values is not None:
            res = self.client.put_from(ks, [_contiguous(v) for v in values])
        elif target_locations is not None:
            res = self.client.put_from_ptrs(ks, target_locations, _sizes(target_sizes, len(ks)))
        else:
            raise ValueError("batch_set needs values or target_locations")
        return all(r.ok for r in res)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """The value read into target_location (a tensor, or an address with target_sizes); None on a miss."""
        out = self.batch_get([key], None if target_location is None else [target_location],
                             None if target_sizes is None else [target_sizes])
        return out[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """One entry per key: the filled target, or None on a miss.

        Targets are tensors, or addresses in registered memory with target_sizes.
        Without targets the values come back as new uint8 tensors."""
        import torch

        if not keys:
            return []
        ks = [self._value_key(k) for k in keys]
        if target_locations is None:
            out = []
            for k in ks:
                try:
                    out.append(torch.frombuffer(bytearray(self.client.get(k)), dtype=torch.uint8))
                except LookupError:
                    out.append(None)
            return out
        if isinstance(target_locations[0], int):
            res = self.client.get_into_ptrs(ks, target_locations, _sizes(target_sizes, len(ks)))
        else:
            res = self.client.get_into(ks, target_locations)
        return [t if r.ok else None for t, r in zip(target_locations, res)]

    # ---- housekeeping ----------------------------------------------------------
    def clear(self) -> None:
        """kvmesh evicts by itself and cannot list a tenant's keys: nothing to do."""
        logger.info("kvmesh: clear() leaves stored pages to kvmesh's eviction")

    def get_stats(self) -> dict:
        return self.client.stats()

    def close(self) -> None:
        """Unregisters the host pool (and closes the client this backend made).

        Memory from ``alloc_host_buffer`` is unregistered too; it stays valid
        for the pool's tensors until they are gone."""
        for r in self._regions:
            if r.registered:
                self.client.unregister(r)
        self._regions = []
        for a in self._allocations:
            if a.registered:
                self.client.unregister(a.region)
        self._allocations = []
        if self._owns_client:
            self.client.close()


def _contiguous(v: Any) -> Any:
    return v.contiguous() if hasattr(v, "contiguous") else v
