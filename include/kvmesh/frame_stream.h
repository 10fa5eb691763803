// kvmesh/frame_stream.h — KV of video frames reused across frames by
// similarity (docs/worldmodel.md).
//
// A world model keeps the KV of every past frame, and most of a new frame is
// the background of the frames before it. A FrameStream is one session of
// frames (gray 8-bit, row-major, cut into square patches) over a Router. For
// each new frame it matches every patch against the same patch position in
// the stream's last `window` frames; a patch that matches reuses the block the
// earlier frame stored (the same key: a reference, counted by the stream, not
// a copy), the others are computed by the caller and put under new keys.
//
//   auto s = kvmesh::FrameStream::Open(router, so).value();
//   kvmesh::FrameMatch m = s->Match(pixels).value();      // which patches reuse
//   s->GetReused(m, dst);                                   // their blocks, into dst (registered memory or not)
//   ... compute the patches with !m.patches[i].reused, reading s->History(p) for temporal context ...
//   s->Commit(m, pixels, computed_blocks);                  // puts the computed blocks, slides the window
//   s->End();                                               // releases the stream's blocks
//
// Matching (mode kSimilar) compares a patch with the pixels its candidate
// block was computed from (not with the frame that last referenced it, so a
// slow drift cannot chain a block forever): it passes when the patch's SSIM
// (one window over the patch, 8-bit constants) is >= ssim_threshold and the
// share of pixels that moved by more than pixel_delta is <= change_threshold;
// the passing candidate with the highest SSIM wins (ties: the most recent).
// kExact passes only pixel-identical patches; kOff reuses nothing.
//
// Keys: a stream's blocks are grouped keys (kvmesh/block_key.h) whose group is
// derived from the router's model and tenant salt and the stream id, so a
// stream's blocks land on one node (per replica rank) and two tenants (two
// salts) never share a block; co-eviction is off, so losing one block costs
// one recomputation, not the stream.
//
// Reference counting: the stream counts, for each block, the frames of its
// window that reference it. Blocks read as reused or as history are refreshed
// on their node by the read; a block no frame of the window references any
// more is handed to Router::Release (the next to leave its node), and End()
// releases every block the stream still references.
//
// Failures: a reused block that misses (evicted, corrupt, its node dead) turns
// that patch into a computed one (GetReused rewrites its PatchMatch), so a
// dead node costs recomputation, never wrong KV.
//
// Thread-safety: one FrameStream is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kvmesh/block_key.h"
#include "kvmesh/config.h"
#include "kvmesh/request.h"
#include "kvmesh/status.h"

namespace kvmesh {

class Router;

enum class FrameReuse : uint8_t {
  kOff = 0,      // every patch computed
  kExact = 1,    // reuse pixel-identical patches only (what exact-hash caches can do)
  kSimilar = 2,  // SSIM and change-rate gating
};

// The gate of one match (defaults: docs/worldmodel.md, the tau/rho sweep).
struct FrameMatchOptions {
  FrameReuse mode = FrameReuse::kSimilar;
  uint32_t window = 16;          // frames of the stream a patch is matched against (>= 1)
  float ssim_threshold = 0.92f;  // tau: SSIM >= tau ...
  float change_threshold = 0.05f;  // rho: ... and share of changed pixels <= rho
  uint32_t pixel_delta = 16;     // a pixel changed when |new - old| > pixel_delta (0..255)
  // CacheBlend-style repair: a patch that passes the gate is still computed
  // when a patch within this grid distance (Chebyshev) failed it: the reused
  // patches whose context changed most. 0: off.
  uint32_t recompute_radius = 0;
  // CacheBlend-style refresh chosen by measured deviation (0: off). A hint to
  // the model that computes the frame: it runs its first layer for every
  // patch and computes, through every layer, the reused patches whose fresh
  // second-layer K and V moved from the reused block's by more than this
  // (relative L2); the caller marks them with Refresh().
  float refresh_deviation = 0.0f;
  // A block computed more than max_age frames before this one fails the gate
  // (the patch is computed again: bounds how stale a reused block's context
  // gets). 0: no cap.
  uint32_t max_age = 0;
  // Motion neighbourhood: also match the blocks of patch positions within
  // this grid distance (Chebyshev) in the window, so a camera pan finds the
  // background where it was. 0: the same position only.
  uint32_t motion_radius = 0;

