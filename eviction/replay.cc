#include "eviction/replay.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <queue>

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <nlohmann/json.hpp>

namespace kvmesh {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status LineError(std::string_view source, size_t line, const std::string& what) {
  return InvalidArgument(std::string(source) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace

Result<Trace> ParseMooncakeTrace(std::istream& in, std::string_view source) {
  Trace t;
  t.source = std::string(source);
  absl::flat_hash_map<int64_t, uint32_t> dense;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return LineError(source, line_no, "not a JSON object");
    for (const char* key : {"timestamp", "input_length", "output_length"}) {
      auto it = j.find(key);
      if (it == j.end()) return LineError(source, line_no, std::string("missing '") + key + "'");
      if (!it->is_number_integer() || it->get<int64_t>() < 0)
        return LineError(source, line_no, std::string("'") + key + "' must be a non-negative integer");
    }
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array()) return LineError(source, line_no, "'hash_ids' must be an array");
    t.begin.push_back(static_cast<uint32_t>(t.blocks.size()));
    t.timestamp_ms.push_back(j["timestamp"].get<int64_t>());
    int64_t in_len = j["input_length"].get<int64_t>();
    t.input_length.push_back(static_cast<uint32_t>(std::min<int64_t>(in_len, UINT32_MAX)));
    t.output_length.push_back(static_cast<uint32_t>(std::min<int64_t>(j["output_length"].get<int64_t>(), UINT32_MAX)));
    if (auto s = j.find("session"); s != j.end()) {
      if (!s->is_number_integer() || s->get<int64_t>() < 0)
        return LineError(source, line_no, "'session' must be a non-negative integer");
      t.session.resize(t.timestamp_ms.size() - 1, -1);  // earlier lines without one
      t.session.push_back(s->get<int64_t>());
    } else if (!t.session.empty()) {
      t.session.push_back(-1);
    }
    if (auto c = j.find("closes"); c != j.end()) {
      if (!c->is_boolean()) return LineError(source, line_no, "'closes' must be true or false");
      t.closes.resize(t.timestamp_ms.size() - 1, 0);
      t.closes.push_back(c->get<bool>() ? 1 : 0);
    } else if (!t.closes.empty()) {
      t.closes.push_back(0);
    }
    for (const auto& h : *ids) {
      if (!h.is_number_integer()) return LineError(source, line_no, "'hash_ids' must hold integers");
      auto [it, fresh] = dense.try_emplace(h.get<int64_t>(), static_cast<uint32_t>(dense.size()));
      t.blocks.push_back(it->second);
    }
    if (t.blocks.size() >= UINT32_MAX - 1) return LineError(source, line_no, "trace too large (2^32 lookups)");
  }
  if (in.bad()) return IoError("reading " + std::string(source));
  t.begin.push_back(static_cast<uint32_t>(t.blocks.size()));
  t.distinct = dense.size();
  if (!t.session.empty()) {
    t.session.resize(t.requests(), -1);
    t.closes.resize(t.requests(), 0);
  } else {
    t.closes.clear();  // "closes" without sessions names nothing
  }
  return t;
}

Result<Trace> LoadMooncakeTrace(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot open trace " + path);
  return ParseMooncakeTrace(f, path);
}

SessionCloses::SessionCloses(const Trace& t, double ms_per_output_token)
    : t_(t), ms_per_token_(ms_per_output_token), readers_(t.distinct, 0) {}

SessionCloses::~SessionCloses() = default;

uint64_t SessionCloses::CloseDue(int64_t now_ms, const std::function<bool(uint32_t)>& release) {
  uint64_t released = 0;
  while (!due_.empty() && due_.top().first <= now_ms) {
    const int64_t s = due_.top().second;
    due_.pop();
    auto it = open_.find(s);
    if (it == open_.end()) continue;
    for (const uint32_t b : it->second.blocks)  // shallowest first: the deepest is released last, leaves first
      if (readers_[b] == 1 && release(b)) ++released;
    open_.erase(it);
  }
  return released;
}

void SessionCloses::Read(size_t r) {
  const int64_t s = t_.session[r];
  if (s < 0) return;
  Session& x = open_[s];
  for (size_t k = t_.begin[r]; k < t_.begin[r + 1]; ++k) {
    const uint32_t b = t_.blocks[k];
    if (x.seen.insert(b).second) {
      x.blocks.push_back(b);
      ++readers_[b];
    }
  }
  if (t_.closes[r]) {
    const auto done = static_cast<int64_t>(static_cast<double>(t_.output_length[r]) * ms_per_token_);
    due_.emplace(t_.timestamp_ms[r] + done, s);
  }
}

// The replay's hint rule. A client knows, when it sends a request, the token
// count of its prompt (so whether the last block is partial), each block's
// depth, and how many earlier requests carried each block (the router counts
// prefix hits). With K priority classes (lowest evicted first):
//   0      the partial last block of a prompt: the next turn of the conversation
//          appends to it, so its chained hash changes and it is almost never read
//          again (0.7% in the Mooncake conversation trace);
//   K-1    the first block of a prompt (system prompts are shared by everybody);
//   1 + min(shares, K-2) for the other (full) blocks, where shares = the number
//          of earlier requests that carried the block: a block read again is
//          likelier to be read again (26% -> 42% -> 50% -> 70% in the trace).
// With the default K = 4: 0 tail, 1 new, 2 shared once, 3 shared twice or more
// and first blocks. lru-priority's aging (one class per aging period idle)
// lets stale shared blocks fall back to the bottom.
AccessInfo DeriveHints(const Trace& trace, size_t r, size_t k, uint32_t shares, const HintOptions& o) {
  const uint32_t classes = std::clamp<uint32_t>(o.priority_classes, 1, kMaxPriorityClasses);
  const uint32_t top = classes - 1;
  const size_t first = trace.begin[r], last = trace.begin[r + 1] - 1;
  const bool partial_tail = k == last && o.block_tokens && trace.input_length[r] % o.block_tokens != 0;
  uint32_t cls;
  if (partial_tail) cls = 0;
  else if (k == first) cls = top;
  else cls = 1 + std::min<uint32_t>(shares, top >= 1 ? top - 1 : 0);
  AccessInfo info;
  info.priority = static_cast<Priority>(std::min(cls, top));
  info.score = static_cast<float>(partial_tail ? 0 : 1 + shares);
  return info;
}

double PrefillModel::BlockFlops(uint32_t index, uint32_t tokens) const {
  const double d = static_cast<double>(heads) * head_dim;
  const double t = tokens;
  const double p0 = static_cast<double>(index) * block_tokens;
  return layers * (24.0 * d * d * t + 4.0 * d * (t * p0 + t * (t + 1) / 2));
}

std::vector<double> PrefillModel::LookupFlops(const Trace& trace) const {
  std::vector<double> out(trace.lookups());
  const uint32_t bt = std::max<uint32_t>(block_tokens, 1);
  for (size_t r = 0; r < trace.requests(); ++r) {
    const size_t first = trace.begin[r], last = trace.begin[r + 1];
    for (size_t k = first; k < last; ++k) {
      const uint32_t index = static_cast<uint32_t>(k - first);
      uint32_t tokens = bt;
      if (k + 1 == last) {
        const int64_t rest = static_cast<int64_t>(trace.input_length[r]) - static_cast<int64_t>(index) * bt;
        tokens = static_cast<uint32_t>(std::clamp<int64_t>(rest, 1, bt));
      }
      out[k] = BlockFlops(index, tokens);
    }
  }
  return out;
}

Result<PolicySpec> ParsePolicySpec(std::string_view spec) {
  PolicySpec out;
  const size_t at = spec.find('@');
  out.name = std::string(spec.substr(0, at));
  if (at != std::string_view::npos) {
    std::string rest(spec.substr(at + 1));
    const size_t slash = rest.find('/');
    const std::string num = rest.substr(0, slash);
    char* end = nullptr;
    const double s = std::strtod(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !(s >= 0) || s > 1e9)
      return InvalidArgument("policy '" + std::string(spec) +
                             "': expected <name>@<aging seconds>[/<priority classes>]");
    out.aging_ns = static_cast<int64_t>(s * 1e9);
    if (slash != std::string::npos) {
      const std::string cls = rest.substr(slash + 1);
      const long c = std::strtol(cls.c_str(), &end, 10);
      if (cls.empty() || end != cls.c_str() + cls.size() || c < 1 || c > kMaxPriorityClasses)
        return InvalidArgument("policy '" + std::string(spec) + "': priority classes must be in 1.." +
                               std::to_string(kMaxPriorityClasses));
      out.classes = static_cast<uint32_t>(c);
    }
  }
  KVMESH_RETURN_IF_ERROR(MakeEvictionPolicy(out.name, {}).status());
  return out;
}

Result<ReplayResult> ReplayPolicy(const Trace& trace, std::string_view policy, size_t capacity,
                                  const ReplayOptions& o) {
  if (capacity == 0) return InvalidArgument("replay capacity must be at least one block");
  KVMESH_ASSIGN_OR_RETURN(PolicySpec spec, ParsePolicySpec(policy));
  ManualClock clock(0);
  HintOptions hints = o.hints;
  if (spec.classes) hints.priority_classes = *spec.classes;
  PolicyOptions po;
  po.priority_classes = hints.priority_classes;
  po.aging_ns = spec.aging_ns.value_or(o.aging_ns);
  po.capacity_hint = capacity;
  po.shadow_sample_floor = o.shadow_sample_floor;
  po.clock = &clock;
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> p, MakeEvictionPolicy(spec.name, po));

