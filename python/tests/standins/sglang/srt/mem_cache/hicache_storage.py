"""Stand-in of ``python/sglang/srt/mem_cache/hicache_storage.py``,
sgl-project/sglang @ 001067fffe33427bee0ed2f007fb7551a1d76b44.

The storage-backend contract of HiCache's L3 tier, as that file has it:

* ``STORAGE_BATCH_SIZE = 128``: the most pages per batched storage call.
* ``HiCacheStorageConfig``: 15 fields, in upstream's order (tp_rank, tp_size,
  pp_rank, pp_size, attn_cp_rank, attn_cp_size, is_mla_model,
  enable_storage_metrics, is_page_first_layout, model_name, dp_rank=0,
  dp_size=1, tp_lcm_size=None, should_split_heads=False, extra_config=None).
* ``HiCacheStorageExtraInfo(prefix_keys=None, extra_info=None)``.
* ``PoolName`` (a ``str`` Enum whose ``__str__`` is the value, so
  ``PoolName.MAMBA == "mamba"``, equal hashes, ``f"{k}.{PoolName.MAMBA}"`` is
  ``"k.mamba"``), ``PoolHitPolicy`` (all_pages / trailing_pages),
  ``PoolTransfer`` (7 fields), ``SidecarPoolSpec``, ``PoolTransferResult``
  (two fields at 001067ff: kv_hit_pages, extra_pool_hit_pages; ``empty()``,
  ``update_kv_hit_pages`` keeps the max, ``update_extra_pool_hit_pages`` is a
  dict update), ``count_pool_hits`` (per pool, the entries before the first False).
* ``HiCacheStorage(ABC)``: abstract ``get``, ``batch_get``, ``set``,
  ``batch_set``, ``exists`` (nothing else); defaults: ``register_mem_pool_host``
  stores the pool as ``self.mem_pool_host``, ``register_mem_host_pool_v2``
  fills ``self.registered_pools[name]``, ``batch_exists`` counts the leading
  keys ``exists`` says yes to, the v1 and v2 methods raise
  NotImplementedError (raising, not returning None, is upstream's choice: a
  None kills the controller's daemon thread), ``clear`` does nothing,
  ``get_stats`` returns None. ``close`` is not part of the ABC (the
  controller calls it if the backend has it).
* ``HiCacheFile``: the built-in ``file`` backend, in a small version (no
  LRU evictor, no metadata cache) with upstream's key naming: config suffix
  ``_{model, "/"->"-"}`` + ``_{tp_rank}_{tp_size}`` unless MLA +
  ``_{pp_size}_{pp_rank}`` if pp_size > 1 + ``_cp{rank}_{size}`` if
  attn_cp_size > 1; one file ``{key}{suffix}.bin`` per page holding the flat
  page; ``set`` skips a key that exists; v2 component keys
  ``{key}.{pool}{suffix}`` (KV: the plain key); ``batch_exists_v2`` with
  all_pages / trailing_pages boundaries computed on the KV page keys (only
  ``len(transfer.keys)`` of a transfer is used, the keys may be
  placeholders); ``batch_get_v2`` / ``batch_set_v2`` go page by page through
  the registered pool's flat-page API at ``host_indices[i * page_size]``, all
  False for a transfer whose index count is not ``len(keys) * page_size``.
  The directory is ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` or
  ``file_path`` (default ``/tmp/hicache``), created by tp rank 0 / cp rank 0.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Optional

import torch

logger = logging.getLogger(__name__)

STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass(frozen=True)
class PrefetchTimeoutConfig:
    base: float = 2.0
    per_ki_token: float = 0.1
    max: float = 30.0


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self) -> str:
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    """host <-> storage: host_indices + keys; device <-> host: host_indices + device_indices."""

    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass(frozen=True)
class SidecarPoolSpec:
    pool_name: PoolName
    indices_from_pool: PoolName
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: Dict[str, int]

    @classmethod
    def empty(cls) -> "PoolTransferResult":
        return cls(0, {})

    def update_kv_hit_pages(self, kv_hit_pages: int) -> None:
        if kv_hit_pages > self.kv_hit_pages:
            self.kv_hit_pages = kv_hit_pages

    def update_extra_pool_hit_pages(self, results: Dict[str, int]) -> None:
        self.extra_pool_hit_pages.update(results)


def count_pool_hits(results: Dict[str, List[bool]]) -> Dict[str, int]:
    """Per pool, the index of the first entry equal to False (len when none).

    As upstream, only an entry that compares equal to False ends the run
    (False, 0): a None counts as a success."""
    hits = {}
    for name, oks in results.items():
        n = 0
        for ok in oks:
            if ok == False:  # noqa: E712 (upstream's `False in rs` / `rs.index(False)`)
                break
            n += 1
        hits[name] = n
    return hits


class HiCacheStorage(ABC):
    """The L3 storage backend HiCache's controller drives (see the module docstring)."""

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
        raise NotImplementedError()

    def batch_get_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[str, List[bool]]:
        raise NotImplementedError()

    def batch_set_v2(self, transfers: List[PoolTransfer],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[str, List[bool]]:
        raise NotImplementedError()

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """The value of key (None when absent)."""

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None):
        """One value (or None) per key."""

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        """True when stored."""

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """True when every value was stored."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True when key is stored."""

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Number of consecutive keys, from the first, that exist."""
        n = 0
        for key in keys:
            if not self.exists(key):
                break
            n += 1
        return n

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None


def file_config_suffix(c: "HiCacheStorageConfig") -> str:
    """HiCacheFile's namespace of a rank: model, tp rank (not for MLA), pp, attn cp."""
    suffix = "_" + ("-".join(c.model_name.split("/")) if c.model_name else "")
    if not c.is_mla_model:
        suffix += f"_{c.tp_rank}_{c.tp_size}"
    if c.pp_size > 1:
        suffix += f"_{c.pp_size}_{c.pp_rank}"
    if c.attn_cp_size > 1:
        suffix += f"_cp{c.attn_cp_rank}_{c.attn_cp_size}"
    return suffix


