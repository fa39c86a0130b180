#include "common/metrics/metrics.h"

#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- A small parser for the text exposition format 0.0.4, independent of the renderer ---------

using LabelMap = std::map<std::string, std::string>;
using SeriesKey = std::pair<std::string, LabelMap>;  // sample name, labels

struct ParsedFamily {
  std::string help;
  std::string type;
};

struct Exposition {
  std::map<std::string, ParsedFamily> families;
  std::vector<std::string> family_order;  // as declared by # TYPE lines
  std::map<SeriesKey, double> samples;
  std::vector<SeriesKey> sample_order;

  double Value(const std::string& name, const LabelMap& labels = {}) const {
    auto it = samples.find({name, labels});
    EXPECT_NE(it, samples.end()) << "no sample " << name;
    return it == samples.end() ? std::nan("") : it->second;
  }
  bool Has(const std::string& name, const LabelMap& labels = {}) const {
    return samples.count({name, labels}) > 0;
  }
};

bool IsMetricNameChar(char c, bool first) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
         (!first && std::isdigit(static_cast<unsigned char>(c)));
}

absl::StatusOr<double> ParseValue(absl::string_view text) {
  if (text == "+Inf") {
    return std::numeric_limits<double>::infinity();
  }
  if (text == "-Inf") {
    return -std::numeric_limits<double>::infinity();
  }
  if (text == "NaN") {
    return std::nan("");
  }
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return absl::InvalidArgumentError(absl::StrCat("bad value \"", text, "\""));
  }
  return value;
}

// Reads `"..."` at text[*pos] with the escapes \\, \" and \n; leaves *pos after the quote.
absl::StatusOr<std::string> ParseQuoted(absl::string_view text, size_t* pos) {
  if (*pos >= text.size() || text[*pos] != '"') {
    return absl::InvalidArgumentError("expected '\"'");
  }
  std::string out;
  for (size_t i = *pos + 1; i < text.size(); ++i) {
    char c = text[i];
    if (c == '"') {
      *pos = i + 1;
      return out;
    }
    if (c == '\n') {
      return absl::InvalidArgumentError("raw newline in label value");
    }
    if (c == '\\') {
      if (++i >= text.size()) {
        break;
      }
      switch (text[i]) {
        case '\\':
          out.push_back('\\');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'n':
          out.push_back('\n');
          break;
        default:
          return absl::InvalidArgumentError("bad escape in label value");
      }
      continue;
    }
    out.push_back(c);
  }
  return absl::InvalidArgumentError("unterminated label value");
}

std::string UnescapeHelp(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '\\' || text[i + 1] == 'n')) {
      out.push_back(text[i + 1] == 'n' ? '\n' : '\\');
      ++i;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// The family a sample belongs to: itself, or a histogram's name without _bucket/_sum/_count.
std::string FamilyOf(const Exposition& e, const std::string& sample_name) {
  if (e.families.count(sample_name) > 0) {
    return sample_name;
  }
  for (absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (absl::EndsWith(sample_name, suffix)) {
      std::string base = sample_name.substr(0, sample_name.size() - suffix.size());
      auto it = e.families.find(base);
      if (it != e.families.end() && it->second.type == "histogram") {
        return base;
      }
    }
  }
  return "";
}

absl::Status ParseSampleLine(absl::string_view line, Exposition& e) {
  size_t pos = 0;
  while (pos < line.size() && IsMetricNameChar(line[pos], pos == 0)) {
    ++pos;
  }
  if (pos == 0) {
    return absl::InvalidArgumentError(absl::StrCat("no metric name in \"", line, "\""));
  }
  std::string name(line.substr(0, pos));
  LabelMap labels;
  if (pos < line.size() && line[pos] == '{') {
    ++pos;
    while (pos < line.size() && line[pos] != '}') {
      size_t start = pos;
      while (pos < line.size() && line[pos] != '=') {
        ++pos;
      }
      std::string label(line.substr(start, pos - start));
      ++pos;  // '='
      auto value = ParseQuoted(line, &pos);
      if (!value.ok()) {
        return value.status();
      }
      if (!labels.emplace(label, *value).second) {
        return absl::InvalidArgumentError(absl::StrCat("repeated label ", label));
      }
      if (pos < line.size() && line[pos] == ',') {
        ++pos;
      }
    }
    if (pos >= line.size()) {
      return absl::InvalidArgumentError("unterminated label set");
    }
    ++pos;  // '}'
  }
  if (pos >= line.size() || line[pos] != ' ') {
    return absl::InvalidArgumentError(absl::StrCat("no space before value in \"", line, "\""));
  }
  std::vector<absl::string_view> rest = absl::StrSplit(line.substr(pos + 1), ' ');
  auto value = ParseValue(rest[0]);  // rest[1], if any, is a timestamp
  if (!value.ok()) {
    return value.status();
  }
  if (FamilyOf(e, name).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sample ", name, " has no # TYPE"));
  }
  SeriesKey key{name, labels};
  if (!e.samples.emplace(key, *value).second) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate series ", name));
  }
  e.sample_order.push_back(std::move(key));
  return absl::OkStatus();
}

