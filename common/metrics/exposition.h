// The data model of one scrape and its Prometheus text rendering (format 0.0.4).
//
// A scrape is a list of FamilySnapshot values: plain data, produced by Registry::Collect() from
// the registered families and the collectors, and turned into text by RenderPrometheusText().
// Keeping the two apart lets tests and other exporters read values without parsing text.
// Everything here is a value type or a pure function: thread-compatible, no shared state.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pd::metrics {

// The Prometheus metric types we expose (no summaries: histograms aggregate across replicas).
enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge" or "histogram", as written on a `# TYPE` line.
absl::string_view MetricTypeName(MetricType type);

// Label name/value pairs of one sample, in the order they are rendered.
using LabelPairs = std::vector<std::pair<std::string, std::string>>;

// One exposition line: `<family name><suffix>{labels} value`.
struct Sample {
  // Appended to the family name: "" for counters and gauges; "_bucket", "_sum" or "_count" for
  // histograms.
  std::string suffix;
  // For histogram buckets the last pair is ("le", upper bound).
  LabelPairs labels;
  double value = 0;
};

// A metric family at one instant: everything rendered under one `# HELP` / `# TYPE` header.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<Sample> samples;
};

// Renders `families` in the given order (Registry::Collect() already sorts them by name).
// Escapes HELP text (`\\`, `\n`) and label values (`\\`, `\"`, `\n`); values use FormatValue().
std::string RenderPrometheusText(absl::Span<const FamilySnapshot> families);

// Formats a sample value so that it parses back to the same double: integers below 2^53 as
// plain digits ("42"), other finite values as the shortest round-trip form ("0.1", "1e-07"),
// and "+Inf", "-Inf", "NaN" for the rest.
std::string FormatValue(double value);

// Escaping used in the text format. EscapeHelp: `\` -> `\\`, newline -> `\n`.
// EscapeLabelValue additionally escapes `"` as `\"`.
std::string EscapeHelp(absl::string_view help);
std::string EscapeLabelValue(absl::string_view value);

// Name rules. A metric name matches [a-zA-Z_:][a-zA-Z0-9_:]* and, for our metrics, starts with
// "pd_"; a counter's name also ends in "_total" (docs/development.md, "Logging and metrics"). A
// label name matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__" (reserved by Prometheus);
// "le" is also reserved on histograms. Errors are InvalidArgument and name the offending metric.
absl::Status ValidateMetricName(absl::string_view name, MetricType type);
absl::Status ValidateLabelNames(absl::string_view metric_name, MetricType type,
                                absl::Span<const std::string> label_names);

// The sample names a family of `type` called `name` writes: {name} for counters and gauges,
// {name_bucket, name_sum, name_count} for histograms. Two families collide when one's name or
// sample names meet the other's.
std::vector<std::string> SampleNames(absl::string_view name, MetricType type);

}  // namespace pd::metrics
