"""Stand-in of the storage part of ``python/sglang/srt/observability/metrics_collector.py``,
sgl-project/sglang @ 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed (the stored
version; in older SGLang the same classes lived in
``sglang/srt/metrics/collector.py``, e.g. @
93d04878cfb9b08645fae7b11bd340ee33b34acf; the hybrid-cache era that
001067fffe33427bee0ed2f007fb7551a1d76b44 belongs to imports them from
``observability``, so the stand-in has only this path).

Facts relied on:

* ``StorageMetrics`` is a dataclass of four lists: ``prefetch_pgs``,
  ``backup_pgs`` (ints, pages per batch), ``prefetch_bandwidth``,
  ``backup_bandwidth`` (floats, GB/s);
* a backend's ``get_stats()`` is read only when storage metrics are on: the
  radix cache's ``check_hicache_events`` calls
  ``storage_metrics_collector.log_storage_metrics(
  cache_controller.storage_backend.get_stats())`` (HiRadixCache and its hybrid
  variants); ``log_storage_metrics`` returns on None and otherwise asserts
  ``isinstance(storage_metrics, StorageMetrics)`` and observes every value of
  the four lists into histograms.

The stand-in's collector keeps the observed values in lists instead of
Prometheus histograms.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class StorageMetricsCollector:
    def __init__(self, labels: Optional[Dict[str, str]] = None):
        self.labels = dict(labels or {})
        self.prefetched_tokens_total = 0
        self.backuped_tokens_total = 0
        self.observed = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}

    def log_prefetched_tokens(self, prefetched_tokens: int):
        if prefetched_tokens > 0:
            self.prefetched_tokens_total += prefetched_tokens

    def log_backuped_tokens(self, backuped_tokens: int):
        if backuped_tokens > 0:
            self.backuped_tokens_total += backuped_tokens

    def log_storage_metrics(self, storage_metrics: Optional[StorageMetrics] = None):
        if storage_metrics is None:
            return
        assert isinstance(storage_metrics, StorageMetrics)
        for name, values in self.observed.items():
            for v in getattr(storage_metrics, name):
                values.append(float(v))
