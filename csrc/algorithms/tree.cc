// Pipelined trees: reduce, broadcast, and all_reduce as reduce-then-broadcast.
//
// Terms: ranks are renumbered relative to the root (rel = r - root mod P) and arranged as a
// complete k-ary tree in heap order: the parent of rel is (rel-1)/k, its children are
// k*rel+1 .. k*rel+k. Arity 2 is the binary tree; arity 1 is a chain (root -> 1 -> 2 -> ...),
// which is what "ring" means for broadcast and reduce; arity P-1 is flat, what "direct" means for
// broadcast: the root sends every segment to every rank, which over single-copy shared memory
// means each rank reads it once straight from the root's buffer and the root copies nothing. The buffer is cut into S
// segments of `segment` elements (the last may be shorter); segments stream through the tree so that a node forwards
// segment t-1 while it receives segment t.
//
// An interior node reduces its children one after another (child 1 into the accumulator from
// the input, child 2.. into the accumulator from itself): two children never write the same
// elements in one step, and the reduction order is fixed: own, child 1, child 2, ...
#include "algorithms/tree.h"
#include <algorithm>
#include "algorithms/op_builders.h"

namespace ringtree {

TreeNode tree_node(int P, int r, int root, int arity) {
  TreeNode n;
  const int rel = ring_mod(r - root, P);
  if (rel != 0) n.parent = ring_mod((rel - 1) / arity + root, P);
  for (int c = 1; c <= arity; ++c) {
    const int child = arity * rel + c;
    if (child < P) n.children.push_back(ring_mod(child + root, P));
  }
  return n;
}

namespace {

// Segments of [base, base + count).
struct Segments {
  uint64_t base, count, segment;
  uint64_t num() const { return count == 0 ? 0 : (count + segment - 1) / segment; }
  uint64_t offset(uint64_t t) const { return base + t * segment; }
  uint64_t length(uint64_t t) const { return std::min(segment, count - t * segment); }
};

Segments make_segments(uint64_t base, uint64_t count, uint64_t segment) {
  return {base, count, segment == 0 || segment > count ? std::max<uint64_t>(count, 1) : segment};
}

}  // namespace

void tree_reduce_over(Schedule& s, const TreeNode& node, uint64_t offset, uint64_t count, uint64_t segment, BufId src,
                      BufId acc) {
  const Segments seg = make_segments(offset, count, segment);
  const uint64_t S = seg.num();
  if (node.children.empty()) {  // leaf: stream the input up
    for (uint64_t t = 0; t < S; ++t) {
      s.add(make_send(node.parent, src, seg.offset(t), seg.length(t)));
      s.end_step();
    }
    return;
  }
  for (uint64_t t = 0; t < S; ++t) {
    // first child, and forward the previous segment to the parent
    s.add(make_recv_reduce(node.children[0], acc, seg.offset(t), src, seg.offset(t), seg.length(t)));
    if (node.parent >= 0 && t > 0) s.add(make_send(node.parent, acc, seg.offset(t - 1), seg.length(t - 1)));
    s.end_step();
    // remaining children, one step each
    for (size_t c = 1; c < node.children.size(); ++c) {
      s.add(make_recv_reduce(node.children[c], acc, seg.offset(t), acc, seg.offset(t), seg.length(t)));
      s.end_step();
    }
  }
  if (node.parent >= 0 && S > 0) {  // drain: the last segment goes up
    s.add(make_send(node.parent, acc, seg.offset(S - 1), seg.length(S - 1)));
    s.end_step();
  }
}

// The root sends segment t to every child in step t; any other node receives segment t and
// sends segment t-1 to its children in step t, then drains the last segment.
void tree_broadcast_over(Schedule& s, const TreeNode& node, uint64_t offset, uint64_t count, uint64_t segment,
                         BufId buf) {
  const Segments seg = make_segments(offset, count, segment);
  const uint64_t S = seg.num();
  auto send_to_children = [&](uint64_t t) {
    for (int child : node.children) s.add(make_send(child, buf, seg.offset(t), seg.length(t)));
  };
  if (node.parent < 0) {
    for (uint64_t t = 0; t < S; ++t) {
      send_to_children(t);
      s.end_step();
    }
    return;
  }
  for (uint64_t t = 0; t < S; ++t) {
    s.add(make_recv(node.parent, buf, seg.offset(t), seg.length(t)));
    if (t > 0) send_to_children(t - 1);
    s.end_step();
  }
  if (!node.children.empty() && S > 0) {
    send_to_children(S - 1);
    s.end_step();
  }
}

void tree_reduce(Schedule& s, int P, int r, int root, uint64_t count, uint64_t segment, int arity) {
  // Non-root interior nodes accumulate in scratch so the caller's buffers stay untouched.
  const TreeNode node = tree_node(P, r, root, arity);
  BufId acc = r == root ? BufId::Output : BufId::Scratch;
  if (r != root && !node.children.empty()) s.scratch_elems = count;
  tree_reduce_over(s, node, 0, count, segment, BufId::Input, acc);
}

// Broadcast of the output buffer (in place; the root's output holds the data).
void tree_broadcast(Schedule& s, int P, int r, int root, uint64_t count, uint64_t segment, int arity) {
  tree_broadcast_over(s, tree_node(P, r, root, arity), 0, count, segment, BufId::Output);
}

// all_reduce: reduce to rank 0 over the binary tree, accumulating in the output (every rank's
// output is overwritten by the broadcast anyway), then broadcast from rank 0 over the same tree.
void tree_all_reduce(Schedule& s, int P, int r, uint64_t count, uint64_t segment) {
  const TreeNode node = tree_node(P, r, 0, 2);
  tree_reduce_over(s, node, 0, count, segment, BufId::Input, BufId::Output);
  if (r == 0 && P == 1) return;
  tree_broadcast_over(s, node, 0, count, segment, BufId::Output);
}

}  // namespace ringtree
