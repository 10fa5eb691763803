#include "cli/serve/engine_proc.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "cli/serve/bench_serve.h"
#include "common/spawn.h"
#include "eviction/replay.h"
#include "kvmesh/network.h"

namespace kvmesh::serve {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(WorkloadOptions, rate, duration_s, turns, think_s, agent_share, system_prompts,
                                   system_tokens, agent_preamble_tokens, user_tokens, tool_tokens, output_tokens, seed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TraceWindow, start_s, duration_s, speed, max_output)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(EngineProcConfig, index, engine_model, mfu, mbu, block_tokens, max_batch, kv_scale,
                                   local_cache_blocks, max_prefill_tokens, mode, policy, coordinator, salt, nodes,
                                   link_latency_s, link_seconds_per_byte, probe_interval_s, kv_events, workload,
                                   trace_path, trace, schedule_hash, link_deviation_share)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(DecisionCounters, lookups, runs, runs_loaded, runs_recomputed, blocks_loaded,
                                   blocks_recomputed, load_misses, est_load_s, est_recompute_s, charged_load_s,
                                   loads_slower, load_loss_s, bytes_loaded, bytes_put, put_errors, get_errors,
                                   decided_s, loads_over_bound, worst_load_ratio, shadow_loads, shadow_load_s,
                                   lookup_wait_s, lookup_rpc_s, lookup_timeouts)

json ToJson(const EngineProcConfig& c) { return json(c); }

uint64_t ScheduleHash(const std::vector<ServeRequest>& requests) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const ServeRequest& r : requests) {
    mix(uint64_t(std::llround(r.arrival_s * 1e9)));
    mix(r.prompt.size());
    for (TokenId t : r.prompt) mix(t);
    mix(r.output.size());
  }
  return h;
}

namespace {

// Whole lines from a blocking fd; false at end of input or on an error.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  bool Next(std::string* line) {
    for (;;) {
      const size_t nl = buf_.find('\n', pos_);
      if (nl != std::string::npos) {
        line->assign(buf_, pos_, nl - pos_);
        pos_ = nl + 1;
        return true;
      }
      buf_.erase(0, pos_);
      pos_ = 0;
      char chunk[65536];
      const ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(chunk, size_t(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
  size_t pos_ = 0;
};

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  ::strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

}  // namespace

Result<std::unique_ptr<EngineProcess>> EngineProcess::Start(const std::string& kvmesh_bin,
                                                            const EngineProcConfig& config,
                                                            const std::string& log_path,
                                                            LocalCacheListener listener, double timeout_s) {
  // A write to a child that died must fail with EPIPE, not kill the harness.
  ::signal(SIGPIPE, SIG_IGN);
  KVMESH_ASSIGN_OR_RETURN(const SpawnedChild c,
                          SpawnWithStdoutPipe({kvmesh_bin, "serve-engine"}, log_path, false, /*pipe_stdin=*/true));
  std::unique_ptr<EngineProcess> p(new EngineProcess());
  p->index_ = config.index;
  p->log_ = log_path;
  p->pid_ = c.pid;
  p->in_ = c.in;
  p->out_ = c.out;
  ::fcntl(p->out_, F_SETFL, 0);  // the reader thread blocks on it
  p->listener_ = std::move(listener);
  p->reader_ = std::thread([q = p.get()] { q->ReadLoop(); });
  p->WriteLine(ToJson(config).dump());
  std::unique_lock<std::mutex> lock(p->mu_);
  p->cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return p->ready_ || p->eof_; });
  if (p->ready_) return p;
  const std::string why = !p->error_.empty() ? p->error_
                          : p->eof_          ? "it exited before it was ready"
                                             : "not ready after " + std::to_string(timeout_s) + " s";
  lock.unlock();
  return Unavailable("serve-engine " + std::to_string(config.index) + " (pid " + std::to_string(c.pid) +
                     "): " + why + " (log: " + log_path + ")");
}

EngineProcess::~EngineProcess() {
  CloseInput();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return eof_; });
  }
  Reap(0);
  if (reader_.joinable()) reader_.join();
  if (out_ >= 0) ::close(out_);
}

void EngineProcess::CloseInput() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

