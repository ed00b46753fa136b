// A schedule is one rank's part of a collective, as data: an ordered list of steps, each step a
// set of ops that run concurrently and touch disjoint memory. Executors (host now, CUDA later)
// walk the same schedule; the simulator checks it without any transport.
//
// Terms used by every algorithm file:
//   block    the N elements one rank owns in reduce_scatter / all_gather / all_to_all / gather /
//            scatter (N = the per-rank count), or the 1/P share of an all_reduce buffer that the
//            ring hands around.
//   segment  a slice of a buffer that a pipelined algorithm (tree, chain) moves as one message.
//   step     a set of ops that may run concurrently; step k+1 starts when step k is complete.
// Offsets and counts are in elements.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "ringtree/types.h"

namespace ringtree {

enum class BufId : uint8_t { Input, Output, Scratch, Count };
enum class OpKind : uint8_t {
  Send,        // src -> peer
  Recv,        // peer -> dst
  RecvReduce,  // dst = src (op) incoming from peer
  Copy,        // dst = src, local
};

struct BufRef {
  BufId buf = BufId::Input;
  uint64_t offset = 0;
};

struct Op {
  OpKind kind;
  int32_t peer;  // -1 for Copy
  uint64_t count;
  BufRef dst;
  BufRef src;
};

struct Schedule {
  std::vector<Op> ops;
  std::vector<uint32_t> step_end;  // ops[step_end[k-1] .. step_end[k]) form step k
  uint64_t scratch_elems = 0;

  size_t num_steps() const { return step_end.size(); }
  uint32_t step_begin(size_t k) const { return k == 0 ? 0 : step_end[k - 1]; }
  void add(const Op& op) { ops.push_back(op); }
  void end_step() {
    if (step_end.empty() ? !ops.empty() : step_end.back() != ops.size())
      step_end.push_back(static_cast<uint32_t>(ops.size()));
  }
};

struct ScheduleKey {
  Collective coll;
  Algo algo;        // concrete (never Auto)
  int nranks;
  int rank;
  uint64_t count;   // all_reduce/broadcast/reduce: whole buffer; others: per-rank block N
  int root;
  uint64_t segment; // elements per pipelined segment (tree, chain); 0 = whole buffer
  int peer = -1;    // send/recv

  bool operator==(const ScheduleKey& o) const {
    return coll == o.coll && algo == o.algo && nranks == o.nranks && rank == o.rank &&
           count == o.count && root == o.root && segment == o.segment && peer == o.peer;
  }
};

// For executors that cache schedules by key.
struct ScheduleKeyHash {
  size_t operator()(const ScheduleKey& k) const {
    size_t h = static_cast<size_t>(k.coll) * 31 + static_cast<size_t>(k.algo);
    h = h * 1000003 + static_cast<size_t>(k.count);
    h = h * 1000003 + static_cast<size_t>(k.root) * 7 + static_cast<size_t>(k.peer);
    return h * 1000003 + static_cast<size_t>(k.segment);
  }
};

// Which concrete algorithms a collective supports; the first is its default.
std::vector<Algo> supported_algos(Collective coll);

Schedule build_schedule(const ScheduleKey& key);

// ScheduleKey::segment for a call: elements per pipelined segment for the tree and chain
// algorithms (all_reduce tree, broadcast, reduce), 0 for the others. segment_bytes 0 means
// the RINGTREE_TREE_SEGMENT_BYTES setting (128 KiB); every executor uses this, so all build
// the same schedule for the same call.
uint64_t pipeline_segment(Collective coll, Algo algo, size_t elem_size, uint64_t segment_bytes = 0);

// Per-algorithm generators (one file each).
void ring_all_reduce(Schedule& s, int nranks, int rank, uint64_t count);
void ring_reduce_scatter(Schedule& s, int nranks, int rank, uint64_t block);
void ring_all_gather(Schedule& s, int nranks, int rank, uint64_t block);
void tree_all_reduce(Schedule& s, int nranks, int rank, uint64_t count, uint64_t segment);
void tree_reduce(Schedule& s, int nranks, int rank, int root, uint64_t count, uint64_t segment, int arity);
void tree_broadcast(Schedule& s, int nranks, int rank, int root, uint64_t count, uint64_t segment, int arity);
void direct_all_to_all(Schedule& s, int nranks, int rank, uint64_t block);
// Pairwise exchange with per-peer counts (all_to_all_v); not cached, not keyed.
void direct_all_to_all_v(Schedule& s, int nranks, int rank, const std::vector<uint64_t>& send_counts,
                         const std::vector<uint64_t>& recv_counts);
void direct_gather(Schedule& s, int nranks, int rank, int root, uint64_t block);
void direct_scatter(Schedule& s, int nranks, int rank, int root, uint64_t block);
void dissemination_barrier(Schedule& s, int nranks, int rank);

// Transport-free check: builds every rank's schedule for `key` (key.rank ignored), runs them
// against each other with rendezvous semantics (a send completes only when the receiver is at
// the matching recv, so any buffering also works), tracks which inputs every output element
// holds, and throws Error describing the first violation. Returns a short summary.
// drop_op >= 0 removes that op from rank 0's schedule first: a fault the check must report.
std::string simulate_schedules(ScheduleKey key, int drop_op = -1);

}  // namespace ringtree
