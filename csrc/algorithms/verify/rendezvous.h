// Every rank's schedule walked together, in one thread, under rendezvous semantics: a send
// completes only when the receiver's current step holds the matching receive, so a walk that
// finishes proves the schedules need no buffering. The verifier drives it to check
// schedules; the single-process GPU executor drives it to enqueue the same work on streams.
//
// One-shot ops (schedule.h) are walked with the one-shot semantics (common/oneshot.h): a rank's
// publications are numbered by call from 1 (its n-th Publish is call n, as the one-shot
// generation counter); a read of call g waits until its peer has published call g; and every
// rank has S slots (kOneShotSlots unless the caller says), so call g + S overwrites call g. The
// walk tracks which events happen before which (a vector clock per rank: program order, and a
// publication before every read that waited for it) and reports a rank that could overwrite a
// call before some reader has finished with it, in any interleaving, not only in the one walked.
#pragma once
#include <string>
#include <vector>
#include "algorithms/schedule.h"
#include "common/oneshot.h"

namespace ringtree {

class RendezvousVisitor {
 public:
  virtual ~RendezvousVisitor() = default;
  // `rank` enters `step`: perform its local copies (the walker then counts them as done).
  virtual void enter_step(int rank, size_t step) = 0;
  // `sender`'s send matched `receiver`'s receive; their counts are equal.
  virtual void transfer(int sender, const Op& send, int receiver, const Op& recv) = 0;
  // One-shot ops: `rank` publishes (on entering the step), or reads publications of `call` whose
  // ranks have all published it. An executor without one-shot slots keeps these defaults, which throw.
  virtual void publish(int rank, const Op& op, uint64_t call);
  virtual void read_published(int rank, const Op& op, uint64_t call);
};

// "" when every rank finished; otherwise what went wrong: a bad peer, a send and receive that
// disagree on size, a one-shot read before this rank's own publication or of a publication
// already overwritten, a slot that could be reused too early, or a deadlock naming each
// blocked rank's step.
// read_calls (optional): per rank, per step, the one-shot call that step's reads belong to, or 0
// for the rank's latest publication; several calls in a row give a call's deferred steps a later
// place (as the host executor settles them).
// oneshot_slots: the slots per rank the walk assumes (common/oneshot.h has two kinds).
std::string walk_rendezvous(const std::vector<const Schedule*>& schedules, RendezvousVisitor& visitor,
                            const std::vector<std::vector<uint64_t>>* read_calls = nullptr,
                            int oneshot_slots = kOneShotSlots);

}  // namespace ringtree
