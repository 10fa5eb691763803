// common/bounded_json.h — parsing JSON that came over the network with a
// bound on its nesting depth (docs/security.md, "Resource limits").
//
// nlohmann::json parses without recursion, but copying, dumping and comparing
// a document recurse once per level: a 100,000-level body parsed whole and
// then copied or dumped overflows the stack. Every JSON body or answer a
// daemon reads from a peer goes through ParseBoundedJson, which refuses a
// document nested deeper than `max_depth` before any DOM is built (a SAX pass
// that stops at the first level too deep), then parses it.
//
//   Result<nlohmann::json> j = ParseBoundedJson(request.body, kMaxNetworkJsonDepth);
//   if (!j.ok()) return 400 with j.status().message();
//
// Size is bounded where the bytes are read (the HTTP servers' body limits,
// the HTTP client's answer limit), not here. A loader of local files that
// dumps values into its errors (the config loader) can use it the same way,
// with ignore_comments.
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvmesh/status.h"

namespace kvmesh {

// The control plane's documents are at most 4 levels deep ({"eviction":
// {key: [scores]}} in a heartbeat, the map's nodes' ports); 16 leaves room.
inline constexpr size_t kMaxNetworkJsonDepth = 16;

namespace bounded_json_detail {

// Counts container levels; stops the parse at the first one past the bound.
class DepthSax final : public nlohmann::json::json_sax_t {
 public:
  explicit DepthSax(size_t max_depth) : max_(max_depth) {}
  bool too_deep() const { return too_deep_; }
  bool syntax_error() const { return syntax_error_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Enter(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return Leave(); }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override { return Leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception&) override {
    syntax_error_ = true;
    return false;
  }

 private:
  bool Enter() {
    if (++depth_ > max_) {
      too_deep_ = true;
      return false;  // ends the parse here: nothing past this level is read
    }
    return true;
  }
  bool Leave() {
    --depth_;
    return true;
  }
  const size_t max_;
  size_t depth_ = 0;
  bool too_deep_ = false;
  bool syntax_error_ = false;
};

}  // namespace bounded_json_detail

// One JSON document (nothing but whitespace after it) nested at most
// `max_depth` levels (a flat object or array is 1 level; a scalar 0).
// InvalidArgument "not valid JSON" or "nested deeper than N levels".
// Never throws.
inline Result<nlohmann::json> ParseBoundedJson(std::string_view text, size_t max_depth = kMaxNetworkJsonDepth,
                                               bool ignore_comments = false) {
  bounded_json_detail::DepthSax sax(max_depth);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json,
                                   /*strict=*/true, ignore_comments);
  } catch (const nlohmann::json::exception&) {  // a number no double holds (out_of_range), to be safe
    ok = false;
  }
  if (sax.too_deep()) return InvalidArgument("nested deeper than " + std::to_string(max_depth) + " levels");
  if (!ok) return InvalidArgument("not valid JSON");
  nlohmann::json j =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false, ignore_comments);
  if (j.is_discarded()) return InvalidArgument("not valid JSON");
  return j;
}

}  // namespace kvmesh
