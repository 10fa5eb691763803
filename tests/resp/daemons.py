"""Real kvmesh daemons for the RESP end-to-end scripts (connector_pattern.py, cluster_client.py).

Each process is started in its own session, dies with the script (PR_SET_PDEATHSIG, even when
ctest's timeout SIGKILLs the script), reports its ports in its `listening` event, and writes its
stderr to a file in the script's temporary directory, so a failing run can show what the daemons
logged (`Procs.dump_logs`). Bounds on waits grow with the build as the C++ tests' TimeBound:
KVMESH_TEST_TIME_SCALE (sanitizers: 4), set by kvmesh_test_bounds in tests/CMakeLists.txt.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

TIME_SCALE = int(os.environ.get("KVMESH_TEST_TIME_SCALE", "1"))


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when this script dies, even by SIGKILL (a ctest timeout)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Procs:
    """Daemons by name; `stop` kills every one, whatever state the test is in."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.procs = {}

    def start(self, name: str, argv, timeout: float = 15.0) -> dict:
        """Starts argv and returns its `listening` event (ports chosen at run time)."""
        timeout *= TIME_SCALE
        log = open(os.path.join(self.log_dir, f"{name}.log"), "wb")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                             preexec_fn=die_with_parent)
        log.close()
        self.procs[name] = p
        end = time.time() + timeout
        while time.time() < end:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{name} ({argv[1]}) exited before listening")
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "listening":
                return ev
        raise RuntimeError(f"{name} ({argv[1]}) did not listen within {timeout}s")

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def kill(self, name: str) -> None:
        p = self.procs[name]
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def dump_logs(self, tail_bytes: int = 4000) -> None:
        """The end of every daemon's stderr, for a run that failed."""
        for name in self.procs:
            path = os.path.join(self.log_dir, f"{name}.log")
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - tail_bytes))
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            sys.stderr.write(f"--- {name} stderr (last {tail_bytes} bytes) ---\n{text}\n")
