#include "runtime/cost_model.h"

#include <pthread.h>
#include <sys/stat.h>
#include <sched.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include "common/check.h"
#include "common/cpu_relax.h"
#include "common/env.h"
#include "kernels/host/reduce.h"

namespace ringtree {

namespace {

constexpr int kCacheVersion = 2;
// The executor's own work per message (header check, ring bookkeeping) on top of the
// cache-line round trip that the thread ping-pong measures; fitted from P=2 bench runs.
constexpr double kHandoffOverhead_s = 0.3e-6;

// Microseconds with 3 significant digits, for the formulas explain() prints.
std::string us(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", seconds * 1e6);
  return buf;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Block = std::unique_ptr<uint8_t, FreeDeleter>;
Block alloc_block(size_t bytes) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!p) throw std::bad_alloc();
  std::memset(p, 1, bytes);  // fault the pages in before timing
  return Block(p);
}

// Copy and reduce rates of data that another core has just written, as a receiver sees it:
// in cache, the source lines move between cores; from memory, sizes beyond any cache.
void measure_bandwidths(MachineCosts& m, bool two_cores) {
  const ReduceFn sum = reduce_fn(DataType::Float32, ReduceOp::Sum);
  for (size_t bytes : {size_t{128} << 10, size_t{16} << 20}) {
    const bool in_cache = bytes < (1 << 20);
    Block a = alloc_block(bytes), b = alloc_block(bytes), c = alloc_block(bytes);
    const int reps = in_cache ? 20 : 3;
    // A writer thread refreshes the source before each timed pass (skipped on one core).
    auto fresh_source = [&] {
      if (!two_cores || !in_cache) return;
      std::thread writer([&] { std::memset(a.get(), static_cast<int>(bytes & 0x7f), bytes); });
      writer.join();
    };
    auto timed = [&](auto&& work) {
      double best = 1e30;
      for (int i = 0; i <= reps; ++i) {
        fresh_source();
        const double t0 = now_s();
        work();
        if (i > 0) best = std::min(best, now_s() - t0);  // the first pass warms up
      }
      return static_cast<double>(bytes) / std::max(best, 1e-9);
    };
    const double copy = timed([&] { std::memcpy(b.get(), a.get(), bytes); });
    const double reduce = timed([&] { sum(c.get(), a.get(), b.get(), bytes / 4); });
    (in_cache ? m.copy_hot_Bps : m.copy_cold_Bps) = copy;
    (in_cache ? m.reduce_hot_Bps : m.reduce_cold_Bps) = reduce;
  }
}

// Half a round trip of a flag between two threads: on two cores, the cache-line handoff;
// pinned to one core and yielding, a context switch.
double ping_pong_s(bool same_core, int round_trips) {
  std::atomic<int> turn{0};
  auto pin = [&](std::thread& t, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(t.native_handle(), sizeof(set), &set);
  };
  auto wait_for = [&](int want) {
    while (turn.load(std::memory_order_acquire) != want) {
      if (same_core) sched_yield();
      else cpu_relax();
    }
  };
  double best = 1e30;
  for (int trial = 0; trial < 3; ++trial) {
    turn.store(0);
    double t0 = 0, t1 = 0;
    std::thread echo([&] {
      for (int i = 0; i < round_trips; ++i) {
        wait_for(1);
        turn.store(0, std::memory_order_release);
      }
    });
    std::thread serve([&] {
      t0 = now_s();
      for (int i = 0; i < round_trips; ++i) {
        turn.store(1, std::memory_order_release);
        wait_for(0);
      }
      t1 = now_s();
    });
    cpu_set_t mine;
    if (same_core && sched_getaffinity(0, sizeof(mine), &mine) == 0) {
      int first = 0;
      while (first < CPU_SETSIZE && !CPU_ISSET(first, &mine)) ++first;
      pin(echo, first);
      pin(serve, first);
    }
    serve.join();
    echo.join();
    best = std::min(best, (t1 - t0) / round_trips / 2);
  }
  return best;
}

int online_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string cache_path(const std::string& host) {
  std::string dir = env_str("RINGTREE_CACHE_DIR", "");
  if (dir == "off") return "";
  if (dir.empty()) {
    const std::string xdg = env_str("XDG_CACHE_HOME", ""), home = env_str("HOME", "");
    if (xdg.empty() && home.empty()) return "";
    dir = (xdg.empty() ? home + "/.cache" : xdg) + "/ringtree";
  }
  std::string safe;
  for (char ch : host) safe += std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '.' ? ch : '_';
  return str_cat(dir, "/machine-v", kCacheVersion, "-", safe, ".txt");
}

// The measured fields, in file order.
struct Field { const char* name; double MachineCosts::*value; };
const Field kFields[] = {{"hop_s", &MachineCosts::hop_s}, {"switch_s", &MachineCosts::switch_s},
                         {"copy_hot_Bps", &MachineCosts::copy_hot_Bps}, {"copy_cold_Bps", &MachineCosts::copy_cold_Bps},
                         {"reduce_hot_Bps", &MachineCosts::reduce_hot_Bps},
                         {"reduce_cold_Bps", &MachineCosts::reduce_cold_Bps}};

bool read_cache(const std::string& path, MachineCosts& m) {
  if (path.empty()) return false;
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  int found = 0;
  char name[64];
  double value;
  while (std::fscanf(f, "%63s %lf", name, &value) == 2)
    for (const Field& fld : kFields)
      if (std::strcmp(name, fld.name) == 0 && std::isfinite(value) && value > 0) { m.*fld.value = value; ++found; }
  std::fclose(f);
  return found == static_cast<int>(sizeof(kFields) / sizeof(kFields[0]));
}

void write_cache(const std::string& path, const MachineCosts& m) {
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  // Create each level; a failure just means no cache.
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  const std::string tmp = str_cat(path, ".", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  for (const Field& fld : kFields) std::fprintf(f, "%s %.6g\n", fld.name, m.*fld.value);
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

// Largest cache of each level that cpu0 sees, from sysfs; 0 when unknown.
static double cache_size(int level) {
  double best = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = str_cat("/sys/devices/system/cpu/cpu0/cache/index", index, "/");
    FILE* f = std::fopen((dir + "level").c_str(), "r");
    if (!f) break;
    int got = 0;
    const bool ok = std::fscanf(f, "%d", &got) == 1;
    std::fclose(f);
    if (!ok || got != level) continue;
    f = std::fopen((dir + "size").c_str(), "r");
    if (!f) continue;
    double kib = 0;
    if (std::fscanf(f, "%lfK", &kib) == 1) best = std::max(best, kib * 1024);
    std::fclose(f);
  }
  return best;
}

MachineCosts measure_machine(const std::string& host) {
  MachineCosts m;
  m.cores = online_cores();
  if (cache_size(2) > 0) m.l2_bytes = cache_size(2);
  if (cache_size(3) > m.l2_bytes) m.l3_bytes = cache_size(3);
  const std::string path = cache_path(host);
  if (read_cache(path, m)) {
    m.measured = 2;
    return m;
  }
  measure_bandwidths(m, m.cores >= 2);
  if (m.cores >= 2) m.hop_s = ping_pong_s(false, 2000) + kHandoffOverhead_s;
  m.switch_s = ping_pong_s(true, 300) + kHandoffOverhead_s;
  m.measured = 1;
  write_cache(path, m);
  return m;
}

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
