// Codec tests: number formats, round trips within each codec's error bound,
// scalar vs AVX2 byte equality, mixed/lossless/lowrank policies, and the
// block format's rejection of corrupt and truncated input.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/block_format.h"
#include "kernels/codec.h"
#include "cli/codec_bench.h"
#include "kernels/cuda/codec_cuda_threads.h"
#include "kernels/lowrank.h"
#include "kernels/quant_cpu.h"

using namespace kvmesh;
using namespace kvmesh::kernels;

namespace {

using Bytes = std::vector<std::byte>;

Bytes Generate(const BlockShape& s, uint64_t seed) {
  Bytes b(s.bytes());
  GenerateKvBlock(s, seed, b);
  return b;
}

std::unique_ptr<Codec> Make(std::string_view name, bool scalar = false, std::shared_ptr<const LowRankBasis> basis = {}) {
  auto spec = ParseCodecSpec(name);
  REQUIRE(spec.ok());
  CodecPolicy p;
  p.base = *spec;
  p.force_scalar = scalar;
  p.basis = std::move(basis);
  auto c = MakeCodec(p);
  REQUIRE(c.ok());
  return std::move(c).value();
}

Bytes Encode(const Codec& c, const BlockShape& s, const Bytes& raw) {
  auto max = c.MaxEncodedSize(s);
  REQUIRE(max.ok());
  Bytes out(*max);
  auto n = c.Encode(s, raw, out);
  REQUIRE(n.ok());
  out.resize(*n);
  return out;
}

Bytes Decode(const Codec& c, const BlockShape& s, const Bytes& blob) {
  Bytes out(s.bytes());
  Status st = c.Decode(blob, out);
  INFO(st.ToString());
  REQUIRE(st.ok());
  return out;
}

// Random raw data with awkward values: zero groups, huge values, subnormals.
Bytes Awkward(const BlockShape& s, uint64_t seed) {
  Bytes b(s.bytes());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01;
  auto* p = reinterpret_cast<uint8_t*>(b.data());
  const uint8_t t = static_cast<uint8_t>(s.dtype);
  for (size_t i = 0; i < s.elements(); ++i) {
    float v = n01(rng);
    switch (rng() % 16) {
      case 0: v = 0; break;
      case 1: v *= 3000.0f; break;
      case 2: v *= 1e-6f; break;
      default: break;
    }
    StoreElem(p, i, t, v);
  }
  // One all-zero plane row stretch.
  for (size_t i = 0; i < std::min<size_t>(s.head_dim * 2, s.elements()); ++i) StoreElem(p, i, t, 0.0f);
  return b;
}

}  // namespace

TEST_CASE("fp16 conversion round-trips every half and rounds to nearest even", "[codec][format]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = HalfToFloat(x);
    if (std::isnan(f)) continue;
    REQUIRE(FloatToHalf(f) == x);
  }
  CHECK(FloatToHalf(1.0f + 1.0f / 2048) == 0x3C00);                  // tie -> even
  CHECK(FloatToHalf(1.0f + 3.0f / 2048) == 0x3C02);                  // tie -> even (up)
  CHECK(FloatToHalf(65520.0f) == 0x7C00);                            // rounds to inf
  CHECK(FloatToHalf(65519.0f) == 0x7BFF);
  CHECK(FloatToHalf(2.98023224e-8f) == 0x0000);                      // half the smallest subnormal: tie -> 0
  CHECK(FloatToHalf(-5.96046448e-8f) == 0x8001);
  CHECK(FloatToBf16(1.0f) == 0x3F80);
  CHECK(Bf16ToFloat(FloatToBf16(3.140625f)) == 3.140625f);
}

TEST_CASE("fp8 e4m3 and e5m2 encode every finite code exactly and saturate", "[codec][format]") {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float e4 = E4M3ToFloat(code), e5 = E5M2ToFloat(code);
    if (!std::isnan(e4)) {
      INFO("e4m3 code " << c << " value " << e4);
      if (c != 0x80) REQUIRE(FloatToE4M3(e4) == code);
    }
    if (std::isfinite(e5)) {
      INFO("e5m2 code " << c << " value " << e5);
      if (c != 0x80) REQUIRE(FloatToE5M2(e5) == code);
    }
  }
  CHECK(E4M3ToFloat(0x7E) == 448.0f);
  CHECK(FloatToE4M3(1000.0f) == 0x7E);
  CHECK(FloatToE4M3(-1e9f) == 0xFE);
  CHECK(FloatToE4M3(1.0f) == 0x38);
  CHECK(E5M2ToFloat(0x7B) == 57344.0f);
  CHECK(FloatToE5M2(1e6f) == 0x7B);
  CHECK(FloatToE5M2(1.0f) == 0x3C);
  CHECK(FloatToE4M3(std::nanf("")) == 0x7F);
  // 1.0625 lies halfway between 1.0 (0x38) and 1.125 (0x39): ties to even.
  CHECK(FloatToE4M3(1.0625f) == 0x38);
}

