// The device code of the device executors (see launch.h): the CUDA IPC executor's walk kernel,
// which runs the step walker (exec/step_walker.h) with a device policy, and the staged path's
// wait on a pinned counter.
#include "exec/cuda/launch.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/reduce_device.cuh"
#include "kernels/cuda/scoped_sync.cuh"

namespace ringtree {

namespace {

constexpr int kWalkThreads = 512;
using sync::Scope;

// The device policy of the walker: thread 0 of the block handles flags; every thread moves data.
// Incoming slots are read with __ldcg (through L2, never a stale L1 line): another rank writes them.
template <typename T, typename F>
struct DeviceMem {
  F f;
  const volatile uint32_t* abort;
  ChannelBarrier* barrier;
  mutable unsigned idle = 0;  // rounds in a row that moved nothing (relax's back-off)

  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ bool agree(bool v) const {
    __shared__ int decision;
    if (threadIdx.x == 0) decision = v ? 1 : 0;
    __syncthreads();
    const bool out = decision != 0;
    __syncthreads();
    return out;
  }
  // dst = src. Where both sit at the same offset within 16 bytes (slots, chunks and blocks
  // mostly do): bytes up to the first 16-byte boundary, 16-byte words, then bytes; where they
  // share the offset within 4 bytes, the same with 4-byte words; else bytes.
  __device__ void copy(void* dst, const void* src, size_t bytes) const {
    if (sync::hold_copy(dst, src, bytes, threadIdx.x, blockDim.x)) return;  // the stand-in's weak mode
    const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    if (((d ^ s) & 15) == 0) {
      copy_words<uint4>(dst, src, bytes);
    } else if (((d ^ s) & 3) == 0) {
      copy_words<unsigned int>(dst, src, bytes);
    } else {
      copy_bytes(static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), bytes);
    }
  }
  __device__ void copy_bytes(unsigned char* out, const unsigned char* in, size_t bytes) const {
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = __ldcg(in + i);
  }
  template <typename W>
  __device__ void copy_words(void* dst, const void* src, size_t bytes) const {
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    size_t head = (sizeof(W) - reinterpret_cast<uintptr_t>(dst) % sizeof(W)) % sizeof(W);
    if (head > bytes) head = bytes;
    const size_t words = (bytes - head) / sizeof(W), done = head + words * sizeof(W);
    copy_bytes(out, in, head);
    W* wout = reinterpret_cast<W*>(out + head);
    const W* win = reinterpret_cast<const W*>(in + head);
    for (size_t i = threadIdx.x; i < words; i += blockDim.x) wout[i] = __ldcg(win + i);
    copy_bytes(out + done, in + done, bytes - done);
  }
  // dst = local (op) incoming: 16 bytes of each operand at a time where all three sit at the
  // same offset within 16 bytes, one element at a time for the rest (cuda::split_by_phase).
  // Both operands through L2: another channel (block) may have written the local one.
  __device__ void reduce(void* dst, const void* local, const void* incoming, size_t count) const {
    cuda::elementwise_strided<cuda::L2Loads>(
        static_cast<T*>(dst), static_cast<const T*>(local), static_cast<const T*>(incoming),
        cuda::split_by_phase<T>(dst, local, incoming, count), f, threadIdx.x, blockDim.x);
  }
  // Every thread's slot writes and reads of the round are done, then the leader alone makes
  // them visible system-wide ahead of its next flag store (walker contract: published()).
  // Why one thread's fence covers the block's accesses, in the PTX memory model: bar.sync is
  // morally strong at CTA scope and orders each thread's earlier accesses before the leader's
  // later ones in causality order; fence.acq_rel.sys is cumulative, so every access in causality
  // order before it (the other threads' slot writes, and their slot reads: no later write of a
  // peer can be seen by them) is ordered before the leader's following st.release.sys of the
  // flag at system scope. A peer that ld.acquire.sys's that flag therefore sees the whole
  // chunk. Before, each of the 512 threads ran membar.sys itself, twice per chunk.
  __device__ void published() const {
    idle = 0;
    __syncthreads();
    if (leader()) sync::fence_release<Scope::System>();
  }
  // Flags, headers, call and stop words: all in mailboxes that other ranks' kernels map (system
  // scope). The acquire orders the block's later slot reads after it: the leader's load, then
  // agree()'s bar.sync, then the other threads' reads.
  __device__ uint64_t load(const uint64_t* p) const { return sync::load_acquire<Scope::System>(p); }
  __device__ void store(uint64_t* p, uint64_t v) const { sync::store_release<Scope::System>(p, v); }
  // The abort word is pinned host memory the host writes.
  __device__ bool stop() const { return sync::load_acquire<Scope::System>(const_cast<const uint32_t*>(abort)) != 0; }
  __device__ bool step_barrier(const WalkPlan& plan) const {
    __shared__ int passed;
    __syncthreads();  // this block's threads are done with the step
    if (gridDim.x == 1) return true;
    // The channels are blocks of one GPU: device scope. Each leader's acq_rel arrival is
    // cumulative over its block's step (ordered before it by the bar.sync above); the last one's
    // release of the generation carries every arrival to the waiters' acquire.
    if (threadIdx.x == 0) {
      passed = 1;
      const unsigned gen = sync::load_acquire<Scope::Device>(&barrier->generation);
      if (sync::fetch_add<Scope::Device>(&barrier->arrived, 1u) == gridDim.x - 1) {
        sync::exchange<Scope::Device>(&barrier->arrived, 0u);
        sync::fetch_add<Scope::Device>(&barrier->generation, 1u);
      } else {
        while (sync::load_acquire<Scope::Device>(&barrier->generation) == gen) {
          if (stop_in_force(plan, *this) != 0 || stop()) {
            passed = 0;
            break;
          }
          relax();
        }
      }
    }
    __syncthreads();
    return passed != 0;
  }
  // A few idle rounds spin (a peer's chunk is usually close); then naps that double up to 8 us,
  // so that a walker waiting on a peer leaves the multiprocessor's issue slots to the rank's
  // other work and to other ranks' kernels sharing the GPU. Any progress (published) resets it.
  __device__ void relax() const {
    ++idle;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    if (idle > 4) __nanosleep(32u << (idle - 4 < 8 ? idle - 4 : 8));
#endif
  }
};

// One block per channel; status[blockIdx.x] gets each channel's outcome.
template <typename T, typename F>
__global__ void __launch_bounds__(kWalkThreads)
    walk_kernel(WalkPlan plan, F f, const volatile uint32_t* abort, WalkStatus* statuses, ChannelBarrier* barrier) {
  __shared__ uint64_t progress[kWalkerMaxStepOps];
  plan.channel = blockIdx.x;
  DeviceMem<T, F> mem{f, abort, barrier};
  WalkFault fault;
  const WalkResult result = walk_schedule(plan, mem, progress, &fault);
  WalkStatus* status = statuses + blockIdx.x;
  if (threadIdx.x == 0) {
    status->fault = fault;
    status->stop_value = stop_in_force(plan, mem);
    // The last channel out leaves the barrier as the next call needs it: a channel that
    // stopped may have arrived at a barrier that then never released.
    if (sync::fetch_add<Scope::Device>(&barrier->exited, 1u) == gridDim.x - 1) {
      sync::exchange<Scope::Device>(&barrier->arrived, 0u);
      sync::exchange<Scope::Device>(&barrier->exited, 0u);
    }
    // Pinned host memory the host polls: the release publishes fault and stop_value first.
    sync::store_release<Scope::System>(&status->result, static_cast<int32_t>(result));
  }
}

template <typename Op>
void launch_walk_with(const WalkLaunch& l, DataType dtype) {
  cuda::for_op_types<Op>(dtype, [&](auto tag) {
    using T = decltype(tag);
    using F = cuda::Combine<T, Op>;
    F f{};
    WalkPlan plan = l.plan;
    const volatile uint32_t* abort = l.abort;
    WalkStatus* statuses = l.statuses;
    ChannelBarrier* barrier = l.barrier;
    void* args[] = {&plan, &f, &abort, &statuses, &barrier};
    // Cooperative: every channel's block is resident at once, as they wait for each other.
    RT_CUDA_CHECK(
        cudaLaunchCooperativeKernel(walk_kernel<T, F>, dim3(l.plan.nchannels), dim3(kWalkThreads), args, 0, l.stream));
  });
}

// The staged path's wait (device_comm.cc, step 3): naps that double up to 8 us, as relax().
__global__ void wait_for_release(const volatile unsigned long long* released, unsigned long long ticket) {
  unsigned nap = 32;
  while (sync::load_acquire<Scope::System>(const_cast<const unsigned long long*>(released)) < ticket) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(nap);
    if (nap < 8192) nap *= 2;
#endif
  }
}

}  // namespace

