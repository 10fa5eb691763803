"""Stand-in of ``DSAIndexerPoolHost`` from ``python/sglang/srt/mem_cache/pool_host/dsa.py``,
sgl-project/sglang @ 03ba7b5b7dd249244bd5af01b236fd6449c66e8d: the DSA
index-key sidecar (``PoolName.INDEXER``), whose indices and layout follow
the KV anchor (``indices_from_pool = KV``).

Facts relied on (P page_size, L layers):

* page_size, size, page_num and layout come from the anchor MLA host pool;
* bytes per token per layer = ``index_page_size * (index_head_dim +
  index_head_dim // quant_block_size * 4) // page_size`` (uint8 index keys plus
  one fp32 scale per quant block); ``indexer_page_stride_size`` = that times P;
  ``indexer_page_num = (size + P + 1) // P``;
* buffer ``index_k_with_scale_buffer``, uint8: layer_first ``(L,
  indexer_page_num, stride)``, page_first / page_first_direct
  ``(indexer_page_num, L, 1, stride)``;
* indexed by page (``host_index // P``): ``get_data_page`` is ``[:,
  p:p+1, :]`` (layer_first) or ``[p:p+1]``, flattened; dummy page zeros (L,
  stride) flattened; ``set_from_flat_data_page`` reshapes back;
* ``get_page_buffer_meta``: page-first layouts only, one entry per page,
  ``base + page * L*stride``, ``L*stride`` bytes.

Simplified: the constructor takes the device pool and the anchor instead of
upstream's ``HostPoolDecl``; every device layer is owned; no MTP draft
layers, no dummy mode.
"""

import threading

import torch

from .base import HostKVCache
from .common import ALLOC_MEMORY_FUNCS, itemsize, get_allocator_from_storage


class DSAIndexerPoolHost(HostKVCache):
    def __init__(self, device_pool, anchor_host, pin_memory: bool = False, device: str = "cpu",
                 allocator_type="default"):
        self.device_pool = device_pool
        self.page_size = anchor_host.page_size
        self.layout = anchor_host.layout
        self.pin_memory, self.device = pin_memory, device
        self.allocator = get_allocator_from_storage(allocator_type)
        self.can_use_write_back_jit = False
        self.dtype = device_pool.store_dtype
        self.start_layer, self.end_layer = device_pool.start_layer, device_pool.end_layer
        self.layer_num = device_pool.layer_num
        self.indexer_dtype = device_pool.index_k_with_scale_buffer_dtype
        self.size, self.page_num = anchor_host.size, anchor_host.page_num
        per_token = device_pool.index_head_dim + device_pool.index_head_dim // device_pool.quant_block_size * 4
        self.bytes_per_token_per_layer = device_pool.index_page_size * per_token // self.page_size
        self.indexer_page_stride_size = self.bytes_per_token_per_layer * self.page_size
        self.indexer_layout_dim = self.indexer_page_stride_size * self.layer_num
        self.indexer_page_num = (self.size + self.page_size + 1) // self.page_size
        self.size_per_token = self.get_size_per_token()
        self.kv_buffer = self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def get_size_per_token(self):
        return self.bytes_per_token_per_layer * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        alloc = ALLOC_MEMORY_FUNCS[self.device_pool.device]
        if self.layout == "layer_first":
            dims = (self.layer_num, self.indexer_page_num, self.indexer_page_stride_size)
        elif self.layout in ("page_first", "page_first_direct"):
            dims = (self.indexer_page_num, self.layer_num, 1, self.indexer_page_stride_size)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.index_k_with_scale_buffer = alloc(dims, dtype=self.indexer_dtype, device=self.device,
                                               pin_memory=self.pin_memory, allocator=self.allocator,
                                               registration_granularity_bytes=self.indexer_layout_dim)
        return self.index_k_with_scale_buffer

    def get_hybrid_pool_buffer(self):
        return [self.index_k_with_scale_buffer]

    def _page_view(self, index):
        p = int(index) // self.page_size
        if self.layout == "layer_first":
            return self.index_k_with_scale_buffer[:, p:p + 1, :]
        if self.layout in ("page_first", "page_first_direct"):
            return self.index_k_with_scale_buffer[p:p + 1]
        raise ValueError(f"Unsupported layout: {self.layout}")

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((self.layer_num, self.indexer_page_stride_size), dtype=self.indexer_dtype,
                           device=self.device).flatten()

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        view = self._page_view(index)
        view[...] = data_page.reshape(view.shape)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ("page_first", "page_first_direct"):
            raise ValueError(f"Unsupported layout: {self.layout}")
        stride = self.layer_num * self.indexer_page_stride_size * itemsize(self.indexer_dtype)
        base, idx = self.index_k_with_scale_buffer.data_ptr(), indices.tolist()
        ptrs = [base + (int(idx[i]) // self.page_size) * stride for i in range(0, len(idx), self.page_size)]
        return ptrs, [stride] * len(ptrs)
