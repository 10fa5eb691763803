#include "transport/protocol.h"

#include <cstring>
#include <tuple>

#include "common/checksum.h"

namespace kvmesh::proto {
namespace {

// Little-endian stores and loads (the protocol is LE on every host).
template <typename T>
void Store(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF);
}
template <typename T>
T Load(const std::byte* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}
template <typename T>
void Append(std::string* out, T v) {
  std::byte b[sizeof(T)];
  Store(b, v);
  out->append(reinterpret_cast<const char*>(b), sizeof(T));
}

void AppendString(std::string* out, std::string_view s) {
  Append<uint16_t>(out, static_cast<uint16_t>(s.size()));
  out->append(s);
}

// A bounds-checked reader over an untrusted span.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    *v = Load<T>(b_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s, size_t max) {
    uint16_t n = 0;
    if (!Get(&n) || n > max || b_.size() - pos_ < n) return false;
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }
  // n i32 tokens, after checking they are there (nothing allocated otherwise).
  bool GetTokens(uint32_t n, std::vector<TokenId>* out) {
    if (left() / 4 < n) return false;
    out->resize(n);
    for (uint32_t i = 0; i < n; ++i) (*out)[i] = Load<int32_t>(b_.data() + pos_ + size_t{i} * 4);
    pos_ += size_t{n} * 4;
    return true;
  }
  std::span<const std::byte> Take(size_t n) {
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

constexpr size_t kMaxErrorBytes = 1024;
constexpr size_t kMaxHelloBody = 4 + 3 * (2 + kMaxStringBytes);
constexpr size_t kMaxHelloAnswerBody = 2 + kMaxStringBytes + 12;

uint32_t HeaderChecksum(const std::byte* p) { return static_cast<uint32_t>(Checksum64(p, 36)); }

Status Malformed(std::string what) { return InvalidArgument("malformed frame: " + std::move(what)); }

// Fixed-layout bodies: the fields in order, little-endian, nothing after.
template <typename... T>
std::string EncodeFixed(T... v) {
  std::string out;
  (Append<T>(&out, v), ...);
  return out;
}
// Writes the outputs only when the whole body parses.
template <typename... T>
bool ParseFixed(std::span<const std::byte> body, T*... out) {
  Reader r(body);
  std::tuple<T...> v;
  if (!std::apply([&r](auto&... x) { return (r.Get(&x) && ...); }, v) || !r.done()) return false;
  std::tie(*out...) = v;
  return true;
}

// Body length bounds of SEQ frames (the parsers check the exact sizes).
constexpr uint64_t kAny = UINT32_MAX;
uint64_t SeqRequestMin(Opcode op) {
  switch (op) {
    case Opcode::kSeqCreate: return kSeqCreateFixed;
    case Opcode::kSeqAppend: return kSeqAppendFixed;
    case Opcode::kSeqTruncate: return 12;
    case Opcode::kSeqRead: return 16;
    default: return 8;  // FORK, RELEASE, INFO: the id
  }
}
uint64_t SeqRequestMax(Opcode op) {
  switch (op) {
    case Opcode::kSeqCreate:
    case Opcode::kSeqAppend: return kAny;
    default: return SeqRequestMin(op);
  }
}
uint64_t SeqAnswerMin(Opcode op) {
  switch (op) {
    case Opcode::kSeqCreate: return 16;
    case Opcode::kSeqAppend: return 4;
    case Opcode::kSeqFork: return 8;
    case Opcode::kSeqInfo: return 12;
    case Opcode::kSeqRead: return kSeqReadAnswerFixed;
    default: return 0;  // TRUNCATE, RELEASE
  }
}
uint64_t SeqAnswerMax(Opcode op) {
  switch (op) {
    case Opcode::kSeqInfo:
    case Opcode::kSeqRead: return kAny;
    default: return SeqAnswerMin(op);
  }
}

}  // namespace

