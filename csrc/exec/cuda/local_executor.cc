// The single-process, multi-rank GPU executor (see local_executor.h).
//
// It runs the very schedules the host executor runs (build_schedule, same key, same chunk
// boundaries, same reduction order) for P ranks whose buffers share one GPU, from one host
// thread, with CUDA streams and events instead of a transport.
//
// Terms:
//   rank stream   one CUDA stream per rank, owned by the executor. It carries everything that
//                 writes the rank's memory: its local copies, the transfers into it, its premul
//                 and avg passes. Work on one rank stream runs in schedule order.
//   transfer      a matched pair (rank a's Send to b, b's Recv or RecvReduce from a). It is one
//                 device operation enqueued on b's stream that reads a's memory and writes b's:
//                 cudaMemcpyAsync for Recv, the reduce kernel (dst = local (op) incoming, the
//                 host's operand order) for RecvReduce. Ranks share the device, so the receiver
//                 reads the sender's buffer directly; there is no staging.
//   ready event   recorded on a's stream when a enters a step that has sends: a's memory as the
//                 step's sends must read it. A transfer waits on it before reading.
//   done event    recorded on b's stream after a transfer. Rank a waits on the done events of
//                 all its sends before it enters its next step.
//
// The two waits give rendezvous semantics, the model verify/dataflow.cc verifies the schedules under:
// a transfer reads a's data only once a has finished every earlier step (read-after-write), and
// a does not go on to overwrite what it sent, nor does anything later write into it, until the
// receiver has consumed it (write-after-read). Ops within a step touch disjoint memory, so
// running a step's ops in any order, on any of the streams, is allowed.
//
// Walking the schedules: the shared rendezvous walk (algorithms/rendezvous.h, the verifier's
// too) enters every rank's first step, then repeatedly matches pending sends with the receives
// the peers' current steps hold; each transfer is enqueued as it is matched, and a rank
// advances once every op of its step is matched. Enqueueing in this order guarantees every event is recorded before any
// stream is told to wait on it. Only enqueueing happens here; nothing waits for the device.
//
// Stream semantics: on entry every rank stream waits on an event recorded on the caller's
// stream (fork); on exit the caller's stream waits on every rank stream (join). So the
// collective runs after what the caller enqueued before it and before what it enqueues after.
// A later call is ordered after an earlier one on every rank stream, so the executor's cached
// scratch and premul buffers are reused safely.
#include "kernels/cuda/cuda_api.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include "algorithms/verify/rendezvous.h"
#include "algorithms/schedule.h"
#include "common/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "exec/cuda/call_watch.h"
#include "exec/cuda/device_comm.h"
#include "exec/cuda/local_executor.h"
#include "exec/plan.h"

