// One rank's walk through its schedule over mailboxes in memory every rank can address: the
// CUDA IPC executor runs it as a kernel (one thread block per rank, buffers and mailboxes mapped
// through CUDA IPC), and the same source runs on host threads in tests, so the protocol, the
// chunking and the reduction order are checked on machines without a GPU.
//
// Terms:
//   lane     the two mailboxes between this rank and one peer. Messages to the peer go into the
//            peer's inbox (`send_slots`, `slots` slots of `slot_bytes`); the peer's messages
//            arrive in this rank's inbox (`recv_slots`).
//   chunk    what one slot holds: a message is cut into chunks of slot_bytes, in order, so both
//            sides agree on every chunk's size without a header.
//   header   two words per slot, written with the chunk: the call's tag (a hash of its
//            fingerprint: collective, count, dtype, op, root, algorithm and sequence number)
//            and the chunk's byte count. The receiver checks both, so ranks that made
//            different calls stop with a mismatch instead of mixing their data.
//   counters `sent` and `received` count chunks per lane over the life of the mailboxes. The
//            sender publishes `sent` in the peer's memory (send_posted) once a chunk is in its
//            slot; the receiver publishes `received` in the sender's memory (recv_consumed)
//            once it has read a slot. So a slot is never overwritten before it has been read,
//            each flag has exactly one writer, and calls need no reset in between.
//   stop     one word per rank in every rank's memory (stop_words[q]: written by rank q alone),
//            set by a rank that stopped a call: in its own memory, so its other channels end,
//            and in every peer's, so theirs do. It names the first call it stops (stop_value's
//            low 40 bits: seq + 1), and a walker obeys only a stop of its own call or an earlier
//            one: a peer that runs ahead and stops a later call must not end (and be blamed for)
//            a call this rank can still finish.
//   call     two words per lane in the peer's memory: this rank's current call, {tag, seq + 1},
//            written by channel 0's leader as a walk starts (the seq word cleared while the tag
//            changes). A walker that has nothing to do looks at its peers' words: a peer in the
//            same call (seq) with another tag made a different call. That finds mismatches in
//            which no chunk of the wrong call is ever read (all_reduce against broadcast: the
//            ranks wait for chunks that never come) without waiting for the timeout.
//
// The walker runs message ops and copies only. One-shot ops (schedule.h: Publish, CopyPublished,
// ReducePublished, the one-shot schedules) need the host's shared one-shot slots: an executor
// hands the walker only schedules that walker_can_run() accepts, and a walker that meets one
// anyway stops every rank instead of taking it for a receive.
//
// Within a step every op moves one chunk whenever its lane allows, round robin, so a step's
// sends and receives progress together (a step can hold both directions of an exchange). Two
// ops of one step on the same lane and direction go in schedule order, one after the other:
// chunks on a lane are matched by order alone.
//
// Models of the protocol's patterns (slots through posted and consumed, the call words, the
// channels' barrier) for the SPIN model checker: exec/cuda/models/*.pml.
//
// The Mem policy supplies what differs between the device and the host:
//   leader()              the one thread that reads and writes flags (all threads on the host)
//   agree(v)              every thread of the walker gets the leader's v
//   copy / reduce         data movement by every thread: dst = src; dst = a (op) b
//   published()           makes this thread group's slot writes / reads complete and visible
//                         system-wide before the leader's next flag store
//   load / store          flag accesses with acquire / release semantics
//   stop()                true when the walk must end (abort flag or deadline)
//   relax()               back off after a round that moved nothing
//   step_barrier(p)       every thread of this walker is done with the step (the leader may
//                         rewrite the step's shared progress), and so are this rank's other
//                         channels; false if a stop of plan p's call (stop_in_force) or stop()
//                         ends the wait
#pragma once
#include <cstddef>
#include <cstdint>
#include "algorithms/schedule.h"
#include "common/host_device.h"
#include "transport/mailbox_lane.h"

