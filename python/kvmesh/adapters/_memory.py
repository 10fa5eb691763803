"""The memory behind a tensor, for registering an engine's KV cache once."""

from typing import Any, Tuple


def whole_storage(t: Any) -> Tuple[int, Any]:
    """(address, a contiguous 1-D tensor over the whole memory) behind tensor t:
    what registering t's memory once means, whatever view of it t is."""
    import torch

    if hasattr(t, "untyped_storage"):  # torch >= 2.0
        s = t.untyped_storage()
        return s.data_ptr(), torch.empty(0, dtype=torch.uint8, device=t.device).set_(s)
    s = t.storage()  # torch 1.x (Debian 12's 1.13): a typed storage
    return s.data_ptr(), t.new_empty(0).set_(s)