TEST_CASE("Every codec round-trips a KV block within its error bound", "[codec]") {
  struct Case {
    const char* name;
    double max_rel_l2;
  };
  const Case cases[] = {
      {"raw", 0.0},          {"fp16", 0.0},         {"bf16", 0.004},       {"int8", 0.01},
      {"int8:token", 0.03},  {"int8:channel", 0.01}, {"int4", 0.12},       {"int4:token", 0.35},
      {"int4:g32", 0.10},    {"fp8-e4m3", 0.04},    {"fp8-e5m2", 0.08},    {"int8:g64", 0.01},
  };
  for (uint32_t dim : {64u, 128u}) {
    const BlockShape s{0, 2, 0, 4, 32, dim, DType::kFp16};
    const Bytes raw = Generate(s, 42 + dim);
    for (const Case& c : cases) {
      INFO(c.name << " dim " << dim);
      auto codec = Make(c.name);
      const Bytes blob = Encode(*codec, s, raw);
      const Bytes back = Decode(*codec, s, blob);
      const ErrorStats e = CompareBlocks(s, raw, back);
      CHECK(e.rel_l2 <= c.max_rel_l2);
      if (c.max_rel_l2 > 0) CHECK(e.rel_l2 > 0);  // it really quantised
      // Decoding needs no codec object.
      Bytes again(s.bytes());
      REQUIRE(DecodeBlock(blob, again).ok());
      CHECK(again == back);
    }
  }
}

TEST_CASE("KIVI per-channel keys beat per-token keys on outlier channels", "[codec]") {
  const BlockShape s{0, 2, 0, 4, 64, 128, DType::kFp16};
  const Bytes raw = Generate(s, 7);
  auto kivi = Make("int4:kivi"), token = Make("int4:token");
  const ErrorStats ek = CompareBlocks(s, raw, Decode(*kivi, s, Encode(*kivi, s, raw)));
  const ErrorStats et = CompareBlocks(s, raw, Decode(*token, s, Encode(*token, s, raw)));
  CHECK(ek.rel_l2_k < et.rel_l2_k);
  CHECK(ek.rel_l2_v == Approx(et.rel_l2_v));  // values are per token in both
}

TEST_CASE("The AVX2 and scalar paths write identical bytes", "[codec][simd]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available (or KVMESH_FORCE_SCALAR set): nothing to compare");
    return;
  }
  const char* names[] = {"int8",     "int8:token", "int8:channel", "int4",    "int4:token", "int4:channel",
                         "int8:g16", "int4:g32",   "int4:g48",     "int8:g5", "fp8-e4m3",   "fp8-e5m2",
                         "fp16",     "bf16"};
  const uint32_t dims[] = {64, 128, 96, 100, 256, 24};
  const uint32_t tokens[] = {16, 64, 17};
  const DType dtypes[] = {DType::kFp16, DType::kBf16, DType::kFp32};
  int compared = 0;
  for (DType dt : dtypes)
    for (uint32_t d : dims)
      for (uint32_t t : tokens) {
        const BlockShape s{0, 1, 0, 2, t, d, dt};
        const Bytes raw = Awkward(s, d * 1000 + t);
        for (const char* n : names) {
          INFO(n << " dim " << d << " tokens " << t << " dtype " << DTypeName(dt));
          auto fast = Make(n, false), slow = Make(n, true);
          const Bytes a = Encode(*fast, s, raw), b = Encode(*slow, s, raw);
          REQUIRE(a == b);
          REQUIRE(Decode(*fast, s, a) == Decode(*slow, s, a));
          ++compared;
        }
      }
  CHECK(compared == 14 * 6 * 3 * 3);
}

