// The cost model behind algo="auto" prices the schedules themselves (an algorithm is a schedule,
// schedule.h): what a call costs is counted from the ops that build_schedule() produces for
// every rank, not written down per algorithm, so a price cannot drift from the schedule it
// prices. A call is priced as
//   time = call + hops x hop + sum over op kinds of (bytes of that kind x seconds per byte)
// where
//   hops   messages on the critical path: the longest chain of steps that wait on each other,
//          one hop per step that sends or receives, plus the executor's fingerprint handshake
//          where the schedule needs one;
//   bytes  what the busiest rank sends, receives, receives-and-reduces and copies locally.
// A link between hosts carries both directions at once (full duplex), and its bytes move while the
// rank's CPU handles them: the bytes across hosts cost the larger of their CPU time and the link's
// time, which counts, step by step, the larger of what the step sends and what it receives across
// hosts (a ring's step sends and receives at once; a tree's reduce and broadcast phases use one
// direction each, in turn). Every rank drives its own messages, so the local ranks of a host
// crossing to other hosts at once (hier's shards) run in parallel, each priced on its own stream.
// With a topology (which ranks share a host), hops and bytes are split by link: a step with a
// message to or from another host costs an inter-host hop (TCP), and the bytes those messages
// carry move at TCP's rate; the rest at shared memory's. The critical path and the busiest rank
// are the slowest under those weights.
// The seconds per hop and per byte come from the machine figures (MachineCosts), which the
// machine probe (runtime/machine_probe.h) measures on rank 0 and every rank adopts.
//
// Counting builds every rank's schedule, so it runs once per communicator (PriceTable::build),
// on a geometric grid of sizes; a call is priced from that table without allocating.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>
#include "algorithms/schedule.h"

