"""Stand-in of ``vllm/v1/core/sched/output.py`` with the 003df29 field set.

Facts relied on (facts §5: the constructor calls in scheduler.py@003df29,
cross-checked with the annotated copy index 58546731618 whose fields match):
* ``NewRequestData(req_id, prompt_token_ids, mm_features, sampling_params,
  pooling_params, block_ids: tuple[list[int], ...] (one full list per KV
  cache group), num_computed_tokens (local + external at admission),
  lora_request, prompt_embeds=None, prompt_is_token_ids=None,
  prefill_token_ids=None)``; ``from_request(request, block_ids,
  prefill_token_ids=None)``.
* ``CachedRequestData(req_ids, resumed_req_ids: set (new_block_ids replace the
  table), new_token_ids (PP only; empty), all_token_ids (v1 runner: full
  token list of requests not scheduled in the previous step), new_block_ids:
  list[tuple[list[int], ...] | None] (None when no group got a block),
  num_computed_tokens, num_output_tokens)``; ``num_reqs``,
  ``is_context_phase``, ``make_empty``. Running requests come first, then
  resumed ones.
* ``SchedulerOutput``: scheduled_new_reqs, scheduled_cached_reqs,
  num_scheduled_tokens, total_num_scheduled_tokens,
  scheduled_spec_decode_tokens, scheduled_encoder_inputs,
  num_common_prefix_blocks, finished_req_ids, free_encoder_mm_hashes, then
  defaults scheduled_encoder_input_stats, preempted_req_ids,
  has_structured_output_requests, pending_structured_output_tokens,
  num_invalid_spec_tokens, kv_connector_metadata, ec_connector_metadata,
  ec_manager_metadata, new_block_ids_to_zero, kv_cache_block_copies,
  partial_tail_offloads, num_spec_tokens_to_schedule; ``make_empty``.
  (``has_sync_kv_loads`` is later than 003df29 and absent.)
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prompt_is_token_ids: list[bool] | None = None
    prefill_token_ids: list[int] | None = None

    @classmethod
    def from_request(cls, request, block_ids: tuple[list[int], ...],
                     prefill_token_ids: list[int] | None = None) -> "NewRequestData":
        return cls(req_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                   mm_features=request.mm_features, sampling_params=request.sampling_params,
                   pooling_params=request.pooling_params, block_ids=block_ids,
                   num_computed_tokens=request.num_computed_tokens, lora_request=request.lora_request,
                   prefill_token_ids=prefill_token_ids)


@dataclass
class CachedRequestData:
    req_ids: list[str]
    resumed_req_ids: set[str]
    new_token_ids: list[list[int]]
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def is_context_phase(self, req_id: str) -> bool:
        d = dict(zip(self.req_ids, self.num_output_tokens))
        return d.get(req_id) == 0

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls(req_ids=[], resumed_req_ids=set(), new_token_ids=[], all_token_ids={}, new_block_ids=[],
                   num_computed_tokens=[], num_output_tokens=[])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    scheduled_encoder_inputs: dict[str, list[int]]
    num_common_prefix_blocks: list[int]
    finished_req_ids: set[str]
    free_encoder_mm_hashes: list[str]
    scheduled_encoder_input_stats: Any = None
    preempted_req_ids: set[str] | None = None
    has_structured_output_requests: bool = False
    pending_structured_output_tokens: bool = False
    num_invalid_spec_tokens: dict[str, int] | None = None
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None
    ec_manager_metadata: Any = None
    new_block_ids_to_zero: list[int] | None = None
    kv_cache_block_copies: list | None = None
    partial_tail_offloads: dict[str, list[tuple[int, int, int]]] | None = None
    num_spec_tokens_to_schedule: int = 0

    @classmethod
    def make_empty(cls) -> "SchedulerOutput":
        return cls(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData.make_empty(),
                   num_scheduled_tokens={}, total_num_scheduled_tokens=0, scheduled_spec_decode_tokens={},
                   scheduled_encoder_inputs={}, num_common_prefix_blocks=[], finished_req_ids=set(),
                   free_encoder_mm_hashes=[])
