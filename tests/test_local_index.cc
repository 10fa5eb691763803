// Local reads (transport/local_index.h) over a real BlockStore whose pool is
// a memfd: what the index serves, what it must never serve (an erased, an
// evicted, a replaced block, a torn copy), and the reads it hands back to
// the store as hits.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "shard_node/block_store.h"
#include "transport/local_index.h"

using namespace kvmesh;

namespace {

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull + 1, i ^ 0x5bd1e995ull}; }

// The bytes of block i: every byte says which block and where.
std::vector<std::byte> Payload(uint64_t i, size_t size) {
  std::vector<std::byte> b(size);
  for (size_t j = 0; j < size; ++j) b[j] = static_cast<std::byte>((i * 131 + j * 7 + (j >> 8)) & 0xff);
  return b;
}

std::unique_ptr<BlockStore> Store(uint64_t capacity, uint64_t slot, uint32_t classes = 1, uint32_t stripes = 2) {
  StoreOptions o;
  o.capacity_bytes = capacity;
  o.slot_bytes = slot;
  o.size_classes = classes;
  o.stripes = stripes;
  o.policy = "lru";
  o.local_reads = true;
  auto s = BlockStore::Create(std::move(o));
  REQUIRE(s.ok());
  return std::move(*s);
}

std::shared_ptr<LocalIndexReader> Reader(BlockStore& s) {
  REQUIRE(s.local_index() != nullptr);
  const std::string fds = "/proc/" + std::to_string(::getpid()) + "/fd/";
  auto r = LocalIndexReader::Open(fds + std::to_string(s.backend().shared_fd()), s.backend().size(),
                                  fds + std::to_string(s.local_index()->fd()), s.local_index()->bytes());
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("Local reads: stored blocks read through the index, gone ones miss", "[local_reads]") {
  auto store = Store(8 << 20, 64 << 10, 4);
  auto r = Reader(*store);
  std::vector<std::byte> dst(64 << 10);
  for (uint64_t i = 0; i < 20; ++i) REQUIRE(store->Put(Key(i), Payload(i, 1000 + i * 3000)).ok());
  size_t read = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    const size_t n = r->Read(Key(i), dst);
    // A collision may leave a block out of the index (a local miss), never a wrong block.
    if (n == 0) continue;
    ++read;
    REQUIRE(n == 1000 + i * 3000);
    const auto want = Payload(i, n);
    CHECK(std::memcmp(dst.data(), want.data(), n) == 0);
  }
  CHECK(read == 20);  // 4-way buckets: no key lost to a collision at this load
  CHECK(r->Read(Key(99), dst) == 0);  // never stored
  // Too small a destination: the node's answer says so, not the index.
  std::vector<std::byte> small(100);
  CHECK(r->Read(Key(1), small) == 0);
  // Erased: a miss at once.
  REQUIRE(store->Erase(Key(3)).ok());
  CHECK(r->Read(Key(3), dst) == 0);
  // A pinned block that is erased is hidden from local reads too.
  {
    auto ref = store->Get(Key(4));
    REQUIRE(ref.ok());
    REQUIRE(store->Erase(Key(4)).ok());
    CHECK(r->Read(Key(4), dst) == 0);
  }
  // Stored again: read again.
  REQUIRE(store->Put(Key(3), Payload(3, 4000)).ok());
  REQUIRE(r->Read(Key(3), dst) == 4000);
  const auto want = Payload(3, 4000);
  CHECK(std::memcmp(dst.data(), want.data(), 4000) == 0);
}

TEST_CASE("Local reads: evicted blocks miss and reads count as hits that keep blocks", "[local_reads]") {
  // 16 slots of 64 KiB in one stripe of fixed slots, LRU.
  auto store = Store(1 << 20, 64 << 10, 1, 1);
  auto r = Reader(*store);
  std::vector<std::byte> dst(64 << 10);
  for (uint64_t i = 0; i < 16; ++i) REQUIRE(store->Put(Key(i), Payload(i, 64 << 10)).ok());
  // Read block 0 locally, then hand the reads to the store as the node's
  // drain thread does: it becomes the most recent and a hit.
  const uint64_t hits0 = store->Stats().hits;
  size_t read = 0;
  for (int k = 0; k < 3; ++k) read += r->Read(Key(0), dst) > 0 ? 1 : 0;
  REQUIRE(read == 3);
  size_t drained = store->local_index()->DrainTouches([&](const BlockKey& k) { store->TouchLocal(k); });
  CHECK(drained == 3);
  CHECK(store->Stats().hits == hits0 + 3);
  // 15 more blocks evict the 15 least recently used: blocks 1..15, and not
  // block 0, the oldest put but the most recently read.
  for (uint64_t i = 16; i < 31; ++i) REQUIRE(store->Put(Key(i), Payload(i, 64 << 10)).ok());
  CHECK(store->Exists(Key(0)));
  CHECK_FALSE(store->Exists(Key(1)));
  // Whatever was evicted misses locally; whatever is stored reads its own bytes.
  for (uint64_t i = 0; i < 31; ++i) {
    const size_t n = r->Read(Key(i), dst);
    if (!store->Exists(Key(i))) {
      CHECK(n == 0);
    } else if (n > 0) {
      const auto want = Payload(i, 64 << 10);
      CHECK(std::memcmp(dst.data(), want.data(), n) == 0);
    }
  }
  CHECK(store->Stats().evictions > 0);
  // Nothing left in the ring after a drain, and a drain of nothing is nothing.
  store->local_index()->DrainTouches([](const BlockKey&) {});
  CHECK(store->local_index()->DrainTouches([](const BlockKey&) {}) == 0);
}

