#include "cli/codec_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kernels/lowrank.h"
#include "kernels/quant_cpu.h"

namespace kvmesh::kernels {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Index of element (plane p, token t, dim d).
size_t Elem(const BlockShape& s, size_t p, uint32_t t, uint32_t d) {
  return (p * s.tokens + t) * s.head_dim + d;
}

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

}  // namespace

void GenerateKvBlock(const BlockShape& s, uint64_t seed, std::span<std::byte> out) {
  auto* dst = reinterpret_cast<uint8_t*>(out.data());
  const uint8_t type = static_cast<uint8_t>(s.dtype);
  const uint32_t D = s.head_dim;
  std::vector<float> a, z;
  for (size_t p = 0; p < s.planes(); ++p) {
    const bool key = (p / s.heads) % 2 == 0;
    const uint32_t layer = s.layer_begin + static_cast<uint32_t>(p / (2 * s.heads));
    const uint32_t head = s.head_begin + static_cast<uint32_t>(p % s.heads);
    // Structure (mixing matrix, channel scales, outliers) depends on the head
    // only, so a basis fitted on other seeds sees the same distribution.
    std::mt19937_64 hrng(Mix(Mix(layer, head), key ? 1 : 2));
    std::mt19937_64 rng(Mix(seed, p));
    std::normal_distribution<float> n01;
    const uint32_t r0 = std::max<uint32_t>(2, key ? D / 8 : D / 4);
    a.resize(size_t{D} * r0);
    for (uint32_t d = 0; d < D; ++d)
      for (uint32_t j = 0; j < r0; ++j) a[size_t{d} * r0 + j] = n01(hrng) / std::sqrt(1.0f + j);
    std::vector<float> scale(D), offset(D, 0.0f);
    for (uint32_t d = 0; d < D; ++d) scale[d] = std::exp(0.3f * n01(hrng));
    if (key) {  // a few outlier channels: large and biased, consistently over tokens
      const uint32_t outliers = std::max<uint32_t>(2, D / 32);
      for (uint32_t o = 0; o < outliers; ++o) {
        uint32_t d = static_cast<uint32_t>(hrng() % D);
        scale[d] *= 12.0f;
        offset[d] = (hrng() & 1 ? 1.0f : -1.0f) * 3.0f * scale[d];
      }
    }
    const float noise = key ? 0.2f : 0.5f;
    z.resize(r0);
    for (uint32_t t = 0; t < s.tokens; ++t) {
      for (uint32_t j = 0; j < r0; ++j) z[j] = n01(rng);
      for (uint32_t d = 0; d < D; ++d) {
        float v = 0;
        for (uint32_t j = 0; j < r0; ++j) v += a[size_t{d} * r0 + j] * z[j];
        v = v / std::sqrt(static_cast<float>(r0)) * 1.5f + noise * n01(rng);
        StoreElem(dst, Elem(s, p, t, d), type, offset[d] + scale[d] * v);
      }
    }
  }
}

ErrorStats CompareBlocks(const BlockShape& s, std::span<const std::byte> ref, std::span<const std::byte> got) {
  const auto* r = reinterpret_cast<const uint8_t*>(ref.data());
  const auto* g = reinterpret_cast<const uint8_t*>(got.data());
  const uint8_t type = static_cast<uint8_t>(s.dtype);
  double num[2] = {0, 0}, den[2] = {0, 0}, max_abs = 0;
  for (size_t p = 0; p < s.planes(); ++p) {
    const int kv = static_cast<int>((p / s.heads) % 2);
    for (size_t i = p * s.plane_elements(), e = i + s.plane_elements(); i < e; ++i) {
      double x = LoadElem(r, i, type), y = LoadElem(g, i, type);
      num[kv] += (y - x) * (y - x);
      den[kv] += x * x;
      max_abs = std::max(max_abs, std::fabs(y - x));
    }
  }
  ErrorStats st;
  st.rel_l2 = std::sqrt((num[0] + num[1]) / std::max(1e-300, den[0] + den[1]));
  st.rel_l2_k = std::sqrt(num[0] / std::max(1e-300, den[0]));
  st.rel_l2_v = std::sqrt(num[1] / std::max(1e-300, den[1]));
  st.max_abs = max_abs;
  return st;
}

