"""Simulated processes: the per-process globals of vLLM, kept per simulated
process because every engine core and every worker of the stand-in runs in
this one Python process.

Real vLLM runs the engine core (scheduler, scheduler-side connector) in one
process and, with more than one worker, each worker (model runner,
worker-side connector) in its own process; a single worker runs inside the
engine-core process ("uni" executor). Per process it keeps: the tensor/pipeline parallel groups
(``vllm/distributed/parallel_state.py`` ``_TP``/``_PP``), the worker's KV
connector agent (``vllm/distributed/kv_transfer/kv_transfer_state.py``
``_KV_CONNECTOR_AGENT``), the current VllmConfig (``vllm/config``
``set_current_vllm_config``) and the forward context
(``vllm/forward_context.py``). Here each of those lives on a
``SimulatedProcess``; the module-level "current" process is set by whoever
calls into a connector (the worker before it calls its connector, the engine
core around its scheduler), so ``get_tensor_model_parallel_rank()`` called
from a worker-side connector answers that worker's rank, and called from the
scheduler side of a multi-worker engine raises AssertionError as in vLLM (no
group initialised in the engine-core process then).

Limitation: the current process is one module global, not thread-local; a
connector's background thread that calls ``parallel_state`` after the call
that started it has returned sees whichever process is current then. Connectors
that read their rank in ``__init__`` (the usual way) are unaffected.
"""

import contextlib
import itertools

_ids = itertools.count()


class SimulatedProcess:
    def __init__(self, name: str):
        self.name = f"{name}#{next(_ids)}"
        self.tp_group = None
        self.pp_group = None
        self.world_group = None
        self.kv_connector_agent = None
        self.vllm_config = None
        self.forward_context = None

    @contextlib.contextmanager
    def active(self):
        global _current
        prev, _current = _current, self
        try:
            yield self
        finally:
            _current = prev

    def __repr__(self):
        return f"SimulatedProcess({self.name})"


# The driver (the test itself): nothing initialised, like an API-server process.
DRIVER = SimulatedProcess("driver")
_current = DRIVER


def current() -> SimulatedProcess:
    return _current
