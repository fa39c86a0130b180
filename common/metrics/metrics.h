// Metrics registry: counters, gauges and histograms in labelled families, rendered as
// Prometheus text (format 0.0.4) by Registry::RenderPrometheus().
//
//   metrics::Registry registry;
//   PD_ASSIGN_OR_RETURN(auto* requests, registry.AddCounter(
//       "pd_router_requests_total", "Requests received, by result.", {"code"}));
//   metrics::Counter& ok = requests->WithLabels({"ok"});  // look up once, keep the reference
//   ok.Increment();                                        // lock-free
//
// Components do not depend on this library (docs/development.md, "Logging and metrics"): they
// expose Stats() snapshots, and services publish them either by updating metrics or with a
// collector that runs at scrape time:
//
//   registry.AddCollector([&cache](metrics::CollectorSink& sink) {
//     KvCacheStats s = cache.Stats();
//     sink.AddGauge("pd_kvcache_blocks", "KV blocks by state.", s.num_free_blocks,
//                   {{"state", "free"}});
//   });
//
// Names are `pd_<component>_<what>_<unit>`; counters end in `_total` (rules in exposition.h).
// Label values must come from a bounded set (codes, roles, peers), never request ids: children
// are never removed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/metrics/exposition.h"

namespace pd::metrics {

// A monotonic counter. Thread-safe and lock-free: any thread may increment and read.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `n` (an event count): a single atomic add.
  void Increment(uint64_t n = 1);
  // Adds `delta` (for example seconds or bytes as a double). `delta` must be >= 0 and not NaN
  // (DCHECKed; counters never decrease). A compare-and-swap loop.
  void Add(double delta);
  // The current total: integer increments plus double additions.
  double Value() const;

 private:
  // Relaxed everywhere: each counter is independent and readers need no ordering with other
  // memory, only an eventually complete total.
  std::atomic<uint64_t> int_value_{0};
  std::atomic<double> double_value_{0};
};

// A value that goes up and down. Thread-safe and lock-free.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value);
  // Adds `delta` (may be negative). A compare-and-swap loop.
  void Add(double delta);
  double Value() const;

 private:
  std::atomic<double> value_{0};  // relaxed: independent value, no ordering with other memory
};

// A distribution over fixed buckets. Observe() is thread-safe and lock-free (two atomic adds and
// a compare-and-swap loop for the sum). A snapshot taken during concurrent observations may
// have a sum that lags the counts by those in-flight observations; counts are always consistent
// (the `+Inf` bucket equals `_count`).
class Histogram {
 public:
  // `upper_bounds` are strictly increasing and finite (the registry validates them); an implicit
  // +Inf bucket follows. The pointee must outlive the histogram (its family owns both).
  explicit Histogram(const std::vector<double>* upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose upper bound is >= value (the `le` semantics); NaN
  // goes to the +Inf bucket and makes the sum NaN, as in the Go client.
  void Observe(double value);

  struct Snapshot {
    // Cumulative: [i] counts observations <= upper_bounds[i]; the last entry is +Inf == count.
    std::vector<uint64_t> cumulative_counts;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot GetSnapshot() const;

  const std::vector<double>& upper_bounds() const { return *upper_bounds_; }

 private:
  const std::vector<double>* upper_bounds_;
  // Per-bucket (non-cumulative) counts, upper_bounds_->size() + 1 entries; relaxed like Counter.
  std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;
  std::atomic<double> sum_{0};
};

// Bucket helpers (CHECK their arguments: bad buckets are a programmer error).
// `count` bounds start, start*factor, ...; start > 0, factor > 1, count >= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);
// `count` bounds start, start+width, ...; width > 0, count >= 1.
std::vector<double> LinearBuckets(double start, double width, int count);
// Latency buckets in seconds, 1 ms to 60 s in 1-2.5-5 steps: fits TTFT, TPOT, queue time and
// KV transfer latency.
const std::vector<double>& DefaultLatencyBucketsSeconds();

namespace metrics_internal {

// What Family<T> shares whatever its metric type; used by the registry.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names, std::vector<double> upper_bounds);
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // Histogram bucket bounds without the implicit +Inf; empty for other types.
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

  // This family's current samples, children in label-value order.
  virtual FamilySnapshot Snapshot() const = 0;

 protected:
  LabelPairs MakeLabelPairs(const std::vector<std::string>& values) const;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::vector<double> upper_bounds_;
};

}  // namespace metrics_internal

// A metric family: one name, fixed label names, one child metric per distinct label values.
// T is Counter, Gauge or Histogram. Owned by the Registry, which hands out stable pointers.
// Thread-safe: WithLabels() takes a mutex (cache the returned reference on hot paths); the
// children it returns are lock-free.
template <typename T>
class Family final : public metrics_internal::FamilyBase {
 public:
  // Use Registry::Add*; public only for the registry's make_unique.
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::vector<double> upper_bounds);

