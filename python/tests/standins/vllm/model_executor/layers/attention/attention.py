"""Stand-in of ``vllm/model_executor/layers/attention/attention.py`` (not read):
the attention layer object found in ``ForwardContext.no_compile_layers``.

Facts relied on: a layer has ``layer_name``, ``num_kv_heads``, ``head_size``,
``sliding_window``, ``attn_backend`` and ``kv_cache`` (bound by the model
runner after allocation: the same tensor registered for that layer), read by
connectors such as example_connector.py@00231834dc62bb1127ec5c8f2e6762c87d2f477e.
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class Attention:
    layer_name: str
    num_kv_heads: int
    head_size: int
    attn_backend: Any
    sliding_window: int | None = None
    kv_cache: Any = None
