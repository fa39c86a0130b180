#include "common/hash/block_hash.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd {
namespace {

// Domain separation: bump the version when the encoding below changes, so old and new hashes
// can never be confused (old caches simply stop hitting).
constexpr absl::string_view kSeedDomain = "pdserve/block-hash/v1";

void AppendU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

// Length prefix makes the concatenation unambiguous ("ab"+"c" != "a"+"bc").
void AppendField(std::string* out, absl::string_view field) {
  AppendU64(out, field.size());
  out->append(field.data(), field.size());
}

BlockHash Xxh3(const std::string& bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockHash{h.high64, h.low64};
}

}  // namespace

std::string BlockHash::ToBytes() const {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((high >> (56 - 8 * i)) & 0xff);
    out[8 + i] = static_cast<char>((low >> (56 - 8 * i)) & 0xff);
  }
  return out;
}

std::string BlockHash::ToHex() const { return absl::BytesToHexString(ToBytes()); }

absl::StatusOr<BlockHash> BlockHash::FromBytes(absl::string_view bytes) {
  if (bytes.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("block hash must be 16 bytes, got ", bytes.size()));
  }
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.high = (h.high << 8) | static_cast<uint8_t>(bytes[i]);
    h.low = (h.low << 8) | static_cast<uint8_t>(bytes[8 + i]);
  }
  return h;
}

absl::StatusOr<BlockHash> BlockHash::FromHex(absl::string_view hex) {
  if (hex.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("block hash hex must be 32 digits, got ", hex.size()));
  }
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat("block hash hex has a non-hex digit: ", hex));
    }
  }
  return FromBytes(absl::HexStringToBytes(hex));
}

absl::Status HashSeedInput::Validate() const {
  if (model_fingerprint.empty()) {
    return absl::InvalidArgumentError("hash seed: model_fingerprint is empty");
  }
  if (kv_dtype.empty()) {
    return absl::InvalidArgumentError("hash seed: kv_dtype is empty");
  }
  if (block_size == 0) {
    return absl::InvalidArgumentError("hash seed: block_size must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockHash> ComputeHashSeed(const HashSeedInput& input) {
  if (absl::Status s = input.Validate(); !s.ok()) {
    return s;
  }
  std::string bytes;
  AppendField(&bytes, kSeedDomain);
  AppendField(&bytes, input.model_fingerprint);
  AppendField(&bytes, input.kv_dtype);
  AppendU32(&bytes, input.block_size);
  AppendField(&bytes, input.cache_salt);
  return Xxh3(bytes);
}

BlockHash HashBlock(const BlockHash& parent, absl::Span<const uint32_t> tokens,
                    absl::string_view extras) {
  std::string bytes;
  bytes.reserve(16 + 8 + 4 * tokens.size() + 8 + extras.size());
  AppendU64(&bytes, parent.high);
  AppendU64(&bytes, parent.low);
  AppendU64(&bytes, tokens.size());
  for (uint32_t t : tokens) {
    AppendU32(&bytes, t);
  }
  AppendField(&bytes, extras);
  return Xxh3(bytes);
}

std::vector<BlockHash> ComputeBlockHashes(const BlockHash& seed, absl::Span<const uint32_t> tokens,
                                          uint32_t block_size) {
  std::vector<BlockHash> chain;
  ExtendBlockHashes(seed, tokens, block_size, &chain);
  return chain;
}

void ExtendBlockHashes(const BlockHash& seed, absl::Span<const uint32_t> tokens,
                       uint32_t block_size, std::vector<BlockHash>* chain) {
  CHECK_GT(block_size, 0u);
  const size_t num_full = tokens.size() / block_size;
  CHECK_LE(chain->size(), num_full) << "chain is longer than the tokens it hashes";
  chain->reserve(num_full);
  for (size_t i = chain->size(); i < num_full; ++i) {
    const BlockHash& parent = i == 0 ? seed : (*chain)[i - 1];
    chain->push_back(HashBlock(parent, tokens.subspan(i * block_size, block_size)));
  }
}

std::string ConcatBlockHashes(absl::Span<const BlockHash> hashes) {
  std::string out;
  out.reserve(hashes.size() * 16);
  for (const BlockHash& h : hashes) {
    out += h.ToBytes();
  }
  return out;
}

absl::StatusOr<std::vector<BlockHash>> SplitBlockHashes(absl::string_view bytes) {
  if (bytes.size() % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        bytes.size(), " bytes is not a whole number of 16-byte block hashes"));
  }
  std::vector<BlockHash> out;
  out.reserve(bytes.size() / 16);
  for (size_t i = 0; i < bytes.size(); i += 16) {
    absl::StatusOr<BlockHash> h = BlockHash::FromBytes(bytes.substr(i, 16));
    if (!h.ok()) {
      return h.status();
    }
    out.push_back(*h);
  }
  return out;
}

}  // namespace pd
