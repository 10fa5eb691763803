#include "shard_node/ssd_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/checksum.h"

namespace kvmesh {
namespace {

constexpr uint32_t kMagic = 0x4B56534Cu;  // "KVSL"
constexpr uint16_t kVersion = 1;
constexpr uint64_t kAlign = 4096;

struct Header {
  uint32_t magic;
  uint16_t version;
  uint8_t codec;
  uint8_t priority;
  uint32_t size;
  uint32_t logical_size;
  uint64_t key_hi;
  uint64_t key_lo;
  uint64_t payload_checksum;
  uint64_t header_checksum;  // over the bytes above
};
static_assert(sizeof(Header) == 48);

uint64_t HeaderSum(const Header& h) { return Checksum64(&h, offsetof(Header, header_checksum)); }

// Full-length positional I/O (retries short transfers and EINTR).
Status PwriteAll(int fd, const struct iovec* iov, int n, uint64_t off) {
  std::vector<struct iovec> v(iov, iov + n);
  size_t i = 0;
  while (i < v.size()) {
    ssize_t w = ::pwritev(fd, v.data() + i, static_cast<int>(v.size() - i), static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("ssd tier write", errno);
    }
    off += static_cast<uint64_t>(w);
    size_t left = static_cast<size_t>(w);
    while (i < v.size() && left >= v[i].iov_len) left -= v[i++].iov_len;
    if (i < v.size()) {
      v[i].iov_base = static_cast<char*>(v[i].iov_base) + left;
      v[i].iov_len -= left;
    }
  }
  return Status::Ok();
}

Status PreadAll(int fd, void* dst, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("ssd tier read", errno);
    }
    if (r == 0) return DataLoss("ssd tier: short read (file truncated)");
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SsdTier>> SsdTier::Create(const SsdTierOptions& o) {
  if (o.path.empty()) return InvalidArgument("ssd tier: no path");
  if (o.capacity_bytes == 0 || o.slot_bytes == 0) return InvalidArgument("ssd tier: capacity and slot size must be > 0");
  std::unique_ptr<SsdTier> t(new SsdTier());
  t->slot_payload_ = o.slot_bytes;
  t->slot_stride_ = (sizeof(Header) + o.slot_bytes + kAlign - 1) / kAlign * kAlign;
  const uint64_t slots = o.capacity_bytes / t->slot_stride_;
  if (slots == 0) {
    return InvalidArgument("ssd tier budget of " + std::to_string(o.capacity_bytes) + " bytes cannot hold one " +
                           std::to_string(t->slot_stride_) + "-byte slot");
  }
  struct stat st{};
  t->file_ = o.path;
  if (::stat(o.path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::string name = o.name.empty() ? "tier" : o.name;
    for (char& ch : name)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
    t->file_ = o.path + "/kvmesh-" + name + ".ssd";
    t->owns_file_ = true;
  }
  t->fd_ = ::open(t->file_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (t->fd_ < 0) return ErrnoStatus("ssd tier: opening " + t->file_, errno);
  if (::ftruncate(t->fd_, static_cast<off_t>(slots * t->slot_stride_)) != 0)
    return ErrnoStatus("ssd tier: sizing " + t->file_, errno);
  t->clock_ = o.clock ? o.clock : SystemClock();
  t->on_evict_ = o.on_evict;
  t->observer_ = o.observer;
  t->slots_.resize(slots);
  for (uint64_t i = slots; i-- > 0;) t->free_.push_back(static_cast<uint32_t>(i));
  t->index_.reserve(slots);
  PolicyOptions po;
  po.capacity_hint = slots;
  po.clock = t->clock_;
  KVMESH_ASSIGN_OR_RETURN(t->policy_, MakeEvictionPolicy(o.policy, po));
  t->stats_.capacity_bytes = slots * t->slot_stride_;
  t->stats_.slots_total = slots;
  return t;
}

SsdTier::~SsdTier() {
  if (fd_ >= 0) ::close(fd_);
  if (owns_file_) ::unlink(file_.c_str());  // a cache file we named: nothing survives a restart anyway
}

void SsdTier::FreeSlotLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.live) {
    --stats_.blocks;
    stats_.bytes_stored -= s.meta.size;
  }
  s = Slot{};
  free_.push_back(slot);
}

Status SsdTier::Put(const BlockKey& key, std::span<const std::byte> payload, const SsdBlockMeta& meta) {
  if (payload.empty() || payload.size() > slot_payload_)
    return InvalidArgument("ssd tier: block of " + std::to_string(payload.size()) + " bytes does not fit a slot");
  const AccessInfo info{meta.priority, static_cast<uint32_t>(payload.size()), 0.0f, key.lo ^ key.hi};
  uint32_t slot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      policy_->Touch(it->second, info);
      return Status::Ok();
    }
    while (free_.empty()) {
      std::optional<EntryId> v = policy_->Victim();
      if (!v) return ResourceExhausted("ssd tier: every slot is being written");
      const uint32_t vs = static_cast<uint32_t>(*v);
      policy_->Remove(*v, RemoveReason::kEvicted);
      index_.erase(slots_[vs].key);
      Notify(BlockChange::kRemoved, slots_[vs].key);
      ++stats_.evictions;
      if (on_evict_) on_evict_(slots_[vs].key);
      if (slots_[vs].readers > 0) {
        slots_[vs].doomed = true;  // the last reader frees it
      } else {
        FreeSlotLocked(vs);
      }
    }
    slot = free_.back();
    free_.pop_back();
    slots_[slot] = Slot{};
    slots_[slot].key = key;  // reserved: not in the index until written
  }

