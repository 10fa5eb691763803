"""Stand-in of the ``vllm.v1.executor`` package."""

from .abstract import Executor  # noqa: F401
