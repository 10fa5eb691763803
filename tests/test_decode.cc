// Issue 6, item 4: the model-parallel decode over kvmesh sequences produces the
// same tokens and logits (fp32 tolerance) as the single-process reference
// without kvmesh, for 1, 2 and 4 ranks, with a fork, a truncate across a block
// boundary, a multi-token (verify-style) feed and a prefix-matched prefill.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <thread>

#include "coordinator/decode/engine.h"
#include "coordinator/decode/model.h"
#include "coordinator/decode/model_cuda.h"
#include "tests/decode_scenario.h"
#include "coordinator/decode/cluster.h"
#include "kvmesh/embedded.h"
#include "shard_node/shard_node.h"

using namespace kvmesh;
using namespace kvmesh::decode;

using namespace kvmesh::decode::testing;

namespace {

// Teacher forcing: every Pick returns a fixed token, so a run whose logits
// drift (a lossy KV codec) still feeds the same tokens as the reference and
// its logits stay comparable step by step. No collective: every rank picks
// the same token on its own.
class ForcedExec final : public Exec {
 public:
  explicit ForcedExec(Exec* x) : x_(x) {}
  int New() override { return x_->New(); }
  int Fork(int s) override { return x_->Fork(s); }
  void Truncate(int s, uint32_t n) override { x_->Truncate(s, n); }
  std::vector<std::vector<float>> Feed(const std::vector<std::pair<int, std::vector<TokenId>>>& batch,
                                       bool all_rows) override {
    return x_->Feed(batch, all_rows);
  }
  std::vector<float> Prefill(int* seq, const std::vector<TokenId>& prompt, uint32_t* reused) override {
    return x_->Prefill(seq, prompt, reused);
  }
  TokenId Pick(const std::vector<float>&, float, uint64_t req, uint64_t idx) override {
    return static_cast<TokenId>((req * 31 + idx * 7 + 11) % 64);
  }

 private:
  Exec* x_;
};

Transcript RunReference(const std::shared_ptr<const Weights>& w, bool forced) {
  Transcript t;
  RefExec x(w);
  ForcedExec fx(&x);
  RunScenario(forced ? static_cast<Exec&>(fx) : x, &t);
  return t;
}

// Runs the scenario on `ranks` threads over an embedded cluster (rank r's KV
// on node r); returns each rank's transcript (logits on rank 0 only).
std::vector<Transcript> RunRanks(const ModelConfig& mc, const std::shared_ptr<const Weights>& w, int ranks,
                                 const SequenceOptions& so, bool forced, std::unique_ptr<EmbeddedCluster>* keep) {
  auto cluster = EmbeddedCluster::Start(ClusterFor(mc, ranks)).value();
  auto comms = MakeThreadComms(ranks);
  std::vector<std::unique_ptr<SequenceTable>> tables(ranks);
  for (int r = 0; r < ranks; ++r) {
    RankPlan plan = PlanRank(mc, r, ranks).value();
    tables[r] = SequenceTable::Create(&cluster->node(r).store(), mc.Spec(), {0, mc.layers}, plan.kv_heads, so).value();
  }
  std::vector<Transcript> per_rank(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      RankEngine eng(w, PlanRank(mc, r, ranks).value(), tables[r].get(), comms[r].get());
      RankExec x(&eng);
      ForcedExec fx(&x);
      RunScenario(forced ? static_cast<Exec&>(fx) : x, &per_rank[r]);
    });
  }
  for (auto& th : threads) th.join();
  tables.clear();
  if (keep != nullptr) *keep = std::move(cluster);
  return per_rank;
}

// Share of logit rows whose argmax (the greedy token) agrees.
double Top1Agreement(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  size_t same = 0, n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    same += std::max_element(a[i].begin(), a[i].end()) - a[i].begin() ==
            std::max_element(b[i].begin(), b[i].end()) - b[i].begin();
  return n ? double(same) / n : 0;
}

// ||a - b|| / ||b|| over every logit of two transcripts.
double RelL2(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    for (size_t j = 0; j < std::min(a[i].size(), b[i].size()); ++j) {
      err += double(a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
      norm += double(b[i][j]) * b[i][j];
    }
  return norm > 0 ? std::sqrt(err / norm) : 0;
}

}  // namespace

