// The machine probe: measures this host's figures for the cost model (copy and reduce
// bandwidth in and out of cache, the latency of one message handoff between cores, and of a
// context switch when ranks outnumber cores) in about 20 ms, and caches them per host on disk.
// Pricing (algorithms/pricing.h) only reads the figures; rank 0 measures and every rank adopts
// its figures, so every rank prices alike and chooses alike.
#pragma once
#include <string>
#include "algorithms/pricing.h"

namespace ringtree {

// Measures this machine (about 20 ms) or reads the per-host cache file; its settings are rows of
// common/settings.def.
MachineCosts measure_machine(const std::string& host);

}  // namespace ringtree
