// Private entry points to the host reduce kernels, for tests and micro-benchmarks only: they
// take raw addresses (e.g. numpy's arr.ctypes.data), so the caller answers for sizes and lifetimes.
#include "bindings/bindings.h"
#include "common/check.h"
#include "kernels/host/reduce.h"

namespace py = pybind11;

namespace ringtree {

namespace {

DataType checked_dtype(int code) {
  RT_CHECK(code >= 0 && code < static_cast<int>(DataType::Count), InvalidArgument, "unknown dtype code ", code);
  return static_cast<DataType>(code);
}

template <typename T = void>
T* address(uintptr_t p) { return reinterpret_cast<T*>(p); }

}  // namespace

void register_kernels(py::module_& m) {
  m.def(
      "_reduce",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op) {
        RT_CHECK(op >= 0 && op < static_cast<int>(ReduceOp::Count), InvalidArgument, "unknown reduce op code ", op);
        ReduceFn fn = reduce_fn(checked_dtype(dtype), static_cast<ReduceOp>(op));
        py::gil_scoped_release release;
        fn(address(dst), address<const void>(a), address<const void>(b), count);
      },
      py::arg("dst_ptr"), py::arg("a_ptr"), py::arg("b_ptr"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      "dst = a (op) b over count elements at raw addresses (testing hook).");
  m.def(
      "_scale",
      [](uintptr_t dst, uintptr_t src, size_t count, int dtype, double factor) {
        DataType t = checked_dtype(dtype);
        py::gil_scoped_release release;
        scale_elements(address(dst), address<const void>(src), count, t, factor);
      },
      py::arg("dst_ptr"), py::arg("src_ptr"), py::arg("count"), py::arg("dtype"), py::arg("factor"),
      "dst = src * factor, premul_sum's map (testing hook).");
  m.def(
      "_divide",
      [](uintptr_t dst, size_t count, int dtype, int64_t divisor) {
        DataType t = checked_dtype(dtype);
        py::gil_scoped_release release;
        divide_elements(address(dst), count, t, divisor);
      },
      py::arg("dst_ptr"), py::arg("count"), py::arg("dtype"), py::arg("divisor"),
      "dst /= divisor in place, avg's map (testing hook).");
  m.def("_kernel_isa", &kernel_isa_name, "The instruction set the half-precision kernels use: 'avx2+f16c' or 'scalar'.");
}

}  // namespace ringtree
