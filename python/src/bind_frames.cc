// kvmesh.FrameStream (bindings.h): a session of world-model frames whose
// patches reuse earlier frames' KV blocks by similarity (kvmesh/frame_stream.h,
// docs/worldmodel.md). Opened by Client.frame_stream; the match of the frame
// in progress is kept between match() and commit().
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "client.h"
#include "kvmesh/frame_stream.h"

namespace kvmesh::python {

namespace {

struct PyFrameStream {
  std::shared_ptr<Client> client;
  std::unique_ptr<FrameStream> s;
  FrameMatch pending;
  bool has_pending = false;

  ~PyFrameStream() {
    if (!s) return;
    if (client->closed()) {
      s->Detach();  // the router is gone, and its nodes with it (embedded) or out of reach
    } else {
      try {
        // Best effort: a destructor has no caller to tell (End of a stream on a dead node is a no-op).
        (void)client->WithRouter([&](Router&) { return s->End(); });
      } catch (...) {  // closed meanwhile: nothing left to release through it
        s->Detach();
      }
    }
  }
};

FrameReuse ModeOf(const std::string& mode) {
  if (mode == "off") return FrameReuse::kOff;
  if (mode == "exact") return FrameReuse::kExact;
  if (mode == "similar") return FrameReuse::kSimilar;
  Throw(InvalidArgument("frame_stream: mode must be 'off', 'exact' or 'similar', got '" + mode + "'"));
}

py::dict MatchDict(const PatchMatch& m) {
  py::dict d;
  d["reused"] = m.reused;
  d["blended"] = m.blended;
  d["key"] = FromKey(m.key);
  d["source_frame"] = m.source_frame;
  d["source_patch"] = m.source_patch;
  d["ssim"] = m.ssim;
  d["change"] = m.change;
  return d;
}

py::list Matches(const FrameMatch& m) {
  py::list l;
  for (const PatchMatch& p : m.patches) l.append(MatchDict(p));
  return l;
}

std::vector<uint8_t> Pixels(py::handle pixels) {
  Memory mem = Memory::Acquire(pixels, /*writable=*/false);
  if (mem.device()) Throw(InvalidArgument("frame_stream: pixels must be host memory"));
  const auto* b = reinterpret_cast<const uint8_t*>(mem.data());
  return std::vector<uint8_t>(b, b + mem.size());
}

// A host buffer holding one equal block per patch, and that block's size.
std::pair<Memory, size_t> PatchBlocks(py::handle obj, bool writable, size_t patches, const char* call) {
  Memory mem = Memory::Acquire(obj, writable);
  if (mem.device()) Throw(InvalidArgument(std::string("FrameStream.") + call + ": the buffer must be host memory"));
  if (mem.size() % patches != 0)
    Throw(InvalidArgument(std::string("FrameStream.") + call + ": the buffer must hold one equal block per patch"));
  const size_t bb = mem.size() / patches;
  return {std::move(mem), bb};
}

// Context tags: none (None), else one uint64 per patch, from a sequence of
// ints or a numpy uint64 array. Their count is checked by FrameStream.
std::vector<uint64_t> Tags(py::handle tags, const char* call) {
  if (tags.is_none()) return {};
  return ToU64s(tags, (std::string("FrameStream.") + call + ": tags").c_str());
}

void NeedPending(const PyFrameStream& f, const char* call) {
  if (!f.has_pending) Throw(FailedPrecondition(std::string("FrameStream.") + call + ": no frame matched"));
}

}  // namespace

void BindFrames(py::module_& m) {
  py::class_<PyFrameStream, std::shared_ptr<PyFrameStream>> f(m, "FrameStream", R"(A session of world-model frames.

Gray 8-bit frames (width x height, row-major) cut into patch x patch patches, one
KV block per patch. match() compares each patch with the same position (and, with
motion_radius, its neighbours) in the last `window` frames; a patch whose SSIM is
>= tau and whose changed-pixel share is <= rho reuses the earlier block (a
reference, not a copy). Optional context tags (one uint64 per patch, given to
match() and commit()) also require a reused block's inputs to be the same.
get_reused() reads those blocks, commit() puts the computed ones and slides the
window, end() releases the stream's blocks.)");
  f.def_property_readonly("patches", [](const PyFrameStream& f) { return f.s->num_patches(); })
      .def_property_readonly("next_frame", [](const PyFrameStream& f) { return f.s->next_frame(); })
      .def(
          "match",
          [](PyFrameStream& f, py::handle pixels, py::handle tags) {
            std::vector<uint8_t> px = Pixels(pixels);
            const std::vector<uint64_t> t = Tags(tags, "match");
            Result<FrameMatch> r = f.s->Match(px, nullptr, t);
            if (!r.ok()) Throw(r.status());
            f.pending = std::move(*r);
            f.has_pending = true;
            return Matches(f.pending);
          },
          py::arg("pixels"), py::arg("tags") = py::none(),
          "Matches the next frame; one dict per patch: reused, blended, key, source_frame, source_patch, ssim, "
          "change. tags (None, or one uint64 per patch: a sequence of ints or a numpy uint64 array): a "
          "fingerprint of the inputs patch p's block would be computed from; a candidate then also needs the "
          "tag commit() stored with it to equal tags[p]. Any other count raises InvalidArgumentError.")
      .def(
          "get_reused",
          [](PyFrameStream& f, py::handle out) {
            NeedPending(f, "get_reused");
            const size_t n = f.pending.patches.size();
            auto [mem, bb] = PatchBlocks(out, /*writable=*/true, n, "get_reused");
            std::vector<std::span<std::byte>> dst(n);
            for (size_t i = 0; i < n; ++i) dst[i] = {mem.data() + i * bb, bb};
            Status st = f.client->WithRouter([&](Router&) { return f.s->GetReused(f.pending, dst); });
            if (!st.ok()) Throw(st);
            return Matches(f.pending);
          },
          py::arg("out"),
          "Reads every reused patch's block into out[i * block_bytes] (out: a writable buffer of patches x "
          "block_bytes); a miss turns the patch computed. Returns the match as it now stands.")
      .def(
          "refresh",
          [](PyFrameStream& f, uint32_t p) {
            NeedPending(f, "refresh");
            Status st = f.s->Refresh(f.pending, p);
            if (!st.ok()) Throw(st);
          },
          py::arg("patch"), "Marks reused patch p computed after all (the caller recomputed it).")
      .def(
          "history", [](const PyFrameStream& f, uint32_t p) {
            if (p >= f.s->num_patches()) Throw(InvalidArgument("FrameStream.history: no such patch"));
            return FromKeys(f.s->History(p));
          },
          py::arg("patch"), "Keys of patch p in the window's frames, oldest first (its temporal context).")
      .def(
          "commit",
          [](PyFrameStream& f, py::handle pixels, py::handle blocks, py::handle tags) {
            NeedPending(f, "commit");
            std::vector<uint8_t> px = Pixels(pixels);
            const std::vector<uint64_t> t = Tags(tags, "commit");
            const size_t n = f.pending.patches.size();
            auto [mem, bb] = PatchBlocks(blocks, /*writable=*/false, n, "commit");
            std::vector<std::span<const std::byte>> src(n);
            for (size_t i = 0; i < n; ++i) src[i] = {mem.data() + i * bb, bb};
            Status st = f.client->WithRouter([&](Router&) { return f.s->Commit(f.pending, px, src, t); });
            if (!st.ok()) Throw(st);
            f.has_pending = false;
          },
          py::arg("pixels"), py::arg("blocks"), py::arg("tags") = py::none(),
          "Puts the block of every computed patch (blocks[i * block_bytes]; reused patches' entries are ignored) "
          "and appends the frame to the window. tags (None, or one uint64 per patch): stored with each computed "
          "block for match(tags=...).")
      .def(
          "references", [](const PyFrameStream& f, py::handle key) { return f.s->References(ToKey(key)); },
          py::arg("key"), "How many frames of the window reference the block.")
      .def_property_readonly("stats",
                             [](const PyFrameStream& f) {
                               const FrameStreamStats& s = f.s->stats();
                               py::dict d;
                               d["frames"] = s.frames;
                               d["patches"] = s.patches;
                               d["reused"] = s.reused;
                               d["blocks_put"] = s.blocks_put;
                               d["bytes_put"] = s.bytes_put;
                               d["put_failures"] = s.put_failures;
                               d["reuse_misses"] = s.reuse_misses;
                               d["released"] = s.released;
                               return d;
                             })
      .def(
          "end",
          [](PyFrameStream& f) {
            f.has_pending = false;
            Status st = f.client->WithRouter([&](Router&) { return f.s->End(); });
            if (!st.ok()) Throw(st);
          },
          "Releases every block the stream references and forgets the window.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyFrameStream& f, py::args) {
        f.has_pending = false;
        if (!f.client->closed()) (void)f.client->WithRouter([&](Router&) { return f.s->End(); });
      });

  // Client.frame_stream: bound here, on the Client class bound before.
  py::class_<Client, std::shared_ptr<Client>> client = py::reinterpret_borrow<py::object>(m.attr("Client"));
  client.def(
      "frame_stream",
      [](std::shared_ptr<Client> c, uint64_t stream_id, uint32_t width, uint32_t height, uint32_t patch,
         const std::string& mode, std::optional<double> tau, std::optional<double> rho, std::optional<uint32_t> window,
         std::optional<uint32_t> pixel_delta, std::optional<uint32_t> recompute_radius,
         std::optional<double> refresh_deviation, std::optional<uint32_t> max_age,
         std::optional<uint32_t> motion_radius, int priority) {
        FrameStreamOptions so;
        so.stream_id = stream_id;
        so.width = width;
        so.height = height;
        so.patch = patch;
        so.match.mode = ModeOf(mode);
        if (tau) so.match.ssim_threshold = static_cast<float>(*tau);
        if (rho) so.match.change_threshold = static_cast<float>(*rho);
        if (window) so.match.window = *window;
        if (pixel_delta) so.match.pixel_delta = *pixel_delta;
        if (recompute_radius) so.match.recompute_radius = *recompute_radius;
        if (refresh_deviation) so.match.refresh_deviation = static_cast<float>(*refresh_deviation);
        if (max_age) so.match.max_age = *max_age;
        if (motion_radius) so.match.motion_radius = *motion_radius;
        if (priority < 0 || priority > 255) Throw(InvalidArgument("frame_stream: priority must be in 0..255"));
        so.request.priority = static_cast<uint8_t>(priority);
        auto r = c->WithRouter([&](Router& router) { return FrameStream::Open(router, so); });
        if (!r.ok()) Throw(r.status());
        auto f = std::make_shared<PyFrameStream>();
        f->client = std::move(c);
        f->s = std::move(*r);
        return f;
      },
      py::kw_only(), py::arg("stream_id") = 0, py::arg("width") = 64, py::arg("height") = 64, py::arg("patch") = 8,
      py::arg("mode") = "similar", py::arg("tau") = py::none(), py::arg("rho") = py::none(),
      py::arg("window") = py::none(), py::arg("pixel_delta") = py::none(), py::arg("recompute_radius") = py::none(),
      py::arg("refresh_deviation") = py::none(), py::arg("max_age") = py::none(),
      py::arg("motion_radius") = py::none(), py::arg("priority") = 1,
      "A FrameStream over this client's nodes (the gate's values default to FrameMatchOptions': tau 0.92, rho "
      "0.05, window 16).");
}

}  // namespace kvmesh::python
