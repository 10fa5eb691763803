// router/frame_stream.cc — similarity-gated reuse of frame KV over a Router
// (include/kvmesh/frame_stream.h, docs/worldmodel.md).
#include "kvmesh/frame_stream.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "common/hash.h"
#include "kvmesh/router.h"

namespace kvmesh {

size_t FrameMatch::reused() const {
  return static_cast<size_t>(std::count_if(patches.begin(), patches.end(), [](const PatchMatch& p) { return p.reused; }));
}

Status FrameMatchOptions::Validate() const {
  if (window == 0) return InvalidArgument("frame match: window must be >= 1");
  if (!(ssim_threshold >= -1.0f && ssim_threshold <= 1.0f))
    return InvalidArgument("frame match: ssim_threshold must be in [-1, 1]");
  if (!(change_threshold >= 0.0f && change_threshold <= 1.0f))
    return InvalidArgument("frame match: change_threshold must be in [0, 1]");
  if (pixel_delta > 255) return InvalidArgument("frame match: pixel_delta must be in [0, 255]");
  if (!(refresh_deviation >= 0.0f)) return InvalidArgument("frame match: refresh_deviation must be >= 0");
  if (motion_radius > 4) return InvalidArgument("frame match: motion_radius must be in [0, 4]");
  return Status::Ok();
}

FrameMatchOptions FrameMatchOptions::FromConfig(const FramesConfig& c) {
  FrameMatchOptions o;
  o.window = c.window;
  o.ssim_threshold = static_cast<float>(c.ssim_threshold);
  o.change_threshold = static_cast<float>(c.change_threshold);
  o.pixel_delta = c.pixel_delta;
  o.recompute_radius = c.recompute_radius;
  o.refresh_deviation = static_cast<float>(c.refresh_deviation);
  o.max_age = c.max_age;
  o.motion_radius = c.motion_radius;
  return o;
}

float PatchSsim(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  const size_t n = std::min(a.size(), b.size());
  if (n == 0) return 1.0f;
  double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    sa += x;
    sb += y;
    saa += x * x;
    sbb += y * y;
    sab += x * y;
  }
  const double inv = 1.0 / static_cast<double>(n);
  const double ma = sa * inv, mb = sb * inv;
  const double va = saa * inv - ma * ma, vb = sbb * inv - mb * mb, cov = sab * inv - ma * mb;
  constexpr double kC1 = (0.01 * 255) * (0.01 * 255), kC2 = (0.03 * 255) * (0.03 * 255);
  return static_cast<float>(((2 * ma * mb + kC1) * (2 * cov + kC2)) / ((ma * ma + mb * mb + kC1) * (va + vb + kC2)));
}

float PatchChangeRate(std::span<const uint8_t> a, std::span<const uint8_t> b, uint32_t delta) {
  const size_t n = std::min(a.size(), b.size());
  if (n == 0) return 0.0f;
  size_t changed = 0;
  for (size_t i = 0; i < n; ++i) changed += static_cast<uint32_t>(std::abs(int{a[i]} - int{b[i]})) > delta;
  return static_cast<float>(changed) / static_cast<float>(n);
}

struct FrameStream::Impl {
  uint64_t group = 0;  // the stream's key group: model, tenant salt and stream id
  struct Frame {
    uint32_t number = 0;
    std::vector<BlockKey> keys;  // per patch
  };
  std::deque<Frame> window;  // oldest first
  struct Block {
    uint32_t refs = 0;          // frames of the window naming it
    uint32_t source_frame = 0;  // the frame that computed it
    uint32_t patch = 0;
    std::vector<uint8_t> pixels;  // the patch it was computed from
    bool tagged = false;          // Commit was given a tag for it
    uint64_t tag = 0;
  };
  std::map<BlockKey, Block> blocks;
  // Scratch reused across frames.
  std::vector<uint8_t> patch_px;
  std::vector<PutItem> puts;
  std::vector<GetItem> gets;
  std::vector<size_t> get_patch;
  std::vector<BlockKey> to_release;

  BlockKey NewKey(uint32_t frame, uint32_t patch) const {
    return GroupedKey(group, Mix64((uint64_t{frame} << 32 | patch) ^ Mix64(group)), /*co_evict=*/false);
  }
  void Unref(const BlockKey& k) {
    auto it = blocks.find(k);
    if (it == blocks.end()) return;
    if (--it->second.refs == 0) {
      to_release.push_back(k);
      blocks.erase(it);
    }
  }
};

