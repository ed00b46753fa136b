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
// NCCL path: validated like a host call (the host communicator's own checks), then handed to
// NCCL on the caller's stream. Each call records an event that the watchdog follows.
#include <cuda_runtime_api.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#include "common/check.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/reduce.cuh"
#include "exec/cuda/call_watch.cuh"
#include "exec/cuda/device_comm.h"
#include "exec/cuda/ipc_executor.h"
#include "exec/cuda/local_executor.h"
#include "exec/plan.h"
#include "transport/nccl/nccl_library.h"

namespace ringtree {

namespace {

using Clock = std::chrono::steady_clock;

// The stream's half of the handoff (step 3).
__global__ void wait_for_release(const volatile unsigned long long* released, unsigned long long ticket) {
  while (*released < ticket) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(2000);
#endif
  }
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
  if (in_bytes && out_bytes && ranges_overlap(reinterpret_cast<void*>(in), in_bytes, reinterpret_cast<void*>(out),
                                              out_bytes)) {
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

// ---- NCCL ------------------------------------------------------------------------------------

int nccl_dtype(DataType t) {
  switch (t) {
    case DataType::Int8: return kNcclInt8;
    case DataType::Uint8: return kNcclUint8;
    case DataType::Int32: return kNcclInt32;
    case DataType::Int64: return kNcclInt64;
    case DataType::Float16: return kNcclFloat16;
    case DataType::BFloat16: return kNcclBfloat16;
    case DataType::Float32: return kNcclFloat32;
    case DataType::Float64: return kNcclFloat64;
    default: RT_THROW(InvalidArgument, "dtype code ", static_cast<int>(t), " has no NCCL equivalent");
  }
}

// The op NCCL reduces with: the plan's combine (avg and premul_sum are sums between the plan's
// pre- and post-steps, so they mean what they mean on every other executor).
int nccl_op(ReduceOp combine) {
  switch (combine) {
    case ReduceOp::Prod: return kNcclProd;
    case ReduceOp::Min: return kNcclMin;
    case ReduceOp::Max: return kNcclMax;
    default: return kNcclSum;
  }
}

class NcclPath : public std::enable_shared_from_this<NcclPath> {
 public:
  NcclPath(std::shared_ptr<Communicator> host, std::string hint) : host_ptr_(std::move(host)), host_(*host_ptr_),
                                                                     hint_(std::move(hint)) {}
  ~NcclPath() { close(); }

  std::shared_ptr<DeviceWork> run(const CollectiveArgs& a, cudaStream_t stream, bool want_work);
  void close();
  // Throws the sticky failure, if any.
  void raise_if_failed() {
    std::lock_guard<std::mutex> lock(watch_.mutex());
    if (!failure_.empty()) throw Error(failure_);
  }

 private:
  void init(double timeout_s);
  struct Device;  // run_plan's device policy: the caller's stream and NCCL
  void walk(const CallPlan& plan, const CollectiveArgs& a, const uint8_t* in, uint8_t* out, cudaStream_t s);
  void start_watch();
  void fail_locked(const std::string& why);
  void check(NcclResult r, const char* call) {
    if (r != kNcclSuccess && r != kNcclInProgress)
      RT_THROW(Error, call, " failed on rank ", host_.rank(), ": ", nccl_error_text(*api_, r, comm_));
  }

  std::shared_ptr<Communicator> host_ptr_;
  Communicator& host_;
  std::string hint_;
  const NcclApi* api_ = nullptr;
  NcclComm comm_ = nullptr;
  int device_ = -1;
  uint64_t calls_ = 0;
  // call_mu_ serializes calls into NCCL (one rank's calls enter NCCL in issue order); the
  // watch's mutex guards the failure state. The watch never takes call_mu_: a call stuck
  // inside NCCL is exactly what it must be able to abort.
  std::mutex call_mu_;
  std::string failure_;  // sticky once NCCL failed, timed out or could not start
  bool aborted_ = false;
  bool closed_ = false;
  CallWatch watch_;
};

void NcclPath::init(double timeout_s) {
  // Every rank learns whether every rank can start NCCL before any of them enters
  // ncclCommInitRank, which would wait for a rank that never comes.
  std::string why;
  api_ = nccl_api(hint_, &why);
  int device = -1;
  const cudaError_t dev_err = cudaGetDevice(&device);
  if (api_ && dev_err != cudaSuccess) why = str_cat("no usable CUDA device: ", cudaGetErrorString(dev_err));
  NcclUniqueId uid{};
  if (why.empty() && host_.rank() == 0) {
    const NcclResult r = api_->GetUniqueId(&uid);
    if (r != kNcclSuccess) why = str_cat("ncclGetUniqueId failed: ", nccl_error_text(*api_, r));
  }
  const std::string unable = first_rank_unable(host_, why, timeout_s);
  RT_CHECK(unable.empty(), Error, "algo='nccl': ", unable, "; no NCCL communicator was made");
  CollectiveArgs b;
  b.coll = Collective::Broadcast;
  b.dtype = DataType::Uint8;
  b.input = {&uid, sizeof(uid), false, true};
  b.timeout_s = timeout_s;
  host_.run(b, false);
  NcclComm comm = nullptr;
  const NcclResult r = api_->CommInitRank(&comm, host_.size(), uid, host_.rank());
  if (r != kNcclSuccess)
    RT_THROW(Error, "ncclCommInitRank failed on rank ", host_.rank(), ": ", nccl_error_text(*api_, r));
  comm_ = comm;
  device_ = device;
  start_watch();
}

// Stream-ordered: a temp lives from its allocation to its free on the caller's stream, so calls
// on different streams never share one.
struct NcclPath::Device {
  NcclPath& path;
  const CollectiveArgs& args;
  cudaStream_t stream;
  void* temp_ptr = nullptr;
  uint8_t* temp(size_t bytes) {
    RT_CUDA_CHECK(cudaMallocAsync(&temp_ptr, bytes, stream));
    return static_cast<uint8_t*>(temp_ptr);
  }
  void release_temp() {
    if (temp_ptr) RT_CUDA_CHECK(cudaFreeAsync(temp_ptr, stream));
    temp_ptr = nullptr;
  }
  ~Device() {
    if (temp_ptr) (void)cudaFreeAsync(temp_ptr, stream);
  }
  void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) { cuda_scale(dst, src, n, t, factor, stream); }
  void copy(void* dst, const void* src, size_t bytes) {
    RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  void divide(void* dst, uint64_t n, DataType t, int64_t divisor) { cuda_divide(dst, n, t, divisor, stream); }
  void walk(const CallPlan& plan, uint8_t* in, uint8_t* out) { path.walk(plan, args, in, out, stream); }
};

std::shared_ptr<DeviceWork> NcclPath::run(const CollectiveArgs& a, cudaStream_t stream, bool want_work) {
  const char* name = collective_name(a.coll);
  RT_CHECK(a.coll != Collective::Barrier, InvalidArgument, "barrier has no device buffers; call it without algo='nccl'");
  const ValidatedCall v = validate_call(a, host_.rank(), host_.size());
  // A dtype NCCL lacks is refused here, before the first call's set-up traffic.
  (void)nccl_dtype(a.dtype);
  const int device = current_device();
  check_device_buffers(a, device);
  const double timeout_s = a.timeout_s > 0 ? a.timeout_s : host_.default_timeout();
  // NCCL runs whole collectives; the plan's key names the direct schedules it walks as grouped
  // point-to-point calls for the collectives it has no single call for.
  const CallPlan plan = lower(a, v, host_.rank(), host_.size(), supported_algos(a.coll).front(), timeout_s);
  std::lock_guard<std::mutex> call_lock(call_mu_);
  raise_if_failed();
  if (!comm_) {
    try {
      init(timeout_s);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(watch_.mutex());
      failure_ = e.what();  // every rank raised; later calls raise the same at once
      throw;
    }
  }
  RT_CHECK(device == device_, InvalidArgument, name, ": the current device is ", device,
           " but this communicator's NCCL communicator lives on device ", device_);
  Device dev{*this, a, stream};
  run_plan(plan, dev);
  dev.release_temp();
  const uint64_t seq = calls_++;
  watch_.track(stream, seq, timeout_s, str_cat(name, " #", seq, " (algo='nccl')"));
  if (!want_work) return nullptr;
  auto self = shared_from_this();
  auto check = [self] { self->raise_if_failed(); };
  return std::make_shared<DeviceWork>(reinterpret_cast<uintptr_t>(stream), check, check);
}

void NcclPath::walk(const CallPlan& plan, const CollectiveArgs& a, const uint8_t* in, uint8_t* out, cudaStream_t s) {
  const int dt = nccl_dtype(plan.dtype);
  const int op = nccl_op(plan.combine);
  const int root = plan.key.root;
  switch (plan.key.coll) {
    case Collective::AllReduce:
      check(api_->AllReduce(in, out, plan.output.count, dt, op, comm_, s), "ncclAllReduce");
      return;
    case Collective::ReduceScatter:
      check(api_->ReduceScatter(in, out, plan.output.count, dt, op, comm_, s), "ncclReduceScatter");
      return;
    case Collective::AllGather:
      check(api_->AllGather(in, out, plan.input.count, dt, comm_, s), "ncclAllGather");
      return;
    case Collective::Broadcast:  // one buffer: the plan's input and output
      check(api_->Broadcast(in, out, plan.input.count, dt, root, comm_, s), "ncclBroadcast");
      return;
    case Collective::Reduce:  // out: null off the root (NCCL ignores it there), in place on it
      check(api_->Reduce(in, out, plan.input.count, dt, op, root, comm_, s), "ncclReduce");
      return;
    default: break;
  }
  // Everything else is a direct schedule (all_to_all, gather, scatter, all_to_all_v, p2p): its
  // sends and receives go to NCCL as one group, its local copies to the stream. Direct
  // schedules' ops touch disjoint memory and never reduce, so one group keeps their meaning.
  Schedule sched;
  if (plan.key.coll == Collective::AllToAllV) {
    direct_all_to_all_v(sched, host_.size(), host_.rank(), a.send_counts, a.recv_counts);
  } else if (plan.key.coll == Collective::SendRecv) {
    sched.add({OpKind::Send, a.peer, plan.input.count, {}, {BufId::Input, 0}});
    sched.add({OpKind::Recv, a.recv_peer, plan.output.count, {BufId::Output, 0}, {}});
    sched.end_step();
  } else {
    sched = build_schedule(plan.key);
  }
  const size_t esz = plan.elem_size();
  uint8_t* const bases[3] = {const_cast<uint8_t*>(in), out, nullptr};
  check(api_->GroupStart(), "ncclGroupStart");
  try {
    for (const Op& o : sched.ops) {
      RT_CHECK(o.kind != OpKind::RecvReduce && !(o.kind == OpKind::Copy && o.src.buf == BufId::Scratch), Error,
               "internal error: algo='nccl' walks only direct schedules, not ", collective_name(plan.key.coll), "'s");
      if (o.count == 0) continue;
      uint8_t* dst = bases[static_cast<int>(o.dst.buf)] + o.dst.offset * esz;
      const uint8_t* src = bases[static_cast<int>(o.src.buf)] + o.src.offset * esz;
      if (o.kind == OpKind::Send) check(api_->Send(src, o.count, dt, o.peer, comm_, s), "ncclSend");
      else if (o.kind == OpKind::Recv) check(api_->Recv(dst, o.count, dt, o.peer, comm_, s), "ncclRecv");
      else if (dst != src) RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, o.count * esz, cudaMemcpyDeviceToDevice, s));
    }
  } catch (...) {
    (void)api_->GroupEnd();
    throw;
  }
  check(api_->GroupEnd(), "ncclGroupEnd");
}

void NcclPath::fail_locked(const std::string& why) {
  if (failure_.empty()) failure_ = why;
  if (comm_ && !aborted_) {
    aborted_ = true;
    (void)api_->CommAbort(comm_);  // ends NCCL's kernels, so every stream moves on
  }
}

void NcclPath::start_watch() {
  CallWatch::Hooks hooks;
  hooks.running = [this](const CallWatch::Call& c) {
    NcclResult async_error = kNcclSuccess;
    if (failure_.empty() && api_->CommGetAsyncError(comm_, &async_error) == kNcclSuccess &&
        async_error != kNcclSuccess && async_error != kNcclInProgress)
      fail_locked(str_cat(c.what, " failed on rank ", host_.rank(), " in NCCL: ",
                          nccl_error_text(*api_, async_error, comm_)));
  };
  hooks.failed = [this](const CallWatch::Call& c, const std::string& why, bool) {
    fail_locked(str_cat(c.what, " on rank ", host_.rank(), ": ", why, "; the NCCL communicator was aborted"));
  };
  watch_.start(std::move(hooks));
}

void NcclPath::close() {
  std::lock_guard<std::mutex> call_lock(call_mu_);
  if (closed_) return;
  closed_ = true;
  watch_.finish();  // calls still running get until their deadline, then NCCL is aborted
  if (comm_ && !aborted_) (void)api_->CommDestroy(comm_);
  comm_ = nullptr;
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
    close();
    staging_.reset();  // waits for the device to finish with each slot
  }

