#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::metrics {
namespace {

// The "lock-free" promise in metrics.h; holds on every platform we build for (x86-64, aarch64).
static_assert(std::atomic<double>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Adds `delta` to an atomic double. Relaxed: see Counter (independent values, no pairing).
void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed,
                                       std::memory_order_relaxed)) {
  }
}

absl::Status ValidateBuckets(absl::string_view name, std::vector<double>& upper_bounds) {
  if (!upper_bounds.empty() && std::isinf(upper_bounds.back()) && upper_bounds.back() > 0) {
    upper_bounds.pop_back();  // +Inf is implicit
  }
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric \"", name, "\": bucket bound ", FormatValue(upper_bounds[i]), " is not finite"));
    }
    if (i > 0 && upper_bounds[i] <= upper_bounds[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric \"", name, "\": bucket bounds must be strictly increasing, got ",
                       FormatValue(upper_bounds[i - 1]), " then ", FormatValue(upper_bounds[i])));
    }
  }
  return absl::OkStatus();
}

// Whether families (a_name, a_type) and (b_name, b_type) would write a common sample name.
bool Collides(absl::string_view a_name, MetricType a_type, absl::string_view b_name,
              MetricType b_type) {
  std::vector<std::string> a = SampleNames(a_name, a_type);
  a.emplace_back(a_name);
  std::vector<std::string> b = SampleNames(b_name, b_type);
  b.emplace_back(b_name);
  for (const std::string& x : a) {
    if (std::find(b.begin(), b.end(), x) != b.end()) {
      return true;
    }
  }
  return false;
}

std::string DescribeFamily(MetricType type, absl::Span<const std::string> label_names) {
  return absl::StrCat(MetricTypeName(type), " with labels {", absl::StrJoin(label_names, ","), "}");
}

}  // namespace

// ---- Counter, Gauge, Histogram ------------------------------------------------------------------

void Counter::Increment(uint64_t n) { int_value_.fetch_add(n, std::memory_order_relaxed); }

void Counter::Add(double delta) {
  DCHECK(delta >= 0) << "counter decrement or NaN: " << delta;
  AtomicAdd(double_value_, delta);
}

double Counter::Value() const {
  return static_cast<double>(int_value_.load(std::memory_order_relaxed)) +
         double_value_.load(std::memory_order_relaxed);
}

void Gauge::Set(double value) { value_.store(value, std::memory_order_relaxed); }

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

double Gauge::Value() const { return value_.load(std::memory_order_relaxed); }

Histogram::Histogram(const std::vector<double>* upper_bounds)
    : upper_bounds_(upper_bounds),
      bucket_counts_(std::make_unique<std::atomic<uint64_t>[]>(upper_bounds->size() + 1)) {}

void Histogram::Observe(double value) {
  const std::vector<double>& bounds = *upper_bounds_;
  size_t index = bounds.size();  // +Inf, also where NaN goes
  if (!std::isnan(value)) {
    index = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  }
  bucket_counts_[index].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::GetSnapshot() const {
  Snapshot snapshot;
  const size_t num_buckets = upper_bounds_->size() + 1;
  snapshot.cumulative_counts.resize(num_buckets);
  uint64_t running = 0;
  for (size_t i = 0; i < num_buckets; ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative_counts[i] = running;
  }
  // _count is derived from the buckets so that +Inf == _count even under concurrent Observe().
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  CHECK_GT(start, 0);
  CHECK_GT(factor, 1);
  CHECK_GE(count, 1);
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  CHECK_GT(width, 0);
  CHECK_GE(count, 1);
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) {
    bounds.push_back(start + width * i);
  }
  return bounds;
}

const std::vector<double>& DefaultLatencyBucketsSeconds() {
  static const auto* const kBuckets = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
  return *kBuckets;
}

// ---- Families ---------------------------------------------------------------------------------

