// A lane: the two mailboxes between a rank and one peer, in memory both can address (device
// memory mapped through CUDA IPC, or host memory in tests). Transports that hand out mailboxes
// describe them with it; the step walker (exec/step_walker.h) moves chunks through them. The
// protocol on a lane (slots, headers, counters) is described in exec/step_walker.h.
#pragma once
#include <cstdint>

namespace ringtree {

struct MailboxLane {
  uint8_t* send_slots = nullptr;            // the peer's inbox for this rank's chunks
  uint64_t* send_headers = nullptr;         // their headers, 2 words per slot (peer's memory)
  const uint64_t* recv_headers = nullptr;   // headers of this rank's inbox (this rank's memory)
  uint64_t* send_posted = nullptr;          // peer's memory: chunks this rank has posted
  const uint64_t* send_consumed = nullptr;  // this rank's memory: this rank's chunks the peer read
  const uint8_t* recv_slots = nullptr;      // this rank's inbox for the peer's chunks
  const uint64_t* recv_posted = nullptr;    // this rank's memory: chunks the peer has posted
  uint64_t* recv_consumed = nullptr;        // peer's memory: the peer's chunks this rank has read
  uint64_t* peer_stop = nullptr;            // peer's memory: this rank's stop word (WalkPlan::stop_words)
  uint64_t* send_call = nullptr;            // peer's memory: the call this rank is in (2 words)
  const uint64_t* recv_call = nullptr;      // this rank's memory: the call the peer is in (2 words)
};

}  // namespace ringtree
