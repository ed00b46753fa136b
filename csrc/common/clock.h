// Deadlines for every wait: bootstrap, collectives, Work::wait; and a cheap tick source.
#pragma once
#include <chrono>
#include <cstdint>

namespace ringtree {

// Whether the CPU's time-stamp counter ticks at a constant rate in every power state.
bool invariant_tsc();
// That counter where it is invariant (a few ns to read, where the steady clock costs 25-30 ns),
// else steady-clock ns. Only differences of ticks from one machine mean anything.
int64_t ticks();

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  static Deadline after_seconds(double seconds) {
    Deadline d;
    d.at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return d;
  }
  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, cap_ms].
  int remaining_ms(int cap_ms) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }

 private:
  Clock::time_point at_;
};

}  // namespace ringtree