namespace metrics_internal {

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

LabelPairs FamilyBase::MakeLabelPairs(const std::vector<std::string>& values) const {
  LabelPairs pairs;
  pairs.reserve(values.size() + 1);  // +1: room for a histogram's "le"
  for (size_t i = 0; i < values.size(); ++i) {
    pairs.emplace_back(label_names_[i], values[i]);
  }
  return pairs;
}

}  // namespace metrics_internal

template <typename T>
Family<T>::Family(std::string name, std::string help, MetricType type,
                  std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : FamilyBase(std::move(name), std::move(help), type, std::move(label_names),
                 std::move(upper_bounds)) {
  // A label-less family has exactly one child: create it now so that it renders (as 0) before
  // the first update, as Prometheus clients do.
  if (this->label_names().empty()) {
    WithLabels({});
  }
}

template <typename T>
T& Family<T>::WithLabels(absl::Span<const std::string> label_values) {
  CHECK_EQ(label_values.size(), label_names().size())
      << "metric \"" << name() << "\": WithLabels got " << label_values.size()
      << " values for labels {" << absl::StrJoin(label_names(), ",") << "}";
  std::vector<std::string> key(label_values.begin(), label_values.end());
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& child = children_[std::move(key)];
  if (child == nullptr) {
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<Histogram>(&upper_bounds());
    } else {
      child = std::make_unique<T>();
    }
  }
  return *child;
}

