// transport/tls_client.h — the old name of transport/fd_tls_client.h, kept
// only for transport/tcp_channel.cc's include until that line moves to
// fd_tls_client.h; then this file goes.
#pragma once

#include "transport/fd_tls_client.h"
