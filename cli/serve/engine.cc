#include "cli/serve/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <list>
#include <unordered_map>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kvmesh::serve {

// ---- LinkEstimate ---------------------------------------------------------------

namespace {

// The median of v[0, n) (n > 0), reordering it; the mean of the middle two for even n.
double MedianInPlace(double* v, size_t n) {
  std::nth_element(v, v + n / 2, v + n);
  const double hi = v[n / 2];
  if (n % 2) return hi;
  return (*std::max_element(v, v + n / 2) + hi) / 2;
}

constexpr double kMinCost = 1e-15;  // seconds per byte (1 PB/s): keeps bytes_per_s finite

}  // namespace

LinkEstimate::LinkEstimate(double latency_s, double seconds_per_byte, double probe_interval_s,
                           double deviation_share)
    : latency_s_(std::max(latency_s, 0.0)), cost_(std::max(seconds_per_byte, kMinCost)), dev_(deviation_share),
      probe_interval_s_(probe_interval_s) {}

double LinkEstimate::Estimate(double bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return latency_s_ + bytes * cost_ * (1 + 2 * DeviationLocked());
}

double LinkEstimate::DeviationLocked() const {
  // The second largest slowness of the window's loads: one outlier in the
  // window is forgiven, a second is not. The fitted line, a median over the
  // window, follows a link that slowed for good only after half the window;
  // this follows it after two loads, and stays cautious while the window
  // holds two slow loads (a tier with a heavy tail, as an SSD behind a host
  // tier: one load in a pressure run at 8.7x recomputing when only the last
  // three loads counted).
  double first = 0, second = 0;
  for (size_t i = 0; i < slow_held_; ++i) {
    second = std::max(second, std::min(first, slow_[i]));
    first = std::max(first, slow_[i]);
  }
  return std::max(dev_, second);
}

void LinkEstimate::Observe(double bytes, double seconds) {
  if (bytes <= 0 || seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  // The error against what was expected before this load (its forecast), as
  // a share of it, as a TCP retransmission timer weighs its RTT samples,
  // winsorized: one load counts at most max(3 x the deviation, 0.5), so a
  // single outlier (the first get after a store: 12-15x over UCX on the VM)
  // makes the estimate somewhat more cautious, not 8x (it added 14 / 4).
  const double expected = latency_s_ + bytes * cost_;
  const double error = (seconds - expected) / expected;
  constexpr double kWeight = 0.25, kCapTimes = 3, kCapFloor = 0.5;
  dev_ = (1 - kWeight) * dev_ + kWeight * std::min(std::abs(error), std::max(kCapTimes * dev_, kCapFloor));
  // The unclipped slowness of the window's loads: a link that really slowed,
  // or slows often, shows in two of them (DeviationLocked), one outlier does not.
  slow_[slow_next_] = std::max(error, 0.0);
  slow_next_ = (slow_next_ + 1) % slow_.size();
  slow_held_ = std::min(slow_held_ + 1, slow_.size());
  AddLocked(bytes, seconds);
  ++observed_;
}

void LinkEstimate::Seed(double bytes, double seconds) {
  if (bytes <= 0 || seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  AddLocked(bytes, seconds);
}

void LinkEstimate::AddLocked(double bytes, double seconds) {
  window_[next_] = Load{bytes, seconds};
  next_ = (next_ + 1) % kWindow;
  held_ = std::min(held_ + 1, kWindow);
  FitLocked();
}

void LinkEstimate::FitLocked() {
  // Fixed-size scratch: no allocation under the lock (Observe is on the load path).
  std::array<double, kWindow*(kWindow - 1) / 2> slopes;
  std::array<double, kWindow> rest;
  size_t n = 0;
  for (size_t i = 0; i < held_; ++i)
    for (size_t j = i + 1; j < held_; ++j) {
      const Load& lo = window_[i].bytes < window_[j].bytes ? window_[i] : window_[j];
      const Load& hi = window_[i].bytes < window_[j].bytes ? window_[j] : window_[i];
      if (hi.bytes >= 1.5 * lo.bytes) slopes[n++] = (hi.seconds - lo.seconds) / (hi.bytes - lo.bytes);
    }
  if (n > 0) {
    const double slope = MedianInPlace(slopes.data(), n);
    if (slope > kMinCost) {
      for (size_t i = 0; i < held_; ++i) rest[i] = window_[i].seconds - slope * window_[i].bytes;
      cost_ = slope;
      latency_s_ = std::max(MedianInPlace(rest.data(), held_), 0.0);
      return;
    }
  }
  // One size (or sizes whose times do not rise with them): the intercept
  // cannot be told from these loads; keep it and fit the slope.
  for (size_t i = 0; i < held_; ++i) rest[i] = std::max(window_[i].seconds - latency_s_, 0.0) / window_[i].bytes;
  cost_ = std::max(MedianInPlace(rest.data(), held_), kMinCost);
}

bool LinkEstimate::ClaimProbe(double now_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (now_s - last_probe_s_ < probe_interval_s_) return false;
  last_probe_s_ = now_s;
  return true;
}

double LinkEstimate::latency_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latency_s_;
}

double LinkEstimate::bytes_per_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cost_ > 0 ? 1 / cost_ : 0;
}

