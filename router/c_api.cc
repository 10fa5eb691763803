// The C ABI (include/kvmesh/kvmesh.h) over kvmesh::NetworkClient.
// Every entry point converts Status to a code plus a thread-local message and
// catches everything: no exception crosses the boundary.
#include "kvmesh/kvmesh.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "kvmesh/frame_stream.h"
#include "kvmesh/kv_route.h"
#include "kvmesh/network.h"

struct kvmesh_client {
  std::unique_ptr<kvmesh::NetworkClient> net;
};

// One thread at a time: the stream and the match pending between
// kvmesh_frame_match and kvmesh_frame_commit.
struct kvmesh_frame_stream {
  std::unique_ptr<kvmesh::FrameStream> s;
  kvmesh::FrameMatch pending;
  bool has_pending = false;
};

// Immutable after creation: shared by the caller's threads without locks.
struct kvmesh_seq {
  kvmesh::SequenceHandle h;
};

namespace {

thread_local std::string t_error;

int Fail(const kvmesh::Status& s) {
  t_error = s.ToString();
  return static_cast<int>(s.code());
}
int Ok() {
  t_error.clear();
  return KVMESH_OK;
}

template <typename F>
int Guard(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return Fail(kvmesh::ResourceExhausted("out of memory"));
  } catch (const std::exception& e) {
    return Fail(kvmesh::Internal(e.what()));
  } catch (...) {
    return Fail(kvmesh::Internal("unknown exception"));
  }
}

std::span<const kvmesh::TokenId> Tokens(const int32_t* t, size_t n) { return {t, n}; }
kvmesh::BlockKey Key(kvmesh_key k) { return kvmesh::BlockKey{k.hi, k.lo}; }

}  // namespace