  // The child for these label values (one per label name, in order), created on first use. The
  // reference stays valid for the registry's lifetime. A wrong number of values is a programmer
  // error and CHECK-fails naming the metric. `WithLabels({})` is the child of a label-less family.
  T& WithLabels(absl::Span<const std::string> label_values);

  FamilySnapshot Snapshot() const override;

 private:
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_ ABSL_GUARDED_BY(mu_);
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Collects the samples collectors publish at scrape time. Counters and gauges only: a collector
// turns a Stats() snapshot into values. Samples with the same name form one family (help and
// type from the first; later samples of another type are dropped with an error log).
// Thread-compatible: one collector fills it at a time.
class CollectorSink {
 public:
  CollectorSink() = default;

  void AddGauge(absl::string_view name, absl::string_view help, double value,
                LabelPairs labels = {});
  // `value` is the running total the component counts itself (for example from Stats()).
  void AddCounter(absl::string_view name, absl::string_view help, double value,
                  LabelPairs labels = {});

  // Families in first-seen order, samples in the order added. Names are not validated here
  // (the registry does it at render time).
  const std::vector<FamilySnapshot>& families() const { return families_; }

 private:
  friend class Registry;  // moves families_ out after a collector ran

  void Add(absl::string_view name, absl::string_view help, MetricType type, double value,
           LabelPairs labels);

  std::vector<FamilySnapshot> families_;
};

using CollectorId = StrongId<struct CollectorIdTag, uint64_t>;

// The set of metric families one process exposes. Usually one per binary, created in main()
// and passed by pointer to the services that register metrics and to MetricsHttpServer.
// Thread-safe: every method may be called from any thread. Collectors run on the thread that
// calls Collect()/RenderPrometheus(), one collector at a time, and must not call AddCollector,
// RemoveCollector, Collect or RenderPrometheus themselves (they may register metrics).
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Register a family, or return the existing one when the same name is registered again with
  // the same type, help, label names (and buckets). Errors, each naming the metric:
  // InvalidArgument for a bad metric or label name or bad buckets; AlreadyExists when the name
  // (or a histogram's _bucket/_sum/_count name) is taken by a family that differs.
  absl::StatusOr<Family<Counter>*> AddCounter(absl::string_view name, absl::string_view help,
                                              std::vector<std::string> label_names = {});
  absl::StatusOr<Family<Gauge>*> AddGauge(absl::string_view name, absl::string_view help,
                                          std::vector<std::string> label_names = {});
  // `upper_bounds`: strictly increasing, not NaN; a trailing +Inf is dropped (it is implicit).
  absl::StatusOr<Family<Histogram>*> AddHistogram(absl::string_view name, absl::string_view help,
                                                  std::vector<std::string> label_names,
                                                  std::vector<double> upper_bounds);

  // Adds a function run at every Collect()/RenderPrometheus(). Samples it emits with an invalid
  // name, a name taken by a registered family, or a conflicting type are dropped and logged.
  CollectorId AddCollector(std::function<void(CollectorSink&)> collector);
  // Removes a collector; after it returns the collector is not running and will not run again,
  // so it may release what the collector captured. Unknown ids are ignored.
  void RemoveCollector(CollectorId id);

  // All families (registered and collected), sorted by name.
  std::vector<FamilySnapshot> Collect() const;
  // Collect() rendered as Prometheus text format 0.0.4.
  std::string RenderPrometheus() const;

 private:
  absl::StatusOr<metrics_internal::FamilyBase*> AddFamily(absl::string_view name,
                                                          absl::string_view help, MetricType type,
                                                          std::vector<std::string> label_names,
                                                          std::vector<double> upper_bounds);

  // Lock order: collect_mu_ before mu_ (a collector may register metrics while collect_mu_ is
  // held; nothing takes collect_mu_ while holding mu_).
  mutable absl::Mutex collect_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<CollectorId, std::function<void(CollectorSink&)>> collectors_
      ABSL_GUARDED_BY(collect_mu_);
  uint64_t next_collector_id_ ABSL_GUARDED_BY(collect_mu_) = 0;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<metrics_internal::FamilyBase>> families_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::metrics
