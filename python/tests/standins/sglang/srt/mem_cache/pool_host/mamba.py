"""Stand-in of ``MambaPoolHost`` from ``python/sglang/srt/mem_cache/pool_host/mamba.py``,
sgl-project/sglang @ 02f0c2a0f8e4540dd6484b74f3d5b4ea4509f206.

Facts relied on (Lm = num_mamba_layers):

* constructor ``(device_pool, host_to_device_ratio, host_size,
  pin_memory=True, device="cpu", allocator_type="default",
  layout="layer_first")`` with ``layout`` asserted to be page_first or
  page_first_direct; ``page_size = 1`` (one slot per request state);
* state shapes from ``device_pool.mamba_cache.conv[i].shape[2:]`` and
  ``.temporal.shape[2:]``, dtypes from those tensors, ``dtype = conv_dtype``;
  ``temporal_state_elem_size`` may be 0 (conv-only models);
* ``get_size_per_token() = (sum(conv elems * conv B) + temporal elems *
  temporal B) * Lm``; size as the base pool: ``page_num = size + 1``;
* page-first buffers: ``temporal_buffer (S, Lm, 1, *temporal_shape)``, and
  ``conv_buffer[i] (S, Lm, 1, *conv_shape_i)``; ``kv_buffer`` is the list of
  the non-empty ones (temporal first); ``get_hybrid_pool_buffer() =
  [temporal_buffer, *conv_buffer]``;
* ``get_data_page(index)``: uint8 concatenation of the bytes of
  ``temporal_buffer[index], conv_buffer[0][index], ...``;
  ``get_dummy_flat_data_page()``: uint8 zeros of ``page_size *
  size_per_token``; ``set_from_flat_data_page`` splits the bytes in the same
  order and copies each part back;
* ``get_page_buffer_meta(indices)``: per slot, [temporal (left out when its
  element size is 0), conv_0, ..., conv_n] with ``ptr = base_i +
  idx*Lm*elem_i*B_i`` and ``size = page_size*Lm*B_i*elem_i``;
* ``free`` defers: freed slots go to a release list that ``alloc`` merges
  back when the free list runs short; ``available_size`` counts both.
"""

from typing import Optional

import torch

from .base import HostKVCache, synchronized
from .common import ALLOC_MEMORY_FUNCS, itemsize, get_allocator_from_storage


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class MambaPoolHost(HostKVCache):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int, pin_memory: bool = False,
                 device: str = "cpu", allocator_type="default", layout: str = "layer_first"):
        import threading

        self.device_pool = device_pool
        self.page_size = 1
        assert layout in ("page_first", "page_first_direct"), f"Unsupported layout: {layout}"
        self.layout, self.pin_memory, self.device = layout, pin_memory, device
        self.allocator = get_allocator_from_storage(allocator_type)
        self.can_use_write_back_jit = True
        self.num_mamba_layers = device_pool.num_mamba_layers
        self.conv_state_shapes = [tuple(c.shape[2:]) for c in device_pool.mamba_cache.conv]
        self.temporal_state_shape = tuple(device_pool.mamba_cache.temporal.shape[2:])
        self.temporal_state_elem_size = _numel(self.temporal_state_shape)
        self.conv_state_elem_sizes = [_numel(s) for s in self.conv_state_shapes]
        self.conv_dtype = device_pool.mamba_cache.conv[0].dtype
        self.temporal_dtype = device_pool.mamba_cache.temporal.dtype
        self.dtype = self.conv_dtype
        self._size_pool(device_pool, host_size, host_to_device_ratio)
        self.kv_buffer = self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def get_size_per_token(self):
        conv = sum(e * itemsize(self.conv_dtype) for e in self.conv_state_elem_sizes)
        return (conv + self.temporal_state_elem_size * itemsize(self.temporal_dtype)) * self.num_mamba_layers

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        host_alloc = ALLOC_MEMORY_FUNCS[self.device_pool.device]

        def alloc(dims, dtype):
            if _numel(dims) == 0:
                return torch.empty(dims, dtype=dtype, device=self.device)
            return host_alloc(dims, dtype=dtype, device=self.device, pin_memory=self.pin_memory,
                              allocator=self.allocator,
                              registration_granularity_bytes=_numel(dims[1:]) * itemsize(dtype))

        head = (self.size, self.num_mamba_layers, 1)
        self.temporal_buffer = alloc(head + self.temporal_state_shape, self.temporal_dtype)
        self.conv_buffer = [alloc(head + s, self.conv_dtype) for s in self.conv_state_shapes]
        return [b for b in (self.temporal_buffer, *self.conv_buffer) if b.numel() > 0]

    def get_hybrid_pool_buffer(self):
        return [self.temporal_buffer, *self.conv_buffer]

    def _iter_page_tensors(self, index):
        index = int(index)
        yield self.temporal_buffer[index]
        for buf in self.conv_buffer:
            yield buf[index]

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1) for t in self._iter_page_tensors(index)])

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_size * self.size_per_token, dtype=torch.uint8, device=self.device)

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        raw = data_page.contiguous().view(torch.uint8).reshape(-1)
        at = 0
        for t in self._iter_page_tensors(index):
            n = t.numel() * t.element_size()
            t.copy_(raw[at:at + n].view(t.dtype).reshape(t.shape))
            at += n

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        Lm, idx = self.num_mamba_layers, indices.tolist()
        parts = []
        if self.temporal_state_elem_size > 0:
            parts.append((self.temporal_buffer.data_ptr(), self.temporal_state_elem_size,
                          itemsize(self.temporal_dtype)))
        for buf, e in zip(self.conv_buffer, self.conv_state_elem_sizes):
            parts.append((buf.data_ptr(), e, itemsize(self.conv_dtype)))
        ptrs, sizes = [], []
        for i in range(0, len(idx), self.page_size):
            for base, elems, b in parts:
                ptrs.append(base + idx[i] * Lm * elems * b)
                sizes.append(self.page_size * Lm * b * elems)
        return ptrs, sizes

    @synchronized
    def clear(self):
        self.mem_state = torch.zeros((self.size,), dtype=torch.uint8)
        self.free_slots = torch.arange(self.size, dtype=torch.int64)
        self.release_slots = []
        self.num_release_slots = 0

    def available_size(self):
        return len(self.free_slots) + self.num_release_slots

    def _merge_release_slots(self):
        if self.release_slots:
            self.free_slots = torch.cat([self.free_slots, *self.release_slots])
            self.release_slots, self.num_release_slots = [], 0

    @synchronized
    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > self.available_size():
            return None
        if need_size > len(self.free_slots):
            self._merge_release_slots()
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return select

    @synchronized
    def free(self, indices: torch.Tensor) -> int:
        indices = indices.cpu()
        if indices.numel() == 0:
            return 0
        self.release_slots.append(indices)
        self.num_release_slots += len(indices)
        return len(indices)
