// bench_store: the block store and the router's match_prefix, each beside a
// baseline measured in the same run.
//
//   build/bin/bench_store [--quick] [--json]
//
// Rows:
//   put  <size>   BlockStore::Put (copy into the pool + xxh3 checksum + index +
//                 eviction at steady state)        vs memcpy of the same bytes
//   get  <size>   BlockStore::GetInto (pin, verify checksum, copy out, unpin)
//                                                  vs memcpy of the same bytes
//   view <size>   BlockStore::Get (pinned zero-copy view, verify checksum)
//                                                  vs memcpy of the same bytes
//   match_prefix  Router::MatchPrefix on a 4-node embedded cluster, block
//                 lookups/s, vs lookups of the same keys in one absl::flat_hash_set
//   mixed put / mixed get / mixed held
//                 a mixed-size workload (30% raw blocks, 30% int8-of-fp16
//                 size, 20% int4 size, 20% uniform 1 KiB..slot/4) on the
//                 size-classed store (size_classes = N, default 4) vs the
//                 fixed-slot store (size_classes = 1), same keys, same pool:
//                 put and get GB/s of payload, and blocks resident after
//                 filling (the "held" row's figures are counts, not rates)
// --classes N sets size_classes for the put/get/view rows and the mixed rows
// (default 4; --classes 1 runs the put/get/view rows on fixed slots);
// --sweep prints the mixed rows for N = 2..6; --mixed-only skips the rest.
// Rates are medians of 7 trials (3 with --quick); each trial of a row runs the
// kvmesh operation and its baseline back to back, so both see the same load.
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <string>

#include <absl/container/flat_hash_set.h>
#include <nlohmann/json.hpp>

#include "bench/bench_util.h"
#include "common/hash.h"
#include "kvmesh/embedded.h"
#include "kvmesh/size.h"
#include "shard_node/block_store.h"

using namespace kvmesh;
using kvmesh::bench::MeasurePair;
using kvmesh::bench::Sample;

namespace {

struct Row {
  std::string name;
  std::string unit;
  Sample value, baseline;
  std::string baseline_name;
};

BlockKey Key(uint64_t i) { return BlockKey{i * 0x9E3779B97F4A7C15ull + 1, i}; }

// A store of `capacity` bytes in `slot`-byte slots with `classes` size
// classes, 8 stripes, on prefaulted host memory, without aging.
std::unique_ptr<BlockStore> BenchStore(size_t capacity, size_t slot, uint32_t classes) {
  StoreOptions o;
  o.capacity_bytes = capacity;
  o.slot_bytes = slot;
  o.size_classes = classes;
  o.stripes = 8;
  o.policy_options.aging_ns = 0;
  HostMemoryOptions hm;
  hm.prefault = true;
  o.backend = MakeHostMemory(capacity, hm).value();
  return BlockStore::Create(std::move(o)).value();
}

std::vector<Row> StoreRows(size_t block, int trials, uint32_t classes) {
  const size_t capacity = 256ull << 20;
  const size_t slots = capacity / block;
  const size_t src_blocks = std::max<size_t>(8, (64ull << 20) / block);  // 64 MiB of sources: out of cache
  std::vector<std::byte> src(src_blocks * block);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < src.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(&src[i], &v, 8);
  }
  std::vector<std::byte> dst(capacity);  // memcpy baseline destination, same size as the pool
  std::memset(dst.data(), 1, dst.size());

  auto store = BenchStore(capacity, block, classes);

  const size_t ops = std::max<size_t>(64, (512ull << 20) / block);  // ~512 MiB per trial
  uint64_t next_key = 0;
  auto put = [&] {
    for (size_t i = 0; i < ops; ++i) {
      const size_t s = (next_key % src_blocks) * block;
      (void)store->Put(Key(next_key++), std::span(src).subspan(s, block));
    }
    return double(ops * block);
  };
  auto memcpy_in = [&] {
    for (size_t i = 0; i < ops; ++i)
      std::memcpy(dst.data() + (i % slots) * block, src.data() + (i % src_blocks) * block, block);
    return double(ops * block);
  };
  auto [put_s, memcpy_in_s] = MeasurePair(trials, put, memcpy_in);
  Row rp{"put " + FormatSize(block), "GB/s", put_s, memcpy_in_s, "memcpy"};

