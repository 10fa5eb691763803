"""Stand-in of ``vllm/envs.py``: environment variables read on access (not
read upstream; the variables are those facts §7a and
vllm/v1/core/kv_cache_utils.py copies name).

Facts relied on: ``envs.VLLM_KV_CACHE_LAYOUT`` is read by
``vllm/v1/attention/backends/utils.py::get_kv_cache_layout()`` (pre-#51718
era; facts §7a) and must be "NHD" or "HND" when set; ``PYTHONHASHSEED`` seeds
``NONE_HASH`` (``vllm/v1/core/kv_cache_utils.py::init_none_hash``, see
v1/core/kv_cache_utils.py here).
"""

import os

_GETTERS = {
    "VLLM_KV_CACHE_LAYOUT": lambda: os.getenv("VLLM_KV_CACHE_LAYOUT") or None,
}


def __getattr__(name):
    if name in _GETTERS:
        return _GETTERS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return list(_GETTERS)
