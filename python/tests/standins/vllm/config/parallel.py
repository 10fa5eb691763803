"""Stand-in of ``vllm/config/parallel.py`` (``ParallelConfig``), minimal. Not
read upstream: the fields scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06
reads, plus ``rank``.

Facts relied on: ``tensor_parallel_size``, ``pipeline_parallel_size``,
``rank`` (a worker's global rank; each worker process has its own copy of the
VllmConfig with its rank), ``world_size`` = tp * pp,
``decode_context_parallel_size`` / ``prefill_context_parallel_size`` (read by
the scheduler; 1 here), ``data_parallel_index`` (the event publisher),
``distributed_executor_backend``: None becomes "uni" for a world size of 1
(the worker runs inside the engine-core process: its parallel groups and
connector agent are that process's) and "mp" otherwise (one process per
worker; the SchedulerOutput and the workers' outputs are serialized), as
``ParallelConfig.__post_init__`` defaults it (copies of vllm/config/parallel.py,
index 52288803334 and 56415986793; not read at 003df29).
Pipeline parallelism > 1 is not modelled.
"""

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rank: int = 0
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    data_parallel_index: int = 0
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    distributed_executor_backend: str | None = None

    def __post_init__(self):
        if self.pipeline_parallel_size != 1:
            raise NotImplementedError("stand-in: pipeline parallelism is not modelled")
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uni" if self.world_size == 1 else "mp"
        if self.distributed_executor_backend not in ("uni", "mp"):
            raise NotImplementedError(f"stand-in: executor backend {self.distributed_executor_backend!r}")
        if self.distributed_executor_backend == "uni" and self.world_size != 1:
            raise ValueError("the uni executor runs one worker")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size
