#pragma once
#include <pybind11/pybind11.h>
#include <string>
#include <tuple>
#include <vector>
#include "common/check.h"
#include "ringtree/communicator.h"

namespace ringtree {

// An enum from Python's code for it, refused (InvalidArgument) when out of range.
template <typename E>
E checked_enum(int code, E count, const char* what) {
  RT_CHECK(code >= 0 && code < static_cast<int>(count), InvalidArgument, "unknown ", what, " code ", code);
  return static_cast<E>(code);
}

// Estimates as Python takes them: (algo code, seconds, formula).
inline std::vector<std::tuple<int, double, std::string>> estimate_tuples(const std::vector<AlgoEstimate>& estimates) {
  std::vector<std::tuple<int, double, std::string>> out;
  for (const AlgoEstimate& e : estimates) out.emplace_back(static_cast<int>(e.algo), e.seconds, e.formula);
  return out;
}
void register_errors(pybind11::module_& m);
void register_types(pybind11::module_& m);
void register_communicator(pybind11::module_& m);
// Communicator methods as method descriptors that call the fast entry (fast_method.cc).
void register_fast_method(pybind11::module_& m);
// Calls a communicator's fast entry (Communicator._fast, a plain or a group's) with its arguments.
PyObject* call_fast_entry(PyObject* entry, PyObject* const* args, Py_ssize_t nargs);
// Whether obj is a numpy array (or a subclass): what the fast entry reads (NumPy's C API).
bool is_ndarray(PyObject* obj);
void register_policies(pybind11::module_& m);
void register_schedules(pybind11::module_& m);
void register_kernels(pybind11::module_& m);
// The CUDA path (register_cuda.cc, compiled once per module): present in every build, a stub
// without CUDA.
void register_cuda(pybind11::module_& m);
// The thread ranks and the device kernels alone (register_cuda.cc; CUDA and stand-in builds).
void register_thread_ranks(pybind11::module_& m);
// All of the above: a module that serves as ringtree._core.
void register_core(pybind11::module_& m);
void register_security(pybind11::module_& m);
}  // namespace ringtree
