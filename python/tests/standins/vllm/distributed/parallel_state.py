"""Stand-in of ``vllm/distributed/parallel_state.py``: the group accessors a
KV connector calls.

Facts relied on: vLLM keeps per process ``_TP`` / ``_PP`` / ``_WORLD``
``GroupCoordinator``s; ``get_tp_group()`` / ``get_pp_group()`` /
``get_world_group()`` assert they are initialised (AssertionError "tensor
model parallel group is not initialized", "pipeline model parallel group is
not initialized", "world group is not initialized");
``get_tensor_model_parallel_rank()`` = ``get_tp_group().rank_in_group``;
``get_tensor_model_parallel_world_size()`` = ``get_tp_group().world_size``;
a GroupCoordinator exposes ``rank`` (global), ``ranks``, ``world_size``,
``rank_in_group``, ``local_rank``, ``is_first_rank``, ``is_last_rank``.
The engine-core process (scheduler, scheduler-side connector) initialises no
group, so calling these there raises.

Here "per process" is per simulated process (vllm._standin.process): a worker
makes its process current before it calls its connector.
"""

from dataclasses import dataclass

from vllm._standin import process as _process

__all__ = ["GroupCoordinator", "get_tp_group", "get_pp_group", "get_world_group",
           "get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size",
           "get_pipeline_model_parallel_rank", "get_pipeline_model_parallel_world_size",
           "model_parallel_is_initialized"]


@dataclass
class GroupCoordinator:
    unique_name: str
    ranks: list
    rank: int
    local_rank: int = 0

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def rank_in_group(self) -> int:
        return self.ranks.index(self.rank)

    @property
    def is_first_rank(self) -> bool:
        return self.rank == self.ranks[0]

    @property
    def is_last_rank(self) -> bool:
        return self.rank == self.ranks[-1]


def init_worker_groups(proc, rank: int, tp_size: int, pp_size: int = 1) -> None:
    """What ``init_distributed_environment`` + ``initialize_model_parallel`` leave
    in a worker process (stand-in helper)."""
    assert pp_size == 1
    world = list(range(tp_size * pp_size))
    proc.world_group = GroupCoordinator("world", world, rank, local_rank=rank)
    proc.tp_group = GroupCoordinator("tp", world, rank, local_rank=rank)
    proc.pp_group = GroupCoordinator("pp", [rank], rank, local_rank=rank)


def get_world_group() -> GroupCoordinator:
    g = _process.current().world_group
    assert g is not None, "world group is not initialized"
    return g


def get_tp_group() -> GroupCoordinator:
    g = _process.current().tp_group
    assert g is not None, "tensor model parallel group is not initialized"
    return g


def get_pp_group() -> GroupCoordinator:
    g = _process.current().pp_group
    assert g is not None, "pipeline model parallel group is not initialized"
    return g


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def get_pipeline_model_parallel_world_size() -> int:
    return get_pp_group().world_size


def get_pipeline_model_parallel_rank() -> int:
    return get_pp_group().rank_in_group


def model_parallel_is_initialized() -> bool:
    p = _process.current()
    return p.tp_group is not None and p.pp_group is not None
