"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/utils.py`` (the
pre-#51718 layout helper, the TP output aggregator, ``yield_req_data``,
``copy_kv_blocks``).

Facts relied on:
* ``get_kv_connector_cache_layout()`` (index 51881811174, 310466897; facts
  §2c): with a kv_transfer_config in ``get_current_vllm_config()``, the
  connector *class* (``KVConnectorFactory.get_connector_class``) is asked
  ``get_required_kvcache_layout(vllm_config)``; its answer if not None, else
  "NHD" (logged); "NHD" without a kv_transfer_config.
* ``KVOutputAggregator(expected_finished_count)``: per request id, counts
  ``finished_sending`` / ``finished_recving`` reports across workers and
  releases the id once every expected worker (the world size, or the
  connector's ``get_finished_count()``) reported it; unions
  ``invalid_block_ids``; aggregates stats and worker metadata with their
  ``aggregate``; returns the output of ``output_rank`` carrying the result
  (index 68717383190, citing upstream utils.py).
* ``yield_req_data(scheduler_output)`` yields ``(req_id, block_ids, resumed)``:
  new requests with their full ``block_ids`` and False, then the cached
  requests' ``(req_id, new_block_ids[i], req_id in resumed_req_ids)``
  (index 12306796842).
* ``copy_kv_blocks(src, dst, src_ids, dst_ids, direction)`` is what the model
  runner passes to ``set_host_xfer_buffer_ops`` (facts §6c).
"""

from collections import defaultdict
from collections.abc import Iterator

import torch

from vllm.logger import init_logger

logger = init_logger(__name__)


def get_kv_connector_cache_layout() -> str:
    from vllm.config import get_current_vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    vllm_config = get_current_vllm_config()
    kv_config = vllm_config.kv_transfer_config
    if kv_config is not None:
        connector_cls = KVConnectorFactory.get_connector_class(kv_config)
        layout = connector_cls.get_required_kvcache_layout(vllm_config)
        if layout is not None:
            return layout
        logger.info("Connectors do not specify a kv cache layout, defaulting to NHD.")
    return "NHD"


class KVOutputAggregator:
    def __init__(self, expected_finished_count: int):
        self._expected_finished_count = expected_finished_count
        self._recv_remaining_count: dict[str, int] = defaultdict(lambda: expected_finished_count)
        self._send_remaining_count: dict[str, int] = defaultdict(lambda: expected_finished_count)

    @classmethod
    def from_connector(cls, connector, world_size: int) -> "KVOutputAggregator":
        count = connector.get_finished_count() if connector is not None else None
        return cls(count if count is not None else world_size)

    def aggregate(self, outputs, output_rank: int = 0):
        from vllm.v1.outputs import KVConnectorOutput

        def update(req_ids, remaining, finished):
            for req_id in req_ids or ():
                remaining[req_id] -= 1
                if remaining[req_id] == 0:
                    finished.add(req_id)
                    del remaining[req_id]

        finished_sending, finished_recving, invalid = set(), set(), set()
        stats = events = worker_meta = None
        for out in outputs:
            kv = out.kv_connector_output if out is not None else None
            if kv is None:
                continue
            update(kv.finished_sending, self._send_remaining_count, finished_sending)
            update(kv.finished_recving, self._recv_remaining_count, finished_recving)
            invalid |= set(kv.invalid_block_ids or ())
            if kv.kv_connector_stats is not None:
                stats = kv.kv_connector_stats if stats is None else stats.aggregate(kv.kv_connector_stats)
            if kv.kv_cache_events is not None:
                events = kv.kv_cache_events if events is None else events.aggregate(kv.kv_cache_events)
            if kv.kv_connector_worker_meta is not None:
                worker_meta = (kv.kv_connector_worker_meta if worker_meta is None
                               else worker_meta.aggregate(kv.kv_connector_worker_meta))
        output = outputs[output_rank]
        output.kv_connector_output = KVConnectorOutput(
            finished_sending=finished_sending or None, finished_recving=finished_recving or None,
            kv_connector_stats=stats, kv_cache_events=events, kv_connector_worker_meta=worker_meta,
            invalid_block_ids=invalid, expected_finished_count=self._expected_finished_count)
        return output


def yield_req_data(scheduler_output) -> Iterator[tuple[str, tuple[list[int], ...] | None, bool]]:
    for req in scheduler_output.scheduled_new_reqs:
        yield req.req_id, req.block_ids, False
    cached = scheduler_output.scheduled_cached_reqs
    yield from zip(cached.req_ids, cached.new_block_ids,
                   (req_id in cached.resumed_req_ids for req_id in cached.req_ids))


def copy_kv_blocks(src_kv_caches, dst_kv_caches, src_block_ids, dst_block_ids, direction) -> None:
    """Copies blocks between two sets of per-layer caches (dim 0 = blocks for
    blocks-first layouts, dim 1 for the legacy (2, num_blocks, ...) one)."""
    for name, src in src_kv_caches.items():
        dst = dst_kv_caches[name]
        dim = 1 if (src.dim() == 5 and src.shape[0] == 2) else 0
        idx_s = src.new_tensor(src_block_ids, dtype=torch.long)
        idx_d = dst.new_tensor(dst_block_ids, dtype=torch.long)
        dst.index_copy_(dim, idx_d, src.index_select(dim, idx_s))
