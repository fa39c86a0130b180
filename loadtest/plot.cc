#include "loadtest/plot.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "loadtest/report.h"

namespace pd::loadtest {
namespace {

constexpr LatencyMetric kMetrics[] = {LatencyMetric::kTtft, LatencyMetric::kTpot,
                                      LatencyMetric::kItl, LatencyMetric::kE2el};
constexpr const char* kTitles[] = {"TTFT", "TPOT", "ITL", "E2EL"};
constexpr int kMaxCdfPoints = 2000;

// Exit status of a child that could not exec its program (the shell's convention).
constexpr int kExecFailed = 127;

std::string CdfFile(const PlotRun& run, LatencyMetric metric) {
  return absl::StrCat("cdf_", run.stem, "_", LatencyMetricName(metric), ".dat");
}

// A gnuplot string literal: double quotes, backslash and quote escaped.
std::string Quoted(absl::string_view s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// The terminal preamble: pngcairo when this gnuplot has it (Debian's gnuplot-nox does), else
// libgd's png.
std::string Preamble(const std::string& image, int width, int height) {
  return absl::StrFormat(
      "if (strstrt(GPVAL_TERMINALS, \"pngcairo\") > 0) {\n"
      "  set terminal pngcairo noenhanced size %d,%d font \",10\"\n"
      "} else {\n"
      "  set terminal png noenhanced size %d,%d\n"
      "}\n"
      "set output %s\n",
      width, height, width, height, Quoted(image));
}

// Runs `program script` in `dir`, output to dir/gnuplot.log. Returns "" on success, else what
// went wrong.
std::string RunGnuplot(const std::string& program, const std::string& dir,
                       const std::string& script) {
  const std::string log = dir + "/gnuplot.log";
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::StrCat("cannot open ", log, ": ", std::strerror(errno));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const std::string err = std::strerror(errno);
    ::close(log_fd);
    return absl::StrCat("fork: ", err);
  }
  if (pid == 0) {
    // Child of a multi-threaded process: async-signal-safe calls only until exec.
    if (::chdir(dir.c_str()) != 0 || ::dup2(log_fd, STDOUT_FILENO) < 0 ||
        ::dup2(log_fd, STDERR_FILENO) < 0) {
      ::_exit(kExecFailed);
    }
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, STDIN_FILENO);
    }
    char* const argv[] = {const_cast<char*>(program.c_str()), const_cast<char*>(script.c_str()),
                          nullptr};
    ::execvp(program.c_str(), argv);
    ::_exit(kExecFailed);
  }
  ::close(log_fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return absl::StrCat("waitpid: ", std::strerror(errno));
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    return "";
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExecFailed) {
    return absl::StrCat(program,
                        " not found (install gnuplot-nox, or render the scripts elsewhere)");
  }
  return absl::StrCat(program, " failed on ", script, " (status ", status, "; see ", log, ")");
}

absl::Status WriteCdfData(const std::string& path, const PlotRun& run, LatencyMetric metric,
                          const std::vector<double>& samples) {
  std::string out = absl::StrFormat(
      "# pd-loadtest: empirical CDF of %s (ms), run %s, %d samples\n"
      "# columns: 1 = %s_ms, 2 = cumulative_fraction\n",
      LatencyMetricName(metric), Quoted(run.label), samples.size(), LatencyMetricName(metric));
  for (const auto& [value, fraction] : CdfPoints(samples, kMaxCdfPoints)) {
    absl::StrAppendFormat(&out, "%.6g %.6g\n", value, fraction);
  }
  return WriteFile(path, out);
}

std::string SweepDataFile(const SweepSeries& series) {
  return series.stem.empty() ? "throughput.dat" : absl::StrCat("throughput_", series.stem, ".dat");
}

absl::Status WriteSweepData(const std::string& path, const std::vector<SweepPoint>& sweep) {
  std::string out =
      "# pd-loadtest: throughput versus offered request rate, one line per run of the sweep\n"
      "# columns: 1 = request_rate (req/s, offered), 2 = request_throughput (req/s), "
      "3 = output_throughput (tok/s), 4 = request_goodput (req/s; NaN without an SLO), "
      "5 = mean_ttft_ms, 6 = p99_ttft_ms\n";
  for (const SweepPoint& p : sweep) {
    absl::StrAppendFormat(&out, "%.6g %.6g %.6g %s %.6g %.6g\n", p.request_rate,
                          p.request_throughput, p.output_throughput,
                          p.request_goodput.has_value()
                              ? absl::StrFormat("%.6g", *p.request_goodput)
                              : std::string("NaN"),
                          p.mean_ttft_ms, p.p99_ttft_ms);
  }
  return WriteFile(path, out);
}

}  // namespace

