"""Stand-in of ``python/sglang/srt/mem_cache/storage/backend_factory.py``,
sgl-project/sglang @ 001067fffe33427bee0ed2f007fb7551a1d76b44.

Facts relied on:

* ``StorageBackendFactory._registry``: name -> lazy loader, module path,
  class name; ``register_backend(name, module_path, class_name)``.
* ``_load_backend_class(module_path, class_name, backend_name)``:
  ``importlib.import_module`` then ``getattr``; a class that is not a
  subclass of ``HiCacheStorage`` raises TypeError; ImportError and
  AttributeError are re-raised naming the backend / module.
* ``create_backend(backend_name, storage_config, mem_pool_host, **kwargs)``:
  a registered name -> ``_create_builtin_backend``; ``"dynamic"`` with
  ``storage_config.extra_config`` not None -> ``_create_dynamic_backend``;
  anything else -> ValueError("Unknown storage backend ...").
* ``_create_dynamic_backend``: the fields ``backend_name``, ``module_path``,
  ``class_name`` of extra_config are required (ValueError "Missing required
  field ..."); the instance is made as exactly ``backend_class(storage_config,
  kwargs)``, the kwargs **dict** as second positional argument (the
  controller passes none, so it is ``{}``); ``mem_pool_host`` is not given to a
  dynamic backend (it arrives through ``register_mem_pool_host``); errors are
  logged and re-raised. ``interface_v1`` is not read here.
* Built-ins: ``file`` / ``sim`` / ``nixl`` -> ``cls(storage_config)``;
  ``mooncake``, ``aibrix``, ``eic``, ``simm``, ``mori``, ``shm``, ``kvcc`` ->
  ``cls(storage_config, mem_pool_host)``; ``hf3fs`` ->
  ``cls.from_env_config(bytes_per_page, mem_pool_host.dtype, storage_config)``
  with bytes_per_page = ksize_per_token * page_size (page_first,
  page_first_direct) or size_per_token * page_size (layer_first). All are
  registered under upstream's module paths; only ``file`` (``HiCacheFile`` of
  the stand-in's ``hicache_storage``) exists in the stand-in, the others
  fail to import.
"""

import importlib
import logging
from typing import Any, Dict

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

logger = logging.getLogger(__name__)


class StorageBackendFactory:
    _registry: Dict[str, Dict[str, Any]] = {}

    @staticmethod
    def _load_backend_class(module_path: str, class_name: str, backend_name: str):
        try:
            module = importlib.import_module(module_path)
            backend_class = getattr(module, class_name)
            if not issubclass(backend_class, HiCacheStorage):
                raise TypeError(f"Backend class {class_name} must inherit from HiCacheStorage")
            return backend_class
        except ImportError as e:
            raise ImportError(f"Failed to import backend '{backend_name}' from '{module_path}': {e}") from e
        except AttributeError as e:
            raise AttributeError(f"Class '{class_name}' not found in module '{module_path}': {e}") from e

    @classmethod
    def register_backend(cls, name: str, module_path: str, class_name: str) -> None:
        def loader():
            return cls._load_backend_class(module_path, class_name, name)

        cls._registry[name] = {"loader": loader, "module_path": module_path, "class_name": class_name}

    @classmethod
    def create_backend(cls, backend_name: str, storage_config: HiCacheStorageConfig, mem_pool_host: Any,
                       **kwargs) -> HiCacheStorage:
        if backend_name in cls._registry:
            backend_class = cls._registry[backend_name]["loader"]()
            return cls._create_builtin_backend(backend_name, backend_class, storage_config, mem_pool_host)
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            return cls._create_dynamic_backend(storage_config.extra_config, storage_config, mem_pool_host,
                                               **kwargs)
        raise ValueError(f"Unknown storage backend '{backend_name}'. "
                         f"Registered backends: {list(cls._registry)}. ")

    @classmethod
    def _create_dynamic_backend(cls, backend_config: Dict[str, Any], storage_config: HiCacheStorageConfig,
                                mem_pool_host: Any, **kwargs) -> HiCacheStorage:
        for field in ("backend_name", "module_path", "class_name"):
            if field not in backend_config:
                raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
        name = backend_config["backend_name"]
        try:
            backend_class = cls._load_backend_class(backend_config["module_path"], backend_config["class_name"],
                                                    name)
            return backend_class(storage_config, kwargs)
        except Exception as e:
            logger.error("Failed to create dynamic storage backend '%s': %s", name, e)
            raise

    @classmethod
    def _create_builtin_backend(cls, backend_name, backend_class, storage_config, mem_pool_host):
        if backend_name in ("file", "sim", "nixl"):
            return backend_class(storage_config)
        if backend_name in ("mooncake", "aibrix", "eic", "simm", "mori", "shm", "kvcc"):
            return backend_class(storage_config, mem_pool_host)
        if backend_name == "hf3fs":
            if mem_pool_host.layout in ("page_first", "page_first_direct"):
                bytes_per_page = mem_pool_host.get_ksize_per_token() * mem_pool_host.page_size
            elif mem_pool_host.layout == "layer_first":
                bytes_per_page = mem_pool_host.get_size_per_token() * mem_pool_host.page_size
            return backend_class.from_env_config(bytes_per_page, mem_pool_host.dtype, storage_config)
        raise ValueError(f"Unknown built-in backend: {backend_name}")


for _name, _module, _cls in (
    ("file", "sglang.srt.mem_cache.hicache_storage", "HiCacheFile"),
    ("sim", "sglang.srt.mem_cache.storage.sim_storage", "SimHiCacheStorage"),
    ("nixl", "sglang.srt.mem_cache.storage.nixl.hicache_nixl", "HiCacheNixl"),
    ("mooncake", "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store", "MooncakeStore"),
    ("hf3fs", "sglang.srt.mem_cache.storage.hf3fs.storage_hf3fs", "HiCacheHF3FS"),
    ("aibrix", "sglang.srt.mem_cache.storage.aibrix_kvcache.aibrix_kvcache_storage", "AibrixKVCacheStorage"),
    ("eic", "sglang.srt.mem_cache.storage.eic.eic_storage", "EICStorage"),
    ("simm", "sglang.srt.mem_cache.storage.simm.hicache_simm", "HiCacheSiMM"),
    ("mori", "sglang.srt.mem_cache.storage.umbp.umbp_store", "UMBPStore"),
    ("shm", "sglang.srt.mem_cache.storage.shm", "HiCacheShm"),
    ("kvcc", "sglang.srt.mem_cache.storage.kvcc.kvcc_store", "KVCCStore"),
):
    StorageBackendFactory.register_backend(_name, _module, _cls)
