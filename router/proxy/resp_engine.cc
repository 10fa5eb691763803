#include "router/proxy/resp_engine.h"

#include <algorithm>

#include "router/replica_plan.h"
#include "transport/frame_plan.h"

namespace kvmesh {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using namespace proto;

// One Run(): its ops and who to tell when all are answered.
struct RespEngine::Batch {
  std::list<Batch>::iterator self;
  std::vector<OpRun> runs;
  size_t left = 0;
  std::function<void()> done;
  AnswerBudget* budget = nullptr;                 // the connection's (null: none)
  std::function<void(size_t, uint64_t)> op_done;  // with a budget
  std::vector<OpRun*> parked;                     // runs whose step waits for room in the budget
};

// One op and its I/Os in flight.
struct RespEngine::OpRun {
  RespOp* op = nullptr;
  RespOpEnv env;
  Batch* batch = nullptr;
  size_t outstanding = 0;
  size_t index = 0;       // in its batch
  uint64_t pending = 0;   // reserved for the step in flight (its reads' expected sizes)
  uint64_t reserved = 0;  // what its answered steps hold (the bytes that came)
};

// A write sent to several replicas: done when every leg has answered, its
// answers merged by the replica plan (router/replica_plan.h).
struct RespEngine::Fanout {
  size_t left = 0;
  WriteMerge merge;
};

// One I/O to one replica rank.
struct RespEngine::Pending {
  BlockIo* io = nullptr;
  OpRun* run = nullptr;              // null: nobody waits (cleanup)
  std::shared_ptr<BlockIo> owned;    // the io when nobody waits (shared by its legs)
  std::shared_ptr<Fanout> fan;       // writes to several replicas
  uint8_t rank = 0;
  uint8_t busy_retries = 0;
  EpochRetry retry;                  // the replica plan's stale-epoch rule for this I/O
};

namespace {
constexpr uint8_t kMaxBusyRetries = 4;

ReplicaOp ReplicaOpOf(BlockIo::Kind k) {
  switch (k) {
    case BlockIo::Kind::kPut: return ReplicaOp::kPut;
    case BlockIo::Kind::kErase: return ReplicaOp::kErase;
    case BlockIo::Kind::kExists: return ReplicaOp::kExists;
    case BlockIo::Kind::kGet:
    case BlockIo::Kind::kStats: break;
  }
  return ReplicaOp::kGet;
}
}  // namespace

RespEngine::RespEngine(asio::io_context& io, asio::thread_pool& helpers, RespEngineOptions o)
    : io_(io), helpers_(helpers), o_(std::move(o)), tick_(io), alive_(std::make_shared<bool>(true)) {
  Tick();
}

RespEngine::~RespEngine() {
  *alive_ = false;
  tick_.cancel();
}

void RespEngine::Tick() {
  const int64_t ms = std::clamp<int64_t>(o_.timeout_ms / 4, 5, 100);
  tick_.expires_after(std::chrono::milliseconds(ms));
  tick_.async_wait([this, alive = alive_](const boost::system::error_code& ec) {
    if (ec || !*alive || stopped_) return;
    const auto now = Clock::now();
    for (auto& [addr, link] : by_addr_) link->Expire(now);
    Tick();
  });
}

void RespEngine::Run(std::span<RespOp* const> ops, const RespOpEnv& env, std::function<void()> done) {
  Run(ops, env, std::move(done), nullptr, {});
}

void RespEngine::Run(std::span<RespOp* const> ops, const RespOpEnv& env, std::function<void()> done,
                     AnswerBudget* budget, std::function<void(size_t, uint64_t)> op_done) {
  Batch& b = batches_.emplace_back();
  b.self = std::prev(batches_.end());
  b.done = std::move(done);
  b.budget = budget;
  b.op_done = std::move(op_done);
  if (budget) {
    budget->head_ = 0;
    budget->parked_ = 0;
    budget->batch_ = &b;
  }
  b.left = ops.size() + 1;  // +1 until every op has started
  b.runs.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    b.runs[i].op = ops[i];
    b.runs[i].env = env;
    b.runs[i].batch = &b;
    b.runs[i].index = i;
  }
  ++starting_;  // the ops' first I/Os go out together
  for (OpRun& r : b.runs) Advance(&r);
  --starting_;
  if (--b.left == 0) {
    if (b.budget) b.budget->batch_ = nullptr;
    asio::post(io_, std::move(b.done));
    batches_.erase(b.self);
  }
  if (starting_ == 0 && flush_wanted_) {
    flush_wanted_ = false;
    ScheduleFlush();
  }
}

