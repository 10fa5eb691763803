#include "transport/resp/resp_ops.h"

#include <algorithm>
#include <unordered_map>

namespace kvmesh {
namespace {

BlockIo GetIo(const BlockKey& k, uint64_t size_hint = 0) {
  BlockIo io;
  io.kind = BlockIo::Kind::kGet;
  io.key = k;
  io.size_hint = size_hint;
  return io;
}
BlockIo ExistsIo(const BlockKey& k) {
  BlockIo io;
  io.kind = BlockIo::Kind::kExists;
  io.key = k;
  return io;
}
BlockIo EraseIo(const BlockKey& k) {
  BlockIo io;
  io.kind = BlockIo::Kind::kErase;
  io.key = k;
  return io;
}
BlockIo PutIo(const BlockKey& k, std::span<const char> head, std::span<const char> data, bool replace) {
  BlockIo io;
  io.kind = BlockIo::Kind::kPut;
  io.key = k;
  io.head = head;
  io.data = data;
  io.replace = replace;
  return io;
}

// Erases of every part of `h` (a version of `key`) into *out.
void ErasePartsOf(std::string_view key, const RespKeyGroup& g, const RespHead& h, std::vector<BlockIo>* out) {
  for (uint32_t i = 0; i < h.parts; ++i) out->push_back(EraseIo(RespPartKey(key, g, h.nonce, i)));
}

// ---- reading one key: head, then its parts, all or nothing -------------------------

// A dependent key (RespPrimaryKey) also reads the head of the key it
// depends on, in the same step, and checks that every part of that value is
// there: it is found only when that whole value is.
class ReadTask {
 public:
  enum class Mode : uint8_t { kValue, kExists, kTtl };
  ReadTask(std::string_view key, Mode mode) : key_(key), mode_(mode) {}

  // Appends its next I/Os to *next and returns false, or returns true when done.
  bool Step(std::span<BlockIo> done, std::vector<BlockIo>* next, std::vector<BlockIo>* after, const RespOpEnv& env) {
    switch (state_) {
      case 0:
        head_key_ = RespKey(key_, *env.rules);
        next->push_back(GetIo(head_key_));
        dependent_ = RespPrimaryKey(key_, *env.rules, &primary_);
        if (dependent_) next->push_back(GetIo(RespKey(primary_, *env.rules)));
        state_ = 1;
        return false;
      case 1:
        if (dependent_) {  // the value this key depends on: its head now, its parts with ours
          const BlockIo& p = done[1];
          if (!p.status.ok() || !DecodeRespHead(p.value, &primary_head_).ok() || primary_head_.expired(env.now_ms))
            return true;
        }
        return OnHead(done[0], next, env);
      case 2: {  // parts answered: ours (own_parts_) first, then the primary's
        for (size_t i = own_parts_; i < done.size(); ++i)
          if (!done[i].status.ok() || !done[i].found) return true;  // its value is gone: so is this key
        primary_checked_ = true;
        bool all = true;
        for (uint32_t i = 0; i < own_parts_ && all; ++i) {
          const BlockIo& p = done[i];
          all = mode_ == Mode::kExists ? p.status.ok() && p.found
                                       : p.status.ok() && p.value.size() == head_.PartSize(i);
        }
        if (all) {
          found_ = true;
          if (mode_ == Mode::kValue && own_parts_ > 0) {
            pieces_.clear();
            keeps_.clear();
            for (uint32_t i = 0; i < own_parts_; ++i) {
              pieces_.push_back(done[i].value);
              keeps_.push_back(std::move(done[i].keep));
            }
            inline_keep_.reset();
          }
          return true;
        }
        // A part is gone (evicted, or erased by a SET that replaced this
        // version): read the head again. A new version is read instead; the
        // same version is broken and goes.
        if (++rereads_ > 2) return true;
        next->push_back(GetIo(head_key_));
        state_ = 3;
        return false;
      }
      case 3: {
        RespHead again;
        if (!done[0].status.ok() || !DecodeRespHead(done[0].value, &again).ok()) return true;  // gone: a miss
        if (again.nonce == head_.nonce) {
          after->push_back(EraseIo(head_key_));
          ErasePartsOf(key_, RespGroupOf(key_, *env.rules), head_, after);
          return true;
        }
        return OnHead(done[0], next, env);
      }
      default:
        return true;
    }
  }

