"""Stand-in of ``vllm/distributed/__init__.py``, which re-exports
``parallel_state`` (so ``from vllm.distributed import
get_tensor_model_parallel_rank`` works as upstream)."""

from .parallel_state import *  # noqa: F401,F403
from .parallel_state import __all__  # noqa: F401
