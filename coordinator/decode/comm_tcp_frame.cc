#include "coordinator/decode/comm_tcp_frame.h"

#include <sys/uio.h>

#include <array>
#include <cstring>
#include <sstream>

#include "common/checksum.h"
#include "transport/socket_util.h"

namespace kvmesh::decode::tcp_step {
namespace {

constexpr uint32_t kMagic = 0x4353564bu;  // "KVSC" little-endian
constexpr uint8_t kVersion = 2;           // 2: the full mesh (1 was the star)

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kHello: return "hello";
    case Op::kWelcome: return "welcome";
    case Op::kSumF32: return "AllReduceSum";
    case Op::kMinU64: return "AllReduceMin";
    case Op::kSumU64: return "AllReduceSumU64";
    case Op::kBroadcast: return "Broadcast";
    case Op::kBarrier: return "Barrier";
    case Op::kAbort: return "abort";
    case Op::kPeerHello: return "peer hello";
    case Op::kReady: return "ready";
  }
  return "unknown";
}

void EncodeHeader(const Header& h, std::byte* b) {
  PutLe(&b[0], kMagic, 4);
  PutLe(&b[4], kVersion, 1);
  PutLe(&b[5], static_cast<uint8_t>(h.op), 1);
  PutLe(&b[6], h.root, 2);
  PutLe(&b[8], h.seq, 8);
  PutLe(&b[16], h.len, 8);
  PutLe(&b[24], h.sum, 8);
  PutLe(&b[32], Checksum64(b, 32), 8);
}

Status DecodeHeader(const std::byte* b, const std::string& from, Header* h) {
  if (GetLe(&b[32], 8) != Checksum64(b, 32))
    return DataLoss("bad frame header from " + from + " (checksum mismatch: not a kvmesh step peer, or corrupted)");
  if (GetLe(&b[0], 4) != kMagic) return DataLoss("bad frame magic from " + from);
  if (GetLe(&b[4], 1) != kVersion)
    return DataLoss("frame version " + std::to_string(GetLe(&b[4], 1)) + " from " + from + ", expected " +
                    std::to_string(kVersion));
  h->op = static_cast<Op>(GetLe(&b[5], 1));
  h->root = static_cast<uint16_t>(GetLe(&b[6], 2));
  h->seq = GetLe(&b[8], 8);
  h->len = GetLe(&b[16], 8);
  h->sum = GetLe(&b[24], 8);
  return Status::Ok();
}

Status CheckExpected(const Header& got, const Header& want, const std::string& from) {
  if (got.op == want.op && got.root == want.root && got.seq == want.seq && got.len == want.len) return Status::Ok();
  std::ostringstream m;
  m << "collective mismatch: " << from << " sent " << OpName(got.op) << " #" << got.seq << " (root " << got.root
    << ", " << got.len << " bytes), expected " << OpName(want.op) << " #" << want.seq << " (root " << want.root
    << ", " << want.len << " bytes)";
  if (got.op < Op::kHello || got.op > Op::kReady) return DataLoss(m.str());
  return Internal(m.str());
}

std::string RankName(int r) { return "rank " + std::to_string(r); }

Status ReadAbort(int fd, const Header& h, std::span<const std::byte> have, const std::string& from) {
  if (h.len > kMaxAbortBytes) return DataLoss("oversized abort frame from " + from);
  std::string why(h.len, '\0');
  const size_t n = std::min<size_t>(have.size(), why.size());
  if (n > 0) std::memcpy(why.data(), have.data(), n);
  KVMESH_RETURN_IF_ERROR(ReadFullUntil(fd, why.data() + n, why.size() - n, Clock::now() + kAbortWait, from));
  const auto code = static_cast<StatusCode>(h.root);
  return Status(code == StatusCode::kOk ? StatusCode::kUnavailable : code, from + " aborted: " + why);
}

Status SendFrame(int fd, Header h, std::span<const std::byte> payload, Clock::time_point deadline,
                 const std::string& to) {
  h.len = payload.size();
  h.sum = Checksum64(payload.data(), payload.size());
  std::array<std::byte, kHeaderBytes> head;
  EncodeHeader(h, head.data());
  std::vector<iovec> iov{{head.data(), head.size()}};
  if (!payload.empty()) iov.push_back({const_cast<std::byte*>(payload.data()), payload.size()});
  Status s = WriteAllV(fd, iov, deadline);
  return s.ok() ? s : Status(s.code(), "to " + to + ": " + s.message());
}

void SendAbort(int fd, const Status& s, uint64_t seq, Clock::time_point deadline, const std::string& to) {
  const std::string why = s.ToString().substr(0, kMaxAbortBytes);
  (void)SendFrame(fd, Header{Op::kAbort, static_cast<uint16_t>(s.code()), seq, 0, 0},
                  std::as_bytes(std::span(why.data(), why.size())), deadline, to);
}

Status RecvFrame(int fd, const Header& want, std::vector<std::byte>* payload, Clock::time_point deadline,
                 const std::string& from) {
  std::array<std::byte, kHeaderBytes> b;
  KVMESH_RETURN_IF_ERROR(ReadFullUntil(fd, b.data(), b.size(), deadline, from));
  Header h;
  KVMESH_RETURN_IF_ERROR(DecodeHeader(b.data(), from, &h));
  if (h.op == Op::kAbort) return ReadAbort(fd, h, {}, from);
  KVMESH_RETURN_IF_ERROR(CheckExpected(h, want, from));
  payload->resize(h.len);
  KVMESH_RETURN_IF_ERROR(ReadFullUntil(fd, payload->data(), payload->size(), deadline, from));
  if (Checksum64(payload->data(), payload->size()) != h.sum)
    return DataLoss("payload checksum mismatch in " + std::string(OpName(h.op)) + " from " + from);
  return Status::Ok();
}

}  // namespace kvmesh::decode::tcp_step
