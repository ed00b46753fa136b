#include <chrono>
#include <cstdio>
#include "ringtree/communicator.h"

namespace ringtree {

bool Work::wait(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_s < 0) {
    cv_.wait(lock, [this] { return done_; });
  } else if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done_; })) {
    return false;
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    done_ = true;
  }
  cv_.notify_all();
}

void Gate::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

void Gate::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = why.empty() ? "the input was never produced" : why;
    open_ = true;
  }
  cv_.notify_all();
}

void Gate::done() noexcept {
  if (!on_done_) return;
  try {
    on_done_();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringtree: a gate's on_done failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "ringtree: a gate's on_done failed\n");
  }
}

bool Gate::wait_open(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return open_; })) return false;
  if (!failure_.empty()) throw Error(failure_);
  return true;
}

}  // namespace ringtree
