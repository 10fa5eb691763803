#include "transport/resp/resp_commands.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace kvmesh {
namespace {

bool Eq(std::string_view a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

bool ParseInt(std::string_view s, int64_t* v) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

std::string Bulk(std::string_view s) { return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n"; }
std::string Error(const std::string& m) {
  std::string line = "-" + m;
  for (char& c : line)
    if (c == '\r' || c == '\n') c = ' ';
  return line + "\r\n";
}
std::string Arity(std::string_view cmd) {
  std::string lower(cmd.substr(0, 64));
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return Error("ERR wrong number of arguments for '" + lower + "' command");
}

// Case-insensitive equality with a lower-case name.
bool EqUpper(std::string_view a, std::string_view lower) {
  if (a.size() != lower.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != lower[i]) return false;
  return true;
}

std::string Int(int64_t v) { return ":" + std::to_string(v) + "\r\n"; }

// COMMAND's table (the Redis 6 shape: name, arity, flags, first key, last
// key, step): cluster clients read the key positions from it.
struct CommandInfo {
  const char* name;
  int arity;  // > 0: exactly; < 0: at least -arity
  const char* flags;  // space separated
  int first, last, step;
};
constexpr CommandInfo kCommandTable[] = {
    {"get", 2, "readonly fast", 1, 1, 1},           {"set", -3, "write denyoom", 1, 1, 1},
    {"setnx", 3, "write denyoom fast", 1, 1, 1},    {"setex", 4, "write denyoom", 1, 1, 1},
    {"psetex", 4, "write denyoom", 1, 1, 1},        {"mget", -2, "readonly fast", 1, -1, 1},
    {"mset", -3, "write denyoom", 1, -1, 2},        {"exists", -2, "readonly fast", 1, -1, 1},
    {"del", -2, "write", 1, -1, 1},                 {"unlink", -2, "write fast", 1, -1, 1},
    {"ttl", 2, "readonly fast", 1, 1, 1},           {"pttl", 2, "readonly fast", 1, 1, 1},
    {"ping", -1, "fast", 0, 0, 0},                  {"echo", 2, "fast", 0, 0, 0},
    {"info", -1, "loading stale", 0, 0, 0},         {"dbsize", 1, "readonly fast", 0, 0, 0},
    {"select", 2, "loading stale fast", 0, 0, 0},   {"auth", -2, "noscript loading stale fast no_auth", 0, 0, 0},
    {"hello", -1, "noscript loading stale fast no_auth", 0, 0, 0},
    {"client", -2, "noscript loading stale", 0, 0, 0}, {"quit", -1, "noscript loading stale fast no_auth", 0, 0, 0},
    {"command", -1, "loading stale", 0, 0, 0},      {"config", -2, "admin noscript loading stale", 0, 0, 0},
    {"cluster", -2, "stale", 0, 0, 0},              {"readonly", 1, "loading stale fast", 0, 0, 0},
    {"readwrite", 1, "loading stale fast", 0, 0, 0}, {"asking", 1, "fast", 0, 0, 0},
};

std::string CommandEntry(const CommandInfo& c) {
  std::string flags;
  size_t nflags = 0;
  for (std::string_view f = c.flags; !f.empty();) {
    const size_t sp = f.find(' ');
    const std::string_view one = f.substr(0, sp);
    flags += "+" + std::string(one) + "\r\n";
    ++nflags;
    f = sp == std::string_view::npos ? std::string_view() : f.substr(sp + 1);
  }
  return "*6\r\n" + Bulk(c.name) + Int(c.arity) + "*" + std::to_string(nflags) + "\r\n" + flags + Int(c.first) +
         Int(c.last) + Int(c.step);
}

std::string CommandReply(const RespCommand& a) {
  const size_t n = sizeof(kCommandTable) / sizeof(kCommandTable[0]);
  if (a.size() == 1) {
    std::string out = "*" + std::to_string(n) + "\r\n";
    for (const CommandInfo& c : kCommandTable) out += CommandEntry(c);
    return out;
  }
  if (Eq(a[1], "COUNT")) return Int(static_cast<int64_t>(n));
  if (Eq(a[1], "INFO")) {
    std::string out = "*" + std::to_string(a.size() - 2) + "\r\n";
    for (size_t i = 2; i < a.size(); ++i) {
      const CommandInfo* found = nullptr;
      for (const CommandInfo& c : kCommandTable)
        if (EqUpper(a[i], c.name)) found = &c;
      out += found ? CommandEntry(*found) : std::string("*-1\r\n");
    }
    return out;
  }
  return "*0\r\n";  // DOCS and the rest: nothing to add
}

constexpr const char* kNoAuth = "-NOAUTH Authentication required.\r\n";
constexpr const char* kWrongPass = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";

bool SecretEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;  // the length is no secret
  unsigned diff = 0;                       // constant time in the bytes
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned>(static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  return diff == 0;
}

class ClusterAuth final : public RespAuth {
 public:
  explicit ClusterAuth(AuthConfig auth) : auth_(std::move(auth)) {}
  bool required() const override { return !auth_.token.empty(); }
  std::optional<uint32_t> Login(std::string_view user, std::string_view password) const override {
    std::optional<uint32_t> found;
    if (user == "default" && SecretEquals(password, auth_.token)) found = 0;
    // Every tenant's name and secret are compared, found or not.
    for (size_t i = 0; i < auth_.tenants.size(); ++i) {
      const bool name = SecretEquals(user, auth_.tenants[i].name);
      const bool secret = SecretEquals(password, auth_.tenants[i].token);
      if (name && secret && !found) found = static_cast<uint32_t>(i + 1);
    }
    return found;
  }
  uint64_t QuotaBytes(uint32_t identity) const override {
    return identity >= 1 && identity <= auth_.tenants.size() ? auth_.tenants[identity - 1].quota_bytes : 0;
  }
  size_t tenants() const override { return auth_.tenants.size(); }

 private:
  AuthConfig auth_;
};

// The smallest chunk a block store cuts (shard_node/block_store.h
// kMinChunkBytes; this layer may not include it): a block holds at least
// min(slot, this), and a node charges at least 7/8 of its chunk.
constexpr uint64_t kStoreMinChunkBytes = 4096;

}  // namespace

std::shared_ptr<const RespAuth> MakeClusterAuth(const AuthConfig& auth) {
  if (auth.token.empty()) return nullptr;
  return std::make_shared<ClusterAuth>(auth);
}

RespKeyRules RespRulesFromConfig(const RespConfig& c) {
  RespKeyRules r;
  r.hash_tags = c.hash_tags;
  r.group_suffixes = c.group_suffixes;
  r.cluster_slots = c.cluster;
  return r;
}

std::string RespClusterNodeId(std::string_view node_id) {
  const XXH128_hash_t h = XXH3_128bits(node_id.data(), node_id.size());
  const uint64_t t = XXH3_64bits_withSeed(node_id.data(), node_id.size(), 0x6b766d657368ull);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%016llx%016llx%08llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64), static_cast<unsigned long long>(t & 0xffffffffull));
  return std::string(buf, 40);
}

