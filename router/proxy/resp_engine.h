// router/proxy/resp_engine.h — the RESP proxy's event loop engine: it runs
// the ops (transport/resp/resp_ops.h) of every connection of one loop and
// sends their block I/O to the nodes in batches, as twemproxy does.
//
// Batching: an op's I/Os are queued as they are asked for, and one flush,
// posted to run after every handler the loop has ready (the clients' bytes
// that arrived together, the nodes' answers) — or run at once when nothing
// is in flight to any node (an idle cluster: nothing to gather, no loop turn
// to spend) — places every queued I/O with
// the current shard map (router/shard_map.h: grouped keys by their group)
// and sends each node one frame per kind: GET, EXISTS, PUT (runs of equal
// REPLACE flag), ERASE, in that order, on the node's one NodeLink, split
// only where the node's limits (HELLO) demand. So the commands of all
// connections that arrive together cost one round trip per node, and a
// step's reads run before its writes on every node (the ops' contract).
//
// Replicas: the engine executes the Router's replica plan
// (router/replica_plan.h) one I/O at a time: a PUT or ERASE goes to every
// replica (a PUT is stored when any replica stored it); a GET or EXISTS asks
// the primary and, on a miss or an unreachable node, the next replica. A
// frame answered StaleEpoch asks for a map refresh (off the loop) and its
// I/Os are placed again once, with the new map, when the refresh succeeded.
// Frames are split and built by the frame plan (transport/frame_plan.h). A
// node that cannot be reached, or does not answer within timeout_ms
// (checked every tick), fails its I/Os: reads miss, writes fail.
//
// Backpressure: a connection's Run may carry an AnswerBudget (below): its
// ops fetch blocks only while the answers it has not written fit, so a
// client that stops reading stops the fetching for itself.
//
// Thread-safety: none; every call runs on the loop's thread. The blocking
// callbacks (refresh, stats) run on the helper pool.
// Asio appears in this header: include it from .cc files only.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "router/proxy/node_link.h"
#include "router/proxy/resp_proxy.h"
#include "router/shard_map.h"
#include "transport/asio.h"
#include "transport/resp/resp_ops.h"

namespace kvmesh {

struct RespEngineOptions {
  // The shard map to place with; called on the loop (must be cheap).
  std::function<std::shared_ptr<const ShardMap>()> map;
  std::function<Status()> refresh;                   // blocking; may be empty
  std::function<Result<RespClusterStats>()> stats;   // blocking; may be empty
  NodeLinkOptions link;                              // host and port come from the map
  int64_t timeout_ms = 2000;                         // per frame
  uint64_t block_bytes = 1u << 20;                   // sizes a GET whose size is unknown
};

struct RespEngineStats {
  uint64_t frames = 0, node_errors = 0, ios = 0, parked = 0;
};

// The answer bytes one client connection holds: fetched from the nodes (or
// being fetched) and not yet written to the client. A step of an op that
// reads blocks reserves what it will fetch (a block's size when known, else
// the slot size) and is sent only when that fits under `limit`, or when the
// op is the connection's next answer to take (so the connection always makes
// progress, over the limit by at most that one op); otherwise it waits
// (parked) until the connection takes or writes answers. When a step's
// answers arrive the reservation becomes the bytes that came. So a client
// that pipelines reads and never reads its answers holds at most about
// `limit` plus one answer, whatever it asks for.
// Used on the loop's thread only.
class AnswerBudget {
 public:
  explicit AnswerBudget(uint64_t limit) : limit_(limit) {}
  uint64_t held() const { return held_; }
  uint64_t limit() const { return limit_; }
  bool parked() const { return parked_ > 0; }  // an op waits for room: write answers

 private:
  friend class RespEngine;
  uint64_t limit_;
  uint64_t held_ = 0;
  size_t head_ = 0;    // in the current Run: the first op whose answer the connection has not taken
  size_t parked_ = 0;  // ops of the current Run waiting for room
  void* batch_ = nullptr;  // the current Run's (RespEngine's), while it runs
  bool abandoned_ = false;  // the connection is gone (Abandon)
};

class RespEngine {
 public:
  // REQUIRES: io and helpers outlive the engine; io runs on one thread.
  RespEngine(boost::asio::io_context& io, boost::asio::thread_pool& helpers, RespEngineOptions o);
  ~RespEngine();

