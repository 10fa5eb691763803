// Embedding the kvmesh router in an inference server (embedded cluster).
// Built by CI as build/bin/example_embed_router; docs/guide.md shows it.
#include <cstdio>
#include <string>
#include <vector>

#include "kvmesh/embedded.h"
#include "kvmesh/router.h"

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string a = argv[1];
    std::fprintf(a == "--help" || a == "-h" ? stdout : stderr,
                 "usage: example_embed_router\nStarts two shards in this process, stores a prompt's blocks through "
                 "the embedded router and reads them back.\n");
    return a == "--help" || a == "-h" ? 0 : 2;
  }
  // 1. A cluster config: here inline; usually kvmesh::LoadConfigFile("cluster.json").
  auto config = kvmesh::ParseConfig(R"({
    "model": {"model_id": "my-model", "num_layers": 2, "num_kv_heads": 2, "head_dim": 64,
              "dtype": "fp16", "block_tokens": 16},
    "nodes": [{"id": "gpu0", "memory": {"host": "16MiB"}},
              {"id": "gpu1", "memory": {"host": "16MiB"}}]
  })");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  // 2. Start the shards in this process and take the router.
  auto cluster = kvmesh::EmbeddedCluster::Start(*config, {.tenant_salt = "tenant-42"});
  if (!cluster.ok()) return 1;
  kvmesh::Router& router = (*cluster)->router();

  // 3. A request arrives: how much of its prompt is cached?
  std::vector<kvmesh::TokenId> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<kvmesh::TokenId>(1000 + i);
  size_t cached = router.MatchPrefix(prompt).value_or(0);  // 0 the first time

  // 4. Prefill computes KV for the missing full blocks and stores them.
  const size_t block_bytes = router.model().FullBlockBytes();  // [layer][k|v][head][token][dim]
  const size_t full = prompt.size() / router.block_tokens();    // 6 full blocks; 4 tokens left over
  std::vector<std::vector<std::byte>> kv(full - cached, std::vector<std::byte>(block_bytes, std::byte{1}));
  std::vector<std::span<const std::byte>> blocks(kv.begin(), kv.end());
  kvmesh::RequestOptions opts;
  opts.priority = 2;  // e.g. a system prompt: evicted after priority 0 and 1
  if (auto s = router.Put(prompt, blocks, opts, /*first_block=*/cached); !s.ok()) {
    std::fprintf(stderr, "put: %s\n", s.ToString().c_str());
    return 1;
  }

  // 5. The next request with the same prefix finds it and reads the KV back.
  size_t hit = router.MatchPrefix(prompt).value_or(0);
  auto keys = router.Keys(prompt);
  std::vector<std::byte> buf(block_bytes);
  std::vector<kvmesh::GetItem> items{{keys[0], buf}};
  (void)router.GetBatch(items);
  std::printf("cached before: %zu blocks, after put: %zu of %zu blocks, block 0 read: %s (%zu bytes)\n", cached, hit,
              full, items[0].status.ToString().c_str(), items[0].size);
  return hit == full && items[0].status.ok() ? 0 : 1;
}
