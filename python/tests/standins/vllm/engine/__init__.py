"""Stand-in of the ``vllm.engine`` package (argument parsing only)."""