std::shared_ptr<const RespAuth> MakeTokenAuth(std::string token) {
  AuthConfig a;
  a.token = std::move(token);
  return MakeClusterAuth(a);
}

RespCommands::RespCommands(RespFrontOptions o) : o_(std::move(o)) {
  identities_ = 1 + (o_.auth ? o_.auth->tenants() : 0);
  by_identity_ = std::make_unique<std::atomic<uint64_t>[]>(identities_);
  for (size_t i = 0; i < identities_; ++i) by_identity_[i].store(0, std::memory_order_relaxed);
}

uint64_t RespCommands::commands(uint32_t identity) const {
  return identity < identities_ ? by_identity_[identity].load(std::memory_order_relaxed) : 0;
}

uint64_t RespCommands::ValueCharge(uint64_t value_bytes) const {
  const uint64_t floor = std::min(o_.block_bytes, kStoreMinChunkBytes);
  auto block = [&](uint64_t n) {
    return o_.block_charge ? o_.block_charge(n) : std::max(n, floor - floor / 8);
  };
  RespHead h;
  LayoutRespValue(value_bytes, o_.block_bytes, &h);
  if (h.is_inline()) return block(kRespHeadBytes + value_bytes);
  return block(kRespHeadBytes) + uint64_t{h.parts - 1} * block(h.part_bytes) + block(h.PartSize(h.parts - 1));
}

