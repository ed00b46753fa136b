// How long a rank spins and yields before it blocks (backoff.h), as a pure function of the counts
// it is decided from, so each rule can be tested alone:
//   - oversubscribed: more ranks on this host than CPUs this process may use, or more ranks on
//     this kernel allowed exactly this rank's CPUs (other containers and network namespaces
//     count) than those CPUs;
//   - spin 1000 us while every local rank can have a core, 1 us when oversubscribed or when no
//     other rank shares this host (its data arrive through the kernel, which needs this core);
//   - yield 2000 us with a peer on this host, 0 without one;
//   - RINGTREE_SPIN_US and RINGTREE_YIELD_US, when set (>= 0), replace either.
// Waits then adapt per wait (backoff.h): one on nothing but TCP blocks at once, one whose peer
// last waited on this CPU skips the spin.
#pragma once
#include <cstdint>
#include <string>
#include "exec/host/backoff.h"

namespace ringtree {

struct WaitCounts {
  int local_ranks = 1;    // ranks on this host, as the probes found, this one included
  int cpu_sharers = 1;    // ranks on this kernel allowed exactly this rank's CPUs, this one included
  int cpus = 1;           // the CPUs those ranks are allowed
  int online_cpus = 1;    // the CPUs this process may run on
  int64_t spin_us = -1;   // RINGTREE_SPIN_US (-1: not set)
  int64_t yield_us = -1;  // RINGTREE_YIELD_US (-1: not set)
};

struct WaitDecision {
  WaitPolicy policy;
  bool oversubscribed = false;
  std::string text;  // the policy and the counts behind it, for status()
};

WaitDecision decide_wait_policy(const WaitCounts& counts);

}  // namespace ringtree
