/* kvmesh/kvmesh.h — the C ABI of the kvmesh router, so inference servers in
 * any language (C, Rust, Go, Python via ctypes/cffi) can use a kvmesh cluster.
 *
 * A client connects to a cluster's coordinator, fetches the shard map and talks
 * to the shard nodes directly over TCP (pooled, pipelined connections; map
 * refresh on stale epochs). It is the C face of kvmesh::NetworkClient.
 *
 *   kvmesh_options o = kvmesh_default_options();
 *   o.coordinator = "127.0.0.1:7070";
 *   kvmesh_client* c = NULL;
 *   if (kvmesh_connect(&o, &c) != KVMESH_OK) { fprintf(stderr, "%s\n", kvmesh_last_error()); ... }
 *   size_t cached = 0;
 *   kvmesh_match_prefix(c, tokens, n_tokens, &cached);   // leading cached blocks
 *   kvmesh_put_blocks(c, tokens, n_tokens, cached, blocks, sizes, n_new);
 *   kvmesh_close(c);
 *
 * Conventions: every function returns a kvmesh_status (0 = OK); on error
 * kvmesh_last_error() gives a message valid until the calling thread's next
 * kvmesh call. Output parameters are written only on success. Buffers are
 * owned by the caller; kvmesh never keeps a pointer after a call returns.
 * No C++ exception ever crosses this boundary.
 *
 * Thread-safety: a kvmesh_client may be used from many threads at once.
 */
#ifndef KVMESH_KVMESH_H_
#define KVMESH_KVMESH_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The same codes as kvmesh::StatusCode (kvmesh/status.h). */
typedef enum kvmesh_status {
  KVMESH_OK = 0,
  KVMESH_INVALID_ARGUMENT = 1,
  KVMESH_NOT_FOUND = 2, /* a miss */
  KVMESH_ALREADY_EXISTS = 3,
  KVMESH_RESOURCE_EXHAUSTED = 4, /* e.g. dst too small: *size tells the size needed */
  KVMESH_BUSY = 5,
  KVMESH_DATA_LOSS = 6,    /* corrupt block: treat as a miss */
  KVMESH_UNAVAILABLE = 7,  /* node or cluster unreachable: treat as a miss */
  KVMESH_DEADLINE_EXCEEDED = 8,
  KVMESH_STALE_EPOCH = 9,
  KVMESH_FAILED_PRECONDITION = 10,
  KVMESH_UNIMPLEMENTED = 11,
  KVMESH_IO_ERROR = 12,
  KVMESH_INTERNAL = 13,
  KVMESH_PERMISSION_DENIED = 14
} kvmesh_status;

typedef struct kvmesh_client kvmesh_client;

/* A 128-bit block key (kvmesh/block_key.h). */
typedef struct kvmesh_key {
  uint64_t hi;
  uint64_t lo;
} kvmesh_key;

typedef struct kvmesh_options {
  const char* coordinator; /* "host:port" of the coordinator's HTTP API (required) */
  const char* client_id;   /* NULL: "kvmesh-c" */
  const char* tenant_salt; /* NULL: "" — keys of different salts never meet */
  const char* token;       /* NULL: none — the cluster secret, or with `tenant` that tenant's token */
  int64_t timeout_ms;      /* per call; <= 0: 2000 */
  /* NULL: none — a tenant of the cluster's $.auth.tenants: the nodes keep the
   * client's blocks in that tenant's namespace (kvmesh/network.h). Added last:
   * start from kvmesh_default_options() so every field is set. */
  const char* tenant;
  /* NULL: plain TCP — TLS to a cluster with $.tls: the CA file the servers'
   * certificates chain to, and (client_auth "all") this client's certificate
   * and key files. Added last, like tenant. */
  const char* tls_ca;
  const char* tls_cert;
  const char* tls_key;
} kvmesh_options;

kvmesh_options kvmesh_default_options(void);

int kvmesh_connect(const kvmesh_options* options, kvmesh_client** out);
void kvmesh_close(kvmesh_client* client); /* NULL is fine */

/* Message of the calling thread's last error ("" after success). */
const char* kvmesh_last_error(void);

uint32_t kvmesh_block_tokens(const kvmesh_client* client);
size_t kvmesh_block_bytes(const kvmesh_client* client); /* full block, uncompressed */
uint64_t kvmesh_epoch(const kvmesh_client* client);

