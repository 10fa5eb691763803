#include "shard_node/server/ucx_server.h"

#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "shard_node/server/frame_handler.h"
#include "transport/asio.h"
#include "transport/ucx_worker.h"

namespace kvmesh {
namespace {

namespace asio = boost::asio;
using namespace proto;

// A request whose body is (being) received.
struct Incoming {
  ucp_ep_h ep = nullptr;
  uint64_t nonce = 0;  // the client's session nonce (AM header bytes 40..47)
  FrameHeader header;
  std::vector<std::byte> body;
  void* rndv_desc = nullptr;  // set while the body waits for ucp_am_recv_data_nbx
  bool malformed = false;
};

// A reply in flight: owns every byte the send reads.
struct Outgoing {
  FrameReply rep;
  std::vector<ucp_dt_iov_t> iov;
};

class Server final : public UcxServer {
 public:
  Server(ShardNode* node, UcxServerOptions o, const std::atomic<uint64_t>* epoch)
      : handler_(node, o.limits, o.token, epoch), sd_(io_) {}
  ~Server() override { Stop(); }

  Status Init() {
    KVMESH_ASSIGN_OR_RETURN(worker_, UcxWorker::Create(/*multi_thread=*/false));
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = kUcxAmRequest;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.cb = &Server::OnRequest;
    hp.arg = this;
    KVMESH_UCX_RETURN(ucp_worker_set_am_recv_handler(worker_->get(), &hp));
    int fd = ::dup(worker_->efd());
    if (fd < 0) return ErrnoStatus("dup(ucx efd)", errno);
    sd_.assign(fd);
    asio::co_spawn(io_, Loop(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
    return Status::Ok();
  }

  const std::string& address() const override { return worker_->address(); }
  uint64_t requests() const override { return requests_.load(); }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ec;
      sd_.cancel(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
    // Let in-flight sends finish or fail before the worker goes.
    for (int i = 0; i < 1000 && !inflight_.empty(); ++i) worker_->ProgressAll();
    conns_.clear();
  }

 private:
  // The Asio loop: progress, handle what arrived, arm, sleep on the efd.
  asio::awaitable<void> Loop() {
    for (;;) {
      worker_->ProgressAll();
      StartRendezvous();
      if (!ready_.empty()) {
        HandleReady();
        continue;
      }
      if (!inflight_.empty() || !receiving_.empty()) {
        // Replies or rendezvous receives under way need progress the wakeup
        // fd does not always announce: poll, yielding to the loop.
        co_await asio::post(io_, asio::use_awaitable);
        continue;
      }
      if (!worker_->Arm()) continue;  // events pending: progress again
      boost::system::error_code ec;
      co_await sd_.async_wait(asio::posix::descriptor_base::wait_read, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
    }
  }

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Server*>(arg);
    auto in = std::make_unique<Incoming>();
    in->ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
    const auto hb = std::span<const std::byte>(static_cast<const std::byte*>(header), header_length);
    if (header_length == kHeaderSize + 8) std::memcpy(&in->nonce, hb.data() + kHeaderSize, 8);
    if (in->ep == nullptr || header_length != kHeaderSize + 8 ||
        !DecodeHeader(hb, self->handler_.limits(), &in->header).ok() || in->header.is_response() ||
        in->header.body_len != length) {
      self->handler_.malformed.fetch_add(1);  // dropped; a malformed peer gets no answer
      return UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      in->body.resize(length);  // bounded: DecodeHeader checked body_len against the limits
      in->rndv_desc = data;
      self->rndv_.push_back(std::move(in));
      return UCS_INPROGRESS;  // the descriptor is kept for ucp_am_recv_data_nbx
    }
    in->body.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
    self->ready_.push_back(std::move(in));
    return UCS_OK;
  }

  void StartRendezvous() {
    while (!rndv_.empty()) {
      Incoming* in = rndv_.front().release();
      rndv_.pop_front();
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = ucp_dt_make_contig(1);
      p.user_data = this;
      p.cb.recv_am = [](void* req, ucs_status_t st, size_t, void* user) {
        (void)user;
        auto* self = static_cast<Server*>(user);
        auto it = self->receiving_.find(req);
        if (it != self->receiving_.end()) {
          if (st == UCS_OK) self->ready_.push_back(std::move(it->second));
          self->receiving_.erase(it);
        }
        ucp_request_free(req);
      };
      void* r = ucp_am_recv_data_nbx(worker_->get(), in->rndv_desc, in->body.data(), in->body.size(), &p);
      if (r == nullptr) {
        ready_.emplace_back(in);
      } else if (UCS_PTR_IS_ERR(r)) {
        delete in;
      } else {
        receiving_[r].reset(in);
      }
    }
  }

  void HandleReady() {
    while (!ready_.empty()) {
      std::unique_ptr<Incoming> in = std::move(ready_.front());
      ready_.pop_front();
      requests_.fetch_add(1, std::memory_order_relaxed);
      const auto session = std::make_pair(in->ep, in->nonce);
      auto& conn = conns_[session];
      auto out = std::make_unique<Outgoing>();
      const FrameOutcome oc = handler_.Handle(in->header, in->body, &conn.hello_done, &out->rep);
      // "Closing" a UCX peer forgets its handshake: its next frame must be a
      // (valid) HELLO again. Endpoint pointers can be reused by new peers.
      if (oc != FrameOutcome::kReply) conns_.erase(session);
      if (oc == FrameOutcome::kClose) continue;
      Send(in->ep, std::move(out));
    }
  }

  void Send(ucp_ep_h ep, std::unique_ptr<Outgoing> out) {
    auto& pieces = out->rep.pieces;  // pieces[0] is the header: it goes as the AM header
    for (size_t i = 1; i < pieces.size(); ++i)
      if (!pieces[i].empty()) out->iov.push_back({const_cast<std::byte*>(pieces[i].data()), pieces[i].size()});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    // An empty answer body (SEQ_TRUNCATE, SEQ_RELEASE) goes as zero contiguous
    // bytes: UCX refuses an iov datatype with no entries.
    const bool empty = out->iov.empty();
    p.datatype = empty ? ucp_dt_make_contig(1) : ucp_dt_make_iov();
    static const std::byte kNoBody{};
    Outgoing* raw = out.get();
    p.user_data = this;
    p.cb.send = [](void* req, ucs_status_t, void* user) {
      auto* self = static_cast<Server*>(user);
      self->inflight_.erase(req);
      ucp_request_free(req);
    };
    void* r = ucp_am_send_nbx(ep, kUcxAmReply, raw->rep.header.data(), kHeaderSize,
                              empty ? static_cast<const void*>(&kNoBody) : raw->iov.data(), raw->iov.size(), &p);
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return;  // sent (or failed) at once: `out` may go
    inflight_[r] = std::move(out);
  }

  struct ConnState {
    bool hello_done = false;
  };

  FrameHandler handler_;
  asio::io_context io_{1};
  asio::posix::stream_descriptor sd_;
  std::unique_ptr<UcxWorker> worker_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> requests_{0};
  // Everything below is touched by the loop thread only (UCX callbacks run inside its progress calls).
  std::deque<std::unique_ptr<Incoming>> rndv_, ready_;
  std::map<void*, std::unique_ptr<Incoming>> receiving_;
  std::map<void*, std::unique_ptr<Outgoing>> inflight_;
  // Handshake state per (endpoint, client session nonce): a new peer that
  // happens to get a reused endpoint pointer still has to HELLO.
  std::map<std::pair<ucp_ep_h, uint64_t>, ConnState> conns_;
};

}  // namespace

Result<std::unique_ptr<UcxServer>> UcxServer::Start(ShardNode* node, UcxServerOptions options,
                                                    const std::atomic<uint64_t>* epoch) {
  auto s = std::make_unique<Server>(node, std::move(options), epoch);
  KVMESH_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<UcxServer>(std::move(s));
}

}  // namespace kvmesh