template <typename T>
FamilySnapshot Family<T>::Snapshot() const {
  FamilySnapshot snapshot{name(), help(), type(), {}};
  absl::MutexLock lock(&mu_);
  const std::vector<double>& bounds = upper_bounds();
  for (const auto& [label_values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      Histogram::Snapshot h = child->GetSnapshot();
      for (size_t i = 0; i < h.cumulative_counts.size(); ++i) {
        LabelPairs labels = MakeLabelPairs(label_values);
        labels.emplace_back("le", i < bounds.size() ? FormatValue(bounds[i]) : "+Inf");
        snapshot.samples.push_back(
            {"_bucket", std::move(labels), static_cast<double>(h.cumulative_counts[i])});
      }
      snapshot.samples.push_back({"_sum", MakeLabelPairs(label_values), h.sum});
      snapshot.samples.push_back(
          {"_count", MakeLabelPairs(label_values), static_cast<double>(h.count)});
    } else {
      snapshot.samples.push_back({"", MakeLabelPairs(label_values), child->Value()});
    }
  }
  return snapshot;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---- CollectorSink ----------------------------------------------------------------------------

void CollectorSink::AddGauge(absl::string_view name, absl::string_view help, double value,
                             LabelPairs labels) {
  Add(name, help, MetricType::kGauge, value, std::move(labels));
}

void CollectorSink::AddCounter(absl::string_view name, absl::string_view help, double value,
                               LabelPairs labels) {
  Add(name, help, MetricType::kCounter, value, std::move(labels));
}

void CollectorSink::Add(absl::string_view name, absl::string_view help, MetricType type,
                        double value, LabelPairs labels) {
  auto it = std::find_if(families_.begin(), families_.end(),
                         [&](const FamilySnapshot& f) { return f.name == name; });
  if (it == families_.end()) {
    families_.push_back({std::string(name), std::string(help), type, {}});
    it = std::prev(families_.end());
  } else if (it->type != type) {
    LOG_FIRST_N(ERROR, 10) << "metric \"" << name << "\": collector emitted a "
                           << MetricTypeName(type) << " sample for a " << MetricTypeName(it->type)
                           << " family; dropped";
    return;
  }
  it->samples.push_back({"", std::move(labels), value});
}

// ---- Registry ---------------------------------------------------------------------------------

absl::StatusOr<Family<Counter>*> Registry::AddCounter(absl::string_view name,
                                                      absl::string_view help,
                                                      std::vector<std::string> label_names) {
  PD_ASSIGN_OR_RETURN(metrics_internal::FamilyBase * family,
                      AddFamily(name, help, MetricType::kCounter, std::move(label_names), {}));
  return static_cast<Family<Counter>*>(family);
}

absl::StatusOr<Family<Gauge>*> Registry::AddGauge(absl::string_view name, absl::string_view help,
                                                  std::vector<std::string> label_names) {
  PD_ASSIGN_OR_RETURN(metrics_internal::FamilyBase * family,
                      AddFamily(name, help, MetricType::kGauge, std::move(label_names), {}));
  return static_cast<Family<Gauge>*>(family);
}

absl::StatusOr<Family<Histogram>*> Registry::AddHistogram(absl::string_view name,
                                                          absl::string_view help,
                                                          std::vector<std::string> label_names,
                                                          std::vector<double> upper_bounds) {
  PD_ASSIGN_OR_RETURN(metrics_internal::FamilyBase * family,
                      AddFamily(name, help, MetricType::kHistogram, std::move(label_names),
                                std::move(upper_bounds)));
  return static_cast<Family<Histogram>*>(family);
}

absl::StatusOr<metrics_internal::FamilyBase*> Registry::AddFamily(
    absl::string_view name, absl::string_view help, MetricType type,
    std::vector<std::string> label_names, std::vector<double> upper_bounds) {
  PD_RETURN_IF_ERROR(ValidateMetricName(name, type));
  PD_RETURN_IF_ERROR(ValidateLabelNames(name, type, label_names));
  if (type == MetricType::kHistogram) {
    PD_RETURN_IF_ERROR(ValidateBuckets(name, upper_bounds));
  }

  absl::MutexLock lock(&mu_);
  auto it = families_.find(std::string(name));
  if (it != families_.end()) {
    metrics_internal::FamilyBase* existing = it->second.get();
    if (existing->type() != type || existing->label_names() != label_names) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric \"", name, "\": already registered as ",
                       DescribeFamily(existing->type(), existing->label_names()),
                       ", cannot register as ", DescribeFamily(type, label_names)));
    }
    if (existing->upper_bounds() != upper_bounds) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric \"", name, "\": already registered with buckets {",
          absl::StrJoin(existing->upper_bounds(), ",",
                        [](std::string* out, double b) { out->append(FormatValue(b)); }),
          "}, cannot register with different buckets"));
    }
    if (existing->help() != help) {
      return absl::AlreadyExistsError(absl::StrCat("metric \"", name,
                                                   "\": already registered with help \"",
                                                   existing->help(), "\", got \"", help, "\""));
    }
    return existing;
  }
  for (const auto& [other_name, other] : families_) {
    if (Collides(name, type, other_name, other->type())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric \"", name, "\" (", MetricTypeName(type), ") collides with the samples of ",
          MetricTypeName(other->type()), " \"", other_name, "\""));
    }
  }

  std::unique_ptr<metrics_internal::FamilyBase> family;
  std::string name_str(name);
  switch (type) {
    case MetricType::kCounter:
      family = std::make_unique<Family<Counter>>(name_str, std::string(help), type,
                                                 std::move(label_names), std::vector<double>());
      break;
    case MetricType::kGauge:
      family = std::make_unique<Family<Gauge>>(name_str, std::string(help), type,
                                               std::move(label_names), std::vector<double>());
      break;
    case MetricType::kHistogram:
      family = std::make_unique<Family<Histogram>>(name_str, std::string(help), type,
                                                   std::move(label_names), std::move(upper_bounds));
      break;
  }
  metrics_internal::FamilyBase* result = family.get();
  families_.emplace(std::move(name_str), std::move(family));
  return result;
}

CollectorId Registry::AddCollector(std::function<void(CollectorSink&)> collector) {
  CHECK(collector != nullptr);
  absl::MutexLock lock(&collect_mu_);
  CollectorId id(next_collector_id_++);
  collectors_.emplace(id, std::move(collector));
  return id;
}

void Registry::RemoveCollector(CollectorId id) {
  // Taking collect_mu_ waits for a running Collect(), so the collector is not running after this.
  absl::MutexLock lock(&collect_mu_);
  collectors_.erase(id);
}

