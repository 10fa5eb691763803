#include "transport/http_client.h"

#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>

#include "transport/socket_util.h"
#include "transport/fd_tls_client.h"

namespace kvmesh {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxAnswer = 16u << 20;

// The Content-Length (case-insensitive name) of the header block `head`, or -1.
int64_t ContentLength(std::string_view head) {
  size_t pos = 0;
  while ((pos = head.find("\r\n", pos)) != std::string_view::npos) {
    pos += 2;
    constexpr std::string_view kName = "content-length:";
    if (head.size() - pos < kName.size()) break;
    bool match = true;
    for (size_t i = 0; i < kName.size() && match; ++i)
      match = std::tolower(static_cast<unsigned char>(head[pos + i])) == kName[i];
    if (!match) continue;
    size_t i = pos + kName.size();
    while (i < head.size() && head[i] == ' ') ++i;
    int64_t v = 0;
    size_t digits = 0;
    for (; i < head.size() && std::isdigit(static_cast<unsigned char>(head[i])) && digits < 12; ++i, ++digits)
      v = v * 10 + (head[i] - '0');
    return digits ? v : -1;
  }
  return -1;
}

// True when the header block `head` says "Transfer-Encoding: chunked"
// (case-insensitive), as etcd's JSON gateway does for its streaming calls.
bool Chunked(std::string_view head) {
  std::string lower(head);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t at = lower.find("\r\ntransfer-encoding:");
  if (at == std::string::npos) return false;
  const size_t eol = lower.find("\r\n", at + 2);
  return lower.substr(at, eol - at).find("chunked") != std::string::npos;
}

// Decodes a chunked body (RFC 9112 section 7.1; extensions and trailers are
// skipped) into `out`. True once the last (zero-size) chunk has arrived.
bool Dechunk(std::string_view body, std::string* out) {
  out->clear();
  size_t pos = 0;
  for (;;) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string_view::npos) return false;
    uint64_t size = 0;
    size_t i = pos, digits = 0;
    for (; i < eol && std::isxdigit(static_cast<unsigned char>(body[i])) && digits < 8; ++i, ++digits)
      size = size * 16 + static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(body[i]))
                                                    ? body[i] - '0'
                                                    : std::tolower(static_cast<unsigned char>(body[i])) - 'a' + 10);
    if (digits == 0) return false;
    if (size == 0) return true;
    if (body.size() - (eol + 2) < size + 2) return false;
    out->append(body.substr(eol + 2, size));
    pos = eol + 2 + size + 2;
  }
}

// True once `resp` holds the whole answer: its headers and Content-Length
// bytes of body, or a chunked body's last chunk (answers with neither run to
// the end of the connection).
bool Complete(const std::string& resp) {
  const size_t end = resp.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const std::string_view head = std::string_view(resp).substr(0, end + 2);
  if (Chunked(head)) {
    std::string body;
    return Dechunk(std::string_view(resp).substr(end + 4), &body);
  }
  const int64_t len = ContentLength(head);
  return len >= 0 && resp.size() - (end + 4) >= static_cast<uint64_t>(len);
}

}  // namespace

Result<HttpResult> HttpRequest(const std::string& host, uint16_t port, const std::string& method,
                               const std::string& target, const std::string& body, int64_t timeout_ms,
                               const HttpRequestOptions& options) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  KVMESH_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(host, port, deadline));
  std::unique_ptr<TlsConn> tls;
  if (options.tls) {
    KVMESH_ASSIGN_OR_RETURN(tls, options.tls->Connect(fd.get(), host, deadline));
  }
  if (options.authorization.find_first_of("\r\n") != std::string::npos)
    return InvalidArgument("an Authorization value must not contain a line break");
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) +
                    "\r\nConnection: close\r\nContent-Type: application/json\r\n";
  if (!options.authorization.empty()) req += "Authorization: " + options.authorization + "\r\n";
  req += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<iovec> iov{{req.data(), req.size()}};
  KVMESH_RETURN_IF_ERROR(tls ? tls->WriteAllV(iov, deadline) : WriteAllV(fd.get(), iov, deadline));
  std::string resp;
  char buf[16384];
  while (!Complete(resp)) {
    size_t got = 0;
    if (tls) {
      Result<size_t> n = tls->ReadSome(buf, sizeof buf, deadline);
      if (!n.ok()) {
        if (n.status().code() == StatusCode::kDeadlineExceeded)
          return DeadlineExceeded("HTTP " + method + " " + target + ": no answer in time");
        return n.status();
      }
      got = *n;
    } else {
      ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return Unavailable(std::string("recv: ") + std::strerror(errno));
        auto left = MsLeft(deadline);
        pollfd p{fd.get(), POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, left) == 0)
          return DeadlineExceeded("HTTP " + method + " " + target + ": no answer in time");
        continue;
      }
      got = static_cast<size_t>(n);
    }
    if (got == 0) break;  // the server closed: the answer runs to here
    resp.append(buf, got);
    if (resp.size() > kMaxAnswer) return ResourceExhausted("HTTP answer larger than 16 MiB");
  }
  size_t sp = resp.find(' ');
  size_t end = resp.find("\r\n\r\n");
  if (resp.compare(0, 5, "HTTP/") != 0 || sp == std::string::npos || end == std::string::npos)
    return Unavailable("malformed HTTP answer");
  HttpResult r;
  r.status = std::atoi(resp.c_str() + sp + 1);
  if (Chunked(std::string_view(resp).substr(0, end + 2))) {  // etcd's streaming calls (coordinator/etcd_client.h)
    Dechunk(std::string_view(resp).substr(end + 4), &r.body);
    return r;
  }
  r.body = resp.substr(end + 4);
  const int64_t len = ContentLength(std::string_view(resp).substr(0, end + 2));
  if (len >= 0 && r.body.size() > static_cast<uint64_t>(len)) r.body.resize(static_cast<size_t>(len));
  return r;
}

}  // namespace kvmesh
