"""Stand-in of the ``vllm.v1.core`` package."""