  bool found() const { return found_; }
  const RespHead& head() const { return head_; }
  int64_t expire_at_ms() const { return head_.expire_at_ms; }
  // kValue: the value's bytes, in order, and what keeps them alive.
  void AnswerValue(RespReply* out) {
    if (!found_) return out->Nil();
    if (inline_keep_) return out->BulkBorrowed(inline_, std::move(inline_keep_));
    out->Add("$" + std::to_string(head_.value_bytes) + "\r\n");
    for (size_t i = 0; i < pieces_.size(); ++i) out->Borrowed(pieces_[i], std::move(keeps_[i]));
    out->Add("\r\n");
  }

 private:
  // Our head answered: done, or the parts to read (ours, and the primary's
  // once) into *next.
  bool OnHead(BlockIo& h, std::vector<BlockIo>* next, const RespOpEnv& env) {
    if (!h.status.ok() || !DecodeRespHead(h.value, &head_).ok() || head_.expired(env.now_ms)) return true;
    own_parts_ = 0;
    if (mode_ != Mode::kTtl && !head_.is_inline()) {
      const RespKeyGroup g = RespGroupOf(key_, *env.rules);
      for (uint32_t i = 0; i < head_.parts; ++i) {
        const BlockKey pk = RespPartKey(key_, g, head_.nonce, i);
        next->push_back(mode_ == Mode::kExists ? ExistsIo(pk) : GetIo(pk, head_.PartSize(i)));
      }
      own_parts_ = head_.parts;
    }
    if (dependent_ && !primary_checked_ && !primary_head_.is_inline()) {
      const RespKeyGroup g = RespGroupOf(primary_, *env.rules);
      for (uint32_t i = 0; i < primary_head_.parts; ++i)
        next->push_back(ExistsIo(RespPartKey(primary_, g, primary_head_.nonce, i)));
    }
    if (mode_ == Mode::kValue && head_.is_inline()) {
      inline_ = h.value.subspan(kRespHeadBytes);
      inline_keep_ = std::move(h.keep);
    }
    if (own_parts_ == 0 && (!dependent_ || primary_checked_ || primary_head_.is_inline())) {
      found_ = true;
      return true;
    }
    state_ = 2;
    return false;
  }

  std::string_view key_;
  Mode mode_;
  int state_ = 0;
  int rereads_ = 0;
  bool found_ = false;
  bool dependent_ = false, primary_checked_ = false;
  uint32_t own_parts_ = 0;
  BlockKey head_key_;
  RespHead head_;
  std::string primary_;  // the key this one depends on (dependent_)
  RespHead primary_head_;
  std::span<const char> inline_;               // an inline value ...
  std::shared_ptr<const void> inline_keep_;    // ... and its head block
  std::vector<std::span<const char>> pieces_;  // a parted value's parts ...
  std::vector<std::shared_ptr<const void>> keeps_;
};

// ---- writing one key: parts, then the head swapped last ---------------------------

class WriteTask {
 public:
  WriteTask(std::string_view key, std::string_view value, const RespSetOptions& o) : key_(key), value_(value), o_(o) {}

