"""Stand-in of the ``vllm.v1.attention`` package."""
