"""Stand-in of ``vllm/utils/func_utils.py::supports_kw``.

Facts relied on (factory.py, 003df29 era, facts §2a): the factory rejects a
module-path connector class when ``not supports_kw(connector_cls,
"kv_cache_config")``. ``supports_kw`` inspects the callable's signature (for a
class, its ``__init__``): True when a parameter of that name can be passed by
keyword, or when the signature ends in ``**kwargs``.
"""

import inspect
from typing import Any, Callable


def supports_kw(callable: Callable[..., Any], kw_name: str, *, requires_kw_only: bool = False,
                allow_var_kwargs: bool = True) -> bool:
    try:
        params = inspect.signature(callable).parameters
    except (TypeError, ValueError):
        return False
    if not params:
        return False
    param = params.get(kw_name)
    passable_as_kw = param is not None and param.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if passable_as_kw and (not requires_kw_only or param.kind == inspect.Parameter.KEYWORD_ONLY):
        return True
    if requires_kw_only and passable_as_kw:
        return False
    last = params[next(reversed(params))]
    return allow_var_kwargs and last.kind == inspect.Parameter.VAR_KEYWORD
