// One-shot's protocol constants, shared by the shared-memory layout (transport/shm),
// the host executor that follows the rules (exec/host/oneshot.cc) and the walk that proves them
// (algorithms/verify/rendezvous.cc).
#pragma once
#include <cstdint>

namespace ringtree {

// Each rank has kOneShotSlots slots, one page each: call `gen` publishes its fingerprint into
// slot gen % kOneShotSlots, and a payload of up to kOneShotInlineBytes beside it. A larger payload
// goes into payload slot gen % kOneShotPayloadSlots (RINGTREE_ONESHOT_BYTES each), so the many
// slots that let tiny calls run far ahead cost a page each, not a full payload. Few payload slots:
// every call writes the next one, so a run of calls cycles through P x slots x payload bytes, and
// with 16 slots of 512 KiB at P=4 that filled a 32 MiB L3 (an all_to_all then read its peers'
// blocks at half the speed it reaches with 4 slots).
constexpr int kOneShotSlots = 64;
constexpr uint64_t kOneShotSlotBytes = 4096;                       // a page
constexpr uint64_t kOneShotInlineBytes = kOneShotSlotBytes - 128;  // less its control lines
constexpr int kOneShotPayloadSlots = 4;
// The rule: a rank runs the waits a call left for later (a broadcast's or scatter's root's, a
// gather's or reduce's other ranks', a count-0 call's deferred steps: wait for the publications it
// skipped, check their fingerprints) before it publishes call g + A, where A is kOneShotRunAhead
// for a call whose payload fits inline and kOneShotPayloadRunAhead for a larger one. Every call
// waits for every peer's publication, in the call or deferred (schedule.h's one-shot rules), so by
// then the rank has seen every peer publish call g - A. Slot g % S last held call g - S; each peer
// that published g - A had returned from that call (its reads in the call) and run its deferred
// steps (before publishing g - S + A) as long as 2 * A <= S. The payload slots obey the same rule
// with the smaller A: a call with a large payload waits for what a small one would not, and a small
// call writes no payload slot. A deferred step reads only a fingerprint, which stays in the call's
// own slot.
constexpr uint64_t kOneShotRunAhead = 32;
constexpr uint64_t kOneShotPayloadRunAhead = 2;
static_assert(2 * kOneShotRunAhead <= static_cast<uint64_t>(kOneShotSlots), "a slot could be rewritten while read");
static_assert(2 * kOneShotPayloadRunAhead <= static_cast<uint64_t>(kOneShotPayloadSlots),
              "a payload slot could be rewritten while read");
static_assert(kOneShotPayloadRunAhead <= kOneShotRunAhead, "the payload rule must be the stricter one");

// The slot call `gen` publishes into.
inline int oneshot_slot_of(uint64_t gen) { return static_cast<int>(gen % kOneShotSlots); }

// How far ahead a rank may publish past its oldest unsettled call, for a call that publishes
// `call_bytes` (the call's full publication: every rank decides alike).
inline uint64_t oneshot_run_ahead(uint64_t call_bytes) {
  return call_bytes <= kOneShotInlineBytes ? kOneShotRunAhead : kOneShotPayloadRunAhead;
}

}  // namespace ringtree
