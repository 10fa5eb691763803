// The in-process channel (inproc_channel.h). Get copies from pool memory
// straight into the caller's buffer, verifying the checksum in the same pass.
#include "coordinator/embedded/inproc_channel.h"

#include "shard_node/shard_node.h"

namespace kvmesh {
namespace {

class InProcessChannel final : public ShardChannel {
 public:
  explicit InProcessChannel(ShardNode* node) : node_(node) {}
  std::string_view transport() const override { return "inproc"; }

  Status Put(std::span<PutItem> items, const RequestOptions& o) override {
    PutOptions po;
    po.priority = o.priority;
    po.score = o.score;
    po.replace = o.replace;
    for (PutItem& it : items) it.status = node_->Put(it.key, it.data, po);
    return Status::Ok();
  }
  Status Get(std::span<GetItem> items, const RequestOptions&) override {
    for (GetItem& it : items) {
      Result<size_t> n = node_->GetInto(it.key, it.dst);  // verifies while copying
      if (n.ok()) {
        it.size = *n;
        it.status = Status::Ok();
      } else if (n.status().code() == StatusCode::kResourceExhausted) {
        // The caller's buffer is too small: report the size it needs, which
        // is the decoded (logical) size when the node stores blocks encoded.
        Result<BlockRef> ref = node_->Get(it.key);
        it.size = ref.ok() ? ref->meta().logical_size : 0;
        it.status = n.status();
      } else {
        it.status = n.status();
      }
    }
    return Status::Ok();
  }
  Status Exists(std::span<const BlockKey> keys, std::span<uint8_t> found, bool touch,
                const RequestOptions&) override {
    for (size_t i = 0; i < keys.size(); ++i) found[i] = node_->Exists(keys[i], touch) ? 1 : 0;
    return Status::Ok();
  }
  Status Erase(std::span<const BlockKey> keys, std::span<Status> st) override {
    for (size_t i = 0; i < keys.size(); ++i) st[i] = node_->Erase(keys[i]);
    return Status::Ok();
  }
  Status Pin(std::span<const BlockKey> keys, std::span<Status> st) override {
    for (size_t i = 0; i < keys.size(); ++i) st[i] = node_->Pin(keys[i]);
    return Status::Ok();
  }
  Status Unpin(std::span<const BlockKey> keys, std::span<Status> st) override {
    for (size_t i = 0; i < keys.size(); ++i) st[i] = node_->Unpin(keys[i]);
    return Status::Ok();
  }
  Status Release(std::span<const BlockKey> keys, std::span<Status> st) override {
    for (size_t i = 0; i < keys.size(); ++i) st[i] = node_->Release(keys[i]);
    return Status::Ok();
  }
  Result<std::string> StatsJson() override { return node_->StatsJson(); }

  Result<SeqCreated> SeqCreate(const SeqCreateArgs& a, const RequestOptions&) override {
    return node_->sequences().Create(a);
  }
  Result<uint32_t> SeqAppend(SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v, uint32_t, const RequestOptions&) override {
    return node_->sequences().Append(id, tokens, k, v);
  }
  Status SeqTruncate(SeqId id, uint32_t n, const RequestOptions&) override {
    return node_->sequences().Truncate(id, n);
  }
  Result<SeqId> SeqFork(SeqId id, const RequestOptions&) override { return node_->sequences().Fork(id); }
  Status SeqRelease(SeqId id, const RequestOptions&) override { return node_->sequences().Release(id); }
  Result<SequenceState> SeqInfo(SeqId id, const RequestOptions&) override { return node_->sequences().Info(id); }
  Status SeqRead(SeqId id, uint32_t from, uint32_t n, std::vector<std::byte>* k, std::vector<std::byte>* v,
                 const RequestOptions&) override {
    KVMESH_ASSIGN_OR_RETURN(SeqRows rows, node_->sequences().Read(id, from, n, SIZE_MAX, k, v));
    if (rows.n != n) return Internal("in-process sequence read came back short");
    return Status::Ok();
  }

 private:
  ShardNode* node_;
};

}  // namespace

std::unique_ptr<ShardChannel> MakeInProcessChannel(ShardNode* node) {
  return std::make_unique<InProcessChannel>(node);
}

}  // namespace kvmesh
