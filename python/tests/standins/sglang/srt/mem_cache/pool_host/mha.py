"""Stand-in of ``MHATokenToKVPoolHost`` from
``python/sglang/srt/mem_cache/pool_host/mha.py``, sgl-project/sglang @
0047d999bb3a3ad311df5a4b6356bfb5586e0d66 (the version read_file returned;
find_files lists 39baee9e09735ebb7916f64ceb00dbfe395ab52b as stored).

Facts relied on (P page_size, L layer_num, H head_num, D head_dim, B dtype
itemsize, S size in tokens, page_num = S / P):

* ``head_num = device_pool.row_dim // device_pool.head_dim``; ``L =
  device_pool.layer_num`` (no MTP draft layers here); ``get_size_per_token()
  = H*D*L*B*2``, ``get_ksize_per_token()`` half of it.
* ``kv_buffer`` is one tensor, ``k_buffer = kv_buffer[0]``, ``v_buffer =
  kv_buffer[1]``, with dims per layout: ``layer_first (2, L, S, H, D)``,
  ``page_first (2, S, L, H, D)``, ``page_first_direct (2, page_num, L, P, H,
  D)``, ``page_head (2, page_num, H, P, L, D)``.
* ``get_data_page(index, flat=True)``: layer_first ``kv_buffer[:, :,
  index:index+P]`` (flat order (2, L, P, H, D)), page_first ``kv_buffer[:,
  index:index+P]`` ((2, P, L, H, D)), page_first_direct and page_head
  ``kv_buffer[:, index//P : index//P+1]`` ((2, 1, L, P, H, D) and (2, 1, H, P,
  L, D)); flattened when flat. ``get_dummy_flat_data_page()`` is zeros of
  (2, L, P, H, D), flattened (same numel); ``set_from_flat_data_page`` reshapes
  to the layout's page shape and assigns.
* ``get_page_buffer_meta(indices) -> (ptrs, sizes)``: ``len(indices) % P ==
  0`` asserted; one entry group per page, from ``indices[0], indices[P], ...``;
  ``v_offset = L*S*H*D*B``. layer_first: per page and layer ``K_l = base +
  idx*H*D*B + l*S*H*D*B``, ``V_l = K_l + v_offset``, in the order K_0, V_0,
  K_1, V_1, ... (2L entries per page, each P*H*D*B bytes). page_first,
  page_first_direct, page_head: ``K = base + idx*L*H*D*B``, ``V = K +
  v_offset`` (2 entries per page, each L*P*H*D*B bytes).
* ``get_hybrid_pool_buffer() = [k_buffer, v_buffer]``.

So the flat page order (generic path) differs from the part order
(zero-copy path) for every layout but page_first_direct / page_head.
"""

import torch

from .base import HostKVCache
from .common import ALLOC_MEMORY_FUNCS, itemsize

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")


class MHATokenToKVPoolHost(HostKVCache):
    def __init__(self, device_pool, host_to_device_ratio: float, host_size: int, page_size: int, layout: str,
                 pin_memory: bool = False, device: str = "cpu", allocator_type="default"):
        super().__init__(device_pool, host_to_device_ratio, host_size, page_size, layout, pin_memory, device,
                         allocator_type)

    def get_size_per_token(self):
        self.head_num = self.device_pool.row_dim // self.device_pool.head_dim
        self.head_dim = self.device_pool.head_dim
        self.layer_num = self.device_pool.layer_num
        return self.head_dim * self.head_num * self.layer_num * itemsize(self.dtype) * 2

    def get_ksize_per_token(self):
        return self.get_size_per_token() // 2

    def _page_dims(self):
        L, P, H, D = self.layer_num, self.page_size, self.head_num, self.head_dim
        return {"layer_first": (2, L, P, H, D), "page_first": (2, P, L, H, D),
                "page_first_direct": (2, 1, L, P, H, D), "page_head": (2, 1, H, P, L, D)}[self.layout]

    def init_kv_buffer(self):
        L, S, H, D, P, N = self.layer_num, self.size, self.head_num, self.head_dim, self.page_size, self.page_num
        if self.layout == "layer_first":
            dims = (2, L, S, H, D)
        elif self.layout == "page_first":
            dims = (2, S, L, H, D)
        elif self.layout == "page_first_direct":
            dims = (2, N, L, P, H, D)
        elif self.layout == "page_head":
            dims = (2, N, H, P, L, D)
        else:
            raise ValueError(f"Unsupported layout: {self.layout}")
        self.token_stride_size = H * D * itemsize(self.dtype)
        self.layout_dim = self.token_stride_size * L
        return ALLOC_MEMORY_FUNCS[self.device_pool.device](
            dims, dtype=self.dtype, device=self.device, pin_memory=self.pin_memory, allocator=self.allocator,
            registration_granularity_bytes=(P * self.layout_dim
                                            if self.layout in ("page_first", "page_first_direct") else None))

    @property
    def k_buffer(self):
        return self.kv_buffer[0]

    @property
    def v_buffer(self):
        return self.kv_buffer[1]

    def get_hybrid_pool_buffer(self):
        return [self.k_buffer, self.v_buffer]

    def _page_view(self, index):
        index, P = int(index), self.page_size
        if self.layout == "layer_first":
            return self.kv_buffer[:, :, index:index + P]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + P]
        if self.layout in ("page_first_direct", "page_head"):
            return self.kv_buffer[:, index // P:index // P + 1]
        raise ValueError(f"Unsupported layout: {self.layout}")

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        page = self._page_view(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                           dtype=self.dtype, device=self.device).flatten()

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        self._page_view(index)[...] = data_page.reshape(self._page_dims())

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        L, S, H, D, B, P = self.layer_num, self.size, self.head_num, self.head_dim, itemsize(self.dtype), self.page_size
        base = self.kv_buffer.data_ptr()
        v_offset = L * S * H * D * B
        idx = indices.tolist()
        ptrs = []
        if self.layout == "layer_first":
            for i in range(0, len(idx), P):
                for layer in range(L):
                    k = base + idx[i] * H * D * B + layer * S * H * D * B
                    ptrs += [k, k + v_offset]
            return ptrs, [P * H * D * B] * len(ptrs)
        if self.layout in ("page_first", "page_first_direct", "page_head"):
            for i in range(0, len(idx), P):
                k = base + idx[i] * L * H * D * B
                ptrs += [k, k + v_offset]
            return ptrs, [L * P * H * D * B] * len(ptrs)
        raise ValueError(f"Unsupported layout: {self.layout}")
