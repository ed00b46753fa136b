// The CUDA IPC executor's host side (see ipc_executor.h and step_walker.h).
//
// Each rank's mailboxes live in its device memory and every peer maps them (the CUDA IPC
// transport, transport/cuda_ipc/mailboxes.h); this file sees them as lanes. One walk per call
// runs C walkers per rank (C thread blocks of a cooperative kernel, launched through
// exec/cuda/launch.h), which meet at a barrier after every step.
// All of a rank's IPC calls run in issue order on one internal stream (forked from and joined
// back to the caller's stream with events), so mailboxes, counters and scratch are never used
// by two calls at once. A watchdog thread follows each call: past its timeout it sets the abort
// word the kernel polls and the peers' stop words, so every rank's kernel ends and reports.
#include "kernels/cuda/cuda_api.h"
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>
#include "common/check.h"
#include "common/settings.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "exec/cuda/call_watch.h"
#include "exec/cuda/device_comm.h"
#include "exec/cuda/ipc_executor.h"
#include "exec/cuda/launch.h"
#include "exec/plan.h"
#include "exec/step_walker.h"
#include "transport/cuda_ipc/mailboxes.h"

namespace ringtree {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kStatusRing = 1024;
constexpr int kMaxIpcRanks = 64;  // 2P+1 ops per step must fit kWalkerMaxStepOps

RT_SETTING(CudaIpc)
RT_SETTING(CudaIpcSlotBytes)
RT_SETTING(CudaIpcSlots)
RT_SETTING(CudaIpcChannels)
constexpr int kMaxChannels = 32;

// A stop word says which call it stops first, who stopped it and why, so the ranks it stops
// report the same kind of error, name that rank, and charge it to that call or a later one,
// never to one they can still finish: bits 0-39 the call's seq + 1 (step_walker.h), bits
// 40-47 the ErrorKind, bits 48-63 the rank + 1. 0: not stopped.
uint64_t stop_word_value(ErrorKind kind, int rank, uint64_t seq) {
  return static_cast<uint64_t>(rank + 1) << 48 | static_cast<uint64_t>(kind) << 40 | stop_seq_bits(seq);
}
int stop_word_rank(uint64_t word) { return static_cast<int>(word >> 48) - 1; }
ErrorKind stop_word_kind(uint64_t word) {
  const auto k = static_cast<uint8_t>(word >> 40);
  return k < static_cast<uint8_t>(ErrorKind::Count) ? static_cast<ErrorKind>(k) : ErrorKind::PeerFailure;
}

// A grow-only device buffer, reallocated in the internal stream's order (no host or device-wide
// synchronization, which would wait for the caller's stream too).
struct DeviceScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
  void* ensure(size_t want, cudaStream_t stream) {
    if (want <= bytes) return ptr;
    if (ptr) RT_CUDA_CHECK(cudaFreeAsync(ptr, stream));
    ptr = nullptr;
    bytes = 0;
    RT_CUDA_CHECK(cudaMallocAsync(&ptr, want, stream));
    bytes = want;
    return ptr;
  }
  ~DeviceScratch() {
    if (ptr) (void)cudaFree(ptr);
  }
};

struct DeviceSchedule {
  Op* ops = nullptr;
  uint32_t* step_end = nullptr;
  uint32_t num_steps = 0;
  uint64_t scratch_elems = 0;
  Schedule host;  // the source of the asynchronous copies into ops and step_end, kept while cached
};

class IpcPathImpl;

// Which GPU a rank's device is (its PCI location, the same in every process of the host) and
// whether its contexts are shared through MPS.
struct GpuPlace {
  int32_t pci_domain = -1, pci_bus = -1, pci_device = -1;
  int32_t mps = 0;
  bool same_gpu(const GpuPlace& o) const {
    return pci_domain == o.pci_domain && pci_bus == o.pci_bus && pci_device == o.pci_device;
  }
};

