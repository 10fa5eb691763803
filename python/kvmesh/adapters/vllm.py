"""kvmesh as a vLLM KV connector (v1).

Method for method the shape of ``KVConnectorBase_V1`` in vLLM's
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` (vllm-project/vllm,
read at commit 003df2961dd8830c317a61f9745ccd557da9fa06). Scheduler side:
``get_num_new_matched_tokens`` (the prefix kvmesh holds, in tokens),
``update_state_after_alloc``, ``build_connector_meta``, ``request_finished``.
Worker side: ``register_kv_caches``, ``start_load_kv`` /
``wait_for_layer_load`` (one asynchronous load per layer, so layer i+1 loads
while layer i computes), ``save_kv_layer`` / ``wait_for_save`` (one
asynchronous save per layer), ``get_block_ids_with_load_errors``,
``get_finished``, ``shutdown``.

The paged KV of one layer is vLLM's (FlashAttention backend) tensor
``[2, num_blocks, block_size, num_kv_heads, head_dim]``: for each block, K and
V are each one contiguous run of ``block_size * num_kv_heads * head_dim``
elements. Registered once (``register_kv_caches``), they move straight
between the nodes and the tensor (``get_into_ptrs`` / ``put_from_ptrs``).

Keys. The K run of block b of layer l is stored under kvmesh's token key of
block b for the slice ``layers=(l, l + 1)`` (``Client.keys``), so it names its
whole prefix, the model and the tenant; the V run under a key derived from it.
A block counts as cached when K and V of every layer are stored.

This module does not import vLLM. To register it with vLLM, mix in the base
class so vLLM's checks pass::

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    class Connector(KvmeshConnector, KVConnectorBase_V1): pass

and name that class in ``--kv-transfer-config``; ``kv_connector_extra_config``
takes ``{"coordinator": "host:port"}`` (or ``"config"``, ``"tenant"``).

Session closes (an eviction hint, docs/eviction.md). A request's
``kv_transfer_params`` (vLLM passes the API request's ``kv_transfer_params``
to the connector) may carry ``"kvmesh.session"`` (an id shared by a session's
requests) and, on the session's last request, ``"kvmesh.session_closes": true``
(alone, it makes the request a session of its own). When that request
finishes, the scheduler-side connector releases the blocks the session's
requests computed and saved that no request had read before and no other
request hit or saved in the meantime (as this connector saw them): they
become the nodes' next victims unless read again. Blocks shared with other
sessions (a system prompt, a popular document, also one evicted and computed
again) are kept.
"""

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from .. import Client
from ..errors import Error
from ._keys import derive

logger = logging.getLogger(__name__)

_V = b"vllm-v"


@dataclass
class KvmeshTransfer:
    """Blocks [first_block, first_block + len(block_ids)) of one request."""
    req_id: str
    token_ids: List[int]  # the request's tokens up to the last block moved (keys name their prefix)
    first_block: int
    block_ids: List[int]  # vLLM's block id of each block moved


@dataclass
class KvmeshConnectorMetadata:
    """What the scheduler tells the workers for one step."""
    loads: List[KvmeshTransfer] = field(default_factory=list)
    saves: List[KvmeshTransfer] = field(default_factory=list)


@dataclass
class _Tracked:
    token_ids: List[int]
    block_ids: List[int]
    saved_blocks: int


_SESSION = "kvmesh.session"
_CLOSES = "kvmesh.session_closes"


@dataclass
class _Session:
    """Blocks an open session saved: (tokens, first block, layer-0 K key of each block)."""
    saves: List[Tuple[List[int], int, list]] = field(default_factory=list)
    shared: Set[Any] = field(default_factory=set)  # layer-0 K keys another request hit or saved