TEST_CASE("The AVX2 path serves every quantiser on common shapes, byte-identical to scalar", "[codec][simd]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available");
    return;
  }
  for (uint8_t codec : {uint8_t{kCodecInt8}, uint8_t{kCodecInt4}, uint8_t{kCodecFp8E4M3}, uint8_t{kCodecFp8E5M2}})
    for (uint8_t axis : {uint8_t{kPerToken}, uint8_t{kPerChannel}})
      for (uint32_t dim : {64u, 128u}) {
        INFO("codec " << int(codec) << " axis " << int(axis) << " dim " << dim);
        const BlockShape s{0, 1, 0, 1, 64, dim, DType::kFp16};
        const Bytes raw = Awkward(s, codec * 10 + axis);
        const PlaneGeom g = MakePlaneGeom(codec, axis, 128, 64, dim, kElemFp16, 0);
        std::vector<uint8_t> a(g.bytes), b(g.bytes), da(s.plane_elements() * 2), db(da.size());
        const auto* in = reinterpret_cast<const uint8_t*>(raw.data());
        REQUIRE(EncodePlaneAvx2(g, in, a.data()));
        EncodePlaneScalar(g, in, b.data());
        REQUIRE(a == b);
        REQUIRE(DecodePlaneAvx2(g, a.data(), da.data(), kElemFp16));
        DecodePlaneScalar(g, a.data(), db.data(), kElemFp16);
        REQUIRE(da == db);
      }
}

TEST_CASE("The AVX2 path handles inf and NaN inputs like the scalar path", "[codec][simd]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available");
    return;
  }
  const BlockShape s{0, 1, 0, 1, 16, 64, DType::kFp16};
  Bytes raw = Awkward(s, 5);
  auto* p = reinterpret_cast<uint8_t*>(raw.data());
  StoreU16(p, 3, 0x7C00);    // +inf
  StoreU16(p, 70, 0xFC00);   // -inf
  StoreU16(p, 131, 0x7E00);  // NaN
  StoreU16(p, 900, 0x7BFF);  // 65504
  // Whole channels of NaN, +inf, -inf and -65504 in the first key plane (per-channel groups).
  for (uint32_t t = 0; t < s.tokens; ++t) {
    StoreU16(p, size_t{t} * s.head_dim + 5, 0x7E00);
    StoreU16(p, size_t{t} * s.head_dim + 6, 0x7C00);
    StoreU16(p, size_t{t} * s.head_dim + 7, 0xFC00);
    StoreU16(p, size_t{t} * s.head_dim + 8, 0xFBFF);
  }
  for (const char* n : {"int8", "int8:token", "int4", "int4:token", "fp8-e4m3", "fp8-e5m2", "int4:channel", "bf16"}) {
    INFO(n);
    auto fast = Make(n, false), slow = Make(n, true);
    const Bytes a = Encode(*fast, s, raw), b = Encode(*slow, s, raw);
    REQUIRE(a == b);
    REQUIRE(Decode(*fast, s, a) == Decode(*slow, s, a));
  }
}

TEST_CASE("Large blocks encode on several threads to the same bytes", "[codec]") {
  const BlockShape s{0, 8, 0, 8, 64, 128, DType::kFp16};  // 2 MiB... x4 below
  const BlockShape big{0, 32, 0, 8, 64, 128, DType::kFp16};  // 8 MiB: above the threading threshold
  (void)s;
  const Bytes raw = Generate(big, 3);
  CodecPolicy p1, p4;
  p1.base = *ParseCodecSpec("int4");
  p1.threads = 1;
  p4 = p1;
  p4.threads = 4;
  auto c1 = std::move(MakeCodec(p1)).value(), c4 = std::move(MakeCodec(p4)).value();
  const Bytes a = Encode(*c1, big, raw), b = Encode(*c4, big, raw);
  CHECK(a == b);
  CHECK(Decode(*c4, big, b) == Decode(*c1, big, a));
}

