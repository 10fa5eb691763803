// gpu_model_test: the reference model on the GPU (coordinator/decode/cuda/model_cuda.h)
// against the CPU reference (ReferenceModel), and its kernels against the
// CPU functions they mirror.
//
// 1. Ops, on random data (seed from the clock unless --seed N; printed):
//    MatMul, RmsNorm and RoPE must equal the CPU's bytes (odd sizes, strides,
//    batches); attention and SwiGLU, which use expf, within 1e-5 relative.
// 2. Models (dense, MoE, GQA and MQA shapes; hidden sizes that are not a
//    multiple of 8): a prompt longer than two 64-row chunks, then teacher-forced
//    greedy decode, a fork, a truncate and a re-feed on both models; every
//    logits vector compared. Stated tolerance: relative L2 <= 1e-4, worst
//    element <= 1e-3 of the largest |logit|, and the same greedy token unless the
//    CPU's top two are within 1e-4 of each other.
// 3. Errors: a bad token and a sequence past max_positions are refused and
//    feed nothing.
// Exit 0 on success, 1 on a mismatch. Without a GPU: "SKIP: no GPU", exit 0.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "coordinator/decode/model.h"
#include "coordinator/decode/cuda/model_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "coordinator/decode/cuda/model_ops.h"

using namespace kvmesh;
using namespace kvmesh::decode;
namespace ops = kvmesh::kernels::cuda;


namespace {

int failures = 0;

void Fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  ++failures;
}

struct Dev {
  float* p = nullptr;
  explicit Dev(const std::vector<float>& h) {
    CUDA_OK(cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(float)));
    CUDA_OK(cudaMemcpy(p, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t n) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float))); }
  ~Dev() { cudaFree(p); }
  std::vector<float> Get(size_t n) const {
    std::vector<float> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<float> Random(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) * scale;
  return v;
}

bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double MaxRel(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, amax = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    amax = std::max(amax, std::abs(double(a[i])));
  }
  return worst / amax;
}

void TestOps(std::mt19937_64& rng) {
  // MatMul: odd sizes, padded leading dimensions, several batches.
  for (size_t cols : {1u, 7u, 8u, 133u, 1024u})
    for (size_t batch : {1u, 5u, 64u}) {
      const size_t rows = 37, ldw = cols + 3, ldx = cols + 1, ldy = rows + 2;
      std::vector<float> W = Random(rows * ldw, rng), x = Random(batch * ldx, rng), y(batch * ldy, 0.0f);
      Dev dW(W), dx(x), dy(y);
      CUDA_OK(ops::MatMul(dW.p, ldw, rows, cols, dx.p, ldx, batch, dy.p, ldy, nullptr));
      MatMul(W.data(), ldw, rows, cols, x.data(), ldx, batch, y.data(), ldy);
      if (!SameBytes(dy.Get(y.size()), y))
        Fail("MatMul bytes differ (cols " + std::to_string(cols) + ", batch " + std::to_string(batch) + ")");
    }
  // RmsNorm.
  for (size_t n : {3u, 64u, 133u}) {
    const size_t rows = 9;
    std::vector<float> x = Random(rows * n, rng, 3.0f), gain = Random(n, rng), out(rows * n);
    Dev dx(x), dg(gain), dout(out.size());
    CUDA_OK(ops::RmsNorm(dx.p, dg.p, n, rows, dout.p, nullptr));
    for (size_t r = 0; r < rows; ++r) RmsNorm(x.data() + r * n, gain.data(), n, out.data() + r * n);
    if (!SameBytes(dout.Get(out.size()), out)) Fail("RmsNorm bytes differ (n " + std::to_string(n) + ")");
  }
  // RoPE at scattered positions.
  {
    const uint32_t heads = 3, dim = 48;
    const size_t rows = 6;
    const uint32_t pos[rows] = {0, 1, 17, 255, 1000, 4095};
    std::vector<float> v = Random(rows * heads * dim, rng), cs(rows * dim);
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t i = 0; i < dim / 2; ++i)
        RopeAngle(dim, pos[r], i, 10000.0f, &cs[r * dim + 2 * i], &cs[r * dim + 2 * i + 1]);
    Dev dv(v), dcs(cs);
    CUDA_OK(ops::Rope(dv.p, rows, heads, dim, dcs.p, nullptr));
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t h = 0; h < heads; ++h) Rope(v.data() + (r * heads + h) * dim, dim, pos[r], 10000.0f);
    if (!SameBytes(dv.Get(v.size()), v)) Fail("RoPE bytes differ");
  }
  // Attention (GQA 6 query heads over 2 KV heads), 4 rows after 300 cached positions.
  {
    const uint32_t Q = 6, KV = 2, D = 40, pos0 = 300;
    const size_t rows = 4, P = pos0 + rows;
    std::vector<float> q = Random(rows * Q * D, rng), k = Random(P * KV * D, rng), v = Random(P * KV * D, rng);
    Dev dq(q), dk(k), dv(v), dscr(rows * Q * P), dout(rows * Q * D);
    CUDA_OK(ops::Attention(dq.p, dk.p, dv.p, rows, pos0, Q, KV, D, dscr.p, dout.p, nullptr));
    std::vector<float> want(rows * Q * D, 0.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    for (size_t r = 0; r < rows; ++r)
      for (uint32_t i = 0; i < Q; ++i) {
        const uint32_t kvh = i / (Q / KV), n = pos0 + static_cast<uint32_t>(r) + 1;
        std::vector<float> s(n);
        float mx = -INFINITY, sum = 0;
        for (uint32_t p = 0; p < n; ++p)
          mx = std::max(mx, s[p] = Dot(&q[(r * Q + i) * D], &k[(p * KV + kvh) * D], D) * scale);
        for (uint32_t p = 0; p < n; ++p) sum += s[p] = std::exp(s[p] - mx);
        for (uint32_t p = 0; p < n; ++p)
          for (uint32_t d = 0; d < D; ++d) want[(r * Q + i) * D + d] += s[p] / sum * v[(p * KV + kvh) * D + d];
      }
    const double rel = MaxRel(want, dout.Get(want.size()));
    std::printf("attention: worst relative difference %.3g\n", rel);
    if (rel > 1e-5) Fail("attention differs by " + std::to_string(rel));
  }
  // SwiGLU.
  {
    const size_t n = 1000;
    std::vector<float> a = Random(n, rng, 4.0f), b = Random(n, rng);
    Dev da(a), db(b);
    CUDA_OK(ops::SwiGlu(da.p, db.p, n, nullptr));
    for (size_t i = 0; i < n; ++i) a[i] = Silu(a[i]) * b[i];
    const double rel = MaxRel(a, da.Get(n));
    if (rel > 1e-5) Fail("SwiGLU differs by " + std::to_string(rel));
  }
  CUDA_OK(cudaDeviceSynchronize());
}

