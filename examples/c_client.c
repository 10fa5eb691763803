/* examples/c_client.c — the kvmesh C ABI from plain C11.
 *
 *   build/examples/example_c_client 127.0.0.1:7070
 *
 * Connects to a running cluster's coordinator, stores the KV blocks of a
 * token sequence, finds them again with a prefix match, reads one back and
 * checks it byte-for-byte. Then a live sequence: create, append K/V token
 * by token's worth, info, read back byte-for-byte, fork, truncate, a second
 * client's create reusing the sealed prefix, a too-small read buffer, and
 * release. Then world-model frame streams, untagged and with context tags.
 * Exit status 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmesh/kvmesh.h"

#define CHECK_OK(call)                                                  \
  if ((call) != KVMESH_OK) {                                            \
    fprintf(stderr, "%s: %s\n", #call, kvmesh_last_error());            \
    break;                                                              \
  }
#define EXPECT(cond)                                                    \
  if (!(cond)) {                                                        \
    fprintf(stderr, "sequence check failed: %s\n", #cond);              \
    break;                                                              \
  }

/* The live-sequence calls; returns the prefix tokens the second client
 * attached (> 0), or 0 on failure. */
static uint32_t sequences(kvmesh_client* c, const char* coordinator) {
  const uint32_t bt = kvmesh_block_tokens(c);
  const size_t n = (size_t)bt * 2 + 5; /* two full blocks and five tokens */
  int32_t* toks = malloc(sizeof(int32_t) * n);
  int32_t* back_toks = malloc(sizeof(int32_t) * n);
  for (size_t i = 0; i < n; ++i) toks[i] = (int32_t)(7000 + 3 * i);
  kvmesh_seq *s = NULL, *f = NULL, *s2 = NULL;
  kvmesh_client* c2 = NULL;
  unsigned char *k = NULL, *v = NULL, *kb = NULL, *vb = NULL;
  uint32_t reused = 0;
  do {
    CHECK_OK(kvmesh_seq_create(c, toks, n, NULL, &s));
    EXPECT(kvmesh_seq_prefix_tokens(s) == 0);
    const size_t bytes = kvmesh_seq_kv_bytes(c, s, n);
    EXPECT(bytes > 0 && bytes % n == 0);
    k = malloc(bytes), v = malloc(bytes), kb = malloc(bytes), vb = malloc(bytes);
    for (size_t i = 0; i < bytes; ++i) k[i] = (unsigned char)(i * 13 + 1), v[i] = (unsigned char)(i * 29 + 5);
    uint32_t first = 99;
    CHECK_OK(kvmesh_seq_append(c, s, toks, n, k, v, bytes, &first));
    EXPECT(first == 0);
    kvmesh_seq_state info;
    CHECK_OK(kvmesh_seq_info(c, s, &info, back_toks, n));
    EXPECT(info.length == n && info.sealed_blocks == 2 && memcmp(back_toks, toks, sizeof(int32_t) * n) == 0);
    size_t got = 0;
    CHECK_OK(kvmesh_seq_read(c, s, 0, (uint32_t)n, kb, vb, bytes, &got));
    EXPECT(got == bytes && memcmp(kb, k, bytes) == 0 && memcmp(vb, v, bytes) == 0);
    /* Too small a buffer: refused with the size needed, nothing read. */
    got = 0;
    EXPECT(kvmesh_seq_read(c, s, 0, (uint32_t)n, kb, vb, bytes - 1, &got) == KVMESH_RESOURCE_EXHAUSTED);
    EXPECT(got == bytes);
    CHECK_OK(kvmesh_seq_fork(c, s, &f));
    CHECK_OK(kvmesh_seq_truncate(c, s, 5));
    CHECK_OK(kvmesh_seq_info(c, s, &info, NULL, 0));
    EXPECT(info.length == n - 5);
    CHECK_OK(kvmesh_seq_info(c, f, &info, NULL, 0));
    EXPECT(info.length == n);
    memset(kb, 0, bytes);
    CHECK_OK(kvmesh_seq_read(c, f, 0, (uint32_t)n, kb, vb, bytes, &got));
    EXPECT(memcmp(kb, k, bytes) == 0 && memcmp(vb, v, bytes) == 0);
    /* A second client with the same prompt: the two sealed blocks come attached. */
    kvmesh_options o = kvmesh_default_options();
    o.coordinator = coordinator;
    o.tenant_salt = "c-example";
    CHECK_OK(kvmesh_connect(&o, &c2));
    CHECK_OK(kvmesh_seq_create(c2, toks, n, NULL, &s2));
    EXPECT(kvmesh_seq_prefix_tokens(s2) == 2 * bt);
    CHECK_OK(kvmesh_seq_release(c2, s2));
    CHECK_OK(kvmesh_seq_release(c, f));
    CHECK_OK(kvmesh_seq_release(c, s));
    EXPECT(kvmesh_seq_info(c, s, &info, NULL, 0) == KVMESH_NOT_FOUND);
    reused = kvmesh_seq_prefix_tokens(s2);
  } while (0);
  kvmesh_seq_free(s);
  kvmesh_seq_free(f);
  kvmesh_seq_free(s2);
  kvmesh_close(c2);
  free(k), free(v), free(kb), free(vb);
  free(toks), free(back_toks);
  return reused;
}