class HiCacheFile(HiCacheStorage):
    """The built-in ``file`` backend, small version (module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, file_path: str = "/tmp/hicache"):
        self.file_path = os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR") or file_path
        c = storage_config
        self.config_suffix = file_config_suffix(c)
        if not os.path.exists(self.file_path) and c.tp_rank == 0 and c.attn_cp_rank == 0:
            os.makedirs(self.file_path, exist_ok=True)

    def _get_suffixed_key(self, key: str) -> str:
        return key + self.config_suffix

    def _get_component_key(self, key: str, component_name: Optional[str] = None) -> str:
        if component_name is None or component_name in ("__default__", PoolName.KV):
            return self._get_suffixed_key(key)
        return self._get_suffixed_key(f"{key}.{component_name}")

    def _path(self, suffixed: str) -> str:
        return os.path.join(self.file_path, f"{suffixed}.bin")

    def get(self, key, target_location=None, target_sizes=None):
        path = self._path(self._get_suffixed_key(key))
        try:
            with open(path, "rb", buffering=0) as f:
                want = target_location.numel() * target_location.element_size()
                view = memoryview(target_location.view(torch.uint8).contiguous().numpy())
                if f.readinto(view) != want:
                    raise IOError(f"short read for {key}")
            return target_location
        except FileNotFoundError:
            return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        targets = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        if self.exists(key):
            return True
        path = self._path(self._get_suffixed_key(key))
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex}"
        try:
            value.contiguous().view(torch.uint8).numpy().tofile(tmp)
            os.replace(tmp, path)
            return True
        except Exception as e:  # upstream logs and answers False
            logger.error("HiCacheFile: failed to save %s: %s", key, e)
            try:
                os.remove(tmp)
            except OSError:
                pass
            return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        for k, v in zip(keys, values):
            if not self.set(k, v):
                return False
        return True

    def exists(self, key) -> bool:
        return os.path.exists(self._path(self._get_suffixed_key(key)))

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        def has(i, name=None):
            return os.path.exists(self._path(self._get_component_key(keys[i], name)))

        kv_pages = 0
        while kv_pages < len(keys) and has(kv_pages):
            kv_pages += 1
        hit_count = {PoolName.KV: kv_pages} if kv_pages else {}
        final_pages = kv_pages
        for t in pool_transfers or []:
            if final_pages == 0:
                break
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = 0
                while boundary < kv_pages and has(boundary, t.name):
                    boundary += 1
            else:
                trailing = max(1, len(t.keys) if t.keys else 1)
                boundary = 0
                for prefix_len in range(kv_pages, 0, -1):
                    if all(has(i, t.name) for i in range(max(0, prefix_len - trailing), prefix_len)):
                        boundary = prefix_len
                        break
            if boundary:
                hit_count[t.name] = boundary
            final_pages = min(final_pages, boundary)
        return PoolTransferResult(final_pages, hit_count)

    @staticmethod
    def _storage_key(pool_name, key: str) -> str:
        return key if pool_name == PoolName.KV else f"{key}.{pool_name}"

    def _read_page(self, pool_name, key, host_pool, page_offset) -> bool:
        data = self.get(self._storage_key(pool_name, key), host_pool.get_dummy_flat_data_page())
        if data is None:
            return False
        host_pool.set_from_flat_data_page(page_offset, data)
        return True

    def _write_page(self, pool_name, key, host_pool, page_offset) -> bool:
        return self.set(self._storage_key(pool_name, key), host_pool.get_data_page(page_offset, flat=True))

    def _batch_io_v2(self, transfers, op):
        results = {}
        for t in transfers:
            pool = self.registered_pools[t.name]
            keys = t.keys or []
            page_size = getattr(pool, "page_size", 1) or 1
            if t.host_indices is None or t.host_indices.numel() != len(keys) * page_size:
                logger.error("HiCacheFile: %s index count mismatch", t.name)
                results[t.name] = [False] * len(keys)
                continue
            results[t.name] = [op(t.name, k, pool, t.host_indices[i * page_size].item())
                               for i, k in enumerate(keys)]
        return results

    def batch_get_v2(self, transfers, extra_info=None):
        return self._batch_io_v2(transfers, self._read_page)

    def batch_set_v2(self, transfers, extra_info=None):
        return self._batch_io_v2(transfers, self._write_page)

    def clear(self) -> None:
        for name in os.listdir(self.file_path):
            p = os.path.join(self.file_path, name)
            if os.path.isfile(p):
                os.remove(p)