double LinkEstimate::deviation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return DeviationLocked();
}

uint64_t LinkEstimate::observed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return observed_;
}

void DecisionCounters::Add(const DecisionCounters& o) {
  lookups += o.lookups;
  runs += o.runs;
  runs_loaded += o.runs_loaded;
  runs_recomputed += o.runs_recomputed;
  blocks_loaded += o.blocks_loaded;
  blocks_recomputed += o.blocks_recomputed;
  load_misses += o.load_misses;
  est_load_s += o.est_load_s;
  est_recompute_s += o.est_recompute_s;
  charged_load_s += o.charged_load_s;
  loads_slower += o.loads_slower;
  load_loss_s += o.load_loss_s;
  bytes_loaded += o.bytes_loaded;
  bytes_put += o.bytes_put;
  put_errors += o.put_errors;
  get_errors += o.get_errors;
  decided_s += o.decided_s;
  loads_over_bound += o.loads_over_bound;
  worst_load_ratio = std::max(worst_load_ratio, o.worst_load_ratio);
  shadow_loads += o.shadow_loads;
  shadow_load_s += o.shadow_load_s;
  lookup_wait_s += o.lookup_wait_s;
  lookup_rpc_s += o.lookup_rpc_s;
  lookup_timeouts += o.lookup_timeouts;
}

// ---- the engine's own prefix cache: an LRU over chained block hashes ---------------

class Engine::LocalCache {
 public:
  LocalCache(size_t capacity, LocalCacheListener listener) : capacity_(capacity), listener_(std::move(listener)) {}
  // Leading blocks of `chain` held (each refreshed).
  size_t Match(const std::vector<uint64_t>& chain) {
    size_t n = 0;
    while (n < chain.size()) {
      auto it = where_.find(chain[n]);
      if (it == where_.end()) break;
      order_.splice(order_.begin(), order_, it->second);
      ++n;
    }
    return n;
  }
  void Insert(const std::vector<uint64_t>& chain, size_t upto) {
    if (capacity_ == 0) return;
    stored_.clear();
    removed_.clear();
    for (size_t i = 0; i < std::min(upto, chain.size()); ++i) {
      auto it = where_.find(chain[i]);
      if (it != where_.end()) {
        order_.splice(order_.begin(), order_, it->second);
        continue;
      }
      order_.push_front(chain[i]);
      where_[chain[i]] = order_.begin();
      if (listener_) stored_.push_back(chain[i]);
      if (order_.size() > capacity_) {
        if (listener_) removed_.push_back(order_.back());
        where_.erase(order_.back());
        order_.pop_back();
      }
    }
    if (listener_ && (!stored_.empty() || !removed_.empty())) listener_(stored_, removed_);
  }

