#include "loadtest/length_spec.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pd::loadtest {
namespace {

absl::Status Malformed(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "length spec '", text, "': ", why,
      " (expected N, fixed:N, uniform:A,B, normal:MEAN,SD or normal:MEAN,SD,MIN,MAX)"));
}

}  // namespace

LengthSpec LengthSpec::Fixed(int64_t n) {
  LengthSpec s;
  s.kind_ = Kind::kFixed;
  s.min_ = s.max_ = n;
  return s;
}

absl::StatusOr<LengthSpec> LengthSpec::Parse(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  absl::string_view kind = "fixed";
  absl::string_view args = trimmed;
  if (const size_t colon = trimmed.find(':'); colon != absl::string_view::npos) {
    kind = trimmed.substr(0, colon);
    args = trimmed.substr(colon + 1);
  }
  std::vector<double> v;
  for (absl::string_view part : absl::StrSplit(args, ',')) {
    double x = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &x) || !std::isfinite(x)) {
      return Malformed(text, absl::StrCat("'", part, "' is not a number"));
    }
    v.push_back(x);
  }
  auto is_int = [](double x) { return x == std::floor(x) && std::fabs(x) < 1e15; };
  LengthSpec s;
  if (kind == "fixed") {
    if (v.size() != 1 || !is_int(v[0]) || v[0] < 1) {
      return Malformed(text, "fixed length must be one integer >= 1");
    }
    return Fixed(static_cast<int64_t>(v[0]));
  }
  if (kind == "uniform") {
    if (v.size() != 2 || !is_int(v[0]) || !is_int(v[1]) || v[0] < 1 || v[0] > v[1]) {
      return Malformed(text, "uniform needs two integers 1 <= A <= B");
    }
    s.kind_ = Kind::kUniform;
    s.min_ = static_cast<int64_t>(v[0]);
    s.max_ = static_cast<int64_t>(v[1]);
    return s;
  }
  if (kind == "normal") {
    if (v.size() != 2 && v.size() != 4) {
      return Malformed(text, "normal needs MEAN,SD or MEAN,SD,MIN,MAX");
    }
    if (v[0] < 1 || v[1] < 0) {
      return Malformed(text, "normal needs MEAN >= 1 and SD >= 0");
    }
    s.kind_ = Kind::kNormal;
    s.mean_ = v[0];
    s.sd_ = v[1];
    s.min_ = 1;
    s.max_ = static_cast<int64_t>(std::llround(2 * v[0]));
    if (v.size() == 4) {
      if (!is_int(v[2]) || !is_int(v[3]) || v[2] < 1 || v[2] > v[3]) {
        return Malformed(text, "normal bounds need integers 1 <= MIN <= MAX");
      }
      s.min_ = static_cast<int64_t>(v[2]);
      s.max_ = static_cast<int64_t>(v[3]);
    }
    return s;
  }
  return Malformed(text, absl::StrCat("unknown kind '", kind, "'"));
}

int64_t LengthSpec::Sample(std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kFixed:
      return min_;
    case Kind::kUniform:
      return std::uniform_int_distribution<int64_t>(min_, max_)(rng);
    case Kind::kNormal: {
      if (sd_ == 0) {
        return std::clamp<int64_t>(std::llround(mean_), min_, max_);
      }
      const double x = std::normal_distribution<double>(mean_, sd_)(rng);
      return std::clamp<int64_t>(std::llround(x), min_, max_);
    }
  }
  return min_;
}

std::string LengthSpec::ToString() const {
  switch (kind_) {
    case Kind::kFixed:
      return absl::StrCat(min_);
    case Kind::kUniform:
      return absl::StrCat("uniform:", min_, ",", max_);
    case Kind::kNormal:
      return absl::StrCat("normal:", mean_, ",", sd_, ",", min_, ",", max_);
  }
  return "";
}

}  // namespace pd::loadtest
