"""Stand-in of ``vllm/v1/core/single_type_kv_cache_manager.py``.

Facts relied on (``single_type_kv_cache_manager.py@129ab7c60cbb8eb11e875373e67f7e521b74aa30``,
read; facts §8):
* per request ``req_to_blocks`` (one list per group) and ``num_cached_block``;
* ``get_num_blocks_to_allocate``: a running request (in num_cached_block)
  needs ``cdiv(num_tokens, bs) - len(blocks)``; a new one needs blocks for the
  non-skipped suffix, ``max(required - max(skipped_blocks, local_computed_blocks), 0)``,
  plus the evictable (ref 0) blocks among its non-skipped prefix hits;
* ``allocate_new_computed_blocks``: skipped positions (from
  ``get_num_skipped_tokens(local + external)``) become the **null block**,
  prefix hits are touched and appended, then new blocks are allocated for the
  in-window external tokens (``cdiv(local + external, bs) - len(blocks)``);
* ``allocate_new_blocks`` appends ``cdiv(num_tokens, bs) - len(blocks)`` new
  blocks; ``cache_blocks`` registers newly full blocks; ``free`` frees in
  reverse order;
* ``remove_skipped_blocks(request_id, computed)``: walking backwards from the
  last skipped block and stopping at the first null one, replaces skipped
  entries with the null block (the index is kept) and frees the real blocks;
* SlidingWindowManager: ``get_num_skipped_tokens(n) = max(0, n - window + 1)``;
  its prefix-hit search goes right to left for ``cdiv(window - 1, bs)``
  contiguous cached blocks, nulls before them.
"""

from collections import defaultdict

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec


class SingleTypeKVCacheManager:
    def __init__(self, kv_cache_spec, block_pool, enable_caching: bool, kv_cache_group_id: int):
        self.block_size = kv_cache_spec.block_size
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.req_to_blocks: dict = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks, total_computed_tokens) -> int:
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0
            return max(num_required - num_req_blocks, 0)
        skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        local_blocks = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(skipped_blocks, local_blocks), 0)
        skip_new = max(0, skipped_blocks - num_req_blocks)
        evictable = sum(b.ref_cnt == 0 and not b.is_null for b in list(new_computed_blocks)[skip_new:])
        return num_new + evictable

    def allocate_new_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                     num_external_computed_tokens) -> None:
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0
            return
        req_blocks = self.req_to_blocks[request_id]
        assert len(req_blocks) == 0
        total = num_local_computed_tokens + num_external_computed_tokens
        skipped_tokens = self.get_num_skipped_tokens(total)
        skipped_blocks = skipped_tokens // self.block_size
        new_computed_blocks = list(new_computed_blocks)
        if skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[skipped_blocks:]
            num_external_computed_tokens = min(total - skipped_tokens, num_external_computed_tokens)
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        else:
            assert not new_computed_blocks, "Computed blocks should be empty when prefix caching is disabled"
        req_blocks.extend([self._null_block] * skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)
        if num_external_computed_tokens > 0:
            req_blocks.extend(self.block_pool.get_new_blocks(cdiv(total, self.block_size) - len(req_blocks)))

    def allocate_new_blocks(self, request_id, num_tokens):
        req_blocks = self.req_to_blocks[request_id]
        n = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if n <= 0:
            return []
        new = self.block_pool.get_new_blocks(n)
        req_blocks.extend(new)
        return new

    def cache_blocks(self, request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached, num_full,
                                          self.block_size, self.kv_cache_group_id)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        n = min(skipped_tokens // self.block_size, len(blocks))
        removed = []
        for i in range(n - 1, -1, -1):
            if blocks[i] is self._null_block:
                break
            removed.append(blocks[i])
            blocks[i] = self._null_block
        self.block_pool.free_blocks(removed)


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        computed = tuple([] for _ in kv_cache_group_ids)
        for h in block_hashes[:max_length // kv_cache_spec.block_size]:
            cached = block_pool.get_cached_block(h, kv_cache_group_ids)
            if cached is None:
                break
            for c, b in zip(computed, cached):
                c.append(b)
        return computed


class SlidingWindowManager(SingleTypeKVCacheManager):
    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        bs = kv_cache_spec.block_size
        needed = cdiv(kv_cache_spec.sliding_window - 1, bs)
        max_blocks = max_length // bs
        computed = tuple([block_pool.null_block] * max_blocks for _ in kv_cache_group_ids)
        contiguous = 0
        for i in range(max_blocks - 1, -1, -1):
            cached = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                contiguous = 0
                continue
            for c, b in zip(computed, cached):
                c[i] = b
            contiguous += 1
            if contiguous >= needed:
                for c in computed:
                    del c[i + contiguous:]
                return computed
        for c in computed:
            del c[contiguous:]
        return computed


def manager_class_for(spec):
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowManager
    if isinstance(spec, FullAttentionSpec):
        return FullAttentionManager
    raise NotImplementedError(f"stand-in: no KV cache manager for {type(spec).__name__}")
