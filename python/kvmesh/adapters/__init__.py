"""The engine-free cores of kvmesh's engine plug-ins (docs/engines.md).

Engines load the classes of :mod:`kvmesh.vllm` and :mod:`kvmesh.sglang`,
which derive from the engines' own base classes and from these cores:

- :mod:`kvmesh.adapters.vllm`: ``KvmeshConnector``, vLLM's KV connector v1
  (prefix lookup in whole blocks, per-layer asynchronous load and save of the
  paged KV in any layout vLLM hands out, hybrid KV-cache groups);
- :mod:`kvmesh.adapters.sglang`: ``KvmeshHiCacheStorage``, SGLang's HiCache
  L3 storage backend (generic and zero-copy page paths that agree, the v2
  pool API of hybrid models).

Neither imports its engine, so both run (and are tested) without it. Both
count their hits and say why they missed (``stats()``; ``serve_metrics`` for
a Prometheus ``/metrics``).
"""

from ._stats import MISS_REASONS, render_metrics, serve_metrics  # noqa: F401
