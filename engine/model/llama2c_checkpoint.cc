#include "engine/model/llama2c_checkpoint.h"

#include <xxhash.h>

#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::engine {
namespace {

static_assert(std::endian::native == std::endian::little,
              "llama2.c checkpoints are little-endian; add byte swapping for big-endian hosts");

// Floats of every tensor, in file order, for one config. All counts fit in uint64 once
// CheckedSizes() has succeeded.
struct TensorSizes {
  uint64_t embedding = 0;     // vocab * dim
  uint64_t norm = 0;          // dim (per layer, and the final norm)
  uint64_t wq = 0;            // dim * dim (per layer; wo has the same size)
  uint64_t wkv = 0;           // kv_dim * dim (per layer)
  uint64_t ffn = 0;           // hidden * dim (per layer; w1, w2, w3)
  uint64_t freq_cis = 0;      // seq_len * head_dim / 2 (each of the two tables)
  uint64_t total_floats = 0;  // everything after the header
};

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

std::string DescribeHeader(const ModelConfig& c) {
  return absl::StrCat("dim=", c.dim, " hidden_dim=", c.hidden_dim, " n_layers=", c.n_layers,
                      " n_heads=", c.n_heads, " n_kv_heads=", c.n_kv_heads,
                      " vocab_size=", c.vocab_size, " seq_len=", c.seq_len,
                      " shared_classifier=", c.shared_classifier ? "true" : "false");
}

// Parses the 7 x int32 header and fills the derived fields. Validates everything that does not
// depend on the file size.
absl::StatusOr<ModelConfig> ParseHeader(const MappedFile& file) {
  if (file.size() < Llama2cCheckpoint::kHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": file is ", file.size(), " bytes, shorter than the ",
                     Llama2cCheckpoint::kHeaderBytes, "-byte llama2.c header"));
  }
  int32_t h[7];
  std::memcpy(h, file.data(), sizeof(h));
  static constexpr const char* kNames[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                            "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    // vocab_size may be negative (unshared classifier) but never zero or INT32_MIN (no abs).
    const bool ok = i == 5 ? (h[i] != 0 && h[i] != INT32_MIN) : h[i] > 0;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": invalid llama2.c header: ", kNames[i], " is ", h[i],
                       " at byte offset ", 4 * i, ", must be ", i == 5 ? "non-zero" : "positive"));
    }
  }
  ModelConfig c;  // the defaults are the llama2.c conventions (theta, eps, special ids)
  c.architecture = Architecture::kLlama2c;
  c.rope_form = RopeForm::kInterleaved;
  c.weight_dtype = kernels::DType::kF32;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -h[5];
  c.seq_len = h[6];
  // run.c ends a generation when the model samples BOS: these models end a story by starting
  // the next one. EOS (2) stays the primary id.
  c.eos_ids = {2, 1};
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": invalid llama2.c header (", DescribeHeader(c), "): ", why));
  };
  if (c.dim % c.n_heads != 0) {
    return invalid(absl::StrCat("dim ", c.dim, " is not a multiple of n_heads ", c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid(
        absl::StrCat("n_heads ", c.n_heads, " is not a multiple of n_kv_heads ", c.n_kv_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  c.kv_dim = c.n_kv_heads * c.head_dim;  // <= dim, so no overflow
  if (c.head_dim % 2 != 0) {
    return invalid(absl::StrCat("head_dim ", c.head_dim, " is odd; rotary pairs need it even"));
  }
  return c;
}

// Float counts of every tensor; InvalidArgument when the total byte size overflows 64 bits.
absl::StatusOr<TensorSizes> CheckedSizes(const ModelConfig& c, absl::string_view path) {
  const uint64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers;
  TensorSizes s;
  s.norm = dim;
  s.freq_cis = static_cast<uint64_t>(c.seq_len) * (c.head_dim / 2);  // < 2^62
  bool overflow = MulOverflows(c.vocab_size, dim, &s.embedding) || MulOverflows(dim, dim, &s.wq) ||
                  MulOverflows(c.kv_dim, dim, &s.wkv) || MulOverflows(hidden, dim, &s.ffn);
  // Per layer: 2 norms, wq + wo, wk + wv, w1 + w2 + w3.
  uint64_t per_layer = 0, t = 0, total = 0;
  overflow = overflow || MulOverflows(2, s.norm, &per_layer) || MulOverflows(2, s.wq, &t) ||
             AddOverflows(per_layer, t, &per_layer) || MulOverflows(2, s.wkv, &t) ||
             AddOverflows(per_layer, t, &per_layer) || MulOverflows(3, s.ffn, &t) ||
             AddOverflows(per_layer, t, &per_layer) || MulOverflows(layers, per_layer, &total) ||
             AddOverflows(total, s.embedding, &total) || AddOverflows(total, s.norm, &total) ||
             AddOverflows(total, 2 * s.freq_cis, &total) ||
             (!c.shared_classifier && AddOverflows(total, s.embedding, &total)) ||
             MulOverflows(total, sizeof(float), &t) ||
             AddOverflows(t, Llama2cCheckpoint::kHeaderBytes, &t);
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": invalid llama2.c header (", DescribeHeader(c), "): implied file size overflows"));
  }
  s.total_floats = total;
  return s;
}

// XXH3-128 of a canonical config encoding followed by the file bytes, as 32 hex chars. The
// config is hashed too so that a change of the fixed conventions (theta, eps, special ids)
// changes the fingerprint even though the file did not change.
std::string ComputeFingerprint(const ModelConfig& c, const MappedFile& file) {
  XXH3_state_t* state = XXH3_createState();
  CHECK(state != nullptr) << "XXH3_createState: out of memory";
  CHECK_EQ(XXH3_128bits_reset(state), XXH_OK);
  static constexpr char kTag[] = "pd.llama2c.v1";
  CHECK_EQ(XXH3_128bits_update(state, kTag, sizeof(kTag)), XXH_OK);
  const int32_t fields[] = {c.dim,
                            c.hidden_dim,
                            c.n_layers,
                            c.n_heads,
                            c.n_kv_heads,
                            c.vocab_size,
                            c.seq_len,
                            c.shared_classifier ? 1 : 0,
                            c.head_dim,
                            c.kv_dim,
                            std::bit_cast<int32_t>(c.rope_theta),
                            std::bit_cast<int32_t>(c.rms_norm_eps),
                            static_cast<int32_t>(c.bos_id),
                            static_cast<int32_t>(c.eos_id)};
  CHECK_EQ(XXH3_128bits_update(state, fields, sizeof(fields)), XXH_OK);
  CHECK_EQ(XXH3_128bits_update(state, file.data(), file.size()), XXH_OK);
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
  XXH3_freeState(state);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(canonical.digest), sizeof(canonical)));
}

}  // namespace

