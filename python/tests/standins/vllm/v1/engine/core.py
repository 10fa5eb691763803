"""Stand-in of ``vllm/v1/engine/core.py`` (``EngineCore``): builds the workers
(their connectors and KV caches) first, then the scheduler, and steps.

Facts relied on (EngineCore.__init__ / _initialize_kv_caches / step; copies
index 53122058033, 1387682 and facts §10):
1. ``model_executor = Executor(vllm_config)`` (workers: devices, models);
2. ``_initialize_kv_caches``: the workers' ``get_kv_cache_spec()``, one
   KVCacheConfig per worker, ``cache_config.num_gpu_blocks`` set, then
   ``model_executor.initialize_from_config(kv_cache_configs)`` (each worker
   creates its connector, role WORKER, then allocates and registers its
   caches);
3. ``Scheduler(vllm_config, kv_cache_config, ...)`` (the scheduler-side
   connector, role SCHEDULER);
4. ``request_block_hasher`` built when ``enable_prefix_caching`` or
   ``scheduler.get_kv_connector()`` is set (``init_none_hash``: random per
   process unless PYTHONHASHSEED);
5. ``step()``: nothing to do unless ``scheduler.has_requests()`` (which stays
   True while finished requests are still to be reported to the workers);
   ``schedule()`` -> ``model_executor.execute_model(output)`` ->
   ``scheduler.update_from_output(output, model_output)``;
6. ``shutdown()``: the executor (worker connectors' ``shutdown``), then the
   scheduler (the scheduler connector's ``shutdown``).

Everything the scheduler (and its connector) does runs with this engine's
simulated process current: with the "mp" executor (TP > 1) no parallel group
is initialised there, as in vLLM's engine-core process; with "uni" (TP 1) the
worker shares it, groups and worker connector included, as in vLLM.

Stand-in additions: ``make_request``, ``run`` (steps until the given requests
finish and the scheduler has nothing left to report), ``tokens`` (output
tokens per request), ``kv_mismatches`` (positions whose KV, as attended to by
the model, differed from what the model computes: collected from the workers,
except for requests whose output the scheduler discarded after a KV load
failure), ``runner(rank)``.
"""

import itertools

from vllm._standin.process import SimulatedProcess
from vllm.config import set_current_vllm_config
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_hash_fn_by_name, get_kv_cache_configs, get_request_block_hasher, \
    init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.executor import Executor
from vllm.v1.request import Request


class EngineCore:
    def __init__(self, vllm_config, executor_class=Executor, log_stats: bool = False):
        self.vllm_config = vllm_config
        self.process = SimulatedProcess("engine-core")
        with self.process.active():  # a "uni" executor's worker lives in this process
            self.model_executor = executor_class(vllm_config)
            kv_cache_config = self._initialize_kv_caches(vllm_config)
        with self.process.active(), set_current_vllm_config(vllm_config):
            self.scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                                       block_size=vllm_config.cache_config.block_size, log_stats=log_stats)
            kv_connector = self.scheduler.get_kv_connector()
            self.request_block_hasher = None
            if vllm_config.cache_config.enable_prefix_caching or kv_connector is not None:
                hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
                init_none_hash(hash_fn)
                self.request_block_hasher = get_request_block_hasher(vllm_config.cache_config.block_size, hash_fn)
        self.kv_cache_config = kv_cache_config
        self.tokens: dict[str, list[int]] = {}
        self.finished: dict[str, object] = {}
        self.kv_mismatches: list = []
        self.steps = 0
        self._ids = itertools.count()

    def _initialize_kv_caches(self, vllm_config):
        specs = self.model_executor.get_kv_cache_specs()
        num_blocks = vllm_config.cache_config.num_gpu_blocks_override or 128
        kv_cache_configs = get_kv_cache_configs(vllm_config, specs, num_blocks)
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        self.model_executor.initialize_from_config(kv_cache_configs)
        return kv_cache_configs[0]

    # ---- requests ---------------------------------------------------------------------
    def make_request(self, prompt_token_ids, max_tokens: int = 8, request_id: str | None = None,
                     kv_transfer_params: dict | None = None) -> Request:
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        return Request(request_id or f"req-{next(self._ids)}", list(prompt_token_ids),
                       SamplingParams(max_tokens=max_tokens, extra_args=extra),
                       block_hasher=self.request_block_hasher)

    def add_request(self, request: Request) -> str:
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            self.scheduler.add_request(request)
        self.tokens.setdefault(request.request_id, [])
        return request.request_id

    # ---- stepping ---------------------------------------------------------------------
    def step(self):
        if not self.scheduler.has_requests():
            return {}
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            scheduler_output = self.scheduler.schedule()
        with self.process.active():
            model_output = self.model_executor.execute_model(scheduler_output)
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        skipped = self.scheduler.last_failed_kv_load_req_ids
        self.kv_mismatches += [m for m in model_output.standin_kv_mismatches if m["req_id"] not in skipped]
        for eco in outputs.values():
            for out in eco.outputs:
                self.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
                if out.finished:
                    self.finished[out.request_id] = out
        self.steps += 1
        return outputs

    def run(self, request_ids=None, max_steps: int = 500) -> dict[str, list[int]]:
        """Steps until `request_ids` (default: all) finished and nothing is left
        to report; returns the output tokens."""
        for _ in range(max_steps):
            if request_ids is None:
                if not self.scheduler.has_requests():
                    break
            else:
                pending = self.scheduler.finished_req_ids | set(self.scheduler.requests)
                if all(r in self.finished for r in request_ids) and not pending & set(request_ids):
                    break
            self.step()
        else:
            raise TimeoutError(f"stand-in engine: still busy after {max_steps} steps")
        ids = request_ids if request_ids is not None else list(self.tokens)
        return {r: self.tokens[r] for r in ids}

    def runner(self, rank: int = 0):
        return self.model_executor.workers[rank].model_runner

    def worker_connector(self, rank: int = 0):
        return self.model_executor.workers[rank].connector

    def abort_requests(self, request_ids) -> None:
        from vllm.v1.request import RequestStatus
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def shutdown(self) -> None:
        with self.process.active():
            self.model_executor.shutdown()
            self.scheduler.shutdown()
