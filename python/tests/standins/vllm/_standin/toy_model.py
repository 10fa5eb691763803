"""The stand-in's model: deterministic K/V and tokens, so a test can tell
whether the KV a connector loaded equals, byte for byte, what the engine would
have computed itself.

* Prefix hash: ``ph[p] = blake2b(ph[p-1] || token[p])`` (``ph[-1]`` fixed).
* K/V of (layer, global kv head, position p) is a pure function of ``ph[p]``:
  ``randn`` seeded with ``ph[p]``, shape ``(num_layers, total_kv_heads, 2,
  head_size)`` (K at index 0, V at 1), cast to the model dtype. A TP rank
  holds the slice of heads ``[rank*H/tp, (rank+1)*H/tp)``; different heads get
  different values, so a rank that received another rank's bytes is caught.
* MLA: a latent of ``kv_lora_rank + qk_rope_head_dim`` values per (layer, p),
  the same on every TP rank (vLLM replicates the MLA cache across TP ranks).
* A sampled token is a function of the prefix hash of the last position and of
  the bytes of the KV that the last query position attends to, *read from the
  paged cache* (every layer; a sliding-window layer only its window), hashed
  per (layer, global kv head) so that the result does not depend on the TP
  size (the executor puts the ranks' heads side by side: the all-reduce).
  Wrong KV in the cache hence changes the output, as it would in a real model.
"""

import hashlib
from collections import OrderedDict

import torch

_ROOT = b"kvmesh-vllm-standin"


def _h(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def extend_prefix_hashes(hashes: list, tokens, start: int) -> None:
    """Appends the prefix hash of positions [len(hashes), len(tokens))."""
    prev = hashes[-1] if hashes else _h(_ROOT)
    for p in range(len(hashes), len(tokens)):
        prev = _h(prev.to_bytes(8, "little") + int(tokens[p]).to_bytes(8, "little", signed=True))
        hashes.append(prev)


class ToyModel:
    def __init__(self, num_layers: int, total_kv_heads: int, head_size: int, dtype: torch.dtype,
                 use_mla: bool, latent_size: int, vocab_size: int, cache_entries: int = 8192):
        self.num_layers = num_layers
        self.total_kv_heads = total_kv_heads
        self.head_size = head_size
        self.dtype = dtype
        self.use_mla = use_mla
        self.latent_size = latent_size
        self.vocab_size = vocab_size
        self._cache: "OrderedDict[int, torch.Tensor]" = OrderedDict()
        self._cache_entries = cache_entries

    @classmethod
    def from_model_config(cls, model_config) -> "ToyModel":
        return cls(num_layers=model_config.num_layers, total_kv_heads=model_config.num_kv_heads,
                   head_size=model_config.head_size, dtype=model_config.torch_dtype,
                   use_mla=model_config.use_mla,
                   latent_size=model_config.kv_lora_rank + model_config.qk_rope_head_dim,
                   vocab_size=model_config.vocab_size)

    def _values(self, ph: int) -> torch.Tensor:
        v = self._cache.get(ph)
        if v is not None:
            self._cache.move_to_end(ph)
            return v
        g = torch.Generator()
        g.manual_seed(ph & ((1 << 63) - 1))
        if self.use_mla:
            shape = (self.num_layers, self.latent_size)
        else:
            shape = (self.num_layers, self.total_kv_heads, 2, self.head_size)
        v = torch.randn(shape, generator=g, dtype=torch.float32).to(self.dtype)
        self._cache[ph] = v
        if len(self._cache) > self._cache_entries:
            self._cache.popitem(last=False)
        return v

    def kv(self, prefix_hashes, layer: int, heads: slice) -> torch.Tensor:
        """Expected KV of `layer` at the positions whose prefix hashes are given:
        (n, heads, 2, head_size), or (n, latent) for MLA."""
        if self.use_mla:
            return torch.stack([self._values(ph)[layer] for ph in prefix_hashes])
        return torch.stack([self._values(ph)[layer, heads] for ph in prefix_hashes])

    def sample(self, last_prefix_hash: int, rank_digests) -> int:
        h = hashlib.blake2b(last_prefix_hash.to_bytes(8, "little"), digest_size=8)
        for d in rank_digests:
            h.update(d)
        return int.from_bytes(h.digest(), "little") % self.vocab_size