namespace ringtree {

// The most ops one step may hold for the walker (per-op progress lives in a fixed array: shared
// memory on the device). Larger steps go to another executor.
constexpr uint32_t kWalkerMaxStepOps = 256;

// The walker's view of a lane (transport/mailbox_lane.h).
using WalkerLane = MailboxLane;

struct WalkerCounters {
  uint64_t sent = 0, received = 0;
};

struct WalkPlan {
  const Op* ops = nullptr;
  const uint32_t* step_end = nullptr;  // as Schedule::step_end
  uint32_t num_steps = 0;
  uint8_t* bases[3] = {nullptr, nullptr, nullptr};  // indexed by BufId: input, output, scratch
  uint32_t nranks = 0;
  // Channels: walkers of one rank that share its schedule, each moving its own slice of every
  // op (slice_of) over its own lanes, and meeting at a barrier after every step (a later step
  // may read what another channel wrote). Every element keeps the schedule's reduction order.
  uint32_t channel = 0, nchannels = 1;
  const WalkerLane* lanes = nullptr;   // [peer * nchannels + channel]; the rank's own are unused
  WalkerCounters* counters = nullptr;  // same indexing; updated by the walk
  // In this rank's memory, one word per rank (see "stop" above): stop_words[q] is set by rank q
  // when it stops a call, so every walker of that call or a later one ends at once rather than
  // at its timeout. `rank` is this rank: the word it writes, here and in the peers' memory.
  uint64_t* stop_words = nullptr;
  uint32_t rank = 0;
  // What this rank's walker writes into its stop words: nonzero, its low 40 bits this call's
  // seq + 1 (stop_word_for); the executor may encode in the rest who stopped and why.
  uint64_t stop_value = 1;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  uint32_t elem_size = 0;
  uint64_t tag = 0;  // this call's fingerprint hash, carried in every chunk's header
  uint64_t seq = 0;  // this call's place in the lanes' call order (the same on every rank)
};

enum class WalkResult : int { Done = 0, Stopped = 1, Mismatch = 2 };

// What a receiver found in a header, or in a peer's call words (bytes 0), that did not match
// its own call.
struct WalkFault {
  int32_t peer = -1;
  uint64_t got_tag = 0, want_tag = 0, got_bytes = 0, want_bytes = 0;
};

// Progress of a message of no elements that has not moved yet: it still takes one (empty)
// chunk on channel 0, so a barrier's messages synchronize and keep their place on the lane.
constexpr uint64_t kWalkerEmptyPending = ~uint64_t{0};

// The elements [first, first + count) of an op of `count` elements that channel `c` of `n`
// moves: contiguous slices, 16-byte aligned where the op is, so copies stay vectorized. Sender
// and receiver of a message compute the same slices from the same count.
struct Slice {
  uint64_t first, count;
};
RT_HOST_DEVICE inline Slice slice_of(uint64_t count, uint32_t c, uint32_t n, uint32_t elem_size) {
  const uint64_t align = elem_size >= 16 ? 1 : 16 / elem_size;
  uint64_t per = (count + n - 1) / n;
  per = (per + align - 1) / align * align;
  const uint64_t first = per * c < count ? per * c : count;
  const uint64_t last = per * (c + 1) < count ? per * (c + 1) : count;
  return {first, last - first};
}

// Stop words: the low 40 bits hold seq + 1 of the first call a stop ends (modulo 2^40; the
// comparison below is modular, so a long-lived communicator's sequence numbers may wrap).
constexpr uint64_t kStopSeqMask = (uint64_t{1} << 40) - 1;
RT_HOST_DEVICE inline uint64_t stop_seq_bits(uint64_t seq) { return (seq + 1) & kStopSeqMask; }
// Whether stop word `w` ends call `seq`: it is set and stops a call no later than seq.
RT_HOST_DEVICE inline bool stop_applies(uint64_t w, uint64_t seq) {
  return w != 0 && ((stop_seq_bits(seq) - (w & kStopSeqMask)) & kStopSeqMask) < (uint64_t{1} << 39);
}
// The first of this rank's stop words that ends the plan's call, or 0.
template <typename Mem>
RT_HOST_DEVICE uint64_t stop_in_force(const WalkPlan& plan, const Mem& mem) {
  for (uint32_t q = 0; q < plan.nranks; ++q) {
    const uint64_t w = mem.load(plan.stop_words + q);
    if (stop_applies(w, plan.seq)) return w;
  }
  return 0;
}

// Whether every op of `s` is one the walker runs (no one-shot op).
inline bool walker_can_run(const Schedule& s) {
  for (const Op& op : s.ops)
    if (is_oneshot_op(op.kind)) return false;
  return true;
}

template <typename Mem>
RT_HOST_DEVICE WalkResult walk_schedule(const WalkPlan& plan, Mem& mem, uint64_t* progress, WalkFault* fault) {
  const uint64_t chunk_elems = plan.slot_bytes / plan.elem_size;
  const uint64_t esz = plan.elem_size;
  const uint32_t C = plan.nchannels, ch = plan.channel;
  auto lane_index = [&](int32_t peer) { return static_cast<uint64_t>(peer) * C + ch; };
  // This rank's other channels and every peer end at once rather than at their timeouts.
  auto stop_everyone = [&] {
    if (!mem.leader()) return;
    mem.store(plan.stop_words + plan.rank, plan.stop_value);
    for (uint32_t q = 0; q < plan.nranks; ++q)
      if (plan.lanes[static_cast<uint64_t>(q) * C].peer_stop)
        mem.store(plan.lanes[static_cast<uint64_t>(q) * C].peer_stop, plan.stop_value);
  };
  // The leader's look at the peers' call words (see "call" above): true on a mismatch.
  auto peer_in_another_call = [&] {
    for (uint32_t q = 0; q < plan.nranks; ++q) {
      const uint64_t* call = plan.lanes[static_cast<uint64_t>(q) * C].recv_call;
      if (!call || mem.load(call + 1) != plan.seq + 1) continue;
      const uint64_t peer_tag = mem.load(call);
      if (mem.load(call + 1) == plan.seq + 1 && peer_tag != plan.tag) {
        *fault = WalkFault{static_cast<int32_t>(q), peer_tag, plan.tag, 0, 0};
        return true;
      }
    }
    return false;
  };
  if (ch == 0 && mem.leader()) {
    for (uint32_t q = 0; q < plan.nranks; ++q) {
      uint64_t* call = plan.lanes[static_cast<uint64_t>(q) * C].send_call;
      if (!call) continue;
      mem.store(call + 1, 0);
      mem.store(call, plan.tag);
      mem.store(call + 1, plan.seq + 1);
    }
  }
  for (uint32_t k = 0; k < plan.num_steps; ++k) {
    const uint32_t begin = k == 0 ? 0 : plan.step_end[k - 1], end = plan.step_end[k];
    // Local copies first: they touch memory no other op of the step touches.
    for (uint32_t i = begin; i < end; ++i) {
      const Op& op = plan.ops[i];
      if (op.kind > OpKind::Copy) {  // a one-shot op: never walked (see the top of this file)
        stop_everyone();
        return WalkResult::Stopped;
      }
      const Slice sl = slice_of(op.count, ch, C, plan.elem_size);
      if (op.kind == OpKind::Copy && sl.count) {
        uint8_t* dst = plan.bases[static_cast<int>(op.dst.buf)] + (op.dst.offset + sl.first) * esz;
        const uint8_t* src = plan.bases[static_cast<int>(op.src.buf)] + (op.src.offset + sl.first) * esz;
        if (dst != src) mem.copy(dst, src, sl.count * esz);  // in place: a copy onto itself
      }
      if (mem.leader()) {
        const bool empty_message = op.kind != OpKind::Copy && op.count == 0 && ch == 0;
        progress[i - begin] = op.kind == OpKind::Copy ? sl.count : empty_message ? kWalkerEmptyPending : 0;
      }
    }
    mem.published();
    for (;;) {
      bool all_done = true, moved = false;
      for (uint32_t i = begin; i < end; ++i) {
        const Op& op = plan.ops[i];
        const Slice sl = slice_of(op.count, ch, C, plan.elem_size);
        if (progress[i - begin] == sl.count) continue;
        all_done = false;
        const uint64_t done = progress[i - begin] == kWalkerEmptyPending ? 0 : progress[i - begin];
        const bool is_send = op.kind == OpKind::Send;
        // FIFO per lane and direction: wait behind an earlier unfinished op of this step.
        bool blocked = false;
        for (uint32_t j = begin; j < i && !blocked; ++j) {
          const Op& earlier = plan.ops[j];
          blocked = earlier.kind != OpKind::Copy && earlier.peer == op.peer &&
                    (earlier.kind == OpKind::Send) == is_send &&
                    progress[j - begin] != slice_of(earlier.count, ch, C, plan.elem_size).count;
        }
        if (blocked) continue;
        const WalkerLane& lane = plan.lanes[lane_index(op.peer)];
        WalkerCounters& c = plan.counters[lane_index(op.peer)];
        const uint64_t n = sl.count - done < chunk_elems ? sl.count - done : chunk_elems;
        const uint64_t at = sl.first + done;  // element offset within the op
        if (is_send) {
          const bool room = mem.agree(mem.leader() && c.sent - mem.load(lane.send_consumed) < plan.slots);
          if (!room) continue;
          const uint64_t index = c.sent % plan.slots;
          mem.copy(lane.send_slots + index * plan.slot_bytes,
                   plan.bases[static_cast<int>(op.src.buf)] + (op.src.offset + at) * esz, n * esz);
          if (mem.leader()) {
            mem.store(lane.send_headers + 2 * index, plan.tag);
            mem.store(lane.send_headers + 2 * index + 1, n * esz);
          }
          mem.published();
          if (mem.leader()) {
            c.sent += 1;
            mem.store(lane.send_posted, c.sent);
            progress[i - begin] = done + n;
          }
        } else {
          const bool ready = mem.agree(mem.leader() && mem.load(lane.recv_posted) > c.received);
          if (!ready) continue;
          const uint64_t index = c.received % plan.slots;
          bool matches = true;
          if (mem.leader()) {
            const uint64_t got_tag = mem.load(lane.recv_headers + 2 * index);
            const uint64_t got_bytes = mem.load(lane.recv_headers + 2 * index + 1);
            matches = got_tag == plan.tag && got_bytes == n * esz;
            if (!matches) *fault = WalkFault{op.peer, got_tag, plan.tag, got_bytes, n * esz};
          }
          if (!mem.agree(matches)) {
            stop_everyone();
            return WalkResult::Mismatch;
          }
          const uint8_t* slot = lane.recv_slots + index * plan.slot_bytes;
          uint8_t* dst = plan.bases[static_cast<int>(op.dst.buf)] + (op.dst.offset + at) * esz;
          if (op.kind == OpKind::Recv) {
            mem.copy(dst, slot, n * esz);
          } else {  // RecvReduce: dst = local (op) incoming, the host executor's operand order
            mem.reduce(dst, plan.bases[static_cast<int>(op.src.buf)] + (op.src.offset + at) * esz, slot, n);
          }
          mem.published();
          if (mem.leader()) {
            c.received += 1;
            mem.store(lane.recv_consumed, c.received);
            progress[i - begin] = done + n;
          }
        }
        moved = true;
        mem.published();  // every thread sees the leader's progress before the next decision
      }
      if (all_done) break;
      if (!moved) {
        bool mismatch = false;
        if (mem.agree(mem.leader() &&
                      (stop_in_force(plan, mem) != 0 || mem.stop() || (mismatch = peer_in_another_call())))) {
          if (!mem.agree(mismatch)) return WalkResult::Stopped;
          stop_everyone();
          return WalkResult::Mismatch;
        }
        mem.relax();
      }
    }
    // Every thread of every channel has finished step k before any starts step k + 1: the
    // leader rewrites `progress` for the next step while a lagging thread may still be reading
    // it for this one's last check, and a later step may read what another channel wrote.
    if (!mem.step_barrier(plan)) return WalkResult::Stopped;
  }
  return WalkResult::Done;
}

}  // namespace ringtree
