// transport/resp/resp_ops.h — RESP commands as small state machines over
// block I/O, so that one implementation of the value format (resp_value.h)
// serves both fronts: the node-local front runs each step's I/O against its
// store at once (RunRespOpSync), the proxy sends the steps of every
// connection's commands to the nodes in per-node batches
// (router/proxy/resp_engine.h).
//
// An op's life: Step() with io() empty; then, as long as Step() returns
// false, the executor runs the I/Os Step() left in io(), fills in their
// results and calls Step() again. Once Step() returns true, Answer() writes
// the reply and after() holds best-effort cleanup I/Os (erases of replaced or
// broken values) to run without waiting.
//
// Executor contract for one step's I/Os: reads (kGet, kExists) of a node run
// before the writes (kPut, kErase) of that step to that node, and writes of
// one kind run in the order given (a SET puts a value's parts before its
// head). A failed I/O is a miss for reads (status not OK) and an error for
// writes.
//
// Thread-safety: an op is used by one thread at a time. The strings an op
// was made from (command arguments) must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"
#include "kvmesh/types.h"
#include "transport/resp/resp_protocol.h"
#include "transport/resp/resp_value.h"

namespace kvmesh {

struct BlockIo {
  enum class Kind : uint8_t { kGet, kPut, kExists, kErase, kStats };
  Kind kind = Kind::kGet;
  bool replace = false;  // kPut: replace a block stored under the key (else the stored one stays)
  BlockKey key;
  // kPut: the block is head followed by data (either may be empty); the op
  // keeps both alive until its Step() after this I/O.
  std::span<const char> head, data;
  uint64_t size_hint = 0;  // kGet: the block's size when known (0: at most one slot)

  // ---- results (set by the executor) ----
  Status status;                     // OK, or why not
  bool found = false;                // kExists
  std::span<const char> value;       // kGet: the block's bytes; kStats: INFO sections
  std::shared_ptr<const void> keep;  // holds `value` alive (pinned block, receive buffer, string)
  uint64_t count = 0;                // kStats: DBSIZE
};

// What every op of a front sees.
struct RespOpEnv {
  const RespKeyRules* rules = nullptr;
  uint64_t block_bytes = 0;  // largest block (the slot size): parts, inline heads
  int64_t now_ms = 0;        // RespNowMs() when the op started
};

class RespOp {
 public:
  virtual ~RespOp() = default;
  // See the file comment. Returns true when answered.
  virtual bool Step(const RespOpEnv& env) = 0;
  // Appends the reply. REQUIRES: Step() returned true.
  virtual void Answer(RespReply* out) = 0;

  std::vector<BlockIo>& io() { return io_; }
  std::vector<BlockIo>& after() { return after_; }

 protected:
  std::vector<BlockIo> io_, after_;
};

// SET options (Redis 7 syntax).
struct RespSetOptions {
  bool nx = false, xx = false, keep_ttl = false;
  int64_t expire_at_ms = 0;  // 0: no expiry
};

// GET key: bulk or nil.
std::unique_ptr<RespOp> MakeGetOp(std::string_view key);
// MGET k...: an array of bulks or nils.
std::unique_ptr<RespOp> MakeMGetOp(std::span<const std::string_view> keys);
// EXISTS k...: how many are stored (a key named twice counts twice).
std::unique_ptr<RespOp> MakeExistsOp(std::span<const std::string_view> keys);
// TTL / PTTL key: remaining time (s or ms), -1 without expiry, -2 when absent.
std::unique_ptr<RespOp> MakeTtlOp(std::string_view key, bool millis);
// SET key value [options]: +OK, nil when NX/XX stopped it, or -ERR; with
// int_reply (SETNX): :1 when set, :0 when not.
std::unique_ptr<RespOp> MakeSetOp(std::string_view key, std::string_view value, const RespSetOptions& o,
                                  bool int_reply = false);
// MSET k v ...: +OK or the first error. A key named twice is set once, to its last value.
std::unique_ptr<RespOp> MakeMSetOp(std::span<const std::string_view> kv);
// DEL / UNLINK k...: how many existed.
std::unique_ptr<RespOp> MakeDelOp(std::span<const std::string_view> keys);
// INFO (with `header` before the backend's sections) or DBSIZE.
std::unique_ptr<RespOp> MakeStatsOp(bool dbsize, std::string header);
// An answer known at once (rendered protocol bytes).
std::unique_ptr<RespOp> MakeAnsweredOp(std::string answer);

// Runs `op` to its answer with `run` executing each step's I/Os (all of them,
// reads before writes), then runs its after() I/Os. For in-memory backends.
template <typename RunIo>
void RunRespOpSync(RespOp& op, const RespOpEnv& env, RunIo&& run) {
  while (!op.Step(env)) run(std::span<BlockIo>(op.io()));
  if (!op.after().empty()) run(std::span<BlockIo>(op.after()));
}

}  // namespace kvmesh
