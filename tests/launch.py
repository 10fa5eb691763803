"""Starting kvmesh daemons from Python: the one launcher of the Python tests
(python/tests/conftest.py), the RESP end-to-end scripts (tests/resp), the
install test (tests/install_consumer/run.py) and the Python benchmarks
(bench/*.py).

Every daemon runs in a session of its own (its process group is what is
signalled), dies with the process that started it (PR_SET_PDEATHSIG: even when
ctest's timeout SIGKILLs a test, no daemon is left behind), says it is ready
with its `listening` event on stdout (ports chosen at run time) and writes its
stderr to a log: NAME.log in `log_dir` when one is given, else a temporary
file. Bounds on waits grow with the build as the C++ tests' TimeBound:
KVMESH_TEST_TIME_SCALE (sanitizers: 4), set by kvmesh_test_bounds
(cmake/KvmeshHelpers.cmake).

    d = Daemons().start()          # coordinator + n0..n2 of cluster_configs/daemons-local.json
    try:
        ... kvmesh.Client(d.address) ...
    finally:
        d.stop()                   # SIGTERM, then checks every daemon exited cleanly
"""

import contextlib
import ctypes
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SOURCE_DIR = os.environ.get("KVMESH_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KVMESH_BIN = os.environ.get("KVMESH_BIN", os.path.join(SOURCE_DIR, "build", "bin", "kvmesh"))
DAEMONS_CONFIG = os.path.join(SOURCE_DIR, "cluster_configs", "daemons-local.json")

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

_PR_SET_PDEATHSIG = 1


def wait_stopped(pid, timeout_s):
    """True once /proc shows every thread of pid stopped (state T or t)."""
    end = time.monotonic() + timeout_s
    while True:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                        states.append(f.read().rsplit(b")", 1)[1][1:2])
                except (OSError, IndexError):
                    pass  # the thread is gone
        except OSError:
            return False
        if states and all(s in (b"T", b"t", b"Z") for s in states):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.002)


def die_with_parent():
    """In the child before exec: SIGKILL when the starting process dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Daemons:
    """A coordinator and nodes (or any kvmesh daemons) as child processes, by name.

    config, nodes: what start() launches; binary: the kvmesh to run; timeout_s:
    the bound on each start and on the nodes' registration (scaled); secret: the
    config's $.auth.token, for the coordinator's /nodes; log_dir: where NAME.log
    goes (default: temporary files)."""

    def __init__(self, config=DAEMONS_CONFIG, nodes=("n0", "n1", "n2"), timeout_s=15.0, secret=None,
                 binary=KVMESH_BIN, log_dir=None):
        self.config, self.node_ids, self.timeout_s = config, nodes, scaled(timeout_s)
        self.secret = secret
        self.binary, self.log_dir = binary, log_dir
        self.procs = {}
        self.logs = {}
        self.listening = {}
        self.address = None

    def launch(self, name, args, timeout_s=None):
        """Starts `binary args` as `name`; returns its `listening` event."""
        if self.log_dir is not None:
            log = open(os.path.join(self.log_dir, f"{name}.log"), "w+b")
        else:
            log = tempfile.TemporaryFile()
        p = subprocess.Popen([self.binary] + list(args), stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                             preexec_fn=die_with_parent)
        self.procs[name], self.logs[name] = p, log
        timeout_s = self.timeout_s if timeout_s is None else scaled(timeout_s)
        end = time.monotonic() + timeout_s
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
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "listening":
                        self.listening[name] = ev
                        return ev
        state = "exited before listening" if p.poll() is not None else f"did not listen within {timeout_s}s"
        raise RuntimeError(f"{name} ({args[0]}) {state}: {self.log(name)}")

    def start(self):
        """The coordinator (port 0: a free one) and the nodes of the config; returns self once
        the coordinator lists every node."""
        ev = self.launch("coordinator", ["coordinator", "--config", self.config, "--port", "0"])
        self.address = f"127.0.0.1:{ev['ports']['http']}"
        for n in self.node_ids:
            self.launch(n, ["node", "--config", self.config, "--id", n, "--coordinator", self.address])
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

    def log(self, name, tail_bytes=2000):
        """The end of a daemon's stderr."""
        f = self.logs[name]
        f.flush()
        f.seek(0)
        return f.read().decode(errors="replace")[-tail_bytes:]

    def dump_logs(self, tail_bytes=4000):
        """The end of every daemon's stderr on ours, for a run that failed."""
        for name in self.logs:
            if not self.logs[name].closed:
                sys.stderr.write(f"--- {name} stderr (last {tail_bytes} bytes) ---\n{self.log(name, tail_bytes)}\n")

    def alive(self, name):
        return self.procs[name].poll() is None

    def signal(self, name, sig):
        """sig to the daemon's process group; SIGSTOP returns once every thread
        of the daemon is stopped: kill() only queues the stop, and a thread woken
        by a request could answer it before it stops (seen in CI)."""
        pid = self.procs[name].pid
        os.killpg(pid, sig)
        if sig == signal.SIGSTOP:
            wait_stopped(pid, scaled(5))

    def kill(self, name):
        """SIGKILL to the daemon's process group; waits for it."""
        p = self.procs[name]
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            pass

    def kill_all(self):
        """SIGKILL to every daemon, whatever state the test is in; closes the logs."""
        for name in list(self.procs):
            self.kill(name)
        self._close()

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
        for name, p in self.procs.items():
            if p.poll() is None:
                self.kill(name)
        reports = {}
        for name, f in self.logs.items():
            f.seek(0)
            text = f.read().decode(errors="replace")
            m = SANITIZER_REPORT.search(text)
            if m:
                reports[name] = text[m.start():m.start() + 4000]
            elif self.procs[name] in running and self.procs[name].returncode != 0:
                reports[name] = f"exit status {self.procs[name].returncode} after SIGTERM:\n{text[-2000:]}"
        self._close()
        assert not reports, "daemons that did not stop cleanly:\n" + "\n".join(
            f"--- {name}: {r}" for name, r in reports.items())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Leaving a `with Daemons(...) as d:` block: the daemons' logs on ours when it
        raised, then every daemon SIGKILLed (no exit check: stop() makes that)."""
        if exc_type is not None:
            self.dump_logs()
        self.kill_all()

    def _close(self):
        for p in self.procs.values():
            if p.stdout is not None:
                p.stdout.close()
        for f in self.logs.values():
            f.close()


@contextlib.contextmanager
def cluster(cfg, binary=KVMESH_BIN, timeout_s=15.0):
    """Daemons of the config dict `cfg` (a coordinator and cfg's nodes), started
    from a temporary copy of it whose coordinator port is 0 (a free one); yields
    the Daemons once every node is listed, SIGKILLs them all at the end."""
    cfg = dict(cfg, coordinator=dict(cfg["coordinator"], port=0))
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(cfg, f)
        f.flush()
        d = Daemons(config=f.name, nodes=[n["id"] for n in cfg["nodes"]], timeout_s=timeout_s, binary=binary)
        try:
            yield d.start()
        finally:
            d.kill_all()
