// transport/asio.h — the one way kvmesh includes Boost.Asio: Boost 1.74's
// asio.hpp uses std::exchange without including <utility>.
// Only .cc files include this; public headers stay free of Asio.
#pragma once

#include <utility>

#include <boost/asio.hpp>