 private:
  size_t capacity_;
  LocalCacheListener listener_;
  std::vector<uint64_t> stored_, removed_;  // one Insert's changes, for the listener
  std::list<uint64_t> order_;  // most recent first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

std::vector<uint64_t> BlockChain(const std::vector<TokenId>& tokens, uint32_t block_tokens) {
  std::vector<uint64_t> out;
  uint64_t h = 1469598103934665603ull;
  for (size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    for (size_t i = b * block_tokens; i < (b + 1) * block_tokens; ++i) {
      h ^= static_cast<uint64_t>(tokens[i]);
      h *= 1099511628211ull;
    }
    out.push_back(h);
  }
  return out;
}

namespace {

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace


Engine::Engine(uint32_t index, EngineOptions o, const std::vector<ServeRequest>* requests,
               std::vector<RequestRecord>* records)
    : index_(index), o_(std::move(o)), requests_(requests), records_(records),
      local_(std::make_unique<LocalCache>(o_.mode == CacheMode::kRecompute ? 0 : o_.local_cache_blocks,
                                          o_.on_local_cache)) {
  if (o_.reference) compute_ = std::make_unique<ReferenceCompute>(o_.reference);
  if (o_.router) {
    const size_t moved = o_.router->model().FullBlockBytes();
    payload_.assign(moved, std::byte{0x5a});
  }
  remote_ = std::make_unique<std::atomic<int64_t>[]>(requests_->size());
  for (size_t i = 0; i < requests_->size(); ++i) remote_[i].store(-1, std::memory_order_relaxed);
}

Engine::~Engine() {
  Abort();
  Join();
}

void Engine::Start() {
  thread_ = std::thread([this] { Loop(); });
  if (o_.mode == CacheMode::kKvmesh) {
    put_thread_ = std::thread([this] { PutLoop(); });
    load_thread_ = std::thread([this] { LoadLoop(); });
    if (o_.router) lookup_thread_ = std::thread([this] { LookupLoop(); });
  }
}

void Engine::Submit(size_t request) {
  if (lookup_thread_.joinable()) {  // the lookup starts now, while the engine's step goes on
    {
      std::lock_guard<std::mutex> lock(lookup_mu_);
      lookups_.push_back(request);
    }
    lookup_cv_.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(request);
  }
  cv_.notify_one();
}

void Engine::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finishing_ = true;
  }
  cv_.notify_one();
}

void Engine::Abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = finishing_ = true;
  }
  cv_.notify_one();
}

void Engine::Join() {
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(lookup_mu_);
    lookup_stop_ = true;
  }
  lookup_cv_.notify_one();
  if (lookup_thread_.joinable()) lookup_thread_.join();
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    load_stop_ = true;
  }
  load_cv_.notify_one();
  if (load_thread_.joinable()) load_thread_.join();
  {
    std::lock_guard<std::mutex> lock(put_mu_);
    put_stop_ = true;
  }
  put_cv_.notify_one();
  if (put_thread_.joinable()) put_thread_.join();
  counters_.bytes_put = bytes_put_.load();
  counters_.put_errors = put_errors_.load();
  counters_.get_errors += load_errors_.load();
  counters_.shadow_loads = shadow_loads_.load();
  counters_.shadow_load_s = shadow_load_us_.load() / 1e6;
  counters_.lookup_rpc_s = lookup_rpc_us_.load() / 1e6;
  counters_.get_errors += lookup_errors_.load();
}

void Engine::LookupLoop() {
  for (;;) {
    size_t i;
    {
      std::unique_lock<std::mutex> lock(lookup_mu_);
      lookup_cv_.wait(lock, [&] { return lookup_stop_ || !lookups_.empty(); });
      if (lookup_stop_) return;
      i = lookups_.front();
      lookups_.pop_front();
    }
    const auto t0 = std::chrono::steady_clock::now();
    const Result<size_t> held = o_.router->MatchPrefix((*requests_)[i].prompt);
    lookup_rpc_us_.fetch_add(uint64_t(Seconds(std::chrono::steady_clock::now() - t0) * 1e6));
    if (!held.ok()) lookup_errors_.fetch_add(1);
    remote_[i].store(held.ok() ? int64_t(*held) : 0, std::memory_order_release);  // AwaitLookup spins on it
  }
}

