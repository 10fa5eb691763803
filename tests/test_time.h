// tests/test_time.h — bounds on waits inside the tests, grown with the build:
// sanitizer builds run several times slower, and a bound that only keeps a
// broken test from hanging (how long a child process may take to print its
// answer, say) must not fail a correct one there. The factor is the build's
// KVMESH_TEST_TIMEOUT_SCALE (cmake/KvmeshHelpers.cmake: 1, or 4 with a
// sanitizer), which also multiplies each test's ctest TIMEOUT.
// Bounds that are the behaviour under test (a timeout firing on time) stay as
// they are.
#pragma once

#include <chrono>

#ifndef KVMESH_TEST_TIME_SCALE
#define KVMESH_TEST_TIME_SCALE 1
#endif

namespace kvmesh::testing {

inline constexpr int kTimeScale = KVMESH_TEST_TIME_SCALE;

// d, times the build's slowdown factor.
constexpr std::chrono::milliseconds TimeBound(std::chrono::milliseconds d) { return d * kTimeScale; }

}  // namespace kvmesh::testing
