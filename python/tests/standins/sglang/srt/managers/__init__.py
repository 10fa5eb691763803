"""Stand-in of ``python/sglang/srt/managers`` (sgl-project/sglang); see ``sglang/__init__.py``."""
