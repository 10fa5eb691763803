#!/usr/bin/env python3
"""Seeded generator of Mooncake-format serving traces (for `kvmesh replay`).

Writes one JSON object per line, in arrival order, with exactly the Mooncake
fields: {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [...]}. hash_ids are chained over --block-tokens-token blocks: a
block's id names its whole prefix, a partial last block gets its own id (the
next turn appends to it, so it is a different block then), ids are numbered
densely in order of first appearance. Same seed and options -> same bytes.

Kinds of sessions (--kind, or --mix for a blend):
  chat   multi-turn conversations under a few shared system prompts (Zipf
         popularity); each turn's prompt is the history plus a new user
         message; replies (output_length) join the history; users think
         seconds to minutes between turns; some first messages paste a document.
  agent  tool-using agent loops: an app prompt with tool definitions shared by
         every task of the app, a task, then steps of (model tool call, tool
         output); tool outputs are large and varied; steps come seconds apart;
         long histories are compacted into a summary (a new chain, so the old
         blocks die); some tasks fork parallel sub-agents off the same prefix.
  rag    retrieval-augmented questions: a system prompt, then k retrieved
         documents from a Zipf-popular corpus in relevance order, then the
         question; some sessions ask follow-ups.

Sessions start as a Poisson process (--rate per second) until --requests
requests have been written.

--sessions adds two fields that Mooncake traces do not have: "session" (an
id per session; a forked sub-agent is a session of its own) and, on a
session's last request, "closes": true, what a client that closes its
sessions explicitly (SGLang's close_session) would tell the cache. The other
fields stay byte-identical to the trace written without it.

  scripts/gen-trace.py --kind chat --seed 1 --requests 4000 > chat-1.jsonl
  scripts/gen-trace.py --mix chat=0.4,agent=0.4,rag=0.2 --seed 7 --requests 3000 -o mix.jsonl
"""
import argparse
import heapq
import json
import math
import random
import sys


class Hasher:
    """Chained block ids: (parent id, content pieces) -> dense id."""

    def __init__(self):
        self.ids = {}

    def block(self, parent, pieces):
        key = (parent, pieces)
        bid = self.ids.get(key)
        if bid is None:
            bid = len(self.ids)
            self.ids[key] = bid
        return bid


class Prompt:
    """A token sequence as segments (segment id, length); hashes its blocks
    incrementally (full blocks are kept across turns: a prompt only grows)."""

    def __init__(self, hasher, bt, segments=None, full=None):
        self.h = hasher
        self.bt = bt
        self.segs = list(segments or [])  # [(seg_id, length)]
        self.length = sum(n for _, n in self.segs)
        self.full = list(full or [])      # ids of the full blocks hashed so far

    def copy(self):
        return Prompt(self.h, self.bt, self.segs, self.full)

    def append(self, seg_id, n):
        if n > 0:
            self.segs.append((seg_id, n))
            self.length += n

    def _pieces(self, start, end):
        out, pos = [], 0
        for sid, n in self.segs:
            s, e = max(start, pos), min(end, pos + n)
            if s < e:
                out.append((sid, s - pos, e - pos))
            pos += n
            if pos >= end:
                break
        return tuple(out)

    def hash_ids(self):
        nfull = self.length // self.bt
        while len(self.full) < nfull:
            i = len(self.full)
            parent = self.full[-1] if self.full else -1
            self.full.append(self.h.block(parent, self._pieces(i * self.bt, (i + 1) * self.bt)))
        ids = list(self.full)
        if self.length % self.bt:
            parent = ids[-1] if ids else -1
            ids.append(self.h.block(parent, self._pieces(nfull * self.bt, self.length)))
        return ids


