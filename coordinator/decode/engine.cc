#include "coordinator/decode/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvmesh::decode {
namespace {

Range Split(uint32_t n, int rank, int size) {
  const uint32_t base = n / size, extra = n % size, r = static_cast<uint32_t>(rank);
  const uint32_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

std::span<const std::byte> Bytes(const float* p, size_t n) {
  return {reinterpret_cast<const std::byte*>(p), n * sizeof(float)};
}

// A head_dim row rounded to symmetric int4 (scale = absmax / 7), into out.
const float* Int4(const float* row, uint32_t n, std::vector<float>& out) {
  out.resize(n);
  float amax = 0;
  for (uint32_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(row[i]));
  const float scale = amax > 0 ? amax / 7.0f : 1.0f;
  for (uint32_t i = 0; i < n; ++i) out[i] = std::clamp(std::nearbyint(row[i] / scale), -8.0f, 7.0f) * scale;
  return out.data();
}

}  // namespace

Result<RankPlan> PlanRank(const ModelConfig& c, int rank, int size) {
  KVMESH_RETURN_IF_ERROR(c.Validate());
  if (size < 1 || rank < 0 || rank >= size) return InvalidArgument("bad rank " + std::to_string(rank));
  if (static_cast<uint32_t>(size) > c.kv_heads) {
    return InvalidArgument("tensor parallel over " + std::to_string(size) + " ranks needs at least as many KV heads (" +
                           std::to_string(c.kv_heads) + ")");
  }
  RankPlan p;
  p.kv_heads = Split(c.kv_heads, rank, size);
  const uint32_t group = c.q_heads / c.kv_heads;
  p.q_heads = {p.kv_heads.begin * group, p.kv_heads.end * group};
  p.experts = Split(c.experts, rank, size);
  p.ffn_rows = Split(c.ffn, rank, size);
  return p;
}

RankEngine::RankEngine(std::shared_ptr<const Weights> w, RankPlan plan, SequenceTable* table, StepComm* comm)
    : w_(std::move(w)), plan_(plan), table_(table), comm_(comm) {}

void RankEngine::Attention(const SequenceView& v, uint32_t layer, uint32_t pos, const float* q, float* out,
                           bool int4) {
  const ModelConfig& c = w_->config;
  const uint32_t D = c.head_dim, group = c.q_heads / c.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  scores_.resize(pos + 1);
  for (uint32_t i = 0; i < plan_.q_heads.size(); ++i) {
    const uint32_t kvh = (plan_.q_heads.begin + i) / group;
    const float* qi = q + i * D;
    float mx = -INFINITY;
    for (uint32_t p = 0; p <= pos; ++p) {
      const float* kr = reinterpret_cast<const float*>(v.Row(layer, 0, kvh, p));
      if (int4) kr = Int4(kr, D, qrow_);
      scores_[p] = Dot(qi, kr, D) * scale;
      mx = std::max(mx, scores_[p]);
    }
    float sum = 0;
    for (uint32_t p = 0; p <= pos; ++p) sum += scores_[p] = std::exp(scores_[p] - mx);
    float* o = out + i * D;
    std::fill(o, o + D, 0.0f);
    for (uint32_t p = 0; p <= pos; ++p) {
      const float wgt = scores_[p] / sum;
      const float* vr = reinterpret_cast<const float*>(v.Row(layer, 1, kvh, p));
      if (int4) vr = Int4(vr, D, qrow_);
      for (uint32_t d = 0; d < D; ++d) o[d] += wgt * vr[d];
    }
  }
}

// part_[rows][H] := this rank's share of FFN(hn_) (before the reduction).
void RankEngine::Ffn(uint32_t layer, size_t rows) {
  const ModelConfig& c = w_->config;
  const LayerWeights& L = w_->layers[layer];
  const uint32_t H = c.hidden, F = c.ffn;
  std::fill(part_.begin(), part_.begin() + rows * H, 0.0f);
  if (c.experts == 0) {
    const uint32_t f0 = plan_.ffn_rows.begin, nf = plan_.ffn_rows.size();
    if (nf == 0) return;
    a1_.resize(rows * nf);
    a3_.resize(rows * nf);
    MatMul(L.w1[0].data() + size_t{f0} * H, H, nf, H, hn_.data(), H, rows, a1_.data(), nf);
    MatMul(L.w3[0].data() + size_t{f0} * H, H, nf, H, hn_.data(), H, rows, a3_.data(), nf);
    for (size_t i = 0; i < rows * nf; ++i) a1_[i] = Silu(a1_[i]) * a3_[i];
    MatMul(L.w2[0].data() + f0, F, H, nf, a1_.data(), nf, rows, part_.data(), H);
    return;
  }
  // Gate (replicated on every rank: the same bits everywhere).
  const uint32_t E = c.experts, K = c.top_k;
  gate_.resize(rows * E);
  MatMul(L.gate.data(), H, E, H, hn_.data(), H, rows, gate_.data(), E);
  topk_idx_.resize(rows * K);
  topk_w_.resize(rows * K);
  for (size_t r = 0; r < rows; ++r) TopK(gate_.data() + r * E, E, K, topk_idx_.data() + r * K, topk_w_.data() + r * K);
  std::vector<uint32_t> sel;
  std::vector<float> wsel;
  for (uint32_t e = plan_.experts.begin; e < plan_.experts.end; ++e) {
    sel.clear();
    wsel.clear();
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t j = 0; j < K; ++j)
        if (topk_idx_[r * K + j] == e) {
          sel.push_back(static_cast<uint32_t>(r));
          wsel.push_back(topk_w_[r * K + j]);
        }
    if (sel.empty()) continue;
    const size_t m = sel.size();
    tmp_.resize(m * H);
    for (size_t i = 0; i < m; ++i) std::memcpy(tmp_.data() + i * H, hn_.data() + size_t{sel[i]} * H, H * sizeof(float));
    a1_.resize(m * F);
    a3_.resize(m * F);
    MatMul(L.w1[e].data(), H, F, H, tmp_.data(), H, m, a1_.data(), F);
    MatMul(L.w3[e].data(), H, F, H, tmp_.data(), H, m, a3_.data(), F);
    for (size_t i = 0; i < m * F; ++i) a1_[i] = Silu(a1_[i]) * a3_[i];
    MatMul(L.w2[e].data(), F, H, F, a1_.data(), F, m, tmp_.data(), H);
    for (size_t i = 0; i < m; ++i) {
      float* dst = part_.data() + size_t{sel[i]} * H;
      for (uint32_t d = 0; d < H; ++d) dst[d] += wsel[i] * tmp_[i * H + d];
    }
  }
}

