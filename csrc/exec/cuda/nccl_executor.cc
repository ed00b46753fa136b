// The NCCL executor (see nccl_executor.h).
#include "kernels/cuda/cuda_api.h"
#include <chrono>
#include <mutex>
#include <thread>
#include "common/check.h"
#include "exec/cuda/call_watch.h"
#include "exec/cuda/nccl_executor.h"
#include "exec/plan.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "transport/nccl/nccl_library.h"

namespace ringtree {

namespace {

// How a call's elements go to NCCL: as NCCL's type `type`, `per_element` of them per ringtree
// element. NCCL has no int16, uint16 or complex type: a call that only moves data moves their
// bytes, a complex sum reduces the real and imaginary parts as two floats (or doubles), and the
// rest (int16/uint16 reductions, complex products) is refused before any traffic. The float8
// types need NCCL 2.24 to reduce (`version` 0: not known yet; checked again once loaded).
struct NcclType {
  int type;
  uint64_t per_element;
};

NcclType nccl_type(DataType t, bool reduction, ReduceOp combine, int version, const char* name) {
  switch (t) {
    case DataType::Int8:
      return {kNcclInt8, 1};
    case DataType::Uint8:
      return {kNcclUint8, 1};
    case DataType::Int32:
      return {kNcclInt32, 1};
    case DataType::Uint32:
      return {kNcclUint32, 1};
    case DataType::Int64:
      return {kNcclInt64, 1};
    case DataType::Uint64:
      return {kNcclUint64, 1};
    case DataType::Float16:
      return {kNcclFloat16, 1};
    case DataType::BFloat16:
      return {kNcclBfloat16, 1};
    case DataType::Float32:
      return {kNcclFloat32, 1};
    case DataType::Float64:
      return {kNcclFloat64, 1};
    default:
      break;
  }
  RT_CHECK(t < DataType::Count, InvalidArgument, "dtype code ", static_cast<int>(t), " has no NCCL equivalent");
  const bool fp8 = t == DataType::Float8E4M3 || t == DataType::Float8E5M2;
  if (!reduction) return {kNcclUint8, dtype_size(t)};  // data movement: bytes are bytes
  if (fp8) {
    RT_CHECK(version == 0 || version >= kNcclFloat8Version, InvalidArgument, name, ": algo 'nccl' reduces ",
             dtype_name(t), " from NCCL 2.24 on, and this NCCL is ", version / 10000, ".", version / 100 % 100, ".",
             version % 100, "; use algo 'auto', which walks ringtree's schedules");
    return {t == DataType::Float8E4M3 ? kNcclFloat8e4m3 : kNcclFloat8e5m2, 1};
  }
  if (dtype_is_complex(t) && combine == ReduceOp::Sum)
    return {t == DataType::Complex64 ? kNcclFloat32 : kNcclFloat64, 2};
  RT_THROW(InvalidArgument, name, ": algo 'nccl' cannot reduce ", dtype_name(t), " with ", op_name(combine),
           " (NCCL has no ", dtype_name(t), " type", dtype_is_complex(t) ? "; complex sums and averages it can" : "",
           "); use algo 'auto', which walks ringtree's schedules");
}

// The op NCCL reduces with: the plan's combine (avg and premul_sum are sums between the plan's
// pre- and post-steps, so they mean what they mean on every other executor).
int nccl_op(ReduceOp combine) {
  switch (combine) {
    case ReduceOp::Prod:
      return kNcclProd;
    case ReduceOp::Min:
      return kNcclMin;
    case ReduceOp::Max:
      return kNcclMax;
    default:
      return kNcclSum;
  }
}

class NcclPath : public NcclExecutor, public std::enable_shared_from_this<NcclPath> {
 public:
  NcclPath(std::shared_ptr<Communicator> host, std::string hint)
      : host_ptr_(std::move(host)), host_(*host_ptr_), hint_(std::move(hint)) {}
  ~NcclPath() override { close(); }

  std::shared_ptr<DeviceWork> run(const CollectiveArgs& a, uintptr_t stream, bool want_work) override;
  void close() override;
  // Throws the sticky failure, if any.
  void raise_if_failed() {
    std::lock_guard<std::mutex> lock(watch_.mutex());
    if (!failure_.empty()) throw Error(failure_);
  }

