#include "transport/fd_tls_client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/openssl_util.h"
#include "transport/socket_util.h"

namespace kvmesh {
namespace {

using tls_util::OpensslError;

using Clock = std::chrono::steady_clock;

// A socket BIO that sends with MSG_NOSIGNAL: a peer that went away must be an
// error, never a SIGPIPE in the embedding process (OpenSSL's own uses write()).
int BioWrite(BIO* b, const char* in, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t r = ::send(fd, in, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (r >= 0) return static_cast<int>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return -1;
  }
}

int BioRead(BIO* b, char* out, int n) {
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b)));
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t r = ::recv(fd, out, static_cast<size_t>(n), 0);
    if (r >= 0) return static_cast<int>(r);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return -1;
  }
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* x = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kvmesh-socket");
    BIO_meth_set_write(x, BioWrite);
    BIO_meth_set_read(x, BioRead);
    BIO_meth_set_ctrl(x, BioCtrl);
    BIO_meth_set_create(x, BioCreate);
    return x;
  }();
  return m;
}

// Waits for `events` on fd until `deadline`; false when it passed.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  const int left = MsLeft(deadline);
  if (left == 0) return false;
  pollfd p{fd, events, 0};
  return ::poll(&p, 1, left) != 0;
}

}  // namespace

Result<std::shared_ptr<const TlsClientContext>> TlsClientContext::Create(const TlsClientOptions& o) {
  std::shared_ptr<TlsClientContext> c(new TlsClientContext());
  c->ctx_ = SSL_CTX_new(TLS_client_method());
  if (c->ctx_ == nullptr) return Internal("TLS client: " + OpensslError());
  SSL_CTX_set_min_proto_version(c->ctx_, TLS1_2_VERSION);
  SSL_CTX_set_mode(c->ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_PEER, nullptr);
  KVMESH_RETURN_IF_ERROR(LoadTlsIdentity(c->ctx_, {o.ca, o.cert, o.key, o.setting}, /*require_cert=*/false));
  c->verify_hostname_ = o.verify_hostname;
  return std::shared_ptr<const TlsClientContext>(std::move(c));
}

TlsClientContext::~TlsClientContext() {
  if (ctx_) SSL_CTX_free(ctx_);
}

Result<std::unique_ptr<TlsConn>> TlsClientContext::Connect(int fd, const std::string& host,
                                                           Clock::time_point deadline) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return Internal("TLS: " + OpensslError());
  std::unique_ptr<TlsConn> conn(new TlsConn(ssl, fd));
  BIO* bio = BIO_new(SocketMethod());
  if (bio == nullptr) return Internal("TLS: " + OpensslError());
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  SSL_set_bio(ssl, bio, bio);  // the SSL owns the BIO
  KVMESH_RETURN_IF_ERROR(PrepareTlsClient(ssl, host, verify_hostname_));
  for (;;) {
    ERR_clear_error();
    const int r = SSL_connect(ssl);
    if (r == 1) return conn;
    const int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      if (!WaitFor(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline))
        return DeadlineExceeded("TLS handshake with " + host + " did not finish in time");
      continue;
    }
    std::string why;
    const long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) why = std::string("certificate verify failed: ") + X509_verify_cert_error_string(v);
    else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) why = "the peer closed the connection";
    else why = OpensslError();
    return Unavailable("TLS handshake with " + host + ": " + why);
  }
}

TlsConn::~TlsConn() { SSL_free(ssl_); }

long TlsConn::Io(bool write, void* buf, size_t n, short* want, Status* err) {
  std::lock_guard<std::mutex> lock(mu_);
  ERR_clear_error();
  size_t done = 0;
  const int r = write ? SSL_write_ex(ssl_, buf, n, &done) : SSL_read_ex(ssl_, buf, n, &done);
  if (r == 1) return static_cast<long>(done);
  const int e = SSL_get_error(ssl_, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    *want = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
  *want = 0;
  if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    // EOF without close_notify, or a socket error.
    *err = errno == 0 || errno == EPIPE || errno == ECONNRESET ? Unavailable("connection closed by peer")
                                                               : Unavailable(std::string("TLS: ") + std::strerror(errno));
    return -1;
  }
  *err = Unavailable("TLS: " + OpensslError());
  return -1;
}

