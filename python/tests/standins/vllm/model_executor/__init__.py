"""Stand-in of the ``vllm.model_executor`` package."""
