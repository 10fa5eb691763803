// The soak's client threads: prefix-cache prefill and live sequences (see
// soak_workload.h for what each checks).
#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "soak_cluster.h"
#include "soak_workload.h"

namespace kvmesh::soak {

namespace {

constexpr uint32_t kConversations = 3000;  // far more blocks than the cluster holds
constexpr uint32_t kSystemPrompts = 8;
constexpr uint32_t kSeqPrompts = 16;

TokenId Tok(uint64_t seed, uint64_t stream, uint64_t i) {
  return static_cast<TokenId>(Mix(seed ^ (stream << 32) ^ i) % 50000);
}

// Conversation c: system prompt c % 8 (2 blocks) then its own turns (0..9
// blocks), then half a block the cache never holds.
std::vector<TokenId> Conversation(uint64_t seed, uint32_t c, uint32_t bt) {
  const uint32_t sys = c % kSystemPrompts;
  const uint32_t own = static_cast<uint32_t>(Mix(seed ^ c) % 10);
  std::vector<TokenId> t;
  for (uint32_t i = 0; i < 2 * bt; ++i) t.push_back(Tok(seed, 1 + sys, i));
  for (uint32_t i = 0; i < own * bt + bt / 2; ++i) t.push_back(Tok(seed, 1000 + c, i));
  return t;
}

// [layer][n][heads][head_dim] K or V of tokens at positions pos0...
void SeqKv(uint64_t seed, const ModelSpec& m, std::span<const TokenId> toks, uint32_t pos0, uint32_t kv,
           std::vector<std::byte>* out) {
  const size_t n = toks.size(), row = size_t{m.head_dim} * DTypeSize(m.dtype);
  out->resize(BlockLayout::Full(m).side_bytes(n));
  for (uint32_t l = 0; l < m.num_layers; ++l)
    for (size_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < m.num_kv_heads; ++h)
        SeqRow(seed, toks[i], pos0 + static_cast<uint32_t>(i), l, h, kv,
               std::span(*out).subspan(((l * n + i) * m.num_kv_heads + h) * row, row));
}

bool IsPrefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {  // a is a prefix of b
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

// ---- prefix workload ---------------------------------------------------------

void PrefixWorker(Context& c, Router& r, uint32_t thread) {
  std::mt19937_64 rng(c.o.seed * 7919 + thread);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const uint32_t bt = r.block_tokens();
  const size_t bb = r.model().FullBlockBytes();
  std::vector<std::byte> buf, expect(bb);
  std::vector<std::vector<std::byte>> blocks;
  // Even workers read into and put from memory of Router::AllocateMemory (the
  // zero-copy GET_INTO / PUT_FROM path over UCX, with its deadline fence under
  // stalls); odd ones use heap memory. A conversation has at most 11 full blocks.
  constexpr size_t kMaxBlocks = 16;
  std::byte* reg = nullptr;
  uint64_t reg_id = 0;
  if (thread % 2 == 0) {
    auto a = r.AllocateMemory(2 * kMaxBlocks * bb);
    if (a.ok()) {
      reg = a->base;
      reg_id = a->id;
    } else {
      c.inv.Violation("error_class", "AllocateMemory: " + a.status().ToString());
    }
  }
  while (!c.stop.load()) {
    const double u = uni(rng);
    const auto conv = static_cast<uint32_t>(kConversations * u * u * u);  // skewed reuse
    const std::vector<TokenId> toks = Conversation(c.o.seed, conv, bt);
    const std::vector<BlockKey> keys = r.Keys(toks);
    RequestOptions ro;
    ro.priority = conv < 100 ? 2 : 1;

    auto t0 = SteadyClock::now();
    Result<size_t> m = r.MatchPrefix(toks, ro);
    size_t matched = 0;
    if (c.Count(kMatch, m.status(), t0)) matched = *m;
    c.st.prompt_blocks += keys.size();
    c.st.matched_blocks += matched;

    // Read the matched blocks back; every hit must be exactly Payload(key).
    size_t first_missing = matched;
    if (matched > 0) {
      std::span<std::byte> dst;
      if (reg != nullptr && matched <= kMaxBlocks) {
        dst = std::span(reg, matched * bb);
        std::memset(dst.data(), 0, dst.size());
      } else {
        buf.assign(matched * bb, std::byte{0});
        dst = buf;
      }
      std::vector<GetItem> items;
      for (size_t i = 0; i < matched; ++i) items.push_back(GetItem{keys[i], dst.subspan(i * bb, bb), 0, {}});
      t0 = SteadyClock::now();
      Status s = r.GetBatch(items, ro);
      c.Count(kGetBatch, s, t0);
      for (size_t i = 0; i < matched; ++i) {
        const GetItem& it = items[i];
        if (it.status.ok()) {
          Payload(it.key, c.o.seed, expect);
          if (it.size != bb || std::memcmp(it.dst.data(), expect.data(), bb) != 0) {
            c.st.wrong_bytes++;
            c.inv.Violation("wrong_bytes", "GetBatch returned wrong bytes for key " + it.key.ToHex() +
                                               " (size " + std::to_string(it.size) + ")");
          } else {
            c.st.blocks_verified++;
            c.st.bytes_verified += bb;
            c.st.read_hits++;
          }
        } else {
          first_missing = std::min(first_missing, i);
          if (IsMiss(it.status)) {
            c.st.read_gone++;
          } else if (it.status.code() != StatusCode::kBusy && !c.StaleRefusal(it.status)) {
            c.inv.Violation("error_class", "GetBatch item: " + it.status.ToString());
          }
        }
      }
    }
    // "Compute" the missing blocks and store them.
    if (first_missing < keys.size()) {
      blocks.resize(keys.size() - first_missing);
      std::vector<std::span<const std::byte>> spans;
      const bool registered = reg != nullptr && keys.size() - first_missing <= kMaxBlocks;
      for (size_t i = first_missing; i < keys.size(); ++i) {
        std::span<std::byte> b;
        if (registered) {
          b = std::span(reg + (kMaxBlocks + i - first_missing) * bb, bb);
        } else {
          blocks[i - first_missing].resize(bb);
          b = blocks[i - first_missing];
        }
        Payload(keys[i], c.o.seed, b);
        spans.emplace_back(b);
      }
      t0 = SteadyClock::now();
      Status s = r.Put(toks, spans, ro, first_missing);
      c.Count(kPut, s, t0, {StatusCode::kBusy, StatusCode::kResourceExhausted, StatusCode::kStaleEpoch});
      c.st.blocks_put += spans.size();
    }
    // Keys nobody ever stored never hit.
    if ((rng() & 15) == 0) {
      std::vector<std::byte> junk(4 * bb);
      std::vector<GetItem> items;
      for (int i = 0; i < 4; ++i) items.push_back(GetItem{BlockKey{rng(), rng()}, std::span(junk).subspan(i * bb, bb), 0, {}});
      t0 = SteadyClock::now();
      Status s = r.GetBatch(items);
      c.Count(kGetUnknown, s, t0);
      for (const GetItem& it : items) {
        if (it.status.ok()) {
          c.st.wrong_bytes++;
          c.inv.Violation("wrong_bytes", "a key never stored was returned: " + it.key.ToHex());
        } else if (!IsMiss(it.status) && it.status.code() != StatusCode::kBusy && !c.StaleRefusal(it.status)) {
          c.inv.Violation("error_class", "GetBatch of an unknown key: " + it.status.ToString());
        }
      }
    }
  }
  if (reg != nullptr) (void)r.UnregisterMemory(reg_id);
}

// ---- live sequences ------------------------------------------------------------

namespace {

struct LiveSeq {
  SequenceHandle h;
  int node = -1;
  uint64_t gen = 0;               // the node's generation when it was created
  std::vector<TokenId> toks;      // its content as far as this client knows
  bool uncertain = false;         // a mutation failed: the node holds lo..hi
  std::vector<TokenId> lo, hi;    // lo is a prefix of hi
  SteadyClock::time_point touched;
};

struct DeadSeq {
  SequenceHandle h;
  int node = -1;
  uint64_t gen = 0;  // the node's generation when the handle was retired
  SteadyClock::time_point next;
  int probes = 0;
};

class SeqClient {
 public:
  SeqClient(Context& c, Router& r, uint32_t thread)
      : c_(c), r_(r), rng_(c.o.seed * 104729 + thread), m_(r.model()), bt_(r.block_tokens()) {}

  void Run() {
    while (!c_.stop.load()) {
      RetireKilled();
      ProbeDead();
      if (live_.size() < 3 || (live_.size() < 5 && rng_() % 8 == 0)) {
        Create();
        continue;
      }
      LiveSeq& s = live_[rng_() % live_.size()];
      if (s.uncertain && !Resync(s)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its node is away: no busy loop
        continue;
      }
      const uint32_t pick = static_cast<uint32_t>(rng_() % 100);
      if (pick < 35) Append(s, 1 + static_cast<uint32_t>(rng_() % 8));
      else if (pick < 45) Truncate(s);
      else if (pick < 70) Read(s);
      else if (pick < 80) Info(s);
      else if (pick < 88) Fork(s);
      else Release(s);
      if (!live_.empty() && live_.back().toks.size() > 400) Release(live_.back());
    }
    // Leave nothing pinned behind.
    for (LiveSeq& s : live_) (void)r_.ReleaseSequence(s.h);
  }

 private:
  bool Killed(const LiveSeq& s) const { return s.node < 0 || c_.cluster->generation(s.node) != s.gen; }

  // Handles on a node killed since their creation move to the probe list.
  void RetireKilled() {
    for (size_t i = 0; i < live_.size();) {
      if (!Killed(live_[i])) {
        ++i;
        continue;
      }
      const int node = live_[i].node;
      dead_.push_back(DeadSeq{live_[i].h, node, node < 0 ? 0 : c_.cluster->generation(node), SteadyClock::now(), 0});
      live_.erase(live_.begin() + static_cast<ptrdiff_t>(i));
    }
  }

  // Read-only probes, spaced so most land after the node is back: never OK.
  void ProbeDead() {
    const auto now = SteadyClock::now();
    for (size_t i = 0; i < dead_.size();) {
      DeadSeq& d = dead_[i];
      // The generation is bumped just before the SIGKILL: until the old
      // process is reaped, a probe may still reach it and rightly answer OK.
      if (now < d.next || (d.node >= 0 && c_.cluster->dead_generation(d.node) < d.gen)) {
        ++i;
        continue;
      }
      auto t0 = SteadyClock::now();
      Result<SequenceState> st = r_.SequenceInfo(d.h);
      c_.st.seq_killed_probes++;
      c_.Count(kSeqInfo, st.status(), t0);
      const StatusCode code = st.status().code();
      if (st.ok()) {
        c_.inv.Violation("killed_seq", "sequence " + std::to_string(d.h.id) + " of killed node " + d.h.node_id +
                                           " answered OK (length " + std::to_string(st->length) +
                                           "): the id reached another sequence");
      } else if (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded) {
        c_.st.seq_killed_unavailable++;
      } else if (code == StatusCode::kNotFound) {
        c_.st.seq_killed_notfound++;
      } else {
        c_.inv.Violation("killed_seq", "sequence of killed node " + d.h.node_id + ": " + st.status().ToString());
      }
      // For 30 s: a restarted node's new ids climb towards the old ones.
      d.next = now + std::chrono::milliseconds(500);
      if (++d.probes >= 60) {
        dead_.erase(dead_.begin() + static_cast<ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void Verify(const LiveSeq& s, uint32_t from, const std::vector<std::byte>& k, const std::vector<std::byte>& v) {
    const uint32_t n = static_cast<uint32_t>(k.size() / BlockLayout::Full(m_).side_bytes(1));
    std::span<const TokenId> toks = std::span(s.toks).subspan(from, n);
    SeqKv(c_.o.seed, m_, toks, from, 0, &ek_);
    SeqKv(c_.o.seed, m_, toks, from, 1, &ev_);
    if (k.size() != ek_.size() || v.size() != ev_.size() || std::memcmp(k.data(), ek_.data(), k.size()) != 0 ||
        std::memcmp(v.data(), ev_.data(), v.size()) != 0) {
      c_.st.wrong_bytes++;
      c_.inv.Violation("wrong_bytes", "ReadSequence of " + std::to_string(s.h.id) + "@" + s.h.node_id + " [" +
                                          std::to_string(from) + "," + std::to_string(from + n) +
                                          ") returned K/V that differ from what was appended");
      return;
    }
    c_.st.seq_bytes_verified += k.size() + v.size();
    c_.st.seq_tokens_verified += n;
  }

  // After a failed call: a NotFound on a live node's handle means the node
  // lost a sequence it should hold (we touch every handle well within the idle timeout).
  void Lost(LiveSeq& s, const Status& st) {
    if (st.code() == StatusCode::kNotFound && !Killed(s))
      c_.inv.Violation("seq_lost", "sequence " + std::to_string(s.h.id) + "@" + s.h.node_id + ": " + st.ToString());
  }

  void Create() {
    const uint32_t p = static_cast<uint32_t>(rng_() % kSeqPrompts);
    std::vector<TokenId> prompt;
    for (uint32_t i = 0; i < 3 * bt_; ++i) prompt.push_back(Tok(c_.o.seed, 50000 + p, i));
    for (uint32_t i = 0; i < 5; ++i) prompt.push_back(static_cast<TokenId>(rng_() % 50000));
    std::vector<uint64_t> gens;
    for (size_t i = 0; i < c_.cluster->size(); ++i) gens.push_back(c_.cluster->generation(i));
    auto t0 = SteadyClock::now();
    Result<SequenceHandle> h = r_.CreateSequence(prompt);
    if (!c_.Count(kSeqCreate, h.status(), t0, {StatusCode::kResourceExhausted})) return;
    c_.NoteSeqId(h->node_id, h->id);
    LiveSeq s;
    s.h = *h;
    s.node = c_.cluster->IndexOf(h->node_id);
    s.gen = s.node >= 0 ? gens[s.node] : 0;
    s.touched = SteadyClock::now();
    const uint32_t attached = h->prefix_tokens;
    if (attached % bt_ != 0 || attached > 3 * bt_) {
      c_.inv.Violation("seq_state", "CreateSequence attached " + std::to_string(attached) + " tokens of a " +
                                        std::to_string(3 * bt_) + "-token shared prompt");
    }
    c_.st.seq_attached_tokens += attached;
    s.toks.assign(prompt.begin(), prompt.begin() + std::min<size_t>(attached, prompt.size()));
    live_.push_back(std::move(s));
    if (attached < prompt.size()) {
      LiveSeq& ls = live_.back();
      AppendTokens(ls, std::vector<TokenId>(prompt.begin() + attached, prompt.end()));
    }
  }

  void Append(LiveSeq& s, uint32_t n) {
    std::vector<TokenId> add;
    for (uint32_t i = 0; i < n; ++i) add.push_back(static_cast<TokenId>(rng_() % 50000));
    AppendTokens(s, add);
  }

  void AppendTokens(LiveSeq& s, const std::vector<TokenId>& add) {
    const uint32_t pos0 = static_cast<uint32_t>(s.toks.size());
    SeqKv(c_.o.seed, m_, add, pos0, 0, &ek_);
    SeqKv(c_.o.seed, m_, add, pos0, 1, &ev_);
    auto t0 = SteadyClock::now();
    Result<uint32_t> r = r_.AppendSequence(s.h, add, ek_, ev_);
    std::vector<TokenId> after = s.toks;
    after.insert(after.end(), add.begin(), add.end());
    if (c_.Count(kSeqAppend, r.status(), t0, {StatusCode::kResourceExhausted})) {
      if (*r != pos0)
        c_.inv.Violation("seq_state", "AppendSequence answered position " + std::to_string(*r) + ", expected " +
                                          std::to_string(pos0));
      s.toks = std::move(after);
      s.touched = SteadyClock::now();
      return;
    }
    Lost(s, r.status());
    s.uncertain = true;
    s.lo = s.toks;
    s.hi = std::move(after);
  }

  void Truncate(LiveSeq& s) {
    if (s.toks.empty()) return Append(s, 4);
    const uint32_t n = 1 + static_cast<uint32_t>(rng_() % std::min<size_t>(s.toks.size(), 12));
    auto t0 = SteadyClock::now();
    Status st = r_.TruncateSequence(s.h, n);
    std::vector<TokenId> after(s.toks.begin(), s.toks.end() - n);
    if (c_.Count(kSeqTruncate, st, t0)) {
      s.toks = std::move(after);
      s.touched = SteadyClock::now();
      return;
    }
    Lost(s, st);
    s.uncertain = true;
    s.hi = s.toks;
    s.lo = std::move(after);
  }

  // Learns the state after a failed mutation: anything between lo and hi.
  bool Resync(LiveSeq& s) {
    auto t0 = SteadyClock::now();
    Result<SequenceState> st = r_.SequenceInfo(s.h);
    if (!c_.Count(kSeqInfo, st.status(), t0)) {
      Lost(s, st.status());
      return false;
    }
    c_.st.seq_resyncs++;
    if (!IsPrefix(s.lo, st->tokens) || !IsPrefix(st->tokens, s.hi)) {
      c_.inv.Violation("seq_state", "sequence " + std::to_string(s.h.id) + "@" + s.h.node_id + " holds " +
                                        std::to_string(st->tokens.size()) + " tokens after a failed call, not a state between " +
                                        std::to_string(s.lo.size()) + " and " + std::to_string(s.hi.size()));
    }
    s.toks = st->tokens;
    s.uncertain = false;
    s.touched = SteadyClock::now();
    return true;
  }

  void Read(LiveSeq& s) {
    if (s.toks.empty()) return;
    const uint32_t len = static_cast<uint32_t>(s.toks.size());
    const uint32_t from = static_cast<uint32_t>(rng_() % len);
    const uint32_t n = 1 + static_cast<uint32_t>(rng_() % (len - from));
    std::vector<std::byte> k, v;
    auto t0 = SteadyClock::now();
    Status st = r_.ReadSequence(s.h, from, n, &k, &v);
    if (!c_.Count(kSeqRead, st, t0)) return Lost(s, st);
    s.touched = SteadyClock::now();
    const size_t per = BlockLayout::Full(m_).side_bytes(1);
    if (k.size() != per * n) {
      c_.st.wrong_bytes++;
      c_.inv.Violation("wrong_bytes", "ReadSequence of " + std::to_string(n) + " positions returned " +
                                          std::to_string(k.size()) + " K bytes");
      return;
    }
    Verify(s, from, k, v);
  }

  void Info(LiveSeq& s) {
    auto t0 = SteadyClock::now();
    Result<SequenceState> st = r_.SequenceInfo(s.h);
    if (!c_.Count(kSeqInfo, st.status(), t0)) return Lost(s, st.status());
    s.touched = SteadyClock::now();
    if (st->tokens != s.toks || st->length != s.toks.size() || st->sealed_blocks > st->length / bt_) {
      c_.inv.Violation("seq_state", "SequenceInfo of " + std::to_string(s.h.id) + "@" + s.h.node_id + ": " +
                                        std::to_string(st->length) + " tokens, " +
                                        std::to_string(st->sealed_blocks) + " sealed; expected " +
                                        std::to_string(s.toks.size()) + " tokens");
      s.toks = st->tokens;
    }
  }

  void Fork(LiveSeq& s) {
    if (live_.size() >= 6) return Release(s);
    const uint64_t gen = s.gen;
    auto t0 = SteadyClock::now();
    Result<SequenceHandle> f = r_.ForkSequence(s.h);
    if (!c_.Count(kSeqFork, f.status(), t0, {StatusCode::kResourceExhausted})) return Lost(s, f.status());
    c_.NoteSeqId(f->node_id, f->id);
    LiveSeq n;
    n.h = *f;
    n.node = s.node;
    n.gen = gen;
    n.toks = s.toks;
    n.touched = s.touched = SteadyClock::now();
    live_.push_back(std::move(n));  // s may dangle from here
  }

  void Release(LiveSeq& s) {
    auto t0 = SteadyClock::now();
    Status st = r_.ReleaseSequence(s.h);
    if (!c_.Count(kSeqRelease, st, t0)) Lost(s, st);
    // Released or not (a node that missed it reaps it when idle), it is gone for us.
    const size_t i = static_cast<size_t>(&s - live_.data());
    live_.erase(live_.begin() + static_cast<ptrdiff_t>(i));
  }

  Context& c_;
  Router& r_;
  std::mt19937_64 rng_;
  const ModelSpec m_;
  const uint32_t bt_;
  std::vector<LiveSeq> live_;
  std::vector<DeadSeq> dead_;
  std::vector<std::byte> ek_, ev_;
};

}  // namespace

void SequenceWorker(Context& c, Router& r, uint32_t thread) { SeqClient(c, r, thread).Run(); }

}  // namespace kvmesh::soak
