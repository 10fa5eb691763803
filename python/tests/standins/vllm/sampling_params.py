"""Stand-in of ``vllm/sampling_params.py``: the fields the scheduler and a
connector read (not read upstream; vllm/v1/request.py copies index
6246442265 and 52588301725 show how a Request takes them).

Facts relied on: ``Request.max_tokens`` comes from ``sampling_params.max_tokens``;
a request's ``kv_transfer_params`` come from
``sampling_params.extra_args["kv_transfer_params"]`` (vllm/v1/request.py, all
recent versions). The stand-in model samples greedily and has no EOS, so only
``max_tokens`` stops a request (``check_stop``'s length cap).
"""

from dataclasses import dataclass
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    ignore_eos: bool = True
    extra_args: dict[str, Any] | None = None
    num_logprobs: int | None = None
