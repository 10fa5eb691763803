"""Stand-in of ``vllm/model_executor/layers/attention/mla_attention.py``:
``MLACommonMetadata`` (connectors test ``isinstance(attn_metadata,
MLACommonMetadata)`` to pick the 3-D MLA path, as
example_connector.py@00231834dc62bb1127ec5c8f2e6762c87d2f477e does) and the
MLA layer."""

from dataclasses import dataclass

from vllm.v1.attention.backend import AttentionMetadata

from .attention import Attention


@dataclass
class MLACommonMetadata(AttentionMetadata):
    pass


@dataclass
class MLAAttention(Attention):
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
