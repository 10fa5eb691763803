// common/credentials.h — secrets on the wire: constant-time comparison, and
// the HTTP Authorization header the control plane uses (docs/security.md).
//
// The control plane (the coordinator's API, a node's HTTP port) takes
//   Authorization: Bearer <cluster secret>        ($.auth.token: full access)
//   Authorization: Basic base64(<tenant>:<token>)  ($.auth.tenants[]: reads the map)
//
//   HttpCredentials c = ParseAuthorization(header);
//   if (c.kind == HttpCredentials::Kind::kBearer && ConstantTimeEquals(c.secret, token)) ...
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kvmesh {

// True when a == b. The time taken depends on the lengths only, never on
// where the bytes differ (for comparing secrets a client sent).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// RFC 4648 base64 with padding.
std::string Base64Encode(std::string_view bytes);
// nullopt for characters outside the alphabet or bad padding.
std::optional<std::string> Base64Decode(std::string_view text);

struct HttpCredentials {
  enum class Kind { kNone, kBearer, kBasic, kMalformed };
  Kind kind = Kind::kNone;
  std::string user;    // kBasic: the tenant name
  std::string secret;  // kBearer: the token; kBasic: the password
};

// Parses an Authorization header value ("" -> kNone). The scheme is
// case-insensitive; anything that is not a well-formed Bearer or Basic
// value is kMalformed.
HttpCredentials ParseAuthorization(std::string_view header);

// Header values for a client: "Bearer <token>", "Basic base64(user:password)".
std::string BearerAuthorization(std::string_view token);
std::string BasicAuthorization(std::string_view user, std::string_view password);

}  // namespace kvmesh
