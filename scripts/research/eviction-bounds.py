#!/usr/bin/env python3
"""Offline bounds that say how much of the LRU-to-Belady gap a policy could
close on a trace, and with what knowledge (docs/eviction-experiments.md, "Round 4").

  popularity TRACE
      The static popularity oracle: keep the C blocks requested most often over
      the whole trace (a parent is requested at least as often as its child, so
      the set is prefix-closed); a block hits when it is in the set and was seen
      before. Under independent requests (no follow-ups) this is the best any
      policy can do in expectation (Aho-Denning-Ullman's A0), so it shows how
      much of the gap is reachable from popularity alone.

  class-ttl --train TRACE [--test TRACE]
      Gives each access a class from what the cache can see (partial last
      block, log2 of the lookups since the block's previous access, accesses so
      far, depth, request length) and, on the train trace, solves the relaxation
      "hold a block of class c for at most T_c lookups, with C blocks held on
      average": the hit-versus-space curve of each class, its concave hull, and
      the best T_c for the budget (hindsight: the gaps are known). The test
      trace is then replayed with those T_c and a real capacity of C (the block
      closest to its deadline leaves first). Train = test measures what
      per-class holding times could reach with hindsight; train != test what
      of it carries to traffic it was not fitted on.

  class-admission TRACE
      LRU (chains leave deepest block first) that declines the new blocks of
      every class (partial last block, depth, cached prefix, new blocks in the
      request, request length) whose new blocks are read again within 2C
      lookups less often than a threshold, known with hindsight; one row per
      threshold.

  first-reuse TRACE
      Of the new blocks (not a partial last block), the share whose first
      reuse comes less than 2^k lookups later.

  session-close TRACE
      What an explicit end-of-session signal is worth (a trace written by
      `gen-trace.py --sessions`: "session" ids and "closes" on a session's
      last request). LRU (chains leave deepest block first) beside the same
      LRU that, when a session closes (its last request's arrival plus
      --ms-per-output-token per output token, the time its answer is done),
      moves blocks to the eviction end, deepest first: those no open session
      has read ("session close"), or of those only the ones no other session
      ever read ("private blocks"), or the blocks the session itself brought
      into the cache (its misses) that no other session read or brought in
      while it was open ("computed blocks"), and of those only the ones no
      request had read before ("computed blocks read first": the rule of the
      vLLM connector, python/kvmesh/adapters/vllm.py, which sees hits, saves
      and what it has read). --idle-s T...: the same release when a
      session has had no request for T seconds after its latest answer (a
      later request reopens it), without "closes". Sessions are known to the
      cache only through these fields.

All but first-reuse print prefix hit rates and the share of the gap closed beside
`lru`, the default policy and Belady, from `kvmesh replay --json` on the same
trace, at 1/2/5/10% of the distinct blocks.
"""
import argparse
import bisect
import collections
import heapq
import json
import math
import os
import subprocess
import sys

