"""Why a lookup missed: the adapters' directory of configurations and the
thread that classifies misses (reasons: ``_stats.MISS_REASONS``).

Every adapter instance that looks blocks up writes one entry into a small
directory kept in kvmesh itself (one value under a fixed key, in the
authenticated tenant's namespace): the engine, model name, tenant salt, a
summary of its KV layout, and the recipe of its probe key (how the key of a
block or page is made). When a lookup misses, the diagnosis thread asks
whether the first missing block exists under the probe key of each *other*
entry of the same engine kind: found under an entry with another model name,
tenant salt or layout names the reason. Otherwise the block is ``evicted``
when this adapter saved or read it before (a bounded memory of block
identities), else ``no_key``.

The work runs on a daemon thread with a bounded queue, so the engine's
thread never waits for it; misses arriving faster than it classifies them
count as ``undiagnosed``. A directory read is cached for ``refresh_s``.

Thread-safety: submit() and remember() may be called from any thread.
"""

import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from .. import _core
from ..errors import Error

logger = logging.getLogger(__name__)

DIRECTORY_KEY = _core.text_keys(["kvmesh-adapter-directory-v1"], b"")
MAX_ENTRIES = 64


def _entry_id(e: dict) -> str:
    return json.dumps({k: e[k] for k in ("engine", "kind", "salt", "tag", "block_size")}, sort_keys=True)


def read_directory(client: Any) -> List[dict]:
    try:
        raw = client.get(DIRECTORY_KEY[0].tolist())
    except LookupError:
        return []
    except Error as e:
        logger.debug("kvmesh: reading the adapter directory failed: %s", e)
        return []
    try:
        entries = json.loads(bytes(raw).decode())
        return [e for e in entries if isinstance(e, dict)]
    except ValueError:
        return []


def write_entry(client: Any, entry: dict) -> None:
    """Adds or refreshes `entry` (read, merge, write back; a race with
    another writer may drop an entry, which its owner writes again later)."""
    entries = [e for e in read_directory(client) if _entry_id(e) != _entry_id(entry)]
    entries.append(dict(entry, seen=time.time()))
    entries = sorted(entries, key=lambda e: e.get("seen", 0))[-MAX_ENTRIES:]
    payload = bytearray(json.dumps(entries).encode())
    client.put_from(DIRECTORY_KEY, [payload], replace=True, priority=3)


class Miss:
    """The first missing block of a lookup.

    ident: this adapter's identity of the block (for the evicted check);
    probe(entry) -> key or None: the block's key under another entry's recipe."""

    __slots__ = ("ident", "probe")

    def __init__(self, ident: Any, probe: Callable[[dict], Optional[Any]]):
        self.ident, self.probe = ident, probe


class Diagnoser:
    def __init__(self, client: Any, stats: Any, entry: dict, *, queue_max: int = 256, remember: int = 1 << 16,
                 refresh_s: float = 10.0):
        self._client, self._stats, self._entry = client, stats, entry
        self._queue: "queue.Queue[Optional[Miss]]" = queue.Queue(maxsize=queue_max)
        self._seen_lock = threading.Lock()
        self._seen: "OrderedDict[int, None]" = OrderedDict()
        self._remember = remember
        self._refresh_s = refresh_s
        self._entries: List[dict] = []
        self._entries_at = -1e9
        self._registered_at = -1e9
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvmesh-diagnose", daemon=True)
        self._thread.start()
        self._queue.put(None)  # register our entry first

    def remember(self, idents: List[Any]) -> None:
        """Blocks this adapter saved or read (bounded, least recent dropped)."""
        if self._remember <= 0:
            return
        with self._seen_lock:
            for i in idents:
                h = hash(i)
                self._seen.pop(h, None)
                self._seen[h] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)

    def _was_seen(self, ident: Any) -> bool:
        with self._seen_lock:
            return hash(ident) in self._seen

    def submit(self, miss: Miss) -> None:
        try:
            self._queue.put_nowait(miss)
        except queue.Full:
            self._stats.miss("undiagnosed")

    def drain(self, timeout: float = 5.0) -> None:
        """Waits until every miss submitted so far is classified (tests)."""
        done = threading.Event()
        self._queue.put(_Marker(done))
        done.wait(timeout)

    def close(self) -> None:
        self._closed = True
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    # ---- the thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            item = self._queue.get()
            if isinstance(item, _Marker):
                item.done.set()
                continue
            try:
                self._register()
                if item is not None:
                    self._stats.miss(self._classify(item))
            except Exception as e:  # noqa: BLE001 - a diagnosis must never take the engine down
                logger.debug("kvmesh: diagnosing a miss failed: %s", e)
                if item is not None:
                    self._stats.miss("undiagnosed")

    def _register(self) -> None:
        now = time.monotonic()
        if now - self._registered_at < 60.0:
            return
        self._registered_at = now
        try:
            write_entry(self._client, self._entry)
        except Error as e:
            logger.debug("kvmesh: writing the adapter directory failed: %s", e)

    def _others(self, refresh_s: Optional[float] = None) -> List[dict]:
        now = time.monotonic()
        if now - self._entries_at > (self._refresh_s if refresh_s is None else refresh_s):
            self._entries = read_directory(self._client)
            self._entries_at = now
        me = _entry_id(self._entry)
        return [e for e in self._entries if _entry_id(e) != me and e.get("engine") == self._entry["engine"]]

    def _classify(self, miss: Miss) -> str:
        if self._was_seen(miss.ident):
            return "evicted"
        reason = self._probe_others(miss, self._others())
        if reason is None:  # an entry written since the last read may hold it
            reason = self._probe_others(miss, self._others(refresh_s=1.0))
        return reason or "no_key"

    def _probe_others(self, miss: Miss, others: List[dict]) -> Optional[str]:
        probes, owners = [], []
        for e in others:
            k = miss.probe(e)
            if k is not None:
                probes.append(k)
                owners.append(e)
        if probes:
            found = self._client.exists_each(probes)
            hits = [e for e, f in zip(owners, found) if f]
            if hits:
                return _reason(self._entry, hits)
        return None


class _Marker:
    __slots__ = ("done",)

    def __init__(self, done: threading.Event):
        self.done = done


def _reason(me: dict, found: List[dict]) -> str:
    """The most telling difference between this entry and those that hold the block."""
    if any(e.get("model") != me.get("model") for e in found):
        return "other_model"
    if any(e.get("tenant") != me.get("tenant") for e in found):
        return "other_tenant"
    return "other_layout"


def directory_entries(client: Any) -> List[Dict[str, Any]]:
    """The directory as kvmesh holds it (for tools and tests)."""
    return read_directory(client)
