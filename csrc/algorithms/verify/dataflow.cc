// Transport-free check of the schedules (see verify_schedules in schedule.h).
//
// Every element holds the ordered list of (rank, input index) atoms that were reduced into it,
// and the shape of its reduction: a tree interned so that equal shapes have equal ids, with the
// two operands of each op unordered (IEEE sum and product are commutative; association is what
// changes bits).
// Ops within a step must touch disjoint memory (with the in-place aliasing the collective
// permits); a send completes only when its receiver's current step holds the matching recv.
// A publication is a snapshot of atoms; a one-shot read takes atoms from it once it exists.
#include <algorithm>
#include <map>
#include "algorithms/verify/rendezvous.h"
#include "common/oneshot.h"
#include "algorithms/schedule.h"
#include "common/check.h"
#include "common/collective.h"

namespace ringtree {

namespace {

struct Atom {
  int rank;
  uint64_t index;
  bool operator==(const Atom& o) const { return rank == o.rank && index == o.index; }
  bool operator<(const Atom& o) const { return rank != o.rank ? rank < o.rank : index < o.index; }
};

// Reduction shapes. A leaf is one rank's input element; a node joins two shapes, either way round.
class Shapes {
 public:
  uint64_t leaf(int rank, uint64_t index) { return intern({kLeaf + static_cast<uint64_t>(rank), index}); }
  uint64_t join(uint64_t a, uint64_t b) { return intern({std::min(a, b), std::max(a, b)}); }
  // ((x_0 op x_1) op x_2) ... op x_{P-1} of element `index`.
  uint64_t rank_fold(int P, uint64_t index) {
    uint64_t id = leaf(0, index);
    for (int q = 1; q < P; ++q) id = join(id, leaf(q, index));
    return id;
  }