void launch_walk(const WalkLaunch& l, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::Prod:
      return launch_walk_with<cuda::OpProd>(l, dtype);
    case ReduceOp::Min:
      return launch_walk_with<cuda::OpMin>(l, dtype);
    case ReduceOp::Max:
      return launch_walk_with<cuda::OpMax>(l, dtype);
    case ReduceOp::BitAnd:
      return launch_walk_with<cuda::OpBitAnd>(l, dtype);
    case ReduceOp::BitOr:
      return launch_walk_with<cuda::OpBitOr>(l, dtype);
    case ReduceOp::BitXor:
      return launch_walk_with<cuda::OpBitXor>(l, dtype);
    default:
      return launch_walk_with<cuda::OpSum>(l, dtype);  // sum, avg, premul_sum
  }
}

void launch_wait_for_release(const volatile unsigned long long* released, unsigned long long ticket,
                             cudaStream_t stream) {
  void* args[] = {&released, &ticket};
  RT_CUDA_CHECK(cudaLaunchKernel(wait_for_release, dim3(1), dim3(1), args, 0, stream));
}

void load_device_kernels() {
  cudaFuncAttributes attr;
  cuda::for_each_op_and_type([&](auto op, auto tag) {
    using T = decltype(tag);
    RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, walk_kernel<T, cuda::Combine<T, decltype(op)>>));
  });
  RT_CUDA_CHECK(cudaFuncGetAttributes(&attr, wait_for_release));
  load_reduce_kernels();
}

}  // namespace ringtree
