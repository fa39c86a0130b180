#include "loadtest/progress.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pd::loadtest {
namespace {

std::string Rate(double per_s) {
  if (per_s >= 1e6) {
    return absl::StrFormat("%.2fM", per_s / 1e6);
  }
  if (per_s >= 1e3) {
    return absl::StrFormat("%.2fk", per_s / 1e3);
  }
  return absl::StrFormat("%.1f", per_s);
}

}  // namespace

absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text) {
  if (text == "auto") {
    return ProgressMode::kAuto;
  }
  if (text == "bar") {
    return ProgressMode::kBar;
  }
  if (text == "lines") {
    return ProgressMode::kLines;
  }
  if (text == "off") {
    return ProgressMode::kOff;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--progress must be auto, bar, lines or off, got '", text, "'"));
}

std::string FormatProgressBar(const ProgressSnapshot& s, int bar_width) {
  const int64_t done = s.completed + s.failed;
  std::optional<double> fraction;
  if (s.total_requests.has_value() && *s.total_requests > 0) {
    fraction = static_cast<double>(done) / static_cast<double>(*s.total_requests);
  }
  if (s.duration_s.has_value() && *s.duration_s > 0) {
    const double by_time = s.elapsed_s / *s.duration_s;
    fraction = std::max(fraction.value_or(0), by_time);
  }
  std::string out;
  if (fraction.has_value()) {
    const double f = std::clamp(*fraction, 0.0, 1.0);
    const int filled = static_cast<int>(f * bar_width);
    out = absl::StrCat("[", std::string(static_cast<size_t>(filled), '#'),
                       std::string(static_cast<size_t>(bar_width - filled), '.'), "] ",
                       absl::StrFormat("%3d%% ", static_cast<int>(f * 100)));
  }
  const double rate = s.elapsed_s > 0 ? static_cast<double>(done) / s.elapsed_s : 0;
  const double tok = s.elapsed_s > 0 ? static_cast<double>(s.output_tokens) / s.elapsed_s : 0;
  absl::StrAppend(&out, done);
  if (s.total_requests.has_value()) {
    absl::StrAppend(&out, "/", *s.total_requests);
  }
  absl::StrAppend(&out, " | ", s.in_flight, " in flight | ", Rate(rate), " req/s | ", Rate(tok),
                  " tok/s | ", s.failed, " failed | ", absl::StrFormat("%.1fs", s.elapsed_s));
  return out;
}

std::string FormatProgressLine(const ProgressSnapshot& s) {
  const int64_t done = s.completed + s.failed;
  const double rate = s.elapsed_s > 0 ? static_cast<double>(done) / s.elapsed_s : 0;
  const double tok = s.elapsed_s > 0 ? static_cast<double>(s.output_tokens) / s.elapsed_s : 0;
  std::string out = absl::StrFormat("progress: %.1fs %d", s.elapsed_s, done);
  if (s.total_requests.has_value()) {
    absl::StrAppend(&out, "/", *s.total_requests);
  }
  absl::StrAppendFormat(&out, " requests done (%d failed), %d in flight, %.1f req/s, %.0f tok/s",
                        s.failed, s.in_flight, rate, tok);
  return out;
}

ProgressReporter::ProgressReporter(std::FILE* out, ProgressMode mode,
                                   std::function<ProgressSnapshot()> snapshot)
    : out_(out), mode_(mode), snapshot_(std::move(snapshot)) {
  if (mode_ == ProgressMode::kAuto) {
    mode_ = ::isatty(::fileno(out_)) ? ProgressMode::kBar : ProgressMode::kLines;
  }
  interval_ = mode_ == ProgressMode::kBar ? absl::Milliseconds(250) : absl::Seconds(5);
  if (mode_ != ProgressMode::kOff) {
    thread_ = std::thread([this] { Loop(); });
  }
}

ProgressReporter::~ProgressReporter() { Stop(); }

void ProgressReporter::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return;
    }
    stop_ = true;
  }
  if (thread_.joinable()) {
    thread_.join();
    Draw(/*final_update=*/true);
  }
}

void ProgressReporter::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), interval_);
    if (stop_) {
      return;
    }
    mu_.Unlock();
    Draw(/*final_update=*/false);
    mu_.Lock();
  }
}

void ProgressReporter::Draw(bool final_update) {
  const ProgressSnapshot s = snapshot_();
  if (mode_ == ProgressMode::kBar) {
    // \r and clear-to-end-of-line redraw the bar in place.
    std::fprintf(out_, "\r%s\033[K%s", FormatProgressBar(s, 30).c_str(), final_update ? "\n" : "");
  } else if (!final_update) {
    std::fprintf(out_, "%s\n", FormatProgressLine(s).c_str());
  }
  std::fflush(out_);
}

}  // namespace pd::loadtest
