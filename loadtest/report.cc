#include "loadtest/report.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pd::loadtest {
namespace {

using nlohmann::ordered_json;

void AddStats(ordered_json& j, const char* metric, const LatencyStats& s) {
  j[absl::StrCat("mean_", metric, "_ms")] = s.mean;
  j[absl::StrCat("median_", metric, "_ms")] = s.median;
  j[absl::StrCat("p90_", metric, "_ms")] = s.p90;
  j[absl::StrCat("p95_", metric, "_ms")] = s.p95;
  j[absl::StrCat("p99_", metric, "_ms")] = s.p99;
  j[absl::StrCat("num_", metric, "_samples")] = s.count;
}

std::string CsvQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') {
      out += "\"\"";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Ms(int64_t ns) { return absl::StrFormat("%.3f", static_cast<double>(ns) / 1e6); }
std::string MsOrEmpty(double ms) { return ms < 0 ? "" : absl::StrFormat("%.3f", ms); }

std::string StatsRow(const char* name, const LatencyStats& s) {
  return absl::StrFormat("%-10s %10.2f %10.2f %10.2f %10.2f %10.2f %10d\n", name, s.mean, s.median,
                         s.p90, s.p95, s.p99, s.count);
}

ordered_json SummaryObject(const Summary& s, const RunInfo& info);

}  // namespace

