// transport/resp/resp_protocol.h — the Redis protocol (RESP2) both kvmesh
// RESP fronts speak: the node-local front (shard_node/server/resp_server.h,
// one node's store, zero hops) and the cluster-wide proxy
// (router/proxy/resp_proxy.h, every key to the node that owns it). One
// parser and one encoder here; one command table (resp_commands.h) and one
// value format (resp_value.h, resp_ops.h) for both.
//
// Parsing bounds every length (bulk <= max_bulk, array <= 1M elements,
// inline line <= 64 KiB): a protocol error is answered "-ERR Protocol error"
// and closes only that connection. No allocation depends on an unchecked
// length. A connection parses incrementally (RespCommandParser): the work per
// byte received stays constant however a command is cut into reads.
//
// Thread-safety: ParseRespCommand is pure; a RespCommandParser, a
// RespReadBuffer and a RespReply are used by one thread at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <utility>
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
// Starts over on every call: a connection's reader uses RespCommandParser.
RespParse ParseRespCommand(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args,
                           size_t* consumed, std::string* err);

// The same, incrementally, for one connection: the parser keeps its place in
// the command it has begun, so a command that arrives a byte at a time costs
// each byte once (a call re-reads at most the header of the bulk string it
// waits for), never the arguments it already parsed.
class RespCommandParser {
 public:
  // Parses the command that begins at in[0]: `in` holds every byte of it
  // received so far, the bytes of the previous call unchanged (the buffer
  // may have moved). kNeedMore: call again with more bytes. kCommand: as
  // ParseRespCommand; the next call begins a new command at in[0]. kError:
  // *err says why (the parser starts afresh).
  RespParse Parse(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args, size_t* consumed,
                  std::string* err);
  // Bytes the command has been seen to need in all so far: once a bulk
  // string's length is read, at least its end (a reader sizes its buffer
  // once); 0 before.
  size_t wanted() const { return wanted_; }
  // True when part of a command has been parsed.
  bool begun() const { return nargs_ >= 0 || scan_ > 0; }
  void Reset();

 private:
  int64_t nargs_ = -1;  // elements of the array begun (-1: its "*<n>" line not read yet)
  size_t pos_ = 0;      // bytes of the command parsed so far
  size_t scan_ = 0;     // an inline command: bytes searched for its end so far
  size_t wanted_ = 0;
  std::vector<std::pair<size_t, size_t>> spans_;  // the arguments parsed: offset, length
};

// A connection's read buffer: grows without zero-filling (what is not yet
// read is never initialised) and can shrink back.
class RespReadBuffer {
 public:
  char* data() { return data_.get(); }
  size_t capacity() const { return cap_; }
  // Reallocates to `cap` bytes, keeping the first `keep` (REQUIRES keep <= cap).
  void Resize(size_t cap, size_t keep);
  // Room for the next read of a connection that has `filled` bytes buffered:
  // a full buffer grows to twice its size (`first` when it has none), at
  // least to `wanted` (the end of the bulk string the parser waits for, in
  // one allocation) and at most to `max`. False when it is full at `max`: no
  // command it may take is that long, and the connection must close.
  bool MakeRoom(size_t filled, size_t first, size_t wanted, size_t max);

 private:
  std::unique_ptr<char[]> data_;
  size_t cap_ = 0;
};

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
