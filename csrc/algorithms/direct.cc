// Direct (pairwise) algorithms: every rank talks to every other rank.
//
// all_to_all, pairwise exchange: in step s (1..P-1) rank r sends its input block r+s to rank r+s
//   and receives rank r-s's block r into output block r-s; the first step also copies our own
//   block, while the peers read ours (a step's messages start before its copies). Each step
//   pairs every rank with exactly one sender and one receiver.
//   In one buffer (same_buffer), block r-s is received in step s and sent (to rank r-s) in step
//   P-s: the blocks received no later than they are sent (s <= P/2) are staged in scratch in
//   step 0 and sent from there; the others are sent before they are overwritten, and block r
//   stays where it is. At P=2 that stages the one peer block, where a pre-step copy of the whole
//   input then a copy of block r back moved three blocks.
// gather / scatter: the root receives from (sends to) every rank in one step.
// barrier, dissemination: in round k rank r signals r+2^k and waits for r-2^k; after
//   ceil(log2 P) rounds every rank has heard, directly or transitively, from every other.
#include "algorithms/op_builders.h"

namespace ringtree {

void direct_all_to_all(Schedule& s, int P, int r, uint64_t N) {
  const uint64_t ur = static_cast<uint64_t>(r);
  const Op own = make_copy(BufId::Output, ur * N, BufId::Input, ur * N, N);
  if (P == 1) {
    s.add(own);
    s.end_step();
  }
  for (int step = 1; step < P; ++step) {
    const int to = ring_mod(r + step, P), from = ring_mod(r - step, P);
    s.add(make_send(to, BufId::Input, static_cast<uint64_t>(to) * N, N));
    s.add(make_recv(from, BufId::Output, static_cast<uint64_t>(from) * N, N));
    if (step == 1) s.add(own);
    s.end_step();
  }
}

void direct_all_to_all_same_buffer(Schedule& s, int P, int r, uint64_t N) {
  const int staged = P / 2;  // blocks r-1 .. r-staged, in scratch slots 0 .. staged-1
  for (int back = 1; back <= staged; ++back)
    s.add(make_copy(BufId::Scratch, static_cast<uint64_t>(back - 1) * N, BufId::Input,
                    static_cast<uint64_t>(ring_mod(r - back, P)) * N, N));
  s.end_step();
  for (int step = 1; step < P; ++step) {
    const int to = ring_mod(r + step, P), from = ring_mod(r - step, P);
    const int back = P - step;  // block `to` is block r-back, received in step `back`
    if (back <= staged)
      s.add(make_send(to, BufId::Scratch, static_cast<uint64_t>(back - 1) * N, N));
    else
      s.add(make_send(to, BufId::Input, static_cast<uint64_t>(to) * N, N));
    s.add(make_recv(from, BufId::Output, static_cast<uint64_t>(from) * N, N));
    s.end_step();
  }
  s.scratch_elems = static_cast<uint64_t>(staged) * N;
}

void direct_all_to_all_v(Schedule& s, int P, int r, const std::vector<uint64_t>& send_counts,
                         const std::vector<uint64_t>& recv_counts) {
  std::vector<uint64_t> send_displ(P, 0), recv_displ(P, 0);
  for (int q = 1; q < P; ++q) {
    send_displ[q] = send_displ[q - 1] + send_counts[q - 1];
    recv_displ[q] = recv_displ[q - 1] + recv_counts[q - 1];
  }
  const Op own = make_copy(BufId::Output, recv_displ[r], BufId::Input, send_displ[r], send_counts[r]);
  if (P == 1) {
    s.add(own);
    s.end_step();
  }
  for (int step = 1; step < P; ++step) {
    const int to = ring_mod(r + step, P), from = ring_mod(r - step, P);
    s.add(make_send(to, BufId::Input, send_displ[to], send_counts[to]));
    s.add(make_recv(from, BufId::Output, recv_displ[from], recv_counts[from]));
    if (step == 1) s.add(own);
    s.end_step();
  }
}

void direct_gather(Schedule& s, int P, int r, int root, uint64_t N) {
  if (r != root) {
    s.add(make_send(root, BufId::Input, 0, N));
    s.end_step();
    return;
  }
  for (int q = 0; q < P; ++q)
    if (q != root) s.add(make_recv(q, BufId::Output, static_cast<uint64_t>(q) * N, N));
  s.add(make_copy(BufId::Output, static_cast<uint64_t>(root) * N, BufId::Input, 0, N));
  s.end_step();
}

void direct_scatter(Schedule& s, int P, int r, int root, uint64_t N) {
  if (r != root) {
    s.add(make_recv(root, BufId::Output, 0, N));
    s.end_step();
    return;
  }
  for (int q = 0; q < P; ++q)
    if (q != root) s.add(make_send(q, BufId::Input, static_cast<uint64_t>(q) * N, N));
  s.add(make_copy(BufId::Output, 0, BufId::Input, static_cast<uint64_t>(root) * N, N));
  s.end_step();
}

void dissemination_barrier(Schedule& s, int P, int r) {
  for (int distance = 1; distance < P; distance *= 2) {
    s.add(make_send(ring_mod(r + distance, P), BufId::Input, 0, 0));
    s.add(make_recv(ring_mod(r - distance, P), BufId::Output, 0, 0));
    s.end_step();
  }
}

}  // namespace ringtree
