"""Stand-in of ``python/sglang/srt/mem_cache/storage/__init__.py``
(sgl-project/sglang @ 001067fffe33427bee0ed2f007fb7551a1d76b44): the package
exports ``StorageBackendFactory``, which ``HiCacheController.attach_storage_backend``
imports from here (``from sglang.srt.mem_cache.storage import StorageBackendFactory``)."""

from .backend_factory import StorageBackendFactory

__all__ = ["StorageBackendFactory"]
