// The CUDA-on-CPU layer's engine (see cuda_on_cpu.h): blocks on OS threads, CUDA threads as
// fibers, the block barrier, yields and naps.
//
// Fibers: each OS thread that runs blocks keeps a pool of fibers, each a coroutine on a stack of
// its own that loops "run the current kernel for my thread index; report that I returned". A
// fiber is started once with makecontext and afterwards switched with _setjmp/_longjmp, which
// save and restore registers only (swapcontext would also make a system call for the signal
// mask on every switch). Every switch goes through the block's scheduler: a fiber that waits at
// a barrier, yields, naps or returns jumps back to it, and the scheduler picks the next one.
//
// _FORTIFY_SOURCE turns longjmp into a checked version that refuses to jump to another stack,
// which is the whole point here: it is off for this file.
#undef _FORTIFY_SOURCE
#include "kernels/cuda/standin/cuda_on_cpu.h"
#include "kernels/cuda/scoped_sync.cuh"
#include <cxxabi.h>
#include <dlfcn.h>
#include <sched.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "common/settings.h"

namespace ringtree::cuda_on_cpu {

thread_local Coords coords;
thread_local unsigned yield_percent = 0;

namespace {

constexpr size_t kStackBytes = 128 << 10;

// The thread order and yields of the blocks launched from now on (set_schedule).
struct Settings {
  std::atomic<uint64_t> seed{static_cast<uint64_t>(setting_int(Setting::StandinSeed))};
  std::atomic<unsigned> yield{static_cast<unsigned>(std::clamp<int64_t>(setting_int(Setting::StandinYield), 0, 100))};
  const unsigned plant = static_cast<unsigned>(setting_int(Setting::StandinPlant));
  const bool weak = setting_int(Setting::StandinWeak) != 0;
};
Settings& settings() {
  static auto* s = new Settings;
  return *s;
}

// The first kernel error of the process: every grid ends at its next switch, and the launch
// that ran into it reports it (a fault on a GPU ends every kernel of the context).
std::atomic<bool> faulted{false};
std::mutex& fault_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::string& fault_text() {
  static auto* s = new std::string;
  return *s;
}
void raise_fault(const std::string& what) {
  std::lock_guard<std::mutex> lock(fault_mutex());
  if (faulted.load()) return;
  fault_text() = what;
  faulted.store(true);
}

std::string kernel_name(const void* kernel) {
  Dl_info info{};
  if (!dladdr(kernel, &info) || !info.dli_sname) return "a kernel";
  int status = 0;
  char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : info.dli_sname;
  std::free(demangled);
  return name;
}

uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum class State : uint8_t { Ready, Napping, Barrier, Returned };

struct Fiber {
  jmp_buf resume;
  ucontext_t start;
  uint8_t* stack = nullptr;  // a guard page, then the stack
  bool live = false;         // its loop runs: switch to it through `resume`
  uint32_t tid = 0;
  State state = State::Ready;
  const char* file = nullptr;  // the barrier it waits at
  int line = 0;
};

struct Block {
  const std::function<void()>* body;
};

// What one OS thread needs to run blocks.
struct Worker {
  std::vector<Fiber*> fibers;
  jmp_buf scheduler;
  Fiber* current = nullptr;
  const Block* block = nullptr;
  uint64_t random = 0;
  ~Worker() {
    for (Fiber* f : fibers) {
      munmap(f->stack, kStackBytes + static_cast<size_t>(getpagesize()));
      delete f;
    }
  }
};
thread_local Worker worker;

void fiber_main() {
  for (;;) {
    Worker& w = worker;
    Fiber* f = w.current;
    try {
      (*w.block->body)();
    } catch (const std::exception& e) {
      raise_fault(std::string("a kernel threw: ") + e.what());
    } catch (...) {
      raise_fault("a kernel threw");
    }
    f->state = State::Returned;
    if (!_setjmp(f->resume)) _longjmp(worker.scheduler, 1);
    // Resumed for another launch: run its body.
  }
}

// From a fiber back to its block's scheduler; returns when the scheduler switches back.
void switch_out() {
  Worker& w = worker;
  if (!_setjmp(w.current->resume)) _longjmp(w.scheduler, 1);
}

void ensure_fibers(Worker& w, size_t n) {
  const size_t page = static_cast<size_t>(getpagesize());
  while (w.fibers.size() < n) {
    void* p =
        mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw standin::Fault{cudaErrorMemoryAllocation, "CUDA-on-CPU: no memory for fiber stacks"};
    mprotect(p, page, PROT_NONE);  // an overflow faults instead of corrupting a neighbour
    auto* f = new Fiber;
    f->stack = static_cast<uint8_t*>(p);
    w.fibers.push_back(f);
  }
}

// Runs fiber f until it next switches out.
void run_fiber(Worker& w, Fiber* f) {
  const uint3 dim = coords.block_dim;
  coords.thread_idx = uint3{f->tid % dim.x, f->tid / dim.x % dim.y, f->tid / (dim.x * dim.y)};
  w.current = f;
  if (!_setjmp(w.scheduler)) {
    if (f->live) _longjmp(f->resume, 1);
    f->live = true;
    getcontext(&f->start);
    f->start.uc_stack.ss_sp = f->stack + getpagesize();
    f->start.uc_stack.ss_size = kStackBytes;
    f->start.uc_link = nullptr;
    makecontext(&f->start, fiber_main, 0);
    setcontext(&f->start);
  }
  w.current = nullptr;
}

// Sleeps the block's thread while every thread of the block naps: longer the longer it idles.
void idle_sleep(unsigned streak) {
  if (streak < 2) {
    sched_yield();
    return;
  }
  const long us = std::min<long>(10L << std::min<unsigned>(streak - 2, 6), 500);
  const timespec nap{0, us * 1000};
  nanosleep(&nap, nullptr);
}

std::string thread_ranges(std::vector<uint32_t> tids) {
  std::sort(tids.begin(), tids.end());
  std::string out;
  for (size_t i = 0; i < tids.size();) {
    size_t j = i;
    while (j + 1 < tids.size() && tids[j + 1] == tids[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(tids[i]) + (j > i ? "-" + std::to_string(tids[j]) : "");
    i = j + 1;
  }
  return out;
}

// Why the threads at a barrier cannot pass it, or "" when they may.
std::string divergence(const std::vector<Fiber*>& waiting, const std::vector<uint32_t>& returned) {
  std::map<std::pair<std::string, int>, std::vector<uint32_t>> sites;
  for (const Fiber* f : waiting) sites[{f->file, f->line}].push_back(f->tid);
  if (sites.size() == 1 && returned.empty()) return "";
  std::string why = "divergent __syncthreads:";
  for (const auto& kv : sites) {
    const char* base = std::strrchr(kv.first.first.c_str(), '/');
    why += " threads " + thread_ranges(kv.second) + " wait at " + (base ? base + 1 : kv.first.first.c_str()) + ":" +
           std::to_string(kv.first.second) + ";";
  }
  if (!returned.empty()) why += " threads " + thread_ranges(returned) + " have returned;";
  return why;
}

// Runs one block to its end on this thread; false if the process faulted (the block's
// unfinished fibers are dropped).
bool run_block(const Block& b, uint3 block_idx, uint3 block_dim, uint3 grid_dim, uint64_t seed, const void* kernel) {
  Worker& w = worker;
  const uint32_t n = block_dim.x * block_dim.y * block_dim.z;
  ensure_fibers(w, n);
  coords.block_idx = block_idx;
  coords.block_dim = block_dim;
  coords.grid_dim = grid_dim;
  yield_percent = settings().yield;
  w.random = seed;
  w.block = &b;
  const bool shuffle = settings().seed != 0;
  auto shuffled = [&](std::vector<Fiber*>& v) {
    if (!shuffle) return;
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next_random(w.random) % i]);
  };
  std::vector<Fiber*> order(w.fibers.begin(), w.fibers.begin() + n);
  for (uint32_t t = 0; t < n; ++t) {
    order[t]->tid = t;
    order[t]->state = State::Ready;
  }
  shuffled(order);
  std::deque<Fiber*> ready(order.begin(), order.end());
  std::vector<Fiber*> waiting;
  std::vector<uint32_t> returned;
  size_t napping = 0;  // fibers in `ready` that napped
  unsigned idle_streak = 0;
  bool napped_since_release = false;
  std::string error;
  while (error.empty()) {
    if (faulted.load(std::memory_order_relaxed)) break;
    if (ready.empty()) {
      if (waiting.empty()) break;  // every thread returned
      error = divergence(waiting, returned);
      if (!error.empty()) break;
      if (!napped_since_release) idle_streak = 0;
      napped_since_release = false;
      shuffled(waiting);
      for (Fiber* f : waiting) f->state = State::Ready;
      ready.assign(waiting.begin(), waiting.end());
      waiting.clear();
      continue;
    }
    if (napping == ready.size()) {
      idle_sleep(idle_streak++);
      napped_since_release = true;
      for (Fiber* f : ready) f->state = State::Ready;
      napping = 0;
    }
    auto it = std::find_if(ready.begin(), ready.end(), [](const Fiber* f) { return f->state == State::Ready; });
    Fiber* f = *it;
    ready.erase(it);
    run_fiber(w, f);
    switch (f->state) {
      case State::Returned:
        returned.push_back(f->tid);
        break;
      case State::Barrier:
        waiting.push_back(f);
        break;
      case State::Napping:
        ready.push_back(f);
        ++napping;
        break;
      case State::Ready:  // yielded
        if (shuffle && !ready.empty())
          ready.insert(ready.begin() + static_cast<long>(next_random(w.random) % (ready.size() + 1)), f);
        else
          ready.push_back(f);
        break;
    }
  }
  w.block = nullptr;
  yield_percent = 0;
  const bool ok = error.empty() && !faulted.load();
  if (!ok) {
    for (uint32_t t = 0; t < n; ++t)
      if (w.fibers[t]->state != State::Returned) w.fibers[t]->live = false;  // dropped mid-kernel
    if (!error.empty())
      raise_fault(kernel_name(kernel) + ", block (" + std::to_string(block_idx.x) + "," + std::to_string(block_idx.y) +
                  "," + std::to_string(block_idx.z) + "): " + error);
  }
  return ok;
}

// OS threads for the blocks of cooperative grids beyond the first: one per block, so that
// every block runs at once; kept for later grids (with their fibers).
class BlockThreads {
 public:
  void run(std::function<void()> job) {
    std::unique_lock<std::mutex> lock(mu_);
    if (idle_.empty()) {
      auto* slot = new Slot;
      std::thread([this, slot] { loop(slot); }).detach();
      idle_.push_back(slot);
    }
    Slot* slot = idle_.back();
    idle_.pop_back();
    slot->job = std::move(job);
    cv_.notify_all();
  }

