"""Stand-in of the ``vllm.config`` package: upstream's import paths
(``from vllm.config import VllmConfig, KVTransferConfig``,
``vllm.config.kv_transfer``) and the current-config context.

Facts relied on: ``set_current_vllm_config(vllm_config)`` is a context manager
vLLM enters around model construction and worker calls;
``get_current_vllm_config()`` returns it, or (with a warning) a default
``VllmConfig()`` when none is set. The pre-#51718 layout resolution
(``get_kv_connector_cache_layout``, facts §2c) reads the connector class's
``get_required_kvcache_layout(get_current_vllm_config())``. Here the current
config is kept per simulated process (vllm._standin.process).
"""

import contextlib

from vllm._standin import process as _process
from vllm.logger import init_logger

from .attention import AttentionConfig
from .cache import CacheConfig
from .compilation import CompilationConfig, CUDAGraphMode
from .kv_transfer import KVTransferConfig
from .model import ModelConfig
from .parallel import ParallelConfig
from .scheduler import SchedulerConfig
from .vllm import VllmConfig

logger = init_logger(__name__)


@contextlib.contextmanager
def set_current_vllm_config(vllm_config, check_compile=False, prefix=None):
    proc = _process.current()
    prev, proc.vllm_config = proc.vllm_config, vllm_config
    try:
        yield
    finally:
        proc.vllm_config = prev


def get_current_vllm_config() -> VllmConfig:
    cfg = _process.current().vllm_config
    if cfg is None:
        logger.warning("Current vLLM config is not set.")
        return VllmConfig()
    return cfg


class KVEventsConfig:  # imported by the scheduler upstream; unused here
    enable_kv_cache_events = False


__all__ = ["AttentionConfig", "CacheConfig", "CompilationConfig", "CUDAGraphMode", "KVTransferConfig",
           "KVEventsConfig", "ModelConfig", "ParallelConfig", "SchedulerConfig", "VllmConfig",
           "get_current_vllm_config", "set_current_vllm_config"]