/* Keys of the full blocks of tokens[0..n): writes min(cap, blocks) keys, *count = blocks. */
int kvmesh_block_keys(kvmesh_client* client, const int32_t* tokens, size_t n, kvmesh_key* keys, size_t cap,
                      size_t* count);

/* Number of leading full blocks of tokens[0..n) that are cached. */
int kvmesh_match_prefix(kvmesh_client* client, const int32_t* tokens, size_t n, size_t* matched);

/* Stores blocks[i] (sizes[i] bytes) as full block first_block + i of tokens. */
int kvmesh_put_blocks(kvmesh_client* client, const int32_t* tokens, size_t n, size_t first_block,
                      const void* const* blocks, const size_t* sizes, size_t count);

/* Reads full block `index` of tokens into dst[0..cap); *size = its size. */
int kvmesh_get_block(kvmesh_client* client, const int32_t* tokens, size_t n, size_t index, void* dst, size_t cap,
                     size_t* size);

/* By explicit keys. */
int kvmesh_put(kvmesh_client* client, const kvmesh_key* keys, const void* const* data, const size_t* sizes,
               size_t count);
int kvmesh_get(kvmesh_client* client, kvmesh_key key, void* dst, size_t cap, size_t* size);
int kvmesh_erase(kvmesh_client* client, const kvmesh_key* keys, size_t count);
/* Eviction hint: the caller is done with these blocks (a closed session's
 * private blocks); each stored one becomes the next to leave its node's cache
 * until it is read again. Nothing is erased; absent keys are fine. */
int kvmesh_release(kvmesh_client* client, const kvmesh_key* keys, size_t count);

/* ---- registered memory: zero-copy transfers (kvmesh/router.h RegisterMemory) --
 * Register the memory an engine keeps its KV blocks in once; kvmesh_get_into
 * and kvmesh_put_from then move blocks between it and the nodes' pools with no
 * intermediate copy where the transport allows (UCX one-sided puts and gets,
 * TCP straight from/into it). Unregistered memory works too (a bounce buffer).
 *
 *   uint64_t region;
 *   kvmesh_register_memory(c, pool, pool_bytes, KVMESH_MEMORY_HOST, &region);
 *   kvmesh_put_from(c, keys, srcs, sizes, n, statuses);       srcs[i] inside pool
 *   kvmesh_get_into(c, keys, dsts, caps, n, sizes, statuses); dsts[i] inside pool
 *   kvmesh_unregister_memory(c, region);                      no call in flight
 *
 * Batch calls return KVMESH_OK when the batch ran; each item's own result is
 * statuses[i] (a kvmesh_status: KVMESH_NOT_FOUND, KVMESH_DATA_LOSS and
 * KVMESH_UNAVAILABLE are misses). */
typedef enum kvmesh_memory_kind {
  KVMESH_MEMORY_HOST = 0,
  KVMESH_MEMORY_DEVICE = 1 /* CUDA device memory: builds with CUDA only (host bounce) */
} kvmesh_memory_kind;

int kvmesh_register_memory(kvmesh_client* client, void* base, size_t bytes, kvmesh_memory_kind kind,
                           uint64_t* region_id);
/* Allocates bytes of host memory the transport reaches best (over UCX: a
 * shared-memory segment this host's nodes write and read directly) and
 * registers it: *base is the memory, *region_id its region. Freed by
 * kvmesh_unregister_memory or kvmesh_close. Prefer it for an engine's host KV
 * pool: a GetInto into it is one one-sided write by the node. */
int kvmesh_allocate_memory(kvmesh_client* client, size_t bytes, void** base, uint64_t* region_id);
int kvmesh_unregister_memory(kvmesh_client* client, uint64_t region_id);
/* Reads keys[i] into dsts[i][0..caps[i]); sizes[i] = the block's size (for
 * KVMESH_RESOURCE_EXHAUSTED: the size needed). */
int kvmesh_get_into(kvmesh_client* client, const kvmesh_key* keys, void* const* dsts, const size_t* caps,
                    size_t count, size_t* sizes, int* statuses);