FRACTIONS = "0.01,0.02,0.05,0.1"


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def replay(kvmesh, path):
    out = subprocess.run([kvmesh, "replay", "--trace", path, "--capacity-fractions", FRACTIONS,
                          "--policy", "lru", "--json"], check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    rows = []
    for r in j["results"]:
        pol = {p["policy"]: p for p in r["policies"]}
        rows.append({"fraction": r["capacity_fraction"], "C": r["capacity_blocks"],
                     "lru": pol["lru"]["prefix_hit_rate"],
                     "default": pol[j["default_policy"]]["prefix_hit_rate"],
                     "belady": r["belady"]["prefix_hit_rate"]})
    return j["default_policy"], rows


def report(name, label, default_name, rows, values):
    gaps, dgaps = [], []
    for row, v in zip(rows, values):
        lru, bel = row["lru"], row["belady"]
        g = lambda x: (x - lru) / (bel - lru) * 100 if bel > lru else 0.0
        gaps.append(g(v))
        dgaps.append(g(row["default"]))
        print(f"{name} {row['fraction']:.2f} C={row['C']}: lru {lru * 100:.2f}  {default_name} "
              f"{row['default'] * 100:.2f} ({g(row['default']):+.1f}%)  {label} {v * 100:.2f} ({g(v):+.1f}%)  "
              f"belady {bel * 100:.2f}", flush=True)
    print(f"{name}: mean gap closed, {label} {sum(gaps) / len(gaps):+.1f}%, {default_name} "
          f"{sum(dgaps) / len(dgaps):+.1f}%")


def popularity(args):
    trace = [r["hash_ids"] for r in load(args.trace)]
    count, depth = collections.Counter(), {}
    for ids in trace:
        for d, b in enumerate(ids):
            count[b] += 1
            depth.setdefault(b, d)
    order = sorted(count, key=lambda b: (-count[b], depth[b]))
    default_name, rows = replay(args.kvmesh, args.trace)
    lookups = sum(len(ids) for ids in trace)
    values = []
    for row in rows:
        keep, seen, hits = set(order[:row["C"]]), set(), 0
        for ids in trace:
            prefix = True
            for b in ids:
                prefix = prefix and b in keep and b in seen
                hits += prefix
                seen.add(b)
        values.append(hits / lookups)
    report(os.path.basename(args.trace), "popularity oracle", default_name, rows, values)


def classes(rows, block_tokens):
    """(block, class) per lookup, in order; the class uses only the past."""
    count, last, pos, out = collections.Counter(), {}, 0, []
    for r in rows:
        ids = r["hash_ids"]
        partial = r["input_length"] % block_tokens != 0
        for d, b in enumerate(ids):
            pos += 1
            gap = -1 if b not in last else int(math.log2(max(1, pos - last[b])))
            last[b] = pos
            count[b] += 1
            tail = int(partial and d == len(ids) - 1)
            out.append((b, (tail, gap, min(count[b], 4), min(d, 4), min(len(ids), 8))))
    return out


def class_hulls(acc):
    """Per class: the concave hull of (lookups x blocks held, hits) over holding times."""
    n, nxt, gaps = len(acc), {}, collections.defaultdict(list)
    for i in range(n - 1, -1, -1):
        b, c = acc[i]
        gaps[c].append(nxt[b] - i if b in nxt else -(n - i))  # negative: never again (held to the end)
        nxt[b] = i
    holds = sorted({int(1.15 ** k) for k in range(int(math.log(n) / math.log(1.15)) + 2)})
    hulls = {}
    for c, g in gaps.items():
        again = sorted(x for x in g if x > 0)
        never = sorted(-x for x in g if x < 0)
        sa, sn = [0], [0]
        for x in again:
            sa.append(sa[-1] + x)
        for x in never:
            sn.append(sn[-1] + x)
        hull = [(0, 0, 0)]
        for t in holds:
            k = bisect.bisect_right(again, t)
            m = bisect.bisect_right(never, t)
            p = (sa[k] + (len(again) - k) * t + sn[m] + (len(never) - m) * t, k, t)
            if p[0] <= hull[-1][0]:
                continue
            while len(hull) >= 2:
                (x1, y1, _), (x2, y2, _) = hull[-2], hull[-1]
                if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):
                    hull.pop()
                else:
                    break
            hull.append(p)
        hulls[c] = hull
    return hulls


def holding_times(hulls, budget):
    """Greedy on the hulls' slopes: the holding time of each class for `budget`
    lookups x blocks, and the hits the relaxation gets with it."""
    steps = []
    for c, hull in hulls.items():
        for (x1, y1, _), (x2, y2, t2) in zip(hull, hull[1:]):
            if y2 > y1:
                steps.append(((y2 - y1) / (x2 - x1), x2 - x1, y2 - y1, c, t2))
    steps.sort(key=lambda s: -s[0])
    ttl, hits = {}, 0.0
    for _, dx, dy, c, t2 in steps:
        if budget <= 0:
            break
        hits += dy * min(1.0, budget / dx)
        budget -= dx
        ttl[c] = t2
    return ttl, hits


def replay_ttl(acc, rows, capacity, ttl):
    deadline, heap, hits, t, k = {}, [], 0, 0, 0
    for r in rows:
        prefix = True
        for d, b in enumerate(r["hash_ids"]):
            c = acc[k][1]
            k += 1
            t += 1
            prefix = prefix and b in deadline
            hits += prefix
            deadline[b] = t + ttl.get(c, 0) - d * 1e-6  # a chain's deeper blocks leave first
            heapq.heappush(heap, (deadline[b], b))
            while len(deadline) > capacity:
                x, v = heapq.heappop(heap)
                if deadline.get(v) == x:
                    del deadline[v]
    return hits / len(acc)


def class_ttl(args):
    test = args.test or args.train
    train_rows = load(args.train)
    train_acc = classes(train_rows, args.block_tokens)
    hulls = class_hulls(train_acc)
    test_rows = train_rows if test == args.train else load(test)
    test_acc = train_acc if test == args.train else classes(test_rows, args.block_tokens)
    default_name, rows = replay(args.kvmesh, test)
    relaxed, values = [], []
    for row in rows:
        best = 0.0
        for scale in (0.5, 0.7, 1.0, 1.4, 2.0):  # the budget that replays best (hindsight too)
            ttl, _ = holding_times(hulls, scale * row["C"] * len(train_acc))
            best = max(best, replay_ttl(test_acc, test_rows, row["C"], ttl))
        values.append(best)
        relaxed.append(holding_times(hulls, row["C"] * len(train_acc))[1] / len(train_acc))
    name = os.path.basename(test) + ("" if test == args.train else f" (times from {os.path.basename(args.train)})")
    if test == args.train:
        report(name, "relaxation (block hits, average capacity)", default_name, rows, relaxed)
    report(name, "per-class holding times", default_name, rows, values)


