// transport/fd_tls_client.h — the fd TLS stack: TLS for kvmesh's
// blocking-with-deadline clients (the TCP channel to a node's data port, the
// control-plane HTTP client), on OpenSSL over the non-blocking sockets (file
// descriptors) of transport/socket_util.h (docs/security.md, "TLS"). The Asio
// stack (servers, the proxy's node links) is transport/asio_tls.h; both load
// files and check the peer's name with transport/openssl_util.h.
//
//   TlsClientOptions o;  o.ca = "ca.pem";  o.cert = "node.pem";  o.key = "node.key";
//   auto ctx = TlsClientContext::Create(o).value();
//   UniqueFd fd = ConnectTcp(host, port, deadline).value();
//   std::unique_ptr<TlsConn> c = ctx->Connect(fd.get(), host, deadline).value();
//   c->WriteAllV(iov, deadline);  c->ReadFull(buf, n, stall_ms);
//
// The server's certificate must chain to `ca` and (verify_hostname) name the
// host the client dialled, as a DNS name or an IP address in its
// subjectAltName. TLS 1.2 is the oldest version offered.
//
// Thread-safety: a TlsClientContext is immutable and shared. A TlsConn may be
// read by one thread while another writes (the TCP channel's reader and its
// senders): every OpenSSL call on it runs under its own mutex, and waits for
// the socket happen outside it.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kvmesh/status.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kvmesh {

struct TlsClientOptions {
  std::string ca;    // PEM file: the CA(s) that sign servers' certificates (required)
  std::string cert;  // PEM file: the certificate (chain) this client presents, for mutual TLS ("": none)
  std::string key;   // PEM file: its private key (required with cert)
  bool verify_hostname = true;
  std::string setting = "$.tls.";  // what errors call the files (TlsIdentityFiles::setting)
};

class TlsConn;

class TlsClientContext {
 public:
  // InvalidArgument naming the setting, the file and the reason when a file
  // does not load or the key does not match the certificate (LoadTlsIdentity).
  static Result<std::shared_ptr<const TlsClientContext>> Create(const TlsClientOptions& o);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  // The client side of a handshake on `fd` (connected, non-blocking; the
  // caller keeps owning it), for the server `host`, within `deadline`.
  // Unavailable (with OpenSSL's reason: an unknown CA, a name mismatch, a
  // refused client certificate, a peer that does not speak TLS) or
  // DeadlineExceeded.
  Result<std::unique_ptr<TlsConn>> Connect(int fd, const std::string& host,
                                           std::chrono::steady_clock::time_point deadline) const;

 private:
  TlsClientContext() = default;
  SSL_CTX* ctx_ = nullptr;
  bool verify_hostname_ = true;
};

// One TLS connection over a socket it does not own (close the fd after
// destroying this). The read and write calls mirror socket_util.h's.
class TlsConn {
 public:
  ~TlsConn();
  TlsConn(const TlsConn&) = delete;
  TlsConn& operator=(const TlsConn&) = delete;

  // Writes every byte of `iov` (small pieces are gathered into records).
  Status WriteAllV(std::vector<iovec>& iov, std::chrono::steady_clock::time_point deadline);
  // Reads exactly n bytes; the peer may stall at most stall_ms between bytes
  // (DeadlineExceeded), Unavailable when it closes.
  Status ReadFull(void* dst, size_t n, int64_t stall_ms);
  // Reads exactly n bytes before `deadline`.
  Status ReadFullUntil(void* dst, size_t n, std::chrono::steady_clock::time_point deadline, std::string_view peer);
  // Reads at least one byte (or 0 at the peer's clean close) before `deadline`.
  Result<size_t> ReadSome(void* dst, size_t n, std::chrono::steady_clock::time_point deadline);
  // Decrypted bytes already waiting: a poll() on the socket would not see them.
  bool HasBuffered() const;

 private:
  friend class TlsClientContext;
  TlsConn(SSL* ssl, int fd) : ssl_(ssl), fd_(fd) {}
  // One SSL_read / SSL_write under mu_: >0 bytes, 0 at a clean close, or -1
  // with *want set to POLLIN / POLLOUT (wait and retry), or an error in *err.
  long Io(bool write, void* buf, size_t n, short* want, Status* err);

  SSL* ssl_;
  int fd_;
  mutable std::mutex mu_;  // every OpenSSL call on ssl_
};

}  // namespace kvmesh
