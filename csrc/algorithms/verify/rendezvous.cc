#include "algorithms/verify/rendezvous.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include "common/oneshot.h"
#include "common/check.h"

namespace ringtree {

void RendezvousVisitor::publish(int rank, const Op&, uint64_t) {
  RT_THROW(Error, "internal error: rank ", rank,
           "'s schedule publishes in a one-shot slot, which this executor has not");
}

void RendezvousVisitor::read_published(int rank, const Op&, uint64_t) {
  RT_THROW(Error, "internal error: rank ", rank, "'s schedule reads one-shot slots, which this executor has not");
}

namespace {

struct Cursor {
  size_t step = 0;
  bool entered = false;            // the current step's entry work is done
  std::vector<uint8_t> done;       // per op of the current step
  uint64_t call = 0;               // one-shot publications made: the rank's current one-shot call
  size_t publish_step = SIZE_MAX;  // the step that made the latest one
};

bool is_receive(const Op& op) { return op.kind == OpKind::Recv || op.kind == OpKind::RecvReduce; }

// Happens-before over one-shot events (see the header). clock(r)[q] counts the events of
// rank q that rank r's next event follows; a rank's publication carries its clock to every
// rank that reads it.
class OneShotClocks {
 public:
  OneShotClocks(int P, int slots)
      : P_(P), slots_(slots), clocks_(static_cast<size_t>(P) * P, 0), at_publish_(P), last_read_(P) {}

  // Rank r publishes call g into slot g % slots: "" or why that slot may still be read.
  std::string publish(int r, uint64_t g) {
    tick(r);
    const uint64_t D = static_cast<uint64_t>(slots_);
    if (g > D) {
      const uint64_t* reads = &last_read_[r][(g - D - 1) * static_cast<uint64_t>(P_)];
      for (int q = 0; q < P_; ++q)
        if (reads[q] > clock(r)[q])
          return str_cat("rank ", r, " can publish call ", g, " over its call ", g - D, " before rank ", q,
                         " has finished reading that call: ", D, " one-shot slots are not enough for these schedules");
    }
    at_publish_[r].insert(at_publish_[r].end(), clock(r), clock(r) + P_);
    last_read_[r].resize(g * static_cast<uint64_t>(P_), 0);
    return "";
  }

  // Rank r has read rank q's publication of call g (which q has made).
  void read(int r, int q, uint64_t g) {
    const uint64_t* seen = &at_publish_[q][(g - 1) * static_cast<uint64_t>(P_)];
    for (int x = 0; x < P_; ++x) clock(r)[x] = std::max(clock(r)[x], seen[x]);
    tick(r);
    last_read_[q][(g - 1) * static_cast<uint64_t>(P_) + static_cast<uint64_t>(r)] = clock(r)[r];
  }

 private:
  uint64_t* clock(int r) { return &clocks_[static_cast<size_t>(r) * P_]; }
  void tick(int r) { ++clock(r)[r]; }

