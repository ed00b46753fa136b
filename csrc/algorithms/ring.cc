// Ring algorithms.
//
// Terms: P ranks in a ring, rank r sends to next = r+1 and receives from prev = r-1 (mod P).
// The buffer is cut into P blocks (all_reduce: as even as possible, the first count%P blocks
// one element longer). Block b is "owned" by rank b at the end of reduce-scatter.
//
// all_reduce  = reduce-scatter phase (P-1 steps) then all-gather phase (P-1 steps).
//   reduce-scatter step s (0..P-2): send block r-s to next (s=0: from the input), and
//     receive block r-s-1 from prev, reducing it with our input into the output.
//     After step P-2 rank r holds the complete reduction of block r+1.
//   all-gather step s (0..P-2): send block r+1-s, receive block r-s into the output.
// Every block is reduced in ring order starting at a different rank, so each element is
// reduced in one fixed order, and all ranks end with bitwise-identical results.
#include "algorithms/op_builders.h"

namespace ringtree {

namespace {

inline int mod(int a, int p) { return ring_mod(a, p); }

// Block b of a count-element buffer split over P ranks: [offset, offset+length).
struct BlockRange {
  uint64_t offset, length;
};
inline BlockRange block_range(uint64_t count, int nranks, int b) {
  const uint64_t base = count / nranks, extra = count % nranks;
  const uint64_t ub = static_cast<uint64_t>(b);
  return {ub * base + (ub < extra ? ub : extra), base + (ub < extra ? 1 : 0)};
}

inline Op send(int peer, BufId buf, uint64_t off, uint64_t n) { return make_send(peer, buf, off, n); }
inline Op recv(int peer, BufId buf, uint64_t off, uint64_t n) { return make_recv(peer, buf, off, n); }
inline Op recv_reduce(int peer, BufId dst, uint64_t dst_off, BufId src, uint64_t src_off, uint64_t n) {
  return make_recv_reduce(peer, dst, dst_off, src, src_off, n);
}

}  // namespace

void ring_all_reduce(Schedule& s, int P, int r, uint64_t count) {
  s.first_step_meets_neighbours = P > 1;
  const int next = mod(r + 1, P), prev = mod(r - 1, P);
  // reduce-scatter phase
  for (int step = 0; step < P - 1; ++step) {
    BlockRange out = block_range(count, P, mod(r - step, P));
    BlockRange in = block_range(count, P, mod(r - step - 1, P));
    s.add(send(next, step == 0 ? BufId::Input : BufId::Output, out.offset, out.length));
    s.add(recv_reduce(prev, BufId::Output, in.offset, BufId::Input, in.offset, in.length));
    s.end_step();
  }
  // all-gather phase
  for (int step = 0; step < P - 1; ++step) {
    BlockRange out = block_range(count, P, mod(r + 1 - step, P));
    BlockRange in = block_range(count, P, mod(r - step, P));
    s.add(send(next, BufId::Output, out.offset, out.length));
    s.add(recv(prev, BufId::Output, in.offset, in.length));
    s.end_step();
  }
}

// reduce_scatter: the partial sum of block b travels the ring, each rank adding its input
// block b. Partial sums alternate between two scratch blocks so a step never reads the block
// it writes; the last step writes the output.
//   step s (0..P-2): send partial of block r-s-1 (s=0: our input block), receive partial of
//   block r-s-2 and add our input block r-s-2. After step P-2 the output holds block r.
void ring_reduce_scatter(Schedule& s, int P, int r, uint64_t N) {
  s.first_step_meets_neighbours = P > 1;
  const int next = mod(r + 1, P), prev = mod(r - 1, P);
  s.scratch_elems = P > 2 ? 2 * N : 0;
  auto scratch = [N](int step) { return static_cast<uint64_t>(step % 2) * N; };
  for (int step = 0; step < P - 1; ++step) {
    const uint64_t send_block = static_cast<uint64_t>(mod(r - step - 1, P));
    const uint64_t recv_block = static_cast<uint64_t>(mod(r - step - 2, P));
    if (step == 0)
      s.add(send(next, BufId::Input, send_block * N, N));
    else
      s.add(send(next, BufId::Scratch, scratch(step - 1), N));
    const bool last = step == P - 2;
    s.add(recv_reduce(prev, last ? BufId::Output : BufId::Scratch, last ? 0 : scratch(step), BufId::Input,
                      recv_block * N, N));
    s.end_step();
  }
}

// all_gather: step s (0..P-2) forwards block r-s and receives block r-s-1, our own block (s=0)
// sent from the input; step 0 also copies our block into place, while the next rank reads it
// (a step's messages start before its copies). The input is never written, so the next call's
// copy does not have to take back lines that a reader on another core just pulled out of this
// core's cache (a next rank reading single-copy reads straight from the sender's memory).
void ring_all_gather(Schedule& s, int P, int r, uint64_t N) {
  s.first_step_meets_neighbours = P > 1;
  const int next = mod(r + 1, P), prev = mod(r - 1, P);
  for (int step = 0; step < P - 1; ++step) {
    if (step == 0)
      s.add(send(next, BufId::Input, 0, N));
    else
      s.add(send(next, BufId::Output, static_cast<uint64_t>(mod(r - step, P)) * N, N));
    s.add(recv(prev, BufId::Output, static_cast<uint64_t>(mod(r - step - 1, P)) * N, N));
    if (step == 0) s.add(make_copy(BufId::Output, static_cast<uint64_t>(r) * N, BufId::Input, 0, N));
    s.end_step();
  }
}

}  // namespace ringtree
