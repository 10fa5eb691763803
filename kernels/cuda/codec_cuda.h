// kernels/cuda/codec_cuda.h — CUDA encode/decode of the quantising codecs
// (int8, int4, fp8 e4m3/e5m2) and the fp16/bf16/raw conversions.
//
// The kernels evaluate the very functions of kernels/codec_math.h that the
// CPU scalar path uses (built with --fmad=false so nothing is fused), so a
// plane encoded here is byte-identical to the CPU's, and either decodes
// anywhere. They write plane bodies; the block header and its checksum are
// written by the host (kernels/block_format.h), which is what makes a block
// encoded on a GPU indistinguishable from one encoded on a CPU.
//
// Shape after CUTLASS's adapters: check the arguments, run on the caller's
// stream and buffers. Nothing here allocates, synchronises or owns a stream.
// Header-only dependencies (C++17, CUDA runtime), so it builds on a bare GPU
// machine (kernels/cuda/CMakeLists.txt also works as a top-level project).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/codec_math.h"
#include "kernels/cuda/codec_cuda_threads.h"  // PlaneSet, SegmentPlaneSets

namespace kvmesh::kernels::cuda {

// Encodes every plane of `set` (raw -> enc), padding included.
// cudaErrorInvalidValue for lowrank, an empty set or null pointers; else the launch status.
cudaError_t EncodePlanes(const PlaneSet& set, const void* raw, void* enc, cudaStream_t stream);
// Decodes every plane of `set` (enc -> raw elements of out_type).
cudaError_t DecodePlanes(const PlaneSet& set, const void* enc, void* raw, uint8_t out_type, cudaStream_t stream);

}  // namespace kvmesh::kernels::cuda
