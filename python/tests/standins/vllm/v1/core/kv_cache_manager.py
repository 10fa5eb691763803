"""Stand-in of ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheBlocks``,
``KVCacheManager``), with the KV cache coordinator folded in.

Facts relied on:
* ``KVCacheBlocks(blocks: tuple[Sequence[KVCacheBlock], ...])`` (one sequence
  per group); ``get_block_ids(allow_none=False)`` =
  ``tuple([b.block_id for b in group] for group in blocks)``, or None with
  ``allow_none`` when every group is empty; ``get_unhashed_block_ids()``
  (one group only); ``new_empty()``; ``+`` (kv_cache_manager.py@ace980e6de0540f49b0c63248437a1a7807590c1).
* ``allocate_slots(request, num_new_tokens, num_new_computed_tokens=0,
  new_computed_blocks=None, num_lookahead_tokens=0,
  num_external_computed_tokens=0, delay_cache_blocks=False, ...)``
  (ace980e): ValueError when both new and external tokens are 0;
  ``remove_skipped_blocks`` on the total computed tokens first; None when the
  blocks needed exceed the free blocks (here minus ``reserved_blocks``, the
  003df29 admission reservation of in-flight prefills);
  ``allocate_new_computed_blocks`` when there are prefix hits or external
  tokens; ``allocate_new_blocks``; caching of full blocks up to
  ``min(total_computed + new, request.num_tokens)`` unless caching is off or
  ``delay_cache_blocks``; **returns only the newly allocated blocks**
  (scheduler.py@003df29 sends ``get_blocks(request_id)``, the full table, for
  new/resumed requests and the returned blocks for running ones).
* ``get_computed_blocks(request)`` -> (blocks, num_tokens, shared_prefix_boundary)
  with a hit of at most ``num_tokens - 1`` tokens; no lookup when caching is
  off. ``get_computed_blocks_for_connector`` (003df29) adds ``hit_diverged``
  (always False here: no Mamba). Hybrid lookup: the full-attention hit first,
  then the sliding-window hit within it; the shorter one wins.
* ``get_blocks(request_id)`` (the whole table, all groups),
  ``get_block_ids(request_id)``, ``get_block_ids_for_computed_tokens(
  request_id, num_computed_tokens)`` (the first ``cdiv(n, block_size)`` entries
  of every group: the computed prefix with its partial tail),
  ``remove_skipped_blocks(request_id, processed_computed_tokens,
  num_prompt_tokens)`` (the 003df29 keyword names), ``cache_blocks``,
  ``evict_blocks``, ``free``, ``take_events``.
"""

import itertools
from dataclasses import dataclass
from typing import Sequence

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import SlidingWindowSpec

from .block_pool import BlockPool
from .kv_cache_utils import KVCacheBlock
from .single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager, manager_class_for


@dataclass
class KVCacheBlocks:
    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(list(itertools.chain(a, b)) for a, b in zip(self.blocks, other.blocks)))

    def get_block_ids(self, allow_none: bool = False):
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(() for _ in self.blocks))


