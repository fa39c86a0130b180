#include "transport/handshake.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/byte_codec.h"

namespace pd::transport {
namespace {

constexpr uint32_t kEndpointMagic = 0x454b4450;    // "PDKE"
constexpr uint32_t kDescriptorMagic = 0x444b4450;  // "PDKD"
constexpr uint32_t kMaxDescriptorBlocks = 1u << 24;

void PutGeometry(ByteWriter& w, const PoolGeometry& g) {
  w.U32(g.protocol_version);
  w.U64(g.model_fingerprint);
  w.Bytes(g.dtype);
  w.U32(g.block_size);
  w.U32(g.layout_version);
  w.U32(g.num_layers);
  w.U32(g.num_kv_heads);
  w.U32(g.head_dim);
  w.U64(g.block_bytes);
  w.U64(g.num_blocks);
}

PoolGeometry GetGeometry(ByteReader& r) {
  PoolGeometry g;
  g.protocol_version = r.U32();
  g.model_fingerprint = r.U64();
  g.dtype = r.Bytes(64);
  g.block_size = r.U32();
  g.layout_version = r.U32();
  g.num_layers = r.U32();
  g.num_kv_heads = r.U32();
  g.head_dim = r.U32();
  g.block_bytes = r.U64();
  g.num_blocks = r.U64();
  return g;
}

absl::Status CheckHeader(ByteReader& r, uint32_t magic, absl::string_view what) {
  const uint32_t m = r.U32();
  const uint32_t version = r.U32();
  if (!r.ok() || m != magic) {
    return absl::InvalidArgumentError(absl::StrCat("not a kv transport ", what));
  }
  if (version != kTransportProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv transport ", what, " protocol version mismatch: local=", kTransportProtocolVersion,
        " remote=", version));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PoolGeometry::Validate() const {
  if (block_bytes == 0 || num_blocks == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool geometry needs block_bytes > 0 and ", "num_blocks > 0: ", ToString()));
  }
  if (num_blocks > std::numeric_limits<uint64_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pool geometry overflows: ", ToString()));
  }
  if (num_blocks > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_blocks ", num_blocks, " exceeds the 32-bit block id range"));
  }
  return absl::OkStatus();
}

std::string PoolGeometry::ToString() const {
  return absl::StrCat(
      "{protocol_version=", protocol_version, " model_fingerprint=", model_fingerprint,
      " dtype=", dtype, " block_size=", block_size, " layout_version=", layout_version,
      " num_layers=", num_layers, " num_kv_heads=", num_kv_heads, " head_dim=", head_dim,
      " block_bytes=", block_bytes, " num_blocks=", num_blocks, "}");
}

absl::Status CheckCompatible(const PoolGeometry& local, const PoolGeometry& remote,
                             absl::string_view local_name, absl::string_view remote_name) {
  std::vector<std::string> diffs;
  auto cmp = [&](absl::string_view field, const auto& a, const auto& b) {
    if (a != b) {
      diffs.push_back(absl::StrCat(field, " ", local_name, "=", a, " ", remote_name, "=", b));
    }
  };
  cmp("protocol_version", local.protocol_version, remote.protocol_version);
  cmp("model_fingerprint", local.model_fingerprint, remote.model_fingerprint);
  cmp("dtype", local.dtype, remote.dtype);
  cmp("block_size", local.block_size, remote.block_size);
  cmp("layout_version", local.layout_version, remote.layout_version);
  cmp("num_layers", local.num_layers, remote.num_layers);
  cmp("num_kv_heads", local.num_kv_heads, remote.num_kv_heads);
  cmp("head_dim", local.head_dim, remote.head_dim);
  cmp("block_bytes", local.block_bytes, remote.block_bytes);
  if (diffs.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("handshake mismatch: ", absl::StrJoin(diffs, "; ")));
}

std::string EndpointInfo::Encode() const {
  ByteWriter w;
  w.U32(kEndpointMagic);
  w.U32(kTransportProtocolVersion);
  w.Bytes(backend);
  w.U64(instance_id);
  w.Bytes(address);
  w.Bytes(blob);
  return w.Take();
}

absl::StatusOr<EndpointInfo> EndpointInfo::Decode(absl::string_view bytes) {
  ByteReader r(bytes);
  absl::Status s = CheckHeader(r, kEndpointMagic, "endpoint");
  if (!s.ok()) {
    return s;
  }
  EndpointInfo e;
  e.backend = r.Bytes(64);
  e.instance_id = r.U64();
  e.address = r.Bytes(4096);
  e.blob = r.Bytes(1u << 16);
  if (!r.done()) {
    return absl::InvalidArgumentError("malformed kv transport endpoint");
  }
  return e;
}

std::string TransferDescriptor::Encode() const {
  ByteWriter w;
  w.U32(kDescriptorMagic);
  w.U32(kTransportProtocolVersion);
  w.Bytes(backend);
  w.U64(receiver_instance_id);
  w.U64(region_handle);
  w.U64(region_nonce);
  w.U64(tag);
  PutGeometry(w, geometry);
  w.U32(static_cast<uint32_t>(dst_blocks.size()));
  for (BlockId b : dst_blocks) {
    w.U32(b.value());
  }
  w.Bytes(blob);
  return w.Take();
}

absl::StatusOr<TransferDescriptor> TransferDescriptor::Decode(absl::string_view bytes) {
  ByteReader r(bytes);
  absl::Status s = CheckHeader(r, kDescriptorMagic, "descriptor");
  if (!s.ok()) {
    return s;
  }
  TransferDescriptor d;
  d.backend = r.Bytes(64);
  d.receiver_instance_id = r.U64();
  d.region_handle = r.U64();
  d.region_nonce = r.U64();
  d.tag = r.U64();
  d.geometry = GetGeometry(r);
  const uint32_t n = r.U32();
  if (!r.ok() || n > kMaxDescriptorBlocks || r.remaining() < uint64_t{n} * 4) {
    return absl::InvalidArgumentError("malformed kv transport descriptor (block list)");
  }
  d.dst_blocks.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    d.dst_blocks.emplace_back(r.U32());
  }
  d.blob = r.Bytes(1u << 16);
  if (!r.done()) {
    return absl::InvalidArgumentError("malformed kv transport descriptor");
  }
  return d;
}

}  // namespace pd::transport
