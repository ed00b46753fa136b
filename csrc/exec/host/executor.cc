// The host executor: walks one rank's schedule over its connections.
//
// Each collective first sends a header-only "handshake" message to the next rank in the ring
// and expects one from the previous rank. Every message header carries the call's
// fingerprint, and the handshake guarantees every rank checks at least one neighbour, so
// mismatched calls are found on some rank, which then aborts the job for everyone, even when
// the schedule itself would never have connected the disagreeing ranks.
//
// Waiting (backoff.h): spin, then yield, each for a set time, then block in poll() on
// the doorbell (shared memory), the TCP sockets with pending work and every peer's control
// connection (abort notices and liveness). No lost wake-ups: a sleeper raises its flag,
// fences, and looks at the rings once more before it sleeps; wakers publish, fence, then
// read the flag.
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include "bootstrap/socket.h"
#include "common/check.h"
#include "algorithms/ops.h"
#include "kernels/host/copy.h"
#include "runtime/communicator_impl.h"


namespace ringtree {

namespace {

constexpr uint32_t kCtrlMagic = 0x52544354;  // "RTCT"
constexpr uint32_t kMaxCtrlText = 4096;
constexpr uint8_t kNoOp = 0xff;

struct CtrlWire {
  uint32_t magic;
  uint32_t kind;  // 0: goodbye, else an abort kind
  uint64_t seq;
  uint32_t text_len;
  uint32_t pad;
};


}  // namespace

std::string describe_header(const MsgHeader& h) {
  const auto coll = static_cast<Collective>(h.coll);
  const char* dtype = dtype_name(static_cast<DataType>(h.dtype));
  if (coll == Collective::Send) return str_cat("send/recv (p2p #", h.seq, ", count=", h.count, ", dtype=", dtype, ")");
  std::string d = str_cat(collective_name(coll), " #", h.seq, " (count=", h.count, ", dtype=", dtype);
  if (h.op != kNoOp) d += str_cat(", op=", op_name(static_cast<ReduceOp>(h.op)));
  if (h.root >= 0) d += str_cat(", root=", h.root);
  return d + str_cat(", algo=", algo_name(static_cast<Algo>(h.algo)), ")");
}

MsgHeader CommunicatorImpl::fingerprint(const Prepared& p) const {
  MsgHeader h{};
  h.magic = MsgHeader::kMagic;
  // Point-to-point messages all carry "send": a sendrecv matches a plain recv or send.
  const bool p2p = p.args.coll == Collective::Recv || p.args.coll == Collective::SendRecv;
  const Collective c = p2p ? Collective::Send : p.args.coll;
  h.coll = static_cast<uint8_t>(c);
  h.dtype = static_cast<uint8_t>(p.args.dtype);
  h.op = is_reduction(c) ? static_cast<uint8_t>(p.args.op) : kNoOp;
  h.algo = static_cast<uint8_t>(p.algo);
  h.root = is_rooted(c) ? p.args.root : -1;
  h.sender = rank_;
  h.seq = p.seq;
  h.count = p.count;
  if (c == Collective::Barrier) h.dtype = 0;  // a barrier has no data type
  return h;
}

std::string CommunicatorImpl::describe_current() const {
  if (!current_) return "no collective";
  std::string d = describe_header(fingerprint(*current_));
  if (current_->args.coll == Collective::Send) d = "send to rank " + std::to_string(current_->args.peer) + ": " + d;
  if (current_->args.coll == Collective::Recv) d = "recv from rank " + std::to_string(current_->args.peer) + ": " + d;
  if (current_->args.coll == Collective::SendRecv)
    d = str_cat("sendrecv to rank ", current_->args.peer, " and from rank ", current_->args.recv_peer, ": ", d);
  return d;
}

void CommunicatorImpl::execute(Prepared& p) {
  current_ = &p;
  abort_from_peer_ = false;
  try {
    if (aborted_) RT_THROW(Aborted, "the communicator was aborted by an earlier error: ", abort_reason_);
    raise_peer_abort_if_any();
    // Its input is still being produced (device data on their way to the host): the call
    // already holds its place in the order, and its traffic waits for the data.
    if (p.args.ready) {
      bool opened = false;
      try {
        opened = p.args.ready->wait_open(p.timeout_s);
      } catch (const Error& e) {
        RT_THROW(Error, describe_current(), " failed on rank ", rank_, ": its input could not be staged: ", e.what());
      }
      RT_CHECK(opened, Timeout, describe_current(), " timed out on rank ", rank_, " after ", p.timeout_s,
               " s waiting for its own input: the stream it was issued on did not reach it");
    }
    execute_traffic(p);
  } catch (const Aborted&) {
    current_ = nullptr;
    throw;
  } catch (const Error& e) {
    AbortKind kind = dynamic_cast<const Timeout*>(&e)              ? kAbortTimeout
                     : dynamic_cast<const PeerFailure*>(&e)        ? kAbortPeerFailure
                     : dynamic_cast<const CollectiveMismatch*>(&e) ? kAbortMismatch
                                                                   : kAbortError;
    if (!abort_from_peer_) broadcast_abort(kind, e.what());
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      abort_reason_ = e.what();
      aborted_ = true;
    }
    current_ = nullptr;
    throw;
  }
  current_ = nullptr;
}

