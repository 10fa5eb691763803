"""Stand-in of ``vllm/config/attention.py`` (``AttentionConfig.backend``). Not
read upstream; upstream picks the backend from ``--attention-backend`` and the
platform; the stand-in lets a test pick the backend *and its era* here.

The stand-in's backends (vllm/v1/attention/backends/): "FLASH_ATTN" (the
≤0.25 5-D K/V split, facts §7a), "FLASH_ATTN_PACKED" (a stand-in name for the
FlashAttention backend after "[2/N] Pack K/V into the content dim", #44455,
facts §7b), "FLASHINFER" (facts §7a) and "FLASHMLA" (MLA, facts §7a). None
picks FLASHMLA for MLA models and FLASH_ATTN otherwise.
"""

from dataclasses import dataclass


@dataclass
class AttentionConfig:
    backend: str | None = None
