// The test module's hooks into the host kernels and the step walker. They take raw addresses
// (numpy's arr.ctypes.data, say): the caller answers for sizes and lifetimes.
#include <pybind11/stl.h>
#include <memory>
#include "algorithms/schedule.h"
#include "bindings/testing/testing.h"
#include "common/check.h"
#include "exec/testing/walker_threads.h"
#include "kernels/host/reduce.h"

namespace py = pybind11;

namespace ringtree {

namespace {

DataType checked_dtype(int code) {
  RT_CHECK(code >= 0 && code < static_cast<int>(DataType::Count), InvalidArgument, "unknown dtype code ", code);
  return static_cast<DataType>(code);
}

template <typename T = void>
T* address(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

}  // namespace

void register_test_hooks(py::module_& m) {
  m.def(
      "reduce",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op) {
        RT_CHECK(op >= 0 && op < static_cast<int>(ReduceOp::Count), InvalidArgument, "unknown reduce op code ", op);
        ReduceFn fn = reduce_fn(checked_dtype(dtype), static_cast<ReduceOp>(op));
        py::gil_scoped_release release;
        fn(address(dst), address<const void>(a), address<const void>(b), count);
      },
      py::arg("dst_ptr"), py::arg("a_ptr"), py::arg("b_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      "dst = a (op) b over count elements at raw addresses, with the host kernels.");
  m.def(
      "scale",
      [](uintptr_t dst, uintptr_t src, size_t count, int dtype, double factor) {
        DataType t = checked_dtype(dtype);
        py::gil_scoped_release release;
        scale_elements(address(dst), address<const void>(src), count, t, factor);
      },
      py::arg("dst_ptr"), py::arg("src_ptr"), py::arg("count"), py::arg("dtype"), py::arg("factor"),
      "dst = src * factor, premul_sum's map, with the host kernels.");
  m.def(
      "divide",
      [](uintptr_t dst, size_t count, int dtype, int64_t divisor) {
        DataType t = checked_dtype(dtype);
        py::gil_scoped_release release;
        divide_elements(address(dst), count, t, divisor);
      },
      py::arg("dst_ptr"), py::arg("count"), py::arg("dtype"), py::arg("divisor"),
      "dst /= divisor in place, avg's map, with the host kernels.");
  m.def(
      "walk_on_threads",
      [](int coll, int algo, int nranks, uint64_t count, int root, uint64_t segment, int dtype, int op, double factor,
         std::vector<uintptr_t> inputs, std::vector<uintptr_t> outputs, uint64_t slot_bytes, uint32_t slots,
         double timeout, std::vector<uint64_t> tags, uint32_t channels, std::vector<int64_t> hosts, bool device) {
        std::unique_ptr<Topology> topo;
        if (!hosts.empty()) topo = std::make_unique<Topology>(Topology::from_labels(hosts));
        ThreadWalkArgs a;
        a.key = ScheduleKey{
            static_cast<Collective>(coll), static_cast<Algo>(algo), nranks, 0, count, root, segment, -1, topo.get()};
        a.dtype = checked_dtype(dtype);
        a.op = static_cast<ReduceOp>(op);
        a.premul_factor = factor;
        for (uintptr_t p : inputs) a.inputs.push_back(reinterpret_cast<uint8_t*>(p));
        for (uintptr_t p : outputs) a.outputs.push_back(reinterpret_cast<uint8_t*>(p));
        a.slot_bytes = slot_bytes;
        a.slots = slots;
        a.timeout_s = timeout;
        a.tags = std::move(tags);
        a.channels = channels;
        a.device = device;
        walk_on_threads(a);
      },
      py::arg("coll"), py::arg("algo"), py::arg("nranks"), py::arg("count"), py::arg("root"), py::arg("segment"),
      py::arg("dtype"), py::arg("op"), py::arg("factor"), py::arg("inputs"), py::arg("outputs"), py::arg("slot_bytes"),
      py::arg("slots"), py::arg("timeout") = 60.0, py::arg("tags") = std::vector<uint64_t>{}, py::arg("channels") = 1,
      py::arg("hosts") = std::vector<int64_t>{}, py::arg("device") = false, py::call_guard<py::gil_scoped_release>(),
      "Every rank's schedule walked by the CUDA IPC executor's step walker in this process over in-memory\n"
      "mailboxes: with its host policy on threads, or (device=True) as the walk kernel itself through the\n"
      "CUDA stand-in. inputs/outputs: one pointer per rank, as the host executor takes them.");
}

}  // namespace ringtree
