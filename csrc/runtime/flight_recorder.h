// The flight recorder: every communicator keeps its last N calls (RINGTREE_FLIGHT_RECORDER,
// default 2048) with what they were, when they were queued, started and ended, how they ended,
// and, for the call in progress, which peers it still waits for. It is always on: a call costs
// a slot write and two clock reads, no allocation and no lock. A dump (JSON, read by
// `python -m ringtree.analyze`) is written on Timeout / PeerFailure / CollectiveMismatch when
// RINGTREE_DUMP_DIR is set, on request, on a signal (RINGTREE_DUMP_SIGNAL, SIGUSR1 by default)
// and at close with RINGTREE_DUMP_ON_EXIT=1.
//
// Concurrency: a slot is written by the thread that queues the call and then by the one that
// runs it, one after the other; a dump may read a slot while it is being written and then shows
// that one call torn. That is the price of a recorder that never slows a collective down.
#pragma once
#include <array>
#include <atomic>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>
#include "ringtree/errors.h"
#include "ringtree/types.h"

namespace ringtree {

enum class CallState : uint8_t { Queued, Running, Done, Failed };

// Two cache lines: a call writes the first (and the second once, when queued); the recorder cycles
// through its slots in order, which the hardware prefetches. Error texts live apart (failed calls
// are rare), so a successful call never touches them.
struct alignas(64) CallRecord {
  std::atomic<uint64_t> id{0};  // 1, 2, ...: the call's number on this communicator; 0: empty slot
  uint64_t seq = 0;             // the collective's sequence number (p2p: the per-peer one)
  uint64_t count = 0;
  int64_t enqueued = 0, started = 0, ended = 0;  // ticks (see FlightRecorder::ticks)
  int64_t label = -1;                            // set by the caller (a bucket id, a step), -1 for none
  Collective coll = Collective::Barrier;
  DataType dtype = DataType::Int8;
  ReduceOp op = ReduceOp::Sum;
  Algo algo = Algo::Auto;
  std::atomic<uint8_t> state{0};
  ErrorKind error_kind = ErrorKind::Error;
  // second line
  alignas(64) uint64_t recv_seq = 0;  // sendrecv: the receive's
  int32_t root = -1, peer = -1, recv_peer = -1;
};
static_assert(sizeof(CallRecord) == 128, "a call record is two cache lines");

// `s` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s);

class FlightRecorder {
 public:
  // capacity 0 turns the recorder off (open() returns 0 and nothing is kept).
  explicit FlightRecorder(size_t capacity);
  size_t capacity() const { return slots_.size(); }
  uint64_t recorded() const { return next_id_.load(std::memory_order_relaxed); }

  // A new record in the Queued state; returns its id (the handle for the calls below).
  uint64_t open(Collective coll, DataType dtype, ReduceOp op, Algo algo, int root, int peer, int recv_peer,
                uint64_t count, int64_t label, uint64_t seq, uint64_t recv_seq);
  // `at_enqueue`: the call starts the moment it was queued (a blocking call): no second stamp.
  void started(uint64_t id, bool at_enqueue = false);
  // The algorithm, where it is settled only when the call runs (a broadcast asks its root first).
  void set_algo(uint64_t id, Algo algo);
  void finished(uint64_t id, const Error* error);
  // The call in progress (0: none), for the waiting-on part of a dump.
  uint64_t running() const { return running_.load(std::memory_order_relaxed); }

  // The records as a JSON array, oldest first; the running call gets `waiting_on`.
  std::string calls_json(const std::vector<int>& waiting_sends, const std::vector<int>& waiting_recvs) const;

  static int64_t now_ns();
  // The recorder's time stamps: the CPU's invariant time-stamp counter where there is one (a
  // few ns to read, where the steady clock costs 25-30 ns: the recorder reads it on every call),
  // converted to steady-clock ns when a dump is taken; else the steady clock in ns.
  static int64_t ticks();
  // Steady-clock ns of a tick count, by the line through the construction-time and the current
  // (tick, ns) pairs.
  int64_t to_ns(int64_t t, int64_t now_ticks, int64_t now_ns) const;

 private:
  CallRecord* slot_of(uint64_t id);

  std::vector<CallRecord> slots_;
  // The failed calls' texts, by slot; left uninitialized (untouched memory) until a call fails.
  std::unique_ptr<std::array<char, 240>[]> errors_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> running_{0};
  int64_t origin_ticks_ = 0, origin_ns_ = 0;  // a (tick, ns) pair taken at construction
  static void paired_now(int64_t* tick, int64_t* ns);
};

}  // namespace ringtree
