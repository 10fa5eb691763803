"""Stand-in of the ``vllm.v1`` package."""
