#include "common/numa.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include "common/check.h"

namespace ringtree {

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream ranges(text);
  std::string range;
  while (std::getline(ranges, range, ',')) {
    range.erase(
        std::remove_if(range.begin(), range.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
        range.end());
    if (range.empty()) continue;
    char* end = nullptr;
    const long first = std::strtol(range.c_str(), &end, 10);
    long last = first;
    if (*end == '-') last = std::strtol(end + 1, &end, 10);
    if (*end != '\0' || first < 0 || last < first || last >= CPU_SETSIZE) return {};
    for (long c = first; c <= last; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

NumaPlacement numa_placement(const std::string& node_dir) {
  NumaPlacement p;
  std::map<int, int> node_of_cpu;
  if (DIR* dir = opendir(node_dir.c_str())) {
    while (dirent* e = readdir(dir)) {
      int node = -1;
      char tail = 0;
      if (std::sscanf(e->d_name, "node%d%c", &node, &tail) != 1 || node < 0) continue;
      std::ifstream f(node_dir + "/" + e->d_name + "/cpulist");
      std::string text;
      if (!std::getline(f, text)) continue;
      const std::vector<int> cpus = parse_cpu_list(text);
      if (cpus.empty()) continue;  // a memory-only node
      ++p.nodes_on_host;
      for (int c : cpus) node_of_cpu[c] = node;
    }
    closedir(dir);
  }
  if (node_of_cpu.empty()) return p;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      auto it = node_of_cpu.find(c);
      if (CPU_ISSET(c, &mask) && it != node_of_cpu.end()) p.allowed.push_back(it->second);
    }
  }
  std::sort(p.allowed.begin(), p.allowed.end());
  p.allowed.erase(std::unique(p.allowed.begin(), p.allowed.end()), p.allowed.end());
  if (p.allowed.size() == 1) {
    p.node = p.allowed[0];
    p.pinned = true;
  } else {
    const int cpu = sched_getcpu();
    auto it = node_of_cpu.find(cpu);
    p.node = it != node_of_cpu.end() ? it->second : (p.allowed.empty() ? -1 : p.allowed[0]);
  }
  return p;
}

std::string prefer_node(void* addr, size_t bytes, int node) {
#if defined(SYS_mbind)
  if (node < 0) return "no node known";
  constexpr int kPreferred = 1;  // MPOL_PREFERRED (linux/mempolicy.h), without libnuma
  constexpr size_t kBits = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask(static_cast<size_t>(node) / kBits + 1, 0);
  mask[static_cast<size_t>(node) / kBits] |= 1ul << (static_cast<size_t>(node) % kBits);
  if (syscall(SYS_mbind, addr, bytes, kPreferred, mask.data(), mask.size() * kBits + 1, 0) == 0) return "";
  return str_cat("mbind: ", std::strerror(errno));
#else
  (void)addr, (void)bytes, (void)node;
  return "mbind is not available";
#endif
}

std::string describe(const NumaPlacement& p) {
  if (p.node < 0) return "unknown (the kernel reports no NUMA nodes)";
  if (p.pinned)
    return str_cat("node ", p.node, " (every CPU this rank may run on is on it; ", p.nodes_on_host,
                   " node(s) on this host)");
  std::string nodes;
  for (int n : p.allowed) nodes += (nodes.empty() ? "" : ",") + std::to_string(n);
  return str_cat("node ", p.node, " (where it runs now; it may run on node(s) ", nodes, " of ", p.nodes_on_host, ")");
}

}  // namespace ringtree
