// ThreadSanitizer does not model fences (GCC says so, -Wtsan). The seqlock's
// fences order the block copy against the entry's sequence; that copy is
// suppressed for TSan (scripts/tsan.supp), and everything else here is an
// atomic it does model.
#if defined(__SANITIZE_THREAD__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include "transport/local_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "common/checksum.h"

namespace kvmesh {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t PageUp(uint64_t n) { return (n + kPage - 1) / kPage * kPage; }

Status Errno(const std::string& what) {
  const int e = errno;
  std::string m = what + ": " + std::strerror(e);
  if (e == ENOENT) return NotFound(m);
  if (e == EACCES || e == EPERM) return PermissionDenied(m);
  return Unavailable(m);
}

// The copy races with a writer by design (a seqlock): the bytes are kept only
// when the entry's sequence did not move and the hash matches, so a torn copy
// is never used. ThreadSanitizer is told so (scripts/tsan.supp).
__attribute__((noinline)) uint64_t LocalReadCopy(std::byte* dst, const std::byte* src, size_t n) {
  return CopyWithChecksum64(dst, src, n);
}

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the index is shared between processes");
static_assert(sizeof(LocalIndexEntry) == 64 && sizeof(LocalTouchSlot) == 32);
static_assert(sizeof(LocalIndexHeader) <= kPage);

}  // namespace

// ---- the node's side ------------------------------------------------------------------

Result<std::unique_ptr<LocalIndexWriter>> LocalIndexWriter::Create(uint64_t max_blocks, uint64_t pool_bytes) {
  uint32_t entry_bits = 6;  // (at least one bucket)
  while ((uint64_t{1} << entry_bits) < 2 * max_blocks && entry_bits < 22) ++entry_bits;  // at most 4 Mi entries (256 MiB)
  const uint32_t ring_bits = 14;  // 16 Ki reads between drains
  const uint64_t ring_offset = kPage;
  const uint64_t entries_offset = ring_offset + PageUp((uint64_t{1} << ring_bits) * sizeof(LocalTouchSlot));
  const uint64_t bytes = entries_offset + PageUp((uint64_t{1} << entry_bits) * sizeof(LocalIndexEntry));
  std::unique_ptr<LocalIndexWriter> w(new LocalIndexWriter());
  w->fd_ = ::memfd_create("kvmesh-local-index", MFD_CLOEXEC);
  if (w->fd_ < 0) return ResourceExhausted("memfd_create for the local-read index: " + std::string(std::strerror(errno)));
  if (::ftruncate(w->fd_, static_cast<off_t>(bytes)) != 0)
    return ResourceExhausted("sizing the local-read index to " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, w->fd_, 0);
  if (p == MAP_FAILED) return ResourceExhausted("mapping the local-read index: " + std::string(std::strerror(errno)));
  auto* base = static_cast<std::byte*>(p);
  // A fresh memfd reads as zeros: every entry is empty with sequence 0.
  w->header_ = new (base) LocalIndexHeader();
  w->header_->entry_bits = entry_bits;
  w->header_->ring_bits = ring_bits;
  w->header_->ring_offset = ring_offset;
  w->header_->entries_offset = entries_offset;
  w->header_->segment_bytes = bytes;
  w->header_->pool_bytes = pool_bytes;
  w->ring_ = reinterpret_cast<LocalTouchSlot*>(base + ring_offset);
  w->entries_ = reinterpret_cast<LocalIndexEntry*>(base + entries_offset);
  return w;
}

LocalIndexWriter::~LocalIndexWriter() {
  if (header_ != nullptr) ::munmap(header_, header_->segment_bytes);
  if (fd_ >= 0) ::close(fd_);
}

