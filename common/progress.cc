#include "common/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "kvmesh/clock.h"

namespace kvmesh {

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total ? total : 1) {
  const char* ci = std::getenv("CI");
  active_ = enabled && isatty(STDERR_FILENO) && !(ci && *ci);
  start_ns_ = SystemClock()->NowNanos();
}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done) {
  if (!active_ || finished_) return;
  int64_t now = SystemClock()->NowNanos();
  if (done < total_ && now - last_draw_ns_ < 100'000'000) return;  // 10 Hz
  last_draw_ns_ = now;
  constexpr int kWidth = 30;
  double frac = static_cast<double>(done) / static_cast<double>(total_);
  if (frac > 1) frac = 1;
  int fill = static_cast<int>(frac * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < fill ? '#' : '.';
  bar[kWidth] = 0;
  double el = static_cast<double>(now - start_ns_) / 1e9;
  double eta = frac > 0 ? el / frac - el : 0;
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %llu/%llu  %.1fs elapsed, ~%.1fs left ", label_.c_str(),
               bar, frac * 100, static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total_), el, eta);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (!active_ || finished_) return;
  Update(total_);
  finished_ = true;
  std::fputc('\n', stderr);
}

}  // namespace kvmesh
