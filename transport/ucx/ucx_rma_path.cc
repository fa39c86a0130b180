// UcxTransport's RMA data path. Sender: RMA_REQ with the post's runs on the control endpoint;
// on GRANT, one ucp_put_nbx per run at the descriptor's base + offset with the receiver's
// unpacked rkey (cached per connection and region nonce), a flush of the data endpoint, then
// RMA_DONE (or CANCEL when a put failed or the transfer ended meanwhile). Receiver: validates
// and holds every run as an in-progress write (so Cancel/Deregister wait for the writer),
// answers GRANT, and on RMA_DONE releases the runs and answers with the expectation's status.
// See ucx_transport_impl.h.
#include <ucp/api/ucp.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "transport/byte_codec.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace pd::transport::ucx_internal {
namespace {

using transport_internal::PreparedPost;
using transport_internal::WriteGrant;

// Unpacked rkeys a connection keeps before it drops them all (receivers re-register rarely).
constexpr size_t kMaxCachedRkeys = 64;

struct RmaOpCtx {
  UcxTransport* t;
  uint64_t seq;
};

void RmaOpCallback(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<RmaOpCtx*>(user_data);
  ctx->t->OnRmaOpDone(ctx->seq, status);
  ctx->t->Release(ctx);
  ucp_request_free(request);
}

// The receiver's region of a descriptor as this connection puts into it.
struct RemoteRegion {
  uint64_t base = 0;
  ucp_rkey_h rkey = nullptr;
};

// Reads the descriptor's blob (base address, packed rkey) and finds or unpacks its rkey.
absl::StatusOr<RemoteRegion> RemoteRegionOf(UcxConn& conn, const TransferDescriptor& desc) {
  auto rkey_it = conn.rkeys.find(desc.region_nonce);
  ByteReader r(desc.blob);
  RemoteRegion remote;
  remote.base = r.U64();
  const std::string packed = r.Bytes();
  if (!r.ok() || packed.empty()) {
    return absl::FailedPreconditionError(
        "ucx RMA: the descriptor carries no rkey (receiver registration failed to pack one)");
  }
  if (rkey_it == conn.rkeys.end()) {
    if (conn.rkeys.size() >= kMaxCachedRkeys) {
      for (auto& [nonce, rkey] : conn.rkeys) {
        ucp_rkey_destroy(rkey);
      }
      conn.rkeys.clear();
    }
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(conn.data(), packed.data(), &rkey);
    if (st != UCS_OK) {
      return UcsError("ucp_ep_rkey_unpack", st);
    }
    rkey_it = conn.rkeys.emplace(desc.region_nonce, rkey).first;
  }
  remote.rkey = rkey_it->second;
  return remote;
}

}  // namespace

void UcxTransport::StartRmaPost(UcxConn& conn, const DataHeader& h, PreparedPost post) {
  std::string runs;
  runs.reserve(post.runs.size() * sizeof(RunWire));
  for (const BlockRun& run : post.runs) {
    RunWire w{run.dst_first, run.num_blocks};
    runs.append(reinterpret_cast<const char*>(&w), sizeof(w));
  }
  RmaPost& rp = rma_posts_[h.seq];
  rp.conn = conn.id;
  rp.post = std::move(post);
  SendAm(conn, kAmRmaReq, &h, sizeof(h), nullptr, 0, h.seq, /*on_data_ep=*/false, std::move(runs));
}

void UcxTransport::OnRmaReq(uint64_t conn_id, const DataHeader& h, const void* data, size_t length,
                            bool rndv) {
  if (rndv || length % sizeof(RunWire) != 0 || length == 0) {
    SendStatus(conn_id, h.seq, absl::InvalidArgumentError("malformed ucx RMA request"));
    return;
  }
  std::vector<WriteGrant> held;
  absl::Status error;
  for (size_t off = 0; off < length; off += sizeof(RunWire)) {
    RunWire r;
    std::memcpy(&r, static_cast<const char*>(data) + off, sizeof(r));
    absl::StatusOr<WriteGrant> g =
        core_.BeginWrite(h.tag, h.nonce, r.dst_first, r.num_blocks, conn_id);
    if (!g.ok()) {
      error = g.status();
      break;
    }
    held.push_back(*std::move(g));
  }
  if (!error.ok()) {
    // Nothing was written; a partly granted request fails the expectation (a broken sender).
    for (const WriteGrant& g : held) {
      core_.EndWrite(g, false, error);
    }
    SendStatus(conn_id, h.seq, error);
    return;
  }
  grants_[{conn_id, h.seq}] = std::move(held);
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    ReleaseGrants(conn_id, h.seq, false, absl::UnavailableError("ucx connection closed"));
    return;
  }
  StatusHeader g{h.seq, 0, 0};
  SendAm(*conn, kAmRmaGrant, &g, sizeof(g), nullptr, 0, 0);
}

