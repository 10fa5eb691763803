"""Stand-in of ``python/sglang/srt`` (sgl-project/sglang); see ``sglang/__init__.py``."""
