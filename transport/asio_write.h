// transport/asio_write.h — writing a gathered reply on a non-blocking Asio
// socket without a loop turn when the socket takes it: one write_some at
// once, and an async_write for whatever did not fit. The data server and the
// RESP proxy answer this way. Include from .cc files only (Asio).
#pragma once

#include <cstddef>
#include <vector>

#include "transport/asio.h"

namespace kvmesh {

// Writes what the socket takes now and drops it from bufs; true when all of
// it went (ec set on a socket error; "would block" is not one).
// REQUIRES: s is in non-blocking mode.
inline bool WriteNow(boost::asio::ip::tcp::socket& s, std::vector<boost::asio::const_buffer>& bufs,
                     boost::system::error_code& ec) {
  namespace asio = boost::asio;
  size_t n = s.write_some(bufs, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) ec = {}, n = 0;
  if (ec) return false;
  size_t i = 0;
  while (i < bufs.size() && n >= bufs[i].size()) n -= bufs[i++].size();
  if (i == bufs.size()) return true;
  bufs.erase(bufs.begin(), bufs.begin() + static_cast<std::ptrdiff_t>(i));
  bufs[0] += n;
  return false;
}

// Writes every buffer of bufs (modified): WriteNow, then the rest
// asynchronously. REQUIRES: s is in non-blocking mode.
inline boost::asio::awaitable<void> WriteNowThenAsync(boost::asio::ip::tcp::socket& s,
                                                      std::vector<boost::asio::const_buffer>& bufs,
                                                      boost::system::error_code& ec) {
  namespace asio = boost::asio;
  if (WriteNow(s, bufs, ec) || ec) co_return;
  co_await asio::async_write(s, bufs, asio::redirect_error(asio::use_awaitable, ec));
}

}  // namespace kvmesh