void LocalIndexWriter::Publish(const BlockKey& key, uint64_t offset, uint64_t size, uint64_t checksum) {
  LocalIndexEntry* bucket = entries_ + LocalIndexBucket(key, header_->entry_bits);
  // An empty entry of the bucket, else the one the key picks. A writer takes
  // an entry by moving its sequence from even to odd: a failed exchange means
  // another writer changed it since it was read; an odd one is being written.
  LocalIndexEntry* e = nullptr;
  uint64_t s = 0;
  for (uint32_t w = 0; w < kLocalIndexWays && e == nullptr; ++w) {
    uint64_t x = bucket[w].seq.load(std::memory_order_acquire);
    if ((x & 1) == 0 && bucket[w].size.load(std::memory_order_relaxed) == 0 &&
        bucket[w].seq.compare_exchange_strong(x, x + 1, std::memory_order_acquire)) {
      e = &bucket[w];
      s = x;
    }
  }
  if (e == nullptr) {
    LocalIndexEntry& v = bucket[(key.lo ^ key.hi) & (kLocalIndexWays - 1)];
    uint64_t x = v.seq.load(std::memory_order_relaxed);
    if ((x & 1) != 0 || !v.seq.compare_exchange_strong(x, x + 1, std::memory_order_acquire)) return;  // not published
    e = &v;
    s = x;
  }
  std::atomic_thread_fence(std::memory_order_release);  // readers that see a field below see the odd seq
  e->key_hi.store(key.hi, std::memory_order_relaxed);
  e->key_lo.store(key.lo, std::memory_order_relaxed);
  e->offset.store(offset, std::memory_order_relaxed);
  e->size.store(size, std::memory_order_relaxed);
  e->checksum.store(checksum, std::memory_order_relaxed);
  e->seq.store(s + 2, std::memory_order_release);
  published_.fetch_add(1, std::memory_order_relaxed);
}