std::string_view OpcodeName(Opcode op) {
  switch (op) {
    case Opcode::kHello: return "HELLO";
    case Opcode::kPut: return "PUT";
    case Opcode::kGet: return "GET";
    case Opcode::kExists: return "EXISTS";
    case Opcode::kMatchPrefix: return "MATCH_PREFIX";
    case Opcode::kErase: return "ERASE";
    case Opcode::kPin: return "PIN";
    case Opcode::kUnpin: return "UNPIN";
    case Opcode::kStats: return "STATS";
    case Opcode::kSeqCreate: return "SEQ_CREATE";
    case Opcode::kSeqAppend: return "SEQ_APPEND";
    case Opcode::kSeqTruncate: return "SEQ_TRUNCATE";
    case Opcode::kSeqFork: return "SEQ_FORK";
    case Opcode::kSeqRelease: return "SEQ_RELEASE";
    case Opcode::kSeqInfo: return "SEQ_INFO";
    case Opcode::kSeqRead: return "SEQ_READ";
    case Opcode::kMemRegister: return "MEM_REGISTER";
    case Opcode::kMemUnregister: return "MEM_UNREGISTER";
    case Opcode::kGetInto: return "GET_INTO";
    case Opcode::kPutFrom: return "PUT_FROM";
    case Opcode::kRelease: return "RELEASE";
    case Opcode::kLocalMap: return "LOCAL_MAP";
  }
  return "?";
}

bool IsKnownOpcode(uint8_t op) { return op >= 1 && op <= kMaxOpcode; }
bool IsValidStatusCode(uint8_t code) { return code <= static_cast<uint8_t>(StatusCode::kPermissionDenied); }

// Layout: 0 magic u32 | 4 version u16 | 6 opcode u8 | 7 flags u8 | 8 request_id u64 |
// 16 epoch u64 | 24 count u32 | 28 body_len u32 | 32 status u8 | 33 reserved[3] | 36 checksum u32
HeaderBytes EncodeHeader(const FrameHeader& h) {
  HeaderBytes b{};
  Store<uint32_t>(&b[0], kMagic);
  Store<uint16_t>(&b[4], kVersion);
  Store<uint8_t>(&b[6], static_cast<uint8_t>(h.opcode));
  Store<uint8_t>(&b[7], h.flags);
  Store<uint64_t>(&b[8], h.request_id);
  Store<uint64_t>(&b[16], h.epoch);
  Store<uint32_t>(&b[24], h.count);
  Store<uint32_t>(&b[28], h.body_len);
  Store<uint8_t>(&b[32], static_cast<uint8_t>(h.status));
  Store<uint32_t>(&b[36], HeaderChecksum(b.data()));
  return b;
}