std::optional<size_t> Engine::AwaitLookup(size_t i, double wait_s) {
  // Spins rather than sleeps: the budget is a few per cent of a prefill (a
  // millisecond or two), and a thread woken from a timed sleep on a busy
  // 2-core machine came back tens of milliseconds late (a request at 1.65x
  // of recomputing in a quiet pressure run), where a spinning thread keeps
  // its core. The cost is at most the budget, per request that waits.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(wait_s, 0.0)));
  for (;;) {
    const int64_t v = remote_[i].load(std::memory_order_acquire);
    if (v >= 0) return size_t(v);
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

double Engine::RecomputeSeconds(uint64_t new_tokens, uint64_t cached_tokens) const {
  return o_.reference ? o_.reference->PrefillSeconds(new_tokens, cached_tokens)
                      : o_.model->PrefillSeconds(new_tokens, cached_tokens);
}

double Engine::RealBlockBytes() const {
  return double(o_.model->model().KvBytesPerToken()) * o_.block_tokens;
}

double Engine::Now() const { return Seconds(std::chrono::steady_clock::now() - o_.origin); }

bool Engine::Admit(Live& r) {
  const ServeRequest& q = (*requests_)[r.index];
  RequestRecord& rec = (*records_)[r.index];
  if (r.looked_up) {  // back from the loader
    const double real_block = RealBlockBytes();
    counters_.load_misses += r.load_count - r.got;
    counters_.blocks_loaded += r.got;
    counters_.charged_load_s += r.charged_load_s;
    counters_.bytes_loaded += uint64_t(r.got * real_block);
    counters_.decided_s += r.charged_load_s;
    if (r.charged_load_s > r.est_recompute_s) {
      ++counters_.loads_slower;
      counters_.load_loss_s += r.charged_load_s - r.est_recompute_s;
    }
    if (r.charged_load_s > 1.05 * r.est_recompute_s) ++counters_.loads_over_bound;
    if (r.est_recompute_s > 0)
      counters_.worst_load_ratio = std::max(counters_.worst_load_ratio, r.charged_load_s / r.est_recompute_s);
    rec.loaded_tokens = static_cast<uint32_t>(r.got * o_.block_tokens);
    r.cached_tokens = uint64_t(r.local_blocks + r.got) * o_.block_tokens;
    r.new_tokens = q.prompt.size() - r.cached_tokens;
    // Its path: the lookup wait, the decision to this admission (the load,
    // its queue and the wait for the step it joins), then the prefill of the rest.
    rec.kvmesh_path_s = r.lookup_wait_s + (Now() - r.decided_at) + RecomputeSeconds(r.new_tokens, r.cached_tokens);
    return true;
  }
  std::vector<TokenId> all = q.prompt;
  all.insert(all.end(), q.output.begin(), q.output.end());
  r.chain = BlockChain(all, o_.block_tokens);
  const size_t prompt_blocks = q.prompt.size() / o_.block_tokens;
  std::vector<uint64_t> prompt_chain(r.chain.begin(), r.chain.begin() + prompt_blocks);
  // At least the last prompt token is computed (it yields the first token).
  const size_t usable = q.prompt.size() % o_.block_tokens == 0 && prompt_blocks > 0 ? prompt_blocks - 1
                                                                                     : prompt_blocks;
  const size_t local = std::min(local_->Match(prompt_chain), usable);
  rec.local_hit_tokens = static_cast<uint32_t>(local * o_.block_tokens);
  r.cached_tokens = uint64_t(local) * o_.block_tokens;
  r.new_tokens = q.prompt.size() - r.cached_tokens;
  if (o_.mode != CacheMode::kKvmesh || !o_.router) return true;
  // The lookup started at arrival; wait for it at most lookup_wait_share of
  // recomputing what the local cache does not hold.
  // A wait can still end late (the spinning thread preempted): the budget
  // leaves room for how late the recent ones ended (an EWMA of the overshoot
  // that rises fast and falls slowly: pessimistic, like LinkEstimate).
  const double recompute_all = RecomputeSeconds(r.new_tokens, r.cached_tokens);
  const double budget = o_.lookup_wait_share * recompute_all - wake_late_s_;
  const auto w0 = std::chrono::steady_clock::now();
  const std::optional<size_t> remote = AwaitLookup(r.index, budget);
  r.lookup_wait_s = Seconds(std::chrono::steady_clock::now() - w0);
  if (!remote && budget > 0) {
    const double late = std::max(r.lookup_wait_s - budget, 0.0);
    const double weight = late > wake_late_s_ ? 0.5 : 0.1;
    wake_late_s_ = (1 - weight) * wake_late_s_ + weight * late;
  }
  ++counters_.lookups;
  counters_.lookup_wait_s += r.lookup_wait_s;
  if (!remote) {
    ++counters_.lookup_timeouts;
    r.lookup_late = true;
  }
  r.remote_blocks = remote.value_or(0);
  rec.recompute_path_s = recompute_all;
  rec.kvmesh_path_s = r.lookup_wait_s + recompute_all;
  const size_t end = std::min(r.remote_blocks, usable);
  if (end <= local) return true;
  const uint64_t run_blocks = end - local;
  const double real_block = RealBlockBytes();
  const double est_load = o_.link->Estimate(run_blocks * real_block);
  const double est_recompute =
      RecomputeSeconds(run_blocks * o_.block_tokens, uint64_t(local) * o_.block_tokens);
  ++counters_.runs;
  counters_.est_load_s += est_load;
  counters_.est_recompute_s += est_recompute;
  if (o_.policy == LoadPolicy::kDecide && est_load >= est_recompute) {
    ++counters_.runs_recomputed;
    counters_.blocks_recomputed += run_blocks;
    counters_.decided_s += est_recompute;
    rec.run = 2;
    // Keep learning: measure (part of) this run's load, wait for nobody.
    if (o_.link->ClaimProbe(Now())) ShadowLoad(r.index, local, std::min<size_t>(run_blocks, o_.shadow_max_blocks));
    return true;
  }
  ++counters_.runs_loaded;
  rec.run = 1;
  r.looked_up = true;
  r.local_blocks = local;
  r.load_count = run_blocks;
  r.est_recompute_s = est_recompute;
  r.decided_at = Now();
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    loads_.push_back(std::move(r));
  }
  ++loads_in_flight_;  // engine thread only
  load_cv_.notify_one();
  return false;
}

void Engine::LoadLoop() {
  // Loads land in the engine's KV pool: memory registered with the router
  // (AllocateMemory, as an engine registers its pool; over UCX on one host
  // the node writes into it one-sided), grown when a load needs more.
  MemoryRegion pool;
  for (;;) {
    Live r;
    {
      std::unique_lock<std::mutex> lock(load_mu_);
      load_cv_.wait(lock, [&] { return load_stop_ || !loads_.empty(); });
      if (load_stop_) return;
      r = std::move(loads_.front());
      loads_.pop_front();
    }
    const ServeRequest& q = (*requests_)[r.index];
    const std::vector<BlockKey> keys = o_.router->Keys(q.prompt);
    const size_t moved = payload_.size();
    if (pool.bytes < r.load_count * moved) {
      if (pool.base) (void)o_.router->UnregisterMemory(pool.id);
      pool = MemoryRegion{};
      Result<MemoryRegion> grown = o_.router->AllocateMemory(std::max<size_t>(r.load_count, 256) * moved);
      if (grown.ok()) {
        pool = *grown;
        std::fill(pool.base, pool.base + pool.bytes, std::byte{0});  // touched before loads are timed
      }
    }
    std::vector<std::byte> unregistered;  // only when the pool could not be had
    if (!pool.base) unregistered.resize(r.load_count * moved);
    std::byte* dst = pool.base ? pool.base : unregistered.data();
    std::vector<GetItem> items(r.load_count);
    for (size_t i = 0; i < r.load_count; ++i) {
      items[i].key = keys[r.local_blocks + i];
      items[i].dst = std::span<std::byte>(dst + i * moved, moved);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = o_.router->GetInto(items).ok();
    r.measured_load_s = Seconds(std::chrono::steady_clock::now() - t0);
    r.charged_load_s = r.measured_load_s * o_.kv_scale;
    // The rest of the charged time passes here, off the engine's step.
    std::this_thread::sleep_for(std::chrono::duration<double>(r.charged_load_s - r.measured_load_s));
    while (r.got < r.load_count && items[r.got].status.ok()) ++r.got;
    const double real_block = RealBlockBytes();
    o_.link->Observe(r.load_count * real_block, r.charged_load_s);
    if (!ok) load_errors_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(r));
    }
    cv_.notify_one();
  }
}