bool RespEngine::Admit(OpRun* run) {
  AnswerBudget& budget = *run->batch->budget;
  uint64_t need = 0;
  for (const BlockIo& io : run->op->io())
    if (io.kind == BlockIo::Kind::kGet) need += io.size_hint ? io.size_hint : o_.block_bytes;
  if (need == 0) return true;
  if (budget.held_ + need > budget.limit_ && run->index != budget.head_) return false;
  budget.held_ += need;
  run->pending = need;
  return true;
}

void RespEngine::SendStep(OpRun* run) {
  std::vector<BlockIo>& ios = run->op->io();
  run->outstanding = ios.size();
  for (BlockIo& io : ios) Submit(&io, run, nullptr);
}

void RespEngine::ResumeParked(Batch* b) {
  if (b->parked.empty()) return;
  // In op order: the connection's next answer first.
  std::sort(b->parked.begin(), b->parked.end(), [](const OpRun* x, const OpRun* y) { return x->index < y->index; });
  std::vector<OpRun*> go;
  for (auto it = b->parked.begin(); it != b->parked.end();) {
    if (Admit(*it)) {
      go.push_back(*it);
      it = b->parked.erase(it);
      --b->budget->parked_;
    } else {
      ++it;
    }
  }
  if (go.empty()) return;
  ++starting_;  // their I/Os go out together (no completion runs in here)
  for (OpRun* r : go) SendStep(r);
  --starting_;
  if (starting_ == 0 && flush_wanted_) {
    flush_wanted_ = false;
    ScheduleFlush();
  }
}

void RespEngine::Taken(AnswerBudget* budget, size_t next) {
  budget->head_ = next;
  if (budget->batch_) ResumeParked(static_cast<Batch*>(budget->batch_));
}

void RespEngine::Written(AnswerBudget* budget, uint64_t bytes) {
  budget->held_ -= std::min(bytes, budget->held_);
  if (budget->batch_) ResumeParked(static_cast<Batch*>(budget->batch_));
}

void RespEngine::Abandon(AnswerBudget* budget) {
  // Nobody will read the answers: the ops still waiting for room are dropped
  // unsent (a parked op has no I/O in flight, and one dropped before its
  // reads went makes no write either), and so is any op that would park
  // later; those in flight run out. Before, the limit was lifted and every
  // parked read went at once: a client that closed with 94 pipelined GETs of
  // an 8 MiB value made the proxy fetch 750 MiB for nobody.
  budget->abandoned_ = true;
  Batch* b = static_cast<Batch*>(budget->batch_);
  if (!b) return;
  std::vector<OpRun*> dropped;
  dropped.swap(b->parked);
  budget->parked_ = 0;
  for (OpRun* run : dropped)
    if (Drop(run)) return;  // the batch is done
}

bool RespEngine::Drop(OpRun* run) {
  Batch* b = run->batch;
  if (b->op_done) b->op_done(run->index, run->reserved);
  return Finish(b);
}

bool RespEngine::Finish(Batch* b) {
  if (--b->left != 0) return false;
  // The last answer came in (Run() holds the count while it starts ops):
  // resume the connection right here, not a loop turn later.
  if (b->budget) b->budget->batch_ = nullptr;
  std::function<void()> done = std::move(b->done);
  batches_.erase(b->self);
  asio::dispatch(io_, std::move(done));
  return true;
}