void UcxTransport::OnRmaDone(uint64_t conn_id, const DataHeader& h) {
  ReleaseGrants(conn_id, h.seq, true, absl::OkStatus());
  SendStatus(conn_id, h.seq, core_.CompleteExpectation(h.tag, h.nonce));
}

void UcxTransport::ReleaseGrants(uint64_t conn_id, uint64_t seq, bool ok, const absl::Status& why) {
  auto it = grants_.find({conn_id, seq});
  if (it == grants_.end()) {
    return;
  }
  for (const WriteGrant& g : it->second) {
    core_.EndWrite(g, ok, why);
  }
  grants_.erase(it);
}

void UcxTransport::OnRmaGrant(uint64_t seq) {
  auto it = rma_posts_.find(seq);
  if (it == rma_posts_.end() || it->second.started) {
    return;
  }
  RmaPost& rp = it->second;
  UcxConn* conn = FindConn(rp.conn);
  if (conn == nullptr) {
    rma_posts_.erase(it);
    return;
  }
  const PreparedPost& post = rp.post;
  DataHeader h{seq, post.desc.tag, post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!core_.IsPending(post.id)) {
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);  // releases the held runs
    conn->in_flight.erase(seq);
    rma_posts_.erase(it);
    return;
  }
  rp.started = true;
  IssuePuts(*conn, seq, rp);
  if (rp.outstanding == 0) {
    FinishRmaPost(seq);
  }
}

void UcxTransport::IssuePuts(UcxConn& conn, uint64_t seq, RmaPost& rp) {
  const PreparedPost& post = rp.post;
  absl::StatusOr<RemoteRegion> remote = RemoteRegionOf(conn, post.desc);
  if (!remote.ok()) {
    rp.error = remote.status();
    return;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &RmaOpCallback;
  for (const BlockRun& run : post.runs) {
    const uint64_t len = uint64_t{run.num_blocks} * post.block_bytes;
    auto* ctx = Track(new RmaOpCtx{this, seq});
    p.user_data = ctx;
    ++rp.outstanding;
    ucs_status_ptr_t req =
        ucp_put_nbx(conn.data(), post.src_base + uint64_t{run.src_first} * post.block_bytes, len,
                    remote->base + uint64_t{run.dst_first} * post.block_bytes, remote->rkey, &p);
    if (!UCS_PTR_IS_PTR(req)) {
      Release(ctx);
      --rp.outstanding;
      if (UCS_PTR_STATUS(req) != UCS_OK) {
        rp.error = UcsError("ucp_put_nbx", UCS_PTR_STATUS(req));
        break;
      }
    }
  }
  // The flush completes once every put is remotely complete.
  auto* ctx = Track(new RmaOpCtx{this, seq});
  p.user_data = ctx;
  ++rp.outstanding;
  ucs_status_ptr_t req = ucp_ep_flush_nbx(conn.data(), &p);
  if (!UCS_PTR_IS_PTR(req)) {
    Release(ctx);
    --rp.outstanding;
    if (UCS_PTR_STATUS(req) != UCS_OK && rp.error.ok()) {
      rp.error = UcsError("ucp_ep_flush_nbx", UCS_PTR_STATUS(req));
    }
  }
}

void UcxTransport::OnRmaOpDone(uint64_t seq, ucs_status_t status) {
  auto it = rma_posts_.find(seq);
  if (it == rma_posts_.end()) {
    return;
  }
  if (status != UCS_OK && it->second.error.ok()) {
    it->second.error = UcsError("ucx put", status);
  }
  if (--it->second.outstanding == 0) {
    FinishRmaPost(seq);
  }
}

// Every put of `seq` completed (or failed): tell the receiver, which then answers with a status.
void UcxTransport::FinishRmaPost(uint64_t seq) {
  auto it = rma_posts_.find(seq);
  RmaPost rp = std::move(it->second);
  rma_posts_.erase(it);
  UcxConn* conn = FindConn(rp.conn);
  if (conn == nullptr) {
    return;  // the connection failure already failed the transfer
  }
  DataHeader h{seq, rp.post.desc.tag, rp.post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!rp.error.ok() || !core_.IsPending(rp.post.id)) {
    core_.Finish(rp.post.id, rp.error);  // no-op when already finished (cancel, deadline)
    conn->in_flight.erase(seq);
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);  // releases the held runs
    return;
  }
  SendAm(*conn, kAmRmaDone, &h, sizeof(h), nullptr, 0, seq);
}

}  // namespace pd::transport::ucx_internal
