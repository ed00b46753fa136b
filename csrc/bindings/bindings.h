#pragma once
#include <pybind11/pybind11.h>

namespace ringtree {
void register_errors(pybind11::module_& m);
void register_types(pybind11::module_& m);
void register_communicator(pybind11::module_& m);
void register_policies(pybind11::module_& m);
void register_schedules(pybind11::module_& m);
void register_kernels(pybind11::module_& m);
}  // namespace ringtree
