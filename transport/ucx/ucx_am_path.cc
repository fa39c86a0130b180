// UcxTransport's active messages: sending them (headers and small payloads kept alive until
// UCX completes the send), the dispatch of every message this worker receives to the job that
// handles it (handshake, status, RMA, data), statuses and cancels, and the active-message data
// path of both sides: the sender's DATA frames and END, the receiver's validation of each run,
// its eager copy or rendezvous receive straight into the destination blocks, and the status
// that answers END once every run landed. See ucx_transport_impl.h.
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace pd::transport::ucx_internal {

using transport_internal::PreparedPost;
using transport_internal::WriteGrant;

struct RecvCtx {
  UcxTransport* t;
  WriteGrant grant;
  uint64_t conn;
  uint64_t seq;
};

namespace {

struct SendCtx {
  UcxTransport* t;
  uint64_t seq;
  std::string owned;    // keeps small headers/messages alive until completion
  std::string payload;  // keeps a small payload alive until completion
};

template <unsigned kId>
ucs_status_t AmHandler(void* arg, const void* header, size_t header_length, void* data,
                       size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->OnAm(kId, header, header_length, data, length, param);
}

void RecvCallback(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<RecvCtx*>(user_data);
  ctx->t->OnRecvDone(ctx, status);
  ucp_request_free(request);
}

void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendCtx*>(user_data);
  ctx->t->OnSendDone(ctx->seq, status);
  ctx->t->Release(ctx);
  ucp_request_free(request);
}

}  // namespace

absl::Status UcxTransport::RegisterAmHandlers() {
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kAmHello, &AmHandler<kAmHello>},    {kAmHelloReply, &AmHandler<kAmHelloReply>},
      {kAmData, &AmHandler<kAmData>},      {kAmEnd, &AmHandler<kAmEnd>},
      {kAmCancel, &AmHandler<kAmCancel>},  {kAmStatus, &AmHandler<kAmStatus>},
      {kAmRmaReq, &AmHandler<kAmRmaReq>},  {kAmRmaGrant, &AmHandler<kAmRmaGrant>},
      {kAmRmaDone, &AmHandler<kAmRmaDone>}};
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    const ucs_status_t s = ucp_worker_set_am_recv_handler(worker_.get(), &hp);
    if (s != UCS_OK) {
      return UcsError("ucp_worker_set_am_recv_handler", s);
    }
  }
  return absl::OkStatus();
}

void UcxTransport::SendAm(UcxConn& conn, unsigned id, const void* header, size_t header_len,
                          const void* data, size_t len, uint64_t seq, bool on_data_ep,
                          std::string payload) {
  auto* ctx = Track(new SendCtx{
      this, seq, std::string(static_cast<const char*>(header), header_len), std::move(payload)});
  if (!ctx->payload.empty()) {
    data = ctx->payload.data();
    len = ctx->payload.size();
  }
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &SendCallback;
  p.user_data = ctx;
  // Control messages ask for a reply endpoint (the receiver maps it to its connection); the
  // data endpoint's messages name the connection in their header instead.
  p.flags = on_data_ep ? 0 : UCP_AM_SEND_FLAG_REPLY;
  ucp_ep_h ep = on_data_ep ? conn.data() : conn.ep->get();
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, ctx->owned.data(), header_len, data, len, &p);
  if (!UCS_PTR_IS_PTR(req)) {
    OnSendDone(seq, UCS_PTR_STATUS(req));
    Release(ctx);
  }
}

void UcxTransport::OnSendDone(uint64_t seq, ucs_status_t status) {
  if (status != UCS_OK && seq != 0) {
    core_.Finish(TransferId(seq), UcsError("ucx send", status));
  }
}

