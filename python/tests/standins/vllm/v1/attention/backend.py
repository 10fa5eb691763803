"""Stand-in of ``vllm/v1/attention/backend.py``: ``AttentionBackend`` and
``AttentionMetadata`` (base.py@003df29 imports both from here).

Facts relied on (facts §7a): a backend has ``get_name()``,
``get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
cache_dtype_str="auto")`` and ``get_kv_cache_stride_order(
include_num_layers_dimension=False)`` (the physical order of the logical
dims; NotImplementedError means identity). The per-layer metadata the
connector receives in ``save_kv_layer`` carries the step's ``slot_mapping``
(block_id * block_size + offset per scheduled token) and ``block_table``.
"""

from dataclasses import dataclass, field

import torch


class AttentionBackend:
    @staticmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        raise NotImplementedError

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        raise NotImplementedError


@dataclass
class AttentionMetadata:
    num_actual_tokens: int = 0
    slot_mapping: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    block_table: torch.Tensor = field(default_factory=lambda: torch.empty(0, 0, dtype=torch.int32))
    seq_lens: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int32))
    query_start_loc: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int32))
    max_query_len: int = 0
