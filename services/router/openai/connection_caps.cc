#include "services/router/openai/connection_caps.h"

namespace pd::router::openai {

ConnectionCaps::Verdict ConnectionCaps::TryOpen(absl::string_view client) {
  if (open_ >= max_open_) return Verdict::kOpenLimit;
  int64_t& count = per_client_[client];
  if (max_per_client_ > 0 && count >= max_per_client_) return Verdict::kClientLimit;
  ++count;
  ++open_;
  return Verdict::kAdmit;
}

void ConnectionCaps::Close(absl::string_view client) {
  auto it = per_client_.find(client);
  if (it == per_client_.end()) return;
  --open_;
  if (--it->second == 0) per_client_.erase(it);
}

}  // namespace pd::router::openai