absl::StatusOr<Exposition> ParseExposition(absl::string_view text) {
  Exposition e;
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("exposition does not end with a newline");
  }
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  lines.pop_back();  // after the final newline
  for (absl::string_view line : lines) {
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE ")) {
      std::vector<absl::string_view> parts =
          absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      if (parts.size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("bad line \"", line, "\""));
      }
      ParsedFamily& family = e.families[std::string(parts[0])];
      if (line[2] == 'H') {
        family.help = UnescapeHelp(parts[1]);
      } else {
        family.type = std::string(parts[1]);
        e.family_order.emplace_back(parts[0]);
      }
    } else if (line.empty() || line[0] == '#') {
      continue;
    } else {
      absl::Status status = ParseSampleLine(line, e);
      if (!status.ok()) {
        return status;
      }
    }
  }
  return e;
}

Exposition Render(const Registry& registry) {
  std::string text = registry.RenderPrometheus();
  absl::StatusOr<Exposition> parsed = ParseExposition(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  return parsed.ok() ? *std::move(parsed) : Exposition();
}

// ---- Tests ------------------------------------------------------------------------------------

TEST(MetricsTest, CountersAndGaugesRoundTripExactly) {
  Registry registry;
  auto requests = registry.AddCounter("pd_test_requests_total", "Requests.", {"method", "code"});
  ASSERT_TRUE(requests.ok()) << requests.status();
  auto bytes = registry.AddCounter("pd_test_transfer_bytes_total", "Bytes sent.");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto temp = registry.AddGauge("pd_test_temperature", "A gauge.", {"where"});
  ASSERT_TRUE(temp.ok()) << temp.status();

  (*requests)->WithLabels({"get", "200"}).Increment(41);
  (*requests)->WithLabels({"get", "200"}).Increment();
  (*requests)->WithLabels({"put", "500"}).Increment();
  Counter& seconds = (*bytes)->WithLabels({});
  seconds.Add(0.1);
  seconds.Add(0.2);
  seconds.Increment(uint64_t{1} << 40);
  const double expected_bytes = static_cast<double>(uint64_t{1} << 40) + (0.1 + 0.2);

  const double tiny = std::numeric_limits<double>::denorm_min();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> gauge_values = {-1.5e-7, 1e300, 0.30000000000000004, tiny, -42, inf};
  for (size_t i = 0; i < gauge_values.size(); ++i) {
    (*temp)->WithLabels({absl::StrCat("g", i)}).Set(gauge_values[i]);
  }
  (*temp)->WithLabels({"nan"}).Set(std::nan(""));
  (*temp)->WithLabels({"added"}).Set(10);
  (*temp)->WithLabels({"added"}).Add(-12.5);

  Exposition e = Render(registry);
  EXPECT_EQ(e.families["pd_test_requests_total"].type, "counter");
  EXPECT_EQ(e.families["pd_test_requests_total"].help, "Requests.");
  EXPECT_EQ(e.families["pd_test_temperature"].type, "gauge");
  EXPECT_EQ(e.Value("pd_test_requests_total", {{"method", "get"}, {"code", "200"}}), 42);
  EXPECT_EQ(e.Value("pd_test_requests_total", {{"method", "put"}, {"code", "500"}}), 1);
  EXPECT_EQ(e.Value("pd_test_transfer_bytes_total"), expected_bytes);
  EXPECT_EQ(seconds.Value(), expected_bytes);
  for (size_t i = 0; i < gauge_values.size(); ++i) {
    EXPECT_EQ(e.Value("pd_test_temperature", {{"where", absl::StrCat("g", i)}}), gauge_values[i]);
  }
  EXPECT_TRUE(std::isnan(e.Value("pd_test_temperature", {{"where", "nan"}})));
  EXPECT_EQ(e.Value("pd_test_temperature", {{"where", "added"}}), -2.5);
}

TEST(MetricsTest, FormatValueRoundTripsRandomDoubles) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> bits;
  for (int i = 0; i < 10000; ++i) {
    uint64_t b = bits(rng);
    double value;
    std::memcpy(&value, &b, sizeof(value));
    if (std::isnan(value)) {
      continue;
    }
    std::string text = FormatValue(value);
    auto parsed = ParseValue(text);
    ASSERT_TRUE(parsed.ok()) << text;
    EXPECT_EQ(*parsed, value) << text;
  }
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(MetricsTest, LabellessFamilyRendersZeroBeforeFirstUpdate) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("pd_test_events_total", "Events.").ok());
  ASSERT_TRUE(registry.AddGauge("pd_test_level", "Level.").ok());
  Exposition e = Render(registry);
  EXPECT_EQ(e.Value("pd_test_events_total"), 0);
  EXPECT_EQ(e.Value("pd_test_level"), 0);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeAndInfEqualsCount) {
  Registry registry;
  auto latency = registry.AddHistogram("pd_test_latency_seconds", "Latency.", {"op"}, {0.1, 1, 10});
  ASSERT_TRUE(latency.ok()) << latency.status();
  Histogram& read = (*latency)->WithLabels({"read"});
  const std::vector<double> observed = {0.05, 0.1, 0.5, 1, 2, 20, 1000, 0.099};
  double sum = 0;
  for (double v : observed) {
    read.Observe(v);
    sum += v;
  }
  (*latency)->WithLabels({"write"});  // a child with no observations

  Exposition e = Render(registry);
  EXPECT_EQ(e.families["pd_test_latency_seconds"].type, "histogram");
  auto bucket = [&](const std::string& op, const std::string& le) {
    return e.Value("pd_test_latency_seconds_bucket", {{"op", op}, {"le", le}});
  };
  // le is inclusive: 0.1 and 1 fall in their own buckets.
  EXPECT_EQ(bucket("read", "0.1"), 3);
  EXPECT_EQ(bucket("read", "1"), 5);
  EXPECT_EQ(bucket("read", "10"), 6);
  EXPECT_EQ(bucket("read", "+Inf"), 8);
  EXPECT_EQ(e.Value("pd_test_latency_seconds_count", {{"op", "read"}}), 8);
  EXPECT_EQ(e.Value("pd_test_latency_seconds_sum", {{"op", "read"}}), sum);
  EXPECT_EQ(bucket("write", "+Inf"), 0);
  EXPECT_EQ(e.Value("pd_test_latency_seconds_count", {{"op", "write"}}), 0);

  // Cumulative and +Inf == _count for every child, checked generically.
  for (const std::string op : {"read", "write"}) {
    double previous = 0;
    for (const std::string le : {"0.1", "1", "10", "+Inf"}) {
      EXPECT_GE(bucket(op, le), previous);
      previous = bucket(op, le);
    }
    EXPECT_EQ(previous, e.Value("pd_test_latency_seconds_count", {{"op", op}}));
  }

  Histogram::Snapshot snapshot = read.GetSnapshot();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(3, 5, 6, 8));
  EXPECT_EQ(snapshot.count, 8u);
}

