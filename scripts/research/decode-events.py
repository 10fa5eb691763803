#!/usr/bin/env python3
"""Turns `kvmesh decode --events FILE` JSON lines into TTFT and TPOT per run.

Each line is one object with `event` (admit | first_token | token | finish),
`request_id`, `token_idx`, `timestamp` (Unix seconds) and `run` (reuse,
no-reuse). TTFT = first_token - admit; TPOT = (finish - first_token) /
(tokens - 1). Prints medians and p99 per run.

    build/bin/kvmesh decode --events /tmp/decode.jsonl --sweep ''
    scripts/research/decode-events.py /tmp/decode.jsonl
"""
import json
import sys
from collections import defaultdict


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else float("nan")


def main(path):
    req = defaultdict(dict)  # (run, request_id) -> {event: timestamp, "last": token_idx}
    for line in open(path):
        e = json.loads(line)
        r = req[(e["run"], e["request_id"])]
        if e["event"] in ("admit", "first_token", "finish"):
            r[e["event"]] = e["timestamp"]
        r["last"] = max(r.get("last", 0), e["token_idx"])
    runs = defaultdict(lambda: ([], []))
    for (run, _), r in req.items():
        if "admit" in r and "first_token" in r:
            runs[run][0].append(r["first_token"] - r["admit"])
        if "finish" in r and "first_token" in r and r["last"] > 0:
            runs[run][1].append((r["finish"] - r["first_token"]) / r["last"])
    print(f"{'run':12} {'requests':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'TPOT p50 ms':>12} {'TPOT p99 ms':>12}")
    for run, (ttft, tpot) in sorted(runs.items()):
        print(f"{run:12} {len(ttft):8d} {1e3 * pct(ttft, .5):12.2f} {1e3 * pct(ttft, .99):12.2f} "
              f"{1e3 * pct(tpot, .5):12.3f} {1e3 * pct(tpot, .99):12.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