namespace ringtree {

namespace {

// Throws InvalidArgument unless [ptr, ptr + bytes) starts in device memory of `device`.
void check_device_pointer(uintptr_t ptr, uint64_t bytes, int device, const char* what, size_t rank) {
  check_device_buffer(ptr, bytes, device, str_cat("cuda_local_run: ", what, "[", rank, "]"),
                      " (all ranks of one call share one device)");
}

// One rank's call: the arguments as a user of the communicator would give them (a pointer of 0
// is an absent buffer), validated and lowered by the code every executor uses.
struct RankCall {
  CollectiveArgs args;
  CallPlan plan;
  uintptr_t root_source = 0;  // broadcast root: data to copy into its buffer first (0: none)
};

// Everything cuda_local_run checks before touching the device: one plan per rank.
std::vector<RankCall> lower_ranks(const CudaLocalArgs& a) {
  const size_t P = a.inputs.size();
  RT_CHECK(P >= 1, InvalidArgument, "cuda_local_run: give one input pointer per rank (got none)");
  RT_CHECK(P <= 4096, InvalidArgument, "cuda_local_run: at most 4096 ranks, got ", P);
  RT_CHECK(a.outputs.empty() || a.outputs.size() == P, InvalidArgument,
           "cuda_local_run: output pointers must be empty or one per rank: expected ", P, ", got ", a.outputs.size());
  RT_CHECK(a.coll < Collective::Count, InvalidArgument, "cuda_local_run: unknown collective code ",
           static_cast<int>(a.coll));
  const char* name = collective_name(a.coll);
  switch (a.coll) {
    case Collective::Barrier:
    case Collective::Send:
    case Collective::Recv:
    case Collective::AllToAllV:
    case Collective::SendRecv:
      RT_THROW(InvalidArgument, "cuda_local_run: ", name, " is not available on the local GPU executor yet");
    default:
      break;
  }
  RT_CHECK(a.dtype < DataType::Count, InvalidArgument, name, ": unsupported dtype code ", static_cast<int>(a.dtype));
  RT_CHECK(a.algo < Algo::Count, InvalidArgument, name, ": unknown algo code ", static_cast<int>(a.algo));
  RT_CHECK(a.algo != Algo::OneShot, InvalidArgument, name,
           ": algo 'oneshot' runs in the host's shared-memory one-shot slots; the local GPU executor runs message "
           "schedules");
  const std::vector<Algo> supported = supported_algos(a.coll);
  const Algo algo = a.algo == Algo::Auto ? supported.front() : a.algo;
  if (std::find(supported.begin(), supported.end(), algo) == supported.end()) {
    std::string names;
    for (Algo s : supported) names += std::string(algo_name(s)) + ", ";
    RT_THROW(InvalidArgument, name, ": algo '", algo_name(algo), "' is not available; choose from ", names, "auto");
  }
  const uint64_t esz = dtype_size(a.dtype);
  RT_CHECK(a.count <= (uint64_t{1} << 62) / esz / P, InvalidArgument, name, ": count ", a.count, " x ", P,
           " ranks overflows");
  const CollectiveTraits& t = collective_traits(a.coll);
  std::vector<RankCall> calls(P);
  for (size_t r = 0; r < P; ++r) {
    RankCall& rc = calls[r];
    const bool is_root = t.rooted && static_cast<size_t>(a.root) == r;
    const BufferSizes sz = t.sizes(a.count, static_cast<int>(P), is_root);
    uintptr_t in = a.inputs[r], out = a.outputs.empty() ? 0 : a.outputs[r];
    if (a.coll == Collective::Broadcast) {
      // One buffer: the output (the input where no output is given); the root's data come from
      // its input, copied in first when the two differ.
      const uintptr_t buffer = out ? out : in;
      if (is_root && in && in != buffer) rc.root_source = in;
      in = buffer;
      out = 0;
    }
    CollectiveArgs& args = rc.args;
    args.coll = a.coll;
    args.algo = algo;
    args.dtype = a.dtype;
    args.op = a.op;
    args.premul_factor = a.premul_factor;
    args.root = a.root;
    args.input = {reinterpret_cast<void*>(in), sz.input, false, in != 0 || sz.input == 0};
    args.output = {reinterpret_cast<void*>(out), sz.output, false,
                   out != 0 || (sz.output == 0 && t.needs_output(is_root))};
    const ValidatedCall v = validate_call(args, static_cast<int>(r), static_cast<int>(P));
    rc.plan = lower(args, v, static_cast<int>(r), static_cast<int>(P), algo, 0, a.segment_bytes);
  }
  return calls;
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// One rank's progress through its schedule while the host walks all of them.
struct RankRun {
  Schedule sched;
  uint8_t* base[3] = {nullptr, nullptr, nullptr};  // indexed by BufId
  cudaEvent_t ready = nullptr;                     // see "ready event" above; null when the step sends nothing
  std::vector<cudaEvent_t> sends_done;             // "done events" of the current step's sends
};

class Executor {
 public:
  explicit Executor(int device) : device_(device) {}

  CudaLocalStats run(const CudaLocalArgs& a, const std::vector<RankCall>& calls) {
    std::lock_guard<std::mutex> lock(mu_);
    const int P = static_cast<int>(calls.size());
    const size_t esz = dtype_size(a.dtype);
    stats_ = CudaLocalStats{};
    next_event_ = 0;
    ensure_streams(P);
    cudaStream_t caller = reinterpret_cast<cudaStream_t>(a.stream);

    std::vector<RankRun> ranks(P);
    for (int r = 0; r < P; ++r) ranks[r].sched = build_schedule(calls[r].plan.key);
    // Buffers may have to grow; growing waits for earlier calls that still use the old ones.
    for (int r = 0; r < P; ++r) {
      ensure_buffer(scratch_, r, ranks[r].sched.scratch_elems * esz);
      ensure_buffer(temp_, r, calls[r].plan.temp_bytes());
    }

    // Fork: every rank stream starts after what the caller already enqueued.
    cudaEvent_t fork = record(caller);
    for (int r = 0; r < P; ++r) wait(streams_[r], fork);

    for (int r = 0; r < P; ++r) {
      RankRun& st = ranks[r];
      const CallPlan& plan = calls[r].plan;
      if (calls[r].root_source)
        enqueue_copy(plan.output.ptr, reinterpret_cast<const void*>(calls[r].root_source), plan.output.count * esz,
                     streams_[r]);
      RankDevice dev{*this, r};
      st.base[static_cast<int>(BufId::Input)] = run_pre_step(plan, dev);
      st.base[static_cast<int>(BufId::Output)] = static_cast<uint8_t*>(plan.output.ptr);
      st.base[static_cast<int>(BufId::Scratch)] = static_cast<uint8_t*>(scratch_[r].ptr);
    }

    walk(ranks, a, calls.front().plan.combine, esz);

    for (int r = 0; r < P; ++r) {
      RankRun& st = ranks[r];
      // The last step's sends must be consumed before the rank is done (and before avg
      // rewrites an output a peer may still be reading).
      for (cudaEvent_t e : st.sends_done) wait(streams_[r], e);
      st.sends_done.clear();
      RankDevice dev{*this, r};
      run_post_step(calls[r].plan, dev);
      // Join: the caller's stream continues after every rank stream.
      wait(caller, record(streams_[r]));
    }
    return stats_;
  }

  void synchronize() {
    std::lock_guard<std::mutex> lock(mu_);
    sync_streams();
  }

 private:
  // The host-side walk described at the top of this file: the shared rendezvous walk, with
  // entering a step and matching a send to a receive turned into stream work. One-shot ops never
  // get here (validation refuses OneShot); the visitor's inherited one-shot hooks would throw.
  void walk(std::vector<RankRun>& ranks, const CudaLocalArgs& a, ReduceOp combine, size_t esz) {
    struct Enqueue : RendezvousVisitor {
      Executor& ex;
      std::vector<RankRun>& ranks;
      DataType dtype;
      ReduceOp combine;
      size_t esz;
      Enqueue(Executor& e, std::vector<RankRun>& r, DataType t, ReduceOp op, size_t size)
          : ex(e), ranks(r), dtype(t), combine(op), esz(size) {}
      void enter_step(int r, size_t step) override { ex.enter(ranks[r], r, step, esz); }
      void transfer(int from, const Op& snd, int to, const Op& rcv) override {
        ex.transfer(ranks[from], snd, ranks[to], rcv, to, dtype, combine, esz);
      }
    } enqueue(*this, ranks, a.dtype, combine, esz);
    std::vector<const Schedule*> schedules;
    for (const RankRun& st : ranks) schedules.push_back(&st.sched);
    // The schedules are proven by verify_schedules; this guards the executor.
    const std::string problem = walk_rendezvous(schedules, enqueue);
    RT_CHECK(problem.empty(), Error, "internal error: the local GPU executor could not run the schedules of ",
             collective_name(a.coll), " (P=", ranks.size(), ", count=", a.count, "): ", problem);
  }

  // Enqueues the entry work of rank r's step: wait for the previous step's sends, record the
  // ready event, run the step's local copies.
  void enter(RankRun& st, int r, size_t step, size_t esz) {
    cudaStream_t s = streams_[r];
    for (cudaEvent_t e : st.sends_done) wait(s, e);
    st.sends_done.clear();
    const size_t b = st.sched.step_begin(step), e = st.sched.step_end[step];
    bool sends = false;
    for (size_t i = b; i < e; ++i) sends |= st.sched.ops[i].kind == OpKind::Send && st.sched.ops[i].count > 0;
    // Recorded before the copies: sends never read what their own step writes.
    st.ready = sends ? record(s) : nullptr;
    for (size_t i = b; i < e; ++i) {
      const Op& op = st.sched.ops[i];
      if (op.kind == OpKind::Copy) enqueue_copy(at(st, op.dst, esz), at(st, op.src, esz), op.count * esz, s);
    }
  }

  void transfer(RankRun& from, const Op& snd, RankRun& to, const Op& rcv, int to_rank, DataType dtype, ReduceOp combine,
                size_t esz) {
    if (snd.count == 0) return;  // nothing moves; the match alone keeps the walk in step
    cudaStream_t s = streams_[to_rank];
    wait(s, from.ready);
    const uint8_t* incoming = at(from, snd.src, esz);
    uint8_t* dst = at(to, rcv.dst, esz);
    const uint64_t bytes = snd.count * esz;
    if (rcv.kind == OpKind::Recv) {
      enqueue_copy(dst, incoming, bytes, s);
    } else {
      cuda_reduce(dst, at(to, rcv.src, esz), incoming, snd.count, dtype, combine, s);
      count_kernel(3 * bytes);
    }
    stats_.transfers++;
    from.sends_done.push_back(record(s));
  }

  // run_plan's device for rank r: its stream and its temp buffer, counted in the stats.
  struct RankDevice {
    Executor& ex;
    int r;
    uint8_t* temp(size_t) { return static_cast<uint8_t*>(ex.temp_[r].ptr); }
    void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) {
      cuda_scale(dst, src, n, t, factor, ex.streams_[r]);
      ex.count_kernel(2 * n * dtype_size(t));
    }
    void copy(void* dst, const void* src, size_t bytes) { ex.enqueue_copy(dst, src, bytes, ex.streams_[r]); }
    void divide(void* dst, uint64_t n, DataType t, int64_t divisor) {
      cuda_divide(dst, n, t, divisor, ex.streams_[r]);
      ex.count_kernel(2 * n * dtype_size(t));
    }
  };

  static uint8_t* at(const RankRun& st, BufRef ref, size_t esz) {
    return st.base[static_cast<int>(ref.buf)] + ref.offset * esz;
  }

  void enqueue_copy(void* dst, const void* src, uint64_t bytes, cudaStream_t s) {
    if (bytes == 0 || dst == src) return;
    cuda_copy(dst, src, bytes, s);
    stats_.copies++;
    stats_.hbm_bytes += 2 * bytes;
  }

  void count_kernel(uint64_t bytes) {
    stats_.kernels++;
    stats_.hbm_bytes += bytes;
  }

  // Events come from a pool reused by every call: cudaStreamWaitEvent waits for the record that
  // was current when it was called, so re-recording an event later cannot disturb it.
  cudaEvent_t record(cudaStream_t s) {
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      RT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    cudaEvent_t e = events_[next_event_++];
    RT_CUDA_CHECK(cudaEventRecord(e, s));
    stats_.events++;
    return e;
  }

  static void wait(cudaStream_t s, cudaEvent_t e) {
    if (e) RT_CUDA_CHECK(cudaStreamWaitEvent(s, e, 0));
  }

  void ensure_streams(int P) {
    // Non-blocking: the rank streams must not serialise with the legacy default stream behind
    // the executor's back; all ordering is the explicit fork/join above.
    while (static_cast<int>(streams_.size()) < P) {
      cudaStream_t s;
      RT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
    if (static_cast<int>(scratch_.size()) < P) scratch_.resize(P);
    if (static_cast<int>(temp_.size()) < P) temp_.resize(P);
  }

  void ensure_buffer(std::vector<DeviceBuffer>& pool, int r, size_t bytes) {
    DeviceBuffer& b = pool[r];
    if (b.bytes >= bytes) return;
    if (b.ptr) {
      sync_streams();  // an earlier call may still read or write the old buffer
      RT_CUDA_CHECK(cudaFree(b.ptr));
      b = DeviceBuffer{};
    }
    RT_CUDA_CHECK(cudaMalloc(&b.ptr, bytes));
    b.bytes = bytes;
  }

  void sync_streams() {
    for (cudaStream_t s : streams_) RT_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  int device_;
  std::mutex mu_;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  std::vector<DeviceBuffer> scratch_, temp_;
  CudaLocalStats stats_;
};

// One executor per device, created on first use and never destroyed: destroying streams from a
// static destructor can run after the CUDA runtime has shut down at process exit.
Executor* executor_for_current_device(bool create) {
  static std::mutex mu;
  static std::map<int, Executor*> executors;
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = executors.find(dev);
  if (it != executors.end()) return it->second;
  if (!create) return nullptr;
  return executors.emplace(dev, new Executor(dev)).first->second;
}

void require_device(const char* what) {
  std::string reason;
  if (!cuda_runtime_available(&reason)) RT_THROW(Error, what, ": no usable CUDA device (", reason, ")");
}

// Every kernel loaded on the current device before its first launch (see launch.h).
void load_kernels_for_current_device() {
  static std::mutex mu;
  static std::vector<bool> loaded;
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(mu);
  if (dev < static_cast<int>(loaded.size()) && loaded[dev]) return;
  load_reduce_kernels();
  if (dev >= static_cast<int>(loaded.size())) loaded.resize(dev + 1, false);
  loaded[dev] = true;
}

}  // namespace

CudaLocalStats cuda_local_run(const CudaLocalArgs& args) {
  const std::vector<RankCall> calls = lower_ranks(args);
  require_device("cuda_local_run");
  refuse_stream_capture("cuda_local_run", args.stream);
  load_kernels_for_current_device();
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t esz = dtype_size(args.dtype);
  for (size_t r = 0; r < calls.size(); ++r) {
    const CallPlan& p = calls[r].plan;
    check_device_pointer(reinterpret_cast<uintptr_t>(p.input.ptr), p.input.ptr ? p.input.count * esz : 0, dev,
                         "input_ptrs", r);
    check_device_pointer(reinterpret_cast<uintptr_t>(p.output.ptr), p.output.ptr ? p.output.count * esz : 0, dev,
                         "output_ptrs", r);
    check_device_pointer(calls[r].root_source, calls[r].root_source ? p.output.count * esz : 0, dev, "input_ptrs", r);
  }
  return executor_for_current_device(true)->run(args, calls);
}

void cuda_local_synchronize() {
  require_device("cuda_synchronize");
  if (Executor* e = executor_for_current_device(false)) e->synchronize();
  RT_CUDA_CHECK(cudaGetLastError());
}

// The checks every direct kernel entry shares: a device, a known dtype; returns the device.
static int kernel_entry(const char* what, DataType dtype) {
  require_device(what);
  load_kernels_for_current_device();
  RT_CHECK(dtype < DataType::Count, InvalidArgument, what, ": unsupported dtype code ", static_cast<int>(dtype));
  int dev = 0;
  RT_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

void cuda_kernel_reduce(uintptr_t dst, uintptr_t a, uintptr_t b, uint64_t count, DataType dtype, ReduceOp op,
                        uintptr_t stream) {
  RT_CHECK(op < ReduceOp::Count, InvalidArgument, "cuda_kernel_reduce: unknown reduce op code ", static_cast<int>(op));
  const int dev = kernel_entry("cuda_kernel_reduce", dtype);
  refuse_stream_capture("cuda_kernel_reduce", stream);
  const uint64_t bytes = count * dtype_size(dtype);
  check_device_pointer(dst, bytes, dev, "dst", 0);
  check_device_pointer(a, bytes, dev, "a", 0);
  check_device_pointer(b, bytes, dev, "b", 0);
  cuda_reduce(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b), count,
              dtype, op, reinterpret_cast<cudaStream_t>(stream));
}

void cuda_kernel_scale(uintptr_t dst, uintptr_t src, uint64_t count, DataType dtype, double factor, uintptr_t stream) {
  const int dev = kernel_entry("cuda_kernel_scale", dtype);
  refuse_stream_capture("cuda_kernel_scale", stream);
  const uint64_t bytes = count * dtype_size(dtype);
  check_device_pointer(dst, bytes, dev, "dst", 0);
  check_device_pointer(src, bytes, dev, "src", 0);
  cuda_scale(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), count, dtype, factor,
             reinterpret_cast<cudaStream_t>(stream));
}

void cuda_kernel_divide(uintptr_t dst, uint64_t count, DataType dtype, int64_t divisor, uintptr_t stream) {
  const int dev = kernel_entry("cuda_kernel_divide", dtype);
  refuse_stream_capture("cuda_kernel_divide", stream);
  check_device_pointer(dst, count * dtype_size(dtype), dev, "dst", 0);
  cuda_divide(reinterpret_cast<void*>(dst), count, dtype, divisor, reinterpret_cast<cudaStream_t>(stream));
}

void cuda_stream_synchronize(uintptr_t stream) {
  require_device("cuda_stream_synchronize");
  RT_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)));
}

}  // namespace ringtree
