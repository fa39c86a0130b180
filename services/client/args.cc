#include "services/client/args.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/dashed_flags.h"
#include "common/base/status_macros.h"

namespace pd::client {
namespace {

// A flag argument: "-x..." or "--x...", but not "-" or "--" alone.
bool IsFlag(absl::string_view arg) { return arg.size() >= 2 && arg[0] == '-' && arg != "--"; }

}  // namespace

absl::StatusOr<PreparsedArgs> PreparseArgs(const std::vector<std::string>& argv,
                                           const FlagLookup& lookup) {
  PreparsedArgs out;
  bool positional_only = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i == 0 || positional_only || !IsFlag(argv[i])) {
      positional_only = positional_only || (i > 0 && argv[i] == "--");
      out.argv.push_back(argv[i]);
      continue;
    }
    const std::string arg = UndashFlag(argv[i]);
    absl::string_view body = absl::StripPrefix(absl::StripPrefix(arg, "-"), "-");
    const size_t eq = body.find('=');
    const absl::string_view name = body.substr(0, eq);
    std::optional<absl::string_view> value;
    if (eq != absl::string_view::npos) {
      value = body.substr(eq + 1);
    }
    std::optional<FlagInfo> info = lookup(name);
    if (!info.has_value() && absl::StartsWith(name, "no") && !value.has_value()) {
      info = lookup(name.substr(2));  // --noNAME of a boolean
      if (info.has_value() && !info->is_bool) {
        info.reset();
      }
      if (info.has_value()) {
        out.argv.push_back(arg);
        continue;
      }
    }
    if (!info.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag: ", argv[i]));
    }
    if (!value.has_value() && !info->is_bool) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("missing value for flag ", argv[i]));
      }
      value = argv[++i];
    }
    if (value.has_value() && info->check) {
      if (std::string error = info->check(*value); !error.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid value '", *value, "' for --", name, ": ", error));
      }
    }
    if (name == "stop") {
      out.stop.push_back(std::string(*value));
    } else if (value.has_value()) {
      out.argv.push_back(absl::StrCat("--", name, "=", *value));
    } else {
      out.argv.push_back(absl::StrCat("--", name));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> SplitStopList(const std::vector<std::string>& values) {
  std::vector<std::string> stops;
  for (const std::string& value : values) {
    std::string current;
    for (size_t i = 0; i < value.size(); ++i) {
      const char c = value[i];
      if (c == '\\') {
        if (i + 1 == value.size() || (value[i + 1] != ',' && value[i + 1] != '\\')) {
          return absl::InvalidArgumentError(
              absl::StrCat("--stop '", value, "': a backslash must precede ',' or '\\'"));
        }
        current += value[++i];
      } else if (c == ',') {
        stops.push_back(std::move(current));
        current.clear();
      } else {
        current += c;
      }
    }
    stops.push_back(std::move(current));
  }
  for (const std::string& s : stops) {
    if (s.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop '", absl::StrJoin(values, "' '"), "': empty stop string"));
    }
  }
  return stops;
}

absl::StatusOr<std::vector<uint32_t>> ParseTokenIds(absl::string_view text) {
  std::vector<uint32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("--token_ids is empty");
  }
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    uint32_t id = 0;
    if (part.empty() || !absl::SimpleAtoi(part, &id) || part[0] == '-' || part[0] == '+') {
      return absl::InvalidArgumentError(
          absl::StrCat("--token_ids '", text, "': '", part, "' is not a token id (uint32)"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<pdserve::v1::GenerateRequest> BuildRequest(const RequestOptions& options) {
  pdserve::v1::GenerateRequest req;
  req.set_model(options.model);
  const bool has_text = !options.prompt_words.empty();
  const bool has_ids = !options.token_ids.empty();
  if (has_text && has_ids) {
    return absl::InvalidArgumentError("give either a prompt or --token_ids, not both");
  }
  if (!has_text && !has_ids) {
    return absl::InvalidArgumentError("no prompt: give the prompt text or --token_ids");
  }
  if (has_text) {
    std::string text = absl::StrJoin(options.prompt_words, " ");
    if (text.empty()) {
      return absl::InvalidArgumentError(
          "the prompt is empty (to generate from BOS alone, use --token_ids=1 for llama2.c "
          "models)");
    }
    req.set_text(std::move(text));
  } else {
    PD_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, ParseTokenIds(options.token_ids));
    req.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  }
  pdserve::v1::SamplingParams* s = req.mutable_sampling();
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature ", options.temperature, ": must be >= 0 and finite"));
  }
  if (!(options.top_p >= 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--top_p ", options.top_p, ": must be in (0, 1], or 0 for disabled"));
  }
  s->set_max_tokens(options.max_tokens);
  s->set_temperature(options.temperature);
  s->set_top_p(options.top_p);
  s->set_top_k(options.top_k);
  s->set_ignore_eos(options.ignore_eos);
  if (!options.seed.empty()) {
    uint64_t seed = 0;
    if (!absl::SimpleAtoi(options.seed, &seed) || options.seed[0] == '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("--seed '", options.seed, "': not an unsigned 64-bit integer"));
    }
    s->set_seed(seed);
  }
  if (!options.stop.empty()) {
    PD_ASSIGN_OR_RETURN(std::vector<std::string> stops, SplitStopList(options.stop));
    for (std::string& stop : stops) {
      s->add_stop(std::move(stop));
    }
  }
  s->set_presence_penalty(options.presence_penalty);
  s->set_frequency_penalty(options.frequency_penalty);
  s->set_repetition_penalty(options.repetition_penalty);
  s->set_min_p(options.min_p);
  if (!options.logit_bias.empty()) {
    for (absl::string_view item : absl::StrSplit(options.logit_bias, ',')) {
      const std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(item, absl::MaxSplits(':', 1));
      uint32_t id = 0;
      float bias = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.first), &id) ||
          !absl::SimpleAtof(absl::StripAsciiWhitespace(kv.second), &bias) ||
          !std::isfinite(bias)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--logit_bias: '", item, "' is not TOKEN_ID:BIAS (e.g. --logit_bias=42:-100,7:5)"));
      }
      (*s->mutable_logit_bias())[id] = bias;
    }
  }
  if (!options.cache_salt.empty()) {
    req.set_cache_salt(options.cache_salt);
  }
  if (!options.tenant.empty()) {
    req.set_tenant(options.tenant);
  }
  return req;
}

}  // namespace pd::client