 private:
  void init(double timeout_s);
  NcclComm make_comm(const NcclUniqueId& uid, double timeout_s);
  // Waits while a call on the non-blocking communicator is in progress, then check()s it.
  void settle(NcclResult r, const char* call, double timeout_s);
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
  bool non_blocking_ = false;  // made with ncclCommInitRankConfig (blocking = 0)
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
  comm_ = make_comm(uid, timeout_s);
  device_ = device;
  start_watch();
}

// ncclCommInitRank waits inside NCCL for every rank, for ever if one fails in there. So the
// communicator is made non-blocking and polled against the timeout; past it, it is aborted. Its
// later calls may then also answer ncclInProgress: settle() waits for those (NCCL's rule for
// non-blocking communicators). NCCL before 2.14 has no config: a blocking init without a limit.
NcclComm NcclPath::make_comm(const NcclUniqueId& uid, double timeout_s) {
  const int rank = host_.rank();
  NcclComm comm = nullptr;
  if (!api_->CommInitRankConfig) {
    const NcclResult r = api_->CommInitRank(&comm, host_.size(), uid, rank);
    RT_CHECK(r == kNcclSuccess, Error, "ncclCommInitRank failed on rank ", rank, ": ", nccl_error_text(*api_, r));
    return comm;
  }
  NcclConfig config;
  config.blocking = 0;
  NcclResult r = api_->CommInitRankConfig(&comm, host_.size(), uid, rank, &config);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int polls = 0; r == kNcclInProgress && comm; ++polls) {
    if (std::chrono::steady_clock::now() >= deadline) {
      (void)api_->CommAbort(comm);
      RT_THROW(Timeout, "ncclCommInitRankConfig did not finish within ", timeout_s, " s on rank ", rank,
               " (a rank failed inside NCCL's set-up, or never reached it); the NCCL communicator was aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 100 : 2000));
    if (api_->CommGetAsyncError(comm, &r) != kNcclSuccess) r = kNcclInProgress;
  }
  if (r != kNcclSuccess) {
    const std::string why = nccl_error_text(*api_, r, comm);
    if (comm) (void)api_->CommAbort(comm);
    RT_THROW(Error, "ncclCommInitRankConfig failed on rank ", rank, ": ", why);
  }
  non_blocking_ = true;
  return comm;
}

void NcclPath::settle(NcclResult r, const char* call, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int polls = 0; r == kNcclInProgress && non_blocking_; ++polls) {
    RT_CHECK(std::chrono::steady_clock::now() < deadline, Timeout, call, " was still in progress after ", timeout_s,
             " s on rank ", host_.rank());
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 10 : 1000));
    if (api_->CommGetAsyncError(comm_, &r) != kNcclSuccess) r = kNcclInProgress;
  }
  check(r, call);
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
  void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) {
    cuda_scale(dst, src, n, t, factor, stream);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  void divide(void* dst, uint64_t n, DataType t, int64_t divisor) { cuda_divide(dst, n, t, divisor, stream); }
  void walk(const CallPlan& plan, uint8_t* in, uint8_t* out) { path.walk(plan, args, in, out, stream); }
};

