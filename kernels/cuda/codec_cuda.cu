// CUDA kernels for the codecs: one thread per group computes scales (pass 1),
// one thread per code byte writes codes (pass 2), one thread per code byte
// decodes. Each thread's work is a function in codec_cuda_threads.h (shared
// with a CPU test of the index math); every value comes from codec_math.h.
#include "kernels/cuda/codec_cuda.h"
#include "kernels/cuda/codec_cuda_threads.h"

namespace kvmesh::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ size_t ThreadIndex() { return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; }

__global__ void GroupStatsKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t total) {
  const size_t i = ThreadIndex();
  if (i < total) threads::GroupStats(s, raw, enc, i);
}
__global__ void CodesKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t total) {
  const size_t i = ThreadIndex();
  if (i < total) threads::Codes(s, raw, enc, i);
}
__global__ void ConvertKernel(PlaneSet s, const uint8_t* raw, uint8_t* enc, size_t total) {
  const size_t i = ThreadIndex();
  if (i < total) threads::Convert(s, raw, enc, i);
}
__global__ void DecodeKernel(PlaneSet s, const uint8_t* enc, uint8_t* raw, uint8_t out_type, size_t total) {
  const size_t i = ThreadIndex();
  if (i < total) threads::Decode(s, enc, raw, out_type, i);
}

unsigned Blocks(size_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

bool Valid(const PlaneSet& s, const void* a, const void* b) {
  return a != nullptr && b != nullptr && s.outer > 0 && s.inner > 0 && s.geom.tokens > 0 && s.geom.dim > 0 &&
         s.geom.codec < kCodecKindCount && s.geom.codec != kCodecLowRank;
}

}  // namespace

cudaError_t EncodePlanes(const PlaneSet& s, const void* raw, void* enc, cudaStream_t stream) {
  if (!Valid(s, raw, enc)) return cudaErrorInvalidValue;
  const size_t planes = static_cast<size_t>(s.outer) * s.inner;
  const auto* in = static_cast<const uint8_t*>(raw);
  auto* out = static_cast<uint8_t*>(enc);
  if (IsQuantising(s.geom.codec)) {
    const size_t groups = planes * s.geom.groups;
    GroupStatsKernel<<<Blocks(groups), kThreads, 0, stream>>>(s, in, out, groups);
    const size_t total = planes * threads::CodesPerPlane(s.geom);
    CodesKernel<<<Blocks(total), kThreads, 0, stream>>>(s, in, out, total);
  } else {
    const size_t total = planes * threads::ConvertPerPlane(s.geom);
    ConvertKernel<<<Blocks(total), kThreads, 0, stream>>>(s, in, out, total);
  }
  return cudaGetLastError();
}

cudaError_t DecodePlanes(const PlaneSet& s, const void* enc, void* raw, uint8_t out_type, cudaStream_t stream) {
  if (!Valid(s, enc, raw) || out_type > kElemFp32) return cudaErrorInvalidValue;
  const size_t total = static_cast<size_t>(s.outer) * s.inner * threads::DecodePerPlane(s.geom);
  DecodeKernel<<<Blocks(total), kThreads, 0, stream>>>(s, static_cast<const uint8_t*>(enc), static_cast<uint8_t*>(raw),
                                                       out_type, total);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels::cuda
