#include "soak.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>

namespace kvmesh::soak {

const char* OpName(int op) {
  static const char* const kNames[kNumOps] = {"match_prefix", "get_batch",  "put",       "get_unknown_keys",
                                              "seq_create",   "seq_append", "seq_truncate", "seq_fork",
                                              "seq_read",     "seq_info",   "seq_release",  "fill_put",
                                              "probe"};
  return op >= 0 && op < kNumOps ? kNames[op] : "?";
}

bool Context::Count(int op, const Status& s, SteadyClock::time_point t0, std::initializer_list<StatusCode> refusals) {
  OpStats& os = st.ops[op];
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t0).count();
  os.calls++;
  uint64_t prev = os.max_us.load();
  while (static_cast<uint64_t>(us) > prev && !os.max_us.compare_exchange_weak(prev, static_cast<uint64_t>(us))) {
  }
  if (us > o.timeout_ms * 1000) os.over_timeout++;
  if (us > (o.timeout_ms + o.timeout_margin_ms) * 1000) {
    inv.Violation("timeout", std::string(OpName(op)) + " took " + std::to_string(us / 1000) + " ms (timeout " +
                                 std::to_string(o.timeout_ms) + " ms + margin " + std::to_string(o.timeout_margin_ms) +
                                 "): " + s.ToString());
  }
  const auto code = static_cast<size_t>(s.code()) & 15;
  if (s.ok()) {
    os.ok++;
    return true;
  }
  if (IsMiss(s)) {
    os.miss[code]++;
    return false;
  }
  for (StatusCode r : refusals) {
    if (s.code() == r) {
      os.refused[code]++;
      return false;
    }
  }
  if (StaleRefusal(s)) {
    os.refused[code]++;
    return false;
  }
  inv.Violation("error_class", std::string(OpName(op)) + " returned " + s.ToString());
  return false;
}

bool Context::StaleRefusal(const Status& s) {
  if (!o.stale_epoch_refusal || s.code() != StatusCode::kStaleEpoch) return false;
  st.stale_epoch++;
  return true;
}

void Context::NoteSeqId(const std::string& node_id, uint64_t id) {
  std::lock_guard<std::mutex> lock(ids_mu_);
  if (seq_ids_total_ >= (size_t{4} << 20)) return;  // bounded memory: 4 Mi ids are plenty
  if (!seq_ids_[node_id].insert(id).second) {
    inv.Violation("seq_id_reuse", "node " + node_id + " handed out sequence id " + std::to_string(id) +
                                      " again (after a restart): handles from before it reach the new sequence");
    return;
  }
  ++seq_ids_total_;
}

void Context::PushHitRate(double rate) {
  std::lock_guard<std::mutex> lock(hit_mu_);
  hit_rates_.push_back(rate);
}

std::vector<double> Context::HitRates() const {
  std::lock_guard<std::mutex> lock(hit_mu_);
  return hit_rates_;
}

void Invariants::Violation(const std::string& kind, const std::string& what) {
  const double t = std::chrono::duration<double>(SteadyClock::now() - start_).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  ++by_kind_[kind];
  if (first_.size() < 50) first_.push_back({{"t_s", t}, {"kind", kind}, {"what", what}});
  if (by_kind_[kind] <= 5) std::fprintf(stderr, "soak: VIOLATION at %.1fs [%s] %s\n", t, kind.c_str(), what.c_str());
}

size_t Invariants::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

nlohmann::json Invariants::Json() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"total", total_}, {"by_kind", by_kind_}, {"first", first_}};
}

uint32_t CountFds() {
  uint32_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    --n;  // the directory stream's own fd
  }
  return n;
}

uint32_t CountThreads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return static_cast<uint32_t>(std::stoul(line.substr(8)));
  return 0;
}

std::map<std::string, uint32_t> FdKinds() {
  std::map<std::string, uint32_t> kinds;
  std::vector<std::string> names;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    ::closedir(d);
  }
  for (const std::string& n : names) {
    char target[256];
    const ssize_t len = ::readlink(("/proc/self/fd/" + n).c_str(), target, sizeof(target) - 1);
    if (len <= 0) continue;  // the closed directory stream
    std::string t(target, static_cast<size_t>(len));
    const size_t colon = t.find(':');
    kinds[t[0] == '/' ? "file" : t.substr(0, colon)]++;
  }
  return kinds;
}

}  // namespace kvmesh::soak
