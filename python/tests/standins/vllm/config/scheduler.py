"""Stand-in of ``vllm/config/scheduler.py`` (``SchedulerConfig``), minimal. Not
read upstream: the fields scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06
reads; ``disable_hybrid_kv_cache_manager`` per facts §2c (secondary
62009049128, "vllm/config/scheduler.py line 132").

Facts relied on: ``disable_hybrid_kv_cache_manager: bool | None = None``
(tri-state; resolved in ``VllmConfig.__post_init__``, facts §2c),
``max_num_seqs``, ``max_num_batched_tokens``, ``max_num_scheduled_tokens``
(None -> max_num_batched_tokens), ``enable_chunked_prefill``,
``long_prefill_token_threshold`` (0 = off), ``policy`` ("fcfs"),
``async_scheduling`` (False: the stand-in runs one batch at a time, so
``VllmConfig.max_concurrent_batches`` is 1 and the scheduler never defers
block frees).
"""

from dataclasses import dataclass


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_num_scheduled_tokens: int | None = None
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    disable_hybrid_kv_cache_manager: bool | None = None
    policy: str = "fcfs"
    async_scheduling: bool = False
    watermark: float = 0.0

    def __post_init__(self):
        if self.policy != "fcfs":
            raise NotImplementedError("stand-in: only the fcfs policy is modelled")
        if self.async_scheduling:
            raise NotImplementedError("stand-in: async scheduling is not modelled")
