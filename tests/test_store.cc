#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <thread>

#include "kvmesh/clock.h"
#include "shard_node/block_store.h"

using namespace kvmesh;

namespace {
std::unique_ptr<BlockStore> MakeStore(uint64_t slots, uint64_t slot_bytes = 4096, Clock* clock = nullptr,
                                      uint32_t stripes = 1, const char* policy = "lru-priority") {
  StoreOptions o;
  o.capacity_bytes = slots * slot_bytes;
  o.slot_bytes = slot_bytes;
  o.stripes = stripes;
  o.policy = policy;
  o.clock = clock;
  o.policy_options.aging_ns = 0;
  auto r = BlockStore::Create(std::move(o));
  REQUIRE(r.ok());
  return std::move(r).value();
}
BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull, i}; }
std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed + i * 7);
  return v;
}
}  // namespace

TEST_CASE("Store put/get/exists/erase round trip", "[store]") {
  auto s = MakeStore(8);
  auto a = Bytes(1000, 1), b = Bytes(4096, 2);
  REQUIRE(s->Put(Key(1), a).ok());
  REQUIRE(s->Put(Key(2), b).ok());
  CHECK(s->Exists(Key(1)));
  CHECK_FALSE(s->Exists(Key(3)));
  {
    auto r = s->Get(Key(1));
    REQUIRE(r.ok());
    REQUIRE(r->data().size() == 1000);
    CHECK(std::memcmp(r->data().data(), a.data(), 1000) == 0);
  }
  std::vector<std::byte> out(4096);
  auto n = s->GetInto(Key(2), out);
  REQUIRE(n.ok());
  CHECK(*n == 4096);
  CHECK(out == b);
  CHECK(s->Erase(Key(1)).ok());
  CHECK(s->Get(Key(1)).status().code() == StatusCode::kNotFound);
  CHECK(s->Erase(Key(1)).code() == StatusCode::kNotFound);
  auto st = s->Stats();
  CHECK(st.blocks == 1);
  CHECK(st.bytes_stored == 4096);
  CHECK(st.hits == 2);
  CHECK(st.misses == 1);
}

TEST_CASE("Store rejects empty and oversize blocks and duplicates keep the first payload", "[store]") {
  auto s = MakeStore(4);
  CHECK(s->Put(Key(1), {}).code() == StatusCode::kInvalidArgument);
  CHECK(s->Put(Key(1), Bytes(4097, 0)).code() == StatusCode::kInvalidArgument);
  REQUIRE(s->Put(Key(1), Bytes(100, 1)).ok());
  REQUIRE(s->Put(Key(1), Bytes(100, 9)).ok());  // content-addressed: same key, same block
  auto r = s->Get(Key(1));
  REQUIRE(r.ok());
  CHECK(r->data()[0] == std::byte{1});
  CHECK(s->Stats().put_duplicates == 1);
}

TEST_CASE("A full store evicts by policy and never exceeds its pool", "[store]") {
  ManualClock clock;
  auto s = MakeStore(4, 4096, &clock);
  for (uint64_t i = 0; i < 4; ++i) {
    PutOptions o;
    o.priority = i == 0 ? 3 : 1;  // block 0 is high priority
    REQUIRE(s->Put(Key(i), Bytes(4096, static_cast<uint8_t>(i)), o).ok());
    clock.Advance(10);
  }
  REQUIRE(s->Put(Key(10), Bytes(4096, 10)).ok());  // evicts the oldest class-1 block: 1
  CHECK(s->Exists(Key(0)));
  CHECK_FALSE(s->Exists(Key(1)));
  REQUIRE(s->Put(Key(11), Bytes(4096, 11)).ok());  // then 2
  CHECK_FALSE(s->Exists(Key(2)));
  auto st = s->Stats();
  CHECK(st.blocks == 4);
  CHECK(st.evictions == 2);
  CHECK(st.evictions_by_class[1] == 2);
  CHECK(st.bytes_stored <= st.capacity_bytes);
}

TEST_CASE("Pinned blocks are never evicted and a fully pinned store refuses puts", "[store]") {
  auto s = MakeStore(2);
  REQUIRE(s->Put(Key(1), Bytes(64, 1)).ok());
  REQUIRE(s->Put(Key(2), Bytes(64, 2)).ok());
  REQUIRE(s->Pin(Key(1)).ok());
  auto held = s->Get(Key(2));  // a read holds a pin too
  REQUIRE(held.ok());
  Status st = s->Put(Key(3), Bytes(64, 3));
  CHECK(st.code() == StatusCode::kResourceExhausted);
  CHECK(s->Exists(Key(1)));
  CHECK(s->Exists(Key(2)));
  held->Release();
  REQUIRE(s->Put(Key(3), Bytes(64, 3)).ok());  // now 2 is evictable
  CHECK_FALSE(s->Exists(Key(2)));
  CHECK(s->Exists(Key(1)));
  CHECK(s->Unpin(Key(1)).ok());
  CHECK(s->Unpin(Key(1)).code() == StatusCode::kFailedPrecondition);
  CHECK(s->Pin(Key(99)).code() == StatusCode::kNotFound);
}

