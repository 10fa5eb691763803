"""Stand-in of the ``vllm.v1.attention.backends.mla`` package."""
