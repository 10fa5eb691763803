#include "shard_node/tenant_view.h"

#include <vector>

#include "common/checksum.h"
#include "shard_node/shard_node.h"

namespace kvmesh {

BlockKey TenantView::Key(const BlockKey& key) const { return node_->tenants().Scope(tenant_, key); }

void TenantView::Admitted(const BlockKey& stored, uint64_t bytes) {
  if (tenant_ == kClusterTenant) return;
  std::vector<BlockKey> victims;
  node_->tenants().Admitted(tenant_, stored, bytes, &victims);
  uint64_t evicted = 0;
  // Evicted, not erased: a victim in a co-evicted group takes its group
  // along (the other members leave the ledger as quota evictions too, even
  // `stored` when it is one of them, as memory eviction would drop it).
  // A victim the node already dropped on its own answers NotFound: it only
  // leaves the ledger.
  auto dropped = [this](const BlockKey& k) { node_->tenants().Dropped(tenant_, k); };
  for (const BlockKey& v : victims) evicted += node_->Evict(v, dropped).ok() ? 1 : 0;
  if (evicted) node_->tenants().QuotaEvicted(tenant_, evicted);
}

// Hits refresh the tenant's recency; misses forget what the node no longer has.
template <typename T>
T TenantView::Counted(const BlockKey& stored, T result) {
  if (tenant_ == kClusterTenant) return result;
  if (result.ok()) node_->tenants().Hit(tenant_, stored);
  else if (result.status().code() == StatusCode::kNotFound || result.status().code() == StatusCode::kDataLoss)
    node_->tenants().Miss(tenant_, stored);
  return result;
}

Status TenantView::Put(const BlockKey& key, std::span<const std::byte> payload, const PutOptions& o) {
  KVMESH_RETURN_IF_ERROR(node_->tenants().CheckFits(tenant_, payload.size()));
  const BlockKey stored = Key(key);
  KVMESH_RETURN_IF_ERROR(node_->Put(stored, payload, o));
  Admitted(stored, payload.size());
  return Status::Ok();
}

Result<BlockRef> TenantView::Get(const BlockKey& key) {
  const BlockKey stored = Key(key);
  return Counted(stored, node_->Get(stored));
}

Result<BlockRef> TenantView::GetForTransfer(const BlockKey& key) {
  const BlockKey stored = Key(key);
  return Counted(stored, node_->GetForTransfer(stored));
}

Result<size_t> TenantView::GetInto(const BlockKey& key, std::span<std::byte> dst) {
  const BlockKey stored = Key(key);
  return Counted(stored, node_->GetInto(stored, dst));
}

bool TenantView::Exists(const BlockKey& key, bool touch) {
  const BlockKey stored = Key(key);
  const bool found = node_->Exists(stored, touch);
  if (tenant_ != kClusterTenant) {
    if (found && touch) node_->tenants().Hit(tenant_, stored);
    if (!found) node_->tenants().Miss(tenant_, stored);
  }
  return found;
}

Status TenantView::Erase(const BlockKey& key) {
  const BlockKey stored = Key(key);
  Status s = node_->Erase(stored);
  if (tenant_ != kClusterTenant) node_->tenants().Erased(tenant_, stored);
  return s;
}

Status TenantView::Pin(const BlockKey& key) { return node_->Pin(Key(key)); }
Status TenantView::Release(const BlockKey& key) { return node_->Release(Key(key)); }
Status TenantView::Unpin(const BlockKey& key) { return node_->Unpin(Key(key)); }

Result<BlockReservation> TenantView::ReservePut(const BlockKey& key, size_t size, const PutOptions& o) {
  KVMESH_RETURN_IF_ERROR(node_->tenants().CheckFits(tenant_, size));
  Result<BlockReservation> r = node_->ReservePut(Key(key), size, o);
  // Stored already: a put of the same bytes, which refreshes the tenant's recency.
  if (!r.ok() && r.status().code() == StatusCode::kAlreadyExists) Admitted(Key(key), size);
  return r;
}

Status TenantView::CommitPut(BlockReservation& r, uint64_t checksum, bool verify) {
  const BlockKey stored = r.key();
  const uint64_t bytes = r.data().size();
  KVMESH_RETURN_IF_ERROR(node_->CommitPut(r, checksum, verify));
  Admitted(stored, bytes);
  return Status::Ok();
}

TenantView::PutLanding TenantView::StartPut(const BlockKey& key, size_t size, uint64_t checksum, const PutOptions& o) {
  PutLanding p;
  p.key_ = key;
  p.options_ = o;
  p.checksum_ = checksum;
  Result<BlockReservation> r = ReservePut(key, size, o);
  if (r.ok()) {
    p.res_ = std::move(*r);
  } else if (r.status().code() == StatusCode::kFailedPrecondition) {
    p.staged_ = true;  // this node changes blocks on the way in: stage, then Put
  } else if (r.status().code() != StatusCode::kAlreadyExists) {
    p.status_ = r.status();  // AlreadyExists: stored already, OK
  }
  return p;
}

Status TenantView::FinishPut(PutLanding& p, std::span<const std::byte> staged) {
  if (p.reserved()) return CommitPut(p.res_, p.checksum_);
  if (!p.staged_) return p.status_;
  if (Checksum64(staged.data(), staged.size()) != p.checksum_) return DataLoss("payload checksum mismatch");
  return Put(p.key_, staged, p.options_);
}

}  // namespace kvmesh