TEST_CASE("Local reads never return another block's bytes while chunks are reused", "[local_reads]") {
  // A small store under constant eviction, erases and puts (chunks reused all
  // the time) while reader threads read random keys: every byte a read
  // returns must be the key's own.
  auto store = Store(1 << 20, 32 << 10, 2);
  auto r = Reader(*store);
  constexpr uint64_t kKeys = 64;
  std::vector<std::vector<std::byte>> payload;
  for (uint64_t i = 0; i < kKeys; ++i) payload.push_back(Payload(i, 2048 + (i % 7) * 4096));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0}, hits{0};
  std::thread writer([&] {
    std::mt19937_64 rng(1);
    while (!stop.load()) {
      const uint64_t i = rng() % kKeys;
      if (rng() % 4 == 0) (void)store->Erase(Key(i));
      else (void)store->Put(Key(i), payload[i]);
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::byte> dst(32 << 10);
      while (!stop.load()) {
        const uint64_t i = rng() % kKeys;
        const size_t n = r->Read(Key(i), dst);
        if (n == 0) continue;
        hits.fetch_add(1);
        if (n != payload[i].size() || std::memcmp(dst.data(), payload[i].data(), n) != 0) wrong.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  stop = true;
  writer.join();
  for (auto& t : readers) t.join();
  INFO("local hits " << hits.load());
  CHECK(wrong.load() == 0);
  CHECK(hits.load() > 100);
}

TEST_CASE("Local reads: a bucket holds four keys; a fifth replaces one, and no read returns another's bytes",
          "[local_reads]") {
  // An index of 64 entries (16 buckets) over a memfd pool of 8 blocks.
  auto w = LocalIndexWriter::Create(32, 8 * 4096);
  REQUIRE(w.ok());
  const int pool = ::memfd_create("test-pool", MFD_CLOEXEC);
  REQUIRE(pool >= 0);
  REQUIRE(::ftruncate(pool, 8 * 4096) == 0);
  // Five keys of one bucket, each block 4 KiB of its own bytes at its own offset.
  std::vector<BlockKey> keys;
  for (uint64_t i = 1; keys.size() < 5; ++i)
    if (LocalIndexBucket(Key(i), 6) == LocalIndexBucket(Key(1), 6)) keys.push_back(Key(i));
  for (size_t k = 0; k < keys.size(); ++k) {
    const auto b = Payload(k, 4096);
    REQUIRE(::pwrite(pool, b.data(), b.size(), static_cast<off_t>(k * 4096)) == 4096);
  }
  const std::string fds = "/proc/" + std::to_string(::getpid()) + "/fd/";
  auto r = LocalIndexReader::Open(fds + std::to_string(pool), 8 * 4096, fds + std::to_string((*w)->fd()), (*w)->bytes());
  REQUIRE(r.ok());
  std::vector<std::byte> dst(4096);
  auto readable = [&] {
    size_t n = 0;
    for (size_t k = 0; k < keys.size(); ++k) {
      if ((*r)->Read(keys[k], dst) == 0) continue;
      const auto want = Payload(k, 4096);
      CHECK(std::memcmp(dst.data(), want.data(), 4096) == 0);
      ++n;
    }
    return n;
  };
  for (size_t k = 0; k < 4; ++k) (*w)->Publish(keys[k], k * 4096, 4096, Checksum64(Payload(k, 4096).data(), 4096));
  CHECK(readable() == 4);
  (*w)->Publish(keys[4], 4 * 4096, 4096, Checksum64(Payload(4, 4096).data(), 4096));
  CHECK(readable() == 4);  // the fifth took one entry
  CHECK((*r)->Read(keys[4], dst) == 4096);
  // A checksum that does not match the bytes: a local miss, not the bytes.
  (*w)->Retract(keys[4], 4 * 4096);
  CHECK((*r)->Read(keys[4], dst) == 0);
  (*w)->Publish(keys[4], 4 * 4096, 4096, 12345);
  CHECK((*r)->Read(keys[4], dst) == 0);
  // An entry pointing past the pool: a miss.
  (*w)->Retract(keys[4], 4 * 4096);
  (*w)->Publish(keys[4], 7 * 4096 + 1, 4096, Checksum64(Payload(4, 4096).data(), 4096));
  CHECK((*r)->Read(keys[4], dst) == 0);
  ::close(pool);
}

TEST_CASE("Local reads: a reader refuses an index it does not know", "[local_reads]") {
  auto store = Store(1 << 20, 64 << 10);
  const std::string fds = "/proc/" + std::to_string(::getpid()) + "/fd/";
  const std::string pool = fds + std::to_string(store->backend().shared_fd());
  const std::string index = fds + std::to_string(store->local_index()->fd());
  // A size that is not the index's, a path that names nothing.
  CHECK(LocalIndexReader::Open(pool, store->backend().size(), index, store->local_index()->bytes() + 4096)
            .status()
            .code() == StatusCode::kInvalidArgument);
  CHECK(LocalIndexReader::Open(fds + "999999", store->backend().size(), index, store->local_index()->bytes())
            .status()
            .code() == StatusCode::kNotFound);
  // A store without local reads has no index and a private pool.
  StoreOptions o;
  o.capacity_bytes = 1 << 20;
  o.slot_bytes = 64 << 10;
  auto plain = BlockStore::Create(std::move(o));
  REQUIRE(plain.ok());
  CHECK((*plain)->local_index() == nullptr);
  CHECK((*plain)->backend().shared_fd() == -1);
}
