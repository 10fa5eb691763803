// bench/bench_util.h — the small harness every kvmesh benchmark uses:
// repeat a measurement, report the median (and min/max), and print each
// result beside a baseline measured in the same run as a ratio.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
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

// Measures a candidate and its baseline in alternating trials (A B A B ...),
// so both see the same machine load; returns {candidate, baseline}.
inline std::pair<Sample, Sample> MeasurePair(int trials, const std::function<double()>& a,
                                             const std::function<double()>& b) {
  a();
  b();
  std::vector<double> ra, rb;
  for (int t = 0; t < trials; ++t) {
    for (int which = 0; which < 2; ++which) {
      const auto& fn = which == 0 ? a : b;
      double t0 = NowSeconds();
      double units = fn();
      (which == 0 ? ra : rb).push_back(units / (NowSeconds() - t0));
    }
  }
  auto summarise = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return Sample{v[v.size() / 2], v.front(), v.back()};
  };
  return {summarise(ra), summarise(rb)};
}

}  // namespace kvmesh::bench