namespace ringtree {

// The figures pricing uses. The machine probe fills them on rank 0, and the communicator sends
// them to every rank as bytes, so this stays a plain struct.
struct MachineCosts {
  double call_s = 2.5e-6;        // per call: Python, validation, schedule lookup (fitted, P=1 from Python)
  double hop_s = 0.6e-6;         // one message handoff between two running ranks on one host
  double switch_s = 8e-6;        // a handoff when ranks outnumber cores: the peer must be scheduled
  double tcp_hop_s = 40e-6;      // one message over TCP (default, not measured)
  double tcp_Bps = 2e9;          // TCP stream bandwidth (default, not measured)
  double copy_hot_Bps = 20e9;    // memcpy, working set in cache
  double copy_cold_Bps = 8e9;    // memcpy, from memory
  double reduce_hot_Bps = 12e9;  // float32 sum, output bytes per second, in cache
  double reduce_cold_Bps = 6e9;
  double l2_bytes = 1 << 20;   // working sets up to this use the in-cache figures ...
  double l3_bytes = 32 << 20;  // ... from this size the from-memory ones, and in between a log blend
  int32_t cores = 1;           // cores available to this host's ranks
  int32_t local_ranks = 1;     // ranks on this host
  int32_t any_tcp = 0;         // some pair talks over TCP
  int32_t measured = 0;        // 0: defaults, 1: measured now, 2: read from the cache file,
                               // 3: measured now beside other work (not cached)
};

// What a collective's schedules do, counted over every rank's schedule. Amounts are in
// elements of the key (the price table counts 1-byte elements, so bytes). Doubles, because
// the table interpolates between the sizes it counted.
struct ScheduleCounts {
  double steps = 0;     // the most steps any one rank's schedule has
  double hops = 0;      // the critical path in messages (without the executor's handshake)
  double sent = 0;      // the busiest rank: elements it sends,
  double received = 0;  // receives into place,
  double reduced = 0;   // receives and reduces into place,
  double copied = 0;    // and copies locally
  // Of the above, over links between hosts (zero without a topology).
  double remote_hops = 0, remote_sent = 0, remote_received = 0, remote_reduced = 0;
  // What the link must carry one way for the busiest rank: over its steps, the larger of what a
  // step sends and what it receives (and reduces) across hosts.
  double remote_link = 0;
  // One-shot: the largest publication of any rank. A reader starts only once the whole
  // publication is out (its generation is stored after the copy), so, unlike a message, whose
  // pieces the receiver takes while the sender still writes, that copy is on the critical path.
  double published = 0;
  // The busiest host (most ranks; the most bytes among those): what all its ranks together send
  // or receive, reduce and copy inside the host (bytes across hosts go by the link term). When a host's ranks outnumber
  // its cores they share the cores, so a call takes at least this work over the cores, as well as the busiest rank's
  // own work (a rank runs on one core at a time). Ranks with equal work (a ring) give the same bound either way; a
  // tree's leaves and a chain's ends, which do less, leave cores to the others.
  double host_net = 0, host_reduced = 0, host_copied = 0;
  // The executor's fingerprint handshake before the first step: 1, or 0 where the first step's
  // messages meet both ring neighbours and carry the fingerprint (Schedule::first_step_meets_neighbours).
  double handshakes = 0;
};

// How much an inter-host hop and byte weigh against a local one, to find the critical path and
// the busiest rank when hops and bytes are split by link.
struct LinkWeights {
  double hop = 1, byte = 1;
};
// The weights of the machine's figures (a local hop as rates_for prices it, oversubscription
// included).
LinkWeights link_weights(const MachineCosts& m);

// Builds the schedule of `key` for every rank (key.rank is ignored) and counts it; with key.topo,
// split by link (flat algorithms too: their schedules ignore the topology).
ScheduleCounts count_schedules(const ScheduleKey& key, LinkWeights w = {});

// The counts of every scheduled (collective, algorithm) at one P, on a grid of sizes: 0 bytes,
// then every power of two from 1 byte to 16 GiB (2^31 eight-byte elements).
class PriceTable {
 public:
  static constexpr int kGrid = 36;
  // Counts the schedules for P ranks (rooted collectives at root 0; a tree's shape relative to
  // its root is the same for every root). Deterministic: every rank builds the same table.
  // topo: the hosts (kept by pointer, must outlive the table); with it, the counts are split by
  // link and the hierarchical algorithms are counted too.
  void build(int P, const Topology* topo = nullptr, LinkWeights w = {});
  const Topology* topology() const { return topo_; }
  // The executor's handshake goes to the next rank: whether some rank's crosses hosts.
  bool handshake_remote() const { return handshake_remote_; }
  int nranks() const { return P_; }
  // The counts for a call of `bytes` (ScheduleKey::count times the element size): linear in
  // bytes between the two grid points around it (hops are piecewise constant in the number of
  // segments, bytes linear), and beyond the largest point counted, extended along the last
  // two. Allocates nothing. lo/hi, if asked: the grid sizes used.
  ScheduleCounts counts(Collective c, Algo a, uint64_t bytes, uint64_t* lo = nullptr, uint64_t* hi = nullptr) const;
  bool has(Collective c, Algo a) const;

 private:
  struct Table {
    std::array<ScheduleCounts, kGrid> at;
    int counted = 0;  // grid points [0, counted) were counted; larger calls extend the last two
  };
  int P_ = 0;
  const Topology* topo_ = nullptr;
  bool handshake_remote_ = false;
  std::vector<Table> tables_;
  int8_t index_[static_cast<int>(Collective::Count)][static_cast<int>(Algo::Count)] = {};  // table + 1, 0: none
};

struct Candidate {
  Algo algo;
  double seconds;
  std::string terms;  // what was counted, with this call's numbers, for explain()
};

// The predicted seconds of algorithm `a` for a call of `bytes` per rank (ScheduleKey::count
// times the element size) on the table's P ranks; allocates nothing unless `formula` is asked
// for (explain() asks; choose_algo(), on every call, does not).
double predict(const MachineCosts& m, const PriceTable& table, Collective c, Algo a, uint64_t bytes, DataType dtype,
               std::string* formula);

// predict() for each of `algos`, with the formulas.
std::vector<Candidate> price(const MachineCosts& m, const PriceTable& table, Collective c,
                             const std::vector<Algo>& algos, uint64_t bytes, DataType dtype);

}  // namespace ringtree
