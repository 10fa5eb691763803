// coordinator/decode/cuda/model_cuda.cc — CudaReferenceModel (model_cuda.h) on the
// kernels of coordinator/decode/cuda/model_ops.h. Host code only (built by the C++
// compiler against the CUDA runtime).
//
// Device layout: one arena holds every weight tensor; a sequence holds its K
// and V as [layer][max_positions][kv_heads*head_dim]; scratch for one chunk of
// kChunk rows is reserved at Create, so Feed allocates nothing on the device.
#include "coordinator/decode/cuda/model_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_status.h"
#include "coordinator/decode/cuda/model_ops.h"

namespace kvmesh::decode {
namespace ops = kernels::cuda;

namespace {

constexpr uint32_t kChunk = 64;  // prompt rows per forward

template <typename T>
Status Alloc(T** p, size_t n) {
  void* raw = nullptr;
  KVMESH_CUDA_RETURN(cudaMalloc(&raw, std::max<size_t>(n, 1) * sizeof(T)));
  *p = static_cast<T*>(raw);
  return Status::Ok();
}

}  // namespace

Status CudaDeviceStatus() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return Unavailable(std::string("no CUDA device: ") + cudaGetErrorString(e));
  if (n == 0) return Unavailable("no CUDA device");
  return Status::Ok();
}

struct CudaReferenceModel::Impl {
  struct Layer {
    const float *attn_norm, *ffn_norm, *wq, *wk, *wv, *wo, *gate;
    std::vector<const float*> w1, w2, w3;
  };
  struct Seq {
    float* k = nullptr;
    float* v = nullptr;
    uint32_t len = 0;
    bool live = false;
  };

  std::shared_ptr<const Weights> w;
  uint32_t max_pos = 0;
  size_t kvw = 0;  // floats of one position's K (or V) in one layer
  cudaStream_t stream = nullptr;
  float* arena = nullptr;
  const float *embed = nullptr, *lm_head = nullptr, *final_norm = nullptr;
  std::vector<Layer> layers;
  std::vector<Seq> seqs;
  // Device scratch for kChunk rows.
  float *x = nullptr, *hn = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr, *o = nullptr,
        *f = nullptr, *a1 = nullptr, *a3 = nullptr, *g = nullptr, *tmp = nullptr, *cs = nullptr, *scores = nullptr,
        *logits = nullptr, *wts = nullptr;
  uint32_t *tok = nullptr, *idx = nullptr;
  // Host staging, reused.
  std::vector<float> h_cs, h_g, h_w, h_logits;
  std::vector<uint32_t> h_tok, h_idx, h_topk;
  std::vector<float> h_topw;

  std::vector<void*> owned;  // the arena and the scratch buffers, freed with the model

  // cudaMalloc of n T's, freed by ~Impl.
  template <typename T>
  Status Own(T** p, size_t n) {
    KVMESH_RETURN_IF_ERROR(Alloc(p, n));
    owned.push_back(*p);
    return Status::Ok();
  }

  ~Impl() {
    for (Seq& s : seqs) {
      cudaFree(s.k);
      cudaFree(s.v);
    }
    for (void* p : owned) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
  }

