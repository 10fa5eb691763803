"""Stand-in of ``PoolEntry`` / ``HostPoolGroup`` from
``python/sglang/srt/mem_cache/pool_host/group.py``, sgl-project/sglang @
0142dde6f8f9ca74d5572c9572da056ab912152e: the host pools of a hybrid model
(a KV anchor plus sidecars such as Mamba state or the DSA indexer).

Facts relied on:

* ``PoolEntry(name, host_pool, device_pool, layer_mapper,
  is_primary_index_anchor=False, host_evict_fn, device_evict_fn,
  device_alloc_fn, device_free_fn, packed_draft_device_pools=())``;
* ``HostPoolGroup(entries)``: ``entries``, ``entry_map`` (name -> entry),
  ``anchor_entry`` (the entry flagged ``is_primary_index_anchor``, else the
  first), ``layout`` / ``page_size`` / ``size`` of the anchor, ``kv_buffer``
  (the anchor's), ``alloc(n, pool=None)`` / ``free(indices, pool=None)`` (the
  anchor's pool unless a pool name is given), ``add_entry``.

Left out: ``resolve_host_transfers`` (device -> host writes) and the L2 side.
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional


@dataclass
class PoolEntry:
    name: Any
    host_pool: Any
    device_pool: Any = None
    layer_mapper: Optional[Callable] = None
    is_primary_index_anchor: bool = False
    host_evict_fn: Optional[Callable] = None
    device_evict_fn: Optional[Callable] = None
    device_alloc_fn: Optional[Callable] = None
    device_free_fn: Optional[Callable] = None
    packed_draft_device_pools: tuple = ()


class HostPoolGroup:
    def __init__(self, entries: List[PoolEntry]):
        self.entries = list(entries)
        self.entry_map = {e.name: e for e in self.entries}
        self.anchor_entry = next((e for e in self.entries if e.is_primary_index_anchor), self.entries[0])
        anchor = self.anchor_entry.host_pool
        self.layout, self.page_size, self.size = anchor.layout, anchor.page_size, anchor.size

    @property
    def kv_buffer(self):
        return self.anchor_entry.host_pool.kv_buffer

    def _pool(self, pool):
        return self.anchor_entry.host_pool if pool is None else self.entry_map[pool].host_pool

    def alloc(self, need_size: int, pool=None):
        return self._pool(pool).alloc(need_size)

    def free(self, indices, pool=None):
        return self._pool(pool).free(indices)

    def available_size(self):
        return self.anchor_entry.host_pool.available_size()

    def add_entry(self, entry: PoolEntry) -> None:
        self.entries.append(entry)
        self.entry_map[entry.name] = entry
