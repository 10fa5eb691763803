#include "client.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kvmesh/build_config.h"
#include "router/map_fetch.h"

namespace kvmesh::python {

namespace {

std::vector<ItemStatus> Statuses(std::span<const GetItem> items) {
  std::vector<ItemStatus> out(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    out[i] = ItemStatus{items[i].status.code(), items[i].status.message(), items[i].size};
  return out;
}

std::vector<ItemStatus> Statuses(std::span<const PutItem> items) {
  std::vector<ItemStatus> out(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    out[i] = ItemStatus{items[i].status.code(), items[i].status.message(),
                        items[i].status.ok() ? items[i].data.size() : 0};
  return out;
}

py::sequence AsSequence(py::handle h, const char* what) {
  if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h) || py::isinstance<py::bytes>(h))
    Throw(InvalidArgument(std::string(what) + " must be a sequence"));
  return py::reinterpret_borrow<py::sequence>(h);
}

}  // namespace

std::vector<uint64_t> ToU64s(py::handle h, const char* what) {
  py::sequence s = AsSequence(AsPlainSequence(h), what);
  std::vector<uint64_t> out;
  out.reserve(py::len(s));
  for (py::object x : s) {  // held while read (see ToKeys)
    if (!PyLong_Check(x.ptr())) Throw(InvalidArgument(std::string(what) + " must hold ints"));
    const unsigned long long v = PyLong_AsUnsignedLongLong(x.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      Throw(InvalidArgument(std::string(what) + " must hold ints in [0, 2**64)"));
    }
    out.push_back(v);
  }
  return out;
}

ClusterConfig LoadConfigArg(py::handle config) {
  if (py::isinstance<py::dict>(config)) {
    std::string text = py::cast<std::string>(py::module_::import("json").attr("dumps")(config));
    return Value(ParseConfig(text, "<dict>"));
  }
  py::object path = py::reinterpret_borrow<py::object>(config);
  if (!py::isinstance<py::str>(config)) path = py::module_::import("os").attr("fspath")(config);
  const std::string s = py::cast<std::string>(path);
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && s[first] == '{') return Value(ParseConfig(s, "<string>"));
  return Value(LoadConfigFile(s));
}

std::shared_ptr<Client> Client::Connect(const ConnectArgs& a) {
  NetworkClientOptions o;
  o.tenant_salt = a.salt.value_or(a.tenant);
  o.timeout_ms = a.timeout_ms;
  o.connect_timeout_ms = a.connect_timeout_ms;
  o.refresh_ms = a.refresh_ms;
  o.client_id = a.client_id;
  if (a.coordinator) o.coordinator = *a.coordinator;
  if (!a.config.is_none()) {
    ClusterConfig c = LoadConfigArg(a.config);
    if (o.coordinator.empty()) {
      // $.coordinator.addresses (every coordinator, tried in turn), else host:port.
      o.coordinator = ConfigCoordinators(c.coordinator);
      if (o.coordinator.empty())
        Throw(InvalidArgument("the config's coordinator port is 0 (chosen at run time) and it lists no "
                              "$.coordinator.addresses: pass coordinator='host:port'"));
    }
    o.token = c.auth.token;
    o.ucx_progress = c.transport.ucx_progress;
    o.ucx_spin_us = c.transport.ucx_spin_us;
    o.ucx_local_reads = c.transport.ucx_local_reads;
  }
  if (a.token) {
    o.token = *a.token;
    o.tenant = a.tenant;  // a tenant of $.auth.tenants proving itself (empty: the cluster secret)
  }
  if (o.coordinator.empty()) Throw(InvalidArgument("Client needs coordinator='host:port' or a config"));
  Result<std::unique_ptr<NetworkClient>> net = [&] {
    py::gil_scoped_release nogil;
    return NetworkClient::Connect(o);
  }();
  std::shared_ptr<Client> c(new Client());
  c->network_ = Value(std::move(net));
  c->router_ = &c->network_->router();
  c->model_ = c->router_->model();
  return c;
}

void Client::StartEmbedded(py::handle config, const std::string& tenant) {
  ClusterConfig cfg = LoadConfigArg(config);
  RouterOptions ro;
  ro.tenant_salt = tenant;
  Result<std::unique_ptr<EmbeddedCluster>> e = [&] {
    py::gil_scoped_release nogil;
    return EmbeddedCluster::Start(cfg, ro);
  }();
  embedded_ = Value(std::move(e));
  router_ = &embedded_->router();
  model_ = router_->model();
}

Client::~Client() { Close(); }