class Gen:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.h = Hasher()
        self.next_seg = 0
        r = self.rng
        # Shared content, drawn once per trace.
        self.chat_systems = [self.seg() for _ in range(a.chat_systems)]
        self.chat_system_len = [r.randint(200, 2500) for _ in range(a.chat_systems)]
        self.apps = [(self.seg(), r.randint(1500, 7000)) for _ in range(a.agent_apps)]
        self.rag_systems = [(self.seg(), r.randint(150, 900)) for _ in range(2)]
        self.docs = [(self.seg(), int(min(6000, r.lognormvariate(math.log(900), 0.7))))
                     for _ in range(a.rag_docs)]
        self.doc_weights = [1.0 / (i + 1) ** a.rag_zipf for i in range(a.rag_docs)]
        self.sys_weights = [1.0 / (i + 1) ** 1.1 for i in range(a.chat_systems)]
        self.app_weights = [1.0 / (i + 1) ** 0.8 for i in range(a.agent_apps)]

    def seg(self):
        self.next_seg += 1
        return self.next_seg

    def logn(self, median, sigma, lo, hi):
        return int(max(lo, min(hi, self.rng.lognormvariate(math.log(median), sigma))))

    def gen_time(self, out_tokens):
        return out_tokens * self.a.ms_per_output_token / 1000.0

    # Each session is a generator of (prompt, output_length, delay_before_s);
    # a None prompt forks: the value is a list of sub-session generators.
    def chat(self):
        r, a = self.rng, self.a
        si = r.choices(range(a.chat_systems), self.sys_weights)[0]
        p = Prompt(self.h, a.block_tokens)
        p.append(self.chat_systems[si], self.chat_system_len[si])
        turns = min(a.max_turns, 1 + int(r.expovariate(1.0 / a.chat_turns_mean)))
        delay = 0.0
        for t in range(turns):
            user = self.logn(120, 1.0, 5, 4000)
            if t == 0 and r.random() < 0.25:
                user += self.logn(2500, 0.8, 300, 20000)  # a pasted document
            p.append(self.seg(), user)
            out = self.logn(300, 0.8, 5, 3000)
            yield p, out, delay
            p.append(self.seg(), out)
            delay = self.gen_time(out) + self.logn(a.think_s, 1.0, 2, 1800)

    def agent(self, prompt=None, depth=0):
        r, a = self.rng, self.a
        if prompt is None:
            ai = r.choices(range(a.agent_apps), self.app_weights)[0]
            prompt = Prompt(self.h, a.block_tokens)
            prompt.append(*self.apps[ai])
            prompt.append(self.seg(), self.logn(300, 0.9, 20, 5000))  # the task
        p = prompt
        steps = max(2, int(r.lognormvariate(math.log(a.agent_steps), 0.6)))
        delay = 0.0
        for s in range(steps):
            out = self.logn(120, 0.8, 10, 2000)  # the tool call the model writes
            yield p, out, delay
            p.append(self.seg(), out)
            if depth == 0 and s >= 2 and r.random() < 0.06:  # fork sub-agents off this prefix
                subs = [self.agent(p.copy(), depth + 1) for _ in range(r.randint(2, 4))]
                yield None, subs, 0.0
            p.append(self.seg(), self.logn(700, 1.2, 10, 16000))  # the tool's output
            delay = self.gen_time(out) + self.logn(2.0, 1.0, 0.1, 120)
            if p.length > a.agent_context:  # compaction: app prompt + a summary
                q = Prompt(self.h, a.block_tokens)
                q.append(*p.segs[0])
                q.append(self.seg(), self.logn(1500, 0.5, 300, 6000))
                p = q

    def rag(self):
        r, a = self.rng, self.a
        sys_seg = self.rag_systems[0 if r.random() < 0.7 else 1]
        p = Prompt(self.h, a.block_tokens)
        p.append(*sys_seg)
        k = r.randint(1, a.rag_k)
        docs = []
        while len(docs) < k:
            d = r.choices(range(a.rag_docs), self.doc_weights)[0]
            if d not in docs:
                docs.append(d)
        for d in docs:
            p.append(*self.docs[d])
        delay = 0.0
        turns = 1 + (r.random() < a.rag_followup) * r.randint(1, 3)
        for _ in range(turns):
            p.append(self.seg(), self.logn(40, 0.7, 5, 600))
            out = self.logn(200, 0.7, 10, 2000)
            yield p, out, delay
            p.append(self.seg(), out)
            delay = self.gen_time(out) + self.logn(a.think_s / 2, 1.0, 2, 900)

    def run(self, out):
        a, r = self.a, self.rng
        kinds = list(a.mix.keys())
        weights = [a.mix[k] for k in kinds]
        # (time s, tiebreak, session, its next request or None). A session's
        # generator is resumed only after its pending request was written, so
        # the prompt it yielded is not changed in between.
        heap = []
        order = 0
        t_next_session = 0.0
        written = 0
        sid = {}     # session generator -> its number (--sessions); numbers are never reused
        nsid = 0
        lines = []   # with --sessions: records held until their session's end is known
        last = {}    # session number -> index in lines of its latest request

        def push(t, sess, pending=None):
            nonlocal order, nsid
            if sess not in sid:
                sid[sess] = nsid
                nsid += 1
            heapq.heappush(heap, (t, order, sess, pending))
            order += 1

        while written < a.requests:
            if not heap or t_next_session <= heap[0][0]:
                push(t_next_session, getattr(self, r.choices(kinds, weights)[0])())
                t_next_session += r.expovariate(a.rate)
                continue
            t, _, sess, pending = heapq.heappop(heap)
            if pending is not None:
                rec = self._record(t, *pending)
                if a.sessions:
                    rec["session"] = sid[sess]
                    last[rec["session"]] = len(lines)
                    lines.append(rec)
                else:
                    self._write(out, rec)
                written += 1
                push(t, sess)
                continue
            item = next(sess, None)
            if item is None:
                if a.sessions and sid[sess] in last:
                    lines[last[sid[sess]]]["closes"] = True
                del sid[sess]
                continue
            p, val, delay = item
            if p is None:  # a fork: the sub-sessions start now
                for sub in val:
                    push(t, sub)
                push(t, sess)
                continue
            push(t + delay, sess, (p, val))
        for rec in lines:
            self._write(out, rec)

    def _record(self, t, p, output_length):
        return {"timestamp": int(t * 1000), "input_length": p.length,
                "output_length": output_length, "hash_ids": p.hash_ids()}

    def _write(self, out, rec):
        out.write(json.dumps(rec, separators=(", ", ": ")) + "\n")