double AttentionRelError(const BlockShape& s, std::span<const std::byte> ref, std::span<const std::byte> got,
                         uint32_t queries, uint64_t seed) {
  const auto* r = reinterpret_cast<const uint8_t*>(ref.data());
  const auto* g = reinterpret_cast<const uint8_t*>(got.data());
  const uint8_t type = static_cast<uint8_t>(s.dtype);
  const uint32_t D = s.head_dim, T = s.tokens;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01;
  std::vector<double> q(D), sc(T), out_r(D), out_g(D);
  double num = 0, den = 0;
  auto attend = [&](const uint8_t* base, size_t kp, size_t vp, std::vector<double>* out) {
    double mx = -1e300;
    for (uint32_t t = 0; t < T; ++t) {
      double dot = 0;
      for (uint32_t d = 0; d < D; ++d) dot += q[d] * LoadElem(base, Elem(s, kp, t, d), type);
      sc[t] = dot / std::sqrt(static_cast<double>(D));
      mx = std::max(mx, sc[t]);
    }
    double z = 0;
    for (uint32_t t = 0; t < T; ++t) z += (sc[t] = std::exp(sc[t] - mx));
    std::fill(out->begin(), out->end(), 0.0);
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t d = 0; d < D; ++d) (*out)[d] += sc[t] / z * LoadElem(base, Elem(s, vp, t, d), type);
  };
  for (uint32_t l = 0; l < s.layers; ++l)
    for (uint32_t h = 0; h < s.heads; ++h) {
      const size_t kp = (size_t{l} * 2) * s.heads + h, vp = (size_t{l} * 2 + 1) * s.heads + h;
      for (uint32_t qi = 0; qi < queries; ++qi) {
        for (double& x : q) x = n01(rng);
        // Scale q so the reference scores have standard deviation ~2 (a
        // moderately peaked softmax, as in trained models).
        double m = 0, m2 = 0;
        for (uint32_t t = 0; t < T; ++t) {
          double dot = 0;
          for (uint32_t d = 0; d < D; ++d) dot += q[d] * LoadElem(r, Elem(s, kp, t, d), type);
          dot /= std::sqrt(static_cast<double>(D));
          m += dot;
          m2 += dot * dot;
        }
        m /= T;
        const double sd = std::sqrt(std::max(1e-12, m2 / T - m * m));
        for (double& x : q) x *= 2.0 / sd;
        attend(r, kp, vp, &out_r);
        attend(g, kp, vp, &out_g);
        for (uint32_t d = 0; d < D; ++d) {
          num += (out_g[d] - out_r[d]) * (out_g[d] - out_r[d]);
          den += out_r[d] * out_r[d];
        }
      }
    }
  return std::sqrt(num / std::max(1e-300, den));
}

std::vector<std::string> DefaultBenchCodecs() {
  return {"fp16",     "bf16",     "int8",          "int8:token",        "int4",       "int4:token",
          "fp8-e4m3", "fp8-e5m2", "lowrank",       "mixed:fp16@1,int4", "int8+zstd", "int4+lz4"};
}

