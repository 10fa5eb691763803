#include "transport/ucx_worker.h"

#include <cstdlib>

#include "kvmesh/config.h"

namespace kvmesh {

Status UcxStatus(ucs_status_t s, const char* what, const char* file, int line) {
  return Unavailable(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + ucs_status_string(s));
}

namespace {

// UCX_TLS lists transports (or, after '^', the ones to leave out): true when
// it lists nothing that moves memory one-sidedly (tcp and self only).
bool SoftwareRmaOnly(const char* tls) {
  if (tls == nullptr || *tls == '\0' || *tls == '^') return false;
  std::string s(tls);
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    const std::string t = s.substr(at, comma - at);
    if (!t.empty() && t != "tcp" && t != "self") return false;
    at = comma + 1;
  }
  return true;
}

}  // namespace

Result<std::shared_ptr<UcxContext>> UcxContext::Create(bool mt_workers) {
  std::shared_ptr<UcxContext> c(new UcxContext());
  c->software_rma_only_ = SoftwareRmaOnly(std::getenv("UCX_TLS"));
  ucp_config_t* cfg = nullptr;
  KVMESH_UCX_RETURN(ucp_config_read(nullptr, nullptr, &cfg));  // reads UCX_TLS etc.
  // UCX's keepalive rounds off unless the user sets them: in UCX 1.13 a
  // round that meets an endpoint closed under it aborts the process
  // (ucp_worker.c "keepalive.iter == &worker->all_eps", openucx/ucx#11217),
  // seen when a refused client's endpoints close at once. A peer's death is
  // still seen through its TCP connection (the watch endpoint), a hung peer
  // through our own request deadlines.
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", "inf");
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = mt_workers ? 1 : 0;
  ucs_status_t st = ucp_init(&p, cfg, &c->context_);
  ucp_config_release(cfg);
  KVMESH_UCX_RETURN(st);
  return c;
}

UcxContext::~UcxContext() {
  if (context_) ucp_cleanup(context_);
}

Result<std::unique_ptr<UcxMemory>> UcxContext::Map(void* base, size_t length) const {
  std::unique_ptr<UcxMemory> m(new UcxMemory());
  m->owner_ = shared_from_this();
  m->base_ = static_cast<std::byte*>(base);
  m->length_ = length;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = base;
  mp.length = length;
  KVMESH_UCX_RETURN(ucp_mem_map(context_, &mp, &m->memh_));
  void* rk = nullptr;
  size_t rkl = 0;
  KVMESH_UCX_RETURN(ucp_rkey_pack(context_, m->memh_, &rk, &rkl));
  m->rkey_.assign(static_cast<const char*>(rk), rkl);
  ucp_rkey_buffer_release(rk);
  return m;
}

Result<std::shared_ptr<UcxMemory>> UcxContext::MapRegion(void* base, size_t length) {
  auto* b = static_cast<std::byte*>(base);
  std::lock_guard<std::mutex> lock(regions_mu_);
  std::erase_if(regions_, [](const auto& r) { return r.second.expired(); });
  std::erase_if(allocations_, [](const std::weak_ptr<UcxMemory>& w) { return w.expired(); });
  const std::pair<const std::byte*, size_t> range{b, length};
  if (auto it = regions_.find(range); it != regions_.end()) return it->second.lock();
  std::shared_ptr<UcxMemory> shared;
  for (const std::weak_ptr<UcxMemory>& w : allocations_) {
    std::shared_ptr<UcxMemory> a = w.lock();
    if (a && b >= a->base() && length <= a->length() && size_t(b - a->base()) <= a->length() - length) {
      shared = std::move(a);
      break;
    }
  }
  if (!shared) {
    KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<UcxMemory> m, Map(base, length));
    shared = std::move(m);
  }
  regions_.emplace(range, shared);
  return shared;
}

Result<std::shared_ptr<UcxMemory>> UcxContext::Allocate(size_t length) {
  if (length == 0) return InvalidArgument("cannot allocate 0 bytes");
  std::shared_ptr<UcxMemory> m(new UcxMemory());
  m->owner_ = shared_from_this();
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = length;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  KVMESH_UCX_RETURN(ucp_mem_map(context_, &mp, &m->memh_));
  ucp_mem_attr_t at{};
  at.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  KVMESH_UCX_RETURN(ucp_mem_query(m->memh_, &at));
  m->base_ = static_cast<std::byte*>(at.address);
  m->length_ = length;
  void* rk = nullptr;
  size_t rkl = 0;
  KVMESH_UCX_RETURN(ucp_rkey_pack(context_, m->memh_, &rk, &rkl));
  m->rkey_.assign(static_cast<const char*>(rk), rkl);
  ucp_rkey_buffer_release(rk);
  std::lock_guard<std::mutex> lock(regions_mu_);
  allocations_.push_back(m);
  return m;
}

