// Device-buffer collectives for a host communicator (see device_comm.h).
//
// Staged path, on the caller's stream, for call k of this CudaComm:
//   1. copy the device input into a pinned staging slot (device to host);
//   2. a host function opens call k's Gate: the host communicator, which queued call k in its
//      order when it was issued, starts its traffic on the staging slot;
//   3. a one-thread kernel waits until the pinned counter `released` reaches k; the host
//      communicator's worker sets it when call k has finished, whether it succeeded or failed;
//   4. copy the staging slot back into the device output (host to device).
// The host function only opens the gate and returns: a host function that waited for the
// collective could hold up CUDA's callback thread, and with it the gate of an earlier call
// issued on another stream, until the timeout. Calls finish in issue order, so one counter
// serves every stream.
//
// NCCL path: exec/cuda/nccl_executor.cc.
#include "kernels/cuda/cuda_api.h"
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#include "common/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "exec/cuda/call_watch.h"
#include "exec/cuda/device_comm.h"
#include "exec/cuda/ipc_executor.h"
#include "exec/cuda/launch.h"
#include "exec/cuda/nccl_executor.h"
#include "exec/plan.h"

namespace ringtree {

namespace {

using Clock = std::chrono::steady_clock;

// Loads every kernel of the device path on `device`, once per process, before the first call
// there enqueues anything (see load_device_kernels in launch.h).
void load_kernels_once(int device) {
  static std::mutex mu;
  static std::vector<bool> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(loaded.size()) && loaded[device]) return;
  load_device_kernels();
  if (device >= static_cast<int>(loaded.size())) loaded.resize(device + 1, false);
  loaded[device] = true;
}

void CUDART_CB open_gate(void* data) {
  std::unique_ptr<std::shared_ptr<Gate>> gate(static_cast<std::shared_ptr<Gate>*>(data));
  (*gate)->open();
}

// ---- staging ---------------------------------------------------------------------------------

// Pinned host memory reused across calls; a slot is free again once the device has passed the
// event recorded after its last copy back.
class StagingPool {
 public:
  struct Slot {
    uint8_t* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t free_after = nullptr;
  };
  ~StagingPool() {
    for (auto& s : slots_) release(*s);
  }
  Slot& acquire(size_t bytes) {
    for (auto& s : slots_)
      if (s->bytes >= bytes && event_done(s->free_after)) return *s;
    // Bound the pool: drop a free slot that is too small before growing.
    if (slots_.size() >= kMaxSlots) {
      for (auto it = slots_.begin(); it != slots_.end(); ++it) {
        if (event_done((*it)->free_after)) {
          release(**it);
          slots_.erase(it);
          break;
        }
      }
    }
    auto slot = std::make_unique<Slot>();
    size_t rounded = kMinSlotBytes;
    while (rounded < bytes) rounded *= 2;  // sizes settle after a few calls
    void* host = nullptr;
    RT_CUDA_CHECK(cudaHostAlloc(&host, rounded, cudaHostAllocPortable));
    slot->host = static_cast<uint8_t*>(host);
    slot->bytes = rounded;
    RT_CUDA_CHECK(cudaEventCreateWithFlags(&slot->free_after, cudaEventDisableTiming));
    slots_.push_back(std::move(slot));
    return *slots_.back();
  }