TEST_CASE("Mixed precision by layer stores one segment per layer range", "[codec]") {
  const BlockShape s{2, 6, 0, 2, 16, 64, DType::kFp16};  // layers 2..7 of a model
  const Bytes raw = Generate(s, 11);
  CodecPolicy p;
  p.base = *ParseCodecSpec("int4");
  p.rules.push_back({Range{0, 4}, *ParseCodecSpec("fp16")});   // layers 0-3: fp16
  p.rules.push_back({Range{6, 7}, *ParseCodecSpec("int8")});   // layer 6: int8
  auto codec = std::move(MakeCodec(p)).value();
  const Bytes blob = Encode(*codec, s, raw);
  auto info = InspectBlock(blob);
  REQUIRE(info.ok());
  REQUIRE(info->segments.size() == 4);
  CHECK(info->segments[0].spec.kind == kCodecFp16);
  CHECK(info->segments[0].layer_begin == 2);
  CHECK(info->segments[0].layers == 2);
  CHECK(info->segments[1].spec.kind == kCodecInt4);
  CHECK(info->segments[1].layers == 2);
  CHECK(info->segments[2].spec.kind == kCodecInt8);
  CHECK(info->segments[3].spec.kind == kCodecInt4);
  const Bytes back = Decode(*codec, s, blob);
  // The fp16 layers (2, 3) come back exactly: they are the first 2 layers' bytes.
  const size_t layer_bytes = s.bytes() / s.layers;
  CHECK(std::memcmp(back.data(), raw.data(), 2 * layer_bytes) == 0);
  CHECK(std::memcmp(back.data() + 2 * layer_bytes, raw.data() + 2 * layer_bytes, layer_bytes) != 0);
  CHECK(CompareBlocks(s, raw, back).rel_l2 < 0.12);
  CodecPolicy bad = p;
  bad.rules.push_back({Range{3, 5}, *ParseCodecSpec("int8")});
  CHECK(MakeCodec(bad).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("The lossless stage shrinks compressible blocks and decodes to the same values", "[codec]") {
  const BlockShape s{0, 2, 0, 4, 32, 128, DType::kFp16};
  Bytes raw = Generate(s, 5);
  // Make half of the block constant so it is compressible.
  std::memset(raw.data(), 0, raw.size() / 2);
  for (const char* ll : {"lz4", "zstd"}) {
    INFO(ll);
    CodecPolicy plain, packed;
    plain.base = packed.base = *ParseCodecSpec("int8");
    packed.lossless = *ParseLossless(ll);
    auto a = std::move(MakeCodec(plain)).value(), b = std::move(MakeCodec(packed)).value();
    const Bytes ea = Encode(*a, s, raw), eb = Encode(*b, s, raw);
    CHECK(eb.size() < ea.size());
    CHECK(InspectBlock(eb)->lossless == packed.lossless);
    CHECK(Decode(*b, s, eb) == Decode(*a, s, ea));
  }
  // Incompressible input (random fp16 passthrough) is stored without the stage.
  std::mt19937_64 rng(1);
  for (auto& x : raw) x = static_cast<std::byte>(rng());
  CodecPolicy p;
  p.base = *ParseCodecSpec("raw");
  p.lossless = Lossless::kLz4;
  auto c = std::move(MakeCodec(p)).value();
  const Bytes e = Encode(*c, s, raw);
  CHECK(InspectBlock(e)->lossless == Lossless::kNone);
  CHECK(Decode(*c, s, e) == raw);
}

TEST_CASE("Lowrank projects onto a fitted basis and reports its residual", "[codec][lowrank]") {
  const BlockShape s{0, 2, 0, 2, 64, 64, DType::kFp16};
  std::vector<Bytes> cal;
  std::vector<std::span<const std::byte>> spans;
  for (int i = 0; i < 4; ++i) cal.push_back(Generate(s, 900 + i));
  for (auto& c : cal) spans.push_back(c);
  auto basis = LowRankBasis::Fit(s, spans, 16);
  REQUIRE(basis.ok());
  CHECK(basis->mean_residual() > 0.0);
  CHECK(basis->mean_residual() < 0.5);
  auto shared = std::make_shared<LowRankBasis>(std::move(basis).value());
  const Bytes raw = Generate(s, 1);
  auto codec = Make("lowrank:r16", false, shared);
  const Bytes blob = Encode(*codec, s, raw);
  CHECK(blob.size() < s.bytes() / 3);
  const Bytes back = Decode(*codec, s, blob);
  const double err = CompareBlocks(s, raw, back).rel_l2;
  CHECK(err > 0);
  CHECK(err < 0.6);
  // More rank, less error.
  auto codec8 = Make("lowrank:r8", false, shared);
  CHECK(CompareBlocks(s, raw, Decode(*codec8, s, Encode(*codec8, s, raw))).rel_l2 > err);
  // The basis serialises; a block refuses a different basis.
  auto parsed = LowRankBasis::Parse(shared->Serialize());
  REQUIRE(parsed.ok());
  CHECK(parsed->id() == shared->id());
  Bytes out(s.bytes());
  DecodeOptions o;
  CHECK(DecodeBlock(blob, out, o).code() == StatusCode::kFailedPrecondition);
  auto other = LowRankBasis::Fit(s, std::span(spans).subspan(0, 2), 16);
  REQUIRE(other.ok());
  o.basis = &*other;
  CHECK(DecodeBlock(blob, out, o).code() == StatusCode::kFailedPrecondition);
  o.basis = &*parsed;
  REQUIRE(DecodeBlock(blob, out, o).ok());
  CHECK(out == back);
  std::vector<std::byte> ser = shared->Serialize();
  ser[100] ^= std::byte{1};
  CHECK(LowRankBasis::Parse(ser).status().code() == StatusCode::kDataLoss);
}

TEST_CASE("Corrupt and truncated blocks are rejected with a clear status", "[codec][format]") {
  const BlockShape s{0, 2, 0, 2, 16, 64, DType::kFp16};
  const Bytes raw = Generate(s, 9);
  for (const char* name : {"int8", "int4:token", "fp8-e5m2"})
    for (Lossless ll : {Lossless::kNone, Lossless::kZstd, Lossless::kLz4}) {
      INFO(name << " " << LosslessName(ll));
      CodecPolicy p;
      p.base = *ParseCodecSpec(name);
      p.lossless = ll;
      auto codec = std::move(MakeCodec(p)).value();
      const Bytes blob = Encode(*codec, s, raw);
      Bytes out(s.bytes());
      // Every truncation.
      for (size_t n = 0; n < blob.size(); ++n) {
        Status st = DecodeBlock(std::span(blob).first(n), out);
        REQUIRE(!st.ok());
        REQUIRE(st.code() == StatusCode::kDataLoss);
      }
      // Every single-bit flip (one bit per byte, rotating).
      for (size_t i = 0; i < blob.size(); ++i) {
        Bytes bad = blob;
        bad[i] ^= static_cast<std::byte>(1u << (i % 8));
        Status st = DecodeBlock(bad, out);
        INFO("flipped byte " << i);
        REQUIRE(!st.ok());
        REQUIRE((st.code() == StatusCode::kDataLoss || st.code() == StatusCode::kInvalidArgument));
      }
      // A short output buffer.
      Bytes small(s.bytes() - 1);
      CHECK(DecodeBlock(blob, small).code() == StatusCode::kInvalidArgument);
    }
}

TEST_CASE("Blocks whose checksum matches but whose lengths lie are rejected", "[codec][format]") {
  const BlockShape s{0, 2, 0, 2, 16, 64, DType::kFp16};
  const Bytes raw = Generate(s, 10);
  auto codec = Make("int8");
  const Bytes blob = Encode(*codec, s, raw);
  Bytes out(s.bytes());
  auto resealed = [&](size_t off, const void* v, size_t n) {
    Bytes b = blob;
    std::memcpy(b.data() + off, v, n);
    SealBlock(reinterpret_cast<uint8_t*>(b.data()), b.size());
    return b;
  };
  const uint32_t huge = 0xFFFFFFFFu, zero = 0, two = 2;
  const uint64_t big = uint64_t{1} << 50;
  const uint16_t many = 1000;
  const uint8_t kind = 99, axis = 7;
  CHECK(DecodeBlock(resealed(12, &huge, 4), out).code() == StatusCode::kDataLoss);  // layers
  CHECK(DecodeBlock(resealed(24, &zero, 4), out).code() == StatusCode::kDataLoss);  // tokens
  CHECK(DecodeBlock(resealed(28, &two, 4), out).code() == StatusCode::kDataLoss);   // head_dim
  CHECK(DecodeBlock(resealed(32, &many, 2), out).code() == StatusCode::kDataLoss);  // segments
  CHECK(DecodeBlock(resealed(64 + 0, &kind, 1), out).code() == StatusCode::kInvalidArgument);
  CHECK(DecodeBlock(resealed(64 + 1, &axis, 1), out).code() == StatusCode::kDataLoss);
  CHECK(DecodeBlock(resealed(64 + 4, &zero, 4), out).code() == StatusCode::kDataLoss);  // group 0
  CHECK(DecodeBlock(resealed(64 + 4, &two, 4), out).code() == StatusCode::kDataLoss);   // group changes the length
  CHECK(DecodeBlock(resealed(64 + 40, &big, 8), out).code() == StatusCode::kDataLoss);  // segment bytes
  CHECK(DecodeBlock(resealed(40, &big, 8), out).code() == StatusCode::kDataLoss);       // body bytes
  const uint16_t v2 = 2;
  Status st = DecodeBlock(resealed(4, &v2, 2), out);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("version 2") != std::string::npos);
  CHECK(DecodeBlock(raw, out).code() == StatusCode::kInvalidArgument);  // not a block at all
}

TEST_CASE("Codec names parse and print", "[codec]") {
  for (const char* n : {"int8:g128:kivi", "int4:g64:token", "fp8-e4m3:g32:channel", "fp16", "lowrank:r32", "raw"}) {
    auto s = ParseCodecSpec(n);
    REQUIRE(s.ok());
    CHECK(CodecSpecName(*s) == n);
  }
  CHECK(ParseCodecSpec("int9").status().code() == StatusCode::kNotFound);
  CHECK(ParseCodecSpec("int8:g0").status().code() == StatusCode::kInvalidArgument);
  CHECK(ParseCodecSpec("fp16:g64").status().code() == StatusCode::kInvalidArgument);
  CHECK(ParseCodecSpec("int8:r4").status().code() == StatusCode::kInvalidArgument);
  CHECK(ListCodecs().size() == kCodecKindCount);
  CodecPolicy p;
  p.base = *ParseCodecSpec("lowrank");
  CHECK(MakeCodec(p).status().code() == StatusCode::kInvalidArgument);  // no basis
}

TEST_CASE("The codec bench meets the issue's ratio and error floors", "[codec][bench]") {
  BenchOptions o;
  o.quick = true;
  o.layers = 2;
  o.heads = 2;
  o.tokens = 64;
  o.head_dims = {128};
  o.accuracy_blocks = 2;
  o.codecs = {"int8", "int4", "int4:token", "fp16"};
  auto r = RunCodecBench(o);
  REQUIRE(r.ok());
  REQUIRE(r->rows.size() == 4);
  CHECK(r->memcpy_gbps > 0);
  CHECK(r->rows[0].ratio >= 1.9);
  CHECK(r->rows[0].error.rel_l2 < 0.01);
  CHECK(r->rows[0].attn_rel_err < 0.03);
  CHECK(r->rows[1].ratio >= 3.5);
  CHECK(r->rows[2].ratio >= 3.5);
  CHECK(r->rows[3].ratio == Approx(1.0).epsilon(0.01));  // fp16 of fp16 input
  CHECK(r->rows[3].error.rel_l2 == 0.0);
  CHECK(r->rows[3].attn_rel_err < 1e-12);
}

TEST_CASE("Resealed blocks with random header and table damage never read out of bounds", "[codec][format]") {
  // The checksum is recomputed after each mutation, so only the structural
  // checks stand between the damage and the decoder (run under ASan in CI).
  const BlockShape s{0, 3, 0, 2, 16, 64, DType::kFp16};
  const Bytes raw = Generate(s, 12);
  CodecPolicy p;
  p.base = *ParseCodecSpec("int4:g32");
  p.rules.push_back({Range{1, 2}, *ParseCodecSpec("fp8-e4m3")});
  auto codec = std::move(MakeCodec(p)).value();
  const Bytes blob = Encode(*codec, s, raw);
  const size_t meta = MetadataBytes(3);
  REQUIRE(InspectBlock(blob)->segments.size() == 3);
  std::mt19937_64 rng(99);
  Bytes out(s.bytes() * 4);
  int accepted = 0;
  for (int i = 0; i < 4000; ++i) {
    Bytes bad = blob;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % meta;
      if (at >= kChecksumOffset && at < kChecksumOffset + 8) continue;
      bad[at] = static_cast<std::byte>(rng());
    }
    SealBlock(reinterpret_cast<uint8_t*>(bad.data()), bad.size());
    Status st = DecodeBlock(bad, out);
    if (st.ok()) ++accepted;  // e.g. a reserved byte or an equivalent value
  }
  CHECK(accepted < 4000);
}

