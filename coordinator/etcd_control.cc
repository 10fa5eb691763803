#include "coordinator/etcd_control.h"

#include <algorithm>
#include <set>

#include "router/map_json.h"

namespace kvmesh {

using nlohmann::json;

namespace {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// etcd leases count whole seconds.
int64_t Seconds(int64_t ms) { return std::max<int64_t>(1, (ms + 999) / 1000); }

// A node's registration as its etcd value (the fields the map carries).
std::string NodeValue(const Membership::LocalMember& m) {
  json j = {{"id", m.info.id}, {"host", m.info.host}, {"weight", m.info.weight},
            {"ports", {{"data", m.info.ports.data}, {"http", m.info.ports.http}, {"resp", m.info.ports.resp}}}};
  if (!m.ucx.empty()) j["ucx"] = m.ucx;
  return j.dump();
}

}  // namespace

EtcdControl::EtcdControl(const ClusterConfig& config, Membership* members, std::string self)
    : config_(config), members_(members), self_(std::move(self)), prefix_(config.coordinator.etcd.prefix) {}

EtcdControl::~EtcdControl() = default;

Result<std::unique_ptr<EtcdControl>> EtcdControl::Create(const ClusterConfig& config, Membership* members,
                                                         std::string self) {
  std::unique_ptr<EtcdControl> c(new EtcdControl(config, members, std::move(self)));
  KVMESH_ASSIGN_OR_RETURN(c->etcd_, EtcdClient::Create(config.coordinator.etcd, config.tls));
  c->last_ok_ = Clock::now();
  return c;
}

void EtcdControl::Log(json j) {
  j["self"] = self_;
  members_->LogEvent(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

bool EtcdControl::leader() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return leader_public_;
}

void EtcdControl::PublishStatus() {
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    leader_public_ = leader_;
  }
  members_->SetStoreStatus(json{{"self", self_}, {"leader", leader_}, {"leader_id", leader_id_},
                                {"leader_changes", leader_changes_}, {"elected", elected_},
                                {"maps_published", published_}, {"endpoint", etcd_->current()}}
                               .dump());
}

void EtcdControl::StepDown(const std::string& reason) {
  if (!leader_) return;
  leader_ = false;
  leader_revision_ = 0;
  lease_ = 0;
  Log({{"event", "leader_lost"}, {"reason", reason}});
  PublishStatus();
}

Status EtcdControl::SyncNodes() {
  const int64_t ttl_s = Seconds(config_.coordinator.dead_after_ms);
  const auto renew_every = std::chrono::milliseconds(ttl_s * 1000 / 3);
  for (const std::string& id : members_->TakeLeft()) {
    auto it = node_leases_.find(id);
    if (it == node_leases_.end()) continue;
    KVMESH_RETURN_IF_ERROR(etcd_->Revoke(it->second.lease));  // deletes its key, unless it moved to another lease
    node_leases_.erase(it);
  }
  std::set<std::string> live;
  for (const Membership::LocalMember& m : members_->LocalMembers()) {
    live.insert(m.info.id);
    NodeLease& nl = node_leases_[m.info.id];
    const std::string value = NodeValue(m);
    const auto now = Clock::now();
    if (nl.lease != 0 && nl.value == value) {
      if (now - nl.renewed < renew_every) continue;
      KVMESH_ASSIGN_OR_RETURN(int64_t ttl, etcd_->KeepAlive(nl.lease));
      if (ttl > 0) {
        nl.renewed = now;
        continue;
      }
    }
    // New here, changed, or its lease ran out: put it under a fresh lease.
    KVMESH_ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(ttl_s));
    KVMESH_RETURN_IF_ERROR(etcd_->Call("kv/put", EtcdClient::PutOp(prefix_ + "nodes/" + m.info.id, value, lease)
                                                    .at("request_put"))
                               .status());
    if (nl.lease != 0) (void)etcd_->Revoke(nl.lease);  // no key is attached to it any more
    nl = NodeLease{lease, value, now};
  }
  // Nodes silent here (moved to another coordinator, or dead): their leases run out.
  for (auto it = node_leases_.begin(); it != node_leases_.end();)
    it = live.count(it->first) ? std::next(it) : node_leases_.erase(it);
  return Status::Ok();
}

