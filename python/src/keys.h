// python/src/keys.h — key derivation for the engine adapters (docs/python.md,
// "Adapter keys"): the keys kvmesh.adapters give an engine's blocks and pages,
// computed in C++ and returned as (n, 2) uint64 numpy arrays, which every
// call of kvmesh.Client takes as keys without a Python object per key.
//
//   root    = H("kvmesh-adapter-v1" | salt)
//   chain_i = H(chain_{i-1} | tokens of block i as int32 LE)    (KeyDeriver::Chain)
//   derive  = H(key | tag)                                      one key per (key, tag)
//   text    = H("kvmesh-text-v1" | salt | 0x00 | text)
//
// H is xxHash3-128, as for every kvmesh key (kvmesh/block_key.h). These
// values are a storage format of the adapters: a golden test pins them.
//
// Thread-safety: the functions hold the GIL only to read their arguments and
// build the result.
#pragma once

#include "bindings.h"  // BindKeys binds the three functions
