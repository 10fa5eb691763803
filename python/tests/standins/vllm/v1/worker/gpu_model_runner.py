"""Stand-in of ``vllm/v1/worker/gpu_model_runner.py`` (the v1 runner) running
the toy model (vllm._standin.toy_model) on CPU tensors.

Facts relied on:
* ``initialize_kv_cache(kv_cache_config)`` (facts §6c; index 66954386885):
  allocate the tensors (``initialize_kv_cache_tensors``), bind each to its
  attention layer (``layer.kv_cache``), then, with a connector: cross-layer
  buffer -> ``register_cross_layers_kv_cache(buffer, attn_backend)``, else
  **``register_kv_caches({layer_name: tensor})``** with every layer of every
  group (layers of different groups alias the same memory in a hybrid model);
  then always ``set_host_xfer_buffer_ops(copy_kv_blocks)``.
* ``_reshape_kv_cache_tensors`` (facts §7a): one zeroed int8 buffer per
  KVCacheTensor; per layer ``num_blocks = raw.numel() // page_size_bytes``;
  ``shape = backend.get_kv_cache_shape(num_blocks, block_size, heads,
  head_size)``; ``order = backend.get_kv_cache_stride_order()`` (identity on
  NotImplementedError); the layer tensor is
  ``raw.view(dtype).view([shape[i] for i in order]).permute(*inverse(order))``:
  the logical shape with the physical strides (non-contiguous under HND for the
  5-D layout, under NHD for the packed 4-D one).
* The layout comes from ``get_kv_cache_layout()`` (env, then the connector
  class's ``get_required_kvcache_layout``, else NHD), resolved in the worker
  inside ``set_current_vllm_config`` (facts §10, step 2, pre-refactor).
* Cross-layer blocks (facts §6a): only with a connector whose
  ``prefer_cross_layer_blocks`` is True, one group, one backend whose
  ``get_kv_cache_stride_order(include_num_layers_dimension=True)`` exists and
  does not start with 0; one buffer of the permuted ``(num_layers,) + shape``.
* ``execute_model`` order (facts §6a, v1 runner): with a connector and
  metadata, **``handle_preemptions(scheduler_output.kv_connector_metadata)``**
  first; ``_update_states`` (drop finished requests; add new ones with their
  full ``block_ids``; for cached ones set ``num_computed_tokens``, align the
  cached output tokens with ``num_output_tokens`` (they were discarded after a
  sync KV load failure, index 56146267153), **replace** the block ids when
  resumed, else append ``new_block_ids``; take ``all_token_ids`` when sent);
  no scheduled tokens -> ``kv_connector_no_forward``; else the forward inside
  ``set_forward_context(attn_metadata, vllm_config)`` and the connector
  context (kv_connector_model_runner_mixin.py); per layer the hook, attention
  writing this step's K/V through the slot mapping.
* MLA (facts §7a): one latent per token, the same on every TP rank; the
  per-layer metadata is an ``MLACommonMetadata``.
* Sliding-window layers attend to the last ``sliding_window`` positions of
  each query; block-table entries 0 (the null block) are never read.

Stand-in additions: the toy model writes deterministic K/V and, per request
that samples this step, a digest of the KV the last position attends to
(``standin_digests``); every position any query of the step reads is checked
against the model's own values (``standin_kv_mismatches``).
"""

import hashlib
from dataclasses import dataclass, field

import torch

from vllm._standin.toy_model import ToyModel, extend_prefix_hashes
from vllm.config import set_current_vllm_config
from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.attention import Attention, MLAAttention, MLACommonMetadata
from vllm.v1.attention.backend import AttentionMetadata
from vllm.v1.attention.backends import get_backend_class
from vllm.v1.attention.backends.utils import get_kv_cache_layout
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
from vllm.v1.outputs import ModelRunnerOutput

from .kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin


@dataclass
class CachedRequestState:
    req_id: str
    num_prompt_tokens: int
    token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    prefix_hashes: list[int] = field(default_factory=list)


@dataclass
class _ReqPlan:
    req_id: str
    start: int
    end: int
    samples: bool
    # per group: (block index tensor, offset tensor) of positions [start, end)
    write_slots: list


def _inverse(order):
    return [order.index(i) for i in range(len(order))]


