"""The data calls' options are written once (python/src/options.h): every call
shows them in help() as keyword-only arguments with their types and defaults,
and python/kvmesh/_core.pyi declares the same names and types (CallOptions)
for every call it gives **options."""

import ast
import os
import re

import pytest

import kvmesh

STUBS = os.path.join(os.path.dirname(kvmesh.__file__), "_core.pyi")

# What help() shows after "*," for each option, in the table's order.
OPTIONS = [("priority", "int", "1"), ("layers", "Optional[Tuple[int, int]]", "None"),
           ("heads", "Optional[Tuple[int, int]]", "None"), ("timeout_ms", "int", "0"),
           ("expert", "Optional[int]", "None"), ("layer_group", "Optional[int]", "None"),
           ("rank", "Optional[int]", "None"), ("score", "float", "0.0"), ("replace", "bool", "False")]

CALLS = {"Client": ["keys", "match_prefix", "put", "get", "get_into", "put_from", "get_into_ptrs", "put_from_ptrs",
                    "exists", "exists_each", "erase", "release", "create_sequence"],
         "Sequence": ["append", "truncate", "fork", "release", "info", "read"]}


def stubs():
    return ast.parse(open(STUBS).read())


def stub_options():
    """CallOptions of the stubs: name -> annotation as written."""
    cls = next(n for n in stubs().body if isinstance(n, ast.ClassDef) and n.name == "CallOptions")
    return {a.target.id: ast.unparse(a.annotation) for a in cls.body if isinstance(a, ast.AnnAssign)}


@pytest.mark.parametrize("cls,name", [(c, n) for c, ns in CALLS.items() for n in ns])
def test_help_shows_every_option_with_its_type_and_default(cls, name):
    signature = getattr(getattr(kvmesh, cls), name).__doc__.splitlines()[0]
    shown = ", ".join(f"{n}: {t} = {d}" for n, t, d in OPTIONS)
    assert re.search(r"\*, (.*, )?" + re.escape(shown) + r", \*\*kwargs\)", signature), signature
    assert "priority: int = 1  eviction class" in getattr(kvmesh, cls).__dict__[name].__doc__


def test_the_stubs_declare_the_same_options():
    assert list(stub_options().items()) == [(n, t) for n, t, _ in OPTIONS]


def test_every_stub_call_with_options_is_a_bound_call_with_options():
    with_options = set()
    for cls in (n for n in stubs().body if isinstance(n, ast.ClassDef)):
        for f in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            if f.args.kwarg is not None and f.args.kwarg.arg == "options":
                assert ast.unparse(f.args.kwarg.annotation) == "Unpack[CallOptions]", (cls.name, f.name)
                with_options.add((cls.name, f.name))
    assert with_options == {(c, n) for c, ns in CALLS.items() for n in ns}


def test_options_are_keyword_only_and_unknown_ones_raise():
    with kvmesh.EmbeddedCluster({"model": {"model_id": "m", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8,
                                           "dtype": "fp16", "block_tokens": 4},
                                 "nodes": [{"id": "e0", "memory": {"host": "8MiB"}}],
                                 "store": {"slot_bytes": "64KiB"}}) as c:
        assert c.match_prefix(list(range(8)), priority=0, layers=None, expert=None, score=0.5, replace=False) == 0
        with pytest.raises(TypeError):
            c.match_prefix(list(range(8)), 1)  # not positional
        with pytest.raises(kvmesh.InvalidArgumentError, match="unknown option 'colour'"):
            c.match_prefix(list(range(8)), colour="blue")
        with pytest.raises(kvmesh.InvalidArgumentError, match="priority"):
            c.match_prefix(list(range(8)), priority="high")