std::string RespCommands::OverQuota(uint32_t identity, uint64_t value_bytes) const {
  const uint64_t quota = o_.auth ? o_.auth->QuotaBytes(identity) : 0;
  if (quota == 0) return "";
  // A value is all or nothing: one whose blocks cannot all fit the quota
  // would evict its own first parts as it is written (and read as nil).
  const uint64_t held = ValueCharge(value_bytes);
  if (held <= quota) return "";
  return Error("ERR ResourceExhausted: a value of " + std::to_string(value_bytes) + " bytes holds " +
               std::to_string(held) + " bytes of blocks, more than this tenant's quota of " + std::to_string(quota) +
               " bytes per node");
}

RespOpEnv RespCommands::Env() const {
  RespOpEnv e;
  e.rules = &o_.rules;
  e.block_bytes = o_.block_bytes;
  e.now_ms = RespNowMs();
  return e;
}

RespCommands::KeyAccess RespCommands::Access(const RespCommand& a) {
  const std::string_view c = a[0];
  const size_t n = a.size();
  if (n < 2) return {};
  if (Eq(c, "GET") || Eq(c, "TTL") || Eq(c, "PTTL")) return {1, 2, 1, false};
  if (Eq(c, "MGET") || Eq(c, "EXISTS")) return {1, n, 1, false};
  if (Eq(c, "SET")) {
    bool blind = true;
    for (size_t i = 3; i < n; ++i) blind = blind && !Eq(a[i], "NX") && !Eq(a[i], "XX") && !Eq(a[i], "KEEPTTL") && !Eq(a[i], "GET");
    return {1, 2, 1, true, blind};
  }
  if (Eq(c, "SETEX") || Eq(c, "PSETEX")) return {1, 2, 1, true, true};
  if (Eq(c, "SETNX")) return {1, 2, 1, true, false};
  if (Eq(c, "MSET")) return {1, n, 2, true, true};
  if (Eq(c, "DEL") || Eq(c, "UNLINK")) return {1, n, 1, true, false};
  return {};
}