const Schedule& CommunicatorImpl::schedule_for(const Prepared& p) {
  const Collective c = p.args.coll;
  if (c == Collective::SendRecv) {  // one step: both directions progress together
    sendrecv_schedule_ = Schedule{};
    sendrecv_schedule_.add(make_send(p.args.peer, BufId::Input, 0, p.args.input.count));
    sendrecv_schedule_.add(make_recv(p.args.recv_peer, BufId::Output, 0, p.args.output.count));
    sendrecv_schedule_.end_step();
    return sendrecv_schedule_;
  }
  if (c == Collective::AllToAllV) {
    all_to_all_v_schedule_ = Schedule{};
    direct_all_to_all_v(all_to_all_v_schedule_, size_, rank_, p.args.send_counts, p.args.recv_counts);
    return all_to_all_v_schedule_;
  }
  ScheduleKey key{c, p.algo, size_, rank_, p.count, is_rooted(c) ? p.args.root : 0, 0,
                  (c == Collective::Send || c == Collective::Recv) ? p.args.peer : -1};
  key.segment = pipeline_segment(c, p.algo, dtype_size(p.args.dtype));
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  if (schedules_.size() >= 512) schedules_.clear();  // bound the cache; rebuilding is cheap
  return schedules_.emplace(key, build_schedule(key)).first->second;
}

void CommunicatorImpl::execute_traffic(Prepared& p) {
  const CollectiveArgs& a = p.args;
  const size_t esz = dtype_size(a.dtype);
  auto* in = static_cast<uint8_t*>(a.input.ptr);
  auto* out = static_cast<uint8_t*>(a.output.ptr);
  if (a.coll == Collective::Broadcast) out = in;
  const bool reduces = is_reduction(a.coll);
  // premul_sum scales this rank's contribution once, before it enters the reduction.
  if (reduces && a.op == ReduceOp::PremulSum && a.input.present && a.input.count > 0) {
    uint8_t* scaled = premul_.ensure(a.input.count * esz);
    scale_elements(scaled, in, a.input.count, a.dtype, a.premul_factor);
    in = scaled;
  }
  try {
    const bool p2p = a.coll == Collective::Send || a.coll == Collective::Recv || a.coll == Collective::SendRecv;
    if (!p2p) settle_board(p.timeout_s);  // an earlier one-shot broadcast's stragglers, checked
    if (p.algo == Algo::OneShot) {
      run_board(p, in, out);  // publishes a copy of the input, so in-place needs no staging
    } else {
      run_scheduled(p, in, out);
    }
  } catch (const PeerFailure& e) {
    // A peer that aborted explains itself on its control connection, possibly just after its
    // data connection closed: its reason beats our observation of its absence.
    raise_pending_peer_abort();
    // Transports and liveness checks know the peer; this adds which call and which rank.
    throw PeerFailure(str_cat(describe_current(), " on rank ", rank_, ": ", e.what()));
  }
  if (reduces && a.op == ReduceOp::Avg && (a.coll != Collective::Reduce || a.root == rank_))
    divide_elements(out, a.output.count, a.dtype, size_);
}

