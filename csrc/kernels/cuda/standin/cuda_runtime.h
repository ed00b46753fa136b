// A CPU stand-in for the CUDA runtime API, under the CUDA names, so that the host code of the
// device path (CUDA IPC, staged, NCCL, the watchdog, the thread ranks) runs unchanged on machines
// without a GPU. The test module compiles it in place of <cuda_runtime_api.h>
// (kernels/cuda/cuda_api.h); the device code itself runs through the CUDA-on-CPU layer
// (cuda_on_cpu.h), whose launches this runtime queues on its streams.
//
//   devices         RINGTREE_STANDIN_DEVICES of them (default 1), each with RINGTREE_STANDIN_SMS
//                   multiprocessors (default 4). Every host thread has its own current device,
//                   0 when it starts, as in CUDA.
//   contexts        a device gets a "context" the first time a thread makes a call that needs one
//                   with that device current (cudaSetDevice, allocations, streams, events, copies,
//                   launches); contexts() lists them, so a test can see a thread that touched a
//                   device it should not have (a second context costs GPU memory on a real one)
//   device memory   cudaMalloc maps a memfd of its own (MAP_SHARED), so another process can map
//                   the same pages; a hidden first page records which processes map it
//   IPC handles     the path another process opens to reach that memfd: /proc/<pid>/fd/<fd>;
//                   cudaIpcOpenMemHandle maps it. cudaFree of memory that a live process still
//                   maps (undefined behaviour on a GPU) is recorded as a violation
//   pinned memory   cudaHostAlloc is ordinary zeroed memory; its device pointer is itself
//   streams         one worker thread per stream running what was enqueued, in order; each
//                   device has its legacy default stream (handle 0 or cudaStreamLegacy), and each
//                   thread a per-thread default stream (cudaStreamPerThread)
//   events          a counter per event: a record enqueues "completed = n" on its stream;
//                   cudaStreamWaitEvent enqueues a wait for the value recorded last
//   kernels         a launch (cuda_on_cpu.h) is a closure on its stream. Module loading is lazy,
//                   as CUDA's default since 12.2: the first launch of a kernel that
//                   cudaFuncGetAttributes has not loaded waits until every stream of its device
//                   is idle (the context synchronization loading may need); CUDA_MODULE_LOADING
//                   =EAGER loads every kernel up front
//   faults          a kernel that fails makes the error sticky: every later query, synchronization
//                   and launch reports it, as a real fault does
//
// What it does not model: memory visibility between the device and the host or between
// processes beyond what the CPU's own coherence gives (everything here is host memory), the
// legacy default stream's implicit synchronization with blocking streams, peer access limits,
// and anything about speed. Errors are the CUDA codes the callers test for.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidDevice = 101,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchFailure = 719,
  cudaErrorCooperativeLaunchTooLarge = 720,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
typedef struct CUgraphNode_st* cudaGraphNode_t;
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
typedef void (*cudaHostFn_t)(void* user_data);
#define CUDART_CB
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))

struct uint3 {
  unsigned int x, y, z;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct cudaIpcMemHandle_st {
  char reserved[64];
};
typedef struct cudaIpcMemHandle_st cudaIpcMemHandle_t;

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrCooperativeLaunch = 95,
  cudaDevAttrPciBusId = 33,
  cudaDevAttrPciDeviceId = 34,
  cudaDevAttrPciDomainId = 50,
  cudaDevAttrMpsEnabled = 133,
};

constexpr unsigned cudaStreamDefault = 0x0, cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0, cudaEventDisableTiming = 0x2;
constexpr unsigned cudaHostAllocDefault = 0x0, cudaHostAllocPortable = 0x1, cudaHostAllocMapped = 0x2;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 0x1;

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
const char* cudaGetErrorName(cudaError_t err);
const char* cudaGetErrorString(cudaError_t err);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned flags);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream);

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr);
cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* ptr);

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);

// Stream capture and graphs. A capturing stream records what is enqueued on it (kernels, copies,
// host functions) into its graph instead of running it; a launched graph enqueues the recorded
// work, in order, on the launch stream, as often as it is launched. Synchronizing with a
// capturing stream fails and invalidates the capture, as on a GPU. What the stand-in does not
// model (an event recorded during capture: the fork and join of other streams into it) also
// fails with cudaErrorStreamCaptureUnsupported and invalidates it, so no test passes by a gap.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

namespace ringtree::standin {

// Work on `stream` after everything enqueued there before it (a kernel, a copy, a host
// function). Work that throws stands for a device fault: the error becomes sticky (Fault says
// which code; anything else is cudaErrorLaunchFailure) and the stream's later work still runs.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work);
struct Fault {
  cudaError_t code;
  std::string what;
};

// A kernel launch, as the CUDA-on-CPU layer hands it over: checks the configuration (a
// cooperative grid must fit on the device at once), loads the kernel (lazily, see above), and
// enqueues `grid` on the stream.
struct Launch {
  const void* kernel;  // identifies the kernel for loading and in messages
  dim3 grid, block;
  bool cooperative;
  std::function<void()> run;  // runs the whole grid (on the stream's thread)
};
cudaError_t launch(cudaStream_t stream, Launch launch);
// cudaFuncGetAttributes: loads `kernel` on the current device without waiting for anything.
cudaError_t load_kernel(const void* kernel, cudaFuncAttributes* attr);
// The most blocks of `threads` threads one multiprocessor holds at once (2048 threads, 32 blocks).
int blocks_per_multiprocessor(unsigned threads);

// Test hook: environment RINGTREE_STANDIN_FAIL=<name of a runtime call> makes every call of
// that function in this process fail with cudaErrorNotSupported (e.g. cudaIpcOpenMemHandle),
// to exercise the callers' error paths.
bool fails(const char* call);

// Test hooks: the devices that have a context in this process (sorted); what this process did
// that is undefined behaviour on a GPU (freeing memory other processes still map); the device
// an allocation lives on (-1: not device memory).
std::vector<int> contexts();
void clear_sticky_error();
std::vector<std::string> violations();
int device_of(const void* ptr);
// What makes the memory holding `ptr` shared beyond this process's device (pinned host memory,
// device memory exported or mapped through CUDA IPC), or null: accesses to it need system scope.
const char* shared_beyond_process(const void* ptr);

}  // namespace ringtree::standin

namespace ringtree::cuda_on_cpu {
// Test hooks of the CUDA-on-CPU layer (cuda_on_cpu.h): the order and yields of blocks launched
// from now on (as RINGTREE_STANDIN_SEED and RINGTREE_STANDIN_YIELD set them at start); a fresh
// context after a fault a test provoked.
void set_schedule(uint64_t seed, unsigned yield_percent);
void clear_fault();
}  // namespace ringtree::cuda_on_cpu
