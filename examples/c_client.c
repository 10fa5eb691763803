/* examples/c_client.c — the kvmesh C ABI from plain C11.
 *
 *   build/examples/example_c_client 127.0.0.1:7070
 *
 * Connects to a running cluster's coordinator, stores the KV blocks of a
 * token sequence, finds them again with a prefix match, reads one back and
 * checks it byte-for-byte. Exit status 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmesh/kvmesh.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s COORDINATOR_HOST:PORT\n", argv[0]);
    return 2;
  }
  kvmesh_options o = kvmesh_default_options();
  o.coordinator = argv[1];
  o.tenant_salt = "c-example";
  kvmesh_client* c = NULL;
  if (kvmesh_connect(&o, &c) != KVMESH_OK) {
    fprintf(stderr, "connect: %s\n", kvmesh_last_error());
    return 1;
  }
  const uint32_t bt = kvmesh_block_tokens(c);
  const size_t bytes = kvmesh_block_bytes(c);
  enum { kBlocks = 4 };
  int32_t* tokens = malloc(sizeof(int32_t) * bt * kBlocks);
  for (uint32_t i = 0; i < bt * kBlocks; ++i) tokens[i] = (int32_t)(1000 + i);
  unsigned char* blocks[kBlocks];
  const void* ptrs[kBlocks];
  size_t sizes[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    blocks[b] = malloc(bytes);
    for (size_t i = 0; i < bytes; ++i) blocks[b][i] = (unsigned char)(i * 31 + b * 7);
    ptrs[b] = blocks[b];
    sizes[b] = bytes;
  }
  int rc = 1;
  size_t matched = 0, got = 0;
  unsigned char* back = malloc(bytes);
  if (kvmesh_put_blocks(c, tokens, (size_t)bt * kBlocks, 0, ptrs, sizes, kBlocks) != KVMESH_OK) {
    fprintf(stderr, "put: %s\n", kvmesh_last_error());
  } else if (kvmesh_match_prefix(c, tokens, (size_t)bt * kBlocks, &matched) != KVMESH_OK) {
    fprintf(stderr, "match: %s\n", kvmesh_last_error());
  } else if (kvmesh_get_block(c, tokens, (size_t)bt * kBlocks, 2, back, bytes, &got) != KVMESH_OK) {
    fprintf(stderr, "get: %s\n", kvmesh_last_error());
  } else if (matched != kBlocks || got != bytes || memcmp(back, blocks[2], bytes) != 0) {
    fprintf(stderr, "mismatch: matched %zu of %d, got %zu bytes\n", matched, kBlocks, got);
  } else {
    printf("{\"event\":\"c_client_ok\",\"epoch\":%llu,\"matched\":%zu,\"block_bytes\":%zu}\n",
           (unsigned long long)kvmesh_epoch(c), matched, bytes);
    rc = 0;
  }
  free(back);
  for (int b = 0; b < kBlocks; ++b) free(blocks[b]);
  free(tokens);
  kvmesh_close(c);
  return rc;
}
