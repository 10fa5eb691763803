#include "coordinator/decode/world_run.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>

#include "common/hash.h"

namespace kvmesh::decode {

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
  const size_t BF = c.BlockFloats(), BB = c.BlockBytes();
  // Reads land in registered memory: N reused blocks, then up to N * W context blocks.
  const size_t slots = size_t{N} * (1 + W);
  KVMESH_ASSIGN_OR_RETURN(MemoryRegion region, router.AllocateMemory(slots * BB));
  struct Unregister {
    Router& r;
    uint64_t id;
    ~Unregister() { (void)r.UnregisterMemory(id); }
  } unregister{router, region.id};
  auto slot = [&](size_t i) { return region.base + i * BB; };
  std::vector<float> out_blocks(size_t{N} * BF), logits(size_t{N} * c.vocab);
  std::vector<std::span<std::byte>> reused_dst(N);
  for (uint32_t p = 0; p < N; ++p) reused_dst[p] = {slot(p), BB};
  std::vector<std::span<const std::byte>> put_src(N);
  for (uint32_t p = 0; p < N; ++p)
    put_src[p] = {reinterpret_cast<const std::byte*>(out_blocks.data() + size_t{p} * BF), BB};
  std::vector<const float*> reused(N);
  std::vector<std::vector<const float*>> history(N);
  std::map<BlockKey, size_t> ctx_slot;
  std::vector<GetItem> gets;
  std::vector<uint8_t> pixels(size_t{c.width} * c.height), refreshed(N);
  // Tokens (the previous frame's feed the tokenizer's hysteresis) and, with
  // context_gate, the temporal fingerprints of the frames in the window.
  std::vector<uint32_t> tokens(N), prev_tokens;
  std::vector<uint64_t> tsig(size_t{N} * c.layers), tags(N);
  std::deque<std::vector<uint64_t>> sig_window;
  std::vector<const uint64_t*> sig_hist;

  WorldStreamResult res;
  res.logits.reserve(size_t{o.frames} * N * c.vocab);
  for (uint32_t t = 0; t < o.frames; ++t) {
    gen.Frame(t, pixels);  // the camera: not part of the frame's time
    const auto t0 = std::chrono::steady_clock::now();
    WorldFrameStats fs;
    fs.frame = t;
    fs.patches = N;
    KVMESH_RETURN_IF_ERROR(model.Tokenize(pixels, prev_tokens, tokens));
    prev_tokens = tokens;
    if (o.context_gate) {
      sig_hist.clear();
      for (const std::vector<uint64_t>& f : sig_window) sig_hist.push_back(f.data());
      model.Signatures(tokens, sig_hist, tsig, tags);
    }
    KVMESH_ASSIGN_OR_RETURN(FrameMatch m,
                            stream->Match(pixels, nullptr, o.context_gate ? std::span<const uint64_t>(tags)
                                                                          : std::span<const uint64_t>()));
    KVMESH_RETURN_IF_ERROR(stream->GetReused(m, reused_dst));
    // Temporal context of the computed patches (with refresh_deviation, of
    // every patch: the first layer runs for all), each distinct block read once.
    const bool blend = so.match.refresh_deviation > 0;
    ctx_slot.clear();
    gets.clear();
    std::vector<std::vector<BlockKey>> hist_keys(N);
    for (uint32_t p = 0; p < N; ++p) {
      if (m.patches[p].reused && !blend) continue;
      hist_keys[p] = stream->History(p);
      for (const BlockKey& k : hist_keys[p])
        if (ctx_slot.emplace(k, N + ctx_slot.size()).second)
          gets.push_back(GetItem{k, {slot(N + gets.size()), BB}, 0, {}});
    }
    if (!gets.empty()) {
      const Status call = router.GetBatch(gets, so.request);
      if (!call.ok())  // no answer at all (the stream's node is gone): every context block misses
        for (GetItem& g : gets) g.status = call;
    }
    for (uint32_t p = 0; p < N; ++p) {
      reused[p] = m.patches[p].reused ? reinterpret_cast<const float*>(slot(p)) : nullptr;
      history[p].clear();
      for (const BlockKey& k : hist_keys[p]) {
        const size_t s = ctx_slot.at(k);
        if (!gets[s - N].status.ok()) {  // a miss: attend to what is left
          ++fs.history_misses;
          // The block is computed from another history than its fingerprint
          // says: a fingerprint nothing else has keeps it (and what attends
          // to it later) from being reused as if it were.
          tags[p] = Mix64(tags[p] ^ (uint64_t{t} << 32 | p) ^ 0x4D495353);
          for (uint32_t l = 0; l < c.layers; ++l) tsig[size_t{p} * c.layers + l] = tags[p] + l;
          continue;
        }
        history[p].push_back(reinterpret_cast<const float*>(slot(s)));
      }
    }
    fs.blocks_read = m.reused() + gets.size();
    WorldFrameInput in{pixels, gen.Action(t), reused, history};
    in.tokens = tokens;
    in.refresh_deviation = so.match.refresh_deviation;
    in.refreshed = refreshed.data();
    KVMESH_RETURN_IF_ERROR(model.ComputeFrame(in, out_blocks, logits));
    for (uint32_t p = 0; p < N; ++p)
      if (refreshed[p]) {
        KVMESH_RETURN_IF_ERROR(stream->Refresh(m, p));
        reused[p] = nullptr;
        ++fs.refreshed;
      }
    const uint64_t before = stream->stats().bytes_put;
    KVMESH_RETURN_IF_ERROR(stream->Commit(
        m, pixels, put_src, o.context_gate ? std::span<const uint64_t>(tags) : std::span<const uint64_t>()));
    if (o.context_gate) {
      sig_window.push_back(tsig);
      while (sig_window.size() > std::min<size_t>(W, c.window - 1)) sig_window.pop_front();
    }
    fs.bytes_put = stream->stats().bytes_put - before;
    fs.reused = static_cast<uint32_t>(m.reused());
    fs.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    res.frames.push_back(fs);
    res.logits.insert(res.logits.end(), logits.begin(), logits.end());
    if (o.keep_blocks)
      for (uint32_t p = 0; p < N; ++p) {
        const float* b = reused[p] ? reused[p] : out_blocks.data() + size_t{p} * BF;
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
