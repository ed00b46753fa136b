// A schedule is one rank's part of a collective, as data: an ordered list of steps, each step a
// set of ops that run concurrently and touch disjoint memory. Executors (host and CUDA)
// walk the same schedule; the verifier checks it without any transport.
//
// Terms used by every algorithm file:
//   block    the N elements one rank owns in reduce_scatter / all_gather / all_to_all / gather /
//            scatter (N = the per-rank count), or the 1/P share of an all_reduce buffer that the
//            ring hands around.
//   segment  a slice of a buffer that a pipelined algorithm (tree, chain) moves as one message.
//   step     a set of ops that may run concurrently; step k+1 starts when step k is complete.
//   publication  what a rank put in its one-shot slot for one call (algorithms/oneshot.cc makes
//            the schedules, exec/host/oneshot.cc runs them): a buffer every rank of the call may
//            read once it is there, and that never changes after.
// Offsets and counts are in elements.
//
// Two families of ops. Message ops (Send, Recv, RecvReduce) pair with a peer's op and move data
// through a transport; every executor runs them. One-shot ops (Publish, CopyPublished,
// ReducePublished) need memory every rank of the host can read: only the host one-shot executor
// runs them, and the step walker and the GPU executors refuse a schedule that holds one. Copy
// is local and belongs to both.
//
// One-shot rules (the verifier checks them, see verify_schedules):
//   - a rank publishes exactly once per call, in step 0; its reads come later, so every rank has
//     published before any rank waits, and an executor may wait for all of a call's
//     publications at once;
//   - a read of rank q's publication waits until q has published this call; reads are
//     snapshots, so a rank may overwrite its own input after publishing it (in-place needs no
//     staging);
//   - within its call (deferred steps included) every rank waits for every other rank's
//     publication. With the executor's rule (common/oneshot.h: run a call's deferred steps
//     before publishing kOneShotRunAhead calls later) that makes kOneShotSlots slots per rank
//     enough: a slot's previous call was read and checked by every rank before it is rewritten.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>
#include "ringtree/types.h"

namespace ringtree {

// Input, Output and Scratch are this rank's buffers (Count of them: executors index their base
// pointers with these). Published names a publication in a one-shot slot; the op says whose.
enum class BufId : uint8_t { Input, Output, Scratch, Count, Published };
enum class OpKind : uint8_t {
  Send,        // src -> peer
  Recv,        // peer -> dst
  RecvReduce,  // dst = src (op) incoming from peer
  Copy,        // dst = src, local
  // One-shot ops. `peer` is whose publication is read (may be this rank); dst is a local buffer,
  // src = {Published, offset into that publication}. A read of count 0 only waits for the
  // publication (and checks its fingerprint): it is how a rank synchronizes with a peer whose
  // data it does not need.
  Publish,          // this rank's publication [dst.offset, +count) = src; peer -1, dst.buf Published
  CopyPublished,    // dst = published(peer)[src.offset, +count)
  ReducePublished,  // dst = lhs (op) published(peer)[src.offset, +count), where lhs is
                    // published(lhs_peer) at the same offset when lhs_peer >= 0, else dst itself:
                    // a rank-order reduction 0, 1, ..., P-1 is one two-operand op (0 (op) 1) and
                    // P-2 accumulating ones, exactly the passes the one-shot executor makes.
};

constexpr bool is_oneshot_op(OpKind k) { return k >= OpKind::Publish; }
constexpr bool is_oneshot_read(OpKind k) { return k == OpKind::CopyPublished || k == OpKind::ReducePublished; }

struct BufRef {
  BufId buf = BufId::Input;
  uint64_t offset = 0;
};

struct Op {
  OpKind kind;
  int32_t peer;  // -1 for Copy and Publish
  uint64_t count;
  BufRef dst;
  BufRef src;
  int32_t lhs_peer = -1;  // ReducePublished only (see there)
};
static_assert(std::is_trivially_copyable_v<Op>, "the CUDA IPC executor copies ops to device memory as bytes");

struct Schedule {
  std::vector<Op> ops;
  std::vector<uint32_t> step_end;  // ops[step_end[k-1] .. step_end[k]) form step k
  uint64_t scratch_elems = 0;
  // The last deferred_steps steps only wait for publications (one-shot reads of count 0): the
  // result is complete before them, so a rank may return from the call first and run them
  // before its next collective (a one-shot broadcast's or scatter's early return, a gather's or
  // reduce's early return elsewhere than the root; oneshot.cc settle_oneshot).
  uint32_t deferred_steps = 0;
  // The rank other than this one whose publication the deferred steps do not wait for (a
  // broadcast's or scatter's root: the call read it), or -1; the executor settles by it and the
  // verifier checks it against the steps.
  int32_t deferred_unawaited = -1;
  // Every rank's first step sends to rank r+1 and receives from rank r-1 (set by the builders
  // whose schedules do so on every rank; the verifier checks it). Those messages carry the call's
  // fingerprint, so the host executor sends no separate handshake before them. Not for
  // all_to_all: ranks of one call may run its one-buffer schedule beside the out-of-place one,
  // whose first steps differ, and each must send what the other expects first.
  bool first_step_meets_neighbours = false;

