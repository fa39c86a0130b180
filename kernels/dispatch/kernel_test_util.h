// Helpers shared by the kernel tests (kernels/dispatch/*_test.cc): error metrics as in ggml's
// test-backend-ops (max-abs and normalised mean squared error), random data, and the list of
// CPU variants (ISA x threads) every op is run under.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/threads/parallel_for.h"
#include "kernels/cpu/isa.h"
#include "kernels/types.h"

namespace pd::kernels::testing {

struct ErrorStats {
  double max_abs = 0.0;
  double nmse = 0.0;  // sum (got - want)^2 / sum want^2
};

inline ErrorStats Compare(const float* got, const float* want, int64_t n) {
  ErrorStats e;
  double err = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    if (std::isnan(d)) {
      e.max_abs = INFINITY;
      continue;
    }
    err += d * d;
    ref += static_cast<double>(want[i]) * want[i];
    e.max_abs = std::max(e.max_abs, std::abs(d));
  }
  e.nmse = err / std::max(ref, 1e-30);
  if (std::isinf(e.max_abs)) {
    e.nmse = INFINITY;
  }
  return e;
}

inline std::vector<float> RandomVector(int64_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
  }
  return v;
}

// One way of running a CPU kernel: an ISA variant and an optional thread team.
struct CpuVariant {
  cpu::Isa isa;
  int threads;  // 1 = OpContext::parallel stays null
  std::string Name() const { return absl::StrCat(cpu::IsaName(isa), "/t", threads); }
};

// Every ISA this machine runs, each single-threaded and with a team of 3 (more threads than
// cores on small CI machines, so chunking and the futex path get exercised).
inline std::vector<CpuVariant> CpuVariants() {
  std::vector<CpuVariant> out;
  for (int i = 0; i <= static_cast<int>(cpu::DetectedIsa()); ++i) {
    out.push_back({static_cast<cpu::Isa>(i), 1});
    out.push_back({static_cast<cpu::Isa>(i), 3});
  }
  return out;
}

// Selects a variant for its lifetime: sets the ISA and owns the team ctx() points at.
class VariantScope {
 public:
  explicit VariantScope(const CpuVariant& v) {
    cpu::SetIsaForTest(v.isa);
    if (v.threads > 1) {
      ParallelFor::Options o;
      o.num_threads = v.threads;
      o.spin = absl::Microseconds(20);
      team_ = std::make_unique<ParallelFor>(o);
      ctx_.parallel = team_.get();
    }
  }
  ~VariantScope() { cpu::SetIsaForTest(cpu::DetectedIsa()); }
  VariantScope(const VariantScope&) = delete;
  VariantScope& operator=(const VariantScope&) = delete;

  const OpContext& ctx() const { return ctx_; }

 private:
  std::unique_ptr<ParallelFor> team_;
  OpContext ctx_;
};

}  // namespace pd::kernels::testing