  Status Upload() {
    const ModelConfig& c = w->config;
    size_t total = w->embed.size() + w->lm_head.size() + w->final_norm.size();
    for (const LayerWeights& L : w->layers) {
      total += L.attn_norm.size() + L.ffn_norm.size() + L.wq.size() + L.wk.size() + L.wv.size() + L.wo.size() +
               L.gate.size();
      for (size_t e = 0; e < L.w1.size(); ++e) total += L.w1[e].size() + L.w2[e].size() + L.w3[e].size();
    }
    KVMESH_RETURN_IF_ERROR(Own(&arena, total));
    size_t at = 0;
    std::vector<float> host;  // one staging copy, so a single H2D transfer
    host.reserve(total);
    auto put = [&](const std::vector<float>& t) {
      const float* p = arena + at;
      host.insert(host.end(), t.begin(), t.end());
      at += t.size();
      return p;
    };
    embed = put(w->embed);
    lm_head = put(w->lm_head);
    final_norm = put(w->final_norm);
    layers.resize(c.layers);
    for (uint32_t l = 0; l < c.layers; ++l) {
      const LayerWeights& L = w->layers[l];
      Layer& d = layers[l];
      d.attn_norm = put(L.attn_norm);
      d.ffn_norm = put(L.ffn_norm);
      d.wq = put(L.wq);
      d.wk = put(L.wk);
      d.wv = put(L.wv);
      d.wo = put(L.wo);
      d.gate = put(L.gate);
      for (size_t e = 0; e < L.w1.size(); ++e) {
        d.w1.push_back(put(L.w1[e]));
        d.w2.push_back(put(L.w2[e]));
        d.w3.push_back(put(L.w3[e]));
      }
    }
    KVMESH_CUDA_RETURN(cudaMemcpy(arena, host.data(), total * sizeof(float), cudaMemcpyHostToDevice));
    return Status::Ok();
  }

  Status Reserve() {
    const ModelConfig& c = w->config;
    const size_t R = kChunk, H = c.hidden, QD = size_t{c.q_heads} * c.head_dim, KVD = kvw;
    const size_t E = std::max<uint32_t>(c.experts, 1);
    KVMESH_RETURN_IF_ERROR(Own(&x, R * H));
    KVMESH_RETURN_IF_ERROR(Own(&hn, R * H));
    KVMESH_RETURN_IF_ERROR(Own(&q, R * QD));
    KVMESH_RETURN_IF_ERROR(Own(&k, R * KVD));
    KVMESH_RETURN_IF_ERROR(Own(&v, R * KVD));
    KVMESH_RETURN_IF_ERROR(Own(&att, R * QD));
    KVMESH_RETURN_IF_ERROR(Own(&o, R * H));
    KVMESH_RETURN_IF_ERROR(Own(&f, R * H));
    KVMESH_RETURN_IF_ERROR(Own(&a1, R * c.ffn));
    KVMESH_RETURN_IF_ERROR(Own(&a3, R * c.ffn));
    KVMESH_RETURN_IF_ERROR(Own(&g, R * E));
    KVMESH_RETURN_IF_ERROR(Own(&tmp, R * H));
    KVMESH_RETURN_IF_ERROR(Own(&cs, R * c.head_dim));
    KVMESH_RETURN_IF_ERROR(Own(&scores, R * c.q_heads * size_t{max_pos}));
    KVMESH_RETURN_IF_ERROR(Own(&logits, c.vocab));
    // Expert routing of one layer: every (slot, row) once.
    KVMESH_RETURN_IF_ERROR(Own(&wts, R * std::max<uint32_t>(c.top_k, 1)));
    KVMESH_RETURN_IF_ERROR(Own(&idx, R * std::max<uint32_t>(c.top_k, 1)));
    KVMESH_RETURN_IF_ERROR(Own(&tok, R));
    return Status::Ok();
  }

  Status Check(int seq) const {
    if (seq < 0 || static_cast<size_t>(seq) >= seqs.size() || !seqs[seq].live)
      return InvalidArgument("no such CUDA sequence " + std::to_string(seq));
    return Status::Ok();
  }

  Result<int> NewSeq() {
    const size_t n = w->config.layers * size_t{max_pos} * kvw;
    Seq s;
    KVMESH_RETURN_IF_ERROR(Alloc(&s.k, n));
    if (Status st = Alloc(&s.v, n); !st.ok()) {
      cudaFree(s.k);
      return st;
    }
    s.live = true;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (!seqs[i].live) {
        seqs[i] = s;
        return static_cast<int>(i);
      }
    seqs.push_back(s);
    return static_cast<int>(seqs.size() - 1);
  }

