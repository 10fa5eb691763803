"""Fixtures of the kvmesh Python tests: an embedded cluster, and real daemons
(`kvmesh coordinator` + three `kvmesh node`s from cluster_configs/daemons-local.json
on 127.0.0.1, ports chosen at run time), always stopped at the end.

ctest sets PYTHONPATH (build/python), KVMESH_BIN, KVMESH_SOURCE_DIR and
KVMESH_TEST_TIME_SCALE (python/CMakeLists.txt; in sanitizer builds also
LD_PRELOAD and the sanitizer's options).
"""

import ctypes
import json
import os
import re
import select
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest

import kvmesh

# test_pip_install.py runs test files from a venv it installed kvmesh into:
# there, kvmesh must come from that venv, never from the build tree.
if os.environ.get("KVMESH_EXPECT_PACKAGE_IN"):
    assert kvmesh.__file__.startswith(os.environ["KVMESH_EXPECT_PACKAGE_IN"]), kvmesh.__file__

SOURCE_DIR = os.environ.get("KVMESH_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
KVMESH_BIN = os.environ.get("KVMESH_BIN", os.path.join(SOURCE_DIR, "build", "bin", "kvmesh"))
DAEMONS_CONFIG = os.path.join(SOURCE_DIR, "cluster_configs", "daemons-local.json")
# The cluster the README starts for vLLM and SGLang (slots for runs of 36 KiB up to pages of 4 MiB).
ENGINES_CONFIG = os.path.join(SOURCE_DIR, "cluster_configs", "engines-local.json")

# The build's slowdown factor (cmake/KvmeshHelpers.cmake: 1, or 4 with a
# sanitizer), as tests/test_time.h's TimeBound has it for the C++ tests.
TIME_SCALE = int(os.environ.get("KVMESH_TEST_TIME_SCALE", "1"))


def scaled(t):
    """A time bound grown with the build: one that only keeps a broken test
    from hanging (a daemon's start, a child's run), or a client timeout the
    running nodes must answer within (together with the bounds derived from
    it). A bound that is itself the behaviour under test stays as it is."""
    return t * TIME_SCALE

# What a sanitizer build's daemon writes to stderr when it finds a bug (ASan,
# LeakSanitizer, TSan, UBSan).
SANITIZER_REPORT = re.compile(r"(ERROR|WARNING): (Address|Leak|Thread)Sanitizer|runtime error:|Sanitizer: CHECK failed")

# The model of daemons-local.json, for embedded clusters the tests compare with it.
MODEL = {"model_id": "kvmesh-demo-1b", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
         "dtype": "fp16", "block_tokens": 16}


def embedded_config(nodes=3, memory="64MiB", **extra):
    cfg = {"model": dict(MODEL),
           "nodes": [{"id": f"e{i}", "memory": {"host": memory}} for i in range(nodes)],
           "store": {"slot_bytes": "1MiB"}}
    cfg.update(extra)
    return cfg


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """In the child before exec: SIGKILL when the test process dies, so a
    pytest killed by ctest's timeout (no fixture teardown) leaves no daemon."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Daemons:
    """A coordinator and nodes as child processes (each in its own process
    group, killed with the test process if it dies first)."""

    def __init__(self, config=DAEMONS_CONFIG, nodes=("n0", "n1", "n2"), timeout_s=15.0, secret=None):
        self.config, self.node_ids, self.timeout_s = config, nodes, scaled(timeout_s)
        self.secret = secret  # the config's $.auth.token, for the coordinator's /nodes
        self.procs = {}
        self.logs = {}
        self.listening = {}
        self.address = None

    def _start(self, name, args):
        log = tempfile.TemporaryFile()
        p = subprocess.Popen([KVMESH_BIN] + args, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                             preexec_fn=_die_with_parent)
        self.procs[name], self.logs[name] = p, log
        end = time.monotonic() + self.timeout_s
        buf = b""
        while time.monotonic() < end:
            r, _, _ = select.select([p.stdout], [], [], 0.2)
            if not r:
                if p.poll() is not None:
                    break
                continue
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.split(b"\n")[:-1]:
                if line.startswith(b"{"):
                    ev = json.loads(line)
                    if ev.get("event") == "listening":
                        self.listening[name] = ev
                        return ev
        raise RuntimeError(f"{name} did not start: {self.log(name)}")

    def log(self, name):
        f = self.logs[name]
        f.seek(0)
        return f.read().decode(errors="replace")[-2000:]

    def start(self):
        ev = self._start("coordinator", ["coordinator", "--config", self.config, "--port", "0"])
        self.address = f"127.0.0.1:{ev['ports']['http']}"
        for n in self.node_ids:
            self._start(n, ["node", "--config", self.config, "--id", n, "--coordinator", self.address])
        self.wait_nodes(len(self.node_ids))
        return self

    def wait_nodes(self, n):
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            try:
                req = urllib.request.Request(f"http://{self.address}/nodes")
                if self.secret:
                    req.add_header("Authorization", f"Bearer {self.secret}")
                with urllib.request.urlopen(req, timeout=1) as r:
                    if len(json.loads(r.read())["nodes"]) == n:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the coordinator did not list {n} nodes")

    def signal(self, name, sig):
        os.killpg(self.procs[name].pid, sig)

    def stop(self):
        """Stops every daemon still running with SIGTERM (a clean exit, which
        runs a sanitizer build's leak check), SIGKILL after a bound. Raises
        AssertionError when one of them did not exit 0 or a daemon's stderr
        holds a sanitizer report."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for p in running:
            try:
                os.killpg(p.pid, signal.SIGCONT)  # a test may have left it stopped
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + scaled(5)
        for p in running:
            try:
                p.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=scaled(5))
                except subprocess.TimeoutExpired:
                    pass
            p.stdout.close()
        reports = {}
        for name, f in self.logs.items():
            f.seek(0)
            text = f.read().decode(errors="replace")
            f.close()
            m = SANITIZER_REPORT.search(text)
            if m:
                reports[name] = text[m.start():m.start() + 4000]
            elif self.procs[name] in running and self.procs[name].returncode != 0:
                reports[name] = f"exit status {self.procs[name].returncode} after SIGTERM:\n{text[-2000:]}"
        assert not reports, "daemons that did not stop cleanly:\n" + "\n".join(
            f"--- {name}: {r}" for name, r in reports.items())


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
