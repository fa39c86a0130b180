// grammar_maskbench: the grammar engine's speed on real schemas and a real vocabulary, measured
// the way MaskBench measures LLGuidance and XGrammar: compile each schema (time to first mask),
// then walk each valid instance token by token (tokenized with the model's tokenizer),
// computing the token mask before every token (time per mask) and checking that the instance's
// own next token is in it. One thread. Results go to docs/benchmarks.md.
//
//   build/engine/bench/grammar_maskbench --tokenizer=<dir>/tokenizer.json
//       [--schemas=../shared/jsonschema] [--max_schemas=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/structural_tag.h"
#include "engine/grammar/token_trie.h"
#include "engine/model/hf_tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "a Hugging Face tokenizer.json (required)");
ABSL_FLAG(std::string, schemas, PD_SHARED_DIR "/jsonschema",
          "folder of MaskBench-format files ({schema, tests: [{valid, data}]})");
ABSL_FLAG(int, max_schemas, 0, "stop after this many files (0: all)");
ABSL_FLAG(int, skip_schemas, 0, "skip this many files first (in name order)");
ABSL_FLAG(std::string, only, "", "only the files whose name contains this (after --skip_schemas)");
ABSL_FLAG(double, report_slow_ms, 0,
          "print each mask slower than this (schema, position, time); 0: none");
ABSL_FLAG(int, max_whitespace, 16, "JsonSchemaOptions::max_whitespace");
ABSL_FLAG(bool, tool_tag, false,
          "each schema as the arguments of a tool call under tool_choice \"auto\": a structural "
          "tag (<tool_call> trigger) around it, each instance walked inside text and a call");
ABSL_FLAG(bool, verify, false,
          "also compute every mask by the uncached walk and count differences (slow; not timed)");

namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Measures JSON Schema compile time and token-mask time on a schema set with a real "
      "tokenizer.\n  grammar_maskbench --tokenizer=tokenizer.json [--schemas=DIR]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_tokenizer).empty()) {
    std::fprintf(stderr, "grammar_maskbench: --tokenizer is required (a tokenizer.json)\n");
    return 2;
  }
  auto tok = pd::engine::HfTokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::fprintf(stderr, "grammar_maskbench: %s\n", std::string(tok.status().message()).c_str());
    return 1;
  }
  // Token bytes as decoded after an ordinary token (no BOS space rule), as the worker gives
  // them to grammars (specials as their grammar bytes: TokenGrammarBytes).
  const uint32_t n = tok->vocab_size();
  std::vector<std::string> bytes(n);
  const uint32_t prev = tok->Encode("a", false, false).value_or(std::vector<uint32_t>{0})[0];
  for (uint32_t t = 0; t < n; ++t) {
    if (t == tok->eos_id() || t == tok->bos_id()) continue;
    auto b = tok->DecodeToken(prev, t);
    if (b.ok()) bytes[t] = pd::grammar::TokenGrammarBytes(*b, tok->SpecialTokenText(t));
  }
  const auto t_trie = Clock::now();
  const pd::grammar::TokenTrie trie(bytes, {static_cast<int32_t>(tok->eos_id())});
  const double trie_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - t_trie).count();
  std::printf("vocabulary: %u tokens, trie of %zu nodes built in %.1f ms\n", n, trie.num_nodes(),
              trie_ms);
  std::fflush(stdout);

  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(absl::GetFlag(FLAGS_schemas))) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  const auto skip = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_skip_schemas)));
  files.erase(files.begin(), files.begin() + static_cast<std::ptrdiff_t>(std::min(skip, files.size())));
  if (!absl::GetFlag(FLAGS_only).empty()) {
    std::erase_if(files, [](const std::filesystem::path& f) {
      return f.filename().string().find(absl::GetFlag(FLAGS_only)) == std::string::npos;
    });
  }
  if (absl::GetFlag(FLAGS_max_schemas) > 0 &&
      files.size() > static_cast<size_t>(absl::GetFlag(FLAGS_max_schemas))) {
    files.resize(static_cast<size_t>(absl::GetFlag(FLAGS_max_schemas)));
  }
  pd::grammar::JsonSchemaOptions options;
  options.max_whitespace = absl::GetFlag(FLAGS_max_whitespace);
  std::vector<double> compile_ms;
  std::vector<double> mask_us;
  using Path = pd::grammar::Matcher::MaskPath;
  constexpr int kPaths = pd::grammar::Matcher::kNumMaskPaths;
  std::vector<double> path_us[kPaths];
  int compiled = 0;
  int token_refused = 0;
  int mismatches = 0;
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  size_t cache_bytes = 0;
  std::vector<uint32_t> reference;
  size_t done = 0;
  std::vector<uint32_t> mask;
  for (const auto& path : files) {
    if (++done % 100 == 0) {
      std::fprintf(stderr, "[%zu/%zu] %zu masks so far\n", done, files.size(), mask_us.size());
    }
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const Json doc = Json::parse(text.str(), nullptr, false);
    if (doc.is_discarded()) continue;
    const bool tool_tag = absl::GetFlag(FLAGS_tool_tag);
    const std::string begin = "<tool_call>\n{\"name\": \"f\", \"arguments\": ";
    const std::string end = "}\n</tool_call>";
    const auto t0 = Clock::now();
    absl::StatusOr<pd::grammar::Grammar> grammar;
    if (tool_tag) {
      pd::grammar::StructuralTag tag;
      tag.triggers = {"<tool_call>"};
      tag.structures.push_back({begin, doc["schema"].dump(), end});
      grammar = pd::grammar::CompileStructuralTag(tag, options);
    } else {
      grammar = pd::grammar::CompileJsonSchema(doc["schema"].dump(), options);
    }
    if (!grammar.ok()) continue;
    auto c = pd::grammar::CompiledGrammar::Compile(*grammar);
    if (!c.ok()) continue;
    pd::grammar::Matcher first(*c);
    first.FillTokenMask(trie, &mask);  // time to first mask
    compile_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ++compiled;
    for (const Json& t : doc["tests"]) {
      if (!t["valid"].get<bool>()) continue;
      auto ids = tok->Encode(tool_tag ? "Let me check that for you.\n" + begin + t["data"].dump() +
                                            end + "\nDone: <tool> calls are above."
                                      : t["data"].dump(),
                             false, false);
      if (!ids.ok()) continue;
      pd::grammar::Matcher m(*c);
      for (size_t k = 0; k < ids->size(); ++k) {
        const uint32_t id = (*ids)[k];
        const auto m0 = Clock::now();
        m.FillTokenMask(trie, &mask);
        mask_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - m0).count());
        path_us[static_cast<int>(m.last_mask_path())].push_back(mask_us.back());
        if (absl::GetFlag(FLAGS_report_slow_ms) > 0 &&
            mask_us.back() > 1000 * absl::GetFlag(FLAGS_report_slow_ms)) {
          std::string before;
          for (size_t j = (k > 4 ? k - 4 : 0); j < k; ++j) before += trie.token_bytes((*ids)[j]);
          std::fprintf(
              stderr,
              "slow mask: %s, instance token %zu after '%s' (%zu stacks, %s, %zu boundaries): "
              "%.1f ms\n",
              path.filename().string().c_str(), k, before.c_str(), m.num_stacks(),
              pd::grammar::Matcher::MaskPathName(m.last_mask_path()), m.last_mask_boundaries(),
              mask_us.back() / 1000);
        }
        if (absl::GetFlag(FLAGS_verify)) {
          m.FillTokenMaskUncached(trie, &reference);
          if (reference != mask) ++mismatches;
        }
        if ((mask[id >> 5] & (1u << (id & 31))) == 0 || !m.AcceptBytes(bytes[id])) {
          ++token_refused;  // the instance leaves the grammar (e.g. another member order)
          break;
        }
      }
    }
    const auto stats = (*c)->mask_cache().stats();
    cache_hits += stats.hits;
    cache_misses += stats.misses;
    cache_bytes = std::max(cache_bytes, stats.bytes);
  }
  std::printf("schemas: %zu, compiled: %d\n", files.size(), compiled);
  std::printf("compile + first mask (ms): p50 %.2f  p99 %.2f  max %.2f\n",
              Percentile(compile_ms, 0.5), Percentile(compile_ms, 0.99),
              Percentile(compile_ms, 1.0));
  std::printf("mask (us): %zu masks, mean %.1f  p50 %.1f  p99 %.1f  max %.1f\n", mask_us.size(),
              Mean(mask_us), Percentile(mask_us, 0.5), Percentile(mask_us, 0.99),
              Percentile(mask_us, 1.0));
  std::printf("mask (us): p90 %.1f  p95 %.1f\n", Percentile(mask_us, 0.9),
              Percentile(mask_us, 0.95));
  double total_us = 0;
  for (const double x : mask_us) total_us += x;
  std::printf("where the mask time goes (path: masks, share of time, mean, p99 us):\n");
  for (int p = 0; p < kPaths; ++p) {
    const std::vector<double>& v = path_us[p];
    if (v.empty()) continue;
    double sum = 0;
    for (const double x : v) sum += x;
    std::printf("  %-22s %8zu  %5.1f%%  %9.1f  %9.1f\n",
                pd::grammar::Matcher::MaskPathName(static_cast<Path>(p)), v.size(),
                total_us > 0 ? 100 * sum / total_us : 0.0, Mean(v), Percentile(v, 0.99));
  }
  std::printf("mask cache: %lld hits, %lld misses, largest %.1f KiB\n",
              static_cast<long long>(cache_hits), static_cast<long long>(cache_misses),
              static_cast<double>(cache_bytes) / 1024.0);
  const auto shared = trie.mask_cache().stats();
  std::printf("shared (per tokenizer) mask cache: %lld hits, %lld misses, %zu entries, %.1f MiB\n",
              static_cast<long long>(shared.hits), static_cast<long long>(shared.misses),
              shared.entries, static_cast<double>(shared.bytes) / (1024.0 * 1024.0));
  std::printf("instances that left the grammar mid-way: %d\n", token_refused);
  if (absl::GetFlag(FLAGS_verify)) {
    std::printf("masks differing from the uncached walk: %d\n", mismatches);
  }
  return 0;
}