TEST_CASE("The AVX2 fp8 decoder maps all 256 codes like the scalar decoder", "[codec][simd]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available");
    return;
  }
  for (uint8_t codec : {uint8_t{kCodecFp8E4M3}, uint8_t{kCodecFp8E5M2}})
    for (uint8_t out_type : {uint8_t{kElemFp16}, uint8_t{kElemFp32}}) {
      const PlaneGeom g = MakePlaneGeom(codec, kPerToken, 128, 2, 128, kElemFp16, 0);
      std::vector<uint8_t> enc(g.bytes, 0);
      StoreU16(enc.data() + g.scales_off, 0, FloatToHalf(0.75f));
      StoreU16(enc.data() + g.scales_off, 1, FloatToHalf(3.0f));
      for (int i = 0; i < 256; ++i) enc[g.codes_off + i] = static_cast<uint8_t>(i);
      std::vector<uint8_t> a(256 * ElemSize(out_type)), b(a.size());
      REQUIRE(DecodePlaneAvx2(g, enc.data(), a.data(), out_type));
      DecodePlaneScalar(g, enc.data(), b.data(), out_type);
      CHECK(a == b);
    }
}

TEST_CASE("The AVX2 lowrank loops equal the scalar loops bit for bit", "[codec][simd][lowrank]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available");
    return;
  }
  std::mt19937_64 rng(4);
  std::normal_distribution<float> n01;
  for (uint32_t n : {64u, 100u, 128u})
    for (uint32_t rank : {8u, 16u, 20u, 32u}) {
      std::vector<float> row(n), bt(size_t{n} * rank), b(size_t{rank} * n), mean(n), coef(rank), c2(rank);
      for (auto* v : {&row, &bt, &b, &mean})
        for (float& x : *v) x = n01(rng);
      LowRankProjectAvx2(row.data(), n, bt.data(), rank, rank, coef.data());
      for (uint32_t r = 0; r < rank; ++r) {
        float s = 0;
        for (uint32_t d = 0; d < n; ++d) s += row[d] * bt[size_t{d} * rank + r];
        c2[r] = s;
      }
      REQUIRE(std::memcmp(coef.data(), c2.data(), rank * 4) == 0);
      std::vector<float> o1(n), o2(n);
      LowRankReconstructAvx2(coef.data(), rank, b.data(), mean.data(), n, o1.data());
      for (uint32_t d = 0; d < n; ++d) {
        float a = mean[d];
        for (uint32_t r = 0; r < rank; ++r) a += coef[r] * b[size_t{r} * n + d];
        o2[d] = a;
      }
      REQUIRE(std::memcmp(o1.data(), o2.data(), n * 4) == 0);
    }
}