class IpcPathImpl : public IpcPath, public std::enable_shared_from_this<IpcPathImpl> {
 public:
  IpcPathImpl(std::shared_ptr<Communicator> host)
      : host_(std::move(host)), P_(host_->size()), rank_(host_->rank()), mailboxes_(P_, rank_) {}
  ~IpcPathImpl() override { close(); }

  // Allocates and exports this rank's mailboxes; returns "" or why this rank cannot take part.
  std::string prepare_local(CudaIpcMailboxes::Export* out, GpuPlace* place);
  // Maps the peers' mailboxes; returns "" or why not. Called on every rank or none: from then
  // on peers may map this rank's region, and close() waits for them to let go of it.
  std::string open_peers(const std::vector<CudaIpcMailboxes::Export>& exports) {
    peers_may_map_ = true;
    return mailboxes_.open_peers(exports);
  }
  void finish_setup();
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slots() const { return slots_; }
  uint32_t channels() const { return channels_; }
  // Every rank walks one layout: the smallest slot size, slot count and channel count any rank
  // offered (every rank's region is large enough for it). Ranks set differently would otherwise
  // compute offsets into each other's regions from different layouts and write out of bounds.
  void use_layout(uint64_t slot_bytes, uint32_t slots, uint32_t channels) {
    slot_bytes_ = slot_bytes;
    slots_ = slots;
    channels_ = channels;
    mailboxes_.use_layout(slot_bytes, slots, channels);
  }

  bool takes(const CollectiveArgs& a) const override {
    switch (a.coll) {
      case Collective::AllReduce:
      case Collective::ReduceScatter:
      case Collective::AllGather:
      case Collective::AllToAll:
      case Collective::Broadcast:
      case Collective::Reduce:
      case Collective::Gather:
      case Collective::Scatter:
        return a.algo != Algo::OneShot;
      default:
        return false;
    }
  }
  std::shared_ptr<DeviceWork> run(const CollectiveArgs& a, uintptr_t stream, bool want_work) override;
  void close() override;

  void raise_if_failed() {
    std::lock_guard<std::mutex> lock(watch_.mutex());
    throw_failure_locked();
  }
  // The failure a finished call recorded, if any (the kernel's status for seq).
  void check_finished(uint64_t seq, const std::string& what) {
    std::lock_guard<std::mutex> lock(watch_.mutex());
    // A call the watch no longer follows has been noted, and its status entry may since hold a
    // call kStatusRing later: read it only while the call is still followed.
    if (watch_.follows_locked(seq)) note_status_locked(seq, what);
    throw_failure_locked();
  }

 private:
  const DeviceSchedule& schedule_for(const ScheduleKey& key);
  // Everything one call puts on the streams (run() holds call_mu_).
  void enqueue(const CallPlan& plan, const DeviceSchedule& ds, uint64_t seq, cudaStream_t caller);
  struct Device;  // run_plan's device policy: the internal stream and the walk kernel
  static std::string describe_call(Collective coll, uint64_t seq) {
    return str_cat(collective_name(coll), " device call #", seq, " (CUDA IPC)");
  }
  void throw_failure_locked() const;
  void note_status_locked(uint64_t seq, const std::string& what);
  // Fails the path; `seq`: the first call the failure stops on the peers (this rank has
  // finished every call before it).
  void fail_locked(ErrorKind kind, const std::string& why, uint64_t seq);
  void start_watch();

