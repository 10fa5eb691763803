#include "transport/http_client.h"

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>

#include "transport/socket_util.h"

namespace kvmesh {

Result<HttpResult> HttpRequest(const std::string& host, uint16_t port, const std::string& method,
                               const std::string& target, const std::string& body, int64_t timeout_ms,
                               const HttpRequestOptions& options) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  KVMESH_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(host, port, deadline));
  if (options.authorization.find_first_of("\r\n") != std::string::npos)
    return InvalidArgument("an Authorization value must not contain a line break");
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
                    "\r\nConnection: close\r\nContent-Type: application/json\r\n";
  if (!options.authorization.empty()) req += "Authorization: " + options.authorization + "\r\n";
  req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  KVMESH_RETURN_IF_ERROR(WriteAll(fd.get(), req.data(), req.size(), deadline));
  std::string resp;
  char buf[16384];
  constexpr size_t kMax = 16u << 20;
  for (;;) {
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      resp.append(buf, static_cast<size_t>(n));
      if (resp.size() > kMax) return ResourceExhausted("HTTP answer larger than 16 MiB");
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable(std::string("recv: ") + std::strerror(errno));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd.get(), POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0)
      return DeadlineExceeded("HTTP " + method + " " + target + ": no answer in time");
  }
  size_t sp = resp.find(' ');
  size_t end = resp.find("\r\n\r\n");
  if (resp.compare(0, 5, "HTTP/") != 0 || sp == std::string::npos || end == std::string::npos)
    return Unavailable("malformed HTTP answer");
  HttpResult r;
  r.status = std::atoi(resp.c_str() + sp + 1);
  // Chunked answers are not expected from our servers; the body runs to EOF.
  r.body = resp.substr(end + 4);
  return r;
}

}  // namespace kvmesh