 private:
  static constexpr uint64_t kLeaf = uint64_t{1} << 62;  // above every id, so leaf keys never meet node keys
  uint64_t intern(std::pair<uint64_t, uint64_t> key) { return ids_.emplace(key, ids_.size() + 1).first->second; }
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> ids_;
};

struct Value {
  std::vector<Atom> atoms;  // empty: never written
  uint64_t shape = 0;
  bool empty() const { return atoms.empty(); }
  bool operator==(const Value& o) const { return atoms == o.atoms && shape == o.shape; }
};

struct Sizes {
  uint64_t input, output;
};

// The root's buffers (the verifier gives every rank the largest shapes), from the collective's
// description; broadcast's one buffer is modelled as an output of the input's size.
Sizes buffer_sizes(Collective c, int P, uint64_t N) {
  const BufferSizes b = collective_traits(c).sizes(N, P, /*is_root=*/true);
  return {b.input, b.output ? b.output : b.input};
}

// Where a buffer reference lives: storage 0 = input, 1 = output, 2 = scratch, with the
// in-place aliasing of this collective folded in.
struct Location {
  int storage;
  uint64_t offset;
};

struct Aliasing {
  bool in_place;
  Collective coll;
  int rank, root;
  uint64_t N;
  bool same_buffer;  // ScheduleKey::same_buffer: all_to_all's input is its output
  Location locate(BufRef ref) const {
    const int storage = static_cast<int>(ref.buf);
    if (!in_place && coll != Collective::Broadcast) return {storage, ref.offset};
    const uint64_t rN = static_cast<uint64_t>(rank) * N;
    switch (coll) {
      case Collective::AllReduce:
      case Collective::Broadcast:
        return ref.buf == BufId::Input ? Location{1, ref.offset} : Location{storage, ref.offset};
      case Collective::Reduce:
        if (rank == root && ref.buf == BufId::Input) return {1, ref.offset};
        return {storage, ref.offset};
      case Collective::AllGather:
      case Collective::Gather:  // input is output block r
        if (ref.buf == BufId::Input && (coll == Collective::AllGather || rank == root)) return {1, rN + ref.offset};
        return {storage, ref.offset};
      case Collective::AllToAll:  // one buffer, or the pre-step's copy of the input (private)
        return same_buffer && ref.buf == BufId::Input ? Location{1, ref.offset} : Location{storage, ref.offset};
      case Collective::ReduceScatter:
      case Collective::Scatter:  // output is input block r
        if (ref.buf == BufId::Output && (coll == Collective::ReduceScatter || rank == root))
          return {0, rN + ref.offset};
        return {storage, ref.offset};
      default:
        return {storage, ref.offset};
    }
  }
};

struct RankState {
  Schedule sched;
  Aliasing alias;
  std::vector<Value> storage[3];
  std::vector<uint8_t> knows;            // barrier causality: which ranks this rank has heard from
  std::vector<Value> published;          // its publication (one per call)
  std::vector<uint8_t> knows_published;  // what it knew when it published
};

std::string describe(const ScheduleKey& k, bool in_place) {
  return str_cat(collective_name(k.coll), "/", algo_name(k.algo), " P=", k.nranks, " count=", k.count, " root=", k.root,
                 " segment=", k.segment, k.topo ? " on " + k.topo->describe() : std::string(),
                 in_place ? (k.same_buffer ? " in one buffer" : " in-place") : " out-of-place");
}

[[noreturn]] void fail(const ScheduleKey& k, bool in_place, const std::string& what) {
  throw Error("schedule check failed for " + describe(k, in_place) + ": " + what);
}

Value& at(RankState& st, BufRef ref, uint64_t i, const ScheduleKey& k, bool ip, int r) {
  Location loc = st.alias.locate(ref);
  auto& vec = st.storage[loc.storage];
  if (loc.offset + i >= vec.size())
    fail(k, ip,
         str_cat("rank ", r, " touches element ", loc.offset + i, " of buffer ", loc.storage, " which has ",
                 vec.size()));
  return vec[loc.offset + i];
}

void check_step_disjoint(RankState& st, size_t b, size_t e, const ScheduleKey& k, bool ip, int r) {
  struct Range {
    int storage;
    uint64_t lo, hi;
    bool write;
    size_t op;
  };
  std::vector<Range> ranges;
  std::map<int, int> sends, recvs;
  for (size_t i = b; i < e; ++i) {
    const Op& op = st.sched.ops[i];
    if (op.kind == OpKind::Send && ++sends[op.peer] > 1)
      fail(k, ip, str_cat("rank ", r, " step has two sends to ", op.peer));
    if ((op.kind == OpKind::Recv || op.kind == OpKind::RecvReduce) && ++recvs[op.peer] > 1)
      fail(k, ip, str_cat("rank ", r, " step has two receives from ", op.peer));
    if (op.count == 0) continue;
    if (op.kind == OpKind::Copy) {  // in place, a copy onto itself: every executor skips it
      const Location from = st.alias.locate(op.src), to = st.alias.locate(op.dst);
      if (from.storage == to.storage && from.offset == to.offset) continue;
    }
    const bool local_src = op.kind == OpKind::Send || op.kind == OpKind::RecvReduce || op.kind == OpKind::Copy ||
                           op.kind == OpKind::Publish;
    if (local_src) {
      Location l = st.alias.locate(op.src);
      ranges.push_back({l.storage, l.offset, l.offset + op.count, false, i});
    }
    if (op.kind != OpKind::Send && op.kind != OpKind::Publish) {  // an accumulating read of dst is the same op
      Location l = st.alias.locate(op.dst);
      ranges.push_back({l.storage, l.offset, l.offset + op.count, true, i});
    }
  }
  for (size_t x = 0; x < ranges.size(); ++x)
    for (size_t y = x + 1; y < ranges.size(); ++y) {
      const Range &a = ranges[x], &c = ranges[y];
      if (a.op == c.op || a.storage != c.storage || !(a.write || c.write)) continue;
      if (a.lo < c.hi && c.lo < a.hi)
        fail(k, ip, str_cat("rank ", r, " has ops ", a.op, " and ", c.op, " overlapping in one step"));
    }
}

void drop(Schedule& s, size_t index) {
  if (index >= s.ops.size()) return;
  const size_t steps = s.num_steps();
  const size_t step =
      static_cast<size_t>(std::upper_bound(s.step_end.begin(), s.step_end.end(), index) - s.step_end.begin());
  s.ops.erase(s.ops.begin() + static_cast<long>(index));
  for (uint32_t& e : s.step_end)
    if (e > index) --e;
  s.step_end.erase(std::unique(s.step_end.begin(), s.step_end.end()), s.step_end.end());
  if (!s.step_end.empty() && s.step_end.front() == 0) s.step_end.erase(s.step_end.begin());
  if (s.num_steps() < steps && step + s.deferred_steps >= steps) --s.deferred_steps;  // a deferred step emptied
}

bool is_oneshot_schedule(const ScheduleKey& k) { return k.algo == Algo::OneShot; }

// The one-shot rules of schedule.h for one rank's schedule of one call; also that every one-shot op
// names its buffers as its kind says, so the rest of the check can address them.
void check_oneshot_rules(const Schedule& s, int P, int r, const ScheduleKey& k) {
  auto fail_rank = [&](const std::string& what) { fail(k, false, str_cat("rank ", r, " ", what)); };
  const auto local = [](BufRef ref) { return ref.buf < BufId::Count; };
  size_t publishes = 0;
  std::vector<uint8_t> waits_for(P, 0);
  const size_t first_deferred = s.num_steps() - std::min<size_t>(s.deferred_steps, s.num_steps());
  if (s.deferred_steps > 0 && s.deferred_steps >= s.num_steps()) fail_rank("defers every step, its publication too");
  for (size_t step = 0; step < s.num_steps(); ++step)
    for (uint32_t i = s.step_begin(step); i < s.step_end[step]; ++i) {
      const Op& op = s.ops[i];
      if (op.kind == OpKind::Publish) {
        if (step != 0) fail_rank(str_cat("publishes in step ", step, ", not step 0: a peer could wait for it first"));
        if (op.dst.buf != BufId::Published || !local(op.src)) fail_rank("publishes with bad buffers");
        ++publishes;
      } else if (is_oneshot_read(op.kind)) {
        if (step == 0) fail_rank("reads one-shot slots in step 0, beside its publication");
        if (op.src.buf != BufId::Published || !local(op.dst)) fail_rank("reads one-shot slots with bad buffers");
        if (op.peer >= 0 && op.peer < P) waits_for[op.peer] = 1;
        if (op.kind == OpKind::ReducePublished && op.lhs_peer >= 0 && op.lhs_peer < P) waits_for[op.lhs_peer] = 1;
      }
      if (step >= first_deferred && !(is_oneshot_read(op.kind) && op.count == 0))
        fail_rank(str_cat("moves data in deferred step ", step, ": its result would not be complete when it returns"));
    }
  if (publishes != 1) fail_rank(str_cat("publishes ", publishes, " times in one call (one-shot takes one)"));
  // The executor settles a call's deferred steps by deferred_unawaited, not by the steps' ops.
  std::vector<uint8_t> deferred_waits(P, 0);
  for (uint32_t i = s.step_begin(first_deferred); i < s.ops.size(); ++i)
    if (s.ops[i].peer >= 0 && s.ops[i].peer < P) deferred_waits[s.ops[i].peer] = 1;
  int unawaited = -1;
  for (int q = 0; q < P && s.deferred_steps > 0; ++q)
    if (q != r && !deferred_waits[q]) unawaited = unawaited == -1 ? q : -2;
  if (unawaited != s.deferred_unawaited)
    fail_rank(str_cat("says its deferred steps leave rank ", s.deferred_unawaited, " unawaited, but they leave ",
                      unawaited == -2 ? std::string("several ranks") : str_cat("rank ", unawaited)));
  for (int q = 0; q < P; ++q)
    if (q != r && !waits_for[q])
      fail_rank(str_cat("never waits for rank ", q, "'s publication, so it could publish two calls later into the slot",
                        " rank ", q, " may still be reading"));
}

// A schedule that says its first step meets both ring neighbours replaces the executor's
// handshake with those messages: every rank must say so alike, and its first step must hold them.
void check_meets_neighbours_first(const Schedule& s, const Schedule& rank0, int P, int r, const ScheduleKey& k,
                                  bool ip) {
  if (s.first_step_meets_neighbours != rank0.first_step_meets_neighbours)
    fail(k, ip, str_cat("rank ", r, " and rank 0 differ on whether the first step meets the ring neighbours"));
  if (!s.first_step_meets_neighbours) return;
  bool to_next = false, from_prev = false;
  for (uint32_t i = 0; s.num_steps() > 0 && i < s.step_end[0]; ++i) {
    const Op& op = s.ops[i];
    to_next |= op.kind == OpKind::Send && op.peer == (r + 1) % P;
    from_prev |= (op.kind == OpKind::Recv || op.kind == OpKind::RecvReduce) && op.peer == (r + P - 1) % P;
  }
  if (!to_next || !from_prev)
    fail(k, ip,
         str_cat("rank ", r, "'s first step does not send to rank ", (r + 1) % P, " and receive from rank ",
                 (r + P - 1) % P, ", as its schedule says"));
}

void run(const ScheduleKey& base, bool in_place, int drop_op, bool oneshot_rules, bool claim_rank_fold) {
  Shapes shapes;
  const int P = base.nranks;
  const uint64_t N = base.count;
  const Sizes sz = buffer_sizes(base.coll, P, N);
  std::vector<RankState> ranks(P);
  for (int r = 0; r < P; ++r) {
    ScheduleKey k = base;
    k.rank = r;
    RankState& st = ranks[r];
    st.sched = build_schedule(k);
    if (r == 0 && drop_op >= 0) drop(st.sched, static_cast<size_t>(drop_op));
    if (is_oneshot_schedule(base) && oneshot_rules) check_oneshot_rules(st.sched, P, r, base);
    check_meets_neighbours_first(st.sched, ranks[0].sched, P, r, base, in_place);
    st.alias = {in_place, base.coll, r, base.root, N, base.same_buffer};
    st.storage[0].resize(sz.input);
    st.storage[1].resize(sz.output);
    st.storage[2].resize(st.sched.scratch_elems);
    st.knows.assign(P, 0);
    st.knows[r] = 1;
    // Inputs first; then where input and output share storage the input wins, as in memory.
    for (uint64_t i = 0; i < sz.input; ++i)
      at(st, {BufId::Input, i}, 0, base, in_place, r) = {{Atom{r, i}}, shapes.leaf(r, i)};
    if (base.coll == Collective::Broadcast && r == base.root)
      for (uint64_t i = 0; i < sz.output; ++i) st.storage[1][i] = {{Atom{r, i}}, shapes.leaf(r, i)};
  }
  // Values flow as the shared rendezvous walk matches sends with receives.
  struct Flow : RendezvousVisitor {
    std::vector<RankState>& ranks;
    const ScheduleKey& base;
    bool in_place;
    Shapes& shapes;
    Flow(std::vector<RankState>& r, const ScheduleKey& k, bool ip, Shapes& sh)
        : ranks(r), base(k), in_place(ip), shapes(sh) {}
    // dst = lhs (op) incoming
    Value reduced(Value lhs, const Value& incoming) {
      lhs.atoms.insert(lhs.atoms.end(), incoming.atoms.begin(), incoming.atoms.end());
      lhs.shape = shapes.join(lhs.shape, incoming.shape);
      return lhs;
    }
    void enter_step(int r, size_t step) override {
      RankState& st = ranks[r];
      const size_t b = st.sched.step_begin(step), e = st.sched.step_end[step];
      check_step_disjoint(st, b, e, base, in_place, r);
      for (size_t i = b; i < e; ++i) {
        const Op& op = st.sched.ops[i];
        if (op.kind != OpKind::Copy) continue;
        std::vector<Value> tmp(op.count);
        for (uint64_t j = 0; j < op.count; ++j) tmp[j] = at(st, op.src, j, base, in_place, r);
        for (uint64_t j = 0; j < op.count; ++j) at(st, op.dst, j, base, in_place, r) = tmp[j];
      }
    }
    void transfer(int a, const Op& snd, int b, const Op& rcv) override {
      RankState &sa = ranks[a], &sb = ranks[b];
      std::vector<Value> msg(snd.count);
      for (uint64_t x = 0; x < snd.count; ++x) {
        msg[x] = at(sa, snd.src, x, base, in_place, a);
        if (msg[x].empty()) fail(base, in_place, str_cat("rank ", a, " sends an element it never received"));
      }
      for (uint64_t x = 0; x < rcv.count; ++x) {
        Value& d = at(sb, rcv.dst, x, base, in_place, b);
        if (rcv.kind == OpKind::Recv) {
          d = msg[x];
          continue;
        }
        const Value& v = at(sb, rcv.src, x, base, in_place, b);
        if (v.empty()) fail(base, in_place, str_cat("rank ", b, " reduces into an unwritten element"));
        d = reduced(v, msg[x]);
      }
      for (size_t q = 0; q < ranks.size(); ++q) sb.knows[q] |= sa.knows[q];
    }
    void publish(int r, const Op& op, uint64_t) override {
      RankState& st = ranks[r];
      st.published.resize(op.dst.offset + op.count);
      for (uint64_t x = 0; x < op.count; ++x) {
        st.published[op.dst.offset + x] = at(st, op.src, x, base, in_place, r);
        if (st.published[op.dst.offset + x].empty())
          fail(base, in_place, str_cat("rank ", r, " publishes an element it never had"));
      }
      st.knows_published = st.knows;
    }
    const Value& published(int q, uint64_t offset, int r) {
      const std::vector<Value>& pub = ranks[q].published;
      if (offset >= pub.size() || pub[offset].empty())
        fail(base, in_place,
             str_cat("rank ", r, " reads element ", offset, " of rank ", q, "'s publication, which has ", pub.size(),
                     " (or never wrote it)"));
      return pub[offset];
    }
    void read_published(int r, const Op& op, uint64_t) override {
      RankState& st = ranks[r];
      const bool lhs = op.kind == OpKind::ReducePublished && op.lhs_peer >= 0;
      for (uint64_t x = 0; x < op.count; ++x) {
        const Value& incoming = published(op.peer, op.src.offset + x, r);
        Value& d = at(st, op.dst, x, base, in_place, r);
        if (op.kind == OpKind::CopyPublished) {
          d = incoming;
          continue;
        }
        const Value& v = lhs ? published(op.lhs_peer, op.src.offset + x, r) : d;
        if (v.empty()) fail(base, in_place, str_cat("rank ", r, " reduces into an unwritten element"));
        d = reduced(v, incoming);
      }
      for (int q : {op.peer, lhs ? op.lhs_peer : op.peer})
        for (size_t x = 0; x < ranks.size(); ++x) st.knows[x] |= ranks[q].knows_published[x];
    }
  } flow(ranks, base, in_place, shapes);
  std::vector<const Schedule*> schedules;
  for (const RankState& st : ranks) schedules.push_back(&st.sched);
  const std::string problem = walk_rendezvous(schedules, flow);
  if (!problem.empty()) fail(base, in_place, problem);

  // Expected contents.
  // One-shot's claim is stronger than one order on every rank: rank order 0, 1, ..., P-1, as
  // operands too. One-shot and rank_order reductions both have the shape of the rank-order left fold.
  const bool rank_operands = is_oneshot_schedule(base);
  const bool rank_fold = rank_operands || base.algo == Algo::RankOrder || claim_rank_fold;
  auto all_ranks_once = [&](const Value& v, uint64_t index, int r, uint64_t i) {
    std::vector<Atom> sorted = v.atoms;
    std::sort(sorted.begin(), sorted.end());
    bool ok = sorted.size() == static_cast<size_t>(P);
    for (int q = 0; ok && q < P; ++q) ok = sorted[q] == Atom{q, index};
    if (!ok)
      fail(base, in_place,
           str_cat("rank ", r, " element ", i, " is not the reduction of every rank's element ", index,
                   " exactly once (", v.atoms.size(), " terms)"));
    if (rank_operands && !(v.atoms == sorted))
      fail(base, in_place, str_cat("rank ", r, " element ", i, " is not reduced in rank order 0, 1, ..., P-1"));
    if (rank_fold && v.shape != shapes.rank_fold(P, index))
      fail(base, in_place,
           str_cat("rank ", r, " element ", i, " is not reduced as ((x_0 op x_1) op x_2) ... op x_", P - 1,
                   " (the rank-order left fold)"));
  };
  auto expect_single = [&](const Value& v, Atom want, int r, uint64_t i) {
    if (!(v.atoms.size() == 1 && v.atoms[0] == want))
      fail(base, in_place,
           str_cat("rank ", r, " output element ", i, " should be rank ", want.rank, "'s element ", want.index));
  };
  auto out = [&](int r, uint64_t i) -> const Value& { return at(ranks[r], {BufId::Output, i}, 0, base, in_place, r); };
  const Value* reference = nullptr;
  for (int r = 0; r < P; ++r) {
    const uint64_t uP = static_cast<uint64_t>(P), ur = static_cast<uint64_t>(r);
    switch (base.coll) {
      case Collective::AllReduce:
        for (uint64_t i = 0; i < N; ++i) {
          all_ranks_once(out(r, i), i, r, i);
          reference = &out(0, i);
          if (!(out(r, i) == *reference))
            fail(base, in_place, str_cat("ranks 0 and ", r, " reduce element ", i, " in different orders"));
        }
        break;
      case Collective::ReduceScatter:
        for (uint64_t i = 0; i < N; ++i) all_ranks_once(out(r, i), ur * N + i, r, i);
        break;
      case Collective::AllGather:
        for (uint64_t j = 0; j < uP; ++j)
          for (uint64_t i = 0; i < N; ++i) expect_single(out(r, j * N + i), {static_cast<int>(j), i}, r, j * N + i);
        break;
      case Collective::AllToAll:
        for (uint64_t j = 0; j < uP; ++j)
          for (uint64_t i = 0; i < N; ++i)
            expect_single(out(r, j * N + i), {static_cast<int>(j), ur * N + i}, r, j * N + i);
        break;
      case Collective::Broadcast:
        for (uint64_t i = 0; i < N; ++i) expect_single(out(r, i), {base.root, i}, r, i);
        break;
      case Collective::Reduce:
        if (r == base.root)
          for (uint64_t i = 0; i < N; ++i) all_ranks_once(out(r, i), i, r, i);
        break;
      case Collective::Gather:
        if (r == base.root)
          for (uint64_t j = 0; j < uP; ++j)
            for (uint64_t i = 0; i < N; ++i) expect_single(out(r, j * N + i), {static_cast<int>(j), i}, r, j * N + i);
        break;
      case Collective::Scatter:
        for (uint64_t i = 0; i < N; ++i) expect_single(out(r, i), {base.root, ur * N + i}, r, i);
        break;
      case Collective::Barrier:
        for (int q = 0; q < P; ++q)
          if (!ranks[r].knows[q])
            fail(base, in_place, str_cat("rank ", r, " leaves the barrier without hearing from rank ", q));
        break;
      default:
        break;
    }
    // Out of place, the caller's input is never written; a non-root reduce leaves it too.
    const bool input_private = !in_place || (base.coll == Collective::Reduce && r != base.root);
    if (input_private && base.coll != Collective::Broadcast)
      for (uint64_t i = 0; i < sz.input; ++i) {
        const Value& v = ranks[r].storage[0][i];
        if (!(v.atoms.size() == 1 && v.atoms[0] == Atom{r, i}))
          fail(base, in_place, str_cat("rank ", r, " overwrote its input element ", i));
      }
  }
}

// The slots: every rank makes 2 * slots one-shot calls in a row (every slot reused, deferred steps
// included), its schedule repeated, each call's deferred steps placed before the publication `lag`
// calls later (where the host executor settles them at the latest), walked with `slots` slots per
// rank. The walk reports a publication that could land in a slot some rank may still read, in any
// interleaving. common/oneshot.h has two such pairs: the slots with their inline payloads, and the
// payload slots of larger calls (walked as if their fingerprints moved with them, which is
// stricter); a mix of the two settles every call by its slots' rule or sooner.
void check_oneshot_slots(const ScheduleKey& base, int drop_op, int slots, uint64_t lag) {
  const uint64_t calls_in_a_row = 2 * static_cast<uint64_t>(slots);
  struct Silent : RendezvousVisitor {
    void enter_step(int, size_t) override {}
    void transfer(int, const Op&, int, const Op&) override {}
    void publish(int, const Op&, uint64_t) override {}
    void read_published(int, const Op&, uint64_t) override {}
  } silent;
  std::vector<Schedule> calls(base.nranks);
  std::vector<std::vector<uint64_t>> read_calls(base.nranks);
  for (int r = 0; r < base.nranks; ++r) {
    ScheduleKey k = base;
    k.rank = r;
    Schedule one = build_schedule(k);
    if (r == 0 && drop_op >= 0) drop(one, static_cast<size_t>(drop_op));
    const size_t deferred_from = one.num_steps() - std::min<size_t>(one.deferred_steps, one.num_steps());
    // Appends steps [from, to) of `one` as the reads of one-shot call `call` (0: the latest).
    auto append = [&](size_t from, size_t to, uint64_t call) {
      for (size_t step = from; step < to; ++step) {
        calls[r].ops.insert(calls[r].ops.end(), one.ops.begin() + one.step_begin(step),
                            one.ops.begin() + one.step_end[step]);
        calls[r].step_end.push_back(static_cast<uint32_t>(calls[r].ops.size()));
        read_calls[r].push_back(call);
      }
    };
    for (uint64_t c = 1; c <= calls_in_a_row; ++c) {
      if (c > lag) append(deferred_from, one.num_steps(), c - lag);
      append(0, deferred_from, 0);
    }
    for (uint64_t c = calls_in_a_row > lag ? calls_in_a_row - lag + 1 : 1; c <= calls_in_a_row; ++c)
      append(deferred_from, one.num_steps(), c);
  }
  std::vector<const Schedule*> schedules;
  for (const Schedule& s : calls) schedules.push_back(&s);
  const std::string problem = walk_rendezvous(schedules, silent, &read_calls, slots);
  if (!problem.empty())
    fail(base, false, str_cat(calls_in_a_row, " calls in a row, ", slots, " slots, run-ahead ", lag, ": ", problem));
}

}  // namespace

std::string verify_schedules(ScheduleKey key, int drop_op, bool oneshot_rules, bool claim_rank_fold) {
  if (!key.same_buffer) run(key, false, drop_op, oneshot_rules, claim_rank_fold);  // one buffer is in place
  run(key, true, drop_op, oneshot_rules, claim_rank_fold);
  const bool oneshot = is_oneshot_schedule(key);
  if (oneshot) {
    check_oneshot_slots(key, drop_op, kOneShotSlots, kOneShotRunAhead);
    check_oneshot_slots(key, drop_op, kOneShotPayloadSlots, kOneShotPayloadRunAhead);
  }
  uint64_t steps = 0, messages = 0, reads = 0;
  for (int r = 0; r < key.nranks; ++r) {
    key.rank = r;
    Schedule s = build_schedule(key);
    steps = std::max<uint64_t>(steps, s.num_steps());
    for (const Op& op : s.ops) {
      messages += op.kind == OpKind::Send || op.kind == OpKind::Publish;
      reads += is_oneshot_read(op.kind);
    }
  }
  if (oneshot)
    return str_cat(describe(key, false), ": ok, ", steps, " steps on the longest rank, ", messages, " publications, ",
                   reads, " one-shot reads; ", 2 * kOneShotSlots, " calls in a row fit ", kOneShotSlots,
                   " one-shot slots and ", 2 * kOneShotPayloadSlots, " fit ", kOneShotPayloadSlots,
                   " payload slots per rank");
  return str_cat(describe(key, key.same_buffer), ": ok, ", steps, " steps on the longest rank, ", messages,
                 " messages");
}

}  // namespace ringtree