def parse_mix(s):
    mix = {}
    for item in s.split(","):
        k, _, w = item.partition("=")
        if k not in ("chat", "agent", "rag"):
            raise SystemExit(f"--mix: unknown kind '{k}' (chat, agent, rag)")
        mix[k] = float(w) if w else 1.0
    return mix


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["chat", "agent", "rag"], help="one kind of session")
    ap.add_argument("--mix", help="a blend, e.g. chat=0.5,agent=0.3,rag=0.2")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=3000, help="requests to write")
    ap.add_argument("--rate", type=float, default=1.0, help="new sessions per second")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--ms-per-output-token", type=float, default=20.0)
    ap.add_argument("--think-s", type=float, default=40.0, help="median user think time")
    ap.add_argument("--chat-systems", type=int, default=12)
    ap.add_argument("--chat-turns-mean", type=float, default=4.0)
    ap.add_argument("--max-turns", type=int, default=40)
    ap.add_argument("--agent-apps", type=int, default=6)
    ap.add_argument("--agent-steps", type=float, default=10.0, help="median steps of a task")
    ap.add_argument("--agent-context", type=int, default=48000, help="tokens before compaction")
    ap.add_argument("--rag-docs", type=int, default=3000)
    ap.add_argument("--rag-zipf", type=float, default=0.9)
    ap.add_argument("--rag-k", type=int, default=4)
    ap.add_argument("--rag-followup", type=float, default=0.3,
                    help="share of RAG sessions that ask 1-3 follow-up questions")
    ap.add_argument("--sessions", action="store_true",
                    help='add "session" and, on a session\'s last request, "closes": true')
    ap.add_argument("-o", "--output", help="file (default: stdout)")
    a = ap.parse_args()
    if bool(a.kind) == bool(a.mix):
        ap.error("give exactly one of --kind and --mix")
    a.mix = {a.kind: 1.0} if a.kind else parse_mix(a.mix)
    out = open(a.output, "w") if a.output else sys.stdout
    Gen(a).run(out)
    if a.output:
        out.close()


if __name__ == "__main__":
    main()
