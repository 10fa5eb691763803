"""Stand-in of an MLA backend (``vllm/v1/attention/backends/mla/flashmla.py``,
pre-#51718; facts §7a): ``get_kv_cache_shape`` = ``(num_blocks, block_size,
head_size)`` with head_size = kv_lora_rank + qk_rope_head_dim (one latent per
token, no K/V split, num_kv_heads == 1); identity stride order. The MLA cache
is replicated on every TP rank.
"""

import torch

from vllm.v1.attention.backend import AttentionBackend


class FlashMLABackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASHMLA"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        assert num_kv_heads == 1
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        if include_num_layers_dimension:
            raise NotImplementedError
        return (0, 1, 2)

    @staticmethod
    def standin_write(kv, blk, off, values) -> None:
        kv[blk, off] = values

    @staticmethod
    def standin_read(kv, blk, off) -> torch.Tensor:
        return kv[blk, off]

    @staticmethod
    def standin_block(kv, b: int) -> torch.Tensor:
        return kv[b]