  const auto t0 = std::chrono::steady_clock::now();
  ReplayResult res;
  res.policy = std::string(policy);
  res.capacity = capacity;
  const std::vector<double> flops = o.model.LookupFlops(trace);
  const double unit = o.model.BlockFlops(0, std::max<uint32_t>(o.model.block_tokens, 1));  // AccessInfo::cost 1
  std::vector<uint32_t> shares(trace.distinct, 0);
  std::optional<SessionCloses> sessions;
  if (o.session_closes && !trace.session.empty()) sessions.emplace(trace, o.close_ms_per_output_token);
  int64_t now_ns = 0;
  for (size_t r = 0; r < trace.requests(); ++r) {
    now_ns = std::max(now_ns, trace.timestamp_ms[r] * 1'000'000);
    clock.Set(now_ns);
    if (sessions)
      res.released += sessions->CloseDue(trace.timestamp_ms[r], [&p](uint32_t b) {
        if (!p->Contains(b)) return false;
        p->Release(b);
        return true;
      });
    bool prefix = true;
    for (size_t k = trace.begin[r]; k < trace.begin[r + 1]; ++k) {
      const EntryId id = trace.blocks[k];
      AccessInfo info = o.derive_hints ? DeriveHints(trace, r, k, shares[id], hints) : AccessInfo{};
      info.depth = static_cast<uint32_t>(k - trace.begin[r]);
      info.cost = static_cast<float>(flops[k] / unit);
      ++res.lookups;
      res.flops_total += flops[k];
      if (p->Contains(id)) {
        ++res.hits;
        if (prefix) {
          ++res.prefix_hits;
          res.flops_saved += flops[k];
        }
        p->Touch(id, info);
      } else {
        prefix = false;
        if (!p->Admit(id, info)) {
          ++res.declined;
        } else {
          while (p->size() >= capacity) {
            std::optional<EntryId> v = p->Victim();
            if (!v) return Internal(std::string(policy) + ": no victim in a full cache");
            p->Remove(*v, RemoveReason::kEvicted);
            ++res.evictions;
          }
          p->Insert(id, info);
        }
      }
      ++shares[id];
    }
    if (sessions) sessions->Read(r);
    if (o.progress) o.progress->fetch_add(trace.begin[r + 1] - trace.begin[r], std::memory_order_relaxed);
  }
  res.seconds = SecondsSince(t0);
  res.leader = std::string(p->following());
  return res;
}

ReplayResult ReplayInfinite(const Trace& trace, const PrefillModel& model) {
  ReplayResult res;
  res.policy = "infinite";
  const std::vector<double> flops = model.LookupFlops(trace);
  std::vector<bool> seen(trace.distinct, false);
  for (size_t r = 0; r < trace.requests(); ++r) {
    bool prefix = true;
    for (size_t k = trace.begin[r]; k < trace.begin[r + 1]; ++k) {
      ++res.lookups;
      res.flops_total += flops[k];
      if (seen[trace.blocks[k]]) {
        ++res.hits;
        if (prefix) {
          ++res.prefix_hits;
          res.flops_saved += flops[k];
        }
      } else {
        prefix = false;
        seen[trace.blocks[k]] = true;
      }
    }
  }
  return res;
}

}  // namespace kvmesh
