#include "coordinator/decode/driver.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>

#include "shard_node/shard_node.h"
#include "shard_node/tiered_store.h"

#include "common/hash.h"

namespace kvmesh::decode {
namespace {

uint64_t Mix(uint64_t z) { return SplitMix64(&z); }

int64_t NowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch()).count(); }
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The sessions of the workload: conversations and agent loops. Prompts are
// built from the session's history (which holds the model's own replies) and
// tokens drawn from a stream named by (seed, session, turn), so a turn's
// prompt does not depend on scheduling.
class Workload {
 public:
  struct Session {
    bool agent = false;
    uint32_t turns = 0, turn = 0;
    std::vector<TokenId> history;
  };

  Workload(const DecodeWorkloadOptions& o, uint32_t vocab) : o_(o), vocab_(vocab) {
    std::mt19937_64 rng(o.seed);
    std::vector<std::vector<TokenId>> system(std::max(1u, o.system_prompts));
    for (auto& s : system) s = Draw(rng, o.system_tokens_min, o.system_tokens_max);
    std::vector<TokenId> tool = Draw(rng, o.tool_tokens, o.tool_tokens);
    for (uint32_t i = 0; i < o.conversations; ++i) {
      Session s;
      s.turns = Uniform(rng, o.turns_min, o.turns_max);
      s.history = system[Uniform(rng, 0, static_cast<uint32_t>(system.size() - 1))];
      sessions_.push_back(std::move(s));
    }
    for (uint32_t i = 0; i < o.agents; ++i) {
      Session s;
      s.agent = true;
      s.turns = Uniform(rng, o.steps_min, o.steps_max);
      s.history = tool;
      sessions_.push_back(std::move(s));
    }
    for (uint32_t i = 0; i < sessions_.size(); ++i) ready_.push_back(i);
    std::shuffle(ready_.begin(), ready_.end(), rng);
  }

  bool HasReady() const { return !ready_.empty(); }
  // The next ready session's next turn: its prompt and reply length.
  uint32_t Pop(std::vector<TokenId>* prompt, uint32_t* reply_len, uint64_t* request_id) {
    const uint32_t id = ready_.front();
    ready_.pop_front();
    Session& s = sessions_[id];
    std::mt19937_64 rng(Mix(o_.seed ^ Mix(uint64_t{id} << 20 | s.turn)));
    std::vector<TokenId> add = s.agent ? Draw(rng, o_.observation_tokens_min, o_.observation_tokens_max)
                                       : Draw(rng, o_.user_tokens_min, o_.user_tokens_max);
    *reply_len = s.agent ? Uniform(rng, o_.action_tokens_min, o_.action_tokens_max)
                         : Uniform(rng, o_.reply_tokens_min, o_.reply_tokens_max);
    *prompt = s.history;
    prompt->insert(prompt->end(), add.begin(), add.end());
    *request_id = uint64_t{id} * 1000 + s.turn;
    return id;
  }
  // The turn of session `id` finished with `prompt` + `reply`.
  void Finish(uint32_t id, const std::vector<TokenId>& prompt, const std::vector<TokenId>& reply) {
    Session& s = sessions_[id];
    s.history = prompt;
    s.history.insert(s.history.end(), reply.begin(), reply.end());
    if (++s.turn < s.turns) ready_.push_back(id);
  }
  uint64_t TotalRequests() const {
    uint64_t n = 0;
    for (const Session& s : sessions_) n += s.turns;
    return n;
  }

 private:
  static uint32_t Uniform(std::mt19937_64& rng, uint32_t lo, uint32_t hi) {
    return hi <= lo ? lo : lo + static_cast<uint32_t>(rng() % (hi - lo + 1));
  }
  std::vector<TokenId> Draw(std::mt19937_64& rng, uint32_t lo, uint32_t hi) const {
    std::vector<TokenId> t(Uniform(rng, lo, hi));
    for (TokenId& x : t) x = static_cast<TokenId>(rng() % vocab_);
    return t;
  }

  DecodeWorkloadOptions o_;
  uint32_t vocab_;
  std::vector<Session> sessions_;
  std::deque<uint32_t> ready_;
};

struct Active {
  uint32_t session = 0;
  uint64_t request_id = 0;
  std::vector<TokenId> prompt;
  uint32_t reply_len = 0;
  SeqId seq = 0;
  uint32_t fed = 0;  // prompt tokens in the sequence
  std::vector<TokenId> out;
  int64_t t_ready = 0, t_admit = 0, t_first = 0;
};