FrameStream::FrameStream(Router& r, FrameStreamOptions o) : router_(r), o_(std::move(o)), impl_(new Impl) {}

FrameStream::~FrameStream() { (void)End(); }

Result<std::unique_ptr<FrameStream>> FrameStream::Open(Router& router, FrameStreamOptions o) {
  if (o.patch == 0 || o.width == 0 || o.height == 0 || o.width % o.patch != 0 || o.height % o.patch != 0)
    return InvalidArgument("frame stream: width and height must be positive multiples of patch");
  KVMESH_RETURN_IF_ERROR(o.match.Validate());
  std::unique_ptr<FrameStream> s(new FrameStream(router, std::move(o)));
  // The group is the key of a short token chain naming the stream, so the
  // router's model id and tenant salt enter it exactly as they enter token keys.
  const uint32_t bt = std::max<uint32_t>(1, router.block_tokens());
  std::vector<TokenId> tokens(std::max<uint32_t>(bt, 4), 0);
  const uint64_t id = s->o_.stream_id;
  tokens[0] = static_cast<TokenId>(0x574D4653);  // "WMFS"
  tokens[1] = static_cast<TokenId>(static_cast<uint32_t>(id));
  tokens[2] = static_cast<TokenId>(static_cast<uint32_t>(id >> 32));
  tokens.resize((tokens.size() + bt - 1) / bt * bt, 0);
  const std::vector<BlockKey> keys = router.Keys(tokens, s->o_.request);
  if (keys.empty()) return Internal("frame stream: no key for the stream id");
  s->impl_->group = Mix64(keys.back().hi ^ Mix64(keys.back().lo));
  s->impl_->patch_px.resize(size_t{s->o_.patch} * s->o_.patch);
  return s;
}

void FrameStream::ExtractPatch(std::span<const uint8_t> pixels, uint32_t p, uint8_t* out) const {
  const uint32_t P = o_.patch, gx = p % grid_w(), gy = p / grid_w();
  for (uint32_t y = 0; y < P; ++y)
    std::memcpy(out + size_t{y} * P, pixels.data() + (size_t{gy} * P + y) * o_.width + size_t{gx} * P, P);
}

