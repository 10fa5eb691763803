"""Adapters that give kvmesh the shape of an inference engine's KV-cache plug-in.

- :mod:`kvmesh.adapters.sglang`: ``KvmeshHiCacheStorage``, SGLang's HiCache L3
  storage backend (page keys, zero-copy batch get/set into the host pool).
- :mod:`kvmesh.adapters.vllm`: ``KvmeshConnector``, vLLM's KV connector v1
  (prefix match in tokens, per-layer asynchronous load and save of paged blocks).

Neither imports its engine: they follow the engines' base classes method for
method, and the tests drive them with tensors laid out as the engines lay out
their KV.
"""
