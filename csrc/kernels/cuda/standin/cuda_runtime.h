// A CPU stand-in for the few CUDA runtime calls the host side of the device executors makes
// (CUDA IPC, staged, NCCL, the watchdog), under their CUDA names, so that code runs unchanged
// on machines without a GPU: the stand-in build (RINGTREE_CUDA_STANDIN, module
// ringtree._core_standin) compiles it in place of <cuda_runtime_api.h> (kernels/cuda/cuda_api.h).
//
//   device memory   cudaMalloc maps a memfd of its own (MAP_SHARED), so another process can map
//                   the same pages; cudaMemoryTypeDevice for cudaPointerGetAttributes
//   IPC handles     the path another process opens to reach that memfd: /proc/<pid>/fd/<fd>;
//                   cudaIpcOpenMemHandle maps it
//   pinned memory   cudaHostAlloc is ordinary zeroed memory; its device pointer is itself
//   streams         one worker thread per stream running what was enqueued, in order; stream 0
//                   (the legacy default stream) is one more such stream
//   events          a counter per event: a record enqueues "completed = n" on its stream;
//                   cudaStreamWaitEvent enqueues a wait for the value recorded last
//   kernels         closures on the stream (standin::enqueue): the launchers of the stand-in
//                   build run the same host-side step walker and host kernels there
//
// What it does not model: memory visibility between the device and the host or between
// processes beyond what the CPU's own coherence gives (everything here is host memory), the
// legacy default stream's implicit synchronization with blocking streams, multiple devices,
// and anything about speed. Errors are the CUDA codes the callers test for.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorMapBufferObjectFailed = 205,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef void (*cudaHostFn_t)(void* user_data);
#define CUDART_CB

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

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrCooperativeLaunch = 95,
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

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);

namespace ringtree::standin {

// A kernel of the stand-in build: runs on the stream's thread after everything enqueued there
// before it. A kernel that throws stands for a failed launch: the stream's later work still runs
// and cudaGetLastError on the launching thread cannot see it, as with a real kernel fault, the
// event queries report cudaErrorUnknown from then on (the "sticky" error).
cudaError_t enqueue(cudaStream_t stream, std::function<void()> kernel);

// Test hook: environment RINGTREE_STANDIN_FAIL=<name of a runtime call> makes every call of
// that function in this process fail with cudaErrorNotSupported (e.g. cudaIpcOpenMemHandle),
// to exercise the callers' error paths.
bool fails(const char* call);

}  // namespace ringtree::standin
