"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` at
vllm-project/vllm 003df2961dd8830c317a61f9745ccd557da9fa06 (read in full;
facts §1). Written from the facts, not copied.

Facts relied on:
* ``SupportsHMA(ABC)`` with one abstract method
  ``request_finished_all_groups(request, block_ids: tuple[list[int], ...])
  -> (bool, dict | None)``; ``supports_hma(x)``: issubclass for a class, else
  isinstance.
* ``KVConnectorRole`` enum SCHEDULER=0, WORKER=1; marker ABCs
  ``KVConnectorHandshakeMetadata``, ``KVConnectorMetadata``;
  ``KVConnectorWorkerMetadata`` with abstract ``aggregate(other)``.
* ``KVConnectorBase_V1(ABC)`` abstract methods, exactly: start_load_kv,
  wait_for_layer_load, save_kv_layer, wait_for_save,
  get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta.
* ``__init__(vllm_config, role, kv_cache_config)`` (all required) logs a
  warning, then sets, in order: ``_connector_metadata = None``,
  ``_vllm_config``, ``_kv_transfer_config`` (ValueError "kv_transfer_config
  must be set for KVConnectorBase_V1" when None), ``_kv_cache_config``,
  ``_role``, ``use_eagle_prefix_cache_hashing = False``.
* properties: ``prefer_cross_layer_blocks`` False,
  ``supports_eagle_prefix_cache_hashing`` False, ``requires_kv_delivery`` =
  ``self._kv_transfer_config.is_kv_producer`` (so a subclass that skips the
  base ``__init__`` and does not override it raises AttributeError when the
  scheduler reads it), ``role`` = ``self._role``.
* concrete defaults: bind/clear/_get/has connector metadata,
  register_kv_caches, register_cross_layers_kv_cache,
  set_host_xfer_buffer_ops, handle_preemptions(kv_connector_metadata),
  get_finished -> (None, None), get_block_ids_with_load_errors -> set(),
  shutdown, get_kv_connector_stats -> None,
  get_kv_connector_kv_cache_events -> None, get_handshake_metadata -> None,
  build_connector_worker_meta -> None, bind_gpu_block_pool, on_new_request,
  update_connector_output, request_finished -> (False, None),
  take_events -> (), has_pending_push_work -> False, get_finished_count ->
  None, set_xfer_handshake_metadata, set_xfer_handshake_metadata_pp_aware
  (ValueError on a pp_rank != 0), reset_cache -> None,
  set_eagle_prefix_cache_hashing(enabled).
* classmethods: ``get_required_kvcache_layout(vllm_config)`` raises
  TypeError when ``cls is KVConnectorBase_V1``, else None;
  ``requires_piecewise_for_cudagraph(extra_config)`` False;
  ``build_kv_connector_stats(data=None)`` None; ``build_prom_metrics(...)``
  None.
"""

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

import torch

from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadata  # noqa: F401
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import KVConnectorOutput

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# (src tensors, dst tensors, src block indices, dst block indices, direction)
CopyBlocksOp = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], list[int], list[int],
                         Literal["h2d", "d2h"]], None]

logger = init_logger(__name__)


class SupportsHMA(ABC):
    """Marks a connector that works with the hybrid memory allocator (HMA)."""

    @abstractmethod
    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """Called exactly once per finished request, with one block-id list per KV
        cache group (every resident block of the computed prefix, the partial tail
        included), before its blocks are freed. Returns (delay_free, kv_transfer_params)."""
        raise NotImplementedError


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    """Out-of-band handshake metadata (serializable)."""


class KVConnectorMetadata(ABC):  # noqa: B024
    """Scheduler-side connector -> worker-side connector, once per step."""


class KVConnectorWorkerMetadata(ABC):
    """Worker-side connector -> scheduler-side connector, aggregated over workers."""

    @abstractmethod
    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        ...


class KVConnectorBase_V1(ABC):
    """Base class of v1 KV connectors."""

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def supports_eagle_prefix_cache_hashing(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        # The producer role by default; best-effort caches override this to False.
        return self._kv_transfer_config.is_kv_producer

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        logger.warning("Initializing KVConnectorBase_V1. This API is experimental and "
                       "subject to change in the future as we iterate the design.")
        self._connector_metadata: KVConnectorMetadata | None = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
        self.use_eagle_prefix_cache_hashing = enabled

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # ---- worker side ----------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        return

    def register_cross_layers_kv_cache(self, kv_cache: torch.Tensor, attn_backend: type["AttentionBackend"]):
        return

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp):
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata",
                      **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_save(self):
        ...

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return None

    # ---- scheduler side -------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        ...

    @abstractmethod
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        ...

    def on_new_request(self, request: "Request") -> None:
        return

    def update_connector_output(self, connector_output: KVConnectorOutput):
        return

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def take_events(self) -> Iterable[Any]:
        return ()

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return False

    def get_finished_count(self) -> int | None:
        return None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return None

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        return None

    def set_xfer_handshake_metadata_pp_aware(
            self, metadata: dict[tuple[int, int], KVConnectorHandshakeMetadata]) -> None:
        if any(pp_rank != 0 for pp_rank, _ in metadata):
            raise ValueError(f"{type(self).__name__} received pp_rank > 0 handshake metadata "
                             "but does not support PP-disaggregated KV transfer.")
        self.set_xfer_handshake_metadata({tp_rank: m for (_, tp_rank), m in metadata.items()})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None

    def reset_cache(self) -> bool | None:
        logger.debug("Connector cache reset requested, but %s does not implement reset_cache().",
                     type(self).__name__)
        return None
