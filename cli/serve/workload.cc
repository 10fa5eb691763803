#include "cli/serve/workload.h"

#include <algorithm>
#include <random>

#include "eviction/replay.h"

namespace kvmesh::serve {
namespace {

// Tokens of a fresh message: distinct per (tag, index) and seed.
std::vector<TokenId> Tokens(std::mt19937_64& rng, uint32_t n) {
  std::vector<TokenId> t(n);
  for (TokenId& x : t) x = static_cast<TokenId>(rng() % 100000 + 1000);
  return t;
}

uint32_t Around(std::mt19937_64& rng, uint32_t mean) {  // uniform in [mean/2, 3*mean/2]
  if (mean < 2) return std::max<uint32_t>(mean, 1);
  return static_cast<uint32_t>(mean / 2 + rng() % (mean + 1));
}

}  // namespace

std::vector<ServeRequest> MakeWorkload(const WorkloadOptions& o) {
  std::mt19937_64 rng(o.seed);
  // The shared prefixes: chat system prompts [0, n), agent preambles [n, 2n).
  std::vector<std::vector<TokenId>> shared;
  for (uint32_t i = 0; i < 2 * std::max<uint32_t>(o.system_prompts, 1); ++i)
    shared.push_back(Tokens(rng, i < o.system_prompts ? o.system_tokens : o.agent_preamble_tokens));
  const uint32_t n_shared = std::max<uint32_t>(o.system_prompts, 1);

  std::vector<ServeRequest> out;
  const double session_rate = o.rate / std::max<uint32_t>(o.turns, 1);
  std::exponential_distribution<double> gap(session_rate), think(2.0 / std::max(o.think_s, 1e-3));
  std::uniform_real_distribution<double> unit(0, 1);
  uint32_t session = 0;
  for (double t = gap(rng); t < o.duration_s; t += gap(rng), ++session) {
    const bool agent = unit(rng) < o.agent_share;
    std::vector<TokenId> context = shared[(agent ? n_shared : 0) + rng() % n_shared];
    double at = t;
    for (uint32_t k = 0; k < o.turns; ++k) {
      std::vector<TokenId> msg = Tokens(rng, Around(rng, agent ? o.tool_tokens : o.user_tokens));
      context.insert(context.end(), msg.begin(), msg.end());
      ServeRequest r;
      r.session = session;
      r.turn = k;
      r.agent = agent;
      r.arrival_s = at;
      r.prompt = context;
      r.output = Tokens(rng, Around(rng, o.output_tokens));
      context.insert(context.end(), r.output.begin(), r.output.end());
      out.push_back(std::move(r));
      at += o.think_s / 2 + think(rng);  // at least think_s / 2: the answer is read first
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ServeRequest& a, const ServeRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

std::vector<ServeRequest> TraceWorkload(const Trace& trace, const TraceWindow& w) {
  constexpr uint32_t kTraceBlock = 512;  // Mooncake's hash_ids block size
  std::vector<ServeRequest> out;
  const double speed = w.speed > 0 ? w.speed : 1;
  for (size_t r = 0; r < trace.requests(); ++r) {
    const double t = double(trace.timestamp_ms[r]) / 1e3;
    if (t < w.start_s || t >= w.start_s + w.duration_s) continue;
    ServeRequest q;
    q.session = uint32_t(r);
    q.arrival_s = (t - w.start_s) / speed;
    const uint32_t len = trace.input_length[r];
    q.prompt.reserve(len);
    for (uint32_t j = trace.begin[r]; j < trace.begin[r + 1] && q.prompt.size() < len; ++j) {
      std::mt19937_64 block_rng(0x9e3779b97f4a7c15ull ^ trace.blocks[j]);
      for (uint32_t i = 0; i < kTraceBlock && q.prompt.size() < len; ++i)
        q.prompt.push_back(static_cast<TokenId>(block_rng() % 100000 + 1000));
    }
    while (q.prompt.size() < len) q.prompt.push_back(TokenId(1000 + q.prompt.size() % 7));  // ids short of the length
    std::mt19937_64 out_rng(r + 1);
    q.output = Tokens(out_rng, std::max<uint32_t>(1, std::min(trace.output_length[r], w.max_output)));
    out.push_back(std::move(q));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ServeRequest& a, const ServeRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

}  // namespace kvmesh::serve
