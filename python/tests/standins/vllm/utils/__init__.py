"""Stand-in of the ``vllm.utils`` package (only what the stand-in needs)."""