Result<FrameMatch> FrameStream::Match(std::span<const uint8_t> pixels, const FrameMatchOptions* gate,
                                      std::span<const uint64_t> tags) const {
  if (pixels.size() != size_t{o_.width} * o_.height)
    return InvalidArgument("frame stream: frame has " + std::to_string(pixels.size()) + " pixels, expected " +
                           std::to_string(size_t{o_.width} * o_.height));
  if (!tags.empty() && tags.size() != num_patches())
    return InvalidArgument("frame stream: Match needs no tags or one per patch");
  const FrameMatchOptions& g = gate ? *gate : o_.match;
  if (gate) KVMESH_RETURN_IF_ERROR(g.Validate());
  FrameMatch m;
  m.frame = next_frame_;
  const uint32_t n = num_patches();
  m.patches.resize(n);
  std::vector<uint8_t>& px = impl_->patch_px;
  std::vector<uint32_t> cand;
  const int32_t gw = static_cast<int32_t>(grid_w()), gh = static_cast<int32_t>(grid_h());
  const size_t first = impl_->window.size() > g.window ? impl_->window.size() - g.window : 0;
  for (uint32_t p = 0; p < n; ++p) {
    PatchMatch& pm = m.patches[p];
    pm.key = impl_->NewKey(m.frame, p);
    pm.source_frame = m.frame;
    pm.source_patch = p;
    if (g.mode == FrameReuse::kOff) continue;
    ExtractPatch(pixels, p, px.data());
    const BlockKey* best = nullptr;
    float best_ssim = -2.0f, best_change = 1.0f;
    bool best_pass = false;
    // Candidate positions: p itself first, then (motion_radius) its grid
    // neighbours, so a tie keeps the same position.
    cand.assign(1, p);
    const int32_t MR = g.mode == FrameReuse::kSimilar ? static_cast<int32_t>(g.motion_radius) : 0;
    const int32_t px0 = static_cast<int32_t>(p % gw), py0 = static_cast<int32_t>(p / gw);
    for (int32_t y = std::max(0, py0 - MR); y <= std::min(gh - 1, py0 + MR); ++y)
      for (int32_t x = std::max(0, px0 - MR); x <= std::min(gw - 1, px0 + MR); ++x)
        if (x != px0 || y != py0) cand.push_back(static_cast<uint32_t>(y * gw + x));
    for (const uint32_t q : cand) {
      const BlockKey* last = nullptr;
      for (size_t f = impl_->window.size(); f-- > first;) {  // newest first
        const BlockKey& k = impl_->window[f].keys[q];
        if (last && *last == k) continue;  // the same block as the newer frame
        last = &k;
        auto it = impl_->blocks.find(k);
        if (it == impl_->blocks.end()) continue;
        if (g.max_age > 0 && m.frame - it->second.source_frame > g.max_age) continue;  // too stale to reuse
        if (!tags.empty() && (!it->second.tagged || it->second.tag != tags[p])) continue;  // other inputs
        const std::vector<uint8_t>& src = it->second.pixels;
        float ssim, change;
        bool pass;
        if (g.mode == FrameReuse::kExact) {
          pass = std::memcmp(src.data(), px.data(), px.size()) == 0;
          ssim = pass ? 1.0f : PatchSsim(px, src);
          change = pass ? 0.0f : PatchChangeRate(px, src, g.pixel_delta);
        } else {
          ssim = PatchSsim(px, src);
          change = PatchChangeRate(px, src, g.pixel_delta);
          pass = ssim >= g.ssim_threshold && change <= g.change_threshold;
        }
        // Passing beats failing; then higher SSIM; ties keep the newer.
        if ((pass && !best_pass) || (pass == best_pass && ssim > best_ssim)) {
          best = &k;
          best_ssim = ssim;
          best_change = change;
          best_pass = pass;
        }
      }
    }
    if (best == nullptr) continue;
    pm.ssim = best_ssim;
    pm.change = best_change;
    if (best_pass) {
      pm.reused = true;
      pm.key = *best;
      pm.source_frame = impl_->blocks.at(*best).source_frame;
      pm.source_patch = impl_->blocks.at(*best).patch;
    }
  }
  if (g.recompute_radius > 0) {
    const int32_t R = static_cast<int32_t>(g.recompute_radius);
    std::vector<uint8_t> failed(n);
    for (uint32_t p = 0; p < n; ++p) failed[p] = !m.patches[p].reused;
    for (uint32_t p = 0; p < n; ++p) {
      if (failed[p]) continue;
      const int32_t x0 = static_cast<int32_t>(p) % gw, y0 = static_cast<int32_t>(p) / gw;
      bool near = false;
      for (int32_t y = std::max(0, y0 - R); y <= std::min(gh - 1, y0 + R) && !near; ++y)
        for (int32_t x = std::max(0, x0 - R); x <= std::min(gw - 1, x0 + R) && !near; ++x)
          near = failed[size_t(y) * gw + size_t(x)] != 0;
      if (!near) continue;
      PatchMatch& pm = m.patches[p];
      pm.reused = false;
      pm.blended = true;
      pm.key = impl_->NewKey(m.frame, p);
      pm.source_frame = m.frame;
      pm.source_patch = p;
    }
  }
  return m;
}

Status FrameStream::Refresh(FrameMatch& m, uint32_t p) const {
  if (p >= m.patches.size() || m.frame != next_frame_)
    return InvalidArgument("frame stream: Refresh of a patch outside the next frame's match");
  PatchMatch& pm = m.patches[p];
  if (!pm.reused) return Status::Ok();
  pm.reused = false;
  pm.blended = true;
  pm.key = impl_->NewKey(m.frame, p);
  pm.source_frame = m.frame;
  pm.source_patch = p;
  return Status::Ok();
}

Status FrameStream::GetReused(FrameMatch& m, std::span<const std::span<std::byte>> dst) {
  if (dst.size() != m.patches.size()) return InvalidArgument("frame stream: GetReused needs one dst per patch");
  auto& gets = impl_->gets;
  auto& idx = impl_->get_patch;
  gets.clear();
  idx.clear();
  for (size_t i = 0; i < m.patches.size(); ++i) {
    if (!m.patches[i].reused) continue;
    gets.push_back(GetItem{m.patches[i].key, dst[i], 0, {}});
    idx.push_back(i);
  }
  if (gets.empty()) return Status::Ok();
  const Status call = router_.GetBatch(gets, o_.request);
  for (size_t j = 0; j < gets.size(); ++j) {
    if (call.ok() && gets[j].status.ok()) continue;
    // A miss (evicted, corrupt, node gone) or a failed call: compute it instead.
    PatchMatch& pm = m.patches[idx[j]];
    pm.reused = false;
    pm.key = impl_->NewKey(m.frame, static_cast<uint32_t>(idx[j]));
    pm.source_frame = m.frame;
    pm.source_patch = static_cast<uint32_t>(idx[j]);
    ++stats_.reuse_misses;
  }
  return Status::Ok();
}