extern "C" {

kvmesh_options kvmesh_default_options(void) {
  kvmesh_options o;
  o.coordinator = nullptr;
  o.client_id = nullptr;
  o.tenant_salt = nullptr;
  o.token = nullptr;
  o.timeout_ms = 2000;
  o.tenant = nullptr;
  o.tls_ca = nullptr;
  o.tls_cert = nullptr;
  o.tls_key = nullptr;
  return o;
}

int kvmesh_connect(const kvmesh_options* options, kvmesh_client** out) {
  return Guard([&] {
    if (options == nullptr || out == nullptr || options->coordinator == nullptr)
      return Fail(kvmesh::InvalidArgument("kvmesh_connect needs options with a coordinator and an out pointer"));
    kvmesh::NetworkClientOptions o;
    o.coordinator = options->coordinator;
    o.client_id = options->client_id ? options->client_id : "kvmesh-c";
    if (options->tenant_salt) o.tenant_salt = options->tenant_salt;
    if (options->token) o.token = options->token;
    if (options->tenant) o.tenant = options->tenant;
    if (options->tls_ca) o.tls_ca = options->tls_ca;
    if (options->tls_cert) o.tls_cert = options->tls_cert;
    if (options->tls_key) o.tls_key = options->tls_key;
    if (options->timeout_ms > 0) o.timeout_ms = options->timeout_ms;
    auto c = kvmesh::NetworkClient::Connect(o);
    if (!c.ok()) return Fail(c.status());
    *out = new kvmesh_client{std::move(*c)};
    return Ok();
  });
}

void kvmesh_close(kvmesh_client* client) {
  try {
    delete client;
  } catch (...) {
  }
}

const char* kvmesh_last_error(void) { return t_error.c_str(); }

uint32_t kvmesh_block_tokens(const kvmesh_client* c) { return c ? c->net->router().block_tokens() : 0; }
size_t kvmesh_block_bytes(const kvmesh_client* c) { return c ? c->net->router().model().FullBlockBytes() : 0; }
uint64_t kvmesh_epoch(const kvmesh_client* c) { return c ? c->net->epoch() : 0; }

int kvmesh_block_keys(kvmesh_client* c, const int32_t* tokens, size_t n, kvmesh_key* keys, size_t cap,
                      size_t* count) {
  return Guard([&] {
    if (!c || (!tokens && n) || !count || (!keys && cap)) return Fail(kvmesh::InvalidArgument("null argument"));
    auto k = c->net->router().Keys(Tokens(tokens, n));
    for (size_t i = 0; i < k.size() && i < cap; ++i) keys[i] = kvmesh_key{k[i].hi, k[i].lo};
    *count = k.size();
    return Ok();
  });
}

int kvmesh_match_prefix(kvmesh_client* c, const int32_t* tokens, size_t n, size_t* matched) {
  return Guard([&] {
    if (!c || (!tokens && n) || !matched) return Fail(kvmesh::InvalidArgument("null argument"));
    auto m = c->net->router().MatchPrefix(Tokens(tokens, n));
    if (!m.ok()) return Fail(m.status());
    *matched = *m;
    return Ok();
  });
}

int kvmesh_put_blocks(kvmesh_client* c, const int32_t* tokens, size_t n, size_t first_block,
                      const void* const* blocks, const size_t* sizes, size_t count) {
  return Guard([&] {
    if (!c || (!tokens && n) || ((!blocks || !sizes) && count)) return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<std::span<const std::byte>> spans;
    for (size_t i = 0; i < count; ++i) spans.emplace_back(static_cast<const std::byte*>(blocks[i]), sizes[i]);
    kvmesh::Status s = c->net->router().Put(Tokens(tokens, n), spans, {}, first_block);
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_get_block(kvmesh_client* c, const int32_t* tokens, size_t n, size_t index, void* dst, size_t cap,
                     size_t* size) {
  return Guard([&] {
    if (!c || (!tokens && n) || !size) return Fail(kvmesh::InvalidArgument("null argument"));
    auto keys = c->net->router().Keys(Tokens(tokens, n));
    if (index >= keys.size()) return Fail(kvmesh::InvalidArgument("block index past the full blocks of tokens"));
    return kvmesh_get(c, kvmesh_key{keys[index].hi, keys[index].lo}, dst, cap, size);
  });
}

int kvmesh_put(kvmesh_client* c, const kvmesh_key* keys, const void* const* data, const size_t* sizes, size_t count) {
  return Guard([&] {
    if (!c || ((!keys || !data || !sizes) && count)) return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<kvmesh::PutItem> items;
    for (size_t i = 0; i < count; ++i)
      items.push_back(kvmesh::PutItem{Key(keys[i]), {static_cast<const std::byte*>(data[i]), sizes[i]}, {}});
    kvmesh::Status s = c->net->router().PutBatch(items);
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_get(kvmesh_client* c, kvmesh_key key, void* dst, size_t cap, size_t* size) {
  return Guard([&] {
    if (!c || (!dst && cap) || !size) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::GetItem it{Key(key), {static_cast<std::byte*>(dst), cap}, 0, {}};
    kvmesh::Status s = c->net->router().GetBatch(std::span<kvmesh::GetItem>(&it, 1));
    if (!s.ok()) return Fail(s);
    if (it.status.code() == kvmesh::StatusCode::kResourceExhausted) *size = it.size;
    if (!it.status.ok()) return Fail(it.status);
    *size = it.size;
    return Ok();
  });
}

int kvmesh_register_memory(kvmesh_client* c, void* base, size_t bytes, kvmesh_memory_kind kind, uint64_t* region_id) {
  return Guard([&] {
    if (!c || !region_id) return Fail(kvmesh::InvalidArgument("null argument"));
    if (kind != KVMESH_MEMORY_HOST && kind != KVMESH_MEMORY_DEVICE)
      return Fail(kvmesh::InvalidArgument("unknown memory kind"));
    auto r = c->net->router().RegisterMemory(base, bytes,
                                             kind == KVMESH_MEMORY_HOST ? kvmesh::MemoryKind::kHost
                                                                        : kvmesh::MemoryKind::kDevice);
    if (!r.ok()) return Fail(r.status());
    *region_id = r->id;
    return Ok();
  });
}

int kvmesh_allocate_memory(kvmesh_client* c, size_t bytes, void** base, uint64_t* region_id) {
  return Guard([&] {
    if (!c || !base || !region_id) return Fail(kvmesh::InvalidArgument("null argument"));
    auto r = c->net->router().AllocateMemory(bytes);
    if (!r.ok()) return Fail(r.status());
    *base = r->base;
    *region_id = r->id;
    return Ok();
  });
}

int kvmesh_unregister_memory(kvmesh_client* c, uint64_t region_id) {
  return Guard([&] {
    if (!c) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::Status s = c->net->router().UnregisterMemory(region_id);
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_get_into(kvmesh_client* c, const kvmesh_key* keys, void* const* dsts, const size_t* caps, size_t count,
                    size_t* sizes, int* statuses) {
  return Guard([&] {
    if (!c || ((!keys || !dsts || !caps || !sizes || !statuses) && count))
      return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<kvmesh::GetItem> items;
    items.reserve(count);
    for (size_t i = 0; i < count; ++i)
      items.push_back(kvmesh::GetItem{Key(keys[i]), {static_cast<std::byte*>(dsts[i]), caps[i]}, 0, {}});
    kvmesh::Status s = c->net->router().GetInto(items);
    if (!s.ok()) return Fail(s);
    for (size_t i = 0; i < count; ++i) {
      sizes[i] = items[i].size;
      statuses[i] = static_cast<int>(items[i].status.code());
    }
    return Ok();
  });
}

int kvmesh_put_from(kvmesh_client* c, const kvmesh_key* keys, const void* const* srcs, const size_t* sizes,
                    size_t count, int* statuses) {
  return Guard([&] {
    if (!c || ((!keys || !srcs || !sizes || !statuses) && count)) return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<kvmesh::PutItem> items;
    items.reserve(count);
    for (size_t i = 0; i < count; ++i)
      items.push_back(kvmesh::PutItem{Key(keys[i]), {static_cast<const std::byte*>(srcs[i]), sizes[i]}, {}});
    (void)c->net->router().PutFrom(items);  // the first item error; every item carries its own
    for (size_t i = 0; i < count; ++i) statuses[i] = static_cast<int>(items[i].status.code());
    return Ok();
  });
}

int kvmesh_erase(kvmesh_client* c, const kvmesh_key* keys, size_t count) {
  return Guard([&] {
    if (!c || (!keys && count)) return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<kvmesh::BlockKey> k;
    for (size_t i = 0; i < count; ++i) k.push_back(Key(keys[i]));
    kvmesh::Status s = c->net->router().Erase(k);
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_release(kvmesh_client* c, const kvmesh_key* keys, size_t count) {
  return Guard([&] {
    if (!c || (!keys && count)) return Fail(kvmesh::InvalidArgument("null argument"));
    std::vector<kvmesh::BlockKey> k;
    for (size_t i = 0; i < count; ++i) k.push_back(Key(keys[i]));
    kvmesh::Status s = c->net->router().Release(k);
    return s.ok() ? Ok() : Fail(s);
  });
}

kvmesh_seq_options kvmesh_seq_default_options(void) {
  kvmesh_seq_options o;
  o.layers_begin = o.layers_end = 0;
  o.heads_begin = o.heads_end = 0;
  o.priority = kvmesh::kDefaultPriority;
  o.max_blocks = SIZE_MAX;
  return o;
}

int kvmesh_seq_create(kvmesh_client* c, const int32_t* prefix, size_t n, const kvmesh_seq_options* options,
                      kvmesh_seq** out) {
  return Guard([&] {
    if (!c || (!prefix && n) || !out) return Fail(kvmesh::InvalidArgument("null argument"));
    const kvmesh_seq_options so = options ? *options : kvmesh_seq_default_options();
    kvmesh::RequestOptions o;
    o.layers = {so.layers_begin, so.layers_end};
    o.heads = {so.heads_begin, so.heads_end};
    o.priority = so.priority;
    auto h = c->net->router().CreateSequence(Tokens(prefix, n), o, so.max_blocks);
    if (!h.ok()) return Fail(h.status());
    *out = new kvmesh_seq{std::move(*h)};
    return Ok();
  });
}

int kvmesh_seq_append(kvmesh_client* c, const kvmesh_seq* s, const int32_t* tokens, size_t n, const void* k,
                      const void* v, size_t kv_bytes, uint32_t* first_position) {
  return Guard([&] {
    if (!c || !s || (!tokens && n) || ((!k || !v) && kv_bytes)) return Fail(kvmesh::InvalidArgument("null argument"));
    auto pos = c->net->router().AppendSequence(s->h, Tokens(tokens, n), {static_cast<const std::byte*>(k), kv_bytes},
                                               {static_cast<const std::byte*>(v), kv_bytes});
    if (!pos.ok()) return Fail(pos.status());
    if (first_position) *first_position = *pos;
    return Ok();
  });
}

int kvmesh_seq_truncate(kvmesh_client* c, const kvmesh_seq* s, uint32_t n) {
  return Guard([&] {
    if (!c || !s) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::Status st = c->net->router().TruncateSequence(s->h, n);
    return st.ok() ? Ok() : Fail(st);
  });
}

int kvmesh_seq_fork(kvmesh_client* c, const kvmesh_seq* s, kvmesh_seq** out) {
  return Guard([&] {
    if (!c || !s || !out) return Fail(kvmesh::InvalidArgument("null argument"));
    auto h = c->net->router().ForkSequence(s->h);
    if (!h.ok()) return Fail(h.status());
    *out = new kvmesh_seq{std::move(*h)};
    return Ok();
  });
}

int kvmesh_seq_release(kvmesh_client* c, const kvmesh_seq* s) {
  return Guard([&] {
    if (!c || !s) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::Status st = c->net->router().ReleaseSequence(s->h);
    return st.ok() ? Ok() : Fail(st);
  });
}

void kvmesh_seq_free(kvmesh_seq* s) { delete s; }

int kvmesh_seq_info(kvmesh_client* c, const kvmesh_seq* s, kvmesh_seq_state* info, int32_t* tokens, size_t cap) {
  return Guard([&] {
    if (!c || !s || !info || (!tokens && cap)) return Fail(kvmesh::InvalidArgument("null argument"));
    auto st = c->net->router().SequenceInfo(s->h);
    if (!st.ok()) return Fail(st.status());
    std::copy_n(st->tokens.begin(), std::min(cap, st->tokens.size()), tokens);
    info->length = st->length;
    info->sealed_blocks = st->sealed_blocks;
    return Ok();
  });
}

int kvmesh_seq_read(kvmesh_client* c, const kvmesh_seq* s, uint32_t from, uint32_t n, void* k, void* v, size_t cap,
                    size_t* size) {
  return Guard([&] {
    if (!c || !s || ((!k || !v) && cap) || !size) return Fail(kvmesh::InvalidArgument("null argument"));
    const size_t need = kvmesh_seq_kv_bytes(c, s, n);
    if (cap < need) {
      *size = need;
      return Fail(kvmesh::ResourceExhausted("K/V buffers of " + std::to_string(cap) + " bytes, the read needs " +
                                            std::to_string(need)));
    }
    std::vector<std::byte> kb, vb;
    kvmesh::Status st = c->net->router().ReadSequence(s->h, from, n, &kb, &vb);
    if (!st.ok()) return Fail(st);
    if (kb.size() != vb.size() || kb.size() > cap) return Fail(kvmesh::Internal("read answered an unexpected size"));
    if (!kb.empty()) {
      std::memcpy(k, kb.data(), kb.size());
      std::memcpy(v, vb.data(), vb.size());
    }
    *size = kb.size();
    return Ok();
  });
}

uint32_t kvmesh_seq_prefix_tokens(const kvmesh_seq* s) { return s ? s->h.prefix_tokens : 0; }

size_t kvmesh_seq_kv_bytes(const kvmesh_client* c, const kvmesh_seq* s, size_t n) {
  if (!c || !s) return 0;
  const kvmesh::ModelSpec& m = c->net->router().model();
  return kvmesh::BlockLayout{s->h.layers, s->h.heads, m.block_tokens, m.head_dim, m.dtype}.side_bytes(n);
}

struct kvmesh_kv_index {
  kvmesh::KvIndex index;
};

int kvmesh_kv_index_create(kvmesh_kv_index** out) {
  return Guard([&] {
    if (!out) return Fail(kvmesh::InvalidArgument("null argument"));
    *out = new kvmesh_kv_index{};
    return Ok();
  });
}

int kvmesh_kv_index_create_approximate(kvmesh_kv_index** out, double ttl_s) {
  return Guard([&] {
    if (!out) return Fail(kvmesh::InvalidArgument("null argument"));
    if (!(ttl_s > 0)) return Fail(kvmesh::InvalidArgument("approximate KV index: ttl_s must be > 0"));
    kvmesh::RouteWeights w;
    w.approx_ttl_s = ttl_s;
    *out = new kvmesh_kv_index{kvmesh::KvIndex(w)};
    return Ok();
  });
}

void kvmesh_kv_index_free(kvmesh_kv_index* index) {
  try {
    delete index;
  } catch (...) {
  }
}

int kvmesh_kv_index_apply_batch(kvmesh_kv_index* x, const char* instance, const void* payload, size_t size) {
  return Guard([&] {
    if (!x || !instance || (!payload && size)) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::Status s = x->index.ApplyBatch(instance, {static_cast<const std::byte*>(payload), size});
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_kv_index_set_load(kvmesh_kv_index* x, const char* instance, double load) {
  return Guard([&] {
    if (!x || !instance) return Fail(kvmesh::InvalidArgument("null argument"));
    kvmesh::Status s = x->index.SetLoad(instance, load);
    return s.ok() ? Ok() : Fail(s);
  });
}

int kvmesh_kv_index_route(kvmesh_kv_index* x, const kvmesh_key* keys, size_t n_keys, const char* const* candidates,
                          size_t n_candidates, kvmesh_prefix_match* out) {
  return Guard([&] {
    if (!x || (!keys && n_keys) || ((!candidates || !out) && n_candidates))
      return Fail(kvmesh::InvalidArgument("null argument"));
    // Per-thread buffers: a thread that routes again allocates nothing.
    thread_local std::vector<kvmesh::BlockKey> k;
    thread_local std::vector<std::string> names;
    thread_local std::vector<kvmesh::PrefixMatch> r;
    thread_local std::vector<bool> used;
    k.resize(n_keys);
    for (size_t i = 0; i < n_keys; ++i) k[i] = kvmesh::BlockKey{keys[i].hi, keys[i].lo};
    names.resize(n_candidates);
    for (size_t i = 0; i < n_candidates; ++i) {
      if (!candidates[i]) return Fail(kvmesh::InvalidArgument("null candidate name"));
      names[i].assign(candidates[i]);
    }
    x->index.Route(k, names, &r);
    // Route keeps equal names in the candidates' order: give each answer the
    // first candidate index with its name not given yet.
    used.assign(n_candidates, false);
    for (size_t i = 0; i < r.size(); ++i) {
      size_t c = 0;
      while (c < n_candidates && (used[c] || names[c] != r[i].instance)) ++c;
      used[c] = true;
      out[i] = kvmesh_prefix_match{c, r[i].blocks, r[i].gpu_blocks, r[i].cpu_blocks, r[i].load, r[i].score};
    }
    return Ok();
  });
}

kvmesh_frame_options kvmesh_frame_default_options(void) {
  const kvmesh::FrameMatchOptions g;
  const kvmesh::FrameStreamOptions so;
  kvmesh_frame_options o;
  o.stream_id = 0;
  o.width = so.width;
  o.height = so.height;
  o.patch = so.patch;
  o.mode = static_cast<uint32_t>(g.mode);
  o.window = g.window;
  o.ssim_threshold = g.ssim_threshold;
  o.change_threshold = g.change_threshold;
  o.pixel_delta = g.pixel_delta;
  o.recompute_radius = g.recompute_radius;
  o.refresh_deviation = g.refresh_deviation;
  o.max_age = g.max_age;
  o.motion_radius = g.motion_radius;
  o.priority = kvmesh::kDefaultPriority;
  return o;
}

namespace {

kvmesh_patch_match CMatch(const kvmesh::PatchMatch& m) {
  kvmesh_patch_match c;
  c.reused = m.reused ? 1 : 0;
  c.blended = m.blended ? 1 : 0;
  c.key = kvmesh_key{m.key.hi, m.key.lo};
  c.source_frame = m.source_frame;
  c.source_patch = m.source_patch;
  c.ssim = m.ssim;
  c.change = m.change;
  return c;
}

}  // namespace

int kvmesh_frame_open(kvmesh_client* c, const kvmesh_frame_options* options, kvmesh_frame_stream** out) {
  return Guard([&] {
    if (!c || !out) return Fail(kvmesh::InvalidArgument("null argument"));
    const kvmesh_frame_options fo = options ? *options : kvmesh_frame_default_options();
    if (fo.mode > 2) return Fail(kvmesh::InvalidArgument("frame options: mode must be 0, 1 or 2"));
    kvmesh::FrameStreamOptions so;
    so.stream_id = fo.stream_id;
    so.width = fo.width;
    so.height = fo.height;
    so.patch = fo.patch;
    so.match.mode = static_cast<kvmesh::FrameReuse>(fo.mode);
    so.match.window = fo.window;
    so.match.ssim_threshold = fo.ssim_threshold;
    so.match.change_threshold = fo.change_threshold;
    so.match.pixel_delta = fo.pixel_delta;
    so.match.recompute_radius = fo.recompute_radius;
    so.match.refresh_deviation = fo.refresh_deviation;
    so.match.max_age = fo.max_age;
    so.match.motion_radius = fo.motion_radius;
    so.request.priority = fo.priority;
    auto s = kvmesh::FrameStream::Open(c->net->router(), so);
    if (!s.ok()) return Fail(s.status());
    *out = new kvmesh_frame_stream{std::move(*s), {}, false};
    return Ok();
  });
}

uint32_t kvmesh_frame_patches(const kvmesh_frame_stream* s) { return s && s->s ? s->s->num_patches() : 0; }

int kvmesh_frame_match(kvmesh_frame_stream* s, const uint8_t* pixels, size_t n, kvmesh_patch_match* out,
                       size_t cap) {
  return kvmesh_frame_match_tagged(s, pixels, n, nullptr, 0, out, cap);
}

int kvmesh_frame_match_tagged(kvmesh_frame_stream* s, const uint8_t* pixels, size_t n, const uint64_t* tags,
                              size_t n_tags, kvmesh_patch_match* out, size_t cap) {
  return Guard([&] {
    if (!s || !s->s || (!pixels && n) || (!tags && n_tags)) return Fail(kvmesh::InvalidArgument("null argument"));
    if (out == nullptr || cap < s->s->num_patches())
      return Fail(kvmesh::InvalidArgument("frame match: out needs one entry per patch"));
    // FrameStream::Match refuses tags that are neither none nor one per patch.
    auto m = s->s->Match({pixels, n}, nullptr, {tags, n_tags});
    if (!m.ok()) return Fail(m.status());
    s->pending = std::move(*m);
    s->has_pending = true;
    for (size_t i = 0; i < s->pending.patches.size(); ++i) out[i] = CMatch(s->pending.patches[i]);
    return Ok();
  });
}

int kvmesh_frame_get_reused(kvmesh_frame_stream* s, void* const* dsts, size_t cap, kvmesh_patch_match* out,
                            size_t n_out) {
  return Guard([&] {
    if (!s || !s->s || !dsts) return Fail(kvmesh::InvalidArgument("null argument"));
    if (!s->has_pending) return Fail(kvmesh::FailedPrecondition("frame get_reused: no frame matched"));
    const size_t n = s->pending.patches.size();
    std::vector<std::span<std::byte>> dst(n);
    for (size_t i = 0; i < n; ++i) {
      if (!s->pending.patches[i].reused) continue;
      if (!dsts[i]) return Fail(kvmesh::InvalidArgument("frame get_reused: null destination of a reused patch"));
      dst[i] = {static_cast<std::byte*>(dsts[i]), cap};
    }
    kvmesh::Status st = s->s->GetReused(s->pending, dst);
    if (!st.ok()) return Fail(st);
    if (out)
      for (size_t i = 0; i < std::min(n, n_out); ++i) out[i] = CMatch(s->pending.patches[i]);
    return Ok();
  });
}

int kvmesh_frame_refresh(kvmesh_frame_stream* s, uint32_t patch) {
  return Guard([&] {
    if (!s || !s->s) return Fail(kvmesh::InvalidArgument("null argument"));
    if (!s->has_pending) return Fail(kvmesh::FailedPrecondition("frame refresh: no frame matched"));
    kvmesh::Status st = s->s->Refresh(s->pending, patch);
    return st.ok() ? Ok() : Fail(st);
  });
}

int kvmesh_frame_history(kvmesh_frame_stream* s, uint32_t patch, kvmesh_key* keys, size_t cap, size_t* n) {
  return Guard([&] {
    if (!s || !s->s || (!keys && cap) || !n) return Fail(kvmesh::InvalidArgument("null argument"));
    if (patch >= s->s->num_patches()) return Fail(kvmesh::InvalidArgument("frame history: no such patch"));
    const std::vector<kvmesh::BlockKey> h = s->s->History(patch);
    *n = h.size();
    for (size_t i = 0; i < std::min(cap, h.size()); ++i) keys[i] = kvmesh_key{h[i].hi, h[i].lo};
    return Ok();
  });
}

int kvmesh_frame_commit(kvmesh_frame_stream* s, const uint8_t* pixels, size_t n, const void* const* srcs,
                        size_t block_bytes) {
  return kvmesh_frame_commit_tagged(s, pixels, n, srcs, block_bytes, nullptr, 0);
}

int kvmesh_frame_commit_tagged(kvmesh_frame_stream* s, const uint8_t* pixels, size_t n, const void* const* srcs,
                               size_t block_bytes, const uint64_t* tags, size_t n_tags) {
  return Guard([&] {
    if (!s || !s->s || (!pixels && n) || (!tags && n_tags)) return Fail(kvmesh::InvalidArgument("null argument"));
    if (!s->has_pending) return Fail(kvmesh::FailedPrecondition("frame commit: no frame matched"));
    const size_t np = s->pending.patches.size();
    std::vector<std::span<const std::byte>> src(np);
    for (size_t i = 0; i < np; ++i) {
      if (s->pending.patches[i].reused) continue;
      if (!srcs || !srcs[i]) return Fail(kvmesh::InvalidArgument("frame commit: null block of a computed patch"));
      src[i] = {static_cast<const std::byte*>(srcs[i]), block_bytes};
    }
    kvmesh::Status st = s->s->Commit(s->pending, {pixels, n}, src, {tags, n_tags});
    if (!st.ok()) return Fail(st);
    s->has_pending = false;
    return Ok();
  });
}

int kvmesh_frame_stats_get(const kvmesh_frame_stream* s, kvmesh_frame_stats* out) {
  return Guard([&] {
    if (!s || !s->s || !out) return Fail(kvmesh::InvalidArgument("null argument"));
    const kvmesh::FrameStreamStats& st = s->s->stats();
    *out = kvmesh_frame_stats{st.frames,    st.patches,      st.reused,       st.blocks_put,
                              st.bytes_put, st.put_failures, st.reuse_misses, st.released};
    return Ok();
  });
}

int kvmesh_frame_end(kvmesh_frame_stream* s) {
  return Guard([&] {
    if (!s || !s->s) return Fail(kvmesh::InvalidArgument("null argument"));
    s->has_pending = false;
    kvmesh::Status st = s->s->End();
    return st.ok() ? Ok() : Fail(st);
  });
}

void kvmesh_frame_free(kvmesh_frame_stream* s) {
  if (s == nullptr) return;
  try {
    if (s->s) (void)s->s->End();
  } catch (...) {
  }
  delete s;
}

int kvmesh_kv_index_routed(kvmesh_kv_index* x, const char* instance, const kvmesh_key* keys, size_t n_keys) {
  return Guard([&] {
    if (!x || !instance || (!keys && n_keys)) return Fail(kvmesh::InvalidArgument("null argument"));
    thread_local std::vector<kvmesh::BlockKey> k;
    k.resize(n_keys);
    for (size_t i = 0; i < n_keys; ++i) k[i] = kvmesh::BlockKey{keys[i].hi, keys[i].lo};
    kvmesh::Status s = x->index.Routed(instance, k);
    return s.ok() ? Ok() : Fail(s);
  });
}

}  // extern "C"