Result<UcxProgress> ParseUcxProgress(std::string_view name) {
  for (size_t i = 0; i < kUcxProgressModes.size(); ++i)
    if (name == kUcxProgressModes[i]) return static_cast<UcxProgress>(i);
  return InvalidArgument("UCX progress mode must be poll, event, hybrid or adaptive, not \"" + std::string(name) + "\"");
}

UcxMemory::~UcxMemory() {
  if (memh_) ucp_mem_unmap(owner_->get(), memh_);
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(bool multi_thread) {
  KVMESH_ASSIGN_OR_RETURN(auto ctx, UcxContext::Create(multi_thread));
  return Create(std::move(ctx), multi_thread);
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(std::shared_ptr<UcxContext> context, bool multi_thread) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  w->context_ = std::move(context);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  wp.thread_mode = multi_thread ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE;
  wp.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX;
  KVMESH_UCX_RETURN(ucp_worker_create(w->context_->get(), &wp, &w->worker_));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  KVMESH_UCX_RETURN(ucp_worker_get_address(w->worker_, &addr, &len));
  w->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w->worker_, addr);
  KVMESH_UCX_RETURN(ucp_worker_get_efd(w->worker_, &w->efd_));
  ucp_worker_attr_t wa{};
  wa.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  KVMESH_UCX_RETURN(ucp_worker_query(w->worker_, &wa));
  w->max_am_header_ = wa.max_am_header;
  return w;
}

UcxWorker::~UcxWorker() {
  if (worker_) ucp_worker_destroy(worker_);
}

bool UcxWorker::Arm() { return ucp_worker_arm(worker_) == UCS_OK; }

void UcxWorker::ProgressAll() {
  while (ucp_worker_progress(worker_) != 0) {
  }
}

namespace {
constexpr std::string_view kPackMagic = "KVMW";  // a node's workers
constexpr std::string_view kPairMagic = "KVMP";  // one worker's data and watch addresses

// `magic`, a count byte, then per address a 4-byte little-endian length and its bytes.
std::string Pack(std::string_view magic, const std::vector<std::string>& addresses) {
  std::string out(magic);
  out += static_cast<char>(addresses.size());
  for (const std::string& a : addresses) {
    const uint32_t n = static_cast<uint32_t>(a.size());
    for (int i = 0; i < 4; ++i) out += static_cast<char>(n >> (8 * i) & 0xff);
    out += a;
  }
  return out;
}

// The addresses of a well-formed pack of `magic` with at least two; empty otherwise.
std::vector<std::string> Unpack(std::string_view magic, std::string_view address) {
  if (address.size() < magic.size() + 1 || address.substr(0, magic.size()) != magic) return {};
  const size_t count = static_cast<unsigned char>(address[magic.size()]);
  std::vector<std::string> out;
  size_t at = magic.size() + 1;
  for (size_t i = 0; i < count; ++i) {
    if (address.size() - at < 4) return {};
    uint32_t n = 0;
    for (int b = 0; b < 4; ++b) n |= uint32_t(static_cast<unsigned char>(address[at + b])) << (8 * b);
    at += 4;
    if (n == 0 || address.size() - at < n) return {};
    out.emplace_back(address.substr(at, n));
    at += n;
  }
  if (at != address.size() || count < 2) return {};
  return out;
}
}  // namespace

std::string PackWorkerAddresses(const std::vector<std::string>& addresses) {
  if (addresses.size() == 1) return addresses[0];
  return Pack(kPackMagic, addresses);
}

std::vector<std::string> UnpackWorkerAddresses(std::string_view address) {
  std::vector<std::string> out = Unpack(kPackMagic, address);
  if (out.empty()) out.emplace_back(address);
  return out;
}

std::string PackEndpointPair(const std::string& data, const std::string& watch) {
  return Pack(kPairMagic, {data, watch});
}

std::pair<std::string, std::string> UnpackEndpointPair(std::string_view address) {
  std::vector<std::string> two = Unpack(kPairMagic, address);
  if (two.size() != 2) return {std::string(address), std::string(address)};
  return {std::move(two[0]), std::move(two[1])};
}

std::string HexEncode(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(b.size() * 2);
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

Result<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2) return InvalidArgument("odd-length hex string");
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = v(hex[2 * i]), lo = v(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("not a hex string");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace kvmesh