  std::shared_ptr<Communicator> host_;
  int P_, rank_;
  int device_ = -1;
  uint64_t slot_bytes_ = 0;
  uint32_t slots_ = 0;
  uint32_t channels_ = 1;
  ChannelBarrier* barrier_ = nullptr;  // device memory
  CudaIpcMailboxes mailboxes_;
  WalkerLane* lanes_on_device_ = nullptr;
  WalkerCounters* counters_on_device_ = nullptr;
  cudaStream_t stream_ = nullptr, poison_stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  uint32_t* abort_ = nullptr;  // pinned, mapped: the kernel's abort word
  uint32_t* abort_on_device_ = nullptr;
  WalkStatus* status_ = nullptr;  // pinned, mapped ring, one entry per call
  WalkStatus* status_on_device_ = nullptr;
  uint64_t* stop_value_ = nullptr;  // pinned: what fail_locked writes into the peers' stop words
  DeviceScratch scratch_, temp_;
  std::unordered_map<ScheduleKey, DeviceSchedule, ScheduleKeyHash> schedules_;
  uint64_t seq_ = 0;
  bool closed_ = false;
  bool peers_may_map_ = false;  // open_peers ran (on every rank): close() meets the peers

  std::mutex call_mu_;  // one call is enqueued at a time, in issue order
  // The failure state below is guarded by the watch's mutex.
  bool failed_ = false;
  ErrorKind failure_kind_ = ErrorKind::Error;
  std::string failure_;
  CallWatch watch_;
};

std::string IpcPathImpl::prepare_local(CudaIpcMailboxes::Export* out, GpuPlace* place) {
  if (!CudaIpc()) return "RINGTREE_CUDA_IPC=0";
  if (P_ > kMaxIpcRanks) return str_cat(P_, " ranks (the CUDA IPC executor takes at most ", kMaxIpcRanks, ")");
  const std::vector<std::string> transports = host_->status().transports;
  for (int q = 0; q < P_; ++q)
    if (q != rank_ && transports[q] != "shm") return str_cat("rank ", q, " is on another host");
  slot_bytes_ = static_cast<uint64_t>(CudaIpcSlotBytes()) / 16 * 16;
  slots_ = static_cast<uint32_t>(CudaIpcSlots());
  if (slot_bytes_ < 16 || slots_ < 1) return "RINGTREE_CUDA_IPC_SLOT_BYTES / RINGTREE_CUDA_IPC_SLOTS are too small";
  try {
    RT_CUDA_CHECK(cudaGetDevice(&device_));
    int cooperative = 0, sms = 1;
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device_));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
    if (!cooperative) return "the device cannot launch cooperative kernels";
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&place->pci_domain, cudaDevAttrPciDomainId, device_));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&place->pci_bus, cudaDevAttrPciBusId, device_));
    RT_CUDA_CHECK(cudaDeviceGetAttribute(&place->pci_device, cudaDevAttrPciDeviceId, device_));
    // A driver without the attribute answers an error: count that as no MPS.
    if (cudaDeviceGetAttribute(&place->mps, cudaDevAttrMpsEnabled, device_) != cudaSuccess) {
      place->mps = 0;
      (void)cudaGetLastError();
    }
    const int64_t wanted = CudaIpcChannels() < 1 ? 1 : CudaIpcChannels();
    channels_ = static_cast<uint32_t>(std::min<int64_t>({wanted, kMaxChannels, sms}));
  } catch (const Error& e) {
    return e.what();
  }
  return mailboxes_.allocate(slot_bytes_, slots_, channels_, out);
}

