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
    d.at_ = Clock::now() + to_duration(seconds);
    return d;
  }
  // Counts from its first look instead: a collective makes one per wait, most waits end while
  // they spin or yield (a few milliseconds at most, without a look), and reading the clock cost
  // a twentieth of a small call.
  static Deadline from_first_look(double seconds) {
    Deadline d;
    d.seconds_ = seconds;
    d.started_ = false;
    return d;
  }
  bool expired() const { return Clock::now() >= at(); }
  // Milliseconds left, clamped to [0, cap_ms].
  int remaining_ms(int cap_ms) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at() - Clock::now()).count();
    if (left < 0) return 0;
    return left > cap_ms ? cap_ms : static_cast<int>(left);
  }

 private:
  static Clock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  Clock::time_point at() const {
    if (!started_) {
      at_ = Clock::now() + to_duration(seconds_);
      started_ = true;
    }
    return at_;
  }
  double seconds_ = 0;
  mutable Clock::time_point at_{};
  mutable bool started_ = true;
};

}  // namespace ringtree
