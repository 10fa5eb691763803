// transport/resp/resp_protocol.h — the Redis protocol (RESP2) both kvmesh
// RESP fronts speak: the node-local front (resp_server.h, one node's store,
// zero hops) and the cluster-wide proxy (resp_proxy.h, every key through the
// router to the node that owns it). One parser, one encoder, one command
// table; each front supplies a RespBackend.
//
// Commands: PING [msg], ECHO, GET, SET key value (options such as EX are
// accepted and ignored: kvmesh evicts by policy), MGET, MSET, EXISTS, DEL
// (UNLINK), INFO, DBSIZE, SELECT 0, QUIT, plus the handshake answers clients
// ask for (COMMAND, CONFIG GET save|appendonly, CLIENT ..., HELLO -> RESP2).
// Keys and values are binary-safe; a key is stored under RespKey(key) =
// xxHash3-128("resp\0" + key), so RESP keys never meet router block keys and
// both fronts name a key the same way. Values are blocks: at most the store's
// slot size (a larger SET is answered an error, its connection stays open).
//
// Parsing bounds every length (bulk <= max_bulk, array <= 1M elements,
// inline line <= 64 KiB): a protocol error is answered "-ERR Protocol error"
// and closes only that connection. No allocation depends on an unchecked length.
//
// Thread-safety: ParseRespCommand and RespKey are pure; a RespReply is used by
// one thread at a time; RespCommands is as thread-safe as its backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/block_key.h"
#include "kvmesh/status.h"

namespace kvmesh {

constexpr size_t kRespMaxInline = 64 << 10;   // longest inline command line
constexpr int64_t kRespMaxArgs = 1 << 20;     // most elements in one command array

enum class RespParse { kNeedMore, kCommand, kError };

// Parses one command (a RESP array of bulk strings, or an inline command) from
// the front of `in`. On kCommand, args point into `in` and *consumed is the
// bytes used (args may be empty: a blank inline line). On kError, *err says why.
RespParse ParseRespCommand(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args,
                           size_t* consumed, std::string* err);

// The block key a RESP key is stored under (a key space of its own).
BlockKey RespKey(std::string_view key);

// An answer being gathered for one write: owned pieces and borrowed memory,
// in order, without copying large values.
class RespReply {
 public:
  void Add(std::string s);                     // raw protocol bytes
  void Bulk(std::string_view s);               // copies s
  void BulkOwned(std::string s);               // takes s without copying it
  // A bulk string of memory the reply does not own; `keep` holds it alive
  // until the reply is destroyed (e.g. a pinned store block).
  void BulkBorrowed(std::span<const char> s, std::shared_ptr<const void> keep);
  void Nil() { Add("$-1\r\n"); }
  void Int(int64_t v) { Add(":" + std::to_string(v) + "\r\n"); }
  void Ok() { Add("+OK\r\n"); }
  void Err(const std::string& m);              // "-<m>\r\n" (CR/LF in m become spaces)
  void Array(size_t n) { Add("*" + std::to_string(n) + "\r\n"); }

  // The pieces to write, in order; valid until the reply is changed or destroyed.
  const std::vector<std::span<const char>>& pieces() const { return pieces_; }
  size_t bytes() const { return bytes_; }
  bool empty() const { return pieces_.empty(); }

 private:
  std::deque<std::string> strs_;  // stable addresses
  std::vector<std::shared_ptr<const void>> keep_;
  std::vector<std::span<const char>> pieces_;
  size_t bytes_ = 0;
};

// The store behind a front. Keys are RESP keys (the backend applies RespKey).
class RespBackend {
 public:
  virtual ~RespBackend() = default;
  // Appends one answer per key, in order: its value as a bulk string, or nil
  // on a miss (a node that cannot be reached is a miss too).
  virtual void Get(std::span<const std::string_view> keys, RespReply* out) = 0;
  // Stores values[i] under keys[i]; statuses[i] is its result.
  // REQUIRES: keys.size() == values.size() == statuses.size().
  virtual void Set(std::span<const std::string_view> keys, std::span<const std::string_view> values,
                   std::span<Status> statuses) = 0;
  virtual int64_t Exists(std::span<const std::string_view> keys) = 0;  // how many are stored
  virtual int64_t Del(std::span<const std::string_view> keys) = 0;     // how many were erased
  virtual int64_t DbSize() = 0;
  // INFO sections after "# Server\r\nredis_version:...\r\n" (each line "k:v\r\n").
  virtual std::string Info() = 0;
};

// A command: its arguments (args[0] is the name).
using RespCommand = std::vector<std::string_view>;

// The command table over a backend.
class RespCommands {
 public:
  // REQUIRES: backend outlives this. A SET of more than max_value_bytes (the
  // slot size) is answered an error without reaching the backend.
  RespCommands(RespBackend* backend, uint64_t max_value_bytes)
      : backend_(backend), max_value_bytes_(max_value_bytes) {}

  // Runs `cmds` in order and appends each one's answer to `out`. Consecutive
  // GETs (and consecutive SETs) reach the backend as one batch, so a
  // pipelined run costs one router operation, not one per command; the
  // answers stay in command order. Returns false when a QUIT was run (the
  // commands after it are not).
  bool Run(std::span<const RespCommand> cmds, RespReply* out);

  uint64_t commands() const { return commands_.load(std::memory_order_relaxed); }

 private:
  bool Execute(const RespCommand& a, RespReply* out);
  Status CheckValue(std::string_view v) const;
  RespBackend* backend_;
  const uint64_t max_value_bytes_;
  std::atomic<uint64_t> commands_{0};
};

// The "# Server" header of INFO (RESP-compatible version line).
std::string RespInfoHeader();

}  // namespace kvmesh