void UcxTransport::SendStatus(uint64_t conn_id, uint64_t seq, const absl::Status& s) {
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    return;
  }
  StatusHeader h{seq, static_cast<uint32_t>(s.code()), 0};
  auto* ctx = Track(new SendCtx{this, 0, std::string(s.message())});
  std::string header(reinterpret_cast<const char*>(&h), sizeof(h));
  ctx->owned = header + ctx->owned;  // header then message, one buffer
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &SendCallback;
  p.user_data = ctx;
  ucs_status_ptr_t req =
      ucp_am_send_nbx(conn->ep->get(), kAmStatus, ctx->owned.data(), sizeof(h),
                      ctx->owned.data() + sizeof(h), ctx->owned.size() - sizeof(h), &p);
  if (!UCS_PTR_IS_PTR(req)) {
    Release(ctx);
  }
}

// Maps a reply ep back to our inbound connection id, then hands the message to its job.
ucs_status_t UcxTransport::OnAm(unsigned id, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  uint64_t conn_id = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    for (const auto& [cid, conn] : conns_) {
      if (conn->ep != nullptr && conn->ep->get() == param->reply_ep) {
        conn_id = cid;
        break;
      }
    }
  }
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  switch (id) {
    case kAmHello:
      OnHello(conn_id, header, header_length);
      return UCS_OK;
    case kAmHelloReply:
      OnHelloReply(header, header_length, data, length, rndv);
      return UCS_OK;
    case kAmRmaGrant:
      if (header_length == sizeof(StatusHeader)) {
        StatusHeader h;
        std::memcpy(&h, header, sizeof(h));
        OnRmaGrant(h.seq);
      }
      return UCS_OK;
    case kAmStatus:
      OnStatus(header, header_length, data, length, rndv);
      return UCS_OK;
    default:
      break;
  }
  if (header_length != sizeof(DataHeader)) {
    return UCS_OK;
  }
  DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (conn_id == 0) {
    // Data endpoint: the header names our (inbound) connection.
    auto it = conns_.find(h.rconn);
    if (it == conns_.end() || it->second->client || it->second->dead) {
      return UCS_OK;
    }
    conn_id = h.rconn;
  }
  switch (id) {
    case kAmRmaReq:
      OnRmaReq(conn_id, h, data, length, rndv);
      return UCS_OK;
    case kAmRmaDone:
      OnRmaDone(conn_id, h);
      return UCS_OK;
    case kAmCancel:
      OnCancel(conn_id, h);
      return UCS_OK;
    case kAmEnd: {
      SeqState& st = seqs_[{conn_id, h.seq}];
      st.end_pending = true;
      st.end = h;
      SeqProgress(conn_id, h.seq);
      return UCS_OK;
    }
    default:  // kAmData
      return OnData(conn_id, h, data, length, rndv);
  }
}

void UcxTransport::OnStatus(const void* header, size_t header_length, const void* data,
                            size_t length, bool rndv) {
  if (header_length != sizeof(StatusHeader)) {
    return;
  }
  StatusHeader h;
  std::memcpy(&h, header, sizeof(h));
  const auto code = static_cast<absl::StatusCode>(h.code);
  std::string msg = rndv ? "" : std::string(static_cast<const char*>(data), length);
  for (auto& [cid, conn] : conns_) {
    conn->in_flight.erase(h.seq);
  }
  auto rp = rma_posts_.find(h.seq);
  if (rp != rma_posts_.end() && !rp->second.started) {
    rma_posts_.erase(rp);  // refused before any put: nothing outstanding
  }
  core_.Finish(TransferId(h.seq), code == absl::StatusCode::kOk
                                      ? absl::OkStatus()
                                      : absl::Status(code, absl::StrCat("receiver: ", msg)));
}

void UcxTransport::OnCancel(uint64_t conn_id, const DataHeader& h) {
  const absl::Status why = absl::CancelledError(
      absl::StrCat("sender cancelled transfer tag ", h.tag, " before completion"));
  ReleaseGrants(conn_id, h.seq, false, why);
  core_.FailExpectation(h.tag, h.nonce, why);
  auto it = seqs_.find({conn_id, h.seq});
  if (it != seqs_.end()) {
    it->second.failed = true;  // later DATA is dropped; END forgets the sequence
  }
}

