// Named, scoped synchronization for device code: every access of the walk kernel to a word that
// another agent (another thread block, another process's kernel, the host) reads or writes goes
// through one of these, with its scope spelled out:
//
//   Scope::Block   the thread block (PTX .cta)
//   Scope::Device  every thread of this GPU (PTX .gpu)
//   Scope::System  every GPU and the host (PTX .sys): words in CUDA IPC mailboxes (other
//                  processes' kernels read and write them) and in pinned host memory
//
//   load_acquire<S>(p)      ld.acquire.S: later accesses of this thread stay after it
//   store_release<S>(p, v)  st.release.S: earlier accesses of this thread (and, by cumulativity,
//                           what it observed, e.g. through bar.sync) are visible at S first
//   fence_release<S>()      fence.acq_rel.S
//   fetch_add<S> / exchange<S>   atom.acq_rel.S (the grid barrier's counters)
//
// On a GPU they are inline PTX. In the CUDA stand-in (RT_CUDA_ON_CPU, a host compiler)
// they are __atomic builtins with the same orders, each a yield point, and each checks its
// scope: a word of memory shared with another process or with the host (an IPC-exported or
// -mapped allocation, pinned host memory) accessed below system scope stops the process with a
// message naming the access.
#pragma once
#include <cstdint>

namespace ringtree::sync {

enum class Scope { Block, Device, System };

#if defined(RT_CUDA_ON_CPU)

// The stand-in's scope check and planted faults (standin/cuda_on_cpu.cc).
void check_scope(const void* p, Scope scope, const char* what);
bool planted(unsigned fault);
constexpr unsigned kPlantNoFence = 1;        // system-scope releases publish no held store
constexpr unsigned kPlantDeviceRelease = 2;  // system-scope releases downgraded to device scope
constexpr unsigned kPlantFlagFirst = 4;      // a release store lands before the held stores it publishes
// The weak-memory mode (RINGTREE_STANDIN_WEAK=1): a copy into memory shared beyond this process
// is held back, this thread's part of it in 16-byte pieces, until the block's next system-scope
// release, which writes the held pieces in random order. hold_copy is false (nothing held) when
// the mode is off or dst is not shared.
bool hold_copy(void* dst, const void* src, size_t bytes, unsigned thread, unsigned threads);
void publish_held();
void publish_held_late();  // kPlantFlagFirst: after a pause that lets a peer read the flag first

template <Scope S, typename T>
inline T load_acquire(const T* p) {
  check_scope(p, S, "load_acquire");
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <Scope S, typename T>
inline void store_release(T* p, T v) {
  const Scope s = S == Scope::System && planted(kPlantDeviceRelease) ? Scope::Device : S;
  check_scope(p, s, "store_release");
  const bool flag_first = planted(kPlantFlagFirst);
  if (s == Scope::System && !flag_first) publish_held();
  ::ringtree::cuda_on_cpu::yield_point();
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
  if (s == Scope::System && flag_first) publish_held_late();
}
template <Scope S>
inline void fence_release() {
  if (S == Scope::System && !planted(kPlantFlagFirst)) publish_held();
  std::atomic_thread_fence(std::memory_order_acq_rel);
  ::ringtree::cuda_on_cpu::yield_point();
}
template <Scope S, typename T>
inline T fetch_add(T* p, T v) {
  check_scope(p, S, "fetch_add");
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL);
}
template <Scope S, typename T>
inline T exchange(T* p, T v) {
  check_scope(p, S, "exchange");
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL);
}

#else

__device__ __forceinline__ bool hold_copy(void*, const void*, size_t, unsigned, unsigned) { return false; }

// The PTX instruction `op` at scope S (op ".cta", ".gpu" or ".sys" rest), with the asm operands
// that follow: the scope is part of the instruction's name, so each needs its own literal.
#define RT_SCOPED_ASM(S, op, rest, ...)                      \
  do {                                                       \
    if constexpr (S == Scope::Block)                         \
      asm volatile(op ".cta" rest : __VA_ARGS__ : "memory"); \
    else if constexpr (S == Scope::Device)                   \
      asm volatile(op ".gpu" rest : __VA_ARGS__ : "memory"); \
    else                                                     \
      asm volatile(op ".sys" rest : __VA_ARGS__ : "memory"); \
  } while (0)

template <Scope S, typename T>
__device__ __forceinline__ T load_acquire(const T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit words");
  if constexpr (sizeof(T) == 8) {
    unsigned long long v;
    RT_SCOPED_ASM(S, "ld.acquire", ".b64 %0, [%1];", "=l"(v) : "l"(p));
    return static_cast<T>(v);
  } else {
    unsigned v;
    RT_SCOPED_ASM(S, "ld.acquire", ".b32 %0, [%1];", "=r"(v) : "l"(p));
    return static_cast<T>(v);
  }
}
template <Scope S, typename T>
__device__ __forceinline__ void store_release(T* p, T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "32- or 64-bit words");
  if constexpr (sizeof(T) == 8)
    RT_SCOPED_ASM(S, "st.release", ".b64 [%0], %1;", : "l"(p), "l"(static_cast<unsigned long long>(v)));
  else
    RT_SCOPED_ASM(S, "st.release", ".b32 [%0], %1;", : "l"(p), "r"(static_cast<unsigned>(v)));
}
template <Scope S>
__device__ __forceinline__ void fence_release() {
  RT_SCOPED_ASM(S, "fence.acq_rel", ";", :);
}
template <Scope S>
__device__ __forceinline__ unsigned fetch_add(unsigned* p, unsigned v) {
  unsigned old;
  RT_SCOPED_ASM(S, "atom.add.acq_rel", ".u32 %0, [%1], %2;", "=r"(old) : "l"(p), "r"(v));
  return old;
}
template <Scope S>
__device__ __forceinline__ unsigned exchange(unsigned* p, unsigned v) {
  unsigned old;
  RT_SCOPED_ASM(S, "atom.exch.acq_rel", ".b32 %0, [%1], %2;", "=r"(old) : "l"(p), "r"(v));
  return old;
}

#undef RT_SCOPED_ASM

#endif

}  // namespace ringtree::sync
