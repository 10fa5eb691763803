#!/usr/bin/env python3
"""What the vLLM connector costs vLLM's scheduler thread: one
get_num_new_matched_tokens call (kvmesh.adapters.vllm.KvmeshConnector, the
class kvmesh.vllm.KvmeshConnector adds vLLM's bases to) against daemons this
script starts (`kvmesh coordinator` + nodes on 127.0.0.1, ports chosen at run
time), beside an empty call of the same signature in the same run.

A worker-side connector first stores --prompts prompts of --tokens tokens of
a model shaped like an 8B GQA model (32 layers, 8 KV heads of 128, fp16,
vLLM's FlashAttention NHD layout: 2 runs of 32 KiB per layer and block).
Then the scheduler-side connector looks prompts up, each call a new request
(so its chain keys are computed, as for every request vLLM admits): stored
prompts (a hit of every block) and unstored ones (a miss at block 0), with
the default probe (one run per block) and with "lookup": "exact" (every run
of every layer). Rounds interleave the cases; the figures are medians (and
p99) over --rounds calls of each.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_vllm_lookup.py
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_vllm_lookup.py --tokens 8192 --transport ucx
"""

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

from kvmesh.adapters.vllm import KvmeshConnector

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests"))
from launch import KVMESH_BIN, cluster  # noqa: E402  (tests/launch.py: the daemons' launcher)

LAYERS, HEADS, DIM, BS = 32, 8, 128, 16


def config(coordinator, exact=False):
    extra = {"coordinator": coordinator, "tenant": "bench", "lookup": "exact" if exact else "sampled"}
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    spec = type("FullAttentionSpec", (), {"block_size": BS})()
    kcc = SimpleNamespace(num_blocks=None, kv_cache_groups=[SimpleNamespace(layer_names=names, kv_cache_spec=spec)])
    conf = SimpleNamespace(cache_config=SimpleNamespace(block_size=BS),
                           model_config=SimpleNamespace(model="bench/llama-8b-shape", use_mla=False),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, rank=0),
                           kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra, engine_id="bench"))
    return conf, kcc, names


def store(coordinator, prompts, blocks):
    """A worker stores every block of every prompt (the model runner's saves)."""
    conf, kcc, names = config(coordinator)
    kcc.num_blocks = blocks + 1  # block 0 is vLLM's null block
    worker = KvmeshConnector(conf, "WORKER", kcc)
    sched = KvmeshConnector(conf, "SCHEDULER", kcc)
    kv = {n: torch.zeros(2, blocks + 1, BS, HEADS, DIM, dtype=torch.float16) for n in names}
    worker.register_kv_caches(kv)
    for i, p in enumerate(prompts):
        req = SimpleNamespace(request_id=f"store-{i}", prompt_token_ids=p)
        sched.get_num_new_matched_tokens(req, 0)
        sched.update_state_after_alloc(req, None, 0)
        out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(
            req_id=req.request_id, prompt_token_ids=p, block_ids=(list(range(1, blocks + 1)),),
            num_computed_tokens=0)], scheduled_cached_reqs=None, num_scheduled_tokens={req.request_id: len(p)})
        worker.bind_connector_metadata(sched.build_connector_meta(out))
        for n in names:
            worker.save_kv_layer(n, kv[n], None)
        worker.wait_for_save()
        worker.clear_connector_metadata()
        sched.request_finished(req, [])
        print(f"\rstoring prompts: {i + 1}/{len(prompts)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    saved = worker.stats()["saved_blocks"]
    sched.shutdown()
    worker.shutdown()
    return saved


def empty_call(request, num_computed_tokens):
    """The baseline: a call of the same signature that does nothing."""
    return 0, False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=["ucx", "tcp"], default="tcp")
    ap.add_argument("--kvmesh-bin", default=KVMESH_BIN)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2048, help="prompt length (whole blocks of 16 are stored)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts stored")
    ap.add_argument("--rounds", type=int, default=200, help="timed calls per case")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args()

    # The README's cluster for the engines: 4 MiB slots in 8 size classes, so a run (one layer's K or
    # V of one block: 16 x 8 x 128 x 2 B = 32 KiB) takes a 36.5 KiB chunk.
    cfg = json.load(open(os.path.join(SOURCE_DIR, "cluster_configs", "engines-local.json")))
    cfg["nodes"] = cfg["nodes"][:args.nodes]
    cfg["transport"]["backend"] = args.transport
    blocks = args.tokens // BS
    prompts = [[(7919 * i + 104729 * j) % 32000 for j in range(args.tokens)] for i in range(args.prompts)]
    with cluster(cfg, binary=args.kvmesh_bin) as d:
        saved = store(d.address, prompts, blocks)
        result = measure(d.address, prompts, blocks, args.rounds)
    result.update(tokens=args.tokens, blocks=blocks, layers=LAYERS, transport=args.transport, nodes=args.nodes,
                  rounds=args.rounds, saved_blocks=saved)
    if args.json:
        print(json.dumps(result))
        return
    print(f"vLLM connector: get_num_new_matched_tokens on the scheduler thread, {args.tokens}-token prompts "
          f"({blocks} blocks), {LAYERS} layers x 2 runs per block, {args.nodes} nodes over {args.transport}; "
          f"medians of {args.rounds} calls, each a new request")
    print(f"  {'case':<34}{'p50 us':>10}{'p99 us':>10}{'x empty':>10}{'tokens':>8}")
    base = result["cases"]["empty call"]["p50_us"]
    for name, c in result["cases"].items():
        print(f"  {name:<34}{c['p50_us']:>10.1f}{c['p99_us']:>10.1f}{c['p50_us'] / base:>10.0f}{c['tokens']:>8}")


