"""Stand-in of ``vllm/v1/engine/__init__.py``: ``EngineCoreOutput(s)``, as
scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06 constructs them (fields
not used here omitted).

Facts relied on: the scheduler's ``update_from_output`` emits, per request
with output, ``EngineCoreOutput(request_id, new_token_ids, finish_reason,
stop_reason, kv_transfer_params, ...)``, where ``kv_transfer_params`` is the
second element the connector returned from ``request_finished*``; outputs are
grouped by ``client_index`` into ``EngineCoreOutputs``.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: Any = None
    kv_transfer_params: dict[str, Any] | None = None
    events: Any = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    finished_requests: set[str] | None = None
    scheduler_stats: Any = None