Status DecodeHeader(std::span<const std::byte> bytes, const ProtocolLimits& limits, FrameHeader* out) {
  if (bytes.size() < kHeaderSize) return Malformed("truncated header (" + std::to_string(bytes.size()) + " bytes)");
  const std::byte* p = bytes.data();
  if (Load<uint32_t>(p) != kMagic) return Malformed("bad magic");
  uint16_t version = Load<uint16_t>(p + 4);
  if (version != kVersion)
    return Malformed("unsupported protocol version " + std::to_string(version) + " (this node speaks " +
                     std::to_string(kVersion) + ")");
  if (Load<uint32_t>(p + 36) != HeaderChecksum(p)) return Malformed("header checksum mismatch");
  uint8_t op = Load<uint8_t>(p + 6), flags = Load<uint8_t>(p + 7), code = Load<uint8_t>(p + 32);
  if (!IsKnownOpcode(op)) return Malformed("unknown opcode " + std::to_string(op));
  if (flags & ~kKnownFlags) return Malformed("unknown flag bits");
  if (p[33] != std::byte{0} || p[34] != std::byte{0} || p[35] != std::byte{0}) return Malformed("reserved bytes set");
  if (!IsValidStatusCode(code)) return Malformed("unknown status code " + std::to_string(code));
  FrameHeader h;
  h.version = version;
  h.opcode = static_cast<Opcode>(op);
  h.flags = flags;
  h.request_id = Load<uint64_t>(p + 8);
  h.epoch = Load<uint64_t>(p + 16);
  h.count = Load<uint32_t>(p + 24);
  h.body_len = Load<uint32_t>(p + 28);
  h.status = static_cast<StatusCode>(code);
  if (h.body_len > limits.max_body_bytes)
    return ResourceExhausted("frame body of " + std::to_string(h.body_len) + " bytes exceeds the limit of " +
                             std::to_string(limits.max_body_bytes));
  if (h.count > limits.max_items)
    return ResourceExhausted("batch of " + std::to_string(h.count) + " items exceeds the limit of " +
                             std::to_string(limits.max_items));
  const uint64_t n = h.count, len = h.body_len;
  const bool resp = h.is_response();
  if (!resp && h.status != StatusCode::kOk) return Malformed("request with a status code");
  if (resp && h.status != StatusCode::kOk) {
    if (len > kMaxErrorBytes) return Malformed("error message too long");
  } else if (IsSequenceOpcode(h.opcode)) {
    if (n != 0 || len < (resp ? SeqAnswerMin(h.opcode) : SeqRequestMin(h.opcode)) ||
        len > (resp ? SeqAnswerMax(h.opcode) : SeqRequestMax(h.opcode)))
      return Malformed("bad " + std::string(OpcodeName(h.opcode)) + (resp ? " answer" : "") + " length");
  } else if (!resp) {
    switch (h.opcode) {
      case Opcode::kHello:
        if (n != 0 || len < 10 || len > kMaxHelloBody) return Malformed("bad HELLO length");
        break;
      case Opcode::kPut:
        if (len < n * kPutItemSize) return Malformed("PUT body shorter than its item table");
        break;
      case Opcode::kStats:
        if (n != 0 || len != 0) return Malformed("STATS carries no body");
        break;
      case Opcode::kMemRegister:
        if (n != 0 || len < kMemRegisterFixed || len > kMemRegisterFixed + kMaxRkeyBytes + 8)
          return Malformed("bad MEM_REGISTER length");
        break;
      case Opcode::kMemUnregister:
        if (n != 0 || len != 8) return Malformed("MEM_UNREGISTER body is not 8 bytes");
        break;
      case Opcode::kGetInto:
        if (len != n * kGetIntoItemSize) return Malformed("GET_INTO body is not count x 40 bytes");
        break;
      case Opcode::kPutFrom:
        if (len != n * kPutFromItemSize) return Malformed("PUT_FROM body is not count x 48 bytes");
        break;
      case Opcode::kLocalMap:
        if (n != 0 || len != 8) return Malformed("LOCAL_MAP body is not 8 bytes");
        break;
      default:  // key lists
        if (len != n * kKeySize) return Malformed(std::string(OpcodeName(h.opcode)) + " body is not count x 16 bytes");
    }
  } else {
    switch (h.opcode) {
      case Opcode::kHello:
        if (len < 14 || len > kMaxHelloAnswerBody) return Malformed("bad HELLO answer length");
        break;
      case Opcode::kGet:
        if (len < n * kGetItemSize) return Malformed("GET answer shorter than its item table");
        break;
      case Opcode::kGetInto:
        if (len != n * kGetItemSize) return Malformed("GET_INTO answer is not count x 16 bytes");
        break;
      case Opcode::kMemRegister:
      case Opcode::kMemUnregister:
        if (n != 0 || len != 0) return Malformed(std::string(OpcodeName(h.opcode)) + " answer carries no body");
        break;
      case Opcode::kMatchPrefix:
        if (len != 4) return Malformed("MATCH_PREFIX answer is not 4 bytes");
        break;
      case Opcode::kStats:
        break;
      case Opcode::kLocalMap:
        if (n != 0 || len < 20 || len > 20 + 2 * kMaxStringBytes) return Malformed("bad LOCAL_MAP answer length");
        break;
      default:  // one status byte per item
        if (len != n) return Malformed(std::string(OpcodeName(h.opcode)) + " answer is not one byte per item");
    }
  }
  *out = h;
  return Status::Ok();
}

std::string EncodeHelloBody(const Hello& h) {
  std::string out;
  Append<uint16_t>(&out, h.version_min);
  Append<uint16_t>(&out, h.version_max);
  AppendString(&out, h.client_id.substr(0, kMaxStringBytes));
  AppendString(&out, h.tenant.substr(0, kMaxStringBytes));
  AppendString(&out, h.token.substr(0, kMaxStringBytes));
  return out;
}

Status ParseHelloBody(std::span<const std::byte> body, Hello* out) {
  Reader r(body);
  Hello h;
  if (!r.Get(&h.version_min) || !r.Get(&h.version_max) || !r.GetString(&h.client_id, kMaxStringBytes) ||
      !r.GetString(&h.tenant, kMaxStringBytes) || !r.GetString(&h.token, kMaxStringBytes) || !r.done())
    return Malformed("bad HELLO body");
  if (h.version_min > h.version_max) return Malformed("HELLO version range is empty");
  *out = std::move(h);
  return Status::Ok();
}