/* Stores srcs[i][0..sizes[i]) under keys[i]. */
int kvmesh_put_from(kvmesh_client* client, const kvmesh_key* keys, const void* const* srcs, const size_t* sizes,
                    size_t count, int* statuses);

/* ---- live sequences (kvmesh/router.h: CreateSequence and the rest) ----------
 * A sequence lives on one shard node and holds K and V token by token during
 * decode; full blocks are sealed into that node's store, so a later request
 * with the same prompt (any client) attaches them as its prefix.
 * K and V are each [layer][n][heads][head_dim] over the sequence's slice in
 * the model dtype: kvmesh_seq_kv_bytes(c, s, n) bytes each for n tokens.
 *
 *   kvmesh_seq* s = NULL;
 *   kvmesh_seq_create(c, prompt, n_prompt, NULL, &s);        attaches the cached prefix
 *   uint32_t p = kvmesh_seq_prefix_tokens(s);                 tokens already held
 *   kvmesh_seq_append(c, s, prompt + p, n_prompt - p, k, v, bytes, NULL);
 *   kvmesh_seq_read(c, s, 0, n, k_out, v_out, cap, &size);
 *   kvmesh_seq_release(c, s);                                 the node forgets it
 *   kvmesh_seq_free(s);                                       the handle's memory
 *
 * A kvmesh_seq is an immutable handle owned by the caller (create and fork
 * allocate it; free it with kvmesh_seq_free, released or not); it may be
 * used from many threads. Calls on a sequence whose node died answer
 * KVMESH_UNAVAILABLE (or KVMESH_DEADLINE_EXCEEDED); a node releases sequences
 * left idle past its $.sequences.idle_timeout_ms. */
typedef struct kvmesh_seq kvmesh_seq;

typedef struct kvmesh_seq_options {
  uint32_t layers_begin, layers_end; /* the slice's layers; begin == end: all layers */
  uint32_t heads_begin, heads_end;   /* its KV heads; begin == end: all heads */
  uint8_t priority;                  /* eviction class of the blocks it seals */
  size_t max_blocks;                 /* attach at most this many prefix blocks (SIZE_MAX: no limit) */
} kvmesh_seq_options;

kvmesh_seq_options kvmesh_seq_default_options(void);

typedef struct kvmesh_seq_state {
  uint32_t length;        /* tokens */
  uint32_t sealed_blocks; /* leading full blocks sealed into the node's store */
} kvmesh_seq_state;

/* A new sequence placed by prefix affinity, holding the leading full blocks
 * of prefix[0..n) its node has cached. options NULL: defaults. */
int kvmesh_seq_create(kvmesh_client* client, const int32_t* prefix, size_t n, const kvmesh_seq_options* options,
                      kvmesh_seq** out);
/* Appends tokens[0..n) with K and V (kv_bytes each, = kvmesh_seq_kv_bytes(n));
 * *first_position (may be NULL) = the position of tokens[0]. */
int kvmesh_seq_append(kvmesh_client* client, const kvmesh_seq* seq, const int32_t* tokens, size_t n, const void* k,
                      const void* v, size_t kv_bytes, uint32_t* first_position);
/* Drops the last n tokens. */
int kvmesh_seq_truncate(kvmesh_client* client, const kvmesh_seq* seq, uint32_t n);
/* A new sequence on the same node with the same tokens (sealed blocks shared). */
int kvmesh_seq_fork(kvmesh_client* client, const kvmesh_seq* seq, kvmesh_seq** out);
/* The node unpins and forgets the sequence (its sealed blocks stay cached).
 * The handle stays allocated: kvmesh_seq_free it. */
int kvmesh_seq_release(kvmesh_client* client, const kvmesh_seq* seq);
void kvmesh_seq_free(kvmesh_seq* seq); /* NULL is fine; no call to the node */
/* Length and sealed blocks; writes min(cap, length) tokens to tokens (may be NULL when cap is 0). */
int kvmesh_seq_info(kvmesh_client* client, const kvmesh_seq* seq, kvmesh_seq_state* info, int32_t* tokens,
                    size_t cap);
/* K and V of positions [from, from + n) into k[0..cap) and v[0..cap); *size =
 * bytes of each. KVMESH_RESOURCE_EXHAUSTED when cap is smaller (*size then
 * tells the size needed, nothing is read). */
