#!/usr/bin/env bash
# Reproduces the eviction numbers of docs/guide.md and docs/eviction.md:
# `kvmesh replay --json` on the public Mooncake trace and on the held-out
# generated traces of tests/data/traces, the markdown tables (prefix hit rate
# with the share of the LRU-to-Belady gap closed, and prefill FLOPs saved),
# and the plots docs/img/replay_prefix_hit.png (public trace) and
# docs/img/replay_heldout_mix.png (hit rate and FLOPs saved vs capacity);
# then the held-out generated traces written again with session fields
# (gen-trace.py --sessions, the args of tests/data/traces/heldout-args.txt)
# and replayed with --session-closes (docs/eviction-experiments.md, "Round 5");
# then the same traces through the nodes of the built-in cluster, and of the
# same with one stripe per node (--through-cluster, docs/eviction.md "Through
# the nodes").
#   scripts/research/eviction-report.sh [build-dir]      (default: build; JSON in /tmp/kvmesh-eviction)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
KVMESH=$BUILD/bin/kvmesh
OUT=/tmp/kvmesh-eviction
TRACES=tests/data/traces
POLICIES=lru,lru-priority,arc,s3-fifo,lfu,score,turnover-priority,freq-class,freq-class-turnover,adaptive,adaptive-cost
mkdir -p "$OUT" docs/img

for t in conversation_trace heldout-chat-s102 heldout-agent-s103 heldout-rag-s104 heldout-mix-s101; do
  "$KVMESH" replay --trace "$TRACES/$t.jsonl" --capacity-fractions 0.01,0.02,0.05,0.1 \
      --policy "$POLICIES" --json > "$OUT/$t.json"
done
grep -v '^#' "$TRACES/heldout-args.txt" | while read -r t args; do
  [ -n "$t" ] || continue
  # shellcheck disable=SC2086  # args is a word list
  python3 scripts/gen-trace.py $args --sessions -o "$OUT/$t-sessions.jsonl"
  "$KVMESH" replay --trace "$OUT/$t-sessions.jsonl" --capacity-fractions 0.01,0.02,0.05,0.1 \
      --policy "$POLICIES" --session-closes --json > "$OUT/$t-sessions.json"
done
for t in conversation_trace heldout-chat-s102 heldout-agent-s103 heldout-rag-s104 heldout-mix-s101; do
  "$KVMESH" replay --trace "$TRACES/$t.jsonl" --capacity-fractions 0.01,0.02,0.05,0.1 \
      --policy lru,lru-priority,arc,s3-fifo,adaptive --through-cluster --json > "$OUT/$t-cluster.json"
done
"$KVMESH" replay --trace "$OUT/heldout-rag-s104-sessions.jsonl" --capacity-fractions 0.01,0.02,0.05,0.1 \
    --policy lru,lru-priority,arc,s3-fifo,adaptive --through-cluster --session-closes --json \
    > "$OUT/heldout-rag-s104-sessions-cluster.json"
# The built-in cluster with one stripe per node (4 x 1): the nodes' leader alone.
python3 -c 'import json, sys; c = json.load(open("cluster_configs/local.json")); c["store"]["stripes"] = 1; json.dump(c, open(sys.argv[1], "w"))' \
    "$OUT/local-4x1.json"
for t in conversation_trace heldout-chat-s102 heldout-agent-s103 heldout-rag-s104 heldout-mix-s101; do
  "$KVMESH" replay --trace "$TRACES/$t.jsonl" --capacity-fractions 0.01,0.02,0.05,0.1 --policy lru,adaptive \
      --through-cluster --config "$OUT/local-4x1.json" --json > "$OUT/$t-cluster-4x1.json"
done
"$KVMESH" replay --trace "$TRACES/conversation_trace.jsonl" --capacity-fractions 0.0025,0.005,0.01,0.02,0.05,0.1,0.2 \
    --policy lru,lru-priority,arc,s3-fifo,adaptive --plot docs/img/replay_prefix_hit.png > /dev/null
