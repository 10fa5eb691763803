"""Stand-in of ``vllm/v1/attention/backends/utils.py::get_kv_cache_layout``
(the pre-#51718 resolution, facts §7a).

Facts relied on: ``get_kv_cache_layout()`` is ``functools.lru_cache``d (so
resolved once per process) with the precedence
1. ``_KV_CACHE_LAYOUT_OVERRIDE`` (``set_kv_cache_layout(layout)``, which also
   clears the cache),
2. env ``VLLM_KV_CACHE_LAYOUT`` (asserted to be "NHD" or "HND"),
3. ``get_kv_connector_cache_layout()`` (the connector class's
   ``get_required_kvcache_layout(vllm_config)``, else "NHD").
Post-#51718 aliases are accepted from a connector: "LBNHC" = "NHD",
"LBHNC" = "HND" (facts §7c); other #51718 layouts are not modelled.

Here "per process" is per simulated process; the override is module-wide
(one Python process), so a test that sets it affects every engine it builds
afterwards until it resets it (``set_kv_cache_layout(None)``).
"""

from typing import Literal

from vllm import envs
from vllm._standin import process as _process

KVCacheLayoutType = Literal["NHD", "HND"]
_ALIASES = {"NHD": "NHD", "HND": "HND", "LBNHC": "NHD", "LBHNC": "HND"}
_KV_CACHE_LAYOUT_OVERRIDE: str | None = None


def is_valid_kv_cache_layout(value: str) -> bool:
    return value in ("NHD", "HND")


def set_kv_cache_layout(cache_layout: str | None) -> None:
    global _KV_CACHE_LAYOUT_OVERRIDE
    _KV_CACHE_LAYOUT_OVERRIDE = cache_layout
    _process.current().__dict__.pop("kv_cache_layout", None)


def get_kv_cache_layout() -> str:
    proc = _process.current()
    cached = proc.__dict__.get("kv_cache_layout")
    if cached is not None:
        return cached
    if _KV_CACHE_LAYOUT_OVERRIDE is not None:
        layout = _KV_CACHE_LAYOUT_OVERRIDE
    else:
        layout = envs.VLLM_KV_CACHE_LAYOUT
        if layout is None:
            from vllm.distributed.kv_transfer.kv_connector.utils import get_kv_connector_cache_layout
            layout = get_kv_connector_cache_layout()
        else:
            assert is_valid_kv_cache_layout(layout), f"VLLM_KV_CACHE_LAYOUT={layout!r}"
    if layout not in _ALIASES:
        raise NotImplementedError(f"stand-in: KV cache layout {layout!r} is not modelled")
    layout = _ALIASES[layout]
    proc.__dict__["kv_cache_layout"] = layout
    return layout