  // Resident keys for reads: the last `slots` keys put (some may have been
  // evicted by stripe imbalance; count only hits).
  std::vector<BlockKey> resident;
  for (uint64_t k = next_key - slots; k < next_key; ++k)
    if (store->Exists(Key(k))) resident.push_back(Key(k));
  std::vector<std::byte> out(src_blocks * block);
  auto get = [&] {
    size_t bytes = 0;
    for (size_t i = 0; i < ops; ++i) {
      auto n = store->GetInto(resident[i % resident.size()], std::span(out).subspan((i % src_blocks) * block, block));
      bytes += n.ok() ? *n : 0;
    }
    return double(bytes);
  };
  auto memcpy_out = [&] {
    for (size_t i = 0; i < ops; ++i)
      std::memcpy(out.data() + (i % src_blocks) * block, dst.data() + (i % slots) * block, block);
    return double(ops * block);
  };
  auto [get_s, memcpy_out_s] = MeasurePair(trials, get, memcpy_out);
  Row rg{"get " + FormatSize(block), "GB/s", get_s, memcpy_out_s, "memcpy"};
  auto view = [&] {
    size_t bytes = 0;
    for (size_t i = 0; i < ops; ++i) {
      auto r = store->Get(resident[i % resident.size()]);
      bytes += r.ok() ? r->data().size() : 0;
    }
    return double(bytes);
  };
  auto [view_s, memcpy_out2_s] = MeasurePair(trials, view, memcpy_out);
  Row rv{"view " + FormatSize(block), "GB/s", view_s, memcpy_out2_s, "memcpy (out)"};
  for (Row* r : {&rp, &rg, &rv})
    for (Sample* s : {&r->value, &r->baseline}) s->median /= 1e9, s->min /= 1e9, s->max /= 1e9;
  return {rp, rg, rv};
}

// Keys that spread over every stripe (Key() above leaves some stripes empty).
BlockKey SpreadKey(uint64_t i) { return BlockKey{Mix64(i + 1), i}; }

// The mixed-size rows: `classes` against fixed slots (size_classes = 1).
std::vector<Row> MixedRows(uint32_t classes, int trials) {
  const size_t slot = 256 << 10, capacity = 256ull << 20;
  auto slab = BenchStore(capacity, slot, classes), fixed = BenchStore(capacity, slot, 1);
  const size_t keys = 4 * capacity / slot;  // 4x more distinct blocks than full slots
  std::vector<uint32_t> size_of(keys);
  std::mt19937_64 rng(5);
  for (size_t k = 0; k < keys; ++k) {
    const uint64_t d = rng() % 10;
    size_of[k] = d < 3 ? slot                                         // raw
                 : d < 6 ? slot / 2 + slot / 128 + 112                 // int8 g128 of fp16 + header
                 : d < 8 ? slot / 4 + slot / 256 + 112                 // int4 g128
                         : 1024 + static_cast<uint32_t>(rng() % (slot / 4 - 1024));
  }
  std::vector<std::byte> src(slot);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(rng());
  // Every put is a new key (a copy, a checksum and, at steady state, an
  // eviction); both stores see the same key and size sequence.
  const size_t ops = keys;
  auto puts = [&](BlockStore& store, uint64_t& next) {
    return [&, st = &store, n = &next] {
      double bytes = 0;
      for (size_t i = 0; i < ops; ++i, ++*n) {
        const uint32_t size = size_of[*n % keys];
        (void)st->Put(SpreadKey(*n), std::span(src).first(size));
        bytes += size;
      }
      return bytes;
    };
  };
  uint64_t next_slab = 0, next_fixed = 0;
  auto [put_s, put_f] = MeasurePair(trials, puts(*slab, next_slab), puts(*fixed, next_fixed));
  // Reads of the last `ops` keys put, in a random order; only hits count.
  std::vector<uint64_t> order(ops);
  for (uint64_t& k : order) k = next_slab - 1 - rng() % ops;
  std::vector<std::byte> out(slot);
  auto gets = [&](BlockStore& store) {
    return [&, st = &store] {
      double bytes = 0;
      for (uint64_t k : order) {
        auto n = st->GetInto(SpreadKey(k), out);
        bytes += n.ok() ? *n : 0;
      }
      return bytes;
    };
  };
  auto [get_s, get_f] = MeasurePair(trials, gets(*slab), gets(*fixed));
  const std::string tag = " (" + std::to_string(classes) + " classes)";
  Row rp{"mixed put" + tag, "GB/s", put_s, put_f, "fixed slots"};
  Row rg{"mixed get (hit bytes)" + tag, "GB/s", get_s, get_f, "fixed slots"};
  for (Row* r : {&rp, &rg})
    for (Sample* x : {&r->value, &r->baseline}) x->median /= 1e9, x->min /= 1e9, x->max /= 1e9;
  const double held_s = double(slab->Stats().blocks), held_f = double(fixed->Stats().blocks);
  Row rh{"mixed held" + tag, "blks", {held_s, held_s, held_s}, {held_f, held_f, held_f}, "fixed slots"};
  return {rp, rg, rh};
}