void Client::Close() {
  std::vector<uint64_t> ids;
  for (const auto& r : regions_)
    if (r->registered) ids.push_back(r->id);
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(io_mu_);
    if (router_ != nullptr)
      for (uint64_t id : ids) (void)router_->UnregisterMemory(id);  // the router goes away next either way
    router_ = nullptr;
    closed_.store(true);
    network_.reset();
    embedded_.reset();
  }
  for (auto& r : regions_) r->registered = false;
  regions_.clear();
}

uint64_t Client::epoch() {
  return Io([&](Router& r) { return network_ ? network_->epoch() : r.epoch(); });
}

size_t Client::num_nodes() {
  return Io([&](Router&) { return network_ ? network_->num_nodes() : embedded_->num_nodes(); });
}

py::dict Client::stats() {
  RouterStats s = Io([](Router& r) { return r.Stats(); });
  py::dict d;
  d["puts"] = s.puts, d["put_blocks"] = s.put_blocks;
  d["gets"] = s.gets, d["get_blocks"] = s.get_blocks, d["get_hits"] = s.get_hits;
  d["match_calls"] = s.match_calls, d["match_blocks_asked"] = s.match_blocks_asked;
  d["match_blocks_hit"] = s.match_blocks_hit, d["node_errors"] = s.node_errors;
  return d;
}

std::shared_ptr<Region> Client::RegionOf(uintptr_t p, size_t n) const {
  for (const auto& r : regions_)
    if (r->registered && r->Contains(p, n)) return r;
  return nullptr;
}

void Client::CheckDevice(const Memory& m) const {
  if (!m.device()) return;
#if defined(KVMESH_HAVE_CUDA)
  std::shared_ptr<Region> r = RegionOf(reinterpret_cast<uintptr_t>(m.data()), m.size());
  if (r == nullptr || r->kind != MemoryKind::kDevice)
    Throw(InvalidArgument("a CUDA tensor must lie in memory registered with register() first"));
#else
  Throw(Unimplemented("CUDA tensors need kvmesh built with CUDA"));
#endif
}

std::vector<BlockKey> Client::Keys(py::handle tokens, const RequestOptions& o) {
  std::vector<TokenId> t = ToTokens(tokens);
  return Io([&](Router& r) { return r.Keys(t, o); });
}

size_t Client::MatchPrefix(py::handle tokens, const RequestOptions& o) {
  std::vector<TokenId> t = ToTokens(tokens);
  return Value(Io([&](Router& r) { return r.MatchPrefix(t, o); }));
}

void Client::Put(py::handle tokens, py::handle blocks, size_t first_block, const RequestOptions& o) {
  std::vector<TokenId> t = ToTokens(tokens);
  py::sequence bs = AsSequence(blocks, "blocks");
  const size_t full = t.size() / model_.block_tokens;
  if (first_block > full || py::len(bs) > full - first_block)
    Throw(InvalidArgument("blocks " + std::to_string(first_block) + ".." + std::to_string(first_block + py::len(bs)) +
                          " exceed the " + std::to_string(full) + " full blocks of the tokens"));
  std::vector<Memory> mem;
  std::vector<std::span<const std::byte>> spans;
  for (py::object b : bs) {  // held until Acquire holds it (see ToKeys)
    mem.push_back(Memory::Acquire(b, /*writable=*/false));
    CheckDevice(mem.back());
    spans.emplace_back(mem.back().data(), mem.back().size());
  }
  Check(Io([&](Router& r) { return r.Put(t, spans, o, first_block); }));
}

py::bytes Client::Get(py::handle key, const RequestOptions& o) {
  BlockKey k = ToKey(key);
  std::vector<std::byte> b = Value(Io([&](Router& r) { return r.Get(k, o); }));
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

std::vector<Memory> Client::Buffers(py::handle buffers, size_t n, bool writable, const char* call) const {
  py::sequence bs = AsSequence(buffers, "buffers");
  if (py::len(bs) != n) Throw(InvalidArgument(std::string(call) + " needs one buffer per key"));
  std::vector<Memory> mem;
  for (size_t i = 0; i < n; ++i) {
    mem.push_back(Memory::Acquire(bs[i], writable));
    CheckDevice(mem.back());
  }
  return mem;
}

template <typename Item, typename Call>
std::vector<ItemStatus> Client::Batch(const std::vector<BlockKey>& keys, const std::vector<std::span<std::byte>>& spans,
                                      Call call) {
  std::vector<Item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if constexpr (std::is_same_v<Item, GetItem>) {
      items[i] = GetItem{keys[i], spans[i], 0, {}};
    } else {
      items[i] = PutItem{keys[i], spans[i], {}};
    }
  }
  Check(Io([&](Router& r) { return call(r, items); }));
  return Statuses(items);
}

