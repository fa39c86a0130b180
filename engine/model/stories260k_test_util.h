// Test helpers shared by engine_forward_test's files: the stories260K checkpoint (llama2.c, f32,
// classifier tied to the embedding) and block tables.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/model_weights.h"
#include "gtest/gtest.h"

namespace pd::engine::testing {

inline constexpr char kStories260K[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";

// Blocks first, first + 1, ..., first + n - 1.
inline std::vector<int32_t> Table(int32_t first, int32_t n) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Loads stories260K into *checkpoint and sets *weights to its f32 view; a fatal gtest failure
// when the file cannot be loaded (callers check HasFatalFailure()).
inline void LoadStories260K(std::unique_ptr<Llama2cCheckpoint>* checkpoint, ModelWeights* weights) {
  absl::StatusOr<Llama2cCheckpoint> ckpt = Llama2cCheckpoint::Load(kStories260K);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  *checkpoint = std::make_unique<Llama2cCheckpoint>(*std::move(ckpt));
  *weights = WeightsFromLlama2c(**checkpoint);
}

}  // namespace pd::engine::testing