  Status Validate() const;
  // The cluster's defaults ($.frames).
  static FrameMatchOptions FromConfig(const FramesConfig& c);
};

struct FrameStreamOptions {
  uint64_t stream_id = 0;
  uint32_t width = 64, height = 64;  // pixels; multiples of patch
  uint32_t patch = 8;                // square patch side in pixels
  FrameMatchOptions match;
  RequestOptions request;  // priority, slice, timeout of the stream's calls
};

struct PatchMatch {
  bool reused = false;
  BlockKey key;               // reused: the earlier frame's block; computed: the key Commit puts
  uint32_t source_frame = 0;  // the frame whose computation made the block
  uint32_t source_patch = 0;  // the patch position it was computed at (motion_radius: may differ)
  float ssim = 0.0f;          // against the chosen (or best) candidate; 0 when none
  float change = 1.0f;        // share of changed pixels against that candidate
  bool blended = false;       // passed the gate, computed by recompute_radius
};

struct FrameMatch {
  uint32_t frame = 0;                // this frame's number in the stream (0, 1, ...)
  std::vector<PatchMatch> patches;   // row-major over the patch grid
  size_t reused() const;
};

struct FrameStreamStats {
  uint64_t frames = 0, patches = 0, reused = 0;
  uint64_t blocks_put = 0, bytes_put = 0;  // blocks (bytes) this stream stored
  uint64_t put_failures = 0;               // computed blocks a node did not store
  uint64_t reuse_misses = 0;               // reused blocks that missed (recomputed)
  uint64_t released = 0;                   // blocks handed to Router::Release
};

// SSIM of two equally sized 8-bit patches as one window (C1 = (0.01*255)^2,
// C2 = (0.03*255)^2), and the share of pixels with |a - b| > delta.
float PatchSsim(std::span<const uint8_t> a, std::span<const uint8_t> b);
float PatchChangeRate(std::span<const uint8_t> a, std::span<const uint8_t> b, uint32_t delta);

class FrameStream {
 public:
  static Result<std::unique_ptr<FrameStream>> Open(Router& router, FrameStreamOptions options);
  ~FrameStream();  // End() when the caller did not

  const FrameStreamOptions& options() const { return o_; }
  uint32_t grid_w() const { return o_.width / o_.patch; }
  uint32_t grid_h() const { return o_.height / o_.patch; }
  uint32_t num_patches() const { return grid_w() * grid_h(); }
  uint32_t next_frame() const { return next_frame_; }
  const FrameStreamStats& stats() const { return stats_; }

  // Copies patch p of a frame (patch * patch bytes) into out.
  void ExtractPatch(std::span<const uint8_t> pixels, uint32_t p, uint8_t* out) const;

  // Matches the next frame against the window (state unchanged). `gate`
  // overrides the stream's options for this frame (per request). `tags`
  // (empty, or one per patch): a fingerprint of what the caller's model would
  // compute patch p's block from; a candidate then also needs the tag Commit
  // stored with it to equal tags[p] (a block computed from other inputs, e.g.
  // another context, is not reused however similar its pixels).
  Result<FrameMatch> Match(std::span<const uint8_t> pixels, const FrameMatchOptions* gate = nullptr,
                           std::span<const uint64_t> tags = {}) const;

  // Reads the block of every reused patch i into dst[i] (dst.size() ==
  // patches; entries of computed patches are ignored). A miss makes that
  // patch computed (reused = false, a fresh key).
  Status GetReused(FrameMatch& m, std::span<const std::span<std::byte>> dst);

  // Turns reused patch p of m into a computed one (a fresh key; blended =
  // true): the caller recomputed it (refresh_deviation) and Commit puts it.
  Status Refresh(FrameMatch& m, uint32_t p) const;

  // Keys of patch p in the window's frames, oldest first (one per frame; a
  // block several frames reuse appears once per frame). The temporal context
  // the next frame attends to.
  std::vector<BlockKey> History(uint32_t p) const;
  // How many frames of the window reference `key` (0: none).
  uint32_t References(const BlockKey& key) const;

  // Puts blocks[i] for every computed patch i (entries of reused patches are
  // ignored), appends the frame to the window and drops the oldest frame
  // beyond it. A block a node refused (or a dead node) is still named by the
  // frame, counted in stats().put_failures, and the call still succeeds: a
  // later read misses and recomputes. m must come from Match of this frame.
  // tags (empty, or one per patch): stored with each computed block for Match.
  Status Commit(const FrameMatch& m, std::span<const uint8_t> pixels,
                std::span<const std::span<const std::byte>> blocks, std::span<const uint64_t> tags = {});

  // Releases every block the stream references and forgets the window
  // (Router::Release, a hint: a node that cannot take it loses nothing).
  Status End();
  // Forgets the window without calling the router: for a stream whose
  // router is gone (closed), whose nodes dropped its blocks with it.
  void Detach();

 private:
  struct Impl;
  FrameStream(Router& r, FrameStreamOptions o);
  void ReleaseUnreferenced();
  Router& router_;
  FrameStreamOptions o_;
  uint32_t next_frame_ = 0;
  FrameStreamStats stats_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvmesh
