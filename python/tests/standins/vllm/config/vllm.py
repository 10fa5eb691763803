"""Stand-in of ``vllm/config/vllm.py`` (``VllmConfig``): the container and the
two ``__post_init__`` decisions that involve the KV connector.

Facts relied on (facts §2c; secondary copies of config/vllm.py, index ids
52173854056 and 67029572769, and the review of
vllm-project/vllm@199cb9b964822e59ab9b58d88e7be31eb419a2ae, index 70524292758):

1. HMA (``scheduler_config.disable_hybrid_kv_cache_manager``, tri-state):
   * None: HMA is disabled ("need_disable") when a kv_transfer_config is set
     and ``not KVConnectorFactory.supports_hma_config(kv_transfer_config)``
     (that call imports the connector module), with a warning; otherwise it
     becomes False (HMA on). The other need_disable reasons (non-GPU platform,
     chunked local attention) are not modelled.
   * explicit False ("--no-disable-hybrid-kv-cache-manager") is kept; the
     connector check is only in the None branch, so a non-HMA connector then
     fails later in ``KVConnectorFactory.create_connector`` (ValueError).
   * explicit True is respected.
2. CUDA graphs: when ``kv_transfer_config.is_kv_transfer_instance`` and
   ``compilation_config.cudagraph_mode.has_full_cudagraphs()``, vLLM calls
   ``KVConnectorFactory.get_connector_class(ktc).requires_piecewise_for_cudagraph(
   ktc.kv_connector_extra_config)`` on the class and, if True, sets
   ``cudagraph_mode = PIECEWISE``; then ``model_config.enforce_eager`` sets
   NONE. The resulting mode is recorded in ``compilation_config``.

Other read-only facts: ``max_concurrent_batches`` (1: no async scheduling,
no PP), ``num_speculative_tokens`` (0), ``use_v2_model_runner`` (False: the
stand-in is the v1 model runner).
"""

from dataclasses import dataclass, field

from vllm.logger import init_logger

from .attention import AttentionConfig
from .cache import CacheConfig
from .compilation import CompilationConfig, CUDAGraphMode
from .kv_transfer import KVTransferConfig
from .model import ModelConfig
from .parallel import ParallelConfig
from .scheduler import SchedulerConfig

logger = init_logger(__name__)


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    attention_config: AttentionConfig = field(default_factory=AttentionConfig)
    kv_transfer_config: KVTransferConfig | None = None
    speculative_config: object = None
    kv_events_config: object = None
    ec_transfer_config: object = None
    lora_config: object = None

    def __post_init__(self):
        self._resolve_hybrid_kv_cache_manager()
        self._resolve_cudagraph_mode()

    def _resolve_hybrid_kv_cache_manager(self):
        sc = self.scheduler_config
        if sc.disable_hybrid_kv_cache_manager is None:
            need_disable = False
            if self.kv_transfer_config is not None:
                from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
                if not KVConnectorFactory.supports_hma_config(self.kv_transfer_config):
                    logger.warning("Turning off hybrid kv cache manager because the KV connector "
                                   "does not support it.")
                    need_disable = True
            sc.disable_hybrid_kv_cache_manager = need_disable

    def _resolve_cudagraph_mode(self):
        cc = self.compilation_config
        ktc = self.kv_transfer_config
        if ktc is not None and ktc.is_kv_transfer_instance and cc.cudagraph_mode.has_full_cudagraphs():
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
            connector_cls = KVConnectorFactory.get_connector_class(ktc)
            if connector_cls.requires_piecewise_for_cudagraph(ktc.kv_connector_extra_config):
                logger.warning_once("KV connector %s requires PIECEWISE CUDA graph mode; overriding "
                                    "cudagraph_mode from %s to PIECEWISE.", connector_cls.__name__,
                                    cc.cudagraph_mode.name)
                cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
        if self.model_config is not None and self.model_config.enforce_eager:
            cc.cudagraph_mode = CUDAGraphMode.NONE

    @property
    def max_concurrent_batches(self) -> int:
        return 1

    @property
    def num_speculative_tokens(self) -> int:
        return 0

    @property
    def use_v2_model_runner(self) -> bool:
        return False