"$KVMESH" replay --trace "$TRACES/heldout-mix-s101.jsonl" --capacity-fractions 0.0025,0.005,0.01,0.02,0.05,0.1,0.2 \
    --policy lru,lru-priority,arc,s3-fifo,adaptive --plot docs/img/replay_heldout_mix.png > /dev/null

python3 - "$OUT" <<'EOF'
import json, sys, os
out = sys.argv[1]
names = [("conversation_trace", "public Mooncake conversation trace"),
         ("heldout-chat-s102", "held out: chat, seed 102"),
         ("heldout-agent-s103", "held out: agent loops, seed 103"),
         ("heldout-rag-s104", "held out: RAG, seed 104"),
         ("heldout-mix-s101", "held out: mix chat/agent/rag, seed 101")]
show = ["lru", "lru-priority", "arc", "s3-fifo", "adaptive"]
print("## Prefix hit rate % (share of the LRU-to-Belady gap closed)\n")
for key, title in names:
    j = json.load(open(os.path.join(out, key + ".json")))
    cols = j["results"]
    print(f"**{title}** ({j['requests']} requests, {j['lookups']} lookups, {j['distinct_blocks']} distinct blocks)\n")
    print("| policy | " + " | ".join(f"{100*c['capacity_fraction']:g}%" for c in cols) + " | mean gap |")
    print("|---|" + "---|" * (len(cols) + 1))
    allp = [r["policy"] for r in cols[0]["policies"]]
    for p in show:
        rows = [next(r for r in c["policies"] if r["policy"] == p) for c in cols]
        cells = [f"{100*r['prefix_hit_rate']:.2f}" + ("" if p == "lru" else f" ({100*r['gap_closed']:+.0f}%)") for r in rows]
        mean = sum(r["gap_closed"] for r in rows) / len(rows)
        label = f"**{p}** (default)" if rows[0]["default"] else f"`{p}`"
        print(f"| {label} | " + " | ".join(cells) + f" | {'' if p == 'lru' else f'{100*mean:+.1f}%'} |")
    best = []
    for c in cols:
        others = [r for r in c["policies"] if not r["policy"].startswith("adaptive")]
        b = max(others, key=lambda r: r["prefix_hit_rate"])
        best.append(f"{100*b['prefix_hit_rate']:.2f} `{b['policy']}`")
    print("| best other | " + " | ".join(best) + " | |")
    print("| Belady | " + " | ".join(f"{100*c['belady']['prefix_hit_rate']:.2f}" for c in cols) + " | |")
    print()
print("## Prefill FLOPs saved % (model of the built-in config)\n")
print("| trace | policy | " + " | ".join(f"{100*c['capacity_fraction']:g}%" for c in cols) + " |")
print("|---|---|" + "---|" * len(cols))
for key, title in names:
    j = json.load(open(os.path.join(out, key + ".json")))
    cols = j["results"]
    for p in ["lru", "adaptive", "adaptive-cost"]:
        rows = [next(r for r in c["policies"] if r["policy"] == p) for c in cols]
        print(f"| {key} | `{p}` | " + " | ".join(f"{100*r['flops_saved_fraction']:.2f}" for r in rows) + " |")
    print(f"| {key} | Belady | " + " | ".join(f"{100*c['belady']['flops_saved_fraction']:.2f}" for c in cols) + " |")
    print(f"| {key} | belady-flops | " + " | ".join(f"{100*c['belady_flops']['flops_saved_fraction']:.2f}" for c in cols) + " |")
print()
print("## Leader at the end, and replay seconds per policy (adaptive vs lru)\n")
for key, title in names:
    j = json.load(open(os.path.join(out, key + ".json")))
    parts = []
    for c in j["results"]:
        a = next(r for r in c["policies"] if r["policy"] == "adaptive")
        l = next(r for r in c["policies"] if r["policy"] == "lru")
        parts.append(f"{100*c['capacity_fraction']:g}%: {a.get('following','')} ({a['seconds']/max(l['seconds'],1e-9):.1f}x lru time)")
    print(f"- {key}: " + "; ".join(parts))
