// Test helper of the router's unit tests: the stories260K model as pd-router loads it (a
// llama2.c checkpoint and its tokenizer; no chat template, BOS added to text prompts).
#pragma once

#include <memory>

#include "engine/runtime/model_front.h"
#include "gtest/gtest.h"

namespace pd::router {

inline constexpr char kStoriesModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
inline constexpr char kStoriesTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

// Loads it into *model; a fatal gtest failure when it cannot be loaded (callers check
// HasFatalFailure() or ASSERT in SetUp).
inline void LoadStoriesFront(std::unique_ptr<engine::ModelFront>* model) {
  absl::StatusOr<std::unique_ptr<engine::ModelFront>> loaded =
      engine::ModelFront::Load(kStoriesModel, kStoriesTokenizer);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  *model = *std::move(loaded);
}

}  // namespace pd::router
