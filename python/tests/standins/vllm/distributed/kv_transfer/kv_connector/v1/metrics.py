"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/v1/metrics.py``:
``KVConnectorStats`` (not read; its uses in
scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06 and the aggregator).

Facts relied on: a stats object has ``data: dict``, ``aggregate(other)``
(the KVOutputAggregator combines the workers' stats and the scheduler combines
worker and scheduler-side stats), ``reduce()``, ``reset()``, ``is_empty()``.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        self.data = {}

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        return self

    def reduce(self) -> dict[str, Any]:
        return {}

    def is_empty(self) -> bool:
        return not self.data
