// coordinator/decode/comm_tcp_frame.h — the frames of the TCP step group
// (comm_tcp.h "Frames"), spoken by the rendezvous (comm_tcp_rendezvous.cc)
// and the collectives (comm_tcp.cc): the header codec, and the blocking-style
// send and receive of one frame that the rendezvous and the abort path use
// (the collectives drive their links with their own poll() loop).
//
// Every error names the peer (`from` / `to`, e.g. "rank 2"). Frame I/O
// works on non-blocking sockets, bounded by a deadline.
//
// Thread-safety: the functions keep no state.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh::decode::tcp_step {

using Clock = std::chrono::steady_clock;

enum class Op : uint8_t {
  kHello = 1,    // rank -> 0: u32 rank, u32 size, u32 listen ip (network order), u32 listen port
  kWelcome = 2,  // 0 -> rank: u64 group id, then per rank u32 ip, u32 port
  kSumF32 = 3,
  kMinU64 = 4,
  kSumU64 = 5,
  kBroadcast = 6,
  kBarrier = 7,
  kAbort = 8,      // the reason (text); `root` carries the StatusCode
  kPeerHello = 9,  // rank j -> rank i < j on i's listener: u64 group id, u32 rank j, u32 size
  kReady = 10,     // rank -> 0: my links are up; 0 -> rank: every rank's are
};

// The collective an op is for ("AllReduceSum"), or the rendezvous step.
const char* OpName(Op op);

constexpr size_t kHeaderBytes = 40;
constexpr size_t kMaxAbortBytes = 4096;
constexpr size_t kHelloBytes = 16;
constexpr size_t kPeerHelloBytes = 16;
// How long a failing rank spends telling its peers why, and how long a rank
// waits for the rest of an abort frame whose header it has read.
constexpr std::chrono::milliseconds kAbortWait{200};

struct Header {
  Op op = Op::kBarrier;
  uint16_t root = 0;
  uint64_t seq = 0;
  uint64_t len = 0;
  uint64_t sum = 0;  // xxh3 of the payload
};

// The low `bytes` bytes of v at p, little-endian; and back.
inline void PutLe(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint64_t GetLe(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Writes h (magic, version, fields, header checksum) to b[0, kHeaderBytes).
void EncodeHeader(const Header& h, std::byte* b);
// Reads b[0, kHeaderBytes) into *h. DataLoss for a bad checksum, magic or
// version (not a step peer, or corrupted).
Status DecodeHeader(const std::byte* b, const std::string& from, Header* h);
// `got` must be `want` (op, root, seq, len). A valid header for the wrong
// collective is Internal (the ranks left SPMD order); an unknown op is
// garbage (DataLoss).
Status CheckExpected(const Header& got, const Header& want, const std::string& from);

// "rank r".
std::string RankName(int r);

// The Status an abort frame carries, once its header `h` has been read
// (`have`: the first bytes of its reason, already read); the rest of the
// reason is read within kAbortWait.
Status ReadAbort(int fd, const Header& h, std::span<const std::byte> have, const std::string& from);

// Sends h with `payload` (h.len and h.sum are set from it) before the deadline.
Status SendFrame(int fd, Header h, std::span<const std::byte> payload, Clock::time_point deadline,
                 const std::string& to);
// Best effort: an abort frame carrying s (code and text, cut to
// kMaxAbortBytes) for collective `seq`.
void SendAbort(int fd, const Status& s, uint64_t seq, Clock::time_point deadline, const std::string& to);
// Receives one frame that must be `want` into *payload (resized to its
// length) before the deadline, payload checksum checked. An abort frame
// becomes the Status it carries.
Status RecvFrame(int fd, const Header& want, std::vector<std::byte>* payload, Clock::time_point deadline,
                 const std::string& from);

}  // namespace kvmesh::decode::tcp_step
