// A polite spin-wait hint: lets the sibling hyperthread run and saves power while polling.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
namespace ringtree {
inline void cpu_relax() { _mm_pause(); }
}  // namespace ringtree
#elif defined(__aarch64__)
namespace ringtree {
inline void cpu_relax() { asm volatile("yield" ::: "memory"); }
}  // namespace ringtree
#else
namespace ringtree {
inline void cpu_relax() {}
}  // namespace ringtree
#endif