struct Tally {
  double worst_l2 = 0, worst_el = 0;
  size_t vectors = 0, same_token = 0, near_ties = 0;
};

TokenId Argmax(const std::vector<float>& v) {
  return static_cast<TokenId>(std::max_element(v.begin(), v.end()) - v.begin());
}

void Compare(const std::string& where, const std::vector<float>& cpu, const Result<std::vector<float>>& gpu, Tally& t) {
  if (!gpu.ok()) return Fail(where + ": " + gpu.status().ToString());
  const std::vector<float>& g = *gpu;
  if (g.size() != cpu.size()) return Fail(where + ": logits size differs");
  double num = 0, den = 0, el = 0, amax = 1e-30;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double d = double(g[i]) - cpu[i];
    num += d * d;
    den += double(cpu[i]) * cpu[i];
    el = std::max(el, std::abs(d));
    amax = std::max(amax, std::abs(double(cpu[i])));
  }
  const double l2 = std::sqrt(num / std::max(den, 1e-30)), rel_el = el / amax;
  t.worst_l2 = std::max(t.worst_l2, l2);
  t.worst_el = std::max(t.worst_el, rel_el);
  ++t.vectors;
  if (l2 > 1e-4 || rel_el > 1e-3) Fail(where + ": logits differ (rel L2 " + std::to_string(l2) + ")");
  std::vector<float> sorted = cpu;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  if (Argmax(cpu) == Argmax(g)) {
    ++t.same_token;
  } else if (sorted[0] - sorted[1] <= 1e-4f * std::max(1.0f, std::abs(sorted[0]))) {
    ++t.near_ties;
  } else {
    Fail(where + ": greedy token differs");
  }
}

