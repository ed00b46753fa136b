// The host executor's progress engine: walks one rank's schedule over its connections.
//
// Each collective first sends a header-only "handshake" message to the next rank in the ring
// and expects one from the previous rank. Every message header carries the call's
// fingerprint, and the handshake guarantees every rank checks at least one neighbour, so
// mismatched calls are found on some rank, which then aborts the job for everyone, even when
// the schedule itself would never have connected the disagreeing ranks. A schedule whose every
// rank's first step sends to the next rank and receives from the previous one needs none: its
// first messages carry the fingerprint (a rank in another call still sends the next rank a
// header first, handshake or data, and the next rank checks it).
//
// Waiting (backoff.h): spin, then yield, each for a set time, then block in poll() on
// the doorbell (shared memory), the TCP sockets with pending work and every peer's control
// connection (abort notices and liveness). No lost wake-ups: a sleeper raises its flag,
// fences, and looks at the rings once more before it sleeps; wakers publish, fence, then
// read the flag.
#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <functional>
#include "algorithms/op_builders.h"
#include "common/check.h"
#include "kernels/host/copy.h"
#include "exec/host/executor.h"

namespace ringtree {

uint8_t* AlignedBuffer::ensure(size_t bytes) {
  if (bytes <= bytes_ && data_) return data_;
  std::free(data_);
  const size_t rounded = std::max<size_t>(64, (bytes + 63) & ~size_t{63});
  data_ = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
  if (!data_) throw std::bad_alloc();
  bytes_ = rounded;
  return data_;
}

MsgHeader header_of(const Fingerprint& fp, int sender) {
  MsgHeader h{};
  h.magic = MsgHeader::kMagic;
  h.coll = static_cast<uint8_t>(fp.coll);
  h.dtype = static_cast<uint8_t>(fp.dtype);
  h.op = fp.op;
  h.algo = static_cast<uint8_t>(fp.algo);
  h.root = fp.root;
  h.sender = sender;
  h.seq = fp.seq;
  h.count = fp.count;
  h.deterministic = fp.deterministic;
  return h;
}

Fingerprint fingerprint_of(const MsgHeader& h) {
  Fingerprint fp;
  fp.coll = static_cast<Collective>(h.coll);
  fp.dtype = static_cast<DataType>(h.dtype);
  fp.op = h.op;
  fp.algo = static_cast<Algo>(h.algo);
  fp.root = h.root;
  fp.seq = h.seq;
  fp.count = h.count;
  fp.deterministic = h.deterministic != 0;
  return fp;
}

// run_plan's device: host memory, this executor's temp buffer and its walk.
struct HostExecutor::Device {
  HostExecutor& ex;
  uint8_t* temp(size_t bytes) { return ex.temp_.ensure(bytes); }
  void scale(void* dst, const void* src, uint64_t n, DataType t, double factor) {
    scale_elements(dst, src, n, t, factor);
  }
  void copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  void walk(const CallPlan&, uint8_t* in, uint8_t* out) { ex.walk(in, out); }
  void divide(void* dst, uint64_t n, DataType t, int64_t divisor) { divide_elements(dst, n, t, divisor); }
};
void HostExecutor::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborting_) return;
    abort_why_ = why;
    aborting_.store(true, std::memory_order_release);
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void HostExecutor::raise_if_aborted() {
  if (!aborting_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(abort_mu_);
  RT_THROW(Aborted, describe_current(), " on rank ", rank_, " was aborted: ", abort_why_);
}

std::string HostExecutor::describe_current() const {
  if (!current_) return "no collective";
  const CollectiveArgs& a = *current_->args;
  std::string d = describe(current_->plan.fingerprint(current_->seq));
  if (a.coll == Collective::Send) d = "send to rank " + std::to_string(a.peer) + ": " + d;
  if (a.coll == Collective::Recv) d = "recv from rank " + std::to_string(a.peer) + ": " + d;
  if (a.coll == Collective::SendRecv) d = str_cat("sendrecv to rank ", a.peer, " and from rank ", a.recv_peer, ": ", d);
  return d;
}

void HostExecutor::note_waiting(int peer, bool send) {
  waiting_[peer].fetch_or(send ? 1 : 2, std::memory_order_relaxed);
}

void HostExecutor::clear_waiting() {
  for (int q = 0; q < size_; ++q) waiting_[q].store(0, std::memory_order_relaxed);
}

void HostExecutor::waiting_on(std::vector<int>& sends, std::vector<int>& recvs) const {
  for (int q = 0; q < size_; ++q) {
    const uint8_t w = waiting_[q].load(std::memory_order_relaxed);
    if (w & 1) sends.push_back(q);
    if (w & 2) recvs.push_back(q);
  }
}

void HostExecutor::run(const HostCall& call) {
  struct Current {  // current_ names the call in every error until it returns
    HostExecutor& ex;
    ~Current() {
      ex.current_ = nullptr;
      ex.clear_waiting();
    }
  } scope{*this};
  current_ = &call;
  raise_if_aborted();
  const CallPlan& plan = call.plan;
  current_fp_ = header_of(plan.fingerprint(call.seq), rank_);
  Device dev{*this};
  // Receivers of reductions combine what they receive with their own data rather than copy it,
  // and point-to-point sends keep their buffered completion: both stay on the two-copy path. So
  // does gather: its root copies every byte either way, and a single copy only takes the
  // senders' copies, made in parallel with the root's, off the ring (it measured no faster).
  const CollectiveTraits& traits = collective_traits(plan.key.coll);
  const bool single_copy_reads =
      single_copy_on_ && !traits.point_to_point && !traits.reduction && plan.key.coll != Collective::Gather &&
      !(plan.key.coll == Collective::Broadcast && plan.key.count * plan.elem_size() >= broadcast_ring_from_bytes_);
  // all_to_all_v too: the torch backend's all_to_all_single and MoE dispatch take it.
  const bool all_to_all = plan.key.coll == Collective::AllToAll || plan.key.coll == Collective::AllToAllV;
  single_copy_from_ = !single_copy_reads ? 0 : all_to_all ? single_copy_all_to_all_min_bytes_ : single_copy_min_bytes_;
  // Where ranks share cores a broadcast's receivers read the root's buffer, and an all_to_all's
  // each block, single-copy even from small pages: the ring's extra copy there costs a core the
  // others wait for. Not an all_to_all whose output streams (kernels/copy.h): there the ring,
  // whose receiver writes the output around the cache as the kernel's copy does not, measured
  // faster. At P=4 on 2 cores, THP never, separate launches, ring -> single copy: 1 MiB alike,
  // 2 MiB 1.2-1.4x faster, 4 MiB 1.2-1.4x, 8 MiB 0.9-1.1x; 32 MiB (streamed) 1.2-1.4x slower.
  // Large outputs are written around the cache (kernels/copy.h); fenced before they are returned.
  stream_out_ = stream_bytes_ > 0 && plan.output.count * plan.elem_size() >= stream_bytes_;
  stream_copies_ = stream_out_ && !traits.reduction;
  single_copy_huge_only_ =
      single_copy_from_huge_pages_only_ &&
      !(host_cores_shared_ && (plan.key.coll == Collective::Broadcast || (all_to_all && !stream_out_)));
  try {
    try {
      // Earlier one-shot calls' stragglers, checked (one-shot calls settle what the rules need).
      if (!collective_traits(plan.key.coll).point_to_point && plan.key.algo != Algo::OneShot)
        settle_oneshot(plan.timeout_s);
      run_plan(plan, dev);
    } catch (const PeerFailure& e) {
      // A peer that aborted explains itself on its control connection, possibly just after its
      // data connection closed: its reason beats our observation of its absence.
      ctrl_.raise_pending_notice();
      // Transports and liveness checks know the peer; this adds which call and which rank.
      throw PeerFailure(str_cat(describe_current(), " on rank ", rank_, ": ", e.what()));
    }
  } catch (const Error& e) {
    withdraw_single_copy_sends();
    // A peer's notice names the peer's call (perhaps a later one, or comm.abort()): name ours too.
    if (!ctrl_.notice_raised()) throw;
    throw_error(e.kind(), str_cat(describe_current(), " on rank ", rank_, ": ", e.what()));
  } catch (...) {
    withdraw_single_copy_sends();
    throw;
  }
}

// The call returns with an error now, and its buffers with it: peers still to read them must not.
void HostExecutor::withdraw_single_copy_sends() {
  for (const auto& [peer, conn] : single_copy_conns_) conn->withdraw_single_copy_sends();
}

void HostExecutor::walk(uint8_t* in, uint8_t* out) {
  if (current_->plan.key.algo == Algo::OneShot)
    run_oneshot(in, out);
  else
    run_scheduled(in, out);
}

const Schedule& HostExecutor::schedule_for(const HostCall& c) {
  const CollectiveArgs& a = *c.args;
  if (a.coll == Collective::SendRecv) {  // one step: both directions progress together
    per_call_schedule_ = Schedule{};
    per_call_schedule_.add(make_send(a.peer, BufId::Input, 0, c.plan.input.count));
    per_call_schedule_.add(make_recv(a.recv_peer, BufId::Output, 0, c.plan.output.count));
    per_call_schedule_.end_step();
    return per_call_schedule_;
  }
  if (a.coll == Collective::AllToAllV) {
    per_call_schedule_ = Schedule{};
    direct_all_to_all_v(per_call_schedule_, size_, rank_, a.send_counts, a.recv_counts);
    return per_call_schedule_;
  }
  const ScheduleKey& key = c.plan.key;
  if (last_schedule_ && last_key_ == key) return *last_schedule_;  // a loop of one call: no hashing
  auto it = schedules_.find(key);
  if (it == schedules_.end()) {
    if (schedules_.size() >= 512) schedules_.clear();  // bound the cache; rebuilding is cheap
    it = schedules_.emplace(key, build_schedule(key)).first;
  }
  last_key_ = key;
  last_schedule_ = &it->second;  // nodes stay put until the cache is cleared, which happens only above
  return *last_schedule_;
}

void HostExecutor::run_scheduled(uint8_t* in, uint8_t* out) {
  const CallPlan& p = current_->plan;
  const size_t esz = p.elem_size();
  const Schedule& s = schedule_for(*current_);
  uint8_t* scratch = s.scratch_elems ? scratch_.ensure(s.scratch_elems * esz) : nullptr;
  uint8_t* const bases[3] = {in, out, scratch};
  // Schedules without scratch write each output element once, before any send of it, so a sent
  // region is never written again in the call: its send may complete once announced, and the
  // acknowledgements are collected at the end (a pipelined broadcast then runs ahead as it does
  // through the ring). Scratch is reused within a call (hierarchical packing): those wait.
  single_copy_defer_ = single_copy_from_ > 0 && s.scratch_elems == 0;
  run_schedule(s, bases, Deadline::from_first_look(p.timeout_s));
  if (stream_out_) streaming_copy_fence();
}

void HostExecutor::init_cursor(OpCursor& c, const Op& op, uint8_t* const bases[3]) {
  const CallPlan& p = current_->plan;
  const size_t esz = p.elem_size();
  c.op = &op;
  c.peer = op.peer;
  c.conn = conns_[op.peer].get();
  RT_CHECK(c.conn, PeerFailure, "no connection to rank ", op.peer);
  c.is_send = op.kind == OpKind::Send;
  c.done = false;
  c.payload_bytes = op.count * esz;
  if (c.is_send) {
    c.send = SendCursor{};
    c.send.header = current_fp_;
    c.send.header.payload_bytes = c.payload_bytes;
    c.send.payload = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
    c.send.single_copy_min_bytes = single_copy_from_;
    c.send.single_copy_from_huge_pages_only = single_copy_huge_only_;
    c.send.defer_ack = single_copy_defer_ && op.src.buf != BufId::Scratch;
  } else {
    c.recv = RecvCursor{};
    c.expect = current_fp_;
    if (p.key.coll == Collective::SendRecv) {  // the receive has its own sequence number and size
      c.expect.seq = current_->recv_seq;
      c.expect.count = p.output.count;
    }
    c.recv.dst = bases[static_cast<int>(op.dst.buf)] + op.dst.offset * esz;
    c.recv.payload_bytes = c.payload_bytes;
    c.recv.elem_size = static_cast<uint32_t>(esz);
    c.recv.stream = stream_out_;
    if (op.kind == OpKind::RecvReduce) {
      c.recv.local = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
      c.recv.reduce = reduce_fn(p.dtype, p.combine);
    }
  }
}

void HostExecutor::run_schedule(const Schedule& s, uint8_t* const bases[3], const Deadline& deadline) {
  const size_t esz = current_->plan.elem_size();
  const bool handshake =
      size_ > 1 && !collective_traits(current_->plan.key.coll).point_to_point && !s.first_step_meets_neighbours;
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
    bool copies = false;
    for (uint32_t i = s.step_begin(k); i < s.step_end[k]; ++i) {
      if (s.ops[i].kind == OpKind::Copy) {
        copies = true;
        continue;
      }
      cursors_.emplace_back();
      init_cursor(cursors_.back(), s.ops[i], bases);
    }
    // A step's messages start before its local copies: a peer reads what this rank sends while
    // this rank copies its own block, instead of after (the ops of a step touch disjoint memory).
    if (copies && !cursors_.empty()) progress_all();
    for (uint32_t i = s.step_begin(k); i < s.step_end[k] && copies; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::Copy) {
        uint8_t* dst = bases[static_cast<int>(op.dst.buf)] + op.dst.offset * esz;
        const uint8_t* src = bases[static_cast<int>(op.src.buf)] + op.src.offset * esz;
        if (dst == src || op.count == 0) continue;
        // A block copied into an output written around the cache is written so too, as received
        // data is, where no step reduces into the output and reads it back (whatever the block's
        // own size: the output is what does not fit); fenced at once, so a later send of it
        // (another process reading it single-copy) sees it.
        if (stream_copies_ && op.dst.buf == BufId::Output) {
          streaming_copy(dst, src, op.count * esz);
          streaming_copy_fence();
        } else {
          std::memcpy(dst, src, op.count * esz);
        }
      }
    }
    pump(deadline, false);
  }
  cursors_.clear();
  pump(deadline, true);
}