print()
print("## Held-out traces with session closes (client hint; gap from LRU told nothing)\n")
print("| trace | " + " | ".join(f"{100*c['capacity_fraction']:g}%" for c in cols) + " | mean gap | worst vs best other |")
print("|---|" + "---|" * (len(cols) + 2))
for key, title in names[1:]:
    j = json.load(open(os.path.join(out, key + "-sessions.json")))
    cells, gaps, worst = [], [], 1.0
    for c in j["results"]:
        a = next(r for r in c["policies"] if r["default"])
        others = [r for r in c["policies"] if not r["policy"].startswith("adaptive")]
        b = max(others, key=lambda r: r["prefix_hit_rate"])
        worst = min(worst, a["prefix_hit_rate"] - b["prefix_hit_rate"])
        gaps.append(a["gap_closed"])
        cells.append(f"{100*a['prefix_hit_rate']:.2f} ({100*a['gap_closed']:+.0f}%)")
    print(f"| {key} | " + " | ".join(cells) + f" | {100*sum(gaps)/len(gaps):+.1f}% | {100*worst:+.2f} points |")
print()
print("| trace | policy | " + " | ".join(f"{100*c['capacity_fraction']:g}%" for c in cols) + " |")
print("|---|---|" + "---|" * len(cols))
for key, title in names[1:]:
    j = json.load(open(os.path.join(out, key + "-sessions.json")))
    print(f"| {key} | `lru`, told nothing | " + " | ".join(f"{100*c['lru_without_session_closes']['prefix_hit_rate']:.2f}" for c in j["results"]) + " |")
    for p in ["lru", "adaptive"]:
        rows = [next(r for r in c["policies"] if r["policy"] == p) for c in j["results"]]
        print(f"| {key} | `{p}`, told of closes | " + " | ".join(f"{100*r['prefix_hit_rate']:.2f}" for r in rows) + " |")
    print(f"| {key} | Belady | " + " | ".join(f"{100*c['belady']['prefix_hit_rate']:.2f}" for c in j["results"]) + " |")
print()
print("Through the nodes (--through-cluster, no derived hints in either run; gap from each one's own lru):")
print()
print("| trace | `lru` replay | `lru` nodes | `adaptive` replay | `adaptive` nodes | mean gap, replay / nodes |")
print("|---|---|---|---|---|---|")
for key in [k for k, _ in names] + ["heldout-rag-s104-sessions"]:
    j = json.load(open(os.path.join(out, key + "-cluster.json")))
    def hits(p, nodes):
        rows = [next(r for r in c["policies"] if r["policy"] == p) for c in j["results"]]
        return " / ".join(f"{100*(r['cluster'] if nodes else r)['prefix_hit_rate']:.2f}" for r in rows)
    def gap(nodes):
        rows = [next(r for r in c["policies"] if r["default"]) for c in j["results"]]
        return sum((r["cluster"] if nodes else r)["gap_closed"] for r in rows) / len(rows)
    print(f"| {key} | {hits('lru', False)} | {hits('lru', True)} | {hits('adaptive', False)} | {hits('adaptive', True)} | "
          f"{100*gap(False):+.1f}% / {100*gap(True):+.1f}% |")
print()
print("Through the nodes, 4 x 1 (one stripe per node) and 4 x 8 (built in): `lru`, `adaptive`, and the expert the nodes follow at the end:")
print()
print("| cluster, trace | `lru` | `adaptive` | following |")
print("|---|---|---|---|")
for suffix, label in [("-cluster-4x1", "4 x 1"), ("-cluster", "4 x 8")]:
    for key, _ in names:
        j = json.load(open(os.path.join(out, key + suffix + ".json")))
        def row(p):
            return [next(r for r in c["policies"] if r["policy"] == p)["cluster"] for c in j["results"]]
        print(f"| {label}, {key} | " + " / ".join(f"{100*r['prefix_hit_rate']:.2f}" for r in row("lru")) + " | "
              + " / ".join(f"{100*r['prefix_hit_rate']:.2f}" for r in row("adaptive")) + " | "
              + " / ".join(r.get("following", "") for r in row("adaptive")) + " |")
EOF
