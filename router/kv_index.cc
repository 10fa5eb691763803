// router/kv_index.cc — the prefix index behind KV-aware routing
// (kvmesh/kv_route.h): one hash table from a block's 64-bit hash to three
// instance bit sets (GPU, CPU, DISK; an instance is a bit of each).
#include "kvmesh/kv_route.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <mutex>
#include <shared_mutex>

#include <absl/container/flat_hash_map.h>
#include <msgpack.hpp>

namespace kvmesh {

namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view StrOf(const msgpack::object& o) {
  if (o.type != msgpack::type::STR) return {};
  return {o.via.str.ptr, o.via.str.size};
}

}  // namespace

Result<KvTier> ParseKvTier(std::string_view m) {
  if (m.empty() || EqualsIgnoreCase(m, "GPU")) return KvTier::kGpu;
  if (EqualsIgnoreCase(m, "CPU") || EqualsIgnoreCase(m, "CPU_PINNED")) return KvTier::kCpu;
  if (EqualsIgnoreCase(m, "DISK")) return KvTier::kDisk;
  return InvalidArgument("unknown KV event medium \"" + std::string(m) + "\"");
}

struct KvIndex::Impl {
  struct Where {
    uint64_t in[3] = {0, 0, 0};  // per tier, one bit per instance
  };
  RouteWeights w;
  mutable std::shared_mutex mu;
  absl::flat_hash_map<uint64_t, Where> blocks;  // guarded by mu
  std::vector<std::string> names;               // guarded by mu; bit i = names[i]
  std::vector<double> load;                     // guarded by mu
  // Approximate mode: (block hash, instance) -> when its last Routed
  // stops counting (seconds, the caller's clock). Guarded by mu.
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, double> approx;
  uint64_t routed_calls = 0;  // guarded by mu: paces the sweep of expired entries

  // REQUIRES mu held exclusively.
  Result<uint32_t> Instance(std::string_view name) {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return static_cast<uint32_t>(i);
    if (names.size() == kMaxInstances)
      return ResourceExhausted("KV index: more than " + std::to_string(kMaxInstances) + " instances");
    names.emplace_back(name);
    load.push_back(0);
    return static_cast<uint32_t>(names.size() - 1);
  }
  void Set(uint64_t h, uint32_t inst, KvTier t) { blocks[h].in[static_cast<int>(t)] |= uint64_t{1} << inst; }
  void Clear(uint64_t h, uint32_t inst, KvTier t) {
    auto it = blocks.find(h);
    if (it == blocks.end()) return;
    Where& w = it->second;
    w.in[static_cast<int>(t)] &= ~(uint64_t{1} << inst);
    if ((w.in[0] | w.in[1] | w.in[2]) == 0) blocks.erase(it);
  }
  void ClearAll(uint32_t inst) {
    const uint64_t bit = uint64_t{1} << inst;
    absl::erase_if(blocks, [bit](auto& kv) {
      Where& w = kv.second;
      for (uint64_t& m : w.in) m &= ~bit;
      return (w.in[0] | w.in[1] | w.in[2]) == 0;
    });
  }
};

KvIndex::KvIndex(RouteWeights w) : impl_(std::make_unique<Impl>()) { impl_->w = w; }
KvIndex::~KvIndex() = default;

namespace {
// An ExternalBlockHash (bytes | int) as the index keeps it: the low 64 bits
// (of a 16-byte kvmesh key: its second half; other byte strings: their last
// 8 bytes, big-endian).
bool HashOf(const msgpack::object& o, uint64_t* out) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    *out = o.via.u64;
    return true;
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    *out = static_cast<uint64_t>(o.via.i64);
    return true;
  }
  if (o.type == msgpack::type::BIN && o.via.bin.size >= 8) {
    const auto* p = reinterpret_cast<const unsigned char*>(o.via.bin.ptr) + o.via.bin.size - 8;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
    *out = v;
    return true;
  }
  return false;
}
}  // namespace

