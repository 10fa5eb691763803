// transport/protocol.h — the kvmesh wire protocol (docs/protocol.md), shared by
// every byte-stream backend (Asio TCP today, UCX active messages carry the
// same frames). All parsing of untrusted bytes lives in protocol.cc, so one
// fuzz target (fuzz/fuzz_protocol.cc) covers it.
//
// A frame is a fixed 40-byte little-endian header followed by `body_len` body
// bytes. The header carries its own checksum; payload bytes carry per-item
// xxHash3-64 checksums in the item tables. Every length is checked against
// ProtocolLimits before anything is allocated:
//
//   FrameHeader h;
//   KVMESH_RETURN_IF_ERROR(DecodeHeader(bytes, limits, &h));  // magic, version, crc, opcode, sizes
//   ... read h.body_len bytes ...
//   KVMESH_RETURN_IF_ERROR(ParseKeys(h, body, &keys));         // counts vs body length
//
// Decoders never read past the spans they are given and never allocate more
// than limits allow. Encoders append to a std::string / vector (test and
// client side) or fill caller-provided tables (server side, so payloads can
// be written with scatter/gather straight from pool memory).
//
// Thread-safety: free functions on values; safe from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/sequence.h"
#include "kvmesh/status.h"
#include "kvmesh/types.h"

namespace kvmesh::proto {

inline constexpr uint32_t kMagic = 0x534D564B;  // "KVMS" in little-endian byte order
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderSize = 40;
inline constexpr size_t kKeySize = 16;        // hi, lo as u64 LE
inline constexpr size_t kPutItemSize = 32;    // key, size u32, priority u8, codec u8, rsvd u16, checksum u64
inline constexpr size_t kGetItemSize = 16;    // status u8, rsvd[3], size u32, checksum u64
inline constexpr size_t kMaxStringBytes = 256;  // handshake strings, error messages are cut to 1 KiB

enum class Opcode : uint8_t {
  kHello = 1,
  kPut = 2,
  kGet = 3,
  kExists = 4,
  kMatchPrefix = 5,
  kErase = 6,
  kPin = 7,
  kUnpin = 8,
  kStats = 9,
  // Live sequences (kvmesh/sequence.h), node-local ids; part of version 1.
  kSeqCreate = 10,
  kSeqAppend = 11,
  kSeqTruncate = 12,
  kSeqFork = 13,
  kSeqRelease = 14,
  kSeqInfo = 15,
  kSeqRead = 16,
  // One-sided transfers over UCX (docs/protocol.md "Registered memory"),
  // part of version 1: the node moves block bytes straight between its pool
  // and client memory the client registered on this session.
  kMemRegister = 17,
  kMemUnregister = 18,
  kGetInto = 19,
  kPutFrom = 20,
  // Eviction hint (docs/eviction.md "Session closes"): the keys' readers are
  // done; each becomes the next to leave until read again. Part of version 1.
  kRelease = 21,
  // Local reads (docs/protocol.md "Local reads"): a client on the node's
  // host asks to map the node's pool and its local-read index, once, after
  // the HELLO. Part of version 1 (a node older than it closes the session,
  // as for any opcode it does not know).
  kLocalMap = 22,
};
inline constexpr uint8_t kMaxOpcode = 22;
std::string_view OpcodeName(Opcode op);
bool IsKnownOpcode(uint8_t op);
// SEQ_CREATE .. SEQ_READ (live sequences).
inline bool IsSequenceOpcode(Opcode op) { return op >= Opcode::kSeqCreate && op <= Opcode::kSeqRead; }
// MEM_REGISTER .. PUT_FROM (one-sided transfers; UCX sessions only).
inline bool IsRemoteMemoryOpcode(Opcode op) { return op >= Opcode::kMemRegister && op <= Opcode::kPutFrom; }

// Header flag bits.
inline constexpr uint8_t kFlagResponse = 0x01;  // set on every answer
inline constexpr uint8_t kFlagTouch = 0x02;     // EXISTS: count hits as accesses
inline constexpr uint8_t kFlagReplace = 0x04;   // PUT: replace blocks already stored under the keys
inline constexpr uint8_t kKnownFlags = kFlagResponse | kFlagTouch | kFlagReplace;

struct FrameHeader {
  Opcode opcode = Opcode::kHello;
  uint8_t flags = 0;
  uint64_t request_id = 0;
  uint64_t epoch = 0;      // request: the caller's shard-map epoch (0 = unversioned); response: the node's
  uint32_t count = 0;      // items in the body
  uint32_t body_len = 0;
  StatusCode status = StatusCode::kOk;  // response: call-level status (non-OK: body is the message)
  uint16_t version = kVersion;

