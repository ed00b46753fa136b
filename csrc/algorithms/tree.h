// Pipelined trees over any tree shape, for tree.cc (heap-ordered trees over all ranks) and
// hier.cc (trees of host leaders with a tree inside each host). Terms as in tree.cc.
#pragma once
#include <vector>
#include "algorithms/schedule.h"

namespace ringtree {

struct TreeNode {
  int parent = -1;            // absolute rank, -1 at the root
  std::vector<int> children;  // absolute ranks, in the order a reduction takes them
};

// Rank r's place in the complete `arity`-ary tree in heap order over ranks relative to root.
TreeNode tree_node(int nranks, int rank, int root, int arity);

// Elements [offset, offset + count) of the buffers reduced toward the root, segment by segment:
// leaves send `src`, interior nodes accumulate src (op) children into `acc` (the root's result).
void tree_reduce_over(Schedule& s, const TreeNode& node, uint64_t offset, uint64_t count, uint64_t segment, BufId src,
                      BufId acc);
// Elements [offset, offset + count) of `buf` broadcast from the root, segment by segment.
void tree_broadcast_over(Schedule& s, const TreeNode& node, uint64_t offset, uint64_t count, uint64_t segment,
                         BufId buf);

}  // namespace ringtree