absl::string_view LatencyMetricName(LatencyMetric metric) {
  switch (metric) {
    case LatencyMetric::kTtft:
      return "ttft";
    case LatencyMetric::kTpot:
      return "tpot";
    case LatencyMetric::kItl:
      return "itl";
    case LatencyMetric::kE2el:
      return "e2el";
  }
  return "unknown";
}

std::vector<double> LatencySamples(const std::vector<RequestRecord>& records,
                                   LatencyMetric metric) {
  std::vector<double> out;
  for (const RequestRecord& r : records) {
    if (!r.ok()) {
      continue;
    }
    switch (metric) {
      case LatencyMetric::kTtft:
        if (r.TtftMs() >= 0) {
          out.push_back(r.TtftMs());
        }
        break;
      case LatencyMetric::kTpot:
        if (r.TpotMs() >= 0) {
          out.push_back(r.TpotMs());
        }
        break;
      case LatencyMetric::kItl:
        for (int64_t gap_ns : r.itl_ns) {
          out.push_back(static_cast<double>(gap_ns) / 1e6);
        }
        break;
      case LatencyMetric::kE2el:
        out.push_back(r.E2elMs());
        break;
    }
  }
  return out;
}

std::vector<std::pair<double, double>> CdfPoints(std::vector<double> values, int max_points) {
  std::vector<std::pair<double, double>> out;
  if (values.empty()) {
    return out;
  }
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const size_t points = std::min(n, static_cast<size_t>(std::max(2, max_points)));
  out.reserve(points);
  for (size_t k = 0; k < points; ++k) {
    // Rank of the k-th point: 0 for the first, n - 1 for the last, evenly spaced between.
    const size_t i = points == n ? k : (k * (n - 1) + (points - 1) / 2) / (points - 1);
    out.emplace_back(values[i], static_cast<double>(i + 1) / static_cast<double>(n));
  }
  return out;
}

std::string LatencyCdfScript(const std::vector<PlotRun>& runs,
                             const std::vector<std::vector<bool>>& has_samples) {
  std::string s =
      "# pd-loadtest latency CDFs (loadtest/plot.h). Render with: gnuplot latency_cdf.gp\n"
      "# Data: cdf_<run>_<metric>.dat, columns 1 = latency (ms), 2 = cumulative fraction.\n";
  s += Preamble("latency_cdf.png", 1400, 1000);
  s += "set multiplot layout 2,2 title \"pd-loadtest: latency CDFs\"\n"
       "set grid\n"
       "set key bottom right\n"
       "set yrange [0:1]\n"
       "set ylabel \"fraction of samples <= x\"\n"
       "set xlabel \"ms\"\n";
  for (size_t m = 0; m < std::size(kMetrics); ++m) {
    absl::StrAppendFormat(&s, "set title \"%s\"\n", kTitles[m]);
    std::vector<std::string> lines;
    for (size_t r = 0; r < runs.size(); ++r) {
      if (r < has_samples.size() && m < has_samples[r].size() && has_samples[r][m]) {
        lines.push_back(absl::StrCat(Quoted(CdfFile(runs[r], kMetrics[m])),
                                     " using 1:2 with lines lw 2 title ", Quoted(runs[r].label)));
      }
    }
    if (lines.empty()) {
      // gnuplot refuses a plot without points: draw an empty frame with a note.
      s += "set label 1 \"no samples\" at graph 0.5, 0.5 center\n"
           "plot [0:1] -1 notitle\n"
           "unset label 1\n";
    } else {
      absl::StrAppend(&s, "plot ", absl::StrJoin(lines, ", \\\n     "), "\n");
    }
  }
  s += "unset multiplot\n";
  return s;
}

