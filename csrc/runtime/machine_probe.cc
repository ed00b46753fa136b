// The machine probe: see runtime/machine_probe.h.
#include "runtime/machine_probe.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>
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
#include "common/settings.h"
#include "kernels/host/reduce.h"
#include "runtime/private_files.h"

namespace ringtree {

namespace {

constexpr int kCacheVersion = 2;
// The executor's own work per message (header check, ring bookkeeping) on top of the
// cache-line round trip that the thread ping-pong measures; fitted from P=2 bench runs.
constexpr double kHandoffOverhead_s = 0.3e-6;

// A probe whose threads got less than this share of the CPU time they asked for ran beside other
// work; its figures are used for this run but not cached, so a moment of load is not kept for good.
constexpr double kQuietShare = 0.7;
constexpr int kProbeTries = 3;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The share of the CPU time that `threads` running threads would get over a section's wall time
// that the process got: about 1 on a machine with cores to spare; less when others ran on them
// (other processes, or a hypervisor's steal time, which the kernel leaves out of a task's time).
class CpuShare {
 public:
  double of(int threads) const {
    const double wall = now_s() - wall0_;
    return wall > 0 ? (process_cpu_s() - cpu0_) / (wall * threads) : 1.0;
  }

 private:
  double wall0_ = now_s(), cpu0_ = process_cpu_s();
};

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
      if (same_core)
        sched_yield();
      else
        cpu_relax();
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
  std::string dir = setting_str(Setting::CacheDir);
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
struct Field {
  const char* name;
  double MachineCosts::* value;
};
const Field kFields[] = {{"hop_s", &MachineCosts::hop_s},
                         {"switch_s", &MachineCosts::switch_s},
                         {"copy_hot_Bps", &MachineCosts::copy_hot_Bps},
                         {"copy_cold_Bps", &MachineCosts::copy_cold_Bps},
                         {"reduce_hot_Bps", &MachineCosts::reduce_hot_Bps},
                         {"reduce_cold_Bps", &MachineCosts::reduce_cold_Bps}};

// A cache file another user could have planted or may rewrite is ignored (private_files.h).
bool read_cache(const std::string& path, MachineCosts& m) {
  std::string text;
  if (path.empty() || !read_private_file(path, 4096, text)) return false;
  int found = 0;
  char name[64];
  double value;
  int used = 0;
  for (const char* p = text.c_str(); std::sscanf(p, "%63s %lf%n", name, &value, &used) == 2; p += used)
    for (const Field& fld : kFields)
      if (std::strcmp(name, fld.name) == 0 && std::isfinite(value) && value > 0) {
        m.*fld.value = value;
        ++found;
      }
  return found == static_cast<int>(sizeof(kFields) / sizeof(kFields[0]));
}

void write_cache(const std::string& path, const MachineCosts& m) {
  if (path.empty()) return;
  std::string text;
  for (const Field& fld : kFields) {
    char line[96];
    std::snprintf(line, sizeof(line), "%s %.6g\n", fld.name, m.*fld.value);
    text += line;
  }
  const size_t slash = path.rfind('/');
  try {
    write_private_file(path.substr(0, slash), path.substr(slash + 1), text);
  } catch (const Error&) {
    // No cache then (a directory of another user's, no space): the next run measures again.
  }
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

// One measurement of every figure; false when a part of it did not get the CPU it needed.
bool measure_once(MachineCosts& m) {
  const bool two_cores = m.cores >= 2;
  double least_share = 1.0;
  {
    const CpuShare share;
    measure_bandwidths(m, two_cores);  // one thread at a time
    least_share = std::min(least_share, share.of(1));
  }
  if (two_cores) {
    const CpuShare share;
    m.hop_s = ping_pong_s(false, 2000) + kHandoffOverhead_s;  // two spinning threads
    least_share = std::min(least_share, share.of(2));
  }
  m.switch_s = ping_pong_s(true, 300) + kHandoffOverhead_s;  // yields: any share is right
  return least_share >= kQuietShare;
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
  // Load only slows a probe, so the best of the tries is the nearest to the machine's own figures.
  m.measured = 1;
  for (int attempt = 0; attempt < kProbeTries; ++attempt) {
    MachineCosts trial = m;
    const bool quiet = measure_once(trial);
    if (attempt == 0) {
      m = trial;
    } else {
      for (double MachineCosts::* time : {&MachineCosts::hop_s, &MachineCosts::switch_s})
        m.*time = std::min(m.*time, trial.*time);
      for (double MachineCosts::* rate : {&MachineCosts::copy_hot_Bps, &MachineCosts::copy_cold_Bps,
                                          &MachineCosts::reduce_hot_Bps, &MachineCosts::reduce_cold_Bps})
        m.*rate = std::max(m.*rate, trial.*rate);
    }
    if (quiet) {
      write_cache(path, m);
      return m;
    }
  }
  m.measured = 3;  // measured beside other work: used now, measured again next time
  return m;
}

}  // namespace ringtree
