#include "transport/ucx_worker.h"

namespace kvmesh {

Status UcxStatus(ucs_status_t s, const char* what, const char* file, int line) {
  return Unavailable(std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + ucs_status_string(s));
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::Create(bool multi_thread) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* cfg = nullptr;
  KVMESH_UCX_RETURN(ucp_config_read(nullptr, nullptr, &cfg));  // reads UCX_TLS etc.
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = multi_thread ? 1 : 0;
  ucs_status_t st = ucp_init(&p, cfg, &w->context_);
  ucp_config_release(cfg);
  KVMESH_UCX_RETURN(st);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  wp.thread_mode = multi_thread ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE;
  wp.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX;
  KVMESH_UCX_RETURN(ucp_worker_create(w->context_, &wp, &w->worker_));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  KVMESH_UCX_RETURN(ucp_worker_get_address(w->worker_, &addr, &len));
  w->address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(w->worker_, addr);
  KVMESH_UCX_RETURN(ucp_worker_get_efd(w->worker_, &w->efd_));
  return w;
}

UcxWorker::~UcxWorker() {
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

bool UcxWorker::Arm() { return ucp_worker_arm(worker_) == UCS_OK; }

void UcxWorker::ProgressAll() {
  while (ucp_worker_progress(worker_) != 0) {
  }
}

std::string HexEncode(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  out.reserve(b.size() * 2);
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

Result<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2) return InvalidArgument("odd-length hex string");
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = v(hex[2 * i]), lo = v(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("not a hex string");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace kvmesh
