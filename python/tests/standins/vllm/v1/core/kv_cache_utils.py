"""Stand-in of ``vllm/v1/core/kv_cache_utils.py``: ``KVCacheBlock``, request
block hashing, and the KVCacheConfig the engine builds from the workers'
layer specs.

Facts relied on:
* ``KVCacheBlock(block_id, ref_cnt=0, block_hash=None, is_null=False)``.
* ``init_none_hash(hash_fn)``: ``NONE_HASH`` (the parent of a request's first
  block hash) is 32 random bytes per *process* unless ``PYTHONHASHSEED`` is
  set, then ``hash_fn(PYTHONHASHSEED)`` (index 65958302622 and others). So two
  engines agree on ``request.block_hashes`` only when PYTHONHASHSEED is set;
  here each engine core is a process.
* ``get_request_block_hasher(block_size, hash_fn)`` hashes each *full* block
  as ``hash_fn((parent_hash or NONE_HASH, tuple(block_tokens), extra_keys))``
  ("sha256" = SHA-256 of the pickled tuple), continuing from
  ``len(request.block_hashes)``. The engine core builds it when
  ``enable_prefix_caching`` or a KV connector is set (vllm/v1/engine/core.py,
  several copies, e.g. index 53122058033).
* ``get_kv_cache_configs`` (facts §8, "Hybrid models"; index 42701108):
  with HMA off, ``unify_hybrid_kv_cache_specs`` turns SlidingWindowSpec into
  FullAttentionSpec(sliding_window=w) -> one group; a uniform model has one
  group of all layers and one KVCacheTensor per layer (``shared_by=[layer]``);
  a hybrid model (uniform page size) is split by type into groups of
  ``group_size = min(#layers per type)`` layers, with ``group_size``
  KVCacheTensors, tensor ``i`` shared by layer ``i`` of every group; all
  groups draw block ids from one pool of ``num_blocks``.
"""

import hashlib
import os
import pickle
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

from vllm._standin import process as _process
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor,
                                        SlidingWindowSpec)

BlockHash = bytes


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    _block_hash: Any = None
    is_null: bool = False

    @property
    def block_hash(self):
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value):
        assert self._block_hash is None, "The block already has a hash."
        self._block_hash = value

    def reset_hash(self):
        self._block_hash = None

    def __repr__(self):
        return f"KVCacheBlock({self.block_id}, ref={self.ref_cnt}{', null' if self.is_null else ''})"


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def get_hash_fn_by_name(name: str) -> Callable[[Any], bytes]:
    if name == "sha256":
        return sha256
    raise NotImplementedError(f"stand-in: hash algorithm {name!r}")


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    seed = os.getenv("PYTHONHASHSEED")
    _process.current().__dict__["none_hash"] = os.urandom(32) if seed is None else hash_fn(seed)


def get_request_block_hasher(block_size: int, hash_fn: Callable[[Any], bytes]):
    none_hash = _process.current().__dict__["none_hash"]

    def request_block_hasher(request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        tokens = request.all_token_ids
        new = []
        while start + block_size <= len(tokens):
            h = hash_fn((parent if parent is not None else none_hash, tuple(tokens[start:start + block_size]),
                         None))
            new.append(h)
            parent = h
            start += block_size
        return new

    return request_block_hasher


def _unify(spec):
    if isinstance(spec, SlidingWindowSpec):
        return FullAttentionSpec(block_size=spec.block_size, num_kv_heads=spec.num_kv_heads,
                                 head_size=spec.head_size, dtype=spec.dtype, sliding_window=spec.sliding_window)
    return spec


def _type_key(spec):
    if isinstance(spec, FullAttentionSpec):
        return (FullAttentionSpec, type(spec))
    return (type(spec), getattr(spec, "sliding_window", None))


def get_kv_cache_config(vllm_config, kv_cache_spec: dict[str, Any], num_blocks: int) -> KVCacheConfig:
    """One worker's KVCacheConfig (layers in model order in `kv_cache_spec`)."""
    specs = dict(kv_cache_spec)
    if vllm_config.scheduler_config.disable_hybrid_kv_cache_manager:
        specs = {name: _unify(s) for name, s in specs.items()}
    by_type: dict = defaultdict(list)
    for name, s in specs.items():
        by_type[_type_key(s)].append(name)
    if len(by_type) == 1:
        layers = list(specs)
        first = specs[layers[0]]
        # With HMA off a unified group is full attention (its layers keep their
        # own window for compute; the manager frees nothing).
        group_spec = replace(first, sliding_window=None) if type(first) is FullAttentionSpec else first
        tensors = [KVCacheTensor(size=specs[n].page_size_bytes * num_blocks, shared_by=[n]) for n in layers]
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                             kv_cache_groups=[KVCacheGroupSpec(layers, group_spec)])
    pages = {s.page_size_bytes for s in specs.values()}
    if len(pages) != 1:
        raise NotImplementedError("stand-in: hybrid models need one page size")
    page = pages.pop()
    group_size = min(len(v) for v in by_type.values())
    groups = []
    for names in by_type.values():
        for i in range(0, len(names), group_size):
            chunk = names[i:i + group_size]
            groups.append(KVCacheGroupSpec(chunk, specs[chunk[0]]))
    tensors = []
    for i in range(group_size):
        tensors.append(KVCacheTensor(size=page * num_blocks,
                                     shared_by=[g.layer_names[i] for g in groups if i < len(g.layer_names)]))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


def get_kv_cache_configs(vllm_config, kv_cache_specs: list[dict[str, Any]], num_blocks: int) -> list[KVCacheConfig]:
    return [get_kv_cache_config(vllm_config, s, num_blocks) for s in kv_cache_specs]