void CommunicatorImpl::run_scheduled(Prepared& p, uint8_t* in, uint8_t* out) {
  const CollectiveArgs& a = p.args;
  const size_t esz = dtype_size(a.dtype);
  // In-place all_to_all: pairwise exchange overwrites blocks not yet sent, so send from a copy.
  if ((a.coll == Collective::AllToAll || a.coll == Collective::AllToAllV) && a.input.count > 0 &&
      ranges_overlap(in, a.input.count * esz, out, a.output.count * esz)) {
    uint8_t* staged = premul_.ensure(a.input.count * esz);
    std::memcpy(staged, in, a.input.count * esz);
    in = staged;
  }
  const Schedule& s = schedule_for(p);
  uint8_t* scratch = s.scratch_elems ? scratch_.ensure(s.scratch_elems * esz) : nullptr;
  uint8_t* const bases[3] = {in, out, scratch};
  // Large outputs are written around the cache (kernels/copy.h); fenced before they are returned.
  const Buffer& result = a.coll == Collective::Broadcast ? a.input : a.output;
  stream_out_ = stream_bytes_ > 0 && result.count * esz >= stream_bytes_;
  run_schedule(s, bases, p, Deadline::after_seconds(p.timeout_s));
  if (stream_out_) streaming_copy_fence();
}

void CommunicatorImpl::init_cursor(OpCursor& c, const Op& op, uint8_t* const bases[3], const Prepared& p, const MsgHeader& fp) {
  const size_t esz = dtype_size(p.args.dtype);
  c.op = &op;
  c.peer = op.peer;
  c.conn = conns_[op.peer].get();
  RT_CHECK(c.conn, PeerFailure, "no connection to rank ", op.peer);
  c.is_send = op.kind == OpKind::Send;
  c.done = false;
  c.payload_bytes = op.count * esz;
  if (c.is_send) {
    c.send = SendCursor{};
    c.send.header = fp;
    c.send.header.payload_bytes = c.payload_bytes;
    c.send.payload = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
  } else {
    c.recv = RecvCursor{};
    c.expect = fp;
    if (p.args.coll == Collective::SendRecv) {  // the receive has its own sequence number and size
      c.expect.seq = p.recv_seq;
      c.expect.count = p.args.output.count;
    }
    c.recv.dst = bases[static_cast<int>(op.dst.buf)] + op.dst.offset * esz;
    c.recv.payload_bytes = c.payload_bytes;
    c.recv.elem_size = static_cast<uint32_t>(esz);
    c.recv.stream = stream_out_;
    if (op.kind == OpKind::RecvReduce) {
      c.recv.local = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
      c.recv.reduce = reduce_fn(p.args.dtype, p.args.op);
    }
  }
}

