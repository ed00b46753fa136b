// The CPU stand-in for the CUDA runtime (see cuda_runtime.h).
#include "kernels/cuda/standin/cuda_runtime.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include "common/env.h"
#include "common/settings.h"

namespace ringtree::standin {

namespace {

constexpr int kMaxDevices = 16;

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
std::atomic<int> sticky_error{cudaSuccess};  // a kernel failed: the "context" is unusable
std::atomic<uint32_t> context_mask{0};

cudaError_t fail(cudaError_t err) {
  last_error = err;
  return err;
}

int device_count() {
  static const int n = static_cast<int>(std::clamp<int64_t>(setting_int(Setting::StandinDevices), 1, kMaxDevices));
  return n;
}

int multiprocessors() {
  static const int n = static_cast<int>(std::clamp<int64_t>(setting_int(Setting::StandinSms), 1, 1024));
  return n;
}

bool eager_loading() {
  static const bool eager = env_str("CUDA_MODULE_LOADING", "LAZY") == "EAGER";
  return eager;
}

// The calling thread's current device now has a context (see "contexts" in the header).
void need_context() { context_mask.fetch_or(1u << current_device, std::memory_order_relaxed); }

// ---- memory ---------------------------------------------------------------------------------

// Device allocations start one page into their memfd: the page before holds the pids of the
// processes that map the allocation through IPC, so a cudaFree that pulls memory from under a
// live importer is seen.
constexpr int kImporterSlots = 128;
struct IpcHeader {
  int32_t importers[kImporterSlots];
};

enum class Kind { Device, PeerMapping, Host };
struct Allocation {
  size_t bytes = 0;         // as asked for (user-visible)
  size_t mapped = 0;        // as mapped from `base` (whole pages)
  uint8_t* base = nullptr;  // the mapping (the header page, then the user's bytes)
  Kind kind = Kind::Device;
  int fd = -1;  // Device: the memfd that IPC handles name
  int device = 0;
  int slot = -1;          // PeerMapping: this process's importer slot in the header
  bool exported = false;  // Device: an IPC handle was made for it
};

std::mutex& memory_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<uintptr_t, Allocation>& allocations() {  // by the user's address
  static auto* map = new std::map<uintptr_t, Allocation>;
  return *map;
}
std::vector<std::string>& violation_list() {  // memory_mutex held
  static auto* v = new std::vector<std::string>;
  return *v;
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
size_t page_round(size_t bytes) { return (std::max<size_t>(bytes, 1) + page_size() - 1) / page_size() * page_size(); }

// The allocation holding `p`, or null (memory_mutex held).
std::pair<const uintptr_t, Allocation>* find_allocation(const void* p) {
  auto& all = allocations();
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = all.upper_bound(addr);
  if (it == all.begin()) return nullptr;
  --it;
  return addr < it->first + std::max<size_t>(it->second.bytes, 1) ? &*it : nullptr;
}

bool process_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// Unmaps a device allocation, recording a violation if another live process still maps it
// (memory_mutex held).
void release_device_allocation(uintptr_t user, Allocation& a) {
  const auto* header = reinterpret_cast<const IpcHeader*>(a.base);
  std::string importers;
  for (int i = 0; i < kImporterSlots; ++i) {
    const int32_t pid = __atomic_load_n(&header->importers[i], __ATOMIC_ACQUIRE);
    if (pid != 0 && pid != getpid() && process_alive(pid))
      importers += (importers.empty() ? "" : ", ") + std::to_string(pid);
  }
  if (!importers.empty()) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "process %d freed device memory at 0x%llx (%zu bytes) that process(es) %s still map through CUDA "
                  "IPC: undefined behaviour on a GPU (cudaFree before the importers' cudaIpcCloseMemHandle)",
                  static_cast<int>(getpid()), static_cast<unsigned long long>(user), a.bytes, importers.c_str());
    std::fprintf(stderr, "ringtree CUDA stand-in: %s\n", line);
    violation_list().push_back(line);
  }
  munmap(a.base, a.mapped);
  close(a.fd);
}

}  // namespace

}  // namespace ringtree::standin

// ---- streams and events -----------------------------------------------------------------------

