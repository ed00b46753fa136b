// The one-shot board's protocol constants, shared by the shared-memory layout (transport/shm),
// the host executor that follows the rules (exec/host/board.cc) and the walk that proves them
// (algorithms/verify/rendezvous.cc).
#pragma once
#include <cstdint>

namespace ringtree {

// Slots per rank: call `gen` publishes into slot gen % kBoardSlots.
constexpr int kBoardSlots = 16;
// The rule: a rank runs the waits a call left for later (a broadcast root's, a count-0 call's
// deferred steps: wait for the publications it skipped, check their fingerprints) before it
// publishes call g + kBoardRunAhead. Every call waits for every peer's publication, in the call
// or deferred (schedule.h's board rules), so by then the rank has seen every peer publish call
// g - kBoardRunAhead. Slot g % kBoardSlots last held call g - kBoardSlots; each peer that
// published g - kBoardRunAhead had returned from that call (its reads in the call) and run its
// deferred steps (before publishing g - kBoardSlots + kBoardRunAhead) as long as
// 2 * kBoardRunAhead <= kBoardSlots.
constexpr uint64_t kBoardRunAhead = 8;
static_assert(2 * kBoardRunAhead <= static_cast<uint64_t>(kBoardSlots), "a slot could be rewritten while read");

}  // namespace ringtree