Status KvIndex::ApplyBatch(std::string_view instance, std::span<const std::byte> payload) {
  msgpack::object_handle oh;
  try {
    oh = msgpack::unpack(reinterpret_cast<const char*>(payload.data()), payload.size());
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("KV event batch: not msgpack: ") + e.what());
  }
  const msgpack::object& batch = oh.get();
  if (batch.type != msgpack::type::ARRAY || batch.via.array.size < 2 ||
      batch.via.array.ptr[1].type != msgpack::type::ARRAY)
    return InvalidArgument("KV event batch: expected [ts, events, ...]");
  const msgpack::object_array& events = batch.via.array.ptr[1].via.array;
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  for (uint32_t i = 0; i < events.size; ++i) {
    const msgpack::object& ev = events.ptr[i];
    if (ev.type != msgpack::type::ARRAY || ev.via.array.size == 0)
      return InvalidArgument("KV event batch: event " + std::to_string(i) + " is not a tagged array");
    const msgpack::object* f = ev.via.array.ptr;
    const uint32_t n = ev.via.array.size;
    const std::string_view tag = StrOf(f[0]);
    if (tag == "AllBlocksCleared") {
      impl_->ClearAll(inst);
      continue;
    }
    const bool stored = tag == "BlockStored";
    if (!stored && tag != "BlockRemoved")
      return InvalidArgument("KV event batch: unknown event \"" + std::string(tag) + "\"");
    // BlockStored: medium is field 6; BlockRemoved: field 2 (absent or nil: GPU).
    const uint32_t medium_at = stored ? 6 : 2;
    std::string_view medium;
    if (n > medium_at && f[medium_at].type == msgpack::type::STR) medium = StrOf(f[medium_at]);
    KVMESH_ASSIGN_OR_RETURN(KvTier tier, ParseKvTier(medium));
    if (n < 2 || f[1].type != msgpack::type::ARRAY)
      return InvalidArgument("KV event batch: " + std::string(tag) + " without block_hashes");
    const msgpack::object_array& hashes = f[1].via.array;
    for (uint32_t j = 0; j < hashes.size; ++j) {
      uint64_t h;
      if (!HashOf(hashes.ptr[j], &h)) return InvalidArgument("KV event batch: a block hash is not bytes or int");
      if (stored) impl_->Set(h, inst, tier);
      else impl_->Clear(h, inst, tier);
    }
  }
  return Status::Ok();
}

Status KvIndex::Stored(std::string_view instance, KvTier tier, std::span<const BlockKey> keys) {
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  for (const BlockKey& k : keys) impl_->Set(k.lo, inst, tier);
  return Status::Ok();
}

Status KvIndex::Removed(std::string_view instance, KvTier tier, std::span<const BlockKey> keys) {
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  for (const BlockKey& k : keys) impl_->Clear(k.lo, inst, tier);
  return Status::Ok();
}

Status KvIndex::Cleared(std::string_view instance) {
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  impl_->ClearAll(inst);
  return Status::Ok();
}

Status KvIndex::SetLoad(std::string_view instance, double load) {
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  impl_->load[inst] = std::clamp(load, 0.0, 1.0);
  return Status::Ok();
}

