"""Stand-in of ``MLATokenToKVPoolHost`` from
``python/sglang/srt/mem_cache/pool_host/mla.py``, sgl-project/sglang @
01c0ede38cc9645488fd2847dbea8a2f6a9241d8 (find_files lists
c76318764f51e77e13f6f37ce271232485a8708c as stored; read_file returned 01c0ede3).

Facts relied on (kvd = kv_lora_rank + qk_rope_head_dim, L layer_num, P
page_size, S size, B itemsize):

* ``get_size_per_token() = kvd*B*L`` (== ``get_ksize_per_token()``);
* ``kv_buffer`` dims: ``layer_first (L, S, 1, kvd)``, ``page_first (S, L, 1,
  kvd)``, ``page_first_direct (page_num, L, P, 1, kvd)``;
* ``get_data_page``: layer_first ``[:, idx:idx+P]`` (flat (L, P, 1, kvd)),
  page_first ``[idx:idx+P]`` ((P, L, 1, kvd)), page_first_direct
  ``[idx//P : idx//P+1]`` ((1, L, P, 1, kvd)); dummy page zeros (L, P, 1, kvd)
  flattened; ``set_from_flat_data_page`` reshapes to the layout's page shape;
* ``get_page_buffer_meta``: layer_first, per page, L entries ``base +
  idx*kvd*B + l*S*kvd*B`` of P*kvd*B bytes; page_first and
  page_first_direct, 1 entry ``base + idx*L*kvd*B`` of L*P*kvd*B bytes.

Left out: ``page_first_kv_split`` (Ascend), the dummy (``kv_buffer`` None)
mode, DCP.
"""

import torch

from .base import HostKVCache
from .common import ALLOC_MEMORY_FUNCS, itemsize

LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = False, device: str = "cpu", allocator_type="default"):
        super().__init__(device_pool, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type)

    def get_size_per_token(self):
        self.kv_lora_rank = self.device_pool.kv_lora_rank
        self.qk_rope_head_dim = self.device_pool.qk_rope_head_dim
        self.kv_cache_dim = self.kv_lora_rank + self.qk_rope_head_dim
        self.layer_num = self.device_pool.layer_num
        return self.kv_cache_dim * itemsize(self.dtype) * self.layer_num

    def get_ksize_per_token(self):
        return self.get_size_per_token()

    def init_kv_buffer(self):
        L, S, K, P = self.layer_num, self.size, self.kv_cache_dim, self.page_size
        if self.layout == "layer_first":
            dims = (L, S, 1, K)
        elif self.layout == "page_first":
            dims = (S, L, 1, K)
        elif self.layout == "page_first_direct":
            dims = (self.page_num, L, P, 1, K)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = K * itemsize(self.dtype)
        self.layout_dim = self.token_stride_size * L
        return ALLOC_MEMORY_FUNCS[self.device_pool.device](
            dims, dtype=self.dtype, device=self.device, pin_memory=self.pin_memory, allocator=self.allocator,
            registration_granularity_bytes=(P * self.layout_dim
                                            if self.layout in ("page_first", "page_first_direct") else None))

    def get_hybrid_pool_buffer(self):
        return [self.kv_buffer]

    def _page_dims(self):
        L, P, K = self.layer_num, self.page_size, self.kv_cache_dim
        return {"layer_first": (L, P, 1, K), "page_first": (P, L, 1, K),
                "page_first_direct": (1, L, P, 1, K)}[self.layout]

    def _page_view(self, index):
        index, P = int(index), self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, index:index + P]
        if self.layout == "page_first":
            return self.kv_buffer[index:index + P]
        if self.layout == "page_first_direct":
            return self.kv_buffer[index // P:index // P + 1]
        raise ValueError(f"Unsupported layout: {self.layout}")

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((self.layer_num, self.page_size, 1, self.kv_cache_dim), dtype=self.dtype,
                           device=self.device).flatten()

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        self._page_view(index)[...] = data_page.reshape(self._page_dims())

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        L, S, K, B, P = self.layer_num, self.size, self.kv_cache_dim, itemsize(self.dtype), self.page_size
        base = self.kv_buffer.data_ptr()
        idx = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), P):
                ptrs += [base + idx[i] * K * B + layer * S * K * B for layer in range(L)]
            return ptrs, [P * K * B] * len(ptrs)
        if self.layout in ("page_first", "page_first_direct"):
            ptrs = [base + idx[i] * L * K * B for i in range(0, len(idx), P)]
            return ptrs, [L * P * K * B] * len(ptrs)
        raise ValueError(f"Unsupported layout: {self.layout}")
