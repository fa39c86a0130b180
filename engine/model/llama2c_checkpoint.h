// Llama2cCheckpoint: a memory-mapped llama2.c "version 0" checkpoint (the format `run.c` reads;
// spec in shared/models/stories260K/README.md), with zero-copy float views of every tensor.
//
// File layout (little-endian, no padding): 7 x int32 header
//   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
// (vocab_size < 0 means an unshared classifier stored at the end), then float32 tensors back to
// back: token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, two legacy
// freq_cis tables (skipped by size), and wcls when unshared. Matrices are row-major [out][in].
//
// Ownership: the checkpoint owns the mapping; every pointer it returns stays valid while the
// checkpoint (or the object it was moved into) lives. Moving does not invalidate pointers.
//
// Thread-safety: immutable after Load(); all const methods may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/mapped_file.h"
#include "engine/model/model_config.h"

namespace pd::engine {

class Llama2cCheckpoint {
 public:
  // Size of the int32 header in bytes; the first tensor starts here.
  static constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);

  // Maps `path`, parses and validates the header, checks that the file size equals exactly the
  // size the header implies, and hashes the file for Fingerprint() (reads every page once).
  // Errors (messages name the path and the offending values):
  //   NotFound / PermissionDenied / InvalidArgument from MappedFile::Open;
  //   InvalidArgument  the file is shorter than the header; a header field is non-positive,
  //                    dim % n_heads != 0, n_heads % n_kv_heads != 0, head_dim is odd, or the
  //                    implied size overflows 64 bits; the file is truncated or has trailing
  //                    bytes (the message names the expected and actual byte counts).
  static absl::StatusOr<Llama2cCheckpoint> Load(absl::string_view path);

  Llama2cCheckpoint(Llama2cCheckpoint&&) noexcept = default;
  Llama2cCheckpoint& operator=(Llama2cCheckpoint&&) noexcept = default;
  Llama2cCheckpoint(const Llama2cCheckpoint&) = delete;
  Llama2cCheckpoint& operator=(const Llama2cCheckpoint&) = delete;

  // architecture kLlama2c, interleaved RoPE, f32 weights; theta, eps and the special ids are
  // the fixed llama2.c conventions (the ModelConfig defaults).
  const ModelConfig& config() const { return config_; }

  // 32 lower-case hex characters: XXH3-128 over a canonical encoding of config() followed by
  // every byte of the file. Equal fingerprints mean bit-identical weights and architecture.
  const std::string& Fingerprint() const { return fingerprint_; }

  // The raw mapped file (header included), e.g. to compute tensor offsets. Never null: a valid
  // checkpoint is at least kHeaderBytes long.
  const uint8_t* file_data() const { return file_.data(); }
  size_t file_size_bytes() const { return file_.size(); }
  const std::string& path() const { return file_.path(); }

  // Tensor views into the mapping (no copies). `layer` must be in [0, n_layers): CHECK-fails
  // otherwise (a programmer error). Shapes use the config's names; matrices are [out][in].
  const float* token_embedding() const { return token_embedding_; }  // [vocab_size, dim]
  const float* rms_att(int layer) const;                             // [dim]
  const float* wq(int layer) const;                                  // [dim, dim]
  const float* wk(int layer) const;                                  // [kv_dim, dim]
  const float* wv(int layer) const;                                  // [kv_dim, dim]
  const float* wo(int layer) const;                                  // [dim, dim]
  const float* rms_ffn(int layer) const;                             // [dim]
  const float* w1(int layer) const;                                  // gate [hidden_dim, dim]
  const float* w2(int layer) const;                                  // down [dim, hidden_dim]
  const float* w3(int layer) const;                                  // up   [hidden_dim, dim]
  const float* rms_final() const { return rms_final_; }              // [dim]
  // Output classifier [vocab_size, dim]; equals token_embedding() when shared_classifier.
  const float* wcls() const { return wcls_; }

 private:
  Llama2cCheckpoint(MappedFile file, const ModelConfig& config);
  // Returns base + layer * per_layer_floats after checking `layer`.
  const float* LayerSlice(const float* base, int layer, size_t per_layer_floats) const;

  MappedFile file_;
  ModelConfig config_;
  std::string fingerprint_;
  // Base of each stacked tensor (layer 0) inside file_.
  const float* token_embedding_ = nullptr;
  const float* rms_att_ = nullptr;
  const float* wq_ = nullptr;
  const float* wk_ = nullptr;
  const float* wv_ = nullptr;
  const float* wo_ = nullptr;
  const float* rms_ffn_ = nullptr;
  const float* w1_ = nullptr;
  const float* w2_ = nullptr;
  const float* w3_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* wcls_ = nullptr;
};

}  // namespace pd::engine