std::unique_ptr<RespOp> RespCommands::Compile(const RespCommand& a, RespSessionState* s, bool* quit) const {
  commands_.fetch_add(1, std::memory_order_relaxed);
  if (s->identity < identities_) by_identity_[s->identity].fetch_add(1, std::memory_order_relaxed);
  const std::string_view cmd = a[0];
  const size_t argc = a.size();
  auto answer = [](std::string s) { return MakeAnsweredOp(std::move(s)); };
  const bool locked = o_.auth && o_.auth->required() && !s->authenticated;
  if (Eq(cmd, "AUTH")) {
    if (argc != 2 && argc != 3) return answer(Arity(cmd));
    if (!o_.auth || !o_.auth->required()) {
      if (argc == 2)
        return answer(Error("ERR AUTH <password> called without any password configured for the default user. "
                            "Are you sure your configuration is correct?"));
      return answer(kWrongPass);
    }
    const std::optional<uint32_t> id = o_.auth->Login(argc == 2 ? "default" : a[1], a[argc - 1]);
    if (!id) return answer(kWrongPass);
    s->authenticated = true;
    s->identity = *id;
    return answer("+OK\r\n");
  }
  if (Eq(cmd, "HELLO")) return answer(Hello(a, s));
  if (Eq(cmd, "QUIT")) {
    *quit = true;
    return answer("+OK\r\n");
  }
  if (locked) return answer(kNoAuth);
  if (Eq(cmd, "CLUSTER")) {
    if (!o_.cluster) return answer(Error("ERR This instance has cluster support disabled"));
    return answer(Cluster(a));
  }
  if (Eq(cmd, "READONLY") || Eq(cmd, "READWRITE") || Eq(cmd, "ASKING")) {
    if (!o_.cluster) return answer(Error("ERR This instance has cluster support disabled"));
    return answer("+OK\r\n");
  }
  if (o_.cluster)
    if (std::string r = Redirect(a); !r.empty()) return answer(std::move(r));

  std::span<const std::string_view> rest(a.data() + 1, argc - 1);
  if (Eq(cmd, "GET")) {
    if (argc != 2) return answer(Arity(cmd));
    return MakeGetOp(a[1]);
  }
  if (Eq(cmd, "SET") || Eq(cmd, "SETNX") || Eq(cmd, "SETEX") || Eq(cmd, "PSETEX")) return Set(a, *s);
  if (Eq(cmd, "MGET")) {
    if (argc < 2) return answer(Arity(cmd));
    return MakeMGetOp(rest);
  }
  if (Eq(cmd, "MSET")) {
    if (argc < 3 || argc % 2 == 0) return answer(Arity(cmd));
    for (size_t i = 2; i < argc; i += 2)
      if (a[i].size() > o_.max_value_bytes)
        return answer(Error("ERR ResourceExhausted: value of " + std::to_string(a[i].size()) +
                            " bytes exceeds the maximum of " + std::to_string(o_.max_value_bytes) + " bytes"));
    for (size_t i = 2; i < argc; i += 2)
      if (std::string e = OverQuota(s->identity, a[i].size()); !e.empty()) return answer(std::move(e));
    return MakeMSetOp(rest);
  }
  if (Eq(cmd, "EXISTS")) {
    if (argc < 2) return answer(Arity(cmd));
    return MakeExistsOp(rest);
  }
  if (Eq(cmd, "DEL") || Eq(cmd, "UNLINK")) {
    if (argc < 2) return answer(Arity(cmd));
    return MakeDelOp(rest);
  }
  if (Eq(cmd, "TTL") || Eq(cmd, "PTTL")) {
    if (argc != 2) return answer(Arity(cmd));
    return MakeTtlOp(a[1], Eq(cmd, "PTTL"));
  }
  if (Eq(cmd, "PING")) {
    if (argc > 2) return answer(Arity(cmd));
    return answer(argc == 1 ? std::string("+PONG\r\n") : Bulk(a[1]));
  }
  if (Eq(cmd, "ECHO")) {
    if (argc != 2) return answer(Arity(cmd));
    return answer(Bulk(a[1]));
  }
  if (Eq(cmd, "INFO")) {
    // A tenant sees its own figures only: the commands it sent, not the front's.
    const uint64_t n = s->identity == 0 ? commands() : commands(s->identity);
    return MakeStatsOp(false, RespInfoHeader() + "resp_commands_processed:" + std::to_string(n) + "\r\n" +
                                  "# Cluster\r\ncluster_enabled:" + (o_.cluster ? "1" : "0") + "\r\n");
  }
  if (Eq(cmd, "DBSIZE")) return MakeStatsOp(true, "");
  if (Eq(cmd, "SELECT")) {
    if (argc != 2) return answer(Arity(cmd));
    return answer(a[1] == "0" ? std::string("+OK\r\n") : Error("ERR kvmesh has one database (0)"));
  }
  if (Eq(cmd, "CONFIG")) {
    // redis-benchmark reads "save" and "appendonly": kvmesh is a cache with neither.
    if (argc == 3 && Eq(a[1], "GET")) {
      std::string_view k = a[2];
      if (k == "save" || k == "appendonly") return answer("*2\r\n" + Bulk(k) + Bulk(k == "save" ? "" : "no"));
      return answer("*0\r\n");
    }
    return answer(Error("ERR CONFIG supports only GET"));
  }
  if (Eq(cmd, "COMMAND")) return answer(CommandReply(a));
  if (Eq(cmd, "CLIENT")) {
    if (argc >= 2 && Eq(a[1], "SETNAME")) {
      if (argc != 3) return answer(Arity(cmd));
      s->name = std::string(a[2]);
      return answer("+OK\r\n");
    }
    if (argc >= 2 && Eq(a[1], "GETNAME")) return answer(s->name.empty() ? std::string("$-1\r\n") : Bulk(s->name));
    if (argc >= 2 && Eq(a[1], "ID")) return answer(":" + std::to_string(s->id) + "\r\n");
    return answer("+OK\r\n");  // SETINFO (lib-name, lib-ver), NO-EVICT, ... accepted
  }
  return answer(Error("ERR unknown command '" + std::string(cmd.substr(0, 64)) +
                      "' (kvmesh speaks PING ECHO GET SET SETNX SETEX PSETEX MGET MSET EXISTS DEL TTL PTTL INFO "
                      "DBSIZE SELECT AUTH HELLO CLIENT COMMAND CONFIG CLUSTER QUIT)"));
}

