"""Stand-in only: the scheduler side of one rank, as far as HiCache's storage
tier needs it (upstream spreads it over the scheduler and the radix caches:
``hiradix_cache.py`` / the HiMamba cache, not read at
001067fffe33427bee0ed2f007fb7551a1d76b44), with bounded waits so a test can
drive the controller's real threads deterministically.

What it does, following ``managers/cache_controller.py`` @ 001067ff:

* backup: page hashes as the radix cache makes them,
  ``get_hash_str(token_ids, last_hash, page_size=P)``, handed to
  ``write_storage(host_indices, token_ids, hash_value=..., prefix_keys=...)``
  (plus ``extra_pools`` for the hybrid controller); completion is the
  operation coming back on ``ack_backup_queue`` (``completed_tokens``).
* prefetch: ``prefetch(rid, tokens, last_hash, prefix_keys[, extra_pools])``;
  the controller's prefetch thread answers on ``prefetch_hit_queue`` with the
  rank-reduced ``storage_hit_count``; the scheduler then revokes (terminates)
  an operation whose hit is 0 or under ``prefetch_threshold`` (assumption:
  upstream's radix cache does this), or allocates ``storage_hit_count`` host
  slots (``mem_pool_host.alloc``; the KV anchor for a pool group) into
  ``operation.host_indices`` and puts it on ``prefetch_buffer``; the acks
  (per-batch ``completed_tokens``, sidecar ``pool_hits``, then
  ``completed_req``) arrive on ``ack_prefetch_queue``.

With several ranks, each rank's controller runs its own threads and the
reductions meet in the stand-in process groups, so a test calls
``start_prefetch`` on every rank, then ``wait_hit`` / ``load`` /
``wait_done`` on each in turn; none of these block on another rank.
Every wait raises TimeoutError after ``timeout_s``, naming any exception a
controller thread died of.

Storage metrics: with the controller's ``enable_storage_metrics``,
``check_hicache_events()`` does what the radix cache's does for L3 metrics
(``observability/metrics_collector.py`` @ 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed
and the HiRadixCache versions read): ``log_storage_metrics(
storage_backend.get_stats())``, which accepts None or a ``StorageMetrics``.
"""

import time
from dataclasses import dataclass, field
from queue import Empty
from typing import Any, Dict, List, Optional

from sglang.srt.mem_cache.utils import get_hash_str
from sglang.srt.observability.metrics_collector import StorageMetricsCollector


@dataclass
class PrefetchResult:
    operation: Any
    storage_hit_count: int
    host_indices: Any = None
    completed_tokens: int = 0
    pool_hits: Dict[str, int] = field(default_factory=dict)
    acks: List[Any] = field(default_factory=list)


class StandinScheduler:
    def __init__(self, controller, timeout_s: float = 20.0):
        self.controller = controller
        self.timeout_s = timeout_s
        self._backup_acks: Dict[int, Any] = {}
        self._hits: Dict[int, Any] = {}
        self._prefetch_acks: Dict[int, List[Any]] = {}
        self.storage_metrics_collector = StorageMetricsCollector(
            {"storage_backend": str(controller.storage_backend_type)})

    def check_hicache_events(self) -> None:
        """The L3 metrics step of the radix cache's ``check_hicache_events``."""
        if self.controller.enable_storage and self.controller.enable_storage_metrics:
            self.storage_metrics_collector.log_storage_metrics(self.controller.storage_backend.get_stats())

    @property
    def page_size(self) -> int:
        return self.controller.page_size

    # ---- backup ---------------------------------------------------------------
    def page_hashes(self, token_ids, last_hash: Optional[str] = None) -> List[str]:
        return get_hash_str(list(token_ids), last_hash, page_size=self.page_size)

    def backup(self, host_indices, token_ids, last_hash: Optional[str] = None, prefix_keys=None,
               extra_pools=None) -> int:
        kw = {} if extra_pools is None else {"extra_pools": extra_pools}
        return self.controller.write_storage(host_indices, list(token_ids),
                                             hash_value=self.page_hashes(token_ids, last_hash),
                                             prefix_keys=prefix_keys, **kw)

    def wait_backup(self, op_id: int):
        end = time.monotonic() + self.timeout_s
        while op_id not in self._backup_acks:
            op = self._take(self.controller.ack_backup_queue, end, f"backup {op_id}", "no ack")
            if op is not None:
                self._backup_acks[op.id] = op
        return self._backup_acks.pop(op_id)

    def _take(self, queue, end: float, what: str, missing: str):
        """The next item of one of the controller's queues, or None after a short
        wait; raises RuntimeError naming the exception a controller thread died
        of, TimeoutError ("<what>: <missing> after ...") once `end` has passed."""
        errors = self.controller.standin_thread_errors
        if errors:
            raise RuntimeError(f"{what}: a controller thread died: {errors[0]!r}") from errors[0]
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{what}: {missing} after {self.timeout_s}s")
        try:
            return queue.get(timeout=min(0.05, left))
        except Empty:
            return None

    # ---- prefetch -------------------------------------------------------------
    def start_prefetch(self, rid: str, token_ids, last_hash: Optional[str] = None, prefix_keys=None,
                       extra_pools=None):
        kw = {} if extra_pools is None else {"extra_pools": extra_pools}
        return self.controller.prefetch(rid, list(token_ids), last_hash, prefix_keys, **kw)

    def wait_hit(self, op) -> int:
        end = time.monotonic() + self.timeout_s
        while id(op) not in self._hits:
            got = self._take(self.controller.prefetch_hit_queue, end, f"prefetch {op.request_id}", "no hit count")
            if got is not None:
                self._hits[id(got)] = got
        return self._hits.pop(id(op)).storage_hit_count

    def load(self, op) -> bool:
        """After wait_hit: allocate the hit's host slots and queue the reads (True),
        or revoke the operation (False: no hit, under the threshold, no room)."""
        hit = op.storage_hit_count
        if hit == 0 or hit < self.controller.prefetch_threshold:
            self.controller.terminate_prefetch(op)
            return False
        host_indices = self.controller.mem_pool_host.alloc(hit)
        if host_indices is None:
            self.controller.terminate_prefetch(op)
            return False
        op.host_indices = host_indices
        self._prefetch_acks[id(op)] = []
        self.controller.prefetch_buffer.put(op)
        return True

    def wait_done(self, op) -> PrefetchResult:
        result = PrefetchResult(operation=op, storage_hit_count=op.storage_hit_count, host_indices=op.host_indices)
        if id(op) not in self._prefetch_acks:  # revoked
            return result
        end = time.monotonic() + self.timeout_s
        while True:
            acks = self._prefetch_acks[id(op)]
            if acks and acks[-1].completed_req:
                break
            ack = self._take(self.controller.ack_prefetch_queue, end, f"prefetch {op.request_id}", "not completed")
            if ack is not None:
                self._prefetch_acks.setdefault(id(ack.operation), []).append(ack)
        result.acks = self._prefetch_acks.pop(id(op))
        for ack in result.acks:
            if ack.completed_tokens is not None:
                result.completed_tokens = ack.completed_tokens
            if ack.pool_hits:
                result.pool_hits.update({str(k): v for k, v in ack.pool_hits.items()})
        return result

    def prefetch(self, rid: str, token_ids, last_hash: Optional[str] = None, prefix_keys=None,
                 extra_pools=None) -> PrefetchResult:
        """The whole prefetch of one rank (only for a controller without other ranks)."""
        op = self.start_prefetch(rid, token_ids, last_hash, prefix_keys, extra_pools)
        self.wait_hit(op)
        self.load(op)
        return self.wait_done(op)