Result<CodecPolicy> PolicyFromName(std::string_view name, const BlockShape& shape,
                                   std::span<const std::span<const std::byte>> calibration,
                                   std::shared_ptr<const LowRankBasis> basis) {
  CodecPolicy p;
  p.basis = std::move(basis);
  std::string_view spec = name;
  if (size_t plus = name.find('+'); plus != std::string_view::npos) {
    KVMESH_ASSIGN_OR_RETURN(p.lossless, ParseLossless(name.substr(plus + 1)));
    spec = name.substr(0, plus);
  }
  auto parse = [&](std::string_view text) -> Result<CodecSpec> {
    KVMESH_ASSIGN_OR_RETURN(CodecSpec s, ParseCodecSpec(text));
    if (s.kind == kCodecLowRank) {
      if (s.rank == 0) s.rank = p.basis ? p.basis->rank() : std::max<uint32_t>(1, shape.head_dim / 4);
      if (!p.basis) {
        if (calibration.empty()) return InvalidArgument("lowrank: no calibration blocks to fit a basis");
        KVMESH_ASSIGN_OR_RETURN(LowRankBasis b, LowRankBasis::Fit(shape, calibration, s.rank));
        p.basis = std::make_shared<LowRankBasis>(std::move(b));
      }
    }
    return s;
  };
  if (spec.rfind("mixed:", 0) == 0) {
    std::string_view rest = spec.substr(6);
    const size_t at = rest.find('@'), comma = rest.find(',');
    uint32_t n = 0;
    if (at == std::string_view::npos || comma == std::string_view::npos || comma < at)
      return InvalidArgument("mixed codec: expected mixed:<spec>@<layers>,<spec>, got " + std::string(name));
    for (char c : rest.substr(at + 1, comma - at - 1)) {
      if (c < '0' || c > '9') return InvalidArgument("mixed codec: bad layer count in " + std::string(name));
      n = n * 10 + static_cast<uint32_t>(c - '0');
    }
    KVMESH_ASSIGN_OR_RETURN(CodecSpec first, parse(rest.substr(0, at)));
    KVMESH_ASSIGN_OR_RETURN(p.base, parse(rest.substr(comma + 1)));
    p.rules.push_back({Range{0, n}, first});
  } else {
    KVMESH_ASSIGN_OR_RETURN(p.base, parse(spec));
  }
  return p;
}