int EngineProcess::Reap(double grace_s) {
  std::lock_guard<std::mutex> lock(reap_mu_);  // the reader and the owner may both get here
  int status = 0;
  if (reaped_ || pid_ <= 0) return status;
  const auto until = Clock::now() + std::chrono::duration<double>(grace_s);
  pid_t w = 0;
  while ((w = ::waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (w == 0) {
    ::kill(-pid_, SIGKILL);  // its process group (SpawnWithStdoutPipe)
    ::waitpid(pid_, &status, 0);
  }
  reaped_ = true;
  return status;
}

bool EngineProcess::WriteLine(const std::string& line) {
  if (in_ < 0) return false;
  return WriteAll(in_, line + "\n");
}

Status EngineProcess::Begin(Clock::time_point origin) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(origin.time_since_epoch()).count();
  if (!WriteLine("origin " + std::to_string(ns)))
    return Unavailable("serve-engine " + std::to_string(index_) + ": its stdin is closed (it exited) " + death());
  return Status::Ok();
}

void EngineProcess::Submit(size_t request) { WriteLine(std::to_string(request)); }

void EngineProcess::Finish() { WriteLine("end"); }

std::string EngineProcess::death() const {
  std::lock_guard<std::mutex> lock(mu_);
  return death_;
}

void EngineProcess::ReadLoop() {
  LineReader r(out_);
  std::string line;
  std::vector<uint64_t> stored, removed;
  while (r.Next(&line)) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;
    try {
      if (j.contains("f")) {
        finished_.store(j["f"].get<uint64_t>(), std::memory_order_relaxed);
      } else if (j.contains("c")) {
        if (!listener_) continue;
        stored = j["c"].get<std::vector<uint64_t>>();
        removed = j["x"].get<std::vector<uint64_t>>();
        listener_(stored, removed);
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        if (j.contains("r")) records_.push_back(std::move(j["r"]));
        else if (j.contains("d")) report_ = std::move(j);
        else if (j.contains("ready")) ready_ = true;
        else if (j.contains("error")) error_ = j["error"].get<std::string>();
        else if (j.contains("done")) done_ = true;
        cv_.notify_all();
      }
    } catch (const json::exception&) {  // a line of the wrong shape: skipped, as a line that is not JSON
    }
  }
  // Its stdout closed: it exited (or is about to). Reaped here when it died
  // before its report, so that death() can say how.
  std::string how;
  bool done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = done_;
  }
  if (!done) how = DescribeExit(Reap(2));
  std::lock_guard<std::mutex> lock(mu_);
  if (!done) {
    death_ = "engine " + std::to_string(index_) + " (serve-engine pid " + std::to_string(pid_) + ") died: " + how +
             (error_.empty() ? "" : ", " + error_) + " (log: " + log_ + ")";
  }
  eof_ = true;
  cv_.notify_all();
}

Status EngineProcess::Collect(std::vector<RequestRecord>* recs, double timeout_s) {
  CloseInput();
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return eof_; })) {
    lock.unlock();
    Reap(0);
    return DeadlineExceeded("serve-engine " + std::to_string(index_) + " (pid " + std::to_string(pid_) +
                            ") did not report " + std::to_string(timeout_s) + " s after its stop; killed (log: " +
                            log_ + ")");
  }
  if (!death_.empty()) return Unavailable(death_);
  try {
    for (const json& x : records_) {
      const size_t i = x[0].get<size_t>();
      if (i >= recs->size()) continue;
      RequestRecord& rec = (*recs)[i];
      rec.engine = index_;
      rec.first_token = x[1].get<double>();
      rec.finish = x[2].get<double>();
      rec.local_hit_tokens = x[3].get<uint32_t>();
      rec.loaded_tokens = x[4].get<uint32_t>();
      rec.run = x[5].get<uint8_t>();
      rec.kvmesh_path_s = x[6].get<double>();
      rec.recompute_path_s = x[7].get<double>();
    }
    if (report_.is_object()) {
      counters_ = report_["d"].get<DecisionCounters>();
      link_latency_s = report_["link"][0].get<double>();
      link_bytes_per_s = report_["link"][1].get<double>();
      link_deviation = report_["link"][2].get<double>();
    }
  } catch (const json::exception& e) {
    return Internal("serve-engine " + std::to_string(index_) + ": a malformed report line: " + e.what());
  }
  lock.unlock();
  Reap(10);  // it reported: it is exiting
  return Status::Ok();
}

// The child.
namespace {

// Lines to stdout from the engine's thread, the progress thread and main.
class Out {
 public:
  void Line(const json& j) {
    const std::string s = j.dump() + "\n";
    std::lock_guard<std::mutex> lock(mu_);
    if (!WriteAll(1, s)) std::_Exit(3);  // the harness is gone
  }