Status EtcdControl::Lead() {
  const auto& e = config_.coordinator.etcd;
  const std::string key = prefix_ + "leader";
  if (leader_) {
    if (Clock::now() - renewed_ >= std::chrono::milliseconds(e.lease_ms / 3)) {
      const auto sent = Clock::now();
      Result<int64_t> ttl = etcd_->KeepAlive(lease_);
      if (ttl.ok() && *ttl == 0) {
        StepDown("lease expired");
      } else if (ttl.ok()) {
        lease_end_ = sent + std::chrono::seconds(*ttl);
        renewed_ = sent;
      }
    }
    if (leader_ && Clock::now() >= lease_end_) StepDown("lease ran out before it could be renewed");
    return Status::Ok();
  }
  KVMESH_ASSIGN_OR_RETURN(std::optional<EtcdKv> current, etcd_->Get(key));
  std::string seen = current ? current->value : "";
  if (!current) {
    const auto sent = Clock::now();
    const int64_t ttl_s = Seconds(e.lease_ms);
    KVMESH_ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(ttl_s));
    json txn = {{"compare", json::array({EtcdClient::Equal(key, "CREATE", int64_t{0})})},
                {"success", json::array({EtcdClient::PutOp(key, self_, lease)})},
                {"failure", json::array({EtcdClient::RangeOp(key)})}};
    Result<json> a = etcd_->Txn(txn);
    if (a.ok() && (*a)["succeeded"].get<bool>()) {
      leader_ = true;
      lease_ = lease;
      leader_revision_ = EtcdClient::Int(a->value("header", json()), "revision");
      lease_end_ = sent + std::chrono::seconds(ttl_s);
      renewed_ = sent;
      ++elected_;
      seen = self_;
      Log({{"event", "leader_elected"}, {"lease_ms", ttl_s * 1000}, {"revision", leader_revision_}});
    } else {
      (void)etcd_->Revoke(lease);  // another coordinator won
      if (!a.ok()) return a.status();
      const json& rs = (*a)["responses"];
      if (rs.is_array() && !rs.empty()) {
        std::vector<EtcdKv> kvs = EtcdClient::ParseKvs(rs[0].value("response_range", json()));
        if (!kvs.empty()) seen = kvs[0].value;
      }
    }
  }
  if (!seen.empty() && seen != leader_id_) {
    if (!leader_id_.empty()) ++leader_changes_;
    if (!leader_) Log({{"event", "leader_seen"}, {"leader", seen}});
    leader_id_ = seen;
  }
  return Status::Ok();
}

Result<std::optional<EtcdControl::MapPlan>> EtcdControl::PlanMap() {
  KVMESH_ASSIGN_OR_RETURN(std::optional<EtcdKv> map, etcd_->Get(prefix_ + "map"));
  Result<PublishedMap> current = map ? ParsePublishedMap(map->value) : Result<PublishedMap>(NotFound("no map"));
  if (current.ok()) members_->Publish(map->value);
  if (!leader_) return std::optional<MapPlan>();
  // The leader: the map the registered nodes make, compared with the published one.
  KVMESH_ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->GetPrefix(prefix_ + "nodes/"));
  KVMESH_ASSIGN_OR_RETURN(std::optional<EtcdKv> epoch_kv, etcd_->Get(prefix_ + "epoch"));
  // Registrations were checked by the coordinator that put them; the map's
  // parser (router/map_json.h) checks them again as a whole.
  PublishedMap empty;
  empty.model = config_.model;
  empty.placement = config_.placement;
  empty.backend = config_.transport.backend;
  json candidate = json::parse(PublishedMapToJson(empty));
  json nodes = json::array();
  for (const EtcdKv& kv : kvs)  // in key order, so by node id
    if (json n = json::parse(kv.value, nullptr, /*allow_exceptions=*/false); n.is_object()) nodes.push_back(n);
  candidate["nodes"] = std::move(nodes);
  KVMESH_ASSIGN_OR_RETURN(PublishedMap next, ParsePublishedMap(candidate.dump()));
  const uint64_t epoch = current.ok() ? current->epoch : 0;
  if (epoch_kv && epoch_kv->value != std::to_string(epoch)) return std::optional<MapPlan>();  // a map in flight
  next.epoch = epoch;
  if (current.ok() && PublishedMapToJson(next) == PublishedMapToJson(*current)) return std::optional<MapPlan>();
  if (!current.ok() && next.nodes.empty()) return std::optional<MapPlan>();  // nothing to publish yet
  MapPlan plan;
  // The first epoch is the wall-clock milliseconds, as a lone coordinator's.
  plan.epoch = epoch == 0 ? static_cast<uint64_t>(UnixMs()) : epoch + 1;
  next.epoch = plan.epoch;
  plan.text = PublishedMapToJson(next);
  plan.previous = epoch;
  plan.epoch_mod = epoch_kv ? epoch_kv->mod_revision : 0;
  plan.nodes = next.nodes.size();
  return std::optional<MapPlan>(std::move(plan));
}