struct CUevent_st {
  uint64_t recorded = 0;   // records issued
  uint64_t completed = 0;  // records their streams have reached
  int refs = 1;            // the handle, plus each queued record or wait
  int device = 0;
};

struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};

struct CUstream_st {
  std::deque<std::function<void()>> work;
  CUgraph_st* capture = nullptr;  // while capturing: where enqueued work goes instead
  bool capture_invalidated = false;
  bool running = false;  // the worker is inside a closure
  bool closing = false;
  std::thread worker;
  int refs = 1;  // the handle and the worker
  int device = 0;
};

namespace ringtree::standin {

namespace {

// Everything about streams and events waits on this one condition variable.
std::mutex& queue_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::condition_variable& queue_cv() {
  static auto* cv = new std::condition_variable;
  return *cv;
}

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
    } catch (const Fault& f) {
      std::fprintf(stderr, "ringtree CUDA stand-in: %s\n", f.what.c_str());
      int none = cudaSuccess;
      sticky_error.compare_exchange_strong(none, f.code);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ringtree CUDA stand-in: a kernel failed: %s\n", e.what());
      int none = cudaSuccess;
      sticky_error.compare_exchange_strong(none, cudaErrorLaunchFailure);
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

std::mutex& streams_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<CUstream_st*>& live_streams() {  // every stream that may hold work, for device-wide waits
  static auto* v = new std::vector<CUstream_st*>;
  return *v;
}

CUstream_st* new_stream(int device, bool listed) {
  auto* s = new CUstream_st;
  s->refs = 2;
  s->device = device;
  s->worker = std::thread(run_stream, s);
  s->worker.detach();  // a stream destroyed with work queued finishes it on its own
  if (listed) {
    std::lock_guard<std::mutex> lock(streams_mutex());
    live_streams().push_back(s);
  }
  return s;
}

// The legacy default stream of each device (never destroyed), and each thread's per-thread
// default stream of each device.
CUstream_st* legacy_stream(int device) {
  static CUstream_st* legacy[kMaxDevices] = {};
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!legacy[device]) legacy[device] = new_stream(device, true);
  return legacy[device];
}
CUstream_st* per_thread_stream(int device) {
  thread_local CUstream_st* streams[kMaxDevices] = {};
  if (!streams[device]) streams[device] = new_stream(device, true);
  return streams[device];
}

CUstream_st* resolve(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy) return legacy_stream(current_device);
  if (s == cudaStreamPerThread) return per_thread_stream(current_device);
  return s;
}

void drain(CUstream_st* s) {  // waits until everything enqueued so far has run
  std::unique_lock<std::mutex> lock(queue_mutex());
  queue_cv().wait(lock, [s] { return s->work.empty() && !s->running; });
}

// Waits until every stream of `device` is idle: what a device-wide synchronization waits for.
void drain_device(int device) {
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mutex());
    for (CUstream_st* s : live_streams())
      if (s->device == device) streams.push_back(s);
  }
  for (CUstream_st* s : streams) drain(s);
}

cudaError_t enqueue_on(CUstream_st* s, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex());
    if (s->closing) return fail(cudaErrorInvalidResourceHandle);
    if (s->capture) {  // recorded into the graph, run when it is launched
      s->capture->nodes.push_back(std::move(work));
      return cudaSuccess;
    }
    s->work.push_back(std::move(work));
  }
  queue_cv().notify_all();
  return cudaSuccess;
}

// ---- kernels ----------------------------------------------------------------------------------

std::mutex& kernels_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<std::pair<int, const void*>>& loaded_kernels() {  // (device, kernel)
  static auto* s = new std::set<std::pair<int, const void*>>;
  return *s;
}

bool is_loaded(int device, const void* kernel) {
  std::lock_guard<std::mutex> lock(kernels_mutex());
  return loaded_kernels().count({device, kernel}) != 0;
}
void mark_loaded(int device, const void* kernel) {
  std::lock_guard<std::mutex> lock(kernels_mutex());
  loaded_kernels().insert({device, kernel});
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work) {
  return enqueue_on(resolve(stream), std::move(work));
}

