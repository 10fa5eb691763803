"""Stand-in of ``vllm/v1/core/sched/scheduler.py`` at vllm-project/vllm
003df2961dd8830c317a61f9745ccd557da9fa06 (read in full; facts §4 and §10).
Written from the facts, not copied; spec decode, encoders, structured output,
LoRA, pooling, streaming input, priority scheduling, async scheduling and PP
are not modelled.

Facts relied on, in call order:

``__init__``: defaults connector=None, recompute_kv_load_failures=True,
defer_block_free=False, requires_kv_delivery=False; with a kv_transfer_config:
assert not encoder-decoder; ``KVConnectorFactory.create_connector(
config=vllm_config, role=KVConnectorRole.SCHEDULER,
kv_cache_config=kv_cache_config)`` (keywords); ``recompute_kv_load_failures
= (kv_load_failure_policy == "recompute")``; defer_block_free only with
``max_concurrent_batches > 1`` and a consumer (never here);
**``self.requires_kv_delivery = self.connector.requires_kv_delivery``**;
``use_eagle_prefix_cache_hashing = is_eagle_prefix_cache_hashing_enabled(
vllm_config, connector)`` (reads ``supports_eagle_prefix_cache_hashing`` only
under EAGLE); the KVCacheManager; ``connector.bind_gpu_block_pool(
kv_cache_manager.block_pool)``.

``add_request``: enqueue, ``self.requests[id] = request``, then
``connector.on_new_request(request)``.

``schedule()``:
* running requests first; ``allocate_slots`` failing preempts
  ``self.running.pop()`` (FCFS) with ``_preempt_request(req,
  drop_stale_output=self.requires_kv_delivery)`` until it fits or the request
  itself was preempted. **No connector call at preemption.**
  ``_preempt_request``: free blocks, status PREEMPTED, num_computed_tokens=0,
  ``num_preemptions += 1``, prepend to waiting, id into
  ``reset_preempted_req_ids``.
* waiting requests only if nothing was preempted this step. Blocked
  WAITING_FOR_REMOTE_KVS requests are promoted once their id is in
  ``finished_recving_kv_req_ids`` (``_update_waiting_for_remote_kv``:
  ``cache_blocks``; a full-prompt load keeps one token to compute; status
  PREEMPTED if preempted before, else WAITING).
* for ``num_computed_tokens == 0``: with a connector
  ``get_computed_blocks_for_connector``; ``block_aligned_local = local -
  local % block_size``; **``ext, load_async =
  connector.get_num_new_matched_tokens(request, block_aligned_local)``**;
  ``ext is None`` -> skip the request this step (asked again next step);
  partial-tail rules; ``assert local + ext <= request.num_tokens``.
* ``load_async``: assert ext > 0, no new tokens; else ``num_new_tokens =
  num_tokens - num_computed`` and **``assert num_new_tokens > 0``** (a sync hit
  must leave a token to compute).
* ``allocate_slots(...)``; None -> stop admitting. Then, with a connector,
  **``update_state_after_alloc(request, kv_cache_manager.get_blocks(id),
  num_external_computed_tokens)``** on every admission (the whole table, all
  groups; also with 0 external tokens).
* async load: status WAITING_FOR_REMOTE_KVS, requeued, ``num_computed_tokens``
  set now, not scheduled this step.
* else running; WAITING -> scheduled_new_reqs, PREEMPTED -> resumed.
* ``NewRequestData.from_request(req, get_blocks(id).get_block_ids())``;
  ``_make_cached_request_data``: running then resumed; resumed ids in
  ``resumed_req_ids`` with ``new_block_ids`` = the full table;
  ``all_token_ids`` for requests not scheduled in the previous step;
  ``new_block_ids`` entry None when no group got a block.
* ``SchedulerOutput(..., preempted_req_ids=self.reset_preempted_req_ids,
  finished_req_ids=self.finished_req_ids, partial_tail_offloads=...)``;
  **``kv_connector_metadata = connector.build_connector_meta(output)`` every
  step**, even with nothing scheduled; then ``_update_after_schedule`` adds
  the scheduled tokens to ``num_computed_tokens`` and **replaces** (not
  clears) ``finished_req_ids`` and ``reset_preempted_req_ids``.

``update_from_output``: ``kv_connector_output.invalid_block_ids`` ->
``_handle_invalid_blocks`` (async loaders in skipped_waiting, then running;
**group 0 only**: ``(req_block_ids,) = get_block_ids(req_id)``, which fails
with more than one group, as upstream; truncate ``num_computed_tokens`` to
the first bad block; policy "fail": the requests end FINISHED_ERROR; policy
"recompute": sync ids skip this step's output, async ids go to
``failed_recving_kv_req_ids``); the token loop (stop -> ``_free_request``,
its ``kv_transfer_params`` into the EngineCoreOutput); then
``_update_from_kv_xfer_finished``: **``update_connector_output``**, then
finished_recving / finished_sending; ``connector.get_kv_connector_stats()``;
**``connector.take_events()``**.

``_free_request`` -> **``_connector_finished``**: ``remove_skipped_blocks``
(processed tokens) so out-of-window sliding-window entries become the null
block 0; ``block_ids = get_block_ids_for_computed_tokens(id,
num_computed_tokens)``; not SupportsHMA: ``assert len(kv_cache_groups) == 1``
and ``request_finished(request, block_ids[0])``; SupportsHMA:
``request_finished_all_groups(request, block_ids)``. Then the id joins
``finished_req_ids`` (the workers' next ``get_finished``) and, unless the
connector delays, the blocks are freed and the request dropped.
``finished_sending`` frees delayed blocks. ``shutdown`` calls
``connector.shutdown()``.

Stand-in additions (not upstream): ``connector_calls`` records every
scheduler-side connector call (name, request id, arguments, result);
``history`` keeps every SchedulerOutput; ``preempt(req_id)`` makes the next
``schedule()`` preempt that running request exactly as an allocation failure
that chose it would (the test's way to trigger a preemption);
``last_failed_kv_load_req_ids``.
"""