namespace {

std::vector<std::span<std::byte>> Spans(const std::vector<Memory>& mem) {
  std::vector<std::span<std::byte>> spans;
  spans.reserve(mem.size());
  for (const Memory& m : mem) spans.emplace_back(m.data(), m.size());
  return spans;
}

}  // namespace

std::vector<ItemStatus> Client::GetInto(py::handle keys, py::handle buffers, const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  std::vector<Memory> mem = Buffers(buffers, ks.size(), /*writable=*/true, "get_into");
  return Batch<GetItem>(ks, Spans(mem), [&](Router& r, std::vector<GetItem>& items) { return r.GetInto(items, o); });
}

std::vector<ItemStatus> Client::PutFrom(py::handle keys, py::handle buffers, const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  std::vector<Memory> mem = Buffers(buffers, ks.size(), /*writable=*/false, "put_from");
  return Batch<PutItem>(ks, Spans(mem), [&](Router& r, std::vector<PutItem>& items) { return r.PutFrom(items, o); });
}

namespace {

// (ptr, size) pairs from ptrs and sizes (a sequence, or one int for every item).
std::vector<std::pair<uintptr_t, size_t>> Ranges(py::handle ptrs, py::handle sizes, size_t n) {
  std::vector<uint64_t> p = ToU64s(ptrs, "ptrs");
  std::vector<uint64_t> s;
  if (PyLong_Check(sizes.ptr())) {
    s.assign(n, ToU64s(py::make_tuple(sizes), "sizes")[0]);
  } else {
    s = ToU64s(sizes, "sizes");
  }
  if (p.size() != n || s.size() != n) Throw(InvalidArgument("ptrs and sizes need one entry per key"));
  std::vector<std::pair<uintptr_t, size_t>> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {static_cast<uintptr_t>(p[i]), static_cast<size_t>(s[i])};
  return out;
}

}  // namespace

std::vector<std::span<std::byte>> Client::RegisteredSpans(const std::vector<std::pair<uintptr_t, size_t>>& ranges,
                                                          bool writable,
                                                          std::vector<std::shared_ptr<Region>>* hold) const {
  std::vector<std::span<std::byte>> spans(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    std::shared_ptr<Region> r = RegionOf(ranges[i].first, ranges[i].second);
    if (r == nullptr)
      Throw(InvalidArgument("item " + std::to_string(i) + ": the address range lies in no region registered here"));
    if (writable && !r->writable) Throw(InvalidArgument("item " + std::to_string(i) + ": the region is read-only"));
    if (hold->empty() || hold->back() != r) hold->push_back(r);
    spans[i] = std::span<std::byte>(reinterpret_cast<std::byte*>(ranges[i].first), ranges[i].second);
  }
  return spans;
}

std::vector<ItemStatus> Client::GetIntoPtrs(py::handle keys, py::handle ptrs, py::handle sizes,
                                            const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  std::vector<std::shared_ptr<Region>> hold;  // alive until the call returns
  std::vector<std::span<std::byte>> spans = RegisteredSpans(Ranges(ptrs, sizes, ks.size()), /*writable=*/true, &hold);
  return Batch<GetItem>(ks, spans, [&](Router& r, std::vector<GetItem>& items) { return r.GetInto(items, o); });
}

std::vector<ItemStatus> Client::PutFromPtrs(py::handle keys, py::handle ptrs, py::handle sizes,
                                            const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  std::vector<std::shared_ptr<Region>> hold;  // alive until the call returns
  std::vector<std::span<std::byte>> spans = RegisteredSpans(Ranges(ptrs, sizes, ks.size()), /*writable=*/false, &hold);
  return Batch<PutItem>(ks, spans, [&](Router& r, std::vector<PutItem>& items) { return r.PutFrom(items, o); });
}

std::vector<bool> Client::ExistsEach(py::handle keys, const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  std::vector<uint8_t> found(ks.size(), 0);
  Check(Io([&](Router& r) { return r.ExistsBatch(ks, found, o); }));
  return std::vector<bool>(found.begin(), found.end());
}

size_t Client::Exists(py::handle keys, const RequestOptions& o) {
  std::vector<bool> f = ExistsEach(keys, o);
  return static_cast<size_t>(std::find(f.begin(), f.end(), false) - f.begin());
}

void Client::Erase(py::handle keys, const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  Check(Io([&](Router& r) { return r.Erase(ks, o); }));
}

void Client::Release(py::handle keys, const RequestOptions& o) {
  std::vector<BlockKey> ks = ToKeys(keys);
  Check(Io([&](Router& r) { return r.Release(ks, o); }));
}

