// The wait policy's rules (see wait_policy.h).
#include "exec/host/wait_policy.h"

#include "common/check.h"

namespace ringtree {

WaitDecision decide_wait_policy(const WaitCounts& c) {
  WaitDecision d;
  d.oversubscribed = c.local_ranks > c.online_cpus || c.cpu_sharers > c.cpus;
  // A rank whose peers are all across TCP neither spins nor yields: its data arrives through the
  // kernel, which needs the core the spinning rank holds, and on a busy core sched_yield hands a
  // whole time slice to an unrelated task that data arriving on a socket cannot interrupt (no
  // wake-up). Both cost about a millisecond a wait between namespace hosts; poll() wakes it.
  const bool host_peer = c.local_ranks > 1;
  const int64_t spin_us = c.spin_us >= 0 ? c.spin_us : (d.oversubscribed || !host_peer ? 1 : 1000);
  const int64_t yield_us = c.yield_us >= 0 ? c.yield_us : (host_peer ? 2000 : 0);
  d.policy.spin_ns = 1000 * spin_us;
  d.policy.yield_ns = 1000 * yield_us;
  d.text =
      str_cat("spin ", spin_us, " us", c.spin_us >= 0 ? " (RINGTREE_SPIN_US)" : "", ", yield ", yield_us, " us",
              c.yield_us >= 0 ? " (RINGTREE_YIELD_US)" : "", ", then block; ", c.local_ranks, " ranks on this host, ",
              c.cpu_sharers, " allowed the same ", c.cpus, " CPUs", d.oversubscribed ? ": oversubscribed" : "");
  return d;
}

}  // namespace ringtree
