"""Stand-in of the device KV pools of ``python/sglang/srt/mem_cache/memory_pool.py``
(sgl-project/sglang), reduced to what the host pools and the controller read
from them: shape descriptors, no GPU memory.

Facts relied on (read through the host pools that use them: ``pool_host/mha.py``
@ 0047d999bb3a3ad311df5a4b6356bfb5586e0d66, ``pool_host/mla.py`` @
01c0ede38cc9645488fd2847dbea8a2f6a9241d8, ``pool_host/mamba.py`` @
02f0c2a0f8e4540dd6484b74f3d5b4ea4509f206, ``pool_host/dsa.py`` @
03ba7b5b7dd249244bd5af01b236fd6449c66e8d; and ``managers/cache_controller.py``
@ 001067fffe33427bee0ed2f007fb7551a1d76b44):

* every pool has ``size``, ``page_size``, ``store_dtype``, ``layer_num``,
  ``start_layer``, ``end_layer``, ``device``;
* MHA: ``head_num``, ``head_dim``, ``row_dim`` (the host pool takes
  ``row_dim // head_dim`` heads);
* MLA: ``kv_lora_rank``, ``qk_rope_head_dim`` (kv_cache_dim is their sum);
  the controller's ``is_mla_model`` is ``isinstance(device_pool,
  MLATokenToKVPool)``;
* DSA (``DSATokenToKVPool``, a subclass of the MLA pool): ``index_head_dim``,
  ``quant_block_size``, ``index_page_size``, uint8
  ``index_k_with_scale_buffer_dtype``;
* Mamba: ``num_mamba_layers``, ``mamba_cache.conv`` (a list of tensors
  ``(layers, slots, *conv_shape)``) and ``mamba_cache.temporal``; the host pool
  takes the state shapes from ``shape[2:]`` and the dtypes from them.

The Mamba pool's ``mamba_cache`` tensors are real (small, CPU) because the
host pool reads shapes and dtypes off them; nothing else is allocated.
"""

from types import SimpleNamespace
from typing import List, Sequence

import torch


class KVCache:
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, layer_num: int, device: str = "cpu",
                 start_layer: int = 0):
        self.size, self.page_size, self.dtype, self.store_dtype = size, page_size, dtype, dtype
        self.layer_num, self.device = layer_num, device
        self.start_layer, self.end_layer = start_layer, start_layer + layer_num - 1


class MHATokenToKVPool(KVCache):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                 layer_num: int, device: str = "cpu", start_layer: int = 0):
        super().__init__(size, page_size, dtype, layer_num, device, start_layer)
        self.head_num, self.head_dim = head_num, head_dim
        self.row_dim = head_num * head_dim


class MLATokenToKVPool(KVCache):
    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str = "cpu", start_layer: int = 0):
        super().__init__(size, page_size, dtype, layer_num, device, start_layer)
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim


class DSATokenToKVPool(MLATokenToKVPool):
    index_k_with_scale_buffer_dtype = torch.uint8

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, index_head_dim: int = 64, quant_block_size: int = 64, device: str = "cpu"):
        super().__init__(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device)
        self.index_head_dim, self.quant_block_size = index_head_dim, quant_block_size
        self.index_page_size = page_size


class MambaPool:
    def __init__(self, size: int, num_mamba_layers: int, conv_state_shapes: Sequence[Sequence[int]],
                 temporal_state_shape: Sequence[int], conv_dtype: torch.dtype = torch.bfloat16,
                 temporal_dtype: torch.dtype = torch.float32, device: str = "cpu"):
        self.size, self.num_mamba_layers, self.device = size, num_mamba_layers, device
        slots = size + 1
        conv: List[torch.Tensor] = [torch.zeros((num_mamba_layers, slots, *s), dtype=conv_dtype)
                                    for s in conv_state_shapes]
        temporal = torch.zeros((num_mamba_layers, slots, *temporal_state_shape), dtype=temporal_dtype)
        self.mamba_cache = SimpleNamespace(conv=conv, temporal=temporal)


class TokenToKVPoolAllocator:
    """The allocator the controller is given; it reads the device pool through ``get_kvcache()``."""

    def __init__(self, kvcache):
        self._kvcache = kvcache

    def get_kvcache(self):
        return self._kvcache