std::string SummaryJson(const Summary& s, const RunInfo& info) {
  // Replace (not throw on) invalid UTF-8 in error messages and paths.
  return SummaryObject(s, info).dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

namespace {

ordered_json SummaryObject(const Summary& s, const RunInfo& info) {
  ordered_json j;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["cancelled"] = s.cancelled;
  j["num_requests"] = s.num_requests;
  j["interrupted"] = info.interrupted;
  j["duration"] = s.duration_s;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["short_outputs"] = s.short_outputs;
  j["request_throughput"] = s.request_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  if (s.slo.any()) {
    j["request_goodput"] = s.request_goodput;
    j["good_requests"] = s.good_requests;
  } else {
    j["request_goodput"] = nullptr;
    j["good_requests"] = nullptr;
  }
  AddStats(j, "ttft", s.ttft);
  AddStats(j, "tpot", s.tpot);
  AddStats(j, "itl", s.itl);
  AddStats(j, "e2el", s.e2el);
  ordered_json errors = ordered_json::object();
  for (const auto& [code, n] : s.errors) {
    errors[code] = n;
  }
  j["errors"] = errors;
  j["usage_prompt_tokens"] = s.usage_prompt_tokens;
  j["usage_cached_tokens"] = s.usage_cached_tokens;
  if (s.prefix_cache_hit_ratio.has_value()) {
    j["prefix_cache_hit_ratio"] = *s.prefix_cache_hit_ratio;
  } else {
    j["prefix_cache_hit_ratio"] = nullptr;
  }
  j["max_in_flight"] = info.max_in_flight;
  ordered_json c;
  c["target"] = info.target;
  c["model"] = info.model;
  c["workload"] = info.workload;
  c["arrival"] = info.arrival;
  c["concurrency"] = info.concurrency;
  c["request_rate"] = info.request_rate;
  c["burstiness"] = info.burstiness;
  c["seed"] = info.seed;
  c["num_requests"] = info.num_requests;
  c["duration_s"] = info.duration_bound_s;
  c["slo_ttft_ms"] = s.slo.ttft_ms.has_value() ? ordered_json(*s.slo.ttft_ms) : ordered_json();
  c["slo_tpot_ms"] = s.slo.tpot_ms.has_value() ? ordered_json(*s.slo.tpot_ms) : ordered_json();
  for (const auto& [key, value] : info.workload_options) {
    c[key] = value;
  }
  c["started_at"] = info.started_at;
  j["config"] = c;
  return j;
}

ordered_json OptionalNumber(const std::optional<double>& v) {
  return v.has_value() ? ordered_json(*v) : ordered_json();
}

std::string OptionalText(const std::optional<double>& v, const char* format) {
  return v.has_value() ? absl::StrFormat(format, *v) : std::string("-");
}

std::string Dump(const ordered_json& j) {
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace

std::vector<MetricRatio> CompareMetrics(const Summary& a, const Summary& b) {
  std::vector<MetricRatio> out;
  auto add = [&out](std::string name, std::optional<double> va, std::optional<double> vb,
                    bool higher_is_better) {
    MetricRatio m;
    m.name = std::move(name);
    m.a = va;
    m.b = vb;
    if (va.has_value() && vb.has_value() && *va != 0) {
      m.ratio = *vb / *va;
    }
    m.higher_is_better = higher_is_better;
    out.push_back(std::move(m));
  };
  add("request_throughput", a.request_throughput, b.request_throughput, true);
  add("output_throughput", a.output_throughput, b.output_throughput, true);
  add("total_token_throughput", a.total_token_throughput, b.total_token_throughput, true);
  if (a.slo.any()) {
    add("request_goodput", a.request_goodput, b.request_goodput, true);
  }
  for (auto [metric, sa, sb] :
       {std::tuple{"ttft", &a.ttft, &b.ttft}, std::tuple{"tpot", &a.tpot, &b.tpot},
        std::tuple{"itl", &a.itl, &b.itl}, std::tuple{"e2el", &a.e2el, &b.e2el}}) {
    const bool defined = sa->count > 0 && sb->count > 0;
    auto v = [defined](double x) { return defined ? std::optional<double>(x) : std::nullopt; };
    add(absl::StrCat("mean_", metric, "_ms"), v(sa->mean), v(sb->mean), false);
    add(absl::StrCat("median_", metric, "_ms"), v(sa->median), v(sb->median), false);
    add(absl::StrCat("p99_", metric, "_ms"), v(sa->p99), v(sb->p99), false);
  }
  add("prefix_cache_hit_ratio", a.prefix_cache_hit_ratio, b.prefix_cache_hit_ratio, true);
  add("completed", static_cast<double>(a.completed), static_cast<double>(b.completed), true);
  add("failed", static_cast<double>(a.failed), static_cast<double>(b.failed), false);
  return out;
}

std::string CompareJson(const LabeledSummary& a, const LabeledSummary& b) {
  ordered_json j;
  j["mode"] = "compare";
  j["a"] = SummaryObject(a.summary, a.info);
  j["b"] = SummaryObject(b.summary, b.info);
  ordered_json ratios = ordered_json::object();
  for (const MetricRatio& m : CompareMetrics(a.summary, b.summary)) {
    ratios[m.name] = OptionalNumber(m.ratio);
  }
  j["ratios"] = ratios;
  return Dump(j);
}

std::string CompareSweepJson(const std::vector<std::pair<LabeledSummary, LabeledSummary>>& pairs) {
  ordered_json j;
  j["mode"] = "compare_sweep";
  ordered_json rates = ordered_json::array();
  ordered_json a = ordered_json::array();
  ordered_json b = ordered_json::array();
  ordered_json ratios = ordered_json::array();
  for (const auto& [ra, rb] : pairs) {
    rates.push_back(ra.info.request_rate);
    a.push_back(SummaryObject(ra.summary, ra.info));
    b.push_back(SummaryObject(rb.summary, rb.info));
    ordered_json r = ordered_json::object();
    for (const MetricRatio& m : CompareMetrics(ra.summary, rb.summary)) {
      r[m.name] = OptionalNumber(m.ratio);
    }
    ratios.push_back(r);
  }
  j["request_rates"] = rates;
  j["a"] = a;
  j["b"] = b;
  j["ratios"] = ratios;
  return Dump(j);
}

std::string CompareTable(const LabeledSummary& a, const LabeledSummary& b) {
  std::string t = "============ pd-loadtest compare (B / A) ============\n";
  absl::StrAppendFormat(&t, "A = %s, B = %s (same requests, interleaved)\n", a.info.target,
                        b.info.target);
  absl::StrAppendFormat(&t, "%-26s %14s %14s %10s  %s\n", "metric", "A", "B", "B/A", "better");
  for (const MetricRatio& m : CompareMetrics(a.summary, b.summary)) {
    std::string better = "-";
    if (m.ratio.has_value() && *m.ratio != 1.0) {
      better = (*m.ratio > 1.0) == m.higher_is_better ? "B" : "A";
    }
    absl::StrAppendFormat(&t, "%-26s %14s %14s %10s  %s\n", m.name, OptionalText(m.a, "%.3f"),
                          OptionalText(m.b, "%.3f"), OptionalText(m.ratio, "%.3f"), better);
  }
  t += "=====================================================\n";
  return t;
}

std::string SweepJson(const std::vector<LabeledSummary>& runs) {
  ordered_json j;
  j["mode"] = "sweep";
  ordered_json rates = ordered_json::array();
  ordered_json list = ordered_json::array();
  for (const LabeledSummary& r : runs) {
    rates.push_back(r.info.request_rate);
    list.push_back(SummaryObject(r.summary, r.info));
  }
  j["request_rates"] = rates;
  j["runs"] = list;
  return Dump(j);
}

std::string SweepTable(const std::vector<LabeledSummary>& runs) {
  std::string t = "============ pd-loadtest sweep ============\n";
  absl::StrAppendFormat(&t, "%10s %12s %14s %12s %12s %12s %8s\n", "rate", "req/s", "output tok/s",
                        "goodput", "TTFT mean", "TTFT p99", "failed");
  for (const LabeledSummary& r : runs) {
    const Summary& s = r.summary;
    absl::StrAppendFormat(&t, "%10.2f %12.2f %14.1f %12s %12.2f %12.2f %8d%s\n",
                          r.info.request_rate, s.request_throughput, s.output_throughput,
                          s.slo.any() ? absl::StrFormat("%.2f", s.request_goodput) : "-",
                          s.ttft.mean, s.ttft.p99, s.failed,
                          r.info.interrupted ? " (interrupted)" : "");
  }
  t += "===========================================\n";
  return t;
}

std::string RecordsCsv(const std::vector<RequestRecord>& records) {
  std::string out =
      "index,source_line,scheduled_ms,start_ms,ttft_ms,tpot_ms,e2el_ms,input_tokens,max_tokens,"
      "output_tokens,prompt_tokens,cached_tokens,completion_tokens,finish_reason,status,error\n";
  for (const RequestRecord& r : records) {
    const std::string status =
        r.cancelled_by_client ? "CANCELLED_BY_CLIENT" : StatusCodeName(r.code);
    absl::StrAppend(&out, r.index, ",", r.source_line, ",", Ms(r.scheduled_ns), ",", Ms(r.start_ns),
                    ",", MsOrEmpty(r.TtftMs()), ",", MsOrEmpty(r.TpotMs()), ",",
                    Ms(r.end_ns - r.start_ns), ",", r.input_tokens, ",", r.max_tokens, ",",
                    r.output_tokens, ",");
    if (r.has_usage) {
      absl::StrAppend(&out, r.prompt_tokens, ",", r.cached_tokens, ",", r.completion_tokens, ",");
    } else {
      absl::StrAppend(&out, ",,,");
    }
    absl::StrAppend(&out, r.finish_reason, ",", status, ",",
                    r.error.empty() ? "" : CsvQuote(r.error), "\n");
  }
  return out;
}

std::string SummaryTable(const Summary& s, const RunInfo& info) {
  std::string t;
  absl::StrAppend(&t, "============ pd-loadtest ",
                  info.interrupted ? "(INTERRUPTED: partial) " : "", "============\n");
  absl::StrAppendFormat(&t, "target %s, model %s, workload %s, arrival %s\n", info.target,
                        info.model.empty() ? "(default)" : info.model, info.workload, info.arrival);
  absl::StrAppendFormat(&t, "%-34s %d\n", "Successful requests:", s.completed);
  absl::StrAppendFormat(&t, "%-34s %d\n", "Failed requests:", s.failed);
  for (const auto& [code, n] : s.errors) {
    absl::StrAppendFormat(&t, "  %-32s %d\n", code + ":", n);
  }
  if (s.cancelled > 0) {
    absl::StrAppendFormat(&t, "%-34s %d\n", "Cancelled (by pd-loadtest):", s.cancelled);
  }
  absl::StrAppendFormat(&t, "%-34s %.2f\n", "Benchmark duration (s):", s.duration_s);
  absl::StrAppendFormat(&t, "%-34s %d\n", "Total input tokens:", s.total_input_tokens);
  if (s.usage_prompt_tokens > 0 && s.usage_prompt_tokens != s.total_input_tokens) {
    // Text prompts (the chat endpoint): the server's tokenization and template decide.
    absl::StrAppendFormat(&t, "%-34s %d (server usage; %d sent as asked)\n",
                          "Total prompt tokens:", s.usage_prompt_tokens, s.total_input_tokens);
  }
  absl::StrAppendFormat(&t, "%-34s %d\n", "Total generated tokens:", s.total_output_tokens);
  if (s.short_outputs > 0) {
    absl::StrAppendFormat(&t, "%-34s %d (fewer tokens than requested)\n",
                          "Short outputs:", s.short_outputs);
  }
  absl::StrAppendFormat(&t, "%-34s %.2f\n", "Request throughput (req/s):", s.request_throughput);
  absl::StrAppendFormat(&t, "%-34s %.2f\n",
                        "Output token throughput (tok/s):", s.output_throughput);
  absl::StrAppendFormat(&t, "%-34s %.2f\n",
                        "Total token throughput (tok/s):", s.total_token_throughput);
  if (s.slo.any()) {
    std::string slo;
    if (s.slo.ttft_ms.has_value()) {
      absl::StrAppendFormat(&slo, "TTFT <= %g ms", *s.slo.ttft_ms);
    }
    if (s.slo.tpot_ms.has_value()) {
      absl::StrAppendFormat(&slo, "%sTPOT <= %g ms", slo.empty() ? "" : ", ", *s.slo.tpot_ms);
    }
    absl::StrAppendFormat(&t, "%-34s %.2f (%d requests; %s)\n",
                          "Request goodput (req/s):", s.request_goodput, s.good_requests, slo);
  }
  if (s.prefix_cache_hit_ratio.has_value()) {
    absl::StrAppendFormat(&t, "%-34s %.4f (%d / %d prompt tokens)\n",
                          "Prefix cache hit ratio:", *s.prefix_cache_hit_ratio,
                          s.usage_cached_tokens, s.usage_prompt_tokens);
  } else {
    absl::StrAppendFormat(&t, "%-34s n/a (no usage reported)\n", "Prefix cache hit ratio:");
  }
  absl::StrAppendFormat(&t, "%-34s %d\n", "Max requests in flight:", info.max_in_flight);
  absl::StrAppendFormat(&t, "%-10s %10s %10s %10s %10s %10s %10s\n", "(ms)", "mean", "median",
                        "p90", "p95", "p99", "samples");
  t += StatsRow("TTFT", s.ttft);
  t += StatsRow("TPOT", s.tpot);
  t += StatsRow("ITL", s.itl);
  t += StatsRow("E2EL", s.e2el);
  t += "==================================================\n";
  return t;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write '", path, "': ", err));
  }
  return absl::OkStatus();
}

}  // namespace pd::loadtest
