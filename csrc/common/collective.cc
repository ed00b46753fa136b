#include "common/collective.h"

namespace ringtree {

namespace {

using M = Multiple;

// In Collective's code order.
const CollectiveTraits kTraits[] = {
    //  coll                      reduce root   p2p    in place                       in@root        out@root in@other
    //  out@other
    {Collective::AllReduce, true, false, false, InPlace::SameBuffer, M::One, M::One, M::One, M::One},
    {Collective::ReduceScatter, true, false, false, InPlace::OutputIsInputBlock, M::WorldSize, M::One, M::WorldSize,
     M::One},
    {Collective::AllGather, false, false, false, InPlace::InputIsOutputBlock, M::One, M::WorldSize, M::One,
     M::WorldSize},
    {Collective::AllToAll, false, false, false, InPlace::StagedSameBuffer, M::WorldSize, M::WorldSize, M::WorldSize,
     M::WorldSize},
    {Collective::Broadcast, false, true, false, InPlace::OneBuffer, M::One, M::None, M::One, M::None},
    {Collective::Reduce, true, true, false, InPlace::SameBuffer, M::One, M::One, M::One, M::None},
    {Collective::Gather, false, true, false, InPlace::InputIsOutputBlock, M::One, M::WorldSize, M::One, M::None},
    {Collective::Scatter, false, true, false, InPlace::OutputIsInputBlock, M::WorldSize, M::One, M::None, M::One},
    {Collective::Barrier, false, false, false, InPlace::None, M::None, M::None, M::None, M::None},
    {Collective::Send, false, false, true, InPlace::None, M::One, M::None, M::One, M::None},
    {Collective::Recv, false, false, true, InPlace::None, M::None, M::One, M::None, M::One},
    {Collective::AllToAllV, false, false, false, InPlace::StagedSameBuffer, M::Free, M::Free, M::Free, M::Free},
    {Collective::SendRecv, false, false, true, InPlace::None, M::Free, M::Free, M::Free, M::Free},
};
static_assert(sizeof(kTraits) / sizeof(kTraits[0]) == static_cast<size_t>(Collective::Count),
              "one entry per collective");

uint64_t elems(Multiple m, uint64_t count, int nranks) {
  switch (m) {
    case M::One:
      return count;
    case M::WorldSize:
      return count * static_cast<uint64_t>(nranks);
    default:
      return 0;
  }
}

}  // namespace

const CollectiveTraits& collective_traits(Collective c) { return kTraits[static_cast<int>(c)]; }

double CollectiveTraits::busbw_factor(int nranks) const {
  const double P = nranks;
  switch (coll) {
    case Collective::AllReduce:
      return nranks > 1 ? 2.0 * (P - 1) / P : 0.0;
    case Collective::ReduceScatter:
    case Collective::AllGather:
    case Collective::AllToAll:
    case Collective::Gather:
    case Collective::Scatter:
    case Collective::AllToAllV:
      return nranks > 1 ? (P - 1) / P : 0.0;
    case Collective::Barrier:
      return 0.0;
    default:
      return 1.0;  // broadcast, reduce, send, recv, sendrecv
  }
}

BufferSizes CollectiveTraits::sizes(uint64_t count, int nranks, bool is_root) const {
  const bool root_side = !rooted || is_root;
  return {elems(root_side ? input_on_root : input_elsewhere, count, nranks),
          elems(root_side ? output_on_root : output_elsewhere, count, nranks)};
}

uint64_t CollectiveTraits::count_from(uint64_t input_elems, uint64_t output_elems, int nranks) const {
  const uint64_t P = static_cast<uint64_t>(nranks > 0 ? nranks : 1);
  switch (coll) {
    case Collective::ReduceScatter:
    case Collective::Scatter:
    case Collective::Recv:
      return output_elems;
    case Collective::AllToAll:
      return input_elems / P;
    case Collective::Barrier:
    case Collective::AllToAllV:
      return 0;  // per-peer sizes travel with the messages
    default:
      return input_elems;  // all_reduce, all_gather, broadcast, reduce, gather, send, sendrecv
  }
}

}  // namespace ringtree