static void CheckRanksMatchReference(const ModelConfig& mc, int ranks) {
  auto w = Weights::Generate(mc).value();
  Transcript ref = RunReference(w, false);
  std::unique_ptr<EmbeddedCluster> cluster;
  std::vector<Transcript> per_rank = RunRanks(mc, w, ranks, {}, false, &cluster);
  const Transcript& got = per_rank[0];
  REQUIRE(got.tokens == ref.tokens);
  for (int r = 1; r < ranks; ++r) CHECK(per_rank[r].tokens == ref.tokens);
  REQUIRE(got.logits.size() == ref.logits.size());
  for (size_t i = 0; i < ref.logits.size(); ++i) REQUIRE(got.logits[i].size() == ref.logits[i].size());
  const float worst = WorstRelative(got.logits, ref.logits);
  INFO("ranks " << ranks << " worst relative logit difference " << worst);
  CHECK(worst < 1e-4f);
  // The second request found the five sealed 8-token blocks of its 40-token
  // prefix shared with b.
  CHECK(got.reused[0] == 0);
  CHECK(got.reused[1] == 40);
  // Each rank kept only its own heads' KV, on its own node.
  for (int r = 0; r < ranks; ++r) CHECK(cluster->node(r).Stats().store.blocks > 0);
}

TEST_CASE("Decode: 1, 2 and 4 ranks (MoE, expert parallel) match the single-process reference", "[decode]") {
  ModelConfig mc = SmallModel(4);
  for (int ranks : {1, 2, 4}) {
    SECTION("ranks " + std::to_string(ranks)) { CheckRanksMatchReference(mc, ranks); }
  }
}

TEST_CASE("Decode: a dense FFN split over 2 and 4 ranks matches the reference", "[decode]") {
  ModelConfig mc = SmallModel(0);
  for (int ranks : {2, 4}) {
    SECTION("ranks " + std::to_string(ranks)) { CheckRanksMatchReference(mc, ranks); }
  }
}

TEST_CASE("Decode: the comparison is sensitive (one different history token moves the logits)", "[decode]") {
  // Guards the equality test against passing vacuously: one different token
  // in the history must move the logits far beyond the tolerance.
  ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  ReferenceModel a(w), b(w);
  std::vector<TokenId> p = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  int sa = a.NewSequence(), sb = b.NewSequence();
  auto la = a.Feed(sa, p);
  p[3] = 40;  // one different token in the history
  auto lb = b.Feed(sb, p);
  float worst = 0;
  for (size_t j = 0; j < la.size(); ++j) worst = std::max(worst, std::abs(la[j] - lb[j]));
  CHECK(worst > 1e-2f);
}

TEST_CASE("Decode: PlanRank splits heads and experts evenly and refuses more ranks than KV heads", "[decode]") {
  ModelConfig mc = SmallModel(4);
  RankPlan p = PlanRank(mc, 1, 2).value();
  CHECK(p.kv_heads == Range{2, 4});
  CHECK(p.q_heads == Range{4, 8});
  CHECK(p.experts == Range{2, 4});
  CHECK(PlanRank(mc, 0, 8).status().code() == StatusCode::kInvalidArgument);
  ModelConfig odd = mc;
  odd.experts = 3;
  CHECK(PlanRank(odd, 2, 4).value().experts.empty() == false);
  CHECK(PlanRank(odd, 3, 4).value().experts.empty());
}

