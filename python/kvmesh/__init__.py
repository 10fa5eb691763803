"""kvmesh from Python: a client of a kvmesh KV-cache cluster (docs/python.md).

    import kvmesh

    cluster = kvmesh.EmbeddedCluster("cluster_configs/local.json")    # nodes in this process
    client = kvmesh.Client("127.0.0.1:7070", tenant="t1")            # or daemons
    cached = client.match_prefix(prompt)                              # leading cached blocks
    pool = client.allocate(nbytes)                                    # registered memory, a buffer
    region = client.register(kv_pool)                                 # or register memory once
    client.put_from(client.keys(prompt)[cached:], blocks)             # store new blocks
    statuses = client.get_into(keys, views)                           # one ItemStatus per block

Keys are (hi, lo) pairs of 64-bit ints (include/kvmesh/block_key.h); token
keys come from ``client.keys(tokens)``. Buffers are anything with the buffer
protocol (bytearray, memoryview, numpy arrays) or torch tensors (contiguous;
CPU, or CUDA in builds with CUDA after ``register``). Failed calls raise
:class:`kvmesh.Error` subclasses carrying kvmesh's status code; every call
releases the GIL while it does I/O.

Engines load kvmesh by name: ``kvmesh.vllm.KvmeshConnector`` (vLLM's KV
connector v1) and ``kvmesh.sglang.KvmeshStorage`` (SGLang's HiCache storage
backend); their engine-free cores are :mod:`kvmesh.adapters.vllm` and
:mod:`kvmesh.adapters.sglang` (docs/engines.md).
"""

from ._core import (  # noqa: F401
    HAVE_CUDA,
    HAVE_UCX,
    VERSION,
    Allocation,
    Client,
    EmbeddedCluster,
    FrameStream,
    ItemStatus,
    KvIndex,
    Region,
    Sequence,
    chain_keys,
    derive_keys,
    text_keys,
)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .errors import InvalidArgumentError

__version__ = VERSION


def key_hex(key: "tuple[int, int]") -> str:
    """32 lowercase hex digits, hi first (BlockKey::ToHex)."""
    hi, lo = key
    return f"{hi:016x}{lo:016x}"


def key_from_hex(text: str) -> "tuple[int, int]":
    """The key written by key_hex (BlockKey::FromHex)."""
    if len(text) != 32:
        raise InvalidArgumentError(f"a key is 32 hex digits, got {len(text)}")
    try:
        return int(text[:16], 16), int(text[16:], 16)
    except ValueError:
        raise InvalidArgumentError(f"not a hex key: {text!r}") from None


__all__ = [
    "Allocation", "Client", "EmbeddedCluster", "FrameStream", "ItemStatus", "KvIndex", "Region", "Sequence", "HAVE_CUDA", "HAVE_UCX", "VERSION",
    "key_hex", "key_from_hex", "chain_keys", "derive_keys", "text_keys",
] + list(_errors_all)
