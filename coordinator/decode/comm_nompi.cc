// Stand-ins when kvmesh is built without MPI.
#include "coordinator/decode/step_comm.h"

namespace kvmesh::decode {

bool HaveMpi() { return false; }

Result<std::unique_ptr<StepComm>> MakeMpiComm() {
  return Unimplemented("this kvmesh was built without MPI (KVMESH_WITH_MPI)");
}

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int*, char***) {
  return Unimplemented("this kvmesh was built without MPI (KVMESH_WITH_MPI)");
}

MpiSession::~MpiSession() = default;

}  // namespace kvmesh::decode
