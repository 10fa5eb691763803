"""Stand-in of ``vllm/config/cache.py`` (``CacheConfig``), minimal. Not read
upstream: the fields are those scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06
and the engine core (copies index 53122058033, 1387682) read.

Facts relied on: ``block_size`` (the scheduler's and the connectors' block
size), ``cache_dtype`` ("auto" = model dtype), ``enable_prefix_caching``
(upstream default True), ``prefix_caching_hash_algo`` (default "sha256"),
``num_gpu_blocks`` (set by the engine core after profiling; the scheduler
asserts it is > 0), ``num_gpu_blocks_override``. The stand-in does not
profile: the number of blocks is ``num_gpu_blocks_override`` (default 128).
"""

from dataclasses import dataclass


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    num_gpu_blocks_override: int | None = None
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    mamba_cache_mode: str = "none"