std::string EncodeHelloAnswerBody(const HelloAnswer& a) {
  std::string out;
  AppendString(&out, a.node_id.substr(0, kMaxStringBytes));
  Append<uint32_t>(&out, a.limits.max_body_bytes);
  Append<uint32_t>(&out, a.limits.max_items);
  Append<uint32_t>(&out, a.limits.max_block_bytes);
  return out;
}

Status ParseHelloAnswerBody(std::span<const std::byte> body, HelloAnswer* out) {
  Reader r(body);
  HelloAnswer a;
  if (!r.GetString(&a.node_id, kMaxStringBytes) || !r.Get(&a.limits.max_body_bytes) ||
      !r.Get(&a.limits.max_items) || !r.Get(&a.limits.max_block_bytes) || !r.done())
    return Malformed("bad HELLO answer body");
  *out = std::move(a);
  return Status::Ok();
}

void AppendKey(std::string* out, const BlockKey& k) {
  Append<uint64_t>(out, k.hi);
  Append<uint64_t>(out, k.lo);
}

BlockKey ReadKey(const std::byte* p) { return BlockKey{Load<uint64_t>(p), Load<uint64_t>(p + 8)}; }

Status ParseKeys(const FrameHeader& h, std::span<const std::byte> body, std::vector<BlockKey>* out) {
  if (body.size() != uint64_t{h.count} * kKeySize) return Malformed("key list length mismatch");
  out->clear();
  out->reserve(h.count);
  for (uint32_t i = 0; i < h.count; ++i) out->push_back(ReadKey(body.data() + i * kKeySize));
  return Status::Ok();
}

void EncodePutRecord(const PutRecord& r, std::byte out[kPutItemSize]) {
  Store<uint64_t>(out, r.key.hi);
  Store<uint64_t>(out + 8, r.key.lo);
  Store<uint32_t>(out + 16, r.size);
  Store<uint8_t>(out + 20, r.priority);
  Store<uint8_t>(out + 21, r.codec);
  Store<uint16_t>(out + 22, 0);
  Store<uint64_t>(out + 24, r.checksum);
}

Status ParsePutTable(const FrameHeader& h, std::span<const std::byte> table, const ProtocolLimits& limits,
                     std::vector<PutRecord>* out) {
  const uint64_t table_bytes = uint64_t{h.count} * kPutItemSize;
  if (table.size() != table_bytes || h.body_len < table_bytes) return Malformed("PUT item table length mismatch");
  out->clear();
  out->reserve(h.count);
  uint64_t total = 0;
  for (uint32_t i = 0; i < h.count; ++i) {
    const std::byte* p = table.data() + i * kPutItemSize;
    PutRecord r;
    r.key = ReadKey(p);
    r.size = Load<uint32_t>(p + 16);
    r.priority = Load<uint8_t>(p + 20);
    r.codec = Load<uint8_t>(p + 21);
    if (Load<uint16_t>(p + 22) != 0) return Malformed("PUT item reserved bytes set");
    r.checksum = Load<uint64_t>(p + 24);
    if (r.size == 0) return Malformed("PUT item " + std::to_string(i) + " is empty");
    if (r.size > limits.max_block_bytes)
      return ResourceExhausted("PUT item " + std::to_string(i) + " of " + std::to_string(r.size) +
                               " bytes exceeds the block limit of " + std::to_string(limits.max_block_bytes));
    if (r.priority >= kMaxPriorityClasses) return Malformed("PUT item priority out of range");
    total += r.size;
    out->push_back(r);
  }
  if (total != h.body_len - table_bytes) return Malformed("PUT payload sizes do not add up to the body length");
  return Status::Ok();
}

void EncodeGetRecord(const GetRecord& r, std::byte out[kGetItemSize]) {
  Store<uint8_t>(out, static_cast<uint8_t>(r.status));
  out[1] = out[2] = out[3] = std::byte{0};
  Store<uint32_t>(out + 4, r.size);
  Store<uint64_t>(out + 8, r.checksum);
}