Result<bool> EtcdControl::CommitMap(const MapPlan& plan) {
  // Only with lease_ms / 4 of the lease left by this clock: a leader that was
  // paused past its lease stops here (the transaction's compares stop it in etcd too).
  if (!leader_) return false;
  if (Clock::now() + std::chrono::milliseconds(config_.coordinator.etcd.lease_ms / 4) >= lease_end_) {
    StepDown("lease too close to its end to publish");
    return false;
  }
  json txn = {{"compare", json::array({EtcdClient::Equal(prefix_ + "leader", "CREATE", leader_revision_),
                                       EtcdClient::Equal(prefix_ + "epoch", "MOD", plan.epoch_mod)})},
              {"success", json::array({EtcdClient::PutOp(prefix_ + "epoch", std::to_string(plan.epoch)),
                                       EtcdClient::PutOp(prefix_ + "map", plan.text)})},
              {"failure", json::array({EtcdClient::RangeOp(prefix_ + "leader")})}};
  KVMESH_ASSIGN_OR_RETURN(json a, etcd_->Txn(txn));
  if (!a["succeeded"].get<bool>()) {
    const json& rs = a["responses"];
    std::vector<EtcdKv> kvs =
        rs.is_array() && !rs.empty() ? EtcdClient::ParseKvs(rs[0].value("response_range", json())) : std::vector<EtcdKv>();
    if (kvs.empty() || kvs[0].create_revision != leader_revision_) StepDown("another coordinator leads");
    return false;
  }
  ++published_;
  Log({{"event", "map_published"}, {"epoch", plan.epoch}, {"previous", plan.previous}, {"nodes", plan.nodes}});
  members_->Publish(plan.text);
  return true;
}

void EtcdControl::Tick() {
  Status s = SyncNodes();
  if (s.ok()) s = Lead();
  if (s.ok()) {
    Result<std::optional<MapPlan>> plan = PlanMap();
    if (!plan.ok()) s = plan.status();
    else if (*plan) s = CommitMap(**plan).status();
  }
  const auto now = Clock::now();
  if (s.ok()) {
    last_ok_ = now;
    if (unreachable_logged_) Log({{"event", "etcd_reachable"}, {"endpoint", etcd_->current()}});
    unreachable_logged_ = false;
  } else if (!unreachable_logged_) {
    Log({{"event", "etcd_unreachable"}, {"error", s.ToString()}});
    unreachable_logged_ = true;
  }
  // Out of reach for a lease's time: this coordinator speaks for no one (503s send nodes and clients on),
  // from that moment on, not from the end of the round that finds it out.
  members_->SetStoreReachableUntil(last_ok_ + std::chrono::milliseconds(config_.coordinator.etcd.lease_ms));
  if (leader_ && now >= lease_end_) StepDown("lease ran out before it could be renewed");
  PublishStatus();
}

void EtcdControl::Stop() {
  if (leader_) {
    (void)etcd_->Revoke(lease_);  // deletes the leader key: a follower leads at its next round
    StepDown("stopping");
  }
}

}  // namespace kvmesh