std::vector<BlockKey> FrameStream::History(uint32_t p) const {
  std::vector<BlockKey> out;
  const size_t first = impl_->window.size() > o_.match.window ? impl_->window.size() - o_.match.window : 0;
  for (size_t f = first; f < impl_->window.size(); ++f) out.push_back(impl_->window[f].keys[p]);
  return out;
}

uint32_t FrameStream::References(const BlockKey& key) const {
  auto it = impl_->blocks.find(key);
  return it == impl_->blocks.end() ? 0 : it->second.refs;
}

Status FrameStream::Commit(const FrameMatch& m, std::span<const uint8_t> pixels,
                           std::span<const std::span<const std::byte>> blocks, std::span<const uint64_t> tags) {
  if (m.frame != next_frame_) return FailedPrecondition("frame stream: Commit of a frame that is not the next");
  if (m.patches.size() != num_patches() || blocks.size() != num_patches() ||
      (!tags.empty() && tags.size() != num_patches()))
    return InvalidArgument("frame stream: Commit needs one match and one block slot per patch (and no tags or one per patch)");
  if (pixels.size() != size_t{o_.width} * o_.height) return InvalidArgument("frame stream: wrong frame size");
  auto& puts = impl_->puts;
  puts.clear();
  for (size_t i = 0; i < m.patches.size(); ++i)
    if (!m.patches[i].reused) puts.push_back(PutItem{m.patches[i].key, blocks[i], {}});
  const Status call = puts.empty() ? Status::Ok() : router_.PutBatch(puts, o_.request);
  for (const PutItem& it : puts) {
    if (call.ok() && (it.status.ok() || it.status.code() == StatusCode::kAlreadyExists)) {
      ++stats_.blocks_put;
      stats_.bytes_put += it.data.size();
    } else {
      ++stats_.put_failures;
    }
  }
  Impl::Frame fr;
  fr.number = m.frame;
  fr.keys.resize(m.patches.size());
  const size_t pp = size_t{o_.patch} * o_.patch;
  for (size_t i = 0; i < m.patches.size(); ++i) {
    const PatchMatch& pm = m.patches[i];
    fr.keys[i] = pm.key;
    Impl::Block& b = impl_->blocks[pm.key];
    if (b.refs == 0 && !pm.reused) {
      b.source_frame = m.frame;
      b.patch = static_cast<uint32_t>(i);
      b.pixels.resize(pp);
      ExtractPatch(pixels, static_cast<uint32_t>(i), b.pixels.data());
      b.tagged = !tags.empty();
      b.tag = tags.empty() ? 0 : tags[i];
    }
    ++b.refs;
    if (pm.reused) ++stats_.reused;
  }
  impl_->window.push_back(std::move(fr));
  // The window keeps as many frames as matching and history look at.
  while (impl_->window.size() > o_.match.window) {
    for (const BlockKey& k : impl_->window.front().keys) impl_->Unref(k);
    impl_->window.pop_front();
  }
  ++next_frame_;
  ++stats_.frames;
  stats_.patches += m.patches.size();
  ReleaseUnreferenced();
  return Status::Ok();  // blocks a node did not store are counted in put_failures
}

void FrameStream::ReleaseUnreferenced() {
  if (impl_->to_release.empty()) return;
  // An eviction hint: a node that cannot take it (gone, say) loses nothing.
  (void)router_.Release(impl_->to_release, o_.request);
  stats_.released += impl_->to_release.size();
  impl_->to_release.clear();
}

void FrameStream::Detach() {
  impl_->window.clear();
  impl_->blocks.clear();
  impl_->to_release.clear();
}

Status FrameStream::End() {
  if (!impl_) return Status::Ok();
  while (!impl_->window.empty()) {
    for (const BlockKey& k : impl_->window.front().keys) impl_->Unref(k);
    impl_->window.pop_front();
  }
  ReleaseUnreferenced();
  return Status::Ok();
}

}  // namespace kvmesh
