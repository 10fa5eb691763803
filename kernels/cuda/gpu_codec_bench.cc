// gpu_codec_bench: CUDA codec encode/decode GB/s (of raw fp16 input) against
// cudaMemcpy device-to-device of the same bytes, measured in the same run.
// Medians of --reps timed runs (cudaEvent timing on one stream). --json for
// machine-readable output. Needs only the CUDA runtime.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/codec_math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/codec_cuda.h"

using namespace kvmesh::kernels;
using namespace kvmesh::kernels::cuda;


namespace {

struct Codec {
  const char* name;
  uint8_t kind;
  uint8_t key_axis;
};

template <typename Fn>
double MedianMs(int reps, cudaStream_t s, Fn fn) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  fn();  // warm-up
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CUDA_OK(cudaEventRecord(a, s));
    fn();
    CUDA_OK(cudaEventRecord(b, s));
    CUDA_OK(cudaEventSynchronize(b));
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int reps = 10;
  uint32_t layers = 32, heads = 8, tokens = 64, dim = 128, blocks = 16;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: gpu_codec_bench [--reps R] [--dim D] [--tokens T] [--blocks B] [--json]\n"
          "Encode/decode GB/s of the CUDA codecs beside a device-to-device copy of the same bytes (needs a GPU).\n");
      return 0;
    }
    auto next = [&] { return i + 1 < argc ? static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10)) : 0u; };
    if (a == "--json") json = true;
    else if (a == "--reps") reps = static_cast<int>(next());
    else if (a == "--dim") dim = next();
    else if (a == "--tokens") tokens = next();
    else if (a == "--blocks") blocks = next();
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no GPU\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  const uint32_t outer = layers * blocks;  // blocks of `layers` layers, back to back
  const size_t raw_plane = size_t{tokens} * dim * 2;
  const size_t raw_bytes = size_t{outer} * 2 * heads * raw_plane;
  std::vector<uint16_t> host(raw_bytes / 2);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> n01;
  for (size_t i = 0; i < host.size(); ++i) host[i] = FloatToHalf(n01(rng) * ((i % dim) % 31 == 5 ? 15.0f : 1.0f));
  void *d_raw, *d_enc, *d_out;
  CUDA_OK(cudaMalloc(&d_raw, raw_bytes));
  CUDA_OK(cudaMalloc(&d_out, raw_bytes));
  CUDA_OK(cudaMalloc(&d_enc, raw_bytes + (size_t{1} << 20) * 64));
  CUDA_OK(cudaMemcpy(d_raw, host.data(), raw_bytes, cudaMemcpyHostToDevice));
  const double copy_ms = MedianMs(reps, s, [&] {
    CUDA_OK(cudaMemcpyAsync(d_out, d_raw, raw_bytes, cudaMemcpyDeviceToDevice, s));
  });
  const double copy_gbps = raw_bytes / copy_ms / 1e6;
  const Codec codecs[] = {{"int8:kivi", kCodecInt8, kPerChannel},       {"int8:token", kCodecInt8, kPerToken},
                          {"int4:kivi", kCodecInt4, kPerChannel},       {"int4:token", kCodecInt4, kPerToken},
                          {"fp8-e4m3:kivi", kCodecFp8E4M3, kPerChannel}, {"fp8-e5m2:kivi", kCodecFp8E5M2, kPerChannel},
                          {"bf16", kCodecBf16, kPerToken}};
  if (json) {
    std::printf("{\"gpu\": \"%s\", \"shape\": \"%ux(L%u H%u T%u D%u) fp16\", \"raw_bytes\": %zu, \"d2d_copy_gbps\": %.1f, "
                "\"rows\": [",
                prop.name, blocks, layers, heads, tokens, dim, raw_bytes, copy_gbps);
  } else {
    std::printf("gpu_codec_bench: %s, %u blocks of L%u H%u T%u D%u fp16 (%.0f MiB), medians of %d\n", prop.name, blocks,
                layers, heads, tokens, dim, raw_bytes / 1048576.0, reps);
    std::printf("cudaMemcpy D2D (same run): %.1f GB/s\n", copy_gbps);
    std::printf("%-16s %7s %10s %10s %8s %8s\n", "codec", "ratio", "enc GB/s", "dec GB/s", "enc/d2d", "dec/d2d");
  }
  bool first = true;
  for (const Codec& c : codecs) {
    const PlaneGeom k = MakePlaneGeom(c.kind, c.key_axis, 128, tokens, dim, kElemFp16, 0);
    const PlaneGeom v = MakePlaneGeom(c.kind, kPerToken, 128, tokens, dim, kElemFp16, 0);
    PlaneSet sets[2];
    size_t raw_base[2], enc_base[2];
    SegmentPlaneSets(k, v, outer, heads, sets, raw_base, enc_base);
    const size_t enc_bytes = size_t{outer} * heads * (k.bytes + v.bytes);
    auto* raw = static_cast<uint8_t*>(d_raw);
    auto* enc = static_cast<uint8_t*>(d_enc);
    auto* out = static_cast<uint8_t*>(d_out);
    const double enc_ms = MedianMs(reps, s, [&] {
      for (int kv = 0; kv < 2; ++kv) CUDA_OK(EncodePlanes(sets[kv], raw + raw_base[kv], enc + enc_base[kv], s));
    });
    const double dec_ms = MedianMs(reps, s, [&] {
      for (int kv = 0; kv < 2; ++kv) CUDA_OK(DecodePlanes(sets[kv], enc + enc_base[kv], out + raw_base[kv], kElemFp16, s));
    });
    const double eg = raw_bytes / enc_ms / 1e6, dg = raw_bytes / dec_ms / 1e6;
    const double ratio = static_cast<double>(raw_bytes) / static_cast<double>(enc_bytes);
    if (json) {
      std::printf("%s{\"codec\": \"%s\", \"ratio\": %.3f, \"encode_gbps\": %.1f, \"decode_gbps\": %.1f, "
                  "\"encode_vs_d2d\": %.3f, \"decode_vs_d2d\": %.3f}",
                  first ? "" : ", ", c.name, ratio, eg, dg, eg / copy_gbps, dg / copy_gbps);
    } else {
      std::printf("%-16s %7.2f %10.1f %10.1f %8.2f %8.2f\n", c.name, ratio, eg, dg, eg / copy_gbps, dg / copy_gbps);
    }
    first = false;
  }
  if (json) std::printf("]}\n");
  cudaFree(d_raw);
  cudaFree(d_enc);
  cudaFree(d_out);
  cudaStreamDestroy(s);
  return 0;
}