  // One forward of n <= kChunk rows at the end of s; logits of the last row
  // into h_logits when want_logits.
  Status Forward(Seq& s, std::span<const TokenId> toks, bool want_logits) {
    const ModelConfig& c = w->config;
    const uint32_t H = c.hidden, D = c.head_dim, Q = c.q_heads, KV = c.kv_heads, F = c.ffn;
    const size_t n = toks.size(), QD = size_t{Q} * D, half = D / 2;
    const uint32_t pos0 = s.len;
    if (pos0 + n > max_pos)
      return ResourceExhausted("CUDA sequence would exceed " + std::to_string(max_pos) + " positions");
    h_tok.resize(n);
    for (size_t r = 0; r < n; ++r) h_tok[r] = static_cast<uint32_t>(toks[r]);  // checked by Feed
    h_cs.resize(n * D);
    for (size_t r = 0; r < n; ++r)
      for (uint32_t i = 0; i < half; ++i)
        RopeAngle(D, pos0 + static_cast<uint32_t>(r), i, c.rope_theta, &h_cs[r * D + 2 * i], &h_cs[r * D + 2 * i + 1]);
    cudaStream_t st = stream;
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(tok, h_tok.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice, st));
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(cs, h_cs.data(), n * D * sizeof(float), cudaMemcpyHostToDevice, st));
    KVMESH_CUDA_RETURN(ops::GatherRows(embed, tok, n, H, x, st));
    for (uint32_t l = 0; l < c.layers; ++l) {
      const Layer& L = layers[l];
      float* kc = s.k + size_t{l} * max_pos * kvw;
      float* vc = s.v + size_t{l} * max_pos * kvw;
      KVMESH_CUDA_RETURN(ops::RmsNorm(x, L.attn_norm, H, n, hn, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.wq, H, QD, H, hn, H, n, q, QD, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.wk, H, kvw, H, hn, H, n, k, kvw, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.wv, H, kvw, H, hn, H, n, v, kvw, st));
      KVMESH_CUDA_RETURN(ops::Rope(q, n, Q, D, cs, st));
      KVMESH_CUDA_RETURN(ops::Rope(k, n, KV, D, cs, st));
      KVMESH_CUDA_RETURN(
          cudaMemcpyAsync(kc + size_t{pos0} * kvw, k, n * kvw * sizeof(float), cudaMemcpyDeviceToDevice, st));
      KVMESH_CUDA_RETURN(
          cudaMemcpyAsync(vc + size_t{pos0} * kvw, v, n * kvw * sizeof(float), cudaMemcpyDeviceToDevice, st));
      KVMESH_CUDA_RETURN(ops::Attention(q, kc, vc, n, pos0, Q, KV, D, scores, att, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.wo, QD, H, QD, att, QD, n, o, H, st));
      KVMESH_CUDA_RETURN(ops::Axpy(1.0f, o, x, n * H, st));
      KVMESH_CUDA_RETURN(ops::RmsNorm(x, L.ffn_norm, H, n, hn, st));
      if (c.experts == 0) {
        // The reference adds 1.0f * FFN into a zeroed f, then f into x: the same bits as adding FFN.
        KVMESH_CUDA_RETURN(ops::MatMul(L.w1[0], H, F, H, hn, H, n, a1, F, st));
        KVMESH_CUDA_RETURN(ops::MatMul(L.w3[0], H, F, H, hn, H, n, a3, F, st));
        KVMESH_CUDA_RETURN(ops::SwiGlu(a1, a3, n * F, st));
        KVMESH_CUDA_RETURN(ops::MatMul(L.w2[0], F, H, F, a1, F, n, o, H, st));
        KVMESH_CUDA_RETURN(ops::Axpy(1.0f, o, x, n * H, st));
      } else {
        KVMESH_RETURN_IF_ERROR(Moe(L, n));
      }
    }
    s.len = pos0 + static_cast<uint32_t>(n);
    if (want_logits) {
      KVMESH_CUDA_RETURN(ops::RmsNorm(x + (n - 1) * H, final_norm, H, 1, hn, st));
      KVMESH_CUDA_RETURN(ops::MatMul(lm_head, H, c.vocab, H, hn, H, 1, logits, c.vocab, st));
      KVMESH_CUDA_RETURN(ops::Scale(LogitScale(c), logits, c.vocab, st));
      h_logits.resize(c.vocab);
      KVMESH_CUDA_RETURN(cudaMemcpyAsync(h_logits.data(), logits, c.vocab * sizeof(float), cudaMemcpyDeviceToHost, st));
    }
    KVMESH_CUDA_RETURN(cudaStreamSynchronize(st));
    return Status::Ok();
  }

  // x += MoE(hn) for n rows. Gate logits come to the host, which picks the
  // experts with the CPU's TopK; then per top-k slot j (the reference's
  // accumulation order) and expert e, the rows routed to e at slot j run
  // together and are added into f with their weights.
  Status Moe(const Layer& L, size_t n) {
    const ModelConfig& c = w->config;
    const uint32_t H = c.hidden, F = c.ffn, E = c.experts, K = c.top_k;
    cudaStream_t st = stream;
    KVMESH_CUDA_RETURN(ops::MatMul(L.gate, H, E, H, hn, H, n, g, E, st));
    h_g.resize(n * E);
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(h_g.data(), g, n * E * sizeof(float), cudaMemcpyDeviceToHost, st));
    KVMESH_CUDA_RETURN(cudaStreamSynchronize(st));
    h_topk.resize(n * K);
    h_topw.resize(n * K);
    for (size_t r = 0; r < n; ++r) TopK(h_g.data() + r * E, E, K, h_topk.data() + r * K, h_topw.data() + r * K);
    // Groups (j, e) laid out one after another: rows in h_idx, weights in h_w.
    struct Group {
      uint32_t e;
      size_t at, m;
    };
    std::vector<Group> groups;
    h_idx.clear();
    h_w.clear();
    for (uint32_t j = 0; j < K; ++j)
      for (uint32_t e = 0; e < E; ++e) {
        const size_t at = h_idx.size();
        for (size_t r = 0; r < n; ++r)
          if (h_topk[r * K + j] == e) {
            h_idx.push_back(static_cast<uint32_t>(r));
            h_w.push_back(h_topw[r * K + j]);
          }
        if (h_idx.size() > at) groups.push_back({e, at, h_idx.size() - at});
      }
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(idx, h_idx.data(), h_idx.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, st));
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(wts, h_w.data(), h_w.size() * sizeof(float), cudaMemcpyHostToDevice, st));
    KVMESH_CUDA_RETURN(cudaMemsetAsync(f, 0, n * H * sizeof(float), st));
    for (const Group& gr : groups) {
      KVMESH_CUDA_RETURN(ops::GatherRows(hn, idx + gr.at, gr.m, H, tmp, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.w1[gr.e], H, F, H, tmp, H, gr.m, a1, F, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.w3[gr.e], H, F, H, tmp, H, gr.m, a3, F, st));
      KVMESH_CUDA_RETURN(ops::SwiGlu(a1, a3, gr.m * F, st));
      KVMESH_CUDA_RETURN(ops::MatMul(L.w2[gr.e], F, H, F, a1, F, gr.m, o, H, st));
      KVMESH_CUDA_RETURN(ops::ScatterAxpyRows(o, idx + gr.at, wts + gr.at, gr.m, H, f, st));
    }
    KVMESH_CUDA_RETURN(ops::Axpy(1.0f, f, x, n * H, st));
    return Status::Ok();
  }
};

