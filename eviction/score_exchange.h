// eviction/score_exchange.h — the eviction policy groups' scores as node
// daemons and the coordinator exchange them (docs/eviction.md "Through the
// nodes"): a node's heartbeat carries {"eviction": {key: [scores]}} (each of
// its PolicyGroups' own sums), and the coordinator answers with
// {"eviction_peers": {key: [scores]}}: for every key the node sent, the sum
// over the other live nodes that sent the same key with as many scores. The
// node installs them with PolicyGroups::SetPeers, so every node's stripes
// follow the expert that scores best over the whole cluster.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eviction/eviction_policy.h"
#include "kvmesh/status.h"

namespace kvmesh {

inline constexpr size_t kMaxScoreGroups = 64;      // keys per node
inline constexpr size_t kMaxScoreKeyBytes = 200;

// Reads a {key: [scores]} object; `path` names it in errors ("$.eviction").
// Refused: not an object, more than kMaxScoreGroups keys, a key empty or
// longer than kMaxScoreKeyBytes, a value not an array of 1..8 finite numbers
// >= 0.
Result<PeerScores> ParseScores(const nlohmann::json& j, const std::string& path);
// The same for an answer: anything malformed gives no peers (decide alone).
PeerScores ParsePeerScores(const nlohmann::json& j);
nlohmann::json ScoresToJson(const PeerScores& s);

// For `self`'s keys, the sums over `others` of the same key and width.
PeerScores SumPeers(const PeerScores& self, const std::vector<const PeerScores*>& others);

}  // namespace kvmesh
