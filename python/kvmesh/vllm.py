"""kvmesh's KV connector for vLLM, as vLLM loads it by name.

    vllm serve <model> --kv-transfer-config '{"kv_connector": "KvmeshConnector",
        "kv_connector_module_path": "kvmesh.vllm", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"coordinator": "127.0.0.1:7070"}}'

vLLM's factory imports this module (``kv_connector_module_path``) and takes
``KvmeshConnector`` from it; the class derives from vLLM's
``KVConnectorBase_V1`` and ``SupportsHMA`` (hybrid models keep vLLM's hybrid
KV cache manager) and from the engine-free core
:class:`kvmesh.adapters.vllm.KvmeshConnector`, which does the work. Its
constructor runs the base's first, so every attribute vLLM reads is set
whatever the MRO. The extra config keys are the core's (docs/engines.md).

Importing this module without vLLM raises ImportError saying so.
"""

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        SupportsHMA,
    )
except ImportError as e:  # pragma: no cover - exercised by a test in a clean interpreter
    raise ImportError(
        "kvmesh.vllm is the vLLM KV connector and needs vLLM in this Python environment "
        f"(import of vllm.distributed.kv_transfer.kv_connector.v1.base failed: {e}). Install vLLM, or use "
        "kvmesh.adapters.vllm.KvmeshConnector, the engine-free core, without it.") from None

from typing import Any, Dict, Optional

from .adapters import vllm as _core_connector

__all__ = ["KvmeshConnector", "KvmeshConnectorMetadata"]


class KvmeshConnectorMetadata(_core_connector.KvmeshConnectorMetadata, KVConnectorMetadata):
    """The core's per-step metadata, as vLLM's KVConnectorMetadata."""


class KvmeshConnector(_core_connector.KvmeshConnector, KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector v1 over kvmesh (see kvmesh.adapters.vllm)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None, **kwargs: Any):
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        _core_connector.KvmeshConnector.__init__(self, vllm_config, role, kv_cache_config, **kwargs)

    # vLLM resolves these through the class (they are also on the core); named
    # here so that neither base's default can win in any MRO.
    requires_kv_delivery = _core_connector.KvmeshConnector.requires_kv_delivery

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        return _core_connector.KvmeshConnector.requires_piecewise_for_cudagraph.__func__(cls, extra_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        return _core_connector.KvmeshConnector.get_required_kvcache_layout.__func__(cls, vllm_config)

    def build_connector_meta(self, scheduler_output: Any) -> KvmeshConnectorMetadata:
        meta = _core_connector.KvmeshConnector.build_connector_meta(self, scheduler_output)
        return KvmeshConnectorMetadata(meta.loads, meta.saves)

    def request_finished_all_groups(self, request: Any, block_ids: Any):
        return _core_connector.KvmeshConnector.request_finished_all_groups(self, request, block_ids)
