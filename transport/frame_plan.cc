#include "transport/frame_plan.h"

#include "common/checksum.h"

namespace kvmesh::proto {

Status CheckPutBlock(uint64_t size, const ProtocolLimits& lim) {
  if (size == 0 || size > lim.max_block_bytes)
    return ResourceExhausted("block of " + std::to_string(size) + " bytes is over the node's block limit");
  return Status::Ok();
}

uint64_t PayloadChecksum(std::span<const std::byte> head, std::span<const std::byte> data) {
  if (head.empty()) return Checksum64(data.data(), data.size());
  if (data.empty()) return Checksum64(head.data(), head.size());
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, head.data(), head.size());
  XXH3_64bits_update(&st, data.data(), data.size());
  return XXH3_64bits_digest(&st);
}

Status GetRecordStatus(const GetRecord& r) {
  if (r.status == StatusCode::kOk) return Status::Ok();
  if (r.status == StatusCode::kNotFound) return NotFound("not stored");
  return ItemStatus(static_cast<uint8_t>(r.status));
}

Status VerifyPayload(std::span<const std::byte> bytes, uint64_t checksum) {
  if (Checksum64(bytes.data(), bytes.size()) == checksum) return Status::Ok();
  return DataLoss("payload checksum mismatch in transit");
}

}  // namespace kvmesh::proto