 private:
  struct Slot {
    std::function<void()> job;
  };
  void loop(Slot* slot) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [slot] { return static_cast<bool>(slot->job); });
      std::function<void()> job = std::move(slot->job);
      slot->job = nullptr;
      lock.unlock();
      job();
      lock.lock();
      idle_.push_back(slot);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot*> idle_;
};

BlockThreads& block_threads() {
  static auto* t = new BlockThreads;
  return *t;
}

std::atomic<uint64_t> launches{0};

struct Grid {
  const void* kernel;
  uint3 grid, block;
  bool cooperative;
  std::function<void()> body;
  uint64_t seq;
};

uint3 block_coords(uint64_t b, uint3 grid) {
  return uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
               static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
}

uint64_t block_seed(const Grid& g, uint64_t b) {
  uint64_t s = settings().seed ^ (g.seq * 0xD1B54A32D192ED03ull) ^ ((b + 1) * 0x9E3779B97F4A7C15ull);
  next_random(s);
  return s;
}

void run_grid(const Grid& g) {
  const uint64_t blocks = uint64_t{g.grid.x} * g.grid.y * g.grid.z;
  const Block block{&g.body};
  if (!faulted.load()) {
    if (!g.cooperative || blocks == 1) {
      for (uint64_t b = 0; b < blocks; ++b)
        if (!run_block(block, block_coords(b, g.grid), g.block, g.grid, block_seed(g, b), g.kernel)) break;
    } else {
      std::mutex mu;
      std::condition_variable cv;
      uint64_t left = blocks - 1;
      for (uint64_t b = 1; b < blocks; ++b) {
        block_threads().run([&, b] {
          run_block(block, block_coords(b, g.grid), g.block, g.grid, block_seed(g, b), g.kernel);
          std::lock_guard<std::mutex> lock(mu);
          if (--left == 0) cv.notify_all();
        });
      }
      run_block(block, block_coords(0, g.grid), g.block, g.grid, block_seed(g, 0), g.kernel);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return left == 0; });
    }
  }
  if (faulted.load()) {
    std::lock_guard<std::mutex> lock(fault_mutex());
    throw standin::Fault{cudaErrorLaunchFailure, "CUDA-on-CPU: " + fault_text()};
  }
}

}  // namespace

