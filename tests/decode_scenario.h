// tests/decode_scenario.h — the decode equality scenario shared by the
// thread test (test_decode.cc) and the mpirun test (test_decode_mpi.cc): the
// same operations run by the single-process reference and by the ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/decode/engine.h"
#include "coordinator/decode/model.h"
#include "kvmesh/config.h"

namespace kvmesh::decode::testing {

// Throws on failure (Catch reports it; the MPI test aborts).
inline void Must(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("decode scenario: ") + what);
}
inline void MustOk(const Status& s) {
  if (!s.ok()) throw std::runtime_error("decode scenario: " + s.ToString());
}


inline ModelConfig SmallModel(uint32_t experts) {
  ModelConfig c;
  c.vocab = 64;
  c.hidden = 32;
  c.layers = 2;
  c.q_heads = 8;
  c.kv_heads = 4;
  c.head_dim = 8;
  c.ffn = 48;
  c.experts = experts;
  c.top_k = 2;
  c.block_tokens = 8;
  c.seed = 7;
  return c;
}

// One config node per rank; rank r's KV (affinity Rank(r)) on node r.
inline ClusterConfig ClusterFor(const ModelConfig& m, int ranks) {
  ClusterConfig c;
  c.model = m.Spec();
  for (int r = 0; r < ranks; ++r) {
    NodeConfig n;
    n.id = "rank" + std::to_string(r);
    n.memory.host = 4 << 20;
    c.nodes.push_back(n);
    c.placement.groups["g" + std::to_string(r)] = {n.id};
    c.placement.affinity.push_back(
        AffinityRule{Affinity::Kind::kRank, {uint32_t(r), uint32_t(r) + 1}, "g" + std::to_string(r)});
  }
  return c;
}

// The operations of the scenario, run either by the reference or by the ranks.
class Exec {
 public:
  virtual ~Exec() = default;
  virtual int New() = 0;
  virtual int Fork(int s) = 0;
  virtual void Truncate(int s, uint32_t n) = 0;
  // Feeds each (seq, tokens); returns logits of the last token of each
  // (all_rows: of every token) on the driver, nothing elsewhere.
  virtual std::vector<std::vector<float>> Feed(const std::vector<std::pair<int, std::vector<TokenId>>>& batch,
                                               bool all_rows) = 0;
  // A new sequence for `prompt` that reuses cached full blocks; returns the
  // logits after the prompt and how many tokens were reused.
  virtual std::vector<float> Prefill(int* seq, const std::vector<TokenId>& prompt, uint32_t* reused) = 0;
  // Samples on the driver and shares the token with every rank.
  virtual TokenId Pick(const std::vector<float>& logits, float temp, uint64_t req, uint64_t idx) = 0;
};

class RefExec final : public Exec {
 public:
  explicit RefExec(std::shared_ptr<const Weights> w) : m_(std::move(w)) {}
  int New() override { return m_.NewSequence(); }
  int Fork(int s) override { return m_.Fork(s); }
  void Truncate(int s, uint32_t n) override { m_.Truncate(s, n); }
  std::vector<std::vector<float>> Feed(const std::vector<std::pair<int, std::vector<TokenId>>>& batch,
                                       bool all_rows) override {
    std::vector<std::vector<float>> out;
    for (const auto& [s, toks] : batch) {
      for (size_t i = 0; i < toks.size(); ++i) {
        auto l = m_.Feed(s, std::span(&toks[i], 1));
        if (all_rows || i + 1 == toks.size()) out.push_back(std::move(l));
      }
    }
    return out;
  }
  std::vector<float> Prefill(int* seq, const std::vector<TokenId>& prompt, uint32_t* reused) override {
    *seq = New();
    *reused = 0;
    return m_.Feed(*seq, prompt);
  }
  TokenId Pick(const std::vector<float>& logits, float temp, uint64_t req, uint64_t idx) override {
    return Sample(logits, temp, 99, req, idx);
  }

 private:
  ReferenceModel m_;
};

class RankExec final : public Exec {
 public:
  RankExec(RankEngine* e) : e_(e) {}
  int New() override {
    seqs_.push_back(e_->table().Create());
    return static_cast<int>(seqs_.size() - 1);
  }
  int Fork(int s) override {
    seqs_.push_back(e_->table().Fork(seqs_[s]).value());
    return static_cast<int>(seqs_.size() - 1);
  }
  void Truncate(int s, uint32_t n) override { MustOk(e_->table().Truncate(seqs_[s], n)); }
  std::vector<std::vector<float>> Feed(const std::vector<std::pair<int, std::vector<TokenId>>>& batch,
                                       bool all_rows) override {
    std::vector<StepEntry> entries;
    for (const auto& [s, toks] : batch) entries.push_back(StepEntry{seqs_[s], toks});
    std::vector<float> hidden, logits;
    ForwardOptions fo;
    fo.all_rows = all_rows;
    MustOk(e_->Forward(entries, fo, &hidden));
    std::vector<std::vector<float>> out;
    if (e_->comm().rank() != 0) return out;
    e_->Logits(hidden, &logits);
    const size_t V = e_->config().vocab;
    for (size_t r = 0; r < logits.size() / V; ++r) out.emplace_back(logits.begin() + r * V, logits.begin() + (r + 1) * V);
    return out;
  }
  std::vector<float> Prefill(int* seq, const std::vector<TokenId>& prompt, uint32_t* reused) override {
    // Prefix match on every rank's shard; the ranks agree on the minimum.
    const uint32_t bt = e_->table().layout().block_tokens;
    uint64_t m = e_->table().MatchPrefix(prompt);
    m = std::min<uint64_t>(m, (prompt.size() - 1) / bt);  // compute at least one token
    MustOk(e_->comm().AllReduceMin(std::span(&m, 1)));
    seqs_.push_back(e_->table().CreateFromPrefix(prompt, m));
    *seq = static_cast<int>(seqs_.size() - 1);
    *reused = static_cast<uint32_t>(m * bt);
    Must(e_->table().Length(seqs_.back()).value() == *reused, "attached length");
    std::vector<TokenId> rest(prompt.begin() + *reused, prompt.end());
    auto l = Feed({{*seq, rest}}, false);
    return l.empty() ? std::vector<float>{} : l[0];
  }
  TokenId Pick(const std::vector<float>& logits, float temp, uint64_t req, uint64_t idx) override {
    TokenId t = 0;
    if (e_->comm().rank() == 0) t = Sample(logits, temp, 99, req, idx);
    MustOk(e_->comm().Broadcast(std::as_writable_bytes(std::span(&t, 1)), 0));
    return t;
  }