/* The frame streams below: 16x16 frames of four 8x8 patches. */
enum { kFrameSide = 16, kFramePatches = 4 };

static kvmesh_frame_options frame_options(uint64_t stream_id) {
  kvmesh_frame_options fo = kvmesh_frame_default_options();
  fo.stream_id = stream_id;
  fo.width = fo.height = kFrameSide;
  fo.patch = 8;
  return fo;
}

/* World-model frames (kvmesh_frame_*): a 16x16 frame of four 8x8 patches,
 * computed once, then the same frame again reuses all four blocks, read back
 * by reference. Returns the patches the second frame reused (0 on error). */
static uint32_t frames(kvmesh_client* c, size_t bytes) {
  enum { kW = kFrameSide, kPatches = kFramePatches };
  uint8_t px[kW * kW];
  for (int i = 0; i < kW * kW; ++i) px[i] = (uint8_t)((i * 37) % 200 + 20);
  unsigned char* blocks[kPatches];
  unsigned char* back[kPatches];
  for (int p = 0; p < kPatches; ++p) {
    blocks[p] = malloc(bytes);
    back[p] = malloc(bytes);
    memset(blocks[p], 0x40 + p, bytes);
  }
  const kvmesh_frame_options fo = frame_options(77);
  kvmesh_frame_stream* s = NULL;
  kvmesh_patch_match m[kPatches];
  kvmesh_key hist[4];
  size_t n_hist = 0;
  uint32_t reused = 0, counted = 0;
  do {
    CHECK_OK(kvmesh_frame_open(c, &fo, &s));
    EXPECT(kvmesh_frame_patches(s) == kPatches);
    CHECK_OK(kvmesh_frame_match(s, px, sizeof(px), m, kPatches));
    EXPECT(!m[0].reused && !m[3].reused);
    CHECK_OK(kvmesh_frame_commit(s, px, sizeof(px), (const void* const*)blocks, bytes));
    CHECK_OK(kvmesh_frame_match(s, px, sizeof(px), m, kPatches));
    CHECK_OK(kvmesh_frame_get_reused(s, (void* const*)back, bytes, m, kPatches));
    for (int p = 0; p < kPatches; ++p)
      counted += m[p].reused && m[p].source_frame == 0 && memcmp(back[p], blocks[p], bytes) == 0;
    CHECK_OK(kvmesh_frame_commit(s, px, sizeof(px), NULL, bytes));
    CHECK_OK(kvmesh_frame_history(s, 2, hist, 4, &n_hist));
    EXPECT(n_hist == 2 && hist[0].hi == hist[1].hi && hist[0].lo == hist[1].lo);
    kvmesh_frame_stats st;
    CHECK_OK(kvmesh_frame_stats_get(s, &st));
    EXPECT(st.blocks_put == kPatches && st.reused == kPatches);
    CHECK_OK(kvmesh_frame_end(s));
    reused = counted; /* every check passed */
  } while (0);
  kvmesh_frame_free(s);
  for (int p = 0; p < kPatches; ++p) free(blocks[p]), free(back[p]);
  return reused;
}

