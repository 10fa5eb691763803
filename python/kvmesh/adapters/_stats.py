"""Counters of an engine adapter: its hit rate, why its misses missed, and
what it moved; readable as a dict (``stats()``) and as Prometheus text on the
adapter's own ``/metrics`` endpoint (``serve_metrics``, extra config
``"metrics_port"``).

A lookup asks kvmesh for a prompt's blocks (vLLM) or pages (SGLang); when
kvmesh holds fewer than were asked, the first missing one is classified, off
the engine's thread (``_diagnose.Diagnoser``), into one reason of
``MISS_REASONS``:

- ``no_key``: nothing stored under this block's key, nor under the key any
  other configuration of the same prompt would use (never stored here);
- ``evicted``: this adapter saved or read the block before, it is gone now;
- ``other_layout``: stored by an engine of the same model and tenant whose
  KV layout differs (dtype, paged layout, block size, parallel ranks): its
  bytes would not fit this engine's cache;
- ``other_model``: stored under another model name (a path instead of the
  hub name, say);
- ``other_tenant``: stored under another tenant salt;
- ``not_ready``: the engine's workers have not told kvmesh their layout yet
  (vLLM: no worker record), so nothing can be looked up;
- ``unsupported``: a layout the adapter does not move (vLLM's Mamba state);
- ``unavailable``: kvmesh did not answer the lookup (no node reachable, a
  timeout): a miss, never an error of the engine;
- ``undiagnosed``: more misses at once than the diagnosis keeps up with.

Blocks of other authenticated tenants ($.auth.tenants) are invisible by
design: such a miss reads ``no_key``.

Thread-safety: every method may be called from any thread.
"""

import http.server
import threading
import time
import weakref
from typing import Dict, Optional

MISS_REASONS = ("no_key", "evicted", "other_layout", "other_model", "other_tenant", "not_ready", "unsupported",
                "unavailable", "undiagnosed")

_COUNTERS = (
    ("lookups", "lookups (one per request admitted, or per batch_exists call)"),
    ("lookup_tokens", "prompt tokens asked for in whole blocks or pages"),
    ("hit_tokens", "of those, tokens kvmesh held"),
    ("loaded_blocks", "blocks or pages read from kvmesh into the engine"),
    ("load_errors", "blocks or pages that failed to load (recomputed)"),
    ("saved_blocks", "blocks or pages stored"),
    ("save_errors", "blocks or pages whose store failed (a later miss)"),
)


class AdapterStats:
    """The counters of one adapter instance (engine: "vllm" or "sglang"; role:
    "scheduler", "worker", "storage"; rank: e.g. "tp0")."""

    def __init__(self, engine: str, role: str, rank: str = ""):
        self.engine, self.role, self.rank = engine, role, rank
        self._lock = threading.Lock()
        self._c: Dict[str, int] = {name: 0 for name, _ in _COUNTERS}
        self._misses: Dict[str, int] = {r: 0 for r in MISS_REASONS}
        self._lookup_s = 0.0
        self._lookup_n = 0
        self.started = time.time()
        _REGISTRY.add(self)

    def add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self._c[k] += int(v)

    def miss(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._misses[reason] += n

    def lookup_time(self, seconds: float) -> None:
        with self._lock:
            self._lookup_s += seconds
            self._lookup_n += 1

    def snapshot(self) -> dict:
        with self._lock:
            d = dict(self._c)
            d["misses"] = dict(self._misses)
            d["lookup_seconds"] = self._lookup_s
            d["lookup_timed"] = self._lookup_n
        d["hit_rate"] = d["hit_tokens"] / d["lookup_tokens"] if d["lookup_tokens"] else 0.0
        d.update(engine=self.engine, role=self.role, rank=self.rank)
        return d

    def prometheus(self) -> str:
        s = self.snapshot()
        labels = f'engine="{self.engine}",role="{self.role}",rank="{self.rank}"'
        out = []
        for name, _ in _COUNTERS:
            out.append(f"kvmesh_connector_{name}_total{{{labels}}} {s[name]}")
        for r, n in s["misses"].items():
            out.append(f'kvmesh_connector_misses_total{{{labels},reason="{r}"}} {n}')
        out.append(f"kvmesh_connector_lookup_seconds_sum{{{labels}}} {s['lookup_seconds']:.6f}")
        out.append(f"kvmesh_connector_lookup_seconds_count{{{labels}}} {s['lookup_timed']}")
        return "\n".join(out) + "\n"


class _Registry:
    def __init__(self):
        self._lock = threading.Lock()
        self._items: "weakref.WeakSet[AdapterStats]" = weakref.WeakSet()

    def add(self, s: AdapterStats) -> None:
        with self._lock:
            self._items.add(s)

    def render(self) -> str:
        with self._lock:
            items = list(self._items)
        head = []
        for name, doc in _COUNTERS:
            head += [f"# HELP kvmesh_connector_{name}_total {doc}", f"# TYPE kvmesh_connector_{name}_total counter"]
        head += ["# HELP kvmesh_connector_misses_total lookups that missed, by the first missing block's reason",
                 "# TYPE kvmesh_connector_misses_total counter",
                 "# HELP kvmesh_connector_lookup_seconds time spent in lookups on the engine's thread",
                 "# TYPE kvmesh_connector_lookup_seconds summary"]
        return "\n".join(head) + "\n" + "".join(s.prometheus() for s in items)


_REGISTRY = _Registry()
_server_lock = threading.Lock()
_server: Optional[http.server.ThreadingHTTPServer] = None


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        body = _REGISTRY.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # quiet: an engine's log is not ours
        pass


def serve_metrics(port: int = 0, host: str = "127.0.0.1") -> int:
    """Serves every adapter's counters of this process as Prometheus text on
    http://host:port/metrics (one server per process; a second call returns the
    first server's port). port 0 picks a free port. Returns the port."""
    global _server
    with _server_lock:
        if _server is None:
            _server = http.server.ThreadingHTTPServer((host, int(port)), _Handler)
            _server.daemon_threads = True
            threading.Thread(target=_server.serve_forever, name="kvmesh-metrics", daemon=True).start()
        return _server.server_address[1]


def render_metrics() -> str:
    """The text serve_metrics answers with."""
    return _REGISTRY.render()
