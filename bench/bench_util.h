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

// Measures several functions in alternating trials (A B C A B C ...), so
// all see the same machine load; one Sample each, in the order given.
inline std::vector<Sample> MeasureAlternating(int trials, const std::vector<std::function<double()>>& fns) {
  for (const auto& fn : fns) fn();  // warm-up
  std::vector<std::vector<double>> rates(fns.size());
  for (int t = 0; t < trials; ++t) {
    for (size_t which = 0; which < fns.size(); ++which) {
      double t0 = NowSeconds();
      double units = fns[which]();
      rates[which].push_back(units / (NowSeconds() - t0));
    }
  }
  std::vector<Sample> out;
  for (std::vector<double>& v : rates) {
    std::sort(v.begin(), v.end());
    out.push_back(Sample{v[v.size() / 2], v.front(), v.back()});
  }
  return out;
}

// Measures a candidate and its baseline in alternating trials (A B A B ...),
// so both see the same machine load; returns {candidate, baseline}.
inline std::pair<Sample, Sample> MeasurePair(int trials, const std::function<double()>& a,
                                             const std::function<double()>& b) {
  const std::vector<Sample> s = MeasureAlternating(trials, {a, b});
  return {s[0], s[1]};
}

}  // namespace kvmesh::bench
