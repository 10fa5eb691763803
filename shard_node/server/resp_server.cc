#include "shard_node/server/resp_server.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <deque>
#include <string_view>
#include <thread>
#include <vector>

#include "shard_node/shard_node.h"
#include "transport/asio.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kMaxInline = 64 << 10;
constexpr int64_t kMaxArgs = 1 << 20;

enum class Parse { kNeedMore, kCommand, kError };

// Reads "<digits>\r\n" at in[pos] after a type byte. kNeedMore when the line is incomplete.
Parse ReadNumber(std::string_view in, size_t* pos, int64_t* out) {
  size_t eol = in.find("\r\n", *pos);
  if (eol == std::string_view::npos) return in.size() - *pos > 32 ? Parse::kError : Parse::kNeedMore;
  if (eol == *pos || eol - *pos > 20) return Parse::kError;
  int64_t v = 0;
  bool neg = false;
  size_t i = *pos;
  if (in[i] == '-') {
    neg = true;
    ++i;
  }
  if (i == eol) return Parse::kError;
  for (; i < eol; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(in[i]))) return Parse::kError;
    v = v * 10 + (in[i] - '0');
  }
  *out = neg ? -v : v;
  *pos = eol + 2;
  return Parse::kCommand;
}

// Parses one command (a RESP array of bulk strings, or an inline command)
// from the front of `in`. args point into `in`.
Parse ParseCommand(std::string_view in, uint64_t max_bulk, std::vector<std::string_view>* args, size_t* consumed,
                   std::string* err) {
  args->clear();
  if (in.empty()) return Parse::kNeedMore;
  if (in[0] != '*') {  // inline command: words up to the end of the line
    size_t eol = in.find('\n');
    if (eol == std::string_view::npos) {
      if (in.size() > kMaxInline) {
        *err = "inline command too long";
        return Parse::kError;
      }
      return Parse::kNeedMore;
    }
    std::string_view line = in.substr(0, eol);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t') ++j;
      if (j > i) args->push_back(line.substr(i, j - i));
      i = j;
    }
    *consumed = eol + 1;
    return Parse::kCommand;
  }
  size_t pos = 1;
  int64_t n = 0;
  Parse p = ReadNumber(in, &pos, &n);
  if (p != Parse::kCommand) {
    if (p == Parse::kError) *err = "invalid multibulk length";
    return p;
  }
  if (n < 0 || n > kMaxArgs) {
    *err = "invalid multibulk length";
    return Parse::kError;
  }
  for (int64_t a = 0; a < n; ++a) {
    if (pos >= in.size()) return Parse::kNeedMore;
    if (in[pos] != '$') {
      *err = "expected '$', got '" + std::string(1, in[pos]) + "'";
      return Parse::kError;
    }
    ++pos;
    int64_t len = 0;
    p = ReadNumber(in, &pos, &len);
    if (p != Parse::kCommand) {
      if (p == Parse::kError) *err = "invalid bulk length";
      return p;
    }
    if (len < 0 || static_cast<uint64_t>(len) > max_bulk) {
      *err = "invalid bulk length";
      return Parse::kError;
    }
    if (in.size() - pos < static_cast<size_t>(len) + 2) return Parse::kNeedMore;
    if (in[pos + len] != '\r' || in[pos + len + 1] != '\n') {
      *err = "bulk string not terminated by CRLF";
      return Parse::kError;
    }
    args->push_back(in.substr(pos, static_cast<size_t>(len)));
    pos += static_cast<size_t>(len) + 2;
  }
  *consumed = pos;
  return Parse::kCommand;
}

BlockKey RespKey(std::string_view key) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, "resp", 5);  // includes the NUL: a separate key space
  XXH3_128bits_update(st, key.data(), key.size());
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return BlockKey{h.high64, h.low64};
}

