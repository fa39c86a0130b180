// Helpers shared by the ModelRuntime tests: stories260K paths, a greedy generation driven
// through the scheduler on the calling thread, and the statistics of a running EngineLoop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "gtest/gtest.h"

namespace pd::engine::testing {

inline constexpr char kStoriesModel[] = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
inline constexpr char kStoriesTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

inline ModelRuntimeConfig StoriesConfig(kernels::Device device) {
  ModelRuntimeConfig c;
  c.model = kStoriesModel;
  c.tokenizer = kStoriesTokenizer;
  c.kv_blocks = 64;
  c.threads = 1;
  c.device = device;
  return c;
}

struct Generated {
  std::vector<uint32_t> tokens;
  uint32_t cached_tokens = 0;
  absl::Status status;
};

// Submits every prompt (greedy, `max_tokens` each, ids 1..n from `first_id`) at once, steps
// the scheduler until idle, and returns the outputs in prompt order.
inline std::vector<Generated> GreedyAll(ModelRuntime* rt,
                                        const std::vector<std::vector<uint32_t>>& prompts,
                                        uint32_t max_tokens, uint64_t first_id = 1) {
  std::vector<Generated> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.id = RequestId(first_id + i);
    r.prompt = prompts[i];
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    Generated* g = &out[i];
    r.on_output = [g](GenerationOutput o) {
      g->tokens.insert(g->tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finish_reason != FinishReason::kNone) {
        g->cached_tokens = o.cached_tokens;
        g->status = o.status;
      }
    };
    EXPECT_TRUE(rt->scheduler()->Submit(std::move(r)).ok());
  }
  while (!rt->scheduler()->idle()) {
    rt->scheduler()->Step();
  }
  return out;
}

// The scheduler's statistics read on `loop`'s thread, after everything posted before.
inline SchedulerStats StatsAfterPosted(EngineLoop* loop) {
  SchedulerStats stats;
  absl::Notification read;
  loop->Post([&](Scheduler& s) {
    stats = s.Stats();
    read.Notify();
  });
  EXPECT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return stats;
}

}  // namespace pd::engine::testing
