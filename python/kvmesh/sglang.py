"""kvmesh's HiCache storage backend for SGLang, as SGLang loads it by name.

    python -m sglang.launch_server --model-path <model> --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvmesh", "module_path": "kvmesh.sglang",
            "class_name": "KvmeshStorage", "coordinator": "127.0.0.1:7070"}'

SGLang's ``dynamic`` backend imports this module (``module_path``), checks
that ``KvmeshStorage`` (``class_name``) is a subclass of its
``HiCacheStorage``, and constructs it as ``KvmeshStorage(storage_config,
kwargs)``. The work is done by the engine-free core
:class:`kvmesh.adapters.sglang.KvmeshHiCacheStorage`; this class adds
SGLang's own types (``PoolTransferResult`` from ``batch_exists_v2``, the
``StorageMetrics`` that ``--enable-storage-metrics`` reads from
``get_stats``).

Importing this module without SGLang raises ImportError saying so.
"""

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, PoolTransferResult  # type: ignore
except ImportError as e:  # pragma: no cover - exercised by a test in a clean interpreter
    raise ImportError(
        "kvmesh.sglang is the SGLang HiCache storage backend and needs SGLang in this Python environment "
        f"(import of sglang.srt.mem_cache.hicache_storage failed: {e}). Install SGLang, or use "
        "kvmesh.adapters.sglang.KvmeshHiCacheStorage, the engine-free core, without it.") from None

from typing import Any

from .adapters import sglang as _core_storage

__all__ = ["KvmeshStorage"]


class KvmeshStorage(_core_storage.KvmeshHiCacheStorage, HiCacheStorage):
    """SGLang HiCache storage over kvmesh (see kvmesh.adapters.sglang)."""

    def __init__(self, storage_config: Any = None, kwargs: Any = None, **options: Any):
        options.setdefault("result_type", PoolTransferResult)
        _core_storage.KvmeshHiCacheStorage.__init__(self, storage_config, kwargs, **options)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics of the batches since the last call (what
        --enable-storage-metrics logs); kvmesh's own counters: stats()."""
        try:  # its home in recent SGLang, then the older one
            from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
        except ImportError:
            try:
                from sglang.srt.metrics.collector import StorageMetrics  # type: ignore
            except ImportError:
                return None
        prefetch, backup, prefetch_bw, backup_bw = self.take_storage_metrics()
        return StorageMetrics(prefetch_pgs=prefetch, backup_pgs=backup, prefetch_bandwidth=prefetch_bw,
                              backup_bandwidth=backup_bw)
