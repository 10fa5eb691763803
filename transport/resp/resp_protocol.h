// transport/resp/resp_protocol.h — the Redis protocol (RESP2) both kvmesh
// RESP fronts speak: the node-local front (shard_node/server/resp_server.h,
// one node's store, zero hops) and the cluster-wide proxy
// (router/proxy/resp_proxy.h, every key to the node that owns it). One
// parser and one encoder here; one command table (resp_commands.h) and one
// value format (resp_value.h, resp_ops.h) for both.
//
// Parsing bounds every length (bulk <= max_bulk, array <= 1M elements,
// inline line <= 64 KiB): a protocol error is answered "-ERR Protocol error"
// and closes only that connection. No allocation depends on an unchecked length.
//
// Thread-safety: ParseRespCommand is pure; a RespReply is used by one thread
// at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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
  // Raw bytes the reply does not own (e.g. one part of a bulk string), kept
  // alive by `keep` until the reply is destroyed.
  void Borrowed(std::span<const char> s, std::shared_ptr<const void> keep);
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

// A command: its arguments (args[0] is the name).
using RespCommand = std::vector<std::string_view>;

// The "# Server" header of INFO (RESP-compatible version line).
std::string RespInfoHeader();

}  // namespace kvmesh