void TestModel(const char* name, const ModelConfig& c, std::mt19937_64& rng) {
  auto w = Weights::Generate(c);
  if (!w.ok()) return Fail(std::string(name) + ": " + w.status().ToString());
  auto gm = CudaReferenceModel::Create(*w, 512);
  if (!gm.ok()) return Fail(std::string(name) + ": " + gm.status().ToString());
  CudaReferenceModel& G = **gm;
  ReferenceModel R(*w);
  Tally t;
  const int rs = R.NewSequence();
  const int gs = G.NewSequence().value();
  std::vector<TokenId> prompt(150);
  for (TokenId& x : prompt) x = static_cast<TokenId>(rng() % c.vocab);
  std::vector<float> cl = R.Feed(rs, prompt);
  Compare(std::string(name) + " prompt", cl, G.Feed(gs, prompt), t);
  // Teacher-forced greedy decode: both models get the CPU's token.
  auto step = [&](int r, int g, const std::string& tag) {
    const TokenId next = Argmax(cl);
    cl = R.Feed(r, std::span(&next, 1));
    Compare(std::string(name) + " " + tag, cl, G.Feed(g, std::span(&next, 1)), t);
  };
  for (int i = 0; i < 12; ++i) step(rs, gs, "decode " + std::to_string(i));
  const int rf = R.Fork(rs);
  const int gf = G.Fork(gs).value();
  const std::vector<float> at_fork = cl;
  for (int i = 0; i < 6; ++i) step(rf, gf, "fork " + std::to_string(i));
  // Roll back 4 draft tokens, then feed three new ones at once.
  R.Truncate(rf, 4);
  if (!G.Truncate(gf, 4).ok()) Fail(std::string(name) + ": truncate refused");
  if (R.Length(rf) != G.Length(gf)) Fail(std::string(name) + ": lengths differ after truncate");
  const std::vector<TokenId> redo = {static_cast<TokenId>(1 % c.vocab), static_cast<TokenId>(2 % c.vocab),
                                     static_cast<TokenId>(3 % c.vocab)};
  cl = R.Feed(rf, redo);
  Compare(std::string(name) + " re-feed", cl, G.Feed(gf, redo), t);
  // The parent is untouched by its fork.
  cl = at_fork;
  for (int i = 0; i < 4; ++i) step(rs, gs, "parent " + std::to_string(i));
  std::printf(
      "%-6s %zu logits vectors: worst rel L2 %.3g, worst element %.3g of max |logit|, "
      "greedy token same %zu, near ties %zu\n",
      name, t.vectors, t.worst_l2, t.worst_el, t.same_token, t.near_ties);
}

void TestErrors() {
  ModelConfig c;
  auto w = Weights::Generate(c);
  auto gm = CudaReferenceModel::Create(*w, 40);
  if (!gm.ok()) return Fail("errors: " + gm.status().ToString());
  CudaReferenceModel& G = **gm;
  const int s = G.NewSequence().value();
  const std::vector<TokenId> bad = {1, 2, static_cast<TokenId>(c.vocab)};
  auto r = G.Feed(s, bad);
  if (r.ok() || r.status().code() != StatusCode::kInvalidArgument || G.Length(s) != 0)
    Fail("a bad token was not refused cleanly");
  std::vector<TokenId> many(41, 5);
  r = G.Feed(s, many);
  if (r.ok() || r.status().code() != StatusCode::kResourceExhausted || G.Length(s) != 0)
    Fail("a sequence past max_positions was not refused cleanly");
  if (G.Fork(s + 7).ok()) Fail("a fork of no sequence was accepted");
  if (!G.Release(s).ok() || G.Release(s).ok()) Fail("release twice was not refused");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("usage: gpu_model_test [--seed N]\nThe CUDA decode model against the CPU model (needs a GPU).\n");
      return 0;
    }
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
  if (Status st = CudaDeviceStatus(); !st.ok()) {
    std::printf("SKIP: no GPU (%s)\n", st.ToString().c_str());
    return 0;
  }
  std::printf("gpu_model_test --seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  TestOps(rng);
  ModelConfig moe;  // defaults: 4 layers, 8 query heads over 4 KV heads, 4 experts top 2
  TestModel("moe", moe, rng);
  ModelConfig dense;
  dense.experts = 0;
  dense.kv_heads = 2;
  dense.hidden = 100;  // not a multiple of 8: the dot-product tails
  dense.seed = 7;
  TestModel("dense", dense, rng);
  ModelConfig mqa;
  mqa.q_heads = 4;
  mqa.kv_heads = 1;
  mqa.head_dim = 32;
  mqa.experts = 8;
  mqa.top_k = 3;
  mqa.layers = 3;
  mqa.seed = 11;
  TestModel("mqa", mqa, rng);
  TestErrors();
  if (failures) {
    std::printf("gpu_model_test: %d failures (seed %llu)\n", failures, static_cast<unsigned long long>(seed));
    return 1;
  }
  std::printf("gpu_model_test: OK\n");
  return 0;
}