bool HostExecutor::progress_recv_checked(OpCursor& c) {
  bool moved = false;
  try {
    moved = c.conn->progress_recv(c.recv);
  } catch (const PeerFailure& e) {
    // A peer that closed after its last send: its socket delivered what it sent, then ended.
    if (ctrl_.alive(c.peer)) throw;
    RT_THROW(PeerFailure, "rank ", c.peer, " closed its communicator while this rank still expects data from it (",
             e.what(), ")");
  }
  if (c.recv.header_ready && !c.recv.header_checked) {
    check_header(c.recv.header, c.expect, c.payload_bytes, c.peer);
    c.recv.header_checked = true;
    moved |= c.conn->progress_recv(c.recv);
  }
  c.done = c.conn->recv_complete(c.recv);
  return moved;
}

bool HostExecutor::progress_all() {
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

bool HostExecutor::step_done(bool final) const {
  for (const OpCursor& c : cursors_)
    if (!c.done) return false;
  return !final || (!hs_send_pending_ && !hs_recv_pending_ && single_copy_acked());
}

bool HostExecutor::single_copy_acked() const {
  for (const auto& [peer, conn] : single_copy_conns_)
    if (!conn->acknowledged()) return false;
  return true;
}

bool HostExecutor::awaited_peer_on_this_cpu(bool oneshot) {
  if (!have_shm_) return false;
  const int cpu = sched_getcpu();
  own_segment_->header()->cpu.store(cpu, std::memory_order_relaxed);
  auto on_this_cpu = [&](int q) {
    return q != rank_ && peer_segments_[q] && peer_segments_[q]->header()->cpu.load(std::memory_order_relaxed) == cpu;
  };
  bool shared = false;
  if (oneshot) {
    for (int q = 0; q < size_ && !shared; ++q) shared = !oneshot_arrived_[q] && on_this_cpu(q);
  } else {
    for (const OpCursor& c : cursors_) shared = shared || (!c.done && on_this_cpu(c.peer));
  }
  if (shared) shared_cpu_waits_.fetch_add(1, std::memory_order_relaxed);
  return shared;
}

WaitStart HostExecutor::pump_wait_start() {
  bool open = false, all_tcp = true;
  auto look = [&](const OpCursor& c) {
    if (c.done || !c.conn) return;
    open = true;
    all_tcp = all_tcp && c.conn->poll_fd() >= 0;
  };
  for (const OpCursor& c : cursors_) look(c);
  if (hs_send_pending_) look(hs_send_);
  if (hs_recv_pending_) look(hs_recv_);
  // Unacknowledged single-copy sends wait on a shared-memory peer.
  if (open && all_tcp && single_copy_acked()) return WaitStart::Block;
  return awaited_peer_on_this_cpu(false) ? WaitStart::Yield : WaitStart::Spin;
}

void HostExecutor::pump(const Deadline& deadline, bool final) {
  auto how_to_start = [this] { return pump_wait_start(); };
  Backoff backoff(wait_, how_to_start);
  for (;;) {
    const bool moved = progress_all();
    if (step_done(final)) return;
    if (moved) {
      backoff.progressed();
      continue;
    }
    if (backoff.should_block()) block(deadline, final);
  }
}

void HostExecutor::block(const Deadline& deadline, bool final) {
  // A peer that said goodbye can no longer send or receive what this step still needs, beyond
  // what it sent before it left. Its goodbye can overtake that data: a TCP socket still delivers
  // it and then reports the close itself (progress_recv_checked names the departure), and what
  // it wrote into shared memory before leaving is there to take, so one more pass comes first.
  auto departed = [&](const OpCursor& c) { return !c.done && !ctrl_.alive(c.peer); };
  auto check_departed = [&](const OpCursor& c) {
    if (!departed(c) || (!c.is_send && c.conn->poll_fd() >= 0)) return;
    RT_THROW(PeerFailure, "rank ", c.peer, " closed its communicator while this rank still ",
             c.is_send ? "sends to" : "expects data from", " it");
  };
  raise_if_aborted();
  ctrl_.raise_notice_if_any();  // no progress was possible: a peer's abort now explains why
  check_oneshot_mismatch();     // a peer may be in a one-shot call for this one
  bool any_departed = (hs_send_pending_ && departed(hs_send_)) || (hs_recv_pending_ && departed(hs_recv_));
  for (const OpCursor& c : cursors_) any_departed |= departed(c);
  if (any_departed && progress_all()) return;  // what it sent before it left
  for (const OpCursor& c : cursors_) check_departed(c);
  if (hs_send_pending_) check_departed(hs_send_);
  if (hs_recv_pending_) check_departed(hs_recv_);
  for (const auto& [peer, conn] : single_copy_conns_)
    if (!conn->acknowledged() && !ctrl_.alive(peer))
      RT_THROW(PeerFailure, "rank ", peer, " closed its communicator before it read this rank's single-copy message");
  if (deadline.expired()) throw_timeout();

  // The data descriptors to wait on (TCP); the doorbell and control connections are added by doze().
  pollfds_.clear();
  pollfd_peer_.clear();
  clear_waiting();
  auto watch_data = [&](const OpCursor& c) {
    if (!c.done) note_waiting(c.peer, c.is_send);
    const int fd = c.conn->poll_fd();
    if (c.done || fd < 0) return;
    pollfds_.push_back({fd, static_cast<short>(c.is_send ? POLLOUT : POLLIN), 0});
    pollfd_peer_.push_back(-2);
  };
  for (const OpCursor& c : cursors_) watch_data(c);
  for (const auto& [peer, conn] : single_copy_conns_)
    if (!conn->acknowledged()) note_waiting(peer, true);
  if (hs_send_pending_) watch_data(hs_send_);
  if (hs_recv_pending_) watch_data(hs_recv_);
  doze(deadline, [&] { return progress_all() || step_done(final); });
}

void HostExecutor::doze(const Deadline& deadline, const std::function<bool()>& ready) {
  ShmSegmentHeader* self = have_shm_ ? own_segment_->header() : nullptr;
  if (self) {
    self->sleeping.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  if (ready()) {
    if (self) self->sleeping.store(0, std::memory_order_relaxed);
    return;
  }
  if (self) {
    pollfds_.push_back({bell_.fd(), POLLIN, 0});
    pollfd_peer_.push_back(-1);
  }
  pollfds_.push_back({wake_fd_, POLLIN, 0});
  pollfd_peer_.push_back(-3);
  ctrl_.add_pollfds(pollfds_, pollfd_peer_);
  // The cap is a safety net only; every wake-up we expect arrives through a descriptor.
  const int n = poll(pollfds_.data(), pollfds_.size(), deadline.remaining_ms(200));
  if (self) self->sleeping.store(0, std::memory_order_relaxed);
  if (n <= 0) return;
  for (size_t i = 0; i < pollfds_.size(); ++i) {
    if (!pollfds_[i].revents) continue;
    if (pollfd_peer_[i] == -1)
      bell_.drain();
    else if (pollfd_peer_[i] == -3)
      raise_if_aborted();
    else if (pollfd_peer_[i] >= 0)
      ctrl_.handle(pollfd_peer_[i]);
  }
}

void HostExecutor::check_header(const MsgHeader& got, const MsgHeader& want, uint64_t want_payload, int peer) const {
  RT_CHECK(got.magic == MsgHeader::kMagic, Error, "corrupt message header from rank ", peer, " during ",
           describe_current());
  const bool same = got.coll == want.coll && got.dtype == want.dtype && got.op == want.op && got.algo == want.algo &&
                    got.root == want.root && got.seq == want.seq && got.count == want.count &&
                    got.deterministic == want.deterministic;
  if (!same)
    RT_THROW(CollectiveMismatch, "collective mismatch: rank ", rank_, " called ", describe(fingerprint_of(want)),
             " but rank ", peer, " called ", describe(fingerprint_of(got)));
  if (got.payload_bytes != want_payload) {
    // all_to_all_v sizes are per rank, so only the message itself can reveal a disagreement.
    if (static_cast<Collective>(want.coll) == Collective::AllToAllV)
      RT_THROW(CollectiveMismatch, "collective mismatch in ", describe(fingerprint_of(want)), ": rank ", peer,
               " sends ", got.payload_bytes, " bytes to rank ", rank_, ", which expects ", want_payload,
               " (send_counts[", rank_, "] on rank ", peer, " differs from recv_counts[", peer, "] on rank ", rank_,
               ")");
    RT_THROW(Error, "internal error: rank ", peer, " sent ", got.payload_bytes, " bytes where ", want_payload,
             " were expected in ", describe_current());
  }
}

void HostExecutor::throw_timeout() const {
  std::string waiting;
  auto note = [&](const OpCursor& c, const char* what) {
    if (c.done) return;
    waiting += str_cat(waiting.empty() ? "" : "; ", "rank ", c.peer, " (", what, ", ",
                       c.is_send ? c.send.done : c.recv.done, " bytes moved)");
  };
  if (hs_send_pending_) note(hs_send_, "handshake send");
  if (hs_recv_pending_) note(hs_recv_, "handshake receive");
  for (const OpCursor& c : cursors_) note(c, c.is_send ? "send" : "receive");
  for (const auto& [peer, conn] : single_copy_conns_)
    if (!conn->acknowledged())
      waiting += str_cat(waiting.empty() ? "" : "; ", "rank ", peer, " (to read a single-copy send)");
  RT_THROW(Timeout, describe_current(), " timed out on rank ", rank_, " after ",
           current_ ? current_->plan.timeout_s : 0.0, " s waiting for ", waiting);
}

}  // namespace ringtree