void LocalIndexWriter::Retract(const BlockKey& key, uint64_t offset) {
  LocalIndexEntry* bucket = entries_ + LocalIndexBucket(key, header_->entry_bits);
  for (uint32_t w = 0; w < kLocalIndexWays; ++w) {
    LocalIndexEntry& e = bucket[w];
    uint64_t s = e.seq.load(std::memory_order_acquire);
    if ((s & 1) == 0 && e.size.load(std::memory_order_relaxed) != 0 &&
        e.key_hi.load(std::memory_order_relaxed) == key.hi && e.key_lo.load(std::memory_order_relaxed) == key.lo &&
        e.offset.load(std::memory_order_relaxed) == offset &&
        // A failed exchange: another writer took the entry, for another block.
        e.seq.compare_exchange_strong(s, s + 1, std::memory_order_acquire)) {
      std::atomic_thread_fence(std::memory_order_release);
      e.size.store(0, std::memory_order_relaxed);
      e.key_hi.store(0, std::memory_order_relaxed);
      e.key_lo.store(0, std::memory_order_relaxed);
      e.seq.store(s + 2, std::memory_order_release);
      break;
    }
  }
  // Whatever writes the block's memory next comes after this fence: a reader
  // that copied any of those bytes then sees the entry's sequence change.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

size_t LocalIndexWriter::DrainTouches(const std::function<void(const BlockKey&)>& fn) {
  const uint64_t size = uint64_t{1} << header_->ring_bits;
  const uint64_t head = header_->ring_head.load(std::memory_order_acquire);
  if (head - ring_tail_ > size) ring_tail_ = head - size;  // overrun: the oldest are gone
  size_t n = 0;
  for (; ring_tail_ != head; ++ring_tail_) {
    LocalTouchSlot& t = ring_[ring_tail_ & (size - 1)];
    if (t.full.exchange(0, std::memory_order_acquire) == 0) continue;  // its reader has not written it yet: dropped
    fn(BlockKey{t.hi.load(std::memory_order_relaxed), t.lo.load(std::memory_order_relaxed)});
    ++n;
  }
  reads_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

// ---- the client's side ----------------------------------------------------------------

Result<std::shared_ptr<LocalIndexReader>> LocalIndexReader::Open(const std::string& pool_path, uint64_t pool_bytes,
                                                                 const std::string& index_path, uint64_t index_bytes) {
  std::shared_ptr<LocalIndexReader> r(new LocalIndexReader());
  const int pfd = ::open(pool_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (pfd < 0) return Errno("opening the node's pool " + pool_path);
  void* pool = ::mmap(nullptr, pool_bytes, PROT_READ, MAP_SHARED, pfd, 0);
  ::close(pfd);
  if (pool == MAP_FAILED) return Errno("mapping the node's pool");
  r->pool_ = static_cast<const std::byte*>(pool);
  r->pool_bytes_ = pool_bytes;
  const int ifd = ::open(index_path.c_str(), O_RDWR | O_CLOEXEC);
  if (ifd < 0) return Errno("opening the node's local-read index " + index_path);
  LocalIndexHeader h;  // a copy, checked before anything is mapped on its word
  const ssize_t got = ::pread(ifd, &h, offsetof(LocalIndexHeader, ring_head), 0);
  if (got != static_cast<ssize_t>(offsetof(LocalIndexHeader, ring_head)) || h.magic != kLocalIndexMagic ||
      h.version != kLocalIndexVersion || h.segment_bytes != index_bytes || h.entry_bits <= kLocalIndexWayBits || h.entry_bits > 30 ||
      h.ring_bits < 1 || h.ring_bits > 30 || h.ring_offset != kPage || h.entries_offset <= h.ring_offset ||
      h.entries_offset % kPage != 0 ||
      h.ring_offset + (uint64_t{1} << h.ring_bits) * sizeof(LocalTouchSlot) > h.entries_offset ||
      h.entries_offset + (uint64_t{1} << h.entry_bits) * sizeof(LocalIndexEntry) > h.segment_bytes ||
      h.pool_bytes != pool_bytes) {
    ::close(ifd);
    return InvalidArgument("the node's local-read index is not one this client reads (version " +
                           std::to_string(h.version) + ")");
  }
  void* head = ::mmap(nullptr, h.entries_offset, PROT_READ | PROT_WRITE, MAP_SHARED, ifd, 0);
  void* entries = head == MAP_FAILED ? MAP_FAILED
                                     : ::mmap(nullptr, h.segment_bytes - h.entries_offset, PROT_READ, MAP_SHARED, ifd,
                                              static_cast<off_t>(h.entries_offset));
  ::close(ifd);
  if (head == MAP_FAILED || entries == MAP_FAILED) {
    if (head != MAP_FAILED) ::munmap(head, h.entries_offset);
    return Errno("mapping the node's local-read index");
  }
  r->index_map_ = head;
  r->head_bytes_ = h.entries_offset;
  r->entries_map_ = entries;
  r->entries_bytes_ = h.segment_bytes - h.entries_offset;
  r->header_ = static_cast<LocalIndexHeader*>(head);
  r->ring_ = reinterpret_cast<LocalTouchSlot*>(static_cast<std::byte*>(head) + h.ring_offset);
  r->entries_ = static_cast<const LocalIndexEntry*>(entries);
  r->entry_bits_ = h.entry_bits;
  r->ring_mask_ = (uint64_t{1} << h.ring_bits) - 1;
  return r;
}

LocalIndexReader::~LocalIndexReader() {
  if (entries_map_ != nullptr) ::munmap(entries_map_, entries_bytes_);
  if (index_map_ != nullptr) ::munmap(index_map_, head_bytes_);
  if (pool_ != nullptr) ::munmap(const_cast<std::byte*>(pool_), pool_bytes_);
}

size_t LocalIndexReader::Read(const BlockKey& key, std::span<std::byte> dst) {
  const LocalIndexEntry* bucket = entries_ + LocalIndexBucket(key, entry_bits_);
  for (uint32_t w = 0; w < kLocalIndexWays; ++w) {
    const LocalIndexEntry& e = bucket[w];
    const uint64_t s = e.seq.load(std::memory_order_acquire);
    if (e.key_hi.load(std::memory_order_relaxed) != key.hi || e.key_lo.load(std::memory_order_relaxed) != key.lo)
      continue;
    const uint64_t size = e.size.load(std::memory_order_relaxed);
    const uint64_t offset = e.offset.load(std::memory_order_relaxed);
    const uint64_t sum = e.checksum.load(std::memory_order_relaxed);
    if ((s & 1) != 0 || size == 0 || size > dst.size() || offset > pool_bytes_ || size > pool_bytes_ - offset) return 0;
    const uint64_t got = LocalReadCopy(dst.data(), pool_ + offset, size);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(std::memory_order_relaxed) != s || got != sum) return 0;
    LocalTouchSlot& t = ring_[header_->ring_head.fetch_add(1, std::memory_order_relaxed) & ring_mask_];
    t.hi.store(key.hi, std::memory_order_relaxed);
    t.lo.store(key.lo, std::memory_order_relaxed);
    t.full.store(1, std::memory_order_release);
    return size;
  }
  return 0;
}

}  // namespace kvmesh
