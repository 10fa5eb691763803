"""Stand-in of ``vllm/v1/core/block_pool.py`` (``BlockPool``).

Facts relied on (facts §8, "Null block"): one pool of ``num_gpu_blocks``
blocks shared by every KV cache group; ``__init__`` takes the first free block
as ``null_block`` (block id 0, ``is_null``; its ref count is not kept, it is
never cached or freed); ``get_new_blocks(n)`` pops the least recently freed
blocks (evicting their cached hash); ``free_blocks(ordered)`` decrements ref
counts and appends blocks reaching 0 to the free queue in the given order;
``touch(blocks)`` takes cached blocks out of the free queue;
``get_cached_block(hash, group_ids)`` returns one block per group or None;
``cache_full_blocks(...)`` registers the hashes of newly full blocks (skipping
null blocks); ``evict_blocks(ids)`` drops cached hashes. The scheduler binds
this object to the connector (``bind_gpu_block_pool``).
"""

from collections import OrderedDict

from .kv_cache_utils import KVCacheBlock


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int | None = None,
                 enable_kv_cache_events: bool = False):
        assert num_gpu_blocks > 1
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue: "OrderedDict[int, KVCacheBlock]" = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict = {}
        _, self.null_block = self.free_block_queue.popitem(last=False)
        self.null_block.is_null = True

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total

    def get_cached_block(self, block_hash, kv_cache_group_ids: list[int]):
        out = []
        for gid in kv_cache_group_ids:
            blk = self.cached_block_hash_to_block.get((block_hash, gid))
            if blk is None:
                return None
            out.append(blk)
        return out

    def cache_full_blocks(self, request, blocks, num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int) -> None:
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or blk.block_hash is not None:
                continue
            key = (request.block_hashes[i], kv_cache_group_id)
            blk.block_hash = key
            self.cached_block_hash_to_block[key] = blk

    def _maybe_evict_cached_block(self, blk: KVCacheBlock) -> None:
        key = blk.block_hash
        if key is None:
            return
        if self.cached_block_hash_to_block.get(key) is blk:
            del self.cached_block_hash_to_block[key]
        blk.reset_hash()

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = []
        for _ in range(num_blocks):
            _, blk = self.free_block_queue.popitem(last=False)
            self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt = 1
            ret.append(blk)
        return ret

    def touch(self, blocks) -> None:
        for blk in blocks:
            if blk.is_null:
                continue
            if blk.ref_cnt == 0:
                del self.free_block_queue[blk.block_id]
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        for blk in ordered_blocks:
            if blk.is_null:
                continue
            blk.ref_cnt -= 1
            assert blk.ref_cnt >= 0
            if blk.ref_cnt == 0:
                self.free_block_queue[blk.block_id] = blk

    def evict_blocks(self, block_ids) -> None:
        for bid in block_ids:
            self._maybe_evict_cached_block(self.blocks[bid])

    def reset_prefix_cache(self) -> bool:
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        for blk in self.blocks:
            blk.reset_hash()
        self.cached_block_hash_to_block.clear()
        return True

    def take_events(self) -> list:
        return []
