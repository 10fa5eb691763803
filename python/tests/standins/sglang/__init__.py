"""A small stand-in of SGLang (sgl-project/sglang) for kvmesh's tests: the
HiCache L3 storage-backend contract, and the code that loads and drives a
backend, at the module paths SGLang has, so that ``import sglang.srt...``
resolves here when ``python/tests/standins`` is first on ``sys.path``.

SGLang itself cannot be installed in kvmesh's test environment. Nothing here
is copied from SGLang: every module is written from facts read in upstream's
files, and its docstring names the file(s) and commit(s) it follows and the
facts it relies on. When upstream moves, updating the stand-in is the change:
re-read the named files at the new commit and adjust the module that names
them.

Upstream files followed (all in sgl-project/sglang):

* ``python/sglang/srt/mem_cache/hicache_storage.py``,
  ``python/sglang/srt/mem_cache/storage/backend_factory.py`` and
  ``python/sglang/srt/managers/cache_controller.py`` at
  001067fffe33427bee0ed2f007fb7551a1d76b44 (the target commit);
* host pools: ``pool_host/base.py`` @ 049f8e64daef5f97982ffd46d89c2277ce260a16,
  ``pool_host/common.py`` @ 59cbeaefe666c63cd4d0fe8919a25814ea2e66e2,
  ``pool_host/mha.py`` @ 0047d999bb3a3ad311df5a4b6356bfb5586e0d66,
  ``pool_host/mla.py`` @ 01c0ede38cc9645488fd2847dbea8a2f6a9241d8,
  ``pool_host/mamba.py`` @ 02f0c2a0f8e4540dd6484b74f3d5b4ea4509f206,
  ``pool_host/dsa.py`` @ 03ba7b5b7dd249244bd5af01b236fd6449c66e8d,
  ``pool_host/group.py`` @ 0142dde6f8f9ca74d5572c9572da056ab912152e;
* ``mem_cache/hybrid_cache/hybrid_cache_controller.py`` @
  00343773d3293d382f0b39101f36b656d30ad2f0;
* ``mem_cache/utils.py`` (``get_hash_str``; pure-Python bodies of several
  versions, same semantics as the native hash of
  ``mem_cache/cpp_utils/hash_binding.cpp`` @ 30a90c4f837192e0aa4dafcc12e38c315fb4185c);
* ``mem_cache/memory_pool.py`` (device pools, as shape descriptors: what the
  host pools and the controller read from them);
* ``observability/metrics_collector.py`` @ 44cedc2b9c7dd31d9acae4498ea4fa0d3665feed
  (``StorageMetrics``, which a backend's ``get_stats`` returns, and how the
  radix cache logs it).

Stand-in only (no upstream module): ``srt/standin_dist.py`` (in-process
process groups for the controllers' MIN all-reduces) and
``srt/managers/standin_scheduler.py`` (the scheduler / radix-cache side of a
rank: hashes for backups, host allocation for prefetches, bounded waits on
the controller's queues).

The files other than the three at 001067ff are not from that commit; where
they disagree with it, the 001067ff files win (kvmesh's
``/work/notes/sglang-facts.md`` has the facts, section by section).

What is left out: the GPU side (device pools are shape descriptors, host
pools hold CPU tensors, no device <-> host kernels), the radix tree, and
``torch.distributed`` (ranks are controllers in one process that reduce
through ``sglang.srt.standin_dist``). Helpers that exist only in the
stand-in carry "standin" in their module name.

Used by ``python/tests/test_sglang_engine.py``, which puts
``python/tests/standins`` first on ``sys.path`` itself.
"""
