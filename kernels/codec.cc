// Codec registry, policies, and the block encode/decode drivers.
#include "kernels/codec.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <cstring>
#include <thread>

#include "kernels/block_format.h"
#include "kernels/lowrank.h"
#include "kernels/quant_cpu.h"

namespace kvmesh::kernels {

// ---- Registry ------------------------------------------------------------------
namespace {

constexpr CodecInfo kCodecs[] = {
    {"raw", kCodecRaw, false, "the input bytes unchanged"},
    {"fp16", kCodecFp16, false, "fp16 passthrough (converts bf16/fp32 input)"},
    {"bf16", kCodecBf16, false, "bf16 passthrough (converts fp16/fp32 input)"},
    {"int8", kCodecInt8, true, "symmetric int8 per group, fp16 scales"},
    {"int4", kCodecInt4, true, "asymmetric uint4 per group, fp16 scale and zero point, 2 per byte"},
    {"fp8-e4m3", kCodecFp8E4M3, true, "fp8 e4m3 per group, fp16 scales"},
    {"fp8-e5m2", kCodecFp8E5M2, true, "fp8 e5m2 per group, fp16 scales"},
    {"lowrank", kCodecLowRank, false, "per-head rank-r projection onto a PCA basis, fp16 coefficients"},
};
static_assert(std::size(kCodecs) == kCodecKindCount);

bool ParseUint(std::string_view s, uint32_t* out) {
  if (s.empty() || s.size() > 9) return false;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

std::span<const CodecInfo> ListCodecs() { return kCodecs; }

const CodecInfo& CodecInfoOf(CodecKind kind) { return kCodecs[kind < kCodecKindCount ? kind : 0]; }

Result<const CodecInfo*> FindCodec(std::string_view name) {
  for (const CodecInfo& c : kCodecs)
    if (c.name == name) return &c;
  std::string known;
  for (const CodecInfo& c : kCodecs) known += (known.empty() ? "" : ", ") + std::string(c.name);
  return NotFound("unknown codec \"" + std::string(name) + "\" (known: " + known + ")");
}

Result<CodecSpec> ParseCodecSpec(std::string_view text) {
  const size_t colon = text.find(':');
  KVMESH_ASSIGN_OR_RETURN(const CodecInfo* info, FindCodec(text.substr(0, colon)));
  CodecSpec s;
  s.kind = info->kind;
  std::string_view rest = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t c = rest.find(':');
    std::string_view opt = rest.substr(0, c);
    rest = c == std::string_view::npos ? std::string_view{} : rest.substr(c + 1);
    uint32_t v = 0;
    if (opt == "kivi") {
      s.key_axis = kPerChannel, s.value_axis = kPerToken;
    } else if (opt == "token") {
      s.key_axis = kPerToken, s.value_axis = kPerToken;
    } else if (opt == "channel") {
      s.key_axis = kPerChannel, s.value_axis = kPerChannel;
    } else if (opt.size() > 1 && opt[0] == 'g' && ParseUint(opt.substr(1), &v) && v > 0 && info->quantising) {
      s.group_size = v;
    } else if (opt.size() > 1 && opt[0] == 'r' && ParseUint(opt.substr(1), &v) && v > 0 &&
               info->kind == kCodecLowRank) {
      s.rank = v;
    } else {
      return InvalidArgument("codec \"" + std::string(text) + "\": bad option \"" + std::string(opt) +
                             "\" (options: gN for quantisers, rN for lowrank, kivi|token|channel)");
    }
  }
  return s;
}

std::string CodecSpecName(const CodecSpec& s) {
  std::string n(CodecInfoOf(s.kind).name);
  if (IsQuantising(s.kind)) {
    n += ":g" + std::to_string(s.group_size);
    if (s.key_axis == kPerChannel && s.value_axis == kPerToken) n += ":kivi";
    else if (s.key_axis == kPerToken && s.value_axis == kPerToken) n += ":token";
    else if (s.key_axis == kPerChannel && s.value_axis == kPerChannel) n += ":channel";
    else n += ":ktoken-vchannel";
  }
  if (s.kind == kCodecLowRank && s.rank) n += ":r" + std::to_string(s.rank);
  return n;
}

Result<Lossless> ParseLossless(std::string_view t) {
  if (t == "none" || t.empty()) return Lossless::kNone;
  if (t == "lz4") return Lossless::kLz4;
  if (t == "zstd") return Lossless::kZstd;
  return InvalidArgument("unknown lossless stage \"" + std::string(t) + "\" (none, lz4, zstd)");
}

std::string_view LosslessName(Lossless l) {
  return l == Lossless::kLz4 ? "lz4" : l == Lossless::kZstd ? "zstd" : "none";
}

// ---- Shapes ---------------------------------------------------------------------------
Status BlockShape::Validate() const {
  if (layers == 0 || heads == 0 || tokens == 0 || head_dim == 0)
    return InvalidArgument("block shape " + ToString() + ": every extent must be > 0");
  if (layers > kMaxExtent || heads > kMaxExtent || tokens > kMaxExtent || head_dim > kMaxExtent ||
      uint64_t{layer_begin} + layers > uint64_t{1} << 32 || uint64_t{head_begin} + heads > uint64_t{1} << 32)
    return InvalidArgument("block shape " + ToString() + ": an extent is out of range");
  const unsigned __int128 b = static_cast<unsigned __int128>(2) * layers * heads * tokens * head_dim * DTypeSize(dtype);
  if (b > kMaxRawBytes) return InvalidArgument("block shape " + ToString() + ": larger than 1 TiB");
  if (static_cast<uint8_t>(dtype) > 2) return InvalidArgument("block shape: bad dtype");
  return Status::Ok();
}

BlockShape BlockShape::FromLayout(const BlockLayout& l) {
  return {l.layers.begin, l.layers.size(), l.heads.begin, l.heads.size(), l.block_tokens, l.head_dim, l.dtype};
}

std::string BlockShape::ToString() const {
  std::string s = "L" + std::to_string(layers) + "xH" + std::to_string(heads) + "xT" + std::to_string(tokens) + "xD" +
                  std::to_string(head_dim) + " " + std::string(DTypeName(dtype));
  if (layer_begin || head_begin) s += " @L" + std::to_string(layer_begin) + ",H" + std::to_string(head_begin);
  return s;
}

PlaneGeom PlaneGeometry(const CodecSpec& spec, const BlockShape& shape, uint32_t kv, uint32_t rank) {
  const uint8_t axis = kv == 0 ? spec.key_axis : spec.value_axis;
  return MakePlaneGeom(spec.kind, axis, spec.group_size, shape.tokens, shape.head_dim,
                       static_cast<uint8_t>(shape.dtype), rank);
}

// ---- Workers ----------------------------------------------------------------------------
namespace {

constexpr size_t kParallelMinBytes = size_t{4} << 20;  // below this, one thread is faster

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller is one).
template <typename Fn>
void ParallelFor(size_t n, uint32_t threads, Fn&& fn) {
  if (threads <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  const uint32_t extra = static_cast<uint32_t>(std::min<size_t>(threads, n)) - 1;
  std::vector<std::thread> pool;
  pool.reserve(extra);
  for (uint32_t t = 0; t < extra; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

uint32_t WorkerThreads(uint32_t requested, size_t bytes) {
  if (bytes < kParallelMinBytes) return 1;
  if (requested) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

// One plane of a block: where its raw and encoded bytes live.
struct PlaneJob {
  const SegmentInfo* seg;
  PlaneGeom geom;
  uint32_t layer, kv, head;  // absolute
  size_t raw_off, enc_off;
};

std::vector<PlaneJob> PlanJobs(const BlockShape& shape, const std::vector<SegmentInfo>& segs) {
  std::vector<PlaneJob> jobs;
  jobs.reserve(shape.planes());
  const size_t raw_plane = shape.plane_elements() * DTypeSize(shape.dtype);
  for (const SegmentInfo& s : segs) {
    const PlaneGeom g[2] = {PlaneGeometry(s.spec, shape, 0, s.spec.rank), PlaneGeometry(s.spec, shape, 1, s.spec.rank)};
    size_t enc = s.offset;
    for (uint32_t l = 0; l < s.layers; ++l)
      for (uint32_t kv = 0; kv < 2; ++kv)
        for (uint32_t h = 0; h < shape.heads; ++h) {
          const uint32_t layer = s.layer_begin + l;
          const size_t plane = (size_t{layer - shape.layer_begin} * 2 + kv) * shape.heads + h;
          jobs.push_back({&s, g[kv], layer, kv, shape.head_begin + h, plane * raw_plane, enc});
          enc += g[kv].bytes;
        }
  }
  return jobs;
}

std::vector<std::byte>& Scratch() {
  thread_local std::vector<std::byte> buf;
  return buf;
}

// ---- The policy codec ------------------------------------------------------------------------
class PolicyCodec final : public Codec {
 public:
  explicit PolicyCodec(CodecPolicy p) : policy_(std::move(p)) {}

  std::string name() const override {
    std::string n;
    for (const LayerRule& r : policy_.rules)
      n += CodecSpecName(r.spec) + "[" + std::to_string(r.layers.begin) + "-" + std::to_string(r.layers.end - 1) + "]+";
    n += CodecSpecName(policy_.base);
    if (policy_.lossless != Lossless::kNone) n += "+" + std::string(LosslessName(policy_.lossless));
    return n;
  }
  const CodecPolicy& policy() const override { return policy_; }

  Result<size_t> MaxEncodedSize(const BlockShape& shape) const override {
    KVMESH_RETURN_IF_ERROR(shape.Validate());
    std::vector<SegmentInfo> segs = Segments(shape);
    uint64_t body = 0;
    for (const SegmentInfo& s : segs) body += s.bytes;
    return MetadataBytes(segs.size()) + body;
  }

  Result<size_t> Encode(const BlockShape& shape, std::span<const std::byte> raw,
                        std::span<std::byte> out) const override {
    KVMESH_RETURN_IF_ERROR(shape.Validate());
    if (raw.size() < shape.bytes())
      return InvalidArgument("encode: raw input holds " + std::to_string(raw.size()) + " bytes, shape " +
                             shape.ToString() + " needs " + std::to_string(shape.bytes()));
    BlockInfo info;
    info.version = kBlockVersion;
    info.shape = shape;
    info.segments = Segments(shape);
    for (const SegmentInfo& s : info.segments) {
      info.body_bytes += s.bytes;
      if (s.spec.kind == kCodecLowRank) {
        for (uint32_t h = shape.head_begin; h < shape.head_begin + shape.heads; ++h) {
          KVMESH_RETURN_IF_ERROR(policy_.basis->Covers(s.layer_begin, h, shape.head_dim, s.spec.rank));
          KVMESH_RETURN_IF_ERROR(policy_.basis->Covers(s.layer_begin + s.layers - 1, h, shape.head_dim, s.spec.rank));
        }
      }
    }
    const size_t meta = MetadataBytes(info.segments.size());
    if (out.size() < meta + info.body_bytes)
      return InvalidArgument("encode: output holds " + std::to_string(out.size()) + " bytes, needs " +
                             std::to_string(meta + info.body_bytes));
    auto* dst = reinterpret_cast<uint8_t*>(out.data());
    uint8_t* body = dst + meta;
    std::vector<std::byte>& scratch = Scratch();
    if (policy_.lossless != Lossless::kNone) {
      scratch.resize(info.body_bytes);
      body = reinterpret_cast<uint8_t*>(scratch.data());
    }
    const auto* src = reinterpret_cast<const uint8_t*>(raw.data());
    const std::vector<PlaneJob> jobs = PlanJobs(shape, info.segments);
    const CpuPath path = policy_.force_scalar ? CpuPath::kScalar : CpuPath::kAuto;
    auto encode_plane = [&](size_t i) {
      const PlaneJob& j = jobs[i];
      if (j.geom.codec == kCodecLowRank) {
        policy_.basis->EncodePlane(j.layer, j.kv, j.head, j.geom.rank, src + j.raw_off, j.geom.in_type, shape.tokens,
                                   body + j.enc_off);
      } else {
        EncodePlane(j.geom, src + j.raw_off, body + j.enc_off, path);
      }
    };
    const uint32_t threads = WorkerThreads(policy_.threads, shape.bytes());
    if (threads == 1 && policy_.lossless == Lossless::kNone) {
      // One pass: hash each plane right after writing it, while it is in L1.
      info.lossless = Lossless::kNone;
      info.stored_bytes = info.body_bytes;
      WriteBlockMetadata(info, dst);
      BlockHasher hasher(dst);
      hasher.Update(dst + kBlockHeaderBytes, meta - kBlockHeaderBytes);
      for (size_t i = 0; i < jobs.size(); ++i) {
        encode_plane(i);
        hasher.Update(body + jobs[i].enc_off, jobs[i].geom.bytes);
      }
      hasher.Seal(dst);
      return meta + info.body_bytes;
    }
    ParallelFor(jobs.size(), threads, encode_plane);
    info.lossless = Lossless::kNone;
    info.stored_bytes = info.body_bytes;
    if (policy_.lossless != Lossless::kNone) {
      size_t packed = Compress(body, info.body_bytes, dst + meta);
      if (packed > 0) {
        info.lossless = policy_.lossless;
        info.stored_bytes = packed;
      } else {
        std::memcpy(dst + meta, body, info.body_bytes);  // compression did not help
      }
    }
    WriteBlockMetadata(info, dst);
    SealBlock(dst, meta + info.stored_bytes);
    return meta + info.stored_bytes;
  }

  Status Decode(std::span<const std::byte> block, std::span<std::byte> raw) const override {
    DecodeOptions o;
    o.basis = policy_.basis.get();
    o.force_scalar = policy_.force_scalar;
    o.threads = policy_.threads;
    return DecodeBlock(block, raw, o);
  }

 private:
  const CodecSpec& SpecOf(uint32_t layer) const {
    for (const LayerRule& r : policy_.rules)
      if (layer >= r.layers.begin && layer < r.layers.end) return r.spec;
    return policy_.base;
  }

  std::vector<SegmentInfo> Segments(const BlockShape& shape) const {
    std::vector<SegmentInfo> segs;
    for (uint32_t l = shape.layer_begin; l < shape.layer_begin + shape.layers; ++l) {
      CodecSpec spec = SpecOf(l);
      if (!IsQuantising(spec.kind)) {  // normalise fields that do not apply
        spec.group_size = 0;
        spec.key_axis = spec.value_axis = kPerToken;
      }
      if (spec.kind != kCodecLowRank) spec.rank = 0;
      if (!segs.empty() && segs.back().spec == spec) {
        ++segs.back().layers;
        continue;
      }
      SegmentInfo s;
      s.spec = spec;
      s.layer_begin = l;
      s.layers = 1;
      s.basis_id = spec.kind == kCodecLowRank ? policy_.basis->id() : 0;
      segs.push_back(s);
    }
    uint64_t off = 0;
    for (SegmentInfo& s : segs) {
      s.offset = off;
      s.bytes = SegmentBodyBytes(s.spec, shape, s.layers);
      off += s.bytes;
    }
    return segs;
  }

  // Compresses n bytes into dst (capacity n - 1); 0 when it does not shrink.
  size_t Compress(const uint8_t* src, size_t n, uint8_t* dst) const {
    if (n < 2) return 0;
    if (policy_.lossless == Lossless::kLz4) {
      if (n > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) return 0;
      int r = LZ4_compress_default(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                   static_cast<int>(n), static_cast<int>(std::min<size_t>(n - 1, INT32_MAX)));
      return r > 0 ? static_cast<size_t>(r) : 0;
    }
    size_t r = ZSTD_compress(dst, n - 1, src, n, policy_.lossless_level ? policy_.lossless_level : 3);
    return ZSTD_isError(r) ? 0 : r;
  }

  CodecPolicy policy_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeCodec(CodecPolicy p) {
  std::vector<CodecSpec*> specs{&p.base};
  for (LayerRule& r : p.rules) {
    if (r.layers.empty()) return InvalidArgument("codec policy: empty layer range in a rule");
    specs.push_back(&r.spec);
  }
  for (size_t i = 0; i < p.rules.size(); ++i)
    for (size_t j = i + 1; j < p.rules.size(); ++j)
      if (p.rules[i].layers.begin < p.rules[j].layers.end && p.rules[j].layers.begin < p.rules[i].layers.end)
        return InvalidArgument("codec policy: layer rules " + std::to_string(i) + " and " + std::to_string(j) + " overlap");
  for (CodecSpec* s : specs) {
    if (s->kind >= kCodecKindCount) return InvalidArgument("codec policy: unknown codec id " + std::to_string(s->kind));
    if (IsQuantising(s->kind) && (s->group_size == 0 || s->group_size > kMaxExtent))
      return InvalidArgument("codec policy: " + std::string(CodecInfoOf(s->kind).name) + " needs a group size in 1..2^24");
    if (s->kind == kCodecLowRank) {
      if (!p.basis) return InvalidArgument("codec policy: lowrank needs a basis (codec.basis in the config)");
      if (s->rank == 0) s->rank = p.basis->rank();
      if (s->rank > p.basis->rank())
        return InvalidArgument("codec policy: lowrank rank " + std::to_string(s->rank) + " exceeds the basis rank " +
                               std::to_string(p.basis->rank()));
    }
  }
  if (p.lossless_level < 0 || p.lossless_level > 22) return InvalidArgument("codec policy: zstd level must be in 0..22");
  return std::unique_ptr<Codec>(new PolicyCodec(std::move(p)));
}

namespace {
// Runs fn(i) for every block on up to `threads` threads; returns the first error.
template <typename Fn>
Status ForEachBlock(size_t n, uint32_t threads, Fn&& fn) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::mutex mu;
  Status first;
  ParallelFor(n, threads, [&](size_t i) {
    Status s = fn(i);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = s.WithContext("block " + std::to_string(i));
    }
  });
  return first;
}
}  // namespace

Status EncodeBatch(const Codec& codec, const BlockShape& shape, std::span<const std::span<const std::byte>> raws,
                   std::span<const std::span<std::byte>> outs, std::span<size_t> sizes, uint32_t threads) {
  if (outs.size() != raws.size() || sizes.size() != raws.size())
    return InvalidArgument("encode batch: raws, outs and sizes differ in length");
  return ForEachBlock(raws.size(), threads, [&](size_t i) -> Status {
    KVMESH_ASSIGN_OR_RETURN(sizes[i], codec.Encode(shape, raws[i], outs[i]));
    return Status::Ok();
  });
}

Status DecodeBatch(const Codec& codec, std::span<const std::span<const std::byte>> blocks,
                   std::span<const std::span<std::byte>> raws, uint32_t threads) {
  if (blocks.size() != raws.size()) return InvalidArgument("decode batch: blocks and raws differ in length");
  return ForEachBlock(blocks.size(), threads, [&](size_t i) { return codec.Decode(blocks[i], raws[i]); });
}

uint8_t PrimaryCodecId(const CodecPolicy& p) { return static_cast<uint8_t>(1 + p.base.kind); }

Status DecodeBlock(std::span<const std::byte> block, std::span<std::byte> raw, const DecodeOptions& o) {
  KVMESH_ASSIGN_OR_RETURN(BlockInfo info, InspectBlock(block));
  const BlockShape& shape = info.shape;
  if (raw.size() < shape.bytes())
    return InvalidArgument("decode: output holds " + std::to_string(raw.size()) + " bytes, the block needs " +
                           std::to_string(shape.bytes()));
  for (const SegmentInfo& s : info.segments) {
    if (s.spec.kind != kCodecLowRank) continue;
    if (o.basis == nullptr) return FailedPrecondition("decode: the block is lowrank and no basis was given");
    if (o.basis->id() != s.basis_id) return FailedPrecondition("decode: the block was encoded with another lowrank basis");
    for (uint32_t h = shape.head_begin; h < shape.head_begin + shape.heads; ++h) {
      KVMESH_RETURN_IF_ERROR(o.basis->Covers(s.layer_begin, h, shape.head_dim, s.spec.rank));
      KVMESH_RETURN_IF_ERROR(o.basis->Covers(s.layer_begin + s.layers - 1, h, shape.head_dim, s.spec.rank));
    }
  }
  const uint8_t* body = reinterpret_cast<const uint8_t*>(block.data()) + MetadataBytes(info.segments.size());
  if (info.lossless != Lossless::kNone) {
    std::vector<std::byte>& scratch = Scratch();
    scratch.resize(info.body_bytes);
    if (info.lossless == Lossless::kLz4) {
      if (info.body_bytes > static_cast<uint64_t>(LZ4_MAX_INPUT_SIZE) || info.stored_bytes > INT32_MAX)
        return DataLoss("decode: lz4 body too large");
      int r = LZ4_decompress_safe(reinterpret_cast<const char*>(body), reinterpret_cast<char*>(scratch.data()),
                                  static_cast<int>(info.stored_bytes), static_cast<int>(info.body_bytes));
      if (r < 0 || static_cast<uint64_t>(r) != info.body_bytes) return DataLoss("decode: lz4 body is corrupt");
    } else {
      size_t r = ZSTD_decompress(scratch.data(), info.body_bytes, body, info.stored_bytes);
      if (ZSTD_isError(r) || r != info.body_bytes)
        return DataLoss(std::string("decode: zstd body is corrupt (") +
                        (ZSTD_isError(r) ? ZSTD_getErrorName(r) : "short") + ")");
    }
    body = reinterpret_cast<const uint8_t*>(scratch.data());
  }
  auto* dst = reinterpret_cast<uint8_t*>(raw.data());
  const std::vector<PlaneJob> jobs = PlanJobs(shape, info.segments);
  const CpuPath path = o.force_scalar ? CpuPath::kScalar : CpuPath::kAuto;
  const uint8_t out_type = static_cast<uint8_t>(shape.dtype);
  ParallelFor(jobs.size(), WorkerThreads(o.threads, shape.bytes()), [&](size_t i) {
    const PlaneJob& j = jobs[i];
    if (j.geom.codec == kCodecLowRank) {
      o.basis->DecodePlane(j.layer, j.kv, j.head, j.geom.rank, body + j.enc_off, shape.tokens, dst + j.raw_off, out_type);
    } else {
      DecodePlane(j.geom, body + j.enc_off, dst + j.raw_off, out_type, path);
    }
  });
  return Status::Ok();
}

}  // namespace kvmesh::kernels
