// The project's logging header: include this, never <glog/logging.h> directly.
//
// Spelling is the common subset of glog and absl/log (LOG(INFO), VLOG(n), CHECK*, DCHECK*), so a
// later switch to absl/log changes this file only. Levels: ERROR = something failed and someone
// may need to act; WARNING = degraded or fallback; INFO = lifecycle only; VLOG(1) per request,
// VLOG(2) per block or transfer.
#pragma once

#include <glog/logging.h>  // IWYU pragma: export

namespace pd {

// Initialises logging for a binary: to stderr, with the program name. Call once from main.
// Thread-compatible: call before starting threads.
void InitLogging(const char* argv0);

}  // namespace pd
