"""Stand-in of ``vllm/v1/attention/backends/flash_attn.py`` in two eras.

``FlashAttentionBackend`` (vLLM ≤ 0.25.x; flash_attn.py@0084b783bcda6d7ee15c337b1062cbee9985c954
and index 57388598621; facts §7a):
* ``get_kv_cache_shape`` = ``(2, num_blocks, block_size, num_kv_heads,
  head_size)`` (K = [0], V = [1]); ValueError unless block_size % 16 == 0;
* ``get_kv_cache_stride_order()``: NHD (0,1,2,3,4), HND (0,1,3,2,4); with the
  layers dimension NHD (2,0,1,3,4,5), HND (2,4,0,1,3,5) (from
  ``get_kv_cache_layout()``).

``FlashAttentionPackedBackend`` (after "[2/N] Pack K/V into the content dim",
#44455, vLLM ≥ 0.26; facts §7b; the name is the stand-in's):
* logical shape ``(num_blocks, num_kv_heads, block_size, 2*head_size)`` with
  K = ``[..., :head_size]`` and V = ``[..., head_size:]``;
* stride order NHD (0,2,1,3) (physically (blocks, tokens, heads, 2D): the
  registered tensor is a non-contiguous view), HND identity (contiguous).
  Either way one block of one layer is one contiguous page.

``standin_write`` / ``standin_read`` are the stand-in's "attention" writing and
reading (n, heads, 2, head_size) values at (block, offset) pairs through the
logical view, as ``reshape_and_cache`` does through the slot mapping.
"""

import torch

from vllm.v1.attention.backend import AttentionBackend

from .utils import get_kv_cache_layout


class FlashAttentionBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        layout = get_kv_cache_layout()
        if layout == "NHD":
            return (2, 0, 1, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)
        if layout == "HND":
            return (2, 4, 0, 1, 3, 5) if include_num_layers_dimension else (0, 1, 3, 2, 4)
        raise ValueError(f"Unknown cache layout format {layout}.")

    @staticmethod
    def standin_write(kv: torch.Tensor, blk: torch.Tensor, off: torch.Tensor, values: torch.Tensor) -> None:
        kv[0][blk, off] = values[:, :, 0]
        kv[1][blk, off] = values[:, :, 1]

    @staticmethod
    def standin_read(kv: torch.Tensor, blk: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        return torch.stack([kv[0][blk, off], kv[1][blk, off]], dim=2)

    @staticmethod
    def standin_block(kv: torch.Tensor, b: int) -> torch.Tensor:
        """Block b in logical (block_size, heads, 2, head_size) order."""
        return torch.stack([kv[0, b], kv[1, b]], dim=2)


class FlashAttentionPackedBackend(AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "FLASH_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        if block_size % 16 != 0:
            raise ValueError("Block size must be a multiple of 16.")
        return (num_blocks, num_kv_heads, block_size, 2 * head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        if include_num_layers_dimension:
            raise NotImplementedError
        layout = get_kv_cache_layout()
        if layout == "NHD":
            return (0, 2, 1, 3)
        if layout == "HND":
            return (0, 1, 2, 3)
        raise ValueError(f"Unknown cache layout format {layout}.")

    @staticmethod
    def standin_write(kv, blk, off, values) -> None:
        n, h, _, d = values.shape
        kv[blk, :, off] = values.reshape(n, h, 2 * d)

    @staticmethod
    def standin_read(kv, blk, off) -> torch.Tensor:
        x = kv[blk, :, off]
        return x.reshape(x.shape[0], x.shape[1], 2, x.shape[2] // 2)

    @staticmethod
    def standin_block(kv, b: int) -> torch.Tensor:
        x = kv[b].transpose(0, 1)  # (block_size, heads, 2D)
        return x.reshape(x.shape[0], x.shape[1], 2, x.shape[2] // 2)