std::unique_ptr<RespOp> RespCommands::Set(const RespCommand& a, const RespSessionState& s) const {
  const std::string_view cmd = a[0];
  const size_t argc = a.size();
  RespSetOptions o;
  std::string_view key, value;
  bool int_reply = false;
  const int64_t now = RespNowMs();
  auto ttl = [&](std::string_view v, int64_t unit_ms, bool absolute) -> std::string {
    int64_t x = 0;
    if (!ParseInt(v, &x)) return Error("ERR value is not an integer or out of range");
    if (x <= 0 || x > INT64_MAX / 1000 / 2) return Error("ERR invalid expire time in '" + std::string(cmd) + "' command");
    o.expire_at_ms = absolute ? x * unit_ms : now + x * unit_ms;
    return "";
  };
  if (Eq(cmd, "SETNX")) {
    if (argc != 3) return MakeAnsweredOp(Arity(cmd));
    key = a[1], value = a[2], o.nx = true, int_reply = true;
  } else if (Eq(cmd, "SETEX") || Eq(cmd, "PSETEX")) {
    if (argc != 4) return MakeAnsweredOp(Arity(cmd));
    key = a[1], value = a[3];
    if (std::string e = ttl(a[2], Eq(cmd, "SETEX") ? 1000 : 1, false); !e.empty()) return MakeAnsweredOp(e);
  } else {
    if (argc < 3) return MakeAnsweredOp(Arity(cmd));
    key = a[1], value = a[2];
    bool have_expiry = false;
    for (size_t i = 3; i < argc; ++i) {
      const std::string_view opt = a[i];
      if (Eq(opt, "NX") && !o.xx) {
        o.nx = true;
      } else if (Eq(opt, "XX") && !o.nx) {
        o.xx = true;
      } else if (Eq(opt, "KEEPTTL") && !have_expiry) {
        o.keep_ttl = true;
      } else if ((Eq(opt, "EX") || Eq(opt, "PX") || Eq(opt, "EXAT") || Eq(opt, "PXAT")) && !have_expiry &&
                 !o.keep_ttl && i + 1 < argc) {
        have_expiry = true;
        const bool secs = Eq(opt, "EX") || Eq(opt, "EXAT");
        if (std::string e = ttl(a[++i], secs ? 1000 : 1, Eq(opt, "EXAT") || Eq(opt, "PXAT")); !e.empty())
          return MakeAnsweredOp(e);
      } else if (Eq(opt, "GET")) {
        return MakeAnsweredOp(Error("ERR kvmesh does not support SET ... GET"));
      } else {
        return MakeAnsweredOp(Error("ERR syntax error"));
      }
    }
  }
  if (value.size() > o_.max_value_bytes)
    return MakeAnsweredOp(Error("ERR ResourceExhausted: value of " + std::to_string(value.size()) +
                                " bytes exceeds the maximum of " + std::to_string(o_.max_value_bytes) + " bytes"));
  if (std::string e = OverQuota(s.identity, value.size()); !e.empty()) return MakeAnsweredOp(std::move(e));
  return MakeSetOp(key, value, o, int_reply);
}

