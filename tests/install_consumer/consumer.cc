// Put and get through NetworkClient, built against an installed kvmesh.
// Usage: consumer COORDINATOR_HOST:PORT
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "kvmesh/build_config.h"
#include "kvmesh/network.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer COORDINATOR_HOST:PORT\n");
    return 2;
  }
  kvmesh::NetworkClientOptions o;
  o.coordinator = argv[1];
  o.client_id = "install-consumer";
  o.timeout_ms = 5000;
  auto client = kvmesh::NetworkClient::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  kvmesh::Router& r = (*client)->router();
  const uint32_t bt = r.block_tokens();
  const size_t block_bytes = r.model().FullBlockBytes();

  // A prompt of 4 full blocks; each block's bytes are a pattern of its index.
  std::vector<kvmesh::TokenId> prompt(4 * bt);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<kvmesh::TokenId>(1000 + i);
  std::vector<std::vector<std::byte>> data(4, std::vector<std::byte>(block_bytes));
  std::vector<std::span<const std::byte>> blocks;
  for (size_t b = 0; b < data.size(); ++b) {
    for (size_t i = 0; i < block_bytes; ++i) data[b][i] = static_cast<std::byte>((i * 7 + b * 31) & 0xff);
    blocks.emplace_back(data[b]);
  }
  if (kvmesh::Status s = r.Put(prompt, blocks); !s.ok()) {
    std::fprintf(stderr, "put: %s\n", s.ToString().c_str());
    return 1;
  }
  auto cached = r.MatchPrefix(prompt);
  if (!cached.ok() || *cached != 4) {
    std::fprintf(stderr, "match_prefix: expected 4 blocks, got %s\n",
                 cached.ok() ? std::to_string(*cached).c_str() : cached.status().ToString().c_str());
    return 1;
  }
  std::vector<kvmesh::BlockKey> keys = r.Keys(prompt);
  std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(block_bytes));
  std::vector<kvmesh::GetItem> items;
  for (size_t b = 0; b < keys.size(); ++b) items.push_back({keys[b], out[b]});
  if (kvmesh::Status s = r.GetBatch(items); !s.ok()) {
    std::fprintf(stderr, "get: %s\n", s.ToString().c_str());
    return 1;
  }
  for (size_t b = 0; b < items.size(); ++b) {
    if (!items[b].status.ok() || items[b].size != block_bytes || std::memcmp(out[b].data(), data[b].data(), block_bytes)) {
      std::fprintf(stderr, "block %zu: %s, %zu bytes, %s\n", b, items[b].status.ToString().c_str(), items[b].size,
                   items[b].status.ok() ? "bytes differ" : "miss");
      return 1;
    }
  }
  std::printf("install consumer (kvmesh %s): put 4 blocks of %zu bytes, match_prefix 4, read back equal\n",
              KVMESH_VERSION, block_bytes);
  return 0;
}
