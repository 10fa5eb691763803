#include "coordinator/decode/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/hash.h"

namespace kvmesh::decode {
namespace {

uint64_t Mix(uint64_t z) { return Mix64(z); }

}  // namespace

void FillUniform(std::vector<float>& v, size_t n, uint64_t seed, uint64_t tag, float a) {
  v.resize(n);
  uint64_t x = Mix(seed ^ Mix(tag + 0x9E3779B97F4A7C15ull));
  for (size_t i = 0; i < n; ++i) {
    x += 0x9E3779B97F4A7C15ull;
    const double u = static_cast<double>(Mix(x) >> 11) * (1.0 / 9007199254740992.0);  // [0,1)
    v[i] = static_cast<float>((2.0 * u - 1.0) * a);
  }
}

namespace {

uint64_t Tag(uint32_t layer, uint32_t tensor, uint32_t expert = 0) {
  return (uint64_t{layer} << 40) | (uint64_t{tensor} << 32) | expert;
}

}  // namespace

Status ModelConfig::Validate() const {
  if (vocab < 2 || hidden == 0 || layers == 0 || q_heads == 0 || kv_heads == 0 || head_dim == 0 || ffn == 0)
    return InvalidArgument("decode model: every size must be > 0 (vocab >= 2)");
  if (q_heads % kv_heads != 0) return InvalidArgument("decode model: kv_heads must divide q_heads");
  if (head_dim % 2 != 0) return InvalidArgument("decode model: head_dim must be even (RoPE)");
  if (experts > 0 && (top_k == 0 || top_k > experts))
    return InvalidArgument("decode model: top_k must be in [1, experts]");
  if (block_tokens == 0) return InvalidArgument("decode model: block_tokens must be > 0");
  return Status::Ok();
}

ModelSpec ModelConfig::Spec() const {
  ModelSpec m;
  m.model_id = model_id + "-s" + std::to_string(seed) + "-v" + std::to_string(vocab) + "-h" + std::to_string(hidden) +
               "-l" + std::to_string(layers) + "-q" + std::to_string(q_heads) + "-kv" + std::to_string(kv_heads) +
               "-d" + std::to_string(head_dim) + "-f" + std::to_string(ffn) + "-e" + std::to_string(experts) + "k" +
               std::to_string(top_k);
  m.num_layers = layers;
  m.num_kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.dtype = DType::kFp32;
  m.block_tokens = block_tokens;
  m.num_experts = experts;
  return m;
}

uint64_t ModelConfig::Params() const {
  const uint64_t attn = uint64_t{hidden} * head_dim * (2 * q_heads + 2 * kv_heads);
  const uint64_t ffn_one = 3ull * hidden * ffn;
  const uint64_t per_layer = attn + (experts ? experts * ffn_one + uint64_t{experts} * hidden : ffn_one) + 2 * hidden;
  return per_layer * layers + 2ull * vocab * hidden + hidden;
}

Result<std::shared_ptr<const Weights>> Weights::Generate(const ModelConfig& c) {
  KVMESH_RETURN_IF_ERROR(c.Validate());
  auto w = std::make_shared<Weights>();
  w->config = c;
  const float a_h = std::sqrt(3.0f / c.hidden);
  const float a_attn = std::sqrt(3.0f / (c.q_heads * c.head_dim));
  const float a_ffn = std::sqrt(3.0f / c.ffn);
  FillUniform(w->embed, size_t{c.vocab} * c.hidden, c.seed, Tag(0xFFFF, 1), std::sqrt(3.0f));
  FillUniform(w->lm_head, size_t{c.vocab} * c.hidden, c.seed, Tag(0xFFFF, 3), std::sqrt(3.0f));
  FillUniform(w->final_norm, c.hidden, c.seed, Tag(0xFFFF, 2), 0.1f);
  for (float& g : w->final_norm) g += 1.0f;
  w->layers.resize(c.layers);
  const uint32_t nffn = c.experts ? c.experts : 1;
  for (uint32_t l = 0; l < c.layers; ++l) {
    LayerWeights& L = w->layers[l];
    FillUniform(L.attn_norm, c.hidden, c.seed, Tag(l, 1), 0.1f);
    FillUniform(L.ffn_norm, c.hidden, c.seed, Tag(l, 2), 0.1f);
    for (float& g : L.attn_norm) g += 1.0f;
    for (float& g : L.ffn_norm) g += 1.0f;
    FillUniform(L.wq, size_t{c.q_heads} * c.head_dim * c.hidden, c.seed, Tag(l, 3), a_h);
    FillUniform(L.wk, size_t{c.kv_heads} * c.head_dim * c.hidden, c.seed, Tag(l, 4), a_h);
    FillUniform(L.wv, size_t{c.kv_heads} * c.head_dim * c.hidden, c.seed, Tag(l, 5), a_h);
    FillUniform(L.wo, size_t{c.hidden} * c.q_heads * c.head_dim, c.seed, Tag(l, 6), a_attn);
    if (c.experts) FillUniform(L.gate, size_t{c.experts} * c.hidden, c.seed, Tag(l, 7), a_h);
    L.w1.resize(nffn);
    L.w2.resize(nffn);
    L.w3.resize(nffn);
    for (uint32_t e = 0; e < nffn; ++e) {
      FillUniform(L.w1[e], size_t{c.ffn} * c.hidden, c.seed, Tag(l, 8, e), a_h);
      FillUniform(L.w3[e], size_t{c.ffn} * c.hidden, c.seed, Tag(l, 9, e), a_h);
      FillUniform(L.w2[e], size_t{c.hidden} * c.ffn, c.seed, Tag(l, 10, e), a_ffn);
    }
  }
  return std::shared_ptr<const Weights>(std::move(w));
}

float Dot(const float* a, const float* b, size_t n) {
  // Eight independent partial sums (vectorizable, fixed order).
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void MatMul(const float* W, size_t ldw, size_t rows, size_t cols, const float* x, size_t ldx, size_t batch, float* y,
            size_t ldy) {
  // Tiles of batch rows stay in L1 while the weight rows stream past them;
  // each output is still one Dot, so tiling never changes a result.
  constexpr size_t kTile = 8;
  for (size_t b0 = 0; b0 < batch; b0 += kTile) {
    const size_t b1 = std::min(batch, b0 + kTile);
    for (size_t r = 0; r < rows; ++r) {
      const float* wr = W + r * ldw;
      for (size_t b = b0; b < b1; ++b) y[b * ldy + r] = Dot(wr, x + b * ldx, cols);
    }
  }
}

void RmsNorm(const float* x, const float* gain, size_t n, float* out) {
  const float ms = Dot(x, x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(ms + 1e-6f);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * inv * gain[i];
}

void RopeAngle(uint32_t dim, uint32_t pos, uint32_t i, float theta, float* c, float* s) {
  const double freq = std::pow(static_cast<double>(theta), -2.0 * i / dim);
  const double ang = pos * freq;
  *c = static_cast<float>(std::cos(ang));
  *s = static_cast<float>(std::sin(ang));
}

void Rope(float* v, uint32_t dim, uint32_t pos, float theta) {
  const uint32_t half = dim / 2;
  for (uint32_t i = 0; i < half; ++i) {
    float c, s;
    RopeAngle(dim, pos, i, theta, &c, &s);
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = a * s + b * c;
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

void TopK(const float* logits, uint32_t n, uint32_t k, uint32_t* idx, float* w) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](uint32_t a, uint32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  float mx = logits[order[0]], sum = 0;
  for (uint32_t i = 0; i < k; ++i) {
    idx[i] = order[i];
    w[i] = std::exp(logits[order[i]] - mx);
    sum += w[i];
  }
  for (uint32_t i = 0; i < k; ++i) w[i] /= sum;
}

TokenId Sample(std::span<const float> logits, float temperature, uint64_t seed, uint64_t request, uint64_t index) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  if (temperature <= 0) return static_cast<TokenId>(best);
  double sum = 0;
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - logits[best]) / temperature);
  const double u = static_cast<double>(Mix(Mix(seed ^ Mix(request)) + index) >> 11) * (1.0 / 9007199254740992.0);
  double acc = 0, target = u * sum;
  for (size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (acc > target) return static_cast<TokenId>(i);
  }
  return static_cast<TokenId>(best);
}

// ---- ReferenceModel --------------------------------------------------------

ReferenceModel::ReferenceModel(std::shared_ptr<const Weights> w) : w_(std::move(w)) {}

int ReferenceModel::NewSequence() {
  Seq s;
  s.k.resize(w_->config.layers);
  s.v.resize(w_->config.layers);
  seqs_.push_back(std::move(s));
  return static_cast<int>(seqs_.size() - 1);
}

int ReferenceModel::Fork(int seq) {
  seqs_.push_back(seqs_[seq]);
  return static_cast<int>(seqs_.size() - 1);
}

void ReferenceModel::Truncate(int seq, uint32_t n) {
  Seq& s = seqs_[seq];
  s.len -= n;
  for (auto& k : s.k) k.resize(s.len);
  for (auto& v : s.v) v.resize(s.len);
}

void ReferenceModel::Extend(int seq, uint32_t n) {
  Seq& s = seqs_[seq];
  const size_t width = size_t(w_->config.kv_heads) * w_->config.head_dim;
  s.len += n;
  for (auto& k : s.k) k.resize(s.len, std::vector<float>(width, 0.0f));
  for (auto& v : s.v) v.resize(s.len, std::vector<float>(width, 0.0f));
}

uint32_t ReferenceModel::Length(int seq) const { return seqs_[seq].len; }

std::vector<float> ReferenceModel::Feed(int seq, std::span<const TokenId> tokens) {
  std::vector<float> logits;
  for (TokenId t : tokens) logits = Step(seqs_[seq], t);
  return logits;
}

std::vector<float> ReferenceModel::Step(Seq& s, TokenId tok) {
  const ModelConfig& c = w_->config;
  const uint32_t H = c.hidden, D = c.head_dim, Q = c.q_heads, KV = c.kv_heads, group = Q / KV;
  const uint32_t pos = s.len;
  std::vector<float> x(w_->embed.begin() + static_cast<ptrdiff_t>(size_t(tok) * H),
                       w_->embed.begin() + static_cast<ptrdiff_t>(size_t(tok + 1) * H));
  std::vector<float> h(H), q(Q * D), att(Q * D), o(H), f(H), a1(c.ffn), a3(c.ffn), scores;
  for (uint32_t l = 0; l < c.layers; ++l) {
    const LayerWeights& L = w_->layers[l];
    RmsNorm(x.data(), L.attn_norm.data(), H, h.data());
    std::vector<float> k(KV * D), v(KV * D);
    MatMul(L.wq.data(), H, Q * D, H, h.data(), H, 1, q.data(), Q * D);
    MatMul(L.wk.data(), H, KV * D, H, h.data(), H, 1, k.data(), KV * D);
    MatMul(L.wv.data(), H, KV * D, H, h.data(), H, 1, v.data(), KV * D);
    for (uint32_t i = 0; i < Q; ++i) Rope(q.data() + i * D, D, pos, c.rope_theta);
    for (uint32_t i = 0; i < KV; ++i) Rope(k.data() + i * D, D, pos, c.rope_theta);
    s.k[l].push_back(std::move(k));
    s.v[l].push_back(std::move(v));
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (uint32_t i = 0; i < Q; ++i) {
      const uint32_t kvh = i / group;
      scores.resize(pos + 1);
      float mx = -INFINITY;
      for (uint32_t p = 0; p <= pos; ++p) {
        scores[p] = Dot(q.data() + i * D, s.k[l][p].data() + kvh * D, D) * scale;
        mx = std::max(mx, scores[p]);
      }
      float sum = 0;
      for (uint32_t p = 0; p <= pos; ++p) sum += scores[p] = std::exp(scores[p] - mx);
      float* out = att.data() + i * D;
      std::fill(out, out + D, 0.0f);
      for (uint32_t p = 0; p <= pos; ++p) {
        const float wgt = scores[p] / sum;
        const float* vr = s.v[l][p].data() + kvh * D;
        for (uint32_t d = 0; d < D; ++d) out[d] += wgt * vr[d];
      }
    }
    MatMul(L.wo.data(), Q * D, H, Q * D, att.data(), Q * D, 1, o.data(), H);
    for (uint32_t i = 0; i < H; ++i) x[i] += o[i];
    RmsNorm(x.data(), L.ffn_norm.data(), H, h.data());
    std::vector<uint32_t> idx{0};
    std::vector<float> wts{1.0f};
    if (c.experts) {
      std::vector<float> g(c.experts);
      MatMul(L.gate.data(), H, c.experts, H, h.data(), H, 1, g.data(), c.experts);
      idx.resize(c.top_k);
      wts.resize(c.top_k);
      TopK(g.data(), c.experts, c.top_k, idx.data(), wts.data());
    }
    std::fill(f.begin(), f.end(), 0.0f);
    for (size_t j = 0; j < idx.size(); ++j) {
      const uint32_t e = idx[j];
      MatMul(L.w1[e].data(), H, c.ffn, H, h.data(), H, 1, a1.data(), c.ffn);
      MatMul(L.w3[e].data(), H, c.ffn, H, h.data(), H, 1, a3.data(), c.ffn);
      for (uint32_t i = 0; i < c.ffn; ++i) a1[i] = Silu(a1[i]) * a3[i];
      MatMul(L.w2[e].data(), c.ffn, H, c.ffn, a1.data(), c.ffn, 1, o.data(), H);
      for (uint32_t i = 0; i < H; ++i) f[i] += wts[j] * o[i];
    }
    for (uint32_t i = 0; i < H; ++i) x[i] += f[i];
  }
  ++s.len;
  RmsNorm(x.data(), w_->final_norm.data(), H, h.data());
  std::vector<float> logits(c.vocab);
  MatMul(w_->lm_head.data(), H, c.vocab, H, h.data(), H, 1, logits.data(), c.vocab);
  const float ls = LogitScale(c);
  for (float& z : logits) z *= ls;
  return logits;
}

}  // namespace kvmesh::decode
