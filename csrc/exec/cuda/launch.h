// The device code the host side of the device executors launches, behind two functions: in a
// CUDA build kernels (launch.cu); in the stand-in build closures on the stand-in's stream
// threads (standin/launch_standin.cc) that run the same step walker with its host policy. The
// executors' host code (ipc_executor.cc, device_comm.cc) is the same in both builds.
#pragma once
#include <cstdint>
#include "exec/step_walker.h"
#include "kernels/cuda/cuda_api.h"
#include "ringtree/types.h"

namespace ringtree {

// Where the C walkers of one rank meet after each step (device memory, zeroed once).
struct ChannelBarrier {
  unsigned arrived, generation;
};

// What a walker ended with, written by the walk into pinned host memory.
struct WalkStatus {
  int32_t result;  // WalkResult, or -1 while running
  WalkFault fault;
  uint64_t stop_value;  // Stopped: the rank's stop word as the walker left (0: aborted here)
};

// One rank's walk of one call: plan.nchannels walkers (a cooperative kernel of that many
// blocks), statuses[c] for walker c, enqueued on `stream`. abort: pinned, mapped; nonzero ends
// the walk.
struct WalkLaunch {
  WalkPlan plan;
  const volatile uint32_t* abort;
  WalkStatus* statuses;
  ChannelBarrier* barrier;
  cudaStream_t stream;
};
void launch_walk(const WalkLaunch& launch, DataType dtype, ReduceOp op);

// The staged path's wait on `stream` until *released (pinned, mapped) reaches `ticket`.
void launch_wait_for_release(const volatile unsigned long long* released, unsigned long long ticket,
                             cudaStream_t stream);

}  // namespace ringtree
