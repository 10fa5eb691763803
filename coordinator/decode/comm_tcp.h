// coordinator/decode/comm_tcp.h — the decode step collectives over plain TCP,
// for ranks that are separate processes started without mpirun (one per
// daemon, one per host).
//
// Topology: a star around rank 0. Every collective is a gather to rank 0 and
// a reply from it, so every collective is also a barrier. Rank 0 reduces in
// rank order (rank 0's data, then + rank 1, + rank 2, ...), exactly like the
// thread backend, so AllReduceSum is bitwise identical to MakeThreadComms.
//
// Rendezvous: rank 0 listens on host:port. With port 0 the kernel picks a
// port and rank 0 writes "host:port" to `rendezvous_file` (atomically: a
// temporary file renamed into place); the other ranks poll that file, and
// rank 0 removes it once every rank has joined. Each rank says hello with its
// rank and the world size; rank 0 refuses duplicates and mismatches.
//
// Frames: a 40-byte header (magic, version, op, root, sequence number,
// payload length, xxh3 of the payload, xxh3 of the header) and the payload.
// Receivers know the expected op and length, so a garbage header is rejected
// before anything is allocated. Hosts must share byte order and float format.
//
// Failures: a peer that dies (connection closed), sends garbage (DataLoss) or
// does not arrive within step_timeout (DeadlineExceeded) fails the collective.
// Rank 0 then sends an abort frame with the reason to every rank it still
// reaches, and every socket is closed, so each rank returns a clear Status
// within about step_timeout — never a hang. The error is sticky: later calls
// return it at once. A rank that fails on its own and destroys its comm closes
// its socket, which fails the others' next collective the same way.
//
// Thread-safety: one comm per rank, used by one thread (like every StepComm).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "coordinator/decode/step_comm.h"

namespace kvmesh::decode {

struct TcpCommOptions {
  int rank = 0;
  int size = 1;
  // Rank 0 listens here; the other ranks connect here. Port 0: rank 0 binds a
  // free port and publishes it in rendezvous_file (then required).
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // Written by rank 0 when it bound port 0; read (polled) by the other ranks
  // when their port is 0. Holds "host:port\n".
  std::string rendezvous_file;
  // Rendezvous: how long rank 0 waits for every rank, and the others for
  // rank 0 (its file, its port, its hello reply).
  std::chrono::milliseconds connect_timeout{15000};
  // Longest wait inside one collective for the slowest rank. Non-root ranks
  // wait this plus a grace period, so rank 0's abort reason reaches them first.
  std::chrono::milliseconds step_timeout{30000};
};

// Joins the TCP step group. Blocks until every rank has joined (rank 0) or
// rank 0 accepted this rank (others), or connect_timeout. Errors:
// InvalidArgument (bad options), DeadlineExceeded (rendezvous timed out),
// Unavailable (cannot listen / connect, or rank 0 refused the hello).
Result<std::unique_ptr<StepComm>> MakeTcpComm(const TcpCommOptions& o);

// NCCL step collectives over one CUDA device per rank (comm_nccl.cc, built
// only with CUDA + NCCL). The NCCL unique id is exchanged over a TCP comm
// made from `o` (same rendezvous); host buffers are staged through a device
// buffer. Sums run in NCCL's order (fp32 tolerance, like MPI).
// Unimplemented without NCCL; Unavailable without a usable device.
bool HaveNccl();
Result<std::unique_ptr<StepComm>> MakeNcclComm(const TcpCommOptions& o, int device);
// CUDA devices visible here (0 without CUDA or without a GPU).
int CudaDeviceCount();

}  // namespace kvmesh::decode
