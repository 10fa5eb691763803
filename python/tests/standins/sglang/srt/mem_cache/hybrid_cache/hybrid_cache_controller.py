"""Stand-in of the storage half of ``HybridCacheController`` in
``python/sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py``,
sgl-project/sglang @ 00343773d3293d382f0b39101f36b656d30ad2f0 (not the
target commit; it builds on the 001067ff base: ``super().attach_storage_backend``,
a base ``_page_transfer`` that returns the completed pages).

Facts relied on:

* its own ``StorageOperation`` / ``PrefetchOperation`` add ``pool_transfers``
  and ``pool_storage_result = PoolTransferResult.empty()``;
* ``__init__``: the base with ``storage_backend=None``, then
  ``storage_host_pool = mem_pool_host.anchor_entry.host_pool`` (the KV host
  pool, which ``register_mem_pool_host`` and the generic / zero-copy KV
  paths use), then ``attach_storage_backend(..., host_pools=entries)``;
* ``attach_storage_backend(..., host_pools=None)``: the base attach (factory,
  ``register_mem_pool_host(anchor)``, the v1 / generic choice, threads),
  **then** ``register_mem_host_pool_v2(entry.host_pool, entry.name)`` for
  every entry, the KV anchor included (name ``PoolName.KV``);
  ``register_host_pool_entry`` registers a later entry the same way;
* ``write_storage(host_indices, token_ids, hash_value, prefix_keys,
  extra_pools)`` / ``prefetch(request_id, new_input_tokens, last_hash,
  prefix_keys, extra_pools)`` carry the pool transfers;
* ``_storage_hit_query``: ``get_hash_str`` over the whole request (not in
  128-page batches); with pool transfers ``batch_exists_v2(hashes,
  operation.pool_transfers, HiCacheStorageExtraInfo(prefix_keys copy))``, else
  ``batch_exists`` wrapped into a PoolTransferResult; the hit is
  ``kv_hit_pages`` (recorded with ``update_kv_hit_pages``);
* ``_page_transfer``: the base first (KV, and KV-derived sidecars per
  batch), then ``_page_transfer_sidecar``: only if not terminated and every
  KV page came: the non-KV-derived transfers, ``_sync_trailing_keys``
  (trailing_pages: ``keys = hashes[max(0, hit - N):hit]`` with N the
  transfer's key count, host indices beyond ``len(keys) * pool page_size``
  trimmed and released), non-KV-derived index resolution, then
  ``batch_get_v2(transfers)`` (no extra_info) and ``count_pool_hits``; a
  ``PrefetchAck(pool_hits=...)`` is emitted whenever ``pool_transfers`` is
  not None (``{}`` when the read was skipped);
* ``_reduce_prefetch_ack``: the base's, then a MIN all-reduce of
  ``pool_hits`` for every ``PoolName`` in enum order (missing = 0);
* ``_page_backup``: the transfers ``should_backup`` keeps (all unless
  ``backup_skip``; then only MAMBA, plus mooncake's MHA DRAFT / DRAFT_SWA),
  KV-derived ones given the operation's host indices and (if unset) its
  hashes, then ``batch_set_v2(transfers)`` (no extra_info) **before** the KV
  pages; then the base ``_page_backup`` unless ``backup_skip``, else
  ``completed_tokens`` all or nothing by the sidecar results;
* ``backup_thread_func`` always runs ``_page_backup`` (rank-sharded Mamba
  state is written by every TP rank).

The Mamba transfers themselves come from the HiMamba radix cache (a stored
version of it): backup ``[PoolTransfer(MAMBA, host_indices=[slot],
keys=[node's last page hash], hit_policy=TRAILING_PAGES)]``; prefetch
``[PoolTransfer(MAMBA, host_indices=[new slot], keys=["__placeholder__"],
hit_policy=TRAILING_PAGES)]``. The tests build those.

Left out: the L2 (device) side, draft pools, compressed-pool ratios.
"""

from __future__ import annotations

import logging
import threading
import time
from queue import Queue
from typing import List, Optional

import torch

from sglang.srt.managers.cache_controller import HiCacheController as BaseHiCacheController
from sglang.srt.managers.cache_controller import PrefetchAck
from sglang.srt.managers.cache_controller import StorageOperation as BaseStorageOperation
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    count_pool_hits,
)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.standin_dist import ReduceOp

logger = logging.getLogger(__name__)


class StorageOperation(BaseStorageOperation):
    def __init__(self, host_indices, token_ids, last_hash=None, hash_value=None, prefix_keys=None,
                 pool_transfers: Optional[List[PoolTransfer]] = None):
        super().__init__(host_indices, token_ids, last_hash, hash_value, prefix_keys)
        self.pool_transfers = pool_transfers
        self.pool_storage_result = PoolTransferResult.empty()


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id, token_ids, last_hash=None, prefix_keys=None,
                 pool_transfers: Optional[List[PoolTransfer]] = None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        self.start_time = time.monotonic()
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys, pool_transfers=pool_transfers)
        self.pool_transfers_done = not bool(pool_transfers)

    def mark_terminate(self):
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self) -> bool:
        with self._lock:
            return self._terminated_flag


