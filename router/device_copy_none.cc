// router/device_copy.h without CUDA: device memory cannot be registered.
#include "router/device_copy.h"

namespace kvmesh {

bool DeviceCopyAvailable() { return false; }
Status CopyToDevice(void*, const void*, size_t) { return Unimplemented("kvmesh was built without CUDA"); }
Status CopyFromDevice(void*, const void*, size_t) { return Unimplemented("kvmesh was built without CUDA"); }

}  // namespace kvmesh