  // Runs every op to its answer (their after() I/Os are sent without
  // waiting) and then posts done() on the loop. REQUIRES: the ops outlive done().
  void Run(std::span<RespOp* const> ops, const RespOpEnv& env, std::function<void()> done);
  // The same for one connection within its answer budget (null: none):
  // op_done(i, reserved) runs on the loop as soon as op i is answered
  // (`reserved`: the bytes it holds against the budget, which the connection
  // gives back with Written once its answer is written). REQUIRES: budget
  // outlives done(); one Run per budget at a time.
  void Run(std::span<RespOp* const> ops, const RespOpEnv& env, std::function<void()> done, AnswerBudget* budget,
           std::function<void(size_t, uint64_t)> op_done);
  // The connection has taken the answers of ops [0, next) of its Run: op
  // `next` may now go over the limit.
  void Taken(AnswerBudget* budget, size_t next);
  // The connection wrote answers holding `bytes` of its budget.
  void Written(AnswerBudget* budget, uint64_t bytes);
  // The connection is gone: its ops waiting for room (and any that would
  // wait later) are dropped unsent, reported done unanswered (Step() never
  // returned true: the connection must not Answer() them); those in flight
  // run out.
  void Abandon(AnswerBudget* budget);
  // Closes the node links and sends nothing more. The owner then stops the
  // loop: ops in flight are never answered (their connections go with it).
  void Stop();
  const RespEngineStats& stats() const { return stats_; }

 private:
  struct Batch;
  struct OpRun;
  struct Fanout;
  struct Pending;
  using PendingPtr = std::unique_ptr<Pending>;
  using PendingList = std::vector<PendingPtr>;

  void Advance(OpRun* run);
  bool Drop(OpRun* run);          // done without an answer (Abandon); true when that ended its batch
  bool Finish(Batch* b);          // one op of b is done; true when that ended b (b is gone)
  void SendStep(OpRun* run);      // submits the I/Os its Step() left
  bool Admit(OpRun* run);         // reserves its step's reads in the budget (false: it must wait)
  void ResumeParked(Batch* b);    // sends the parked runs that may go now
  void Submit(BlockIo* io, OpRun* run, std::shared_ptr<BlockIo> owned);
  void Complete(PendingPtr p, const Status& s);
  void MissOrRetry(PendingPtr p, const Status& why);
  void Requeue(PendingPtr p);
  void ScheduleFlush();
  void Flush();
  void FlushReady();  // places and sends ready_ (Flush, guarded)
  void UseMap(std::shared_ptr<const ShardMap> m);
  void SendNode(size_t node, PendingList& gets, PendingList& exists, PendingList& puts, PendingList& erases);
  void OnAnswer(proto::Opcode op, std::shared_ptr<PendingList> items, const Status& call, const proto::FrameHeader& h,
                std::span<const char> body, const std::shared_ptr<const void>& keep);
  void AskStats(PendingPtr p);
  void AskRefresh(PendingPtr p);
  void Tick();

  boost::asio::io_context& io_;
  boost::asio::thread_pool& helpers_;
  RespEngineOptions o_;
  bool stopped_ = false;
  bool flush_posted_ = false;
  bool in_flush_ = false;     // FlushReady is running
  int starting_ = 0;          // Run() is starting ops
  bool flush_wanted_ = false; // I/O queued meanwhile: ScheduleFlush once they end
  std::list<Batch> batches_;
  PendingList ready_;     // to be placed at the next flush
  PendingList parked_;    // waiting for their node's link to connect
  PendingList stale_;     // waiting for a map refresh
  bool refreshing_ = false;
  std::shared_ptr<const ShardMap> map_;
  std::vector<std::shared_ptr<NodeLink>> links_;              // by node index of map_
  std::map<std::string, std::shared_ptr<NodeLink>> by_addr_;  // "id@host:port"
  boost::asio::steady_timer tick_;
  RespEngineStats stats_;
  std::shared_ptr<bool> alive_;  // false once destroyed (helper results posted late)
};

}  // namespace kvmesh