def new_block_classes(rows, block_tokens):
    """Per lookup: the class of a block never seen before, else None."""
    seen, out = set(), []
    for r in rows:
        ids = r["hash_ids"]
        partial = r["input_length"] % block_tokens != 0
        cached = next((i for i, b in enumerate(ids) if b not in seen), len(ids))
        new = sum(1 for b in ids if b not in seen)
        for d, b in enumerate(ids):
            out.append(None if b in seen else
                       (int(partial and d == len(ids) - 1), min(d, 8), min(cached, 3), min(new.bit_length(), 6),
                        min(r["input_length"].bit_length(), 16)))
        seen.update(ids)
    return out


def next_use(rows):
    flat = [b for r in rows for b in r["hash_ids"]]
    nxt, out = {}, [0] * len(flat)
    for i in range(len(flat) - 1, -1, -1):
        out[i] = nxt.get(flat[i], math.inf) - i
        nxt[flat[i]] = i
    return out


def lru_declining(rows, classes_, capacity, declined):
    cache, hits, k = collections.OrderedDict(), 0, 0
    for r in rows:
        ids, prefix = r["hash_ids"], True
        for b in ids:
            if b in cache:
                hits += prefix
            else:
                prefix = False
                if classes_[k] not in declined:
                    cache[b] = True
            k += 1
        for b in reversed(ids):  # the request's first block most recent, its deepest oldest
            if b in cache:
                cache.move_to_end(b)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits / k


def class_admission(args):
    rows = load(args.trace)
    cls, nxt = new_block_classes(rows, args.block_tokens), next_use(rows)
    default_name, reps = replay(args.kvmesh, args.trace)
    for threshold in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25):
        values, shares = [], []
        for row in reps:
            stats = collections.defaultdict(lambda: [0, 0])
            for c, gap in zip(cls, nxt):
                if c is not None:
                    stats[c][0] += 1
                    stats[c][1] += gap <= 2 * row["C"]
            declined = {c for c, (n, again) in stats.items() if again < threshold * n}
            shares.append(sum(stats[c][0] for c in declined) / max(1, sum(n for n, _ in stats.values())))
            values.append(lru_declining(rows, cls, row["C"], declined))
        report(os.path.basename(args.trace), f"declining classes under {threshold:.0%} "
               f"(of new blocks {'/'.join(f'{x:.0%}' for x in shares)})", default_name, reps, values)


def first_reuse(args):
    rows = load(args.trace)
    first, pos, hist, new = {}, 0, collections.Counter(), 0
    for r in rows:
        ids = r["hash_ids"]
        partial = r["input_length"] % args.block_tokens != 0
        for d, b in enumerate(ids):
            if b not in first:
                first[b] = None if (partial and d == len(ids) - 1) else pos
                new += first[b] is not None
            elif first[b] is not None:
                hist[max(1, pos - first[b]).bit_length()] += 1  # distance < 2^k
                first[b] = None
            pos += 1
    total = 0
    print(f"{os.path.basename(args.trace)}: {new} new blocks; share first reused less than 2^k lookups later")
    for k in range(1, max(hist, default=1) + 1):
        total += hist[k]
        print(f"  2^{k}: {total / max(1, new):6.1%}")