int blocks_per_multiprocessor(unsigned threads) {
  if (threads == 0) return 0;
  return static_cast<int>(std::min<unsigned>(32, 2048 / threads));
}

cudaError_t launch(cudaStream_t stream, Launch l) {
  if (const int sticky = sticky_error.load()) return fail(static_cast<cudaError_t>(sticky));
  const uint64_t threads = uint64_t{l.block.x} * l.block.y * l.block.z;
  const uint64_t blocks = uint64_t{l.grid.x} * l.grid.y * l.grid.z;
  if (threads == 0 || threads > 1024 || blocks == 0 || l.grid.x > 0x7fffffffu || l.grid.y > 65535 || l.grid.z > 65535)
    return fail(cudaErrorInvalidConfiguration);
  CUstream_st* s = resolve(stream);
  if (s->device != current_device) return fail(cudaErrorInvalidResourceHandle);  // a stream of another device
  need_context();
  if (l.cooperative &&
      blocks > static_cast<uint64_t>(multiprocessors()) * blocks_per_multiprocessor(static_cast<unsigned>(threads)))
    return fail(cudaErrorCooperativeLaunchTooLarge);
  if (!is_loaded(current_device, l.kernel)) {
    // Lazy loading: loading may need a context synchronization, which waits for every kernel
    // running on the device, including ones that spin until this one runs.
    if (!eager_loading()) drain_device(current_device);
    mark_loaded(current_device, l.kernel);
  }
  return enqueue_on(s, std::move(l.run));
}

cudaError_t load_kernel(const void* kernel, cudaFuncAttributes* attr) {
  need_context();
  mark_loaded(current_device, kernel);
  if (attr) *attr = cudaFuncAttributes{0, 0, 0, 1024, 32, 90, 90};
  return cudaSuccess;
}

bool fails(const char* call) {
  static const std::string failing = setting_str(Setting::StandinFail);
  return !failing.empty() && failing == call;
}

std::vector<int> contexts() {
  std::vector<int> out;
  const uint32_t mask = context_mask.load();
  for (int d = 0; d < kMaxDevices; ++d)
    if (mask & (1u << d)) out.push_back(d);
  return out;
}

void clear_sticky_error() { sticky_error.store(cudaSuccess); }

std::vector<std::string> violations() {
  std::lock_guard<std::mutex> lock(memory_mutex());
  return violation_list();
}

int device_of(const void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto* a = find_allocation(ptr);
  return a && a->second.kind != Kind::Host ? a->second.device : -1;
}

const char* shared_beyond_process(const void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto* a = find_allocation(ptr);
  if (!a) return nullptr;
  switch (a->second.kind) {
    case Kind::Host:
      return "pinned host memory";
    case Kind::PeerMapping:
      return "another process's device memory mapped through CUDA IPC";
    default:
      return a->second.exported ? "device memory exported through CUDA IPC" : nullptr;
  }
}

}  // namespace ringtree::standin

using namespace ringtree::standin;

