"""Stand-in of ``get_hash_str`` from ``python/sglang/srt/mem_cache/utils.py``
(sgl-project/sglang @ 001067fffe33427bee0ed2f007fb7551a1d76b44; the body is
native there, ``mem_cache/cpp_utils/hash_binding.cpp`` @
30a90c4f837192e0aa4dafcc12e38c315fb4185c, with the semantics of the older
pure-Python versions).

Facts relied on:

* ``get_hash_str(token_ids, prior_hash=None, page_size=None)``;
* SHA-256 chaining: a digest is SHA256(previous digest's 32 raw bytes, if
  any || each token as uint32 little-endian); its lowercase hex is the key and
  the next page's prior;
* with ``page_size`` the result is one hex string per page, ``ceil(n / P)``
  of them (a last partial page is hashed too; the controller only passes
  page-aligned token lists); without it, one string over all tokens;
* a tuple token (EAGLE bigram) hashes each of its elements.

Left out: the 8-byte encoding of token ids of 2**32 and above.
"""

import hashlib
from typing import List, Optional, Union


def _digest(tokens, prior: Optional[bytes]) -> bytes:
    h = hashlib.sha256()
    if prior:
        h.update(prior)
    for t in tokens:
        for v in (t if isinstance(t, tuple) else (t,)):
            h.update(int(v).to_bytes(4, "little", signed=False))
    return h.digest()


def get_hash_str(token_ids: List[int], prior_hash: Optional[str] = None,
                 page_size: Optional[int] = None) -> Union[str, List[str]]:
    tokens = [t if isinstance(t, tuple) else int(t) for t in token_ids]
    prior = bytes.fromhex(prior_hash) if prior_hash else None
    if page_size is None:
        return _digest(tokens, prior).hex()
    out = []
    for start in range(0, len(tokens), page_size):
        prior = _digest(tokens[start:start + page_size], prior)
        out.append(prior.hex())
    return out
