#include "common/clock.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace ringtree {

bool invariant_tsc() {
#if defined(__x86_64__)
  static const bool yes = [] {
    // CPUID 0x80000007, EDX bit 8: the TSC ticks at a constant rate in every power state.
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000007) return false;
    __get_cpuid(0x80000007, &a, &b, &c, &d);
    return (d & (1u << 8)) != 0;
  }();
  return yes;
#else
  return false;
#endif
}

int64_t ticks() {
#if defined(__x86_64__)
  if (invariant_tsc()) return static_cast<int64_t>(__rdtsc());
#endif
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ringtree