 private:
  std::mutex mu_;
};

Result<std::vector<ServeRequest>> Schedule(const EngineProcConfig& c) {
  if (c.trace_path.empty()) return MakeWorkload(c.workload);
  KVMESH_ASSIGN_OR_RETURN(const Trace trace, LoadMooncakeTrace(c.trace_path));
  return TraceWorkload(trace, c.trace);
}

}  // namespace

int RunServeEngine() {
  // Dies with the harness, even when it was killed (its stdin's end follows too).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 1;
  Out out;
  auto fail = [&](const std::string& why) {
    std::cerr << "kvmesh serve-engine: " << why << "\n";
    out.Line({{"error", why}});
    return 1;
  };
  LineReader in(0);
  std::string line;
  if (!in.Next(&line)) return fail("no configuration line on stdin");
  const json cj = json::parse(line, nullptr, false);
  if (cj.is_discarded()) return fail("the configuration line is not JSON");
  EngineProcConfig c;
  try {
      c = cj.get<EngineProcConfig>();
  } catch (const json::exception& e) {
    return fail(std::string("configuration: ") + e.what());
  }
  auto model = LoadEngineModel(c.engine_model, c.mfu, c.mbu);
  if (!model.ok()) return fail(model.status().ToString());
  auto reqs = Schedule(c);
  if (!reqs.ok()) return fail(reqs.status().ToString());
  if (ScheduleHash(*reqs) != c.schedule_hash) return fail("this schedule is not the harness's (hash mismatch)");
  std::unique_ptr<NetworkClient> client;
  std::unique_ptr<LinkEstimate> link;
  if (CacheMode(c.mode) == CacheMode::kKvmesh) {
    auto cl = ConnectEngineClient(c.coordinator, "bench-serve-engine-" + std::to_string(c.index), c.salt, c.nodes);
    if (!cl.ok()) return fail(cl.status().ToString());
    client = std::move(*cl);
    link = std::make_unique<LinkEstimate>(c.link_latency_s, c.link_seconds_per_byte, c.probe_interval_s,
                                          c.link_deviation_share);
  }
  std::vector<RequestRecord> recs(reqs->size());
  EngineOptions eo;
  eo.model = &*model->roofline;
  eo.reference = model->reference;
  eo.block_tokens = c.block_tokens;
  eo.local_cache_blocks = c.local_cache_blocks;
  eo.max_batch = c.max_batch;
  eo.max_prefill_tokens = c.max_prefill_tokens;
  eo.mode = CacheMode(c.mode);
  eo.policy = LoadPolicy(c.policy);
  eo.router = client ? &client->router() : nullptr;
  eo.link = link.get();
  eo.kv_scale = c.kv_scale;
  if (c.kv_events)
    eo.on_local_cache = [&out](std::span<const uint64_t> stored, std::span<const uint64_t> removed) {
      out.Line({{"c", std::vector<uint64_t>(stored.begin(), stored.end())},
                {"x", std::vector<uint64_t>(removed.begin(), removed.end())}});
    };
  out.Line({{"ready", true}});
  if (!in.Next(&line) || line.rfind("origin ", 0) != 0) return fail("no origin line after ready");
  eo.origin = Clock::time_point(std::chrono::nanoseconds(std::stoll(line.substr(7))));
  Engine engine(c.index, eo, &*reqs, &recs);
  engine.Start();
  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    uint64_t sent = 0;
    while (!stop.load()) {
      const uint64_t f = engine.finished();
      if (f != sent) out.Line({{"f", sent = f}});
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::vector<size_t> given;
  while (in.Next(&line)) {
    if (line == "end") {
      engine.Finish();
      continue;
    }
    char* end = nullptr;
    const unsigned long long i = std::strtoull(line.c_str(), &end, 10);
    if (line.empty() || *end != '\0' || i >= reqs->size()) continue;  // not a request index
    given.push_back(size_t(i));
    engine.Submit(size_t(i));
  }
  engine.Abort();
  engine.Join();
  stop.store(true);
  ticker.join();
  out.Line({{"f", engine.finished()}});
  for (size_t i : given) {
    const RequestRecord& r = recs[i];
    out.Line({{"r", {i, r.first_token, r.finish, r.local_hit_tokens, r.loaded_tokens, r.run, r.kvmesh_path_s,
                     r.recompute_path_s}}});
  }
  out.Line({{"d", json(engine.counters())},
            {"link", {link ? link->latency_s() : 0.0, link ? link->bytes_per_s() : 0.0,
                      link ? link->deviation() : 0.0}}});
  out.Line({{"done", true}});
  return 0;
}

}  // namespace kvmesh::serve
