#include "common/log/log.h"

namespace pd {

void InitLogging(const char* argv0) {
  // Containers and the local launcher collect stderr; files under /tmp would be lost.
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
}

}  // namespace pd