CudaReferenceModel::CudaReferenceModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaReferenceModel::~CudaReferenceModel() = default;

Result<std::unique_ptr<CudaReferenceModel>> CudaReferenceModel::Create(std::shared_ptr<const Weights> w,
                                                                       uint32_t max_positions) {
  if (!w) return InvalidArgument("CUDA model: no weights");
  KVMESH_RETURN_IF_ERROR(w->config.Validate());
  if (max_positions == 0) return InvalidArgument("CUDA model: max_positions must be > 0");
  KVMESH_RETURN_IF_ERROR(CudaDeviceStatus());
  auto impl = std::make_unique<Impl>();
  impl->w = std::move(w);
  impl->max_pos = max_positions;
  impl->kvw = size_t{impl->w->config.kv_heads} * impl->w->config.head_dim;
  KVMESH_CUDA_RETURN(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  KVMESH_RETURN_IF_ERROR(impl->Upload());
  KVMESH_RETURN_IF_ERROR(impl->Reserve());
  return std::unique_ptr<CudaReferenceModel>(new CudaReferenceModel(std::move(impl)));
}

Result<int> CudaReferenceModel::NewSequence() { return impl_->NewSeq(); }

Result<int> CudaReferenceModel::Fork(int seq) {
  KVMESH_RETURN_IF_ERROR(impl_->Check(seq));
  KVMESH_ASSIGN_OR_RETURN(const int child, impl_->NewSeq());
  Impl::Seq& from = impl_->seqs[seq];
  Impl::Seq& to = impl_->seqs[child];
  const size_t layer = size_t{impl_->max_pos} * impl_->kvw, rows = size_t{from.len} * impl_->kvw;
  for (uint32_t l = 0; l < impl_->w->config.layers; ++l) {
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(to.k + l * layer, from.k + l * layer, rows * sizeof(float),
                                       cudaMemcpyDeviceToDevice, impl_->stream));
    KVMESH_CUDA_RETURN(cudaMemcpyAsync(to.v + l * layer, from.v + l * layer, rows * sizeof(float),
                                       cudaMemcpyDeviceToDevice, impl_->stream));
  }
  KVMESH_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  to.len = from.len;
  return child;
}

