#include "coordinator/decode/world_run.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include "common/hash.h"

namespace kvmesh::decode {

WorldFrameStep::WorldFrameStep(const WorldModel& model, uint32_t window)
    : model_(model),
      n_(model.config().num_patches()),
      bf_(model.config().BlockFloats()),
      bb_(model.config().BlockBytes()),
      slots_(size_t{n_} * (1 + window)) {
  blocks_.resize(size_t{n_} * bf_);
  logits_.resize(size_t{n_} * model.config().vocab);
  reused_.assign(n_, nullptr);
  history_.resize(n_);
  hist_keys_.resize(n_);
  put_src_.resize(n_);
  for (uint32_t p = 0; p < n_; ++p)
    put_src_[p] = {reinterpret_cast<const std::byte*>(blocks_.data() + size_t{p} * bf_), bb_};
}

void WorldFrameStep::SetRegion(std::byte* base) {
  base_ = base;
  reused_dst_.resize(n_);
  for (uint32_t p = 0; p < n_; ++p) reused_dst_[p] = {base_ + size_t{p} * bb_, bb_};
}

Status WorldFrameStep::Run(Router& router, FrameStream& st, FrameMatch& m, WorldFrameInput in, const Held& held,
                           Counts& counts, std::span<uint8_t> missed) {
  if (base_ == nullptr) return FailedPrecondition("world frame step: no region");
  if (m.patches.size() != n_ || (!missed.empty() && missed.size() != n_))
    return InvalidArgument("world frame step: the match or `missed` does not fit the model");
  auto slot = [&](size_t i) { return base_ + i * bb_; };
  auto copy = [&](const BlockKey& k) -> const float* { return held ? held(k) : nullptr; };
  // The caller's copies serve the reused blocks when they hold every one;
  // otherwise all are read (a miss turns its patch into a computed one).
  bool all_held = static_cast<bool>(held);
  for (uint32_t p = 0; p < n_ && all_held; ++p)
    if (m.patches[p].reused && !copy(m.patches[p].key)) all_held = false;
  if (!all_held) KVMESH_RETURN_IF_ERROR(st.GetReused(m, reused_dst_));
  // Temporal context of the computed patches (with refresh, of every patch:
  // the first layer runs for all), each distinct block read once.
  const bool blend = in.refresh_deviation > 0;
  ctx_slot_.clear();
  gets_.clear();
  for (uint32_t p = 0; p < n_; ++p) {
    hist_keys_[p].clear();
    if (m.patches[p].reused && !blend) continue;
    hist_keys_[p] = st.History(p);
    for (const BlockKey& k : hist_keys_[p])
      if (!copy(k) && ctx_slot_.emplace(k, gets_.size()).second)
        gets_.push_back(GetItem{k, {slot(n_ + gets_.size()), bb_}, 0, {}});
  }
  if (!gets_.empty()) {
    const Status call = router.GetBatch(gets_, st.options().request);
    if (!call.ok())  // no answer at all (the stream's node is gone): every context block misses
      for (GetItem& g : gets_) g.status = call;
  }
  for (uint32_t p = 0; p < n_; ++p) {
    reused_[p] = nullptr;
    if (m.patches[p].reused) {
      const float* c = all_held ? copy(m.patches[p].key) : nullptr;
      reused_[p] = c ? c : reinterpret_cast<const float*>(slot(p));
    }
    history_[p].clear();
    if (!missed.empty()) missed[p] = 0;
    for (const BlockKey& k : hist_keys_[p]) {
      if (const float* c = copy(k)) {
        history_[p].push_back(c);
        continue;
      }
      const size_t g = ctx_slot_.at(k);
      if (!gets_[g].status.ok()) {  // a miss: attend to what is left
        ++counts.history_misses;
        if (!missed.empty()) missed[p] = 1;
        continue;
      }
      history_[p].push_back(reinterpret_cast<const float*>(slot(n_ + g)));
    }
  }
  counts.blocks_read += (all_held ? 0 : m.reused()) + gets_.size();
  in.reused = reused_;
  in.history = history_;
  KVMESH_RETURN_IF_ERROR(model_.ComputeFrame(in, blocks_, logits_));
  // Patches the model refreshed are computed ones now.
  if (in.refreshed)
    for (uint32_t p = 0; p < n_; ++p)
      if (in.refreshed[p]) reused_[p] = nullptr;
  return Status::Ok();
}

WorldStreamContext::WorldStreamContext(const WorldModel& model, uint32_t window, bool context_gate)
    : model_(model),
      gate_(context_gate),
      keep_(std::min<uint32_t>(window, std::max<uint32_t>(model.config().window, 1) - 1)),
      tokens_(model.config().num_patches()),
      tsig_(size_t{model.config().num_patches()} * model.config().layers),
      tags_(model.config().num_patches()) {}

Status WorldStreamContext::Begin(std::span<const uint8_t> pixels) {
  KVMESH_RETURN_IF_ERROR(model_.Tokenize(pixels, prev_, tokens_));
  prev_ = tokens_;
  if (gate_) {
    hist_.clear();
    for (const std::vector<uint64_t>& f : window_) hist_.push_back(f.data());
    model_.Signatures(tokens_, hist_, tsig_, tags_);
  }
  return Status::Ok();
}

void WorldStreamContext::Missed(uint32_t p) {
  if (!gate_) return;
  tags_[p] = Mix64(tags_[p] ^ (uint64_t{frame_} << 32 | p) ^ 0x4D495353);
  const uint32_t layers = model_.config().layers;
  for (uint32_t l = 0; l < layers; ++l) tsig_[size_t{p} * layers + l] = tags_[p] + l;
}

void WorldStreamContext::End() {
  ++frame_;
  if (!gate_) return;
  window_.push_back(tsig_);
  while (window_.size() > keep_) window_.pop_front();
}

Result<WorldStreamResult> RunWorldStream(Router& router, const WorldModel& model, const FrameGenerator& gen,
                                         const WorldStreamOptions& o) {
  const WorldModelConfig& c = model.config();
  if (gen.params().width != c.width || gen.params().height != c.height)
    return InvalidArgument("world run: the frame generator's size differs from the model's");
  FrameStreamOptions so = o.stream;
  so.width = c.width;
  so.height = c.height;
  so.patch = c.patch;
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<FrameStream> stream, FrameStream::Open(router, so));
  const uint32_t N = c.num_patches(), W = so.match.window;
  const size_t BF = c.BlockFloats();
  WorldFrameStep step(model, W);
  KVMESH_ASSIGN_OR_RETURN(MemoryRegion region, router.AllocateMemory(step.RegionBytes()));
  struct Unregister {
    Router& r;
    uint64_t id;
    ~Unregister() { (void)r.UnregisterMemory(id); }
  } unregister{router, region.id};
  step.SetRegion(region.base);
  std::vector<uint8_t> pixels(size_t{c.width} * c.height), refreshed(N), missed(N);
  WorldStreamContext ctx(model, W, o.context_gate);