void Event(const DecodeRunOptions& o, const char* event, uint64_t request_id, uint64_t token_idx, const char* extra = "") {
  if (!o.events) return;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "{\"event\":\"%s\",\"request_id\":%llu,\"token_idx\":%llu,\"timestamp\":%.6f,\"run\":\"%s\"%s}", event,
                static_cast<unsigned long long>(request_id), static_cast<unsigned long long>(token_idx), UnixSeconds(),
                o.label.c_str(), extra);
  o.events(buf);
}

}  // namespace

Result<DecodeReport> RunDecodeWorkload(RankEngine& eng, const PrefixLookup& lookup, ShardNode* node,
                                       const DecodeWorkloadOptions& wo, const DecodeRunOptions& o) {
  const ModelConfig& mc = eng.config();
  StepComm& comm = eng.comm();
  SequenceTable& table = eng.table();
  const bool driver = comm.rank() == 0;
  const uint32_t bt = table.layout().block_tokens;
  const uint32_t batch = std::max(1u, o.batch), chunk = std::max(1u, o.prefill_chunk);
  Workload wl(wo, mc.vocab);
  DecodeReport rep;
  const SequenceStats seq0 = table.Stats();
  const uint64_t rows0 = eng.rows_fed();
  std::vector<Active> active;
  std::vector<int64_t> ready_at(wo.conversations + wo.agents, 0);
  std::vector<StepEntry> entries;
  std::vector<float> hidden, sel, logits;
  std::vector<TokenId> toks;
  std::vector<std::vector<TokenId>> step_tokens;
  const int64_t start = NowNs();
  for (int64_t& t : ready_at) t = start;

  while (true) {
    // Admit ready requests up to the batch size.
    while (active.size() < batch && wl.HasReady()) {
      Active a;
      a.session = wl.Pop(&a.prompt, &a.reply_len, &a.request_id);
      a.t_ready = ready_at[a.session];
      a.t_admit = NowNs();
      const uint64_t full = a.prompt.size() / bt;
      uint64_t m = 0;
      if (o.prefix_reuse) {
        m = std::min<uint64_t>(lookup(a.prompt), (a.prompt.size() - 1) / bt);  // compute >= 1 token
        KVMESH_RETURN_IF_ERROR(comm.AllReduceMin(std::span(&m, 1)));
        a.seq = table.CreateFromPrefix(a.prompt, m);
        // A block evicted between lookup and attach: agree on what every rank has.
        uint64_t got = table.Length(a.seq).value() / bt;
        KVMESH_RETURN_IF_ERROR(comm.AllReduceMin(std::span(&got, 1)));
        if (got < m) {
          KVMESH_RETURN_IF_ERROR(table.Truncate(a.seq, static_cast<uint32_t>((m - got) * bt)));
          m = got;
        }
      } else {
        a.seq = table.Create();
      }
      a.fed = static_cast<uint32_t>(m * bt);
      rep.prompt_tokens += a.prompt.size();
      rep.prompt_blocks += full;
      rep.matched_blocks += m;
      rep.computed_prompt_tokens += a.prompt.size() - a.fed;
      if (driver) {
        char extra[96];
        std::snprintf(extra, sizeof extra, ",\"prompt_tokens\":%zu,\"reused_tokens\":%u,\"batch\":%u",
                      a.prompt.size(), a.fed, batch);
        Event(o, "admit", a.request_id, 0, extra);
      }
      active.push_back(std::move(a));
    }
    if (active.empty()) break;

    // One step: a prompt chunk for requests in prefill, one token for the rest.
    entries.clear();
    step_tokens.assign(active.size(), {});
    for (size_t i = 0; i < active.size(); ++i) {
      Active& a = active[i];
      if (a.fed < a.prompt.size()) {
        const uint32_t n = std::min<uint32_t>(chunk, static_cast<uint32_t>(a.prompt.size()) - a.fed);
        step_tokens[i].assign(a.prompt.begin() + a.fed, a.prompt.begin() + a.fed + n);
        a.fed += n;
      } else {
        step_tokens[i] = {a.out.back()};
      }
      entries.push_back(StepEntry{a.seq, step_tokens[i]});
    }
    ForwardOptions fo;
    KVMESH_RETURN_IF_ERROR(eng.Forward(entries, fo, &hidden));
    ++rep.steps;

    // The driver samples for every request past its prompt; all ranks learn the tokens.
    toks.assign(active.size(), -1);
    if (driver) {
      sel.clear();
      std::vector<size_t> who;
      for (size_t i = 0; i < active.size(); ++i) {
        if (active[i].fed < active[i].prompt.size()) continue;
        sel.insert(sel.end(), hidden.begin() + i * mc.hidden, hidden.begin() + (i + 1) * mc.hidden);
        who.push_back(i);
      }
      eng.Logits(sel, &logits);
      for (size_t j = 0; j < who.size(); ++j) {
        const Active& a = active[who[j]];
        toks[who[j]] = Sample(std::span(logits).subspan(j * mc.vocab, mc.vocab), o.temperature, o.sample_seed,
                              a.request_id, a.out.size());
      }
    }
    KVMESH_RETURN_IF_ERROR(comm.Broadcast(std::as_writable_bytes(std::span(toks)), 0));
    const int64_t now = NowNs();

    std::vector<Active> still;
    for (size_t i = 0; i < active.size(); ++i) {
      Active& a = active[i];
      if (toks[i] < 0) {
        still.push_back(std::move(a));
        continue;
      }
      a.out.push_back(toks[i]);
      rep.token_digest += Mix(a.request_id * 0x100000001b3ull + a.out.size() * 0x10001 + static_cast<uint64_t>(toks[i]));
      if (a.out.size() == 1) {
        a.t_first = now;
        if (driver) rep.ttft.Record(now - a.t_admit);
      }
      if (driver) Event(o, a.out.size() == 1 ? "first_token" : "token", a.request_id, a.out.size() - 1);
      if (a.out.size() < a.reply_len) {
        still.push_back(std::move(a));
        continue;
      }
      // Finished: its sealed blocks stay cached for the next turn.
      ++rep.requests;
      rep.generated_tokens += a.out.size();
      if (driver) {
        if (a.out.size() > 1) rep.tpot.Record((now - a.t_first) / static_cast<int64_t>(a.out.size() - 1));
        rep.e2e.Record(now - a.t_ready);
        rep.queue.Record(a.t_admit - a.t_ready);
        Event(o, "finish", a.request_id, a.out.size() - 1);
      }
      KVMESH_RETURN_IF_ERROR(table.Release(a.seq));
      ready_at[a.session] = now;
      wl.Finish(a.session, a.prompt, a.out);
    }
    active = std::move(still);
  }
  rep.wall_s = static_cast<double>(NowNs() - start) / 1e9;
  rep.rows_fed = eng.rows_fed() - rows0;

  const SequenceStats seq1 = table.Stats();
  const StoreStats st = node ? node->store().Stats() : StoreStats{};
  uint64_t host = 0, ssd = 0;
  if (const TieredStore* tiers = node ? node->tiers() : nullptr) {
    const TierStats ts = tiers->Stats();
    host = ts.host.bytes_stored;
    ssd = ts.ssd.bytes_stored;
  }
  uint64_t sums[7] = {st.bytes_stored, st.blocks, seq1.seals - seq0.seals, seq1.seal_dedups - seq0.seal_dedups,
                      host, ssd, st.bytes_logical};
  KVMESH_RETURN_IF_ERROR(comm.AllReduceSumU64(sums));
  rep.kv_bytes_stored = sums[0];
  rep.kv_blocks_stored = sums[1];
  rep.kv_seals = sums[2];
  rep.kv_seal_dedups = sums[3];
  rep.kv_bytes_host = sums[4];
  rep.kv_bytes_ssd = sums[5];
  rep.kv_bytes_logical = sums[6];
  // Every rank saw the same tokens; the driver's wall time is the run's.
  double wall = rep.wall_s;
  KVMESH_RETURN_IF_ERROR(comm.Broadcast(std::as_writable_bytes(std::span(&wall, 1)), 0));
  rep.wall_s = wall;
  return rep;
}

