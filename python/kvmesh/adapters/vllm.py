"""kvmesh as a vLLM KV connector (v1): the engine-free core.

vLLM loads :class:`kvmesh.vllm.KvmeshConnector` (``kv_connector_module_path``
``"kvmesh.vllm"``), which derives from vLLM's ``KVConnectorBase_V1`` and
``SupportsHMA`` and from this class. This module does not import vLLM, so
tests and tools can drive the core with plain objects shaped as vLLM's.

The contract followed is vLLM's ``KVConnectorBase_V1`` and the scheduler's
use of it (vllm-project/vllm ``vllm/distributed/kv_transfer/kv_connector/v1/base.py``
and ``vllm/v1/core/sched/scheduler.py`` at commit
003df2961dd8830c317a61f9745ccd557da9fa06; ``factory.py`` as of that era;
the facts relied on are listed in ``python/tests/standins/vllm``, whose
stand-in drives this class in the tests):

- Scheduler side: ``get_num_new_matched_tokens(request, num_computed_tokens)``
  (side-effect free: one ``exists`` call to kvmesh, measured by
  ``bench/bench_vllm_lookup.py``), ``update_state_after_alloc`` (called once
  per admission: counters, session bookkeeping, the load to plan),
  ``build_connector_meta`` (every step), ``request_finished`` /
  ``request_finished_all_groups`` (hybrid models), ``requires_kv_delivery``
  False (a best-effort cache: a dropped save is a later miss).
- Worker side: ``register_kv_caches`` (any layout vLLM hands out: the byte
  runs of a block are found from the tensor's strides), ``start_load_kv`` /
  ``wait_for_layer_load`` (one load per layer in flight), ``save_kv_layer`` /
  ``wait_for_save``, ``get_block_ids_with_load_errors``.

Keys. The scheduler chains a prompt's full blocks
(``kvmesh.chain_keys(tokens, block_size, salt)``, salt = model name, tenant,
block size): a chain key names the whole prefix. Each byte run of a block on
a worker is stored under ``derive_keys(chain, tag)``, the tag naming the
layer, the run, the worker's tensor-parallel rank (none for MLA, whose ranks
hold the same bytes and only rank 0 stores) and the layer's byte layout
(dtype, dims in memory order): engines whose bytes differ never share a key,
and a miss for that reason is reported as ``other_layout``.

Each worker writes a record to kvmesh when it registers its caches (its
tags); the scheduler reads the records of every rank once and probes, per
block, one run per rank and KV-cache group (``"lookup": "sampled"``, the
default) or every run (``"exact"``). A run lost after the probe is a load
error: vLLM recomputes from that block.

Hybrid models (vLLM's hybrid KV cache manager, ``SupportsHMA``): full
attention groups (MLA too) move every block; sliding-window groups only the
blocks inside the window of the hit (and never null block 0). Mamba groups
are not moved: a model with one never hits (``unsupported``).

Session closes (an eviction hint, docs/eviction.md): a request's
``kv_transfer_params`` may carry ``"kvmesh.session"`` and, on the session's
last request, ``"kvmesh.session_closes": true``; when that request finishes
the blocks the session computed and no other request read are released.
"""

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .. import _core
from ..errors import Error
from ._client import make_client
from ._diagnose import Diagnoser, Miss
from ._memory import whole_storage
from ._stats import AdapterStats, serve_metrics

logger = logging.getLogger(__name__)

_NULL = 0  # vLLM's null block id: a position with no data (outside a sliding window)
_SESSION = "kvmesh.session"
_CLOSES = "kvmesh.session_closes"


# ---- metadata (scheduler -> workers) -----------------------------------------------
@dataclass
class KvmeshTransfer:
    """Blocks at prompt positions [first_block, first_block + n) of one request.

    chains: (n, 2) uint64 chain keys of those positions; block_ids[g][i]: vLLM's
    block id of position first_block + i in KV-cache group g (0: not moved)."""
    req_id: str
    first_block: int
    chains: np.ndarray
    block_ids: List[List[int]]


@dataclass
class KvmeshConnectorMetadata:
    """What the scheduler tells the workers for one step."""
    loads: List[KvmeshTransfer] = field(default_factory=list)
    saves: List[KvmeshTransfer] = field(default_factory=list)


# ---- configuration -------------------------------------------------------------
@dataclass
class _Group:
    index: int
    kind: str  # "full", "mla", "sliding", "unsupported"
    layer_names: List[str]
    window: int = 0  # sliding window in tokens
    why: str = ""


def _group_kind(spec: Any) -> Tuple[str, int, str]:
    name = type(spec).__name__ if spec is not None else "FullAttentionSpec"
    if "Mamba" in name:
        return "unsupported", 0, f"{name}: Mamba state is not moved by kvmesh"
    if "SlidingWindow" in name:
        return "sliding", int(spec.sliding_window), ""
    if "MLA" in name:
        return "mla", 0, ""
    if "ChunkedLocal" in name or "Cross" in name or "EncoderOnly" in name:
        return "unsupported", 0, f"{name} is not moved by kvmesh"
    if getattr(spec, "sliding_window", None):  # HMA off: a sliding window layer unified as full attention
        return "full", 0, ""
    return "full", 0, ""


