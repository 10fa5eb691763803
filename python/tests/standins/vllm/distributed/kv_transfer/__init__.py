"""Stand-in of ``vllm/distributed/kv_transfer/__init__.py`` (re-exports of
kv_transfer_state, as upstream)."""

from .kv_transfer_state import (  # noqa: F401
    ensure_kv_transfer_initialized,
    ensure_kv_transfer_shutdown,
    get_kv_transfer_group,
    has_kv_transfer_group,
    is_v1_kv_transfer_group,
)