TEST_CASE("The CUDA kernels' per-thread work, run on the CPU over every index, equals the CPU codec", "[codec][cuda]") {
  // kernels/cuda/codec_cuda.cu only computes a flat thread index and calls
  // these functions, so this checks the GPU's index math, strides and
  // padding here; gpu_codec_test checks the device itself.
  using namespace kvmesh::kernels::cuda;
  std::mt19937_64 rng(31);
  const uint8_t codecs[] = {kCodecInt8, kCodecInt4, kCodecFp8E4M3, kCodecFp8E5M2, kCodecFp16, kCodecBf16, kCodecRaw};
  int cases = 0;
  for (uint8_t codec : codecs)
    for (uint8_t axis : {uint8_t{kPerToken}, uint8_t{kPerChannel}})
      for (uint32_t dim : {64u, 100u})
        for (uint32_t t : {16u, 17u})
          for (DType dt : {DType::kFp16, DType::kBf16, DType::kFp32}) {
            if (!IsQuantising(codec) && axis != kPerToken) continue;
            const uint8_t type = static_cast<uint8_t>(dt);
            const uint32_t layers = 2, heads = 3;
            const BlockShape s{0, layers, 0, heads, t, dim, dt};
            const Bytes raw = Awkward(s, rng());
            const PlaneGeom k = MakePlaneGeom(codec, axis, 48, t, dim, type, 0);
            const PlaneGeom v = MakePlaneGeom(codec, kPerToken, 48, t, dim, type, 0);
            PlaneSet sets[2];
            size_t raw_base[2], enc_base[2];
            SegmentPlaneSets(k, v, layers, heads, sets, raw_base, enc_base);
            const size_t enc_bytes = size_t{layers} * heads * (k.bytes + v.bytes);
            std::vector<uint8_t> cpu(enc_bytes, 0xAB), gpu(enc_bytes, 0xCD);
            const auto* in = reinterpret_cast<const uint8_t*>(raw.data());
            for (int kv = 0; kv < 2; ++kv)
              for (uint32_t l = 0; l < layers; ++l)
                for (uint32_t h = 0; h < heads; ++h)
                  EncodePlaneScalar(sets[kv].geom, in + raw_base[kv] + l * sets[kv].raw_outer_stride + h * sets[kv].raw_inner_stride,
                                    cpu.data() + enc_base[kv] + l * sets[kv].enc_outer_stride + h * sets[kv].enc_inner_stride);
            const size_t planes = size_t{layers} * heads;
            for (int kv = 0; kv < 2; ++kv) {
              const PlaneSet& ps = sets[kv];
              if (IsQuantising(codec)) {
                for (size_t i = 0; i < planes * ps.geom.groups; ++i) threads::GroupStats(ps, in + raw_base[kv], gpu.data() + enc_base[kv], i);
                for (size_t i = 0; i < planes * threads::CodesPerPlane(ps.geom); ++i)
                  threads::Codes(ps, in + raw_base[kv], gpu.data() + enc_base[kv], i);
              } else {
                for (size_t i = 0; i < planes * threads::ConvertPerPlane(ps.geom); ++i)
                  threads::Convert(ps, in + raw_base[kv], gpu.data() + enc_base[kv], i);
              }
            }
            INFO("codec " << int(codec) << " axis " << int(axis) << " dim " << dim << " tokens " << t << " dtype " << int(type));
            REQUIRE(cpu == gpu);
            std::vector<uint8_t> dec_cpu(raw.size(), 1), dec_gpu(raw.size(), 2);
            for (int kv = 0; kv < 2; ++kv) {
              const PlaneSet& ps = sets[kv];
              for (uint32_t l = 0; l < layers; ++l)
                for (uint32_t h = 0; h < heads; ++h)
                  DecodePlaneScalar(ps.geom, cpu.data() + enc_base[kv] + l * ps.enc_outer_stride + h * ps.enc_inner_stride,
                                    dec_cpu.data() + raw_base[kv] + l * ps.raw_outer_stride + h * ps.raw_inner_stride, type);
              for (size_t i = 0; i < planes * threads::DecodePerPlane(ps.geom); ++i)
                threads::Decode(ps, cpu.data() + enc_base[kv], dec_gpu.data() + raw_base[kv], type, i);
            }
            REQUIRE(dec_cpu == dec_gpu);
            ++cases;
          }
  CHECK(cases == (4 * 2 + 3) * 2 * 2 * 3);
}

