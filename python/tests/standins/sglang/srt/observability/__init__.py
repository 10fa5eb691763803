"""Stand-in of ``python/sglang/srt/observability`` (sgl-project/sglang); see ``sglang/__init__.py``."""
