#include "eviction/score_exchange.h"

#include <cmath>

#include "eviction/eviction_policy.h"

namespace kvmesh {

Result<PeerScores> ParseScores(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) return InvalidArgument(path + ": must be an object of score arrays");
  if (j.size() > kMaxScoreGroups)
    return InvalidArgument(path + ": more than " + std::to_string(kMaxScoreGroups) + " groups");
  PeerScores out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key.empty() || key.size() > kMaxScoreKeyBytes)
      return InvalidArgument(path + ": a group key must have 1.." + std::to_string(kMaxScoreKeyBytes) + " bytes");
    const std::string at = path + "." + key;
    const nlohmann::json& v = it.value();
    if (!v.is_array() || v.empty() || v.size() > PolicyGroup::kMaxScores)
      return InvalidArgument(at + ": must be an array of 1.." + std::to_string(PolicyGroup::kMaxScores) + " numbers");
    std::vector<double> scores;
    for (const nlohmann::json& x : v) {
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
        return InvalidArgument(at + ": scores must be finite numbers >= 0");
      scores.push_back(x.get<double>());
    }
    out.emplace_back(key, std::move(scores));
  }
  return out;
}

PeerScores ParsePeerScores(const nlohmann::json& j) {
  Result<PeerScores> r = ParseScores(j, "$.eviction_peers");
  return r.ok() ? std::move(r).value() : PeerScores{};
}

nlohmann::json ScoresToJson(const PeerScores& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : s) j[k] = v;
  return j;
}

PeerScores SumPeers(const PeerScores& self, const std::vector<const PeerScores*>& others) {
  PeerScores out;
  for (const auto& [key, mine] : self) {
    std::vector<double> sum(mine.size(), 0.0);
    bool any = false;
    for (const PeerScores* o : others) {
      for (const auto& [k, v] : *o) {
        if (k != key || v.size() != mine.size()) continue;
        for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
        any = true;
      }
    }
    if (any) out.emplace_back(key, std::move(sum));
  }
  return out;
}

}  // namespace kvmesh
