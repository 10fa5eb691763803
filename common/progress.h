// common/progress.h — a progress bar on stderr for long commands (replays,
// benchmarks, the demo). Draws only when stderr is a terminal; silent when
// piped or under CI, so logs and --json output stay clean. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace kvmesh {

class ProgressBar {
 public:
  // total: number of units of work; label: shown before the bar.
  ProgressBar(std::string label, uint64_t total, bool enabled = true);
  ~ProgressBar();  // finishes the line
  void Update(uint64_t done);
  void Finish();
  bool active() const { return active_; }

 private:
  std::string label_;
  uint64_t total_;
  bool active_;
  int64_t last_draw_ns_ = 0;
  int64_t start_ns_ = 0;
  bool finished_ = false;
};

}  // namespace kvmesh
