#include "common/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

extern char** environ;

namespace kvmesh {

Result<SpawnedChild> SpawnWithStdoutPipe(const std::vector<std::string>& argv, const std::string& log_path,
                                         bool append_log, bool pipe_stdin) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe2", errno);
  int in[2] = {-1, -1};
  if (pipe_stdin && ::pipe2(in, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return ErrnoStatus("pipe2", err);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  if (pipe_stdin) posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_addopen(&fa, 2, log_path.c_str(), O_WRONLY | O_CREAT | (append_log ? O_APPEND : O_TRUNC),
                                   0644);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  sigset_t def, none;
  sigemptyset(&def);
  sigaddset(&def, SIGPIPE);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &def);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  SpawnedChild c;
  const int rc = ::posix_spawn(&c.pid, args[0], &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (pipe_stdin) ::close(in[0]);
  if (rc != 0) {
    ::close(fds[0]);
    if (pipe_stdin) ::close(in[1]);
    return ErrnoStatus("posix_spawn " + argv[0], rc);
  }
  c.out = fds[0];
  c.in = in[1];
  ::fcntl(c.out, F_SETFL, O_NONBLOCK);
  return c;
}

}  // namespace kvmesh
