// Prompts in the style of stories260K's training stories, shared by the KV quality benches
// (kv_quality, kv_policy_quality): the same prompts make their figures comparable.
#pragma once

namespace pd::engine {

inline constexpr const char* kStoryPrompts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom and his dog went to the park. The dog saw a ball and",
    "One day, a little bird was flying in the sky. It saw",
    "Sue had a big red box. She wanted to",
    "The sun was hot, so Ben went to the lake with his mom.",
    "There was a kind old man who lived in a small house by the sea.",
    "Mia found a shiny key under her bed.",
    "The cat wanted to eat the fish, but",
};

}  // namespace pd::engine
