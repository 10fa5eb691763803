#!/usr/bin/env python3
"""kvmesh decode --kv-codec: the ranks seal KV blocks encoded (fewer bytes than
the raw-KV run of the same workload, and than their own logical bytes), and
the run still generates every token. Usage: decode_codec.py KVMESH_BIN"""
import json
import os
import subprocess
import sys

# Bounds grow with the build (sanitizers: KVMESH_TEST_TIME_SCALE, cmake/KvmeshHelpers.cmake).
SCALE = int(os.environ.get("KVMESH_TEST_TIME_SCALE", "1"))

kvmesh = sys.argv[1]
# A small run (sanitizer builds run this several times slower): 2 layers, short replies.
args = [kvmesh, "decode", "--json", "--sweep", "", "--no-spec", "--conversations", "3", "--agents", "1",
        "--ranks", "2", "--layers", "2", "--reply-max", "10", "--temperature", "0"]
out = {}
for codec in ("int8", "int4"):
    p = subprocess.run(args + ["--kv-codec", codec], capture_output=True, text=True, timeout=170 * SCALE)
    if p.returncode != 0:
        sys.exit(f"kvmesh decode --kv-codec {codec} exited {p.returncode}: {p.stderr}")
    j = json.loads(p.stdout)
    c = j["kv_codec"]
    r = j["with_reuse"]
    print(f"{codec}: kv_bytes {c['kv_bytes']} raw {c['kv_bytes_raw_kv']} ratio {c['kv_bytes_ratio']:.3f}, "
          f"logical {r['kv_bytes_logical']}, same tokens as raw: {c['same_tokens_as_raw_kv']}")
    assert c["codec"] == codec, c
    assert r["generated_tokens"] > 0 and r["kv_bytes"]["device"] == c["kv_bytes"], (r, c)
    assert r["kv_bytes_logical"] > r["kv_bytes"]["device"], r
    out[codec] = c["kv_bytes_ratio"]
# fp32 KV: int8 stores about 0.29x, int4 about 0.16x (scales and headers included).
assert 0.2 < out["int8"] < 0.4, out
assert 0.08 < out["int4"] < out["int8"], out
# No codec: no kv_codec section, stored == logical.
p = subprocess.run(args, capture_output=True, text=True, timeout=170 * SCALE)
assert p.returncode == 0, p.stderr
j = json.loads(p.stdout)
assert "kv_codec" not in j
assert j["with_reuse"]["kv_bytes_logical"] == j["with_reuse"]["kv_bytes"]["device"]
print("ok")
