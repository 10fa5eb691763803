"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/v1/__init__.py``
(the scheduler at 003df29 imports ``KVConnectorBase_V1, KVConnectorRole,
SupportsHMA`` from here)."""

from .base import (  # noqa: F401
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
    supports_hma,
)