  bool is_response() const { return flags & kFlagResponse; }
};

// Bounds applied to every frame before allocation (config $.transport).
struct ProtocolLimits {
  uint32_t max_body_bytes = 64u << 20;   // whole frame body
  uint32_t max_items = 4096;             // items per batch
  uint32_t max_block_bytes = 16u << 20;  // one payload
};

using HeaderBytes = std::array<std::byte, kHeaderSize>;

// Writes `h` (version forced to kVersion) with its checksum.
HeaderBytes EncodeHeader(const FrameHeader& h);
// Validates magic, version, header checksum, opcode, flags, reserved bits,
// status code, body_len <= max_body_bytes, count <= max_items, and the body
// length each opcode implies for its count (exact for key lists, a lower
// bound for PUT / GET answers). Errors are InvalidArgument (malformed) or
// ResourceExhausted (over a limit); either way the connection must be closed.
Status DecodeHeader(std::span<const std::byte> bytes, const ProtocolLimits& limits, FrameHeader* out);

// ---- HELLO -----------------------------------------------------------------
// Request body: u16 version_min, u16 version_max, then three strings
// (u16 length + bytes, each <= kMaxStringBytes): client_id, tenant, token.
// Answer body (OK): string node_id, u32 max_body_bytes, u32 max_items, u32 max_block_bytes.
struct Hello {
  uint16_t version_min = kVersion;
  uint16_t version_max = kVersion;
  std::string client_id;
  std::string tenant;
  std::string token;
};
struct HelloAnswer {
  std::string node_id;
  ProtocolLimits limits;
};
std::string EncodeHelloBody(const Hello& h);
Status ParseHelloBody(std::span<const std::byte> body, Hello* out);
std::string EncodeHelloAnswerBody(const HelloAnswer& a);
Status ParseHelloAnswerBody(std::span<const std::byte> body, HelloAnswer* out);

// ---- LOCAL_MAP ---------------------------------------------------------------
// Request body: u64 the client's HostBootId(). Answer (OK): u64 pool_bytes,
// u64 index_bytes, then two strings: the paths the client opens the pool and
// the index by (/proc/<node pid>/fd/<n>). FailedPrecondition when the node
// offers no local reads to this client (another host, a tenant, none made).
struct LocalMapAnswer {
  uint64_t pool_bytes = 0;
  uint64_t index_bytes = 0;
  std::string pool_path;
  std::string index_path;
};
std::string EncodeLocalMapAnswer(const LocalMapAnswer& a);
Status ParseLocalMapAnswer(std::span<const std::byte> body, LocalMapAnswer* out);

// ---- key lists (GET, EXISTS, MATCH_PREFIX, ERASE, PIN, UNPIN requests) -----
void AppendKey(std::string* out, const BlockKey& k);
BlockKey ReadKey(const std::byte* p);
// REQUIRES: h was accepted by DecodeHeader. Checks body == count * 16.
Status ParseKeys(const FrameHeader& h, std::span<const std::byte> body, std::vector<BlockKey>* out);

// ---- PUT request -------------------------------------------------------------
// Body: count item records (kPutItemSize each), then the payloads in item order.
struct PutRecord {
  BlockKey key;
  uint32_t size = 0;
  Priority priority = kDefaultPriority;
  uint8_t codec = 0;
  uint64_t checksum = 0;  // xxHash3-64 of the payload
};
void EncodePutRecord(const PutRecord& r, std::byte out[kPutItemSize]);
// Parses the item table `table` (count * kPutItemSize bytes) and checks every
// size against limits and that the sizes add up to body_len - table size.
// Payload i then starts at the sum of sizes 0..i-1 after the table.
Status ParsePutTable(const FrameHeader& h, std::span<const std::byte> table, const ProtocolLimits& limits,
                     std::vector<PutRecord>* out);

// ---- GET answer --------------------------------------------------------------
// Body: count item records (kGetItemSize each), then the payloads of the hits
// (size > 0 only when status is OK) in item order.
struct GetRecord {
  StatusCode status = StatusCode::kOk;
  uint32_t size = 0;
  uint64_t checksum = 0;
};
void EncodeGetRecord(const GetRecord& r, std::byte out[kGetItemSize]);
// For a GET_INTO answer (h.opcode kGetInto) the body is the table alone.
Status ParseGetTable(const FrameHeader& h, std::span<const std::byte> table, const ProtocolLimits& limits,
                     std::vector<GetRecord>* out);

// ---- status-per-item answers (PUT, EXISTS, ERASE, PIN, UNPIN) -----------------
// Body: count bytes, one StatusCode (EXISTS: 1 = found, 0 = not) per item.
Status ParseStatusBytes(const FrameHeader& h, std::span<const std::byte> body, std::vector<uint8_t>* out);
// One item's status byte as a Status (0 = OK; otherwise "node answered <code>").
Status ItemStatus(uint8_t code);

// MATCH_PREFIX answer body: u32 number of leading hits.
Status ParseMatchAnswer(const FrameHeader& h, std::span<const std::byte> body, uint32_t* matched);

// Error answer body: the message text (<= 1 KiB). Non-OK status required.
Status ParseErrorBody(const FrameHeader& h, std::span<const std::byte> body);

// Checks a status code byte from the wire.
bool IsValidStatusCode(uint8_t code);

// ---- live sequences (SEQ_*; docs/protocol.md "Live sequences") ----------------
// Every SEQ frame has count 0; the body carries its own sizes, each checked
// against the body length before anything is allocated. K and V travel as
// [layer][n][heads][head_dim] over the sequence's slice, each with its own
// xxHash3-64.
inline constexpr uint32_t kSeqNoLimit = 0xFFFFFFFFu;  // SEQ_CREATE max_blocks: no limit
inline constexpr size_t kSeqCreateFixed = 30;   // ranges 16, priority 1, rsvd 3, max_blocks 4, salt len 2, ntok 4
inline constexpr size_t kSeqAppendFixed = 32;   // id 8, n 4, layers 4, k checksum 8, v checksum 8
inline constexpr size_t kSeqReadAnswerFixed = 32;  // n 4, layers 4, row_bytes 4, rsvd 4, checksums 16

struct SeqCreateRequest {
  Range layers;  // empty: all layers
  Range heads;   // empty: all KV heads
  Priority priority = kDefaultPriority;
  uint32_t max_blocks = kSeqNoLimit;
  std::string tenant_salt;      // <= kMaxStringBytes
  std::vector<TokenId> prefix;  // attach the leading full blocks the node has
};
std::string EncodeSeqCreate(const SeqCreateRequest& r);
Status ParseSeqCreate(std::span<const std::byte> body, SeqCreateRequest* out);

// SEQ_CREATE answer: id u64, length u32, attached_blocks u32.
std::string EncodeSeqCreateAnswer(const SeqCreated& a);
Status ParseSeqCreateAnswer(std::span<const std::byte> body, SeqCreated* out);

// SEQ_APPEND request: the fixed part and the tokens; K then V follow (sent
// as separate pieces so payloads are never copied into one buffer).
std::string EncodeSeqAppendHead(uint64_t id, uint32_t layers, std::span<const TokenId> tokens, uint64_t k_checksum,
                                uint64_t v_checksum);
// A parsed SEQ_APPEND: k and v point into the body. K and V are equally long;
// with n > 0 each is a whole number of layers x n rows.
struct SeqAppendRequest {
  uint64_t id = 0;
  uint32_t layers = 0;
  std::vector<TokenId> tokens;
  uint64_t k_checksum = 0, v_checksum = 0;
  std::span<const std::byte> k, v;
};
Status ParseSeqAppend(std::span<const std::byte> body, SeqAppendRequest* out);

// SEQ_FORK / SEQ_RELEASE / SEQ_INFO requests and the SEQ_FORK answer: one u64.
std::string EncodeSeqId(uint64_t id);
Status ParseSeqId(std::span<const std::byte> body, uint64_t* id);
// SEQ_TRUNCATE request: id u64, n u32.  SEQ_READ request: id u64, from u32, n u32.
std::string EncodeSeqTruncate(uint64_t id, uint32_t n);
Status ParseSeqTruncate(std::span<const std::byte> body, uint64_t* id, uint32_t* n);
std::string EncodeSeqRead(uint64_t id, uint32_t from, uint32_t n);
Status ParseSeqRead(std::span<const std::byte> body, uint64_t* id, uint32_t* from, uint32_t* n);
// SEQ_APPEND answer: u32 position of the first appended token.
std::string EncodeU32(uint32_t v);
Status ParseU32Answer(std::span<const std::byte> body, uint32_t* v);

// SEQ_INFO answer: length u32, sealed_blocks u32, ntok u32, tokens.
std::string EncodeSeqInfoAnswer(const SequenceState& a);
Status ParseSeqInfoAnswer(std::span<const std::byte> body, SequenceState* out);

// SEQ_READ answer: n u32 (positions actually read: a node may return fewer
// than asked so the answer fits its body limit), layers u32, row_bytes u32
// (one position of one layer: heads x head_dim x dtype), reserved u32 (0),
// k checksum u64, v checksum u64, then K and V (layers x n x row_bytes each).
std::string EncodeSeqReadAnswerHead(uint32_t n, uint32_t layers, uint32_t row_bytes, uint64_t k_checksum,
                                    uint64_t v_checksum);
struct SeqReadAnswer {
  uint32_t n = 0, layers = 0, row_bytes = 0;
  uint64_t k_checksum = 0, v_checksum = 0;
  std::span<const std::byte> k, v;
};
Status ParseSeqReadAnswer(std::span<const std::byte> body, SeqReadAnswer* out);

// ---- registered memory (MEM_*, GET_INTO, PUT_FROM; docs/protocol.md) -------
inline constexpr size_t kMemRegisterFixed = 26;   // region u64, base u64, length u64, rkey len u16
inline constexpr size_t kMaxRkeyBytes = 4096;     // a packed UCX rkey (a few hundred bytes in practice)
inline constexpr size_t kGetIntoItemSize = 40;    // key, region u64, addr u64, capacity u32, deadline_ms u32
inline constexpr size_t kPutFromItemSize = 48;    // key, size u32, priority u8, codec u8, rsvd u16, checksum u64,
                                                  // region u64, addr u64

// MEM_REGISTER request: a region of client memory and the packed remote key
// the node needs to reach it. Answer: empty. MEM_UNREGISTER: region u64.
struct MemRegister {
  uint64_t region = 0;
  uint64_t base = 0;    // the region's address in the client's address space
  uint64_t length = 0;
  std::string rkey;     // <= kMaxRkeyBytes
  uint64_t host = 0;    // the client's HostBootId() (optional trailing u64; 0: unknown)
};
std::string EncodeMemRegister(const MemRegister& r);
Status ParseMemRegister(std::span<const std::byte> body, MemRegister* out);

// GET_INTO item: write the block straight to [addr, addr + capacity) of the
// client's registered region. The answer is count GET records (status, size,
// checksum of the bytes written) with no payloads: the block is already there.
struct GetIntoRecord {
  BlockKey key;
  uint64_t region = 0;
  uint64_t addr = 0;
  uint32_t capacity = 0;
  // The client's deadline for the call: steady_clock milliseconds mod 2^32
  // (0: none). A node on the client's host (same HostBootId) writes nothing
  // after it: the client has given up and may reuse the memory.
  uint32_t deadline_ms = 0;
};
void EncodeGetIntoRecord(const GetIntoRecord& r, std::byte out[kGetIntoItemSize]);
// REQUIRES: h was accepted by DecodeHeader (body == count * kGetIntoItemSize).
Status ParseGetIntoTable(const FrameHeader& h, std::span<const std::byte> body, std::vector<GetIntoRecord>* out);

// PUT_FROM item: read `size` bytes from [addr, addr + size) of the client's
// registered region into the pool and store them under key (checksum as in
// PUT). The answer is count status bytes, as for PUT.
struct PutFromRecord {
  PutRecord put;
  uint64_t region = 0;
  uint64_t addr = 0;
};
void EncodePutFromRecord(const PutFromRecord& r, std::byte out[kPutFromItemSize]);
// Checks every size against limits (non-empty, <= max_block_bytes).
Status ParsePutFromTable(const FrameHeader& h, std::span<const std::byte> body, const ProtocolLimits& limits,
                         std::vector<PutFromRecord>* out);

// Builds a complete frame (header + body) — for clients, tests and tools.
std::string BuildFrame(FrameHeader h, std::string_view body);

}  // namespace kvmesh::proto
