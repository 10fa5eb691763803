"""Stand-in of ``vllm/engine/arg_utils.py``: the command-line flags a user
passes to ``vllm serve`` for a KV connector, parsed the way vLLM parses them.

Facts relied on (facts §3, "CLI"): ``--kv-transfer-config '<JSON>'`` takes a
JSON object whose keys are ``KVTransferConfig`` field names and becomes
``KVTransferConfig(**json.loads(value))``; ``--disable-hybrid-kv-cache-manager``
/ ``--no-disable-hybrid-kv-cache-manager`` set the tri-state
``SchedulerConfig.disable_hybrid_kv_cache_manager`` to True / False (absent:
None); ``--block-size``, ``--tensor-parallel-size``,
``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
``--enforce-eager``. The dotted form (``--kv-transfer-config.kv_role x``) is
not modelled.

``parse_kv_transfer_config(text)`` is the helper the tests use on the exact
JSON string a user pastes after ``--kv-transfer-config``.
"""

import argparse
import json
from dataclasses import dataclass, field

from vllm.config import (AttentionConfig, CacheConfig, CompilationConfig, KVTransferConfig, ModelConfig,
                         ParallelConfig, SchedulerConfig, VllmConfig)


def parse_kv_transfer_config(text: str) -> KVTransferConfig:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--kv-transfer-config takes a JSON object")
    return KVTransferConfig(**value)


@dataclass
class EngineArgs:
    model: str = "standin/toy-4l"
    block_size: int = 16
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool | None = None
    disable_hybrid_kv_cache_manager: bool | None = None
    kv_transfer_config: KVTransferConfig | None = None
    attention_backend: str | None = None
    enforce_eager: bool = False
    num_gpu_blocks_override: int | None = None
    extra: dict = field(default_factory=dict)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--model", default=EngineArgs.model)
        parser.add_argument("--block-size", type=int, default=EngineArgs.block_size)
        parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
        parser.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction,
                            default=None)
        parser.add_argument("--kv-transfer-config", type=parse_kv_transfer_config, default=None)
        parser.add_argument("--attention-backend", default=None)
        parser.add_argument("--enforce-eager", action="store_true")
        parser.add_argument("--num-gpu-blocks-override", type=int, default=None)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(model=args.model, block_size=args.block_size, tensor_parallel_size=args.tensor_parallel_size,
                   enable_prefix_caching=args.enable_prefix_caching,
                   disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
                   kv_transfer_config=args.kv_transfer_config, attention_backend=args.attention_backend,
                   enforce_eager=args.enforce_eager, num_gpu_blocks_override=args.num_gpu_blocks_override)

    def create_engine_config(self, model_config: ModelConfig | None = None, **scheduler_kwargs) -> VllmConfig:
        mc = model_config or ModelConfig(model=self.model)
        mc.enforce_eager = mc.enforce_eager or self.enforce_eager
        cache = CacheConfig(block_size=self.block_size, num_gpu_blocks_override=self.num_gpu_blocks_override)
        if self.enable_prefix_caching is not None:
            cache.enable_prefix_caching = self.enable_prefix_caching
        return VllmConfig(
            model_config=mc, cache_config=cache,
            parallel_config=ParallelConfig(tensor_parallel_size=self.tensor_parallel_size),
            scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
                                             **scheduler_kwargs),
            compilation_config=CompilationConfig(), attention_config=AttentionConfig(backend=self.attention_backend),
            kv_transfer_config=self.kv_transfer_config)


def make_arg_parser() -> argparse.ArgumentParser:
    return EngineArgs.add_cli_args(argparse.ArgumentParser(prog="vllm serve"))