TEST_CASE("Batches of blocks encode and decode on several threads like one by one", "[codec]") {
  const BlockShape s{0, 2, 0, 4, 32, 64, DType::kFp16};
  auto codec = Make("int4");
  const size_t max = *codec->MaxEncodedSize(s);
  std::vector<Bytes> raws, outs(9, Bytes(max)), back(9, Bytes(s.bytes()));
  std::vector<std::span<const std::byte>> rs, bs;
  std::vector<std::span<std::byte>> os, ds;
  for (int i = 0; i < 9; ++i) raws.push_back(Generate(s, 500 + i));
  for (int i = 0; i < 9; ++i) rs.push_back(raws[i]), os.push_back(outs[i]), ds.push_back(back[i]);
  std::vector<size_t> sizes(9);
  REQUIRE(EncodeBatch(*codec, s, rs, os, sizes, 3).ok());
  for (int i = 0; i < 9; ++i) {
    const Bytes one = Encode(*codec, s, raws[i]);
    REQUIRE(sizes[i] == one.size());
    REQUIRE(std::equal(one.begin(), one.end(), outs[i].begin()));
    bs.push_back(std::span<const std::byte>(outs[i]).first(sizes[i]));
  }
  REQUIRE(DecodeBatch(*codec, bs, ds, 3).ok());
  for (int i = 0; i < 9; ++i) CHECK(back[i] == Decode(*codec, s, Bytes(bs[i].begin(), bs[i].end())));
  // A corrupt block fails the batch with its index.
  outs[4][100] ^= std::byte{1};
  Status st = DecodeBatch(*codec, bs, ds, 3);
  CHECK(st.code() == StatusCode::kDataLoss);
  CHECK(st.message().find("block 4") != std::string::npos);
}

