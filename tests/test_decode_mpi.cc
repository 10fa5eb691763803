// The decode under mpirun: `mpirun -np N test_decode_mpi` runs the decode
// equality scenario with one rank per process (each with its own ShardNode),
// steps over MPI collectives; rank 0 compares tokens and logits with the
// single-process reference, then a small workload checks prefix reuse.
// Exit 0 on success; any failure aborts the job with a message.
#include <mpi.h>

#include <cstdio>
#include <exception>

#include "coordinator/decode/cluster.h"
#include "shard_node/shard_node.h"
#include "tests/decode_scenario.h"

using namespace kvmesh;
using namespace kvmesh::decode;
using namespace kvmesh::decode::testing;

namespace {

void Check(int rank) {
  auto comm = MakeMpiComm();
  MustOk(comm.status());
  StepComm& c = **comm;
  const int ranks = c.size();
  const ModelConfig mc = SmallModel(4);
  auto w = Weights::Generate(mc).value();
  const ClusterConfig cfg = ClusterFor(mc, ranks);

  // 1. The equality scenario.
  Transcript got;
  {
    RankPlan plan = PlanRank(mc, rank, ranks).value();
    auto node = ShardNode::Create(cfg, cfg.nodes[rank].id).value();
    auto table = SequenceTable::Create(&node->store(), mc.Spec(), {0, mc.layers}, plan.kv_heads).value();
    RankEngine eng(w, plan, table.get(), &c);
    RankExec x(&eng);
    RunScenario(x, &got);
    table.reset();
  }
  if (rank == 0) {
    Transcript ref;
    RefExec x(w);
    RunScenario(x, &ref);
    Must(got.tokens == ref.tokens, "tokens differ from the reference");
    Must(got.logits.size() == ref.logits.size(), "logit count differs");
    const float worst = WorstRelative(got.logits, ref.logits);
    std::printf("decode over MPI, %d ranks: %zu tokens equal, %zu logit vectors, worst relative difference %.3g\n",
                ranks, got.tokens.size(), got.logits.size(), worst);
    Must(worst < 1e-4f, "logits differ beyond fp32 tolerance");
    Must(got.reused.size() == 2 && got.reused[0] == 0 && got.reused[1] == 40, "prefix reuse did not attach 40 tokens");
  }

  // 2. A small workload: prefix reuse finds blocks on every rank's own shard.
  ClusterConfig dcfg = DecodeClusterConfig(cfg, mc, ranks).value();
  DecodeWorkloadOptions wo;
  wo.conversations = 3;
  wo.agents = 1;
  wo.system_prompts = 1;
  wo.system_tokens_min = 24, wo.system_tokens_max = 32;
  wo.tool_tokens = 24;
  wo.user_tokens_min = 4, wo.user_tokens_max = 8;
  wo.reply_tokens_min = 2, wo.reply_tokens_max = 4;
  wo.observation_tokens_min = 4, wo.observation_tokens_max = 8;
  wo.action_tokens_min = 2, wo.action_tokens_max = 3;
  DecodeRunOptions o;
  o.batch = 2;
  DecodeReport rep;
  MustOk(RunOnMpi(dcfg, w, c, [&](RankEngine& e, const PrefixLookup& lookup, ShardNode* node) -> Status {
    KVMESH_ASSIGN_OR_RETURN(rep, RunDecodeWorkload(e, lookup, node, wo, o));
    return Status::Ok();
  }));
  if (rank == 0) {
    std::printf("workload over MPI: %llu requests, %llu tokens, prefix hit rate %.2f\n",
                (unsigned long long)rep.requests, (unsigned long long)rep.generated_tokens, rep.prefix_hit_rate());
    Must(rep.requests >= 3 * 2 + 1 * 3, "too few requests finished");
    Must(rep.matched_blocks > 0, "no prefix reuse");
  }
  MustOk(c.Barrier());
}

}  // namespace

int main(int argc, char** argv) {
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  const int rank = (*session)->rank();
  try {
    Check(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) std::printf("decode MPI test passed\n");
  return 0;
}