Status RankEngine::Forward(std::span<const StepEntry> entries, const ForwardOptions& o, std::vector<float>* hidden) {
  const ModelConfig& c = w_->config;
  const uint32_t H = c.hidden, D = c.head_dim;
  const uint32_t Qr = plan_.q_heads.size(), KVr = plan_.kv_heads.size();
  const uint32_t q0 = plan_.q_heads.begin, kv0 = plan_.kv_heads.begin;
  const uint32_t nl = o.layers == 0 ? c.layers : std::min(o.layers, c.layers);

  // Rows: every fed token of every entry, in entry order.
  size_t rows = 0;
  for (const StepEntry& e : entries) {
    if (e.tokens.empty()) return InvalidArgument("a step entry without tokens");
    rows += e.tokens.size();
  }
  row_pos_.resize(rows);
  row_entry_.resize(rows);
  std::vector<uint32_t> first(entries.size());
  x_.resize(rows * H);
  {
    size_t r = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      KVMESH_ASSIGN_OR_RETURN(first[i], table_->Extend(entries[i].seq, entries[i].tokens));
      for (size_t t = 0; t < entries[i].tokens.size(); ++t, ++r) {
        const TokenId tok = entries[i].tokens[t];
        if (tok < 0 || static_cast<uint32_t>(tok) >= c.vocab) return InvalidArgument("token outside the vocabulary");
        row_pos_[r] = first[i] + static_cast<uint32_t>(t);
        row_entry_[r] = static_cast<uint32_t>(i);
        std::memcpy(x_.data() + r * H, w_->embed.data() + size_t(tok) * H, H * sizeof(float));
      }
    }
  }
  rows_fed_ += rows;
  std::vector<SequenceView> views(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    KVMESH_ASSIGN_OR_RETURN(views[i], table_->View(entries[i].seq));
  }
  hn_.resize(rows * H);
  q_.resize(rows * Qr * D);
  k_.resize(rows * KVr * D);
  v_.resize(rows * KVr * D);
  att_.resize(rows * Qr * D);
  part_.resize(rows * H);

  for (uint32_t l = 0; l < nl; ++l) {
    const LayerWeights& L = w_->layers[l];
    for (size_t r = 0; r < rows; ++r) RmsNorm(x_.data() + r * H, L.attn_norm.data(), H, hn_.data() + r * H);
    MatMul(L.wq.data() + size_t{q0} * D * H, H, Qr * D, H, hn_.data(), H, rows, q_.data(), Qr * D);
    MatMul(L.wk.data() + size_t{kv0} * D * H, H, KVr * D, H, hn_.data(), H, rows, k_.data(), KVr * D);
    MatMul(L.wv.data() + size_t{kv0} * D * H, H, KVr * D, H, hn_.data(), H, rows, v_.data(), KVr * D);
    for (size_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < Qr; ++i) Rope(q_.data() + (r * Qr + i) * D, D, row_pos_[r], c.rope_theta);
      for (uint32_t i = 0; i < KVr; ++i) Rope(k_.data() + (r * KVr + i) * D, D, row_pos_[r], c.rope_theta);
    }
    // KV next to the data: into this rank's sequences, then attention over them.
    for (size_t i = 0, r = 0; i < entries.size(); r += entries[i].tokens.size(), ++i) {
      const uint32_t n = static_cast<uint32_t>(entries[i].tokens.size());
      KVMESH_RETURN_IF_ERROR(table_->Write(entries[i].seq, l, first[i], n, Bytes(k_.data() + r * KVr * D, n * KVr * D),
                                           Bytes(v_.data() + r * KVr * D, n * KVr * D)));
    }
    for (size_t r = 0; r < rows; ++r)
      Attention(views[row_entry_[r]], l, row_pos_[r], q_.data() + r * Qr * D, att_.data() + r * Qr * D, o.int4_kv);
    // This rank's columns of Wo, then the sum over ranks.
    MatMul(L.wo.data() + size_t{q0} * D, size_t{c.q_heads} * D, H, Qr * D, att_.data(), Qr * D, rows, part_.data(), H);
    KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(std::span(part_.data(), rows * H)));
    for (size_t i = 0; i < rows * H; ++i) x_[i] += part_[i];

    for (size_t r = 0; r < rows; ++r) RmsNorm(x_.data() + r * H, L.ffn_norm.data(), H, hn_.data() + r * H);
    Ffn(l, rows);
    KVMESH_RETURN_IF_ERROR(comm_->AllReduceSum(std::span(part_.data(), rows * H)));
    for (size_t i = 0; i < rows * H; ++i) x_[i] += part_[i];
  }
  if (o.seal && nl == c.layers && !o.int4_kv) {
    for (const StepEntry& e : entries) KVMESH_RETURN_IF_ERROR(table_->Commit(e.seq));
  }

  hidden->clear();
  for (size_t i = 0, r = 0; i < entries.size(); r += entries[i].tokens.size(), ++i) {
    const size_t n = entries[i].tokens.size();
    for (size_t t = o.all_rows ? 0 : n - 1; t < n; ++t) {
      const size_t at = hidden->size();
      hidden->resize(at + H);
      RmsNorm(x_.data() + (r + t) * H, w_->final_norm.data(), H, hidden->data() + at);
    }
  }
  return Status::Ok();
}

void RankEngine::Logits(std::span<const float> hidden, std::vector<float>* logits) const {
  const ModelConfig& c = w_->config;
  const size_t rows = hidden.size() / c.hidden;
  logits->resize(rows * c.vocab);
  MatMul(w_->lm_head.data(), c.hidden, c.vocab, c.hidden, hidden.data(), c.hidden, rows, logits->data(), c.vocab);
  const float ls = LogitScale(c);
  for (float& z : *logits) z *= ls;
}

}  // namespace kvmesh::decode