/* Context tags (kvmesh_frame_match_tagged, _commit_tagged): the same frame
 * committed with tag A on every patch, then matched with tag B on patches 0
 * and 1 (A on 2 and 3) reuses only patches 2 and 3; matched without tags it
 * reuses all four (the pixel gate alone); tags that are neither none nor one
 * per patch are refused by match and by commit. Returns the patches the
 * B/A-tagged frame reused (2 when every check passed, else 0). */
static uint32_t tagged_frames(kvmesh_client* c, size_t bytes) {
  enum { kW = kFrameSide, kPatches = kFramePatches };
  uint8_t px[kW * kW];
  for (int i = 0; i < kW * kW; ++i) px[i] = (uint8_t)((i * 53) % 190 + 30);
  unsigned char* blocks[kPatches];
  for (int p = 0; p < kPatches; ++p) {
    blocks[p] = malloc(bytes);
    memset(blocks[p], 0x60 + p, bytes);
  }
  const uint64_t tag_a[kPatches] = {0xA0, 0xA1, 0xA2, 0xA3};
  const uint64_t tag_ba[kPatches] = {0xB0, 0xB1, 0xA2, 0xA3};
  const kvmesh_frame_options fo = frame_options(78);
  kvmesh_frame_stream* s = NULL;
  kvmesh_patch_match m[kPatches];
  uint32_t result = 0;
  do {
    CHECK_OK(kvmesh_frame_open(c, &fo, &s));
    EXPECT(kvmesh_frame_match_tagged(s, px, sizeof(px), tag_a, kPatches - 1, m, kPatches) ==
           KVMESH_INVALID_ARGUMENT);
    CHECK_OK(kvmesh_frame_match_tagged(s, px, sizeof(px), tag_a, kPatches, m, kPatches));
    EXPECT(!m[0].reused && !m[1].reused && !m[2].reused && !m[3].reused);
    EXPECT(kvmesh_frame_commit_tagged(s, px, sizeof(px), (const void* const*)blocks, bytes, tag_a, 1) ==
           KVMESH_INVALID_ARGUMENT);
    CHECK_OK(kvmesh_frame_commit_tagged(s, px, sizeof(px), (const void* const*)blocks, bytes, tag_a, kPatches));
    /* Same pixels, other inputs for patches 0 and 1: only 2 and 3 reuse. */
    CHECK_OK(kvmesh_frame_match_tagged(s, px, sizeof(px), tag_ba, kPatches, m, kPatches));
    const uint32_t mixed = (uint32_t)(m[0].reused + m[1].reused + m[2].reused + m[3].reused);
    EXPECT(!m[0].reused && !m[1].reused && m[2].reused && m[3].reused);
    CHECK_OK(kvmesh_frame_commit_tagged(s, px, sizeof(px), (const void* const*)blocks, bytes, tag_ba, kPatches));
    /* No tags: the pixel gate alone reuses every patch. */
    CHECK_OK(kvmesh_frame_match(s, px, sizeof(px), m, kPatches));
    EXPECT(m[0].reused && m[1].reused && m[2].reused && m[3].reused);
    CHECK_OK(kvmesh_frame_commit(s, px, sizeof(px), NULL, bytes));
    CHECK_OK(kvmesh_frame_end(s));
    result = mixed; /* every check passed */
  } while (0);
  kvmesh_frame_free(s);
  for (int p = 0; p < kPatches; ++p) free(blocks[p]);
  return result;
}

int main(int argc, char** argv) {
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("usage: %s COORDINATOR_HOST:PORT\nStores and reads back a prefix of blocks through the C ABI (kvmesh.h).\n",
           argv[0]);
    return 0;
  }
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
    const uint32_t reused = sequences(c, argv[1]);
    const uint32_t frames_reused = frames(c, bytes);
    const uint32_t tagged_reused = tagged_frames(c, bytes);
    if (reused > 0 && frames_reused > 0 && tagged_reused > 0) {
      printf("{\"event\":\"c_client_ok\",\"epoch\":%llu,\"matched\":%zu,\"block_bytes\":%zu,"
             "\"seq_prefix_tokens\":%u,\"frames_reused\":%u,\"frames_tagged_reused\":%u}\n",
             (unsigned long long)kvmesh_epoch(c), matched, bytes, reused, frames_reused, tagged_reused);
      rc = 0;
    }
  }
  free(back);
  for (int b = 0; b < kBlocks; ++b) free(blocks[b]);
  free(tokens);
  kvmesh_close(c);
  return rc;
}