absl::StatusOr<Llama2cCheckpoint> Llama2cCheckpoint::Load(absl::string_view path) {
  PD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  PD_ASSIGN_OR_RETURN(ModelConfig config, ParseHeader(file));
  PD_ASSIGN_OR_RETURN(TensorSizes sizes, CheckedSizes(config, path));
  const uint64_t expected = kHeaderBytes + sizes.total_floats * sizeof(float);
  if (file.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", file.size(), " bytes but the llama2.c header (",
                     DescribeHeader(config), ") implies ", expected, " bytes (",
                     file.size() < expected ? "truncated" : "trailing data", ")"));
  }
  return Llama2cCheckpoint(std::move(file), config);
}

Llama2cCheckpoint::Llama2cCheckpoint(MappedFile file, const ModelConfig& config)
    : file_(std::move(file)), config_(config) {
  // The mapping is page-aligned and the header is 28 bytes, so every float is 4-byte aligned.
  CHECK_EQ(reinterpret_cast<uintptr_t>(file_.data() + kHeaderBytes) % alignof(float), 0u);
  // Load() validated the sizes, so these cannot overflow or run past the mapping.
  const uint64_t dim = config_.dim, layers = config_.n_layers;
  const uint64_t wq = dim * dim, wkv = static_cast<uint64_t>(config_.kv_dim) * dim,
                 ffn = static_cast<uint64_t>(config_.hidden_dim) * dim;
  const float* p = reinterpret_cast<const float*>(file_.data() + kHeaderBytes);
  auto take = [&p](uint64_t num_floats) {
    const float* start = p;
    p += num_floats;
    return start;
  };
  token_embedding_ = take(static_cast<uint64_t>(config_.vocab_size) * dim);
  rms_att_ = take(layers * dim);
  wq_ = take(layers * wq);
  wk_ = take(layers * wkv);
  wv_ = take(layers * wkv);
  wo_ = take(layers * wq);
  rms_ffn_ = take(layers * dim);
  w1_ = take(layers * ffn);
  w2_ = take(layers * ffn);
  w3_ = take(layers * ffn);
  rms_final_ = take(dim);
  take(2 * static_cast<uint64_t>(config_.seq_len) * (config_.head_dim / 2));  // freq_cis
  wcls_ = config_.shared_classifier ? token_embedding_ : take(config_.vocab_size * dim);
  CHECK_EQ(reinterpret_cast<const uint8_t*>(p), file_.data() + file_.size());
  fingerprint_ = ComputeFingerprint(config_, file_);
}

const float* Llama2cCheckpoint::LayerSlice(const float* base, int layer,
                                           size_t per_layer_floats) const {
  CHECK_GE(layer, 0);
  CHECK_LT(layer, config_.n_layers);
  return base + static_cast<size_t>(layer) * per_layer_floats;
}

const float* Llama2cCheckpoint::rms_att(int layer) const {
  return LayerSlice(rms_att_, layer, config_.dim);
}
const float* Llama2cCheckpoint::wq(int layer) const {
  return LayerSlice(wq_, layer, static_cast<size_t>(config_.dim) * config_.dim);
}
const float* Llama2cCheckpoint::wk(int layer) const {
  return LayerSlice(wk_, layer, static_cast<size_t>(config_.kv_dim) * config_.dim);
}
const float* Llama2cCheckpoint::wv(int layer) const {
  return LayerSlice(wv_, layer, static_cast<size_t>(config_.kv_dim) * config_.dim);
}
const float* Llama2cCheckpoint::wo(int layer) const {
  return LayerSlice(wo_, layer, static_cast<size_t>(config_.dim) * config_.dim);
}
const float* Llama2cCheckpoint::rms_ffn(int layer) const {
  return LayerSlice(rms_ffn_, layer, config_.dim);
}
const float* Llama2cCheckpoint::w1(int layer) const {
  return LayerSlice(w1_, layer, static_cast<size_t>(config_.hidden_dim) * config_.dim);
}
const float* Llama2cCheckpoint::w2(int layer) const {
  return LayerSlice(w2_, layer, static_cast<size_t>(config_.hidden_dim) * config_.dim);
}
const float* Llama2cCheckpoint::w3(int layer) const {
  return LayerSlice(w3_, layer, static_cast<size_t>(config_.hidden_dim) * config_.dim);
}

}  // namespace pd::engine
