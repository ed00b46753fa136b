// The cost model behind algo="auto": each candidate algorithm is priced as
//   time = call + hops x hop + bytes-on-the-critical-path x cost-per-byte
// with the machine's figures, which runtime/machine_probe measures on this host.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "ringtree/types.h"

namespace ringtree {

// The figures pricing uses. The machine probe (runtime/machine_probe.h) fills them on rank 0,
// and the communicator sends them to every rank as bytes, so this stays a plain struct.
struct MachineCosts {
  double call_s = 2.5e-6;       // per call: Python, validation, schedule lookup (fitted, P=1 from Python)
  double hop_s = 0.6e-6;        // one message handoff between two running ranks on one host
  double switch_s = 8e-6;       // a handoff when ranks outnumber cores: the peer must be scheduled
  double tcp_hop_s = 40e-6;     // one message over TCP (default, not measured)
  double tcp_Bps = 2e9;         // TCP stream bandwidth (default, not measured)
  double copy_hot_Bps = 20e9;   // memcpy, working set in cache
  double copy_cold_Bps = 8e9;   // memcpy, from memory
  double reduce_hot_Bps = 12e9; // float32 sum, output bytes per second, in cache
  double reduce_cold_Bps = 6e9;
  double l2_bytes = 1 << 20;    // working sets up to this use the in-cache figures ...
  double l3_bytes = 32 << 20;   // ... from this size the from-memory ones, and in between a log blend
  int32_t cores = 1;            // cores available to this host's ranks
  int32_t local_ranks = 1;      // ranks on this host
  int32_t any_tcp = 0;          // some pair talks over TCP
  int32_t measured = 0;         // 0: defaults, 1: measured now, 2: read from the cache file
};

struct Candidate {
  Algo algo;
  double seconds;
  std::string terms;  // the formula with this call's numbers, for explain()
};

// The predicted seconds of one algorithm; the formula with this call's numbers if asked.
double predict(const MachineCosts& m, Collective c, Algo a, int P, uint64_t block_bytes, DataType dtype,
               uint64_t segment_bytes, std::string* formula);

// Prices `algos` for a call whose per-rank block is block_bytes (the fingerprint count times
// the element size) over P ranks. segment_bytes: the pipeline segment of tree/chain schedules.
std::vector<Candidate> price(const MachineCosts& m, Collective c, const std::vector<Algo>& algos, int P,
                             uint64_t block_bytes, DataType dtype, uint64_t segment_bytes);

}  // namespace ringtree
