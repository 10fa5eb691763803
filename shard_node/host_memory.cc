#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "shard_node/memory_backend.h"

namespace kvmesh {
namespace {

class HostMemory final : public MemoryBackend {
 public:
  HostMemory(std::byte* base, size_t size, int fd = -1) : base_(base), size_(size), fd_(fd) {}
  ~HostMemory() override {
    munmap(base_, size_);
    if (fd_ >= 0) close(fd_);
  }
  int shared_fd() const override { return fd_; }
  std::string_view name() const override { return "host"; }
  bool host_accessible() const override { return true; }
  std::byte* base() const override { return base_; }
  size_t size() const override { return size_; }
  void CopyIn(std::byte* dst, const std::byte* src, size_t n) override { std::memcpy(dst, src, n); }
  void CopyOut(std::byte* dst, const std::byte* src, size_t n) override { std::memcpy(dst, src, n); }

 private:
  std::byte* base_;
  size_t size_;
  int fd_;
};

}  // namespace

Result<std::unique_ptr<MemoryBackend>> MakeHostMemory(size_t bytes, const HostMemoryOptions& o) {
  if (bytes == 0) return InvalidArgument("host memory budget must be > 0");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (o.prefault) flags |= MAP_POPULATE;
  int fd = -1;
  if (o.shared) {
    // Pages are allocated on first write, as for anonymous memory.
    fd = memfd_create("kvmesh-pool", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      if (fd >= 0) close(fd);
      return ResourceExhausted("cannot make " + std::to_string(bytes) + " bytes of shared host memory: " +
                               std::strerror(e));
    }
    flags = (flags & ~(MAP_PRIVATE | MAP_ANONYMOUS)) | MAP_SHARED;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    if (fd >= 0) close(fd);
    return ResourceExhausted("cannot map " + std::to_string(bytes) + " bytes of host memory: " + std::strerror(e));
  }
  if (o.hugepages) (void)madvise(p, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<MemoryBackend>(new HostMemory(static_cast<std::byte*>(p), bytes, fd));
}

}  // namespace kvmesh
