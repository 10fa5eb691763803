"""Stand-in of the ``vllm.v1.attention.backends`` package.

``get_backend_class(name)`` maps the stand-in's backend names (see
vllm/config/attention.py) to classes.
"""


def get_backend_class(name: str):
    from .flash_attn import FlashAttentionBackend, FlashAttentionPackedBackend
    from .flashinfer import FlashInferBackend
    from .mla.flashmla import FlashMLABackend
    return {"FLASH_ATTN": FlashAttentionBackend, "FLASH_ATTN_PACKED": FlashAttentionPackedBackend,
            "FLASHINFER": FlashInferBackend, "FLASHMLA": FlashMLABackend}[name]
