// Handshake data checked before any KV byte moves: pool geometry (model fingerprint, dtype, block
// size, layout, shape) and the wire formats that carry it — the endpoint a transport publishes
// and the per-transfer descriptor the receiver (decode) hands the sender (prefill) through the
// control-plane RPC as opaque bytes.
//
// All types here are plain values, thread-compatible. Encodings are versioned by
// kTransportProtocolVersion; a different version is a FailedPrecondition, never a guess.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/strong_id.h"

namespace pd::transport {

// Bumped whenever an encoding below or a backend's wire protocol changes.
inline constexpr uint32_t kTransportProtocolVersion = 1;

// The geometry of one KV block pool (docs/architecture.md, "KV layout"): `num_blocks` equal blocks
// of `block_bytes` each, laid out [layer][K|V][kv_head][token][head_dim]. Two pools may exchange
// blocks when every field except num_blocks matches (pools differ in size).
struct PoolGeometry {
  uint32_t protocol_version = kTransportProtocolVersion;
  uint64_t model_fingerprint = 0;  // weights identity (hash), from the engine
  std::string dtype;               // cache dtype name (kernels::DTypeName): "f32", "bf16", "f16",
                                   // "i8", "fp8_e4m3"; compared as an opaque string
  uint32_t block_size = 0;         // tokens per block
  uint32_t layout_version = 1;     // version of the block layout above
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t block_bytes = 0;  // bytes per block; any value >= 1 (need not be aligned)
  uint64_t num_blocks = 0;   // blocks in the pool

  // InvalidArgument when block_bytes or num_blocks is 0 or their product overflows.
  absl::Status Validate() const;
  std::string ToString() const;
};

// OK when `local` and `remote` may exchange blocks; otherwise FailedPrecondition listing every
// differing field with both values, e.g. "handshake mismatch: dtype prefill=bf16 decode=f16".
absl::Status CheckCompatible(const PoolGeometry& local, const PoolGeometry& remote,
                             absl::string_view local_name = "local",
                             absl::string_view remote_name = "remote");

// What LocalEndpoint() returns: enough for a peer to Connect.
struct EndpointInfo {
  std::string backend;       // KvTransport::Name() of the publisher
  uint64_t instance_id = 0;  // random per transport instance; identifies it in descriptors
  std::string address;       // backend-specific, e.g. "127.0.0.1:4242"
  std::string blob;          // backend-specific extra bytes (e.g. a UCX worker address)

  std::string Encode() const;
  // InvalidArgument for garbage; FailedPrecondition for another protocol version.
  static absl::StatusOr<EndpointInfo> Decode(absl::string_view bytes);
};

// What ExpectTransfer returns, encoded: where the sender may write, and proof of which
// registration it targets. `region_nonce` is fresh for every Register, so a descriptor made
// before a Deregister (or for another pool) is rejected instead of writing into reused memory.
struct TransferDescriptor {
  std::string backend;
  uint64_t receiver_instance_id = 0;
  uint64_t region_handle = 0;
  uint64_t region_nonce = 0;
  uint64_t tag = 0;
  PoolGeometry geometry;            // the receiver's pool
  std::vector<BlockId> dst_blocks;  // announced destination blocks, each once
  std::string blob;                 // backend-specific (UCX: base address + packed rkey)

  std::string Encode() const;
  static absl::StatusOr<TransferDescriptor> Decode(absl::string_view bytes);
};

}  // namespace pd::transport
