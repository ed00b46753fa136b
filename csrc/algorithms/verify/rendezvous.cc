#include "algorithms/verify/rendezvous.h"

#include <algorithm>
#include "common/check.h"

namespace ringtree {

namespace {

struct Cursor {
  size_t step = 0;
  bool entered = false;       // the current step's entry work is done
  std::vector<uint8_t> done;  // per op of the current step
};

bool is_receive(const Op& op) { return op.kind == OpKind::Recv || op.kind == OpKind::RecvReduce; }

}  // namespace

std::string walk_rendezvous(const std::vector<const Schedule*>& schedules, RendezvousVisitor& visitor) {
  const int P = static_cast<int>(schedules.size());
  std::vector<Cursor> cursors(P);
  // Enters the current step, and any following steps that hold only local copies.
  auto enter = [&](int r) {
    Cursor& c = cursors[r];
    const Schedule& s = *schedules[r];
    while (c.step < s.num_steps() && !c.entered) {
      const size_t b = s.step_begin(c.step), e = s.step_end[c.step];
      c.done.assign(e - b, 0);
      visitor.enter_step(r, c.step);
      bool all_done = true;
      for (size_t i = b; i < e; ++i) {
        if (s.ops[i].kind == OpKind::Copy) c.done[i - b] = 1;
        else all_done = false;
      }
      c.entered = true;
      if (all_done) { c.step++; c.entered = false; }
    }
  };
  for (int r = 0; r < P; ++r) enter(r);

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
    }
    for (int r = 0; r < P; ++r) {
      Cursor& c = cursors[r];
      if (c.step < schedules[r]->num_steps() && c.entered &&
          std::all_of(c.done.begin(), c.done.end(), [](uint8_t d) { return d != 0; })) {
        c.step++;
        c.entered = false;
        enter(r);
        progressed = true;
      }
    }
    if (finished) return "";
    if (!progressed) {
      std::string blocked = "deadlock:";
      for (int r = 0; r < P; ++r)
        if (cursors[r].step < schedules[r]->num_steps()) blocked += str_cat(" rank ", r, " at step ", cursors[r].step, ";");
      return blocked;
    }
  }
}

}  // namespace ringtree
