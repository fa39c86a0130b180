// The block-hash chain that names KV blocks across the cluster
// (docs/architecture.md, "Block hashing").
//
//   seed     = H("pdserve/block-hash/v1", model fingerprint, kv dtype, block size, cache salt)
//   hash[i]  = H(hash[i-1] (or seed for i = 0), tokens of block i, extras of block i)
//
// H is XXH3-128 over an explicit little-endian, length-prefixed encoding, so the same tokens
// give the same hash on every machine and every build. Only full blocks are hashed: a block's
// hash names the whole prefix up to and including it, so two requests share block i exactly when
// they share tokens [0, (i+1)·block_size) and the seed (same model, same tenant salt).
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pd {

// A 128-bit block hash. Value type; the 16-byte form (ToBytes) is what crosses the wire and
// goes into Redis keys (hex).
struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  // 16 bytes, big-endian (high then low): the canonical wire form.
  std::string ToBytes() const;
  // 32 lower-case hex digits of ToBytes().
  std::string ToHex() const;
  // Inverse of ToBytes. InvalidArgument unless exactly 16 bytes.
  static absl::StatusOr<BlockHash> FromBytes(absl::string_view bytes);
  // Inverse of ToHex. InvalidArgument unless exactly 32 hex digits.
  static absl::StatusOr<BlockHash> FromHex(absl::string_view hex);

  friend bool operator==(const BlockHash&, const BlockHash&) = default;
  friend auto operator<=>(const BlockHash&, const BlockHash&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.high, b.low);
  }
};

// What makes two caches compatible. Everything here goes into the seed, so a change in any
// field gives a disjoint hash space.
struct HashSeedInput {
  std::string model_fingerprint;  // weights + config identity (engine/model), non-empty
  std::string kv_dtype;           // cache dtype name, e.g. "f32", "bf16"; non-empty
  uint32_t block_size = 16;       // tokens per block, > 0
  std::string cache_salt;         // per-tenant salt; empty = shared (no tenant isolation)

  // InvalidArgument naming the field when a required field is empty or zero.
  absl::Status Validate() const;
};

// The chain seed (hash[-1]). InvalidArgument when `input` is invalid.
absl::StatusOr<BlockHash> ComputeHashSeed(const HashSeedInput& input);

// The hash of one block given its parent (the previous block's hash, or the seed). `tokens` are
// the block's token ids; `extras` is opaque per-block data that must also match for a hit
// (e.g. a multimodal input hash or LoRA id); empty when unused.
BlockHash HashBlock(const BlockHash& parent, absl::Span<const uint32_t> tokens,
                    absl::string_view extras = {});

// Hashes of the full blocks of `tokens` (tokens.size() / block_size of them; a trailing partial
// block is not hashed). Block i's parent is hash[i-1], block 0's is `seed`.
std::vector<BlockHash> ComputeBlockHashes(const BlockHash& seed, absl::Span<const uint32_t> tokens,
                                          uint32_t block_size);

// Extends `chain` (hashes of the first chain->size() full blocks of `tokens`, chained from
// `seed`) with the hashes of any further full blocks of `tokens`. For decode, where a sequence
// grows one token at a time and must not rehash its whole prefix per block.
void ExtendBlockHashes(const BlockHash& seed, absl::Span<const uint32_t> tokens,
                       uint32_t block_size, std::vector<BlockHash>* chain);

// The wire form of a run of hashes (proto `bytes` fields such as block_hashes): each hash's
// 16 ToBytes() bytes, concatenated in order.
std::string ConcatBlockHashes(absl::Span<const BlockHash> hashes);
// Its inverse. InvalidArgument when the length is not a multiple of 16.
absl::StatusOr<std::vector<BlockHash>> SplitBlockHashes(absl::string_view bytes);

}  // namespace pd