Status ParseGetTable(const FrameHeader& h, std::span<const std::byte> table, const ProtocolLimits& limits,
                     std::vector<GetRecord>* out) {
  const uint64_t table_bytes = uint64_t{h.count} * kGetItemSize;
  if (table.size() != table_bytes || h.body_len < table_bytes) return Malformed("GET item table length mismatch");
  out->clear();
  out->reserve(h.count);
  uint64_t total = 0;
  for (uint32_t i = 0; i < h.count; ++i) {
    const std::byte* p = table.data() + i * kGetItemSize;
    uint8_t code = Load<uint8_t>(p);
    if (!IsValidStatusCode(code)) return Malformed("GET item status code out of range");
    if (p[1] != std::byte{0} || p[2] != std::byte{0} || p[3] != std::byte{0}) return Malformed("GET item reserved bytes set");
    GetRecord r{static_cast<StatusCode>(code), Load<uint32_t>(p + 4), Load<uint64_t>(p + 8)};
    if (r.status != StatusCode::kOk && r.status != StatusCode::kResourceExhausted && r.size != 0)
      return Malformed("GET miss with a payload size");
    if (r.size > limits.max_block_bytes) return ResourceExhausted("GET item larger than the block limit");
    if (r.status == StatusCode::kOk) total += r.size;
    out->push_back(r);
  }
  // A GET_INTO answer carries no payloads: the node wrote them into client memory.
  const uint64_t payloads = h.opcode == Opcode::kGetInto ? 0 : total;
  if (payloads != h.body_len - table_bytes) return Malformed("GET payload sizes do not add up to the body length");
  return Status::Ok();
}

Status ItemStatus(uint8_t code) {
  if (code == 0) return Status::Ok();
  auto c = static_cast<StatusCode>(code);
  return Status(c, "node answered " + std::string(StatusCodeName(c)));
}

Status ParseStatusBytes(const FrameHeader& h, std::span<const std::byte> body, std::vector<uint8_t>* out) {
  if (body.size() != h.count) return Malformed("status list length mismatch");
  out->resize(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    uint8_t c = static_cast<uint8_t>(body[i]);
    if (!IsValidStatusCode(c)) return Malformed("item status code out of range");
    (*out)[i] = c;
  }
  return Status::Ok();
}

Status ParseMatchAnswer(const FrameHeader& h, std::span<const std::byte> body, uint32_t* matched) {
  if (body.size() != 4) return Malformed("MATCH_PREFIX answer length");
  uint32_t m = Load<uint32_t>(body.data());
  if (m > h.count && h.count != 0) return Malformed("MATCH_PREFIX answer larger than the request");
  *matched = m;
  return Status::Ok();
}

Status ParseErrorBody(const FrameHeader& h, std::span<const std::byte> body) {
  if (h.status == StatusCode::kOk) return Internal("ParseErrorBody on an OK answer");
  std::string msg(reinterpret_cast<const char*>(body.data()), std::min<size_t>(body.size(), kMaxErrorBytes));
  for (char& c : msg)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return Status(h.status, msg);
}

// ---- live sequences ----------------------------------------------------------

std::string EncodeSeqCreate(const SeqCreateRequest& r) {
  std::string out;
  Append<uint32_t>(&out, r.layers.begin);
  Append<uint32_t>(&out, r.layers.end);
  Append<uint32_t>(&out, r.heads.begin);
  Append<uint32_t>(&out, r.heads.end);
  Append<uint8_t>(&out, r.priority);
  Append<uint8_t>(&out, 0);
  Append<uint16_t>(&out, 0);
  Append<uint32_t>(&out, r.max_blocks);
  AppendString(&out, std::string_view(r.tenant_salt).substr(0, kMaxStringBytes));
  Append<uint32_t>(&out, static_cast<uint32_t>(r.prefix.size()));
  for (TokenId t : r.prefix) Append<int32_t>(&out, t);
  return out;
}