 private:
  static constexpr size_t kMaxSlots = 8;
  static constexpr size_t kMinSlotBytes = 64 << 10;
  static void release(Slot& s) {
    (void)cudaEventSynchronize(s.free_after);  // the device may still be copying out of it
    (void)cudaEventDestroy(s.free_after);
    (void)cudaFreeHost(s.host);
  }
  std::vector<std::unique_ptr<Slot>> slots_;
};

// Where a call's buffers sit in its staging slot: in-place layouts (the same buffer, or one
// inside the other) keep their relative position, so the host collective sees them in place.
struct StagingLayout {
  uint64_t bytes = 0, in_offset = 0, out_offset = 0;
};

StagingLayout lay_out(uintptr_t in, uint64_t in_bytes, uintptr_t out, uint64_t out_bytes) {
  StagingLayout l;
  if (in_bytes && out_bytes &&
      ranges_overlap(reinterpret_cast<void*>(in), in_bytes, reinterpret_cast<void*>(out), out_bytes)) {
    const uintptr_t lo = std::min(in, out);
    l.bytes = std::max(in + in_bytes, out + out_bytes) - lo;
    l.in_offset = in - lo;
    l.out_offset = out - lo;
  } else {
    l.in_offset = 0;
    l.out_offset = (in_bytes + 255) / 256 * 256;
    l.bytes = l.out_offset + out_bytes;
  }
  return l;
}

// ---- the communicator ------------------------------------------------------------------------

// The last finished staged call's ticket, in pinned host memory the device reads (step 3).
struct ReleaseCounter {
  unsigned long long* host = nullptr;
  unsigned long long* on_device = nullptr;
  ReleaseCounter() {
    void* p = nullptr;
    RT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable));
    host = static_cast<unsigned long long*>(p);
    *host = 0;
    const cudaError_t err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&on_device), p, 0);
    if (err != cudaSuccess) {
      (void)cudaFreeHost(p);
      throw_cuda_error(err, "cudaHostGetDevicePointer", __FILE__, __LINE__);
    }
  }
  ~ReleaseCounter() { (void)cudaFreeHost(host); }
  // Called by the host communicator's worker, in ticket order; the staging data it wrote
  // before are visible to the copy back once the device sees the new value.
  void release(unsigned long long ticket) { __atomic_store_n(host, ticket, __ATOMIC_RELEASE); }
};

class CudaCommImpl : public CudaComm {
 public:
  CudaCommImpl(std::shared_ptr<Communicator> host, std::string hint)
      : host_(std::move(host)), hint_(std::move(hint)), released_(std::make_shared<ReleaseCounter>()) {}
  ~CudaCommImpl() override {
    try {
      close();
      DeviceGuard guard(device_);
      staging_.reset();  // waits for the device to finish with each slot
    } catch (const Error& e) {
      std::fprintf(stderr, "ringtree: closing CUDA buffers' communicator: %s\n", e.what());
    }
  }

  std::shared_ptr<DeviceWork> run(const CollectiveArgs& args, uintptr_t stream, bool use_nccl,
                                  bool want_work) override {
    RT_CHECK(!closed_, Aborted, "the communicator is closed");
    RT_CHECK(!host_->is_aborted(), Aborted, collective_name(args.coll), ": the communicator was aborted");
    // The call runs on its buffers' device (c10d's device guard), the one this communicator's
    // first call ran on.
    const int device = call_device(args);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (device_ < 0) device_ = device;
      RT_CHECK(device == device_, InvalidArgument, collective_name(args.coll), ": the buffers are on device ", device,
               " but this communicator's device calls run on device ", device_,
               " (one device per rank and communicator, as with NCCL)");
    }
    DeviceGuard guard(device);
    refuse_stream_capture(collective_name(args.coll), stream);  // before any set-up or enqueue
    load_kernels_once(device);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    if (use_nccl) {
      std::shared_ptr<NcclExecutor> nccl;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!nccl_) nccl_ = NcclExecutor::create(host_, hint_);
        nccl = nccl_;
      }
      return nccl->run(args, stream, want_work);
    }
    if (IpcPath* ipc = ipc_path(); ipc && ipc->takes(args)) return ipc->run(args, stream, want_work);
    return staged(args, s, want_work);
  }

  std::string executor() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ipc_tried_) return "not set up";
    return ipc_ ? "ipc" : "staged: " + ipc_unavailable_;
  }

  void close() override {
    std::shared_ptr<NcclExecutor> nccl;
    std::shared_ptr<IpcPath> ipc;
    int device = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      nccl = std::move(nccl_);
      ipc = std::move(ipc_);
      device = device_;
    }
    DeviceGuard guard(device);
    if (nccl) nccl->close();
    if (ipc) ipc->close();
  }

 private:
  // The CUDA IPC executor, set up by the first call that may use it: a collective, so every
  // rank decides at the same call, and every rank gets the same answer.
  IpcPath* ipc_path() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ipc_tried_) {
      ipc_tried_ = true;
      ipc_ = IpcPath::connect(host_, &ipc_unavailable_);
    }
    return ipc_.get();
  }

  std::shared_ptr<DeviceWork> staged(const CollectiveArgs& user, cudaStream_t stream, bool want_work);

  std::shared_ptr<Communicator> host_;
  std::string hint_;
  std::mutex mu_;  // one staged call is issued at a time: tickets follow the host order
  bool closed_ = false;
  int device_ = -1;  // the device of the first call, which every call uses
  std::unique_ptr<StagingPool> staging_ = std::make_unique<StagingPool>();
  std::shared_ptr<ReleaseCounter> released_;  // shared with the gates of queued calls
  unsigned long long next_ticket_ = 0;
  std::shared_ptr<NcclExecutor> nccl_;
  std::shared_ptr<IpcPath> ipc_;
  bool ipc_tried_ = false;
  std::string ipc_unavailable_;  // why the staged path serves every call, when it does
};

