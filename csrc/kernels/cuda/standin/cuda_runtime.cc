// The CPU stand-in for the CUDA runtime (see cuda_runtime.h).
#include "kernels/cuda/standin/cuda_runtime.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ringtree::standin {

namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
std::atomic<int> sticky_error{cudaSuccess};  // a kernel failed: the "context" is unusable

cudaError_t fail(cudaError_t err) {
  last_error = err;
  return err;
}

// ---- memory ---------------------------------------------------------------------------------

enum class Kind { Device, PeerMapping, Host };
struct Allocation {
  size_t bytes = 0;   // as asked for
  size_t mapped = 0;  // as mapped (whole pages)
  Kind kind = Kind::Device;
  int fd = -1;        // Device: the memfd that IPC handles name
};

std::mutex& memory_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<uintptr_t, Allocation>& allocations() {  // by base address
  static auto* map = new std::map<uintptr_t, Allocation>;
  return *map;
}

size_t page_round(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

// The allocation holding `p`, or null (memory_mutex held).
std::pair<const uintptr_t, Allocation>* find_allocation(const void* p) {
  auto& all = allocations();
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = all.upper_bound(addr);
  if (it == all.begin()) return nullptr;
  --it;
  return addr < it->first + std::max<size_t>(it->second.bytes, 1) ? &*it : nullptr;
}

// ---- streams and events ---------------------------------------------------------------------

// Everything about streams and events waits on this one condition variable.
std::mutex& queue_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::condition_variable& queue_cv() {
  static auto* cv = new std::condition_variable;
  return *cv;
}

}  // namespace

}  // namespace ringtree::standin

struct CUevent_st {
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // records their streams have reached
  int refs = 1;            // the handle, plus each queued record or wait
};

struct CUstream_st {
  std::deque<std::function<void()>> work;
  bool running = false;  // the worker is inside a closure
  bool closing = false;
  std::thread worker;
  int refs = 1;  // the handle and the worker
};

namespace ringtree::standin {

namespace {

void release_event(CUevent_st* ev) {  // queue_mutex held
  if (--ev->refs == 0) delete ev;
}

void release_stream(CUstream_st* s) {  // queue_mutex held
  if (--s->refs == 0) delete s;
}

void run_stream(CUstream_st* s) {
  std::unique_lock<std::mutex> lock(queue_mutex());
  for (;;) {
    queue_cv().wait(lock, [s] { return !s->work.empty() || s->closing; });
    if (s->work.empty()) break;  // closing, and everything enqueued has run
    std::function<void()> job = std::move(s->work.front());
    s->work.pop_front();
    s->running = true;
    lock.unlock();
    try {
      job();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ringtree CUDA stand-in: a kernel failed: %s\n", e.what());
      sticky_error.store(cudaErrorUnknown);
    }
    job = nullptr;
    lock.lock();
    s->running = false;
    queue_cv().notify_all();
  }
  s->running = false;
  queue_cv().notify_all();
  release_stream(s);
}

CUstream_st* new_stream() {
  auto* s = new CUstream_st;
  s->refs = 2;
  s->worker = std::thread(run_stream, s);
  s->worker.detach();  // a stream destroyed with work queued finishes it on its own
  return s;
}

// Stream 0, the legacy default stream: one more stream, never destroyed.
CUstream_st* resolve(cudaStream_t s) {
  if (s) return s;
  static CUstream_st* legacy = new_stream();
  return legacy;
}

std::mutex& streams_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<CUstream_st*>& live_streams() {  // for cudaDeviceSynchronize
  static auto* v = new std::vector<CUstream_st*>;
  return *v;
}

void drain(CUstream_st* s) {  // waits until everything enqueued so far has run
  std::unique_lock<std::mutex> lock(queue_mutex());
  queue_cv().wait(lock, [s] { return s->work.empty() && !s->running; });
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, std::function<void()> kernel) {
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard<std::mutex> lock(queue_mutex());
    if (s->closing) return fail(cudaErrorInvalidResourceHandle);
    s->work.push_back(std::move(kernel));
  }
  queue_cv().notify_all();
  return cudaSuccess;
}

bool fails(const char* call) {
  static const std::string failing = [] {
    const char* v = std::getenv("RINGTREE_STANDIN_FAIL");
    return std::string(v ? v : "");
  }();
  return !failing.empty() && failing == call;
}

}  // namespace ringtree::standin

using namespace ringtree::standin;

#define STANDIN_FAILS(name) \
  if (fails(#name)) return fail(cudaErrorNotSupported)

cudaError_t cudaGetDeviceCount(int* count) {
  STANDIN_FAILS(cudaGetDeviceCount);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidValue);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  STANDIN_FAILS(cudaDeviceGetAttribute);
  if (device != 0) return fail(cudaErrorInvalidValue);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 4; return cudaSuccess;
    case cudaDevAttrCooperativeLaunch: *value = 1; return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mutex());
    streams = live_streams();
  }
  streams.push_back(resolve(nullptr));
  for (CUstream_st* s : streams) drain(s);
  return static_cast<cudaError_t>(sticky_error.load());
}

cudaError_t cudaGetLastError() {
  const cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorMapBufferObjectFailed: return "cudaErrorMapBufferObjectFailed";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotSupported: return "operation not supported (CUDA stand-in)";
    default: return "unknown error";
  }
}

