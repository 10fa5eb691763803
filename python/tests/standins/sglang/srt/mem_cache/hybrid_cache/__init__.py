"""Stand-in of ``python/sglang/srt/mem_cache/hybrid_cache`` (sgl-project/sglang); see ``sglang/__init__.py``."""
