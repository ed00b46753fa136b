// Pricing a call from its schedules: see algorithms/pricing.h for the terms.
#include "algorithms/pricing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include "common/check.h"
#include "common/collective.h"

namespace ringtree {

namespace {

// Grid point i of a price table: 0 bytes, then 2^(i-1).
uint64_t grid_bytes(int i) { return i == 0 ? 0 : uint64_t{1} << (i - 1); }

// Counting stops once the counts grow linearly in bytes: three grid points in a line (each step
// of the grid doubles the size, so the second difference is twice the first). From there on a
// larger call only has more segments of the same shape (one more hop and one more segment's
// bytes each) or larger blocks, so larger calls extend the last two points counted, exactly up
// to the rounding of uneven blocks. Small calls are not in that regime (blocks of 0 or 1
// element, fewer segments than tree levels), so the check starts at 4 segments and 16 bytes a
// rank. A ring or pairwise schedule has about P^2 ops over all ranks, so a table costs O(P^2)
// per grid point counted (all tables together on a 2-core VM: P=8 about 0.5 ms, P=64 20-40 ms,
// P=256 about 0.5 s). kCountOpBudget caps the ops one table may count: up to P of about 256
// the counting reaches the linear regime first; beyond, a ring or pairwise table stops early
// and extends from smaller calls (at P=300 its counts at 1 MiB are off by 0.04%), while the
// pipelined trees, whose counts change shape with the segments, have only O(P) ops a segment
// and are counted in full.
constexpr uint64_t kCountOpBudget = uint64_t{1} << 22;
constexpr double kLinearTolerance = 1e-4;

bool in_a_line(const ScheduleCounts& a, const ScheduleCounts& b, const ScheduleCounts& c) {
  auto line = [](double x, double y, double z) {
    return std::fabs((z - y) - 2 * (y - x)) <= kLinearTolerance * std::max(1.0, std::fabs(z));
  };
  return line(a.steps, b.steps, c.steps) && line(a.hops, b.hops, c.hops) && line(a.sent, b.sent, c.sent) &&
         line(a.received, b.received, c.received) && line(a.reduced, b.reduced, c.reduced) &&
         line(a.copied, b.copied, c.copied) && line(a.remote_hops, b.remote_hops, c.remote_hops) &&
         line(a.remote_sent, b.remote_sent, c.remote_sent) &&
         line(a.remote_received, b.remote_received, c.remote_received) &&
         line(a.remote_reduced, b.remote_reduced, c.remote_reduced) &&
         line(a.remote_link, b.remote_link, c.remote_link) && line(a.published, b.published, c.published) &&
         line(a.host_net, b.host_net, c.host_net) && line(a.host_reduced, b.host_reduced, c.host_reduced) &&
         line(a.host_copied, b.host_copied, c.host_copied) && line(a.handshakes, b.handshakes, c.handshakes);
}

// The collectives with a keyed schedule for every rank (send/recv pair only two ranks' halves;
// all_to_all_v is priced as the all_to_all it generalizes).
bool has_keyed_schedules(Collective c) { return c <= Collective::Barrier; }

// The critical path in hops. Ranks are walked step by step in dependency order: a rank posts a
// step's sends when the step starts (its previous step has ended), and the step ends one hop
// after the later of its start and the departure of the last message it receives; a step that
// neither sends nor receives (a local copy) takes no hop. Messages between two ranks arrive in
// the order they were sent, as on every transport. So a ring all_reduce, whose ranks move in
// lockstep, takes one hop a step, and a pipelined chain takes depth + segments - 1: a rank's
// step t waits for its parent's step t+1, not for anything at the same step index.
// In one-shot calls a publication is the message: a step that reads peers' publications
// ends one hop after the latest of them, and publishing itself is a local copy. So a one-shot call
// takes one hop, whatever P.
// With a topology, a hop over a link between hosts weighs w.hop local hops: a message arrives
// one hop of its own link after it left, and a step that talks across hosts lasts at least one
// inter-host hop. Paths are compared by weight and counted in hops of each kind.
struct PathLength {
  double local = 0, remote = 0;
  double weight(double w) const { return local + w * remote; }
  PathLength plus(bool across) const { return {local + (across ? 0 : 1), remote + (across ? 1 : 0)}; }
};

PathLength critical_path(const std::vector<Schedule>& all, const Topology* topo, double w) {
  const int P = static_cast<int>(all.size());
  auto across = [&](int a, int b) { return topo && !topo->same_host(a, b); };
  auto later = [w](const PathLength& a, const PathLength& b) { return b.weight(w) > a.weight(w) ? b : a; };
  struct Link {
    std::vector<PathLength> departed;  // when each message left, in order
    size_t taken = 0;                  // messages received so far
  };
  std::vector<Link> links(static_cast<size_t>(P) * P);
  auto link = [&](int from, int to) -> Link& { return links[static_cast<size_t>(from) * P + to]; };
  std::vector<size_t> next(P, 0);        // each rank's next step
  std::vector<PathLength> ended(P);      // when its last finished step ended
  std::vector<uint8_t> posted(P, 0);     // the next step's sends are posted
  std::vector<PathLength> published(P);  // when a rank's one-shot publication is out
  std::vector<uint8_t> has_published(P, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      const Schedule& s = all[r];
      while (next[r] < s.num_steps()) {
        const uint32_t begin = s.step_begin(next[r]), end = s.step_end[next[r]];
        if (!posted[r]) {
          for (uint32_t i = begin; i < end; ++i) {
            if (s.ops[i].kind == OpKind::Send) link(r, s.ops[i].peer).departed.push_back(ended[r]);
            if (s.ops[i].kind == OpKind::Publish) published[r] = ended[r], has_published[r] = 1;
          }
          posted[r] = 1;
        }
        bool talks = false, talks_across = false, ready = true, reads_oneshot = false;
        PathLength last = ended[r], oneshot_from;
        for (uint32_t i = begin; i < end; ++i) {
          const Op& op = s.ops[i];
          if (op.kind == OpKind::Copy || op.kind == OpKind::Publish) continue;
          if (is_oneshot_read(op.kind)) {
            for (int q : {op.peer, op.lhs_peer}) {
              if (q < 0 || q == r) continue;
              if (!has_published[q])
                ready = false;
              else
                oneshot_from = reads_oneshot ? later(oneshot_from, published[q]) : published[q], reads_oneshot = true;
            }
            continue;
          }
          talks = true;
          talks_across |= across(r, op.peer);
          if (op.kind == OpKind::Send) continue;
          Link& l = link(op.peer, r);
          if (l.taken < l.departed.size())
            last = later(last, l.departed[l.taken].plus(across(op.peer, r)));
          else
            ready = false;
          ++l.taken;
        }
        if (!ready) {  // some message is not sent yet: give back what this step took, try later
          for (uint32_t i = begin; i < end; ++i)
            if (s.ops[i].kind == OpKind::Recv || s.ops[i].kind == OpKind::RecvReduce) --link(s.ops[i].peer, r).taken;
          break;
        }
        ended[r] = talks ? later(last, ended[r].plus(talks_across)) : last;
        // Publications already read cost nothing more: later one-shot steps read local memory.
        if (reads_oneshot) ended[r] = later(ended[r], oneshot_from.plus(false));
        ++next[r];
        posted[r] = 0;
        moved = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    RT_CHECK(next[r] == all[r].num_steps(), Error, "pricing: rank ", r, " waits forever at step ", next[r],
             " of its schedule");
  PathLength longest;
  for (int r = 0; r < P; ++r) longest = later(longest, ended[r]);
  return longest;
}

// Counts every rank's schedule of `key`; ops: adds the number of ops built.
ScheduleCounts count_built(const ScheduleKey& key, uint64_t* ops, LinkWeights w) {
  const int P = key.nranks;
  const Topology* topo = key.topo;
  std::vector<Schedule> all(P);
  ScheduleKey k = key;
  ScheduleCounts out;
  // The data term is the busiest rank's total, not a per-step maximum over ranks: in pipelined
  // schedules the ranks' step numbers do not line up in time (a tree node at depth d runs step
  // t while the root runs step t+d), so a per-step maximum would add up unrelated steps. Every
  // byte a rank moves goes through its one progress thread, so the rank that moves the most
  // bounds the call; the critical path adds the latency. Busiest means the most bytes of all
  // kinds together (a byte across hosts weighing w.byte); of two ranks that tie, the one that
  // reduces more (a reduction costs more than a copy), then the lower rank.
  double most = -1, most_reduced = -1, published = 0;
  // Per host label (rank 0's host alone without a topology): ranks, then the work of each kind.
  struct HostWork {
    int ranks = 0;
    double net = 0, reduced = 0, copied = 0;
  };
  std::vector<HostWork> hosts(topo ? topo->hosts.size() : 1);
  for (int r = 0; r < P; ++r) {
    k.rank = r;
    all[r] = build_schedule(k);
    if (ops) *ops += all[r].ops.size();
    ScheduleCounts mine;
    const Schedule& sched = all[r];
    mine.steps = static_cast<double>(sched.num_steps());
    for (size_t step = 0; step < sched.num_steps(); ++step) {
      double step_out = 0, step_in = 0;  // across hosts, this step
      for (uint32_t i = sched.step_begin(step); i < sched.step_end[step]; ++i) {
        const Op& op = sched.ops[i];
        const double n = static_cast<double>(op.count);
        const bool remote = topo && op.peer >= 0 && !topo->same_host(r, op.peer) && !is_oneshot_op(op.kind);
        switch (op.kind) {
          case OpKind::Send:
            mine.sent += n, mine.remote_sent += remote ? n : 0, step_out += remote ? n : 0;
            break;
          case OpKind::Recv:
            mine.received += n, mine.remote_received += remote ? n : 0, step_in += remote ? n : 0;
            break;
          case OpKind::RecvReduce:
            mine.reduced += n, mine.remote_reduced += remote ? n : 0, step_in += remote ? n : 0;
            break;
          case OpKind::ReducePublished:
            mine.reduced += n;
            break;
          case OpKind::Copy:
          case OpKind::Publish:
          case OpKind::CopyPublished:
            mine.copied += n;
            break;
        }
        if (op.kind == OpKind::Publish) published = std::max(published, n);
      }
      mine.remote_link += std::max(step_out, step_in);
    }
    out.steps = std::max(out.steps, mine.steps);
    HostWork& hw = hosts[topo ? topo->host_of[r] : 0];
    // Inside the host only: bytes across hosts are priced by the busiest rank's link term.
    ++hw.ranks, hw.net += mine.sent + mine.received - mine.remote_sent - mine.remote_received;
    hw.reduced += mine.reduced - mine.remote_reduced, hw.copied += mine.copied;
    const double remote = mine.remote_sent + mine.remote_received + mine.remote_reduced;
    const double total =
        mine.sent + mine.received + mine.reduced + mine.copied - remote + std::max(remote, w.byte * mine.remote_link);
    if (total > most || (total == most && mine.reduced > most_reduced)) {
      most = total, most_reduced = mine.reduced;
      const double steps = out.steps;
      out = mine;
      out.steps = steps;
    }
  }
  out.published = published;
  const HostWork* big = &hosts[0];
  for (const HostWork& h : hosts) {
    const double work = h.net + h.reduced + h.copied, most_work = big->net + big->reduced + big->copied;
    if (h.ranks > big->ranks || (h.ranks == big->ranks && work > most_work)) big = &h;
  }
  out.host_net = big->net, out.host_reduced = big->reduced, out.host_copied = big->copied;
  out.handshakes = P > 1 && !all[0].first_step_meets_neighbours ? 1 : 0;
  const PathLength path = critical_path(all, topo, w.hop);
  out.hops = path.local + path.remote;
  out.remote_hops = path.remote;
  return out;
}

ScheduleCounts lerp(const ScheduleCounts& a, const ScheduleCounts& b, double f) {
  auto mix = [f](double x, double y) { return x + (y - x) * f; };
  return {mix(a.steps, b.steps),
          mix(a.hops, b.hops),
          mix(a.sent, b.sent),
          mix(a.received, b.received),
          mix(a.reduced, b.reduced),
          mix(a.copied, b.copied),
          mix(a.remote_hops, b.remote_hops),
          mix(a.remote_sent, b.remote_sent),
          mix(a.remote_received, b.remote_received),
          mix(a.remote_reduced, b.remote_reduced),
          mix(a.remote_link, b.remote_link),
          mix(a.published, b.published),
          mix(a.host_net, b.host_net),
          mix(a.host_reduced, b.host_reduced),
          mix(a.host_copied, b.host_copied),
          mix(a.handshakes, b.handshakes)};
}

// The larger of a rank's buffers for a call whose ScheduleKey::count is `bytes` (all_to_all_v
// priced as the all_to_all it generalizes), from the collective's description.
double buffer_bytes(Collective c, int P, uint64_t bytes) {
  const BufferSizes b =
      collective_traits(c == Collective::AllToAllV ? Collective::AllToAll : c).sizes(bytes, P, /*is_root=*/true);
  return static_cast<double>(std::max(b.input, b.output));
}

// Seconds per hop and per byte of each op kind, for one call, over shared memory and between
// hosts (TCP).
struct Rates {
  double call, hop, net, reduce, copy;  // net: a byte sent or received
  double remote_hop, link;              // link: a byte one way over the link between hosts
  double share;                         // ranks per core on this host (1 when they have a core each)
  int cores;
};

// all_remote: every pair talks over TCP and the table has no topology to tell which (the old
// whole-call view: the slowest link sets the pace of every message).
Rates rates_for(const MachineCosts& m, double buffer, DataType dtype, bool all_remote) {
  // Per-byte costs for this working set (input and output), slowed down when the host's ranks
  // share fewer cores; half and float8 types reduce at float32's element rate (two and four times
  // its cost per byte).
  const double working_set = 2 * buffer;
  const double cold = working_set <= m.l2_bytes ? 0.0
                      : working_set >= m.l3_bytes
                          ? 1.0
                          : std::log(working_set / m.l2_bytes) / std::log(m.l3_bytes / m.l2_bytes);
  auto per_byte = [cold](double hot_Bps, double cold_Bps) { return (1 - cold) / hot_Bps + cold / cold_Bps; };
  const double share = m.local_ranks > m.cores ? static_cast<double>(m.local_ranks) / m.cores : 1.0;
  const double half = (dtype == DataType::Float16 || dtype == DataType::BFloat16)        ? 2.0
                      : (dtype == DataType::Float8E4M3 || dtype == DataType::Float8E5M2) ? 4.0
                                                                                         : 1.0;
  Rates r;
  r.share = share;
  r.cores = std::max(1, m.cores);
  r.call = m.call_s * share;  // the call's own CPU time is shared too
  r.copy = share * per_byte(m.copy_hot_Bps, m.copy_cold_Bps);
  r.reduce = share * half * per_byte(m.reduce_hot_Bps, m.reduce_cold_Bps);
  r.net = r.copy;  // on shared memory a message is a copy in and a copy out
  // Oversubscribed, a handoff waits for the peer's turn on a shared core: about one switch per
  // rank sharing it, there and back (fitted to P=4 on 2 cores).
  r.hop = m.local_ranks > m.cores ? 2 * share * m.switch_s : m.hop_s;
  // Between hosts the link sets the pace of messages and of what arrives on them.
  r.remote_hop = m.tcp_hop_s;
  r.link = 1.0 / m.tcp_Bps;
  if (all_remote) r.hop = r.remote_hop, r.net = std::max(r.net, r.link), r.reduce = std::max(r.reduce, r.link);
  return r;
}

// The busiest rank's bytes: those inside the host at CPU rates; those across hosts at the larger
// of their CPU time and the link's time one way (full duplex: see pricing.h).
double remote_seconds(const ScheduleCounts& k, const Rates& r) {
  const double cpu = (k.remote_sent + k.remote_received) * r.net + k.remote_reduced * r.reduce;
  return std::max(cpu, k.remote_link * r.link);
}

double data_seconds(const ScheduleCounts& k, const Rates& r) {
  const double local = (k.sent + k.received - k.remote_sent - k.remote_received) * r.net +
                       (k.reduced - k.remote_reduced) * r.reduce + k.copied * r.copy;
  if (r.share <= 1) return local + remote_seconds(k, r);
  // Ranks outnumber cores: the busiest rank's own work at a core's pace, or the host's work
  // over its cores, whichever is longer (the rates carry the share: take it out).
  const double host = (k.host_net * r.net + k.host_reduced * r.reduce + k.host_copied * r.copy) / r.cores;
  return std::max(local, host) / r.share + remote_seconds(k, r);
}

std::string us(double seconds) {  // 3 significant digits, whole microseconds from 1000
  char buf[32];
  std::snprintf(buf, sizeof(buf), seconds < 1e-3 ? "%.3g" : "%.0f", seconds * 1e6);
  return buf;
}

std::string size_text(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g %s", bytes, units[u]);
  return buf;
}

std::string count_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

// "sends 1 MiB (512 KiB across hosts), reduces 512 KiB", the kinds a rank does.
std::string data_text(const ScheduleCounts& k) {
  std::string out;
  const std::tuple<const char*, double, double> kinds[] = {{"sends", k.sent, k.remote_sent},
                                                           {"receives", k.received, k.remote_received},
                                                           {"reduces", k.reduced, k.remote_reduced},
                                                           {"copies", k.copied, 0}};
  for (const auto& [verb, bytes, remote] : kinds) {
    if (bytes <= 0) continue;
    out += str_cat(out.empty() ? "" : ", ", verb, " ", size_text(bytes));
    if (remote > 0) out += str_cat(" (", remote < bytes ? size_text(remote) : std::string("all"), " across hosts)");
  }
  // Full duplex: the link's load is the larger direction, step by step (pricing.h).
  if (k.remote_link > 0) out += str_cat("; the host link carries ", size_text(k.remote_link), " one way");
  return out.empty() ? "moves no data" : out;
}

}  // namespace

ScheduleCounts count_schedules(const ScheduleKey& key, LinkWeights w) { return count_built(key, nullptr, w); }

LinkWeights link_weights(const MachineCosts& m) {
  const Rates r = rates_for(m, m.l3_bytes, DataType::Float32, false);
  return {r.remote_hop / r.hop, std::max(1.0, r.link / r.net)};
}

void PriceTable::build(int P, const Topology* topo, LinkWeights w) {
  RT_CHECK(P >= 1, InvalidArgument, "pricing needs at least one rank, got ", P);
  RT_CHECK(!topo || topo->nranks() == P, InvalidArgument, "pricing: the topology has ", topo ? topo->nranks() : 0,
           " ranks, not ", P);
  P_ = P;
  topo_ = topo;
  handshake_remote_ = false;
  for (int r = 0; topo && r < P; ++r) handshake_remote_ |= !topo->same_host(r, (r + 1) % P);
  tables_.clear();
  std::memset(index_, 0, sizeof(index_));
  for (int ci = 0; ci < static_cast<int>(Collective::Count); ++ci) {
    const Collective c = static_cast<Collective>(ci);
    if (!has_keyed_schedules(c)) continue;
    std::vector<Algo> algos = supported_algos(c);
    if (has_oneshot_schedule(c)) algos.push_back(Algo::OneShot);
    if (topo)
      for (Algo a : hier_algos(c)) algos.push_back(a);
    for (Algo a : rank_order_algos(c)) algos.push_back(a);
    for (Algo a : algos) {
      Table t;
      // Element size 1: the counts come out in bytes, for every dtype. A dtype's schedule cuts
      // blocks at element boundaries, which moves a block edge by less than one element.
      const uint64_t segment = pipeline_segment(c, a, 1);
      const uint64_t linear_from = std::max<uint64_t>(4 * segment, 16 * static_cast<uint64_t>(P));
      uint64_t ops = 0;
      for (int i = 0; i < kGrid; ++i) {
        t.at[i] = count_built(ScheduleKey{c, a, P, 0, grid_bytes(i), 0, segment, -1, topo}, &ops, w);
        t.counted = i + 1;
        if (i >= 2 && grid_bytes(i - 2) >= linear_from && in_a_line(t.at[i - 2], t.at[i - 1], t.at[i])) break;
        if (i >= 2 && ops > kCountOpBudget) break;
      }
      tables_.push_back(t);
      index_[ci][static_cast<int>(a)] = static_cast<int8_t>(tables_.size());
    }
  }
  index_[static_cast<int>(Collective::AllToAllV)][static_cast<int>(Algo::Direct)] =
      index_[static_cast<int>(Collective::AllToAll)][static_cast<int>(Algo::Direct)];
}

bool PriceTable::has(Collective c, Algo a) const {
  return c < Collective::Count && a < Algo::Count && index_[static_cast<int>(c)][static_cast<int>(a)] > 0;
}

ScheduleCounts PriceTable::counts(Collective c, Algo a, uint64_t bytes, uint64_t* lo_bytes, uint64_t* hi_bytes) const {
  RT_CHECK(has(c, a), InvalidArgument, "the cost model has no schedule to price for ", collective_name(c), " with ",
           algo_name(a));
  const Table& t = tables_[index_[static_cast<int>(c)][static_cast<int>(a)] - 1];
  // Point i holds 2^(i-1) bytes, so bytes in [2^(i-1), 2^i) lie between points i and i+1.
  int lo = bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
  lo = std::min(lo, t.counted - 2);
  const double x0 = static_cast<double>(grid_bytes(lo)), x1 = static_cast<double>(grid_bytes(lo + 1));
  if (lo_bytes) *lo_bytes = grid_bytes(lo);
  if (hi_bytes) *hi_bytes = grid_bytes(lo + 1);
  return lerp(t.at[lo], t.at[lo + 1], (static_cast<double>(bytes) - x0) / (x1 - x0));
}

double predict(const MachineCosts& m, const PriceTable& table, Collective c, Algo a, uint64_t bytes, DataType dtype,
               std::string* formula) {
  const int P = table.nranks();
  const double buffer = buffer_bytes(c, P, bytes);
  const bool oneshot = a == Algo::OneShot;
  uint64_t lo = bytes, hi = bytes;
  const ScheduleCounts k = table.counts(c, a, bytes, &lo, &hi);
  // The executor's fingerprint handshake with its ring neighbours comes before the first step,
  // unless that step's messages meet them; in one-shot calls every call publishes, and that is
  // its handshake.
  const double handshake = oneshot ? 0 : k.handshakes;
  const Rates r = rates_for(m, buffer, dtype, !table.topology() && m.any_tcp);
  const double hops = handshake + k.hops;
  const double remote_hops = k.remote_hops + (table.handshake_remote() ? handshake : 0);
  const double data = data_seconds(k, r);
  const double publish = k.published * r.copy;  // the one-shot publication, before any read
  const double t = r.call + (hops - remote_hops) * r.hop + remote_hops * r.remote_hop + publish + data;
  if (formula) {  // explain() only: choosing must stay cheap (it runs on every call)
    std::string hop_terms =
        hops - remote_hops > 0 || remote_hops == 0 ? str_cat(count_text(hops - remote_hops), " x ", us(r.hop)) : "";
    if (remote_hops > 0)
      hop_terms += str_cat(hop_terms.empty() ? "" : " + ", count_text(remote_hops), " x ", us(r.remote_hop));
    const std::string sum =
        str_cat(" = ", us(r.call), " + ", hop_terms, " + ",
                publish > 0 ? str_cat(us(publish), " (publication) + ") : std::string(), us(data), " us");
    const std::string where =
        lo == bytes || hi == bytes
            ? std::string()
            : str_cat(bytes > hi ? " (linear past the counts at " : " (interpolated between the counts at ",
                      size_text(static_cast<double>(lo)), " and ", size_text(static_cast<double>(hi)), ")");
    *formula =
        str_cat("counted: ", count_text(k.steps), " steps, ", count_text(handshake), " handshake + ",
                count_text(k.hops), oneshot ? " hop (one-shot publications)" : " hops", " on the critical path",
                remote_hops > 0 ? str_cat(" (", count_text(remote_hops), " of ", count_text(hops), " across hosts)")
                                : std::string(),
                "; busiest rank ", data_text(k), where, sum);
  }
  return t;
}

std::vector<Candidate> price(const MachineCosts& m, const PriceTable& table, Collective c,
                             const std::vector<Algo>& algos, uint64_t bytes, DataType dtype) {
  std::vector<Candidate> out;
  for (Algo a : algos) {
    std::string formula;
    const double t = predict(m, table, c, a, bytes, dtype, &formula);
    out.push_back({a, t, formula});
  }
  return out;
}

}  // namespace ringtree
