// Small constructors shared by the algorithm files.
#pragma once
#include "algorithms/schedule.h"

namespace ringtree {

inline int ring_mod(int a, int p) { return ((a % p) + p) % p; }
inline Op make_send(int peer, BufId buf, uint64_t off, uint64_t n) { return {OpKind::Send, peer, n, {}, {buf, off}}; }
inline Op make_recv(int peer, BufId buf, uint64_t off, uint64_t n) { return {OpKind::Recv, peer, n, {buf, off}, {}}; }
inline Op make_recv_reduce(int peer, BufId dst, uint64_t dst_off, BufId src, uint64_t src_off, uint64_t n) {
  return {OpKind::RecvReduce, peer, n, {dst, dst_off}, {src, src_off}};
}
inline Op make_copy(BufId dst, uint64_t dst_off, BufId src, uint64_t src_off, uint64_t n) {
  return {OpKind::Copy, -1, n, {dst, dst_off}, {src, src_off}};
}

}  // namespace ringtree
