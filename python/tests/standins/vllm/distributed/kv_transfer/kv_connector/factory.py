"""Stand-in of ``vllm/distributed/kv_transfer/kv_connector/factory.py`` of the
003df29 era (facts §2a: annotated copies, index ids 68509921217 and
58929518475, citing upstream L27-L145; not stored at 003df29 itself).

Facts relied on:
* ``_registry: dict[name, loader]``; ``register_connector(name, module_path,
  class_name)`` (ValueError on a duplicate) stores a lazy loader
  (import_module + getattr). The stand-in registers no in-tree connectors.
* ``get_connector_class(kv_transfer_config)``:
  ValueError "Connector name is not set in KVTransferConfig" when
  kv_connector is None; ValueError "kv_connector_module_path cannot be an
  empty string." for ""; **a set module path wins over the registry**:
  ``importlib.import_module(path)`` then ``getattr(module, name)``
  (AttributeError "Class {name} not found in {path}"), then ValueError when
  ``not supports_kw(cls, "kv_cache_config")`` (the deprecated 2-argument
  constructor; no fallback in this era); else the registry; else ValueError
  "Unsupported connector type: {name}".
* ``supports_hma_config(kv_transfer_config)``: imports the class; for
  anything but "MultiConnector" returns ``supports_hma(cls)``.
  (MultiConnector is not modelled.)
* ``create_connector(config, role, kv_cache_config)``: ValueError
  "kv_transfer_config must be set to create a connector" when None; class via
  get_connector_class; ``hma_enabled = not
  config.scheduler_config.disable_hybrid_kv_cache_manager``; if
  ``hma_enabled and not supports_hma_config(ktc)``: ValueError "Connector
  {cls.__name__} does not support HMA but HMA is enabled. Please set
  `--disable-hybrid-kv-cache-manager`."; logs; returns
  ``connector_cls(config, role, kv_cache_config)`` (three positionals).
"""

import importlib
from typing import Callable

from vllm.logger import init_logger
from vllm.utils.func_utils import supports_kw

from .v1.base import KVConnectorBase_V1, KVConnectorRole, supports_hma

logger = init_logger(__name__)


class KVConnectorFactory:
    _registry: dict[str, Callable[[], type[KVConnectorBase_V1]]] = {}

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader() -> type[KVConnectorBase_V1]:
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def create_connector(cls, config, role: KVConnectorRole, kv_cache_config) -> KVConnectorBase_V1:
        kv_transfer_config = config.kv_transfer_config
        if kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(kv_transfer_config)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not cls.supports_hma_config(kv_transfer_config):
            raise ValueError(f"Connector {connector_cls.__name__} does not support HMA but HMA is enabled. "
                             "Please set `--disable-hybrid-kv-cache-manager`.")
        logger.info("Creating v1 connector with name: %s and engine_id: %s", connector_cls.__name__,
                    kv_transfer_config.engine_id)
        return connector_cls(config, role, kv_cache_config)

    @classmethod
    def get_connector_class_by_name(cls, connector_name: str) -> type[KVConnectorBase_V1]:
        if connector_name not in cls._registry:
            raise ValueError(f"Connector '{connector_name}' is not registered.")
        return cls._registry[connector_name]()

    @classmethod
    def get_connector_class(cls, kv_transfer_config) -> type[KVConnectorBase_V1]:
        connector_name = kv_transfer_config.kv_connector
        if connector_name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        module_path = kv_transfer_config.kv_connector_module_path
        if module_path == "":
            raise ValueError("kv_connector_module_path cannot be an empty string.")
        if module_path is not None:
            module = importlib.import_module(module_path)
            try:
                connector_cls = getattr(module, connector_name)
            except AttributeError as e:
                raise AttributeError(f"Class {connector_name} not found in {module_path}") from e
            if not supports_kw(connector_cls, "kv_cache_config"):
                logger.error("Connector %s uses deprecated 2-argument constructor signature.", connector_name)
                raise ValueError(
                    f"Connector {connector_name} uses deprecated 2-argument constructor signature. "
                    "External v1 KV connectors must accept kv_cache_config as the third constructor "
                    "argument and pass it to super().__init__().")
            return connector_cls
        if connector_name in cls._registry:
            return cls._registry[connector_name]()
        raise ValueError(f"Unsupported connector type: {connector_name}")

    @classmethod
    def supports_hma_config(cls, kv_transfer_config) -> bool:
        connector_cls = cls.get_connector_class(kv_transfer_config)
        if kv_transfer_config.kv_connector != "MultiConnector":
            return supports_hma(connector_cls)
        raise NotImplementedError("stand-in: MultiConnector is not modelled")
