"""A stand-in of vLLM (vllm-project/vllm) for kvmesh's tests: the parts that
load a v1 KV connector and call it, written from the facts in
/work/notes/vllm-facts.md and from upstream files read at the commits each
module's docstring names. No upstream code is copied.

Primary commit: 003df2961dd8830c317a61f9745ccd557da9fa06 ("003df29") for
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` and
``vllm/v1/core/sched/scheduler.py``; the other modules follow the 003df29 era
(see each docstring).

Module paths are upstream's, so ``import vllm...`` resolves here when
``python/tests/standins`` is first on ``sys.path`` (only
python/tests/test_vllm_engine.py does that). What is *not* upstream lives in
``vllm._standin`` (the simulated processes and the toy model).

When upstream moves, updating the stand-in is the change: every module lists
the facts (signatures, attribute reads, call order) it relies on.
"""

__version__ = "0.0.0+standin.003df29"
STANDIN = True
