#include "cli/serve/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

namespace kvmesh::serve {

bool Sustains(const RunResult& r) {
  return r.requests > 0 && r.finished == r.requests && r.met_slo >= 0.9 * double(r.requests);
}

Ratios CompareConfigs(const std::vector<RunResult>& results, const std::string& a, const std::string& b) {
  Ratios out;
  out.a = a;
  out.b = b;
  std::map<double, const RunResult*> ra, rb;
  for (const RunResult& r : results) {
    if (r.config == a) ra[r.rate] = &r;
    if (r.config == b) rb[r.rate] = &r;
  }
  for (const auto& [rate, x] : ra) {
    auto y = rb.find(rate);
    if (y == rb.end()) continue;
    out.goodput.emplace_back(rate, y->second->goodput > 0 ? x->goodput / y->second->goodput : 0);
    if (Sustains(*x) && Sustains(*y->second)) {
      out.sustained_rate = rate;
      out.ttft_p99_ratio = y->second->ttft_p99 > 0 ? x->ttft_p99 / y->second->ttft_p99 : 0;
    }
  }
  return out;
}

std::vector<HitBound> HitBounds(const std::vector<RunResult>& results, const std::string& base) {
  std::vector<HitBound> out;
  for (const RunResult& r : results) {
    if (r.config.rfind("kvmesh", 0) != 0) continue;
    HitBound h;
    h.config = r.config;
    h.rate = r.rate;
    const DecisionCounters& d = r.decisions;
    h.cost_ratio = d.est_recompute_s > 0 ? d.decided_s / d.est_recompute_s : 0;
    const RunResult* b = nullptr;
    for (const RunResult& x : results)
      if (x.config == base && x.rate == r.rate && x.ttft.size() == r.ttft.size()) b = &x;
    std::vector<double> mine, theirs;
    for (size_t i = 0; i < r.run.size() && i < r.ttft.size(); ++i) {
      if (r.run[i] == 0) continue;
      mine.push_back(r.ttft[i]);
      if (b) theirs.push_back(b->ttft[i]);
    }
    h.hit_requests = mine.size();
    h.ttft_p50 = Percentile(mine, 50);
    h.base_ttft_p50 = Percentile(theirs, 50);
    h.ttft_ratio = h.base_ttft_p50 > 0 && !mine.empty() ? h.ttft_p50 / h.base_ttft_p50 : 0;
    out.push_back(h);
  }
  return out;
}

// The bound per request in the same run (RunResult::path_*): each request's
// path through kvmesh against recomputing what its local cache lacks.
static void PrintPathBounds(const std::vector<RunResult>& results) {
  std::printf("the same requests in the same run: path = lookup wait + (a load: decision to admission + prefill of "
              "the rest; else: prefill of the uncached tokens), against the prefill of the uncached tokens\n");
  std::printf("%-17s %6s %6s %8s %8s %8s %6s %8s %6s %9s %9s\n", "config", "rate", "hits", "path50", "path99",
              "max", ">5%", "lookups", ">5%", "wait ms", "timeouts");
  for (const RunResult& r : results) {
    if (r.config.rfind("kvmesh", 0) != 0) continue;
    const DecisionCounters& d = r.decisions;
    std::printf("%-17s %6.2f %6llu %7.3fx %7.3fx %7.3fx %6llu %8llu %6llu %9.1f %9llu\n", r.config.c_str(), r.rate,
                (unsigned long long)r.path_hits, r.path_ratio_p50, r.path_ratio_p99, r.path_ratio_max,
                (unsigned long long)r.path_hits_over, (unsigned long long)r.path_lookups,
                (unsigned long long)r.path_lookups_over, d.lookup_wait_s * 1e3,
                (unsigned long long)d.lookup_timeouts);
  }
}

// KV bytes held per tier (RunResult::held): what each kvmesh run added.
static void PrintHeld(const std::vector<RunResult>& results) {
  bool any = false;
  for (const RunResult& r : results) any |= !r.codec.empty();
  if (!any) return;
  std::printf("KV held by kvmesh at a run's end less its start, GB at real size (a codec's blocks as stored); raw = "
              "the primary tier's blocks unencoded\n");
  std::printf("%-17s %6s %-9s %9s %9s %9s %9s %7s\n", "config", "rate", "codec", "device", "host", "ssd", "raw",
              "raw/st");
  for (const RunResult& r : results) {
    if (r.codec.empty()) continue;
    const double primary = r.held.device > 0 ? r.held.device : r.held.host;
    std::printf("%-17s %6.2f %-9s %9.3f %9.3f %9.3f %9.3f ", r.config.c_str(), r.rate, r.codec.c_str(),
                r.held.device / 1e9, r.held.host / 1e9, r.held.ssd / 1e9, r.held.logical / 1e9);
    if (primary > 0 && r.held.logical > 0)
      std::printf("%6.2fx\n", r.held.logical / primary);
    else
      std::printf("%7s\n", "-");  // nothing net in the primary tier (a full tier demotes as much as it takes)
  }
}

void PrintTable(const BenchServeOptions& o, const std::vector<RunResult>& results) {
  std::printf("SLO: TTFT <= %.0f ms and TPOT <= %.0f ms; times in ms; hit = prompt tokens not prefilled\n",
              o.slo_ttft_s * 1e3, o.slo_tpot_s * 1e3);
  std::printf("%-16s %6s %7s %8s %8s %6s %6s %6s %7s %7s %5s %5s %5s %8s %8s %s\n", "config", "rate", "offer",
              "ttft50", "ttft99", "tpot50", "tpot99", "req/s", "tok/s", "goodput", "hit", "local", "load",
              "GB_load", "GB_put", "runs loaded/recomputed (slower)");
  for (const RunResult& r : results) {
    const DecisionCounters& d = r.decisions;
    std::printf("%-16s %6.2f %7.2f %8.1f %8.1f %6.1f %6.1f %6.2f %7.0f %7.2f %5.2f %5.2f %5.2f %8.2f %8.2f %llu/%llu (%llu)\n",
                r.config.c_str(), r.rate, r.offered_rps, r.ttft_p50 * 1e3, r.ttft_p99 * 1e3, r.tpot_p50 * 1e3,
                r.tpot_p99 * 1e3, r.req_s, r.tok_s, r.goodput, r.hit_rate, r.local_hit_rate, r.loaded_rate,
                d.bytes_loaded / 1e9, d.bytes_put / 1e9, (unsigned long long)d.runs_loaded,
                (unsigned long long)d.runs_recomputed, (unsigned long long)d.loads_slower);
  }
  const std::vector<HitBound> bounds = HitBounds(results);
  if (!bounds.empty()) {
    std::printf("load or recompute: hits = requests kvmesh held a run for beyond the local prefix; their TTFT p50 "
                "against the same requests under local (recomputing the run); cost = decided / recompute-all of the "
                "runs; >5%% = loads slower than 1.05 x recomputing\n");
    std::printf("%-17s %6s %6s %7s %9s %9s %7s %6s %6s %6s %7s %7s %10s\n", "config", "rate", "hits", "runs",
                "hit_ttft", "local", "ratio", "cost", ">5%", "worst", "shadow", "GB/s", "est GB/s");
    for (const HitBound& h : bounds) {
      const RunResult* r = nullptr;
      for (const RunResult& x : results)
        if (x.config == h.config && x.rate == h.rate) r = &x;
      const DecisionCounters& d = r->decisions;
      const double measured = d.charged_load_s > 0 ? d.bytes_loaded / d.charged_load_s : 0;
      std::printf("%-17s %6.2f %6llu %3llu/%-3llu %9.1f %9.1f %6.2fx %5.2fx %6llu %5.2fx %7llu %7.2f %10.2f\n",
                  h.config.c_str(), h.rate, (unsigned long long)h.hit_requests, (unsigned long long)d.runs_loaded,
                  (unsigned long long)d.runs_recomputed, h.ttft_p50 * 1e3, h.base_ttft_p50 * 1e3, h.ttft_ratio,
                  h.cost_ratio, (unsigned long long)d.loads_over_bound, d.worst_load_ratio,
                  (unsigned long long)d.shadow_loads, measured / 1e9, r->link_bytes_per_s / 1e9);
    }
    PrintPathBounds(results);
  }
  PrintHeld(results);
  for (const char* other : {"local", "kvmesh-blind"}) {
    const Ratios q = CompareConfigs(results, "kvmesh", other);
    if (q.goodput.empty()) continue;
    std::printf("kvmesh / %s, goodput:", other);
    for (const auto& [rate, x] : q.goodput) std::printf("  %.2f req/s: %.2fx", rate, x);
    if (q.sustained_rate > 0)
      std::printf("; TTFT p99 at %.2f req/s (highest both sustain): %.2fx\n", q.sustained_rate, q.ttft_p99_ratio);
    else
      std::printf("; no rate both sustain\n");
  }
}

nlohmann::json ResultsJson(const BenchServeOptions& o, const std::vector<RunResult>& results) {
  nlohmann::json runs = nlohmann::json::array();
  for (const RunResult& r : results) {
    const DecisionCounters& d = r.decisions;
    runs.push_back({{"config", r.config}, {"rate", r.rate}, {"offered_rps", r.offered_rps},
                    {"requests", r.requests}, {"finished", r.finished}, {"met_slo", r.met_slo},
                    {"ttft_p50_s", r.ttft_p50}, {"ttft_p99_s", r.ttft_p99}, {"tpot_p50_s", r.tpot_p50},
                    {"tpot_p99_s", r.tpot_p99}, {"req_s", r.req_s}, {"tok_s", r.tok_s}, {"goodput", r.goodput},
                    {"hit_rate", r.hit_rate}, {"local_hit_rate", r.local_hit_rate}, {"loaded_rate", r.loaded_rate},
                    {"later_turn_hit_rate", r.later_turn_hit_rate}, {"sustained", Sustains(r)},
                    {"link", {{"latency_s", r.link_latency_s}, {"bytes_per_s", r.link_bytes_per_s},
                              {"deviation", r.link_deviation}, {"probe_latency_s", r.probe_latency_s},
                              {"probe_bytes_per_s", r.probe_bytes_per_s}}},
                    {"decisions", {{"lookups", d.lookups}, {"runs", d.runs}, {"runs_loaded", d.runs_loaded},
                                   {"runs_recomputed", d.runs_recomputed}, {"blocks_loaded", d.blocks_loaded},
                                   {"blocks_recomputed", d.blocks_recomputed}, {"load_misses", d.load_misses},
                                   {"est_load_s", d.est_load_s}, {"est_recompute_s", d.est_recompute_s},
                                   {"charged_load_s", d.charged_load_s}, {"loads_slower", d.loads_slower},
                                   {"load_loss_s", d.load_loss_s}, {"decided_s", d.decided_s},
                                   {"loads_over_bound", d.loads_over_bound},
                                   {"worst_load_ratio", d.worst_load_ratio}, {"shadow_loads", d.shadow_loads},
                                   {"shadow_load_s", d.shadow_load_s}, {"lookup_wait_s", d.lookup_wait_s},
                                   {"lookup_rpc_s", d.lookup_rpc_s}, {"lookup_timeouts", d.lookup_timeouts}}},
                    {"path_bound", {{"hits", r.path_hits}, {"hits_over", r.path_hits_over},
                                    {"lookups", r.path_lookups}, {"lookups_over", r.path_lookups_over},
                                    {"ratio_p50", r.path_ratio_p50}, {"ratio_p99", r.path_ratio_p99},
                                    {"ratio_max", r.path_ratio_max}}},
                    {"bytes_loaded", d.bytes_loaded}, {"bytes_put", d.bytes_put},
                    {"codec", r.codec},
                    {"held_bytes", {{"device", r.held.device}, {"host", r.held.host}, {"ssd", r.held.ssd},
                                    {"raw", r.held.logical}}},
                    {"get_errors", d.get_errors}, {"put_errors", d.put_errors}, {"seconds", r.seconds}});
  }
  nlohmann::json ratios = nlohmann::json::object();
  for (const char* other : {"local", "kvmesh-blind", "recompute"}) {
    const Ratios q = CompareConfigs(results, "kvmesh", other);
    if (q.goodput.empty()) continue;
    nlohmann::json g = nlohmann::json::array();
    for (const auto& [rate, x] : q.goodput) g.push_back({{"rate", rate}, {"goodput_ratio", x}});
    ratios[std::string("kvmesh_over_") + other] = {{"goodput", g}, {"sustained_rate", q.sustained_rate},
                                                   {"ttft_p99_ratio", q.ttft_p99_ratio}};
  }
  nlohmann::json hb = nlohmann::json::array();
  for (const HitBound& h : HitBounds(results))
    hb.push_back({{"config", h.config}, {"rate", h.rate}, {"hit_requests", h.hit_requests},
                  {"hit_ttft_p50_s", h.ttft_p50}, {"local_ttft_p50_s", h.base_ttft_p50},
                  {"ttft_ratio", h.ttft_ratio}, {"cost_ratio", h.cost_ratio}});
  return {{"engine_model", o.engine_model}, {"mfu", o.mfu}, {"mbu", o.mbu}, {"engines", o.engines},
          {"cluster", o.cluster}, {"transport", o.transport}, {"nodes", o.nodes}, {"kv_scale", o.kv_scale},
          {"block_tokens", o.block_tokens}, {"local_cache_blocks", o.local_cache_blocks},
          {"slo", {{"ttft_s", o.slo_ttft_s}, {"tpot_s", o.slo_tpot_s}}},
          {"workload", {{"duration_s", o.workload.duration_s}, {"turns", o.workload.turns},
                        {"think_s", o.workload.think_s}, {"agent_share", o.workload.agent_share},
                        {"system_tokens", o.workload.system_tokens},
                        {"agent_preamble_tokens", o.workload.agent_preamble_tokens},
                        {"user_tokens", o.workload.user_tokens}, {"tool_tokens", o.workload.tool_tokens},
                        {"output_tokens", o.workload.output_tokens}, {"seed", o.workload.seed}}},
          {"runs", runs}, {"ratios", ratios}, {"hit_bounds", hb}};
}

bool WritePlots(const std::string& prefix, const BenchServeOptions& o, const std::vector<RunResult>& results) {
  std::vector<std::string> configs;
  for (const RunResult& r : results)
    if (std::find(configs.begin(), configs.end(), r.config) == configs.end()) configs.push_back(r.config);
  const std::string dat = prefix + ".dat";
  {
    std::ofstream f(dat);
    for (const std::string& c : configs) {  // one gnuplot data block per configuration
      f << "# " << c << ": offered_rps ttft_p99_ms goodput\n";
      for (const RunResult& r : results)
        if (r.config == c) f << r.offered_rps << ' ' << r.ttft_p99 * 1e3 << ' ' << r.goodput << '\n';
      f << "\n\n";
    }
  }
  const std::string title = "kvmesh bench-serve: " + o.engine_model + ", " + std::to_string(o.engines) + " engines";
  bool ok = GnuplotCurves(prefix + "-ttft-p99.png", dat, configs, 2, title, "offered load (requests/s)",
                          "TTFT p99 (ms)", true);
  ok &= GnuplotCurves(prefix + "-goodput.png", dat, configs, 3, title, "offered load (requests/s)",
                      "goodput (requests/s within SLO)", false);
  return ok;
}

bool GnuplotCurves(const std::string& png, const std::string& dat, const std::vector<std::string>& curves,
                   int column, const std::string& title, const std::string& xlabel, const std::string& ylabel,
                   bool logy) {
  const std::string gp = png + ".gp";
  {
    std::ofstream f(gp);
    f << "set terminal pngcairo size 800,500\nset output '" << png << "'\n"
      << "set title '" << title << "'\n"
      << "set xlabel '" << xlabel << "'\nset ylabel '" << ylabel << "'\nset grid\nset key top left\n"
      << (logy ? "set logscale y\n" : "") << "plot ";
    for (size_t i = 0; i < curves.size(); ++i)
      f << (i ? ", " : "") << "'" << dat << "' index " << i << " using 1:" << column
        << " with linespoints pt 7 title '" << curves[i] << "'";
    f << "\n";
  }
  return std::system(("gnuplot '" + gp + "' 2>/dev/null").c_str()) == 0;
}

}  // namespace kvmesh::serve
