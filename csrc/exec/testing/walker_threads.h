// The step walker (step_walker.h) for every rank of a collective in this process, each rank
// walking its own schedule over in-memory mailboxes: the CUDA IPC executor's protocol without a
// GPU or other processes, for tests (the test module's walk_on_threads). Two ways to walk:
//   host    the walker's host policy, one thread per rank and channel;
//   device  the CUDA IPC executor's walk kernel itself (exec/cuda/launch.h), one cooperative
//           launch per rank on a stream of its own, through the CUDA stand-in and its
//           CUDA-on-CPU layer (kernels/cuda/standin): 512 CUDA threads per channel as fibers.
#pragma once
#include <cstdint>
#include <vector>
#include "algorithms/schedule.h"

namespace ringtree {

struct ThreadWalkArgs {
  ScheduleKey key;  // key.rank is ignored: every rank runs
  DataType dtype = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  double premul_factor = 1.0;
  std::vector<uint8_t*> inputs, outputs;  // one per rank, as the host executor's bases
  uint64_t slot_bytes = 1 << 16;
  uint32_t slots = 4;
  uint32_t channels = 1;  // walkers (threads) per rank
  double timeout_s = 60;
  std::vector<uint64_t> tags;  // per rank; empty: every rank the same. Differing tags model
                               // ranks that made different calls (a mismatch to detect).
  bool device = false;         // walk with the device kernel (see the top of this file)
};

// Runs the collective; throws Timeout if a rank is still walking after timeout_s, and
// CollectiveMismatch naming the ranks when a chunk's header does not match the receiver's call.
// With `device`, a kernel that faulted (a divergent barrier, say) throws Error with the fault.
void walk_on_threads(const ThreadWalkArgs& args);

}  // namespace ringtree
