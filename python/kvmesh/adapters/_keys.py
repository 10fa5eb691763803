"""Keys the adapters derive for what the token keys do not name.

kvmesh's token keys (Client.keys) name a prefix and a (layers, heads) slice.
The adapters also need keys for the V half of a layer's block and for the
string page keys an engine hands them; both are 128-bit BLAKE2b digests, so
they spread over the nodes like token keys and never collide with them in
practice.
"""

import hashlib

_MASK = (1 << 64) - 1


def _split(digest: bytes) -> "tuple[int, int]":
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")


def derive(key: "tuple[int, int]", tag: bytes) -> "tuple[int, int]":
    """A key for `tag` attached to `key` (e.g. the V part of a K block)."""
    hi, lo = key
    raw = (hi & _MASK).to_bytes(8, "little") + (lo & _MASK).to_bytes(8, "little") + tag
    return _split(hashlib.blake2b(raw, digest_size=16).digest())


def from_text(text: str) -> "tuple[int, int]":
    """A key for an engine's string key."""
    return _split(hashlib.blake2b(text.encode(), digest_size=16).digest())
