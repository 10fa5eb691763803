// coordinator/decode/world_run.h — frame sessions of the reference world
// model with their KV in kvmesh (docs/worldmodel.md): each frame is matched
// against its stream (kvmesh/frame_stream.h), reused blocks and the temporal
// context are read back from the nodes into registered memory, the other
// patches are computed and put. `kvmesh worldmodel` and the tests run it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "coordinator/decode/frame_gen.h"
#include "coordinator/decode/world_model.h"
#include "kvmesh/frame_stream.h"
#include "kvmesh/router.h"

namespace kvmesh::decode {

struct WorldFrameStats {
  uint32_t frame = 0;
  uint32_t patches = 0, reused = 0;
  double ms = 0;               // match, reads, compute, puts: the whole frame
  uint64_t bytes_put = 0;      // KV bytes this frame stored
  uint64_t blocks_read = 0;    // blocks read back (reused and temporal context)
  uint64_t history_misses = 0; // context blocks that missed (left out of attention)
  uint32_t refreshed = 0;      // matched patches computed after all (refresh_deviation)
};

struct WorldStreamOptions {
  FrameStreamOptions stream;  // width/height/patch are taken from the model
  uint32_t frames = 64;
  std::function<void(uint32_t done)> progress;
  // Keep every frame's blocks (computed and reused) and sources in the
  // result, for breaking the error down (`kvmesh worldmodel --diagnose`).
  bool keep_blocks = false;
  // Exact reuse: a patch also needs its block's fingerprint
  // (WorldModel::Signatures: its tokens through the model's spatial and
  // temporal dependencies) to equal the one this frame would compute it from,
  // so a reused block is the block recomputation would produce. Off: the
  // pixel gate alone decides (an approximation: context is not checked).
  bool context_gate = false;
};

struct WorldStreamResult {
  std::vector<WorldFrameStats> frames;
  std::vector<float> logits;  // [frame][patch][vocab]
  FrameStreamStats stats;
  // keep_blocks only: [frame][patch][BlockFloats] as the model used them, and
  // [frame][patch] the frame that computed the block (== frame: computed).
  std::vector<float> blocks;
  std::vector<uint32_t> source_frame;
};

// The part of a frame between FrameStream::Match and Commit, shared by
// RunWorldStream and `kvmesh bench-serve --workload worldmodel`: reads the
// reused blocks and the computed patches' temporal context (a block `held`
// returns is taken from the caller's memory; the others are read from kvmesh
// into registered memory, region()), and computes the frame into blocks()
// and logits(). Owns its scratch: one frame at a time (not thread-safe).
class WorldFrameStep {
 public:
  // The caller's copy of a block (BlockFloats floats), or nullptr.
  using Held = std::function<const float*(const BlockKey&)>;
  WorldFrameStep(const WorldModel& model, uint32_t window);
  // Registered memory for the reads (RegionBytes() bytes), before Run.
  size_t RegionBytes() const { return slots_ * bb_; }
  void SetRegion(std::byte* base);

  struct Counts {
    uint64_t blocks_read = 0;     // reused and context blocks read from kvmesh
    uint64_t history_misses = 0;  // context blocks that missed (left out of attention)
  };
  // in: pixels, action, tokens and refresh settings (its reused and history
  // are filled here). With in.refresh_deviation > 0 every patch's context is
  // read. Reused blocks are read from kvmesh unless `held` has every one (a
  // miss makes the patch computed, m is rewritten). missed (empty or one per
  // patch): 1 where a context block of the patch missed.
  Status Run(Router& router, FrameStream& st, FrameMatch& m, WorldFrameInput in, const Held& held, Counts& counts,
             std::span<uint8_t> missed = {});

  std::span<float> blocks() { return blocks_; }
  std::span<float> logits() { return logits_; }
  // The block each patch used in the last Run: reused (held or read) or computed.
  const float* used(uint32_t p) const { return reused_[p] ? reused_[p] : blocks_.data() + size_t{p} * bf_; }
  // The computed blocks, one span per patch, for FrameStream::Commit.
  std::span<const std::span<const std::byte>> put_src() const { return put_src_; }

 private:
  const WorldModel& model_;
  uint32_t n_;
  size_t bf_, bb_, slots_;
  std::byte* base_ = nullptr;
  std::vector<float> blocks_, logits_;
  std::vector<const float*> reused_;
  std::vector<std::vector<const float*>> history_;
  std::vector<std::span<std::byte>> reused_dst_;
  std::vector<std::span<const std::byte>> put_src_;
  std::map<BlockKey, size_t> ctx_slot_;
  std::vector<GetItem> gets_;
  std::vector<std::vector<BlockKey>> hist_keys_;
};

// A stream's tokens and, with the context gate, its blocks' fingerprints:
// WorldModel::Tokenize's hysteresis needs the previous frame's tokens and
// WorldModel::Signatures the fingerprints of the frames in the window. One per
// stream (RunWorldStream; bench-serve's world engines keep one per session,
// and wm-off one for its tokens). Per frame: Begin, then Match/Commit with
// tags(), Missed for each patch whose context missed (before Commit), End.
class WorldStreamContext {
 public:
  // window: the stream's match window (frames).
  WorldStreamContext(const WorldModel& model, uint32_t window, bool context_gate);
  // Tokenizes the frame and, with the gate, fingerprints its patches.
  Status Begin(std::span<const uint8_t> pixels);
  std::span<const uint32_t> tokens() const { return tokens_; }
  // The per-patch tags for FrameStream::Match and Commit (empty without the gate).
  std::span<const uint64_t> tags() const { return gate_ ? std::span<const uint64_t>(tags_) : std::span<const uint64_t>(); }
  // Patch p was computed from another history than its fingerprint says (a
  // context block missed): a fingerprint nothing else has keeps it, and what
  // attends to it later, from being reused as if it were.
  void Missed(uint32_t p);
  // The frame's fingerprints join the window (after Commit).
  void End();
  bool context_gate() const { return gate_; }

 private:
  const WorldModel& model_;
  bool gate_;
  uint32_t keep_, frame_ = 0;
  std::vector<uint32_t> tokens_, prev_;
  std::vector<uint64_t> tsig_, tags_;
  std::deque<std::vector<uint64_t>> window_;
  std::vector<const uint64_t*> hist_;
};

// Runs frames [0, o.frames) of `gen` through `model` over `router`; ends the
// stream before returning. The router's model must be model.config().Spec().
Result<WorldStreamResult> RunWorldStream(Router& router, const WorldModel& model, const FrameGenerator& gen,
                                         const WorldStreamOptions& o);

struct LogitError {
  double mean_abs = 0, max_abs = 0;
  double token_agreement = 1;  // share of patches whose predicted token agrees
};
// a against the reference b (same shape, [..][vocab]).
LogitError CompareLogits(std::span<const float> a, std::span<const float> b, uint32_t vocab);
// Standard deviation of the values (the logit scale errors are judged against).
double LogitScale(std::span<const float> logits);

}  // namespace kvmesh::decode