namespace {
double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Status KvIndex::Routed(std::string_view instance, std::span<const BlockKey> keys, double now_s) {
  if (impl_->w.approx_ttl_s <= 0) return FailedPrecondition("KV index: Routed needs approx_ttl_s > 0 (approximate mode)");
  const double until = (now_s < 0 ? SteadySeconds() : now_s) + impl_->w.approx_ttl_s;
  std::unique_lock lock(impl_->mu);
  KVMESH_ASSIGN_OR_RETURN(uint32_t inst, impl_->Instance(instance));
  for (const BlockKey& k : keys) impl_->approx[{k.lo, inst}] = until;
  if (++impl_->routed_calls % 4096 == 0) {
    const double now = until - impl_->w.approx_ttl_s;
    absl::erase_if(impl_->approx, [now](const auto& kv) { return kv.second <= now; });
  }
  return Status::Ok();
}

size_t KvIndex::approx_entries() const {
  std::shared_lock lock(impl_->mu);
  return impl_->approx.size();
}

void KvIndex::Route(std::span<const BlockKey> keys, std::span<const std::string> candidates,
                    std::vector<PrefixMatch>* out_ptr, double now_s) const {
  const RouteWeights& w = impl_->w;
  std::vector<PrefixMatch>& out = *out_ptr;
  out.resize(candidates.size());
  {
    std::shared_lock lock(impl_->mu);
    uint64_t want = 0;  // candidates still inside their prefix, per tier level
    int bits[kMaxInstances];  // the instance bit of each of the first 64 candidates (later ones: found again below)
    for (size_t c = 0; c < candidates.size(); ++c) {
      PrefixMatch& m = out[c];
      m.instance.assign(candidates[c]);
      m.gpu_blocks = m.cpu_blocks = m.blocks = 0;
      m.load = 0;
      int bit = -1;
      for (size_t i = 0; i < impl_->names.size(); ++i) {
        if (impl_->names[i] == candidates[c]) {
          bit = static_cast<int>(i);
          m.load = impl_->load[i];
          want |= uint64_t{1} << i;
          break;
        }
      }
      if (c < kMaxInstances) bits[c] = bit;
    }
    const bool approx = !impl_->approx.empty();
    const double now = approx ? (now_s < 0 ? SteadySeconds() : now_s) : 0;
    // Walk the keys while any candidate's prefix goes on; `gpu`, `cpu`, `any`
    // are the instances whose prefix is still unbroken at that level.
    uint64_t gpu = want, cpu = want, any = want;
    uint32_t counts_gpu[kMaxInstances] = {}, counts_cpu[kMaxInstances] = {}, counts_any[kMaxInstances] = {};
    for (const BlockKey& k : keys) {
      if (any == 0) break;
      uint64_t in[3] = {0, 0, 0};
      auto it = impl_->blocks.find(k.lo);
      if (it != impl_->blocks.end()) std::copy(std::begin(it->second.in), std::end(it->second.in), in);
      if (approx) {
        for (uint64_t m = any; m != 0; m &= m - 1) {
          const uint32_t i = static_cast<uint32_t>(__builtin_ctzll(m));
          auto a = impl_->approx.find(std::pair<uint64_t, uint32_t>{k.lo, i});
          if (a != impl_->approx.end() && a->second > now) in[0] |= uint64_t{1} << i;
        }
      }
      gpu &= in[0];
      cpu &= in[0] | in[1];
      any &= in[0] | in[1] | in[2];
      for (uint64_t m = any; m != 0; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        ++counts_any[i];
        if (cpu >> i & 1) ++counts_cpu[i];
        if (gpu >> i & 1) ++counts_gpu[i];
      }
    }
    for (size_t c = 0; c < candidates.size(); ++c) {
      int bit = -1;
      if (c < kMaxInstances) {
        bit = bits[c];
      } else {
        for (size_t i = 0; i < impl_->names.size(); ++i)
          if (impl_->names[i] == candidates[c]) bit = static_cast<int>(i);
      }
      if (bit < 0) continue;
      out[c].gpu_blocks = counts_gpu[bit];
      out[c].cpu_blocks = counts_cpu[bit];
      out[c].blocks = counts_any[bit];
    }
  }
  const double n = keys.empty() ? 1.0 : static_cast<double>(keys.size());
  for (PrefixMatch& m : out) {
    const double cached = w.gpu * m.gpu_blocks + w.cpu * (m.cpu_blocks - m.gpu_blocks) + w.disk * (m.blocks - m.cpu_blocks);
    m.score = cached / n - w.load * m.load;
  }
  // Best first, stable (ties keep the candidates' order); an insertion sort:
  // a handful of candidates, and std::stable_sort would allocate its buffer.
  auto better = [](const PrefixMatch& a, const PrefixMatch& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.load < b.load;
  };
  for (size_t i = 1; i < out.size(); ++i)
    for (size_t j = i; j > 0 && better(out[j], out[j - 1]); --j) std::swap(out[j], out[j - 1]);
}

std::vector<PrefixMatch> KvIndex::Route(std::span<const BlockKey> keys, std::span<const std::string> candidates) const {
  std::vector<PrefixMatch> out;
  Route(keys, candidates, &out);
  return out;
}

size_t KvIndex::blocks() const {
  std::shared_lock lock(impl_->mu);
  return impl_->blocks.size();
}

size_t KvIndex::memory_bytes() const {
  std::shared_lock lock(impl_->mu);
  // flat_hash_map: one control byte and one slot (key + value) per bucket.
  return impl_->blocks.capacity() * (sizeof(std::pair<uint64_t, Impl::Where>) + 1) +
         impl_->approx.capacity() * (sizeof(std::pair<std::pair<uint64_t, uint32_t>, double>) + 1);
}

std::vector<std::string> KvIndex::instances() const {
  std::shared_lock lock(impl_->mu);
  return impl_->names;
}

}  // namespace kvmesh
