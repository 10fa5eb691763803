// kvmesh/size.h — byte sizes as users write them in configs and flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvmesh/status.h"

namespace kvmesh {

// Parses "8GB" (10^9), "512MiB" (2^20), "1.5GiB", "64KB", "4096", "4096B".
// Units: B, KB/MB/GB/TB (decimal), KiB/MiB/GiB/TiB (binary); case-insensitive,
// optional space before the unit. Fractions are allowed when the result is a
// whole number of bytes after rounding down. Rejects negatives, empty strings,
// unknown units and values over 2^63.
Result<uint64_t> ParseSize(std::string_view text);

// 1536 -> "1.5KiB"; exact values print without decimals ("64MiB").
std::string FormatSize(uint64_t bytes);

}  // namespace kvmesh
