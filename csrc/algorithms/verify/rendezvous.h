// Every rank's schedule walked together, in one thread, under rendezvous semantics: a send
// completes only when the receiver's current step holds the matching receive, so a walk that
// finishes proves the schedules need no buffering. The simulator drives it to check
// schedules; the single-process GPU executor drives it to enqueue the same work on streams.
#pragma once
#include <string>
#include <vector>
#include "algorithms/schedule.h"

namespace ringtree {

class RendezvousVisitor {
 public:
  virtual ~RendezvousVisitor() = default;
  // `rank` enters `step`: perform its local copies (the walker then counts them as done).
  virtual void enter_step(int rank, size_t step) = 0;
  // `sender`'s send matched `receiver`'s receive; their counts are equal.
  virtual void transfer(int sender, const Op& send, int receiver, const Op& recv) = 0;
};

// "" when every rank finished; otherwise what went wrong: a bad peer, a send and receive that
// disagree on size, or a deadlock naming each blocked rank's step.
std::string walk_rendezvous(const std::vector<const Schedule*>& schedules, RendezvousVisitor& visitor);

}  // namespace ringtree
