#include "loadtest/workload.h"

#include <algorithm>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

constexpr VocabRange kVocab{3, 512};

std::vector<RequestSpec> Take(Workload& w, int n) {
  std::vector<RequestSpec> out;
  RequestSpec s;
  for (int i = 0; i < n && w.Next(&s); ++i) {
    out.push_back(s);
  }
  return out;
}

TEST(WorkloadTest, SyntheticLengthsAndUniquePrompts) {
  SyntheticOptions o;
  o.input_len = *LengthSpec::Parse("uniform:10,20");
  o.output_len = LengthSpec::Fixed(7);
  o.vocab = kVocab;
  o.seed = 42;
  auto w = MakeSyntheticWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->name(), "synthetic");
  EXPECT_FALSE((*w)->size().has_value());
  std::vector<RequestSpec> reqs = Take(**w, 200);
  ASSERT_EQ(reqs.size(), 200u);
  absl::flat_hash_set<uint32_t> first_tokens;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].index, static_cast<int64_t>(i));
    EXPECT_GE(reqs[i].prompt.size(), 10u);
    EXPECT_LE(reqs[i].prompt.size(), 20u);
    EXPECT_EQ(reqs[i].output_len, 7);
    EXPECT_FALSE(reqs[i].arrival_offset.has_value());
    first_tokens.insert(reqs[i].prompt[0]);
  }
  EXPECT_GT(first_tokens.size(), 150u);  // prompts do not share prefixes

  // The same seed gives the same requests.
  auto again = MakeSyntheticWorkload(o);
  ASSERT_TRUE(again.ok());
  std::vector<RequestSpec> reqs2 = Take(**again, 200);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].prompt, reqs2[i].prompt);
  }
}

TEST(WorkloadTest, SharedPrefixPoolVisitedBeforeRepeating) {
  SharedPrefixOptions o;
  o.num_prefixes = 3;
  o.suffixes_per_prefix = 4;
  o.prefix_len = 32;
  o.suffix_len = 8;
  o.output_len = LengthSpec::Fixed(5);
  o.vocab = kVocab;
  auto w = MakeSharedPrefixWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<RequestSpec> reqs = Take(**w, 24);
  absl::flat_hash_set<std::vector<uint32_t>> first_pass, prefixes, all;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(reqs[i].prompt.size(), 40u);
    EXPECT_EQ(reqs[i].output_len, 5);
    std::vector<uint32_t> prefix(reqs[i].prompt.begin(), reqs[i].prompt.begin() + 32);
    prefixes.insert(prefix);
    all.insert(reqs[i].prompt);
    if (i < 12) {
      EXPECT_TRUE(first_pass.insert(reqs[i].prompt).second) << "repeat within the first pass";
    }
  }
  EXPECT_EQ(prefixes.size(), 3u);
  EXPECT_EQ(all.size(), 12u);  // P x S distinct prompts
}

TEST(WorkloadTest, SharedPrefixRejectsBadOptions) {
  SharedPrefixOptions o;
  o.vocab = kVocab;
  o.num_prefixes = 0;
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.num_prefixes = 1;
  o.prefix_len = 0;
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.prefix_len = 1;
  o.vocab = {5, 5};
  EXPECT_EQ(MakeSharedPrefixWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
}

bool StartsWith(const std::vector<uint32_t>& v, const std::vector<uint32_t>& prefix) {
  return v.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}

MultiTurnOptions ChatOptions() {
  MultiTurnOptions o;
  o.num_conversations = 3;
  o.num_turns = 4;
  o.system_prompt_len = 20;
  o.user_len = LengthSpec::Fixed(10);
  o.output_len = LengthSpec::Fixed(7);
  o.vocab = kVocab;
  o.seed = 5;
  return o;
}

// Every prompt is a first turn (system prompt + 10 user tokens) or extends an earlier prompt
// of its conversation by that turn's 7 reply tokens and 10 new user tokens; a conversation has
// at most 4 turns, and its next turn comes at least floor(3 / 2) = 1 other request later.
TEST(WorkloadTest, MultiTurnEachTurnExtendsThePreviousOne) {
  auto w = MakeMultiTurnWorkload(ChatOptions());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->name(), "multi_turn");
  EXPECT_FALSE((*w)->size().has_value());
  std::vector<RequestSpec> reqs = Take(**w, 60);
  ASSERT_EQ(reqs.size(), 60u);
  const std::vector<uint32_t> system(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 20);
  std::vector<size_t> last_turn_of_open;  // requests whose conversation may continue
  int first_turns = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(reqs[i].output_len, 7);
    EXPECT_TRUE(StartsWith(reqs[i].prompt, system)) << i;  // every conversation shares it
    for (uint32_t t : reqs[i].prompt) {
      ASSERT_GE(t, kVocab.lo);
      ASSERT_LT(t, kVocab.hi);
    }
    const size_t len = reqs[i].prompt.size();
    ASSERT_EQ((len - 30) % 17, 0u) << i;  // 20 + 10 (turn + 1) + 7 turn
    const size_t turn = (len - 30) / 17;
    ASSERT_LE(turn, 3u) << i;
    if (turn == 0) {
      ++first_turns;
    } else {
      // Exactly one open conversation's last turn is its prefix, and it is one turn shorter.
      int parents = 0;
      for (size_t j : last_turn_of_open) {
        if (StartsWith(reqs[i].prompt, reqs[j].prompt)) {
          ++parents;
          EXPECT_EQ(reqs[j].prompt.size() + 17, len) << i << " " << j;
          EXPECT_GE(i - j, 2u) << i << " " << j;
        }
      }
      EXPECT_EQ(parents, 1) << i;
      std::erase_if(last_turn_of_open,
                    [&](size_t j) { return StartsWith(reqs[i].prompt, reqs[j].prompt); });
    }
    if (turn < 3) {
      last_turn_of_open.push_back(i);
    }
  }
  EXPECT_GE(first_turns, 15);  // 60 requests of at most 4 turns
  EXPECT_LE(first_turns, 20);
  // Different conversations part right after the system prompt.
  EXPECT_NE(std::vector<uint32_t>(reqs[0].prompt.begin() + 20, reqs[0].prompt.end()),
            std::vector<uint32_t>(reqs[1].prompt.begin() + 20, reqs[1].prompt.end()));
}

