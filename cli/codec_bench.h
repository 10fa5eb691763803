// cli/codec_bench.h — synthetic KV data, accuracy metrics and the codec
// benchmark behind `kvmesh bench codecs` and bench/bench_codecs.
//
// Data: keys with a few large-magnitude outlier channels (as in real K caches,
// the reason KIVI quantises keys per channel) on top of a decaying low-rank
// structure; values near-Gaussian with a milder spectrum. Accuracy: relative
// L2 error of the dequantised cache, and relative error of the attention
// output softmax(q k^T / sqrt(d)) v over the dequantised cache against an fp32
// reference computed from the original cache. Speed: encode/decode GB/s of
// raw fp16 input, as a ratio to memcpy of the same bytes measured in the same run.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/codec.h"

namespace kvmesh::kernels {

// Fills `out` (shape.bytes()) with a synthetic KV block, deterministic in seed.
void GenerateKvBlock(const BlockShape& shape, uint64_t seed, std::span<std::byte> out);

struct ErrorStats {
  double rel_l2 = 0;    // ||x' - x|| / ||x|| over the whole block
  double rel_l2_k = 0;  // keys only
  double rel_l2_v = 0;  // values only
  double max_abs = 0;   // largest absolute element error
};
// Compares decoded blocks with the originals (same shape).
ErrorStats CompareBlocks(const BlockShape& shape, std::span<const std::byte> ref, std::span<const std::byte> got);
// Relative L2 error of the attention outputs (queries_per_head queries per
// layer x head, seeded) over `got` against an fp32 reference over `ref`.
double AttentionRelError(const BlockShape& shape, std::span<const std::byte> ref, std::span<const std::byte> got,
                         uint32_t queries_per_head, uint64_t seed);

struct BenchOptions {
  uint32_t layers = 4, heads = 8, tokens = 64;
  std::vector<uint32_t> head_dims = {64, 128, 256};
  std::vector<std::string> codecs;  // empty: the default list
  size_t working_set_bytes = size_t{64} << 20;  // raw bytes encoded per timed repetition
  uint32_t reps = 5;                // timed repetitions; medians are reported
  uint32_t accuracy_blocks = 4;     // blocks whose error is measured
  uint32_t threads = 1;             // > 1: EncodeBatch/DecodeBatch over blocks on this many threads
  bool quick = false;               // tests: tiny working set, 1 rep
};

struct BenchRow {
  std::string codec;
  uint32_t head_dim = 0;
  std::string shape;
  double ratio = 0;            // raw bytes / encoded bytes
  ErrorStats error;
  double attn_rel_err = 0;
  double basis_residual = -1;  // lowrank: calibration residual energy (-1: n/a)
  double encode_gbps = 0, decode_gbps = 0;  // of raw input bytes, medians
  // Medians of per-repetition ratios codec GB/s / memcpy GB/s, memcpy of the
  // same working set timed right before each repetition.
  double encode_vs_memcpy = 0, decode_vs_memcpy = 0;
  bool vector_path = false;    // the AVX2 path served this codec and shape
};

struct BenchReport {
  std::string date;     // UTC, ISO 8601
  std::string cpu;      // /proc/cpuinfo model name
  bool avx2 = false;
  uint32_t threads = 1;
  double memcpy_gbps = 0;  // median single-thread memcpy of the working set
  std::vector<BenchRow> rows;
};

// The default codec list (names accepted by `--codec`).
std::vector<std::string> DefaultBenchCodecs();
// Builds a policy from a CLI codec name: a CodecSpec string optionally
// followed by "+lz4" / "+zstd", or "mixed:<spec>@<layers>,<spec>" (the first
// spec for layers [0, layers), the second for the rest). A lowrank spec fits
// its basis from `calibration` blocks of `shape` unless `basis` is given.
Result<CodecPolicy> PolicyFromName(std::string_view name, const BlockShape& shape,
                                   std::span<const std::span<const std::byte>> calibration,
                                   std::shared_ptr<const LowRankBasis> basis = nullptr);

Result<BenchReport> RunCodecBench(const BenchOptions& o);
std::string FormatBenchTable(const BenchReport& r);
std::string FormatBenchJson(const BenchReport& r);

}  // namespace kvmesh::kernels
