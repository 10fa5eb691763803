// coordinator/decode/engine.h — one rank of the model-parallel decode.
//
// Tensor parallel over KV heads: rank r owns KV heads [kv0, kv1) and the query
// heads that read them (GQA), keeps their KV in its own SequenceTable (its
// shard's block store), and computes q/k/v, attention and its slice of the
// output projection next to that KV. Expert parallel for the MoE FFN: rank r
// owns experts [e0, e1) (a dense FFN is split by its inner rows instead). The
// partial outputs of both halves of every layer are summed over the ranks
// with StepComm::AllReduceSum; the residual stream is replicated.
//
// Every rank runs the same Forward calls in the same order (SPMD). Rank 0 is
// the driver: it turns the final hidden states into logits and samples.
//
// Thread-safety: one RankEngine per rank thread.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "coordinator/decode/model.h"
#include "coordinator/decode/step_comm.h"
#include "shard_node/sequence_table.h"

namespace kvmesh::decode {

struct RankPlan {
  Range kv_heads;  // absolute KV heads this rank holds
  Range q_heads;   // the query heads that read them
  Range experts;   // MoE experts this rank computes (may be empty)
  Range ffn_rows;  // dense FFN: inner rows this rank computes
};

// Even split of heads and experts over `size` ranks.
// InvalidArgument when size exceeds the KV heads.
Result<RankPlan> PlanRank(const ModelConfig& c, int rank, int size);

// One sequence's tokens to feed in a step.
struct StepEntry {
  SeqId seq = 0;
  std::span<const TokenId> tokens;
};

struct ForwardOptions {
  bool all_rows = false;  // hidden states of every fed token, not only each entry's last
  uint32_t layers = 0;    // run only the first `layers` layers (early-exit draft); 0 = all.
                          // A partial forward writes KV of those layers only and seals nothing.
  bool int4_kv = false;   // attention reads K and V rounded to int4 (per row and head,
                          // absmax scale): the numerics of an int4 KV cache, for a
                          // QuantSpec-style self-draft. Such a forward seals nothing.
  bool seal = true;       // false: leave full blocks open (draft tokens about to be rolled back)
};

class RankEngine {
 public:
  // REQUIRES: table's slice is (all layers, plan.kv_heads); table and comm outlive the engine.
  RankEngine(std::shared_ptr<const Weights> w, RankPlan plan, SequenceTable* table, StepComm* comm);

  // Feeds each entry's tokens at the end of its sequence (appending their KV;
  // full blocks are sealed) and writes the final-normed hidden states of the
  // selected rows to *hidden ([rows][hidden], entry order).
  Status Forward(std::span<const StepEntry> entries, const ForwardOptions& o, std::vector<float>* hidden);

  // logits [rows][vocab] of normalized hidden states (the driver's job).
  void Logits(std::span<const float> hidden, std::vector<float>* logits) const;

  const ModelConfig& config() const { return w_->config; }
  const RankPlan& plan() const { return plan_; }
  SequenceTable& table() { return *table_; }
  StepComm& comm() { return *comm_; }
  // Rows fed and steps run (work counters for reports).
  uint64_t rows_fed() const { return rows_fed_; }

 private:
  void Attention(const SequenceView& v, uint32_t layer, uint32_t pos, const float* q, float* out, bool int4);
  void Ffn(uint32_t layer, size_t rows);

  std::shared_ptr<const Weights> w_;
  RankPlan plan_;
  SequenceTable* table_;
  StepComm* comm_;
  uint64_t rows_fed_ = 0;
  // Scratch, reused across steps.
  std::vector<float> qrow_, x_, hn_, q_, k_, v_, att_, part_, scores_, gate_, a1_, a3_, tmp_;
  std::vector<uint32_t> row_pos_, row_entry_, topk_idx_;
  std::vector<float> topk_w_;
};

}  // namespace kvmesh::decode