void RespEngine::Advance(OpRun* run) {
  Batch* b = run->batch;
  bool room = false;  // the budget got room back: parked runs may go
  if (b->budget && run->pending) {
    // The step's reads came: its reservation becomes the bytes they hold.
    uint64_t got = 0;
    for (const BlockIo& io : run->op->io())
      if (io.kind == BlockIo::Kind::kGet && io.status.ok()) got += io.value.size();
    AnswerBudget& budget = *b->budget;
    budget.held_ = budget.held_ - std::min(run->pending, budget.held_) + got;
    room = got < run->pending && !b->parked.empty();
    run->reserved += got;
    run->pending = 0;
  }
  if (!run->op->Step(run->env)) {
    if (b->budget && b->budget->abandoned_ && !run->op->io().empty() && !Admit(run)) {
      if (Drop(run)) return;  // the connection is gone: nobody waits for this answer
      if (room) ResumeParked(b);
      return;
    }
    if (b->budget && !b->budget->abandoned_ && !Admit(run)) {  // no room: the step waits for the connection to take or write answers
      b->parked.push_back(run);
      ++b->budget->parked_;
      ++stats_.parked;
    } else {
      SendStep(run);
    }
    if (room) ResumeParked(b);
    return;
  }
  for (BlockIo& a : run->op->after()) Submit(nullptr, nullptr, std::make_shared<BlockIo>(std::move(a)));
  run->op->after().clear();
  if (b->op_done) b->op_done(run->index, run->reserved);
  if (room) ResumeParked(b);
  Finish(b);
}

void RespEngine::Submit(BlockIo* io, OpRun* run, std::shared_ptr<BlockIo> owned) {
  if (owned) io = owned.get();
  ++stats_.ios;
  io->status = Status::Ok();
  const uint32_t legs = map_ ? StartRanks(*map_, ReplicaOpOf(io->kind)) : 1;
  std::shared_ptr<Fanout> fan;
  if (legs > 1) {
    fan = std::make_shared<Fanout>();
    fan->left = legs;
  }
  for (uint32_t r = 0; r < legs; ++r) {
    auto p = std::make_unique<Pending>();
    p->io = io;
    p->run = run;
    p->owned = owned;
    p->fan = fan;
    p->rank = static_cast<uint8_t>(r);
    ready_.push_back(std::move(p));
  }
  ScheduleFlush();
}

void RespEngine::Complete(PendingPtr p, const Status& s) {
  if (p->fan) {
    Fanout& f = *p->fan;
    f.merge.Add(p->rank, s);
    if (--f.left > 0) return;
    p->io->status = f.merge.Result();
  } else {
    p->io->status = s;
  }
  OpRun* run = p->run;
  p.reset();  // frees an io nobody waits for
  if (run == nullptr) return;
  if (--run->outstanding == 0) Advance(run);
}

void RespEngine::MissOrRetry(PendingPtr p, const Status& why) {
  if (map_ && AskNextRank(ReplicaOpOf(p->io->kind), why) &&
      NodeAtRank(*map_, p->io->key, Affinity{}, p->rank + 1u) != kNoNode) {
    ++p->rank;
    return Requeue(std::move(p));
  }
  Complete(std::move(p), why);
}

void RespEngine::Requeue(PendingPtr p) {
  ready_.push_back(std::move(p));
  ScheduleFlush();
}

void RespEngine::ScheduleFlush() {
  if (stopped_) return;
  if (in_flush_ || starting_ > 0) {  // the flush (or Run) in progress sends it when done
    flush_wanted_ = true;
    return;
  }
  if (flush_posted_) return;
  // Nothing in flight to any node: there is no batch to gather (the nodes
  // are idle), so send now and spare the loop turn. Otherwise flush after
  // every handler the loop has ready, which gathers what arrived together.
  bool busy = false;
  for (auto& [addr, link] : by_addr_) busy = busy || link->busy();
  if (!busy) return Flush();
  flush_posted_ = true;
  asio::post(io_, [this, alive = alive_] {
    if (*alive) Flush();
  });
}

void RespEngine::UseMap(std::shared_ptr<const ShardMap> m) {
  if (m == map_) return;
  map_ = std::move(m);
  links_.clear();
  std::map<std::string, std::shared_ptr<NodeLink>> keep;
  if (map_) {
    for (const ShardInfo& n : map_->nodes()) {
      const std::string addr = n.id + "@" + n.host + ":" + std::to_string(n.ports.data);
      auto it = by_addr_.find(addr);
      std::shared_ptr<NodeLink> link;
      if (it != by_addr_.end()) {
        link = it->second;
      } else {
        NodeLinkOptions lo = o_.link;
        lo.host = n.host;
        lo.port = n.ports.data;
        link = std::make_shared<NodeLink>(io_, lo);
      }
      keep[addr] = link;
      links_.push_back(link);
    }
  }
  for (auto& [addr, link] : by_addr_)  // nodes that left the map
    if (!keep.count(addr)) link->Close(Unavailable("node left the shard map"));
  by_addr_ = std::move(keep);
}

