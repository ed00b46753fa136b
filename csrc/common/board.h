// The one-shot board's protocol constants, shared by the shared-memory layout (transport/shm),
// the host executor that follows the rules (exec/host/board.cc) and the walk that proves them
// (algorithms/verify/rendezvous.cc).
#pragma once
#include <cstdint>

namespace ringtree {

// Slots per rank: call `gen` publishes into slot gen % kBoardSlots.
constexpr int kBoardSlots = 16;
// A rank publishes call g only once every peer has published call g - kBoardRunAhead, and it
// checks the fingerprints a call left for later (a broadcast root's, a count-0 call's) before it
// publishes call g + kBoardRunAhead. Slot g % kBoardSlots last held call g - kBoardSlots; its
// readers have all published g - kBoardRunAhead, so they returned from that call (the in-call
// reads) and checked it (the deferred ones) as long as 2 * kBoardRunAhead <= kBoardSlots.
constexpr uint64_t kBoardRunAhead = 8;
static_assert(2 * kBoardRunAhead <= static_cast<uint64_t>(kBoardSlots), "a slot could be rewritten while read");

}  // namespace ringtree