  size_t num_steps() const { return step_end.size(); }
  uint32_t step_begin(size_t k) const { return k == 0 ? 0 : step_end[k - 1]; }
  void add(const Op& op) { ops.push_back(op); }
  void end_step() {
    if (step_end.empty() ? !ops.empty() : step_end.back() != ops.size())
      step_end.push_back(static_cast<uint32_t>(ops.size()));
  }
};

// Which ranks share a host, as the hierarchical schedules (hier.cc) see it. Hosts are numbered in
// the order of their lowest rank (rank 0's host is host 0); the ranks of a host need not be
// contiguous, and hosts may hold different numbers of ranks. A rank's local index is its place
// in its host's ascending list.
struct Topology {
  std::vector<int> host_of;             // per rank
  std::vector<int> local_index;         // per rank
  std::vector<std::vector<int>> hosts;  // per host: its ranks, ascending

  // From any per-rank host labels (equal labels: one host). Throws InvalidArgument on none.
  static Topology from_labels(const std::vector<int64_t>& labels);
  int nranks() const { return static_cast<int>(host_of.size()); }
  int num_hosts() const { return static_cast<int>(hosts.size()); }
  int min_local() const;  // ranks on the smallest host
  int max_local() const;
  bool same_host(int a, int b) const { return host_of[a] == host_of[b]; }
  std::string describe() const;  // "2 hosts: {0,2} {1,3}"
};

struct ScheduleKey {
  Collective coll;
  Algo algo;  // concrete (never Auto)
  int nranks;
  int rank;
  uint64_t count;  // all_reduce/broadcast/reduce: whole buffer; others: per-rank block N
  int root;
  uint64_t segment;  // elements per pipelined segment (tree, chain); 0 = whole buffer
  int peer = -1;     // send/recv
  // Hier and HierTree only: the communicator's hosts, owned by the caller and unchanged while
  // the key is in use (a communicator's topology lives as long as it does).
  const Topology* topo = nullptr;
  // Direct all_to_all only: input and output are one buffer. The schedule keeps the rank's own
  // block where it is and stages in scratch only the blocks it receives into before it sends
  // them (direct.cc), in place of a pre-step copy of the whole input.
  bool same_buffer = false;