Status ParseSeqCreate(std::span<const std::byte> body, SeqCreateRequest* out) {
  Reader r(body);
  SeqCreateRequest q;
  uint8_t rsvd8 = 0;
  uint16_t rsvd16 = 0;
  uint32_t ntok = 0;
  if (!r.Get(&q.layers.begin) || !r.Get(&q.layers.end) || !r.Get(&q.heads.begin) || !r.Get(&q.heads.end) ||
      !r.Get(&q.priority) || !r.Get(&rsvd8) || !r.Get(&rsvd16) || !r.Get(&q.max_blocks) ||
      !r.GetString(&q.tenant_salt, kMaxStringBytes) || !r.Get(&ntok))
    return Malformed("bad SEQ_CREATE body");
  if (rsvd8 != 0 || rsvd16 != 0) return Malformed("SEQ_CREATE reserved bytes set");
  if (q.priority >= kMaxPriorityClasses) return Malformed("SEQ_CREATE priority out of range");
  if (q.layers.end < q.layers.begin || q.heads.end < q.heads.begin) return Malformed("SEQ_CREATE range reversed");
  if (uint64_t{ntok} * 4 != r.left() || !r.GetTokens(ntok, &q.prefix)) return Malformed("SEQ_CREATE token count mismatch");
  *out = std::move(q);
  return Status::Ok();
}

std::string EncodeSeqCreateAnswer(const SeqCreated& a) {
  std::string out;
  Append<uint64_t>(&out, a.id);
  Append<uint32_t>(&out, a.length);
  Append<uint32_t>(&out, a.attached_blocks);
  return out;
}

Status ParseSeqCreateAnswer(std::span<const std::byte> body, SeqCreated* out) {
  Reader r(body);
  SeqCreated a;
  if (!r.Get(&a.id) || !r.Get(&a.length) || !r.Get(&a.attached_blocks) || !r.done())
    return Malformed("bad SEQ_CREATE answer");
  *out = a;
  return Status::Ok();
}

std::string EncodeSeqAppendHead(uint64_t id, uint32_t layers, std::span<const TokenId> tokens, uint64_t k_checksum,
                                uint64_t v_checksum) {
  std::string out;
  out.reserve(kSeqAppendFixed + tokens.size() * 4);
  Append<uint64_t>(&out, id);
  Append<uint32_t>(&out, static_cast<uint32_t>(tokens.size()));
  Append<uint32_t>(&out, layers);
  Append<uint64_t>(&out, k_checksum);
  Append<uint64_t>(&out, v_checksum);
  for (TokenId t : tokens) Append<int32_t>(&out, t);
  return out;
}

Status ParseSeqAppend(std::span<const std::byte> body, SeqAppendRequest* out) {
  Reader r(body);
  SeqAppendRequest q;
  uint32_t n = 0;
  if (!r.Get(&q.id) || !r.Get(&n) || !r.Get(&q.layers) || !r.Get(&q.k_checksum) || !r.Get(&q.v_checksum))
    return Malformed("bad SEQ_APPEND body");
  if (!r.GetTokens(n, &q.tokens)) return Malformed("SEQ_APPEND tokens past the body");
  const uint64_t rest = r.left();
  if (rest % 2 != 0) return Malformed("SEQ_APPEND K and V differ in length");
  const uint64_t side = rest / 2;
  if (n == 0 ? side != 0 : (q.layers == 0 || side % (uint64_t{q.layers} * n) != 0))
    return Malformed("SEQ_APPEND K/V length is not layers x n rows");
  q.k = r.Take(side);
  q.v = r.Take(side);
  *out = std::move(q);
  return Status::Ok();
}

std::string EncodeSeqId(uint64_t id) { return EncodeFixed(id); }

Status ParseSeqId(std::span<const std::byte> body, uint64_t* id) {
  return ParseFixed(body, id) ? Status::Ok() : Malformed("sequence id body is not 8 bytes");
}

std::string EncodeSeqTruncate(uint64_t id, uint32_t n) { return EncodeFixed(id, n); }

Status ParseSeqTruncate(std::span<const std::byte> body, uint64_t* id, uint32_t* n) {
  return ParseFixed(body, id, n) ? Status::Ok() : Malformed("bad SEQ_TRUNCATE body");
}

std::string EncodeSeqRead(uint64_t id, uint32_t from, uint32_t n) { return EncodeFixed(id, from, n); }

Status ParseSeqRead(std::span<const std::byte> body, uint64_t* id, uint32_t* from, uint32_t* n) {
  return ParseFixed(body, id, from, n) ? Status::Ok() : Malformed("bad SEQ_READ body");
}

std::string EncodeU32(uint32_t v) { return EncodeFixed(v); }

