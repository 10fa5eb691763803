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
  const char* token;       /* NULL: none — the cluster's shared secret, if it has one */
  int64_t timeout_ms;      /* per call; <= 0: 2000 */
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

#ifdef __cplusplus
}
#endif

#endif /* KVMESH_KVMESH_H_ */
