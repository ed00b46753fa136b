// Rank-order reductions: deterministic mode's all_reduce, reduce_scatter and reduce.
//
// Terms: the chain is the ranks in rank order, 0 -> 1 -> ... -> P-1. A piece is a run of
// elements that moves as one message: a segment (ScheduleKey::segment) of the buffer for
// all_reduce and reduce, of one rank's block for reduce_scatter (so a piece has one owner). Time
// T is a global step: rank r's step T holds what r does at T, and both sides of a message are at
// the same T, so the ranks advance in lockstep and the schedules cannot deadlock.
//
// Every piece is reduced along the chain: rank 0 sends its input, rank i adds its own input to
// what arrived (x_i (op) partial) and passes the sum on, so rank P-1 ends with
// ((x_0 op x_1) op x_2) ... op x_{P-1}. Sum and product are commutative in IEEE arithmetic
// (x_i op partial has the bits of partial op x_i), and half types round after every step as
// everywhere, so every element gets the bits of that left fold whatever the hosts, the rank
// layout or the transport: only P and the rank order decide them. One-shot reduces
// in the same order (oneshot.cc), so it gives the same bits for sum, prod, avg and premul_sum.
//
// Piece u leaves rank 0 at T = u and is reduced on rank i at T = u + i - 1; it is complete on
// P-1 at T = u + P - 2. Then:
//   all_reduce      the result runs back down the chain, P-1 -> P-2 -> ... -> 0, reaching rank i at
//                   T = u + 2P - 3 - i. Partials accumulate in the output, at the piece's own
//                   place (the result overwrites them after they have been passed on).
//   reduce_scatter  P-1 sends the piece to its owner at T = u + P - 1 (keeps it if it owns it).
//   reduce          the same, every piece owned by the root.
// Partials of reduce_scatter and reduce alternate between two scratch pieces: piece u is written
// at T = u + i - 1 and sent at T = u + i, before piece u + 2 reuses its place.
//
// Cost, against the ring (C = the all_reduce / reduce buffer, or N·P of reduce_scatter):
//   all_reduce      a middle rank sends and receives 2C (ring: 2C(P-1)/P); S + 2P - 3 message
//                   steps for S pieces (ring: 2(P-1)); no scratch.
//   reduce_scatter  every chain link carries C (ring: C(P-1)/P) and owners receive their block
//                   once more; S + P - 1 steps; 2 pieces of scratch per rank.
//   reduce          C along the chain, then C from P-1 to the root (none when the root is P-1).
#include <algorithm>
#include "algorithms/op_builders.h"
#include "common/check.h"

namespace ringtree {

namespace {

struct Piece {
  uint64_t in_offset, out_offset, length;
  int owner;  // -1: every rank (all_reduce)
};

// Segments of [base, base + count), in order, delivered to `owner` at out_base onwards.
void add_pieces(std::vector<Piece>& out, uint64_t base, uint64_t count, uint64_t segment, int owner,
                uint64_t out_base) {
  const uint64_t seg = segment == 0 || segment > count ? count : segment;
  for (uint64_t at = 0; at < count; at += seg)
    out.push_back({base + at, out_base + at, std::min(seg, count - at), owner});
}

}  // namespace

std::vector<Algo> rank_order_algos(Collective coll) {
  switch (coll) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
    case Collective::Reduce:
      return {Algo::RankOrder};
    default:
      return {};
  }
}

void rank_order_schedule(Schedule& s, const ScheduleKey& k) {
  const int P = k.nranks, r = k.rank;
  const bool all_reduce = k.coll == Collective::AllReduce;
  std::vector<Piece> pieces;
  switch (k.coll) {
    case Collective::AllReduce:
      add_pieces(pieces, 0, k.count, k.segment, -1, 0);
      break;
    case Collective::Reduce:
      add_pieces(pieces, 0, k.count, k.segment, k.root, 0);
      break;
    case Collective::ReduceScatter:
      for (int b = 0; b < P; ++b) add_pieces(pieces, static_cast<uint64_t>(b) * k.count, k.count, k.segment, b, 0);
      break;
    default:
      RT_THROW(InvalidArgument, "rank_order has no schedule for ", collective_name(k.coll));
  }
  uint64_t longest = 0;
  for (const Piece& p : pieces) longest = std::max(longest, p.length);
  const bool uses_scratch = !all_reduce && r > 0;
  if (uses_scratch) s.scratch_elems = 2 * longest;
  // Where rank r holds piece u's partial sum (r > 0).
  auto partial = [&](size_t u) -> BufRef {
    const Piece& p = pieces[u];
    if (all_reduce) return {BufId::Output, p.in_offset};
    if (r == P - 1 && p.owner == r) return {BufId::Output, p.out_offset};
    return {BufId::Scratch, (u % 2) * longest};
  };
  std::vector<std::vector<Op>> at(pieces.size() + 2 * static_cast<size_t>(P));
  for (size_t u = 0; u < pieces.size(); ++u) {
    const Piece& p = pieces[u];
    // the chain
    if (r == 0) {
      at[u].push_back(make_send(1, BufId::Input, p.in_offset, p.length));
    } else {
      const BufRef acc = partial(u);
      at[u + r - 1].push_back(make_recv_reduce(r - 1, acc.buf, acc.offset, BufId::Input, p.in_offset, p.length));
      if (r < P - 1) at[u + r].push_back(make_send(r + 1, acc.buf, acc.offset, p.length));
    }
    // the result to where it belongs
    if (all_reduce) {
      if (r == P - 1) {
        at[u + P - 1].push_back(make_send(P - 2, BufId::Output, p.out_offset, p.length));
      } else {
        const size_t T = u + 2 * static_cast<size_t>(P) - 3 - r;
        at[T].push_back(make_recv(r + 1, BufId::Output, p.out_offset, p.length));
        if (r > 0) at[T + 1].push_back(make_send(r - 1, BufId::Output, p.out_offset, p.length));
      }
    } else if (r == P - 1 && p.owner != r) {
      const BufRef acc = partial(u);
      at[u + P - 1].push_back(make_send(p.owner, acc.buf, acc.offset, p.length));
    } else if (r == p.owner && r != P - 1) {
      at[u + P - 1].push_back(make_recv(P - 1, BufId::Output, p.out_offset, p.length));
    }
  }
  for (const std::vector<Op>& step : at) {
    for (const Op& op : step) s.add(op);
    s.end_step();
  }
}

}  // namespace ringtree