Status ParseU32Answer(std::span<const std::byte> body, uint32_t* v) {
  return ParseFixed(body, v) ? Status::Ok() : Malformed("answer is not one u32");
}

std::string EncodeSeqInfoAnswer(const SequenceState& a) {
  std::string out;
  Append<uint32_t>(&out, a.length);
  Append<uint32_t>(&out, a.sealed_blocks);
  Append<uint32_t>(&out, static_cast<uint32_t>(a.tokens.size()));
  for (TokenId t : a.tokens) Append<int32_t>(&out, t);
  return out;
}

Status ParseSeqInfoAnswer(std::span<const std::byte> body, SequenceState* out) {
  Reader r(body);
  SequenceState a;
  uint32_t ntok = 0;
  if (!r.Get(&a.length) || !r.Get(&a.sealed_blocks) || !r.Get(&ntok)) return Malformed("bad SEQ_INFO answer");
  if (ntok != a.length || uint64_t{ntok} * 4 != r.left() || !r.GetTokens(ntok, &a.tokens))
    return Malformed("SEQ_INFO answer token count mismatch");
  *out = std::move(a);
  return Status::Ok();
}

std::string EncodeSeqReadAnswerHead(uint32_t n, uint32_t layers, uint32_t row_bytes, uint64_t k_checksum,
                                    uint64_t v_checksum) {
  std::string out;
  Append<uint32_t>(&out, n);
  Append<uint32_t>(&out, layers);
  Append<uint32_t>(&out, row_bytes);
  Append<uint32_t>(&out, 0);
  Append<uint64_t>(&out, k_checksum);
  Append<uint64_t>(&out, v_checksum);
  return out;
}

Status ParseSeqReadAnswer(std::span<const std::byte> body, SeqReadAnswer* out) {
  Reader r(body);
  SeqReadAnswer a;
  uint32_t rsvd = 0;
  if (!r.Get(&a.n) || !r.Get(&a.layers) || !r.Get(&a.row_bytes) || !r.Get(&rsvd) || !r.Get(&a.k_checksum) ||
      !r.Get(&a.v_checksum))
    return Malformed("bad SEQ_READ answer");
  if (rsvd != 0) return Malformed("SEQ_READ answer reserved bytes set");
  // Each factor is < 2^32 but the product may not be: check without overflow.
  const uint64_t rows = uint64_t{a.layers} * a.n;
  const uint64_t left = r.left();
  if (a.row_bytes != 0 && rows > left / 2 / a.row_bytes) return Malformed("SEQ_READ answer shorter than its rows");
  const uint64_t side = rows * a.row_bytes;
  if (side * 2 != left) return Malformed("SEQ_READ answer length mismatch");
  a.k = r.Take(side);
  a.v = r.Take(side);
  *out = a;
  return Status::Ok();
}

std::string EncodeMemRegister(const MemRegister& r) {
  std::string out;
  out.reserve(kMemRegisterFixed + r.rkey.size());
  Append<uint64_t>(&out, r.region);
  Append<uint64_t>(&out, r.base);
  Append<uint64_t>(&out, r.length);
  Append<uint16_t>(&out, static_cast<uint16_t>(r.rkey.size()));
  out += r.rkey;
  Append<uint64_t>(&out, r.host);
  return out;
}

std::string EncodeLocalMapAnswer(const LocalMapAnswer& a) {
  std::string out;
  Append<uint64_t>(&out, a.pool_bytes);
  Append<uint64_t>(&out, a.index_bytes);
  AppendString(&out, a.pool_path.substr(0, kMaxStringBytes));
  AppendString(&out, a.index_path.substr(0, kMaxStringBytes));
  return out;
}

Status ParseLocalMapAnswer(std::span<const std::byte> body, LocalMapAnswer* out) {
  Reader rd(body);
  LocalMapAnswer a;
  if (!rd.Get(&a.pool_bytes) || !rd.Get(&a.index_bytes) || !rd.GetString(&a.pool_path, kMaxStringBytes) ||
      !rd.GetString(&a.index_path, kMaxStringBytes) || !rd.done())
    return Malformed("bad LOCAL_MAP answer");
  if (a.pool_bytes == 0 || a.index_bytes == 0 || a.pool_path.empty() || a.index_path.empty())
    return Malformed("LOCAL_MAP answer names no memory");
  *out = std::move(a);
  return Status::Ok();
}