std::shared_ptr<Region> Client::Register(py::handle obj) {
  auto region = std::make_shared<Region>();
  try {
    region->memory = Memory::Acquire(obj, /*writable=*/true);
    region->writable = true;
  } catch (const StatusError&) {
    region->memory = Memory::Acquire(obj, /*writable=*/false);  // read-only: put_from only
    region->writable = false;
  }
  region->kind = region->memory.device() ? MemoryKind::kDevice : MemoryKind::kHost;
  region->base = region->memory.data();
  region->bytes = region->memory.size();
  MemoryRegion r = Value(Io([&](Router& rt) { return rt.RegisterMemory(region->base, region->bytes, region->kind); }));
  region->id = r.id;
  regions_.push_back(region);
  return region;
}

std::shared_ptr<Region> Client::Allocate(size_t bytes) {
  if (bytes == 0) Throw(InvalidArgument("allocate needs a size > 0"));
  auto region = std::make_shared<Region>();
  MemoryRegion r = Value(Io([&](Router& rt) { return rt.AllocateMemory(bytes, &region->allocated); }));
  region->id = r.id;
  region->base = r.base;
  region->bytes = r.bytes;
  regions_.push_back(region);
  return region;
}

void Client::Unregister(const std::shared_ptr<Region>& region) {
  auto it = std::find(regions_.begin(), regions_.end(), region);
  if (it == regions_.end() || !region->registered) Throw(NotFound("the region is not registered with this client"));
  // Forgotten here first, so no new call validates against it; calls already
  // validated hold the region (and its memory) until they return.
  regions_.erase(it);
  region->registered = false;
  Status s;
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::shared_mutex> lock(io_mu_);  // waits for calls in flight
    s = router_ != nullptr ? router_->UnregisterMemory(region->id) : FailedPrecondition("the client is closed");
  }
  Check(s);
}

SequenceHandle Client::CreateSequence(py::handle prefix, std::optional<size_t> max_blocks, const RequestOptions& o) {
  std::vector<TokenId> t = ToTokens(prefix);
  return Value(Io([&](Router& r) { return r.CreateSequence(t, o, max_blocks.value_or(SIZE_MAX)); }));
}

uint32_t Client::AppendSequence(const SequenceHandle& h, py::handle tokens, py::handle k, py::handle v,
                                const RequestOptions& o) {
  std::vector<TokenId> t = ToTokens(tokens);
  Memory km = Memory::Acquire(k, false), vm = Memory::Acquire(v, false);
  if (km.device() || vm.device()) Throw(InvalidArgument("sequence K and V must be in host memory"));
  const size_t want = BlockLayout{h.layers, h.heads, model_.block_tokens, model_.head_dim, model_.dtype}.side_bytes(t.size());
  if (km.size() != want || vm.size() != want)
    Throw(InvalidArgument("K and V must each hold " + std::to_string(want) + " bytes ([layer][n][heads][head_dim])"));
  std::span<const std::byte> ks(km.data(), km.size()), vs(vm.data(), vm.size());
  return Value(Io([&](Router& r) { return r.AppendSequence(h, t, ks, vs, o); }));
}

void Client::TruncateSequence(const SequenceHandle& h, uint32_t n, const RequestOptions& o) {
  Check(Io([&](Router& r) { return r.TruncateSequence(h, n, o); }));
}

SequenceHandle Client::ForkSequence(const SequenceHandle& h, const RequestOptions& o) {
  return Value(Io([&](Router& r) { return r.ForkSequence(h, o); }));
}

void Client::ReleaseSequence(const SequenceHandle& h, const RequestOptions& o) {
  Check(Io([&](Router& r) { return r.ReleaseSequence(h, o); }));
}

py::dict Client::SequenceInfo(const SequenceHandle& h, const RequestOptions& o) {
  SequenceState s = Value(Io([&](Router& r) { return r.SequenceInfo(h, o); }));
  py::dict d;
  d["length"] = s.length;
  d["sealed_blocks"] = s.sealed_blocks;
  d["tokens"] = py::cast(s.tokens);
  return d;
}

py::tuple Client::ReadSequence(const SequenceHandle& h, uint32_t from, uint32_t n, const RequestOptions& o) {
  std::vector<std::byte> k, v;
  Check(Io([&](Router& r) { return r.ReadSequence(h, from, n, &k, &v, o); }));
  return py::make_tuple(py::bytes(reinterpret_cast<const char*>(k.data()), k.size()),
                        py::bytes(reinterpret_cast<const char*>(v.data()), v.size()));
}

}  // namespace kvmesh::python