Result<BenchReport> RunCodecBench(const BenchOptions& o) {
  BenchReport rep;
  rep.date = NowUtc();
  rep.cpu = CpuModel();
  rep.avx2 = HaveAvx2Path();
  rep.threads = o.threads;
  const std::vector<std::string> codecs = o.codecs.empty() ? DefaultBenchCodecs() : o.codecs;
  const uint32_t reps = o.quick ? 1 : std::max(1u, o.reps);
  std::vector<double> memcpy_runs;
  for (uint32_t dim : o.head_dims) {
    BlockShape shape{0, o.layers, 0, o.heads, o.tokens, dim, DType::kFp16};
    KVMESH_RETURN_IF_ERROR(shape.Validate());
    const size_t bb = shape.bytes();
    const uint32_t acc_blocks = std::max(1u, o.accuracy_blocks);
    const size_t ws = o.quick ? bb * acc_blocks : std::max(o.working_set_bytes, bb);
    const size_t nblocks = std::max<size_t>(1, ws / bb);
    // Distinct accuracy blocks, repeated to fill the working set; separate
    // calibration blocks for lowrank bases.
    std::vector<std::byte> raw(nblocks * bb), out(nblocks * bb), calib(size_t{4} * bb);
    for (uint32_t i = 0; i < acc_blocks && i < nblocks; ++i)
      GenerateKvBlock(shape, 1000 + i, std::span(raw).subspan(i * bb, bb));
    for (size_t i = acc_blocks; i < nblocks; ++i)
      std::memcpy(raw.data() + i * bb, raw.data() + (i % acc_blocks) * bb, bb);
    std::vector<std::span<const std::byte>> cal;
    for (uint32_t i = 0; i < 4; ++i) {
      GenerateKvBlock(shape, 9000 + i, std::span(calib).subspan(i * bb, bb));
      cal.push_back(std::span<const std::byte>(calib).subspan(i * bb, bb));
    }
    const size_t nacc = std::min<size_t>(acc_blocks, nblocks);
    for (uint32_t r = 0; r < reps + 1; ++r) {  // the first run warms the pages
      auto t0 = Clock::now();
      std::memcpy(out.data(), raw.data(), nblocks * bb);
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (r > 0) memcpy_runs.push_back(static_cast<double>(nblocks * bb) / s / 1e9);
    }
    for (const std::string& name : codecs) {
      KVMESH_ASSIGN_OR_RETURN(CodecPolicy policy, PolicyFromName(name, shape, cal));
      policy.threads = 1;  // --threads spreads blocks (EncodeBatch), not planes
      KVMESH_ASSIGN_OR_RETURN(auto codec, MakeCodec(policy));
      KVMESH_ASSIGN_OR_RETURN(size_t max_enc, codec->MaxEncodedSize(shape));
      std::vector<std::byte> enc(nblocks * max_enc);
      std::vector<size_t> enc_len(nblocks);
      std::vector<std::span<const std::byte>> raw_spans(nblocks), blob_spans(nblocks);
      std::vector<std::span<std::byte>> enc_spans(nblocks), out_spans(nblocks);
      for (size_t i = 0; i < nblocks; ++i) {
        raw_spans[i] = std::span<const std::byte>(raw).subspan(i * bb, bb);
        enc_spans[i] = std::span(enc).subspan(i * max_enc, max_enc);
        out_spans[i] = std::span(out).subspan(i * bb, bb);
      }
      BenchRow row;
      row.codec = name;
      row.head_dim = dim;
      row.shape = shape.ToString();
      row.vector_path = rep.avx2 && (policy.base.kind == kCodecInt8 || policy.base.kind == kCodecInt4);
      if (policy.basis) row.basis_residual = policy.basis->mean_residual();
      // Each repetition times memcpy of the same bytes right before the codec,
      // so a ratio compares runs under the same machine load.
      std::vector<double> enc_runs, dec_runs, enc_ratio, dec_ratio;
      for (uint32_t r = 0; r < reps + 1; ++r) {
        auto tm = Clock::now();
        std::memcpy(out.data(), raw.data(), nblocks * bb);
        const double tc = std::chrono::duration<double>(Clock::now() - tm).count();
        auto t0 = Clock::now();
        if (o.threads <= 1) {
          for (size_t i = 0; i < nblocks; ++i) {
            KVMESH_ASSIGN_OR_RETURN(enc_len[i], codec->Encode(shape, std::span(raw).subspan(i * bb, bb),
                                                              std::span(enc).subspan(i * max_enc, max_enc)));
          }
        } else {
          KVMESH_RETURN_IF_ERROR(EncodeBatch(*codec, shape, raw_spans, enc_spans, enc_len, o.threads));
        }
        double te = std::chrono::duration<double>(Clock::now() - t0).count();
        for (size_t i = 0; i < nblocks; ++i) blob_spans[i] = std::span<const std::byte>(enc).subspan(i * max_enc, enc_len[i]);
        t0 = Clock::now();
        if (o.threads <= 1) {
          for (size_t i = 0; i < nblocks; ++i) KVMESH_RETURN_IF_ERROR(codec->Decode(blob_spans[i], out_spans[i]));
        } else {
          KVMESH_RETURN_IF_ERROR(DecodeBatch(*codec, blob_spans, out_spans, o.threads));
        }
        double td = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r > 0) {
          enc_runs.push_back(static_cast<double>(nblocks * bb) / te / 1e9);
          dec_runs.push_back(static_cast<double>(nblocks * bb) / td / 1e9);
          memcpy_runs.push_back(static_cast<double>(nblocks * bb) / tc / 1e9);
          enc_ratio.push_back(tc / te);
          dec_ratio.push_back(tc / td);
        }
      }
      row.encode_gbps = Median(enc_runs);
      row.decode_gbps = Median(dec_runs);
      row.encode_vs_memcpy = Median(enc_ratio);
      row.decode_vs_memcpy = Median(dec_ratio);
      size_t enc_total = 0;
      double num = 0, den = 0, nk = 0, dk = 0, nv = 0, dv = 0, attn_num = 0;
      for (size_t i = 0; i < nacc; ++i) {
        enc_total += enc_len[i];
        auto a = std::span<const std::byte>(raw).subspan(i * bb, bb);
        auto b = std::span<const std::byte>(out).subspan(i * bb, bb);
        ErrorStats e = CompareBlocks(shape, a, b);
        // Combine per-block errors by energy (each block has similar energy).
        num += e.rel_l2 * e.rel_l2, den += 1;
        nk += e.rel_l2_k * e.rel_l2_k, dk += 1;
        nv += e.rel_l2_v * e.rel_l2_v, dv += 1;
        row.error.max_abs = std::max(row.error.max_abs, e.max_abs);
        double at = AttentionRelError(shape, a, b, 4, 77 + i);
        attn_num += at * at;
      }
      row.ratio = static_cast<double>(nacc * bb) / static_cast<double>(enc_total);
      row.error.rel_l2 = std::sqrt(num / den);
      row.error.rel_l2_k = std::sqrt(nk / dk);
      row.error.rel_l2_v = std::sqrt(nv / dv);
      row.attn_rel_err = std::sqrt(attn_num / static_cast<double>(nacc));
      rep.rows.push_back(row);
    }
  }
  rep.memcpy_gbps = Median(memcpy_runs);
  return rep;
}