  int P_;
  int slots_;
  std::vector<uint64_t> clocks_;                   // P x P
  std::vector<std::vector<uint64_t>> at_publish_;  // [owner][(call-1)*P + x]: its clock when it published
  std::vector<std::vector<uint64_t>> last_read_;   // [owner][(call-1)*P + reader]: reader's time of its last read
};

}  // namespace

std::string walk_rendezvous(const std::vector<const Schedule*>& schedules, RendezvousVisitor& visitor,
                            const std::vector<std::vector<uint64_t>>* read_calls, int oneshot_slots) {
  const int P = static_cast<int>(schedules.size());
  std::vector<Cursor> cursors(P);
  std::unique_ptr<OneShotClocks> clocks;  // made at the first publication
  std::string problem;
  // The call whose publications rank r's current step reads.
  auto reading_call = [&](int r) {
    const uint64_t call = read_calls ? (*read_calls)[r][cursors[r].step] : 0;
    return call ? call : cursors[r].call;
  };
  // Enters the current step, and any following steps that hold only local work (copies and
  // publications); false when a publication breaks the slot rule (`problem`).
  auto enter = [&](int r) {
    Cursor& c = cursors[r];
    const Schedule& s = *schedules[r];
    while (c.step < s.num_steps() && !c.entered) {
      const size_t b = s.step_begin(c.step), e = s.step_end[c.step];
      c.done.assign(e - b, 0);
      visitor.enter_step(r, c.step);
      bool all_done = true;
      for (size_t i = b; i < e; ++i) {
        const Op& op = s.ops[i];
        if (op.kind == OpKind::Publish) {
          c.call++;
          c.publish_step = c.step;
          if (!clocks) clocks = std::make_unique<OneShotClocks>(P, oneshot_slots);
          problem = clocks->publish(r, c.call);
          if (!problem.empty()) return false;
          visitor.publish(r, op, c.call);
        }
        if (op.kind == OpKind::Copy || op.kind == OpKind::Publish)
          c.done[i - b] = 1;
        else
          all_done = false;
      }
      c.entered = true;
      if (all_done) {
        c.step++;
        c.entered = false;
      }
    }
    return true;
  };
  // Whether rank a's read of rank q's publication (of a's current call) can go now; false with
  // `problem` set when it never can.
  auto published = [&](int a, int q) {
    const Cursor& c = cursors[a];
    const uint64_t call = reading_call(a);
    if (q < 0 || q >= P)
      problem = str_cat("rank ", a, " reads the publication of bad rank ", q);
    else if (c.call == 0)
      problem = str_cat("rank ", a, " reads rank ", q, "'s publication before publishing its own");
    else if (q == a && c.publish_step == c.step)
      problem = str_cat("rank ", a, " reads its own publication in the step that makes it");
    else if (cursors[q].call >= call + static_cast<uint64_t>(oneshot_slots))
      problem = str_cat("rank ", q, " overwrote its publication of call ", call, " with call ", cursors[q].call,
                        " before rank ", a, " read it");
    return problem.empty() && (q == a || cursors[q].call >= call);
  };
  for (int r = 0; r < P; ++r)
    if (!enter(r)) return problem;

  for (;;) {
    bool progressed = false, finished = true;
    for (int a = 0; a < P; ++a) {
      Cursor& ca = cursors[a];
      const Schedule& sa = *schedules[a];
      if (ca.step >= sa.num_steps()) continue;
      finished = false;
      const size_t b = sa.step_begin(ca.step), e = sa.step_end[ca.step];
      for (size_t i = b; i < e; ++i) {
        const Op& snd = sa.ops[i];
        if (ca.done[i - b] || snd.kind != OpKind::Send) continue;
        if (snd.peer < 0 || snd.peer >= P || snd.peer == a) return str_cat("rank ", a, " sends to bad peer ", snd.peer);
        Cursor& cb = cursors[snd.peer];
        const Schedule& sb = *schedules[snd.peer];
        if (cb.step >= sb.num_steps()) continue;
        const size_t bb = sb.step_begin(cb.step), be = sb.step_end[cb.step];
        for (size_t j = bb; j < be; ++j) {
          const Op& rcv = sb.ops[j];
          if (cb.done[j - bb] || rcv.peer != a || !is_receive(rcv)) continue;
          if (rcv.count != snd.count)
            return str_cat("rank ", a, " sends ", snd.count, " elements but rank ", snd.peer, " receives ", rcv.count);
          visitor.transfer(a, snd, snd.peer, rcv);
          ca.done[i - b] = 1;
          cb.done[j - bb] = 1;
          progressed = true;
          break;
        }
      }
      for (size_t i = b; i < e; ++i) {
        const Op& op = sa.ops[i];
        if (ca.done[i - b] || !is_oneshot_read(op.kind)) continue;
        const bool lhs = op.kind == OpKind::ReducePublished && op.lhs_peer >= 0;
        const bool ready = published(a, op.peer) && (!lhs || published(a, op.lhs_peer));
        if (!problem.empty()) return problem;
        if (!ready) continue;
        const uint64_t call = reading_call(a);
        visitor.read_published(a, op, call);
        clocks->read(a, op.peer, call);
        if (lhs) clocks->read(a, op.lhs_peer, call);
        ca.done[i - b] = 1;
        progressed = true;
      }
    }
    for (int r = 0; r < P; ++r) {
      Cursor& c = cursors[r];
      if (c.step < schedules[r]->num_steps() && c.entered &&
          std::all_of(c.done.begin(), c.done.end(), [](uint8_t d) { return d != 0; })) {
        c.step++;
        c.entered = false;
        if (!enter(r)) return problem;
        progressed = true;
      }
    }
    if (finished) return "";
    if (!progressed) {
      std::string blocked = "deadlock:";
      for (int r = 0; r < P; ++r)
        if (cursors[r].step < schedules[r]->num_steps())
          blocked += str_cat(" rank ", r, " at step ", cursors[r].step,
                             cursors[r].call ? str_cat(" of one-shot call ", cursors[r].call) : std::string(), ";");
      return blocked;
    }
  }
}

}  // namespace ringtree