def measure(coordinator, prompts, blocks, rounds):
    conf, kcc, _ = config(coordinator)
    sampled = KvmeshConnector(conf, "SCHEDULER", kcc)
    conf_x, kcc_x, _ = config(coordinator, exact=True)
    exact = KvmeshConnector(conf_x, "SCHEDULER", kcc_x)
    cold = [[t + 1 for t in p] for p in prompts]  # never stored: a miss at block 0
    cases = {
        "empty call": (empty_call, prompts),
        "sampled probe, every block hit": (sampled.get_num_new_matched_tokens, prompts),
        "sampled probe, miss at block 0": (sampled.get_num_new_matched_tokens, cold),
        "exact probe, every block hit": (exact.get_num_new_matched_tokens, prompts),
        "exact probe, miss at block 0": (exact.get_num_new_matched_tokens, cold),
    }
    for fn, ps in cases.values():  # warm-up: records read, connections made
        fn(SimpleNamespace(request_id="warm", prompt_token_ids=ps[0]), 0)
    times = {name: [] for name in cases}
    tokens = {}
    n = 0
    for r in range(rounds):
        order = list(cases) if r % 2 == 0 else list(reversed(list(cases)))
        for name in order:
            fn, ps = cases[name]
            req = SimpleNamespace(request_id=f"r{n}", prompt_token_ids=ps[r % len(ps)])
            n += 1
            t0 = time.perf_counter()
            got, _ = fn(req, 0)
            times[name].append(time.perf_counter() - t0)
            tokens[name] = got
            if fn is not empty_call:
                fn.__self__.request_finished(req, [])  # drops the request's cached chain keys
        if r % 20 == 19:
            print(f"\rmeasuring: {r + 1}/{rounds} rounds", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    sampled.shutdown()
    exact.shutdown()
    out = {}
    for name, ts in times.items():
        ts = sorted(ts)
        out[name] = {"p50_us": statistics.median(ts) * 1e6, "p99_us": ts[int(0.99 * (len(ts) - 1))] * 1e6,
                     "tokens": tokens[name]}
    return {"cases": out}


if __name__ == "__main__":
    main()