TEST_CASE("Decode driver: prefix reuse computes less, finds shared blocks and generates the same tokens",
          "[decode]") {
  ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  ClusterConfig base = ClusterFor(mc, 2);
  ClusterConfig cfg = DecodeClusterConfig(base, mc, 2).value();
  DecodeWorkloadOptions wo;
  wo.conversations = 4;
  wo.agents = 2;
  wo.system_prompts = 2;
  wo.system_tokens_min = 24, wo.system_tokens_max = 40;
  wo.tool_tokens = 32;
  wo.user_tokens_min = 4, wo.user_tokens_max = 12;
  wo.reply_tokens_min = 3, wo.reply_tokens_max = 6;
  wo.observation_tokens_min = 4, wo.observation_tokens_max = 10;
  wo.action_tokens_min = 2, wo.action_tokens_max = 4;
  auto run = [&](bool reuse, uint32_t batch) {
    DecodeRunOptions o;
    o.batch = batch;
    o.prefix_reuse = reuse;
    o.prefill_chunk = 16;
    std::vector<std::string> lines;
    o.events = [&lines](const std::string& l) { lines.push_back(l); };
    DecodeReport rep;
    REQUIRE(RunOnThreads(cfg, w, 2, [&](RankEngine& e, const PrefixLookup& lookup, ShardNode* node) -> Status {
              KVMESH_ASSIGN_OR_RETURN(DecodeReport r, RunDecodeWorkload(e, lookup, node, wo, o));
              if (e.comm().rank() == 0) rep = r;
              return Status::Ok();
            }).ok());
    return std::pair(rep, lines);
  };
  auto [with, events] = run(true, 3);
  auto [without, unused] = run(false, 3);
  auto [with_b1, unused2] = run(true, 1);
  CHECK(with.requests == without.requests);
  CHECK(with.requests >= 4 * 2 + 2 * 3);
  CHECK(with.generated_tokens == without.generated_tokens);
  CHECK(with.token_digest == without.token_digest);    // reuse never changes what is generated
  CHECK(with_b1.token_digest == with.token_digest);    // nor does batching
  CHECK(without.matched_blocks == 0);
  CHECK(with.matched_blocks > 0);
  CHECK(with.prefix_hit_rate() > 0.3);
  CHECK(with.computed_prompt_tokens + with.matched_blocks * mc.block_tokens == with.prompt_tokens);
  CHECK(without.computed_prompt_tokens == without.prompt_tokens);
  CHECK(with.kv_bytes_stored > 0);
  CHECK(with.ttft.count() == with.requests);
  // One admit, one first_token and one finish event per request, valid JSON keys.
  size_t admits = 0, firsts = 0, finishes = 0;
  for (const std::string& l : events) {
    CHECK(l.find("\"request_id\":") != std::string::npos);
    CHECK(l.find("\"token_idx\":") != std::string::npos);
    CHECK(l.find("\"timestamp\":") != std::string::npos);
    admits += l.find("\"event\":\"admit\"") != std::string::npos;
    firsts += l.find("\"event\":\"first_token\"") != std::string::npos;
    finishes += l.find("\"event\":\"finish\"") != std::string::npos;
  }
  CHECK(admits == with.requests);
  CHECK(firsts == with.requests);
  CHECK(finishes == with.requests);
}

TEST_CASE("Speculative decoding (early-exit and int4-KV drafts): rollback by truncate, output equals plain greedy", "[decode]") {
  ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  double acceptance[2] = {0, 0};  // [early exit, int4 KV] on 2 ranks
  for (auto [ranks, int4] : {std::pair{1, false}, std::pair{2, false}, std::pair{1, true}, std::pair{2, true}}) {
    ClusterConfig cfg = DecodeClusterConfig(ClusterFor(mc, ranks), mc, ranks).value();
    SpecOptions so;
    so.int4_draft = int4;
    so.prompts = 2;
    so.prompt_tokens = 20;
    so.new_tokens = 24;
    so.draft_tokens = 3;
    so.draft_layers = 1;
    SpecReport rep;
    REQUIRE(RunOnThreads(cfg, w, ranks, [&](RankEngine& e, const PrefixLookup&, ShardNode*) -> Status {
              KVMESH_ASSIGN_OR_RETURN(SpecReport r, RunSpeculative(e, so));
              if (e.comm().rank() == 0) rep = r;
              return Status::Ok();
            }).ok());
    CHECK(rep.same_tokens);
    CHECK(rep.generated == 48);
    CHECK(rep.proposed == rep.rounds * 3);
    CHECK(rep.accepted + rep.rolled_back == rep.proposed);
    CHECK(rep.rolled_back > 0);  // the run exercised rollback
    if (ranks == 2) acceptance[int4] = rep.acceptance();
  }
  // Rounding KV to int4 changes far fewer greedy choices than dropping a layer.
  CHECK(acceptance[1] > acceptance[0]);
  CHECK(acceptance[1] > 0.5);
}