void set_schedule(uint64_t seed, unsigned yield) {
  settings().seed.store(seed);
  settings().yield.store(std::min(yield, 100u));
}

void clear_fault() {
  {
    std::lock_guard<std::mutex> lock(fault_mutex());
    faulted.store(false);
    fault_text().clear();
  }
  standin::clear_sticky_error();
}

void syncthreads(const char* file, int line) {
  Worker& w = worker;
  if (!w.current) return;  // not in a kernel
  w.current->state = State::Barrier;
  w.current->file = file;
  w.current->line = line;
  switch_out();
}

void yield_now() {
  Worker& w = worker;
  if (!w.current) return;
  const uint64_t r = next_random(w.random);
  if (r % 100 < yield_percent) {
    w.current->state = State::Ready;
    switch_out();
  }
  if ((r >> 40) % 64 == 0) sched_yield();  // now and then, let other blocks and processes in
}

void nap(unsigned) {
  Worker& w = worker;
  if (!w.current) {
    sched_yield();
    return;
  }
  w.current->state = State::Napping;
  switch_out();
}

cudaError_t launch(const void* kernel, dim3 grid, dim3 block, bool cooperative, std::function<void()> thread_body,
                   cudaStream_t stream) {
  auto g = std::make_shared<Grid>(Grid{kernel, grid, block, cooperative, std::move(thread_body), 0});
  g->seq = launches.fetch_add(1);
  return standin::launch(stream, standin::Launch{kernel, grid, block, cooperative, [g] { run_grid(*g); }});
}

}  // namespace ringtree::cuda_on_cpu