void RespEngine::Flush() {
  flush_posted_ = false;
  if (stopped_ || ready_.empty()) return;
  in_flush_ = true;
  FlushReady();
  in_flush_ = false;
  if (flush_wanted_) {
    flush_wanted_ = false;
    ScheduleFlush();
  }
}

void RespEngine::FlushReady() {
  UseMap(o_.map ? o_.map() : nullptr);
  PendingList work;
  work.swap(ready_);
  const size_t nodes = map_ ? map_->nodes().size() : 0;
  std::vector<PendingList> gets(nodes), exists(nodes), puts(nodes), erases(nodes);
  for (PendingPtr& p : work) {
    if (p->io->kind == BlockIo::Kind::kStats) {
      AskStats(std::move(p));
      continue;
    }
    const uint32_t node = nodes ? NodeAtRank(*map_, p->io->key, Affinity{}, p->rank) : kNoNode;
    if (node == kNoNode) {  // no node (or fewer live nodes than replicas)
      Complete(std::move(p), Unavailable("no live node for this key"));
      continue;
    }
    NodeLink& link = *links_[node];
    const NodeLink::State st = link.state();
    if (st == NodeLink::State::kBackoff) {
      ++stats_.node_errors;
      MissOrRetry(std::move(p), Unavailable("node " + map_->nodes()[node].id + " unreachable (backing off)"));
      continue;
    }
    if (st != NodeLink::State::kReady) {
      if (st == NodeLink::State::kIdle)
        link.Connect([this, alive = alive_] {
          if (!*alive) return;
          for (PendingPtr& q : parked_) ready_.push_back(std::move(q));
          parked_.clear();
          ScheduleFlush();
        });
      parked_.push_back(std::move(p));
      continue;
    }
    switch (p->io->kind) {
      case BlockIo::Kind::kGet: gets[node].push_back(std::move(p)); break;
      case BlockIo::Kind::kExists: exists[node].push_back(std::move(p)); break;
      case BlockIo::Kind::kPut: puts[node].push_back(std::move(p)); break;
      case BlockIo::Kind::kErase: erases[node].push_back(std::move(p)); break;
      case BlockIo::Kind::kStats: break;
    }
  }
  for (size_t n = 0; n < nodes; ++n)
    if (!gets[n].empty() || !exists[n].empty() || !puts[n].empty() || !erases[n].empty())
      SendNode(n, gets[n], exists[n], puts[n], erases[n]);
}