void CommunicatorImpl::run_schedule(const Schedule& s, uint8_t* const bases[3], const Prepared& p, const Deadline& deadline) {
  current_fp_ = fingerprint(p);
  const size_t esz = dtype_size(p.args.dtype);
  const bool handshake = size_ > 1 && p.args.coll != Collective::Send && p.args.coll != Collective::Recv &&
                         p.args.coll != Collective::SendRecv;
  hs_send_pending_ = hs_recv_pending_ = false;
  if (handshake) {
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    hs_send_ = OpCursor{nullptr, conns_[next].get(), next, true, false, 0, SendCursor{}, RecvCursor{}, current_fp_};
    hs_send_.send.header = current_fp_;
    hs_recv_ = OpCursor{nullptr, conns_[prev].get(), prev, false, false, 0, SendCursor{}, RecvCursor{}, current_fp_};
    RT_CHECK(hs_send_.conn && hs_recv_.conn, PeerFailure, "no connection to a ring neighbour (communicator closed?)");
    hs_send_pending_ = hs_recv_pending_ = true;
  }
  for (size_t k = 0; k < s.num_steps(); ++k) {
    cursors_.clear();
    for (uint32_t i = s.step_begin(k); i < s.step_end[k]; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::Copy) {
        uint8_t* dst = bases[static_cast<int>(op.dst.buf)] + op.dst.offset * esz;
        const uint8_t* src = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
        if (dst != src && op.count) std::memcpy(dst, src, op.count * esz);
        continue;
      }
      cursors_.emplace_back();
      init_cursor(cursors_.back(), op, bases, p, current_fp_);
    }
    pump(deadline, false);
  }
  cursors_.clear();
  pump(deadline, true);
}

bool CommunicatorImpl::progress_recv_checked(OpCursor& c) {
  bool moved = c.conn->progress_recv(c.recv);
  if (c.recv.header_ready && !c.recv.header_checked) {
    check_header(c.recv.header, c.expect, c.payload_bytes, c.peer);
    c.recv.header_checked = true;
    moved |= c.conn->progress_recv(c.recv);
  }
  c.done = c.conn->recv_complete(c.recv);
  return moved;
}

bool CommunicatorImpl::progress_all() {
  bool moved = false;
  if (hs_send_pending_) {
    moved |= hs_send_.conn->progress_send(hs_send_.send);
    hs_send_pending_ = !hs_send_.conn->send_complete(hs_send_.send, 0);
  }
  if (hs_recv_pending_) {
    moved |= progress_recv_checked(hs_recv_);
    hs_recv_pending_ = !hs_recv_.done;
  }
  for (OpCursor& c : cursors_) {
    if (c.done) continue;
    if (c.is_send) {
      if (hs_send_pending_ && c.peer == hs_send_.peer) continue;  // the handshake goes first
      moved |= c.conn->progress_send(c.send);
      c.done = c.conn->send_complete(c.send, c.payload_bytes);
    } else {
      if (hs_recv_pending_ && c.peer == hs_recv_.peer) continue;
      moved |= progress_recv_checked(c);
    }
  }
  return moved;
}

bool CommunicatorImpl::step_done(bool final) const {
  for (const OpCursor& c : cursors_)
    if (!c.done) return false;
  return !final || (!hs_send_pending_ && !hs_recv_pending_);
}

void CommunicatorImpl::pump(const Deadline& deadline, bool final) {
  Backoff backoff(wait_);
  for (;;) {
    const bool moved = progress_all();
    if (step_done(final)) return;
    if (moved) { backoff.progressed(); continue; }
    if (backoff.should_block()) block(deadline, final);
  }
}

