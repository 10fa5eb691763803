"""Runs `kvmesh demo --json` on a small workload and checks the report's shape and sense."""
import json
import os
import subprocess
import sys

# Bounds grow with the build (sanitizers: KVMESH_TEST_TIME_SCALE, cmake/KvmeshHelpers.cmake).
SCALE = int(os.environ.get("KVMESH_TEST_TIME_SCALE", "1"))

out = subprocess.run([sys.argv[1], "demo", "--json", "--conversations", "80", "--threads", "2"],
                     check=True, capture_output=True, text=True, timeout=120 * SCALE).stdout
r = json.loads(out)
for key in ("prefix_hit_rate", "evictions", "latency_us", "bytes_in_use", "requests", "mismatches"):
    assert key in r, f"missing {key}"
for op in ("match_prefix", "get", "put"):
    lat = r["latency_us"][op]
    assert 0 < lat["p50"] <= lat["p99"], (op, lat)
assert 0 < r["prefix_hit_rate"] <= r["infinite_cache_prefix_hit_rate"] <= 1, r
assert r["mismatches"] == 0 and r["put_errors"] == 0, r
assert r["evictions"]["total"] == sum(r["evictions"]["by_class"].values()), r
assert r["bytes_in_use"] <= r["capacity_bytes"], r
print("demo --json OK:", {k: r[k] for k in ("requests", "prefix_hit_rate", "blocks_stored")})

# The decode part: model-parallel decode over kvmesh sequences, with and without reuse.
d = r["decode"]
assert d["ranks"] == 4, d
w, wo = d["with_reuse"], d["without_reuse"]
assert w["requests"] == wo["requests"] > 0 and w["generated_tokens"] == wo["generated_tokens"] > 0, d
assert d["same_tokens_with_and_without_reuse"] is True, d  # raw KV: reuse never changes a token
assert w["prefix_hit_rate"] > 0.3 and wo["prefix_hit_rate"] == 0, d
assert w["computed_prompt_tokens"] < wo["computed_prompt_tokens"], d
assert w["ttft_ms_p50"] > 0 and w["tokens_per_s"] > 0, d
print("demo --json decode OK:", {k: d["with_reuse"][k] for k in ("requests", "prefix_hit_rate")})
