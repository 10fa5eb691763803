// cli/daemon_signals.h — clean shutdown for the daemons: SIGTERM and SIGINT
// are blocked in every thread (call BlockStopSignals() before any thread
// starts, so threads inherit the mask) and taken synchronously by
// WaitForStopSignal() on the main thread, which then stops the servers in
// order. No async-signal-unsafe work ever runs in a signal handler.
#pragma once

#include <signal.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace kvmesh::cli {

inline sigset_t StopSignals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

inline void BlockStopSignals() {
  sigset_t s = StopSignals();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

// Returns the signal number that arrived.
inline int WaitForStopSignal() {
  sigset_t s = StopSignals();
  int sig = 0;
  while (sigwait(&s, &sig) != 0) {
  }
  return sig;
}

// One JSON line on stdout, flushed (scripts and tests read these).
inline void PrintLine(const std::string& json) {
  std::cout << json << std::endl;
}

}  // namespace kvmesh::cli