class GPUModelRunner(KVConnectorModelRunnerMixin):
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.parallel_config = vllm_config.parallel_config
        self.block_size = self.cache_config.block_size
        self.tp_size = self.parallel_config.tensor_parallel_size
        self.tp_rank = self.parallel_config.rank
        self.dtype = self.model_config.torch_dtype
        self.use_mla = self.model_config.use_mla
        self.num_kv_heads = self.model_config.get_num_kv_heads(self.parallel_config)
        self.head_size = self.model_config.get_head_size()
        if self.use_mla:
            self.heads = slice(0, 1)
        else:
            assert self.model_config.num_kv_heads % self.tp_size == 0
            self.heads = slice(self.tp_rank * self.num_kv_heads, (self.tp_rank + 1) * self.num_kv_heads)
        name = vllm_config.attention_config.backend or ("FLASHMLA" if self.use_mla else "FLASH_ATTN")
        if self.use_mla != (name == "FLASHMLA"):
            raise ValueError(f"backend {name} does not fit use_mla={self.use_mla}")
        self.attn_backend = get_backend_class(name)
        self.toy = ToyModel.from_model_config(self.model_config)
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(self.model_config.num_layers)]
        self.windows = {n: (self.model_config.sliding_window if t == "sliding_attention" else None)
                        for n, t in zip(self.layer_names, self.model_config.layer_types)}
        self.layers: dict[str, Attention] = {}
        self.requests: dict[str, CachedRequestState] = {}
        self.kv_caches: dict[str, torch.Tensor] = {}
        self.kv_cache_config = None
        self.kv_cache_layout: str | None = None
        self.layer_group: dict[str, int] = {}
        self.cross_layers_kv_cache = None
        self.connector_calls: list = []

    # ---- model ------------------------------------------------------------------
    def load_model(self) -> None:
        ctx = self.vllm_config.compilation_config.static_forward_context
        for name in self.layer_names:
            if self.use_mla:
                layer = MLAAttention(layer_name=name, num_kv_heads=1, head_size=self.head_size,
                                     attn_backend=self.attn_backend, kv_lora_rank=self.model_config.kv_lora_rank,
                                     qk_rope_head_dim=self.model_config.qk_rope_head_dim)
            else:
                layer = Attention(layer_name=name, num_kv_heads=self.num_kv_heads, head_size=self.head_size,
                                  attn_backend=self.attn_backend, sliding_window=self.windows[name])
            self.layers[name] = layer
            ctx[name] = layer

    def get_kv_cache_spec(self) -> dict:
        specs = {}
        for name in self.layer_names:
            if self.use_mla:
                specs[name] = MLAAttentionSpec(block_size=self.block_size, num_kv_heads=1, head_size=self.head_size,
                                               dtype=self.dtype, cache_dtype_str=self.cache_config.cache_dtype)
            elif self.windows[name]:
                specs[name] = SlidingWindowSpec(block_size=self.block_size, num_kv_heads=self.num_kv_heads,
                                                head_size=self.head_size, dtype=self.dtype,
                                                sliding_window=self.windows[name])
            else:
                specs[name] = FullAttentionSpec(block_size=self.block_size, num_kv_heads=self.num_kv_heads,
                                                head_size=self.head_size, dtype=self.dtype)
        return specs

    # ---- KV cache -------------------------------------------------------------------
    def initialize_kv_cache(self, kv_cache_config) -> None:
        self.kv_cache_config = kv_cache_config
        for gid, g in enumerate(kv_cache_config.kv_cache_groups):
            for name in g.layer_names:
                self.layer_group[name] = gid
        with set_current_vllm_config(self.vllm_config):
            self.kv_cache_layout = None if self.use_mla else get_kv_cache_layout()
            kv_caches = self.initialize_kv_cache_tensors(kv_cache_config)
        for name, t in kv_caches.items():
            self.layers[name].kv_cache = t
        self.kv_caches = kv_caches
        if has_kv_transfer_group():
            connector = get_kv_transfer_group()
            if self.cross_layers_kv_cache is not None:
                connector.register_cross_layers_kv_cache(self.cross_layers_kv_cache, self.attn_backend)
                self._wlog("register_cross_layers_kv_cache")
            else:
                connector.register_kv_caches(kv_caches)
                self._wlog("register_kv_caches", sorted(kv_caches))
            connector.set_host_xfer_buffer_ops(copy_kv_blocks)
            self._wlog("set_host_xfer_buffer_ops")

    def _use_uniform_kv_cache(self, kv_cache_config) -> bool:
        if not has_kv_transfer_group() or not get_kv_transfer_group().prefer_cross_layer_blocks:
            return False
        if len(kv_cache_config.kv_cache_groups) != 1:
            return False
        try:
            order = self.attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True)
        except NotImplementedError:
            return False
        shape = self.attn_backend.get_kv_cache_shape(1, self.block_size, self.num_kv_heads, self.head_size)
        return len(order) == len(shape) + 1 and order[0] != 0

    def initialize_kv_cache_tensors(self, kv_cache_config) -> dict[str, torch.Tensor]:
        spec_of = {n: g.kv_cache_spec for g in kv_cache_config.kv_cache_groups for n in g.layer_names}
        heads = 1 if self.use_mla else self.num_kv_heads
        if self._use_uniform_kv_cache(kv_cache_config):
            names = kv_cache_config.kv_cache_groups[0].layer_names
            num_blocks = kv_cache_config.num_blocks
            shape = (len(names),) + tuple(self.attn_backend.get_kv_cache_shape(
                num_blocks, self.block_size, heads, self.head_size, self.cache_config.cache_dtype))
            order = self.attn_backend.get_kv_cache_stride_order(include_num_layers_dimension=True)
            raw = torch.zeros([shape[i] for i in order], dtype=self.dtype)
            self.cross_layers_kv_cache = raw.permute(*_inverse(order))
            return {n: self.cross_layers_kv_cache[i] for i, n in enumerate(names)}
        out = {}
        for tensor in kv_cache_config.kv_cache_tensors:
            raw = torch.zeros(tensor.size, dtype=torch.int8)
            for name in tensor.shared_by:
                spec = spec_of[name]
                num_blocks = raw.numel() // spec.page_size_bytes
                shape = tuple(self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, heads,
                                                                   self.head_size, self.cache_config.cache_dtype))
                try:
                    order = tuple(self.attn_backend.get_kv_cache_stride_order())
                except NotImplementedError:
                    order = tuple(range(len(shape)))
                physical = [shape[i] for i in order]
                view = raw[:num_blocks * spec.page_size_bytes].view(self.dtype).view(physical)
                out[name] = view.permute(*_inverse(order))
        return {n: out[n] for n in self.layer_names if n in out}

    # ---- steps ----------------------------------------------------------------------
    def _update_states(self, so) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids)
            self.requests[new.req_id] = CachedRequestState(
                new.req_id, len(tokens), tokens, tuple(list(g) for g in new.block_ids), new.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self.requests[req_id]
            st.num_computed_tokens = cached.num_computed_tokens[i]
            if req_id in cached.all_token_ids:
                st.token_ids = list(cached.all_token_ids[req_id])
                st.prefix_hashes = []
            num_output = cached.num_output_tokens[i]
            if num_output < len(st.token_ids) - st.num_prompt_tokens:
                del st.token_ids[st.num_prompt_tokens + num_output:]
                del st.prefix_hashes[st.num_prompt_tokens + num_output:]
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = tuple(list(g) for g in new_ids)
            elif new_ids is not None:
                for g, ids in enumerate(new_ids):
                    st.block_ids[g].extend(ids)

    def _slots(self, st: CachedRequestState, group: int, start: int, end: int):
        table = st.block_ids[group]
        pos = range(start, end)
        blk = [table[p // self.block_size] for p in pos]
        assert all(b != 0 for b in blk), (
            f"stand-in: {st.req_id} positions [{start}, {end}) of group {group} map to the null block: {table}")
        return (torch.tensor(blk, dtype=torch.long),
                torch.tensor([p % self.block_size for p in pos], dtype=torch.long))

    def _prepare_inputs(self, so):
        plans: list[_ReqPlan] = []
        groups = len(self.kv_cache_config.kv_cache_groups)
        for req_id, n in so.num_scheduled_tokens.items():
            st = self.requests[req_id]
            start, end = st.num_computed_tokens, st.num_computed_tokens + n
            assert end <= len(st.token_ids), (req_id, start, end, len(st.token_ids))
            extend_prefix_hashes(st.prefix_hashes, st.token_ids[:end], 0)
            plans.append(_ReqPlan(req_id, start, end, end == len(st.token_ids),
                                  [self._slots(st, g, start, end) for g in range(groups)]))
        md_cls = MLACommonMetadata if self.use_mla else AttentionMetadata
        per_group = []
        for g in range(groups):
            slot = [blk * self.block_size + off for p in plans for blk, off in [p.write_slots[g]]]
            tables = [self.requests[p.req_id].block_ids[g] for p in plans]
            width = max((len(t) for t in tables), default=0)
            per_group.append(md_cls(
                num_actual_tokens=sum(p.end - p.start for p in plans),
                slot_mapping=torch.cat(slot) if slot else torch.empty(0, dtype=torch.long),
                block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
                seq_lens=torch.tensor([p.end for p in plans], dtype=torch.int32),
                query_start_loc=torch.tensor([0] + list(torch.cumsum(torch.tensor(
                    [p.end - p.start for p in plans]), 0).tolist()), dtype=torch.int32),
                max_query_len=max((p.end - p.start for p in plans), default=0)))
        attn_metadata = {name: per_group[self.layer_group[name]] for name in self.layer_names}
        return plans, attn_metadata

    def _attention(self, layer_idx: int, name: str, plans, digests, mismatches) -> None:
        kv = self.layers[name].kv_cache
        g = self.layer_group[name]
        window = self.windows[name]
        backend = self.attn_backend
        for p in plans:
            st = self.requests[p.req_id]
            blk, off = p.write_slots[g]
            backend.standin_write(kv, blk, off, self.toy.kv(st.prefix_hashes[p.start:p.end], layer_idx, self.heads))
            # What the step's queries read: [lo, end) (a window per query for sliding layers).
            lo = 0 if window is None else max(0, p.start - window + 1)
            rblk, roff = self._slots(st, g, lo, p.end)
            got = backend.standin_read(kv, rblk, roff)
            want = self.toy.kv(st.prefix_hashes[lo:p.end], layer_idx, self.heads)
            bad = (got.contiguous().view(torch.uint8).reshape(got.shape[0], -1)
                   != want.contiguous().view(torch.uint8).reshape(want.shape[0], -1)).any(dim=1)
            if bool(bad.any()):
                pos = [lo + i for i in torch.nonzero(bad).flatten().tolist()]
                mismatches.append({"req_id": p.req_id, "layer": name, "rank": self.tp_rank,
                                   "positions": pos[:8], "num_bad": len(pos),
                                   "block_ids": sorted({st.block_ids[g][q // self.block_size] for q in pos})})
            if p.samples:
                # What the last position attends to, one digest per (layer, kv head).
                d_lo = 0 if window is None else max(0, p.end - window)
                seen = got[d_lo - lo:p.end - lo]
                per_head = [seen] if self.use_mla else [seen[:, h] for h in range(seen.shape[1])]
                digests.setdefault(p.req_id, []).append(
                    [hashlib.blake2b(x.contiguous().view(torch.uint8).numpy().tobytes(), digest_size=16).digest()
                     for x in per_head])

    def execute_model(self, so) -> ModelRunnerOutput:
        connector = get_kv_transfer_group() if has_kv_transfer_group() else None
        if connector is not None and so.kv_connector_metadata is not None:
            connector.handle_preemptions(so.kv_connector_metadata)
            self._wlog("handle_preemptions", set(so.preempted_req_ids or ()))
        self._update_states(so)
        if not so.total_num_scheduled_tokens:
            if connector is None:
                return ModelRunnerOutput()
            return self.kv_connector_no_forward(so, self.vllm_config)
        plans, attn_metadata = self._prepare_inputs(so)
        digests: dict = {}
        mismatches: list = []
        with set_forward_context(attn_metadata, self.vllm_config):
            with self.maybe_get_kv_connector_output(so) as kv_connector_output:
                for i, name in enumerate(self.layer_names):
                    self.maybe_transfer_kv_layer(name, self._attention, i, name, plans, digests, mismatches)
        req_ids = [p.req_id for p in plans]
        return ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[] for _ in req_ids], kv_connector_output=kv_connector_output,
            standin_digests=digests,
            standin_last_prefix_hash={p.req_id: self.requests[p.req_id].prefix_hashes[p.end - 1]
                                      for p in plans if p.samples},
            standin_kv_mismatches=mismatches)

    def record_sampled(self, req_id: str, token: int) -> None:
        """The runner caches the token it sampled (v1 runner)."""
        self.requests[req_id].token_ids.append(token)

    # ---- test helpers (stand-in) ---------------------------------------------------
    def read_block(self, layer_name: str, block_id: int) -> torch.Tensor:
        """Block `block_id` of a layer in logical (block_size, heads, 2, head) order
        ((block_size, latent) for MLA)."""
        return self.attn_backend.standin_block(self.kv_caches[layer_name], block_id)

    def expected_block(self, layer_name: str, token_ids: list[int], block_index: int) -> torch.Tensor:
        """What this rank's model computes for block `block_index` of a sequence."""
        hashes: list = []
        end = (block_index + 1) * self.block_size
        assert end <= len(token_ids)
        extend_prefix_hashes(hashes, token_ids[:end], 0)
        return self.toy.kv(hashes[block_index * self.block_size:end], self.layer_names.index(layer_name),
                           self.heads)
