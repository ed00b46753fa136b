// The single-process, multi-rank GPU executor: ranks as threads of one process sharing one GPU,
// the configuration NCCL refuses. It is also how the GPU path is tested on a machine
// with one GPU.
//
// Plain C++ header (no CUDA types), so the bindings compile with the host compiler; the
// implementation is local_executor.cc. Streams travel as integers (cudaStream_t values,
// 0 = the legacy default stream), device buffers as raw pointers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "ringtree/types.h"

namespace ringtree {

// One collective over P "thread ranks" whose buffers all live on the current CUDA device.
struct CudaLocalArgs {
  Collective coll = Collective::AllReduce;
  Algo algo = Algo::Auto;  // Auto: the collective's default (supported_algos().front())
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  double premul_factor = 1.0;
  int root = 0;
  // Elements, as in ScheduleKey::count: the whole buffer for all_reduce / broadcast / reduce,
  // the per-rank block N for reduce_scatter, all_gather, all_to_all, gather and scatter.
  uint64_t count = 0;
  // One pointer per rank (P = inputs.size()). A pointer a rank does not need may be 0: the
  // non-root inputs of scatter, the non-root outputs of reduce and gather. The root's output
  // of reduce may be 0 (in place). broadcast works on outputs[r] (inputs[r] where that is 0);
  // the root's data come from inputs[root], copied into its output first when they differ.
  // In place as in NCCL: all_reduce in == out; all_gather in == out + r*N; reduce_scatter
  // out == in + r*N.
  std::vector<uintptr_t> inputs, outputs;
  uintptr_t stream = 0;        // the caller's stream: the collective is ordered after what is
                               // already on it, and what is enqueued on it later waits for it
  uint64_t segment_bytes = 0;  // tree/chain segment; 0: RINGTREE_TREE_SEGMENT_BYTES (128 KiB),
                               // the host executor's default, so both run the same schedule
};

// What one call enqueued, for tests and the bench (counts, not timings).
struct CudaLocalStats {
  uint64_t transfers = 0;  // matched send/receive pairs with data (copies and reductions)
  uint64_t copies = 0;     // local Copy ops enqueued
  uint64_t kernels = 0;    // reduce / scale / divide kernel launches
  uint64_t events = 0;     // events recorded (cross-stream dependencies)
  uint64_t hbm_bytes = 0;  // bytes read + written by all of the above, the memory traffic
};

// Validates, then enqueues the whole collective and returns (stream semantics).
CudaLocalStats cuda_local_run(const CudaLocalArgs& args);
// Waits until everything the executor of the current device has enqueued is complete, and
// reports any asynchronous CUDA error as ringtree::Error.
void cuda_local_synchronize();

// The kernels alone, for tests and the bench: enqueue on `stream` and return.
void cuda_kernel_reduce(uintptr_t dst, uintptr_t a, uintptr_t b, uint64_t count, DataType dtype, ReduceOp op,
                        uintptr_t stream);
void cuda_kernel_scale(uintptr_t dst, uintptr_t src, uint64_t count, DataType dtype, double factor, uintptr_t stream);
void cuda_kernel_divide(uintptr_t dst, uint64_t count, DataType dtype, int64_t divisor, uintptr_t stream);
void cuda_stream_synchronize(uintptr_t stream);

}  // namespace ringtree