void IpcPathImpl::finish_setup() {
  const std::vector<WalkerLane> lanes = mailboxes_.lanes();
  const size_t boxes = static_cast<size_t>(P_) * channels_;
  RT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  RT_CUDA_CHECK(cudaStreamCreateWithFlags(&poison_stream_, cudaStreamNonBlocking));
  // Set up on the internal stream: synchronous copies would wait for the caller's stream.
  RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&lanes_on_device_), sizeof(WalkerLane) * boxes));
  RT_CUDA_CHECK(
      cudaMemcpyAsync(lanes_on_device_, lanes.data(), sizeof(WalkerLane) * boxes, cudaMemcpyHostToDevice, stream_));
  RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counters_on_device_), sizeof(WalkerCounters) * boxes));
  RT_CUDA_CHECK(cudaMemsetAsync(counters_on_device_, 0, sizeof(WalkerCounters) * boxes, stream_));
  RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&barrier_), sizeof(ChannelBarrier)));
  RT_CUDA_CHECK(cudaMemsetAsync(barrier_, 0, sizeof(ChannelBarrier), stream_));
  RT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `lanes` is the copy's source
  RT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  RT_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  void* p = nullptr;
  RT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  abort_ = static_cast<uint32_t*>(p);
  *abort_ = 0;
  RT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&abort_on_device_), p, 0));
  RT_CUDA_CHECK(
      cudaHostAlloc(&p, sizeof(WalkStatus) * kStatusRing * channels_, cudaHostAllocMapped | cudaHostAllocPortable));
  status_ = static_cast<WalkStatus*>(p);
  std::fill_n(status_, kStatusRing * channels_, WalkStatus{});
  RT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&status_on_device_), p, 0));
  RT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(uint64_t), cudaHostAllocPortable));
  stop_value_ = static_cast<uint64_t*>(p);
  *stop_value_ = 0;
  start_watch();
}

const DeviceSchedule& IpcPathImpl::schedule_for(const ScheduleKey& key) {
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  if (schedules_.size() >= 256) {  // bound the cache; the stream must be done with what it frees
    RT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& kv : schedules_) {
      (void)cudaFree(kv.second.ops);
      (void)cudaFree(kv.second.step_end);
    }
    schedules_.clear();
  }
  DeviceSchedule d;
  d.host = build_schedule(key);
  const Schedule& s = d.host;
  for (size_t k = 0; k < s.num_steps(); ++k)
    RT_CHECK(s.step_end[k] - s.step_begin(k) <= kWalkerMaxStepOps, Error, "internal error: a step of ",
             s.step_end[k] - s.step_begin(k), " ops exceeds the CUDA IPC walker's ", kWalkerMaxStepOps);
  d.num_steps = static_cast<uint32_t>(s.num_steps());
  d.scratch_elems = s.scratch_elems;
  RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.ops), sizeof(Op) * (s.ops.size() + 1)));
  RT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d.step_end), sizeof(uint32_t) * (s.step_end.size() + 1)));
  // On the internal stream, ahead of the walks that read them: a synchronous copy would run on
  // the legacy default stream and wait for what the caller queued there.
  if (!s.ops.empty())
    RT_CUDA_CHECK(cudaMemcpyAsync(d.ops, s.ops.data(), sizeof(Op) * s.ops.size(), cudaMemcpyHostToDevice, stream_));
  if (!s.step_end.empty())
    RT_CUDA_CHECK(cudaMemcpyAsync(d.step_end, s.step_end.data(), sizeof(uint32_t) * s.step_end.size(),
                                  cudaMemcpyHostToDevice, stream_));
  return schedules_.emplace(key, std::move(d)).first->second;
}