TEST_CASE("Erasing a pinned block hides it at once and frees it on the last unpin", "[store]") {
  auto s = MakeStore(1);
  REQUIRE(s->Put(Key(1), Bytes(64, 1)).ok());
  auto ref = s->Get(Key(1));
  REQUIRE(ref.ok());
  REQUIRE(s->Erase(Key(1)).ok());
  CHECK_FALSE(s->Exists(Key(1)));
  CHECK(ref->data()[0] == std::byte{1});  // the reader's view stays valid
  CHECK(s->Put(Key(2), Bytes(64, 2)).code() == StatusCode::kResourceExhausted);  // slot still held
  ref->Release();
  CHECK(s->Put(Key(2), Bytes(64, 2)).ok());
}

TEST_CASE("A corrupt payload fails its checksum and reads as a miss", "[store]") {
  auto s = MakeStore(4);
  REQUIRE(s->Put(Key(1), Bytes(512, 1)).ok());
  {
    auto r = s->Get(Key(1));
    REQUIRE(r.ok());
    // Flip one bit in pool memory behind the store's back (a torn write / bit rot).
    auto* p = const_cast<std::byte*>(r->data().data());
    p[100] ^= std::byte{0x10};
  }
  auto r = s->Get(Key(1));
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK(IsMiss(r.status()));
  CHECK_FALSE(s->Exists(Key(1)));  // dropped, not served again
  auto st = s->Stats();
  CHECK(st.corrupt == 1);
  CHECK(st.blocks == 0);
  REQUIRE(s->Put(Key(1), Bytes(512, 1)).ok());  // and can be stored afresh
  CHECK(s->Get(Key(1)).ok());
}

TEST_CASE("Budgets too small for one block are refused at creation", "[store]") {
  StoreOptions o;
  o.capacity_bytes = 1000;
  o.slot_bytes = 4096;
  auto r = BlockStore::Create(std::move(o));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("cannot hold one block") != std::string::npos);
}

TEST_CASE("Concurrent puts, gets and erases keep the store consistent", "[store][concurrency]") {
  auto s = MakeStore(256, 1024, nullptr, 8);
  std::atomic<uint64_t> bad{0};
  auto worker = [&](int seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::byte> buf(1024), out(1024);
    for (int i = 0; i < 20000; ++i) {
      uint64_t k = rng() % 1000;
      // Content is a function of the key, so any read can be checked.
      for (size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<std::byte>(k + j);
      switch (rng() % 4) {
        case 0:
        case 1:
          (void)s->Put(Key(k), buf);
          break;
        case 2: {
          auto n = s->GetInto(Key(k), out);
          if (n.ok() && (out != buf)) bad.fetch_add(1);
          break;
        }
        case 3:
          (void)s->Erase(Key(k));
          break;
      }
    }
  };
  std::thread t1(worker, 1), t2(worker, 2), t3(worker, 3);
  t1.join();
  t2.join();
  t3.join();
  CHECK(bad.load() == 0);
  auto st = s->Stats();
  CHECK(st.blocks <= st.slots_total);
  CHECK(st.pinned_blocks == 0);
  CHECK(st.corrupt == 0);
}

TEST_CASE("The eviction policy can be switched at run time and keeps recency order", "[store]") {
  ManualClock clock;
  auto s = MakeStore(4, 4096, &clock, 1, "lru-priority");
  for (uint64_t i = 0; i < 4; ++i) {
    PutOptions o;
    o.priority = i == 0 ? 3 : 0;  // under lru-priority block 0 would survive longest
    REQUIRE(s->Put(Key(i), Bytes(64, static_cast<uint8_t>(i)), o).ok());
    clock.Advance(10);
  }
  auto pinned = s->Get(Key(2));  // pinned during the switch
  REQUIRE(pinned.ok());
  CHECK(s->SetPolicy("no-such-policy").code() == StatusCode::kInvalidArgument);
  CHECK(s->policy_name() == "lru-priority");
  REQUIRE(s->SetPolicy("lru").ok());
  CHECK(s->policy_name() == "lru");
  pinned->Release();  // block 2 rejoins as most recently used
  // Plain LRU now: the oldest (block 0, despite its priority) goes first, then 1, then 3.
  REQUIRE(s->Put(Key(10), Bytes(64, 10)).ok());
  CHECK_FALSE(s->Exists(Key(0)));
  REQUIRE(s->Put(Key(11), Bytes(64, 11)).ok());
  CHECK_FALSE(s->Exists(Key(1)));
  REQUIRE(s->Put(Key(12), Bytes(64, 12)).ok());
  CHECK_FALSE(s->Exists(Key(3)));
  CHECK(s->Exists(Key(2)));
  CHECK(s->Stats().blocks == 4);
}