import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.prefix_cache import is_eagle_prefix_cache_hashing_enabled
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.utils import check_stop, remove_all
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

logger = init_logger(__name__)


@dataclass
class ConnectorCall:
    """One scheduler-side connector call (stand-in bookkeeping)."""
    name: str
    req_id: str | None
    args: dict
    result: Any = None


class Scheduler:
    def __init__(self, vllm_config, kv_cache_config, structured_output_manager=None, block_size: int | None = None,
                 hash_block_size: int | None = None, mm_registry=None, include_finished_set: bool = False,
                 log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.cache_config = vllm_config.cache_config
        self.kv_cache_config = kv_cache_config
        self.parallel_config = vllm_config.parallel_config
        self.log_stats = log_stats
        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = (self.scheduler_config.max_num_scheduled_tokens
                                         or self.scheduler_config.max_num_batched_tokens)
        self.max_model_len = vllm_config.model_config.max_model_len
        # stand-in bookkeeping
        self.connector_calls: list[ConnectorCall] = []
        self.history: list[SchedulerOutput] = []
        self.last_failed_kv_load_req_ids: set[str] = set()
        self._forced_preemptions: list[str] = []

        self.connector = None
        self.connector_prefix_cache_stats = None
        self.recompute_kv_load_failures = True
        self.defer_block_free = False
        self.requires_kv_delivery = False
        kv_transfer_config = vllm_config.kv_transfer_config
        if kv_transfer_config is not None:
            assert not vllm_config.model_config.is_encoder_decoder, (
                "Encoder-decoder models are not currently supported with KV connectors")
            self.connector = KVConnectorFactory.create_connector(
                config=self.vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=self.kv_cache_config)
            self.recompute_kv_load_failures = kv_transfer_config.kv_load_failure_policy == "recompute"
            if vllm_config.max_concurrent_batches > 1 and kv_transfer_config.is_kv_consumer:
                self.defer_block_free = True
            self.requires_kv_delivery = self.connector.requires_kv_delivery

        num_gpu_blocks = self.cache_config.num_gpu_blocks
        assert num_gpu_blocks is not None and num_gpu_blocks > 0
        self.block_size = block_size if block_size is not None else self.cache_config.block_size
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue()
        self.skipped_waiting = create_request_queue()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.num_waiting_for_streaming_input = 0
        self.use_eagle = False
        self.num_lookahead_tokens = 0
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("stand-in: speculative decoding is not modelled")
        self.use_eagle_prefix_cache_hashing = is_eagle_prefix_cache_hashing_enabled(vllm_config, self.connector)
        self.kv_cache_manager = KVCacheManager(kv_cache_config=kv_cache_config, max_model_len=self.max_model_len,
                                               enable_caching=self.cache_config.enable_prefix_caching,
                                               hash_block_size=hash_block_size or self.block_size)
        if self.connector is not None:
            self.connector.bind_gpu_block_pool(self.kv_cache_manager.block_pool)
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.current_step = 0
        self._inflight_prefills: set[Request] = set()

    # ---- stand-in bookkeeping ---------------------------------------------------
    def _record(self, name, req_id, result=None, **args) -> None:
        self.connector_calls.append(ConnectorCall(name, req_id, args, result))

    def calls(self, name: str, req_id: str | None = None) -> list[ConnectorCall]:
        return [c for c in self.connector_calls if c.name == name and (req_id is None or c.req_id == req_id)]

    def preempt(self, req_id: str) -> None:
        """Stand-in: the next schedule() preempts this running request, as an
        allocation failure choosing it as the victim would."""
        self._forced_preemptions.append(req_id)

    # ---- requests ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        assert request.request_id not in self.requests, "duplicate request id"
        if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self.skipped_waiting.add_request(request)
        else:
            self.waiting.add_request(request)
        self.requests[request.request_id] = request
        if self.connector is not None:
            self.connector.on_new_request(request)
            self._record("on_new_request", request.request_id)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.skipped_waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        if self.connector is None:
            return False
        return len(self.requests) > len(self.waiting) + len(self.skipped_waiting) + len(self.running)

    def has_requests(self) -> bool:
        return (self.has_unfinished_requests() or self.has_finished_requests()
                or (self.connector is not None and self.connector.has_pending_push_work()))

    def get_kv_connector(self):
        return self.connector

    # ---- schedule -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.current_step += 1
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        scheduled_running_reqs: list[Request] = []
        preempted_reqs: list[Request] = []
        req_to_new_blocks = {}
        num_scheduled_tokens: dict[str, int] = {}
        token_budget = self.max_num_scheduled_tokens
        self.kv_cache_manager.new_step_starts()

        # Stand-in: preemptions a test asked for (the victim an allocation failure would pick).
        forced, self._forced_preemptions = self._forced_preemptions, []
        for req_id in forced:
            req = self.requests.get(req_id)
            if req is not None and req in self.running:
                self.running.remove(req)
                self._preempt_request(req, drop_stale_output=self.requires_kv_delivery)
                preempted_reqs.append(req)

        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = (request.num_tokens_with_spec + request.num_output_placeholders
                              - request.num_computed_tokens)
            threshold = self.scheduler_config.long_prefill_token_threshold
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            num_new_tokens = min(num_new_tokens, token_budget,
                                 self.max_model_len - request.num_computed_tokens - 1)
            if num_new_tokens <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens,
                                                                  num_lookahead_tokens=self.num_lookahead_tokens)
                if new_blocks is not None:
                    break
                preempted_req = self.running.pop()
                self._preempt_request(preempted_req, drop_stale_output=self.requires_kv_delivery)
                preempted_reqs.append(preempted_req)
                if preempted_req is request:
                    break
            if new_blocks is None:
                break
            scheduled_running_reqs.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1

        if not preempted_reqs:
            step_skipped_waiting = create_request_queue()
            while (self.waiting or self.skipped_waiting) and token_budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                request_queue = self.skipped_waiting or self.waiting
                request = request_queue.peek_request()
                request_id = request.request_id
                if (request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                        and not self._try_promote_blocked_waiting_request(request)):
                    request_queue.pop_request()
                    step_skipped_waiting.prepend_request(request)
                    continue

                num_external_computed_tokens = 0
                load_kv_async = False
                if request.num_computed_tokens == 0:
                    hit_diverged = False
                    if self.connector is not None:
                        (new_computed_blocks, num_new_local_computed_tokens, request.shared_prefix_boundary,
                         hit_diverged) = self.kv_cache_manager.get_computed_blocks_for_connector(request)
                    else:
                        (new_computed_blocks, num_new_local_computed_tokens,
                         request.shared_prefix_boundary) = self.kv_cache_manager.get_computed_blocks(request)
                    if self.connector is not None:
                        partial_tail = num_new_local_computed_tokens % self.block_size
                        block_aligned_local = num_new_local_computed_tokens - partial_tail
                        ext_tokens, load_kv_async = self.connector.get_num_new_matched_tokens(
                            request, block_aligned_local)
                        self._record("get_num_new_matched_tokens", request_id, (ext_tokens, load_kv_async),
                                     num_computed_tokens=block_aligned_local,
                                     num_preemptions=request.num_preemptions, num_tokens=request.num_tokens)
                        if ext_tokens is None:
                            request_queue.pop_request()
                            step_skipped_waiting.prepend_request(request)
                            continue
                        if partial_tail and ext_tokens > partial_tail:
                            new_computed_blocks = self.kv_cache_manager.truncate_computed_blocks(
                                new_computed_blocks, block_aligned_local)
                            num_new_local_computed_tokens = block_aligned_local
                            num_external_computed_tokens = ext_tokens
                        elif partial_tail:
                            num_external_computed_tokens = 0
                            load_kv_async = False
                        else:
                            num_external_computed_tokens = ext_tokens
                        if hit_diverged and num_external_computed_tokens == 0:
                            (new_computed_blocks, num_new_local_computed_tokens,
                             request.shared_prefix_boundary) = self.kv_cache_manager.get_computed_blocks(request)
                    num_computed_tokens = num_new_local_computed_tokens + num_external_computed_tokens
                    assert num_computed_tokens <= request.num_tokens
                else:
                    new_computed_blocks = self.kv_cache_manager.empty_kv_cache_blocks
                    num_new_local_computed_tokens = 0
                    num_computed_tokens = request.num_computed_tokens

                if load_kv_async:
                    assert num_external_computed_tokens > 0
                    num_new_tokens = 0
                else:
                    num_new_tokens = request.num_tokens - num_computed_tokens
                    threshold = self.scheduler_config.long_prefill_token_threshold
                    if 0 < threshold < num_new_tokens:
                        num_new_tokens = threshold
                    if not self.scheduler_config.enable_chunked_prefill and num_new_tokens > token_budget:
                        break
                    num_new_tokens = min(num_new_tokens, token_budget)
                    assert num_new_tokens > 0, (
                        f"{request_id}: the KV connector reported {num_external_computed_tokens} tokens of a "
                        f"{request.num_tokens}-token request (local hit {num_new_local_computed_tokens}): a "
                        "synchronous hit must leave at least one token to compute")

                reserved_blocks = self._inflight_prefill_reserved_blocks() if load_kv_async else 0
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new_tokens, num_new_computed_tokens=num_new_local_computed_tokens,
                    new_computed_blocks=new_computed_blocks, num_lookahead_tokens=self.num_lookahead_tokens,
                    num_external_computed_tokens=num_external_computed_tokens, delay_cache_blocks=load_kv_async,
                    reserved_blocks=reserved_blocks, has_scheduled_reqs=bool(self.running))
                if new_blocks is None:
                    break

                if self.connector is not None:
                    blocks = self.kv_cache_manager.get_blocks(request_id)
                    self.connector.update_state_after_alloc(request, blocks, num_external_computed_tokens)
                    self._record("update_state_after_alloc", request_id, block_ids=blocks.get_block_ids(),
                                 num_external_tokens=num_external_computed_tokens)

                request = request_queue.pop_request()
                if load_kv_async:
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    step_skipped_waiting.prepend_request(request)
                    request.num_computed_tokens = num_computed_tokens
                    self._inflight_prefills.add(request)
                    continue

                self.running.append(request)
                if request.status == RequestStatus.WAITING:
                    scheduled_new_reqs.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed_reqs.append(request)
                else:
                    raise RuntimeError(f"Invalid request status: {request.status}")
                req_to_new_blocks[request_id] = self.kv_cache_manager.get_blocks(request_id)
                num_scheduled_tokens[request_id] = num_new_tokens
                token_budget -= num_new_tokens
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed_tokens
                if num_computed_tokens + num_new_tokens < request.num_tokens:
                    self._inflight_prefills.add(request)
            if step_skipped_waiting:
                self.skipped_waiting.prepend_requests(step_skipped_waiting)

        total_num_scheduled_tokens = sum(num_scheduled_tokens.values())
        assert total_num_scheduled_tokens <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs

        new_reqs_data = [NewRequestData.from_request(req, req_to_new_blocks[req.request_id].get_block_ids())
                         for req in scheduled_new_reqs]
        cached_reqs_data = self._make_cached_request_data(scheduled_running_reqs, scheduled_resumed_reqs,
                                                          num_scheduled_tokens, req_to_new_blocks)
        self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        partial_tail_offloads = None
        ktc = self.vllm_config.kv_transfer_config
        if self.connector is not None and ktc is not None and ktc.is_kv_producer:
            partial_tail_offloads = self.kv_cache_manager.take_partial_tail_offloads() or None
        scheduler_output = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data, scheduled_cached_reqs=cached_reqs_data,
            num_scheduled_tokens=num_scheduled_tokens, total_num_scheduled_tokens=total_num_scheduled_tokens,
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=self.kv_cache_manager.get_num_common_prefix_blocks(
                self.running[0].request_id) if self.running else [0] * len(self.kv_cache_config.kv_cache_groups),
            preempted_req_ids=self.reset_preempted_req_ids, finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[], partial_tail_offloads=partial_tail_offloads)
        if self.connector is not None:
            scheduler_output.kv_connector_metadata = self._build_kv_connector_meta(self.connector, scheduler_output)
            self._record("build_connector_meta", None, step=self.current_step)
        self._update_after_schedule(scheduler_output)
        self.history.append(scheduler_output)
        return scheduler_output

    def _build_kv_connector_meta(self, connector, scheduler_output):
        return connector.build_connector_meta(scheduler_output)

    def _preempt_request(self, request: Request, drop_stale_output: bool = False) -> None:
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.kv_cache_manager.free(request)
        self._inflight_prefills.discard(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.invalidate_eagle_hash_publication()
        request.spec_token_ids = []
        request.drop_stale_output = drop_stale_output or (request.drop_stale_output
                                                          and request.num_stale_output_tokens > 0)
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += n
            request.num_in_flight_tokens += n
            request.is_prefill_chunk = request.num_computed_tokens < (request.num_tokens
                                                                      + request.num_output_placeholders)
            if not request.is_prefill_chunk:
                self._inflight_prefills.discard(request)
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def _make_cached_request_data(self, running_reqs, resumed_reqs, num_scheduled_tokens,
                                  req_to_new_blocks) -> CachedRequestData:
        req_ids, new_block_ids, num_computed, num_output = [], [], [], []
        all_token_ids: dict[str, list[int]] = {}
        resumed_req_ids = set()
        for idx, req in enumerate(itertools.chain(running_reqs, resumed_reqs)):
            req_id = req.request_id
            req_ids.append(req_id)
            if idx >= len(running_reqs):
                resumed_req_ids.add(req_id)
            if req_id not in self.prev_step_scheduled_req_ids:
                all_token_ids[req_id] = list(req.all_token_ids)
            new_block_ids.append(req_to_new_blocks[req_id].get_block_ids(allow_none=True))
            num_computed.append(req.num_computed_tokens)
            num_output.append(req.num_output_tokens + req.num_output_placeholders)
        return CachedRequestData(req_ids=req_ids, resumed_req_ids=resumed_req_ids, new_token_ids=[],
                                 all_token_ids=all_token_ids, new_block_ids=new_block_ids,
                                 num_computed_tokens=num_computed, num_output_tokens=num_output)

    def _inflight_prefill_reserved_blocks(self) -> int:
        return sum(self.kv_cache_manager.remaining_blocks(r) for r in self._inflight_prefills)

    # ---- outputs ------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output) -> dict[int, EngineCoreOutputs]:
        sampled_token_ids = model_runner_output.sampled_token_ids
        num_scheduled_tokens = scheduler_output.num_scheduled_tokens
        kv_connector_output = model_runner_output.kv_connector_output
        outputs: dict[int, list[EngineCoreOutput]] = defaultdict(list)

        failed_kv_load_req_ids = None
        if kv_connector_output and kv_connector_output.invalid_block_ids:
            failed_kv_load_req_ids = self._handle_invalid_blocks(kv_connector_output.invalid_block_ids,
                                                                 num_scheduled_tokens)
        self.last_failed_kv_load_req_ids = set(failed_kv_load_req_ids or ())

        stopped_running_reqs: set[Request] = set()
        for req_id, num_tokens_scheduled in num_scheduled_tokens.items():
            assert num_tokens_scheduled > 0
            request = self.requests.get(req_id)
            if request is not None:
                request.num_in_flight_tokens -= num_tokens_scheduled
            if failed_kv_load_req_ids and req_id in failed_kv_load_req_ids:
                continue
            if request is None or request.is_finished():
                continue
            req_index = model_runner_output.req_id_to_index[req_id]
            generated = list(sampled_token_ids[req_index]) if sampled_token_ids else []
            stopped = False
            kv_transfer_params = None
            new_token_ids = generated
            if new_token_ids:
                new_token_ids, stopped = self._update_request_with_output(request, new_token_ids)
            finish_reason = None
            if stopped:
                finish_reason = request.get_finished_reason()
                kv_transfer_params, _ = self._free_request(request)
                stopped_running_reqs.add(request)
            if new_token_ids or stopped:
                outputs[request.client_index].append(EngineCoreOutput(
                    request_id=req_id, new_token_ids=new_token_ids, finish_reason=finish_reason,
                    stop_reason=request.stop_reason, kv_transfer_params=kv_transfer_params))
        if stopped_running_reqs:
            self.running = remove_all(self.running, stopped_running_reqs)

        if failed_kv_load_req_ids and not self.recompute_kv_load_failures:
            for request in self.finish_requests(failed_kv_load_req_ids, RequestStatus.FINISHED_ERROR):
                outputs[request.client_index].append(EngineCoreOutput(
                    request_id=request.request_id, new_token_ids=[],
                    finish_reason=request.get_finished_reason()))

        if kv_connector_output:
            self._update_from_kv_xfer_finished(kv_connector_output)

        if self.connector is not None:
            self.connector.get_kv_connector_stats()
        events = self.kv_cache_manager.take_events()
        if self.connector is not None:
            connector_events = self.connector.take_events()
            self._record("take_events", None)
            if connector_events:
                events = list(events or []) + list(connector_events)
        return {ci: EngineCoreOutputs(outputs=outs) for ci, outs in outputs.items()}

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]):
        stopped = False
        for num_new, token in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token)
            stopped = check_stop(request, self.max_model_len)
            if stopped:
                del new_token_ids[num_new:]
                break
        return new_token_ids, stopped

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list[Request]:
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        valid = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            valid.append(request)
        running = {r for r in valid if r.status == RequestStatus.RUNNING}
        waiting = [r for r in valid if r.status != RequestStatus.RUNNING]
        if running:
            self.running = remove_all(self.running, running)
        if waiting:
            self.waiting.remove_requests(waiting)
            self.skipped_waiting.remove_requests(waiting)
        for request in valid:
            delay_free_blocks = False
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay_free_blocks = request.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(request.request_id)
                self.failed_recving_kv_req_ids.discard(request.request_id)
            request.status = finished_status
            self._free_request(request, delay_free_blocks=delay_free_blocks)
        return valid

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        assert request.is_finished()
        self._inflight_prefills.discard(request)
        connector_delay, kv_xfer_params = self._connector_finished(request)
        self.finished_req_ids.add(request.request_id)
        if not (delay_free_blocks or connector_delay):
            self._free_blocks(request)
        return kv_xfer_params, None

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def _connector_finished(self, request: Request):
        if self.connector is None:
            return False, None
        self.kv_cache_manager.remove_skipped_blocks(
            request_id=request.request_id,
            processed_computed_tokens=max(0, request.num_computed_tokens - request.num_in_flight_tokens),
            num_prompt_tokens=request.num_prompt_tokens)
        block_ids = self.kv_cache_manager.get_block_ids_for_computed_tokens(
            request_id=request.request_id, num_computed_tokens=request.num_computed_tokens)
        if not isinstance(self.connector, SupportsHMA):
            assert len(self.kv_cache_config.kv_cache_groups) == 1
            result = self.connector.request_finished(request, block_ids[0])
            self._record("request_finished", request.request_id, result, block_ids=list(block_ids[0]))
            return result
        result = self.connector.request_finished_all_groups(request, block_ids)
        self._record("request_finished_all_groups", request.request_id, result,
                     block_ids=tuple(list(g) for g in block_ids))
        return result

    # ---- KV transfer bookkeeping ---------------------------------------------------
    def _try_promote_blocked_waiting_request(self, request: Request) -> bool:
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self._update_waiting_for_remote_kv(request)
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        if request.request_id in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(request.request_id)
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            if request.num_computed_tokens == request.num_tokens:
                request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(request.request_id)

    def _update_from_kv_xfer_finished(self, kv_connector_output) -> None:
        if self.connector is not None:
            self.connector.update_connector_output(kv_connector_output)
            self._record("update_connector_output", None,
                         finished_sending=set(kv_connector_output.finished_sending or ()),
                         finished_recving=set(kv_connector_output.finished_recving or ()))
        for req_id in kv_connector_output.finished_recving or ():
            assert req_id in self.requests
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(req)
        for req_id in kv_connector_output.finished_sending or ():
            assert req_id in self.requests
            self._free_blocks(self.requests[req_id])

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens,
                                             evict_blocks: bool = True):
        affected, total_affected_tokens, to_evict, marked = set(), 0, set(), set()
        for request in requests:
            is_affected = False
            marked_invalid_block = False
            req_id = request.request_id
            # As upstream (TODO HMA there): group 0 only; more groups fail to unpack.
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)
            req_num_computed_tokens = request.num_computed_tokens - num_scheduled_tokens.get(req_id, 0)
            req_num_computed_blocks = (req_num_computed_tokens + self.block_size - 1) // self.block_size
            for idx, block_id in zip(range(req_num_computed_blocks), req_block_ids):
                if block_id not in invalid_block_ids:
                    continue
                is_affected = True
                if block_id in marked:
                    continue
                marked.add(block_id)
                if marked_invalid_block:
                    continue
                marked_invalid_block = True
                request.num_computed_tokens = idx * self.block_size
                total_affected_tokens += req_num_computed_tokens - request.num_computed_tokens
                if evict_blocks:
                    to_evict.update(req_block_ids[idx:])
            if is_affected:
                if not marked_invalid_block:
                    total_affected_tokens += request.num_computed_tokens - req_num_computed_tokens
                    request.num_computed_tokens = req_num_computed_tokens
                affected.add(req_id)
        return affected, total_affected_tokens, to_evict

    def _handle_invalid_blocks(self, invalid_block_ids, num_scheduled_tokens) -> set[str]:
        async_reqs = [r for r in self.skipped_waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        async_failed, _, _ = self._update_requests_with_invalid_blocks(async_reqs, invalid_block_ids,
                                                                      num_scheduled_tokens, evict_blocks=False)
        sync_failed, _, sync_to_evict = self._update_requests_with_invalid_blocks(
            self.running, invalid_block_ids, num_scheduled_tokens, evict_blocks=True)
        if not async_failed and not sync_failed:
            return set()
        if sync_to_evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(sync_to_evict)
        if not self.recompute_kv_load_failures:
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    def reset_connector_cache(self) -> bool:
        if self.connector is None:
            return True
        return self.connector.reset_cache() is not False

    def shutdown(self) -> None:
        if self.connector is not None:
            self.connector.shutdown()
