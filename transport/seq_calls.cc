#include "transport/seq_calls.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "common/checksum.h"

namespace kvmesh {
namespace {

using namespace proto;

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

// An answer that does not parse is the node's fault, not the caller's.
Status BadAnswer(const Status& s) { return s.ok() ? s : Unavailable("bad answer from the node: " + s.message()); }

// A request whose body is one encoded string.
Status Call(SeqFrameIo& io, Opcode op, const std::string& body, const RequestOptions& o,
            std::vector<std::byte>* answer) {
  const std::span<const std::byte> pieces[] = {Bytes(body)};
  return io.SeqRoundtrip(op, pieces, o, answer);
}

// One SEQ_APPEND frame: the head, then K and V as they are (never copied).
Result<uint32_t> AppendFrame(SeqFrameIo& io, SeqId id, std::span<const TokenId> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v, uint32_t layers, const RequestOptions& o) {
  const std::string head =
      EncodeSeqAppendHead(id, layers, tokens, Checksum64(k.data(), k.size()), Checksum64(v.data(), v.size()));
  const std::span<const std::byte> pieces[] = {Bytes(head), k, v};
  std::vector<std::byte> answer;
  KVMESH_RETURN_IF_ERROR(io.SeqRoundtrip(Opcode::kSeqAppend, pieces, o, &answer));
  uint32_t pos = 0;
  KVMESH_RETURN_IF_ERROR(BadAnswer(ParseU32Answer(answer, &pos)));
  return pos;
}

}  // namespace

Result<SeqCreated> SeqCreateCall(SeqFrameIo& io, const SeqCreateArgs& a, const RequestOptions& o) {
  if (a.tenant_salt.size() > kMaxStringBytes) return InvalidArgument("tenant salt longer than 256 bytes");
  SeqCreateRequest q;
  q.layers = a.layers;
  q.heads = a.heads;
  q.priority = a.priority;
  q.max_blocks = a.max_blocks >= kSeqNoLimit ? kSeqNoLimit : static_cast<uint32_t>(a.max_blocks);
  q.tenant_salt = a.tenant_salt;
  q.prefix.assign(a.prefix.begin(), a.prefix.end());
  std::vector<std::byte> answer;
  KVMESH_RETURN_IF_ERROR(Call(io, Opcode::kSeqCreate, EncodeSeqCreate(q), o, &answer));
  SeqCreated created;
  KVMESH_RETURN_IF_ERROR(BadAnswer(ParseSeqCreateAnswer(answer, &created)));
  return created;
}

Result<uint32_t> SeqAppendCall(SeqFrameIo& io, SeqId id, std::span<const TokenId> tokens,
                               std::span<const std::byte> k, std::span<const std::byte> v, uint32_t layers,
                               const RequestOptions& o) {
  KVMESH_ASSIGN_OR_RETURN(const uint64_t max_body, io.SeqMaxBody());
  const uint64_t n = tokens.size();
  const bool regular = n > 0 && layers > 0 && k.size() == v.size() && k.size() % (uint64_t{layers} * n) == 0;
  // An irregular shape goes as it is: the node refuses it with the reason.
  if (!regular || kSeqAppendFixed + 4 * n + 2 * uint64_t{k.size()} <= max_body)
    return AppendFrame(io, id, tokens, k, v, layers, o);
  // Too big for one frame: whole tokens per frame, K and V regathered per layer.
  const uint64_t row = k.size() / (uint64_t{layers} * n);
  const uint64_t per_token = 4 + 2 * uint64_t{layers} * row;
  const uint64_t c = max_body > kSeqAppendFixed ? (max_body - kSeqAppendFixed) / per_token : 0;
  if (c == 0) return InvalidArgument("one token of this slice exceeds the node's frame limit");
  uint32_t first = 0;
  std::vector<std::byte> kc, vc;
  for (uint64_t start = 0; start < n; start += c) {
    const uint64_t m = std::min(c, n - start);
    kc.resize(layers * m * row);
    vc.resize(kc.size());
    for (uint64_t l = 0; l < layers; ++l) {
      std::memcpy(kc.data() + l * m * row, k.data() + (l * n + start) * row, m * row);
      std::memcpy(vc.data() + l * m * row, v.data() + (l * n + start) * row, m * row);
    }
    KVMESH_ASSIGN_OR_RETURN(uint32_t pos, AppendFrame(io, id, tokens.subspan(start, m), kc, vc, layers, o));
    if (start == 0) first = pos;
  }
  return first;
}

Status SeqTruncateCall(SeqFrameIo& io, SeqId id, uint32_t n, const RequestOptions& o) {
  std::vector<std::byte> answer;
  return Call(io, Opcode::kSeqTruncate, EncodeSeqTruncate(id, n), o, &answer);
}

Result<SeqId> SeqForkCall(SeqFrameIo& io, SeqId id, const RequestOptions& o) {
  std::vector<std::byte> answer;
  KVMESH_RETURN_IF_ERROR(Call(io, Opcode::kSeqFork, EncodeSeqId(id), o, &answer));
  uint64_t f = 0;
  KVMESH_RETURN_IF_ERROR(BadAnswer(ParseSeqId(answer, &f)));
  return f;
}

Status SeqReleaseCall(SeqFrameIo& io, SeqId id, const RequestOptions& o) {
  std::vector<std::byte> answer;
  return Call(io, Opcode::kSeqRelease, EncodeSeqId(id), o, &answer);
}

Result<SequenceState> SeqInfoCall(SeqFrameIo& io, SeqId id, const RequestOptions& o) {
  std::vector<std::byte> answer;
  KVMESH_RETURN_IF_ERROR(Call(io, Opcode::kSeqInfo, EncodeSeqId(id), o, &answer));
  SequenceState state;
  KVMESH_RETURN_IF_ERROR(BadAnswer(ParseSeqInfoAnswer(answer, &state)));
  return state;
}

Status SeqReadCall(SeqFrameIo& io, SeqId id, uint32_t from, uint32_t n, std::vector<std::byte>* k,
                   std::vector<std::byte>* v, const RequestOptions& o) {
  uint32_t done = 0, layers = 0, row = 0;
  bool first = true;
  std::vector<std::byte> kout, vout, answer;
  do {
    KVMESH_RETURN_IF_ERROR(Call(io, Opcode::kSeqRead, EncodeSeqRead(id, from + done, n - done), o, &answer));
    SeqReadAnswer a;
    KVMESH_RETURN_IF_ERROR(BadAnswer(ParseSeqReadAnswer(answer, &a)));
    if (a.n > n - done || (a.n == 0 && done < n) || (!first && (a.layers != layers || a.row_bytes != row)))
      return BadAnswer(InvalidArgument("SEQ_READ answer does not fit the request"));
    if (first) {  // the shape of the whole read, sized once
      layers = a.layers;
      row = a.row_bytes;
      const uint64_t side = uint64_t{layers} * n * row;
      if (side > SIZE_MAX / 2) return BadAnswer(InvalidArgument("SEQ_READ shape too large"));
      kout.assign(side, std::byte{0});
      vout.assign(side, std::byte{0});
      first = false;
    }
    if (Checksum64(a.k.data(), a.k.size()) != a.k_checksum || Checksum64(a.v.data(), a.v.size()) != a.v_checksum)
      return DataLoss("SEQ_READ K/V checksum mismatch in transit");
    for (uint64_t l = 0; l < layers; ++l) {
      std::memcpy(kout.data() + (l * n + done) * row, a.k.data() + l * a.n * row, size_t{a.n} * row);
      std::memcpy(vout.data() + (l * n + done) * row, a.v.data() + l * a.n * row, size_t{a.n} * row);
    }
    done += a.n;
  } while (done < n);
  *k = std::move(kout);
  *v = std::move(vout);
  return Status::Ok();
}

}  // namespace kvmesh