TEST(MetricsTest, HistogramNanGoesToInfBucket) {
  Registry registry;
  auto h = registry.AddHistogram("pd_test_nan_seconds", "NaN.", {}, {1});
  ASSERT_TRUE(h.ok());
  (*h)->WithLabels({}).Observe(std::nan(""));
  Histogram::Snapshot snapshot = (*h)->WithLabels({}).GetSnapshot();
  EXPECT_THAT(snapshot.cumulative_counts, ElementsAre(0, 1));
  EXPECT_TRUE(std::isnan(snapshot.sum));
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_THAT(ExponentialBuckets(1, 2, 4), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(LinearBuckets(0.5, 1, 3), ElementsAre(0.5, 1.5, 2.5));
  const std::vector<double>& defaults = DefaultLatencyBucketsSeconds();
  ASSERT_FALSE(defaults.empty());
  EXPECT_EQ(defaults.front(), 0.001);
  EXPECT_EQ(defaults.back(), 60);
  for (size_t i = 1; i < defaults.size(); ++i) {
    EXPECT_LT(defaults[i - 1], defaults[i]);
  }

  Registry registry;
  auto with_inf = registry.AddHistogram("pd_test_inf_seconds", "x", {},
                                        {1, 2, std::numeric_limits<double>::infinity()});
  ASSERT_TRUE(with_inf.ok()) << with_inf.status();
  EXPECT_THAT((*with_inf)->upper_bounds(), ElementsAre(1, 2));
  auto decreasing = registry.AddHistogram("pd_test_bad_seconds", "x", {}, {1, 1});
  EXPECT_EQ(decreasing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decreasing.status().message(), HasSubstr("pd_test_bad_seconds"));
  auto nan_bound = registry.AddHistogram("pd_test_nan_bound_seconds", "x", {}, {std::nan("")});
  EXPECT_EQ(nan_bound.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MetricsTest, EscapingRoundTrips) {
  Registry registry;
  const std::string help = "Help with \\ backslash\nand a newline and \"quotes\".";
  auto family = registry.AddGauge("pd_test_escape", help, {"path"});
  ASSERT_TRUE(family.ok()) << family.status();
  const std::string nasty = "a\"b\\c\nd\\n{},=";
  (*family)->WithLabels({nasty}).Set(1);
  (*family)->WithLabels({""}).Set(2);

  std::string text = registry.RenderPrometheus();
  EXPECT_THAT(text, HasSubstr(R"(pd_test_escape{path="a\"b\\c\nd\\n{},="} 1)"));
  EXPECT_THAT(text, HasSubstr(R"(# HELP pd_test_escape Help with \\ backslash\nand a newline)"));
  Exposition e = Render(registry);
  EXPECT_EQ(e.families["pd_test_escape"].help, help);
  EXPECT_EQ(e.Value("pd_test_escape", {{"path", nasty}}), 1);
  EXPECT_EQ(e.Value("pd_test_escape", {{"path", ""}}), 2);
}

TEST(MetricsTest, InvalidNamesAreRejectedNamingTheMetric) {
  Registry registry;
  struct Case {
    std::string name;
    std::vector<std::string> labels;
    std::string why;
  };
  const std::vector<Case> counter_cases = {
      {"pd_bad-name_total", {}, "invalid name"},
      {"1pd_x_total", {}, "invalid name"},
      {"", {}, "invalid name"},
      {"other_requests_total", {}, "pd_"},
      {"pd_requests", {}, "_total"},
      {"pd_ok_total", {"__reserved"}, "reserved"},
      {"pd_ok2_total", {"bad-label"}, "invalid label name"},
      {"pd_ok3_total", {"a:b"}, "invalid label name"},
      {"pd_ok4_total", {"9x"}, "invalid label name"},
      {"pd_ok5_total", {"code", "code"}, "duplicate label"},
  };
  for (const Case& c : counter_cases) {
    auto result = registry.AddCounter(c.name, "help", c.labels);
    ASSERT_FALSE(result.ok()) << c.name;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat("\"", c.name, "\"")));
    EXPECT_THAT(result.status().message(), HasSubstr(c.why)) << result.status();
  }
  auto le = registry.AddHistogram("pd_test_le_seconds", "help", {"le"}, {1});
  EXPECT_EQ(le.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(le.status().message(), HasSubstr("pd_test_le_seconds"));
  // Colons are allowed in metric names; "le" is fine on non-histograms.
  EXPECT_TRUE(registry.AddGauge("pd_test:recorded", "help", {"le"}).ok());
  // Nothing invalid got registered.
  Exposition e = Render(registry);
  EXPECT_THAT(e.family_order, ElementsAre("pd_test:recorded"));
}

TEST(MetricsTest, ReRegistrationReturnsSameFamilyOrConflicts) {
  Registry registry;
  auto first = registry.AddCounter("pd_test_ops_total", "Ops.", {"op"});
  ASSERT_TRUE(first.ok());
  auto again = registry.AddCounter("pd_test_ops_total", "Ops.", {"op"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first, *again);

  auto as_gauge = registry.AddGauge("pd_test_ops_total", "Ops.", {"op"});
  EXPECT_EQ(as_gauge.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(as_gauge.status().message(), HasSubstr("pd_test_ops_total"));
  EXPECT_THAT(as_gauge.status().message(), HasSubstr("counter"));

  auto other_labels = registry.AddCounter("pd_test_ops_total", "Ops.", {"op", "code"});
  EXPECT_EQ(other_labels.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other_labels.status().message(), HasSubstr("pd_test_ops_total"));

  auto other_help = registry.AddCounter("pd_test_ops_total", "Different.", {"op"});
  EXPECT_EQ(other_help.status().code(), absl::StatusCode::kAlreadyExists);

  auto h = registry.AddHistogram("pd_test_wait_seconds", "Wait.", {}, {1, 2});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(registry.AddHistogram("pd_test_wait_seconds", "Wait.", {}, {1, 2}).ok());
  auto other_buckets = registry.AddHistogram("pd_test_wait_seconds", "Wait.", {}, {1, 3});
  EXPECT_EQ(other_buckets.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other_buckets.status().message(), HasSubstr("pd_test_wait_seconds"));

  // A gauge named like a histogram's sample collides, in either order.
  auto count_gauge = registry.AddGauge("pd_test_wait_seconds_count", "x");
  EXPECT_EQ(count_gauge.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(count_gauge.status().message(), HasSubstr("pd_test_wait_seconds_count"));
  ASSERT_TRUE(registry.AddGauge("pd_test_size_bucket", "x").ok());
  auto size_histogram = registry.AddHistogram("pd_test_size", "x", {}, {1});
  EXPECT_EQ(size_histogram.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(size_histogram.status().message(), HasSubstr("pd_test_size_bucket"));
}

TEST(MetricsTest, FamiliesSortedByNameAndChildrenStable) {
  Registry registry;
  auto b = registry.AddGauge("pd_test_b", "b", {"k"});
  auto a = registry.AddCounter("pd_test_a_total", "a");
  ASSERT_TRUE(a.ok() && b.ok());
  (*b)->WithLabels({"z"}).Set(1);
  (*b)->WithLabels({"a"}).Set(2);
  (*b)->WithLabels({"m"}).Set(3);
  Exposition e = Render(registry);
  EXPECT_THAT(e.family_order, ElementsAre("pd_test_a_total", "pd_test_b"));
  ASSERT_EQ(e.sample_order.size(), 4u);
  EXPECT_EQ(e.sample_order[1].second.at("k"), "a");
  EXPECT_EQ(e.sample_order[2].second.at("k"), "m");
  EXPECT_EQ(e.sample_order[3].second.at("k"), "z");
  EXPECT_EQ(registry.RenderPrometheus(), registry.RenderPrometheus());
}

TEST(MetricsTest, WithLabelsReturnsStableReferences) {
  Registry registry;
  auto family = registry.AddCounter("pd_test_stable_total", "x", {"k"});
  ASSERT_TRUE(family.ok());
  Counter* first = &(*family)->WithLabels({"v"});
  for (int i = 0; i < 100; ++i) {
    (*family)->WithLabels({absl::StrCat("other", i)});
  }
  EXPECT_EQ(first, &(*family)->WithLabels({std::string("v")}));
}

TEST(MetricsDeathTest, WrongLabelCountChecks) {
  Registry registry;
  auto family = registry.AddCounter("pd_test_labels_total", "x", {"a", "b"});
  ASSERT_TRUE(family.ok());
  EXPECT_DEATH((*family)->WithLabels({"only_one"}), "pd_test_labels_total");
}

TEST(MetricsTest, ConcurrentUpdatesSumExactly) {
  Registry registry;
  auto counters = registry.AddCounter("pd_test_hits_total", "x", {"k"});
  auto gauges = registry.AddGauge("pd_test_inflight", "x");
  auto histograms = registry.AddHistogram("pd_test_op_seconds", "x", {"k"}, {0.5});
  ASSERT_TRUE(counters.ok() && gauges.ok() && histograms.ok());
  constexpr int kThreads = 4;
  constexpr int kIterations = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      // Every thread looks the children up itself: creation races are part of the test.
      Counter& ints = (*counters)->WithLabels({"int"});
      Counter& doubles = (*counters)->WithLabels({"double"});
      Gauge& gauge = (*gauges)->WithLabels({});
      Histogram& histogram = (*histograms)->WithLabels({"h"});
      for (int i = 0; i < kIterations; ++i) {
        ints.Increment();
        doubles.Add(0.5);  // exact in binary: the total must be exact too
        gauge.Add(i % 2 == 0 ? 2 : -1);
        histogram.Observe(i % 2 == 0 ? 0.25 : 1.0);
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  Exposition e = Render(registry);
  constexpr double kTotal = static_cast<double>(kThreads) * kIterations;
  EXPECT_EQ(e.Value("pd_test_hits_total", {{"k", "int"}}), kTotal);
  EXPECT_EQ(e.Value("pd_test_hits_total", {{"k", "double"}}), kTotal * 0.5);
  EXPECT_EQ(e.Value("pd_test_inflight"), kTotal / 2);
  EXPECT_EQ(e.Value("pd_test_op_seconds_bucket", {{"k", "h"}, {"le", "0.5"}}), kTotal / 2);
  EXPECT_EQ(e.Value("pd_test_op_seconds_count", {{"k", "h"}}), kTotal);
  EXPECT_EQ(e.Value("pd_test_op_seconds_sum", {{"k", "h"}}), kTotal / 2 * 1.25);
}

TEST(MetricsTest, CollectorsRunAtRenderTime) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("pd_test_registered", "Registered.").ok());
  int free_blocks = 10;
  int runs = 0;
  CollectorId id = registry.AddCollector([&](CollectorSink& sink) {
    ++runs;
    sink.AddGauge("pd_test_kv_blocks", "KV blocks by state.", free_blocks, {{"state", "free"}});
    sink.AddGauge("pd_test_kv_blocks", "KV blocks by state.", 100 - free_blocks,
                  {{"state", "used"}});
    sink.AddCounter("pd_test_evictions_total", "Evictions.", 7);
  });
  EXPECT_EQ(runs, 0);

  Exposition e = Render(registry);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(e.families["pd_test_kv_blocks"].type, "gauge");
  EXPECT_EQ(e.families["pd_test_evictions_total"].type, "counter");
  EXPECT_EQ(e.Value("pd_test_kv_blocks", {{"state", "free"}}), 10);
  EXPECT_EQ(e.Value("pd_test_kv_blocks", {{"state", "used"}}), 90);
  EXPECT_THAT(e.family_order,
              ElementsAre("pd_test_evictions_total", "pd_test_kv_blocks", "pd_test_registered"));

  free_blocks = 3;
  e = Render(registry);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(e.Value("pd_test_kv_blocks", {{"state", "free"}}), 3);

  registry.RemoveCollector(id);
  e = Render(registry);
  EXPECT_EQ(runs, 2);
  EXPECT_FALSE(e.Has("pd_test_kv_blocks", {{"state", "free"}}));
}

TEST(MetricsTest, CollectorSamplesThatWouldBreakTheExpositionAreDropped) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("pd_test_taken", "Registered.").ok());
  registry.AddCollector([](CollectorSink& sink) {
    sink.AddGauge("pd_test_taken", "Collides with a registered family.", 1);
    sink.AddGauge("bad name", "Invalid.", 1);
    sink.AddCounter("pd_test_no_suffix", "Counter without _total.", 1);
    sink.AddGauge("pd_test_shared", "Shared.", 1, {{"from", "one"}});
    sink.AddGauge("pd_test_labels", "Bad label.", 1, {{"__x", "v"}});
    sink.AddGauge("pd_test_labels", "Bad label.", 2, {{"ok", "v"}});
    sink.AddGauge("pd_test_dup", "Duplicate series.", 1, {{"k", "v"}});
    sink.AddGauge("pd_test_dup", "Duplicate series.", 2, {{"k", "v"}});
  });
  registry.AddCollector([](CollectorSink& sink) {
    sink.AddGauge("pd_test_shared", "Shared.", 2, {{"from", "two"}});  // merges
    sink.AddCounter("pd_test_shared", "Wrong type.", 3);               // dropped in the sink
  });
  Exposition e = Render(registry);  // also checks the whole output parses, without duplicates
  EXPECT_EQ(e.Value("pd_test_taken"), 0);
  EXPECT_EQ(e.families["pd_test_taken"].help, "Registered.");
  EXPECT_EQ(e.families.count("pd_test_no_suffix"), 0u);
  EXPECT_EQ(e.Value("pd_test_shared", {{"from", "one"}}), 1);
  EXPECT_EQ(e.Value("pd_test_shared", {{"from", "two"}}), 2);
  EXPECT_EQ(e.Value("pd_test_labels", {{"ok", "v"}}), 2);
  EXPECT_FALSE(e.Has("pd_test_labels", {{"__x", "v"}}));
  EXPECT_EQ(e.Value("pd_test_dup", {{"k", "v"}}), 1);
}

TEST(MetricsTest, CollectorMayRegisterMetrics) {
  Registry registry;
  registry.AddCollector([&registry](CollectorSink& sink) {
    auto family = registry.AddCounter("pd_test_lazy_total", "Registered by a collector.");
    ASSERT_TRUE(family.ok());
    (*family)->WithLabels({}).Increment();
    sink.AddGauge("pd_test_from_collector", "x", 1);
  });
  Exposition e = Render(registry);
  EXPECT_EQ(e.Value("pd_test_lazy_total"), 1);
  EXPECT_EQ(e.Value("pd_test_from_collector"), 1);
}

TEST(MetricsTest, CollectConcurrentWithUpdatesAndRegistration) {
  Registry registry;
  auto counter = registry.AddCounter("pd_test_race_total", "x", {"k"});
  ASSERT_TRUE(counter.ok());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 2000; ++i) {
      (*counter)->WithLabels({absl::StrCat("k", i % 50)}).Increment();
      ASSERT_TRUE(registry.AddGauge(absl::StrCat("pd_test_race_", i % 20), "x").ok());
    }
    done = true;
  });
  int renders = 0;
  while (!done || renders == 0) {
    ASSERT_TRUE(ParseExposition(registry.RenderPrometheus()).ok());
    ++renders;
  }
  writer.join();
  Exposition e = Render(registry);
  double total = 0;
  for (int i = 0; i < 50; ++i) {
    total += e.Value("pd_test_race_total", {{"k", absl::StrCat("k", i)}});
  }
  EXPECT_EQ(total, 2000);
}

}  // namespace
}  // namespace pd::metrics
