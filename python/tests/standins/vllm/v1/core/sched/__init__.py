"""Stand-in of the ``vllm.v1.core.sched`` package."""
