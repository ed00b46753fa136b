// The device code the host side of the device executors launches (launch.cu): the CUDA IPC
// executor's walk kernel and the staged path's wait. The stand-in build compiles the same
// launch.cu through the CUDA-on-CPU layer (kernels/cuda/standin/cuda_on_cpu.h), so the executors'
// host code and the kernels are the same in both builds.
#pragma once
#include <cstdint>
#include "exec/step_walker.h"
#include "kernels/cuda/cuda_api.h"
#include "ringtree/types.h"

namespace ringtree {

// Where the C walkers of one rank meet after each step (device memory, zeroed once; every
// walk leaves it as it found it, however its channels ended).
struct ChannelBarrier {
  unsigned arrived, generation, exited;
};

// What a walker ended with, written by the walk into pinned host memory.
struct WalkStatus {
  int32_t result;  // WalkResult, or -1 while running
  WalkFault fault;
  uint64_t stop_value;  // Stopped: the stop word that ended this call (0: none; aborted here)
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

// Loads every kernel instance the device executors launch (every walk, the staged wait, the
// reduce/scale/divide kernels) on the current device, before any of them runs. CUDA loads
// kernels lazily by default (since 12.2), and loading may need a context synchronization: the
// first launch of a kernel would then wait for every kernel on the device, breaking "the host
// never waits", and for walks spinning on a peer whose own walk waits on this rank, for ever.
void load_device_kernels();

}  // namespace ringtree
