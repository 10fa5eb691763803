// coordinator/decode/comm_tcp_rendezvous.h — how the ranks of a TCP step
// group find each other (comm_tcp.h "Rendezvous"): rank 0 collects every
// rank's hello and hands out the table of mesh addresses, then every pair of
// ranks connects and rank 0 confirms that every link is up.
#pragma once

#include <vector>

#include "coordinator/decode/comm_tcp.h"
#include "kvmesh/status.h"
#include "transport/socket_util.h"

namespace kvmesh::decode::tcp_step {

// Joins the group `o` describes and builds the full mesh. Returns links[r],
// the connected socket to rank r (non-blocking, TCP_NODELAY), for every r;
// links[o.rank] is empty. Blocks until every rank is linked, or
// o.connect_timeout. Errors as MakeTcpComm; a rank that fails tells rank 0,
// which tells the others.
// REQUIRES: o passed MakeTcpComm's checks, o.size > 1.
Result<std::vector<UniqueFd>> ConnectMesh(const TcpCommOptions& o);

}  // namespace kvmesh::decode::tcp_step