int kvmesh_seq_read(kvmesh_client* client, const kvmesh_seq* seq, uint32_t from, uint32_t n, void* k, void* v,
                    size_t cap, size_t* size);
/* Tokens attached from the prefix at creation (0 for a fork). */
uint32_t kvmesh_seq_prefix_tokens(const kvmesh_seq* seq);
/* Bytes of K (and of V) for n tokens of the sequence's slice. */
size_t kvmesh_seq_kv_bytes(const kvmesh_client* client, const kvmesh_seq* seq, size_t n);

/* KV-aware routing (kvmesh/kv_route.h, docs/kv-events.md "Routing"): a prefix
 * index fed with KV event payloads (vLLM's EventBatch, msgpack: the third
 * frame of a kvmesh node's or an engine's PUB message) and the routing query.
 * Thread-safe; independent of any client. */
typedef struct kvmesh_kv_index kvmesh_kv_index;

/* One candidate's answer. */
typedef struct kvmesh_prefix_match {
  size_t candidate;    /* index into the candidates passed */
  uint32_t blocks;     /* longest run of leading blocks cached in any tier */
  uint32_t gpu_blocks; /* ... all in GPU */
  uint32_t cpu_blocks; /* ... all in GPU or CPU */
  double load;
  double score;
} kvmesh_prefix_match;

int kvmesh_kv_index_create(kvmesh_kv_index** out);
/* Approximate mode (no engine events): blocks routed to an instance count as
 * on its device for ttl_s seconds after their last kvmesh_kv_index_routed. */
int kvmesh_kv_index_create_approximate(kvmesh_kv_index** out, double ttl_s);
void kvmesh_kv_index_free(kvmesh_kv_index* index);
/* Applies one EventBatch payload that `instance` published. */
int kvmesh_kv_index_apply_batch(kvmesh_kv_index* index, const char* instance, const void* payload, size_t size);
/* The instance's load, 0 (idle) to 1 (saturated). */
int kvmesh_kv_index_set_load(kvmesh_kv_index* index, const char* instance, double load);
/* Fills out[0..n_candidates) best first for the request's chained keys. */
int kvmesh_kv_index_route(kvmesh_kv_index* index, const kvmesh_key* keys, size_t n_keys,
                          const char* const* candidates, size_t n_candidates, kvmesh_prefix_match* out);
/* Approximate mode: the request with these chained keys went to `instance`. */
int kvmesh_kv_index_routed(kvmesh_kv_index* index, const char* instance, const kvmesh_key* keys, size_t n_keys);

/* ---- world-model frames (kvmesh/frame_stream.h, docs/worldmodel.md) --------
 * A frame stream is one session of gray 8-bit frames (width x height, cut
 * into patch x patch patches, one KV block per patch) whose patches reuse
 * the blocks of earlier frames when they look the same (SSIM and change-rate
 * gate), by reference, not by copy.
 *
 *   kvmesh_frame_stream* s = NULL;
 *   kvmesh_frame_options fo = kvmesh_frame_default_options();   stream_id, size, gate
 *   kvmesh_frame_open(c, &fo, &s);
 *   kvmesh_frame_match(s, pixels, n_pixels, matches, n_patches);  matches[i].reused: 1 or 0
 *   kvmesh_frame_get_reused(s, dsts, block_bytes, matches, n_patches);  a miss turns reused to 0
 *   kvmesh_frame_history(s, p, keys, cap, &n);                    temporal context of patch p
 *   kvmesh_frame_commit(s, pixels, n_pixels, srcs, block_bytes);  puts the computed patches
 *   (_match_tagged and _commit_tagged: the same with one context tag per patch)
 *   kvmesh_frame_end(s); kvmesh_frame_free(s);
 *
 * The stream keeps the pending match of the frame between kvmesh_frame_match
 * and kvmesh_frame_commit. End and free every stream before kvmesh_close of
 * its client. One thread at a time per stream. */
typedef struct kvmesh_frame_stream kvmesh_frame_stream;

