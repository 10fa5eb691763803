#include "shard_node/tenants.h"

#include <sys/random.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>

#include <absl/container/flat_hash_map.h>

#include "common/credentials.h"
#include "kvmesh/block_key.h"

namespace kvmesh {
namespace {

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// 16 bytes no client ever sees: without them nobody can compute a namespace's stored keys.
std::string NodeSecret() {
  std::string s(16, '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t n = ::getrandom(s.data() + got, s.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (errno != EINTR) break;
  }
  if (got < s.size()) {  // no kernel randomness: never expected on Linux >= 3.17; still unpredictable-ish
    const uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const uint64_t a = reinterpret_cast<uintptr_t>(&s) ^ t * 0x9E3779B97F4A7C15ull;
    std::memcpy(s.data(), &t, 8);
    std::memcpy(s.data() + 8, &a, 8);
  }
  return s;
}

BlockKey NamespaceKey(const std::string& secret, const std::string& ns) {
  std::string in = "kvmesh-namespace-v1";
  in.push_back('\0');
  in += secret;
  in += ns;
  const XXH128_hash_t h = XXH3_128bits(in.data(), in.size());
  BlockKey k{h.high64, h.low64};
  if (k.hi == 0 && k.lo == 0) k.lo = 1;  // all zero means "unscoped"
  return k;
}

std::string Label(const std::string& s) {
  std::string out;  // names are [A-Za-z0-9._-] (config loader): nothing to escape
  out.reserve(s.size());
  for (char c : s) out += (c == '"' || c == '\\' || c == '\n') ? '_' : c;
  return out;
}

}  // namespace

BlockKey ScopeKey(const BlockKey& ns, const BlockKey& key) {
  if (ns.hi == 0 && ns.lo == 0) return key;
  if (IsGroupedKey(key)) {  // the group alone: members, kind and tag stay
    uint8_t g[25];
    PutU64(g, ns.hi);
    PutU64(g + 8, ns.lo);
    PutU64(g + 16, key.hi);
    g[24] = 'g';
    return BlockKey{XXH3_64bits(g, sizeof g), key.lo};
  }
  uint8_t buf[32];
  PutU64(buf, ns.hi);
  PutU64(buf + 8, ns.lo);
  PutU64(buf + 16, key.hi);
  PutU64(buf + 24, key.lo);
  const XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  return ContentKey(BlockKey{h.high64, h.low64});  // a scoped content key stays one
}

struct TenantRegistry::Tenant {
  TenantConfig config;
  BlockKey ns{};  // all zero for the cluster identity

  struct Entry {
    BlockKey key;
    uint64_t bytes;
  };
  mutable std::mutex mu;
  std::list<Entry> lru;                                              // guarded by mu; front = least recent
  absl::flat_hash_map<BlockKey, std::list<Entry>::iterator> index;  // guarded by mu
  uint64_t bytes = 0;                                                // guarded by mu: the ledger's charge
  uint64_t held = 0;                                                 // guarded by mu: live sequences
  uint64_t pinned = 0;                                               // guarded by mu: connections' pins
  std::atomic<uint64_t> puts{0}, put_bytes{0}, hits{0}, misses{0}, erases{0}, quota_evictions{0}, quota_refused{0},
      sequence_refused{0}, pin_refused{0};

  // Appends t's least recently used blocks (never `keep`) to *victims until
  // its blocks and sequences fit the quota. REQUIRES mu.
  void TrimLocked(const BlockKey* keep, std::vector<BlockKey>* victims) {
    const uint64_t quota = config.quota_bytes;
    if (quota == 0) return;
    while (bytes + held > quota && !lru.empty() && (keep == nullptr || lru.front().key != *keep)) {
      victims->push_back(lru.front().key);
      ForgetLocked(lru.front().key);
    }
  }

