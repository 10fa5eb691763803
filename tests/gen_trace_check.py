#!/usr/bin/env python3
"""scripts/gen-trace.py and scripts/research/eviction-bounds.py session-close.

1. The held-out traces of tests/data/traces regenerate byte-identically (the
   commands of tests/data/traces/README.md).
2. --sessions adds "session" and "closes" and changes nothing else: the
   Mooncake fields of every request are those written without it, and
   "closes" marks the last request of its session only.
3. eviction-bounds.py session-close runs on such a trace, and LRU told of
   closed sessions keeps more prefix hits than LRU at every capacity.
4. `kvmesh replay --session-closes` on held-out RAG with sessions: the
   default policy, told of closes, closes at least a quarter of the gap
   between LRU (told nothing) and Belady, mean over 1/2/5/10%, and is at
   least LRU at every capacity (docs/eviction-experiments.md, "Round 5").

Usage: gen_trace_check.py --kvmesh BIN --source DIR
"""
import argparse
import collections
import filecmp
import json
import os
import re
import subprocess
import sys
import tempfile

def held_out(source):
    """name -> gen-trace.py arguments, from tests/data/traces/heldout-args.txt."""
    out = {}
    with open(os.path.join(source, "tests", "data", "traces", "heldout-args.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, *args = line.split()
                out[name + ".jsonl"] = args
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmesh", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    gen = os.path.join(a.source, "scripts", "gen-trace.py")
    bounds = os.path.join(a.source, "scripts", "research", "eviction-bounds.py")
    data = os.path.join(a.source, "tests", "data", "traces")
    HELD_OUT = held_out(a.source)
    assert len(HELD_OUT) == 4, HELD_OUT
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in HELD_OUT.items():
            out = os.path.join(tmp, name)
            subprocess.run([sys.executable, gen, *args, "-o", out], check=True, timeout=120)
            assert filecmp.cmp(out, os.path.join(data, name), shallow=False), f"{name} does not regenerate"
            print(f"ok: {name} regenerates byte-identically")

        annotated = os.path.join(tmp, "rag-s104-sessions.jsonl")
        subprocess.run([sys.executable, gen, *HELD_OUT["heldout-rag-s104.jsonl"], "--sessions", "-o", annotated],
                       check=True, timeout=120)
        with open(os.path.join(data, "heldout-rag-s104.jsonl")) as f:
            plain = [json.loads(line) for line in f]
        with open(annotated) as f:
            rows = [json.loads(line) for line in f]
        assert len(rows) == len(plain)
        last, closes = {}, collections.Counter()
        for i, (r, p) in enumerate(zip(rows, plain)):
            assert {k: v for k, v in r.items() if k not in ("session", "closes")} == p, f"request {i} differs"
            last[r["session"]] = i
            closes[r["session"]] += bool(r.get("closes"))
        for s, i in last.items():
            assert closes[s] <= 1, f"session {s} closes twice"
            assert closes[s] == 0 or rows[i].get("closes"), f"session {s} closes before its last request"
        assert sum(closes.values()) >= 0.95 * len(last), "most sessions should close within the trace"
        print(f"ok: --sessions: {len(last)} sessions, {sum(closes.values())} close; Mooncake fields unchanged")

        out = subprocess.run([sys.executable, bounds, "--kvmesh", a.kvmesh, "session-close", annotated],
                             check=True, capture_output=True, text=True, timeout=300).stdout
        print(out, end="")
        rates = collections.defaultdict(dict)
        for line in out.splitlines():
            m = re.match(r"\S+ (\d\.\d\d) C=\d+: .*  (lru \(this script\)|lru \+ session close, private blocks) "
                         r"([\d.]+) ", line)
            if m:
                rates[m.group(2)][m.group(1)] = float(m.group(3))
        base, told = rates["lru (this script)"], rates["lru + session close, private blocks"]
        assert len(base) == 4 and base.keys() == told.keys(), out
        for f in base:
            assert told[f] > base[f], f"at {f}: {told[f]} vs {base[f]}"
        print("ok: session closes keep more prefix hits than LRU at every capacity")

        out = subprocess.run([a.kvmesh, "replay", "--trace", annotated, "--capacity-fractions", "0.01,0.02,0.05,0.1",
                              "--session-closes", "--json"], check=True, capture_output=True, text=True,
                             timeout=600).stdout
        j = json.loads(out)
        assert j["session_closes"] is True
        gaps = []
        for col in j["results"]:
            default = next(p for p in col["policies"] if p["default"])
            plain = col["lru_without_session_closes"]["prefix_hit_rate"]
            assert default["prefix_hit_rate"] >= plain, (col["capacity_fraction"], default, plain)
            assert default["released"] > 0
            gaps.append(default["gap_closed"])
        mean = sum(gaps) / len(gaps)
        print(f"held-out RAG with session closes: the default closes {100 * mean:.1f}% of the gap (per capacity "
              + ", ".join(f"{100 * g:.1f}%" for g in gaps) + ")")
        assert mean >= 0.25, mean
        print("ok: told of session closes, the default closes at least a quarter of the gap on held-out RAG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
