// One-shot's protocol constants, shared by the shared-memory layout (transport/shm),
// the host executor that follows the rules (exec/host/oneshot.cc) and the walk that proves them
// (algorithms/verify/rendezvous.cc).
#pragma once
#include <cstdint>

namespace ringtree {

// Slots per rank: call `gen` publishes into slot gen % kOneShotSlots.
constexpr int kOneShotSlots = 16;
// The rule: a rank runs the waits a call left for later (a broadcast root's, a count-0 call's
// deferred steps: wait for the publications it skipped, check their fingerprints) before it
// publishes call g + kOneShotRunAhead. Every call waits for every peer's publication, in the call
// or deferred (schedule.h's one-shot rules), so by then the rank has seen every peer publish call
// g - kOneShotRunAhead. Slot g % kOneShotSlots last held call g - kOneShotSlots; each peer that
// published g - kOneShotRunAhead had returned from that call (its reads in the call) and run its
// deferred steps (before publishing g - kOneShotSlots + kOneShotRunAhead) as long as
// 2 * kOneShotRunAhead <= kOneShotSlots.
constexpr uint64_t kOneShotRunAhead = 8;
static_assert(2 * kOneShotRunAhead <= static_cast<uint64_t>(kOneShotSlots), "a slot could be rewritten while read");

}  // namespace ringtree