class KVCacheManager:
    def __init__(self, kv_cache_config, max_model_len: int, enable_caching: bool = True,
                 hash_block_size: int | None = None, **ignored):
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(kv_cache_config.num_blocks, enable_caching, hash_block_size)
        self.managers = [manager_class_for(g.kv_cache_spec)(g.kv_cache_spec, self.block_pool, enable_caching, gid)
                         for gid, g in enumerate(kv_cache_config.kv_cache_groups)]
        self.num_kv_cache_groups = len(self.managers)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in self.managers))
        self._full_gids = [i for i, m in enumerate(self.managers) if isinstance(m, FullAttentionManager)]
        self._sw_gids = [i for i, m in enumerate(self.managers) if isinstance(m, SlidingWindowManager)]
        if len({self.managers[i].sliding_window for i in self._sw_gids}) > 1:
            raise NotImplementedError("stand-in: one sliding window size per model")
        self.block_size = self.managers[0].block_size

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def new_step_starts(self) -> None:
        return

    # ---- prefix cache ---------------------------------------------------------
    def _find_longest_cache_hit(self, block_hashes, max_length):
        result = [[] for _ in self.managers]
        hit = max_length
        if self._full_gids:
            spec = self.managers[self._full_gids[0]].kv_cache_spec
            full = FullAttentionManager.find_longest_cache_hit(block_hashes, max_length, self._full_gids,
                                                               self.block_pool, spec)
            hit = len(full[0]) * self.block_size
        if self._sw_gids:
            spec = self.managers[self._sw_gids[0]].kv_cache_spec
            sw = SlidingWindowManager.find_longest_cache_hit(block_hashes, hit, self._sw_gids, self.block_pool, spec)
            hit = min(hit, len(sw[0]) * self.block_size)
            for gid, blocks in zip(self._sw_gids, sw):
                result[gid] = blocks[:hit // self.block_size]
        if self._full_gids:
            for gid, blocks in zip(self._full_gids, full):
                result[gid] = blocks[:hit // self.block_size]
        return KVCacheBlocks(tuple(result)), hit

    def get_computed_blocks(self, request):
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0
        blocks, n = self._find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return blocks, n, 0

    def get_computed_blocks_for_connector(self, request):
        blocks, n, boundary = self.get_computed_blocks(request)
        return blocks, n, boundary, False

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_tokens: int) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(g)[:num_tokens // self.block_size] for g in blocks.blocks))

    def record_prefix_cache_stats(self, request, num_local: int) -> None:
        return

    # ---- allocation -----------------------------------------------------------
    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False, reserved_blocks: int = 0,
                       has_scheduled_reqs: bool = False):
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no external computed tokens")
        computed = new_computed_blocks.blocks if new_computed_blocks is not None else self.empty_kv_cache_blocks.blocks
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local + num_external_computed_tokens, self.max_model_len)
        num_main = total_computed + num_new_tokens
        need_slot = min(num_main + num_lookahead_tokens, self.max_model_len)
        rid = request.request_id
        for m in self.managers:
            m.remove_skipped_blocks(rid, total_computed)
        to_allocate = sum(m.get_num_blocks_to_allocate(rid, need_slot, computed[i],
                                                        num_local + num_external_computed_tokens)
                          for i, m in enumerate(self.managers))
        if to_allocate + reserved_blocks > self.block_pool.get_num_free_blocks():
            return None
        if any(len(g) for g in computed) or num_external_computed_tokens > 0:
            for i, m in enumerate(self.managers):
                m.allocate_new_computed_blocks(rid, computed[i], num_local, num_external_computed_tokens)
        new_blocks = tuple(m.allocate_new_blocks(rid, need_slot) for m in self.managers)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        for m in self.managers:
            m.cache_blocks(request, num_computed_tokens)

    def free(self, request) -> None:
        for m in self.managers:
            m.free(request.request_id)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: int | None = None) -> None:
        for m in self.managers:
            m.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.managers))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        n = cdiv(num_computed_tokens, self.block_size)
        return tuple([b.block_id for b in list(m.req_to_blocks.get(request_id, ()))[:n]] for m in self.managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def evict_blocks(self, block_ids) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def take_events(self) -> list:
        return self.block_pool.take_events()

    def take_partial_tail_offloads(self):
        return None

    def remaining_blocks(self, request) -> int:
        """Blocks `request` still needs for its whole sequence (the admission
        reservation of in-flight prefills; sliding windows not discounted)."""
        n = cdiv(min(request.num_tokens, self.max_model_len), self.block_size)
        return sum(max(0, n - len(m.req_to_blocks.get(request.request_id, ()))) for m in self.managers)

    @property
    def has_sliding_window(self) -> bool:
        return any(isinstance(m.kv_cache_spec, SlidingWindowSpec) for m in self.managers)
