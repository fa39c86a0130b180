// Process-level metrics every pdserve binary exposes: resident memory, heap bytes in use
// (glibc mallinfo2 over all arenas: unlike RSS it drops when memory is freed, so it shows
// leaks), threads and CPU time.
#pragma once

#include "common/metrics/metrics.h"

namespace pd::services {

// Adds a collector to `registry` (which must outlive the process's use of it) emitting
// pd_process_resident_memory_bytes, pd_process_heap_inuse_bytes, pd_process_threads
// and pd_process_cpu_seconds_total.
void AddProcessMetrics(metrics::Registry* registry);

}  // namespace pd::services