class HybridCacheController(BaseHiCacheController):
    def __init__(self, token_to_kv_pool_allocator, mem_pool_host, page_size: int, tp_group=None,
                 load_cache_event=None, attn_cp_group=None, attn_tp_group=None, pp_group=None,
                 write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: Optional[str] = None, prefetch_threshold: int = 256,
                 model_name: Optional[str] = None, storage_backend_extra_config: Optional[dict] = None,
                 transfer_layer_num: Optional[int] = None, enable_storage_metrics: bool = False,
                 host_memory_mode: str = "cache"):
        self.extra_host_mem_release_queues = {}
        super().__init__(token_to_kv_pool_allocator=token_to_kv_pool_allocator, mem_pool_host=mem_pool_host,
                         page_size=page_size, tp_group=tp_group, load_cache_event=load_cache_event,
                         attn_cp_group=attn_cp_group, attn_tp_group=attn_tp_group, pp_group=pp_group,
                         write_policy=write_policy, io_backend=io_backend, storage_backend=None,
                         prefetch_threshold=prefetch_threshold, model_name=model_name,
                         storage_backend_extra_config=storage_backend_extra_config,
                         enable_storage_metrics=enable_storage_metrics, host_memory_mode=host_memory_mode)
        self.storage_host_pool = mem_pool_host.anchor_entry.host_pool
        if storage_backend is not None:
            self.attach_storage_backend(storage_backend=storage_backend, prefetch_threshold=prefetch_threshold,
                                        model_name=model_name,
                                        storage_backend_extra_config=storage_backend_extra_config,
                                        host_pools=getattr(mem_pool_host, "entries", None))

    def _start_storage_threads(self):
        super()._start_storage_threads()
        self._init_extra_host_mem_release_queues()

    def attach_storage_backend(self, storage_backend: str, prefetch_threshold: int = 256,
                               model_name: Optional[str] = None,
                               storage_backend_extra_config: Optional[dict] = None, host_pools=None):
        super().attach_storage_backend(storage_backend=storage_backend, prefetch_threshold=prefetch_threshold,
                                       model_name=model_name,
                                       storage_backend_extra_config=storage_backend_extra_config)
        for entry in host_pools or []:
            self.storage_backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def register_host_pool_entry(self, entry) -> None:
        self.mem_pool_host.add_entry(entry)
        if not entry.is_primary_index_anchor:
            self.extra_host_mem_release_queues.setdefault(entry.name, Queue())
        if self.enable_storage and self.storage_backend is not None:
            self.storage_backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def _init_extra_host_mem_release_queues(self) -> None:
        self.extra_host_mem_release_queues = {}
        anchor = getattr(self.mem_pool_host, "anchor_entry", None)
        for entry in getattr(self.mem_pool_host, "entries", None) or []:
            if entry is anchor or entry.is_primary_index_anchor:
                continue
            self.extra_host_mem_release_queues[entry.name] = Queue()

    def append_host_mem_release(self, host_indices=None, extra_pools=None):
        if host_indices is not None and host_indices.numel() > 0:
            for page in host_indices.split(self.mem_pool_host.page_size):
                self.host_mem_release_queue.put(page)
        for t in extra_pools or []:
            if t.host_indices is None or t.host_indices.numel() == 0:
                continue
            entry = self.mem_pool_host.entry_map.get(t.name)
            if entry is None or entry.is_primary_index_anchor or t.indices_from_pool is not None:
                continue
            q = self.extra_host_mem_release_queues.get(t.name)
            if q is None:
                continue
            for page in t.host_indices.split(entry.host_pool.page_size):
                q.put(page)

    # ---- prefetch ---------------------------------------------------------------
    def prefetch(self, request_id, new_input_tokens, last_hash=None, prefix_keys=None, extra_pools=None):
        operation = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys=prefix_keys,
                                      pool_transfers=extra_pools)
        self.prefetch_queue.put(operation)
        return operation

    def write_storage(self, host_indices, token_ids, hash_value=None, prefix_keys=None, extra_pools=None) -> int:
        operation = StorageOperation(host_indices, token_ids, hash_value=hash_value, prefix_keys=prefix_keys,
                                     pool_transfers=extra_pools)
        self.backup_queue.put(operation)
        return operation.id

    def _storage_hit_query(self, operation) -> tuple:
        hash_value = self.get_hash_str(operation.token_ids, operation.last_hash, page_size=self.page_size)
        operation.all_hash_values = hash_value
        extra_info = HiCacheStorageExtraInfo(
            prefix_keys=operation.prefix_keys.copy() if operation.prefix_keys else None)
        if operation.pool_transfers:
            hit = self.storage_backend.batch_exists_v2(hash_value, operation.pool_transfers, extra_info)
        else:
            hit = PoolTransferResult(kv_hit_pages=self.storage_backend.batch_exists(hash_value, extra_info),
                                     extra_pool_hit_pages={})
        kv_hit_pages = hit.kv_hit_pages
        operation.pool_storage_result.update_kv_hit_pages(kv_hit_pages)
        return hash_value[:kv_hit_pages], kv_hit_pages * self.page_size

    def _page_transfer(self, operation) -> None:
        kv_completed_pages = super()._page_transfer(operation)
        self._page_transfer_sidecar(operation, kv_completed_pages)

    def _page_transfer_sidecar(self, operation, kv_completed_pages: int) -> None:
        if operation.pool_transfers is None:
            return
        pool_hits = {}
        if not operation.is_terminated() and kv_completed_pages == len(operation.hash_value):
            nonkv = [t for t in operation.pool_transfers if t.indices_from_pool != PoolName.KV]
            self._sync_trailing_keys(nonkv, operation.hash_value, kv_completed_pages)
            self._resolve_sidecar_nonkv_derived_pool_transfers(operation)
            pool_hits = count_pool_hits(self.storage_backend.batch_get_v2(nonkv))
        self.prefetch_sync_queue.put(PrefetchAck(rid=operation.request_id, operation=operation,
                                                 pool_hits=pool_hits))

    # ---- backup -----------------------------------------------------------------
    def _page_backup(self, operation):
        backup_transfers = [t for t in operation.pool_transfers or [] if self.should_backup(t)]
        results = {}
        if backup_transfers:
            self._resolve_sidecar_kv_derived_pool_transfers(operation)
            self._resolve_sidecar_nonkv_derived_pool_transfers(operation)
            results = self.storage_backend.batch_set_v2(backup_transfers)
            operation.pool_storage_result.update_extra_pool_hit_pages(count_pool_hits(results))
        if not self.backup_skip:
            super()._page_backup(operation)
        else:
            ok = bool(backup_transfers)
            for t in backup_transfers if ok else []:
                r = results.get(t.name)
                if r is None:
                    r = results.get(t.name.value)
                expected = len(t.keys or [])
                if expected == 0 and t.host_indices is not None:
                    expected = int(t.host_indices.numel())
                if not isinstance(r, (list, tuple)) or len(r) != expected or not all(bool(x) for x in r):
                    ok = False
                    break
            operation.completed_tokens = len(operation.hash_value) * self.page_size if ok else 0

    def should_backup(self, transfer: PoolTransfer) -> bool:
        if not self.backup_skip:
            return True
        if transfer.name == PoolName.MAMBA:
            return True
        if self.storage_backend_type == "mooncake" and transfer.name in (PoolName.DRAFT, PoolName.DRAFT_SWA):
            entry = self.mem_pool_host.entry_map.get(transfer.name)
            return entry is not None and isinstance(entry.host_pool, MHATokenToKVPoolHost)
        return False

    def backup_thread_func(self):
        def backup(operation):
            self._page_backup(operation)
            self.ack_backup_queue.put(operation)
        self._serve_queue(self.backup_queue, backup)

    def _resolve_sidecar_kv_derived_pool_transfers(self, operation):
        for t in operation.pool_transfers:
            if t.indices_from_pool == PoolName.KV:
                t.host_indices = operation.host_indices
                if t.keys is None:
                    t.keys = operation.hash_value

    def _resolve_sidecar_nonkv_derived_pool_transfers(self, operation):
        for t in operation.pool_transfers:
            if t.indices_from_pool is None or t.indices_from_pool == PoolName.KV:
                continue
            source = next((s for s in operation.pool_transfers
                           if s.indices_from_pool is None and s.name == t.indices_from_pool), None)
            if source is None:
                raise AssertionError(f"Storage sidecar derived pool source missing: {t.name} from "
                                     f"{t.indices_from_pool}.")
            t.host_indices = source.host_indices
            if t.keys is None:
                t.keys = source.keys

    def _sync_trailing_keys(self, pool_transfers, all_hashes, kv_hit_pages: int) -> None:
        for t in pool_transfers:
            if t.hit_policy != PoolHitPolicy.TRAILING_PAGES:
                continue
            n = len(t.keys) if t.keys else 1
            t.keys = all_hashes[max(0, kv_hit_pages - n):kv_hit_pages]
            if t.host_indices is None:
                continue
            entry = self.mem_pool_host.entry_map.get(t.name)
            pool_page_size = entry.host_pool.page_size if entry is not None else self.page_size
            needed = len(t.keys) * pool_page_size
            if t.host_indices.numel() > needed:
                self.append_host_mem_release(
                    extra_pools=[PoolTransfer(name=t.name, host_indices=t.host_indices[needed:])])
                t.host_indices = t.host_indices[:needed]

    def _reduce_prefetch_ack(self, ack: PrefetchAck) -> None:
        super()._reduce_prefetch_ack(ack)
        if ack.pool_hits is not None:
            packed = torch.tensor([ack.pool_hits.get(p.value, 0) for p in PoolName], dtype=torch.int)
            self._all_reduce(packed, ReduceOp.MIN, self.prefetch_completion_sync_groups)
            for i, p in enumerate(PoolName):
                ack.pool_hits[p.value] = packed[i].item()
