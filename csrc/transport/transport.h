// The narrow waist between algorithms and wires. An executor sees one Connection per peer and
// moves whole messages over it, one send and one receive in flight per direction; it never
// sees sockets or shared-memory segments. Every message starts with a 64-byte header that
// carries the collective's fingerprint, so a receiver detects mismatched calls before it
// consumes a byte of payload.
#pragma once
#include <cstddef>
#include <cstdint>
#include "kernels/host/reduce.h"

namespace ringtree {

struct MsgHeader {
  static constexpr uint32_t kMagic = 0x52544d31;  // "RTM1"
  uint32_t magic;
  uint8_t coll, dtype, op, algo;
  int32_t root;
  int32_t sender;
  uint64_t seq;
  uint64_t count;          // the collective's count (its fingerprint), not this message's
  uint64_t payload_bytes;  // this message
  uint8_t deterministic;   // the call ran in deterministic mode (part of the fingerprint)
  uint8_t pad[7];
  // Transport use: a shared-memory single-copy message's payload address and marker (shm/cma.h).
  uint64_t reserved[2];
};
static_assert(sizeof(MsgHeader) == 64, "MsgHeader must be one cache line");

struct SendCursor {
  MsgHeader header;
  const uint8_t* payload = nullptr;
  uint64_t done = 0;  // bytes of this message's stream already handed to the wire
  // The payload stays put until the send completes, so a same-host receiver may read it in
  // place (shm/cma.h) if it is at least this many bytes (0: never); the executor allows it for
  // collectives whose receivers copy, not reduce, from a size it picks per call.
  uint64_t single_copy_min_bytes = 0;
  // ... and only from a buffer at least half on huge pages (shm/cma.h: the kernel pins each page
  // it reads); checked once.
  bool single_copy_from_huge_pages_only = false;
  // ... and nothing in the call writes it again, so the send may complete once announced; the
  // executor collects the acknowledgement before the call returns (ShmConnection::acknowledged).
  bool defer_ack = false;
  uint64_t ack_at = 0;  // a single-copy send: the ring position that acknowledges it
};

struct RecvCursor {
  MsgHeader header;             // filled in when it arrives
  bool header_ready = false;    // arrived, waiting for the executor's check
  bool header_checked = false;  // payload may flow
  uint8_t* dst = nullptr;
  const uint8_t* local = nullptr;  // second operand of a reduction (may alias dst)
  ReduceFn reduce = nullptr;       // null: plain copy
  bool stream = false;             // copy with streaming stores (a large output; see kernels/copy.h)
  uint32_t elem_size = 1;
  uint64_t payload_bytes = 0;  // expected
  uint64_t done = 0;
};

class Connection {
 public:
  virtual ~Connection() = default;
  // Non-blocking; return true when they moved bytes. A receive stops after the header so the
  // executor can check it (header_ready); payload flows only once header_checked is set.
  virtual bool progress_send(SendCursor& c) = 0;
  virtual bool progress_recv(RecvCursor& c) = 0;
  virtual bool send_complete(const SendCursor& c, uint64_t payload_bytes) const = 0;
  virtual bool recv_complete(const RecvCursor& c) const = 0;
  // Between messages: copies the next incoming message's header without consuming it, if one
  // has arrived (used to spot a peer that runs a different call than this rank).
  virtual bool peek_header(MsgHeader* h) const { return false; }
  // A descriptor to poll for readiness, or -1 when waking comes through the doorbell.
  virtual int poll_fd() const { return -1; }
  virtual const char* kind() const = 0;
};

}  // namespace ringtree