std::string RespCommands::Hello(const RespCommand& a, RespSessionState* s) const {
  const size_t argc = a.size();
  if (argc >= 2) {
    int64_t ver = 0;
    if (!ParseInt(a[1], &ver)) return Error("ERR Protocol version is not an integer or out of range");
    if (ver != 2) return Error("NOPROTO sorry, this protocol version is not supported (kvmesh speaks RESP2)");
  }
  std::string name;
  bool set_name = false;
  for (size_t i = 2; i < argc; ++i) {
    if (Eq(a[i], "AUTH") && i + 2 < argc) {
      const std::optional<uint32_t> id =
          o_.auth && o_.auth->required() ? o_.auth->Login(a[i + 1], a[i + 2]) : std::nullopt;
      if (!id) return kWrongPass;
      s->authenticated = true;
      s->identity = *id;
      i += 2;
    } else if (Eq(a[i], "SETNAME") && i + 1 < argc) {
      name = std::string(a[++i]);
      set_name = true;
    } else {
      return Error("ERR Syntax error in HELLO option '" + std::string(a[i].substr(0, 64)) + "'");
    }
  }
  if (o_.auth && o_.auth->required() && !s->authenticated)
    return Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> "
                 "AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol "
                 "version at the same time");
  if (set_name) s->name = std::move(name);
  return "*14\r\n" + Bulk("server") + Bulk("redis") + Bulk("version") + Bulk("7.0.0") + Bulk("proto") + ":2\r\n" +
         Bulk("id") + ":" + std::to_string(s->id) + "\r\n" + Bulk("mode") + Bulk(o_.cluster ? "cluster" : "standalone") + Bulk("role") +
         Bulk("master") + Bulk("modules") + "*0\r\n";
}

std::string RespCommands::Redirect(const RespCommand& a) const {
  const KeyAccess k = Access(a);
  if (k.first >= k.end) return "";
  const uint32_t slot = RespKeySlot(a[k.first]);
  for (size_t i = k.first + k.step; i < k.end; i += k.step)
    if (RespKeySlot(a[i]) != slot) return "-CROSSSLOT Keys in request don't hash to the same slot\r\n";
  const std::shared_ptr<const RespClusterView> v = o_.cluster->View();
  const int32_t owner = v && slot < v->owner.size() ? v->owner[slot] : -1;
  if (owner < 0) return "-CLUSTERDOWN Hash slot not served\r\n";
  if (owner == v->self) return "";
  const RespClusterView::Node& n = v->nodes[static_cast<size_t>(owner)];
  return "-MOVED " + std::to_string(slot) + " " + n.host + ":" + std::to_string(n.port) + "\r\n";
}

