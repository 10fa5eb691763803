"""Stand-in of the ``vllm.distributed.kv_transfer.kv_connector`` package."""