  // REQUIRES mu.
  void ForgetLocked(const BlockKey& k) {
    auto it = index.find(k);
    if (it == index.end()) return;
    bytes -= it->second->bytes;
    lru.erase(it->second);
    index.erase(it);
  }
};

TenantRegistry::TenantRegistry(const AuthConfig& auth) : cluster_token_(auth.token) {
  const std::string secret = NodeSecret();
  tenants_.push_back(std::make_unique<Tenant>());
  for (const TenantConfig& c : auth.tenants) {
    auto t = std::make_unique<Tenant>();
    t->config = c;
    t->ns = NamespaceKey(secret, c.ns.empty() ? c.name : c.ns);
    tenants_.push_back(std::move(t));
  }
}

TenantRegistry::~TenantRegistry() = default;

bool TenantRegistry::has_tenants() const { return tenants_.size() > 1; }
size_t TenantRegistry::size() const { return tenants_.size() - 1; }

Result<uint32_t> TenantRegistry::Authenticate(std::string_view tenant, std::string_view token) const {
  if (tenant.empty() || !has_tenants()) {
    if (cluster_token_.empty() || ConstantTimeEquals(token, cluster_token_)) return kClusterTenant;
    return PermissionDenied(token.empty() ? "this node requires a token" : "wrong token");
  }
  // Look at every tenant and compare every secret, so the time does not say
  // whether the name exists.
  uint32_t found = 0;
  for (uint32_t i = 1; i < tenants_.size(); ++i) {
    const bool name = ConstantTimeEquals(tenant, tenants_[i]->config.name);
    const bool secret = ConstantTimeEquals(token, tenants_[i]->config.token);
    if (name && secret) found = i;
  }
  if (found == 0) return PermissionDenied("unknown tenant or wrong token");
  return found;
}

const std::string& TenantRegistry::name(uint32_t t) const { return tenants_.at(t)->config.name; }

BlockKey TenantRegistry::Scope(uint32_t t, const BlockKey& key) const { return ScopeKey(tenants_[t]->ns, key); }

const BlockKey& TenantRegistry::Namespace(uint32_t t) const { return tenants_.at(t)->ns; }

void TenantRegistry::SetCharge(BlockCharge charge) { charge_ = std::move(charge); }

uint64_t TenantRegistry::Charge(const BlockKey* stored, uint64_t payload) const {
  return charge_ ? charge_(stored, payload) : payload;
}

Status TenantRegistry::CheckFits(uint32_t t, uint64_t bytes) {
  if (t == kClusterTenant) return Status::Ok();
  Tenant& x = *tenants_[t];
  const uint64_t quota = x.config.quota_bytes;
  if (quota == 0) return Status::Ok();
  const uint64_t charge = Charge(nullptr, bytes);
  uint64_t held;
  {
    std::lock_guard<std::mutex> lock(x.mu);
    held = x.held;
  }
  if (charge <= quota && held <= quota - charge) return Status::Ok();
  x.quota_refused.fetch_add(1, std::memory_order_relaxed);
  return ResourceExhausted("a block of " + std::to_string(bytes) + " bytes (holding " + std::to_string(charge) +
                           ") exceeds tenant \"" + x.config.name + "\"'s quota of " + std::to_string(quota) +
                           " bytes" + (held ? " beside the " + std::to_string(held) + " bytes its live sequences hold" : ""));
}

void TenantRegistry::Admitted(uint32_t t, const BlockKey& key, uint64_t bytes, std::vector<BlockKey>* victims) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  x.puts.fetch_add(1, std::memory_order_relaxed);
  x.put_bytes.fetch_add(bytes, std::memory_order_relaxed);
  const uint64_t charge = Charge(&key, bytes);
  std::lock_guard<std::mutex> lock(x.mu);
  x.ForgetLocked(key);  // a refresh or a replacement: counted once, as the most recent
  x.lru.push_back({key, charge});
  x.index[key] = std::prev(x.lru.end());
  x.bytes += charge;
  x.TrimLocked(&key, victims);
}

namespace {
// Whether `used + bytes` stays within `quota` (0: none), without overflow.
bool FitsQuota(uint64_t used, uint64_t bytes, uint64_t quota) {
  return quota == 0 || (bytes <= quota && used <= quota - bytes);
}
Status OverQuota(const std::string& tenant, const char* what, uint64_t would, uint64_t quota, const char* advice) {
  return ResourceExhausted("tenant \"" + tenant + "\"'s " + what + " would hold " + std::to_string(would) +
                           " bytes, more than its quota of " + std::to_string(quota) + " bytes: " + advice);
}
}  // namespace

Status TenantRegistry::ReserveSequence(uint32_t t, uint64_t bytes, std::vector<BlockKey>* victims) {
  if (t == kClusterTenant || bytes == 0) return Status::Ok();
  Tenant& x = *tenants_[t];
  const uint64_t quota = x.config.quota_bytes;
  std::lock_guard<std::mutex> lock(x.mu);
  if (!FitsQuota(x.held, bytes, quota)) {
    x.sequence_refused.fetch_add(1, std::memory_order_relaxed);
    return OverQuota(x.config.name, "live sequences", x.held + bytes, quota, "release or truncate some");
  }
  x.held += bytes;
  x.TrimLocked(nullptr, victims);
  return Status::Ok();
}

void TenantRegistry::ReleaseSequence(uint32_t t, uint64_t bytes) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  std::lock_guard<std::mutex> lock(x.mu);
  x.held -= std::min(bytes, x.held);
}

Status TenantRegistry::ReservePin(uint32_t t, uint64_t bytes) {
  if (t == kClusterTenant) return Status::Ok();
  Tenant& x = *tenants_[t];
  const uint64_t quota = x.config.quota_bytes;
  std::lock_guard<std::mutex> lock(x.mu);
  if (!FitsQuota(x.pinned, bytes, quota)) {
    x.pin_refused.fetch_add(1, std::memory_order_relaxed);
    return OverQuota(x.config.name, "pins", x.pinned + bytes, quota, "unpin some");
  }
  x.pinned += bytes;
  return Status::Ok();
}

void TenantRegistry::ReleasePin(uint32_t t, uint64_t bytes) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  std::lock_guard<std::mutex> lock(x.mu);
  x.pinned -= std::min(bytes, x.pinned);
}

