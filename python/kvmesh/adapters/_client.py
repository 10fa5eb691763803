"""A kvmesh Client from an engine's plug-in configuration (vLLM's
``kv_connector_extra_config``, SGLang's ``hicache_storage_backend_extra_config``).

Keys read: ``coordinator`` ("host:port" of ``kvmesh coordinator``) or
``config`` (a cluster config file whose coordinator and ``$.auth.token`` are
used), ``tenant`` (salts every key; with ``token`` also the identity of
``$.auth.tenants``), ``token``, ``timeout_ms`` (default 2000),
``connect_timeout_ms`` (default 1000).
"""

from typing import Any, Mapping

from .. import Client

KEYS = ("coordinator", "config", "tenant", "token", "timeout_ms", "connect_timeout_ms")


def make_client(extra: Mapping[str, Any], *, engine: str, client_id: str) -> Client:
    if not extra.get("coordinator") and not extra.get("config"):
        where = {"vllm": "kv_connector_extra_config", "sglang": "hicache_storage_backend_extra_config"}[engine]
        raise ValueError(f'kvmesh: {where} needs "coordinator": "host:port" (the address `kvmesh coordinator` '
                         f'listens on) or "config": "cluster.json"; got keys {sorted(extra)}')
    kw = {"tenant": str(extra.get("tenant", "")), "client_id": client_id}
    if extra.get("token") is not None:
        kw["token"] = str(extra["token"])
    for k in ("timeout_ms", "connect_timeout_ms"):
        if extra.get(k) is not None:
            kw[k] = int(extra[k])
    return Client(extra.get("coordinator"), config=extra.get("config"), **kw)
