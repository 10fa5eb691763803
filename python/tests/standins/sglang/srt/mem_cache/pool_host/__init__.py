"""Stand-in of ``python/sglang/srt/mem_cache/pool_host/__init__.py`` (sgl-project/sglang):
the host pools and the hybrid pool group, at the commits their modules name."""

from .base import HostKVCache
from .dsa import DSAIndexerPoolHost
from .group import HostPoolGroup, PoolEntry
from .mamba import MambaPoolHost
from .mha import MHATokenToKVPoolHost
from .mla import MLATokenToKVPoolHost

__all__ = ["HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost", "MambaPoolHost",
           "DSAIndexerPoolHost", "HostPoolGroup", "PoolEntry"]
