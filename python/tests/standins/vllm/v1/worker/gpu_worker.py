"""Stand-in of ``vllm/v1/worker/gpu_worker.py`` (``Worker``; not read: facts
§2c and §10), one per TP rank, each in its own simulated process
(vllm._standin.process).

Facts relied on: ``init_device`` sets up the distributed groups (here: the
process's TP/PP groups); ``load_model``; ``get_kv_cache_spec``;
``initialize_cache(num_gpu_blocks, num_cpu_blocks)``;
``initialize_from_config(kv_cache_config)`` calls
**``ensure_kv_transfer_initialized(vllm_config, kv_cache_config)``** (the worker
connector, role WORKER, created through the factory) **before**
``model_runner.initialize_kv_cache(kv_cache_config)`` (which registers the
caches) (facts §2c, secondary 62696865526, 62452386562); ``execute_model``;
``shutdown`` -> ``ensure_kv_transfer_shutdown()`` (the connector's
``shutdown``). A worker in its own process (executor "mp") has its own copy of
the VllmConfig with ``parallel_config.rank`` set; the "uni" executor's worker
shares the engine core's process and config object.
"""

import copy

from vllm._standin.process import SimulatedProcess
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer import (ensure_kv_transfer_initialized, ensure_kv_transfer_shutdown,
                                          get_kv_transfer_group, has_kv_transfer_group)
from vllm.distributed.parallel_state import init_worker_groups

from .gpu_model_runner import GPUModelRunner


class Worker:
    def __init__(self, vllm_config, local_rank: int, rank: int, process: SimulatedProcess | None = None):
        if process is None:  # a process of its own: its own (deserialized) config
            self.vllm_config = copy.deepcopy(vllm_config)
            self.vllm_config.parallel_config.rank = rank
            self.vllm_config.compilation_config.static_forward_context = {}
            process = SimulatedProcess(f"worker-rank{rank}")
        else:
            self.vllm_config = vllm_config
        self.local_rank = local_rank
        self.rank = rank
        self.process = process
        self.model_runner: GPUModelRunner | None = None

    @property
    def connector(self):
        with self.process.active():
            return get_kv_transfer_group() if has_kv_transfer_group() else None

    def init_device(self) -> None:
        pc = self.vllm_config.parallel_config
        init_worker_groups(self.process, self.rank, pc.tensor_parallel_size, pc.pipeline_parallel_size)

    def load_model(self) -> None:
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            self.model_runner = GPUModelRunner(self.vllm_config)
            self.model_runner.load_model()

    def get_kv_cache_spec(self) -> dict:
        return self.model_runner.get_kv_cache_spec()

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int = 0) -> None:
        self.vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        self.vllm_config.cache_config.num_cpu_blocks = num_cpu_blocks

    def initialize_from_config(self, kv_cache_config) -> None:
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            ensure_kv_transfer_initialized(self.vllm_config, kv_cache_config)
            self.model_runner.connector_calls.append(("created", has_kv_transfer_group()))
            self.model_runner.initialize_kv_cache(kv_cache_config)

    def execute_model(self, scheduler_output):
        with self.process.active(), set_current_vllm_config(self.vllm_config):
            return self.model_runner.execute_model(scheduler_output)

    def record_sampled(self, req_id: str, token: int) -> None:
        self.model_runner.record_sampled(req_id, token)

    def shutdown(self) -> None:
        with self.process.active():
            ensure_kv_transfer_shutdown()
