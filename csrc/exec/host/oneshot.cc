// One-shot: small collectives in one message latency on a single host.
//
// Each rank's shared-memory segment holds kOneShotSlots one-shot slots (common/oneshot.h). Call number
// `gen` (counting only one-shot calls, identical on every rank) uses slot gen % kOneShotSlots: a
// rank copies its whole input there (or, when it does not fit beside the fingerprint, into payload
// slot gen % kOneShotPayloadSlots) with the call's fingerprint and publishes `gen` last; then
// it waits until every peer it reads has published `gen`, checks each one's fingerprint, and
// computes its result straight from the slots, reducing in rank order 0, 1, ..., P-1 so every
// rank gets identical bits. What it publishes, reads and reduces, in which order, is the call's
// one-shot schedule (algorithms/oneshot.cc), which verify_schedules proves like every other
// schedule.
//
// Most calls wait for every peer's publication, so no rank gets ahead. A broadcast's root and
// every rank of a count-0 call return without waiting for some peers: those waits are the
// schedule's deferred steps, kept here as unsettled calls and run later, and a rank may run
// ahead of slow peers. One rule keeps the slots safe without acknowledgements (common/oneshot.h):
// a rank settles (waits for the publications of, and checks the fingerprints of) an unsettled
// call g before it publishes call g + A: A = kOneShotRunAhead for a call whose payload fits in its
// slot, kOneShotPayloadRunAhead for a larger one. The verifier walks calls in a row under each,
// in any interleaving (algorithms/verify/rendezvous.h). Every other collective settles them all
// first.
//
// A rank in a one-shot call expects no ring traffic; one in a ring schedule expects no one-shot
// publication for its call. Each side looks for the other's evidence before it sleeps, so a
// call whose size sent ranks down different paths is reported as a mismatch, not a hang.
#include <algorithm>
#include <cstring>
#include "common/check.h"
#include "exec/host/executor.h"