 private:
  RankEngine* e_;
  std::vector<SeqId> seqs_;
};

struct Transcript {
  std::vector<std::vector<float>> logits;
  std::vector<TokenId> tokens;
  std::vector<uint32_t> reused;
};

// The scenario: prefill, greedy decode, fork into two sampled branches
// decoded in one batch, truncate one across a block boundary, a 5-token
// verify-style feed, and a second request that shares a prefix. The ranks and
// the reference run exactly the same operations.
inline void RunScenario(Exec& x, Transcript* t) {
  auto keep = [&](const std::vector<std::vector<float>>& ls) {
    for (const auto& l : ls) t->logits.push_back(l);
  };
  auto last = [](const std::vector<std::vector<float>>& ls) { return ls.empty() ? std::vector<float>{} : ls.back(); };
  std::vector<TokenId> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back((i * 7 + 3) % 64);
  int a = 0;
  uint32_t reused = 0;
  std::vector<float> la = x.Prefill(&a, prompt, &reused);
  t->reused.push_back(reused);
  keep({la});
  std::vector<TokenId> hist_a = prompt;
  for (int i = 0; i < 6; ++i) {  // greedy decode: 37 -> 43 tokens in the cache
    TokenId tok = x.Pick(la, 0.0f, 1, i);
    t->tokens.push_back(tok);
    hist_a.push_back(tok);
    auto ls = x.Feed({{a, {tok}}}, false);
    keep(ls);
    la = last(ls);
  }
  // Parallel sampling: fork, then decode both branches in one batch.
  int b = x.Fork(a);
  std::vector<float> lb = la;
  std::vector<TokenId> hist_b = hist_a;
  for (int i = 0; i < 3; ++i) {  // 43 -> 46 each
    TokenId ta = x.Pick(la, 0.9f, 2, i), tb = x.Pick(lb, 0.9f, 3, i);
    t->tokens.push_back(ta);
    t->tokens.push_back(tb);
    hist_a.push_back(ta);
    hist_b.push_back(tb);
    auto ls = x.Feed({{a, {ta}}, {b, {tb}}}, false);
    keep(ls);
    if (!ls.empty()) {
      la = ls[0];
      lb = ls[1];
    }
  }
  // Roll back 7 tokens of a: 46 -> 39, back across the sealed block [32, 40).
  x.Truncate(a, 7);
  hist_a.resize(39);
  // A verify-style multi-token feed: 5 tokens, logits of each.
  std::vector<TokenId> five = {5, 17, 33, 2, 60};
  auto ls = x.Feed({{a, five}}, true);
  keep(ls);
  hist_a.insert(hist_a.end(), five.begin(), five.end());
  la = last(ls);
  for (int i = 0; i < 4; ++i) {
    TokenId tok = x.Pick(la, 0.0f, 4, i);
    t->tokens.push_back(tok);
    hist_a.push_back(tok);
    auto l2 = x.Feed({{a, {tok}}}, false);
    keep(l2);
    la = last(l2);
  }
  // A new request whose prompt extends b's history: its full blocks are
  // found by prefix match and only the rest is computed.
  std::vector<TokenId> p2(hist_b.begin(), hist_b.begin() + 40);
  for (int i = 0; i < 11; ++i) p2.push_back((i * 5 + 1) % 64);
  int c = 0;
  std::vector<float> lc = x.Prefill(&c, p2, &reused);
  t->reused.push_back(reused);
  keep({lc});
  for (int i = 0; i < 5; ++i) {
    TokenId tok = x.Pick(lc, 0.7f, 5, i);
    t->tokens.push_back(tok);
    auto l2 = x.Feed({{c, {tok}}, {b, {tok}}}, false);
    keep(l2);
    if (!l2.empty()) lc = l2[0];
  }
}


// Largest |a - b| / (1 + |b|) over two logit transcripts.
inline float WorstRelative(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  float worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    for (size_t j = 0; j < std::min(a[i].size(), b[i].size()); ++j)
      worst = std::max(worst, std::abs(a[i][j] - b[i][j]) / (1.0f + std::abs(b[i][j])));
  return worst;
}

}  // namespace kvmesh::decode::testing