TEST_CASE("The AVX2 fp16/bf16 conversions equal the scalar ones on arbitrary bit patterns", "[codec][simd]") {
  if (!HaveAvx2Path()) {
    WARN("AVX2+F16C not available");
    return;
  }
  std::mt19937_64 rng(8);
  const uint32_t T = 16, D = 64;
  std::vector<uint8_t> raw(size_t{T} * D * 4);
  for (size_t i = 0; i < raw.size(); i += 4) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 64 == 0) u = 0x7F800001u | (u & 0x80000000u);  // signalling NaN
    if (i % 64 == 4) u = 0x7FC12345u;                      // quiet NaN with payload
    if (i % 64 == 8) u = 0x477FF000u;                      // 65520: rounds to inf in fp16
    if (i % 64 == 12) u = 0x33000000u;                     // 2^-25: fp16 tie to zero
    std::memcpy(&raw[i], &u, 4);
  }
  for (uint8_t codec : {uint8_t{kCodecFp16}, uint8_t{kCodecBf16}}) {
    INFO("codec " << int(codec));
    const PlaneGeom g = MakePlaneGeom(codec, kPerToken, 0, T, D, kElemFp32, 0);
    std::vector<uint8_t> a(g.bytes), b(g.bytes);
    REQUIRE(EncodePlaneAvx2(g, raw.data(), a.data()));
    EncodePlaneScalar(g, raw.data(), b.data());
    REQUIRE(a == b);
    for (uint8_t out_type : {uint8_t{kElemFp32}, uint8_t{kElemFp16}, uint8_t{kElemBf16}}) {
      if (out_type == (codec == kCodecFp16 ? kElemFp16 : kElemBf16)) continue;
      std::vector<uint8_t> da(size_t{T} * D * ElemSize(out_type)), db(da.size());
      REQUIRE(DecodePlaneAvx2(g, a.data(), da.data(), out_type));
      DecodePlaneScalar(g, a.data(), db.data(), out_type);
      REQUIRE(da == db);
    }
  }
}