ucs_status_t UcxTransport::OnData(uint64_t conn_id, const DataHeader& h, void* data, size_t length,
                                  bool rndv) {
  SeqState& st = seqs_[{conn_id, h.seq}];
  if (st.failed) {
    return UCS_OK;  // dropped (rendezvous data is released by returning OK)
  }
  absl::StatusOr<WriteGrant> grant =
      core_.BeginWrite(h.tag, h.nonce, h.dst_first, h.num_blocks, conn_id);
  if (grant.ok() && grant->length != length) {
    core_.EndWrite(*grant, false, absl::DataLossError("ucx frame length mismatch"));
    grant = absl::DataLossError("ucx frame length does not match its blocks");
  }
  if (grant.ok() && cuda_memory_) {
    // Safety net: active-message data into device memory would be a CPU copy (eager) or need
    // a memory-typed receive; senders put into device regions instead (StartPost). Without
    // CUDA support no device region exists.
    absl::StatusOr<transport_internal::RegionInfo> region = core_.GetRegion(grant->exp->region);
    if (region.ok() && region->region.kind == MemoryKind::kCuda) {
      core_.EndWrite(*grant, false,
                     absl::FailedPreconditionError("ucx: active-message data for a device region"));
      grant = absl::FailedPreconditionError(
          "ucx: device-memory blocks are written by RMA only; the sender used active messages");
    }
  }
  if (!grant.ok()) {
    st.failed = true;
    SendStatus(conn_id, h.seq, grant.status());
    return UCS_OK;
  }
  if (!rndv) {
    std::memcpy(grant->dst, data, length);
    core_.EndWrite(*grant, true);
    return UCS_OK;
  }
  auto* ctx = Track(new RecvCtx{this, *grant, conn_id, h.seq});
  ++st.outstanding;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &RecvCallback;
  p.user_data = ctx;
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_.get(), data, grant->dst, length, &p);
  if (!UCS_PTR_IS_PTR(req)) {
    OnRecvDone(ctx, UCS_PTR_STATUS(req));
  }
  return UCS_INPROGRESS;
}

void UcxTransport::OnRecvDone(RecvCtx* ctx, ucs_status_t status) {
  Forget(ctx);
  std::unique_ptr<RecvCtx> owned(ctx);
  const bool ok = status == UCS_OK;
  core_.EndWrite(ctx->grant, ok, ok ? absl::OkStatus() : UcsError("ucx receive", status));
  auto it = seqs_.find({ctx->conn, ctx->seq});
  if (it == seqs_.end()) {
    return;
  }
  --it->second.outstanding;
  if (!ok && !it->second.failed) {
    it->second.failed = true;
    SendStatus(ctx->conn, ctx->seq, UcsError("ucx receive", status));
  }
  SeqProgress(ctx->conn, ctx->seq);
}

void UcxTransport::SeqProgress(uint64_t conn_id, uint64_t seq) {
  auto it = seqs_.find({conn_id, seq});
  if (it == seqs_.end()) {
    return;
  }
  SeqState& st = it->second;
  if (!st.end_pending || st.outstanding > 0) {
    return;
  }
  if (!st.failed) {
    SendStatus(conn_id, seq, core_.CompleteExpectation(st.end.tag, st.end.nonce));
  }
  seqs_.erase(it);
}

void UcxTransport::StartAmPost(UcxConn& conn, DataHeader h, const PreparedPost& post) {
  const uint64_t seq = h.seq;
  const uint32_t frame_blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, kMaxFrameBytes / post.block_bytes));
  for (const BlockRun& run : post.runs) {
    for (uint32_t off = 0; off < run.num_blocks; off += frame_blocks) {
      h.dst_first = run.dst_first + off;
      h.num_blocks = std::min(frame_blocks, run.num_blocks - off);
      SendAm(conn, kAmData, &h, sizeof(h),
             post.src_base + uint64_t{run.src_first + off} * post.block_bytes,
             uint64_t{h.num_blocks} * post.block_bytes, seq, /*on_data_ep=*/true);
    }
  }
  h.dst_first = 0;
  h.num_blocks = 0;
  SendAm(conn, kAmEnd, &h, sizeof(h), nullptr, 0, seq, /*on_data_ep=*/true);
}

}  // namespace pd::transport::ucx_internal