  std::shared_ptr<DeviceWork> run(const CollectiveArgs& args, uintptr_t stream, bool use_nccl, bool want_work) override {
    RT_CHECK(!closed_, Aborted, "the communicator is closed");
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    if (use_nccl) {
      std::shared_ptr<NcclPath> nccl;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!nccl_) nccl_ = std::make_shared<NcclPath>(host_, hint_);
        nccl = nccl_;
      }
      return nccl->run(args, s, want_work);
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
    std::shared_ptr<NcclPath> nccl;
    std::shared_ptr<IpcPath> ipc;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      nccl = std::move(nccl_);
      ipc = std::move(ipc_);
    }
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
  std::unique_ptr<StagingPool> staging_ = std::make_unique<StagingPool>();
  std::shared_ptr<ReleaseCounter> released_;  // shared with the gates of queued calls
  unsigned long long next_ticket_ = 0;
  std::shared_ptr<NcclPath> nccl_;
  std::shared_ptr<IpcPath> ipc_;
  bool ipc_tried_ = false;
  std::string ipc_unavailable_;  // why the staged path serves every call, when it does
};

std::shared_ptr<DeviceWork> CudaCommImpl::staged(const CollectiveArgs& user, cudaStream_t stream, bool want_work) {
  const char* name = collective_name(user.coll);
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
      RT_CUDA_CHECK(cudaMemcpyAsync(slot.host + layout.in_offset, user.input.ptr, in_bytes, cudaMemcpyDeviceToHost, stream));
    auto* gate_ref = new std::shared_ptr<Gate>(gate);
    const cudaError_t err = cudaLaunchHostFunc(stream, open_gate, gate_ref);
    if (err != cudaSuccess) {
      delete gate_ref;
      throw_cuda_error(err, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
    wait_for_release<<<1, 1, 0, stream>>>(released_->on_device, ticket);
    RT_CUDA_CHECK(cudaGetLastError());
    if (out_bytes)
      RT_CUDA_CHECK(cudaMemcpyAsync(user.output.ptr, slot.host + layout.out_offset, out_bytes, cudaMemcpyHostToDevice,
                                    stream));
    if (broadcast_writes && in_bytes)
      RT_CUDA_CHECK(cudaMemcpyAsync(user.input.ptr, slot.host + layout.in_offset, in_bytes, cudaMemcpyHostToDevice,
                                    stream));
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