// Issue 6, item 4 with codecs: sealed KV blocks stored through a lossy codec
// change the logits by a bounded amount. Each codec has a stated tolerance
// (docs/decode.md): the worst |logit - reference| / (1 + |reference|) over
// the teacher-forced scenario, and the share of steps whose greedy token
// agrees with the exact reference. Ranks 1 and 2 must agree with each other
// to fp32 tolerance: the codec's groups never cross a head, so how heads are
// split over ranks does not change what is stored.
TEST_CASE("Decode with a lossy KV codec stays within the codec's stated tolerance of the exact reference",
          "[decode][codec]") {
  ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  const Transcript ref = RunReference(w, true);
  struct Tol {
    const char* codec;
    double max_l2;    // relative L2 error of all logits
    float max_rel;    // worst |logit - reference| / (1 + |reference|)
    double min_top1;  // greedy-token agreement
  };
  // Measured on this scenario (2026-11-30), rel-L2 / worst / greedy agreement:
  // fp16 1.2e-4 / 1.2e-3 / 1, bf16 7.7e-4 / 8.3e-3 / 1, int8 1.7e-3 / 1.9e-2 / 1,
  // fp8-e4m3 9.7e-3 / 0.10 / 1, int4 0.13 / 2.5 / 0.94. The stated bounds
  // (docs/decode.md) leave 2-4x headroom on the errors.
  for (const Tol& tol : {Tol{"fp16", 5e-4, 3e-3f, 1.0}, Tol{"bf16", 2e-3, 2e-2f, 1.0}, Tol{"int8", 5e-3, 4e-2f, 0.97},
                         Tol{"fp8-e4m3", 3e-2, 0.25f, 0.97}, Tol{"int4", 0.3, 5.0f, 0.85}}) {
    SequenceOptions so;
    so.codec.codec = tol.codec;
    std::vector<Transcript> one = RunRanks(mc, w, 1, so, true, nullptr);
    std::vector<Transcript> two = RunRanks(mc, w, 2, so, true, nullptr);
    REQUIRE(one[0].logits.size() == ref.logits.size());
    REQUIRE(two[0].logits.size() == ref.logits.size());
    CHECK(one[0].reused == std::vector<uint32_t>{0, 40});  // teacher-forced: the same prefix hits as exact KV
    const double l2 = RelL2(one[0].logits, ref.logits);
    const float rel = WorstRelative(one[0].logits, ref.logits);
    const double top1 = Top1Agreement(one[0].logits, ref.logits);
    const float split = WorstRelative(two[0].logits, one[0].logits);
    INFO(tol.codec << ": logit rel-L2 " << l2 << ", worst relative " << rel << ", greedy agreement " << top1
                   << ", 1 vs 2 ranks " << split);
    CHECK(l2 < tol.max_l2);
    CHECK(rel < tol.max_rel);
    CHECK(top1 >= tol.min_top1);
    CHECK(split < 1e-4f);
    if (std::string(tol.codec) != "fp16") CHECK(rel > 1e-6f);  // the codec really was in the path
  }
}

TEST_CASE("CUDA reference model: refused cleanly without a CUDA build or device", "[decode]") {
  // With a device, kernels/cuda/gpu_model_test (ctest gpu:model_cuda_vs_cpu) compares it with the CPU.
  if (CudaDeviceStatus().ok()) return;
  auto w = Weights::Generate(ModelConfig{});
  REQUIRE(w.ok());
  auto m = CudaReferenceModel::Create(*w);
  REQUIRE(!m.ok());
  CHECK(m.status().code() == StatusCode::kUnavailable);
  CHECK(!m.status().message().empty());
}

TEST_CASE("RopeAngle is the formula Rope applies", "[decode]") {
  const uint32_t dim = 16;
  for (uint32_t pos : {0u, 1u, 300u}) {
    std::vector<float> v(dim), want(dim);
    for (uint32_t i = 0; i < dim; ++i) v[i] = want[i] = 0.25f * static_cast<float>(i) - 1.0f;
    Rope(v.data(), dim, pos, 10000.0f);
    for (uint32_t i = 0; i < dim / 2; ++i) {
      float c, s;
      RopeAngle(dim, pos, i, 10000.0f, &c, &s);
      const float a = want[i], b = want[i + dim / 2];
      CHECK(v[i] == a * c - b * s);
      CHECK(v[i + dim / 2] == a * s + b * c);
    }
  }
}