bool TlsConn::HasBuffered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return SSL_pending(ssl_) > 0;
}

Status TlsConn::WriteAllV(std::vector<iovec>& iov, Clock::time_point deadline) {
  // Gather small pieces (a frame header, an item table) into one record.
  constexpr size_t kStage = 16 << 10;
  std::string stage;
  auto write = [&](const char* p, size_t n) -> Status {
    while (n > 0) {
      short want = 0;
      Status err;
      const long r = Io(true, const_cast<char*>(p), n, &want, &err);
      if (r > 0) {
        p += r;
        n -= static_cast<size_t>(r);
        continue;
      }
      if (want == 0) return err.ok() ? Unavailable("connection closed by peer") : err;
      if (!WaitFor(fd_, want, deadline)) return DeadlineExceeded("send timed out");
    }
    return Status::Ok();
  };
  for (iovec& v : iov) {
    const char* p = static_cast<const char*>(v.iov_base);
    if (v.iov_len < kStage) {
      stage.append(p, v.iov_len);
      if (stage.size() < kStage) continue;
    } else {
      KVMESH_RETURN_IF_ERROR(write(stage.data(), stage.size()));
      stage.clear();
      KVMESH_RETURN_IF_ERROR(write(p, v.iov_len));
      continue;
    }
    KVMESH_RETURN_IF_ERROR(write(stage.data(), stage.size()));
    stage.clear();
  }
  KVMESH_RETURN_IF_ERROR(write(stage.data(), stage.size()));
  for (iovec& v : iov) v.iov_len = 0;  // all sent, as socket_util's WriteAllV leaves it
  return Status::Ok();
}

Status TlsConn::ReadFull(void* dst, size_t n, int64_t stall_ms) {
  char* p = static_cast<char*>(dst);
  size_t got = 0;
  int64_t waited = 0;
  while (got < n) {
    short want = 0;
    Status err;
    const long r = Io(false, p + got, n - got, &want, &err);
    if (r > 0) {
      got += static_cast<size_t>(r);
      waited = 0;
      continue;
    }
    if (r == 0) return Unavailable("connection closed by peer");
    if (want == 0) return err;
    const int slice = stall_ms >= 0 ? static_cast<int>(std::min<int64_t>(100, std::max<int64_t>(1, stall_ms - waited))) : 100;
    pollfd pf{fd_, want, 0};
    if (::poll(&pf, 1, slice) == 0) {
      waited += slice;
      if (stall_ms >= 0 && waited >= stall_ms) return DeadlineExceeded("peer stalled mid-frame");
    }
  }
  return Status::Ok();
}

Status TlsConn::ReadFullUntil(void* dst, size_t n, Clock::time_point deadline, std::string_view peer) {
  char* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    short want = 0;
    Status err;
    const long r = Io(false, p + got, n - got, &want, &err);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return PeerClosed(peer);
    if (want == 0) return err;
    if (!WaitFor(fd_, want, deadline)) return DeadlineExceeded("no data from " + std::string(peer) + " within the timeout");
  }
  return Status::Ok();
}

Result<size_t> TlsConn::ReadSome(void* dst, size_t n, Clock::time_point deadline) {
  for (;;) {
    short want = 0;
    Status err;
    const long r = Io(false, dst, n, &want, &err);
    if (r >= 0) return static_cast<size_t>(r);
    if (want == 0) return err;
    if (!WaitFor(fd_, want, deadline)) return DeadlineExceeded("no data within the timeout");
  }
}

}  // namespace kvmesh
