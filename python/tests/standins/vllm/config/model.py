"""Stand-in of ``vllm/config/model.py`` (``ModelConfig``), describing the toy
model directly instead of reading an HF config. Not read upstream: the
members are those scheduler.py@003df2961dd8830c317a61f9745ccd557da9fa06 reads
(max_model_len, is_encoder_decoder, is_diffusion) and those in-tree
connectors read (facts §9: ``use_mla`` in NixlConnector's
``get_required_kvcache_layout``; ``get_num_kv_heads`` / ``get_head_size`` in
the KV-size computations of the connectors listed there).

Facts relied on (methods connectors call on ``vllm_config.model_config``):
``model`` (name), ``dtype`` (a torch.dtype after resolution), ``use_mla``,
``max_model_len``, ``is_encoder_decoder`` (the scheduler asserts it is False
with a connector), ``enforce_eager`` (VllmConfig turns CUDA graphs off),
``get_num_layers(parallel_config)``, ``get_total_num_kv_heads()``,
``get_num_kv_heads(parallel_config)`` = max(1, total // tp) (1 for MLA),
``get_head_size()`` (kv_lora_rank + qk_rope_head_dim for MLA),
``get_sliding_window()``, ``hf_config`` (``num_hidden_layers``,
``num_key_value_heads``, ``head_dim``, ``sliding_window``, ``layer_types``).

Stand-in fields: ``layer_types`` (per layer "full_attention" or
"sliding_attention"; default all full) and ``sliding_window``.
"""

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

_DTYPES = {"float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
           "auto": torch.float16}


@dataclass
class ModelConfig:
    model: str = "standin/toy-4l"
    dtype: "torch.dtype | str" = torch.float16
    use_mla: bool = False
    num_layers: int = 4
    num_kv_heads: int = 4
    head_size: int = 64
    layer_types: tuple | None = None
    sliding_window: int | None = None
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    vocab_size: int = 32000
    max_model_len: int = 1024
    enforce_eager: bool = False
    is_encoder_decoder: bool = False
    is_diffusion: bool = False
    hf_config: object = field(default=None, repr=False)

    def __post_init__(self):
        if isinstance(self.dtype, str):
            self.dtype = _DTYPES[self.dtype]
        if self.layer_types is None:
            self.layer_types = ("full_attention",) * self.num_layers
        self.layer_types = tuple(self.layer_types)
        assert len(self.layer_types) == self.num_layers
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need sliding_window")
        if self.use_mla and "sliding_attention" in self.layer_types:
            raise NotImplementedError("stand-in: sliding-window MLA is not modelled")
        if self.hf_config is None:
            self.hf_config = SimpleNamespace(
                num_hidden_layers=self.num_layers, num_key_value_heads=self.num_kv_heads,
                head_dim=self.head_size, sliding_window=self.sliding_window,
                layer_types=list(self.layer_types), kv_lora_rank=self.kv_lora_rank if self.use_mla else None,
                qk_rope_head_dim=self.qk_rope_head_dim if self.use_mla else None, model_type="standin")

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.dtype

    def get_num_layers(self, parallel_config=None) -> int:
        return self.num_layers

    def get_total_num_kv_heads(self) -> int:
        return 1 if self.use_mla else self.num_kv_heads

    def get_num_kv_heads(self, parallel_config) -> int:
        if self.use_mla:
            return 1
        return max(1, self.num_kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self) -> int:
        if self.use_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_size

    def get_sliding_window(self) -> int | None:
        return self.sliding_window
