// transport/local_index.h — local reads: a client on the node's host reads
// blocks straight from the node's pool, with no message and no hand-over
// (docs/protocol.md "Local reads", docs/architecture.md).
//
// A node whose pool is shared memory (a memfd) publishes, beside it, an index
// segment (another memfd): a table, in 4-way buckets, of the live raw blocks of
// its primary store (key, pool offset, size, xxHash3-64 checksum), each entry
// a seqlock, and a ring where readers leave the keys they read so that the
// node counts the hits and refreshes their recency (its eviction policy sees
// them as it sees any read). A client on the same host that the node lets map
// them (LOCAL_MAP, transport/protocol.h) opens both through /proc/<pid>/fd of
// the node and, for each key, looks up its entry, copies the block and hashes
// it in one pass, and keeps the copy only when the entry did not change
// meanwhile and the hash matches. Anything else (no entry for the key, an
// entry being written, a changed entry, a bad hash, an encoded or grouped
// block) is a local miss: the caller asks the node as before. So a local
// read never returns bytes the node did not hold under that key, and the
// table only has to be a cache of the store's index: a full bucket drops an
// older entry, and a writer that finds an entry being written leaves it.
//
// The writer (the node's store, under the stripe lock of the block) removes
// a block's entry before its chunk can be written again (FreeChunk) and when
// the block leaves the index (erase, eviction, a bad checksum); a reader that
// copied from a chunk being reused sees its entry's sequence change.
//
//   Node:   auto w = LocalIndexWriter::Create(max_blocks, pool_bytes);   // w->fd() for LOCAL_MAP
//           w->Publish(key, offset, size, checksum);  w->Retract(key, offset);
//           w->DrainTouches([&](const BlockKey& k) { store.TouchLocal(k); });
//   Client: auto r = LocalIndexReader::Open(pool_path, pool_bytes, index_path, index_bytes);
//           size_t n = r->Read(key, dst);             // 0: ask the node
//
// Thread-safety: the writer's Publish and Retract may run on any threads at
// once (entries are taken by compare-and-swap); DrainTouches on one thread at
// a time. The reader is thread-safe; readers in many processes share a ring.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh {

inline constexpr uint64_t kLocalIndexMagic = 0x314c4968736d766bull;  // "kvmshIL1"
inline constexpr uint32_t kLocalIndexVersion = 1;

// The index segment: this header (its own page, written by the node at
// creation, the ring head by readers), the touch ring (readers write it),
// then the entries (the node writes them; readers map them read-only).
struct LocalIndexHeader {
  uint64_t magic = kLocalIndexMagic;
  uint32_t version = kLocalIndexVersion;
  uint32_t entry_bits = 0;  // 1 << entry_bits entries
  uint32_t ring_bits = 0;   // 1 << ring_bits touch slots
  uint32_t reserved = 0;
  uint64_t ring_offset = 0;     // bytes from the segment's start (page aligned)
  uint64_t entries_offset = 0;  // (page aligned)
  uint64_t segment_bytes = 0;
  uint64_t pool_bytes = 0;  // the pool segment's size (LOCAL_MAP's too): an entry never points past it
  alignas(64) std::atomic<uint64_t> ring_head{0};  // readers take slots with fetch_add
};

// One block: seq is odd while its fields are written; size 0 is empty.
struct alignas(64) LocalIndexEntry {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> key_hi{0}, key_lo{0};
  std::atomic<uint64_t> offset{0};
  std::atomic<uint64_t> size{0};
  std::atomic<uint64_t> checksum{0};
};

// A read left for the node: the key, then `full` set (release) by the
// reader and cleared by the node when it takes the key.
struct LocalTouchSlot {
  std::atomic<uint64_t> hi{0}, lo{0};
  std::atomic<uint64_t> full{0};
  uint64_t pad = 0;
};