std::string ThroughputScript(const std::vector<SweepSeries>& series, bool with_goodput) {
  std::string s =
      "# pd-loadtest sweep: throughput versus offered request rate (loadtest/plot.h).\n"
      "# Render with: gnuplot throughput.gp. Data: throughput*.dat, columns 1 = request_rate,\n"
      "# 2 = request_throughput, 3 = output_throughput, 4 = request_goodput, 5 = mean_ttft_ms,\n"
      "# 6 = p99_ttft_ms.\n";
  s += Preamble("throughput.png", 1500, 500);
  // One plot command per panel: "file" using 1:<column> ... title "<label> <what>" per line.
  auto lines = [&](std::initializer_list<std::tuple<int, int, const char*>> columns) {
    std::string out;
    for (const SweepSeries& one : series) {
      const std::string file = SweepDataFile(one);
      const std::string prefix = one.label.empty() ? "" : absl::StrCat(one.label, " ");
      for (const auto& [column, point_type, what] : columns) {
        absl::StrAppend(&out, out.empty() ? "plot " : ", \\\n     ", "\"", file,
                        "\" using 1:", column, " with linespoints lw 2 pt ", point_type, " title ",
                        Quoted(absl::StrCat(prefix, what)));
      }
    }
    return out;
  };
  s += "set datafile missing \"NaN\"\n"
       "set multiplot layout 1,3 title \"pd-loadtest: rate sweep\"\n"
       "set grid\n"
       "set key top left\n"
       "set xlabel \"offered request rate (req/s)\"\n"
       "set title \"Requests\"\n"
       "set ylabel \"req/s\"\n";
  s += with_goodput ? lines({{2, 7, "throughput"}, {4, 5, "goodput"}})
                    : lines({{2, 7, "throughput"}});
  s += ", \\\n     x with lines dt 2 lc rgb \"gray\" title \"offered\"\n"
       "set title \"Output tokens\"\n"
       "set ylabel \"tokens/s\"\n";
  s += lines({{3, 7, "output throughput"}});
  s += "\nset title \"TTFT\"\n"
       "set ylabel \"ms\"\n";
  s += lines({{5, 7, "mean"}, {6, 5, "p99"}});
  s += "\nunset multiplot\n";
  return s;
}

absl::StatusOr<PlotFiles> WritePlots(const std::string& dir, const std::vector<PlotRun>& runs,
                                     const std::vector<SweepSeries>& sweep,
                                     const std::string& gnuplot) {
  PlotFiles files;
  if (!runs.empty()) {
    std::vector<std::vector<bool>> has_samples(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) {
      for (LatencyMetric metric : kMetrics) {
        const std::vector<double> samples = LatencySamples(*runs[r].records, metric);
        has_samples[r].push_back(!samples.empty());
        const std::string path = absl::StrCat(dir, "/", CdfFile(runs[r], metric));
        if (absl::Status s = WriteCdfData(path, runs[r], metric, samples); !s.ok()) {
          return s;
        }
        files.data.push_back(path);
      }
    }
    const std::string script = absl::StrCat(dir, "/latency_cdf.gp");
    if (absl::Status s = WriteFile(script, LatencyCdfScript(runs, has_samples)); !s.ok()) {
      return s;
    }
    files.scripts.push_back(script);
  }
  std::vector<SweepSeries> series;
  bool with_goodput = false;
  for (const SweepSeries& one : sweep) {
    if (one.points.empty()) {
      continue;
    }
    series.push_back(one);
    const std::string data = absl::StrCat(dir, "/", SweepDataFile(one));
    if (absl::Status s = WriteSweepData(data, one.points); !s.ok()) {
      return s;
    }
    files.data.push_back(data);
    with_goodput = with_goodput ||
                   std::any_of(one.points.begin(), one.points.end(),
                               [](const SweepPoint& p) { return p.request_goodput.has_value(); });
  }
  if (!series.empty()) {
    const std::string script = absl::StrCat(dir, "/throughput.gp");
    if (absl::Status s = WriteFile(script, ThroughputScript(series, with_goodput)); !s.ok()) {
      return s;
    }
    files.scripts.push_back(script);
  }
  if (gnuplot.empty()) {
    files.note = "gnuplot disabled: scripts kept";
    return files;
  }
  for (const std::string& script : files.scripts) {
    const std::string name = script.substr(dir.size() + 1);
    const std::string error = RunGnuplot(gnuplot, dir, name);
    if (!error.empty()) {
      files.note = error;
      files.images.clear();
      return files;
    }
    files.images.push_back(absl::StrCat(dir, "/", name.substr(0, name.size() - 3), ".png"));
  }
  return files;
}

}  // namespace pd::loadtest