std::shared_ptr<DeviceWork> IpcPathImpl::run(const CollectiveArgs& a, uintptr_t stream, bool want_work) {
  const char* name = collective_name(a.coll);
  const ValidatedCall v = validate_call(a, rank_, P_);
  const int device = current_device();
  RT_CHECK(device == device_, InvalidArgument, name, ": the current device is ", device,
           " but this communicator's CUDA IPC mailboxes live on device ", device_);
  check_device_buffers(a, device);
  // Auto takes the collective's default schedule; an explicit algorithm is checked as the host does.
  // Deterministic mode walks the rank-order schedule (one-shot, the host's other choice, runs in host memory).
  const uint64_t bytes = v.count * dtype_size(a.dtype);
  const Algo algo = needs_rank_order(a)    ? Algo::RankOrder
                    : a.algo == Algo::Auto ? supported_algos(a.coll).front()
                                           : host_->choose_algo(a.coll, a.algo, bytes, a.dtype);
  RT_CHECK(!is_hier(algo), InvalidArgument, name, ": algo '", algo_name(algo), "' is for ranks on several hosts; the",
           " CUDA IPC executor's ranks share one, so choose ring, tree, direct or auto");
  const double timeout_s = a.timeout_s > 0 ? a.timeout_s : host_->default_timeout();
  const CallPlan plan = lower(a, v, rank_, P_, algo, timeout_s);
  cudaStream_t caller = reinterpret_cast<cudaStream_t>(stream);

  std::lock_guard<std::mutex> call_lock(call_mu_);
  RT_CHECK(!closed_, Aborted, "the communicator is closed");
  raise_if_failed();
  const uint64_t seq = seq_;
  // At most kStatusRing calls in flight: each has its entry in the status ring until the watch
  // has noted how it ended. Past that, the host waits for the oldest (as NCCL's host waits when
  // its work queue is full), at most its deadline, after which the watch has failed it.
  {
    std::unique_lock<std::mutex> lock(watch_.mutex());
    watch_.wait_until_fewer_locked(lock, seq, kStatusRing);
    throw_failure_locked();
  }
  const DeviceSchedule& ds = schedule_for(plan.key);
  seq_++;
  try {
    enqueue(plan, ds, seq, caller);
  } catch (const Error& e) {
    // This rank's call sequence is now out of step with its peers': nothing more can run here.
    std::lock_guard<std::mutex> lock(watch_.mutex());
    fail_locked(ErrorKind::Error,
                str_cat(describe_call(a.coll, seq), " could not be enqueued on rank ", rank_, ": ", e.what()),
                watch_.oldest_locked(seq));
    throw;
  }
  if (!want_work) return nullptr;
  auto self = shared_from_this();
  return std::make_shared<DeviceWork>(
      reinterpret_cast<uintptr_t>(stream_), [self] { self->raise_if_failed(); },
      [self, seq, what = describe_call(a.coll, seq)] { self->check_finished(seq, what); });
}

// The plan's steps on the internal stream: the pre- and post-steps as stream work, the walk as
// the kernel.
struct IpcPathImpl::Device {
  IpcPathImpl& path;
  const DeviceSchedule& ds;
  uint64_t seq;
  uint8_t* temp(size_t bytes) { return static_cast<uint8_t*>(path.temp_.ensure(bytes, path.stream_)); }
  void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) {
    cuda_scale(dst, src, n, t, factor, path.stream_);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    RT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, path.stream_));
  }
  void divide(void* dst, uint64_t n, DataType t, int64_t divisor) { cuda_divide(dst, n, t, divisor, path.stream_); }
  void walk(const CallPlan& plan, uint8_t* in, uint8_t* out) {
    const size_t esz = plan.elem_size();
    WalkPlan w;
    w.ops = ds.ops;
    w.step_end = ds.step_end;
    w.num_steps = ds.num_steps;
    w.bases[0] = in;
    w.bases[1] = out;
    w.bases[2] = static_cast<uint8_t*>(path.scratch_.ensure(ds.scratch_elems * esz + 16, path.stream_));
    w.lanes = path.lanes_on_device_;
    w.nranks = static_cast<uint32_t>(path.P_);
    w.nchannels = path.channels_;
    w.stop_words = path.mailboxes_.stop_words();
    w.rank = static_cast<uint32_t>(path.rank_);
    w.counters = path.counters_on_device_;
    w.slot_bytes = path.slot_bytes_ / esz * esz;
    w.slots = path.slots_;
    w.elem_size = static_cast<uint32_t>(esz);
    w.tag = plan.fingerprint(seq).tag();
    w.seq = seq;
    w.stop_value = stop_word_value(ErrorKind::CollectiveMismatch, path.rank_, seq);
    WalkStatus* statuses = path.status_ + (seq % kStatusRing) * path.channels_;
    for (uint32_t ch = 0; ch < path.channels_; ++ch) statuses[ch].result = -1;
    WalkLaunch launch{w, path.abort_on_device_, path.status_on_device_ + (seq % kStatusRing) * path.channels_,
                      path.barrier_, path.stream_};
    launch_walk(launch, plan.dtype, plan.combine);
  }
};