class KvmeshConnector:
    """vLLM KV connector v1 over kvmesh.

    vllm_config: vLLM's config (cache_config.block_size, kv_transfer_config.
    kv_connector_extra_config); role: KVConnectorRole (SCHEDULER or WORKER);
    kv_cache_config: vLLM's KVCacheConfig (its first group's layer_names give
    the layer order). client: a kvmesh Client to use instead of one made from
    the extra config. load_threads: layers in flight at once.

    Thread-safety: as vLLM calls a connector (one engine thread per role);
    the transfers themselves run on the connector's own threads.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None, *,
                 client: Optional[Client] = None, load_threads: int = 2, max_sessions: int = 4096,
                 max_seen_blocks: int = 1 << 18):
        self._vllm_config = vllm_config
        self._role = role
        self._connector_metadata: Optional[KvmeshConnectorMetadata] = None
        extra = dict(getattr(getattr(vllm_config, "kv_transfer_config", None), "kv_connector_extra_config", None)
                     or {})
        self._owns_client = client is None
        if client is None:
            client = Client(extra.get("coordinator"), config=extra.get("config"), tenant=extra.get("tenant", ""))
        self.client = client
        self._block_size = int(vllm_config.cache_config.block_size)
        if self._block_size != client.block_tokens:
            raise ValueError(f"vLLM's block_size {self._block_size} must equal kvmesh's block_tokens "
                             f"{client.block_tokens}")
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        self._layer_names: List[str] = list(groups[0].layer_names) if groups else []
        self._num_layers = len(self._layer_names) or client.model["num_layers"]
        if self._num_layers > client.model["num_layers"]:
            raise ValueError(f"{self._num_layers} layers, but kvmesh's model has {client.model['num_layers']}")
        # Scheduler state.
        self._hits: Dict[str, int] = {}          # req_id -> blocks kvmesh holds (last match)
        self._load_pending: Dict[str, int] = {}  # req_id -> external tokens to load
        self._tracked: Dict[str, _Tracked] = {}  # requests whose prompt blocks are being saved
        self._req_session: Dict[str, str] = {}   # req_id -> its session (requests that name one)
        self._closing: Set[str] = set()          # req_ids that close their session when they finish
        self._sessions: "OrderedDict[str, _Session]" = OrderedDict()  # open sessions, least recent first
        self._owner: Dict[Any, str] = {}         # layer-0 K key of a block an open session saved -> session
        self._max_sessions = max(1, max_sessions)
        self._fresh: Dict[str, Set[Any]] = {}    # req_id (of a session) -> its blocks no request read before
        self._prompt_keys: Dict[str, list] = {}  # req_id -> layer-0 K keys of its prompt's full blocks
        self._seen: Dict[int, None] = {}         # hash of blocks' layer-0 K keys, least recently read first
        self._max_seen = max(0, max_seen_blocks)
        self.released_blocks = 0  # blocks released on session closes (each: every layer's K and V)
        # Worker state.
        self._kv_caches: Dict[str, Any] = {}
        self._layer_index: Dict[str, int] = {}
        self._regions = []
        self._pool = ThreadPoolExecutor(max_workers=max(1, load_threads), thread_name_prefix="kvmesh-vllm")
        self._loads: Dict[str, Future] = {}
        self._saves: List[Future] = []
        self._load_errors: Set[int] = set()
        self.save_errors = 0  # blocks whose save failed (a later miss, not an error)

    @property
    def role(self) -> Any:
        return self._role

    # ---- keys -----------------------------------------------------------------
    def _layer_keys(self, tokens: List[int], layer: int, first: int, n: int) -> Tuple[list, list]:
        k = self.client.keys(tokens, layers=(layer, layer + 1))[first:first + n]
        return k, [derive(x, _V) for x in k]

    # ---- scheduler side -------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """Tokens beyond num_computed_tokens whose KV kvmesh holds (whole blocks, at
        least one prompt token left to compute); loads are synchronous with the step."""
        session = self._open_session(request)
        tokens = list(request.prompt_token_ids or [])
        blocks = max(0, len(tokens) - 1) // self._block_size
        if blocks == 0:
            return 0, False
        per_layer = [self._layer_keys(tokens[:blocks * self._block_size], layer, 0, blocks)
                     for layer in range(self._num_layers)]
        ordered = []  # block-major: every layer's K and V of block 0, then block 1, ...
        for b in range(blocks):
            for k, v in per_layer:
                ordered += (k[b], v[b])
        hits = self.client.exists(ordered) // (2 * self._num_layers)
        self._hits[request.request_id] = hits
        if self._owner:
            for key in per_layer[0][0][:hits]:
                self._share(key, session)
        full = len(tokens) // self._block_size  # the blocks a save may cover
        read = per_layer[0][0] if full == blocks else self._layer_keys(tokens[:full * self._block_size], 0, 0, full)[0]
        self._prompt_keys[request.request_id] = read
        self._read(request.request_id, read, session)
        return max(0, hits * self._block_size - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self._load_pending[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KvmeshConnectorMetadata:
        """Loads for requests that found blocks in kvmesh, saves of newly computed prompt blocks."""
        meta = KvmeshConnectorMetadata()
        bs = self._block_size
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        for req in scheduler_output.scheduled_new_reqs:
            tokens = list(req.prompt_token_ids or [])
            block_ids = list(req.block_ids[0])
            computed = int(req.num_computed_tokens)
            external = self._load_pending.pop(req.req_id, 0)
            if external:
                first, last = (computed - external) // bs, computed // bs
                meta.loads.append(KvmeshTransfer(req.req_id, tokens[:last * bs], first, block_ids[first:last]))
            t = _Tracked(tokens, block_ids, self._hits.pop(req.req_id, 0))
            self._tracked[req.req_id] = t
            self._add_saves(meta, req.req_id, t, computed + int(scheduled.get(req.req_id, 0)))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
            flags = getattr(cached, "resumed_from_preemption", None)
            for i, req_id in enumerate(cached.req_ids):
                t = self._tracked.get(req_id)
                if t is None:
                    continue
                new_ids = cached.new_block_ids[i] if cached.new_block_ids else None
                if req_id in resumed or (flags is not None and flags[i]):
                    t.block_ids = list(new_ids[0]) if new_ids else []
                elif new_ids:
                    t.block_ids += list(new_ids[0])
                computed = int(cached.num_computed_tokens[i]) + int(scheduled.get(req_id, 0))
                self._add_saves(meta, req_id, t, computed)
        self._load_pending.clear()
        return meta

    def _add_saves(self, meta: KvmeshConnectorMetadata, req_id: str, t: _Tracked, computed: int) -> None:
        bs = self._block_size
        end = min(computed, len(t.token_ids)) // bs
        end = min(end, len(t.block_ids))
        if end > t.saved_blocks:
            tokens = t.token_ids[:end * bs]
            meta.saves.append(KvmeshTransfer(req_id, tokens, t.saved_blocks, t.block_ids[t.saved_blocks:end]))
            self._saved(req_id, tokens, t.saved_blocks, end - t.saved_blocks)
            t.saved_blocks = end

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[dict]]:
        """Saves finish within their step, so vLLM may free the blocks at once. A
        request that closes its session releases the session's own blocks."""
        req_id = request.request_id
        self._tracked.pop(req_id, None)
        self._hits.pop(req_id, None)
        self._fresh.pop(req_id, None)
        self._prompt_keys.pop(req_id, None)
        session = self._req_session.pop(req_id, None)
        if req_id in self._closing:
            self._closing.discard(req_id)
            if session is not None:
                self._close_session(session)
        return False, None

    # ---- scheduler side: session closes -----------------------------------------
    def _open_session(self, request: Any) -> Optional[str]:
        """The request's session (from its kv_transfer_params), or None."""
        req_id = request.request_id
        if req_id in self._req_session:  # asked again (a preempted request, a later step)
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

    def _read(self, req_id: str, keys: list, session: Optional[str]) -> None:
        """A request reads blocks `keys` (its prompt's full blocks): those no
        request read before may become its session's own."""
        if self._max_seen == 0:
            return
        seen = self._seen
        if session is not None and req_id not in self._fresh:
            self._fresh[req_id] = {k for k in keys if hash(k) not in seen}
        for k in keys:
            h = hash(k)
            seen.pop(h, None)
            seen[h] = None
        while len(seen) > self._max_seen:
            del seen[next(iter(seen))]

    def _share(self, key: Any, session: Optional[str]) -> None:
        """Another request (of `session`, or of none) hit or saved block `key`."""
        owner = self._owner.get(key)
        if owner is not None and owner != session:
            self._sessions[owner].shared.add(key)

    def _saved(self, req_id: str, tokens: List[int], first: int, n: int) -> None:
        session = self._req_session.get(req_id)
        keys = []
        if session is not None or self._owner:
            known = self._prompt_keys.get(req_id)  # hashed when the request was matched
            keys = known[first:first + n] if known is not None and len(known) >= first + n \
                else self._layer_keys(tokens, 0, first, n)[0]
        if session is None:
            for key in keys:
                self._share(key, None)
            return
        s = self._sessions.get(session)
        if s is None:  # forgotten (max_sessions): untracked from here on
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
                s.shared.add(key)  # both saved it: neither session's own
        s.saves.append((tokens, first, keys))

    def _forget(self, session: str, s: _Session) -> None:
        for _, _, keys in s.saves:
            for key in keys:
                if self._owner.get(key) == session:
                    del self._owner[key]

    def _close_session(self, session: str) -> None:
        s = self._sessions.pop(session, None)
        if s is None:
            return
        self._forget(session, s)
        keys, blocks = [], 0
        for tokens, first, own in s.saves:  # shallowest first: the deepest ends up next to leave
            keep = [i for i, key in enumerate(own) if key not in s.shared]
            if not keep:
                continue
            per_layer = [self._layer_keys(tokens, layer, first, len(own)) for layer in range(self._num_layers)]
            for i in keep:
                for k, v in per_layer:
                    keys += (k[i], v[i])
            blocks += len(keep)
        if not keys:
            return
        try:
            self.client.release(keys)
            self.released_blocks += blocks
        except Error as e:  # a hint: the blocks just age as usual
            logger.warning("kvmesh: releasing %d blocks of a closed session failed: %s", blocks, e)

    # ---- worker side: metadata ------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KvmeshConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def _get_connector_metadata(self) -> KvmeshConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    # ---- worker side: the paged KV --------------------------------------------
    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        """Registers every layer's [2, num_blocks, block_size, heads, head_dim] tensor once."""
        names = self._layer_names or list(kv_caches)
        for name, t in kv_caches.items():
            if t.dim() != 5 or t.shape[0] != 2 or t.shape[2] != self._block_size or not t.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous [2, num_blocks, {self._block_size}, "
                                 f"num_kv_heads, head_dim] tensor, got {tuple(t.shape)}")
            if name not in names:
                raise ValueError(f"{name} is not among the layers {names}")
            self._kv_caches[name] = t
            self._layer_index[name] = names.index(name)
            self._regions.append(self.client.register(t))

    def _runs(self, kv: Any, block_ids: List[int]) -> Tuple[List[int], int]:
        """Addresses of the K and V runs of each block (K0, V0, K1, V1, ...) and a run's bytes."""
        num_blocks = kv.shape[1]
        run = kv[0, 0].numel() * kv.element_size()
        base = kv.data_ptr()
        ptrs = []
        for b in block_ids:
            ptrs += (base + b * run, base + (num_blocks + b) * run)
        return ptrs, run

    def _transfer_keys(self, t: KvmeshTransfer, layer: int) -> list:
        k, v = self._layer_keys(t.token_ids, layer, t.first_block, len(t.block_ids))
        return [x for pair in zip(k, v) for x in pair]

    def _load_layer(self, name: str, transfers: List[KvmeshTransfer]) -> Set[int]:
        kv, layer = self._kv_caches[name], self._layer_index[name]
        keys, ptrs, owners = [], [], []
        for t in transfers:
            keys += self._transfer_keys(t, layer)
            p, run = self._runs(kv, t.block_ids)
            ptrs += p
            owners += [b for b in t.block_ids for _ in (0, 1)]
        if not keys:
            return set()
        res = self.client.get_into_ptrs(keys, ptrs, run)
        return {owners[i] for i, r in enumerate(res) if not r.ok or r.size != run}

    def _save_layer(self, name: str, kv: Any, transfers: List[KvmeshTransfer]) -> int:
        layer = self._layer_index[name]
        keys, ptrs = [], []
        for t in transfers:
            keys += self._transfer_keys(t, layer)
            p, run = self._runs(kv, t.block_ids)
            ptrs += p
        if not keys:
            return 0
        if kv.data_ptr() == self._kv_caches[name].data_ptr():
            res = self.client.put_from_ptrs(keys, ptrs, run)
        else:  # a tensor vLLM did not register with us: views, still no copy here
            views = [kv[i, b] for t in transfers for b in t.block_ids for i in (0, 1)]
            res = self.client.put_from(keys, views)
        return sum(not r.ok for r in res) // 2

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Starts one asynchronous load per layer, in layer order."""
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        if not self._kv_caches:
            raise RuntimeError("start_load_kv before register_kv_caches")
        for name in sorted(self._kv_caches, key=self._layer_index.get):
            self._loads[name] = self._pool.submit(self._load_layer, name, meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Blocks until the layer's blocks are in the paged tensor (or known missing)."""
        f = self._loads.pop(layer_name, None)
        if f is not None:
            self._load_errors |= f.result()

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        """Starts saving the step's new prompt blocks of this layer."""
        meta = self._get_connector_metadata()
        if meta.saves:
            self._saves.append(self._pool.submit(self._save_layer, layer_name, kv_layer, meta.saves))

    def wait_for_save(self) -> None:
        """Blocks until every save of the step is done (vLLM may then overwrite the blocks)."""
        saves, self._saves = self._saves, []
        for f in saves:
            failed = f.result()
            if failed:
                self.save_errors += failed
                logger.warning("kvmesh: %d block saves failed (they will be recomputed)", failed)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return None, None

    def shutdown(self) -> None:
        for f in list(self._loads.values()) + self._saves:
            f.result()
        self._loads, self._saves = {}, []
        self._pool.shutdown(wait=True)
        for r in self._regions:
            if r.registered:
                self.client.unregister(r)
        self._regions = []
        if self._owns_client:
            self.client.close()
