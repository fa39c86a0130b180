// Differential test of the logit processing of issue #31 section 3 against PyTorch: random
// cases (logits, prompt, output so far, logit_bias, presence/frequency/repetition penalties,
// temperature, min_p) go through this engine (LogitEditBuilder's edits applied by
// kernels::ApplyLogitEdits, then kernels::Sample with min_p) and through
// testdata/penalties_reference.py, a dense float32 version written as vLLM writes it (Debian's
// python3-torch under /usr/bin/python3). The processed logits must be equal bit for bit; the
// tokens min-p lets the sampler draw must be the ones vLLM keeps (tokens within rounding of the
// threshold excepted), and every kept token of real weight must be drawn.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/scheduler/token_sampling.h"
#include "gtest/gtest.h"
#include "kernels/sampling.h"

namespace pd::engine {
namespace {

constexpr char kOracle[] = PD_SOURCE_DIR "/engine/scheduler/testdata/penalties_reference.py";
constexpr char kPython[] = "/usr/bin/python3";

struct Case {
  std::vector<float> logits;
  std::vector<uint32_t> prompt, output;
  SamplingOptions so;
};

std::string F(float x) {
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";  // Python's json reads these
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(x));  // float32 round trip
  return buf;
}

std::string ToJson(const std::vector<Case>& cases) {
  std::vector<std::string> out;
  for (const Case& c : cases) {
    std::vector<std::string> logits, bias;
    for (float x : c.logits) logits.push_back(F(x));
    for (const auto& [id, b] : c.so.logit_bias)
      bias.push_back(absl::StrCat("[", id, ",", F(b), "]"));
    out.push_back(absl::StrCat(
        "{\"logits\":[", absl::StrJoin(logits, ","), "],\"prompt\":[", absl::StrJoin(c.prompt, ","),
        "],\"output\":[", absl::StrJoin(c.output, ","), "],\"bias\":[", absl::StrJoin(bias, ","),
        "],\"presence\":", F(c.so.presence_penalty), ",\"frequency\":", F(c.so.frequency_penalty),
        ",\"repetition\":", F(c.so.repetition_penalty), ",\"temperature\":", F(c.so.temperature),
        ",\"min_p\":", F(c.so.min_p), "}"));
  }
  return absl::StrCat("[", absl::StrJoin(out, ",\n"), "]\n");
}

std::vector<Case> RandomCases(int n) {
  std::mt19937 rng(2031);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::uniform_real_distribution<float> pen(-2.0f, 2.0f), rep(0.5f, 2.0f), bias(-100.0f, 100.0f),
      temp(0.3f, 1.5f);
  const float min_ps[] = {0.0f, 0.01f, 0.1f, 0.5f, 1.0f};
  std::vector<Case> cases;
  for (int i = 0; i < n; ++i) {
    Case c;
    const int vocab = std::vector<int>{50, 257, 1000}[i % 3];
    for (int t = 0; t < vocab; ++t) c.logits.push_back(logit(rng));
    if (i % 5 == 4) c.logits[i % vocab] = -INFINITY;
    for (int k = 1 + static_cast<int>(rng() % 20); k > 0; --k) c.prompt.push_back(rng() % vocab);
    // Outputs drawn from a small range repeat, so counts above 1 occur.
    const uint32_t range = 1 + rng() % 12;
    for (int k = static_cast<int>(rng() % 31); k > 0; --k) c.output.push_back(rng() % range);
    SamplingOptions& so = c.so;
    so.presence_penalty = i % 4 == 0 ? 0.0f : pen(rng);
    so.frequency_penalty = i % 4 == 1 ? 0.0f : pen(rng);
    so.repetition_penalty = i % 3 == 0 ? 1.0f : rep(rng);
    std::set<uint32_t> ids;
    for (int k = static_cast<int>(rng() % 8); k > 0; --k) ids.insert(rng() % vocab);
    for (uint32_t id : ids) {
      const float b = id % 7 == 0 ? 100.0f : id % 7 == 1 ? -100.0f : bias(rng);
      so.logit_bias.emplace_back(id, b);
    }
    so.temperature = temp(rng);
    so.min_p = min_ps[i % 5];
    cases.push_back(std::move(c));
  }
  return cases;
}

struct Expected {
  std::vector<uint32_t> bits;
  std::vector<int> keep;
  int argmax = -1;
};

std::vector<std::string> Fields(const std::string& line, char tag) {
  std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
  EXPECT_FALSE(f.empty() || f[0] != std::string(1, tag)) << line.substr(0, 40);
  if (!f.empty()) f.erase(f.begin());
  return f;
}

TEST(PenaltiesTorchTest, EditsAndMinPMatchVllmsRuleInPyTorch) {
  const std::vector<Case> cases = RandomCases(60);
  absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-penalties-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string in = dir->File("cases.json"), out = dir->File("oracle.txt");
  std::ofstream(in) << ToJson(cases);
  absl::StatusOr<testing::Subprocess> py =
      testing::Subprocess::Spawn({kPython, kOracle, in, out}, dir->File("python.log"));
  ASSERT_TRUE(py.ok()) << py.status() << " (scripts/setup.sh installs python3-torch)";
  absl::StatusOr<testing::ExitInfo> exit = py->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->Success()) << exit->ToString() << "\n" << py->LogTail(30);

