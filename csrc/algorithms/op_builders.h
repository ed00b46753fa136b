// Builders of schedule ops (send, receive, receive-and-reduce, copy, the one-shot ops), shared
// by the algorithm files and the executors that build per-call schedules.
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

// One-shot ops (schedule.h). A read of count 0 waits for `peer`'s publication and moves nothing.
inline Op make_publish(BufId src, uint64_t n) { return {OpKind::Publish, -1, n, {BufId::Published, 0}, {src, 0}}; }
inline Op make_copy_published(int peer, BufId dst, uint64_t dst_off, uint64_t pub_off, uint64_t n) {
  return {OpKind::CopyPublished, peer, n, {dst, dst_off}, {BufId::Published, pub_off}};
}
inline Op make_reduce_published(int lhs_peer, int peer, BufId dst, uint64_t dst_off, uint64_t pub_off, uint64_t n) {
  return {OpKind::ReducePublished, peer, n, {dst, dst_off}, {BufId::Published, pub_off}, lhs_peer};
}
inline Op make_await_published(int peer) { return make_copy_published(peer, BufId::Output, 0, 0, 0); }

}  // namespace ringtree
