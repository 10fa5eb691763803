"""Stand-in of ``vllm/v1/outputs.py``: ``KVConnectorOutput`` and
``ModelRunnerOutput`` (the latter as scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06
reads it).

Facts relied on (facts §5, KVConnectorOutput; copies 69063122516 and
63867860643): ``KVConnectorOutput`` fields ``finished_sending``,
``finished_recving`` (set | None), ``kv_connector_stats``,
``kv_cache_events``, ``kv_connector_worker_meta``, ``invalid_block_ids``
(set), ``expected_finished_count`` (int) and ``is_empty()``.
``ModelRunnerOutput`` carries ``req_ids``, ``req_id_to_index``,
``sampled_token_ids`` (one list per request; empty for a partial prefill),
``kv_connector_output``. The stand-in adds the per-rank digests its toy model
combines into tokens (``standin_digests``) and the KV it found wrong
(``standin_kv_mismatches``); they are not upstream fields.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorOutput:
    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving and not self.kv_connector_stats
                and not self.kv_cache_events and not self.invalid_block_ids
                and self.kv_connector_worker_meta is None)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str] = field(default_factory=list)
    req_id_to_index: dict[str, int] = field(default_factory=dict)
    sampled_token_ids: list[list[int]] = field(default_factory=list)
    logprobs: Any = None
    prompt_logprobs_dict: dict = field(default_factory=dict)
    pooler_output: list = field(default_factory=list)
    kv_connector_output: KVConnectorOutput | None = None
    num_nans_in_logits: dict | None = None
    # stand-in only
    standin_digests: dict[str, bytes] = field(default_factory=dict)
    standin_last_prefix_hash: dict[str, int] = field(default_factory=dict)
    standin_kv_mismatches: list = field(default_factory=list)


def empty_model_runner_output() -> ModelRunnerOutput:
    return ModelRunnerOutput()
