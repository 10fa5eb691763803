// coordinator/decode/comm_tcp.h — the decode step collectives over plain TCP,
// for ranks that are separate processes started without mpirun (one per
// daemon, one per host).
//
// Code: the rendezvous in comm_tcp_rendezvous.cc, the collectives in
// comm_tcp.cc, the frames both speak in comm_tcp_frame.cc; sockets, address
// resolution and deadline-bounded reads come from transport/socket_util.h.
//
// Topology: a full mesh. Every pair of ranks shares one connection, so every
// collective is one network hop:
//   - AllReduceSum / AllReduceMin / AllReduceSumU64: every rank sends its
//     data to every other rank, then folds all N inputs locally in rank order
//     ((p0 + p1) + p2) + ..., the same additions in the same order as the
//     thread backend, so AllReduceSum is bitwise identical to MakeThreadComms
//     and the same on every rank. (All-to-all costs (N-1) x the data per rank;
//     decode steps send a few KB, where latency, not bandwidth, counts.)
//   - Broadcast: the root sends to every rank directly; the others only
//     receive from it. Like MPI_Bcast it is not a barrier: the root returns
//     once its frames are handed to the kernel.
//   - Barrier: every rank sends an empty frame to every other rank and waits
//     for theirs.
//
// Progress: one poll() loop on the caller's thread drives every link of the
// collective at once, with non-blocking sends and receives: a rank keeps
// reading its peers while its own sends wait for buffer space, so N ranks
// sending large frames to each other at the same moment cannot deadlock. No
// sender thread: no locks, no hand-offs, no extra wake-up per frame on hosts
// that already run several ranks per core. poll() sleeps until a socket is
// ready or the deadline passes — no spinning. Sockets use TCP_NODELAY. Frame
// headers, poll sets and receive buffers are reused; the steady state
// allocates nothing per collective.
//
// Rendezvous: a star around rank 0, used only to exchange the mesh addresses
// and to agree that every link is up. Rank 0 listens on host:port. With
// port 0 the kernel picks a port and rank 0 writes "host:port" to
// `rendezvous_file` (atomically: a temporary file renamed into place); the
// other ranks poll that file, and rank 0 removes it once the group is up.
// Each rank r > 0 connects to rank 0; ranks below N-1 then listen on a
// kernel-chosen port of the local address of that connection, and the hello
// carries rank, world size and that address. Rank 0 refuses duplicates and
// mismatches, then sends every rank the table of addresses and a random
// group id. Rank r connects to ranks 1..r-1 (a peer hello with the group id,
// its rank and the world size) and accepts ranks r+1..N-1, then tells rank 0
// it is ready; rank 0 answers once every rank is. A rank that cannot
// complete its links tells rank 0, which tells the rest.
//
// Frames: a 40-byte header (magic, version, op, root, sequence number,
// payload length, xxh3 of the payload, xxh3 of the header) and the payload.
// Receivers know the expected op and length, so a garbage header is rejected
// before anything is allocated. Hosts must share byte order and float format.
//
// Failures: a peer that dies (connection closed or reset), sends garbage
// (DataLoss), sends a different collective (Internal) or does not arrive
// within the step timeout (DeadlineExceeded) fails the collective on the
// rank that sees it. That rank sends an abort frame with the reason to every
// rank it still reaches and closes every socket, so every rank returns a
// clear Status within about step_timeout — never a hang. A rank that waits
// on the failed peer sees the failure itself, or the abort on a link it is
// reading; a collective does not poll the links it has finished with (every
// frame arriving early from a fast peer would cost a wake-up), so a rank
// waiting only on a stalled peer learns another rank's verdict when its own
// timer fires: it then reads the abort waiting on its other links and
// reports that. Rank 0 gives up on a stalled peer after step_timeout, the
// others after step_timeout plus a grace period, so when rank 0 is alive
// every rank reports rank 0's verdict naming the stalled rank. The error is
// sticky: later calls return it at once. A rank that fails on its own and
// destroys its comm closes its sockets, which fails the others' next
// collective that needs it the same way.
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
  // Rank 0 listens here; the other ranks connect here first. Port 0: rank 0
  // binds a free port and publishes it in rendezvous_file (then required).
  // The mesh links use kernel-chosen ports on each rank's address towards
  // rank 0.
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // Written by rank 0 when it bound port 0; read (polled) by the other ranks
  // when their port is 0. Holds "host:port\n".
  std::string rendezvous_file;
  // Rendezvous: how long rank 0 waits for every rank, and the others for
  // rank 0 (its file, its port, its replies) and for their mesh links.
  std::chrono::milliseconds connect_timeout{15000};
  // Longest wait inside one collective for the slowest rank. Ranks other
  // than 0 wait this plus a grace period (max(500 ms, step_timeout / 4)), so
  // rank 0's abort reason reaches them first.
  std::chrono::milliseconds step_timeout{30000};
};

// Joins the TCP step group. Blocks until every rank has joined and every
// pair of ranks is connected, or connect_timeout. Errors: InvalidArgument
// (bad options, or rank 0 refused the hello), DeadlineExceeded (rendezvous
// timed out), Unavailable (cannot listen / connect).
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
