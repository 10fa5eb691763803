"""Stand-in of ``vllm/utils/math_utils.py``: ``cdiv`` and ``round_down``
(imported by single_type_kv_cache_manager.py@129ab7c60cbb8eb11e875373e67f7e521b74aa30).
"""


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def round_down(x: int, y: int) -> int:
    return (x // y) * y
