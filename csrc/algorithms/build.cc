// One entry: key in, schedule out. Single-rank and empty collectives reduce to local copies
// (the executor still runs its fingerprint handshake, so a count mismatch is caught), except on
// one-shot, where every call publishes: that is its handshake.
#include <algorithm>
#include "algorithms/op_builders.h"
#include "common/check.h"
#include "common/settings.h"

namespace ringtree {

std::vector<Algo> supported_algos(Collective coll) {
  switch (coll) {
    case Collective::AllReduce:
      return {Algo::Ring, Algo::Tree};
    case Collective::ReduceScatter:
    case Collective::AllGather:
      return {Algo::Ring};
    case Collective::Broadcast:
      return {Algo::Tree, Algo::Ring, Algo::Direct};
    case Collective::Reduce:
      return {Algo::Tree, Algo::Ring};
    default:
      return {Algo::Direct};
  }
}

namespace {

RT_SETTING(TreeSegmentBytes)

// Elements of input and output buffers, per collective, for a per-rank count N.
void local_copy_only(Schedule& s, const ScheduleKey& k) {
  const uint64_t N = k.count;
  switch (k.coll) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll:
    case Collective::Reduce:
    case Collective::Gather:
    case Collective::Scatter:
      if (N > 0) {
        s.add(make_copy(BufId::Output, 0, BufId::Input, 0, N));
        s.end_step();
      }
      break;
    default:
      break;
  }
}

}  // namespace

int rooted_tree_arity(Algo algo, int nranks) {
  if (algo == Algo::Direct) return std::max(1, nranks - 1);  // flat: every rank a child of the root
  return algo == Algo::Ring ? 1 : 2;
}

uint64_t pipeline_segment(Collective coll, Algo algo, size_t elem_size, uint64_t segment_bytes) {
  const bool pipelined = coll == Collective::Broadcast || coll == Collective::Reduce || algo == Algo::RankOrder ||
                         (coll == Collective::AllReduce && (algo == Algo::Tree || algo == Algo::HierTree));
  if (!pipelined) return 0;
  const uint64_t bytes =
      segment_bytes ? segment_bytes : static_cast<uint64_t>(std::max<int64_t>(64, TreeSegmentBytes()));
  return std::max<uint64_t>(1, bytes / elem_size);
}

Schedule build_schedule(const ScheduleKey& k) {
  Schedule s;
  const int P = k.nranks, r = k.rank;
  RT_CHECK(P >= 1 && r >= 0 && r < P, InvalidArgument, "bad rank ", r, " of ", P);
  RT_CHECK(!k.same_buffer || (k.coll == Collective::AllToAll && k.algo == Algo::Direct), InvalidArgument,
           "a one-buffer schedule is direct all_to_all's alone, not ", collective_name(k.coll), "/", algo_name(k.algo));
  if (k.coll == Collective::Send) {
    s.add(make_send(k.peer, BufId::Input, 0, k.count));
    s.end_step();
    return s;
  }
  if (k.coll == Collective::Recv) {
    s.add(make_recv(k.peer, BufId::Output, 0, k.count));
    s.end_step();
    return s;
  }
  if (k.algo == Algo::OneShot) {
    oneshot_schedule(s, k.coll, P, r, k.root, k.count);
    return s;
  }
  if (P == 1) {
    local_copy_only(s, k);
    return s;
  }
  if (k.count == 0 && k.coll != Collective::Barrier) return s;
  if (is_hier(k.algo)) {
    hier_schedule(s, k);
    return s;
  }
  if (k.algo == Algo::RankOrder) {
    rank_order_schedule(s, k);
    return s;
  }
  const int arity = rooted_tree_arity(k.algo, P);
  switch (k.coll) {
    case Collective::AllReduce:
      if (k.algo == Algo::Tree)
        tree_all_reduce(s, P, r, k.count, k.segment);
      else
        ring_all_reduce(s, P, r, k.count);
      break;
    case Collective::ReduceScatter:
      ring_reduce_scatter(s, P, r, k.count);
      break;
    case Collective::AllGather:
      ring_all_gather(s, P, r, k.count);
      break;
    case Collective::AllToAll:
      if (k.same_buffer)
        direct_all_to_all_same_buffer(s, P, r, k.count);
      else
        direct_all_to_all(s, P, r, k.count);
      break;
    case Collective::Broadcast:
      tree_broadcast(s, P, r, k.root, k.count, k.segment, arity);
      break;
    case Collective::Reduce:
      tree_reduce(s, P, r, k.root, k.count, k.segment, arity);
      break;
    case Collective::Gather:
      direct_gather(s, P, r, k.root, k.count);
      break;
    case Collective::Scatter:
      direct_scatter(s, P, r, k.root, k.count);
      break;
    case Collective::Barrier:
      dissemination_barrier(s, P, r);
      break;
    default:
      RT_THROW(InvalidArgument, "no schedule for ", collective_name(k.coll));
  }
  return s;
}

}  // namespace ringtree
