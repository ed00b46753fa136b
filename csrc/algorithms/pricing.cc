// Pricing of a call for the cost model: see algorithms/pricing.h.
#include "algorithms/pricing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include "common/check.h"

namespace ringtree {

namespace {

// Microseconds with 3 significant digits, for the formulas explain() prints.
std::string us(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", seconds * 1e6);
  return buf;
}

}  // namespace

double predict(const MachineCosts& m, Collective c, Algo a, int P, uint64_t block_bytes, DataType dtype,
               uint64_t segment_bytes, std::string* formula) {
  const double B = static_cast<double>(block_bytes);
  const double n = (c == Collective::ReduceScatter || c == Collective::AllGather || c == Collective::AllToAll ||
                    c == Collective::Gather || c == Collective::Scatter) ? B * P : B;
  // Per-byte costs for this working set (input and output), slowed down when the host's ranks
  // share fewer cores; half types reduce at float32's element rate (twice its cost per byte).
  const double working_set = 2 * n;
  const double cold = working_set <= m.l2_bytes ? 0.0
                      : working_set >= m.l3_bytes ? 1.0
                      : std::log(working_set / m.l2_bytes) / std::log(m.l3_bytes / m.l2_bytes);
  auto per_byte = [cold](double hot_Bps, double cold_Bps) { return (1 - cold) / hot_Bps + cold / cold_Bps; };
  const double share = m.local_ranks > m.cores ? static_cast<double>(m.local_ranks) / m.cores : 1.0;
  const double half = (dtype == DataType::Float16 || dtype == DataType::BFloat16) ? 2.0 : 1.0;
  double cp = share * per_byte(m.copy_hot_Bps, m.copy_cold_Bps);
  double rd = share * half * per_byte(m.reduce_hot_Bps, m.reduce_cold_Bps);
  // Oversubscribed, a handoff waits for the peer's turn on a shared core: about one switch
  // per rank sharing it, there and back (fitted to P=4 on 2 cores).
  double hop = m.local_ranks > m.cores ? 2 * share * m.switch_s : m.hop_s;
  if (m.any_tcp) {
    hop = m.tcp_hop_s;
    cp = std::max(cp, 1.0 / m.tcp_Bps);
  }
  const double depth = std::ceil(std::log2(std::max(2, P)));       // binary tree depth
  const double children = std::min(2, P - 1);
  const double segments = segment_bytes ? std::max(1.0, std::ceil(n / static_cast<double>(segment_bytes))) : 1.0;
  const double steps = P - 1;

  {
    double hops = 1, bytes_cost = 0;  // hops: message latencies on the critical path (1: handshake)
    const char* form = "";
    switch (c) {
      case Collective::AllReduce:
        if (a == Algo::Ring) {
          hops += 2 * steps;
          bytes_cost = steps / P * n * (cp + rd) + steps / P * n * 2 * cp;
          form = "2(P-1) hops + (P-1)/P n (copy+reduce) + (P-1)/P n 2 copy";
        } else if (a == Algo::Tree) {
          hops += 2 * (depth + segments - 1);
          bytes_cost = n * (children * rd + children * cp + (P > 2 ? 2 * cp : cp));
          form = "2(depth+segments-1) hops + n (children reduce + (children+2) copy)";
        } else if (a == Algo::OneShot) {
          bytes_cost = n * cp + n * steps * rd;
          form = "1 hop + n copy + (P-1) n reduce";
        }
        break;
      case Collective::ReduceScatter:
        if (a == Algo::Ring) { hops += steps; bytes_cost = steps * B * (cp + rd); form = "(P-1) hops + (P-1) block (copy+reduce)"; }
        else if (a == Algo::OneShot) { bytes_cost = n * cp + steps * B * rd; form = "1 hop + n copy + (P-1) block reduce"; }
        break;
      case Collective::AllGather: case Collective::AllToAll:
        if (a == Algo::Ring || a == Algo::Direct) { hops += steps; bytes_cost = steps * B * 2 * cp + B * cp; form = "(P-1) hops + (2P-1) block copy"; }
        else if (a == Algo::OneShot) {
          bytes_cost = (c == Collective::AllGather ? B : n) * cp + n * cp;
          form = "1 hop + input copy + n copy";
        }
        break;
      case Collective::Broadcast: case Collective::Reduce: {
        const double op_cost = c == Collective::Reduce ? rd : cp;  // what a receiver does with a byte
        if (a == Algo::Tree) {
          hops += depth + segments - 1;
          bytes_cost = n * (P > 2 ? op_cost + children * cp : std::max(op_cost, cp));
          form = "(depth+segments-1) hops + n (receive + children copies)";
        } else if (a == Algo::Ring) {
          hops += steps + segments - 1;
          bytes_cost = n * (P > 2 ? op_cost + cp : std::max(op_cost, cp));
          form = "(P-1+segments-1) hops + n (receive + copy)";
        } else if (a == Algo::OneShot) {
          bytes_cost = n * cp + n * (c == Collective::Reduce ? steps * rd : cp);
          form = c == Collective::Reduce ? "1 hop + n copy + (P-1) n reduce" : "1 hop + 2 n copy";
        }
        break;
      }
      case Collective::Barrier:
        if (a == Algo::Direct) { hops += depth; form = "1 + ceil(log2 P) hops"; }
        else if (a == Algo::OneShot) { form = "1 hop"; }
        break;
      default:
        hops += steps;
        bytes_cost = steps * B * 2 * cp;
        form = "(P-1) hops + (P-1) block 2 copy";
        break;
    }
    if (P == 1) { hops = 0; bytes_cost = n * cp; form = "local copy"; }
    const double call = m.call_s * share;  // the call's own CPU time is shared too
    const double t = call + hops * hop + bytes_cost;
    // Only explain() wants the formula; choosing must stay cheap (it runs on every call).
    if (formula) *formula = str_cat(form, " = ", us(call), " + ", hops, " x ", us(hop), " + ", us(bytes_cost), " us");
    return t;
  }
}

std::vector<Candidate> price(const MachineCosts& m, Collective c, const std::vector<Algo>& algos, int P,
                             uint64_t block_bytes, DataType dtype, uint64_t segment_bytes) {
  std::vector<Candidate> out;
  for (Algo a : algos) {
    std::string formula;
    const double t = predict(m, c, a, P, block_bytes, dtype, segment_bytes, &formula);
    out.push_back({a, t, formula});
  }
  return out;
}

}  // namespace ringtree
