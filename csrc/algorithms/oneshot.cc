// One-shot as schedules: one publication per rank, then local reads of the
// publications (exec/host/oneshot.cc runs them over shared memory).
//
// Terms: N is the per-rank count (all_reduce / broadcast / reduce: the whole buffer). A rank's
// publication is its whole input: N elements, N·P for reduce_scatter, all_to_all and scatter's
// root, nothing for a barrier or a broadcast or scatter rank other than the root. Block q is
// elements [q·N, (q+1)·N).
//
// Step 0: publish. Then, per collective:
//   all_reduce / reduce (root) / reduce_scatter: the result is reduced straight from the
//     publications in rank order, published(0) (op) published(1) in one step, then
//     (op) published(q) for q = 2 .. P-1, one step each (each step rewrites the whole result);
//     reduce_scatter reduces block r of every publication. Every rank's every element gets the
//     order 0, 1, ..., P-1, so all ranks get identical bits.
//   all_gather: output block q = published(q), one step.
//   all_to_all: output block q = block r of published(q), one step.
//   broadcast: a rank other than the root copies published(root); the root has its data.
//   scatter: output = block r of published(root), on the root too.
//   gather: the root's output block q = published(q), one step; the others read nothing.
//   reduce (other ranks): nothing to read; wait for every other rank's publication, deferred.
//   barrier: wait for every other rank's publication.
//   count 0 (but barrier): nothing to read; wait for every other rank's publication, deferred.
// Every rank waits for every other rank's publication in its call (schedule.h "one-shot rules"):
// a broadcast or scatter does so in a deferred step, after the rank has its result, so the root
// returns at once and the others once they have the root's data; so does a gather's or reduce's
// rank other than the root, which returns once it has published, as a count-0 call does.
#include "algorithms/op_builders.h"
#include "common/check.h"

namespace ringtree {

namespace {

// dst = published(0) (op) published(1) (op) ... (op) published(P-1), each at pub_off.
void reduce_in_rank_order(Schedule& s, int P, uint64_t pub_off, uint64_t N) {
  if (P == 1) {
    s.add(make_copy_published(0, BufId::Output, 0, pub_off, N));
    s.end_step();
    return;
  }
  s.add(make_reduce_published(0, 1, BufId::Output, 0, pub_off, N));
  s.end_step();
  for (int q = 2; q < P; ++q) {
    s.add(make_reduce_published(-1, q, BufId::Output, 0, pub_off, N));
    s.end_step();
  }
}

// One step waiting for every rank's publication but this rank's and `skip`'s.
void await_others(Schedule& s, int P, int r, int skip) {
  for (int q = 0; q < P; ++q)
    if (q != r && q != skip) s.add(make_await_published(q));
  s.end_step();
}

// How many blocks a one-shot call's largest publication holds (a block: the per-rank count), or
// -1 for a collective one-shot does not run: the one list of what one-shot runs.
int64_t published_blocks(Collective coll, int nranks) {
  switch (coll) {
    case Collective::AllReduce:
    case Collective::Reduce:
    case Collective::AllGather:
    case Collective::Broadcast:
    case Collective::Gather:
      return 1;
    case Collective::ReduceScatter:
    case Collective::AllToAll:
    case Collective::Scatter:  // the root's
      return nranks;
    case Collective::Barrier:
      return 0;
    default:
      return -1;
  }
}

}  // namespace

bool has_oneshot_schedule(Collective coll) { return published_blocks(coll, 1) >= 0; }

uint64_t oneshot_payload_bytes(Collective coll, uint64_t block_bytes, int nranks) {
  const int64_t blocks = published_blocks(coll, nranks);
  return blocks < 0 ? UINT64_MAX : block_bytes * static_cast<uint64_t>(blocks);
}

bool oneshot_publishes_data(Collective coll, int q, int root) {
  if (coll == Collective::Barrier) return false;
  return (coll != Collective::Broadcast && coll != Collective::Scatter) || q == root;
}

void oneshot_schedule(Schedule& s, Collective coll, int P, int r, int root, uint64_t N) {
  RT_CHECK(has_oneshot_schedule(coll), InvalidArgument, "no one-shot schedule for ", collective_name(coll));
  const uint64_t ur = static_cast<uint64_t>(r);
  const uint64_t published =
      oneshot_publishes_data(coll, r, root) ? N * static_cast<uint64_t>(published_blocks(coll, P)) : 0;
  s.add(make_publish(BufId::Input, published));
  s.end_step();
  if (N == 0 && coll != Collective::Barrier && P > 1) {
    // Nothing to read or make: the call returns at once, and its fingerprint checks wait in a
    // deferred step, so a rank's count-0 calls cost no wait for its peers.
    await_others(s, P, r, r);
    s.deferred_steps = 1;
    return;
  }
  switch (coll) {
    case Collective::AllReduce:
      reduce_in_rank_order(s, P, 0, N);
      break;
    case Collective::ReduceScatter:
      reduce_in_rank_order(s, P, ur * N, N);
      break;
    case Collective::Reduce:
      if (r == root) {
        reduce_in_rank_order(s, P, 0, N);
      } else {
        await_others(s, P, r, r);
        s.deferred_steps = 1;
      }
      break;
    case Collective::AllGather:
    case Collective::AllToAll: {
      const uint64_t pub_off = coll == Collective::AllToAll ? ur * N : 0;
      for (int q = 0; q < P; ++q)
        s.add(make_copy_published(q, BufId::Output, static_cast<uint64_t>(q) * N, pub_off, N));
      s.end_step();
      break;
    }
    case Collective::Broadcast:
    case Collective::Scatter: {
      if (coll == Collective::Scatter || r != root) {
        s.add(make_copy_published(root, BufId::Output, 0, coll == Collective::Scatter ? ur * N : 0, N));
        s.end_step();
      }
      const size_t before = s.num_steps();
      await_others(s, P, r, root);
      s.deferred_steps = static_cast<uint32_t>(s.num_steps() - before);
      if (s.deferred_steps && r != root) s.deferred_unawaited = root;
      break;
    }
    case Collective::Gather:
      if (r == root) {
        for (int q = 0; q < P; ++q) s.add(make_copy_published(q, BufId::Output, static_cast<uint64_t>(q) * N, 0, N));
        s.end_step();
      } else {
        await_others(s, P, r, r);
        s.deferred_steps = 1;
      }
      break;
    case Collective::Barrier:
      await_others(s, P, r, r);
      break;
    default:
      break;  // refused above
  }
}

}  // namespace ringtree
