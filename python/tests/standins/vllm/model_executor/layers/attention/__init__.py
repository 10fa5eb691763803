"""Stand-in of the ``vllm.model_executor.layers.attention`` package."""

from .attention import Attention  # noqa: F401
from .mla_attention import MLAAttention, MLACommonMetadata  # noqa: F401
