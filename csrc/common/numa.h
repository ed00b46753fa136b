// Where a rank runs in NUMA terms, and keeping shared memory on its reader's node.
//
// A shared-memory ring is read by one rank (the owner of the segment it lives in) and written by
// another. On a multi-socket host the reader touches every byte twice per lap (it reduces or
// copies out of the ring), so the ring's pages belong on the reader's node: each owner asks for
// its node (MPOL_PREFERRED on the segment, a policy of the shared object that every peer's
// mapping then follows) before it allocates the pages, and allocates them itself, so they are
// first touched by their reader. A one-shot slot has one writer (the owner) and every other rank
// as a reader, so no node suits all of them; it stays with its writer, in the same segment.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace ringtree {

struct NumaPlacement {
  int node = -1;             // this rank's node; -1 where the kernel reports none
  bool pinned = false;       // every CPU this rank may run on is on `node`; else `node` is where it runs now
  int nodes_on_host = 0;     // nodes with CPUs that the kernel reports
  std::vector<int> allowed;  // the nodes of the CPUs this rank may run on
};

// Reads the node of each CPU from `node_dir` (/sys/devices/system/node: nodeN/cpulist) and this
// process's allowed and current CPU.
NumaPlacement numa_placement(const std::string& node_dir);

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; malformed text gives an empty list.
std::vector<int> parse_cpu_list(const std::string& text);

// Asks for [addr, addr + bytes) on `node` (MPOL_PREFERRED). "" when done, else why not.
std::string prefer_node(void* addr, size_t bytes, int node);

// "node 0 (every CPU this rank may run on is on it; 2 node(s) on this host)" and the like.
std::string describe(const NumaPlacement& p);

}  // namespace ringtree
