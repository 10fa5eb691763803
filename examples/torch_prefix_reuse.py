#!/usr/bin/env python3
"""Prefix KV reuse with kvmesh in a small decoder-only PyTorch model.

A model with random weights (fixed seed), grouped-query attention and a paged
KV cache serves requests that share a long prefix. The first request computes
the prefix's KV and stores its full blocks in kvmesh; the next request with
the same prefix finds them (match_prefix), reads them straight into its paged
cache (get_into on memory from Client.allocate, registered already: over UCX
shared memory the nodes write themselves) and computes only its own tokens. The
script prints the time to first token (TTFT) with and without reuse, medians
over several runs, and checks that the logits are identical (torch.equal).

The paged cache is laid out as kvmesh lays out a block (docs/block-layout.md):
cache[block] is [layer][k|v][kv_head][token][head_dim], one contiguous run per
block, so a block moves between the cache and kvmesh as one item, no copy.

    PYTHONPATH=build/python /usr/bin/python3 examples/torch_prefix_reuse.py
    PYTHONPATH=build/python /usr/bin/python3 examples/torch_prefix_reuse.py --coordinator 127.0.0.1:7070

By default the cluster is embedded (three shard nodes in this process); with
--coordinator it is a running `kvmesh coordinator` and its nodes, whose
model's block_tokens must match --block-tokens.
"""

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import kvmesh


@dataclass
class ModelConfig:
    vocab: int = 8192
    layers: int = 8
    d_model: int = 256
    q_heads: int = 8
    kv_heads: int = 2  # GQA: 4 query heads share each KV head
    head_dim: int = 32
    mlp: int = 768
    block_tokens: int = 16


