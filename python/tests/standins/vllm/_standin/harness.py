"""Test helpers of the stand-in (not an upstream module): engine variants
(attention backend, KV layout, MLA, hybrid full + sliding-window), config
building, and the byte-for-byte check of a request's paged KV against what the
toy model computes.

A case names the backend and the layout to force through
``VLLM_KV_CACHE_LAYOUT`` (None: leave the layout to the connector's
``get_required_kvcache_layout``, else NHD); the test sets the environment.
"""

from dataclasses import dataclass, field

import torch

from vllm.config import (AttentionConfig, CacheConfig, CompilationConfig, CUDAGraphMode, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig)


@dataclass(frozen=True)
class Case:
    name: str
    backend: str
    layout: str | None
    model: dict = field(default_factory=dict)

    @property
    def hybrid(self) -> bool:
        return "sliding_attention" in self.model.get("layer_types", ())

    @property
    def mla(self) -> bool:
        return bool(self.model.get("use_mla"))


HYBRID_LAYERS = ("full_attention", "sliding_attention", "full_attention", "sliding_attention")

CASES = {c.name: c for c in [
    Case("fa-NHD", "FLASH_ATTN", "NHD"),
    Case("fa-HND", "FLASH_ATTN", "HND"),
    Case("packed-NHD", "FLASH_ATTN_PACKED", "NHD"),
    Case("packed-HND", "FLASH_ATTN_PACKED", "HND"),
    Case("flashinfer-HND", "FLASHINFER", "HND"),
    Case("mla", "FLASHMLA", None, {"use_mla": True}),
    Case("hybrid", "FLASH_ATTN", "NHD", {"layer_types": HYBRID_LAYERS, "sliding_window": 32}),
    Case("hybrid-packed-HND", "FLASH_ATTN_PACKED", "HND", {"layer_types": HYBRID_LAYERS, "sliding_window": 32}),
]}


def make_vllm_config(case: Case, kv_transfer_config=None, *, tp: int = 1, enable_prefix_caching: bool = False,
                     num_blocks: int = 96, disable_hybrid_kv_cache_manager=None,
                     cudagraph_mode: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE,
                     max_num_batched_tokens: int = 2048, block_size: int = 16,
                     executor_backend: str | None = None) -> VllmConfig:
    return VllmConfig(
        model_config=ModelConfig(**case.model),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                                 num_gpu_blocks_override=num_blocks),
        parallel_config=ParallelConfig(tensor_parallel_size=tp, distributed_executor_backend=executor_backend),
        scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
                                         max_num_batched_tokens=max_num_batched_tokens),
        compilation_config=CompilationConfig(cudagraph_mode=cudagraph_mode),
        attention_config=AttentionConfig(backend=case.backend),
        kv_transfer_config=kv_transfer_config)


def group_windows(engine) -> list:
    return [getattr(g.kv_cache_spec, "sliding_window", None) if type(g.kv_cache_spec).__name__ == "SlidingWindowSpec"
            else None for g in engine.kv_cache_config.kv_cache_groups]


def check_request_blocks(engine, token_ids: list[int], block_ids: tuple, block_indices) -> list[str]:
    """Compares, on every TP rank and every layer, blocks `block_indices` of a
    request (block table `block_ids`, one list per group) with what that rank's
    model computes for `token_ids`; block-table entries 0 (the null block: out
    of a sliding window) are skipped. Returns the differences."""
    bad = []
    for rank, worker in enumerate(engine.model_executor.workers):
        runner = worker.model_runner
        for name in runner.layer_names:
            g = runner.layer_group[name]
            for j in block_indices:
                if j >= len(block_ids[g]) or block_ids[g][j] == 0:
                    continue
                got = runner.read_block(name, block_ids[g][j])
                want = runner.expected_block(name, token_ids, j)
                if not torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8)):
                    bad.append(f"rank {rank} {name} block #{j} (id {block_ids[g][j]})")
    return bad


def admitted_block_ids(engine, req_id: str, nth: int = 0) -> tuple:
    """The block table the scheduler passed to update_state_after_alloc at the
    request's nth admission."""
    return engine.scheduler.calls("update_state_after_alloc", req_id)[nth].args["block_ids"]
