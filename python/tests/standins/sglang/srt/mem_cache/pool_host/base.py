"""Stand-in of ``python/sglang/srt/mem_cache/pool_host/base.py`` (``HostKVCache``),
sgl-project/sglang @ 049f8e64daef5f97982ffd46d89c2277ce260a16.

Facts relied on:

* constructor ``(device_pool, host_to_device_ratio, host_size, page_size,
  layout, pin_memory, device, allocator_type="default")``;
* ``dtype = device_pool.store_dtype``; ``size_per_token =
  get_size_per_token()``; ``size`` = ``int(host_size * 1e9 //
  size_per_token)`` when host_size > 0, else ``int(device_pool.size *
  ratio)``, then aligned up with one page more: ``page_num = size //
  page_size + 1``, ``size = page_num * page_size``;
* ``kv_buffer = init_kv_buffer()``; ``lock`` is an RLock; ``clear()`` resets
  ``free_slots = arange(size)``; ``alloc(n)`` needs ``n % page_size == 0``
  and gives the first n free slots (None when short); ``free(indices)``
  appends them back; ``available_size()``;
* abstract: ``get_size_per_token``, ``init_kv_buffer``,
  ``load_to_device_per_layer``, ``backup_from_device_all_layer``,
  ``get_data_page(index, flat=True)``, ``get_dummy_flat_data_page()``,
  ``set_from_flat_data_page(index, data_page)``; ``get_page_buffer_meta`` is
  each subclass's own.

Left out: the host-memory check, PP size sync, pinning, ``destroy``. The
device <-> host transfers raise (no device side in the stand-in).
"""

import abc
import threading
from functools import wraps
from typing import Optional

import torch

from .common import get_allocator_from_storage


def synchronized(func):
    @wraps(func)
    def wrapper(self, *args, **kwargs):
        with self.lock:
            return func(self, *args, **kwargs)

    return wrapper


class HostKVCache(abc.ABC):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = False, device: str = "cpu", allocator_type="default"):
        self.device_pool = device_pool
        self.page_size = page_size
        self.layout = layout
        self.pin_memory = pin_memory
        self.device = device
        self.allocator = get_allocator_from_storage(allocator_type)
        self.can_use_write_back_jit = False
        self.dtype = device_pool.store_dtype
        self._size_pool(device_pool, host_size, host_to_device_ratio)
        self.start_layer = device_pool.start_layer
        self.end_layer = device_pool.end_layer
        self.kv_buffer = self.init_kv_buffer()
        self.lock = threading.RLock()
        self.clear()

    def _size_pool(self, device_pool, host_size, host_to_device_ratio):
        """size_per_token, size and page_num as upstream's __init__ sets them (host_size
        GB when > 0, else host_to_device_ratio times the device pool; whole pages plus
        one). The stand-in's own helper: the mamba pool sizes itself the same way."""
        self.size_per_token = self.get_size_per_token()
        if host_size > 0:
            self.size = int(host_size * 1e9 // self.size_per_token)
        else:
            self.size = int(device_pool.size * host_to_device_ratio)
        self.page_num = self.size // self.page_size + 1
        self.size = self.page_num * self.page_size

    @abc.abstractmethod
    def get_size_per_token(self):
        raise NotImplementedError()

    @abc.abstractmethod
    def init_kv_buffer(self):
        raise NotImplementedError()

    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend):
        raise NotImplementedError("stand-in: no device side")

    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        raise NotImplementedError("stand-in: no device side")

    @abc.abstractmethod
    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        raise NotImplementedError()

    @abc.abstractmethod
    def get_dummy_flat_data_page(self) -> torch.Tensor:
        raise NotImplementedError()

    @abc.abstractmethod
    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        raise NotImplementedError()

    @synchronized
    def clear(self):
        self.mem_state = torch.zeros((self.size,), dtype=torch.uint8)
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def available_size(self):
        return len(self.free_slots)

    @synchronized
    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        assert need_size % self.page_size == 0, "The requested size should be a multiple of the page size."
        if need_size > self.available_size():
            return None
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return select

    @synchronized
    def free(self, indices: torch.Tensor) -> int:
        self.free_slots = torch.cat([self.free_slots, indices.cpu()])
        return len(indices)
