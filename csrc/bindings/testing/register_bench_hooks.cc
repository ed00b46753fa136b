// A grouped call's cost measured from C++, without the Python layer: this process's rank of a
// fresh communicator times, in interleaved blocks, `calls` plain all_reduces of `count` float32
// elements against one group of `calls` such all_reduces (group_start, the calls, group_end) and
// against the same calls as one list (run_coalesced).
// What the Python figures cannot separate from CPython's per-call cost (bench/rt_bench.py --group).
#include <pybind11/stl.h>
#include <algorithm>
#include <chrono>
#include <vector>
#include "bindings/testing/testing.h"
#include "common/check.h"
#include "ringtree/communicator.h"

namespace py = pybind11;

namespace ringtree {

namespace {

using Clock = std::chrono::steady_clock;

// The calls' common part: a max, so the values stay put however often it runs (rank r holds
// r + 1, then size).
CollectiveArgs max_all_reduce() {
  CollectiveArgs a;
  a.coll = Collective::AllReduce;
  a.dtype = DataType::Float32;
  a.op = ReduceOp::Max;
  return a;
}

CollectiveArgs all_reduce_of(std::vector<float>& x) {
  CollectiveArgs a = max_all_reduce();
  a.input = Buffer{x.data(), x.size(), false, true};
  a.output = a.input;
  return a;
}

}  // namespace

// Out of line and exported, so that an instruction profile can count each alone
// (valgrind --tool=callgrind --toggle-collect='*bench_grouped_calls*').
[[gnu::noinline, gnu::visibility("default")]] void bench_plain_calls(Communicator& c,
                                                                     std::vector<std::vector<float>>& xs) {
  for (auto& x : xs) c.run(all_reduce_of(x), false);
}

[[gnu::noinline, gnu::visibility("default")]] void bench_grouped_calls(Communicator& c,
                                                                       std::vector<std::vector<float>>& xs) {
  c.group_start();
  for (auto& x : xs) c.run(all_reduce_of(x), false);
  c.group_end(false);
}

[[gnu::noinline, gnu::visibility("default")]] void bench_coalesced_calls(
    Communicator& c, const std::vector<Communicator::CallBuffers>& list) {
  c.run_coalesced(max_all_reduce(), list.data(), list.size(), false);
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void register_bench_hooks(py::module_& m) {
  m.def(
      "bench_group",
      [](int rank, int size, const std::string& unique_id, int calls, uint64_t count, int blocks, int reps) {
        auto comm = Communicator::create(rank, size, UniqueId::parse(unique_id), 120.0);
        std::vector<std::vector<float>> xs(calls, std::vector<float>(count, static_cast<float>(rank + 1)));
        std::vector<double> plain_us, group_us, coalesced_us;
        std::vector<Communicator::CallBuffers> list;
        for (auto& x : xs) {
          const Buffer b = all_reduce_of(x).input;  // in place, as the grouped calls
          list.push_back({b, b, DataType::Float32});
        }
        auto time_us = [&](auto body) {
          const auto t0 = Clock::now();
          for (int r = 0; r < reps; ++r) body();
          return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps;
        };
        for (int b = 0; b < blocks; ++b) {
          // Per call for the plain ones, per group for the grouped: the ratio is what the bench
          // reports as a group's cost in plain calls.
          plain_us.push_back(time_us([&] { bench_plain_calls(*comm, xs); }) / calls);
          group_us.push_back(time_us([&] { bench_grouped_calls(*comm, xs); }));
          coalesced_us.push_back(time_us([&] { bench_coalesced_calls(*comm, list); }));
        }
        uint64_t wrong = 0;
        for (auto& x : xs) wrong += std::count_if(x.begin(), x.end(), [&](float v) { return v != size; });
        comm->close();
        RT_CHECK(wrong == 0, Error, "bench_group: ", wrong, " elements differ from the max over ranks");
        return std::make_tuple(median(plain_us), median(group_us), median(coalesced_us));
      },
      py::arg("rank"), py::arg("size"), py::arg("unique_id"), py::arg("calls") = 64, py::arg("count") = 2,
      py::arg("blocks") = 21, py::arg("reps") = 50, py::call_guard<py::gil_scoped_release>(),
      "(median us of one plain all_reduce, of one group of `calls` all_reduces, of the same calls as\n"
      "one list), timed in interleaved blocks on a communicator this rank makes from unique_id (every\n"
      "rank calls it).");
}

}  // namespace ringtree
