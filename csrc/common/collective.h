// One description of each collective: which buffers a rank supplies, how many elements each
// holds for a call's count, which in-place layouts it accepts, whether it reduces or has a root,
// and its bus-bandwidth factor. Validation, lowering, every executor, the bench and the tests
// (through the bindings) read this table instead of re-deriving it.
//
// Terms:
//   count  the schedule's count (ScheduleKey::count): the whole buffer for all_reduce,
//          broadcast, reduce, send and recv; one rank's block N for the others.
//   block  N elements; the larger buffer of reduce_scatter, all_gather, all_to_all, gather and
//          scatter holds one block per rank, block r belonging to rank r.
#pragma once
#include <cstdint>
#include "ringtree/types.h"

namespace ringtree {

// How a collective may run in place (input and output sharing memory).
enum class InPlace : uint8_t {
  None,                // barrier, send, recv, sendrecv: the buffers must not overlap
  SameBuffer,          // all_reduce, reduce: element-wise, output == input
  StagedSameBuffer,    // all_to_all(_v): output == input; the input is copied aside first
  OneBuffer,           // broadcast: there is only one buffer, read on the root, written elsewhere
  InputIsOutputBlock,  // all_gather, gather (root): input == output + rank * block
  OutputIsInputBlock,  // reduce_scatter, scatter (root): output == input + rank * block
};

// Which of a call's buffers hold a multiple of the count, and on which ranks.
enum class Multiple : uint8_t {
  None,       // the buffer is not used on this rank
  One,        // count elements
  WorldSize,  // count x P elements
  Free,       // all_to_all_v and sendrecv: sizes given per call
};

struct BufferSizes {
  uint64_t input = 0, output = 0;  // elements; 0 where the rank uses no such buffer
};

struct CollectiveTraits {
  Collective coll;
  bool reduction;       // combines values with a reduce op
  bool rooted;          // takes a root
  bool point_to_point;  // send, recv, sendrecv: a peer instead of the whole communicator
  InPlace in_place;
  // Buffer multiples on the root (or on every rank for unrooted collectives) and elsewhere.
  Multiple input_on_root, output_on_root, input_elsewhere, output_elsewhere;
  // bus bandwidth = algorithm bandwidth x factor(P) (nccl-tests' definitions).
  double busbw_factor(int nranks) const;
  // Element counts of this rank's buffers for a call of `count` (root: whether this rank is it).
  BufferSizes sizes(uint64_t count, int nranks, bool is_root) const;
  // The count a call has from the buffers given (the inverse of sizes, from the buffer that
  // defines it): all_to_all's input / P, reduce_scatter's output, and so on.
  uint64_t count_from(uint64_t input_elems, uint64_t output_elems, int nranks) const;
  bool needs_input(bool is_root) const { return (is_root ? input_on_root : input_elsewhere) != Multiple::None; }
  bool needs_output(bool is_root) const { return (is_root ? output_on_root : output_elsewhere) != Multiple::None; }
};

// The table entry of `c` (c < Collective::Count).
const CollectiveTraits& collective_traits(Collective c);

}  // namespace ringtree
