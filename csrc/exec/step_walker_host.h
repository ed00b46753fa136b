// The step walker's host policy (exec/step_walker.h): one thread per channel, so that thread is
// the leader and agreement is trivial; flags are host atomics. The host-thread walker of the
// tests (exec/testing/walker_threads.cc) and the CUDA stand-in's walk (exec/cuda/standin) run
// the walk with it.
#pragma once
#include <sched.h>
#include <time.h>
#include <atomic>
#include <cstdint>
#include <cstring>
#include "common/clock.h"
#include "exec/step_walker.h"
#include "kernels/host/reduce.h"

namespace ringtree {

// The channels of one rank meet here after every step (a sense-reversing barrier).
struct RankBarrier {
  std::atomic<uint32_t> arrived{0}, generation{0};
  uint32_t parties = 1;
};

struct HostMem {
  ReduceFn reduce_fn;
  Deadline deadline;
  RankBarrier* barrier;
  // Optional: a word that ends the walk once nonzero (the CUDA IPC executor's abort word).
  const volatile uint32_t* abort = nullptr;
  // Optional: sleep 50 us after this many idle rounds in a row (0: only yield), for walkers
  // that may wait long for a peer that is not running.
  uint32_t sleep_after = 0;
  mutable uint32_t idle = 0;

  bool leader() const { return true; }
  bool agree(bool v) const { return v; }
  void copy(void* dst, const void* src, size_t bytes) const { std::memmove(dst, src, bytes); }
  void reduce(void* dst, const void* a, const void* b, size_t count) const { reduce_fn(dst, a, b, count); }
  void published() const {
    idle = 0;
    std::atomic_thread_fence(std::memory_order_release);
  }
  uint64_t load(const uint64_t* p) const { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
  void store(uint64_t* p, uint64_t v) const { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
  bool stop() const {
    return (abort && __atomic_load_n(const_cast<const uint32_t*>(abort), __ATOMIC_ACQUIRE) != 0) || deadline.expired();
  }
  void relax() const {  // ranks may outnumber cores
    if (sleep_after && ++idle >= sleep_after) {
      const timespec nap{0, 50'000};
      nanosleep(&nap, nullptr);
      return;
    }
    sched_yield();
  }
  template <typename Plan>
  bool step_barrier(const Plan& plan) const {
    if (barrier->parties == 1) return true;  // one thread walks this rank: nothing to wait for
    const uint32_t gen = barrier->generation.load(std::memory_order_acquire);
    if (barrier->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == barrier->parties) {
      barrier->arrived.store(0, std::memory_order_relaxed);
      barrier->generation.fetch_add(1, std::memory_order_release);
      return true;
    }
    while (barrier->generation.load(std::memory_order_acquire) == gen) {
      if (stop_in_force(plan, *this) != 0 || stop()) return false;
      relax();
    }
    return true;
  }
};

}  // namespace ringtree