void RespEngine::SendNode(size_t node, PendingList& gets, PendingList& exists, PendingList& puts,
                          PendingList& erases) {
  NodeLink& link = *links_[node];
  const ProtocolLimits lim = link.limits();
  const auto deadline = Clock::now() + std::chrono::milliseconds(o_.timeout_ms);
  const uint64_t epoch = map_->epoch();
  auto send = [&](Opcode op, uint8_t flags, std::shared_ptr<PendingList> items, std::string table,
                  std::vector<asio::const_buffer> payload, uint64_t body_len) {
    auto f = std::make_unique<LinkFrame>();
    f->header.opcode = op;
    f->header.flags = flags;
    f->header.count = static_cast<uint32_t>(items->size());
    f->header.body_len = static_cast<uint32_t>(body_len);
    f->table = std::move(table);
    f->payload = std::move(payload);
    f->deadline = deadline;
    f->done = [this, op, items, alive = alive_](const Status& call, const FrameHeader& h, std::span<const char> body,
                                                const std::shared_ptr<const void>& keep) {
      if (*alive) OnAnswer(op, items, call, h, body, keep);
    };
    ++stats_.frames;
    link.Send(std::move(f), epoch);
  };
  // Frames as the frame plan (transport/frame_plan.h) splits and builds
  // them. Key lists (GET, EXISTS, ERASE); a GET's answer is sized by the
  // block's size when known, else the slot size.
  auto take = [](PendingList& list, FrameSpan f) {
    auto items = std::make_shared<PendingList>();
    items->reserve(f.size());
    for (size_t i = f.begin; i < f.end; ++i) items->push_back(std::move(list[i]));
    return items;
  };
  auto keys = [&](Opcode op, uint8_t flags, PendingList& list) {
    auto key_of = [&](size_t i) { return list[i]->io->key; };
    auto item_bytes = [&](size_t i) {
      const BlockIo& io = *list[i]->io;
      return op == Opcode::kGet ? GetItemBytes(io.size_hint ? io.size_hint : o_.block_bytes, lim) : kKeyItemBytes;
    };
    for (size_t at = 0; at < list.size();) {
      const FrameSpan f{at, FrameEnd(at, list.size(), lim, item_bytes)};
      std::string table;
      const uint64_t len = BuildKeyTable(f, key_of, &table);
      send(op, flags, take(list, f), std::move(table), {}, len);
      at = f.end;
    }
  };
  keys(Opcode::kGet, 0, gets);
  keys(Opcode::kExists, kFlagTouch, exists);
  // PUT: runs of equal REPLACE flag, in order. A block the plan refuses is
  // never sent (the node would drop the connection).
  auto size_of = [&](size_t i) -> uint64_t { return puts[i]->io->head.size() + puts[i]->io->data.size(); };
  auto refuse = [&](size_t i, Status s) { Complete(std::move(puts[i]), s); };
  auto piece = [&](size_t i) {
    const BlockIo& io = *puts[i]->io;
    return PutPiece{io.key, std::as_bytes(io.head), std::as_bytes(io.data), kDefaultPriority};
  };
  for (size_t run = 0; run < puts.size();) {
    const bool replace = puts[run]->io->replace;
    size_t run_end = run;
    while (run_end < puts.size() && puts[run_end]->io->replace == replace) ++run_end;
    for (size_t at = run; at < run_end;) {
      const FrameSpan f = NextPutFrame(at, run_end, lim, size_of, refuse);
      if (f.empty()) break;
      std::string table;
      std::vector<asio::const_buffer> payload;
      const uint64_t len = BuildPutTable(f, piece, &table, [&](std::span<const std::byte> b) {
        payload.emplace_back(b.data(), b.size());
      });
      send(Opcode::kPut, replace ? kFlagReplace : 0, take(puts, f), std::move(table), std::move(payload), len);
      at = f.end;
    }
    run = run_end;
  }
  keys(Opcode::kErase, 0, erases);
}

void RespEngine::OnAnswer(Opcode op, std::shared_ptr<PendingList> items, const Status& call, const FrameHeader& h,
                          std::span<const char> body, const std::shared_ptr<const void>& keep) {
  PendingList& list = *items;
  if (!call.ok()) {
    ++stats_.node_errors;
    if (EpochRetry::IsStale(call)) {
      for (PendingPtr& p : list) {
        if (p->retry.WantsRefresh(true)) AskRefresh(std::move(p));
        else Complete(std::move(p), call);
      }
      return;
    }
    for (PendingPtr& p : list) MissOrRetry(std::move(p), call);
    return;
  }
  const std::span<const std::byte> bytes = std::as_bytes(body);
  if (op == Opcode::kGet) {
    std::vector<GetRecord> recs;
    const size_t table = list.size() * kGetItemSize;
    Status s = bytes.size() >= table ? ParseGetTable(h, bytes.first(table), o_.link.limits, &recs)
                                     : InvalidArgument("GET answer shorter than its table");
    if (s.ok() && recs.size() != list.size()) s = InvalidArgument("GET answer count differs from the request");
    if (!s.ok()) {
      for (PendingPtr& p : list) MissOrRetry(std::move(p), Unavailable("bad answer from the node: " + s.message()));
      return;
    }
    size_t at = table;
    for (size_t k = 0; k < list.size(); ++k) {
      PendingPtr& p = list[k];
      const GetRecord& r = recs[k];
      if (r.status == StatusCode::kOk) {
        std::span<const char> v = body.subspan(at, r.size);
        at += r.size;
        if (Status c = VerifyPayload(std::as_bytes(v), r.checksum); !c.ok()) {
          MissOrRetry(std::move(p), c);
          continue;
        }
        p->io->value = v;
        p->io->keep = keep;
        Complete(std::move(p), Status::Ok());
      } else if (r.status == StatusCode::kBusy && p->busy_retries < kMaxBusyRetries) {
        ++p->busy_retries;  // the answer was full: ask again in a later frame
        Requeue(std::move(p));
      } else {
        MissOrRetry(std::move(p), GetRecordStatus(r));
      }
    }
    return;
  }
  std::vector<uint8_t> codes;
  Status s = ParseStatusBytes(h, bytes, &codes);
  if (s.ok() && codes.size() != list.size()) s = InvalidArgument("answer count differs from the request");
  if (!s.ok()) {
    for (PendingPtr& p : list) MissOrRetry(std::move(p), Unavailable("bad answer from the node: " + s.message()));
    return;
  }
  for (size_t k = 0; k < list.size(); ++k) {
    if (op == Opcode::kExists) {
      list[k]->io->found = codes[k] != 0;
      Complete(std::move(list[k]), Status::Ok());
    } else {
      Complete(std::move(list[k]), ItemStatus(codes[k]));
    }
  }
}