void Engine::ShadowLoad(size_t request, size_t first_block, size_t blocks) {
  {
    std::lock_guard<std::mutex> lock(put_mu_);
    puts_.push_back(PutJob{request, first_block, first_block + blocks, /*shadow=*/true});
  }
  put_cv_.notify_one();
}

void Engine::StoreBlocks(Live& r, size_t upto_tokens) {
  const size_t end = std::min(upto_tokens / o_.block_tokens, r.chain.size());
  local_->Insert(r.chain, end);
  if (r.lookup_late) {  // its lookup came back after admission: what kvmesh holds needs no put
    const int64_t held = remote_[r.index].load();
    if (held >= 0) {
      r.remote_blocks = std::max(r.remote_blocks, size_t(held));
      r.lookup_late = false;
    }
  }
  if (o_.mode != CacheMode::kKvmesh || end <= r.remote_blocks) return;
  {
    std::lock_guard<std::mutex> lock(put_mu_);
    puts_.push_back(PutJob{r.index, r.remote_blocks, end});
  }
  put_cv_.notify_one();
  r.remote_blocks = end;
}

void Engine::PutLoop() {
  // Offload and shadow loads wait for nobody: below the engine's step and
  // loads in scheduling priority (Linux: a thread's nice value is its own).
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 10);
  std::vector<std::byte> scratch;
  for (;;) {
    PutJob job;
    {
      std::unique_lock<std::mutex> lock(put_mu_);
      put_cv_.wait(lock, [&] { return put_stop_ || !puts_.empty(); });
      if (puts_.empty()) return;
      job = puts_.front();
      puts_.pop_front();
    }
    const ServeRequest& q = (*requests_)[job.request];
    if (job.shadow) {  // measured for the estimate, then dropped
      const std::vector<BlockKey> keys = o_.router->Keys(q.prompt);
      const size_t moved = payload_.size(), n = job.end_block - job.first_block;
      scratch.resize(n * moved);
      std::vector<GetItem> items(n);
      for (size_t i = 0; i < n; ++i) {
        items[i].key = keys[job.first_block + i];
        items[i].dst = std::span<std::byte>(scratch.data() + i * moved, moved);
      }
      const auto t0 = std::chrono::steady_clock::now();
      if (!o_.router->GetBatch(items).ok()) load_errors_.fetch_add(1);
      const double charged = Seconds(std::chrono::steady_clock::now() - t0) * o_.kv_scale;
      o_.link->Observe(n * RealBlockBytes(), charged);
      shadow_loads_.fetch_add(1);
      shadow_load_us_.fetch_add(uint64_t(charged * 1e6));
      continue;
    }
    std::vector<TokenId> all = q.prompt;
    all.insert(all.end(), q.output.begin(), q.output.end());
    std::vector<std::span<const std::byte>> blocks(job.end_block - job.first_block,
                                                   std::span<const std::byte>(payload_));
    if (!o_.router->Put(all, blocks, RequestOptions{}, job.first_block).ok()) put_errors_.fetch_add(1);
    const double real_block = RealBlockBytes();
    bytes_put_.fetch_add(uint64_t(blocks.size() * real_block));
  }
}