  bool Step(std::span<BlockIo> done, std::vector<BlockIo>* next, std::vector<BlockIo>* after, const RespOpEnv& env) {
    switch (state_) {
      case 0: {
        group_ = RespGroupOf(key_, *env.rules);
        head_key_ = RespKey(key_, *env.rules);
        head_.nonce = RespNonce();
        head_.expire_at_ms = o_.expire_at_ms;
        LayoutRespValue(value_.size(), env.block_bytes, &head_);
        EncodeRespHead(head_, hdr_);
        const bool conditional = o_.nx || o_.xx || o_.keep_ttl;
        // The old head tells which parts the replaced version leaves behind.
        // Read it (in the same step as our writes) when the new value has
        // parts, for a co-evicted key (an orphan part would later drop its
        // group) and for NX/XX/KEEPTTL; a small value replacing a parted one
        // of a plain key leaves the old parts to eviction.
        read_old_ = conditional || group_.co_evict || !head_.is_inline();
        if (read_old_) next->push_back(GetIo(head_key_));
        for (uint32_t i = 0; i < head_.parts; ++i)
          next->push_back(PutIo(RespPartKey(key_, group_, head_.nonce, i), {},
                                value_.substr(uint64_t{i} * head_.part_bytes, head_.PartSize(i)), false));
        if (conditional) {
          state_ = 1;
        } else {  // one round: the head goes after the parts, in the same step
          next->push_back(HeadPut(true));
          state_ = 2;
        }
        return false;
      }
      case 1: {  // NX / XX / KEEPTTL: the old head and our parts are in
        NoteOld(done[0], env);
        if (!PartsStored(done.subspan(1), after)) return true;
        const bool exists = old_state_ == Old::kLive;
        if ((o_.nx && exists) || (o_.xx && !exists)) {
          ErasePartsOf(key_, group_, head_, after);
          return true;  // not applied: nil
        }
        if (o_.keep_ttl && exists) {
          head_.expire_at_ms = old_.expire_at_ms;
          EncodeRespHead(head_, hdr_);
        }
        next->push_back(HeadPut(!o_.nx));
        state_ = o_.nx ? 3 : 4;
        return false;
      }
      case 2: {  // one round: [old head] parts head
        size_t at = 0;
        if (read_old_) NoteOld(done[at++], env);
        const bool parts_ok = PartsStored(done.subspan(at, head_.parts), nullptr);
        const BlockIo& h = done[at + head_.parts];
        if (!parts_ok || !h.status.ok()) {
          if (h.status.ok()) after->push_back(EraseIo(head_key_));  // it names a part that is not there
          if (result_.ok()) result_ = h.status;
          ErasePartsOf(key_, group_, head_, after);
          return true;
        }
        Applied(after);
        return true;
      }
      case 3:  // NX: our head was put without replacing; is it the one stored?
        if (!done[0].status.ok()) return Failed(done[0].status, after);
        next->push_back(GetIo(head_key_));
        state_ = 5;
        return false;
      case 4:  // XX / KEEPTTL: the head replaced the old one
        if (!done[0].status.ok()) return Failed(done[0].status, after);
        Applied(after);
        return true;
      case 5: {
        RespHead now;
        const bool decoded = done[0].status.ok() && DecodeRespHead(done[0].value, &now).ok();
        if (decoded && now.nonce == head_.nonce) {
          applied_ = true;
          return true;
        }
        if (decoded && now.expired(env.now_ms) && !retried_) {  // an expired value does not count
          retried_ = true;
          next->push_back(EraseIo(head_key_));
          state_ = 6;
          return false;
        }
        ErasePartsOf(key_, group_, head_, after);  // another SET won
        return true;
      }
      case 6:
        next->push_back(HeadPut(false));
        state_ = 3;
        return false;
      default:
        return true;
    }
  }

  // +OK, nil when NX/XX stopped it, else -ERR.
  void Answer(RespReply* out) const {
    if (!result_.ok()) return out->Err("ERR " + result_.ToString());
    if (applied_) return out->Ok();
    out->Nil();
  }
  const Status& result() const { return result_; }
  bool applied() const { return applied_; }

 private:
  enum class Old : uint8_t { kNone, kLive, kExpired };

  BlockIo HeadPut(bool replace) const {
    return PutIo(head_key_, std::span<const char>(hdr_, kRespHeadBytes),
                 head_.is_inline() ? std::span<const char>(value_) : std::span<const char>(), replace);
  }
  void NoteOld(const BlockIo& io, const RespOpEnv& env) {
    old_state_ = Old::kNone;
    if (!io.status.ok() || !DecodeRespHead(io.value, &old_).ok()) return;
    old_state_ = old_.expired(env.now_ms) ? Old::kExpired : Old::kLive;
  }
  // True when every part put succeeded; else records the error, and (when
  // after is given) erases the parts.
  bool PartsStored(std::span<const BlockIo> parts, std::vector<BlockIo>* after) {
    for (const BlockIo& p : parts) {
      if (p.status.ok()) continue;
      result_ = p.status;
      if (after) ErasePartsOf(key_, group_, head_, after);
      return false;
    }
    return true;
  }
  bool Failed(const Status& s, std::vector<BlockIo>* after) {
    result_ = s;
    ErasePartsOf(key_, group_, head_, after);
    return true;
  }
  // The new head is in: the version it replaced has parts nobody can read any more.
  void Applied(std::vector<BlockIo>* after) {
    applied_ = true;
    if (old_state_ != Old::kNone && !old_.is_inline() && old_.nonce != head_.nonce)
      ErasePartsOf(key_, group_, old_, after);
  }

