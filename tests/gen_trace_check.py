#!/usr/bin/env python3
"""scripts/gen-trace.py and scripts/eviction-bounds.py session-close.

1. The held-out traces of tests/data/traces regenerate byte-identically (the
   commands of tests/data/traces/README.md).
2. --sessions adds "session" and "closes" and changes nothing else: the
   Mooncake fields of every request are those written without it, and
   "closes" marks the last request of its session only.
3. eviction-bounds.py session-close runs on such a trace, and LRU told of
   closed sessions keeps more prefix hits than LRU at every capacity (on
   held-out RAG it closes about half of the LRU-to-Belady gap:
   docs/eviction.md, "A fifth round").

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

HELD_OUT = {
    "heldout-mix-s101.jsonl": ["--mix", "chat=0.4,agent=0.3,rag=0.3", "--seed", "101", "--requests", "3000"],
    "heldout-chat-s102.jsonl": ["--kind", "chat", "--seed", "102", "--requests", "3000", "--chat-systems", "20",
                                "--think-s", "60"],
    "heldout-agent-s103.jsonl": ["--kind", "agent", "--seed", "103", "--requests", "2000", "--agent-apps", "10"],
    "heldout-rag-s104.jsonl": ["--kind", "rag", "--seed", "104", "--requests", "3000", "--rag-docs", "5000",
                               "--rag-zipf", "0.8"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvmesh", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    gen = os.path.join(a.source, "scripts", "gen-trace.py")
    bounds = os.path.join(a.source, "scripts", "eviction-bounds.py")
    data = os.path.join(a.source, "tests", "data", "traces")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