void Engine::Loop() {
  std::deque<Live> waiting;
  std::vector<Live> running;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (running.empty() && waiting.empty())
        cv_.wait(lock, [&] {
          return aborted_ || !inbox_.empty() || !ready_.empty() || (finishing_ && loads_in_flight_ == 0);
        });
      if (aborted_) return;
      for (Live& r : ready_) {  // loaded: first in line
        waiting.push_front(std::move(r));
        --loads_in_flight_;
      }
      ready_.clear();
      for (size_t i : inbox_) {
        Live l;
        l.index = i;
        waiting.push_back(std::move(l));
      }
      inbox_.clear();
      if (running.empty() && waiting.empty() && finishing_ && loads_in_flight_ == 0) return;
    }
    std::vector<Live> admitted;
    uint64_t budget = o_.max_prefill_tokens;
    while (!waiting.empty() && running.size() + admitted.size() < o_.max_batch) {
      const size_t len = (*requests_)[waiting.front().index].prompt.size();
      if (!admitted.empty() && len > budget) break;  // a long prompt waits for a step of its own
      Live r = std::move(waiting.front());
      waiting.pop_front();
      if (!Admit(r)) continue;  // its prefix is loading
      budget -= std::min<uint64_t>(budget, r.new_tokens);
      admitted.push_back(std::move(r));
    }
    if (admitted.empty() && running.empty()) continue;  // everything waits for loads
    std::vector<PrefillWork> prefills;
    for (const Live& r : admitted) prefills.push_back(PrefillWork{r.new_tokens, r.cached_tokens});
    std::vector<uint64_t> decodes;
    for (const Live& r : running)
      decodes.push_back((*requests_)[r.index].prompt.size() + r.generated);
    if (compute_) {  // the reference model computes the step for real; it takes what it takes
      for (Live& r : admitted) r.seq = compute_->Prefill((*requests_)[r.index].prompt, r.cached_tokens);
      for (Live& r : running) {
        const ServeRequest& q = (*requests_)[r.index];
        compute_->Decode(r.seq, q.output[std::min<size_t>(r.generated - 1, q.output.size() - 1)]);
      }
    } else {
      const double model_s = o_.model->StepSeconds(prefills, decodes);
      std::this_thread::sleep_for(std::chrono::duration<double>(model_s));
    }
    const double t = Now();
    std::vector<Live> still;
    for (Live& r : running) {
      ++r.generated;
      const ServeRequest& q = (*requests_)[r.index];
      if (r.generated >= q.output.size()) {
        (*records_)[r.index].finish = t;
        StoreBlocks(r, q.prompt.size() + q.output.size());
        if (compute_) compute_->Release(r.seq);
        finished_.fetch_add(1, std::memory_order_relaxed);
      } else {
        still.push_back(std::move(r));
      }
    }
    running = std::move(still);
    for (Live& r : admitted) {
      const ServeRequest& q = (*requests_)[r.index];
      RequestRecord& rec = (*records_)[r.index];
      rec.first_token = t;
      rec.engine = index_;
      r.generated = 1;
      StoreBlocks(r, q.prompt.size());
      if (r.generated >= q.output.size()) {
        rec.finish = t;
        StoreBlocks(r, q.prompt.size() + q.output.size());
        if (compute_) compute_->Release(r.seq);
        finished_.fetch_add(1, std::memory_order_relaxed);
      } else {
        running.push_back(std::move(r));
      }
    }
  }
}

}  // namespace kvmesh::serve
