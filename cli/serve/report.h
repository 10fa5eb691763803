// cli/serve/report.h — what `kvmesh bench-serve` prints: the table per
// configuration and rate, the same-run ratios of kvmesh against the
// local-cache-only configuration, the JSON document, and the PNG plots
// (gnuplot: TTFT p99 and goodput against offered load, a curve per
// configuration).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/serve/bench_serve.h"

namespace kvmesh::serve {

// A configuration sustains a rate when every request finished and at least
// 90% met the SLO.
bool Sustains(const RunResult& r);

// kvmesh over local: goodput at each rate, and TTFT p99 at the highest rate
// both sustain (0 when they share none).
struct Ratios {
  std::string a = "kvmesh", b = "local";
  std::vector<std::pair<double, double>> goodput;  // (rate, a / b)
  double sustained_rate = 0, ttft_p99_ratio = 0;    // a / b at that rate
};
Ratios CompareConfigs(const std::vector<RunResult>& results, const std::string& a, const std::string& b);

void PrintTable(const BenchServeOptions& o, const std::vector<RunResult>& results);
nlohmann::json ResultsJson(const BenchServeOptions& o, const std::vector<RunResult>& results);
// Writes <prefix>-ttft-p99.png and <prefix>-goodput.png (and their .dat/.gp).
// Returns false when gnuplot failed (the .dat files stay).
bool WritePlots(const std::string& prefix, const BenchServeOptions& o, const std::vector<RunResult>& results);

}  // namespace kvmesh::serve