  std::ifstream lines(out);
  std::vector<Expected> want(cases.size());
  for (Expected& e : want) {
    std::string l, k, a;
    ASSERT_TRUE(std::getline(lines, l) && std::getline(lines, k) && std::getline(lines, a));
    for (const std::string& s : Fields(l, 'L')) {
      uint32_t v = 0;
      ASSERT_TRUE(absl::SimpleAtoi(s, &v)) << s;
      e.bits.push_back(v);
    }
    for (const std::string& s : Fields(k, 'K')) e.keep.push_back(s == "1");
    ASSERT_TRUE(absl::SimpleAtoi(Fields(a, 'A').at(0), &e.argmax));
  }

  int compared_draws = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("case ", i));
    const Case& c = cases[i];
    const int64_t vocab = static_cast<int64_t>(c.logits.size());
    ASSERT_EQ(static_cast<int64_t>(want[i].bits.size()), vocab);
    // This engine: the builder's edits over prompt + output, applied by the kernel.
    std::vector<uint32_t> tokens = c.prompt;
    tokens.insert(tokens.end(), c.output.begin(), c.output.end());
    LogitEditBuilder builder;
    const absl::Span<const kernels::LogitEdit> edits = builder.Build(c.so, tokens, c.prompt.size());
    std::vector<float> row = c.logits;
    const std::vector<int32_t> rows(edits.size(), 0);
    kernels::LogitEditParams e;
    e.logits = row.data();
    e.edits = edits.data();
    e.rows = rows.data();
    e.num_edits = static_cast<int64_t>(edits.size());
    e.num_seqs = 1;
    e.vocab_size = e.logits_stride = vocab;
    ASSERT_TRUE(kernels::ApplyLogitEdits(kernels::OpContext{}, e).ok());
    int mismatched = 0;
    for (int64_t t = 0; t < vocab; ++t) {
      uint32_t got;
      std::memcpy(&got, &row[t], 4);
      if (got != want[i].bits[t] && mismatched++ < 3) {
        ADD_FAILURE() << "token " << t << ": " << row[t] << " (bits " << got << "), torch bits "
                      << want[i].bits[t];
      }
    }
    EXPECT_EQ(mismatched, 0);

    // Greedy, and min-p's kept set through draws of the sampler (steps 0..399).
    constexpr int kDraws = 400;
    std::vector<float> batch;
    for (int d = 0; d < kDraws; ++d) batch.insert(batch.end(), row.begin(), row.end());
    std::vector<float> temperature(kDraws, c.so.temperature), min_p(kDraws, c.so.min_p);
    std::vector<uint64_t> seeds(kDraws, 99 + i), steps(kDraws);
    for (int d = 0; d < kDraws; ++d) steps[d] = d;
    std::vector<int32_t> drawn(kDraws, -1);
    kernels::SamplingParams p;
    p.logits = batch.data();
    p.out_tokens = drawn.data();
    p.num_seqs = kDraws;
    p.vocab_size = p.logits_stride = vocab;
    p.temperature = temperature.data();
    p.min_p = min_p.data();
    p.seeds = seeds.data();
    p.steps = steps.data();
    std::vector<uint8_t> ws(kernels::SamplingWorkspaceBytes(kernels::OpContext{}, p));
    p.workspace = ws.data();
    p.workspace_bytes = static_cast<int64_t>(ws.size());
    ASSERT_TRUE(kernels::Sample(kernels::OpContext{}, p).ok());
    int32_t greedy = -1;
    kernels::SamplingParams g = p;
    g.num_seqs = 1;
    g.out_tokens = &greedy;
    g.temperature = nullptr;
    ASSERT_TRUE(kernels::Sample(kernels::OpContext{}, g).ok());
    EXPECT_EQ(greedy, want[i].argmax);

    // Each token's weight relative to the top one, to tell the near-threshold ones apart.
    float max = -INFINITY;
    for (float x : row) max = std::max(max, x);
    std::vector<double> w(vocab);
    double kept_mass = 0.0;
    for (int64_t t = 0; t < vocab; ++t) {
      w[t] = std::exp((static_cast<double>(row[t]) - max) / c.so.temperature);
      if (want[i].keep[t]) kept_mass += w[t];
    }
    auto near = [&](int64_t t) { return std::fabs(w[t] - c.so.min_p) <= 1e-5 * c.so.min_p; };
    std::set<int32_t> seen(drawn.begin(), drawn.end());
    for (int32_t t : seen) {
      EXPECT_TRUE(want[i].keep[t] || near(t)) << "drew token " << t << ", which min-p drops";
    }
    for (int64_t t = 0; t < vocab; ++t) {
      if (want[i].keep[t] && !near(t) && w[t] / kept_mass > 0.05) {
        EXPECT_EQ(seen.count(static_cast<int32_t>(t)), 1u) << "never drew kept token " << t;
      }
    }
    compared_draws += kDraws;
  }
  EXPECT_EQ(compared_draws, 60 * 400);
}

}  // namespace
}  // namespace pd::engine
