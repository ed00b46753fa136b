// The step walker (step_walker.h) on host threads: every rank of a collective as a thread of
// this process (one per channel), each walking its own schedule over in-memory mailboxes. It is the CUDA IPC
// executor's protocol without a GPU, for tests (ringtree._core.walk_on_threads).
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
};

// Runs the collective; throws Timeout if a rank is still walking after timeout_s, and
// CollectiveMismatch naming the ranks when a chunk's header does not match the receiver's call.
void walk_on_threads(const ThreadWalkArgs& args);

}  // namespace ringtree
