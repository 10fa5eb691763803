"""Stand-in of ``vllm/v1/attention/backends/flashinfer.py`` (pre-#51718;
facts §7a): ``get_kv_cache_shape`` = ``(num_blocks, 2, block_size,
num_kv_heads, head_size)``, stride order NHD (0,1,2,3,4), HND (0,1,3,2,4).
"""

import torch

from vllm.v1.attention.backend import AttentionBackend

from .utils import get_kv_cache_layout


class FlashInferBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASHINFER"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        if include_num_layers_dimension:
            raise NotImplementedError
        layout = get_kv_cache_layout()
        if layout == "NHD":
            return (0, 1, 2, 3, 4)
        if layout == "HND":
            return (0, 1, 3, 2, 4)
        raise ValueError(f"Unknown cache layout format {layout}.")

    @staticmethod
    def standin_write(kv, blk, off, values) -> None:
        kv[:, 0][blk, off] = values[:, :, 0]
        kv[:, 1][blk, off] = values[:, :, 1]

    @staticmethod
    def standin_read(kv, blk, off) -> torch.Tensor:
        return torch.stack([kv[:, 0][blk, off], kv[:, 1][blk, off]], dim=2)

    @staticmethod
    def standin_block(kv, b: int) -> torch.Tensor:
        return torch.stack([kv[b, 0], kv[b, 1]], dim=2)
