// How a rank waits for its peers: spin while they are likely running on other cores, then
// yield (when ranks outnumber cores, the peer we wait for is often queued behind us on this
// core), and only then block. Blocking is the expensive step here: waking a sleeping process
// costs a system call and, in a VM whose idle vCPU halted, 50-500 us. So the spin and yield
// phases are measured in time, not iterations.
//
// Counting ranks against cores misses the case that costs most: a peer this wait needs runs on
// this very CPU (the scheduler put both ranks on one core while other work holds the rest).
// Spinning then keeps the peer off the core for the whole spin, about 1 ms a call. So at the
// start of each wait the caller may say that a peer it waits for was last seen on this CPU,
// and the wait goes straight to yielding. An unrelated neighbour on this core is no reason to
// yield: it would take a whole time slice that the peer's data cannot interrupt.
//
// A wait on nothing but TCP connections blocks at once: the kernel delivers that data, and
// spinning holds the core it needs while a yield hands a whole time slice to a task the arriving
// data cannot interrupt (about a millisecond a wait between namespace hosts here).
#pragma once
#include <sched.h>
#include <chrono>
#include <cstdint>
#include "common/cpu_relax.h"

namespace ringtree {

// What a wait should do first, decided when it starts.
enum class WaitStart { Spin, Yield, Block };

struct WaitPolicy {
  int64_t spin_ns = 0;   // busy-poll this long before yielding
  int64_t yield_ns = 0;  // then sched_yield this long before blocking
};

class Backoff {
 public:
  explicit Backoff(const WaitPolicy& policy) : policy_(policy) {}
  // how_to_start() -> WaitStart: asked once at the start of each wait (a captureless call on `context`).
  template <typename F>
  Backoff(const WaitPolicy& policy, F& how_to_start)
      : policy_(policy), context_(&how_to_start), ask_([](void* f) { return (*static_cast<F*>(f))(); }) {}
  void progressed() { idle_ = 0; }
  // After a pass that made no progress: relax or yield and return false, or return true when
  // the caller should block.
  bool should_block() {
    using Clock = std::chrono::steady_clock;
    if (idle_++ == 0) {
      const WaitStart start = ask_ ? ask_(context_) : WaitStart::Spin;
      if (start == WaitStart::Block) {
        idle_ = 0;
        return true;
      }
      since_ = Clock::now();
      skip_spin_ = start == WaitStart::Yield;
      in_spin_phase_ = !skip_spin_;
      return false;
    }
    // Reading the clock costs tens of ns; the spin phase looks at it every 64 passes.
    if (in_spin_phase_ && (idle_ & 63) != 0) {
      cpu_relax();
      return false;
    }
    const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since_).count();
    in_spin_phase_ = !skip_spin_ && waited < policy_.spin_ns;
    if (in_spin_phase_) {
      cpu_relax();
      return false;
    }
    if (waited < (skip_spin_ ? 0 : policy_.spin_ns) + policy_.yield_ns) {
      sched_yield();
      return false;
    }
    idle_ = 0;
    in_spin_phase_ = true;
    return true;
  }

 private:
  WaitPolicy policy_;
  uint64_t idle_ = 0;
  bool in_spin_phase_ = true;
  bool skip_spin_ = false;
  void* context_ = nullptr;
  WaitStart (*ask_)(void*) = nullptr;
  std::chrono::steady_clock::time_point since_{};
};

}  // namespace ringtree
