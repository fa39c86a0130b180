// Workloads: the sequence of requests a load test sends (prompt tokens, output length and, for
// trace replay, when to send each one).
//
//   synthetic      every prompt unique (no prefix sharing); input and output lengths drawn from
//                  LengthSpecs.
//   shared_prefix  num_prefixes prefixes of prefix_len tokens times suffixes_per_prefix
//                  suffixes of suffix_len tokens: a pool of P x S distinct prompts, sent in a
//                  seeded random order that visits the whole pool before repeating a prompt.
//   trace          a Mooncake trace replayed record by record; prompts synthesized from the
//                  hash ids (equal ids give equal 512-token blocks, see prompt_synth.h).
//   multi_turn     chat conversations: turn k's prompt is turn k-1's prompt, the assistant's
//                  reply to it and a new user message, so each turn extends the previous
//                  conversation (MultiTurnOptions below).
//
// All are deterministic for a given seed.
// A Workload is used by one thread (the load runner's issuer); thread-compatible.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "loadtest/length_spec.h"
#include "loadtest/prompt_synth.h"
#include "loadtest/trace.h"

namespace pd::loadtest {

// One request to send.
struct RequestSpec {
  int64_t index = 0;             // 0-based position in the workload
  std::vector<uint32_t> prompt;  // token ids, never empty
  int64_t output_len = 0;        // sent as max_tokens (with ignore_eos), >= 1
  // Trace replay: when to send it, relative to the start of the run. nullopt otherwise.
  std::optional<absl::Duration> arrival_offset;
  int64_t source_line = 0;  // trace line number; 0 for generated workloads
};

class Workload {
 public:
  virtual ~Workload() = default;
  // "synthetic", "shared_prefix", "multi_turn" or "trace".
  virtual absl::string_view name() const = 0;
  // Fills `out` with the next request; false once the workload is exhausted (trace end).
  virtual bool Next(RequestSpec* out) = 0;
  // Number of requests when finite (traces), nullopt for endless generated workloads.
  virtual std::optional<int64_t> size() const = 0;
};

struct SyntheticOptions {
  LengthSpec input_len = LengthSpec::Fixed(128);
  LengthSpec output_len = LengthSpec::Fixed(128);
  VocabRange vocab;
  uint64_t seed = 0;
};

struct SharedPrefixOptions {
  int64_t num_prefixes = 8;          // P >= 1
  int64_t suffixes_per_prefix = 16;  // S >= 1
  int64_t prefix_len = 512;          // tokens, >= 1
  int64_t suffix_len = 64;           // tokens, >= 0 (0: the P prefixes alone)
  LengthSpec output_len = LengthSpec::Fixed(128);
  VocabRange vocab;
  uint64_t seed = 0;
};

// Multi-turn chat. num_conversations (C) conversations are in progress at once, each in a
// slot. Each request is the next turn of a slot drawn uniformly from the least recently used
// half of the slots, so turn k+1 of a conversation follows its turn k after at least
// floor(C / 2) and on average C requests, in an order without a period (a fixed rotation would
// line up with a round-robin router's and give it perfect affinity).
// A conversation's first prompt is the system prompt (shared by every conversation) and a user
// message; turn k+1's prompt appends the reply to turn k (output_len tokens of turn k,
// synthesized: the workload does not read the server's answer, so a server's cache holds
// turn k's prompt but not its reply, as with a trace's prompt-only hash ids) and a new user
// message. After num_turns turns, or when the next prompt would exceed max_prompt_len, the
// slot starts a new conversation. The workload does not wait for replies: with a closed loop,
// keep concurrency <= num_conversations / 2 so that a turn is normally sent after the previous
// one finished.
struct MultiTurnOptions {
  int64_t num_conversations = 16;  // >= 1
  int64_t num_turns = 8;           // turns per conversation, >= 1
  int64_t system_prompt_len = 64;  // tokens shared by every conversation, >= 0
  LengthSpec user_len = LengthSpec::Fixed(64);
  LengthSpec output_len = LengthSpec::Fixed(128);  // the reply, sent as max_tokens
  // A conversation ends before a prompt would exceed this many tokens; 0 = no cap. Must leave
  // room for a first turn (system_prompt_len + the largest user_len).
  int64_t max_prompt_len = 0;
  VocabRange vocab;
  uint64_t seed = 0;
};

struct TraceWorkloadOptions {
  int64_t block_tokens = 512;  // tokens per hash id; as given to ParseTrace
  VocabRange vocab;
};

// InvalidArgument for invalid options (lengths, counts, vocabulary range).
absl::StatusOr<std::unique_ptr<Workload>> MakeSyntheticWorkload(const SyntheticOptions& options);
absl::StatusOr<std::unique_ptr<Workload>> MakeSharedPrefixWorkload(
    const SharedPrefixOptions& options);
absl::StatusOr<std::unique_ptr<Workload>> MakeMultiTurnWorkload(const MultiTurnOptions& options);
absl::StatusOr<std::unique_ptr<Workload>> MakeTraceWorkload(Trace trace,
                                                            const TraceWorkloadOptions& options);

}  // namespace pd::loadtest