std::shared_ptr<DeviceWork> NcclPath::run(const CollectiveArgs& a, uintptr_t stream_handle, bool want_work) {
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  const char* name = collective_name(a.coll);
  RT_CHECK(a.coll != Collective::Barrier, InvalidArgument,
           "barrier has no device buffers; call it without algo='nccl'");
  RT_CHECK(!needs_rank_order(a), InvalidArgument, name,
           ": algo 'nccl' does not reduce in a fixed order, and deterministic",
           " mode (RINGTREE_DETERMINISTIC=1 or deterministic=True) needs one; use algo 'auto' or 'rank_order'");
  RT_CHECK(!collective_traits(a.coll).reduction || !is_bitwise(a.op), InvalidArgument, name, ": algo 'nccl' has no ",
           op_name(a.op), " (NCCL has no bitwise reductions); use algo 'auto', which walks ringtree's schedules");
  const ValidatedCall v = validate_call(a, host_.rank(), host_.size());
  // A dtype NCCL lacks is refused here, before the first call's set-up traffic.
  const bool reduction = collective_traits(a.coll).reduction;
  const ReduceOp combine = a.op == ReduceOp::Avg || a.op == ReduceOp::PremulSum ? ReduceOp::Sum : a.op;
  (void)nccl_type(a.dtype, reduction, combine, api_ ? api_->version : 0, name);
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
  (void)nccl_type(a.dtype, reduction, combine, api_->version, name);  // now that the version is known
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
  const NcclType nt = nccl_type(plan.dtype, collective_traits(plan.key.coll).reduction, plan.combine, api_->version,
                                collective_name(plan.key.coll));
  const int dt = nt.type;
  const uint64_t k = nt.per_element;  // NCCL's counts are in its elements
  const int op = nccl_op(plan.combine);
  const int root = plan.key.root;
  switch (plan.key.coll) {
    case Collective::AllReduce:
      settle(api_->AllReduce(in, out, plan.output.count * k, dt, op, comm_, s), "ncclAllReduce", plan.timeout_s);
      return;
    case Collective::ReduceScatter:
      settle(api_->ReduceScatter(in, out, plan.output.count * k, dt, op, comm_, s), "ncclReduceScatter",
             plan.timeout_s);
      return;
    case Collective::AllGather:
      settle(api_->AllGather(in, out, plan.input.count * k, dt, comm_, s), "ncclAllGather", plan.timeout_s);
      return;
    case Collective::Broadcast:  // one buffer: the plan's input and output
      settle(api_->Broadcast(in, out, plan.input.count * k, dt, root, comm_, s), "ncclBroadcast", plan.timeout_s);
      return;
    case Collective::Reduce:  // out: null off the root (NCCL ignores it there), in place on it
      settle(api_->Reduce(in, out, plan.input.count * k, dt, op, root, comm_, s), "ncclReduce", plan.timeout_s);
      return;
    default:
      break;
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
      if (o.kind == OpKind::Send)
        check(api_->Send(src, o.count * k, dt, o.peer, comm_, s), "ncclSend");
      else if (o.kind == OpKind::Recv)
        check(api_->Recv(dst, o.count * k, dt, o.peer, comm_, s), "ncclRecv");
      else if (dst != src)
        RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, o.count * esz, cudaMemcpyDeviceToDevice, s));
    }
  } catch (...) {
    (void)api_->GroupEnd();
    throw;
  }
  settle(api_->GroupEnd(), "ncclGroupEnd", plan.timeout_s);
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
    if (failure_.empty() && host_.is_aborted()) {
      fail_locked(str_cat(c.what, " on rank ", host_.rank(), ": the communicator was aborted, and so was NCCL's"));
      return;
    }
    NcclResult async_error = kNcclSuccess;
    if (failure_.empty() && api_->CommGetAsyncError(comm_, &async_error) == kNcclSuccess &&
        async_error != kNcclSuccess && async_error != kNcclInProgress)
      fail_locked(
          str_cat(c.what, " failed on rank ", host_.rank(), " in NCCL: ", nccl_error_text(*api_, async_error, comm_)));
  };
  hooks.failed = [this](const CallWatch::Call& c, const std::string& why, bool) {
    fail_locked(str_cat(c.what, " on rank ", host_.rank(), ": ", why, "; the NCCL communicator was aborted"));
  };
  watch_.start(std::move(hooks), device_);
}

void NcclPath::close() {
  std::lock_guard<std::mutex> call_lock(call_mu_);
  if (closed_) return;
  closed_ = true;
  watch_.finish();  // calls still running get until their deadline, then NCCL is aborted
  if (comm_ && !aborted_) (void)api_->CommDestroy(comm_);
  comm_ = nullptr;
}

}  // namespace

std::shared_ptr<NcclExecutor> NcclExecutor::create(std::shared_ptr<Communicator> host, std::string nccl_library_hint) {
  return std::make_shared<NcclPath>(std::move(host), std::move(nccl_library_hint));
}

}  // namespace ringtree