Status ParseMemRegister(std::span<const std::byte> body, MemRegister* out) {
  Reader rd(body);
  MemRegister r;
  if (!rd.Get(&r.region) || !rd.Get(&r.base) || !rd.Get(&r.length) || !rd.GetString(&r.rkey, kMaxRkeyBytes) ||
      (!rd.done() && !rd.Get(&r.host)) || !rd.done())
    return Malformed("bad MEM_REGISTER body");
  if (r.length == 0 || r.rkey.empty() || r.base + r.length < r.base) return Malformed("bad MEM_REGISTER region");
  *out = std::move(r);
  return Status::Ok();
}

void EncodeGetIntoRecord(const GetIntoRecord& r, std::byte out[kGetIntoItemSize]) {
  Store<uint64_t>(out, r.key.hi);
  Store<uint64_t>(out + 8, r.key.lo);
  Store<uint64_t>(out + 16, r.region);
  Store<uint64_t>(out + 24, r.addr);
  Store<uint32_t>(out + 32, r.capacity);
  Store<uint32_t>(out + 36, r.deadline_ms);
}

Status ParseGetIntoTable(const FrameHeader& h, std::span<const std::byte> body, std::vector<GetIntoRecord>* out) {
  if (body.size() != uint64_t{h.count} * kGetIntoItemSize) return Malformed("GET_INTO table length mismatch");
  out->clear();
  out->reserve(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    const std::byte* p = body.data() + size_t{i} * kGetIntoItemSize;
    GetIntoRecord r;
    r.key = ReadKey(p);
    r.region = Load<uint64_t>(p + 16);
    r.addr = Load<uint64_t>(p + 24);
    r.capacity = Load<uint32_t>(p + 32);
    r.deadline_ms = Load<uint32_t>(p + 36);
    if (r.addr + r.capacity < r.addr) return Malformed("GET_INTO item wraps the address space");
    out->push_back(r);
  }
  return Status::Ok();
}

void EncodePutFromRecord(const PutFromRecord& r, std::byte out[kPutFromItemSize]) {
  EncodePutRecord(r.put, out);
  Store<uint64_t>(out + kPutItemSize, r.region);
  Store<uint64_t>(out + kPutItemSize + 8, r.addr);
}

Status ParsePutFromTable(const FrameHeader& h, std::span<const std::byte> body, const ProtocolLimits& limits,
                         std::vector<PutFromRecord>* out) {
  if (body.size() != uint64_t{h.count} * kPutFromItemSize) return Malformed("PUT_FROM table length mismatch");
  out->clear();
  out->reserve(h.count);
  for (uint32_t i = 0; i < h.count; ++i) {
    const std::byte* p = body.data() + size_t{i} * kPutFromItemSize;
    PutFromRecord r;
    r.put.key = ReadKey(p);
    r.put.size = Load<uint32_t>(p + 16);
    r.put.priority = Load<uint8_t>(p + 20);
    r.put.codec = Load<uint8_t>(p + 21);
    if (Load<uint16_t>(p + 22) != 0) return Malformed("PUT_FROM item reserved bytes set");
    r.put.checksum = Load<uint64_t>(p + 24);
    r.region = Load<uint64_t>(p + 32);
    r.addr = Load<uint64_t>(p + 40);
    if (r.put.size == 0) return Malformed("PUT_FROM item " + std::to_string(i) + " is empty");
    if (r.put.size > limits.max_block_bytes)
      return ResourceExhausted("PUT_FROM item " + std::to_string(i) + " of " + std::to_string(r.put.size) +
                               " bytes exceeds the block limit of " + std::to_string(limits.max_block_bytes));
    if (r.put.priority >= kMaxPriorityClasses) return Malformed("PUT_FROM item priority out of range");
    if (r.addr + r.put.size < r.addr) return Malformed("PUT_FROM item wraps the address space");
    out->push_back(r);
  }
  return Status::Ok();
}

std::string BuildFrame(FrameHeader h, std::string_view body) {
  h.body_len = static_cast<uint32_t>(body.size());
  HeaderBytes hb = EncodeHeader(h);
  std::string out(reinterpret_cast<const char*>(hb.data()), hb.size());
  out.append(body);
  return out;
}

}  // namespace kvmesh::proto