class PagedKVCache:
    """A pool of KV blocks, [num_blocks, layers, 2, kv_heads, block_tokens, head_dim];
    a request holds a block table (its blocks in token order)."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, client, dtype=torch.float32):
        self.cfg = cfg
        shape = (num_blocks, cfg.layers, 2, cfg.kv_heads, cfg.block_tokens, cfg.head_dim)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        # The pool lives in memory kvmesh allocated and registered: transfers into
        # and out of it are zero-copy (the tensor keeps the memory alive).
        self.memory = client.allocate(nbytes)
        self.data = torch.frombuffer(self.memory, dtype=dtype).view(shape)
        self.data.zero_()
        self.free = list(range(num_blocks))

    def alloc(self, tokens: int) -> list:
        n = math.ceil(tokens / self.cfg.block_tokens)
        table, self.free = self.free[:n], self.free[n:]
        return table

    def release(self, table: list) -> None:
        self.free = table + self.free

    def write(self, layer: int, table: list, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """K and V ([kv_heads, n, head_dim]) of positions start .. start + n."""
        bt = self.cfg.block_tokens
        pos = torch.arange(start, start + k.shape[1])
        blocks = torch.tensor(table)[pos // bt]
        self.data[blocks, layer, 0, :, pos % bt] = k.transpose(0, 1)
        self.data[blocks, layer, 1, :, pos % bt] = v.transpose(0, 1)

    def read(self, layer: int, table: list, length: int):
        """K and V ([kv_heads, length, head_dim]) of positions 0 .. length."""
        nb = math.ceil(length / self.cfg.block_tokens)
        kv = self.data[table[:nb], layer]  # [nb, 2, kv_heads, bt, dim]
        kv = kv.permute(1, 2, 0, 3, 4).reshape(2, self.cfg.kv_heads, nb * self.cfg.block_tokens, -1)
        return kv[0, :, :length], kv[1, :, :length]


class Model(torch.nn.Module):
    """Decoder-only transformer: RMSNorm, rotary positions, GQA attention, SwiGLU MLP."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[0]), requires_grad=False)

        d, hq, hk = cfg.d_model, cfg.q_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.embed = torch.nn.Parameter(torch.randn(cfg.vocab, d, generator=g), requires_grad=False)
        self.wq = torch.nn.ParameterList([w(d, hq) for _ in range(cfg.layers)])
        self.wk = torch.nn.ParameterList([w(d, hk) for _ in range(cfg.layers)])
        self.wv = torch.nn.ParameterList([w(d, hk) for _ in range(cfg.layers)])
        self.wo = torch.nn.ParameterList([w(hq, d) for _ in range(cfg.layers)])
        self.w_gate = torch.nn.ParameterList([w(d, cfg.mlp) for _ in range(cfg.layers)])
        self.w_up = torch.nn.ParameterList([w(d, cfg.mlp) for _ in range(cfg.layers)])
        self.w_down = torch.nn.ParameterList([w(cfg.mlp, d) for _ in range(cfg.layers)])
        self.lm_head = w(d, cfg.vocab)
        inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @staticmethod
    def norm(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def rope(self, x, start):  # x: [heads, n, dim]
        pos = torch.arange(start, start + x.shape[1], dtype=torch.float32)
        ang = torch.outer(pos, self.inv_freq)
        cos, sin = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: int, cache: PagedKVCache, table: list,
                logits: int = 0) -> torch.Tensor:
        """Logits of the last `logits` of the tokens at positions start .. start + n (None
        for 0); the tokens' K and V go into the cache."""
        cfg = self.cfg
        n, total = tokens.shape[0], start + tokens.shape[0]
        x = self.embed[tokens]
        causal = torch.ones(n, total, dtype=torch.bool).tril(diagonal=start)
        for layer in range(cfg.layers):
            h = self.norm(x)
            q = (h @ self.wq[layer]).view(n, cfg.q_heads, cfg.head_dim).transpose(0, 1)
            k = (h @ self.wk[layer]).view(n, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
            v = (h @ self.wv[layer]).view(n, cfg.kv_heads, cfg.head_dim).transpose(0, 1)
            q, k = self.rope(q, start), self.rope(k, start)
            cache.write(layer, table, start, k, v)
            keys, values = cache.read(layer, table, total)  # [kv_heads, total, dim]
            group = cfg.q_heads // cfg.kv_heads
            q = q.view(cfg.kv_heads, group * n, cfg.head_dim)  # query heads grouped by their KV head
            scores = (q @ keys.transpose(1, 2)) / math.sqrt(cfg.head_dim)
            scores = scores.view(cfg.kv_heads, group, n, total).masked_fill(~causal, float("-inf"))
            attn = torch.softmax(scores, dim=-1).view(cfg.kv_heads, group * n, total) @ values
            attn = attn.view(cfg.q_heads, n, cfg.head_dim).transpose(0, 1).reshape(n, -1)
            x = x + attn @ self.wo[layer]
            h = self.norm(x)
            x = x + (F.silu(h @ self.w_gate[layer]) * (h @ self.w_up[layer])) @ self.w_down[layer]
        return self.norm(x[n - logits:]) @ self.lm_head if logits else None


class Engine:
    """Chunked prefill with an optional kvmesh prefix cache.

    Prompts are computed in chunks of `chunk` tokens from position 0 (a
    multiple of the block size). A reused prefix is cut down to whole chunks,
    so the tokens after it are computed with the very shapes, and so the very
    kernels, of a run without reuse: the logits match bit for bit."""

    def __init__(self, model: Model, cache: PagedKVCache, client, chunk: int):
        self.model, self.cache, self.client, self.chunk = model, cache, client, chunk
        self.bt = model.cfg.block_tokens

    def prefill(self, tokens: list, reuse: bool):
        """(logits of the last chunk, block table, tokens reused, TTFT in seconds)."""
        t0 = time.perf_counter()
        table = self.cache.alloc(len(tokens))
        t = torch.tensor(tokens)
        start = 0
        if reuse:
            hit = self.client.match_prefix(tokens)                          # leading full blocks cached
            start = min(hit * self.bt, len(tokens) - 1) // self.chunk * self.chunk
            if start:
                n = start // self.bt
                keys = self.client.keys(tokens[:start])
                st = self.client.get_into(keys, [self.cache.data[b] for b in table[:n]])  # zero copy
                got = next((i for i, s in enumerate(st) if not s.ok), n)   # evicted meanwhile: recompute
                start = got * self.bt // self.chunk * self.chunk
        for s in range(start, len(tokens), self.chunk):
            last = s + self.chunk >= len(tokens)
            logits = self.model(t[s:s + self.chunk], s, self.cache, table, logits=len(tokens) - s if last else 0)
        return logits, table, start, time.perf_counter() - t0

    def store(self, tokens: list, table: list) -> float:
        """Stores the request's full blocks that kvmesh does not have yet."""
        t0 = time.perf_counter()
        have = self.client.match_prefix(tokens)
        keys = self.client.keys(tokens)
        st = self.client.put_from(keys[have:], [self.cache.data[b] for b in table[have:len(keys)]])
        if not all(st):
            raise RuntimeError(f"storing blocks failed: {[s for s in st if not s.ok][:3]}")
        return time.perf_counter() - t0


def cluster_config(cfg: ModelConfig) -> dict:
    return {
        "model": {"model_id": "torch-prefix-reuse-demo", "num_layers": cfg.layers, "num_kv_heads": cfg.kv_heads,
                  "head_dim": cfg.head_dim, "dtype": "fp32", "block_tokens": cfg.block_tokens},
        "nodes": [{"id": f"node{i}", "memory": {"host": "96MiB"}} for i in range(3)],
        "store": {"slot_bytes": "1MiB"},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", help="host:port of a running kvmesh coordinator (default: embedded cluster)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prefix-tokens", type=int, default=768, help="shared prefix (rounded down to whole blocks)")
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--chunk-tokens", type=int, default=256, help="prefill chunk (a multiple of --block-tokens)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    cfg = ModelConfig(layers=args.layers, d_model=args.d_model, block_tokens=args.block_tokens,
                      head_dim=args.d_model // ModelConfig.q_heads, mlp=3 * args.d_model)
    chunk = args.chunk_tokens // cfg.block_tokens * cfg.block_tokens
    prefix_len = args.prefix_tokens // chunk * chunk
    if chunk == 0 or prefix_len == 0:
        sys.exit("--chunk-tokens and --prefix-tokens must hold at least one block and one chunk")
    torch.manual_seed(args.seed)
    model = Model(cfg, seed=args.seed)
    if args.coordinator:
        client = kvmesh.Client(args.coordinator, tenant=f"torch-example-{time.time_ns()}")
        where = f"daemons via {args.coordinator} ({client.num_nodes} nodes)"
        if client.block_tokens != cfg.block_tokens:
            sys.exit(f"the cluster's block_tokens is {client.block_tokens}; pass --block-tokens {client.block_tokens}")
    else:
        client = kvmesh.EmbeddedCluster(cluster_config(cfg))
        where = f"embedded cluster ({client.num_nodes} nodes in this process)"
    blocks_per_req = math.ceil((prefix_len + args.suffix_tokens) / cfg.block_tokens)
    cache = PagedKVCache(cfg, num_blocks=3 * blocks_per_req, client=client)
    engine = Engine(model, cache, client, chunk)
    block_bytes = cache.data[0].numel() * cache.data.element_size()

    print(f"kvmesh prefix reuse, {where}")
    print(f"model: {cfg.layers} layers, d_model {cfg.d_model}, {cfg.q_heads} query / {cfg.kv_heads} KV heads (GQA), "
          f"head_dim {cfg.head_dim}, fp32, random weights (seed {args.seed}); paged KV, {cfg.block_tokens}-token "
          f"blocks of {block_bytes // 1024} KiB; prefill in {chunk}-token chunks")
    print(f"each run: request 1 = {prefix_len}-token prefix + {args.suffix_tokens} tokens (computed, then stored); "
          f"request 2 = same prefix + {args.suffix_tokens} other tokens, without and with reuse")
    print(f"{'run':>3}  {'TTFT without reuse':>18}  {'TTFT with reuse':>15}  {'reused':>6}  {'loaded':>9}  "
          f"{'store':>8}  logits identical")
    g = torch.Generator().manual_seed(args.seed + 1)

    def rand(n):
        return torch.randint(0, cfg.vocab, (n,), generator=g).tolist()

    no, yes, stores, max_diff = [], [], [], 0.0
    for run in range(args.runs + 1):  # run 0 warms up (first-call overheads), not counted
        prefix = rand(prefix_len)
        req1, req2 = prefix + rand(args.suffix_tokens), prefix + rand(args.suffix_tokens)
        _, t1, _, _ = engine.prefill(req1, reuse=True)  # a new prefix: nothing cached yet
        store_s = engine.store(req1, t1)
        cache.release(t1)
        logits_no, t_no, _, ttft_no = engine.prefill(req2, reuse=False)
        logits_yes, t_yes, reused, ttft_yes = engine.prefill(req2, reuse=True)
        same = torch.equal(logits_no, logits_yes) and torch.equal(cache.data[t_no], cache.data[t_yes])
        # The same request in one pass instead of chunks agrees to rounding only.
        t_one = cache.alloc(len(req2))
        one = model(torch.tensor(req2), 0, cache, t_one, logits=logits_no.shape[0])
        max_diff = max(max_diff, (one - logits_no).abs().max().item())
        for t in (t_no, t_yes, t_one):
            cache.release(t)
        if not same or reused != prefix_len:
            print(f"run {run}: reused {reused} of {prefix_len} tokens, logits identical: {same}")
            return 1
        if run == 0:
            continue
        no.append(ttft_no)
        yes.append(ttft_yes)
        stores.append(store_s)
        print(f"{run:>3}  {ttft_no * 1e3:>15.1f} ms  {ttft_yes * 1e3:>12.1f} ms  {reused:>6}  "
              f"{prefix_len // cfg.block_tokens * block_bytes / 2**20:>5.1f} MiB  {store_s * 1e3:>5.1f} ms  yes")
    m_no, m_yes = statistics.median(no), statistics.median(yes)
    print(f"median TTFT: without reuse {m_no * 1e3:.1f} ms, with reuse {m_yes * 1e3:.1f} ms "
          f"({m_no / m_yes:.1f}x); storing the prefix after request 1: {statistics.median(stores) * 1e3:.1f} ms")
    print(f"logits with reuse == logits without reuse (torch.equal) in all {args.runs} runs; "
          f"a one-pass prefill differs from the chunked one by at most {max_diff:.1e}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
