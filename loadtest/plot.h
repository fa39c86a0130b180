// Plots of pd-loadtest runs, drawn by gnuplot (Debian's gnuplot-nox). pd-loadtest writes a
// gnuplot script and its data files (plain text, one point per line, columns named in a header
// comment) into the output directory, then runs gnuplot on the script there when it is
// installed; without gnuplot the scripts and data stay, to be rendered elsewhere with
// `cd DIR && gnuplot latency_cdf.gp`.
//
//   latency_cdf.gp -> latency_cdf.png   four panels (TTFT, TPOT, ITL, E2EL): the empirical CDF of
//                                       each metric (ms), one line per run (a single run, A and
//                                       B of a comparison, or each rate of a sweep).
//                     data: cdf_<stem>_<metric>.dat, columns latency_ms, cumulative_fraction.
//   throughput.gp  -> throughput.png    (sweeps) request throughput and goodput, output token
//                                       throughput and TTFT (mean, p99) versus the offered rate,
//                                       one set of lines per series (one target, or A and B of
//                                       a compared sweep).
//                     data: throughput.dat (one series) or throughput_<stem>.dat per series,
//                     columns request_rate, request_throughput, output_throughput,
//                     request_goodput (NaN without an SLO), mean_ttft_ms, p99_ttft_ms.
//
// Thread-compatible; WritePlots runs gnuplot as a child process and waits for it.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loadtest/metrics.h"

namespace pd::loadtest {

enum class LatencyMetric { kTtft, kTpot, kItl, kE2el };

// "ttft", "tpot", "itl", "e2el".
absl::string_view LatencyMetricName(LatencyMetric metric);

// The samples of `metric` in ms over the successful records, as the summary counts them
// (metrics.h): TTFT and E2EL per request, TPOT per request with more than one token, ITL
// pooled.
std::vector<double> LatencySamples(const std::vector<RequestRecord>& records, LatencyMetric metric);

// The empirical CDF of `values` as (value, fraction of samples <= value) points, ascending: every
// sample when there are at most `max_points` (>= 2), else `max_points` points at evenly spaced
// ranks, always including the smallest and the largest sample. Empty for no values.
std::vector<std::pair<double, double>> CdfPoints(std::vector<double> values, int max_points);

// One line of the CDF plots.
struct PlotRun {
  std::string label;  // legend, e.g. "A 127.0.0.1:50051" or "4 req/s"
  std::string stem;   // file name part, [A-Za-z0-9_.-]: "run", "a", "b", "rate_4"
  const std::vector<RequestRecord>* records = nullptr;  // not owned
};

// One rate of a sweep.
struct SweepPoint {
  double request_rate = 0;  // offered, req/s
  double request_throughput = 0;
  double output_throughput = 0;
  std::optional<double> request_goodput;  // nullopt without an SLO
  double mean_ttft_ms = 0;
  double p99_ttft_ms = 0;
};

// The rates of one target's sweep.
struct SweepSeries {
  std::string label;  // legend prefix ("A 127.0.0.1:50051"); "" for a single series
  std::string stem;   // data file throughput_<stem>.dat, [A-Za-z0-9_.-]; "" = throughput.dat
  std::vector<SweepPoint> points;
};

struct PlotFiles {
  std::vector<std::string> data;     // data files written
  std::vector<std::string> scripts;  // gnuplot scripts written
  std::vector<std::string> images;   // images gnuplot drew (empty when it did not run)
  std::string note;  // why there are no images ("gnuplot not found ..."); "" when drawn
};

// The script of latency_cdf.png. `has_samples[r][m]` says whether run r has samples of metric m
// (in LatencyMetric order); lines without samples are left out and a panel without any line
// says "no samples".
std::string LatencyCdfScript(const std::vector<PlotRun>& runs,
                             const std::vector<std::vector<bool>>& has_samples);

// The script of throughput.png for `series` (their labels and stems; the points are not
// read); `with_goodput` adds the goodput lines.
std::string ThroughputScript(const std::vector<SweepSeries>& series, bool with_goodput);

// Writes the data and scripts above into `dir` (an existing directory): latency_cdf.* when `runs`
// is not empty, throughput.* when `sweep` has a series with points. Then, unless `gnuplot` is
// empty, runs `gnuplot <script>` in `dir` for each script (`gnuplot` is a program name looked up on
// PATH or a path), its output going to dir/gnuplot.log. Errors: a file that cannot be written
// (NotFound/Internal with the path). gnuplot missing or failing is not an error: the scripts
// and data stay and `note` says what happened.
absl::StatusOr<PlotFiles> WritePlots(const std::string& dir, const std::vector<PlotRun>& runs,
                                     const std::vector<SweepSeries>& sweep,
                                     const std::string& gnuplot);

}  // namespace pd::loadtest
