#include "exec/cuda/call_watch.h"
#include "exec/cuda/device_comm.h"
#include <cstdio>
#include "common/check.h"
#include "kernels/cuda/cuda_check.h"

namespace ringtree {

namespace {
using Clock = CallWatch::Clock;
}  // namespace

bool cuda_runtime_available(std::string* reason) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (reason) *reason = str_cat("cudaGetDeviceCount: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
    return false;
  }
  if (n == 0 && reason) *reason = "cudaGetDeviceCount found 0 devices";
  return n > 0;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

int current_device() {
  int device = 0;
  RT_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  if (device < 0 || cudaGetDevice(&current) != cudaSuccess || device == current) return;
  // A failure here resurfaces as the error of the first call made on the wrong device.
  if (cudaSetDevice(device) == cudaSuccess) previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

int call_device(const CollectiveArgs& a) {
  const size_t esz = dtype_size(a.dtype);
  for (const Buffer* b : {&a.input, &a.output}) {
    if (!b->present || !b->ptr || b->count * esz == 0) continue;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, b->ptr) != cudaSuccess) {
      (void)cudaGetLastError();  // not a CUDA pointer: check_device_buffers says so
      continue;
    }
    if (attr.type == cudaMemoryTypeDevice) return attr.device;
  }
  return current_device();
}

bool event_done(cudaEvent_t ev) {
  const cudaError_t err = cudaEventQuery(ev);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  throw_cuda_error(err, "cudaEventQuery", __FILE__, __LINE__);
}

bool wait_event(cudaEvent_t ev, double timeout_s, const std::function<void()>& check) {
  const Clock::time_point start = Clock::now();
  for (int polls = 0;; ++polls) {
    if (event_done(ev)) return true;
    if (check) check();
    if (timeout_s >= 0 && std::chrono::duration<double>(Clock::now() - start).count() >= timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 200 ? 20 : 500));  // longer as the wait grows
  }
}

void refuse_stream_capture(const char* what, uintptr_t stream) {
  // A captured call would replay with the sequence number, staging and gates of the one call it
  // was captured from (a use-after-free, a stale copy, a peer waiting on the wrong call), and
  // its set-up would wait for the host inside the capture.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status);
  if (err != cudaSuccess) (void)cudaGetLastError();
  RT_CHECK(err == cudaSuccess && status == cudaStreamCaptureStatusNone, InvalidArgument, what,
           ": the stream is being captured into a CUDA graph",
           err != cudaSuccess ? str_cat(" (cudaStreamIsCapturing: ", cudaGetErrorName(err), ")") : std::string(),
           ", and ringtree's device calls cannot be captured: make the call outside the capture (with torch, "
           "before or after torch.cuda.graph(...), or torch.compile without mode='reduce-overhead'), or on host "
           "buffers");
}

void check_device_buffers(const CollectiveArgs& a, int device) {
  const char* name = collective_name(a.coll);
  const size_t esz = dtype_size(a.dtype);
  if (a.input.present)
    check_device_buffer(reinterpret_cast<uintptr_t>(a.input.ptr), a.input.count * esz, device,
                        str_cat(name, ": input"));
  if (a.output.present)
    check_device_buffer(reinterpret_cast<uintptr_t>(a.output.ptr), a.output.count * esz, device,
                        str_cat(name, ": output"));
}

std::string first_rank_unable(Communicator& host, const std::string& why, double timeout_s) {
  const int32_t able = why.empty() ? 1 : 0;
  std::vector<int32_t> all(static_cast<size_t>(host.size()), 0);
  CollectiveArgs g;
  g.coll = Collective::AllGather;
  g.dtype = DataType::Int32;
  g.input = {const_cast<int32_t*>(&able), 1, true, true};
  g.output = {all.data(), all.size(), false, true};
  g.timeout_s = timeout_s;
  host.run(g, false);
  for (size_t q = 0; q < all.size(); ++q)
    if (!all[q])
      return static_cast<int>(q) == host.rank() ? str_cat("rank ", q, ": ", why)
                                                : str_cat("rank ", q, " cannot (its own error says why)");
  return "";
}

void CallWatch::start(Hooks hooks, int device) {
  hooks_ = std::move(hooks);
  thread_ = std::thread([this, device] {
    if (device >= 0) (void)cudaSetDevice(device);
    loop();
  });
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
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
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
      room_.notify_all();
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
  room_.notify_all();
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

DeviceWork::DeviceWork(uintptr_t stream, std::function<void()> check, std::function<void()> finish)
    : device_(current_device()), check_(std::move(check)), finish_(std::move(finish)) {
  cudaEvent_t ev = nullptr;
  RT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  const cudaError_t err = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    (void)cudaEventDestroy(ev);
    throw_cuda_error(err, "cudaEventRecord", __FILE__, __LINE__);
  }
  event_ = ev;
}

DeviceWork::~DeviceWork() {
  try {
    DeviceGuard guard(device_);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  } catch (const Error&) {
  }
}

bool DeviceWork::wait(double timeout_s) {
  DeviceGuard guard(device_);
  if (!wait_event(static_cast<cudaEvent_t>(event_), timeout_s, check_)) return false;
  if (finish_) finish_();
  return true;
}

bool DeviceWork::is_completed() {
  DeviceGuard guard(device_);
  return event_done(static_cast<cudaEvent_t>(event_));
}

}  // namespace ringtree
