"""Stand-in of ``python/sglang/srt/mem_cache/pool_host/common.py``,
sgl-project/sglang @ 59cbeaefe666c63cd4d0fe8919a25814ea2e66e2: how a host
pool gets its buffers.

Facts relied on:

* a host pool's ``init_kv_buffer`` allocates through
  ``ALLOC_MEMORY_FUNCS[device_pool.device](dims, dtype=, device=, pin_memory=,
  allocator=self.allocator, registration_granularity_bytes=)`` (a
  defaultdict whose default, ``alloc_with_host_register``, calls
  ``allocator.allocate(dims, dtype=, device=)`` and then cudaHostRegisters the
  buffer when ``pin_memory``);
* ``self.allocator = get_allocator_from_storage(allocator_type)``: the
  ``"mooncake"`` and ``"mori"`` types give those stores' allocators (falling
  back to the default when missing), anything else
  ``HostTensorAllocator()``, whose ``allocate`` is an mmap'd CPU tensor
  (``alloc_mmap``).

Stand-in differences: the default allocation is ``torch.empty`` on the CPU
(no mmap, no pinning: there is no GPU); and, an extension upstream does not
have at this commit, ``allocator_type`` may also be an object with
``allocate(dims, dtype, device)`` or a callable ``(dims, dtype) -> tensor``
(a backend's ``alloc_host_buffer``), so a test can let a storage backend
provide the host pool's memory. "mooncake" / "mori" fall back to the default
as upstream does when the store is missing.
"""

from collections import defaultdict

import torch


def itemsize(dtype: torch.dtype) -> int:
    """``dtype.itemsize`` of newer torch (upstream uses it; Debian's torch 1.13 lacks it)."""
    return torch.empty((), dtype=dtype).element_size()


class HostTensorAllocator:
    def __init__(self):
        self.dtype = None
        self.dims = None

    def allocate(self, dims: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
        assert device == "cpu", f"HostTensorAllocator only supports CPU allocations; got device={device!r}"
        self.dtype, self.dims = dtype, dims
        return torch.empty(dims, dtype=dtype, device=device)


class _CallableAllocator(HostTensorAllocator):
    """Stand-in extension: a ``(dims, dtype) -> tensor`` function as the allocator."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def allocate(self, dims, dtype, device):
        self.dtype, self.dims = dtype, dims
        t = self.fn(tuple(dims), dtype)
        assert tuple(t.shape) == tuple(dims) and t.dtype == dtype and t.device.type == "cpu", \
            f"allocator gave {tuple(t.shape)} {t.dtype} on {t.device}, wanted {tuple(dims)} {dtype} on cpu"
        return t


def get_allocator_from_storage(allocator_type="default"):
    if hasattr(allocator_type, "allocate"):
        return allocator_type
    if callable(allocator_type):
        return _CallableAllocator(allocator_type)
    return HostTensorAllocator()


def alloc_with_host_register(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    return allocator.allocate(dims, dtype=dtype, device=device)


ALLOC_MEMORY_FUNCS = defaultdict(lambda: alloc_with_host_register)
