// common/spawn.h — starts a program as the leader of its own process group
// (so a harness can signal the whole group), its stdout on a non-blocking
// pipe the caller reads, its stderr in a log file, SIGPIPE at its default and
// no signal blocked. Used by the daemons `kvmesh bench-serve` and the soak
// harness launch.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh {

struct SpawnedChild {
  pid_t pid = -1;
  int out = -1;  // read end of the child's stdout, O_NONBLOCK; the caller closes it
  int in = -1;   // with pipe_stdin: write end of the child's stdin (blocking); the caller closes it
};

// argv[0] is the program's path. `append_log`: open the log with O_APPEND
// (a restarted daemon keeps its earlier lines) instead of O_TRUNC.
// `pipe_stdin`: the child's stdin is a pipe whose write end is `in` (closing
// it is the child's end of input); else the child inherits stdin.
Result<SpawnedChild> SpawnWithStdoutPipe(const std::vector<std::string>& argv, const std::string& log_path,
                                         bool append_log, bool pipe_stdin = false);

}  // namespace kvmesh
