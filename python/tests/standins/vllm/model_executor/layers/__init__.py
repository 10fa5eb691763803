"""Stand-in of the ``vllm.model_executor.layers`` package."""
