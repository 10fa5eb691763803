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

// The 5% bound, per run of a kvmesh configuration: the requests whose prompt
// kvmesh held a run of beyond the local prefix (its hits, loaded or
// recomputed), their TTFT p50 against the same requests' TTFT p50 in the
// `base` configuration at the same rate (which recomputes those runs), and
// the decided cost of the runs (loads' charged time, recomputes' estimate)
// against recomputing every one.
struct HitBound {
  std::string config;
  double rate = 0;
  uint64_t hit_requests = 0;
  double ttft_p50 = 0, base_ttft_p50 = 0, ttft_ratio = 0;  // 0: no base run or no hit
  double cost_ratio = 0;                                   // decided_s / est_recompute_s
};
std::vector<HitBound> HitBounds(const std::vector<RunResult>& results, const std::string& base = "local");

void PrintTable(const BenchServeOptions& o, const std::vector<RunResult>& results);
nlohmann::json ResultsJson(const BenchServeOptions& o, const std::vector<RunResult>& results);
// Writes <prefix>-ttft-p99.png and <prefix>-goodput.png (and their .dat/.gp).
// Returns false when gnuplot failed (the .dat files stay).
bool WritePlots(const std::string& prefix, const BenchServeOptions& o, const std::vector<RunResult>& results);

// Writes `png` with gnuplot from `dat` (one data block per curve, titled
// `curves`): column `column` against column 1, one line per curve.
// Returns false when gnuplot failed. WritePlots and the world-model report use it.
bool GnuplotCurves(const std::string& png, const std::string& dat, const std::vector<std::string>& curves,
                   int column, const std::string& title, const std::string& xlabel, const std::string& ylabel,
                   bool logy);

}  // namespace kvmesh::serve