  Header h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.codec = meta.codec;
  h.priority = meta.priority;
  h.size = static_cast<uint32_t>(payload.size());
  h.logical_size = meta.logical_size ? meta.logical_size : h.size;
  h.key_hi = key.hi;
  h.key_lo = key.lo;
  h.payload_checksum = Checksum64(payload.data(), payload.size());
  h.header_checksum = HeaderSum(h);
  struct iovec iov[2] = {{&h, sizeof h}, {const_cast<std::byte*>(payload.data()), payload.size()}};
  Status w = PwriteAll(fd_, iov, 2, uint64_t{slot} * slot_stride_);

  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.writes;
  if (!w.ok() || index_.contains(key)) {  // failed, or a concurrent Put of the same key won
    if (!w.ok()) ++stats_.write_errors;
    slots_[slot] = Slot{};
    free_.push_back(slot);
    return w;
  }
  Slot& s = slots_[slot];
  s.live = true;
  s.meta = {h.size, h.logical_size, meta.codec, meta.priority};
  index_.emplace(key, slot);
  Notify(BlockChange::kStored, key);
  policy_->Insert(slot, info);
  ++stats_.blocks;
  stats_.bytes_stored += h.size;
  return Status::Ok();
}

Result<SsdBlockMeta> SsdTier::Read(const BlockKey& key, std::span<std::byte> dst) {
  uint32_t slot;
  SsdBlockMeta meta;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.reads;
    auto it = index_.find(key);
    if (it == index_.end()) {
      ++stats_.misses;
      return NotFound("block " + key.ToHex() + " is not on the ssd tier");
    }
    slot = it->second;
    meta = slots_[slot].meta;
    ++slots_[slot].readers;
    policy_->Touch(slot, AccessInfo{meta.priority, meta.size, 0.0f, key.lo ^ key.hi});
  }
  Status verdict;
  Header h{};
  if (dst.size() < meta.size) {
    verdict = InvalidArgument("ssd tier: destination of " + std::to_string(dst.size()) + " bytes is smaller than the " +
                              std::to_string(meta.size) + "-byte block");
  } else {
    const uint64_t off = uint64_t{slot} * slot_stride_;
    verdict = PreadAll(fd_, &h, sizeof h, off);
    if (verdict.ok()) {
      if (h.magic != kMagic || h.version != kVersion || h.header_checksum != HeaderSum(h))
        verdict = DataLoss("ssd tier: slot header of block " + key.ToHex() + " is torn or corrupt");
      else if (h.key_hi != key.hi || h.key_lo != key.lo || h.size != meta.size)
        verdict = DataLoss("ssd tier: slot of block " + key.ToHex() + " holds another block");
    }
    if (verdict.ok()) verdict = PreadAll(fd_, dst.data(), h.size, off + sizeof h);
    if (verdict.ok() && Checksum64(dst.data(), h.size) != h.payload_checksum)
      verdict = DataLoss("ssd tier: checksum mismatch in block " + key.ToHex());
  }

  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[slot];
  --s.readers;
  const bool corrupt = verdict.code() == StatusCode::kDataLoss;
  if (corrupt) {
    ++stats_.corrupt;
    ++stats_.misses;
    if (auto it = index_.find(key); it != index_.end() && it->second == slot) {
      index_.erase(it);
      Notify(BlockChange::kRemoved, key);
      policy_->Remove(slot, RemoveReason::kErased);
      s.doomed = true;
    }
  } else if (verdict.ok()) {
    ++stats_.hits;
  }
  if (s.doomed && s.readers == 0) FreeSlotLocked(slot);
  if (!verdict.ok()) return verdict;
  return meta;
}

void SsdTier::ForEachLive(const std::function<void(const BlockKey&)>& fn) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, slot] : index_) fn(key);
}

bool SsdTier::Contains(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

Status SsdTier::Erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return NotFound("block " + key.ToHex() + " is not on the ssd tier");
  const uint32_t slot = it->second;
  index_.erase(it);
  Notify(BlockChange::kRemoved, key);
  policy_->Remove(slot, RemoveReason::kErased);
  if (slots_[slot].readers > 0) slots_[slot].doomed = true;
  else FreeSlotLocked(slot);
  return Status::Ok();
}

SsdStats SsdTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<uint64_t> SsdTier::PayloadOffsetForTest(const BlockKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return NotFound("absent");
  return uint64_t{it->second} * slot_stride_ + sizeof(Header);
}

}  // namespace kvmesh
