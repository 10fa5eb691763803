"""Stand-in of ``vllm/config/compilation.py``: ``CUDAGraphMode`` and the two
``CompilationConfig`` fields the connector path touches.

Facts relied on: ``CUDAGraphMode`` members NONE, PIECEWISE, FULL,
FULL_DECODE_ONLY, FULL_AND_PIECEWISE and ``has_full_cudagraphs()`` (True for
the three FULL* modes); ``VllmConfig.__post_init__`` downgrades
``compilation_config.cudagraph_mode`` to PIECEWISE when the connector class's
``requires_piecewise_for_cudagraph(extra_config)`` is True (facts §2c; the
secondary copy of config/vllm.py, index 52173854056); ``enforce_eager`` then
sets NONE. ``static_forward_context`` maps layer name -> attention layer
(``ForwardContext.no_compile_layers``); each worker process has its own.
The default mode, FULL_AND_PIECEWISE, is upstream's v1 default.
"""

import enum
from dataclasses import dataclass, field


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = 3
    FULL_AND_PIECEWISE = 4

    def has_full_cudagraphs(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE)

    def has_piecewise_cudagraphs(self) -> bool:
        return self in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


@dataclass
class CompilationConfig:
    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.FULL_AND_PIECEWISE
    static_forward_context: dict = field(default_factory=dict, repr=False)
