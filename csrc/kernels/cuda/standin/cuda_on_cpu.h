// The CUDA-on-CPU layer: what device sources (*.cu) use beyond the runtime API, for a host C++
// compiler, so that the CUDA stand-in runs the very kernels a GPU runs. A source file of the
// stand-in build includes this header and then the .cu file (see standin/*_cpu.cc); nothing else
// in the .cu changes.
//
// How a launch runs:
//   grid        on its stream's thread (cuda_runtime.h). A plain launch runs its blocks one
//               after another (a kernel that needs two of its blocks resident at once hangs, as
//               it may on a GPU); a cooperative launch is refused unless its blocks fit on the
//               device at once (multiprocessors x blocks per multiprocessor, as on the GPU) and
//               then runs every block at once, one OS thread each.
//   block       one OS thread; its CUDA threads are fibers on it, each with its own stack,
//               switching only at __syncthreads and at the yield points below.
//   __shared__  one instance per block (thread_local: a block is one OS thread).
//   builtins    threadIdx, blockIdx, blockDim, gridDim of the fiber that runs.
//   barrier     __syncthreads releases once every thread of the block waits at it, at the same
//               source line. A thread waiting at another one, or one that has returned while
//               others wait, is a divergent barrier (undefined on a GPU): the launch fails, its
//               error names the lines, and the device's error becomes sticky.
//   order       RINGTREE_STANDIN_SEED=0 (default) runs the fibers in thread order; any other
//               value shuffles the order at every barrier release and every yield, the same way
//               for the same seed.
//   yields      RINGTREE_STANDIN_YIELD=p (percent, default 0): at every fence, atomic and __ldcg a
//               fiber hands over to another with probability p, and the block's thread now and
//               then yields the CPU, so that a flag read too early or a missing barrier becomes a
//               failure or a hang rather than luck.
//   naps        __nanosleep hands over; when every runnable fiber of a block is napping, the
//               block's thread sleeps, longer the longer it stays idle, so spinning kernels
//               leave the CPU to the ranks they wait for.
//   memory      host memory: fences are C++ fences, atomics host atomics, __ldcg a plain load.
//   scopes      kernels/cuda/scoped_sync.cuh's primitives check their scope: memory shared with
//               another process or the host reached below system scope faults the kernel.
//               RINGTREE_STANDIN_WEAK=1 holds the walk kernel's copies into such memory back
//               until the block's next system-scope release (scoped_sync.cuh).
//   arch        the CPU poses as sm_90 (__CUDA_ARCH__ is 900): device code takes its sm_90 paths.
//
// What running a kernel here proves: the barrier and leader discipline of a block (which thread
// writes shared state when, and that every thread sees it), the grid barrier across blocks and
// across calls, the abort, stop and status paths, every copy and reduce path (16-byte packs,
// byte and element tails), every dtype and op instance, and the packing of launch arguments.
// What it cannot: the GPU's weak memory model (x86 is TSO; a missing fence may pass here),
// warps (lockstep, divergence within a warp, warp-level races), real CUDA IPC and peer access,
// caches (__ldcg against a stale L1 line), and anything about speed.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include "kernels/cuda/standin/cuda_runtime.h"

#define __CUDA_ARCH__ 900
#define RT_CUDA_ON_CPU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __restrict__ __restrict

namespace ringtree::cuda_on_cpu {

// Where the running fiber is in its grid.
struct Coords {
  uint3 thread_idx, block_idx, block_dim, grid_dim;
};
extern thread_local Coords coords;

// Out of line: they switch fibers.
void syncthreads(const char* file, int line);
void yield_now();
void nap(unsigned ns);

// The yield points: cheap unless RINGTREE_STANDIN_YIELD is set.
extern thread_local unsigned yield_percent;
inline void yield_point() {
  if (yield_percent) yield_now();
}

// A launch: the kernel with copies of its arguments (as the GPU copies them at the launch), run
// once per CUDA thread with that thread's own copy of each parameter.
template <typename... A, size_t... I>
std::function<void()> bind(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  auto packed = std::make_shared<std::tuple<std::decay_t<A>...>>(*static_cast<std::decay_t<A>*>(args[I])...);
  return [kernel, packed] { std::apply(kernel, *packed); };
}
cudaError_t launch(const void* kernel, dim3 grid, dim3 block, bool cooperative, std::function<void()> thread_body,
                   cudaStream_t stream);

}  // namespace ringtree::cuda_on_cpu

#define threadIdx (static_cast<const uint3&>(::ringtree::cuda_on_cpu::coords.thread_idx))
#define blockIdx (static_cast<const uint3&>(::ringtree::cuda_on_cpu::coords.block_idx))
#define blockDim (static_cast<const uint3&>(::ringtree::cuda_on_cpu::coords.block_dim))
#define gridDim (static_cast<const uint3&>(::ringtree::cuda_on_cpu::coords.grid_dim))
#define __syncthreads() ::ringtree::cuda_on_cpu::syncthreads(__FILE__, __LINE__)

inline void __threadfence_block() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::ringtree::cuda_on_cpu::yield_point();
}
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::ringtree::cuda_on_cpu::yield_point();
}
inline void __threadfence_system() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  ::ringtree::cuda_on_cpu::yield_point();
}
inline void __nanosleep(unsigned ns) { ::ringtree::cuda_on_cpu::nap(ns); }

template <typename T>
inline T atomicAdd(T* p, T v) {
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicSub(T* p, T v) {
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicExch(T* p, T v) {
  ::ringtree::cuda_on_cpu::yield_point();
  return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
  ::ringtree::cuda_on_cpu::yield_point();
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
template <typename T>
inline T __ldcg(const T* p) {
  ::ringtree::cuda_on_cpu::yield_point();
  return *p;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// The launch forms of cuda_runtime.h: typed, so that the arguments can be unpacked.
template <typename... A>
inline cudaError_t cudaLaunchKernel(void (*kernel)(A...), dim3 grid, dim3 block, void** args, size_t shared_bytes = 0,
                                    cudaStream_t stream = nullptr) {
  (void)shared_bytes;
  return ::ringtree::cuda_on_cpu::launch(reinterpret_cast<const void*>(kernel), grid, block, false,
                                         ::ringtree::cuda_on_cpu::bind(kernel, args, std::index_sequence_for<A...>{}),
                                         stream);
}
template <typename... A>
inline cudaError_t cudaLaunchCooperativeKernel(void (*kernel)(A...), dim3 grid, dim3 block, void** args,
                                               size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  (void)shared_bytes;
  return ::ringtree::cuda_on_cpu::launch(reinterpret_cast<const void*>(kernel), grid, block, true,
                                         ::ringtree::cuda_on_cpu::bind(kernel, args, std::index_sequence_for<A...>{}),
                                         stream);
}
template <typename... A>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*kernel)(A...)) {
  return ::ringtree::standin::load_kernel(reinterpret_cast<const void*>(kernel), attr);
}