  std::string_view key_, value_;
  RespSetOptions o_;
  int state_ = 0;
  bool read_old_ = false, applied_ = false, retried_ = false;
  RespKeyGroup group_;
  BlockKey head_key_;
  RespHead head_, old_;
  Old old_state_ = Old::kNone;
  char hdr_[kRespHeadBytes] = {};
  Status result_;
};

// ---- deleting one key ---------------------------------------------------------------

class DelTask {
 public:
  explicit DelTask(std::string_view key) : key_(key) {}
  bool Step(std::span<BlockIo> done, std::vector<BlockIo>* next, std::vector<BlockIo>* after, const RespOpEnv& env) {
    if (state_ == 0) {
      head_key_ = RespKey(key_, *env.rules);
      next->push_back(GetIo(head_key_));  // reads run before the erase
      next->push_back(EraseIo(head_key_));
      state_ = 1;
      return false;
    }
    const BlockIo& h = done[0];
    if (!h.status.ok()) return true;
    RespHead head;
    if (!DecodeRespHead(h.value, &head).ok()) {
      existed_ = true;  // a block that is not a RESP value (erased all the same)
      return true;
    }
    existed_ = !head.expired(env.now_ms);
    if (!head.is_inline()) ErasePartsOf(key_, RespGroupOf(key_, *env.rules), head, after);
    return true;
  }
  bool existed() const { return existed_; }

 private:
  std::string_view key_;
  int state_ = 0;
  bool existed_ = false;
  BlockKey head_key_;
};

// ---- ops over tasks ----------------------------------------------------------------

// Runs its tasks side by side: each step gathers every unfinished task's next
// I/Os into io(), then hands each task back its own results.
template <typename Task>
class TasksOp : public RespOp {
 public:
  bool Step(const RespOpEnv& env) override {
    next_.clear();
    bool all_done = true;
    for (size_t t = 0; t < tasks_.size(); ++t) {
      if (done_[t]) continue;
      std::span<BlockIo> mine(io_.data() + begin_[t], end_[t] - begin_[t]);
      const size_t b = next_.size();
      done_[t] = tasks_[t].Step(mine, &next_, &after_, env);
      begin_[t] = b;
      end_[t] = next_.size();
      all_done = all_done && done_[t];
    }
    io_.swap(next_);
    return all_done;
  }

 protected:
  void Add(Task t) {
    tasks_.push_back(std::move(t));
    done_.push_back(0);
    begin_.push_back(0);
    end_.push_back(0);
  }
  std::vector<Task> tasks_;

 private:
  std::vector<uint8_t> done_;
  std::vector<size_t> begin_, end_;
  std::vector<BlockIo> next_;
};

// The one-key form of TasksOp (GET, SET, TTL: most commands), without its
// per-task bookkeeping.
template <typename Task>
class SingleOp : public RespOp {
 public:
  explicit SingleOp(Task t) : task_(std::move(t)) {}
  bool Step(const RespOpEnv& env) override {
    next_.clear();
    const bool done = task_.Step(std::span<BlockIo>(io_), &next_, &after_, env);
    io_.swap(next_);
    return done;
  }

 protected:
  Task task_;

 private:
  std::vector<BlockIo> next_;
};

class GetOneOp final : public SingleOp<ReadTask> {
 public:
  explicit GetOneOp(std::string_view key) : SingleOp(ReadTask(key, ReadTask::Mode::kValue)) {}
  void Answer(RespReply* out) override { task_.AnswerValue(out); }
};

class SetOneOp final : public SingleOp<WriteTask> {
 public:
  SetOneOp(std::string_view key, std::string_view value, const RespSetOptions& o, bool int_reply)
      : SingleOp(WriteTask(key, value, o)), int_reply_(int_reply) {}
  void Answer(RespReply* out) override {
    if (int_reply_ && task_.result().ok()) return out->Int(task_.applied() ? 1 : 0);
    task_.Answer(out);
  }

 private:
  bool int_reply_;
};

class GetOp final : public TasksOp<ReadTask> {
 public:
  GetOp(std::span<const std::string_view> keys, bool array) : array_(array) {
    tasks_.reserve(keys.size());
    for (std::string_view k : keys) Add(ReadTask(k, ReadTask::Mode::kValue));
  }
  void Answer(RespReply* out) override {
    if (array_) out->Array(tasks_.size());
    for (ReadTask& t : tasks_) t.AnswerValue(out);
  }