def _groups(kv_cache_config: Any) -> List[_Group]:
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if not groups:
        return [_Group(0, "full", [])]
    out = []
    for i, g in enumerate(groups):
        kind, window, why = _group_kind(getattr(g, "kv_cache_spec", None))
        out.append(_Group(i, kind, list(g.layer_names), window, why))
    return out


def _uses_mla(vllm_config: Any) -> bool:
    return bool(getattr(getattr(vllm_config, "model_config", None), "use_mla", False))


def _ranks(vllm_config: Any) -> Tuple[int, int, int, int]:
    """(tp_rank, tp_size, pp_rank, pp_size) of this process (a worker's own;
    on the scheduler the ranks are 0)."""
    pc = getattr(vllm_config, "parallel_config", None)
    tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    pp_size = int(getattr(pc, "pipeline_parallel_size", 1) or 1)
    try:  # vLLM's own view of this worker's place (vllm/distributed/parallel_state.py)
        from vllm.distributed import parallel_state as ps  # type: ignore
        tp_rank = int(ps.get_tensor_model_parallel_rank())
        pp_rank = int(ps.get_pp_group().rank_in_group) if pp_size > 1 else 0
        return tp_rank, tp_size, pp_rank, pp_size
    except Exception:  # noqa: BLE001 - no vLLM, or its groups are not set up in this process
        rank = int(getattr(pc, "rank", 0) or 0)
        return rank % tp_size, tp_size, (rank // tp_size) % pp_size, pp_size


# ---- the byte runs of a block in a paged tensor -----------------------------------
@dataclass
class _Layer:
    name: str
    group: int
    base: int  # data_ptr
    block_stride: int  # bytes from block b to block b + 1
    offsets: np.ndarray  # int64 byte offsets of the block's runs from its start
    run_bytes: int
    desc: str
    tags: List[bytes] = field(default_factory=list)


def block_runs(t: Any, num_blocks: Optional[int]) -> Tuple[int, int, List[int], int, str]:
    """How the bytes of one block lie in a paged KV tensor, from its strides:
    (block dim, kernel blocks per block, run offsets in elements, run length
    in elements, a layout descriptor). Works for every layout vLLM hands out:
    FlashAttention's (2, blocks, tokens, heads, dim) in NHD and HND (a strided
    view), FlashInfer's (blocks, 2, ...), the packed (blocks, heads, tokens,
    2 * dim) in either order, MLA's (blocks, tokens, latent), kernel blocks
    smaller than vLLM's block (dim 0 = blocks * r)."""
    shape, stride = list(t.shape), list(t.stride())
    nd = len(shape)
    dim, r = None, 1
    if num_blocks:
        exact = [d for d in range(nd) if shape[d] == num_blocks]
        if nd == 5 and shape[0] == 2 and 1 in exact:
            dim = 1
        elif exact:
            dim = max(exact, key=lambda d: stride[d])
        else:
            split = [d for d in range(nd) if shape[d] > num_blocks and shape[d] % num_blocks == 0]
            if split:
                dim = max(split, key=lambda d: stride[d])
                r = shape[dim] // num_blocks
    if dim is None:
        dim = 1 if nd == 5 and shape[0] == 2 else 0
    others = [(shape[d], stride[d], d) for d in range(nd) if d != dim and shape[d] > 1]
    expected, inner = 1, []
    for size, st, d in sorted(others, key=lambda x: x[1]):
        if st != expected:
            break
        expected *= size
        inner.append(d)
    outer = sorted(d for _, _, d in others if d not in inner)
    offs = [0]
    for d in outer:  # runs in logical order of the outer dims (K before V)
        offs = [o + i * stride[d] for o in offs for i in range(shape[d])]
    if r > 1:
        offs = [o + s * stride[dim] for s in range(r) for o in offs]
    phys = sorted(((stride[d], d, shape[d]) for d in range(nd) if d != dim), reverse=True)
    desc = f"{str(t.dtype).replace('torch.', '')}|" + ",".join(f"{d}:{n}" for _, d, n in phys) + f"|b{dim}r{r}"
    return dim, r, offs, expected, desc


def _hex(b: bytes) -> str:
    return b.hex()


class KvmeshConnector:
    """vLLM KV connector v1 over kvmesh (the engine-free core; vLLM loads
    :class:`kvmesh.vllm.KvmeshConnector`).

    vllm_config, role (KVConnectorRole or "SCHEDULER"/"WORKER"),
    kv_cache_config: as vLLM passes them. Extra config
    (``kv_transfer_config.kv_connector_extra_config``): ``coordinator`` or
    ``config``, ``tenant``, ``token``, ``timeout_ms`` (the kvmesh client);
    ``lookup`` ("sampled" | "exact"); ``lookup_timeout_ms`` (default 100: the
    longest the scheduler thread waits for kvmesh; then the lookup is a miss);
    ``layerwise`` (default true: one load
    and save per layer, hooks CUDA graphs cannot capture; false moves every
    layer in start_load_kv / wait_for_save); ``metrics_port`` (serve
    ``/metrics``); ``kv_cache_layout`` (the layout to ask vLLM for, default
    "NHD", none for MLA).

    client: a kvmesh Client to use instead of one made from the extra config
    (tests). Thread-safety: as vLLM calls a connector (one engine thread per
    role); transfers run on the connector's own threads.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None, *, client: Any = None,
                 load_threads: int = 2, max_sessions: int = 4096, max_seen_blocks: int = 1 << 18):
        # What KVConnectorBase_V1.__init__ sets, whatever the MRO ran before us.
        if not hasattr(self, "_connector_metadata"):
            self._connector_metadata = None
        self._vllm_config = vllm_config
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        if getattr(self, "_kv_transfer_config", None) is None:
            self._kv_transfer_config = ktc
        self._kv_cache_config = kv_cache_config
        self._role = role
        if not hasattr(self, "use_eagle_prefix_cache_hashing"):
            self.use_eagle_prefix_cache_hashing = False

        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self._extra = extra
        self._is_scheduler = getattr(role, "name", role) == "SCHEDULER"
        self._owns_client = client is None
        self.client = client if client is not None else make_client(
            extra, engine="vllm", client_id="kvmesh-vllm-" + ("scheduler" if self._is_scheduler else "worker"))
        self._block_size = int(vllm_config.cache_config.block_size)
        self._model = str(getattr(getattr(vllm_config, "model_config", None), "model", "") or
                          extra.get("model") or self.client.model["model_id"])
        self._tenant = str(extra.get("tenant", ""))
        self._engine_id = str(getattr(ktc, "engine_id", None) or extra.get("engine_id") or "vllm")
        self._chain_salt = f"vllm\0{self._model}\0{self._tenant}\0{self._block_size}".encode()
        self._groups = _groups(kv_cache_config)
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        self._tp_rank, self._tp_size, self._pp_rank, self._pp_size = _ranks(vllm_config)
        self._mla = _uses_mla(vllm_config) or any(g.kind == "mla" for g in self._groups)
        self._unsupported = [g.why for g in self._groups if g.kind == "unsupported"]
        # A hybrid model (several KV-cache groups) probes every run: vLLM at
        # 003df29 cannot recover a load error there (its _handle_invalid_blocks
        # reads one group and raises), so only a race with eviction between
        # the probe and the load is left.
        self._exact = extra.get("lookup", "exact" if len(self._groups) > 1 else "sampled") == "exact"
        # The scheduler thread waits at most this long for a lookup (then: a miss, "unavailable").
        self._lookup_timeout_ms = int(extra.get("lookup_timeout_ms", 100))
        self._layerwise = bool(extra.get("layerwise", True))
        rank = f"tp{self._tp_rank}/{self._tp_size}" if not self._is_scheduler else "scheduler"
        self._stats = AdapterStats("vllm", "scheduler" if self._is_scheduler else "worker", rank)
        if extra.get("metrics_port") is not None:
            port = serve_metrics(int(extra["metrics_port"]))
            logger.info("kvmesh: connector metrics on http://127.0.0.1:%d/metrics", port)
        if self._unsupported:
            logger.warning("kvmesh: this model's KV cache is not moved (%s): every lookup is a miss",
                           "; ".join(self._unsupported))

        # Scheduler state.
        self._records_at = -1e9
        self._probe_cols: List[Tuple[int, bytes]] = []  # (group index, tag) probed per block
        self._all_tags: List[bytes] = []  # every run of every rank (releases)
        self._chains: "OrderedDict[str, Tuple[int, np.ndarray]]" = OrderedDict()
        self._last: Dict[str, tuple] = {}  # req_id -> the last lookup (for update_state_after_alloc)
        self._load_pending: Dict[str, int] = {}
        self._stored: Dict[str, int] = {}  # req_id -> leading blocks kvmesh held when it was admitted
        self._tracked: Dict[str, "_Tracked"] = {}
        self._diagnoser: Optional[Diagnoser] = None
        self._sessions = _Sessions(max_sessions, max_seen_blocks)
        self.released_blocks = 0  # blocks released on session closes (each: every run of every rank)

        # Worker state.
        self._layers: Dict[str, _Layer] = {}
        self._layer_group: Dict[str, int] = {n: g.index for g in self._groups for n in g.layer_names}
        self._registered: Dict[int, Any] = {}  # storage data_ptr -> Region
        self._pool: Optional[ThreadPoolExecutor] = None
        self._load_threads = max(1, load_threads)
        self._loads: Dict[str, Future] = {}
        self._saves: List[Future] = []
        self._load_errors: Set[int] = set()
        self._errors_lock = threading.Lock()
        self.save_errors = 0  # blocks whose save failed (a later miss, not an error)

    # ---- what vLLM reads off the connector -----------------------------------------
    @property
    def role(self) -> Any:
        return self._role

    @property
    def requires_kv_delivery(self) -> bool:
        """False: kvmesh is a best-effort cache (a dropped save is a later miss),
        so vLLM need not recompute a preempted request whose save is pending."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Dict[str, Any]) -> bool:
        """True unless ``layerwise`` is off: per-layer loads and saves run in
        wait_for_layer_load / save_kv_layer, which a full CUDA graph would skip."""
        return bool((extra_config or {}).get("layerwise", True))

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        """The layout every engine sharing kvmesh should use, so that their keys
        meet: "NHD" (vLLM's default) unless the extra config names another;
        none for MLA (one latent run per token)."""
        if _uses_mla(vllm_config):
            return None
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = getattr(ktc, "kv_connector_extra_config", None) or {}
        return extra.get("kv_cache_layout", "NHD")

    def stats(self) -> dict:
        """Counters of this connector (hit rate, misses by reason, moves)."""
        d = self._stats.snapshot()
        d["released_blocks"] = self.released_blocks
        return d

    # ---- records: what each worker tells the scheduler --------------------------
    def _record_key(self, pp: int, tp: int) -> np.ndarray:
        return _core.text_keys([f"vllm-rank-v1\0{self._engine_id}\0{pp}\0{tp}"], self._chain_salt)

    def _load_records(self) -> bool:
        """Reads every rank's record once (retried at most once a second)."""
        if self._probe_cols:
            return True
        now = time.monotonic()
        if now - self._records_at < 1.0:
            return False
        self._records_at = now
        probes: List[Tuple[int, bytes]] = []
        tags: List[bytes] = []
        try:
            for pp in range(self._pp_size):
                for tp in range(self._tp_size):
                    rec = json.loads(bytes(self.client.get(self._record_key(pp, tp)[0].tolist())).decode())
                    if not rec.get("saves", True):
                        continue  # a replicated (MLA) rank other than 0: rank 0's runs
                    for g, v in sorted(rec["groups"].items(), key=lambda x: int(x[0])):
                        runs = [bytes.fromhex(t) for t in v["tags"]]
                        tags += runs
                        for t in (runs if self._exact else runs[-1:]):
                            probes.append((int(g), t))
        except (LookupError, Error, ValueError, KeyError) as e:
            logger.debug("kvmesh: worker records not ready: %s", e)
            return False
        seen: Set[Tuple[int, bytes]] = set()
        self._probe_cols = [p for p in probes if not (p in seen or seen.add(p))]
        self._all_tags = list(dict.fromkeys(tags))
        probe = self._probe_cols[0][1] if self._probe_cols else b""
        entry = {"engine": "vllm", "kind": "chain", "model": self._model, "tenant": self._tenant,
                 "block_size": self._block_size, "salt": _hex(self._chain_salt), "tag": _hex(probe)}
        self._diagnoser = Diagnoser(self.client, self._stats, entry)
        return True

    # ---- scheduler side ------------------------------------------------------------
    def _chain(self, req_id: str, tokens: Sequence[int]) -> np.ndarray:
        full = len(tokens) // self._block_size
        hit = self._chains.get(req_id)
        if hit is not None and hit[0] == full:
            self._chains.move_to_end(req_id)
            return hit[1]
        chains = _core.chain_keys(tokens[:full * self._block_size], self._block_size, self._chain_salt)
        self._chains[req_id] = (full, chains)
        while len(self._chains) > 8192:  # requests never finished (aborted before a step)
            self._chains.popitem(last=False)
        return chains

    def _window_start(self, window: int, blocks: int) -> int:
        return max(0, blocks * self._block_size - window + 1) // self._block_size

    def _probe(self, chains: np.ndarray, blocks: int) -> int:
        """Leading blocks kvmesh holds for every probed run (sliding-window
        groups: only the blocks inside the window of the hit)."""
        cols = self._probe_cols
        tags = [t for _, t in cols]
        keys = _core.derive_keys(chains[:blocks], tags)
        have = np.asarray(self.client.exists_each(keys, timeout_ms=self._lookup_timeout_ms), dtype=bool)
        have = have.reshape(blocks, len(tags))
        kinds = [self._groups[g].kind if g < len(self._groups) else "full" for g, _ in cols]
        full = [i for i, k in enumerate(kinds) if k != "sliding"]
        hit = blocks
        if full:
            bad = np.flatnonzero(~have[:, full].all(axis=1))
            hit = int(bad[0]) if bad.size else blocks
        sliding = [i for i, k in enumerate(kinds) if k == "sliding"]
        while hit > 0 and sliding:
            ok = True
            for i in sliding:
                start = self._window_start(self._groups[cols[i][0]].window, hit)
                if not have[start:hit, i].all():
                    ok = False
                    break
            if ok:
                break
            hit -= 1
        return hit

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Tokens beyond num_computed_tokens whose KV kvmesh holds: whole blocks,
        at least one prompt token left to compute; loads are synchronous with
        the step. One exists call to kvmesh; no other effect."""
        t0 = time.perf_counter()
        tokens = request.prompt_token_ids or []
        blocks = max(0, len(tokens) - 1) // self._block_size
        hit, reason = 0, None
        if blocks == 0:
            pass
        elif self._unsupported:
            reason = "unsupported"
        elif not self._load_records():
            reason = "not_ready"
        else:
            chains = self._chain(request.request_id, tokens)
            errors = self.client.stats()["node_errors"]
            try:
                hit = self._probe(chains, blocks)
            except Error as e:
                logger.warning("kvmesh: lookup failed (a miss): %s", e)
                reason = "unavailable"
            if reason is None and hit < blocks and self.client.stats()["node_errors"] != errors:
                reason = "unavailable"  # a node did not answer: its blocks read as misses
        self._last[request.request_id] = (hit, blocks, num_computed_tokens, reason)
        self._stats.lookup_time(time.perf_counter() - t0)
        return max(0, hit * self._block_size - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Once per admission: counters, the miss to diagnose, session
        bookkeeping, and the load build_connector_meta will plan."""
        req_id = request.request_id
        hit, asked, local, reason = self._last.pop(req_id, (0, 0, 0, None))
        bs = self._block_size
        want = max(0, asked * bs - local)
        self._stats.add(lookups=1, lookup_tokens=want, hit_tokens=num_external_tokens)
        tokens = request.prompt_token_ids or []
        chains = self._chains.get(req_id, (0, None))[1] if asked else None
        if num_external_tokens < want:
            first = max(hit, local // bs)
            if reason is not None:
                self._stats.miss(reason)
            elif self._diagnoser is not None and chains is not None and first < len(chains):
                self._diagnoser.submit(self._miss(tokens, chains, first))
        if chains is not None and self._diagnoser is not None and hit:
            self._diagnoser.remember([tuple(k) for k in chains[:hit].tolist()])
        if chains is not None:
            self._sessions.admitted(request, chains, hit)
        t = self._tracked.get(req_id)
        if t is not None:  # resumed after a preemption: blocks lost since are saved again
            t.saved_blocks = min(t.saved_blocks, (local + num_external_tokens) // bs)
        if num_external_tokens > 0:
            self._load_pending[req_id] = num_external_tokens
        self._stored[req_id] = hit  # blocks kvmesh holds: not saved again

    def _miss(self, tokens: Sequence[int], chains: np.ndarray, first: int) -> Miss:
        start = first * self._block_size
        ident = tuple(chains[first].tolist())

        def probe(entry: dict) -> Optional[np.ndarray]:
            if entry.get("kind") != "chain":
                return None
            bs = int(entry["block_size"])
            b = start // bs
            if (b + 1) * bs > len(tokens):
                return None
            c = _core.chain_keys(tokens[:(b + 1) * bs], bs, bytes.fromhex(entry["salt"]))
            return _core.derive_keys(c[b:b + 1], bytes.fromhex(entry["tag"]))[0].tolist()

        return Miss(ident, probe)

    def _positions(self, table: Sequence[Sequence[int]], first: int, last: int,
                   hit_end: Optional[int] = None) -> List[List[int]]:
        """Block ids per group for positions [first, last) (0: not moved). A
        load (hit_end given) takes sliding-window groups only inside the window
        ending at hit_end; a save takes every block the step computed (a later
        hit on a shorter prefix needs them)."""
        out = []
        for g, ids in enumerate(table):
            kind = self._groups[g].kind if g < len(self._groups) else "full"
            row = []
            start = self._window_start(self._groups[g].window, hit_end) \
                if kind == "sliding" and hit_end is not None else 0
            for p in range(first, last):
                b = ids[p] if p < len(ids) else _NULL
                row.append(b if kind != "unsupported" and p >= start else _NULL)
            out.append(row)
        return out

    def build_connector_meta(self, scheduler_output: Any) -> KvmeshConnectorMetadata:
        """Loads for requests that found blocks in kvmesh, saves of newly
        computed full prompt blocks (every group, every chunk)."""
        meta = KvmeshConnectorMetadata()
        bs = self._block_size
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for req in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
            tokens = list(req.prompt_token_ids or [])
            table = [list(g) for g in req.block_ids]
            t = _Tracked(tokens, table, min(self._stored.pop(req.req_id, 0), int(req.num_computed_tokens) // bs))
            self._start(meta, req.req_id, t, int(req.num_computed_tokens))
            self._tracked[req.req_id] = t
            self._add_saves(meta, req.req_id, t, int(req.num_computed_tokens) + int(scheduled.get(req.req_id, 0)))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
            flags = getattr(cached, "resumed_from_preemption", None)
            for i, req_id in enumerate(cached.req_ids):
                t = self._tracked.get(req_id)
                if t is None:
                    continue
                new = cached.new_block_ids[i] if cached.new_block_ids else None
                computed = int(cached.num_computed_tokens[i])
                if req_id in resumed or (flags is not None and flags[i]):
                    t.table = [list(g) for g in new] if new else [[] for _ in t.table]
                    self._start(meta, req_id, t, computed)
                elif new:
                    for g, ids in enumerate(new):
                        t.table[g] += list(ids)
                self._add_saves(meta, req_id, t, computed + int(scheduled.get(req_id, 0)))
        self._load_pending.clear()
        return meta

    def _start(self, meta: KvmeshConnectorMetadata, req_id: str, t: "_Tracked", computed: int) -> None:
        external = self._load_pending.pop(req_id, 0)
        if not external:
            return
        bs = self._block_size
        first, last = (computed - external) // bs, computed // bs
        chains = self._chain(req_id, t.tokens)
        meta.loads.append(KvmeshTransfer(req_id, first, chains[first:last], self._positions(t.table, first, last, last)))

    def _add_saves(self, meta: KvmeshConnectorMetadata, req_id: str, t: "_Tracked", computed: int) -> None:
        end = min(computed, len(t.tokens)) // self._block_size
        end = min(end, min((len(ids) for ids in t.table), default=0))
        if end <= t.saved_blocks or self._unsupported:
            return
        chains = self._chain(req_id, t.tokens)
        first = t.saved_blocks
        meta.saves.append(KvmeshTransfer(req_id, first, chains[first:end], self._positions(t.table, first, end)))
        self._sessions.saved(req_id, chains[first:end])
        t.saved_blocks = end

    def request_finished(self, request: Any, block_ids: Any) -> Tuple[bool, Optional[dict]]:
        """Saves finish within their step, so vLLM may free the blocks at once. A
        request that closes its session releases the session's own blocks."""
        req_id = request.request_id
        self._tracked.pop(req_id, None)
        self._chains.pop(req_id, None)
        self._last.pop(req_id, None)
        self._load_pending.pop(req_id, None)
        self._stored.pop(req_id, None)
        closed = self._sessions.finished(request)
        if closed:
            self._release(closed)
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Tuple[List[int], ...]) -> Tuple[bool, Optional[dict]]:
        """Hybrid models (SupportsHMA): called once when the request finished
        in every KV-cache group."""
        return self.request_finished(request, block_ids)

    def _release(self, chains: List[np.ndarray]) -> None:
        if not self._all_tags:
            return
        blocks = sum(len(c) for c in chains)
        keys = _core.derive_keys(np.concatenate(chains), self._all_tags)
        try:
            self.client.release(keys)
            self.released_blocks += blocks
        except Error as e:  # a hint: the blocks just age as usual
            logger.warning("kvmesh: releasing %d blocks of a closed session failed: %s", blocks, e)

    # metadata binding (KVConnectorBase_V1's defaults, for the core alone)
    def bind_connector_metadata(self, connector_metadata: KvmeshConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def _get_connector_metadata(self) -> KvmeshConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    # ---- worker side: the paged KV ---------------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Registers the memory behind every layer's paged KV once and finds
        where each block's bytes lie; then tells the scheduler (a record in
        kvmesh) which runs this worker stores."""
        import torch

        rank = "mla" if self._mla else f"tp{self._tp_rank}/{self._tp_size}"
        for name, t in kv_caches.items():
            g = self._layer_group.get(name, 0 if not self._layer_group else None)
            if g is None:
                logger.debug("kvmesh: layer %s is in no KV-cache group; not moved", name)
                continue
            if not isinstance(t, torch.Tensor) or self._groups[g].kind == "unsupported":
                continue
            dim, r, offs, run, desc = block_runs(t, self._num_blocks)
            es = t.element_size()
            layer = _Layer(name, g, t.data_ptr(), r * t.stride(dim) * es, np.asarray(offs, dtype=np.int64) * es,
                           run * es, desc)
            layer.tags = [f"{rank}|{name}|{desc}|{j}".encode() for j in range(len(offs))]
            self._layers[name] = layer
            ptr, whole = whole_storage(t)
            if ptr not in self._registered:
                self._registered[ptr] = self.client.register(whole)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._load_threads, thread_name_prefix="kvmesh-vllm")
        self._write_record()

    def _write_record(self) -> None:
        saves = not (self._mla and self._tp_rank != 0)
        groups: Dict[str, dict] = {}
        for g in self._groups:
            names = [n for n in g.layer_names if n in self._layers] or \
                [n for n, l in self._layers.items() if l.group == g.index]
            tags = [t for n in names for t in self._layers[n].tags]
            if tags:
                groups[str(g.index)] = {"tags": [_hex(t) for t in tags]}
        rec = {"v": 1, "saves": saves, "groups": groups,
               "layout": sorted({l.desc for l in self._layers.values()})}
        try:
            self.client.put_from(self._record_key(self._pp_rank, self._tp_rank),
                                 [bytearray(json.dumps(rec).encode())], replace=True, priority=3)
        except Error as e:
            logger.warning("kvmesh: writing this worker's record failed (the scheduler will not hit): %s", e)

    def _moves(self, layer: _Layer, transfers: List[KvmeshTransfer]) -> Tuple[np.ndarray, np.ndarray, List[int], int]:
        """(keys, ptrs, owner block id per run, runs per block) of a layer's blocks."""
        chains, ids, owners = [], [], []
        for t in transfers:
            row = t.block_ids[layer.group] if layer.group < len(t.block_ids) else []
            lead = t.block_ids[0] if t.block_ids else row
            for i, b in enumerate(row):
                if b != _NULL:
                    chains.append(t.chains[i])
                    ids.append(b)
                    owners.append(lead[i] if lead[i] != _NULL else b)
        n = len(layer.offsets)
        if not ids:
            return np.zeros((0, 2), np.uint64), np.zeros(0, np.int64), [], n
        keys = _core.derive_keys(np.asarray(chains, dtype=np.uint64), layer.tags)
        ptrs = (layer.base + np.asarray(ids, dtype=np.int64)[:, None] * layer.block_stride + layer.offsets[None, :])
        return keys, ptrs.ravel(), owners, n

    def _load_layer(self, name: str, transfers: List[KvmeshTransfer]) -> Set[int]:
        layer = self._layers[name]
        keys, ptrs, owners, n = self._moves(layer, transfers)
        if not owners:
            return set()
        try:
            res = self.client.get_into_ptrs(keys, ptrs, layer.run_bytes)
        except Error as e:  # the whole call refused: every block of it is a load error, never a crash
            _warn_once(self, "load", e, layer.run_bytes)
            self._stats.add(load_errors=len(owners))
            return set(owners)
        bad = {owners[i // n] for i, r in enumerate(res) if not r.ok or r.size != layer.run_bytes}
        self._stats.add(loaded_blocks=len(owners) - len(bad), load_errors=len(bad))
        return bad

    def _save_layer(self, name: str, transfers: List[KvmeshTransfer]) -> int:
        layer = self._layers[name]
        keys, ptrs, owners, n = self._moves(layer, transfers)
        if not owners:
            return 0
        try:
            res = self.client.put_from_ptrs(keys, ptrs, layer.run_bytes)
        except Error as e:  # a later miss, never a crash of the engine
            _warn_once(self, "save", e, layer.run_bytes)
            self._stats.add(save_errors=len(owners))
            return len(owners)
        failed = len({i // n for i, r in enumerate(res) if not r.ok})
        self._stats.add(saved_blocks=len(owners) - failed, save_errors=failed)
        return failed

    def _ordered_layers(self) -> List[str]:
        order = [n for g in self._groups for n in g.layer_names]
        return [n for n in order if n in self._layers] + [n for n in self._layers if n not in order]

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Starts one asynchronous load per layer, in layer order (all of them
        before returning when layerwise is off)."""
        meta = self._get_connector_metadata()
        if not meta.loads or not self._layers:
            if meta.loads and not self._layers:
                raise RuntimeError("kvmesh: start_load_kv before register_kv_caches")
            return
        for name in self._ordered_layers():
            self._loads[name] = self._pool.submit(self._load_layer, name, meta.loads)
        if not self._layerwise:
            for name in list(self._loads):
                self.wait_for_layer_load(name)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until the layer's blocks are in the paged tensor (or known missing)."""
        f = self._loads.pop(layer_name, None)
        if f is not None:
            bad = f.result()
            if bad:
                with self._errors_lock:
                    self._load_errors |= bad

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Starts saving the step's new full prompt blocks of this layer."""
        meta = self._get_connector_metadata()
        if not meta.saves or not self._layerwise or layer_name not in self._layers:
            return
        if self._mla and self._tp_rank != 0:
            return  # rank 0 stores the latent cache every rank holds
        self._saves.append(self._pool.submit(self._save_layer, layer_name, meta.saves))

    def wait_for_save(self) -> None:
        """Blocks until every save of the step is done (vLLM may then overwrite the blocks)."""
        if not self._layerwise and self._connector_metadata is not None and self._connector_metadata.saves \
                and not (self._mla and self._tp_rank != 0):
            saves = self._connector_metadata.saves
            self._saves += [self._pool.submit(self._save_layer, n, saves) for n in self._ordered_layers()]
        saves, self._saves = self._saves, []
        failed = sum(f.result() for f in saves)
        if failed:
            self.save_errors += failed
            logger.warning("kvmesh: %d block saves failed (they will be recomputed)", failed)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        """Saves finish within their step: nothing of a preempted request is in flight."""
        return None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._errors_lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None

    def shutdown(self) -> None:
        for f in list(self._loads.values()) + self._saves:
            f.result()
        self._loads, self._saves = {}, []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._diagnoser is not None:
            self._diagnoser.close()
        for r in self._registered.values():
            if r.registered:
                self.client.unregister(r)
        self._registered = {}
        if self._owns_client:
            self.client.close()


def _warn_once(owner: Any, what: str, e: Exception, run_bytes: int) -> None:
    """Logs a refused transfer once per kind and message (a misconfigured
    cluster refuses every one: the log says why once)."""
    seen = owner.__dict__.setdefault("_warned", set())
    key = (what, str(e))
    if key in seen:
        return
    seen.add(key)
    logger.error("kvmesh: a %s of %d-byte runs was refused: %s (the nodes' $.store.slot_bytes must be at least "
                 "one run: docs/engines.md, store sizing)", what, run_bytes, e)


@dataclass
class _Tracked:
    tokens: List[int]
    table: List[List[int]]  # block ids per group, by prompt position
    saved_blocks: int


# ---- session closes --------------------------------------------------------------
@dataclass
class _Session:
    saves: List[np.ndarray] = field(default_factory=list)  # chain keys of blocks saved, in order
    own: Set[tuple] = field(default_factory=set)  # blocks this session computed first
    shared: Set[tuple] = field(default_factory=set)  # of those, blocks another request hit or saved


class _Sessions:
    """Which blocks a session computed that no other request read (the
    release of a closed session). Blocks are named by their chain key."""

    def __init__(self, max_sessions: int, max_seen_blocks: int):
        self._sessions: "OrderedDict[str, _Session]" = OrderedDict()
        self._req_session: Dict[str, str] = {}
        self._closing: Set[str] = set()
        self._owner: Dict[tuple, str] = {}
        self._fresh: Dict[str, Set[tuple]] = {}
        self._seen: "OrderedDict[int, None]" = OrderedDict()
        self._max_sessions = max(1, max_sessions)
        self._max_seen = max(0, max_seen_blocks)

    def _open(self, request: Any) -> Optional[str]:
        req_id = request.request_id
        if req_id in self._req_session:
            return self._req_session[req_id]
        params = getattr(request, "kv_transfer_params", None)
        if not isinstance(params, dict):
            return None
        closes = bool(params.get(_CLOSES))
        session = params.get(_SESSION)
        if session is None and not closes:
            return None
        session = f"session:{session}" if session is not None else f"request:{req_id}"
        self._req_session[req_id] = session
        if closes:
            self._closing.add(req_id)
        if session in self._sessions:
            self._sessions.move_to_end(session)
        else:
            self._sessions[session] = _Session()
            while len(self._sessions) > self._max_sessions:  # never closed: forget, release nothing
                self._forget(*self._sessions.popitem(last=False))
        return session

    def _share(self, key: tuple, session: Optional[str]) -> None:
        owner = self._owner.get(key)
        if owner is not None and owner != session:
            self._sessions[owner].shared.add(key)

    def admitted(self, request: Any, chains: np.ndarray, hit: int) -> None:
        """A request was admitted with `hit` blocks from kvmesh; chains: its full prompt blocks."""
        session = self._open(request)
        if not self._owner and session is None and self._max_seen == 0:
            return
        keys = [tuple(k) for k in chains.tolist()]
        for key in keys[:hit]:
            self._share(key, session)
        if self._max_seen == 0:
            return
        seen = self._seen
        if session is not None and request.request_id not in self._fresh:
            self._fresh[request.request_id] = {k for k in keys if hash(k) not in seen}
        for k in keys:
            h = hash(k)
            seen.pop(h, None)
            seen[h] = None
        while len(seen) > self._max_seen:
            seen.popitem(last=False)

    def saved(self, req_id: str, chains: np.ndarray) -> None:
        session = self._req_session.get(req_id)
        if session is None and not self._owner:
            return
        keys = [tuple(k) for k in chains.tolist()]
        if session is None:
            for key in keys:
                self._share(key, None)
            return
        s = self._sessions.get(session)
        if s is None:
            return
        fresh = self._fresh.get(req_id)
        for key in keys:
            if fresh is not None and key not in fresh:  # read before: computed again, not the session's own
                self._share(key, session)
                s.shared.add(key)
                continue
            owner = self._owner.setdefault(key, session)
            if owner != session:
                self._share(key, session)
                s.shared.add(key)
        s.saves.append(chains)

    def _forget(self, session: str, s: _Session) -> None:
        for chains in s.saves:
            for key in (tuple(k) for k in chains.tolist()):
                if self._owner.get(key) == session:
                    del self._owner[key]

    def finished(self, request: Any) -> List[np.ndarray]:
        """The chain keys to release when `request` closes its session (else [])."""
        req_id = request.request_id
        self._fresh.pop(req_id, None)
        session = self._req_session.pop(req_id, None)
        if req_id not in self._closing:
            return []
        self._closing.discard(req_id)
        s = self._sessions.pop(session, None) if session is not None else None
        if s is None:
            return []
        self._forget(session, s)
        out = []
        for chains in s.saves:  # shallowest first: the deepest ends up next to leave
            keep = [i for i, k in enumerate(chains.tolist()) if tuple(k) not in s.shared]
            if keep:
                out.append(chains[keep])
        return out

    def empty(self) -> bool:
        return not (self._sessions or self._owner or self._req_session or self._fresh)
