// What the device executors (staged, NCCL, CUDA IPC) share: the events of their calls, the
// checks of a call's device buffers, and the watchdog, which follows the calls an executor put
// on streams, oldest first, on a thread of its own, and reports a call that fails or runs past
// its deadline, so a hang on the device becomes an error on the host.
#pragma once
#include "kernels/cuda/cuda_api.h"
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "ringtree/communicator.h"

namespace ringtree {

int current_device();

// Makes `device` current on this thread for the scope and restores the previous device after,
// as c10d's device guard: a call runs on its buffers' device whatever device is current. Never
// throws (destructors use it too); a device it could not make current fails the calls after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The device a call's buffers live on (the first buffer with bytes in device memory), else the
// current device. Makes no context.
int call_device(const CollectiveArgs& a);
// True once `ev` has completed; a failed query throws its CUDA error.
bool event_done(cudaEvent_t ev);
// Waits for `ev` up to timeout_s (< 0: no limit), calling `check` between polls (it throws to
// end the wait with an error). False if the time ran out.
bool wait_event(cudaEvent_t ev, double timeout_s, const std::function<void()>& check);

// InvalidArgument when `stream` is being captured into a CUDA graph (or CUDA cannot say whether
// it is): device calls refuse capture before they enqueue or allocate anything. `what` names the
// call in the message.
void refuse_stream_capture(const char* what, uintptr_t stream);

// InvalidArgument unless the call's buffers lie in device memory of `device`.
void check_device_buffers(const CollectiveArgs& a, int device);

// Every rank says, over the host communicator, whether it can go on (`why` empty) before any
// of them starts something that would wait for all. Returns "" when every rank can, else the
// first rank that cannot: "rank q: <why>" for this rank, or a pointer to that rank's error.
std::string first_rank_unable(Communicator& host, const std::string& why, double timeout_s = 0);

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
    std::function<void(const Call&)> completed;  // the call's event has completed
    std::function<void(const Call&)> running;    // polled while it runs (may report a failure)
    std::function<void(const Call&, const std::string& why, bool timed_out)> failed;
  };

  ~CallWatch() { finish(); }
  // Guards the calls, and whatever failure state the executor keeps next to them.
  std::mutex& mutex() { return mu_; }
  // Starts the watch thread, which works on `device` (the executor's): a thread's first CUDA
  // call on another device would make a context there, on device 0 by default.
  void start(Hooks hooks, int device);
  // Records an event on `stream` after the call just enqueued there, and follows it.
  void track(cudaStream_t stream, uint64_t seq, double timeout_s, std::string what);
  // With mutex() held: whether call `seq` (tracked) has not yet been reported completed; the seq
  // of the oldest call still followed, or `otherwise` when none is.
  bool follows_locked(uint64_t seq) const { return !calls_.empty() && calls_.front().seq <= seq; }
  uint64_t oldest_locked(uint64_t otherwise) const { return calls_.empty() ? otherwise : calls_.front().seq; }
  // With mutex() held through `lock`: waits until fewer than `bound` calls before `seq` are still
  // followed (the oldest ends, or the watch fails it at its deadline, or finish() runs).
  void wait_until_fewer_locked(std::unique_lock<std::mutex>& lock, uint64_t seq, uint64_t bound) {
    room_.wait(lock, [&] { return calls_.empty() || calls_.front().seq + bound > seq || stop_; });
  }
  // Stops the thread, gives every call still running until its deadline, reports those that
  // miss it (failed: the executor ends them), and releases the events. Never throws.
  void finish();

 private:
  void loop();
  void check_oldest();  // with mu_ held

  std::mutex mu_;
  std::condition_variable wake_, room_;
  Hooks hooks_;
  std::deque<Call> calls_;
  std::vector<cudaEvent_t> spare_;
  bool stop_ = false, finished_ = false;
  std::thread thread_;
};

}  // namespace ringtree
