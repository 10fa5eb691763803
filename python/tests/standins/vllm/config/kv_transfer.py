"""Stand-in of ``vllm/config/kv_transfer.py`` (``KVTransferConfig``).

Follows the 003df29-era field set (facts §3; sources
``kv_transfer.py@007c643b4abb7a79e69ef2b343b3dc80eb643c0d`` and the annotated
copies cited there). Upstream is a pydantic dataclass (``@config``); here a
plain dataclass, so unknown keys fail with TypeError instead of a pydantic
ValidationError.

Facts relied on:
* fields and defaults: kv_connector=None, engine_id=None, kv_buffer_device
  (platform device type; "cpu" here), kv_buffer_size=1e9, kv_role=None,
  kv_rank=None, kv_parallel_size=1, kv_ip="127.0.0.1", kv_port=14579,
  kv_connector_extra_config={} , kv_connector_module_path=None,
  enable_permute_local_kv=False, kv_load_failure_policy="fail"
  ("recompute" | "fail");
* ``__post_init__``: engine_id = str(uuid4()) when None; kv_role must be one
  of "kv_producer", "kv_consumer", "kv_both" (ValueError "Unsupported
  kv_role"); kv_connector set without kv_role -> ValueError;
* ``is_kv_transfer_instance`` = connector set and role valid;
  ``is_kv_producer`` = connector set and role in (kv_producer, kv_both);
  ``is_kv_consumer`` = connector set and role in (kv_consumer, kv_both);
* ``get_from_extra_config(key, default)``.
"""

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

KVProducer = Literal["kv_producer", "kv_both"]
KVConsumer = Literal["kv_consumer", "kv_both"]
KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]


@dataclass
class KVTransferConfig:
    kv_connector: str | None = None
    engine_id: str | None = None
    kv_buffer_device: str = "cpu"
    kv_buffer_size: float = 1e9
    kv_role: str | None = None
    kv_rank: int | None = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    kv_connector_module_path: str | None = None
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"

    def __post_init__(self) -> None:
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        if self.kv_role is not None and self.kv_role not in get_args(KVRole):
            raise ValueError(f"Unsupported kv_role: {self.kv_role}. Supported roles are {get_args(KVRole)}")
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError("Please specify kv_role when kv_connector "
                             f"is set, supported roles are {get_args(KVRole)}")
        if self.kv_load_failure_policy not in ("recompute", "fail"):
            raise ValueError(f"Unsupported kv_load_failure_policy: {self.kv_load_failure_policy}")

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVRole)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVProducer)

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVConsumer)

    def get_from_extra_config(self, key, default) -> Any:
        return self.kv_connector_extra_config.get(key, default)
