#include "services/base/process_metrics.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace pd::services {
namespace {

// Field `key` ("VmRSS:", "Threads:") of /proc/self/status as a number (kB for memory).
double StatusField(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) {
      return std::stod(line.substr(key.size()));
    }
  }
  return 0;
}

}  // namespace

void AddProcessMetrics(metrics::Registry* registry) {
  registry->AddCollector([](metrics::CollectorSink& sink) {
    sink.AddGauge("pd_process_resident_memory_bytes", "Resident set size",
                  StatusField("VmRSS:") * 1024);
    const struct mallinfo2 mi = mallinfo2();
    sink.AddGauge("pd_process_heap_inuse_bytes",
                  "Heap bytes allocated and not freed (glibc mallinfo2: arenas + mmapped)",
                  static_cast<double>(mi.uordblks + mi.hblkhd));
    sink.AddGauge("pd_process_threads", "Threads of the process", StatusField("Threads:"));
    struct rusage ru;
    if (::getrusage(RUSAGE_SELF, &ru) == 0) {
      sink.AddCounter("pd_process_cpu_seconds_total", "User + system CPU time",
                      ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
                          (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
  });
}

}  // namespace pd::services
