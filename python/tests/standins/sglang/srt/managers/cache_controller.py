"""Stand-in of the storage (L3) half of ``HiCacheController`` in
``python/sglang/srt/managers/cache_controller.py``, sgl-project/sglang @
001067fffe33427bee0ed2f007fb7551a1d76b44: how SGLang loads a storage backend
and calls it.

Facts relied on, in the order the code runs:

* ``attach_storage_backend(storage_backend, prefetch_threshold=256,
  model_name=None, storage_backend_extra_config=None)``:
  1. RuntimeError if storage is attached already; stop leftover threads;
  2. ``storage_backend_type = storage_backend`` (e.g. ``"dynamic"``);
  3. ``get_hash_str`` from ``sglang.srt.mem_cache.utils``;
  4. ``storage_config = _generate_storage_config(model_name, extra_config)``:
     extra_config None -> ``{}``, ``tp_lcm_size`` popped out of it (the
     same dict object is what the backend sees as ``extra_config``, with
     ``backend_name``, ``module_path``, ``class_name``, ``interface_v1`` and
     everything else left in); tp rank/size (attention-TP under DP
     attention, else global TP), pp rank/size, ``attn_cp`` rank/size from
     ``attn_cp_group`` (0, 1 without one); ``is_mla_model`` =
     ``isinstance(device_pool, MLATokenToKVPool)`` (or DeepSeek V4's
     pool); ``is_page_first_layout = (host layout == "page_first")``
     (page_first_direct gives False); ``should_split_heads`` only for a
     non-MLA page_head pool with tp_lcm_size > tp_size;
  5. ``backup_skip = is_mla_model and tp_rank != 0``;
  6. ``StorageBackendFactory.create_backend(storage_backend, storage_config,
     storage_host_pool)`` (no kwargs);
  7. ``storage_backend.register_mem_pool_host(storage_host_pool)`` right
     after construction;
  8. ``enable_storage = True``; ``prefetch_threshold = max(threshold,
     page_size)``; ``prefetch_capacity_limit`` = half the host pool (0.9 of it
     in ``buffer_only`` mode);
  9. the sync groups (hits, then completion);
  10. page functions chosen **after** ``register_mem_pool_host``: generic
      unless the type is one of hf3fs / mooncake / eic / nixl / simm / mori /
      kvcc, or it is ``"dynamic"`` and
      ``bool(storage_config.extra_config.get("interface_v1", 0))`` (so a
      dynamic backend may set ``interface_v1`` in that dict up to then);
  11. the four storage threads start (prefetch, prefetch io aux, prefetch
      sync, backup);
  12. on any exception: threads stopped, groups dropped, ``close()`` of the
      backend if it has one, state reset to generic / detached, re-raised.
* ``write_storage(host_indices, token_ids, hash_value=None,
  prefix_keys=None)`` queues a ``StorageOperation`` for the backup thread and
  returns its id; the backup thread runs ``_page_backup`` unless
  ``backup_skip`` and acks the operation on ``ack_backup_queue``;
  ``_page_backup`` goes in 128-page batches, ``page_set_func(batch hashes,
  batch host indices, HiCacheStorageExtraInfo(prefix_keys=prefix_keys))``,
  stops at the first failed batch, adds ``P * len(batch)`` to
  ``completed_tokens`` per good one and extends a non-empty ``prefix_keys``
  in place.
* ``_generic_page_set``: ``batch_set(hashes, [get_data_page(host_indices[i*P])
  ...])`` (flat pages, no extra_info); ``_page_set_zero_copy``:
  ``all(batch_set_v1(hashes, host_indices, extra_info))``.
* ``prefetch(request_id, new_input_tokens, last_hash=None, prefix_keys=None,
  router_hint=None)`` queues a ``PrefetchOperation``. The prefetch thread:
  ``_storage_hit_query`` (``get_hash_str(tokens, last_hash, page_size=P)``,
  stored in ``all_hash_values``; 128-page batches of
  ``batch_exists(batch, HiCacheStorageExtraInfo(prefix_keys, router hint))``,
  stopping at the first batch not fully found; tokens = pages * P), a MIN
  all-reduce of the token count over the hits groups, ``hash_value`` cut to
  ``hit // P`` pages, ``storage_hit_count = hit``, then
  ``prefetch_hit_queue``. A terminated operation counts 0 without asking.
* The scheduler (not in this file) allocates ``storage_hit_count`` host
  slots into ``operation.host_indices`` and puts the operation on
  ``prefetch_buffer``; see ``standin_scheduler``.
* The io aux thread, ``_page_transfer``: 128-page batches of
  ``_page_transfer_kv_batch`` (``page_get_func`` with
  ``HiCacheStorageExtraInfo(prefix_keys, router hint)``, then
  ``batch_get_v2`` of KV-derived sidecars, ``PoolTransfer(name,
  host_indices=batch host indices, keys=batch hashes)``, no extra_info; the
  batch's hits are the minimum); after a short batch (or termination) the
  remaining batches are skipped but still acked; one ``PrefetchAck(rid,
  completed_tokens=pages so far * P)`` per batch, then
  ``PrefetchAck(completed_req=True)``. The sync thread MIN all-reduces each
  ack's ``completed_tokens`` over the completion groups and puts it on
  ``ack_prefetch_queue``.
* ``_generic_page_get``: ``batch_get(hashes, [get_dummy_flat_data_page()
  ...])`` (no extra_info), None -> 0, then ``set_from_flat_data_page(
  host_indices[i*P], page_data[i])`` for the leading non-None pages (the index
  is a 0-d tensor element); ``_page_get_zero_copy``: leading Trues of
  ``batch_get_v1(hashes, host_indices, extra_info)``.
* ``detach_storage_backend()``: threads stopped, groups dropped, ``close()``
  if present, page functions back to generic.

Stand-in differences: no device side (``write``/``load`` of L2 are left out;
``token_to_kv_pool_allocator.get_kvcache()`` only tells MLA from MHA); ranks
come from stand-in process groups (``sglang.srt.standin_dist``): tp rank /
size from ``tp_group`` (upstream reads them from ``get_parallel()``), pp
from ``pp_group``; DP attention is off. A storage thread that raises dies as
upstream's would, and the exception is also kept in
``standin_thread_errors`` so the test helpers can report it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from queue import Empty, Queue
from typing import List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    count_pool_hits,
)
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.standin_dist import ReduceOp

logger = logging.getLogger(__name__)

_ROUTER_HINT_EXTRA_INFO_KEY = "kvcc_router_hint"

_ZERO_COPY_BACKEND_TYPES = ("hf3fs", "mooncake", "eic", "nixl", "simm", "mori", "kvcc")


def _router_hint_extra_info(operation) -> Optional[dict]:
    hint = getattr(operation, "router_hint", None)
    return None if hint is None else {_ROUTER_HINT_EXTRA_INFO_KEY: hint}


@dataclass
class PrefetchAck:
    rid: str
    operation: "PrefetchOperation"
    completed_tokens: Optional[int] = None
    pool_hits: Optional[dict] = None
    completed_req: Optional[bool] = None


class StorageOperation:
    counter = 0

    def __init__(self, host_indices: Optional[torch.Tensor], token_ids: List[int], last_hash: Optional[str] = None,
                 hash_value: Optional[List[str]] = None, prefix_keys: Optional[List[str]] = None,
                 router_hint: Optional[dict] = None):
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.last_hash = last_hash
        self.completed_tokens = 0
        self.hash_value = hash_value if hash_value is not None else []
        self.prefix_keys = prefix_keys
        self.all_hash_values: Optional[List[str]] = None
        self.router_hint = router_hint
        self.id = StorageOperation.counter
        StorageOperation.counter += 1

    def __lt__(self, other):
        return self.id < other.id


class PrefetchOperation(StorageOperation):
    def __init__(self, request_id: str, token_ids: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None, router_hint: Optional[dict] = None):
        self.request_id = request_id
        self._lock = threading.Lock()
        self._terminated_flag = False
        self.storage_hit_count = 0
        self.start_time = time.monotonic()
        super().__init__(None, token_ids, last_hash, prefix_keys=prefix_keys, router_hint=router_hint)

    def mark_terminate(self):
        with self._lock:
            self._terminated_flag = True

    def is_terminated(self) -> bool:
        with self._lock:
            return self._terminated_flag


class HiCacheController:
    def __init__(self, token_to_kv_pool_allocator, mem_pool_host, page_size: int, tp_group=None,
                 load_cache_event: Optional[threading.Event] = None, attn_cp_group=None, attn_tp_group=None,
                 pp_group=None, write_policy: str = "write_through_selective", io_backend: str = "",
                 storage_backend: Optional[str] = None, prefetch_threshold: int = 256,
                 model_name: Optional[str] = None, storage_backend_extra_config: Optional[dict] = None,
                 enable_storage_metrics: bool = False, host_memory_mode: str = "cache"):
        self.tp_group = tp_group
        self.host_memory_mode = host_memory_mode
        self.attn_cp_group = attn_cp_group
        self.attn_tp_group = attn_tp_group
        self.pp_group = pp_group
        self.prefetch_hits_sync_groups: list = []
        self.prefetch_completion_sync_groups: list = []
        self.mem_pool_device_allocator = token_to_kv_pool_allocator
        self.mem_pool_device = token_to_kv_pool_allocator.get_kvcache()
        self.mem_pool_host = mem_pool_host
        self.storage_host_pool = mem_pool_host
        self.write_policy = write_policy
        self.page_size = page_size
        self.io_backend = io_backend
        self.enable_storage = False
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage_metrics = enable_storage_metrics
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.storage_stop_event = threading.Event()
        self.prefetch_buffer: Optional[Queue] = None
        self.prefetch_sync_queue: Optional[Queue] = None
        self.prefetch_hit_queue: Optional[Queue] = None
        self.ack_prefetch_queue: Queue = Queue()
        self.ack_backup_queue: Optional[Queue] = None
        self.host_mem_release_queue: Optional[Queue] = None
        self.standin_thread_errors: List[BaseException] = []
        if write_policy not in ("write_through", "write_through_selective", "write_back"):
            raise ValueError(f"Invalid write policy: {write_policy}")
        if storage_backend is not None:
            try:
                self.attach_storage_backend(storage_backend=storage_backend, prefetch_threshold=prefetch_threshold,
                                            model_name=model_name,
                                            storage_backend_extra_config=storage_backend_extra_config)
            except ValueError as e:
                raise ValueError(f"Failed to create storage backend: {e}") from e

    # ---- ranks and sync groups ----------------------------------------------
    @staticmethod
    def _rank_and_size(group) -> tuple:
        return (group.rank, group.world_size) if group is not None else (0, 1)

    def get_attn_cp_rank_and_size(self) -> tuple:
        return self._rank_and_size(self.attn_cp_group)

    def _create_sync_groups(self) -> list:
        groups, seen = [], set()
        if self.attn_cp_group is not None or self.attn_tp_group is not None:
            base = [self.attn_cp_group, self.attn_tp_group]
        else:
            base = [self.tp_group]
        if self.pp_group is not None:
            base.append(self.pp_group)
        for g in base:
            if g is None or g.world_size == 1:
                continue
            if id(g.group) in seen:
                continue
            seen.add(id(g.group))
            groups.append(g.derive())
        return groups

    def _destroy_sync_groups(self, groups) -> None:
        pass

    def _all_reduce(self, tensor: torch.Tensor, op, groups) -> None:
        for g in groups:
            g.all_reduce(tensor, op)

    # ---- threads --------------------------------------------------------------
    def _standin_target(self, fn):
        def run():
            try:
                fn()
            except BaseException as e:  # recorded for the test helpers, then the thread dies as upstream's
                self.standin_thread_errors.append(e)
                raise

        return run

    def _start_storage_threads(self):
        assert self.enable_storage
        assert not self.storage_stop_event.is_set()
        self.prefetch_thread = threading.Thread(target=self._standin_target(self.prefetch_thread_func),
                                                daemon=True, name="hicache-prefetch")
        self.prefetch_io_aux_thread = threading.Thread(target=self._standin_target(self.prefetch_io_aux_func),
                                                       daemon=True, name="hicache-prefetch-io")
        self.prefetch_sync_thread = threading.Thread(target=self._standin_target(self.prefetch_sync_thread_func),
                                                     daemon=True, name="hicache-prefetch-sync")
        self.backup_thread = threading.Thread(target=self._standin_target(self.backup_thread_func), daemon=True,
                                              name="hicache-backup")
        self.prefetch_queue = Queue()
        self.backup_queue = Queue()
        self.prefetch_buffer = Queue()
        self.prefetch_sync_queue = Queue()
        self.prefetch_hit_queue = Queue()
        self.ack_prefetch_queue = Queue()
        self.ack_backup_queue = Queue()
        self.host_mem_release_queue = Queue()
        self.prefetch_thread.start()
        self.prefetch_io_aux_thread.start()
        self.prefetch_sync_thread.start()
        self.backup_thread.start()

    def _stop_storage_threads(self):
        self.storage_stop_event.set()
        for name in ("prefetch_queue", "backup_queue", "prefetch_buffer", "prefetch_sync_queue"):
            q = getattr(self, name, None)
            if q is not None:
                q.put_nowait(None)
        threads = [getattr(self, n) for n in ("prefetch_thread", "backup_thread", "prefetch_io_aux_thread",
                                              "prefetch_sync_thread") if hasattr(self, n)]
        for t in threads:
            t.join(timeout=10)
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"Failed to stop HiCache storage threads cleanly: {alive}")

    # ---- attach / detach ------------------------------------------------------
    def attach_storage_backend(self, storage_backend: str, prefetch_threshold: int = 256,
                               model_name: Optional[str] = None,
                               storage_backend_extra_config: Optional[dict] = None):
        if self.enable_storage:
            raise RuntimeError("Storage backend already attached.")
        try:
            self._stop_storage_threads()
        except Exception as e:
            raise RuntimeError("Cannot attach storage backend: previous detach did not stop storage threads "
                               "cleanly.") from e

        self.storage_backend_type = storage_backend
        from sglang.srt.mem_cache.utils import get_hash_str

        self.get_hash_str = get_hash_str
        self.storage_config = self._generate_storage_config(model_name, storage_backend_extra_config)
        self.backup_skip = self.storage_config.is_mla_model and self.storage_config.tp_rank != 0

        from sglang.srt.mem_cache.storage import StorageBackendFactory

        try:
            self.storage_backend = StorageBackendFactory.create_backend(storage_backend, self.storage_config,
                                                                        self.storage_host_pool)
            self.storage_backend.register_mem_pool_host(self.storage_host_pool)

            self.enable_storage = True
            self.prefetch_threshold = max(prefetch_threshold, self.page_size)
            fraction = 0.9 if self.host_memory_mode == "buffer_only" else 0.5
            self.prefetch_capacity_limit = int(fraction * self.mem_pool_host.size)
            self.prefetch_tokens_occupied = 0

            self.prefetch_hits_sync_groups = self._create_sync_groups()
            self.prefetch_completion_sync_groups = self._create_sync_groups()

            self.page_get_func = self._generic_page_get
            self.page_set_func = self._generic_page_set
            if self.storage_backend_type in _ZERO_COPY_BACKEND_TYPES or (
                    self.storage_backend_type == "dynamic"
                    and bool(self.storage_config.extra_config.get("interface_v1", 0))):
                self.page_get_func = self._page_get_zero_copy
                self.page_set_func = self._page_set_zero_copy

            self.storage_stop_event.clear()
            self._start_storage_threads()
        except Exception:
            try:
                self._stop_storage_threads()
            except Exception:
                pass
            self.prefetch_hits_sync_groups = []
            self.prefetch_completion_sync_groups = []
            try:
                if self.storage_backend is not None and hasattr(self.storage_backend, "close"):
                    self.storage_backend.close()
            except Exception:
                pass
            self.storage_backend = None
            self.storage_backend_type = None
            self.enable_storage = False
            self.page_get_func = self._generic_page_get
            self.page_set_func = self._generic_page_set
            raise

    def detach_storage_backend(self):
        try:
            self._stop_storage_threads()
        except Exception as e:
            raise RuntimeError("Stop storage threads failed; detach aborted.") from e
        self.prefetch_hits_sync_groups = []
        self.prefetch_completion_sync_groups = []
        try:
            if self.storage_backend is not None and hasattr(self.storage_backend, "close"):
                self.storage_backend.close()
        except Exception:
            logger.exception("Failed to close storage backend cleanly.")
        self.storage_backend = None
        self.storage_backend_type = None
        self.enable_storage = False
        self.page_get_func = self._generic_page_get
        self.page_set_func = self._generic_page_set
        self.storage_stop_event.clear()

    def _generate_storage_config(self, model_name: Optional[str] = None,
                                 storage_backend_extra_config: Optional[dict] = None) -> HiCacheStorageConfig:
        if storage_backend_extra_config is None:
            storage_backend_extra_config = {}
        self.tp_rank, self.tp_size = self._rank_and_size(self.tp_group)
        self.dp_rank, self.dp_size = 0, 1
        self.pp_rank, self.pp_size = self._rank_and_size(self.pp_group)
        is_rank_replicated = isinstance(self.mem_pool_device, MLATokenToKVPool)
        tp_lcm_size = storage_backend_extra_config.pop("tp_lcm_size", None)
        should_split_heads = False
        if tp_lcm_size:
            assert tp_lcm_size % self.tp_size == 0, "tp_lcm_size must be divisible by tp_size."
            should_split_heads = (not is_rank_replicated and self.mem_pool_host.layout == "page_head"
                                  and tp_lcm_size > self.tp_size)
        attn_cp_rank, attn_cp_size = self.get_attn_cp_rank_and_size()
        return HiCacheStorageConfig(
            tp_rank=self.tp_rank, tp_size=self.tp_size, pp_rank=self.pp_rank, pp_size=self.pp_size,
            attn_cp_rank=attn_cp_rank, attn_cp_size=attn_cp_size, is_mla_model=is_rank_replicated,
            enable_storage_metrics=self.enable_storage_metrics,
            is_page_first_layout=self.mem_pool_host.layout == "page_first", model_name=model_name,
            dp_rank=self.dp_rank, dp_size=self.dp_size, tp_lcm_size=tp_lcm_size,
            should_split_heads=should_split_heads, extra_config=storage_backend_extra_config)

    # ---- prefetch (storage -> host) ------------------------------------------
    def prefetch(self, request_id: str, new_input_tokens: List[int], last_hash: Optional[str] = None,
                 prefix_keys: Optional[List[str]] = None, router_hint: Optional[dict] = None) -> PrefetchOperation:
        operation = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys, router_hint=router_hint)
        self.prefetch_queue.put(operation)
        return operation

    def terminate_prefetch(self, operation):
        operation.mark_terminate()
        return operation.completed_tokens, operation.hash_value

    def append_host_mem_release(self, host_indices: torch.Tensor):
        if host_indices.numel() == 0:
            return
        for page in host_indices.split(self.mem_pool_host.page_size):
            self.host_mem_release_queue.put(page)

    def _page_get_zero_copy(self, operation, hash_values, host_indices, extra_info=None) -> int:
        results = self.storage_backend.batch_get_v1(hash_values, host_indices, extra_info)
        inc = 0
        for i in range(len(hash_values)):
            if not results[i]:
                logger.warning("Prefetch operation %s failed to retrieve page %s.", operation.request_id,
                               hash_values[i])
                break
            inc += 1
        return inc

    def _generic_page_get(self, operation, hash_values, host_indices, extra_info=None) -> int:
        dummy = [self.storage_host_pool.get_dummy_flat_data_page() for _ in hash_values]
        page_data = self.storage_backend.batch_get(hash_values, dummy)
        if page_data is None:
            return 0
        count = 0
        for i in range(len(hash_values)):
            if page_data[i] is None:
                logger.warning("Prefetch operation %s failed to retrieve page %s.", operation.request_id,
                               hash_values[i])
                break
            if operation.is_terminated():
                break
            self.storage_host_pool.set_from_flat_data_page(host_indices[i * self.page_size], page_data[i])
            count += 1
        return count

    def _page_transfer(self, operation) -> int:
        prefix_keys = operation.prefix_keys
        kv_derived = [t for t in getattr(operation, "pool_transfers", None) or []
                      if t.indices_from_pool == PoolName.KV]
        all_success = True
        completed_pages = 0
        for i in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            if all_success and operation.is_terminated():
                all_success = False
            if all_success:
                batch_hashes = operation.hash_value[i:i + STORAGE_BATCH_SIZE]
                batch_host_indices = operation.host_indices[i * self.page_size:(i + len(batch_hashes)) *
                                                            self.page_size]
                extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys,
                                                     extra_info=_router_hint_extra_info(operation))
                hit_pages = self._page_transfer_kv_batch(operation, batch_hashes, batch_host_indices, extra_info,
                                                         kv_derived)
                if hit_pages != len(batch_hashes):
                    all_success = False
                if prefix_keys and len(prefix_keys) > 0:
                    prefix_keys += batch_hashes
                completed_pages += hit_pages
            self.prefetch_sync_queue.put(PrefetchAck(rid=operation.request_id, operation=operation,
                                                     completed_tokens=completed_pages * self.page_size))
        return completed_pages

    def _page_transfer_kv_batch(self, operation, batch_hashes, batch_host_indices, extra_info,
                                kv_derived_transfers) -> int:
        kv_hits = self.page_get_func(operation, batch_hashes, batch_host_indices, extra_info)
        sidecar_hits = {}
        if kv_derived_transfers:
            current = [PoolTransfer(name=t.name, host_indices=batch_host_indices, keys=batch_hashes)
                       for t in kv_derived_transfers]
            sidecar_hits = count_pool_hits(self.storage_backend.batch_get_v2(current))
        return min([kv_hits, *sidecar_hits.values()])

    def prefetch_io_aux_func(self):
        def transfer(operation):
            self._page_transfer(operation)
            self.prefetch_sync_queue.put(PrefetchAck(rid=operation.request_id, operation=operation,
                                                     completed_req=True))
        self._serve_queue(self.prefetch_buffer, transfer)

    def _serve_queue(self, queue, handle) -> None:
        """The loop of each storage thread (stand-in's own helper): handle every item
        of queue but None, polling once a second, until storage_stop_event is set."""
        while not self.storage_stop_event.is_set():
            try:
                item = queue.get(block=True, timeout=1)
                if item is None:
                    continue
                handle(item)
            except Empty:
                continue

    def _storage_hit_query(self, operation) -> tuple:
        prefix_keys = operation.prefix_keys.copy() if operation.prefix_keys else None
        storage_query_count = 0
        hash_value = []
        page_hashes = self.get_hash_str(operation.token_ids, operation.last_hash, page_size=self.page_size)
        operation.all_hash_values = page_hashes
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch_hashes = page_hashes[start:start + STORAGE_BATCH_SIZE]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys,
                                                 extra_info=_router_hint_extra_info(operation))
            hit_page_num = self.storage_backend.batch_exists(batch_hashes, extra_info)
            hash_value.extend(batch_hashes[:hit_page_num])
            storage_query_count += hit_page_num * self.page_size
            if hit_page_num < len(batch_hashes):
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
        return hash_value, storage_query_count

    def prefetch_thread_func(self):
        while (not self.storage_stop_event.is_set()) or not self.prefetch_queue.empty():
            try:
                operation = self.prefetch_queue.get(block=True, timeout=1)
                if operation is None:
                    continue
                if operation.is_terminated():
                    hash_value, storage_hit_count = [], 0
                else:
                    hash_value, storage_hit_count = self._storage_hit_query(operation)
                t = torch.tensor(storage_hit_count, dtype=torch.int)
                self._all_reduce(t, ReduceOp.MIN, self.prefetch_hits_sync_groups)
                storage_hit_count = t.item()
                operation.hash_value = hash_value[:(storage_hit_count // self.page_size)]
                operation.storage_hit_count = storage_hit_count
                self.prefetch_hit_queue.put(operation)
            except Empty:
                continue

    # ---- backup (host -> storage) ---------------------------------------------
    def write_storage(self, host_indices: torch.Tensor, token_ids: List[int],
                      hash_value: Optional[List[str]] = None, prefix_keys: Optional[List[str]] = None) -> int:
        operation = StorageOperation(host_indices, token_ids, hash_value=hash_value, prefix_keys=prefix_keys)
        self.backup_queue.put(operation)
        return operation.id

    def _generic_page_set(self, hash_values, host_indices, extra_info=None) -> bool:
        data = [self.storage_host_pool.get_data_page(host_indices[i * self.page_size])
                for i in range(len(hash_values))]
        return self.storage_backend.batch_set(hash_values, data)

    def _page_set_zero_copy(self, hash_values, host_indices, extra_info=None) -> bool:
        return all(self.storage_backend.batch_set_v1(hash_values, host_indices, extra_info))

    def _page_backup(self, operation):
        prefix_keys = operation.prefix_keys
        for i in range(0, len(operation.hash_value), STORAGE_BATCH_SIZE):
            batch_hashes = operation.hash_value[i:i + STORAGE_BATCH_SIZE]
            batch_host_indices = operation.host_indices[i * self.page_size:(i + len(batch_hashes)) * self.page_size]
            extra_info = HiCacheStorageExtraInfo(prefix_keys=prefix_keys)
            success = self.page_set_func(batch_hashes, batch_host_indices, extra_info)
            if not success:
                logger.warning("Write page to storage: %d pages failed.", len(batch_hashes))
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch_hashes
            operation.completed_tokens += self.page_size * len(batch_hashes)

    def backup_thread_func(self):
        def backup(operation):
            if not self.backup_skip:
                self._page_backup(operation)
            self.ack_backup_queue.put(operation)
        self._serve_queue(self.backup_queue, backup)

    def prefetch_sync_thread_func(self):
        def sync(ack):
            self._reduce_prefetch_ack(ack)
            self.ack_prefetch_queue.put(ack)
        self._serve_queue(self.prefetch_sync_queue, sync)

    def _reduce_prefetch_ack(self, ack: PrefetchAck) -> None:
        if ack.completed_tokens is not None:
            t = torch.tensor(ack.completed_tokens, dtype=torch.int)
            self._all_reduce(t, ReduceOp.MIN, self.prefetch_completion_sync_groups)
            ack.completed_tokens = t.item()
