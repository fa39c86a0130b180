#include "common/metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pd::metrics {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         (allow_colon && c == ':');
}

bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || absl::ascii_isdigit(static_cast<unsigned char>(c));
}

bool MatchesNameSyntax(absl::string_view name, bool allow_colon) {
  if (name.empty() || !IsNameStart(name[0], allow_colon)) {
    return false;
  }
  for (char c : name.substr(1)) {
    if (!IsNameChar(c, allow_colon)) {
      return false;
    }
  }
  return true;
}

void AppendLabels(const LabelPairs& labels, std::string* out) {
  if (labels.empty()) {
    return;
  }
  out->push_back('{');
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) {
      out->push_back(',');
    }
    absl::StrAppend(out, labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
  }
  out->push_back('}');
}

}  // namespace

absl::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string FormatValue(double value) {
  if (std::isnan(value)) {
    return "NaN";
  }
  if (std::isinf(value)) {
    return value > 0 ? "+Inf" : "-Inf";
  }
  // Integral values below 2^53 are exact as int64: print them as plain digits rather than the
  // shortest form ("1e+06"), which is harder to read for counts.
  constexpr double kExactIntegerLimit = 9007199254740992.0;  // 2^53
  if (std::trunc(value) == value && std::fabs(value) < kExactIntegerLimit) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // std::to_chars without a format is the shortest string that round-trips to `value`.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) {
    return "NaN";  // Unreachable: 64 bytes hold any double.
  }
  return std::string(buf, end);
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string RenderPrometheusText(absl::Span<const FamilySnapshot> families) {
  std::string out;
  for (const FamilySnapshot& family : families) {
    absl::StrAppend(&out, "# HELP ", family.name, " ", EscapeHelp(family.help), "\n");
    absl::StrAppend(&out, "# TYPE ", family.name, " ", MetricTypeName(family.type), "\n");
    for (const Sample& sample : family.samples) {
      absl::StrAppend(&out, family.name, sample.suffix);
      AppendLabels(sample.labels, &out);
      absl::StrAppend(&out, " ", FormatValue(sample.value), "\n");
    }
  }
  return out;
}

absl::Status ValidateMetricName(absl::string_view name, MetricType type) {
  if (!MatchesNameSyntax(name, /*allow_colon=*/true)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", name, "\": invalid name, want [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  if (!absl::StartsWith(name, "pd_")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", name, "\": name must start with \"pd_\""));
  }
  if (type == MetricType::kCounter && !absl::EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric \"", name, "\": counter name must end with \"_total\""));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelNames(absl::string_view metric_name, MetricType type,
                                absl::Span<const std::string> label_names) {
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!MatchesNameSyntax(label, /*allow_colon=*/false)) {
      return absl::InvalidArgumentError(absl::StrCat("metric \"", metric_name,
                                                     "\": invalid label name \"", label,
                                                     "\", want [a-zA-Z_][a-zA-Z0-9_]*"));
    }
    if (absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(absl::StrCat("metric \"", metric_name, "\": label name \"",
                                                     label, "\" is reserved (starts with __)"));
    }
    if (type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric \"", metric_name, "\": label name \"le\" is reserved on histograms"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[j] == label) {
        return absl::InvalidArgumentError(
            absl::StrCat("metric \"", metric_name, "\": duplicate label name \"", label, "\""));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SampleNames(absl::string_view name, MetricType type) {
  if (type == MetricType::kHistogram) {
    return {absl::StrCat(name, "_bucket"), absl::StrCat(name, "_sum"),
            absl::StrCat(name, "_count")};
  }
  return {std::string(name)};
}

}  // namespace pd::metrics