void CommunicatorImpl::block(const Deadline& deadline, bool final) {
  // A peer that said goodbye can no longer send or receive what this step still needs.
  auto check_departed = [&](const OpCursor& c) {
    if (!c.done && peer_state_[c.peer] != PeerState::Alive)
      RT_THROW(PeerFailure, "rank ", c.peer, " closed its communicator while this rank still ",
               c.is_send ? "sends to" : "expects data from", " it");
  };
  raise_peer_abort_if_any();  // no progress was possible: a peer's abort now explains why
  if (current_) check_board_mismatch(*current_);  // a peer may be on the board for this call
  for (const OpCursor& c : cursors_) check_departed(c);
  if (hs_send_pending_) check_departed(hs_send_);
  if (hs_recv_pending_) check_departed(hs_recv_);
  if (deadline.expired()) throw_timeout();

  // The data descriptors to wait on (TCP); the doorbell and control connections are added by doze().
  pollfds_.clear();
  pollfd_peer_.clear();
  auto watch_data = [&](const OpCursor& c) {
    const int fd = c.conn->poll_fd();
    if (c.done || fd < 0) return;
    pollfds_.push_back({fd, static_cast<short>(c.is_send ? POLLOUT : POLLIN), 0});
    pollfd_peer_.push_back(-2);
  };
  for (const OpCursor& c : cursors_) watch_data(c);
  if (hs_send_pending_) watch_data(hs_send_);
  if (hs_recv_pending_) watch_data(hs_recv_);
  doze(deadline, [&] { return progress_all() || step_done(final); });
}

void CommunicatorImpl::doze(const Deadline& deadline, const std::function<bool()>& ready) {
  ShmSegmentHeader* self = have_shm_ ? own_segment_->header() : nullptr;
  if (self) {
    self->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (ready()) {
    if (self) self->sleeping.store(0, std::memory_order_relaxed);
    return;
  }
  if (self) { pollfds_.push_back({bell_.fd(), POLLIN, 0}); pollfd_peer_.push_back(-1); }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || mesh_.ctrl_fd[q] < 0) continue;
    pollfds_.push_back({mesh_.ctrl_fd[q], POLLIN, 0});
    pollfd_peer_.push_back(q);
  }
  // The cap is a safety net only; every wake-up we expect arrives through a descriptor.
  const int n = poll(pollfds_.data(), pollfds_.size(), deadline.remaining_ms(200));
  if (self) self->sleeping.store(0, std::memory_order_relaxed);
  if (n <= 0) return;
  for (size_t i = 0; i < pollfds_.size(); ++i) {
    if (!pollfds_[i].revents) continue;
    if (pollfd_peer_[i] == -1) bell_.drain();
    else if (pollfd_peer_[i] >= 0) handle_ctrl(pollfd_peer_[i]);
  }
}

void CommunicatorImpl::raise_peer_abort_if_any() {
  if (!peer_abort_) return;
  std::exception_ptr notice = peer_abort_;
  peer_abort_ = nullptr;
  abort_from_peer_ = true;  // the peer already told everyone
  std::rethrow_exception(notice);
}

void CommunicatorImpl::raise_pending_peer_abort() {
  const Deadline grace = Deadline::after_seconds(0.2);  // the notice is sent before the close
  for (;;) {
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || mesh_.ctrl_fd[q] < 0) continue;
      CtrlWire w{};
      const ssize_t n = recv(mesh_.ctrl_fd[q], &w, sizeof(w), MSG_DONTWAIT | MSG_PEEK);
      if (n == static_cast<ssize_t>(sizeof(w)) && w.magic == kCtrlMagic && w.kind != 0) {
        handle_ctrl(q);
        raise_peer_abort_if_any();
      }
    }
    if (grace.expired()) return;
    poll(nullptr, 0, 10);
  }
}