// Against a 4-worker round robin (request i on worker i mod 4) with 8 conversations, a turn
// must not always land on the worker of its previous turn, as a fixed rotation of slots would.
TEST(WorkloadTest, MultiTurnOrderDoesNotAlignWithRoundRobin) {
  MultiTurnOptions o = ChatOptions();
  o.num_conversations = 8;
  o.num_turns = 1000;
  auto w = MakeMultiTurnWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<RequestSpec> reqs = Take(**w, 400);
  // The previous turn of request i is the latest earlier prompt that is its prefix.
  int same_worker = 0;
  int continued = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (size_t j = i; j-- > 0;) {
      if (StartsWith(reqs[i].prompt, reqs[j].prompt)) {
        ++continued;
        same_worker += (i % 4 == j % 4) ? 1 : 0;
        break;
      }
    }
  }
  EXPECT_GT(continued, 350);
  EXPECT_LT(same_worker, continued / 2);  // about a quarter
}

TEST(WorkloadTest, MultiTurnIsDeterministicPerSeed) {
  auto a = MakeMultiTurnWorkload(ChatOptions());
  auto b = MakeMultiTurnWorkload(ChatOptions());
  MultiTurnOptions other = ChatOptions();
  other.seed = 6;
  auto c = MakeMultiTurnWorkload(other);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<RequestSpec> ra = Take(**a, 10), rb = Take(**b, 10), rc = Take(**c, 10);
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i].prompt, rb[i].prompt) << i;
    EXPECT_NE(ra[i].prompt, rc[i].prompt) << i;
  }
}

// With a cap, a conversation ends before a prompt would exceed it and the slot starts anew.
TEST(WorkloadTest, MultiTurnCapEndsConversationsEarly) {
  MultiTurnOptions o = ChatOptions();
  o.num_conversations = 1;
  o.num_turns = 100;
  o.user_len = *LengthSpec::Parse("uniform:5,15");
  o.output_len = *LengthSpec::Parse("uniform:1,20");
  o.max_prompt_len = 80;
  auto w = MakeMultiTurnWorkload(o);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<RequestSpec> reqs = Take(**w, 200);
  int conversations = 1;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_LE(reqs[i].prompt.size(), 80u) << i;
    if (i > 0 && !StartsWith(reqs[i].prompt, reqs[i - 1].prompt)) {
      ++conversations;
      EXPECT_LE(reqs[i].prompt.size(), 35u) << i;  // a first turn: system + one user message
    }
  }
  EXPECT_GT(conversations, 10);
  EXPECT_LT(conversations, 100);
}

TEST(WorkloadTest, MultiTurnRejectsBadOptions) {
  MultiTurnOptions o = ChatOptions();
  o.num_conversations = 0;
  EXPECT_EQ(MakeMultiTurnWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = ChatOptions();
  o.num_turns = 0;
  EXPECT_EQ(MakeMultiTurnWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = ChatOptions();
  o.system_prompt_len = -1;
  EXPECT_EQ(MakeMultiTurnWorkload(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = ChatOptions();
  o.max_prompt_len = 29;  // system 20 + user 10 does not fit
  absl::Status s = MakeMultiTurnWorkload(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit --max_input_len 29"), absl::string_view::npos) << s;
  o.max_prompt_len = 30;
  EXPECT_TRUE(MakeMultiTurnWorkload(o).ok());
}

TEST(WorkloadTest, TraceReplaysRecordsWithSharedBlocks) {
  std::istringstream in(
      "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 9, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 2000, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, "
      "2]}\n");
  TraceOptions to;
  to.time_scale = 0.1;
  absl::StatusOr<Trace> trace = ParseTrace(in, "t", to);
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto w = MakeTraceWorkload(*std::move(trace), {512, kVocab});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->size(), 2);
  std::vector<RequestSpec> reqs = Take(**w, 10);
  ASSERT_EQ(reqs.size(), 2u);  // exhausted after the trace
  EXPECT_EQ(reqs[0].prompt.size(), 1000u);
  EXPECT_EQ(reqs[1].prompt.size(), 600u);
  EXPECT_EQ(reqs[0].output_len, 9);
  EXPECT_EQ(reqs[1].source_line, 2);
  EXPECT_EQ(reqs[1].arrival_offset, absl::Milliseconds(200));
  // Block 0 shared, the second block not.
  EXPECT_TRUE(
      std::equal(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 512, reqs[1].prompt.begin()));
  EXPECT_FALSE(std::equal(reqs[0].prompt.begin() + 512, reqs[0].prompt.begin() + 600,
                          reqs[1].prompt.begin() + 512));
}

}  // namespace
}  // namespace pd::loadtest
