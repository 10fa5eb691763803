#include "coordinator/decode/world_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/hash.h"
#include "coordinator/decode/model.h"

namespace kvmesh::decode {
namespace {

// Tags of the weight streams (FillUniform), distinct from the decoder's.
uint64_t Tag(uint32_t layer, uint32_t tensor) { return (uint64_t{0x57} << 56) | (uint64_t{layer} << 32) | tensor; }

// out[d] = v_self[d] + sum_j w_j (v_j[d] - v_self[d]) with w = softmax(scale * q . k_j):
// attending to copies of one's own entry returns it exactly.
void Attend(const float* q, const float* const* k, const float* const* v, size_t n, const float* v_self, uint32_t D,
            float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (size_t j = 0; j < n; ++j) {
    scores[j] = Dot(q, k[j], D) * scale;
    mx = std::max(mx, scores[j]);
  }
  float sum = 0;
  for (size_t j = 0; j < n; ++j) sum += scores[j] = std::exp(scores[j] - mx);
  for (uint32_t d = 0; d < D; ++d) out[d] = 0.0f;
  for (size_t j = 0; j < n; ++j) {
    const float w = scores[j] / sum;
    const float* vj = v[j];
    for (uint32_t d = 0; d < D; ++d) out[d] += w * (vj[d] - v_self[d]);
  }
  for (uint32_t d = 0; d < D; ++d) out[d] += v_self[d];
}

}  // namespace

Status WorldModelConfig::Validate() const {
  if (patch == 0 || width == 0 || height == 0 || width % patch || height % patch)
    return InvalidArgument("world model: width and height must be positive multiples of patch");
  if (pool == 0 || patch % pool) return InvalidArgument("world model: pool must divide patch");
  if (hidden == 0 || heads == 0 || hidden % heads) return InvalidArgument("world model: heads must divide hidden");
  if (layers == 0 || ffn == 0 || vocab < 2 || actions == 0 || window == 0)
    return InvalidArgument("world model: layers, ffn, actions, window must be > 0 and vocab >= 2");
  if (!(hysteresis >= 0)) return InvalidArgument("world model: hysteresis must be >= 0");
  return Status::Ok();
}

ModelSpec WorldModelConfig::Spec() const {
  ModelSpec m;
  m.model_id = model_id + "-s" + std::to_string(seed) + "-" + std::to_string(width) + "x" + std::to_string(height) +
               "p" + std::to_string(patch) + "-h" + std::to_string(hidden) + "-a" + std::to_string(heads) + "-l" +
               std::to_string(layers) + "-f" + std::to_string(ffn) + "-v" + std::to_string(vocab) + "-r" +
               std::to_string(spatial_radius) + "-q" + std::to_string(pool) +
               (codes ? "-c" + std::to_string(codes) + "-y" + std::to_string(static_cast<uint32_t>(hysteresis * 16))
                      : std::string()) +
               (input_kv ? "-e" : "");
  m.num_layers = 2 * layers + 1;
  m.num_kv_heads = heads;
  m.head_dim = head_dim();
  m.dtype = DType::kFp32;
  m.block_tokens = 1;
  m.num_experts = 0;
  return m;
}

uint64_t WorldModelConfig::Params() const {
  const uint64_t H = hidden, pp = pooled();
  const uint64_t per_layer = 8 * H * H + 3 * H * ffn + 3 * H;
  const uint64_t front = codes ? uint64_t{codes} * (pp + H) : H * pp;  // codebook and token embedding, or Win
  return front + uint64_t{num_patches()} * H + layers * per_layer + H + uint64_t{actions} * H + uint64_t{vocab} * H;
}

uint64_t WorldModelConfig::MacsPerPatch(uint32_t context) const {
  const uint64_t H = hidden, pp = uint64_t{patch / pool} * (patch / pool);
  const uint64_t side = std::min<uint64_t>(2 * spatial_radius + 1, width / patch);
  const uint64_t attn = 2 * H * (side * side + context);  // scores and weighted sums, both attentions
  return H * pp + layers * (8 * H * H + 3 * H * ffn + attn) + uint64_t{vocab} * H;
}

Result<std::shared_ptr<const WorldWeights>> WorldWeights::Generate(const WorldModelConfig& c) {
  KVMESH_RETURN_IF_ERROR(c.Validate());
  auto w = std::make_shared<WorldWeights>();
  w->config = c;
  const size_t H = c.hidden, pp = size_t{c.patch / c.pool} * (c.patch / c.pool);
  const float a_h = std::sqrt(3.0f / H);
  // Pixels in [-0.5, 0.5] have variance 1/12 at most: scale the input so a
  // token's embedding has a spread like the position embedding's.
  if (c.codes == 0) {
    FillUniform(w->patch_in, H * pp, c.seed, Tag(0xFFFF, 1), std::sqrt(3.0f / pp) * 3.0f);
  } else {
    // Codes uniform over the gray range; token embeddings with a spread like
    // the continuous front end's (std ~0.6).
    FillUniform(w->codebook, size_t{c.codes} * pp, c.seed, Tag(0xFFFF, 6), 127.5f);
    for (float& v : w->codebook) v += 127.5f;
    FillUniform(w->token_in, size_t{c.codes} * H, c.seed, Tag(0xFFFF, 7), 1.0f);
  }
  FillUniform(w->pos, size_t{c.num_patches()} * H, c.seed, Tag(0xFFFF, 2), 0.5f);
  FillUniform(w->final_norm, H, c.seed, Tag(0xFFFF, 3), 0.1f);
  for (float& g : w->final_norm) g += 1.0f;
  FillUniform(w->action, size_t{c.actions} * H, c.seed, Tag(0xFFFF, 4), 0.5f);
  FillUniform(w->head, size_t{c.vocab} * H, c.seed, Tag(0xFFFF, 5), std::sqrt(3.0f));
  w->layers.resize(c.layers);
  for (uint32_t l = 0; l < c.layers; ++l) {
    WorldWeights::Layer& L = w->layers[l];
    uint32_t t = 0;
    for (std::vector<float>* g : {&L.s_norm, &L.t_norm, &L.f_norm}) {
      FillUniform(*g, H, c.seed, Tag(l, ++t), 0.1f);
      for (float& x : *g) x += 1.0f;
    }
    for (std::vector<float>* m : {&L.s_wq, &L.s_wk, &L.s_wv, &L.s_wo, &L.t_wq, &L.t_wk, &L.t_wv, &L.t_wo})
      FillUniform(*m, H * H, c.seed, Tag(l, ++t), a_h);
    FillUniform(L.w1, size_t{c.ffn} * H, c.seed, Tag(l, ++t), a_h);
    FillUniform(L.w3, size_t{c.ffn} * H, c.seed, Tag(l, ++t), a_h);
    FillUniform(L.w2, H * c.ffn, c.seed, Tag(l, ++t), std::sqrt(3.0f / c.ffn));
  }
  return std::shared_ptr<const WorldWeights>(std::move(w));
}

WorldModel::WorldModel(std::shared_ptr<const WorldWeights> w) : w_(std::move(w)) {}

namespace {
// ComputeFrame's buffers, one set per thread and reused: a frame allocates
// nothing once its thread ran a frame of that shape (about 0.6 MB at 256
// patches were allocated and freed per frame, and partly faulted in again
// each time: 21% fewer page faults in a bench-serve world run without them).
struct FrameScratch {
  std::vector<uint32_t> comp, own_tokens;
  std::vector<const float*> src, kp, vp;
  std::vector<float> x, h, q, att, o, a1, a3, px, scores, x0, kv, z;
};
FrameScratch& Scratch() {
  thread_local FrameScratch s;
  return s;
}
}  // namespace

Status WorldModel::ComputeFrame(const WorldFrameInput& in, std::span<float> blocks, std::span<float> logits) const {
  const WorldModelConfig& c = w_->config;
  const uint32_t N = c.num_patches(), H = c.hidden, D = c.head_dim(), A = c.heads, P = c.patch, F = c.ffn;
  const size_t BF = c.BlockFloats();
  if (in.pixels.size() != size_t{c.width} * c.height || in.reused.size() != N || in.history.size() != N ||
      blocks.size() < N * BF || logits.size() < size_t{N} * c.vocab || in.action >= c.actions)
    return InvalidArgument("world model: frame inputs do not match the model's shape");
  // Offsets inside a block: kv layer j's K at j*2H, V at j*2H + H.
  auto K = [&](const float* b, uint32_t kvl) { return b + size_t{kvl} * 2 * H; };
  auto V = [&](const float* b, uint32_t kvl) { return b + size_t{kvl} * 2 * H + H; };
  // Selective refresh needs a second layer to measure the deviation at.
  // (With input_kv every reused patch's K and V are exact: nothing to refresh.)
  const bool blend = in.refresh_deviation > 0 && c.layers >= 2 && !c.input_kv;
  FrameScratch& sc = Scratch();
  std::vector<uint32_t>& comp = sc.comp;  // patches computed (with blend: in the first layer, every patch)
  comp.clear();
  std::vector<const float*>& src = sc.src;
  src.assign(N, nullptr);
  for (uint32_t p = 0; p < N; ++p) {
    src[p] = in.reused[p] && !blend ? in.reused[p] : blocks.data() + size_t{p} * BF;
    if (!in.reused[p] || blend) comp.push_back(p);
    if (in.refreshed) in.refreshed[p] = 0;
    if (in.deviation) in.deviation[p] = 0;
  }
  size_t C = comp.size();
  const uint32_t S = P / c.pool, GW = c.grid_w(), GH = c.height / P;
  std::vector<float> &x = sc.x, &h = sc.h, &q = sc.q, &att = sc.att, &o = sc.o, &a1 = sc.a1, &a3 = sc.a3,
                     &px = sc.px, &scores = sc.scores;
  for (std::vector<float>* v : {&x, &h, &q, &att, &o}) v->assign(C * H, 0.0f);
  a1.assign(C * F, 0.0f);
  a3.assign(C * F, 0.0f);
  px.assign(size_t{S} * S, 0.0f);
  scores.assign(std::max<size_t>(N, c.window) + 1, 0.0f);
  // Embedding: TokenEmbed[token] + pos, or (codes == 0) Win . (pool x pool means / 255 - 0.5) + pos.
  std::vector<uint32_t>& own_tokens = sc.own_tokens;
  std::span<const uint32_t> tokens = in.tokens;
  if (c.codes > 0 && tokens.size() != N) {
    own_tokens.resize(N);
    KVMESH_RETURN_IF_ERROR(Tokenize(in.pixels, {}, own_tokens));
    tokens = own_tokens;
  }
  const float inv_pool = 1.0f / (255.0f * static_cast<float>(c.pool * c.pool));
  for (size_t i = 0; i < C; ++i) {
    const uint32_t p = comp[i], gx = p % GW, gy = p / GW;
    if (c.codes > 0) {
      if (tokens[p] >= c.codes) return InvalidArgument("world model: token out of the codebook");
      for (uint32_t d = 0; d < H; ++d)
        x[i * H + d] = w_->token_in[size_t{tokens[p]} * H + d] + w_->pos[size_t{p} * H + d];
      continue;
    }
    for (uint32_t y = 0; y < S; ++y)
      for (uint32_t xx = 0; xx < S; ++xx) {
        uint32_t sum = 0;
        for (uint32_t dy = 0; dy < c.pool; ++dy)
          for (uint32_t dx = 0; dx < c.pool; ++dx)
            sum += in.pixels[(size_t{gy} * P + y * c.pool + dy) * c.width + size_t{gx} * P + xx * c.pool + dx];
        px[size_t{y} * S + xx] = static_cast<float>(sum) * inv_pool - 0.5f;
      }
    MatMul(w_->patch_in.data(), size_t{S} * S, H, size_t{S} * S, px.data(), size_t{S} * S, 1, x.data() + i * H, H);
    for (uint32_t d = 0; d < H; ++d) x[i * H + d] += w_->pos[size_t{p} * H + d];
  }
  std::vector<float>& x0 = sc.x0;  // the embeddings K and V come from (input_kv)
  if (c.input_kv) x0 = x;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<const float*> &kp = sc.kp, &vp = sc.vp;
  for (uint32_t l = 0; l < c.layers && C > 0; ++l) {
    const WorldWeights::Layer& L = w_->layers[l];
    if (blend && l == 1) {
      // CacheBlend's test at the second layer: the fresh spatial K and V of
      // each reused patch against its reused block's; the patches that moved
      // more than refresh_deviation go on through every layer, the others
      // drop out and keep their reused block (src) for the layers above.
      size_t kept = 0;
      std::vector<float>& kv = sc.kv;
      kv.assign(2 * size_t{H}, 0.0f);
      for (size_t i = 0; i < C; ++i) {
        const uint32_t p = comp[i];
        bool keep = in.reused[p] == nullptr;
        if (!keep) {
          RmsNorm(x.data() + i * H, L.s_norm.data(), H, h.data());
          MatMul(L.s_wk.data(), H, H, H, h.data(), H, 1, kv.data(), H);
          MatMul(L.s_wv.data(), H, H, H, h.data(), H, 1, kv.data() + H, H);
          const float* old = in.reused[p] + size_t{2} * 2 * H;  // kv layer 2: layer 1's spatial K, V
          double d = 0, r = 0;
          for (size_t e = 0; e < 2 * size_t{H}; ++e) {
            d += double(kv[e] - old[e]) * double(kv[e] - old[e]);
            r += double(old[e]) * old[e];
          }
          const float dev = static_cast<float>(std::sqrt(d / std::max(r, 1e-30)));
          if (in.deviation) in.deviation[p] = dev;
          keep = dev > in.refresh_deviation;
          if (keep && in.refreshed) in.refreshed[p] = 1;
          if (!keep) src[p] = in.reused[p];
        }
        if (!keep) continue;
        if (kept != i) std::memmove(x.data() + kept * H, x.data() + i * H, H * sizeof(float));
        comp[kept++] = p;
      }
      comp.resize(kept);
      C = kept;
      if (C == 0) break;
    }
    const uint32_t ls = 2 * l, lt = 2 * l + 1;
    // h = RMSNorm(x); q = Wq h; K and V of kv layer kvl into each computed patch's block.
    auto project = [&](const std::vector<float>& norm, const std::vector<float>& wq, const std::vector<float>& wk,
                       const std::vector<float>& wv, uint32_t kvl) {
      for (size_t i = 0; i < C; ++i) RmsNorm(x.data() + i * H, norm.data(), H, h.data() + i * H);
      MatMul(wq.data(), H, H, H, h.data(), H, C, q.data(), H);
      if (c.input_kv)  // K and V from the layer-normed embedding instead of the layer's input
        for (size_t i = 0; i < C; ++i) RmsNorm(x0.data() + i * H, norm.data(), H, h.data() + i * H);
      for (size_t i = 0; i < C; ++i) {
        float* b = blocks.data() + size_t{comp[i]} * BF;
        MatMul(wk.data(), H, H, H, h.data() + i * H, H, 1, b + size_t{kvl} * 2 * H, H);
        MatMul(wv.data(), H, H, H, h.data() + i * H, H, 1, b + size_t{kvl} * 2 * H + H, H);
      }
    };
    // x += Wo att.
    auto residual = [&](const std::vector<float>& wo) {
      MatMul(wo.data(), H, H, H, att.data(), H, C, o.data(), H);
      for (size_t e = 0; e < C * H; ++e) x[e] += o[e];
    };
    // Spatial attention over the neighbourhood (reused patches bring their K, V).
    project(L.s_norm, L.s_wq, L.s_wk, L.s_wv, ls);
    const int32_t R = static_cast<int32_t>(c.spatial_radius);
    for (size_t i = 0; i < C; ++i) {
      const uint32_t p = comp[i];
      const int32_t px0 = static_cast<int32_t>(p % GW), py0 = static_cast<int32_t>(p / GW);
      const float* self = src[p];
      for (uint32_t a = 0; a < A; ++a) {
        kp.clear();
        vp.clear();
        for (int32_t y = std::max(0, py0 - R); y <= std::min(int32_t(GH) - 1, py0 + R); ++y)
          for (int32_t xx = std::max(0, px0 - R); xx <= std::min(int32_t(GW) - 1, px0 + R); ++xx) {
            const float* b = src[size_t(y) * GW + size_t(xx)];
            kp.push_back(K(b, ls) + a * D);
            vp.push_back(V(b, ls) + a * D);
          }
        Attend(q.data() + i * H + a * D, kp.data(), vp.data(), kp.size(), V(self, ls) + a * D, D, scale,
               scores.data(), att.data() + i * H + a * D);
      }
    }
    residual(L.s_wo);
    // Temporal attention at each patch position over the window.
    project(L.t_norm, L.t_wq, L.t_wk, L.t_wv, lt);
    for (size_t i = 0; i < C; ++i) {
      const uint32_t p = comp[i];
      const std::vector<const float*>& hist = in.history[p];
      const size_t keep = std::min<size_t>(hist.size(), c.window - 1);
      const float* self = src[p];
      for (uint32_t a = 0; a < A; ++a) {
        kp.clear();
        vp.clear();
        for (size_t j = hist.size() - keep; j < hist.size(); ++j) {
          kp.push_back(K(hist[j], lt) + a * D);
          vp.push_back(V(hist[j], lt) + a * D);
        }
        kp.push_back(K(self, lt) + a * D);
        vp.push_back(V(self, lt) + a * D);
        Attend(q.data() + i * H + a * D, kp.data(), vp.data(), kp.size(), V(self, lt) + a * D, D, scale,
               scores.data(), att.data() + i * H + a * D);
      }
    }
    residual(L.t_wo);
    // FFN (SwiGLU).
    for (size_t i = 0; i < C; ++i) RmsNorm(x.data() + i * H, L.f_norm.data(), H, h.data() + i * H);
    MatMul(L.w1.data(), H, F, H, h.data(), H, C, a1.data(), F);
    MatMul(L.w3.data(), H, F, H, h.data(), H, C, a3.data(), F);
    for (size_t e = 0; e < C * F; ++e) a1[e] = Silu(a1[e]) * a3[e];
    MatMul(L.w2.data(), F, H, F, a1.data(), F, C, o.data(), H);
    for (size_t e = 0; e < C * H; ++e) x[e] += o[e];
  }
  // The output kv layer: RMSNorm(x) and x.
  const uint32_t lo = 2 * c.layers;
  for (size_t i = 0; i < C; ++i) {
    float* b = blocks.data() + size_t{comp[i]} * BF;
    RmsNorm(x.data() + i * H, w_->final_norm.data(), H, b + size_t{lo} * 2 * H);
    std::memcpy(b + size_t{lo} * 2 * H + H, x.data() + i * H, H * sizeof(float));
  }
  // Logits of every patch from its output state and the action.
  std::vector<float>& z = sc.z;
  z.assign(size_t{N} * H, 0.0f);
  for (uint32_t p = 0; p < N; ++p) {
    const float* hn = K(src[p], lo);
    for (uint32_t d = 0; d < H; ++d) z[size_t{p} * H + d] = hn[d] + w_->action[size_t{in.action} * H + d];
  }
  MatMul(w_->head.data(), H, c.vocab, H, z.data(), H, N, logits.data(), c.vocab);
  const float ls = 4.0f / std::sqrt(static_cast<float>(H));
  for (size_t e = 0; e < size_t{N} * c.vocab; ++e) logits[e] *= ls;
  return Status::Ok();
}

Status WorldModel::Tokenize(std::span<const uint8_t> pixels, std::span<const uint32_t> previous,
                            std::span<uint32_t> out) const {
  const WorldModelConfig& c = w_->config;
  const uint32_t N = c.num_patches(), P = c.patch, S = P / c.pool, GW = c.grid_w(), pp = c.pooled();
  if (pixels.size() != size_t{c.width} * c.height || out.size() != N || (!previous.empty() && previous.size() != N))
    return InvalidArgument("world model: Tokenize inputs do not match the model's shape");
  std::vector<uint32_t> sums(pp);
  std::vector<float> f(pp);
  const float inv = 1.0f / static_cast<float>(c.pool * c.pool);
  for (uint32_t p = 0; p < N; ++p) {
    const uint32_t gx = p % GW, gy = p / GW;
    for (uint32_t y = 0; y < S; ++y)
      for (uint32_t xx = 0; xx < S; ++xx) {
        uint32_t sum = 0;
        for (uint32_t dy = 0; dy < c.pool; ++dy)
          for (uint32_t dx = 0; dx < c.pool; ++dx)
            sum += pixels[(size_t{gy} * P + y * c.pool + dy) * c.width + size_t{gx} * P + xx * c.pool + dx];
        sums[size_t{y} * S + xx] = sum;
        f[size_t{y} * S + xx] = static_cast<float>(sum) * inv;
      }
    if (c.codes == 0) {
      uint64_t h = Mix64(0x746F6B656E);
      for (uint32_t v : sums) h = Mix64(h ^ v);
      out[p] = static_cast<uint32_t>(h);
      continue;
    }
    float best = INFINITY;
    uint32_t arg = 0;
    for (uint32_t k = 0; k < c.codes; ++k) {
      const float* code = w_->codebook.data() + size_t{k} * pp;
      float d2 = 0;
      for (uint32_t e = 0; e < pp; ++e) d2 += (f[e] - code[e]) * (f[e] - code[e]);
      if (d2 < best) {
        best = d2;
        arg = k;
      }
    }
    out[p] = arg;
    if (previous.empty() || previous[p] >= c.codes || previous[p] == arg) continue;
    const float* code = w_->codebook.data() + size_t{previous[p]} * pp;
    float d2 = 0;
    for (uint32_t e = 0; e < pp; ++e) d2 += (f[e] - code[e]) * (f[e] - code[e]);
    if (std::sqrt(d2) <= std::sqrt(best) + c.hysteresis) out[p] = previous[p];
  }
  return Status::Ok();
}

void WorldModel::Signatures(std::span<const uint32_t> tokens, std::span<const uint64_t* const> history,
                            std::span<uint64_t> temporal_out, std::span<uint64_t> block_out) const {
  const WorldModelConfig& c = w_->config;
  const uint32_t N = c.num_patches(), L = c.layers, GW = c.grid_w(), GH = c.height / c.patch;
  const int32_t R = static_cast<int32_t>(c.spatial_radius);
  const size_t keep = std::min<size_t>(history.size(), c.window - 1);
  // a: the state entering a layer; b: after spatial attention (what the
  // layer's temporal K and V are made from, and what temporal_out records).
  // input_kv: every K and V of a patch is a function of its token and
  // position, e (the same for every layer); a still carries the query path.
  std::vector<uint64_t> a(N), b(N), e(N), hist;
  for (uint32_t p = 0; p < N; ++p) a[p] = e[p] = Mix64(Mix64(0x5749474E ^ tokens[p]) ^ p);
  // Spatial attention of p at layer l over the neighbours' K and V (made from kv).
  auto spatial = [&](uint32_t p, uint32_t l, const std::vector<uint64_t>& kv) {
    const int32_t px0 = static_cast<int32_t>(p % GW), py0 = static_cast<int32_t>(p / GW);
    uint64_t h = Mix64(a[p] ^ (uint64_t{l} << 48));
    for (int32_t y = std::max(0, py0 - R); y <= std::min(int32_t(GH) - 1, py0 + R); ++y)
      for (int32_t xx = std::max(0, px0 - R); xx <= std::min(int32_t(GW) - 1, px0 + R); ++xx)
        h = Mix64(h ^ kv[size_t(y) * GW + size_t(xx)]);
    return h;
  };
  // Temporal attention of p at layer l: state h, own entry self, the history.
  auto temporal = [&](uint32_t p, uint32_t l, uint64_t h, uint64_t self) {
    hist.clear();
    for (size_t j = history.size() - keep; j < history.size(); ++j) hist.push_back(history[j][size_t{p} * L + l]);
    // A history of copies of the patch's own entry adds exactly nothing
    // (Attend: out = v_self + sum w_j (v_j - v_self)): the same as none.
    if (std::all_of(hist.begin(), hist.end(), [&](uint64_t v) { return v == self; })) hist.clear();
    std::sort(hist.begin(), hist.end());
    h = Mix64(h ^ 0x54454D50);
    for (uint64_t v : hist) h = Mix64(h ^ v);
    return h;  // the FFN is per patch: the next layer's input is determined by this
  };
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t p = 0; p < N; ++p) {
      b[p] = spatial(p, l, c.input_kv ? e : a);
      temporal_out[size_t{p} * L + l] = c.input_kv ? e[p] : b[p];
    }
    for (uint32_t p = 0; p < N; ++p) a[p] = temporal(p, l, b[p], temporal_out[size_t{p} * L + l]);
  }
  for (uint32_t p = 0; p < N; ++p) block_out[p] = a[p];
}

std::vector<uint32_t> PredictedTokens(std::span<const float> logits, uint32_t vocab) {
  std::vector<uint32_t> out(logits.size() / vocab);
  for (size_t p = 0; p < out.size(); ++p) {
    const float* l = logits.data() + p * vocab;
    out[p] = static_cast<uint32_t>(std::max_element(l, l + vocab) - l);
  }
  return out;
}

}  // namespace kvmesh::decode