void TenantRegistry::QuotaEvicted(uint32_t t, uint64_t n) {
  if (t != kClusterTenant) tenants_[t]->quota_evictions.fetch_add(n, std::memory_order_relaxed);
}

void TenantRegistry::Hit(uint32_t t, const BlockKey& key) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  x.hits.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(x.mu);
  auto it = x.index.find(key);
  if (it != x.index.end()) x.lru.splice(x.lru.end(), x.lru, it->second);
}

void TenantRegistry::Miss(uint32_t t, const BlockKey& key) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  x.misses.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(x.mu);
  x.ForgetLocked(key);
}

void TenantRegistry::Erased(uint32_t t, const BlockKey& key) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  x.erases.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(x.mu);
  x.ForgetLocked(key);
}

void TenantRegistry::Dropped(uint32_t t, const BlockKey& key) {
  if (t == kClusterTenant) return;
  Tenant& x = *tenants_[t];
  x.quota_evictions.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(x.mu);
  x.ForgetLocked(key);
}

void TenantRegistry::Reconcile(const std::function<bool(const BlockKey&)>& exists) {
  for (size_t t = 1; t < tenants_.size(); ++t) {
    Tenant& x = *tenants_[t];
    std::vector<BlockKey> keys;
    {
      std::lock_guard<std::mutex> lock(x.mu);
      keys.reserve(x.lru.size());
      for (const auto& e : x.lru) keys.push_back(e.key);
    }
    std::vector<BlockKey> gone;
    for (const BlockKey& k : keys)
      if (!exists(k)) gone.push_back(k);
    std::lock_guard<std::mutex> lock(x.mu);
    for (const BlockKey& k : gone) x.ForgetLocked(k);
  }
}

TenantStats TenantRegistry::Stats(uint32_t t) const {
  const Tenant& x = *tenants_.at(t);
  TenantStats s;
  s.name = x.config.name;
  s.ns = x.config.ns.empty() ? x.config.name : x.config.ns;
  s.quota_bytes = x.config.quota_bytes;
  {
    std::lock_guard<std::mutex> lock(x.mu);
    s.bytes = x.bytes;
    s.blocks = x.lru.size();
    s.sequence_bytes = x.held;
    s.pinned_bytes = x.pinned;
  }
  s.puts = x.puts.load(std::memory_order_relaxed);
  s.put_bytes = x.put_bytes.load(std::memory_order_relaxed);
  s.hits = x.hits.load(std::memory_order_relaxed);
  s.misses = x.misses.load(std::memory_order_relaxed);
  s.erases = x.erases.load(std::memory_order_relaxed);
  s.quota_evictions = x.quota_evictions.load(std::memory_order_relaxed);
  s.quota_refused = x.quota_refused.load(std::memory_order_relaxed);
  s.sequence_refused = x.sequence_refused.load(std::memory_order_relaxed);
  s.pin_refused = x.pin_refused.load(std::memory_order_relaxed);
  return s;
}

std::vector<TenantStats> TenantRegistry::AllStats() const {
  std::vector<TenantStats> out;
  for (uint32_t t = 1; t < tenants_.size(); ++t) out.push_back(Stats(t));
  return out;
}

std::string TenantRegistry::PrometheusText() const {
  if (!has_tenants()) return {};
  const std::vector<TenantStats> all = AllStats();
  std::string out;
  auto family = [&](const char* name, const char* type, uint64_t TenantStats::*field) {
    out += std::string("# TYPE ") + name + " " + type + "\n";
    for (const TenantStats& s : all)
      out += std::string(name) + "{tenant=\"" + Label(s.name) + "\"} " + std::to_string(s.*field) + "\n";
  };
  family("kvmesh_tenant_bytes", "gauge", &TenantStats::bytes);
  family("kvmesh_tenant_blocks", "gauge", &TenantStats::blocks);
  family("kvmesh_tenant_quota_bytes", "gauge", &TenantStats::quota_bytes);
  family("kvmesh_tenant_sequence_bytes", "gauge", &TenantStats::sequence_bytes);
  family("kvmesh_tenant_pinned_bytes", "gauge", &TenantStats::pinned_bytes);
  family("kvmesh_tenant_puts_total", "counter", &TenantStats::puts);
  family("kvmesh_tenant_put_bytes_total", "counter", &TenantStats::put_bytes);
  family("kvmesh_tenant_hits_total", "counter", &TenantStats::hits);
  family("kvmesh_tenant_misses_total", "counter", &TenantStats::misses);
  family("kvmesh_tenant_erases_total", "counter", &TenantStats::erases);
  family("kvmesh_tenant_quota_evictions_total", "counter", &TenantStats::quota_evictions);
  family("kvmesh_tenant_quota_refused_total", "counter", &TenantStats::quota_refused);
  family("kvmesh_tenant_sequence_refused_total", "counter", &TenantStats::sequence_refused);
  family("kvmesh_tenant_pin_refused_total", "counter", &TenantStats::pin_refused);
  return out;
}

}  // namespace kvmesh