void IpcPathImpl::enqueue(const CallPlan& plan, const DeviceSchedule& ds, uint64_t seq, cudaStream_t caller) {
  RT_CUDA_CHECK(cudaEventRecord(fork_, caller));
  RT_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  Device dev{*this, ds, seq};
  run_plan(plan, dev);
  RT_CUDA_CHECK(cudaEventRecord(join_, stream_));
  RT_CUDA_CHECK(cudaStreamWaitEvent(caller, join_, 0));
  watch_.track(stream_, seq, plan.timeout_s, describe_call(plan.key.coll, seq));
}

void IpcPathImpl::throw_failure_locked() const {
  if (failed_) throw_error(failure_kind_, failure_);
}

void IpcPathImpl::note_status_locked(uint64_t seq, const std::string& what) {
  // The first channel that did not finish says why (a mismatch wins over a stop it caused).
  const WalkStatus* statuses = status_ + (seq % kStatusRing) * channels_;
  int32_t result = static_cast<int32_t>(WalkResult::Done);
  WalkFault f;
  uint64_t stopped_by = 0;  // the stop word a stopped channel found
  for (uint32_t ch = 0; ch < channels_; ++ch) {
    const int32_t r = *reinterpret_cast<const volatile int32_t*>(&statuses[ch].result);
    if (r == static_cast<int32_t>(WalkResult::Mismatch)) {
      result = r;
      f = statuses[ch].fault;
      break;
    }
    if (result == static_cast<int32_t>(WalkResult::Done)) result = r;
    if (r == static_cast<int32_t>(WalkResult::Stopped) && !stopped_by) stopped_by = statuses[ch].stop_value;
  }
  if (result == static_cast<int32_t>(WalkResult::Mismatch))
    fail_locked(ErrorKind::CollectiveMismatch,
                str_cat(what, " on rank ", rank_, ": rank ", f.peer, " is in another call (tag ", f.got_tag,
                        f.got_bytes || f.want_bytes ? str_cat(", a chunk of ", f.got_bytes, " bytes") : std::string(),
                        "; this call: tag ", f.want_tag,
                        f.got_bytes || f.want_bytes ? str_cat(", ", f.want_bytes, " bytes") : std::string(),
                        "): the ranks called different collectives, or with different arguments"),
                seq);
  else if (result == static_cast<int32_t>(WalkResult::Stopped) && stopped_by && stop_word_rank(stopped_by) != rank_)
    // Another rank's error, of the same kind here: a mismatch or a timeout is one on every rank.
    fail_locked(stop_word_kind(stopped_by),
                str_cat(what, " on rank ", rank_, " was stopped by rank ", stop_word_rank(stopped_by), ", which ",
                        stop_word_kind(stopped_by) == ErrorKind::CollectiveMismatch ? "found a peer in another call"
                        : stop_word_kind(stopped_by) == ErrorKind::Timeout          ? "timed out"
                        : stop_word_kind(stopped_by) == ErrorKind::Aborted          ? "was aborted"
                                                                                    : "failed",
                        " (its own error says more)"),
                seq);
  else if (result == static_cast<int32_t>(WalkResult::Stopped))
    fail_locked(ErrorKind::PeerFailure,
                str_cat(what, " on rank ", rank_,
                        " was stopped: ", *abort_ ? "this rank aborted it" : "a peer stopped on an error"),
                seq);
}

