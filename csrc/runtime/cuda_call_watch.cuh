// The watchdog of a device executor (NCCL, CUDA IPC): it follows the calls the executor put on
// streams, oldest first, on a thread of its own, and reports a call that fails or runs past its
// deadline, so a hang on the device becomes an error on the host. Include from .cu files only.
#pragma once
#include <cuda_runtime_api.h>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ringtree {

class CallWatch {
 public:
  using Clock = std::chrono::steady_clock;
  struct Call {
    cudaEvent_t ev;  // recorded after the call
    uint64_t seq;
    Clock::time_point deadline;
    double timeout_s;
    std::string what;  // "all_reduce device call #3 (CUDA IPC)"
  };
  // Each runs with mutex() held, on the watch thread or in finish().
  struct Hooks {
    std::function<void(const Call&)> completed;      // the call's event has completed
    std::function<void(const Call&)> running;        // polled while it runs (may report a failure)
    std::function<void(const Call&, const std::string& why, bool timed_out)> failed;
  };

  ~CallWatch() { finish(); }
  // Guards the calls, and whatever failure state the executor keeps next to them.
  std::mutex& mutex() { return mu_; }
  void start(Hooks hooks);
  // Records an event on `stream` after the call just enqueued there, and follows it.
  void track(cudaStream_t stream, uint64_t seq, double timeout_s, std::string what);
  // Stops the thread, gives every call still running until its deadline, reports those that
  // miss it (failed: the executor ends them), and releases the events. Never throws.
  void finish();

 private:
  void loop();
  void check_oldest();  // with mu_ held

  std::mutex mu_;
  std::condition_variable wake_;
  Hooks hooks_;
  std::deque<Call> calls_;
  std::vector<cudaEvent_t> spare_;
  bool stop_ = false, finished_ = false;
  std::thread thread_;
};

}  // namespace ringtree