void CommunicatorImpl::handle_ctrl(int q) {
  int& fd = mesh_.ctrl_fd[q];
  CtrlWire w{};
  ssize_t n = recv(fd, &w, sizeof(w), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  const bool eof = n <= 0;
  if (!eof && static_cast<size_t>(n) < sizeof(w)) {
    try {
      read_full(fd, reinterpret_cast<uint8_t*>(&w) + n, sizeof(w) - static_cast<size_t>(n), Deadline::after_seconds(1.0));
    } catch (const Error&) {
      n = 0;
    }
  }
  if (eof || n == 0 || w.magic != kCtrlMagic) {
    close_fd(fd);
    if (peer_state_[q] == PeerState::Departed) return;
    peer_state_[q] = PeerState::Gone;
    abort_from_peer_ = false;
    RT_THROW(PeerFailure, "rank ", q, " (pid ", mesh_.peers[q].pid, " on ", mesh_.peers[q].host,
             ") died or lost its connection");
  }
  if (w.kind == 0) {  // goodbye: it closed its communicator normally
    peer_state_[q] = PeerState::Departed;
    close_fd(fd);
    return;
  }
  std::string text(std::min(w.text_len, kMaxCtrlText), '\0');
  try {
    read_full(fd, text.data(), text.size(), Deadline::after_seconds(1.0));
  } catch (const Error&) {
  }
  const std::string what = str_cat("rank ", q, " aborted the communicator: ", text);
  if (peer_abort_) return;  // the first notice explains; later ones repeat it
  switch (w.kind) {
    case kAbortTimeout: peer_abort_ = std::make_exception_ptr(Timeout(what)); break;
    case kAbortPeerFailure: peer_abort_ = std::make_exception_ptr(PeerFailure(what)); break;
    case kAbortMismatch: peer_abort_ = std::make_exception_ptr(CollectiveMismatch(what)); break;
    default: peer_abort_ = std::make_exception_ptr(Error(what)); break;
  }
}

void CommunicatorImpl::check_header(const MsgHeader& got, const MsgHeader& want, uint64_t want_payload, int peer) const {
  RT_CHECK(got.magic == MsgHeader::kMagic, Error, "corrupt message header from rank ", peer, " during ", describe_current());
  const bool same = got.coll == want.coll && got.dtype == want.dtype && got.op == want.op && got.algo == want.algo &&
                    got.root == want.root && got.seq == want.seq && got.count == want.count;
  if (!same)
    RT_THROW(CollectiveMismatch, "collective mismatch: rank ", rank_, " called ", describe_header(want), " but rank ",
             peer, " called ", describe_header(got));
  if (got.payload_bytes != want_payload) {
    // all_to_all_v sizes are per rank, so only the message itself can reveal a disagreement.
    if (static_cast<Collective>(want.coll) == Collective::AllToAllV)
      RT_THROW(CollectiveMismatch, "collective mismatch in ", describe_header(want), ": rank ", peer, " sends ",
               got.payload_bytes, " bytes to rank ", rank_, ", which expects ", want_payload, " (send_counts[", rank_,
               "] on rank ", peer, " differs from recv_counts[", peer, "] on rank ", rank_, ")");
    RT_THROW(Error, "internal error: rank ", peer, " sent ", got.payload_bytes, " bytes where ", want_payload,
             " were expected in ", describe_current());
  }
}

void CommunicatorImpl::throw_timeout() const {
  std::string waiting;
  auto note = [&](const OpCursor& c, const char* what) {
    if (c.done) return;
    waiting += str_cat(waiting.empty() ? "" : "; ", "rank ", c.peer, " (", what, ", ",
                       c.is_send ? c.send.done : c.recv.done, " bytes moved)");
  };
  if (hs_send_pending_) note(hs_send_, "handshake send");
  if (hs_recv_pending_) note(hs_recv_, "handshake receive");
  for (const OpCursor& c : cursors_) note(c, c.is_send ? "send" : "receive");
  RT_THROW(Timeout, describe_current(), " timed out on rank ", rank_, " after ", current_ ? current_->timeout_s : 0.0,
           " s waiting for ", waiting);
}

void CommunicatorImpl::broadcast_abort(AbortKind kind, const std::string& text) {
  std::string msg(sizeof(CtrlWire), '\0');
  CtrlWire w{kCtrlMagic, static_cast<uint32_t>(kind), current_ ? current_->seq : 0,
             static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxCtrlText)), 0};
  std::memcpy(msg.data(), &w, sizeof(w));
  msg.append(text, 0, w.text_len);
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && mesh_.ctrl_fd[q] >= 0)
      (void)send(mesh_.ctrl_fd[q], msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace ringtree