// Entries come in buckets of kLocalIndexWays (256 bytes): a key may live in
// any entry of its bucket, so two keys of one bucket both stay published
// until the bucket is full (then a publication replaces the entry its key
// picks). A direct-mapped table lost about one key in 70 to a collision at
// this load, and every GET of such a key went to the node.
inline constexpr uint32_t kLocalIndexWayBits = 2;
inline constexpr uint32_t kLocalIndexWays = 1u << kLocalIndexWayBits;
// The first entry of the bucket a key lives in, of 1 << bits entries.
inline uint64_t LocalIndexBucket(const BlockKey& k, uint32_t bits) {
  const uint64_t h = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
  return (h >> (64 - (bits - kLocalIndexWayBits))) << kLocalIndexWayBits;
}

class LocalIndexWriter {
 public:
  // An index for a store of at most `max_blocks` blocks (twice as many
  // entries, rounded up to a power of two) over a pool of `pool_bytes`.
  // ResourceExhausted when the segment cannot be made.
  static Result<std::unique_ptr<LocalIndexWriter>> Create(uint64_t max_blocks, uint64_t pool_bytes);
  ~LocalIndexWriter();
  LocalIndexWriter(const LocalIndexWriter&) = delete;
  LocalIndexWriter& operator=(const LocalIndexWriter&) = delete;

  // The segment's memfd (readers open /proc/<pid>/fd/<fd>) and its size.
  int fd() const { return fd_; }
  uint64_t bytes() const { return header_->segment_bytes; }

  // Makes the block at [offset, offset + size) of the pool readable under
  // `key`: an empty entry of its bucket, else the entry its key picks.
  void Publish(const BlockKey& key, uint64_t offset, uint64_t size, uint64_t checksum);
  // Removes the entry of `key` at `offset`, if it is still there. Writes to
  // the block's memory after this are not read as the block.
  void Retract(const BlockKey& key, uint64_t offset);
  // Calls fn(key) for each read readers left since the last call (lossy: a
  // ring overrun drops the oldest); the count.
  size_t DrainTouches(const std::function<void(const BlockKey&)>& fn);
  // Blocks published so far, and reads DrainTouches handed on (metrics).
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }

 private:
  LocalIndexWriter() = default;
  int fd_ = -1;
  LocalIndexHeader* header_ = nullptr;
  LocalTouchSlot* ring_ = nullptr;
  LocalIndexEntry* entries_ = nullptr;
  uint64_t ring_tail_ = 0;  // DrainTouches' thread
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> reads_{0};
};

class LocalIndexReader {
 public:
  // Maps a node's pool (read-only) and index segments from their paths
  // (/proc/<pid>/fd/<n> of the node). Errors: the open or map failed
  // (PermissionDenied, NotFound...) or the index is not one this code reads
  // (another version, sizes that differ from LOCAL_MAP's).
  static Result<std::shared_ptr<LocalIndexReader>> Open(const std::string& pool_path, uint64_t pool_bytes,
                                                       const std::string& index_path, uint64_t index_bytes);
  ~LocalIndexReader();
  LocalIndexReader(const LocalIndexReader&) = delete;
  LocalIndexReader& operator=(const LocalIndexReader&) = delete;

  // Copies the block stored under `key` into dst and returns its size when
  // the index holds it, its size fits dst and the copy is whole and checks;
  // 0 otherwise (a local miss: ask the node). Leaves the read in the ring.
  size_t Read(const BlockKey& key, std::span<std::byte> dst);

 private:
  LocalIndexReader() = default;
  const std::byte* pool_ = nullptr;
  uint64_t pool_bytes_ = 0;
  void* index_map_ = nullptr;  // header and ring, read-write
  uint64_t head_bytes_ = 0;
  void* entries_map_ = nullptr;  // entries, read-only
  uint64_t entries_bytes_ = 0;
  LocalIndexHeader* header_ = nullptr;
  LocalTouchSlot* ring_ = nullptr;
  const LocalIndexEntry* entries_ = nullptr;
  uint32_t entry_bits_ = 0;
  uint64_t ring_mask_ = 0;
};

}  // namespace kvmesh