void IpcPathImpl::fail_locked(ErrorKind kind, const std::string& why, uint64_t seq) {
  if (!failed_) {
    failed_ = true;
    failure_kind_ = kind;
    failure_ = why;
  }
  if (!*abort_) {
    // End this rank's queued and running walks, and the peers' (their stop words, which say
    // who stopped them and why), so every rank reports instead of waiting out its own timeout.
    __atomic_store_n(abort_, 1u, __ATOMIC_RELEASE);
    *stop_value_ = stop_word_value(failure_kind_, rank_, seq);
    for (int q = 0; q < P_; ++q)
      if (uint64_t* stop = mailboxes_.peer_stop_word(q))
        (void)cudaMemcpyAsync(stop, stop_value_, sizeof(uint64_t), cudaMemcpyHostToDevice, poison_stream_);
  }
}

void IpcPathImpl::start_watch() {
  CallWatch::Hooks hooks;
  hooks.completed = [this](const CallWatch::Call& c) { note_status_locked(c.seq, c.what); };
  // comm.abort() (on this rank or, through the control plane, on a peer) ends the walks in flight
  // here and, through the stop words, the peers'.
  hooks.running = [this](const CallWatch::Call& c) {
    if (host_->is_aborted())
      fail_locked(ErrorKind::Aborted, str_cat(c.what, " on rank ", rank_, ": the communicator was aborted"), c.seq);
  };
  hooks.failed = [this](const CallWatch::Call& c, const std::string& why, bool timed_out) {
    fail_locked(timed_out ? ErrorKind::Timeout : ErrorKind::Error, str_cat(c.what, " on rank ", rank_, ": ", why),
                c.seq);
  };
  watch_.start(std::move(hooks), device_);
}

void IpcPathImpl::close() {
  std::lock_guard<std::mutex> call_lock(call_mu_);
  if (closed_) return;
  closed_ = true;
  DeviceGuard guard(device_);
  // Calls still running get until their deadline; then their kernels are stopped, so the
  // synchronization below cannot wait for ever on a peer that is gone.
  watch_.finish();
  if (stream_) (void)cudaStreamSynchronize(stream_);
  if (poison_stream_) (void)cudaStreamSynchronize(poison_stream_);
  // This rank's device is done with the peers' mailboxes, but a slower peer's walk may still
  // acknowledge this rank's chunks or write a stop word into this rank's, and CUDA forbids
  // freeing memory another process maps. So every rank unmaps its peers' regions, all meet, and
  // only then does each free its own. A rank that cannot meet every peer (one failed, or does
  // not close) keeps its region for the life of the process rather than free it under them.
  mailboxes_.unmap_peers();
  bool everyone_unmapped = false;
  if (peers_may_map_) {
    try {
      CollectiveArgs b;
      b.coll = Collective::Barrier;
      b.timeout_s = host_->default_timeout();
      host_->run(b, false);
      everyone_unmapped = true;
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "ringtree: rank %d keeps its CUDA IPC mailboxes allocated: its peers could not confirm "
                   "they no longer map them (%s)\n",
                   rank_, e.what());
    }
  }
  for (auto& kv : schedules_) {
    (void)cudaFree(kv.second.ops);
    (void)cudaFree(kv.second.step_end);
  }
  schedules_.clear();
  if (lanes_on_device_) (void)cudaFree(lanes_on_device_);
  if (barrier_) (void)cudaFree(barrier_);
  barrier_ = nullptr;
  if (counters_on_device_) (void)cudaFree(counters_on_device_);
  mailboxes_.release(peers_may_map_ && !everyone_unmapped);
  if (fork_) (void)cudaEventDestroy(fork_);
  if (join_) (void)cudaEventDestroy(join_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  if (poison_stream_) (void)cudaStreamDestroy(poison_stream_);
  if (abort_) (void)cudaFreeHost(abort_);
  if (status_) (void)cudaFreeHost(status_);
  if (stop_value_) (void)cudaFreeHost(stop_value_);
  lanes_on_device_ = nullptr;
  counters_on_device_ = nullptr;
  fork_ = join_ = nullptr;
  stream_ = poison_stream_ = nullptr;
  abort_ = nullptr;
  status_ = nullptr;
  stop_value_ = nullptr;
}