def lru_sessions(rows, capacity, ms_per_token, close, timeout_ms=None):
    """Prefix hit rate of leaf-first LRU; with `close`, sessions' private
    blocks go to the eviction end when the session closes."""
    cache, hits, k = collections.OrderedDict(), 0, 0
    refs = collections.Counter()          # block -> open sessions that read it
    readers = collections.Counter()       # block -> sessions that ever read it
    seen = collections.defaultdict(set)   # session -> every block it ever read (across reopenings)
    blocks = collections.defaultdict(dict)  # session -> its blocks, in first-read order
    due = []                              # (close time ms, session)
    latest = {}                           # session -> the due time of its pending close
    owner = {}                            # "computed": block -> the open session that brought it in
    own = collections.defaultdict(list)   # "computed": session -> blocks it brought in, in order
    shared = set()                        # "computed": blocks another session read or brought in meanwhile
    ever = set()                          # blocks any request has read
    for r in rows:
        while close and due and due[0][0] <= r["timestamp"]:
            t, s = heapq.heappop(due)
            if latest.get(s) != t:
                continue                  # superseded by a later request of the session
            del latest[s]
            if close in ("computed", "computed-first"):
                for b in own.pop(s, ()):
                    if owner.get(b) == s:
                        del owner[b]
                        if b in shared:
                            shared.discard(b)
                        elif b in cache:
                            cache.move_to_end(b, last=False)
                blocks.pop(s, None)
                continue
            for b in blocks.pop(s):
                refs[b] -= 1
                if refs[b] == 0:
                    del refs[b]
                    if b in cache and (close != "private" or readers[b] == 1):
                        cache.move_to_end(b, last=False)  # deepest ends up first to leave
        ids, prefix, s = r["hash_ids"], True, r.get("session")
        for b in ids:
            o = owner.get(b)
            if b in cache:
                hits += prefix
                if o is not None and o != s:
                    shared.add(b)
            else:
                prefix = False
                cache[b] = True
                if close in ("computed", "computed-first") and s is not None:
                    if o is None and (close == "computed" or b not in ever):
                        owner[b] = s
                        own[s].append(b)
                    elif o is not None and o != s:
                        shared.add(b)
                elif o is not None:
                    shared.add(b)
            ever.add(b)
            if s is not None and b not in blocks[s]:
                blocks[s][b] = True
                refs[b] += 1
                if b not in seen[s]:
                    seen[s].add(b)
                    readers[b] += 1
            k += 1
        for b in reversed(ids):  # the request's first block most recent, its deepest oldest
            cache.move_to_end(b)
        while len(cache) > capacity:
            cache.popitem(last=False)
        if s is not None and (timeout_ms is not None or r.get("closes")):
            t = r["timestamp"] + r["output_length"] * ms_per_token + (timeout_ms or 0)
            latest[s] = t
            heapq.heappush(due, (t, s))
    return hits / k


def session_close(args):
    rows = load(args.trace)
    if not any("session" in r for r in rows):
        sys.exit(f"eviction-bounds: {args.trace} has no \"session\" fields (write it with gen-trace.py --sessions)")
    default_name, reps = replay(args.kvmesh, args.trace)
    name = os.path.basename(args.trace)
    report(name, "lru (this script)", default_name, reps,
           [lru_sessions(rows, row["C"], args.ms_per_output_token, False) for row in reps])
    report(name, "lru + session close", default_name, reps,
           [lru_sessions(rows, row["C"], args.ms_per_output_token, "all") for row in reps])
    report(name, "lru + session close, private blocks", default_name, reps,
           [lru_sessions(rows, row["C"], args.ms_per_output_token, "private") for row in reps])
    report(name, "lru + session close, computed blocks", default_name, reps,
           [lru_sessions(rows, row["C"], args.ms_per_output_token, "computed") for row in reps])
    report(name, "lru + session close, computed blocks read first", default_name, reps,
           [lru_sessions(rows, row["C"], args.ms_per_output_token, "computed-first") for row in reps])
    for tau in args.idle_s:
        report(name, f"lru + idle {tau:g} s closes, private blocks", default_name, reps,
               [lru_sessions(rows, row["C"], args.ms_per_output_token, "private", tau * 1000) for row in reps])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvmesh", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "kvmesh"))
    ap.add_argument("--block-tokens", type=int, default=512)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("popularity", help="the static popularity oracle (A0)")
    p.add_argument("trace")
    p = sub.add_parser("class-ttl", help="per-class holding times fitted with hindsight")
    p.add_argument("--train", required=True)
    p.add_argument("--test")
    p = sub.add_parser("class-admission", help="LRU declining whole classes of new blocks, with hindsight")
    p.add_argument("trace")
    p = sub.add_parser("first-reuse", help="how long new blocks wait for their first reuse")
    p.add_argument("trace")
    p = sub.add_parser("session-close", help="LRU told when sessions close (gen-trace.py --sessions)")
    p.add_argument("trace")
    p.add_argument("--ms-per-output-token", type=float, default=20.0)
    p.add_argument("--idle-s", type=float, nargs="*", default=[],
                   help="also close a session this long after its latest answer (no \"closes\" needed)")
    a = ap.parse_args()
    if a.cmd == "first-reuse":
        return first_reuse(a)
    if not os.access(a.kvmesh, os.X_OK):
        sys.exit(f"eviction-bounds: no kvmesh binary at {a.kvmesh} (build first, or pass --kvmesh)")
    {"popularity": popularity, "class-ttl": class_ttl, "class-admission": class_admission,
     "session-close": session_close}[a.cmd](a)


if __name__ == "__main__":
    main()