namespace ringtree::sync {

bool planted(unsigned fault) { return (cuda_on_cpu::settings().plant & fault) != 0; }

namespace {
struct Held {
  uint8_t* dst;
  uint8_t bytes[16];
  size_t n;
};
thread_local std::vector<Held> held;  // a block is one OS thread: the block's held stores
thread_local uint64_t held_random = 0x9E3779B97F4A7C15ull;
}  // namespace

bool hold_copy(void* dst, const void* src, size_t bytes, unsigned thread, unsigned threads) {
  if (!cuda_on_cpu::settings().weak || !standin::shared_beyond_process(dst)) return false;
  auto* d = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
  for (size_t i = size_t{thread} * 16; i < bytes; i += size_t{threads} * 16) {
    Held h{d + i, {}, std::min<size_t>(16, bytes - i)};
    std::memcpy(h.bytes, from + i, h.n);
    held.push_back(h);
  }
  return true;
}

void publish_held() {
  if (held.empty() || planted(kPlantNoFence)) return;
  for (size_t i = held.size(); i > 1; --i) std::swap(held[i - 1], held[cuda_on_cpu::next_random(held_random) % i]);
  for (const Held& h : held) std::memcpy(h.dst, h.bytes, h.n);
  held.clear();
}

void publish_held_late() {
  if (held.empty()) return;
  usleep(20000);
  publish_held();
}

// Below system scope, a word that another process or the host shares is a race on a GPU: the
// kernel faults (the launch fails naming the access), and stderr says so at once.
void check_scope(const void* p, Scope scope, const char* what) {
  if (scope == Scope::System) return;
  const char* shared = standin::shared_beyond_process(p);
  if (!shared) return;
  char text[320];
  std::snprintf(text, sizeof text, "scope check: %s at %s scope of %p, which is %s: it needs system scope", what,
                scope == Scope::Block ? "block" : "device", p, shared);
  std::fprintf(stderr, "ringtree stand-in: %s\n", text);
  cuda_on_cpu::raise_fault(text);
}

}  // namespace ringtree::sync