// What each rank publishes at connect, once every rank has its mailboxes: the layout it
// allocated for and what a peer needs to map them.
struct ConnectRecord {
  uint64_t slot_bytes;
  int32_t slots;
  int32_t channels;
  GpuPlace place;
  CudaIpcMailboxes::Export mailboxes;
};

// Processes that share one GPU without MPS take turns on it in time slices, and a walk that
// waits for a peer's walk waits until the GPU switches to the peer's context: each handoff can
// cost a slice (milliseconds). The walks still progress (their waits back off), so the path stays
// and the lowest rank of each such set says so once per process.
void warn_if_time_sliced(const std::vector<ConnectRecord>& all, int rank) {
  std::vector<int> sharing;
  bool every_one_mps = true;
  for (int q = 0; q < static_cast<int>(all.size()); ++q)
    if (all[q].place.same_gpu(all[static_cast<size_t>(rank)].place)) {
      sharing.push_back(q);
      every_one_mps = every_one_mps && all[q].place.mps;
    }
  if (sharing.size() < 2 || sharing.front() != rank || every_one_mps) return;
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  std::string ranks;
  for (int q : sharing) ranks += str_cat(ranks.empty() ? "" : ", ", q);
  const GpuPlace& g = all[static_cast<size_t>(rank)].place;
  char pci[32];
  std::snprintf(pci, sizeof(pci), "%04x:%02x:%02x", g.pci_domain, g.pci_bus, g.pci_device);
  std::fprintf(stderr,
               "ringtree: ranks %s share the GPU at PCI %s without MPS: the GPU time-slices their processes, "
               "so a CUDA IPC call may wait a time slice at each step; start MPS (nvidia-cuda-mps-control -d) "
               "before the job, or give each rank a GPU of its own\n",
               ranks.c_str(), pci);
}

}  // namespace

std::shared_ptr<IpcPath> IpcPath::connect(std::shared_ptr<Communicator> host, std::string* why) {
  auto path = std::make_shared<IpcPathImpl>(host);
  const int P = host->size();
  ConnectRecord rec{};
  const std::string mine = path->prepare_local(&rec.mailboxes, &rec.place);
  rec.slot_bytes = path->slot_bytes();
  rec.slots = static_cast<int32_t>(path->slots());
  rec.channels = static_cast<int32_t>(path->channels());
  // Round 1: can every rank allocate and export its mailboxes?
  std::string failed = first_rank_unable(*host, mine);
  std::vector<ConnectRecord> all(static_cast<size_t>(P));
  if (failed.empty()) {
    CollectiveArgs g;
    g.coll = Collective::AllGather;
    g.dtype = DataType::Uint8;
    g.input = {&rec, sizeof(rec), true, true};
    g.output = {all.data(), sizeof(rec) * all.size(), false, true};
    host->run(g, false);
    ConnectRecord layout = all[0];
    std::vector<CudaIpcMailboxes::Export> exports(static_cast<size_t>(P));
    for (int q = 0; q < P; ++q) {
      layout.slot_bytes = std::min(layout.slot_bytes, all[q].slot_bytes);
      layout.slots = std::min(layout.slots, all[q].slots);
      layout.channels = std::min(layout.channels, all[q].channels);
      exports[q] = all[q].mailboxes;
    }
    path->use_layout(layout.slot_bytes, static_cast<uint32_t>(std::max(layout.slots, 1)),
                     static_cast<uint32_t>(std::clamp(layout.channels, 1, kMaxChannels)));
    // Round 2: could every rank map every peer's mailboxes? Nobody writes into a peer's
    // mailboxes before every rank has answered here.
    failed = first_rank_unable(*host, path->open_peers(exports));
  }
  if (!failed.empty()) {
    path->close();
    if (why) *why = failed;
    return nullptr;
  }
  path->finish_setup();
  warn_if_time_sliced(all, host->rank());
  return path;
}

}  // namespace ringtree
