// The registration functions of the test module (_ringtree_testing, see testing_module.cc).
#pragma once
#include <pybind11/pybind11.h>

namespace ringtree {
// The host kernels at raw addresses and the step walker for every rank in one process.
void register_test_hooks(pybind11::module_& m);
// The CUDA stand-in: device memory, streams, devices, contexts, violations.
void register_standin_hooks(pybind11::module_& m);
// A group's cost timed from C++ (bench_group).
void register_bench_hooks(pybind11::module_& m);
}  // namespace ringtree