std::string RespCommands::Cluster(const RespCommand& a) const {
  if (a.size() < 2) return Arity(a[0]);
  const std::string_view sub = a[1];
  if (Eq(sub, "KEYSLOT")) {
    if (a.size() != 3) return Arity("cluster|keyslot");
    return Int(RespKeySlot(a[2]));
  }
  const std::shared_ptr<const RespClusterView> v = o_.cluster->View();
  const RespClusterView empty;
  const RespClusterView& view = v ? *v : empty;
  if (Eq(sub, "MYID")) return Bulk(view.self >= 0 ? view.nodes[static_cast<size_t>(view.self)].id : "");
  // Runs of consecutive slots with one owner: {first, last, owner}.
  struct Run {
    uint32_t first, last;
    int32_t owner;
  };
  std::vector<Run> runs;
  for (uint32_t s = 0; s < view.owner.size(); ++s) {
    const int32_t o = view.owner[s];
    if (o < 0) continue;
    if (!runs.empty() && runs.back().owner == o && runs.back().last + 1 == s) runs.back().last = s;
    else runs.push_back({s, s, o});
  }
  uint64_t served = 0;
  for (const Run& r : runs) served += r.last - r.first + 1;
  if (Eq(sub, "SLOTS")) {
    std::string out = "*" + std::to_string(runs.size()) + "\r\n";
    for (const Run& r : runs) {
      const RespClusterView::Node& n = view.nodes[static_cast<size_t>(r.owner)];
      out += "*3\r\n" + Int(r.first) + Int(r.last) + "*3\r\n" + Bulk(n.host) + Int(n.port) + Bulk(n.id);
    }
    return out;
  }
  if (Eq(sub, "SHARDS")) {  // Redis 7: per node, its slot ranges and itself (RESP2: flat key/value arrays)
    std::string out;
    size_t shards = 0;
    for (size_t i = 0; i < view.nodes.size(); ++i) {
      const RespClusterView::Node& n = view.nodes[i];
      std::string ranges;
      size_t count = 0;
      for (const Run& r : runs)
        if (r.owner == static_cast<int32_t>(i)) ranges += Int(r.first) + Int(r.last), count += 2;
      if (count == 0) continue;
      ++shards;
      out += "*4\r\n" + Bulk("slots") + "*" + std::to_string(count) + "\r\n" + ranges + Bulk("nodes") + "*1\r\n*14\r\n" +
             Bulk("id") + Bulk(n.id) + Bulk("port") + Int(n.port) + Bulk("ip") + Bulk(n.host) + Bulk("endpoint") +
             Bulk(n.host) + Bulk("role") + Bulk("master") + Bulk("replication-offset") + Int(0) + Bulk("health") +
             Bulk("online");
    }
    return "*" + std::to_string(shards) + "\r\n" + out;
  }
  if (Eq(sub, "NODES")) {
    std::string text;
    for (size_t i = 0; i < view.nodes.size(); ++i) {
      const RespClusterView::Node& n = view.nodes[i];
      text += n.id + " " + n.host + ":" + std::to_string(n.port) + "@" + std::to_string(n.bus_port) + " " +
              (static_cast<int>(i) == view.self ? "myself,master" : "master") + " - 0 0 " +
              std::to_string(view.epoch) + " connected";
      for (const Run& r : runs)
        if (r.owner == static_cast<int32_t>(i))
          text += " " + (r.first == r.last ? std::to_string(r.first)
                                           : std::to_string(r.first) + "-" + std::to_string(r.last));
      text += "\n";
    }
    return Bulk(text);
  }
  if (Eq(sub, "INFO")) {
    const bool ok = served == kRespClusterSlots;
    std::string text = std::string("cluster_state:") + (ok ? "ok" : "fail") + "\r\n";
    auto kv = [&](const char* k, uint64_t x) { text += std::string(k) + ":" + std::to_string(x) + "\r\n"; };
    kv("cluster_slots_assigned", served);
    kv("cluster_slots_ok", served);
    kv("cluster_slots_pfail", 0);
    kv("cluster_slots_fail", 0);
    kv("cluster_known_nodes", view.nodes.size());
    kv("cluster_size", view.nodes.size());
    kv("cluster_current_epoch", view.epoch);
    kv("cluster_my_epoch", view.epoch);
    return Bulk(text);
  }
  return Error("ERR unknown subcommand '" + std::string(sub.substr(0, 64)) +
               "' (kvmesh answers CLUSTER SLOTS SHARDS NODES INFO MYID KEYSLOT)");
}

}  // namespace kvmesh
