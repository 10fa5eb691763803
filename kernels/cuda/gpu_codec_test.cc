// gpu_codec_test: the CUDA codecs against the CPU oracle, byte for byte.
//
// For every quantising codec (and the fp16/bf16/raw conversions), both axes,
// several groups, head dims, token counts and input dtypes, on fresh random
// data (seed from the clock unless --seed N; printed for reruns): encode the
// planes of a multi-layer, multi-head segment on the GPU and on the CPU
// scalar path and compare the bytes; decode the CPU bytes on the GPU and on
// the CPU and compare the values' bytes. Exit 0 on success, 1 on a mismatch.
// Without a GPU it prints "SKIP: no GPU" and exits 0 (ctest marks it skipped).
//
// Needs only the CUDA runtime and kernels/{quant_cpu,quant_avx2,cpu_features}.cc.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/codec_math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/codec_cuda.h"
#include "kernels/quant_cpu.h"

using namespace kvmesh::kernels;
using namespace kvmesh::kernels::cuda;


namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t n) { CUDA_OK(cudaMalloc(&p, n ? n : 1)); }
  ~DeviceBuffer() { cudaFree(p); }
};

// Random elements with awkward values mixed in (zeros, large, tiny, inf, NaN)
// and outlier channels.
std::vector<uint8_t> RandomRaw(size_t elems, uint32_t dim, uint8_t type, std::mt19937_64& rng) {
  std::vector<uint8_t> b(elems * ElemSize(type));
  std::normal_distribution<float> n01;
  for (size_t i = 0; i < elems; ++i) {
    float v = n01(rng) * ((i % dim) % 17 == 3 ? 20.0f : 1.0f);
    switch (rng() % 64) {
      case 0: v = 0; break;
      case 1: v *= 5000.0f; break;
      case 2: v *= 1e-6f; break;
      case 3: v = (rng() & 1) ? INFINITY : -INFINITY; break;
      case 4: v = NAN; break;
      default: break;
    }
    StoreElem(b.data(), i, type, v);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("usage: gpu_codec_test [--seed N]\nThe CUDA codecs against the CPU reference (needs a GPU).\n");
      return 0;
    }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no GPU\n");
    return 0;
  }
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gpu_codec_test: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  const uint8_t codecs[] = {kCodecInt8, kCodecInt4, kCodecFp8E4M3, kCodecFp8E5M2, kCodecFp16, kCodecBf16, kCodecRaw};
  const uint32_t groups[] = {128, 32, 48};
  const uint32_t dims[] = {64, 128, 100, 256};
  const uint32_t tokens[] = {16, 64, 17};
  const uint8_t types[] = {kElemFp16, kElemBf16, kElemFp32};
  const uint32_t layers = 3, heads = 4;
  int cases = 0, failures = 0;
  for (uint8_t codec : codecs)
    for (uint8_t axis : {uint8_t{kPerToken}, uint8_t{kPerChannel}})
      for (uint32_t group : groups)
        for (uint32_t dim : dims)
          for (uint32_t t : tokens)
            for (uint8_t type : types) {
              if (!IsQuantising(codec) && (axis != kPerToken || group != 128)) continue;
              const PlaneGeom k = MakePlaneGeom(codec, axis, group, t, dim, type, 0);
              const PlaneGeom v = MakePlaneGeom(codec, kPerToken, group, t, dim, type, 0);
              PlaneSet sets[2];
              size_t raw_base[2], enc_base[2];
              SegmentPlaneSets(k, v, layers, heads, sets, raw_base, enc_base);
              const size_t raw_plane = size_t{t} * dim * ElemSize(type);
              const size_t raw_bytes = size_t{layers} * 2 * heads * raw_plane;
              const size_t enc_bytes = size_t{layers} * heads * (k.bytes + v.bytes);
              std::vector<uint8_t> raw = RandomRaw(raw_bytes / ElemSize(type), dim, type, rng);
              // CPU oracle: the scalar path, plane by plane, at the same offsets.
              std::vector<uint8_t> cpu(enc_bytes, 0xAB), gpu(enc_bytes, 0xCD);
              for (int kv = 0; kv < 2; ++kv)
                for (uint32_t l = 0; l < layers; ++l)
                  for (uint32_t h = 0; h < heads; ++h)
                    EncodePlaneScalar(sets[kv].geom,
                                      raw.data() + raw_base[kv] + l * sets[kv].raw_outer_stride + h * sets[kv].raw_inner_stride,
                                      cpu.data() + enc_base[kv] + l * sets[kv].enc_outer_stride + h * sets[kv].enc_inner_stride);
              DeviceBuffer d_raw(raw_bytes), d_enc(enc_bytes), d_out(raw_bytes);
              CUDA_OK(cudaMemcpyAsync(d_raw.p, raw.data(), raw_bytes, cudaMemcpyHostToDevice, stream));
              CUDA_OK(cudaMemsetAsync(d_enc.p, 0xCD, enc_bytes, stream));
              for (int kv = 0; kv < 2; ++kv)
                CUDA_OK(EncodePlanes(sets[kv], static_cast<uint8_t*>(d_raw.p) + raw_base[kv],
                                     static_cast<uint8_t*>(d_enc.p) + enc_base[kv], stream));
              CUDA_OK(cudaMemcpyAsync(gpu.data(), d_enc.p, enc_bytes, cudaMemcpyDeviceToHost, stream));
              // Decode the CPU's bytes on the GPU and on the CPU.
              CUDA_OK(cudaMemcpyAsync(d_enc.p, cpu.data(), enc_bytes, cudaMemcpyHostToDevice, stream));
              for (int kv = 0; kv < 2; ++kv)
                CUDA_OK(DecodePlanes(sets[kv], static_cast<uint8_t*>(d_enc.p) + enc_base[kv],
                                     static_cast<uint8_t*>(d_out.p) + raw_base[kv], type, stream));
              std::vector<uint8_t> gpu_dec(raw_bytes), cpu_dec(raw_bytes);
              CUDA_OK(cudaMemcpyAsync(gpu_dec.data(), d_out.p, raw_bytes, cudaMemcpyDeviceToHost, stream));
              CUDA_OK(cudaStreamSynchronize(stream));
              for (int kv = 0; kv < 2; ++kv)
                for (uint32_t l = 0; l < layers; ++l)
                  for (uint32_t h = 0; h < heads; ++h)
                    DecodePlaneScalar(sets[kv].geom,
                                      cpu.data() + enc_base[kv] + l * sets[kv].enc_outer_stride + h * sets[kv].enc_inner_stride,
                                      cpu_dec.data() + raw_base[kv] + l * sets[kv].raw_outer_stride + h * sets[kv].raw_inner_stride,
                                      type);
              ++cases;
              const bool enc_ok = cpu == gpu, dec_ok = cpu_dec == gpu_dec;
              if (!enc_ok || !dec_ok) {
                ++failures;
                size_t first = 0;
                const auto& a = enc_ok ? cpu_dec : cpu;
                const auto& b = enc_ok ? gpu_dec : gpu;
                while (first < a.size() && a[first] == b[first]) ++first;
                std::printf("MISMATCH %s: codec %u axis %u group %u dim %u tokens %u type %u, first differing byte %zu "
                            "(cpu %02x gpu %02x)\n",
                            enc_ok ? "decode" : "encode", codec, axis, group, dim, t, type, first, a[first], b[first]);
              }
            }
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf("gpu_codec_test: %d cases, %d mismatches (seed %llu)\n", cases, failures,
              static_cast<unsigned long long>(seed));
  return failures ? 1 : 0;
}
