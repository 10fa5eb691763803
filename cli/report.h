// cli/report.h — small helpers shared by the commands that print
// side-by-side comparisons (kvmesh decode, kvmesh demo).
#pragma once

#include <cstdint>
#include <cstdio>

namespace kvmesh::cli {

inline double Ms(uint64_t ns) { return static_cast<double>(ns) / 1e6; }
// a / b, 0 when b is 0.
inline double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

// One "name  x  y  x/y" row: x and y printed with `fmt`, in columns of
// name_width and value_width; the ratio takes value_width - 5 digits.
inline void PrintRatioRow(const char* name, double x, double y, const char* fmt, int name_width, int value_width) {
  char bx[32], by[32];
  std::snprintf(bx, sizeof bx, fmt, x);
  std::snprintf(by, sizeof by, fmt, y);
  std::printf("  %-*s %*s %*s %*.2fx\n", name_width, name, value_width, bx, value_width, by, value_width - 5,
              Ratio(x, y));
}

}  // namespace kvmesh::cli