 private:
  bool array_;
};

class ExistsOp final : public TasksOp<ReadTask> {
 public:
  explicit ExistsOp(std::span<const std::string_view> keys) {
    for (std::string_view k : keys) Add(ReadTask(k, ReadTask::Mode::kExists));
  }
  void Answer(RespReply* out) override {
    int64_t n = 0;
    for (const ReadTask& t : tasks_) n += t.found();
    out->Int(n);
  }
};

class TtlOp final : public TasksOp<ReadTask> {
 public:
  TtlOp(std::string_view key, bool millis) : millis_(millis) { Add(ReadTask(key, ReadTask::Mode::kTtl)); }
  bool Step(const RespOpEnv& env) override {
    now_ms_ = env.now_ms;
    return TasksOp<ReadTask>::Step(env);
  }
  void Answer(RespReply* out) override {
    const ReadTask& t = tasks_[0];
    if (!t.found()) return out->Int(-2);
    if (t.expire_at_ms() == 0) return out->Int(-1);
    const int64_t left = std::max<int64_t>(0, t.expire_at_ms() - now_ms_);
    out->Int(millis_ ? left : (left + 500) / 1000);
  }

 private:
  bool millis_;
  int64_t now_ms_ = 0;
};

class MSetOp final : public TasksOp<WriteTask> {
 public:
  explicit MSetOp(std::span<const std::string_view> kv) {
    // A key named twice: only its last value is written (as if in order).
    std::unordered_map<std::string_view, size_t> last;
    for (size_t i = 0; i + 1 < kv.size(); i += 2) last[kv[i]] = i;
    for (size_t i = 0; i + 1 < kv.size(); i += 2)
      if (last[kv[i]] == i) Add(WriteTask(kv[i], kv[i + 1], RespSetOptions{}));
  }
  void Answer(RespReply* out) override {
    for (const WriteTask& t : tasks_)
      if (!t.result().ok()) return out->Err("ERR " + t.result().ToString());
    out->Ok();
  }
};

class DelOp final : public TasksOp<DelTask> {
 public:
  explicit DelOp(std::span<const std::string_view> keys) {
    for (std::string_view k : keys) Add(DelTask(k));
  }
  void Answer(RespReply* out) override {
    int64_t n = 0;
    for (const DelTask& t : tasks_) n += t.existed();
    out->Int(n);
  }
};

class StatsOp final : public RespOp {
 public:
  StatsOp(bool dbsize, std::string header) : dbsize_(dbsize), header_(std::move(header)) {}
  bool Step(const RespOpEnv&) override {
    if (!asked_) {
      asked_ = true;
      BlockIo io;
      io.kind = BlockIo::Kind::kStats;
      io_.push_back(std::move(io));
      return false;
    }
    result_ = std::move(io_[0]);
    io_.clear();
    return true;
  }
  void Answer(RespReply* out) override {
    if (dbsize_) return out->Int(static_cast<int64_t>(result_.count));
    out->BulkOwned(header_ + std::string(result_.value.data(), result_.value.size()));
  }

 private:
  bool dbsize_;
  bool asked_ = false;
  std::string header_;
  BlockIo result_;
};

class AnsweredOp final : public RespOp {
 public:
  explicit AnsweredOp(std::string a) : answer_(std::move(a)) {}
  bool Step(const RespOpEnv&) override { return true; }
  void Answer(RespReply* out) override { out->Add(std::move(answer_)); }

 private:
  std::string answer_;
};

}  // namespace

std::unique_ptr<RespOp> MakeGetOp(std::string_view key) { return std::make_unique<GetOneOp>(key); }
std::unique_ptr<RespOp> MakeMGetOp(std::span<const std::string_view> keys) {
  return std::make_unique<GetOp>(keys, true);
}
std::unique_ptr<RespOp> MakeExistsOp(std::span<const std::string_view> keys) {
  return std::make_unique<ExistsOp>(keys);
}
std::unique_ptr<RespOp> MakeTtlOp(std::string_view key, bool millis) { return std::make_unique<TtlOp>(key, millis); }
std::unique_ptr<RespOp> MakeSetOp(std::string_view key, std::string_view value, const RespSetOptions& o,
                                  bool int_reply) {
  return std::make_unique<SetOneOp>(key, value, o, int_reply);
}
std::unique_ptr<RespOp> MakeMSetOp(std::span<const std::string_view> kv) {
  return std::make_unique<MSetOp>(kv);
}
std::unique_ptr<RespOp> MakeDelOp(std::span<const std::string_view> keys) { return std::make_unique<DelOp>(keys); }
std::unique_ptr<RespOp> MakeStatsOp(bool dbsize, std::string header) {
  return std::make_unique<StatsOp>(dbsize, std::move(header));
}
std::unique_ptr<RespOp> MakeAnsweredOp(std::string answer) { return std::make_unique<AnsweredOp>(std::move(answer)); }

}  // namespace kvmesh
