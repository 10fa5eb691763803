// kvmesh/status.h — the one error currency of kvmesh.
//
// Every fallible kvmesh call returns a Status or a Result<T>. Foreign error
// codes (errno, CUDA, NCCL, UCX, MPI, JSON) are converted into a Status at the
// edge where they are first seen; exceptions never cross a module boundary, a
// thread, an Asio handler or the C ABI.
//
//   Result<Config> c = LoadConfig(path);
//   if (!c.ok()) return c.status();
//   KVMESH_ASSIGN_OR_RETURN(auto store, BlockStore::Create(opts));
//   KVMESH_RETURN_IF_ERROR(store->Put(key, bytes, {}));
//
// Thread-safety: Status and Result are values; const use from many threads is safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvmesh {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,    // the caller sent something malformed (bad config, bad frame)
  kNotFound = 2,           // a miss
  kAlreadyExists = 3,
  kResourceExhausted = 4,  // no room and nothing evictable (all pinned), or a limit hit
  kBusy = 5,               // admission refused under pressure; retry later, reads still work
  kDataLoss = 6,           // checksum mismatch / torn block: treat as a miss
  kUnavailable = 7,        // a node or transport is down; treat as a miss
  kDeadlineExceeded = 8,
  kStaleEpoch = 9,         // the shard map the caller used is old: refresh and retry
  kFailedPrecondition = 10,
  kUnimplemented = 11,
  kIoError = 12,
  kInternal = 13,
  kPermissionDenied = 14,  // bad or missing auth token
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: block 3f2a.. is not stored" (or "OK").
  std::string ToString() const;

  // Prefixes the message with context: "loading config: <message>".
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Busy(std::string m) { return {StatusCode::kBusy, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status StaleEpoch(std::string m) { return {StatusCode::kStaleEpoch, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }

// Converts an errno value into a Status: "<what>: <strerror>".
Status ErrnoStatus(std::string_view what, int err);

// True for the codes a cache client should treat as "not here, recompute".
inline bool IsMiss(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kDataLoss ||
         s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

// Prints "what: status" to stderr and aborts: value() of an errored Result
// is a caller bug, and it must fail loudly, never read an empty value.
[[noreturn]] void DieOnBadResultAccess(const Status& status);

// Result<T>: a T or a non-OK Status. REQUIRES: never constructed from an OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("Result constructed from an OK Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok(); otherwise the process aborts naming the status.
  T& value() & {
    if (!value_) DieOnBadResultAccess(status_);
    return *value_;
  }
  const T& value() const& {
    if (!value_) DieOnBadResultAccess(status_);
    return *value_;
  }
  T&& value() && {
    if (!value_) DieOnBadResultAccess(status_);
    return std::move(*value_);
  }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

  T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace kvmesh

#define KVMESH_CONCAT_INNER_(a, b) a##b
#define KVMESH_CONCAT_(a, b) KVMESH_CONCAT_INNER_(a, b)

#define KVMESH_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::kvmesh::Status kvmesh_status_ = (expr);         \
    if (!kvmesh_status_.ok()) return kvmesh_status_;  \
  } while (0)

#define KVMESH_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// KVMESH_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status on error.
#define KVMESH_ASSIGN_OR_RETURN(lhs, expr) \
  KVMESH_ASSIGN_OR_RETURN_IMPL_(KVMESH_CONCAT_(kvmesh_result_, __LINE__), lhs, expr)