  WorldStreamResult res;
  res.logits.reserve(size_t{o.frames} * N * c.vocab);
  for (uint32_t t = 0; t < o.frames; ++t) {
    gen.Frame(t, pixels);  // the camera: not part of the frame's time
    const auto t0 = std::chrono::steady_clock::now();
    WorldFrameStats fs;
    fs.frame = t;
    fs.patches = N;
    KVMESH_RETURN_IF_ERROR(ctx.Begin(pixels));
    KVMESH_ASSIGN_OR_RETURN(FrameMatch m, stream->Match(pixels, nullptr, ctx.tags()));
    WorldFrameInput in{pixels, gen.Action(t), {}, {}};
    in.tokens = ctx.tokens();
    in.refresh_deviation = so.match.refresh_deviation;
    in.refreshed = refreshed.data();
    WorldFrameStep::Counts counts;
    KVMESH_RETURN_IF_ERROR(step.Run(router, *stream, m, in, {}, counts, missed));
    fs.blocks_read = counts.blocks_read;
    fs.history_misses = counts.history_misses;
    for (uint32_t p = 0; p < N; ++p) {
      if (refreshed[p]) {
        KVMESH_RETURN_IF_ERROR(stream->Refresh(m, p));
        ++fs.refreshed;
      }
      if (missed[p]) ctx.Missed(p);
    }
    const uint64_t before = stream->stats().bytes_put;
    KVMESH_RETURN_IF_ERROR(stream->Commit(m, pixels, step.put_src(), ctx.tags()));
    ctx.End();
    fs.bytes_put = stream->stats().bytes_put - before;
    fs.reused = static_cast<uint32_t>(m.reused());
    fs.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    res.frames.push_back(fs);
    res.logits.insert(res.logits.end(), step.logits().begin(), step.logits().end());
    if (o.keep_blocks)
      for (uint32_t p = 0; p < N; ++p) {
        const float* b = step.used(p);
        res.blocks.insert(res.blocks.end(), b, b + BF);
        res.source_frame.push_back(m.patches[p].source_frame);
      }
    if (o.progress) o.progress(t + 1);
  }
  KVMESH_RETURN_IF_ERROR(stream->End());
  res.stats = stream->stats();
  return res;
}

LogitError CompareLogits(std::span<const float> a, std::span<const float> b, uint32_t vocab) {
  LogitError e;
  const size_t n = std::min(a.size(), b.size());
  if (n == 0) return e;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    sum += d;
    e.max_abs = std::max(e.max_abs, d);
  }
  e.mean_abs = sum / static_cast<double>(n);
  const std::vector<uint32_t> ta = PredictedTokens(a.first(n), vocab), tb = PredictedTokens(b.first(n), vocab);
  size_t agree = 0;
  for (size_t i = 0; i < ta.size(); ++i) agree += ta[i] == tb[i];
  e.token_agreement = ta.empty() ? 1.0 : static_cast<double>(agree) / static_cast<double>(ta.size());
  return e;
}

double LogitScale(std::span<const float> logits) {
  if (logits.empty()) return 0;
  double sum = 0, sq = 0;
  for (float v : logits) {
    sum += v;
    sq += double{v} * v;
  }
  const double n = static_cast<double>(logits.size()), mean = sum / n;
  return std::sqrt(std::max(0.0, sq / n - mean * mean));
}

}  // namespace kvmesh::decode
