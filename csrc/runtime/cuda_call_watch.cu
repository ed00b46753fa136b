#include "runtime/cuda_call_watch.cuh"
#include <cstdio>
#include "common/check.h"
#include "kernels/cuda_check.cuh"

namespace ringtree {

void CallWatch::start(Hooks hooks) {
  hooks_ = std::move(hooks);
  thread_ = std::thread([this] { loop(); });
}

void CallWatch::track(cudaStream_t stream, uint64_t seq, double timeout_s, std::string what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t ev = nullptr;
    if (!spare_.empty()) {
      ev = spare_.back();
      spare_.pop_back();
    } else {
      RT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    const cudaError_t err = cudaEventRecord(ev, stream);
    if (err != cudaSuccess) {
      spare_.push_back(ev);
      throw_cuda_error(err, "cudaEventRecord", __FILE__, __LINE__);
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    calls_.push_back({ev, seq, deadline, timeout_s, std::move(what)});
  }
  wake_.notify_all();
}

void CallWatch::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    try {
      check_oldest();
    } catch (const std::exception& e) {  // a hook's own failure must not end the process
      std::fprintf(stderr, "ringtree: device watchdog: %s\n", e.what());
    }
    wake_.wait_for(lock, std::chrono::milliseconds(calls_.empty() ? 200 : 2));
  }
}

void CallWatch::check_oldest() {
  while (!calls_.empty()) {
    const Call& c = calls_.front();
    const cudaError_t err = cudaEventQuery(c.ev);
    if (err == cudaSuccess) {
      if (hooks_.completed) hooks_.completed(c);
      spare_.push_back(c.ev);
      calls_.pop_front();
      continue;
    }
    if (err != cudaErrorNotReady) {
      hooks_.failed(c, str_cat("CUDA error ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)), false);
    } else {
      if (hooks_.running) hooks_.running(c);
      if (Clock::now() >= c.deadline) hooks_.failed(c, str_cat("timed out after ", c.timeout_s, " s"), true);
    }
    return;  // the oldest call is still running: the later ones are too
  }
}

void CallWatch::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (const Call& c : calls_) {
    while (cudaEventQuery(c.ev) == cudaErrorNotReady && Clock::now() < c.deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (cudaEventQuery(c.ev) == cudaErrorNotReady && hooks_.failed) {
      try {
        hooks_.failed(c, "was still running at close", true);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ringtree: device watchdog at close: %s\n", e.what());
      }
    }
  }
  for (const Call& c : calls_) (void)cudaEventDestroy(c.ev);
  calls_.clear();
  for (cudaEvent_t ev : spare_) (void)cudaEventDestroy(ev);
  spare_.clear();
}

}  // namespace ringtree