  bool operator==(const ScheduleKey& o) const {
    return coll == o.coll && algo == o.algo && nranks == o.nranks && rank == o.rank && count == o.count &&
           root == o.root && segment == o.segment && peer == o.peer && topo == o.topo && same_buffer == o.same_buffer;
  }
};

// For executors that cache schedules by key.
struct ScheduleKeyHash {
  size_t operator()(const ScheduleKey& k) const {
    size_t h = static_cast<size_t>(k.coll) * 31 + static_cast<size_t>(k.algo);
    h = h * 1000003 + static_cast<size_t>(k.count);
    h = h * 1000003 + static_cast<size_t>(k.root) * 7 + static_cast<size_t>(k.peer);
    return (h * 1000003 + static_cast<size_t>(k.segment)) * 2 + static_cast<size_t>(k.same_buffer);
  }
};

// Which concrete algorithms a collective supports over any transport; the first is its default.
// OneShot is not listed: it needs one-shot slots (every rank on one host), which the communicator
// checks before it offers it; build_schedule builds its schedules all the same.
std::vector<Algo> supported_algos(Collective coll);
// Whether algo="auto" weighs `a` for `coll`. Broadcast's flat tree ('direct') is not weighed: its
// gain is the single-copy reads of the root's buffer, which the cost model does not price, and
// from 4 KiB pages (process_vm_readv pins each) four ranks on two cores measured it slower than
// the binary tree at 2 MiB and even at 8 MiB. The communicator runs it for a large broadcast whose
// root holds it on huge pages (HostExecutor::broadcast_asks_root).
inline bool auto_weighs(Collective coll, Algo a) { return !(coll == Collective::Broadcast && a == Algo::Direct); }
// The hierarchical algorithms of a collective (none for gather, scatter, barrier, point to point).
// Not in supported_algos either: they need a topology, which only the host communicator has; it
// offers them when its ranks span hosts.
std::vector<Algo> hier_algos(Collective coll);
inline bool is_hier(Algo a) { return a == Algo::Hier || a == Algo::HierTree; }
// The rank-order algorithm of a reduction (all_reduce, reduce_scatter, reduce; none for the
// others). Not in supported_algos either: auto takes it only in deterministic mode.
std::vector<Algo> rank_order_algos(Collective coll);

Schedule build_schedule(const ScheduleKey& key);

// ScheduleKey::segment for a call: elements per pipelined segment for the tree and chain
// algorithms (all_reduce tree, broadcast, reduce, rank_order), 0 for the others. segment_bytes 0 means
// the RINGTREE_TREE_SEGMENT_BYTES setting (128 KiB); every executor uses this, so all build
// the same schedule for the same call.
uint64_t pipeline_segment(Collective coll, Algo algo, size_t elem_size, uint64_t segment_bytes = 0);

// Children per node of a broadcast or reduce tree over nranks ranks: ring is a chain (1), tree
// binary (2), and direct (broadcast only) flat: every other rank a child of the root.
int rooted_tree_arity(Algo algo, int nranks);
// Whether every rank of that tree over nranks ranks receives straight from the root.
inline bool rooted_tree_is_flat(Algo algo, int nranks) { return nranks - 1 <= rooted_tree_arity(algo, nranks); }

// Per-algorithm generators (one file each).
void ring_all_reduce(Schedule& s, int nranks, int rank, uint64_t count);
void ring_reduce_scatter(Schedule& s, int nranks, int rank, uint64_t block);
void ring_all_gather(Schedule& s, int nranks, int rank, uint64_t block);
void tree_all_reduce(Schedule& s, int nranks, int rank, uint64_t count, uint64_t segment);
void tree_reduce(Schedule& s, int nranks, int rank, int root, uint64_t count, uint64_t segment, int arity);
void tree_broadcast(Schedule& s, int nranks, int rank, int root, uint64_t count, uint64_t segment, int arity);
void direct_all_to_all(Schedule& s, int nranks, int rank, uint64_t block);
// The same exchange when input and output are one buffer (ScheduleKey::same_buffer).
void direct_all_to_all_same_buffer(Schedule& s, int nranks, int rank, uint64_t block);
// Pairwise exchange with per-peer counts (all_to_all_v); not cached, not keyed.
void direct_all_to_all_v(Schedule& s, int nranks, int rank, const std::vector<uint64_t>& send_counts,
                         const std::vector<uint64_t>& recv_counts);
void direct_gather(Schedule& s, int nranks, int rank, int root, uint64_t block);
void direct_scatter(Schedule& s, int nranks, int rank, int root, uint64_t block);
void dissemination_barrier(Schedule& s, int nranks, int rank);
// Hierarchical schedules (hier.cc) over key.topo; key.algo Hier or HierTree.
void hier_schedule(Schedule& s, const ScheduleKey& key);
// Deterministic reductions (rank_order.cc): every element reduced in rank order along the chain
// 0 -> 1 -> ... -> P-1, with the same bits on any layout; key.algo RankOrder.
void rank_order_schedule(Schedule& s, const ScheduleKey& key);
// One-shot (oneshot.cc) for all_reduce, reduce_scatter, all_gather, all_to_all, broadcast,
// reduce, gather, scatter and barrier; P = 1 and count = 0 included (a one-shot call always
// publishes).
void oneshot_schedule(Schedule& s, Collective coll, int nranks, int rank, int root, uint64_t count);
// Whether one-shot runs `coll` (the collectives listed above).
bool has_oneshot_schedule(Collective coll);
// What each rank of a one-shot call publishes, in bytes, for a per-rank count of block_bytes (the
// largest publication of the call: a broadcast's or scatter's root, every rank of the others); UINT64_MAX for
// a collective one-shot does not run.
uint64_t oneshot_payload_bytes(Collective coll, uint64_t block_bytes, int nranks);
// Whether rank q of a one-shot call publishes data (its whole input, oneshot_payload_bytes of it)
// or only its fingerprint: a barrier's ranks and a broadcast's or scatter's other ranks publish none.
bool oneshot_publishes_data(Collective coll, int q, int root);

// Transport-free check: builds every rank's schedule for `key` (key.rank ignored), runs them
// against each other with rendezvous semantics (a send completes only when the receiver is at
// the matching recv, so any buffering also works; a one-shot read only once its peer has
// published), tracks which inputs every output element holds, and throws Error describing the
// first violation. Returns a short summary. One-shot schedules also get the one-shot rules above
// checked, the rank order of their reductions (0, 1, ..., P-1 on every rank), and three calls
// in a row walked over two slots per rank, proving that no rank can overwrite a publication
// before every reader is done with it. One-shot and rank_order reductions must also have the shape
// of the rank-order left fold ((x_0 op x_1) op x_2) ... (operands of each op in either order),
// which is what makes their bits equal; claim_rank_fold asks that of any algorithm (a check of
// the checker: the ring and the trees must fail it).
// drop_op >= 0 removes that op from rank 0's schedule first: a fault the check must report.
// oneshot_rules false skips the per-call one-shot rules, to show that the data check and the walk
// of three calls find a fault without them (a check of the checker).
std::string verify_schedules(ScheduleKey key, int drop_op = -1, bool oneshot_rules = true,
                             bool claim_rank_fold = false);

}  // namespace ringtree