void RespEngine::AskRefresh(PendingPtr p) {
  stale_.push_back(std::move(p));
  if (refreshing_) return;
  refreshing_ = true;
  asio::post(helpers_, [this, alive = alive_] {
    Status s = o_.refresh ? o_.refresh() : Unavailable("no map refresh");
    asio::post(io_, [this, alive, s = std::move(s)] {
      if (!*alive) return;
      refreshing_ = false;
      PendingList stale;
      stale.swap(stale_);
      // Placed again with the new map when the refresh succeeded (a read
      // from rank 0); otherwise the I/O fails with why.
      for (PendingPtr& q : stale) {
        if (q->retry.Refreshed(s)) {
          q->rank = static_cast<uint8_t>(EpochRetry::RankAfterRefresh(ReplicaOpOf(q->io->kind), q->rank));
          ready_.push_back(std::move(q));
        } else {
          Complete(std::move(q), StaleEpoch("shard map refresh failed: " + s.message()));
        }
      }
      ScheduleFlush();
    });
  });
}

void RespEngine::AskStats(PendingPtr p) {
  std::shared_ptr<Pending> held(std::move(p));
  asio::post(helpers_, [this, held, alive = alive_] {
    Result<RespClusterStats> r = o_.stats ? o_.stats() : Result<RespClusterStats>(Unavailable("no cluster stats"));
    asio::post(io_, [this, held, r = std::move(r), alive] {
      if (!*alive) return;
      auto text = std::make_shared<std::string>("role:proxy\r\n# Cluster\r\n");
      auto kv = [&](const char* k, uint64_t v) { *text += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
      kv("shard_map_epoch", map_ ? map_->epoch() : 0);
      kv("router_node_errors", stats_.node_errors);
      kv("frames_sent", stats_.frames);
      BlockIo& io = *held->io;
      if (r.ok()) {
        kv("live_nodes", r->nodes);
        *text += "# Stats\r\n";
        kv("keyspace_hits", r->hits);
        kv("keyspace_misses", r->misses);
        kv("evicted_keys", r->evictions);
        *text += "# Memory\r\n";
        kv("used_memory", r->bytes_stored);
        kv("slot_bytes", o_.block_bytes);
        *text += "# Keyspace\r\n";
        *text += "db0:keys=" + std::to_string(r->blocks) + ",expires=0,avg_ttl=0\r\n";
        io.count = r->blocks;
      } else {
        *text += "cluster_stats_error:" + r.status().ToString() + "\r\n";
      }
      io.value = std::span<const char>(*text);
      io.keep = std::move(text);
      Complete(std::make_unique<Pending>(std::move(*held)), Status::Ok());
    });
  });
}

void RespEngine::Stop() {
  if (stopped_) return;
  stopped_ = true;
  tick_.cancel();
  // The owner stops the loop next: what is queued or in flight is dropped
  // with the engine, never answered.
  for (auto& [addr, link] : by_addr_) link->Close(Unavailable("RESP proxy stopping"));
}

}  // namespace kvmesh
