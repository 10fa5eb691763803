"""Stand-in of ``vllm/v1/executor/abstract.py`` / ``multiproc_executor.py``
(``Executor``; not read: the calls the engine core copies of
vllm/v1/engine/core.py, index 53122058033, make): the TP workers of one
engine, run one after the other in this process.

Facts relied on: the executor builds ``world_size`` workers (``init_device``,
``load_model``), collects ``get_kv_cache_spec`` from each, runs
``initialize_from_config`` on each, and per step runs ``execute_model`` on
every worker and returns the output of the output rank with the workers'
``kv_connector_output`` combined by ``KVOutputAggregator`` (expected count: the
world size, or the worker connector's ``get_finished_count()``). ``shutdown``
shuts the workers down.

``parallel_config.distributed_executor_backend``: "uni" (world size 1, the
default there) runs the worker in the current process, the engine core's, and
hands it the SchedulerOutput object itself; "mp" gives each worker a process
and sends the SchedulerOutput and the outputs through pickle, as vLLM's
multiprocess executor serializes them (so connector metadata must pickle).

Stand-in: the "all-reduce" of TP happens here: the executor combines the
workers' digests into the sampled token (vllm._standin.toy_model) and gives it
back to every worker, as every TP rank samples the same token. Workers run
sequentially, so a connector that needs its TP peers to act concurrently
(e.g. a collective inside a connector call) would block; kvmesh's does not.
"""

import pickle

from vllm._standin import process as _process
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.v1.worker.gpu_worker import Worker


def _wire(obj):
    return pickle.loads(pickle.dumps(obj))


class Executor:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        world = vllm_config.parallel_config.world_size
        self.uni = vllm_config.parallel_config.distributed_executor_backend == "uni"
        if self.uni:
            self.workers = [Worker(vllm_config, local_rank=0, rank=0, process=_process.current())]
        else:
            self.workers = [Worker(vllm_config, local_rank=r, rank=r) for r in range(world)]
        for w in self.workers:
            w.init_device()
            w.load_model()
        self.kv_output_aggregator: KVOutputAggregator | None = None

    def get_kv_cache_specs(self) -> list[dict]:
        return [w.get_kv_cache_spec() for w in self.workers]

    def initialize_from_config(self, kv_cache_configs) -> None:
        for w, cfg in zip(self.workers, kv_cache_configs):
            w.initialize_cache(cfg.num_blocks)
            w.initialize_from_config(cfg)
        self.kv_output_aggregator = KVOutputAggregator.from_connector(self.workers[0].connector, len(self.workers))

    def execute_model(self, scheduler_output):
        if self.uni:
            outputs = [self.workers[0].execute_model(scheduler_output)]
        else:
            outputs = [_wire(w.execute_model(_wire(scheduler_output))) for w in self.workers]
        out = outputs[0]
        toy = self.workers[0].model_runner.toy
        mismatches = [m for o in outputs for m in o.standin_kv_mismatches]
        for i, req_id in enumerate(out.req_ids):
            if req_id in out.standin_last_prefix_hash:
                token = toy.sample(out.standin_last_prefix_hash[req_id],
                                   self._all_reduce(req_id, [o.standin_digests[req_id] for o in outputs],
                                                    mismatches))
                out.sampled_token_ids[i] = [token]
                for w in self.workers:
                    w.record_sampled(req_id, token)
        if any(o.kv_connector_output is not None for o in outputs):
            out = self.kv_output_aggregator.aggregate(outputs, output_rank=0)
        out.standin_kv_mismatches = mismatches
        return out

    def _all_reduce(self, req_id, rank_digests, mismatches) -> list[bytes]:
        """Per layer, the (layer, kv head) digests in global head order: the
        ranks' heads side by side, or for MLA the one replicated latent (every
        rank must hold the same bytes)."""
        combined = []
        mla = self.workers[0].model_runner.use_mla
        for layer, per_rank in enumerate(zip(*rank_digests)):
            if mla:
                if any(d != per_rank[0] for d in per_rank):
                    mismatches.append({"req_id": req_id, "layer": layer, "rank": "all",
                                       "positions": [], "num_bad": -1, "block_ids": [],
                                       "what": "MLA ranks attended to different latents"})
                combined += per_rank[0]
            else:
                for d in per_rank:
                    combined += d
        return combined

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()