// ---- memory ---------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  STANDIN_FAILS(cudaMalloc);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const int fd = memfd_create("ringtree-cuda-standin", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  const size_t mapped = page_round(bytes);
  void* p = ftruncate(fd, static_cast<off_t>(mapped)) == 0
                ? mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> lock(memory_mutex());
  allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes, mapped, Kind::Device, fd};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  cudaDeviceSynchronize();  // as CUDA: the device may still be using it
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Device) return fail(cudaErrorInvalidDevicePointer);
  munmap(ptr, it->second.mapped);
  close(it->second.fd);
  allocations().erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t) { return cudaMalloc(ptr, bytes); }

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return enqueue(stream, [ptr] {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations().end()) return;
    munmap(ptr, it->second.mapped);
    close(it->second.fd);
    allocations().erase(it);
  });
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  STANDIN_FAILS(cudaHostAlloc);
  *ptr = nullptr;
  void* p = nullptr;
  if (posix_memalign(&p, 256, std::max<size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0, std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(memory_mutex());
  allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes, bytes, Kind::Host, -1};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Host) return fail(cudaErrorInvalidValue);
  std::free(ptr);
  allocations().erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto* a = find_allocation(host_ptr);
  if (!a || a->second.kind != Kind::Host) return fail(cudaErrorInvalidValue);
  *device_ptr = host_ptr;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  *attr = cudaPointerAttributes{cudaMemoryTypeUnregistered, -1, nullptr, const_cast<void*>(ptr)};
  std::lock_guard<std::mutex> lock(memory_mutex());
  if (auto* a = find_allocation(ptr)) {
    attr->type = a->second.kind == Kind::Host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    attr->device = 0;
    attr->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  drain(resolve(nullptr));  // it runs on the legacy default stream, after what is there
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  STANDIN_FAILS(cudaMemcpyAsync);
  return enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  drain(resolve(nullptr));
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return enqueue(stream, [ptr, value, bytes] { std::memset(ptr, value, bytes); });
}

// ---- IPC ------------------------------------------------------------------------------------

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  STANDIN_FAILS(cudaIpcGetMemHandle);
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Device) return fail(cudaErrorInvalidValue);
  std::memset(handle, 0, sizeof(*handle));
  std::snprintf(handle->reserved, sizeof(handle->reserved), "/proc/%d/fd/%d", static_cast<int>(getpid()),
                it->second.fd);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned) {
  STANDIN_FAILS(cudaIpcOpenMemHandle);
  *ptr = nullptr;
  char path[sizeof(handle.reserved) + 1] = {};
  std::memcpy(path, handle.reserved, sizeof(handle.reserved));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
  struct stat st {};
  void* p = fstat(fd, &st) == 0 && st.st_size > 0
                ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  std::lock_guard<std::mutex> lock(memory_mutex());
  const auto bytes = static_cast<size_t>(st.st_size);
  allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes, bytes, Kind::PeerMapping, -1};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::PeerMapping) return fail(cudaErrorInvalidValue);
  munmap(ptr, it->second.mapped);
  allocations().erase(it);
  return cudaSuccess;
}

// ---- streams and events ---------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  STANDIN_FAILS(cudaStreamCreateWithFlags);
  CUstream_st* s = new_stream();
  std::lock_guard<std::mutex> lock(streams_mutex());
  live_streams().push_back(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(streams_mutex());
    auto& v = live_streams();
    v.erase(std::remove(v.begin(), v.end(), stream), v.end());
  }
  std::lock_guard<std::mutex> lock(queue_mutex());
  stream->closing = true;  // the worker finishes what is queued, then ends
  queue_cv().notify_all();
  release_stream(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  drain(resolve(stream));
  return static_cast<cudaError_t>(sticky_error.load());
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(queue_mutex());
    target = event->recorded;
    if (event->completed >= target) return cudaSuccess;  // nothing to wait for
    ++event->refs;
  }
  return enqueue(stream, [event, target] {
    std::unique_lock<std::mutex> lock(queue_mutex());
    queue_cv().wait(lock, [&] { return event->completed >= target; });
    release_event(event);
  });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  STANDIN_FAILS(cudaLaunchHostFunc);
  return enqueue(stream, [fn, user_data] { fn(user_data); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(queue_mutex());
  release_event(event);  // queued records and waits keep it until they have run
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  STANDIN_FAILS(cudaEventRecord);
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(queue_mutex());
    ticket = ++event->recorded;
    ++event->refs;
  }
  const cudaError_t err = enqueue(stream, [event, ticket] {
    std::lock_guard<std::mutex> lock(queue_mutex());
    event->completed = std::max(event->completed, ticket);
    queue_cv().notify_all();
    release_event(event);
  });
  if (err != cudaSuccess) {
    std::lock_guard<std::mutex> lock(queue_mutex());
    event->completed = std::max(event->completed, ticket);
    release_event(event);
  }
  return err;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (const int sticky = sticky_error.load()) return static_cast<cudaError_t>(sticky);
  std::lock_guard<std::mutex> lock(queue_mutex());
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::unique_lock<std::mutex> lock(queue_mutex());
  const uint64_t target = event->recorded;
  queue_cv().wait(lock, [&] { return event->completed >= target; });
  return static_cast<cudaError_t>(sticky_error.load());
}
