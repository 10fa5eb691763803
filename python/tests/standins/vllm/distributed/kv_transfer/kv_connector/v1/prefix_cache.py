"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/v1/prefix_cache.py``
(index 57788856729, the 003df29 era).

Facts relied on: ``is_eagle_prefix_cache_hashing_enabled(vllm_config,
kv_connector=None)`` returns False unless ``speculative_config`` is set and
``use_eagle()``; then, with a kv_transfer_config, ``kv_connector is not None
and kv_connector.supports_eagle_prefix_cache_hashing``; otherwise
``cache_config.enable_prefix_caching``. So the scheduler reads the
connector's ``supports_eagle_prefix_cache_hashing`` only under EAGLE.
"""


def is_eagle_prefix_cache_hashing_enabled(vllm_config, kv_connector=None) -> bool:
    spec = vllm_config.speculative_config
    if spec is None or not spec.use_eagle():
        return False
    if vllm_config.kv_transfer_config is not None:
        return bool(kv_connector is not None and kv_connector.supports_eagle_prefix_cache_hashing)
    return vllm_config.cache_config.enable_prefix_caching
