#include "kvmesh/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

namespace kvmesh {

Result<uint64_t> ParseSize(std::string_view text) {
  auto bad = [&](const char* why) {
    return InvalidArgument("cannot parse size '" + std::string(text) + "': " + why);
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t num_begin = i;
  bool seen_digit = false, seen_dot = false;
  while (i < text.size()) {
    char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++i;
  }
  if (!seen_digit) {
    if (i < text.size() && text[i] == '-') return bad("sizes cannot be negative");
    return bad("expected a number such as 8GB, 512MiB or 4096");
  }
  const std::string number(text.substr(num_begin, i - num_begin));
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) break;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  if (i != text.size()) return bad("trailing characters");

  long double mult;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kb" || unit == "k") mult = 1e3L;
  else if (unit == "mb" || unit == "m") mult = 1e6L;
  else if (unit == "gb" || unit == "g") mult = 1e9L;
  else if (unit == "tb" || unit == "t") mult = 1e12L;
  else if (unit == "kib") mult = 1024.0L;
  else if (unit == "mib") mult = 1024.0L * 1024;
  else if (unit == "gib") mult = 1024.0L * 1024 * 1024;
  else if (unit == "tib") mult = 1024.0L * 1024 * 1024 * 1024;
  else return bad("unknown unit (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");

  long double v = std::strtold(number.c_str(), nullptr) * mult;
  if (!(v < 9.2233720368547758e18L)) return bad("value too large");
  return static_cast<uint64_t>(std::floor(v));
}

std::string FormatSize(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f%s", v, kUnits[u]);
  else std::snprintf(buf, sizeof buf, "%.2f%s", v, kUnits[u]);
  return buf;
}

}  // namespace kvmesh