Status CudaReferenceModel::Truncate(int seq, uint32_t n) {
  KVMESH_RETURN_IF_ERROR(impl_->Check(seq));
  Impl::Seq& s = impl_->seqs[seq];
  if (n > s.len) return InvalidArgument("truncate past the start of the sequence");
  s.len -= n;  // rows past len are overwritten by the next Feed
  return Status::Ok();
}

Status CudaReferenceModel::Release(int seq) {
  KVMESH_RETURN_IF_ERROR(impl_->Check(seq));
  Impl::Seq& s = impl_->seqs[seq];
  KVMESH_CUDA_RETURN(cudaStreamSynchronize(impl_->stream));
  cudaFree(s.k);
  cudaFree(s.v);
  s = Impl::Seq{};
  return Status::Ok();
}

uint32_t CudaReferenceModel::Length(int seq) const { return impl_->Check(seq).ok() ? impl_->seqs[seq].len : 0; }

Result<std::vector<float>> CudaReferenceModel::Feed(int seq, std::span<const TokenId> tokens) {
  KVMESH_RETURN_IF_ERROR(impl_->Check(seq));
  if (tokens.empty()) return InvalidArgument("Feed without tokens");
  for (TokenId t : tokens)  // all checked before any chunk runs: a bad token feeds nothing
    if (t < 0 || static_cast<uint32_t>(t) >= impl_->w->config.vocab)
      return InvalidArgument("token outside the vocabulary");
  Impl::Seq& s = impl_->seqs[seq];
  if (s.len + tokens.size() > impl_->max_pos)
    return ResourceExhausted("CUDA sequence would exceed " + std::to_string(impl_->max_pos) + " positions");
  for (size_t at = 0; at < tokens.size(); at += kChunk) {
    const size_t n = std::min<size_t>(kChunk, tokens.size() - at);
    KVMESH_RETURN_IF_ERROR(impl_->Forward(s, tokens.subspan(at, n), at + n == tokens.size()));
  }
  return impl_->h_logits;
}

}  // namespace kvmesh::decode
