"""Runs `kvmesh replay --json` on a held-out trace and checks the rows: prefix
hit rate, gap closed and FLOPs saved for each policy, the default named."""
import json
import os
import subprocess
import sys

# Bounds grow with the build (sanitizers: KVMESH_TEST_TIME_SCALE, cmake/KvmeshHelpers.cmake).
SCALE = int(os.environ.get("KVMESH_TEST_TIME_SCALE", "1"))

kvmesh, trace = sys.argv[1], sys.argv[2]
out = subprocess.run([kvmesh, "replay", "--trace", trace, "--capacity-fractions", "0.01,0.1",
                      "--policy", "lru-priority,arc", "--json", "--threads", "2"],
                     check=True, capture_output=True, text=True, timeout=120 * SCALE).stdout
j = json.loads(out)
assert j["default_policy"] == "adaptive", j["default_policy"]
for key in ("layers", "heads", "head_dim", "block_tokens"):
    assert j["model"][key] > 0, j["model"]
assert 0 < j["infinite"]["flops_saved_fraction"] <= 1, j["infinite"]
assert len(j["results"]) == 2, j["results"]
for col in j["results"]:
    rows = {r["policy"]: r for r in col["policies"]}
    # lru (the gap's base) and the default are always run.
    assert set(rows) == {"lru", "lru-priority", "arc", "adaptive"}, rows.keys()
    assert [r["policy"] for r in col["policies"] if r["default"]] == ["adaptive"], col
    for name, r in rows.items():
        for key in ("prefix_hit_rate", "gap_closed", "flops_saved_fraction", "flops_gap_closed"):
            assert key in r, (name, key)
        assert 0 <= r["prefix_hit_rate"] <= col["belady"]["prefix_hit_rate"] + 1e-12, (name, r)
        assert 0 <= r["flops_saved_fraction"] <= j["infinite"]["flops_saved_fraction"] + 1e-12, (name, r)
    assert rows["lru"]["gap_closed"] == 0 and rows["lru"]["flops_gap_closed"] == 0, rows["lru"]
    b = col["belady"]
    want = (rows["adaptive"]["prefix_hit_rate"] - rows["lru"]["prefix_hit_rate"]) / (
        b["prefix_hit_rate"] - rows["lru"]["prefix_hit_rate"])
    assert abs(rows["adaptive"]["gap_closed"] - want) < 1e-9, (rows["adaptive"], want)
    assert rows["adaptive"]["following"], rows["adaptive"]
    ref = col["flops_reference_fraction"]
    assert ref == max(b["flops_saved_fraction"], col["belady_flops"]["flops_saved_fraction"]), col
    assert rows["adaptive"]["prefix_hit_rate"] >= rows["lru"]["prefix_hit_rate"], col
print("replay --json OK:", [(c["capacity_blocks"], {r["policy"]: round(r["prefix_hit_rate"], 4)
                                                   for r in c["policies"]}) for c in j["results"]])