bool Eq(std::string_view a, const char* b) {
  size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

// The gathered answer to a run of pipelined commands.
struct Out {
  std::deque<std::string> strs;  // stable addresses
  std::vector<BlockRef> refs;
  std::vector<asio::const_buffer> bufs;
  size_t bytes = 0;
  void Add(std::string s) {
    bytes += s.size();
    // Coalesce small pieces into the previous owned string.
    if (!strs.empty() && !bufs.empty() && bufs.back().data() == strs.back().data() && s.size() < 256 &&
        strs.back().size() < 4096) {
      strs.back() += s;
      bufs.back() = asio::buffer(strs.back());
      return;
    }
    strs.push_back(std::move(s));
    bufs.push_back(asio::buffer(strs.back()));
  }
  void Bulk(std::string_view s) { Add("$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"); }
  void Nil() { Add("$-1\r\n"); }
  void Int(int64_t v) { Add(":" + std::to_string(v) + "\r\n"); }
  void Ok() { Add("+OK\r\n"); }
  void Err(const std::string& m) { Add("-" + m + "\r\n"); }
  void Array(size_t n) { Add("*" + std::to_string(n) + "\r\n"); }
  void Ref(BlockRef r) {
    Add("$" + std::to_string(r.data().size()) + "\r\n");
    auto d = r.data();
    refs.push_back(std::move(r));
    bufs.push_back(asio::buffer(d.data(), d.size()));
    bytes += d.size();
    strs.push_back("\r\n");
    bufs.push_back(asio::buffer(strs.back()));
  }
};

class Server final : public RespServer {
 public:
  Server(ShardNode* node, RespServerOptions o) : node_(node), o_(std::move(o)), acceptor_(io_) {}
  ~Server() override { Stop(); }

  Status Bind() {
    boost::system::error_code ec;
    auto addr = asio::ip::make_address(o_.host, ec);
    if (ec) return InvalidArgument("bad listen address " + o_.host);
    tcp::endpoint ep(addr, o_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Unavailable("RESP listen on " + o_.host + ":" + std::to_string(o_.port) + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    asio::co_spawn(io_, Accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
    return Status::Ok();
  }
  uint16_t port() const override { return port_; }
  uint64_t commands() const override { return commands_.load(); }
  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

 private:
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket s = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor_.is_open()) co_return;
        continue;
      }
      asio::co_spawn(io_, Session(std::move(s)), asio::detached);
    }
  }

  asio::awaitable<void> Session(tcp::socket s) {
    boost::system::error_code ec;
    s.set_option(tcp::no_delay(true), ec);
    std::vector<char> buf(64 << 10);
    size_t filled = 0;
    std::vector<std::string_view> args;
    bool quit = false;
    bool need_read = true;
    while (!quit) {
      if (need_read) {
        if (filled == buf.size()) {
          if (buf.size() >= o_.max_value_bytes + kMaxInline) break;  // cannot be a valid command
          buf.resize(std::min<size_t>(buf.size() * 2, o_.max_value_bytes + kMaxInline + 64));
        }
        size_t n = co_await s.async_read_some(asio::buffer(buf.data() + filled, buf.size() - filled),
                                              asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        filled += n;
      }
      Out out;
      size_t pos = 0;
      bool error = false;
      need_read = true;
      for (;;) {
        size_t used = 0;
        std::string err;
        Parse p = ParseCommand(std::string_view(buf.data() + pos, filled - pos), o_.max_value_bytes, &args, &used, &err);
        if (p == Parse::kNeedMore) break;
        if (p == Parse::kError) {
          out.Err("ERR Protocol error: " + err);
          error = true;
          break;
        }
        pos += used;
        if (args.empty()) continue;
        commands_.fetch_add(1, std::memory_order_relaxed);
        if (!Execute(args, &out)) {
          quit = true;
          break;
        }
        if (out.bytes > (8u << 20)) {  // answer what we have, then parse the rest
          need_read = false;
          break;
        }
      }
      if (!out.bufs.empty()) {
        co_await asio::async_write(s, out.bufs, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
      }
      if (error) break;
      // Keep the unparsed tail (args no longer referenced: the answer is written).
      std::memmove(buf.data(), buf.data() + pos, filled - pos);
      filled -= pos;
    }
    s.shutdown(tcp::socket::shutdown_both, ec);
    s.close(ec);
  }

  // Runs one command; false after QUIT.
  bool Execute(const std::vector<std::string_view>& a, Out* out) {
    const std::string_view cmd = a[0];
    const size_t argc = a.size();
    auto arity = [&](bool ok) {
      if (!ok) out->Err("ERR wrong number of arguments for '" + std::string(cmd) + "' command");
      return ok;
    };
    if (Eq(cmd, "GET")) {
      if (arity(argc == 2)) Get(a[1], out);
    } else if (Eq(cmd, "SET")) {
      if (arity(argc >= 3)) {
        Status s = Put(a[1], a[2]);
        if (s.ok()) out->Ok();
        else out->Err("ERR " + s.ToString());
      }
    } else if (Eq(cmd, "MGET")) {
      if (arity(argc >= 2)) {
        out->Array(argc - 1);
        for (size_t i = 1; i < argc; ++i) Get(a[i], out);
      }
    } else if (Eq(cmd, "MSET")) {
      if (arity(argc >= 3 && argc % 2 == 1)) {
        Status first;
        for (size_t i = 1; i + 1 < argc; i += 2) {
          Status s = Put(a[i], a[i + 1]);
          if (!s.ok() && first.ok()) first = s;
        }
        if (first.ok()) out->Ok();
        else out->Err("ERR " + first.ToString());
      }
    } else if (Eq(cmd, "EXISTS")) {
      if (arity(argc >= 2)) {
        int64_t n = 0;
        for (size_t i = 1; i < argc; ++i) n += node_->Exists(RespKey(a[i]), false);
        out->Int(n);
      }
    } else if (Eq(cmd, "DEL") || Eq(cmd, "UNLINK")) {
      if (arity(argc >= 2)) {
        int64_t n = 0;
        for (size_t i = 1; i < argc; ++i) n += node_->Erase(RespKey(a[i])).ok();
        out->Int(n);
      }
    } else if (Eq(cmd, "PING")) {
      if (argc == 1) out->Add("+PONG\r\n");
      else out->Bulk(a[1]);
    } else if (Eq(cmd, "ECHO")) {
      if (arity(argc == 2)) out->Bulk(a[1]);
    } else if (Eq(cmd, "INFO")) {
      out->Bulk(Info());
    } else if (Eq(cmd, "DBSIZE")) {
      out->Int(static_cast<int64_t>(node_->Stats().store.blocks));
    } else if (Eq(cmd, "SELECT")) {
      if (arity(argc == 2)) {
        if (a[1] == "0") out->Ok();
        else out->Err("ERR kvmesh has one database (0)");
      }
    } else if (Eq(cmd, "CONFIG")) {
      // redis-benchmark reads "save" and "appendonly": kvmesh is a cache with neither.
      if (argc == 3 && Eq(a[1], "GET")) {
        std::string_view k = a[2];
        if (k == "save" || k == "appendonly") {
          out->Array(2);
          out->Bulk(k);
          out->Bulk(k == "save" ? "" : "no");
        } else {
          out->Array(0);
        }
      } else {
        out->Err("ERR CONFIG supports only GET");
      }
    } else if (Eq(cmd, "COMMAND")) {
      out->Array(0);
    } else if (Eq(cmd, "CLIENT")) {
      out->Ok();
    } else if (Eq(cmd, "HELLO")) {
      out->Err("NOPROTO kvmesh speaks RESP2 only");
    } else if (Eq(cmd, "QUIT")) {
      out->Ok();
      return false;
    } else {
      out->Err("ERR unknown command '" + std::string(cmd.substr(0, 64)) +
               "' (kvmesh speaks PING ECHO GET SET MGET MSET EXISTS DEL INFO DBSIZE SELECT QUIT)");
    }
    return true;
  }

  void Get(std::string_view key, Out* out) {
    Result<BlockRef> r = node_->Get(RespKey(key));
    if (!r.ok()) return out->Nil();  // a miss, or a corrupt block (erased): nil either way
    if (r->meta().codec != 0) {  // stored encoded (config.codec): answer the decoded value
      std::string value(r->meta().logical_size, '\0');
      r->Release();
      Result<size_t> n = node_->GetInto(RespKey(key), std::as_writable_bytes(std::span<char>(value)));
      if (!n.ok()) return out->Nil();
      value.resize(*n);
      return out->Bulk(value);
    }
    if (node_->store().backend().host_accessible()) return out->Ref(std::move(*r));
    std::string copy(r->data().size(), '\0');
    node_->store().backend().CopyOut(reinterpret_cast<std::byte*>(copy.data()), r->data().data(), copy.size());
    out->Bulk(copy);
  }

  Status Put(std::string_view key, std::string_view value) {
    if (value.empty()) return InvalidArgument("kvmesh stores non-empty values only");
    return node_->Put(RespKey(key), std::as_bytes(std::span<const char>(value.data(), value.size())), PutOptions{});
  }

  std::string Info() const {
    NodeStats st = node_->Stats();
    const StoreStats& s = st.store;
    std::string o = "# Server\r\nredis_version:7.0.0-kvmesh\r\nkvmesh_version:0.1.0\r\nnode_id:" + st.node_id +
                    "\r\n# Stats\r\n";
    auto kv = [&](const char* k, uint64_t v) { o += std::string(k) + ":" + std::to_string(v) + "\r\n"; };
    kv("resp_commands_processed", commands_.load());
    kv("keyspace_hits", s.hits);
    kv("keyspace_misses", s.misses);
    kv("evicted_keys", s.evictions);
    o += "# Memory\r\n";
    kv("used_memory", s.bytes_stored);
    kv("maxmemory", s.capacity_bytes);
    kv("slot_bytes", s.slot_bytes);
    o += "# Keyspace\r\n";
    o += "db0:keys=" + std::to_string(s.blocks) + ",expires=0,avg_ttl=0\r\n";
    return o;
  }

  ShardNode* node_;
  RespServerOptions o_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> commands_{0};
};

}  // namespace

Result<std::unique_ptr<RespServer>> RespServer::Start(ShardNode* node, RespServerOptions options) {
  auto s = std::make_unique<Server>(node, std::move(options));
  KVMESH_RETURN_IF_ERROR(s->Bind());
  return std::unique_ptr<RespServer>(std::move(s));
}

}  // namespace kvmesh
