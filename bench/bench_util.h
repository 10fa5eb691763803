// bench/bench_util.h — the small harness every kvmesh benchmark uses:
// repeat a measurement, report the median (and min/max), and print each
// result beside a baseline measured in the same run as a ratio.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace kvmesh::bench {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Sample {
  double median = 0, min = 0, max = 0;
};

// Runs fn() `trials` times (after one warm-up) and returns the rate
// units/second of each trial summarised. fn returns the units of work done.
inline Sample MeasureRate(int trials, const std::function<double()>& fn) {
  fn();  // warm-up: page faults, caches
  std::vector<double> rates;
  for (int t = 0; t < trials; ++t) {
    double t0 = NowSeconds();
    double units = fn();
    double dt = NowSeconds() - t0;
    rates.push_back(units / dt);
  }
  std::sort(rates.begin(), rates.end());
  return Sample{rates[rates.size() / 2], rates.front(), rates.back()};
}

}  // namespace kvmesh::bench