// ---- Speculative decoding ----------------------------------------------------

namespace {

// Greedy token of each row of `hidden` (driver only), broadcast to all ranks.
Status GreedyRows(RankEngine& eng, const std::vector<float>& hidden, std::vector<TokenId>* out, size_t rows) {
  out->assign(rows, 0);
  if (eng.comm().rank() == 0) {
    std::vector<float> logits;
    eng.Logits(hidden, &logits);
    const uint32_t V = eng.config().vocab;
    for (size_t r = 0; r < rows; ++r) (*out)[r] = Sample(std::span(logits).subspan(r * V, V), 0.0f, 0, 0, 0);
  }
  return eng.comm().Broadcast(std::as_writable_bytes(std::span(*out)), 0);
}

std::vector<TokenId> SpecPrompt(const SpecOptions& o, uint32_t i, uint32_t vocab) {
  std::mt19937_64 rng(Mix(o.seed + i));
  std::vector<TokenId> p(o.prompt_tokens);
  for (TokenId& t : p) t = static_cast<TokenId>(rng() % vocab);
  return p;
}

}  // namespace

Result<SpecReport> RunSpeculative(RankEngine& eng, const SpecOptions& o) {
  SequenceTable& table = eng.table();
  const uint32_t k = std::max(1u, o.draft_tokens);
  const uint32_t dl = std::clamp(o.draft_layers, 1u, eng.config().layers);
  SpecReport rep;
  std::vector<float> hidden;
  std::vector<TokenId> tok;
  bool same = true;
  for (uint32_t pi = 0; pi < o.prompts; ++pi) {
    const std::vector<TokenId> prompt = SpecPrompt(o, pi, eng.config().vocab);
    std::vector<TokenId> plain_out, spec_out;
    // Plain greedy decode.
    {
      SeqId s = table.Create();
      StepEntry e{s, prompt};
      KVMESH_RETURN_IF_ERROR(eng.Forward(std::span(&e, 1), {}, &hidden));
      KVMESH_RETURN_IF_ERROR(GreedyRows(eng, hidden, &tok, 1));
      plain_out.push_back(tok[0]);
      const int64_t t0 = NowNs();
      while (plain_out.size() < o.new_tokens) {
        StepEntry d{s, std::span(&plain_out.back(), 1)};
        KVMESH_RETURN_IF_ERROR(eng.Forward(std::span(&d, 1), {}, &hidden));
        KVMESH_RETURN_IF_ERROR(GreedyRows(eng, hidden, &tok, 1));
        plain_out.push_back(tok[0]);
      }
      const int64_t dt = NowNs() - t0;
      rep.plain_s += dt / 1e9;
      rep.plain_tpot.Record(dt / static_cast<int64_t>(o.new_tokens - 1));
      KVMESH_RETURN_IF_ERROR(table.Release(s));
    }
    // Speculative: a fresh sequence of the same prompt (its prefix blocks are
    // now cached: attach them, compute the rest).
    {
      const uint32_t bt = table.layout().block_tokens;
      SeqId s = table.CreateFromPrefix(prompt, (prompt.size() - 1) / bt);
      // Agree on the attached length across ranks.
      uint64_t got = table.Length(s).value();
      KVMESH_RETURN_IF_ERROR(eng.comm().AllReduceMin(std::span(&got, 1)));
      KVMESH_RETURN_IF_ERROR(table.Truncate(s, table.Length(s).value() - static_cast<uint32_t>(got)));
      StepEntry e{s, std::span(prompt).subspan(got)};
      KVMESH_RETURN_IF_ERROR(eng.Forward(std::span(&e, 1), {}, &hidden));
      KVMESH_RETURN_IF_ERROR(GreedyRows(eng, hidden, &tok, 1));
      spec_out.push_back(tok[0]);
      const int64_t t0 = NowNs();
      std::vector<TokenId> feed;
      while (spec_out.size() < o.new_tokens) {
        // Draft k tokens with the first dl layers.
        std::vector<TokenId> draft;
        TokenId cur = spec_out.back();
        ForwardOptions dfo;
        dfo.seal = false;
        if (o.int4_draft) {
          dfo.int4_kv = true;
        } else {
          dfo.layers = dl;
        }
        for (uint32_t i = 0; i < k; ++i) {
          StepEntry d{s, std::span(&cur, 1)};
          KVMESH_RETURN_IF_ERROR(eng.Forward(std::span(&d, 1), dfo, &hidden));
          KVMESH_RETURN_IF_ERROR(GreedyRows(eng, hidden, &tok, 1));
          draft.push_back(tok[0]);
          cur = tok[0];
        }
        // The draft's partial-layer KV goes; the target verifies [last, d1..dk].
        KVMESH_RETURN_IF_ERROR(table.Truncate(s, k));
        feed.assign(1, spec_out.back());
        feed.insert(feed.end(), draft.begin(), draft.end());
        StepEntry v{s, feed};
        ForwardOptions vfo;
        vfo.all_rows = true;
        KVMESH_RETURN_IF_ERROR(eng.Forward(std::span(&v, 1), vfo, &hidden));
        KVMESH_RETURN_IF_ERROR(GreedyRows(eng, hidden, &tok, k + 1));
        uint32_t acc = 0;
        while (acc < k && draft[acc] == tok[acc]) ++acc;
        ++rep.rounds;
        rep.proposed += k;
        rep.accepted += acc;
        // Keep [last, d1..d_acc]; roll back the rejected drafts.
        KVMESH_RETURN_IF_ERROR(table.Truncate(s, k - acc));
        rep.rolled_back += k - acc;
        for (uint32_t i = 0; i < acc && spec_out.size() < o.new_tokens; ++i) spec_out.push_back(draft[i]);
        if (spec_out.size() < o.new_tokens) spec_out.push_back(tok[acc]);
      }
      const int64_t dt = NowNs() - t0;
      rep.spec_s += dt / 1e9;
      rep.spec_tpot.Record(dt / static_cast<int64_t>(o.new_tokens - 1));
      KVMESH_RETURN_IF_ERROR(table.Release(s));
    }
    rep.generated += o.new_tokens;
    same = same && plain_out == spec_out;
  }
  rep.same_tokens = same;
  return rep;
}

}  // namespace kvmesh::decode