namespace {

// Drops collected samples whose label names are invalid or whose label set repeats (a repeated
// series is invalid exposition), then orders samples by labels for a stable output.
void NormalizeCollectedSamples(FamilySnapshot& family) {
  std::vector<Sample> kept;
  kept.reserve(family.samples.size());
  for (Sample& sample : family.samples) {
    std::vector<std::string> label_names;
    label_names.reserve(sample.labels.size());
    for (const auto& [label_name, value] : sample.labels) {
      label_names.push_back(label_name);
    }
    absl::Status status = ValidateLabelNames(family.name, family.type, label_names);
    if (!status.ok()) {
      LOG_FIRST_N(ERROR, 10) << "collector sample dropped: " << status.message();
      continue;
    }
    kept.push_back(std::move(sample));
  }
  std::stable_sort(kept.begin(), kept.end(),
                   [](const Sample& a, const Sample& b) { return a.labels < b.labels; });
  auto duplicate =
      std::adjacent_find(kept.begin(), kept.end(),
                         [](const Sample& a, const Sample& b) { return a.labels == b.labels; });
  if (duplicate != kept.end()) {
    LOG_FIRST_N(ERROR, 10) << "metric \"" << family.name
                           << "\": collectors emitted the same labels twice; keeping the first";
    kept.erase(std::unique(kept.begin(), kept.end(),
                           [](const Sample& a, const Sample& b) { return a.labels == b.labels; }),
               kept.end());
  }
  family.samples = std::move(kept);
}

// Adds collected family `family` to `result` (registered families plus collected ones so far)
// unless it is invalid or collides; same-name, same-type families from several collectors merge.
void MergeCollected(FamilySnapshot family, size_t num_registered,
                    std::vector<FamilySnapshot>& result) {
  absl::Status status = ValidateMetricName(family.name, family.type);
  if (!status.ok()) {
    LOG_FIRST_N(ERROR, 10) << "collector family dropped: " << status.message();
    return;
  }
  for (size_t i = 0; i < result.size(); ++i) {
    FamilySnapshot& other = result[i];
    if (i >= num_registered && other.name == family.name && other.type == family.type) {
      std::move(family.samples.begin(), family.samples.end(), std::back_inserter(other.samples));
      return;
    }
    if (Collides(family.name, family.type, other.name, other.type)) {
      LOG_FIRST_N(ERROR, 10) << "collector family \"" << family.name << "\" ("
                             << MetricTypeName(family.type) << ") collides with "
                             << (i < num_registered ? "registered " : "collected ")
                             << MetricTypeName(other.type) << " \"" << other.name << "\"; dropped";
      return;
    }
  }
  result.push_back(std::move(family));
}

}  // namespace

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<FamilySnapshot> collected;
  {
    absl::MutexLock lock(&collect_mu_);
    for (const auto& [id, collector] : collectors_) {
      CollectorSink sink;
      collector(sink);
      std::move(sink.families_.begin(), sink.families_.end(), std::back_inserter(collected));
    }
  }

  // Families are never removed, so their pointers stay valid after mu_ is released.
  std::vector<const metrics_internal::FamilyBase*> registered;
  {
    absl::MutexLock lock(&mu_);
    registered.reserve(families_.size());
    for (const auto& [name, family] : families_) {
      registered.push_back(family.get());
    }
  }
  std::vector<FamilySnapshot> result;
  result.reserve(registered.size() + collected.size());
  for (const metrics_internal::FamilyBase* family : registered) {
    result.push_back(family->Snapshot());
  }
  const size_t num_registered = result.size();
  for (FamilySnapshot& family : collected) {
    MergeCollected(std::move(family), num_registered, result);
  }
  for (size_t i = num_registered; i < result.size(); ++i) {
    NormalizeCollectedSamples(result[i]);
  }
  std::sort(result.begin(), result.end(),
            [](const FamilySnapshot& a, const FamilySnapshot& b) { return a.name < b.name; });
  return result;
}

std::string Registry::RenderPrometheus() const { return RenderPrometheusText(Collect()); }

}  // namespace pd::metrics