std::shared_ptr<DeviceWork> CudaCommImpl::staged(const CollectiveArgs& user, cudaStream_t stream, bool want_work) {
  const size_t esz = dtype_size(user.dtype);
  const auto in = reinterpret_cast<uintptr_t>(user.input.ptr), out = reinterpret_cast<uintptr_t>(user.output.ptr);
  const uint64_t in_bytes = user.input.present ? user.input.count * esz : 0;
  const uint64_t out_bytes = user.output.present ? user.output.count * esz : 0;
  check_device_buffers(user, current_device());
  host_->validate(user);  // before any staging or traffic

  std::lock_guard<std::mutex> lock(mu_);
  const StagingLayout layout = lay_out(in, in_bytes, out, out_bytes);
  StagingPool::Slot& slot = staging_->acquire(layout.bytes);
  CollectiveArgs host_args = user;
  host_args.input.ptr = slot.host + layout.in_offset;
  host_args.output.ptr = slot.host + layout.out_offset;
  const unsigned long long ticket = next_ticket_ + 1;
  auto gate = std::make_shared<Gate>([released = released_, ticket] { released->release(ticket); });
  host_args.ready = gate;
  std::shared_ptr<Work> host_work = host_->run(host_args, true);  // takes its place in the order
  next_ticket_ = ticket;
  // What the collective writes on this rank: its output, and a broadcast's one buffer.
  const bool broadcast_writes = user.coll == Collective::Broadcast && user.root != host_->rank();
  try {
    if (in_bytes)
      RT_CUDA_CHECK(
          cudaMemcpyAsync(slot.host + layout.in_offset, user.input.ptr, in_bytes, cudaMemcpyDeviceToHost, stream));
    auto* gate_ref = new std::shared_ptr<Gate>(gate);
    const cudaError_t err = cudaLaunchHostFunc(stream, open_gate, gate_ref);
    if (err != cudaSuccess) {
      delete gate_ref;
      throw_cuda_error(err, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
    launch_wait_for_release(released_->on_device, ticket, stream);  // the stream's half (step 3)
    if (out_bytes)
      RT_CUDA_CHECK(
          cudaMemcpyAsync(user.output.ptr, slot.host + layout.out_offset, out_bytes, cudaMemcpyHostToDevice, stream));
    if (broadcast_writes && in_bytes)
      RT_CUDA_CHECK(
          cudaMemcpyAsync(user.input.ptr, slot.host + layout.in_offset, in_bytes, cudaMemcpyHostToDevice, stream));
    RT_CUDA_CHECK(cudaEventRecord(slot.free_after, stream));
  } catch (const Error& e) {
    gate->fail(e.what());  // the queued host call fails on every rank instead of timing out
    throw;
  }
  if (!want_work) return nullptr;
  // Finished before the stream was released: its wait returns at once and rethrows its error.
  return std::make_shared<DeviceWork>(reinterpret_cast<uintptr_t>(stream), nullptr,
                                      [host_work] { host_work->wait(-1.0); });
}

}  // namespace

std::shared_ptr<CudaComm> CudaComm::create(std::shared_ptr<Communicator> host, std::string nccl_library_hint) {
  RT_CHECK(host, InvalidArgument, "CudaComm needs a host communicator");
  std::string why;
  RT_CHECK(cuda_runtime_available(&why), Error, "CUDA buffers need a CUDA device: ", why);
  return std::make_shared<CudaCommImpl>(std::move(host), std::move(nccl_library_hint));
}

}  // namespace ringtree
