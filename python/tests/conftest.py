"""Fixtures of the kvmesh Python tests: an embedded cluster, and real daemons
(`kvmesh coordinator` + three `kvmesh node`s from cluster_configs/daemons-local.json
on 127.0.0.1, ports chosen at run time), always stopped at the end.

ctest sets PYTHONPATH (build/python), KVMESH_BIN, KVMESH_SOURCE_DIR and
KVMESH_TEST_TIME_SCALE (python/CMakeLists.txt; in sanitizer builds also
LD_PRELOAD and the sanitizer's options).
"""

import json
import os
import sys

import pytest

import kvmesh

# test_pip_install.py runs test files from a venv it installed kvmesh into:
# there, kvmesh must come from that venv, never from the build tree.
if os.environ.get("KVMESH_EXPECT_PACKAGE_IN"):
    assert kvmesh.__file__.startswith(os.environ["KVMESH_EXPECT_PACKAGE_IN"]), kvmesh.__file__

# The daemons' launcher, shared with tests/resp, tests/install_consumer and bench/ (tests/launch.py).
sys.path.insert(0, os.path.join(os.environ.get("KVMESH_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                                "tests"))
from launch import DAEMONS_CONFIG, KVMESH_BIN, SOURCE_DIR, TIME_SCALE, Daemons, scaled  # noqa: E402,F401

# The cluster the README starts for vLLM and SGLang (slots for runs of 36 KiB up to pages of 4 MiB).
ENGINES_CONFIG = os.path.join(SOURCE_DIR, "cluster_configs", "engines-local.json")

# The model of daemons-local.json, for embedded clusters the tests compare with it.
MODEL = {"model_id": "kvmesh-demo-1b", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
         "dtype": "fp16", "block_tokens": 16}


def embedded_config(nodes=3, memory="64MiB", **extra):
    cfg = {"model": dict(MODEL),
           "nodes": [{"id": f"e{i}", "memory": {"host": memory}} for i in range(nodes)],
           "store": {"slot_bytes": "1MiB"}}
    cfg.update(extra)
    return cfg


def daemons_over(backend, tmp_path, ucx=None):
    """Daemons of daemons-local.json with its $.transport.backend set (and
    $.transport.ucx merged with `ucx`; a copy in tmp_path), started."""
    cfg = json.load(open(DAEMONS_CONFIG))
    cfg["transport"]["backend"] = backend
    if ucx:
        cfg["transport"].setdefault("ucx", {}).update(ucx)
    path = tmp_path / f"{backend}.json"
    path.write_text(json.dumps(cfg))
    return Daemons(config=str(path)).start()


@pytest.fixture(scope="module")
def daemons():
    d = Daemons()
    try:
        yield d.start()
    finally:
        d.stop()


@pytest.fixture(scope="module")
def engine_daemons():
    """Daemons of cluster_configs/engines-local.json, the README's cluster for the engines."""
    d = Daemons(config=ENGINES_CONFIG)
    try:
        yield d.start()
    finally:
        d.stop()


@pytest.fixture
def embedded():
    with kvmesh.EmbeddedCluster(embedded_config(), tenant="tests") as c:
        yield c


@pytest.fixture(params=["embedded", "daemons"])
def client(request):
    """The same tests against an in-process cluster and against daemons (a tenant
    per test, so tests sharing the daemons never see each other's blocks)."""
    tenant = f"tests-{request.node.name}"
    if request.param == "embedded":
        c = kvmesh.EmbeddedCluster(embedded_config(), tenant=tenant)
    else:
        d = request.getfixturevalue("daemons")
        c = kvmesh.Client(d.address, tenant=tenant, timeout_ms=2000, refresh_ms=200)
    with c:
        yield c