std::string FormatBenchTable(const BenchReport& r) {
  std::ostringstream o;
  char buf[256];
  o << "kvmesh codec bench  " << r.date << "  cpu: " << r.cpu << "  avx2+f16c: " << (r.avx2 ? "yes" : "no")
    << "  threads: " << r.threads << "\n";
  std::snprintf(buf, sizeof(buf),
                "memcpy (same run, 1 thread, median): %.2f GB/s; enc/mc and dec/mc are medians of per-repetition "
                "ratios to a memcpy of the same bytes timed just before\n",
                r.memcpy_gbps);
  o << buf;
  std::snprintf(buf, sizeof(buf), "%-20s %4s %6s %9s %9s %9s %9s %8s %8s %6s %6s\n", "codec", "dim", "ratio", "relL2",
                "relL2(K)", "relL2(V)", "attn_err", "enc GB/s", "dec GB/s", "enc/mc", "dec/mc");
  o << buf;
  for (const BenchRow& w : r.rows) {
    std::snprintf(buf, sizeof(buf), "%-20s %4u %6.2f %9.2e %9.2e %9.2e %9.2e %8.2f %8.2f %6.2f %6.2f\n",
                  w.codec.c_str(), w.head_dim, w.ratio, w.error.rel_l2, w.error.rel_l2_k, w.error.rel_l2_v,
                  w.attn_rel_err, w.encode_gbps, w.decode_gbps, w.encode_vs_memcpy, w.decode_vs_memcpy);
    o << buf;
  }
  return o.str();
}

std::string FormatBenchJson(const BenchReport& r) {
  nlohmann::json j;
  j["date"] = r.date;
  j["cpu"] = r.cpu;
  j["avx2_f16c"] = r.avx2;
  j["threads"] = r.threads;
  j["memcpy_gbps"] = r.memcpy_gbps;
  j["rows"] = nlohmann::json::array();
  for (const BenchRow& w : r.rows) {
    nlohmann::json x;
    x["codec"] = w.codec;
    x["head_dim"] = w.head_dim;
    x["shape"] = w.shape;
    x["ratio"] = w.ratio;
    x["rel_l2"] = w.error.rel_l2;
    x["rel_l2_k"] = w.error.rel_l2_k;
    x["rel_l2_v"] = w.error.rel_l2_v;
    x["max_abs_err"] = w.error.max_abs;
    x["attn_rel_err"] = w.attn_rel_err;
    if (w.basis_residual >= 0) x["basis_residual"] = w.basis_residual;
    x["encode_gbps"] = w.encode_gbps;
    x["decode_gbps"] = w.decode_gbps;
    x["encode_vs_memcpy"] = w.encode_vs_memcpy;
    x["decode_vs_memcpy"] = w.decode_vs_memcpy;
    x["vector_path"] = w.vector_path;
    j["rows"].push_back(x);
  }
  return j.dump(2);
}

}  // namespace kvmesh::kernels