typedef struct kvmesh_frame_options {
  uint64_t stream_id;
  uint32_t width, height, patch; /* pixels; width and height multiples of patch */
  uint32_t mode;                 /* 0: off, 1: exact, 2: similar (SSIM gate) */
  uint32_t window;               /* frames a patch is matched against */
  float ssim_threshold;          /* tau */
  float change_threshold;        /* rho */
  uint32_t pixel_delta;
  uint32_t recompute_radius;
  float refresh_deviation;
  uint32_t max_age;
  uint32_t motion_radius;
  uint8_t priority; /* eviction class of the stream's blocks */
} kvmesh_frame_options;

/* The defaults of FrameMatchOptions (tau 0.92, rho 0.05, window 16, ...). */
kvmesh_frame_options kvmesh_frame_default_options(void);

typedef struct kvmesh_patch_match {
  uint8_t reused;        /* 1: the block `key` of an earlier frame is reused */
  uint8_t blended;       /* passed the gate but computed (recompute_radius, refresh) */
  kvmesh_key key;        /* reused: the earlier block; computed: the key commit puts */
  uint32_t source_frame; /* the frame that computed the block */
  uint32_t source_patch; /* the patch position it was computed at */
  float ssim, change;    /* against the chosen (or best) candidate */
} kvmesh_patch_match;

typedef struct kvmesh_frame_stats {
  uint64_t frames, patches, reused, blocks_put, bytes_put, put_failures, reuse_misses, released;
} kvmesh_frame_stats;

int kvmesh_frame_open(kvmesh_client* client, const kvmesh_frame_options* options, kvmesh_frame_stream** out);
/* Patches of a frame (grid_w * grid_h). */
uint32_t kvmesh_frame_patches(const kvmesh_frame_stream* stream);
/* Matches the next frame (n = width * height pixels); out[0..patches). */
int kvmesh_frame_match(kvmesh_frame_stream* stream, const uint8_t* pixels, size_t n, kvmesh_patch_match* out,
                       size_t cap);
/* kvmesh_frame_match with context tags (FrameStream::Match's tags): tags
 * NULL and n_tags 0 for none (the pixel gate alone), else one per patch: a
 * fingerprint of what the caller's model would compute patch p's block from;
 * a candidate also needs the tag it was committed with to equal tags[p].
 * Any other n_tags is refused (KVMESH_INVALID_ARGUMENT). */
int kvmesh_frame_match_tagged(kvmesh_frame_stream* stream, const uint8_t* pixels, size_t n,
                              const uint64_t* tags, size_t n_tags, kvmesh_patch_match* out, size_t cap);
/* Reads the block of every reused patch i into dsts[i][0..cap) (dsts of
 * computed patches are ignored; may be NULL). A miss makes the patch
 * computed; out[0..patches) (may be NULL) receives the rewritten match. */
int kvmesh_frame_get_reused(kvmesh_frame_stream* stream, void* const* dsts, size_t cap, kvmesh_patch_match* out,
                            size_t n_out);
/* Marks reused patch p computed after all (the caller recomputed it). */
int kvmesh_frame_refresh(kvmesh_frame_stream* stream, uint32_t patch);
/* Keys of patch p in the window, oldest first: *n of them, min(cap, *n) written. */
int kvmesh_frame_history(kvmesh_frame_stream* stream, uint32_t patch, kvmesh_key* keys, size_t cap, size_t* n);
/* Puts srcs[i][0..block_bytes) for every computed patch i of the pending
 * match (srcs of reused patches are ignored; may be NULL) and appends the frame. */
int kvmesh_frame_commit(kvmesh_frame_stream* stream, const uint8_t* pixels, size_t n, const void* const* srcs,
                        size_t block_bytes);
/* kvmesh_frame_commit storing tags[i] with every computed patch i for later
 * kvmesh_frame_match_tagged calls: NULL and 0 for none, else one per patch. */
int kvmesh_frame_commit_tagged(kvmesh_frame_stream* stream, const uint8_t* pixels, size_t n, const void* const* srcs,
                               size_t block_bytes, const uint64_t* tags, size_t n_tags);
int kvmesh_frame_stats_get(const kvmesh_frame_stream* stream, kvmesh_frame_stats* out);
/* Releases the stream's blocks (the stream stays allocated). */
int kvmesh_frame_end(kvmesh_frame_stream* stream);
void kvmesh_frame_free(kvmesh_frame_stream* stream); /* NULL is fine; ends the stream first */

#ifdef __cplusplus
}
#endif

#endif /* KVMESH_KVMESH_H_ */
