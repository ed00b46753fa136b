// Collectives on CUDA device buffers for a host communicator's ranks (one process per rank),
// with NCCL's stream semantics: a call is enqueued on the caller's stream and returns at once;
// what the caller enqueues on that stream afterwards sees the result. Three ways to move the data:
//
//   ipc     the default when every rank is on this host: the CUDA IPC executor walks the same
//           schedules as the host in a kernel, over mailboxes in device memory that every rank
//           maps through CUDA IPC (ipc_executor.h, step_walker.h). It serves the eight
//           collectives with buffers (all_reduce ... scatter), for algo auto/ring/tree/direct.
//   staged  everything else (another host, no IPC, p2p, all_to_all_v, algo='oneshot'). Device data are copied to pinned
//   host memory on the caller's stream,
//           the host communicator runs the collective (shared memory or TCP, the same schedules
//           as host buffers), and the result is copied back on the same stream. The host call
//           takes its place in the communicator's order when issued, and waits for the stream
//           to deliver its input (a Gate); the stream waits for the host result with a one-thread
//           kernel that polls a pinned counter. So the host never waits for the device, and a
//           dead peer or a timeout still ends the call with an error on every rank. This is also
//           the host-staged fallback between hosts when NCCL is absent.
//   nccl    algo="nccl": the whole collective is handed to NCCL (libnccl.so.2 loaded at run
//           time), for comparison and for GPUs on different hosts. The NCCL communicator is made
//           at the first such call; its unique id travels over the host communicator. A watchdog
//           thread turns a call that does not finish within its timeout into an error (and
//           aborts the NCCL communicator), so a hang inside NCCL is reported, not silent.
//
// Plain C++ header (no CUDA types) so the bindings compile with the host compiler.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include "ringtree/communicator.h"

namespace ringtree {

// True when the CUDA runtime finds at least one device (never throws; reason says why not).
bool cuda_runtime_available(std::string* reason = nullptr);
int cuda_device_count();

// A device collective in flight, whichever executor enqueued it: complete once the device passes
// the point its stream was at when the call was enqueued. wait() blocks the host until then.
class DeviceWork {
 public:
  // `check` runs between polls while waiting (it throws to report a failure early);
  // `finish` runs once the device is done (it throws the call's error, if it had one).
  DeviceWork(uintptr_t stream, std::function<void()> check, std::function<void()> finish);
  ~DeviceWork();
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
  // False if still running after timeout_s (< 0: no limit); rethrows the collective's error.
  bool wait(double timeout_s);
  bool is_completed();

 private:
  int device_;             // the call's, where the event lives
  void* event_ = nullptr;  // a cudaEvent_t
  std::function<void()> check_, finish_;
};

class CudaComm {
 public:
  // `nccl_library_hint`: where the nvidia-nccl wheel keeps libnccl.so.2 ("" if not installed).
  static std::shared_ptr<CudaComm> create(std::shared_ptr<Communicator> host, std::string nccl_library_hint);
  virtual ~CudaComm() = default;
  // args' buffers are device pointers, all on one device, where the call runs whatever device
  // is current (the current device is restored after); every call of a communicator uses the
  // device of its first. Enqueued on `stream` (a cudaStream_t of that device as an integer, 0:
  // the legacy default stream). Invalid arguments throw before anything is enqueued and before
  // any traffic. want_work=false (blocking calls) returns null.
  virtual std::shared_ptr<DeviceWork> run(const CollectiveArgs& args, uintptr_t stream, bool use_nccl,
                                          bool want_work) = 0;
  // "ipc", "staged: <why IPC is not used>", or "not set up" before the first call.
  virtual std::string executor() = 0;
  // Finishes what is queued (the host part), stops the watchdog, releases the NCCL communicator
  // and the staging memory once the device is done with them.
  virtual void close() = 0;
};

}  // namespace ringtree
