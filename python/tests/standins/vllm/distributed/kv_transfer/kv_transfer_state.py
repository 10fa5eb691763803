"""Stand-in of ``vllm/distributed/kv_transfer/kv_transfer_state.py``: the
worker process's connector agent.

Facts relied on (facts §2c; index ids 53166403148, 139062844):
``ensure_kv_transfer_initialized(vllm_config, kv_cache_config=None)`` returns
if ``kv_transfer_config`` is None; if ``is_kv_transfer_instance`` and no agent
exists yet, the agent becomes ``KVConnectorFactory.create_connector(
config=vllm_config, role=KVConnectorRole.WORKER, kv_cache_config=kv_cache_config)``
(keywords). ``get_kv_transfer_group()`` asserts an agent exists;
``has_kv_transfer_group()``; ``is_v1_kv_transfer_group(connector=None)`` is an
isinstance check on KVConnectorBase_V1; ``ensure_kv_transfer_shutdown()``
calls ``shutdown()`` and drops the agent. The worker calls
``ensure_kv_transfer_initialized`` before ``initialize_kv_cache`` (so the
connector exists before ``register_kv_caches``).

The agent is per simulated process (vllm._standin.process).
"""

from vllm._standin import process as _process


def get_kv_transfer_group():
    agent = _process.current().kv_connector_agent
    assert agent is not None, "disaggregated KV cache transfer parallel group is not initialized"
    return agent


def has_kv_transfer_group() -> bool:
    return _process.current().kv_connector_agent is not None


def is_v1_kv_transfer_group(connector=None) -> bool:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    if connector is None:
        connector = _process.current().kv_connector_agent
    if connector is None:
        return False
    return isinstance(connector, KVConnectorBase_V1)


def ensure_kv_transfer_initialized(vllm_config, kv_cache_config=None) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    ktc = vllm_config.kv_transfer_config
    if ktc is None:
        return
    proc = _process.current()
    if ktc.is_kv_transfer_instance and proc.kv_connector_agent is None:
        proc.kv_connector_agent = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.WORKER, kv_cache_config=kv_cache_config)


def ensure_kv_transfer_shutdown() -> None:
    proc = _process.current()
    if proc.kv_connector_agent is not None:
        proc.kv_connector_agent.shutdown()
        proc.kv_connector_agent = None
