"""Stand-in of ``vllm/v1/request.py`` (``Request``, ``RequestStatus``), from what
scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06 reads and the request.py
copies index 6246442265 and 52588301725 (the ``kv_transfer_params`` from
``sampling_params.extra_args``).

Facts relied on (what the 003df29 scheduler and connectors read):
``request_id``, ``prompt_token_ids``, ``num_prompt_tokens``,
``all_token_ids`` / ``_all_token_ids`` (prompt then output),
``output_token_ids``, ``num_tokens``, ``num_output_tokens``,
``num_tokens_with_spec``, ``num_computed_tokens``, ``num_preemptions``,
``status``, ``kv_transfer_params`` (from
``sampling_params.extra_args["kv_transfer_params"]``), ``sampling_params``,
``max_tokens``, ``block_hashes`` (from the engine's request block hasher,
updated as tokens are appended), ``num_output_placeholders``,
``num_in_flight_tokens``, ``num_stale_output_tokens``, ``drop_stale_output``,
``spec_token_ids``, ``mm_features`` ([]), ``lora_request`` (None),
``has_encoder_inputs`` (False), ``use_structured_output`` (False),
``resumable`` (False), ``is_prefill_chunk``, ``shared_prefix_boundary``,
``client_index``; ``is_finished()``, ``get_finished_reason()``,
``append_output_token_ids()``.
``RequestStatus``: WAITING, WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR,
WAITING_FOR_REMOTE_KVS, WAITING_FOR_STREAMING_REQ, RUNNING, PREEMPTED, then
the finished ones (FINISHED_STOPPED, FINISHED_LENGTH_CAPPED,
FINISHED_ABORTED, FINISHED_IGNORED, FINISHED_ERROR); ``is_finished(status)``
is ``status > PREEMPTED``.
``num_publishable_block_hashes`` is named only in base.py@003df29's
docstrings; without EAGLE prefix hashing the stand-in publishes every block
hash (an assumption, not read upstream).
"""

import enum
import time
from typing import Any, Callable

from vllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> str | None:
        return {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH_CAPPED: "length",
                RequestStatus.FINISHED_ABORTED: "abort", RequestStatus.FINISHED_IGNORED: "length",
                RequestStatus.FINISHED_ERROR: "error"}.get(status)


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams | None,
                 pooling_params: Any = None, eos_token_id: int | None = None, arrival_time: float | None = None,
                 lora_request: Any = None, cache_salt: str | None = None, priority: int = 0,
                 client_index: int = 0, block_hasher: Callable[["Request"], list] | None = None):
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.eos_token_id = eos_token_id
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        self.status = RequestStatus.WAITING
        self.stop_reason = None
        self.max_tokens = sampling_params.max_tokens if sampling_params is not None else 1
        extra = (sampling_params.extra_args or {}) if sampling_params is not None else {}
        self.kv_transfer_params: dict[str, Any] | None = extra.get("kv_transfer_params")
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.spec_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.num_in_flight_tokens = 0
        self.num_stale_output_tokens = 0
        self.drop_stale_output = False
        self.num_preemptions = 0
        self.num_nans_in_logits = 0
        self.mm_features: list = []
        self.has_encoder_inputs = False
        self.use_structured_output = False
        self.structured_output_request = None
        self.resumable = False
        self.streaming_queue = None
        self.is_prefill_chunk = False
        self.shared_prefix_boundary = 0
        self.prefill_stats = None
        self.trace_headers = None
        self.next_decode_eligible_step = 0
        self.last_sched_seq = 0
        self.block_hashes: list = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(self._output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def num_publishable_block_hashes(self) -> int:
        return len(self.block_hashes)

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def invalidate_eagle_hash_publication(self, *args) -> None:
        return

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def take_events(self):
        return None

    def __repr__(self):
        return (f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
