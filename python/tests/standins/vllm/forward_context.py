"""Stand-in of ``vllm/forward_context.py`` (not read; its uses in
example_connector.py@00231834dc62bb1127ec5c8f2e6762c87d2f477e and in the
KV-connector mixin and attention hook copies of facts §6).

Facts relied on: ``ForwardContext`` carries ``no_compile_layers`` (layer name
-> attention layer, from ``vllm_config.compilation_config.static_forward_context``;
each layer has ``kv_cache``, the tensor registered for it, as in
example_connector.py@00231834dc62bb1127ec5c8f2e6762c87d2f477e which reads
``getattr(layer, "kv_cache", None)``), ``attn_metadata`` (layer name ->
that layer's metadata, or None in profile/dummy runs and in
``kv_connector_no_forward``) and ``virtual_engine`` (0).
``set_forward_context(attn_metadata, vllm_config, ...)`` is a context manager;
``get_forward_context()`` asserts one is set; the KV-connector mixin calls
``start_load_kv(get_forward_context())`` inside it (facts §6a).
The context is per simulated process here.
"""

import contextlib
from dataclasses import dataclass, field
from typing import Any

from vllm._standin import process as _process


@dataclass
class ForwardContext:
    no_compile_layers: dict[str, Any]
    attn_metadata: Any
    virtual_engine: int = 0
    additional_kwargs: dict[str, Any] = field(default_factory=dict)


def get_forward_context() -> ForwardContext:
    ctx = _process.current().forward_context
    assert ctx is not None, ("Forward context is not set. "
                             "Please use `set_forward_context` to set the forward context.")
    return ctx


def is_forward_context_available() -> bool:
    return _process.current().forward_context is not None


@contextlib.contextmanager
def set_forward_context(attn_metadata, vllm_config, virtual_engine: int = 0, **kwargs):
    proc = _process.current()
    prev = proc.forward_context
    proc.forward_context = ForwardContext(
        no_compile_layers=vllm_config.compilation_config.static_forward_context,
        attn_metadata=attn_metadata, virtual_engine=virtual_engine)
    try:
        yield
    finally:
        proc.forward_context = prev
