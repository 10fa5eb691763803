"""Stand-in of ``vllm/v1/kv_cache_interface.py`` (pre-#51718 shapes; source
``kv_cache_interface.py@001cabc1be16a59a70d720ed61a13b678c060a18``, facts §8).

Facts relied on:
* ``KVCacheSpec(block_size)``, frozen; ``page_size_bytes``.
* ``AttentionSpec(num_kv_heads, head_size, dtype, page_size_padded=None)``:
  ``real_page_size_bytes = 2 * block_size * num_kv_heads * head_size *
  dtype_size`` (K and V).
* ``FullAttentionSpec``: ``head_size_v`` (defaults to head_size),
  ``sliding_window`` (set when HMA is off and a sliding-window layer is
  treated as full attention), ``attention_chunk_size``.
* ``MLAAttentionSpec(FullAttentionSpec)``: ``cache_dtype_str``; page =
  ``block_size * num_kv_heads * head_size * dtype_size`` (num_kv_heads 1).
* ``SlidingWindowSpec(AttentionSpec)``: ``sliding_window``.
* ``MambaSpec(shapes, dtypes, page_size_padded=None, mamba_type)``:
  declared only; the stand-in has no Mamba layers.
* ``KVCacheTensor(size, shared_by)``, ``KVCacheGroupSpec(layer_names,
  kv_cache_spec)``, ``KVCacheConfig(num_blocks, kv_cache_tensors,
  kv_cache_groups)`` with ``has_mamba_layers`` and ``needs_kv_cache_zeroing``
  (both read by the 003df29 scheduler).
"""

from dataclasses import dataclass, field

import torch


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    page_size_padded: int | None = None

    @property
    def real_page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * _dtype_size(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.real_page_size_bytes


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    head_size_v: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def real_page_size_bytes(self) -> int:
        hv = self.head_size if self.head_size_v is None else self.head_size_v
        return self.block_size * self.num_kv_heads * (self.head_size + hv) * _dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    cache_dtype_str: str | None = None

    @property
    def real_page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * _dtype_size(self.dtype)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    shapes: tuple = ()
    dtypes: tuple = ()
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return sum(int(torch.Size(s).numel()) * _dtype_size(d) for s, d in zip(self.shapes, self.dtypes))


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list[str]


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)

    @property
    def has_mamba_layers(self) -> bool:
        return any(isinstance(g.kv_cache_spec, MambaSpec) for g in self.kv_cache_groups)

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        return False