#define STANDIN_FAILS(name) \
  if (fails(#name)) return fail(cudaErrorNotSupported)

cudaError_t cudaGetDeviceCount(int* count) {
  STANDIN_FAILS(cudaGetDeviceCount);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  need_context();  // since CUDA 12, cudaSetDevice initializes the device's primary context
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  STANDIN_FAILS(cudaDeviceGetAttribute);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = multiprocessors();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = 2048;
      return cudaSuccess;
    case cudaDevAttrCooperativeLaunch:
      *value = 1;
      return cudaSuccess;
    case cudaDevAttrPciBusId:  // one bus per device: the stand-in's devices are distinct GPUs
      *value = device + 1;
      return cudaSuccess;
    case cudaDevAttrPciDeviceId:
    case cudaDevAttrPciDomainId:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMpsEnabled:
      *value = ::ringtree::setting_int(::ringtree::Setting::StandinMps) != 0 ? 1 : 0;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceSynchronize() {
  need_context();
  drain_device(current_device);
  return static_cast<cudaError_t>(sticky_error.load());
}

cudaError_t cudaGetLastError() {
  const cudaError_t err = last_error;
  last_error = cudaSuccess;
  return err;
}

const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorMapBufferObjectFailed:
      return "cudaErrorMapBufferObjectFailed";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorCooperativeLaunchTooLarge:
      return "cudaErrorCooperativeLaunchTooLarge";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorMapBufferObjectFailed:
      return "mapping of buffer object failed";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorCooperativeLaunchTooLarge:
      return "too many blocks in cooperative launch";
    case cudaErrorNotSupported:
      return "operation not supported (CUDA stand-in)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    default:
      return "unknown error";
  }
}

// ---- memory ---------------------------------------------------------------------------------

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  STANDIN_FAILS(cudaMalloc);
  need_context();
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const int fd = memfd_create("ringtree-cuda-standin", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  const size_t mapped = page_size() + page_round(bytes);
  void* p = ftruncate(fd, static_cast<off_t>(mapped)) == 0
                ? mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  if (p == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  auto* base = static_cast<uint8_t*>(p);
  std::lock_guard<std::mutex> lock(memory_mutex());
  allocations()[reinterpret_cast<uintptr_t>(base + page_size())] = {bytes, mapped,         base, Kind::Device,
                                                                    fd,    current_device, -1};
  *ptr = base + page_size();
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  need_context();
  const int device = device_of(ptr);
  drain_device(device < 0 ? current_device : device);  // as CUDA: the device may still be using it
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Device) return fail(cudaErrorInvalidDevicePointer);
  release_device_allocation(it->first, it->second);
  allocations().erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t) { return cudaMalloc(ptr, bytes); }

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  need_context();
  return enqueue(stream, [ptr] {
    std::lock_guard<std::mutex> lock(memory_mutex());
    auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocations().end() || it->second.kind != Kind::Device) return;
    release_device_allocation(it->first, it->second);
    allocations().erase(it);
  });
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  STANDIN_FAILS(cudaHostAlloc);
  need_context();
  *ptr = nullptr;
  void* p = nullptr;
  if (posix_memalign(&p, 256, std::max<size_t>(bytes, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0, std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(memory_mutex());
  allocations()[reinterpret_cast<uintptr_t>(p)] = {bytes,          bytes, static_cast<uint8_t*>(p), Kind::Host, -1,
                                                   current_device, -1};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  need_context();
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Host) return fail(cudaErrorInvalidValue);
  std::free(ptr);
  allocations().erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned) {
  need_context();
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
    attr->device = a->second.device;
    attr->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  need_context();
  drain(resolve(nullptr));  // it runs on the legacy default stream, after what is there
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t stream) {
  STANDIN_FAILS(cudaMemcpyAsync);
  need_context();
  return enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  need_context();
  drain(resolve(nullptr));
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  need_context();
  return enqueue(stream, [ptr, value, bytes] { std::memset(ptr, value, bytes); });
}

// ---- IPC ------------------------------------------------------------------------------------

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  STANDIN_FAILS(cudaIpcGetMemHandle);
  need_context();
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::Device) return fail(cudaErrorInvalidValue);
  it->second.exported = true;
  std::memset(handle, 0, sizeof(*handle));
  std::snprintf(handle->reserved, sizeof(handle->reserved), "/proc/%d/fd/%d", static_cast<int>(getpid()),
                it->second.fd);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned) {
  STANDIN_FAILS(cudaIpcOpenMemHandle);
  need_context();
  *ptr = nullptr;
  char path[sizeof(handle.reserved) + 1] = {};
  std::memcpy(path, handle.reserved, sizeof(handle.reserved));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
  struct stat st{};
  void* p = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) > page_size()
                ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  close(fd);
  if (p == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  auto* base = static_cast<uint8_t*>(p);
  auto* header = reinterpret_cast<IpcHeader*>(base);
  int slot = -1;
  for (int i = 0; i < kImporterSlots && slot < 0; ++i) {
    int32_t expected = 0;
    if (__atomic_compare_exchange_n(&header->importers[i], &expected, static_cast<int32_t>(getpid()), false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      slot = i;
  }
  const auto mapped = static_cast<size_t>(st.st_size);
  std::lock_guard<std::mutex> lock(memory_mutex());
  allocations()[reinterpret_cast<uintptr_t>(base + page_size())] = {
      mapped - page_size(), mapped, base, Kind::PeerMapping, -1, current_device, slot};
  *ptr = base + page_size();
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  need_context();
  std::lock_guard<std::mutex> lock(memory_mutex());
  auto it = allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations().end() || it->second.kind != Kind::PeerMapping) return fail(cudaErrorInvalidValue);
  Allocation& a = it->second;
  if (a.slot >= 0) __atomic_store_n(&reinterpret_cast<IpcHeader*>(a.base)->importers[a.slot], 0, __ATOMIC_RELEASE);
  munmap(a.base, a.mapped);
  allocations().erase(it);
  return cudaSuccess;
}

// ---- streams and events ---------------------------------------------------------------------

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  STANDIN_FAILS(cudaStreamCreateWithFlags);
  need_context();
  *stream = new_stream(current_device, true);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return fail(cudaErrorInvalidResourceHandle);
  need_context();
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

// A capturing stream: invalidates its capture and says so (what CUDA does for an operation that
// cannot be captured); else cudaSuccess.
static cudaError_t refuse_in_capture(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(queue_mutex());
  if (!s->capture) return cudaSuccess;
  s->capture_invalidated = true;
  return fail(cudaErrorStreamCaptureUnsupported);
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  need_context();
  CUstream_st* s = resolve(stream);
  if (s == legacy_stream(s->device)) return fail(cudaErrorStreamCaptureUnsupported);  // as CUDA
  std::lock_guard<std::mutex> lock(queue_mutex());
  if (s->capture) return fail(cudaErrorInvalidValue);
  s->capture = new CUgraph_st;
  s->capture_invalidated = false;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(queue_mutex());
  if (!s->capture) return fail(cudaErrorInvalidValue);
  *graph = s->capture;
  s->capture = nullptr;
  if (s->capture_invalidated) {
    delete *graph;
    *graph = nullptr;
    return fail(cudaErrorStreamCaptureInvalidated);
  }
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(queue_mutex());
  *status = !s->capture              ? cudaStreamCaptureStatusNone
            : s->capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (!graph || nodes) return fail(cudaErrorInvalidValue);  // the count only
  *count = graph->nodes.size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return fail(cudaErrorInvalidValue);
  need_context();
  for (const auto& node : exec->nodes)
    if (const cudaError_t err = enqueue(stream, node); err != cudaSuccess) return err;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  need_context();
  if (const cudaError_t err = refuse_in_capture(resolve(stream)); err != cudaSuccess) return err;
  drain(resolve(stream));
  return static_cast<cudaError_t>(sticky_error.load());
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  need_context();
  // Waiting in a capture on an event from outside it: not modelled (see the header).
  if (const cudaError_t err = refuse_in_capture(resolve(stream)); err != cudaSuccess) return err;
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
  need_context();
  return enqueue(stream, [fn, user_data] { fn(user_data); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  need_context();
  *event = new CUevent_st;
  (*event)->device = current_device;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  need_context();
  std::lock_guard<std::mutex> lock(queue_mutex());
  release_event(event);  // queued records and waits keep it until they have run
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  STANDIN_FAILS(cudaEventRecord);
  need_context();
  CUstream_st* s = resolve(stream);
  if (s->device != event->device) return fail(cudaErrorInvalidResourceHandle);  // as CUDA: one device
  // An event recorded in a capture: not modelled (see the header).
  if (const cudaError_t err = refuse_in_capture(s); err != cudaSuccess) return err;
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(queue_mutex());
    ticket = ++event->recorded;
    ++event->refs;
  }
  const cudaError_t err = enqueue_on(s, [event, ticket] {
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
  need_context();
  if (const int sticky = sticky_error.load()) return static_cast<cudaError_t>(sticky);
  std::lock_guard<std::mutex> lock(queue_mutex());
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  need_context();
  std::unique_lock<std::mutex> lock(queue_mutex());
  const uint64_t target = event->recorded;
  queue_cv().wait(lock, [&] { return event->completed >= target; });
  return static_cast<cudaError_t>(sticky_error.load());
}