Row MatchRow(int trials) {
  auto cfg = ParseConfig(R"({"model": {"model_id": "bench", "num_layers": 4, "num_kv_heads": 4, "head_dim": 64,
                                       "block_tokens": 16},
                             "nodes": [{"id": "a", "memory": {"host": "64MiB"}}, {"id": "b", "memory": {"host": "64MiB"}},
                                       {"id": "c", "memory": {"host": "64MiB"}}, {"id": "d", "memory": {"host": "64MiB"}}]})")
                 .value();
  auto cluster = EmbeddedCluster::Start(cfg).value();
  Router& r = cluster->router();
  // 40 prompts of 64 blocks (1024 tokens), all resident (2560 of the 4096 slots of 64 KiB).
  std::vector<std::vector<TokenId>> prompts;
  std::vector<std::byte> blk(cfg.model.FullBlockBytes(), std::byte{3});
  absl::flat_hash_set<BlockKey> set;
  for (int p = 0; p < 40; ++p) {
    std::vector<TokenId> t(1024);
    std::iota(t.begin(), t.end(), p * 100000);
    std::vector<std::span<const std::byte>> spans(64, std::span<const std::byte>(blk));
    (void)r.Put(t, spans);
    for (const BlockKey& k : r.Keys(t)) set.insert(k);
    prompts.push_back(std::move(t));
  }
  const int calls = 2000;
  auto match = [&] {
    size_t blocks = 0;
    for (int i = 0; i < calls; ++i) blocks += r.MatchPrefix(prompts[i % prompts.size()]).value_or(0);
    if (blocks != size_t{calls} * 64) std::abort();  // every block must hit
    return double(blocks);
  };
  // Baseline: the same number of key lookups in one in-process hash set
  // (keys precomputed: the raw cost of an index probe).
  std::vector<std::vector<BlockKey>> keys;
  for (auto& p : prompts) keys.push_back(r.Keys(p));
  auto hashset = [&] {
    size_t found = 0, blocks = 0;
    for (int i = 0; i < calls; ++i) {
      for (const BlockKey& k : keys[i % keys.size()]) found += set.contains(k);
      blocks += keys[i % keys.size()].size();
    }
    if (found == 0) std::abort();
    return double(blocks);
  };
  auto [match_s, hashset_s] = MeasurePair(trials, match, hashset);
  Row row{"match_prefix (64-block prompts)", "Mblocks/s", match_s, hashset_s, "flat_hash_set lookup"};
  for (Sample* s : {&row.value, &row.baseline}) s->median /= 1e6, s->min /= 1e6, s->max /= 1e6;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, json = false, sweep = false, mixed_only = false;
  uint32_t classes = kDefaultSizeClasses;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--json") json = true;
    else if (a == "--sweep") sweep = true;
    else if (a == "--mixed-only") mixed_only = true;
    else if (a == "--classes" && i + 1 < argc) classes = static_cast<uint32_t>(std::stoul(argv[++i]));
    else {
      (a == "--help" || a == "-h" ? std::cout : std::cerr)
          << "usage: bench_store [--quick] [--json] [--classes N | --sweep] [--mixed-only]\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const int trials = quick ? 3 : 7;
  std::vector<Row> rows;
  if (!mixed_only) {
    for (size_t block : {64ull << 10, 256ull << 10, 1ull << 20, 2ull << 20}) {
      if (!json) std::fprintf(stderr, "bench_store: blocks of %s...\n", FormatSize(block).c_str());
      for (Row& r : StoreRows(block, trials, classes)) rows.push_back(r);
    }
    if (!json) std::fprintf(stderr, "bench_store: match_prefix...\n");
    rows.push_back(MatchRow(trials));
  }
  std::vector<uint32_t> sweep_classes = sweep ? std::vector<uint32_t>{2, 3, 4, 5, 6} : std::vector<uint32_t>{classes};
  for (uint32_t n : sweep_classes) {
    if (!json) std::fprintf(stderr, "bench_store: mixed sizes, %u classes...\n", n);
    for (Row& r : MixedRows(n, trials)) rows.push_back(r);
  }
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows)
      j.push_back({{"name", r.name}, {"unit", r.unit}, {"median", r.value.median}, {"min", r.value.min},
                   {"max", r.value.max}, {"baseline", r.baseline_name}, {"baseline_median", r.baseline.median},
                   {"ratio", r.value.median / r.baseline.median}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-34s %12s %12s   %-22s %8s\n", "benchmark (median of trials)", "kvmesh", "baseline", "baseline is", "ratio");
  for (const Row& r : rows)
    std::printf("%-34s %8.2f %-4s %8.2f %-4s %-22s %7.2fx\n", r.name.c_str(), r.value.median, r.unit.c_str(),
                r.baseline.median, r.unit.c_str(), r.baseline_name.c_str(), r.value.median / r.baseline.median);
  return 0;
}
