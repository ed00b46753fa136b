#pragma once
#include <pybind11/pybind11.h>

namespace ringtree {
void register_errors(pybind11::module_& m);
void register_types(pybind11::module_& m);
void register_communicator(pybind11::module_& m);
void register_schedules(pybind11::module_& m);
void register_kernels(pybind11::module_& m);
// The CUDA path (register_cuda.cc, compiled once per module): present in every build, a stub
// without CUDA.
void register_cuda(pybind11::module_& m);
// The thread ranks and the device kernels alone (register_cuda.cc; CUDA and stand-in builds).
void register_thread_ranks(pybind11::module_& m);
// All of the above: a module that serves as ringtree._core.
void register_core(pybind11::module_& m);
}  // namespace ringtree
