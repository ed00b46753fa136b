// The stand-in build's device code (see exec/cuda/launch.h): each launch is a closure on the
// stand-in stream's thread (kernels/cuda/standin/cuda_runtime.h). The walk runs the same
// walk_schedule as the kernel, one host thread per channel with the step walker's host policy,
// over the mailboxes the CUDA IPC transport mapped (shared memory between the rank processes),
// and reports through the same WalkStatus ring and abort word.
#include <time.h>
#include <thread>
#include <vector>
#include "exec/cuda/launch.h"
#include "exec/step_walker_host.h"
#include "kernels/cuda/cuda_check.h"

namespace ringtree {

void launch_walk(const WalkLaunch& l, DataType dtype, ReduceOp op) {
  const ReduceFn fn = reduce_fn(dtype, op);  // avg and premul_sum reduce with sum (plan.combine)
  RT_CUDA_CHECK(standin::enqueue(l.stream, [l, fn] {
    const uint32_t C = l.plan.nchannels;
    RankBarrier barrier;
    barrier.parties = C;
    auto walker = [&](uint32_t ch) {
      // No deadline of its own: as on the device, the watchdog ends a late walk (abort word).
      HostMem mem{fn, Deadline::after_seconds(1e9), &barrier, l.abort, 64};
      std::vector<uint64_t> progress(kWalkerMaxStepOps);
      WalkPlan plan = l.plan;
      plan.channel = ch;
      WalkFault fault;
      const WalkResult result = walk_schedule(plan, mem, progress.data(), &fault);
      WalkStatus* status = l.statuses + ch;
      status->fault = fault;
      status->stop_value = __atomic_load_n(plan.stop_word, __ATOMIC_ACQUIRE);
      __atomic_store_n(&status->result, static_cast<int32_t>(result), __ATOMIC_RELEASE);
    };
    std::vector<std::thread> others;
    for (uint32_t ch = 1; ch < C; ++ch) others.emplace_back(walker, ch);
    walker(0);
    for (auto& t : others) t.join();
  }));
}

void launch_wait_for_release(const volatile unsigned long long* released, unsigned long long ticket,
                             cudaStream_t stream) {
  RT_CUDA_CHECK(standin::enqueue(stream, [released, ticket] {
    const timespec nap{0, 20'000};
    while (__atomic_load_n(const_cast<const unsigned long long*>(released), __ATOMIC_ACQUIRE) < ticket)
      nanosleep(&nap, nullptr);
  }));
}

}  // namespace ringtree