namespace ringtree {

void HostExecutor::publish_oneshot(const MsgHeader& fp, const uint8_t* payload, uint64_t bytes, uint64_t gen) {
  OneShotSlot* mine = own_segment_->oneshot_slot(oneshot_slot_of(gen));
  mine->gen.store(OneShotSlot::kWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  mine->fp = fp;
  mine->fp.payload_bytes = bytes;  // what this rank put there (check_header's expectation)
  // Placed by the call's size (fp.payload_bytes), which every rank knows, not by this rank's share.
  if (bytes) oneshot_stores_.copy(own_segment_->oneshot_payload(gen, fp.payload_bytes), payload, bytes);
  mine->gen.store(gen, std::memory_order_release);
  // Pairs with the fence between a sleeper's flag store and its last look at the one-shot slots.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int q = 0; q < size_; ++q)
    if (q != rank_ && peer_segments_[q]->header()->sleeping.load(std::memory_order_relaxed)) bell_.ring(q);
}

// What rank q put in its one-shot slot for the call `fp` describes (fp.payload_bytes: a full input).
static uint64_t oneshot_payload_of(const MsgHeader& fp, int q) {
  return oneshot_publishes_data(static_cast<Collective>(fp.coll), q, fp.root) ? fp.payload_bytes : 0;
}

// Waits until every rank not yet marked in oneshot_arrived_ has published `gen`, checking each
// one's fingerprint against `fp` as it arrives.
void HostExecutor::await_oneshot(uint64_t gen, const MsgHeader& fp, double timeout_s) {
  const int slot_index = oneshot_slot_of(gen);
  const Deadline deadline = Deadline::from_first_look(timeout_s);
  int missing = 0;
  for (int q = 0; q < size_; ++q) missing += oneshot_arrived_[q] == 0;
  auto how_to_start = [this] { return awaited_peer_on_this_cpu(true) ? WaitStart::Yield : WaitStart::Spin; };
  Backoff backoff(wait_, how_to_start);
  while (missing > 0) {
    bool moved = false;
    for (int q = 0; q < size_; ++q) {
      if (oneshot_arrived_[q]) continue;
      const OneShotSlot* slot = peer_segments_[q]->oneshot_slot(slot_index);
      if (slot->gen.load(std::memory_order_acquire) != gen) continue;
      check_header(slot->fp, fp, oneshot_payload_of(fp, q), q);
      oneshot_arrived_[q] = 1;
      --missing;
      moved = true;
    }
    if (missing == 0) break;
    if (moved) {
      backoff.progressed();
      continue;
    }
    if (backoff.should_block()) oneshot_block(fp, timeout_s, deadline, gen);
  }
}

// A one-shot broadcast or scatter returns once a rank has what it needs (the root at once, the
// others with the root's data), and a gather's or reduce's rank other than the root and a count-0
// call at once: the ranks it skipped are its deferred steps.
// Settling the call waits for their publications and checks their fingerprints, so a mismatched
// call raises in a later one, as a ring schedule's early finisher does. Oldest first.
void HostExecutor::settle_oneshot_through(uint64_t last_gen, double timeout_s) {
  while (oneshot_unsettled_count_ > 0 && oneshot_unsettled_[oneshot_unsettled_first_].gen <= last_gen) {
    const UnsettledOneShotCall call = oneshot_unsettled_[oneshot_unsettled_first_];
    oneshot_unsettled_first_ = (oneshot_unsettled_first_ + 1) % oneshot_unsettled_.size();
    --oneshot_unsettled_count_;
    for (int q = 0; q < size_; ++q) oneshot_arrived_[q] = q == rank_ || q == call.unawaited;
    await_oneshot(call.gen, call.fp, timeout_s);
  }
}

void HostExecutor::settle_oneshot(double timeout_s) { settle_oneshot_through(UINT64_MAX, timeout_s); }

// Settles, oldest first, the unsettled calls every awaited rank has published by now, without
// waiting: a mismatch shows in the next call that can see it, not only when the rules need it.
// Their slots still hold them (this rank has not published far enough for a rewrite).
void HostExecutor::settle_oneshot_published(double timeout_s) {
  while (oneshot_unsettled_count_ > 0) {
    const UnsettledOneShotCall& call = oneshot_unsettled_[oneshot_unsettled_first_];
    const int slot_index = oneshot_slot_of(call.gen);
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && q != call.unawaited &&
          peer_segments_[q]->oneshot_slot(slot_index)->gen.load(std::memory_order_acquire) != call.gen)
        return;
    settle_oneshot_through(call.gen, timeout_s);
  }
}

void HostExecutor::run_oneshot(const uint8_t* in, uint8_t* out) {
  const CallPlan& p = current_->plan;
  const size_t esz = p.elem_size();
  const uint64_t gen = ++oneshot_gen_;
  MsgHeader fp = current_fp_;
  fp.payload_bytes = oneshot_payload_bytes(p.key.coll, p.key.count * esz, size_);
  current_fp_ = fp;
  const Schedule& s = schedule_for(*current_);
  // The rule of common/oneshot.h; then slot gen % kOneShotSlots (and its payload slot) is free to rewrite.
  const uint64_t ahead = oneshot_run_ahead(fp.payload_bytes);
  if (gen > ahead) settle_oneshot_through(gen - ahead, p.timeout_s);
  // ops [0, reads) publish; [reads, reads_end) read and make the result; the rest are deferred.
  const uint32_t reads = s.step_end[0], reads_end = s.step_end[s.num_steps() - s.deferred_steps - 1];
  for (uint32_t i = 0; i < reads; ++i) {
    const Op& op = s.ops[i];  // Publish (its bytes are oneshot_payload_of(fp, rank_))
    publish_oneshot(fp, (op.src.buf == BufId::Input ? in : out) + op.src.offset * esz, op.count * esz, gen);
  }

  // Wait for every publication the result steps read, checking each fingerprint on arrival.
  std::fill(oneshot_arrived_.begin(), oneshot_arrived_.end(), 1);
  for (uint32_t i = reads; i < reads_end; ++i) {
    oneshot_arrived_[s.ops[i].peer] = 0;
    if (s.ops[i].lhs_peer >= 0) oneshot_arrived_[s.ops[i].lhs_peer] = 0;
  }
  oneshot_arrived_[rank_] = 1;
  await_oneshot(gen, fp, p.timeout_s);
  // Earlier unsettled calls whose peers have published by now are checked here, without waiting,
  // so a mismatch shows in the next call that can see it (a call that heard from everyone
  // settles every earlier one), not only when the rule above needs it.
  settle_oneshot_published(p.timeout_s);
  if (s.deferred_steps) {
    RT_CHECK(oneshot_unsettled_count_ < oneshot_unsettled_.size(), Error, "internal error: ", oneshot_unsettled_count_,
             " unsettled one-shot calls");
    // Settling follows the schedule's deferred steps: they wait for every other rank but, for a
    // broadcast or scatter, the root, whose publication the call read (the verifier checks the field).
    oneshot_unsettled_[(oneshot_unsettled_first_ + oneshot_unsettled_count_++) % oneshot_unsettled_.size()] =
        UnsettledOneShotCall{gen, fp, s.deferred_unawaited};
  }

  // Every slot of this call is readable until this rank publishes the next one. The reads write
  // only the output (the verifier proves the input stays untouched).
  auto published = [&](int q, uint64_t offset) -> const uint8_t* {
    const ShmSegment* seg = q == rank_ ? own_segment_.get() : peer_segments_[q].get();
    return seg->oneshot_payload(gen, fp.payload_bytes) + offset * esz;
  };
  for (uint32_t i = reads; i < reads_end; ++i) {
    const Op& op = s.ops[i];
    if (op.count == 0) continue;  // a wait, done above
    uint8_t* dst = out + op.dst.offset * esz;
    if (op.kind == OpKind::CopyPublished) {
      std::memcpy(dst, published(op.peer, op.src.offset), op.count * esz);
    } else {  // ReducePublished: dst = lhs (op) published(peer), in the schedule's rank order
      const uint8_t* lhs = op.lhs_peer >= 0 ? published(op.lhs_peer, op.src.offset) : dst;
      reduce_fn(p.dtype, p.combine)(dst, lhs, published(op.peer, op.src.offset), op.count);
    }
  }
}

void HostExecutor::oneshot_block(const MsgHeader& fp, double timeout_s, const Deadline& deadline, uint64_t gen) {
  raise_if_aborted();
  ctrl_.raise_notice_if_any();
  clear_waiting();
  const int slot_index = oneshot_slot_of(gen);
  for (int q = 0; q < size_; ++q) {
    if (oneshot_arrived_[q]) continue;
    note_waiting(q, false);
    // A publication made before the peer left is there to read: its goodbye may have come since
    // the caller last looked.
    if (!ctrl_.alive(q) && peer_segments_[q]->oneshot_slot(slot_index)->gen.load(std::memory_order_acquire) != gen)
      RT_THROW(PeerFailure, "rank ", q, " closed its communicator while this rank still expects it in ",
               describe(fingerprint_of(fp)));
    // A peer that sends ring traffic for this very call chose another algorithm: its call differs.
    MsgHeader h{};
    if (conns_[q] && conns_[q]->peek_header(&h) && h.magic == MsgHeader::kMagic &&
        h.coll != static_cast<uint8_t>(Collective::Send) && h.seq == fp.seq)
      check_header(h, fp, h.payload_bytes, q);
  }
  if (deadline.expired()) {
    std::string waiting;
    for (int q = 0; q < size_; ++q)
      if (!oneshot_arrived_[q]) waiting += str_cat(waiting.empty() ? "rank " : ", rank ", q);
    RT_THROW(Timeout, describe(fingerprint_of(fp)), " timed out on rank ", rank_, " after ", timeout_s,
             " s waiting for ", waiting, " to publish its input (one-shot)",
             gen < oneshot_gen_ ? str_cat("; this rank is at ", describe(fingerprint_of(current_fp_)),
                                          ": a broadcast's or scatter's root, a gather's or reduce's other ranks or a "
                                          "count-0 call run at most ",
                                          oneshot_run_ahead(current_fp_.payload_bytes),
                                          " one-shot calls ahead of its peers (", kOneShotRunAhead, " up to ",
                                          kOneShotInlineBytes, " bytes a call, ", kOneShotPayloadRunAhead, " above)")
                                : std::string());
  }
  // Ring traffic rings the same doorbell, so a peer on another path is noticed at once.
  pollfds_.clear();
  pollfd_peer_.clear();
  doze(deadline, [&] {
    for (int q = 0; q < size_; ++q)
      if (!oneshot_arrived_[q] &&
          peer_segments_[q]->oneshot_slot(slot_index)->gen.load(std::memory_order_acquire) == gen)
        return true;
    return false;
  });
}

void HostExecutor::check_oneshot_mismatch() const {
  // A point-to-point call's seq counts its messages with one peer, not collectives: a peer's
  // one-shot slot with the same number is an unrelated collective, never this call.
  const auto p2p = static_cast<uint8_t>(Collective::Send);
  if (!oneshot_usable_ || !current_ || current_fp_.coll == p2p) return;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    for (int slot_index = 0; slot_index < kOneShotSlots; ++slot_index) {
      const OneShotSlot* slot = peer_segments_[q]->oneshot_slot(slot_index);
      const uint64_t before = slot->gen.load(std::memory_order_acquire);
      if (before == 0 || before == OneShotSlot::kWriting) continue;
      const MsgHeader h = slot->fp;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot->gen.load(std::memory_order_relaxed) != before) continue;  // being rewritten
      if (h.seq == current_fp_.seq) check_header(h, current_fp_, h.payload_bytes, q);
    }
  }
}

}  // namespace ringtree
